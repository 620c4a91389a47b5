// One rank's view of the group's windows for one Buffer: the protocol's window map, the call's
// epoch (half and tag), and the message-level operations every algorithm is built from --
// publishing and testing count records, completing and testing rows. Every access to peer
// memory goes through the backend's data path.
#pragma once

#include <cstring>
#include <memory>

#include "backend/data_path.hpp"
#include "core/wait.hpp"
#include "protocol/protocol.hpp"
#include "ubep/buffer.hpp"

namespace ubep::ep {

// The ep layer speaks the wire formats (src/protocol) unqualified.
using namespace ::ubep::protocol;

class Window {
 public:
  Window(Group& group, const WindowLayout& map, backend::DataPath& dp, uint64_t initial_epoch)
      : map_(map), mem_(group.allocate_window(map.total)), dp_(dp), calls_(initial_epoch) {}

  const WindowLayout& map() const { return map_; }
  backend::DataPath& dp() const { return dp_; }
  size_t row_bytes() const { return map_.row_bytes; }   // a combine row
  const RowCodec& codec() const { return map_.codec; }  // dispatch rows
  size_t bytes() const { return map_.total; }

  // --- epochs: one sequence number per dispatch (its combine shares it) ---
  uint64_t begin_call() { return calls_.begin_call(); }
  uint64_t begin_repeat() { return calls_.begin_repeat(); }  // see CallSequence::begin_repeat
  uint64_t seq() const { return calls_.seq(); }
  void resume_after(uint64_t seq) { calls_.resume_after(seq); }
  int half() const { return calls_.half(); }
  uint32_t tag() const { return calls_.tag(); }
  void set_sync(SyncMode m) { sync_ = m; }
  SyncMode sync() const { return sync_; }

  // --- addresses (nullptr for ranks on other hosts) ---
  void* peer(int r) const { return mem_->base(r); }
  void* local() const { return mem_->local(); }
  // Elastic groups: a replacement's part of this window (SharedWindow::peer_incarnation).
  uint32_t peer_incarnation(int r) const { return mem_->peer_incarnation(r); }
  bool refresh_peer(int r) const { return mem_->refresh_peer(r); }
  template <typename T>
  T* at(int r, size_t region) const {
    return map_.at<T>(peer(r), half(), region);
  }
  CountRecord count(int dest, int source) const { return map_.count(peer(dest), half(), source); }

  // --- messages ---
  // Count record from `source` at `dest`, completed in the buffer's sync mode.
  void publish_count(int dest, int source, int32_t rows, int32_t topk, int32_t shape,
                     const int32_t* expert_rows) const {
    CountRecord rec = count(dest, source);
    const int32_t head[3] = {rows, topk, shape};
    dp_.put(rec.rows(), head, sizeof head);
    dp_.put(rec.expert_rows(), expert_rows, static_cast<size_t>(map_.local_experts) * 4);
    if (sync_ == SyncMode::kFused)
      dp_.publish(rec.tag(), tag());
    else  // stop-and-wait: fence, then a separate flag
      dp_.publish(map_.count_flag(peer(dest), half(), source), tag(), true);
  }
  bool count_arrived(int dest, int source) const {
    return dp_.arrived(sync_ == SyncMode::kFused ? count(dest, source).tag()
                                                 : map_.count_flag(peer(dest), half(), source),
                       tag());
  }
  // Marks a written message complete with this call's tag, in the sync mode.
  void complete(Tag* t) const { dp_.publish(t, tag(), sync_ == SyncMode::kStopAndWait); }
  bool arrived(const Tag* t) const { return dp_.arrived(t, tag()); }
  void put_row(char* dst, const char* src, bool stream) const {
    dp_.put_row(dst, src, row_bytes(), stream);
  }
  // A dispatch row's message: its payload into x_dst and its scales (if the codec has any) into
  // scale_dst; the caller adds the row's metadata and puts it with put_message.
  backend::RowMessage dispatch_message(char* x_dst, char* scale_dst, RowRef row,
                                       bool stream) const {
    backend::RowMessage m;
    m.payload_dst = x_dst;
    m.payload = row.payload;
    m.payload_bytes = map_.codec.payload_bytes;
    m.scale_bytes = map_.codec.scale_bytes;
    if (m.scale_bytes) {
      m.scale_dst = scale_dst;
      m.scales = row.scales;
    }
    m.stream = stream;
    return m;
  }
  void put_message(const backend::RowMessage& m) const { dp_.put_message(m); }

  // --- failures: a rank publishes into every local peer's window that it rejected a call or
  // that its buffer is broken; waits poll the words of their peers (FailureWatch).
  void publish_failure(int me, uint32_t word) const {
    for (int r = 0; r < map_.ranks; ++r)
      if (r != me && peer(r)) dp_.publish(map_.fail_word(peer(r), me), word);
  }
  uint32_t failure_of(int source) const { return dp_.load(map_.fail_word(local(), source)); }
  // A failure word in this rank's own window: a survivor writes kDeadWord for a dead rank (its
  // own copy; the dead rank writes nothing more), a rejoin clears it.
  void set_failure_of(int source, uint32_t word) const {
    dp_.publish(map_.fail_word(local(), source), word);
  }

  // --- membership records (protocol.hpp MemberRecord, ep/membership.hpp): a seqlock per
  // (source, destination) slot; the source is the only writer of its slot in every window.
  // fields: the record's words after the stamp. Writes into every peer on this host (`to`
  // selects, e.g. not the dead).
  template <typename To>
  void publish_member(int me, uint32_t version, const uint32_t* fields, int n, To&& to) const {
    for (int r = 0; r < map_.ranks; ++r) {
      if (r == me || !peer(r) || !to(r)) continue;
      Tag* w = map_.member_record(peer(r), me).words;
      dp_.publish(w, 2 * version + 1);  // odd: being rewritten
      for (int i = 0; i < n; ++i) dp_.publish(w + 1 + i, fields[i]);
      dp_.publish(w, 2 * version + 2);  // release: the fields above are visible with it
    }
  }
  // A record of a rank on another host, as it arrived over the transport (MemberLink), into this
  // rank's own window: that rank never writes here, so this rank is the slot's only writer and
  // the seqlock holds for the readers (role threads' FailureWatch).
  void store_member(int src, uint32_t version, const uint32_t* fields, int n) const {
    Tag* w = map_.member_record(local(), src).words;
    dp_.publish(w, 2 * version + 1);
    for (int i = 0; i < n; ++i) dp_.publish(w + 1 + i, fields[i]);
    dp_.publish(w, 2 * version + 2);
  }
  // Source `src`'s record in this window; false if never written or being rewritten.
  bool read_member(int src, uint32_t* fields, int n) const {
    const Tag* w = map_.member_record(local(), src).words;
    const uint32_t s1 = dp_.load(w);
    if (s1 == 0 || (s1 & 1u)) return false;
    for (int i = 0; i < n; ++i) fields[i] = dp_.load(w + 1 + i);
    return dp_.load(w) == s1;  // a field of a later version would make the stamp differ
  }
  uint32_t member_round(int src) const {
    return dp_.load(map_.member_record(local(), src).words + MemberRecord::kRound);
  }

 private:
  WindowLayout map_;
  std::unique_ptr<SharedWindow> mem_;
  backend::DataPath& dp_;
  SyncMode sync_ = SyncMode::kFused;
  CallSequence calls_;
};

}  // namespace ubep::ep
