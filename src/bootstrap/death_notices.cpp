#include "bootstrap/death_notices.hpp"

#include "core/log.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace ubep::bootstrap {

DeathNotices::DeathNotices(transport::Remote& remote, DeathWatch& watch, int rank,
                           const std::vector<int>& host_of)
    : remote_(remote), watch_(watch), rank_(rank), host_of_(host_of) {
  for (int r = 0; r < static_cast<int>(host_of_.size()); ++r)
    if (host_of_[static_cast<size_t>(r)] != host_of_[static_cast<size_t>(rank)])
      remotes_.push_back(r);
  inbox_.resize(remotes_.size());
  recv_.assign(remotes_.size(), -1);
  // At most one notice per (dead host-mate, remote rank): reserve so pointers stay valid.
  outbox_.reserve(host_of_.size() * remotes_.size());
  epoch_.assign(remotes_.size(), 0);
  for (size_t i = 0; i < remotes_.size(); ++i) post(i);
}

void DeathNotices::post(size_t i) {
  epoch_[i] = remote_.epoch(remotes_[i]);
  recv_[i] = remote_.irecv(remotes_[i], kTag, &inbox_[i], sizeof(Notice));
}

DeathNotices::~DeathNotices() {
  for (int& r : recv_)
    if (r >= 0) remote_.cancel(r);
  // Sends in flight: give them a moment (their peers may be gone), then leave them; a failure
  // notice's message goes with this object, so a transport that can withdraw its send does.
  flush(std::chrono::milliseconds(100));
  for (Outgoing& o : failures_out_)
    if (o.request >= 0) remote_.abandon(o.request);
}

// A transport that outlives a host (TcpRemote) fails the requests to a lost peer: a notice to
// or from it is moot (its loss reaches the death watch by itself: the transport's on_peer_lost,
// the heartbeat), so the request is dropped instead of failing the wait that pumps it (or the
// destructor that flushes it). Once done or dropped, `req` is -1.
DeathNotices::Outcome DeathNotices::settle(int& req) {
  Outcome out = kDone;
  try {
    if (!remote_.test(req, nullptr)) return kPending;
  } catch (const PeerFailedError& e) {
    log::debug("rank ", rank_, ": death notice dropped: ", e.what());
    remote_.cancel(req);
    out = kDropped;
  }
  req = -1;
  return out;
}

void DeathNotices::flush(std::chrono::milliseconds bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  for (int& s : send_)
    while (s >= 0 && std::chrono::steady_clock::now() < until)
      if (settle(s) == kPending) std::this_thread::yield();
  for (Outgoing& o : failures_out_)
    while (o.request >= 0 && std::chrono::steady_clock::now() < until)
      if (settle(o.request) == kPending) std::this_thread::yield();
}

void DeathNotices::tell_call_failure(int buffer, uint32_t word) {
  for (int peer : remotes_) {
    Outgoing& o = failures_out_.emplace_back();
    o.notice.rank = rank_;
    o.notice.kind = kCallFailure;
    o.notice.buffer = buffer;
    o.notice.word = word;
    try {
      o.request = remote_.isend(peer, kTag, &o.notice, sizeof o.notice);
    } catch (const PeerFailedError& e) {  // a lost peer (TcpRemote): nobody there to tell
      log::debug("rank ", rank_, ": failure notice to rank ", peer, " dropped: ", e.what());
      failures_out_.pop_back();
    }
  }
  pump();
  flush(std::chrono::milliseconds(100));
}

int DeathNotices::watch_call_failures(int buffer, std::function<void(int, uint32_t)> on) {
  const std::lock_guard lock(watchers_mu_);
  watchers_.push_back({next_watcher_, buffer, std::move(on)});
  return next_watcher_++;
}

void DeathNotices::unwatch_call_failures(int id) {
  const std::lock_guard lock(watchers_mu_);
  std::erase_if(watchers_, [id](const Watcher& w) { return w.id == id; });
}

void DeathNotices::deliver(int from, const Notice& n) {
  if (n.rank < 0 || n.rank >= static_cast<int>(host_of_.size())) return;
  if (n.kind == kCallFailure) {
    // The sender's own word (a rank only tells its own), for its Buffer of that number; a
    // Buffer not (or no longer) made here has no watcher and the word goes.
    if (n.rank != from) return;
    const std::lock_guard lock(watchers_mu_);
    for (const Watcher& w : watchers_)
      if (w.buffer == n.buffer) w.on(n.rank, n.word);
    return;
  }
  log::debug("rank ", rank_, ": rank ", n.rank, "'s death heard from rank ", from);
  watch_.note_remote(n.rank, std::string(n.how, strnlen(n.how, sizeof n.how)));
}

void DeathNotices::pump() {
  // Deaths on this host, once per process: a notice to every rank of the other hosts.
  for (int r = 0; r < static_cast<int>(host_of_.size()); ++r) {
    if (r == rank_ || host_of_[static_cast<size_t>(r)] != host_of_[static_cast<size_t>(rank_)])
      continue;
    if (!watch_.dead(r) || !watch_.claim_forward(r)) continue;
    for (int peer : remotes_) {
      if (outbox_.size() == outbox_.capacity()) break;
      Notice& n = outbox_.emplace_back();
      n.rank = r;
      std::snprintf(n.how, sizeof n.how, "%s", watch_.how(r).c_str());
      send_.push_back(remote_.isend(peer, kTag, &n, sizeof n));
      log::debug("rank ", rank_, ": rank ", r, "'s death forwarded to rank ", peer);
    }
  }
  for (int& s : send_)
    if (s >= 0) settle(s);
  std::erase_if(failures_out_,
                [this](Outgoing& o) { return o.request < 0 || settle(o.request) != kPending; });
  // Notices from the other hosts (none more from a lost peer: its receive is dropped), every
  // one that arrived: a peer's notices come in the order it sent them.
  for (size_t i = 0; i < remotes_.size(); ++i) {
    // A lost peer's replacement connected (a new epoch): its notices are heard again.
    if (recv_[i] < 0 && remote_.epoch(remotes_[i]) != epoch_[i]) post(i);
    while (recv_[i] >= 0 && settle(recv_[i]) == kDone) {
      const Notice n = inbox_[i];
      post(i);
      deliver(remotes_[i], n);
    }
  }
}

}  // namespace ubep::bootstrap
