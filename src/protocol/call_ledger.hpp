// The failure-word side of the call contract (docs/RELIABILITY.md), one copy for every engine
// (ep::HostEngine, cuda_host::KernelEngine): which collective call this rank is in, whether its
// buffer is broken and why, and what it tells its peers through its failure word (protocol.hpp)
// when it rejects a call, breaks, or leaves. How a word is read or published is the backend's:
// two callbacks.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "protocol/protocol.hpp"
#include "ubep/error.hpp"

namespace ubep::protocol {

class CallLedger {
 public:
  // read(peer): peer's failure word as this rank's window holds it (0 where it cannot be read);
  // publish(word): this rank's word into every peer's window.
  CallLedger(int rank, int ranks, std::function<uint32_t(int)> read,
             std::function<void(uint32_t)> publish)
      : rank_(rank), ranks_(ranks), read_(std::move(read)), publish_(std::move(publish)) {}

  // Collective calls started (dispatch and combine each count one).
  uint64_t calls() const { return calls_; }
  bool broken() const { return !broken_.empty(); }

  // Starts call number calls() + 1; BrokenBufferError once the buffer is broken.
  void start(const char* what) {
    check_usable(what, calls_ + 1);
    ++calls_;
  }
  // After an agreement on the group (docs/ELASTIC.md): the next call is `call` + 1, the one
  // after the highest any live rank started.
  void resume_after(uint64_t call) {
    if (call > calls_) calls_ = call;
    rejected_ = 0;
  }
  // A rank that rejoins starts clean: what broke it belonged to the group it was masked from.
  void reset() {
    broken_.clear();
    rejected_ = 0;
    publish_(0);
  }
  // A later phase of a started call (dispatch_recv, ...): BrokenBufferError once broken.
  void check_usable(const char* what) const { check_usable(what, calls_); }

  // After this rank accepted its inputs: a peer whose buffer broke never joins another call on
  // it, so neither can this rank: fail now (telling the other peers) instead of at the first
  // wait. Checked after this rank's own inputs, so bad input is always named as such.
  void join(const char* what) {
    for (int r = 0; r < ranks_; ++r) {
      const uint32_t word = r != rank_ ? read_(r) : 0u;
      UBEP_CHECK(!is_dead(word), PeerFailedError, what, " (call ", calls_, "): rank ", r, " died");
      if (!is_broken(word)) continue;
      const uint64_t at = marked_call(word, calls_);
      if (at > calls_) continue;  // it broke in a later call: it had sent its part of this one
      broken_ = detail::concat("rank ", r, "'s buffer broke (it failed call ", at, ")");
      publish_(broken_marker(calls_));
      // A peer that broke in this very call fails it as it fails the ranks waiting in it.
      UBEP_CHECK(at < calls_, PeerFailedError, what, " (call ", calls_, "): rank ", r,
                 " failed call ", at,
                 " (its buffer is broken), so the call cannot complete on rank ", rank_);
      throw BrokenBufferError(detail::concat(what, " (call ", calls_,
                                             "): the buffer is broken after call ", calls_ - 1,
                                             ": ", broken_, "; create a new Buffer"));
    }
  }
  // This rank rejected its input before sending anything: peers waiting in this call learn it.
  void reject() {
    rejected_ = calls_;
    publish_(fail_marker(calls_));
  }
  // The call failed after the ranks started it: the ranks are out of step, so the buffer is
  // broken, for this rank and (through its word) for its peers.
  void fail(const char* what, const std::exception& cause) {
    if (broken_.empty()) broken_ = detail::concat(what, " failed: ", cause.what());
    publish_(broken_marker(calls_));
  }
  // Departure: peers waiting in a call this rank will never make learn it at once. After a
  // completed call M the word names M+1, so peers still finishing M (whose part this rank sent)
  // are not disturbed; in the middle of a split-phase call, or after rejecting call M (its part
  // of M was never sent, and this word replaces the rejection's), it names M. A broken buffer
  // has already published its word.
  void depart(bool idle) {
    if (!broken_.empty()) return;
    const bool sent_last = idle && !(rejected_ != 0 && rejected_ == calls_);
    publish_(broken_marker(sent_last ? calls_ + 1 : calls_));
  }

 private:
  void check_usable(const char* what, uint64_t call) const {
    UBEP_CHECK(broken_.empty(), BrokenBufferError, what, " (call ", call,
               "): the buffer is broken after call ", calls_, ": ", broken_,
               "; create a new Buffer");
  }

  int rank_, ranks_;
  std::function<uint32_t(int)> read_;
  std::function<void(uint32_t)> publish_;
  uint64_t calls_ = 0;
  uint64_t rejected_ = 0;  // the last call whose input this rank rejected (0: none)
  std::string broken_;
};

}  // namespace ubep::protocol
