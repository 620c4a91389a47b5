#include "baseline/exchange.hpp"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ubep/error.hpp"

#ifdef UBEP_WITH_MPI
#include <climits>

#include "bootstrap/mpi_comm.hpp"
#endif

namespace ubep::baseline {

namespace {

// Where a rank's send data of the current exchange is.
struct Posted {
  const void* send = nullptr;
  const int64_t* bytes = nullptr;
  const int64_t* offsets = nullptr;
};

// Like MPI's shared-memory path for large messages: each rank posts where its send data is and
// the receiver copies straight out of the sender's buffer once every rank has posted (one copy).
// Two group barriers per exchange: the first publishes the posts (the barrier's release/acquire
// makes them visible), the second keeps every sender's buffer and post unchanged until every
// receiver has copied out of it, so the next exchange may overwrite them.
class ThreadExchange : public Exchange {
 public:
  explicit ThreadExchange(Group& group) : group_(group) {}
  // Set-up: every rank learns the address of every peer's post.
  void connect(std::vector<const Posted*> peers) { peers_ = std::move(peers); }
  const Posted* post() const { return &mine_; }

  void alltoallv(const void* send, const int64_t* send_bytes, const int64_t* send_offsets,
                 void* recv, const int64_t* recv_bytes, const int64_t* recv_offsets) override {
    mine_ = {send, send_bytes, send_offsets};
    group_.barrier();
    const int me = group_.rank();
    std::string error;
    for (int p = 0; p < group_.size(); ++p) {
      const Posted& peer = *peers_[static_cast<size_t>(p)];
      const int64_t n = peer.bytes[me];
      if (n != recv_bytes[p]) {  // reported after the closing barrier: no peer is left waiting
        if (error.empty())
          error = detail::concat("alltoallv: rank ", p, " sends ", n, " bytes to rank ", me,
                                 " which expects ", recv_bytes[p]);
        continue;
      }
      if (n > 0)
        std::memcpy(static_cast<char*>(recv) + recv_offsets[p],
                    static_cast<const char*>(peer.send) + peer.offsets[me], static_cast<size_t>(n));
    }
    group_.barrier();
    if (!error.empty()) throw InvalidArgument(error);
  }
  const char* name() const override { return "a2a"; }

 private:
  Group& group_;
  Posted mine_;
  std::vector<const Posted*> peers_;
};

#ifdef UBEP_WITH_MPI

class MpiExchange : public Exchange {
 public:
  MpiExchange(MPI_Comm comm, int size) : comm_(comm), counts_(4 * static_cast<size_t>(size)) {}

  void alltoallv(const void* send, const int64_t* send_bytes, const int64_t* send_offsets,
                 void* recv, const int64_t* recv_bytes, const int64_t* recv_offsets) override {
    const size_t n = counts_.size() / 4;
    int* sc = counts_.data();
    int* sd = sc + n;
    int* rc = sd + n;
    int* rd = rc + n;
    for (size_t p = 0; p < n; ++p) {
      UBEP_CHECK_ARG(send_offsets[p] + send_bytes[p] < INT32_MAX &&
                         recv_offsets[p] + recv_bytes[p] < INT32_MAX,
                     "alltoallv: more than 2 GiB in one exchange");
      sc[p] = static_cast<int>(send_bytes[p]);
      sd[p] = static_cast<int>(send_offsets[p]);
      rc[p] = static_cast<int>(recv_bytes[p]);
      rd[p] = static_cast<int>(recv_offsets[p]);
    }
    detail::mpi_check(MPI_Alltoallv(send, sc, sd, MPI_BYTE, recv, rc, rd, MPI_BYTE, comm_),
                      "MPI_Alltoallv");
  }
  const char* name() const override { return "mpi"; }

 private:
  MPI_Comm comm_;
  std::vector<int> counts_;  // send counts, send offsets, receive counts, receive offsets
};
#endif

// Tells this process apart from every other one, even across hosts and PID namespaces (where
// two processes may share a pid): ranks with the same id are threads of one address space.
uint64_t process_id() {
  static const uint64_t id = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  return id;
}

}  // namespace

std::unique_ptr<Exchange> make_exchange(Group& group) {
#ifdef UBEP_WITH_MPI
  if (MPI_Comm comm = detail::mpi_comm_of(group); comm != MPI_COMM_NULL)
    return std::make_unique<MpiExchange>(comm, group.size());
#endif
  // Every rank of a group is the same kind, so every rank takes this collective or none does.
  auto ex = std::make_unique<ThreadExchange>(group);
  struct Entry {
    uint64_t process;
    const Posted* post;
  };
  const Entry mine{process_id(), ex->post()};
  std::vector<Entry> all(static_cast<size_t>(group.size()));
  group.allgather(&mine, all.data(), sizeof(Entry));
  std::vector<const Posted*> peers;
  for (const Entry& e : all) {
    UBEP_CHECK_ARG(e.process == mine.process, "AlltoallBaseline: the ", group.kind(),
                   " group has no bulk exchange (the baseline needs thread ranks or a group "
                   "from make_mpi_group)");
    peers.push_back(e.post);
  }
  ex->connect(std::move(peers));
  return ex;
}

}  // namespace ubep::baseline
