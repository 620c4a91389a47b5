// The baseline users write without ubep: pack per destination -> all-to-all of counts ->
// all-to-all-v of tokens and metadata -> unpack; combine mirrors it. On process groups the
// exchanges are MPI_Alltoall(v); on thread groups, the group's equivalent bulk exchange.
// Same inputs, outputs and bit-exact results as ubep::Buffer, so benchmarks and tests can put
// the two side by side. With config.num_workers > 0 (or -1: cores per rank - 1, as Buffer sizes
// it) the pack, unpack and reduce loops are split over that many helper threads plus the caller,
// so the baseline gets the cores ubep gets. Every config value and every pointer and shape of a
// call is checked: bad input raises InvalidArgument naming the value, never a crash.
#pragma once

#include <cstdint>
#include <memory>

#include "ubep/buffer.hpp"

namespace ubep {

// The collective the baseline moves its bytes with. The default is MPI_Alltoallv on groups from
// make_mpi_group and a one-copy exchange between thread ranks; another library's all-to-all-v
// (ubep-bench's oneCCL, tools/bench/oneccl_exchange.cpp) plugs in here, so the same pack, unpack
// and reduce run over it and the comparison isolates the transport.
class BulkExchange {
 public:
  virtual ~BulkExchange() = default;
  // Collective over the group's ranks: send_bytes[p] bytes from send + send_offsets[p] go to
  // rank p, which receives them at recv + recv_offsets[me] (recv_bytes[p] from rank p).
  virtual void alltoallv(const void* send, const int64_t* send_bytes, const int64_t* send_offsets,
                         void* recv, const int64_t* recv_bytes, const int64_t* recv_offsets) = 0;
  virtual const char* name() const = 0;  // the baseline's name in reports ("mpi", "oneccl")
};

class AlltoallBaseline {
 public:
  AlltoallBaseline(Group& group, BufferConfig config);
  // The same baseline over `exchange` (collective over group's ranks, rank r its rank r).
  AlltoallBaseline(Group& group, BufferConfig config, std::unique_ptr<BulkExchange> exchange);
  ~AlltoallBaseline();
  DispatchResult dispatch(const DispatchArgs& args);
  TensorView combine(const CombineArgs& args);
  const CallStats& last_stats() const;
  // "mpi" on process groups, "a2a" (in-process bulk exchange) on thread groups, else the
  // exchange's name.
  const char* name() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ubep
