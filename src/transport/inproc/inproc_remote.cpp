#include "transport/inproc/inproc_remote.hpp"

#include <cstring>

#include "ubep/error.hpp"

namespace ubep::transport {

void Mailboxes::put(int src, int dst, int tag, const void* data, size_t bytes) {
  std::vector<char> msg(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  std::lock_guard<std::mutex> lock(mu_);
  boxes_[{src, dst, tag}].push_back(std::move(msg));
}

bool Mailboxes::take(int src, int dst, int tag, void* data, size_t capacity, size_t* bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = boxes_.find({src, dst, tag});
  if (it == boxes_.end() || it->second.empty()) return false;
  std::vector<char>& msg = it->second.front();
  UBEP_CHECK_ARG(msg.size() <= capacity, "remote message of ", msg.size(), " bytes from rank ", src,
                 " exceeds the receive capacity ", capacity);
  if (!msg.empty()) std::memcpy(data, msg.data(), msg.size());  // an empty message has no data
  *bytes = msg.size();
  it->second.pop_front();
  return true;
}

int InprocRemote::slot() {
  for (size_t i = 0; i < pending_.size(); ++i)
    if (!pending_[i].live) return static_cast<int>(i);
  pending_.emplace_back();
  return static_cast<int>(pending_.size()) - 1;
}

int InprocRemote::isend(int peer, int tag, const void* data, size_t bytes) {
  boxes_->put(rank_, peer, tag, data, bytes);
  const int s = slot();
  pending_[static_cast<size_t>(s)] = Pending{false, peer, tag, nullptr, 0, bytes, true};
  return s;
}

int InprocRemote::irecv(int peer, int tag, void* data, size_t capacity) {
  const int s = slot();
  pending_[static_cast<size_t>(s)] = Pending{true, peer, tag, data, capacity, 0, true};
  return s;
}

bool InprocRemote::test(int request, size_t* bytes) {
  Pending& p = pending_[static_cast<size_t>(request)];
  if (p.recv && !boxes_->take(p.peer, rank_, p.tag, p.data, p.capacity, &p.bytes)) return false;
  if (bytes) *bytes = p.bytes;
  p.live = false;
  return true;
}

}  // namespace ubep::transport
