// Page-aligned, zero-filled local memory from mmap: untouched pages cost nothing, which matters
// for the latency layout's large [local_experts, max_tokens*ranks, hidden] output.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <utility>

#include "ubep/error.hpp"

namespace ubep {

class LocalArray {
 public:
  LocalArray() = default;
  explicit LocalArray(size_t bytes) : bytes_(bytes) {
    if (bytes_ == 0) return;
    data_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data_ == MAP_FAILED) {
      data_ = nullptr;
      throw SystemError(detail::concat("mmap of ", bytes, " bytes failed"));
    }
  }
  ~LocalArray() {
    if (data_) munmap(data_, bytes_);
  }
  LocalArray(LocalArray&& o) noexcept { *this = std::move(o); }
  LocalArray& operator=(LocalArray&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T = char>
  T* get() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ubep
