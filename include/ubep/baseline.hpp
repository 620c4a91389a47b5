// The baseline users write without ubep: pack per destination -> all-to-all of counts ->
// all-to-all-v of tokens and metadata -> unpack; combine mirrors it. On process groups the
// exchanges are MPI_Alltoall(v); on thread groups, the group's equivalent bulk exchange.
// Same inputs, outputs and bit-exact results as ubep::Buffer, so benchmarks and tests can put
// the two side by side.
#pragma once

#include <memory>

#include "ubep/buffer.hpp"

namespace ubep {

class AlltoallBaseline {
 public:
  AlltoallBaseline(Group& group, BufferConfig config);
  ~AlltoallBaseline();
  DispatchResult dispatch(const DispatchArgs& args);
  TensorView combine(const CombineArgs& args);
  const CallStats& last_stats() const;
  // "mpi" on process groups, "a2a" (in-process bulk exchange) on thread groups.
  const char* name() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ubep
