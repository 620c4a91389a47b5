// ubep::BulkExchange over oneCCL (oneccl_exchange.hpp). ccl::alltoallv takes packed buffers
// (block p right after block p - 1, in rank order) and counts, not offsets: when the baseline's
// offsets are exactly the running sums of its byte counts, the call goes straight to oneCCL;
// otherwise the blocks are staged through packed scratch on each side (a copy, counted in the
// time, as a user with such a layout would pay it).
#include "bench/oneccl_exchange.hpp"

#include <cstring>
#include <vector>

#include <oneapi/ccl.hpp>

namespace ubep::tools {

namespace {

bool packed(const int64_t* bytes, const int64_t* offsets, size_t n) {
  int64_t at = 0;
  for (size_t p = 0; p < n; ++p) {
    if (offsets[p] != at) return false;
    at += bytes[p];
  }
  return true;
}

class OneCclExchange : public BulkExchange {
 public:
  explicit OneCclExchange(Group& group) : n_(static_cast<size_t>(group.size())) {
    static const bool initialised = [] {
      ccl::init();
      return true;
    }();
    (void)initialised;
    // Rank 0 serves the key-value store the communicator is made through; its address reaches
    // the others over the group's own set-up exchange (no MPI call of ours).
    ccl::kvs::address_type addr{};
    if (group.rank() == 0) {
      kvs_ = ccl::create_main_kvs();
      addr = kvs_->get_address();
    }
    std::vector<ccl::kvs::address_type> all(n_);
    group.allgather(&addr, all.data(), sizeof addr);
    if (group.rank() != 0) kvs_ = ccl::create_kvs(all[0]);
    comm_ = std::make_unique<ccl::communicator>(
        ccl::create_communicator(group.size(), group.rank(), kvs_));
  }

  void alltoallv(const void* send, const int64_t* send_bytes, const int64_t* send_offsets,
                 void* recv, const int64_t* recv_bytes, const int64_t* recv_offsets) override {
    std::vector<size_t> sc(send_bytes, send_bytes + n_), rc(recv_bytes, recv_bytes + n_);
    const bool send_packed = packed(send_bytes, send_offsets, n_);
    const bool recv_packed = packed(recv_bytes, recv_offsets, n_);
    const auto* s = static_cast<const int8_t*>(send);
    auto* r = static_cast<int8_t*>(recv);
    if (!send_packed) s = stage_in(s, send_bytes, send_offsets);
    int8_t* into = recv_packed ? r : staged_out(recv_bytes);
    ccl::alltoallv(s, sc, into, rc, *comm_).wait();
    if (!recv_packed) {
      int64_t at = 0;
      for (size_t p = 0; p < n_; ++p) {
        std::memcpy(r + recv_offsets[p], into + at, static_cast<size_t>(recv_bytes[p]));
        at += recv_bytes[p];
      }
    }
  }
  const char* name() const override { return "oneccl"; }

 private:
  const int8_t* stage_in(const int8_t* send, const int64_t* bytes, const int64_t* offsets) {
    int64_t total = 0;
    for (size_t p = 0; p < n_; ++p) total += bytes[p];
    send_stage_.resize(static_cast<size_t>(total));
    int64_t at = 0;
    for (size_t p = 0; p < n_; ++p) {
      std::memcpy(send_stage_.data() + at, send + offsets[p], static_cast<size_t>(bytes[p]));
      at += bytes[p];
    }
    return send_stage_.data();
  }
  int8_t* staged_out(const int64_t* bytes) {
    int64_t total = 0;
    for (size_t p = 0; p < n_; ++p) total += bytes[p];
    recv_stage_.resize(static_cast<size_t>(total));
    return recv_stage_.data();
  }

  size_t n_;
  ccl::shared_ptr_class<ccl::kvs> kvs_;
  std::unique_ptr<ccl::communicator> comm_;
  std::vector<int8_t> send_stage_, recv_stage_;
};

}  // namespace

std::unique_ptr<BulkExchange> make_oneccl_exchange(Group& group) {
  return std::make_unique<OneCclExchange>(group);
}

}  // namespace ubep::tools
