// The Remote transport between thread ranks that pretend to live on different hosts
// (ThreadWorld::set_ranks_per_host): eager copies through mailboxes, so the cross-host code
// paths run (and run under ThreadSanitizer) without MPI.
//
// Correctness: a mailbox per (source, destination, tag) is a FIFO guarded by one mutex; isend
// copies the message in and completes at once; a receive completes when a test() finds the
// mailbox non-empty and pops the oldest message. The mutex orders the producer's copy before
// the consumer's read. FIFO order per (source, tag) matches MPI's non-overtaking rule, which the
// callers rely on (one outstanding receive per (peer, tag) at a time).
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "transport/remote.hpp"

namespace ubep::transport {

class Mailboxes {
 public:
  void put(int src, int dst, int tag, const void* data, size_t bytes);
  bool take(int src, int dst, int tag, void* data, size_t capacity, size_t* bytes);

 private:
  std::mutex mu_;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> boxes_;
};

class InprocRemote : public Remote {
 public:
  InprocRemote(int rank, std::shared_ptr<Mailboxes> boxes)
      : rank_(rank), boxes_(std::move(boxes)) {}
  int isend(int peer, int tag, const void* data, size_t bytes) override;
  int irecv(int peer, int tag, void* data, size_t capacity) override;
  bool test(int request, size_t* bytes) override;
  void cancel(int request) override { pending_[static_cast<size_t>(request)].live = false; }

 private:
  struct Pending {
    bool recv = false;
    int peer = 0, tag = 0;
    void* data = nullptr;
    size_t capacity = 0, bytes = 0;
    bool live = false;
  };
  int slot();
  int rank_;
  std::shared_ptr<Mailboxes> boxes_;
  std::vector<Pending> pending_;
};

}  // namespace ubep::transport
