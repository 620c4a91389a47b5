// The CPU data path: peers' windows are mapped into this process (threads of one process, or
// POSIX shared memory between processes), rows move with plain or non-temporal stores, tags are
// std::atomic_ref release/acquire on the shared words, roles run on a WorkerTeam.
#pragma once

#include <memory>

#include "backend/data_path.hpp"

namespace ubep::cpu {

class WorkerTeam;

class CpuDataPath final : public backend::DataPath {
 public:
  explicit CpuDataPath(int workers);
  ~CpuDataPath() override;

  int members() const override;
  void put_row(void* dst, const void* src, size_t bytes, bool stream) const override;
  void put(void* dst, const void* src, size_t bytes) const override;
  void put_message(const backend::RowMessage& m) const override;
  void publish(protocol::Tag* tag, uint32_t value, bool stop_and_wait) const override;
  bool arrived(const protocol::Tag* tag, uint32_t value) const override;
  uint32_t load(const protocol::Tag* tag) const override;
  void fence() const override;
  void reduce_rows(void* out, DType dtype, int64_t hidden, const void* const* rows,
                   const float* weights, int n, bool stream, const void* const* next_rows,
                   int next_n, bool sequential) const override;
  void accumulate_row(float* acc, const void* row, DType dtype, int64_t hidden,
                      const float* weight) const override;
  void store_row(void* dst, const float* acc, DType dtype, int64_t hidden) const override;

 protected:
  void run_erased(void* obj, void (*fn)(void*, int)) override;

 private:
  std::unique_ptr<WorkerTeam> team_;
};

}  // namespace ubep::cpu
