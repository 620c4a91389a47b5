#include <cstddef>
#include <cstring>
extern "C" {
void* _intel_fast_memcpy(void* d, const void* s, size_t n) { return std::memcpy(d, s, n); }
void* _intel_fast_memset(void* d, int c, size_t n) { return std::memset(d, c, n); }
void* __itt_string_handle_create_ptr__3_0 = nullptr;
void* __itt_task_begin_ptr__3_0 = nullptr;
void* __itt_task_end_ptr__3_0 = nullptr;
void* __itt_metadata_add_ptr__3_0 = nullptr;
void* __itt_thread_set_name_ptr__3_0 = nullptr;
void* __itt_domain_create_ptr__3_0 = nullptr;
void* __itt_event_start_ptr__3_0 = nullptr;
void* __itt_event_end_ptr__3_0 = nullptr;
void* __itt_event_create_ptr__3_0 = nullptr;
}
