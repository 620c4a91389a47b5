#include "backend/cpu/cpu_data_path.hpp"

#include <atomic>
#include <cstring>

#include "backend/cpu/row_kernels.hpp"
#include "backend/cpu/tags.hpp"
#include "backend/cpu/worker_team.hpp"

namespace ubep::cpu {

CpuDataPath::CpuDataPath(int workers) : team_(std::make_unique<WorkerTeam>(workers)) {}
CpuDataPath::~CpuDataPath() = default;

int CpuDataPath::members() const { return team_->size(); }

void CpuDataPath::run_erased(void* obj, void (*fn)(void*, int)) {
  team_->run([&](int m) { fn(obj, m); });
}

void CpuDataPath::put_row(void* dst, const void* src, size_t bytes, bool stream) const {
  if (stream)  // ends with an sfence: ordered before the tag's release store
    kernels::copy_row_to_peer(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

void CpuDataPath::put(void* dst, const void* src, size_t bytes) const {
  std::memcpy(dst, src, bytes);
}

void CpuDataPath::publish(ep::Tag* tag, uint32_t value, bool stop_and_wait) const {
  if (stop_and_wait) std::atomic_thread_fence(std::memory_order_seq_cst);
  publish_tag(tag, value);
}

bool CpuDataPath::arrived(const ep::Tag* tag, uint32_t value) const {
  return tag_arrived(tag, value);
}

void CpuDataPath::fence() const { std::atomic_thread_fence(std::memory_order_seq_cst); }

void CpuDataPath::reduce_rows(void* out, DType dtype, int64_t hidden, const void* const* rows,
                              const float* weights, int n) const {
  kernels::reduce_rows(out, dtype, hidden, rows, weights, n);
}

void CpuDataPath::accumulate_row(float* acc, const void* row, DType dtype, int64_t hidden,
                                 const float* weight) const {
  if (weight)
    kernels::accumulate_row_weighted(acc, row, dtype, hidden, *weight);
  else
    kernels::accumulate_row(acc, row, dtype, hidden);
}

void CpuDataPath::store_row(void* dst, const float* acc, DType dtype, int64_t hidden) const {
  kernels::store_row(dst, acc, dtype, hidden);
}

}  // namespace ubep::cpu
