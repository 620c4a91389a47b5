// The baseline users write without ubep: pack per destination -> all-to-all of counts ->
// all-to-all-v of tokens and metadata -> unpack; combine mirrors it. On process groups the
// exchanges are MPI_Alltoall(v); on thread groups, the group's equivalent bulk exchange.
// Same inputs, outputs and bit-exact results as ubep::Buffer, so benchmarks and tests can put
// the two side by side. With config.num_workers > 0 (or -1: cores per rank - 1, as Buffer sizes
// it) the pack, unpack and reduce loops are split over that many helper threads plus the caller,
// so the baseline gets the cores ubep gets. Every config value and every pointer and shape of a
// call is checked: bad input raises InvalidArgument naming the value, never a crash.
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
