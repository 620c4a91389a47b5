#include "bootstrap/mesh_collective.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "ubep/error.hpp"

namespace ubep::bootstrap {

namespace {
using Clock = std::chrono::steady_clock;
using Header = MeshCollective::Header;
using View = MeshCollective::View;
constexpr uint32_t kMagic = 0x5542434Du;  // "UBCM"

enum class Fit { kCurrent, kStale, kAhead };

// Where a chunk's call stands against this rank's call (see the header's view and seq rules).
// Views of the same sum and another digest (each side took a replacement the other has not yet)
// cannot be ordered: kept, as ahead, until this rank's view moves past or meets it.
Fit fit(const Header& h, const View& v, uint64_t seq) {
  if (h.view_sum < v.sum) return Fit::kStale;
  if (h.view_sum > v.sum || h.view_digest != v.digest) return Fit::kAhead;
  if (h.seq != seq) return h.seq < seq ? Fit::kStale : Fit::kAhead;
  return Fit::kCurrent;
}

// A message as it goes on the wire: its chunks one after the other, each [header, payload].
struct Wire {
  std::vector<char> bytes;
  std::vector<std::pair<size_t, size_t>> chunks;  // (offset in bytes, length)
};

Wire wire_of(Header h, const char* data, size_t total) {
  Wire w;
  const size_t room = MeshCollective::kChunk - sizeof(Header);
  size_t off = 0;
  do {
    const size_t n = std::min(room, total - off);
    h.offset = off;
    const size_t at = w.bytes.size();
    w.bytes.resize(at + sizeof h + n);
    std::memcpy(w.bytes.data() + at, &h, sizeof h);
    if (n > 0) std::memcpy(w.bytes.data() + at + sizeof h, data + off, n);
    w.chunks.emplace_back(at, sizeof h + n);
    off += n;
  } while (off < total);
  return w;
}
}  // namespace

// One attempt of one call, in one view: posts and sends at its start, moved on by step(),
// withdrawn by its destructor (a failed or restarted call leaves nothing posted that could take
// a later call's message, nor a send reading its freed buffers).
class MeshCollective::Call {
 public:
  Call(MeshCollective& c, const char* what, uint64_t index, View view, uint64_t seq, const void* in,
       size_t bytes);
  ~Call();
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  bool step();  // true once complete; throws PeerFailedError naming a lost peer
  void finish(void* out) const;
  const View& view() const { return view_; }
  std::string name() const { return detail::concat(what_, " #", index_); }
  std::string missing() const;
  // The ranks whose death would keep this call from completing.
  std::vector<int> awaited() const;

 private:
  struct Channel {  // one message from `peer` on `tag`, chunk by chunk
    int peer = -1, tag = 0;
    bool active = false, done = false, blocked = false;
    int req = -1;
    std::vector<char> chunk;  // the posted receive's buffer (kChunk)
    std::vector<char> data;   // the message
    uint64_t got = 0;
  };
  void open(Channel& ch, int peer, int tag, size_t total);
  void post(Channel& ch);
  void take(Channel& ch, size_t n);
  void take_current(Channel& ch, const Header& h, size_t n);
  bool advance(Channel& ch);
  bool tested(int req, size_t* n);
  void send(int peer, int tag, const Wire& w);
  void forward();

  MeshCollective& c_;
  const char* what_;
  uint64_t index_;
  View view_;
  uint64_t seq_;
  size_t bytes_;
  std::vector<char> in_;
  Wire mine_;
  std::vector<Channel> round1_;  // [rank]: active for the ranks of the other hosts
  Channel round2_;               // this host's contributions, from this rank's forwarder
  std::vector<Wire> forwards_;   // to the ranks this one forwards to, kept until sent
  std::vector<int> sends_;       // outstanding sends
  bool forwarded_ = false;
};

MeshCollective::Call::Call(MeshCollective& c, const char* what, uint64_t index, View view,
                           uint64_t seq, const void* in, size_t bytes)
    : c_(c), what_(what), index_(index), view_(view), seq_(seq), bytes_(bytes) {
  if (bytes > 0) in_.assign(static_cast<const char*>(in), static_cast<const char*>(in) + bytes);
  const Header h{kMagic, c.rank_, view.sum, view.digest, seq, bytes, 0};
  mine_ = wire_of(h, in_.data(), bytes);
  const int n = static_cast<int>(c.host_of_.size());
  round1_.resize(static_cast<size_t>(n));
  const int my_host = c.host_of_[static_cast<size_t>(c.rank_)];
  for (int q = 0; q < n; ++q)
    if (c.host_of_[static_cast<size_t>(q)] != my_host) {
      send(q, kTagGather, mine_);
      open(round1_[static_cast<size_t>(q)], q, kTagGather, bytes);
    }
  const size_t mates = c.hosts_[static_cast<size_t>(my_host)].size();
  open(round2_, c.forwarder(c.rank_), kTagForward, mates * bytes);
}

MeshCollective::Call::~Call() {
  for (Channel& ch : round1_)
    if (ch.req >= 0) c_.remote_.cancel(ch.req);
  if (round2_.req >= 0) c_.remote_.cancel(round2_.req);
  for (int s : sends_) c_.remote_.abandon(s);
}

void MeshCollective::Call::send(int peer, int tag, const Wire& w) {
  for (const auto& [at, len] : w.chunks)
    sends_.push_back(c_.remote_.isend(peer, tag, w.bytes.data() + at, len));
}

void MeshCollective::Call::open(Channel& ch, int peer, int tag, size_t total) {
  ch.peer = peer;
  ch.tag = tag;
  ch.active = true;
  ch.data.resize(total);
  // A chunk a call before this one read and kept for a later call: perhaps this one's.
  auto kept = c_.ahead_.find({peer, tag});
  if (kept == c_.ahead_.end()) return post(ch);
  ch.chunk = std::move(kept->second);
  c_.ahead_.erase(kept);
  take(ch, ch.chunk.size());
}

void MeshCollective::Call::post(Channel& ch) {
  ch.chunk.resize(kChunk);
  ch.req = c_.remote_.irecv(ch.peer, ch.tag, ch.chunk.data(), kChunk);
}

// The chunk in ch.chunk[0, n): dropped (an older call's: read the next), kept (a later call's:
// nothing more is read from that peer on that tag in this call), or this call's.
void MeshCollective::Call::take(Channel& ch, size_t n) {
  Header h{};
  UBEP_CHECK(n >= sizeof h, Error, name(), ": a message of ", n, " bytes from rank ", ch.peer,
             " (tag ", ch.tag, ") is not a chunk of ubep's group collectives");
  std::memcpy(&h, ch.chunk.data(), sizeof h);
  UBEP_CHECK(h.magic == kMagic && h.from == ch.peer, Error, name(), ": rank ", ch.peer,
             " sent a chunk that is not of ubep's group collectives (magic ", h.magic, ", from ",
             h.from, ", tag ", ch.tag, ")");
  switch (fit(h, view_, seq_)) {
    case Fit::kStale:
      return post(ch);
    case Fit::kAhead:
      ch.chunk.resize(n);
      c_.ahead_[{ch.peer, ch.tag}] = std::move(ch.chunk);
      ch.blocked = true;
      return;
    case Fit::kCurrent:
      return take_current(ch, h, n);
  }
}

void MeshCollective::Call::take_current(Channel& ch, const Header& h, size_t n) {
  const size_t payload = n - sizeof h;
  const bool forward = ch.tag == kTagForward;
  UBEP_CHECK_ARG(h.total == ch.data.size(), name(), ": rank ", ch.peer,
                 forward ? " forwarded this host's contributions as " : " passed ", h.total,
                 " bytes, this rank (", c_.rank_, ") expected ", ch.data.size(),
                 " (every rank passes the same bytes)");
  UBEP_CHECK(h.offset == ch.got && ch.got + payload <= ch.data.size(), Error, name(), ": rank ",
             ch.peer, "'s chunk at ", h.offset, " (", payload, " bytes) after ", ch.got, " of ",
             ch.data.size(), " bytes");
  if (payload > 0) std::memcpy(ch.data.data() + ch.got, ch.chunk.data() + sizeof h, payload);
  ch.got += payload;
  ch.done = ch.got == ch.data.size();  // a message of 0 bytes: its one chunk
  if (!ch.done) post(ch);
}

// A request's test, its failure named with this call.
bool MeshCollective::Call::tested(int req, size_t* n) {
  try {
    return c_.remote_.test_moved(req, n);  // step() moved the transport once for all
  } catch (const PeerFailedError& e) {
    throw PeerFailedError(detail::concat(e.what(), " in ", name()));
  }
}

bool MeshCollective::Call::advance(Channel& ch) {
  while (ch.active && !ch.done && !ch.blocked && ch.req >= 0) {
    size_t n = 0;
    if (!tested(ch.req, &n)) return false;
    ch.req = -1;
    take(ch, n);
  }
  return !ch.active || ch.done;
}

// Round 2: to every rank this one forwards to, the contributions of that rank's host.
void MeshCollective::Call::forward() {
  forwarded_ = true;
  forwards_.reserve(c_.host_of_.size());
  for (size_t x = 0; x < c_.host_of_.size(); ++x) {
    if (!round1_[x].active || c_.forwarder(static_cast<int>(x)) != c_.rank_) continue;
    std::vector<char> block;
    for (int m : c_.hosts_[static_cast<size_t>(c_.host_of_[x])]) {
      const std::vector<char>& d = round1_[static_cast<size_t>(m)].data;
      block.insert(block.end(), d.begin(), d.end());
    }
    const Header h{kMagic, c_.rank_, view_.sum, view_.digest, seq_, block.size(), 0};
    forwards_.push_back(wire_of(h, block.data(), block.size()));
    send(static_cast<int>(x), kTagForward, forwards_.back());
  }
}

bool MeshCollective::Call::step() {
  c_.remote_.progress();
  bool all = true;
  for (Channel& ch : round1_) all = advance(ch) && all;
  if (all && !forwarded_) forward();
  const bool mates = advance(round2_);
  for (size_t i = 0; i < sends_.size();)
    if (tested(sends_[i], nullptr))
      sends_.erase(sends_.begin() + static_cast<std::ptrdiff_t>(i));
    else
      ++i;
  return all && mates && forwarded_ && sends_.empty();
}

void MeshCollective::Call::finish(void* out) const {
  auto* o = static_cast<char*>(out);
  const std::vector<int>& mates = c_.hosts_[static_cast<size_t>(c_.host_of_[c_.rank_])];
  for (size_t r = 0; r < round1_.size(); ++r)
    if (round1_[r].active && bytes_ > 0)
      std::memcpy(o + r * bytes_, round1_[r].data.data(), bytes_);
  for (size_t i = 0; i < mates.size() && bytes_ > 0; ++i) {
    const char* d = round2_.data.data() + i * bytes_;
    UBEP_CHECK(mates[i] != c_.rank_ || std::memcmp(d, in_.data(), bytes_) == 0, Error, name(),
               ": rank ", round2_.peer, " forwarded this rank's contribution altered");
    std::memcpy(o + static_cast<size_t>(mates[i]) * bytes_, d, bytes_);
  }
}

std::string MeshCollective::Call::missing() const {
  std::string s;
  for (const Channel& ch : round1_)
    if (ch.active && !ch.done)
      s += detail::concat(s.empty() ? "" : ", ", "rank ", ch.peer,
                          ch.blocked ? " (at a later call)" : "");
  if (!round2_.done)
    s += detail::concat(s.empty() ? "" : ", ", "rank ", round2_.peer,
                        "'s forward of this host's contributions",
                        round2_.blocked ? " (at a later call)" : "");
  if (!sends_.empty()) s += detail::concat(s.empty() ? "" : ", ", sends_.size(), " sends");
  return s;
}

// Round 1's missing senders; while round 2 is missing, the forwarder and this host's other
// ranks (the forwarder needs their round 1), except one that exited cleanly: it completed the
// call, so every rank had entered it and the forwarder gets every message it needs.
std::vector<int> MeshCollective::Call::awaited() const {
  std::vector<int> ranks;
  for (const Channel& ch : round1_)
    if (ch.active && !ch.done) ranks.push_back(ch.peer);
  if (round2_.done) return ranks;
  ranks.push_back(round2_.peer);
  for (int m : c_.hosts_[static_cast<size_t>(c_.host_of_[static_cast<size_t>(c_.rank_)])])
    if (m != c_.rank_ && !(c_.hooks_.deaths && c_.hooks_.deaths->ended_cleanly(m)))
      ranks.push_back(m);
  return ranks;
}

// ---- the collective ---------------------------------------------------------------------------

MeshCollective::MeshCollective(int rank, std::vector<int> host_of, transport::Remote& remote,
                               MeshHooks hooks, std::chrono::milliseconds timeout)
    : rank_(rank),
      host_of_(std::move(host_of)),
      remote_(remote),
      hooks_(std::move(hooks)),
      timeout_(timeout) {
  int hosts = 0;
  for (int h : host_of_) hosts = std::max(hosts, h + 1);
  hosts_.resize(static_cast<size_t>(hosts));
  for (size_t r = 0; r < host_of_.size(); ++r)
    hosts_[static_cast<size_t>(host_of_[r])].push_back(static_cast<int>(r));
  UBEP_CHECK_ARG(hosts >= 2, "MeshCollective: the group spans ", hosts,
                 " host(s); a group on one host has no transport between hosts");
}

MeshCollective::View MeshCollective::view() const {
  View v;
  v.digest = 14695981039346656037ull;  // FNV-1a over the incarnations
  for (size_t r = 0; r < host_of_.size(); ++r) {
    const uint32_t inc = hooks_.incarnation ? hooks_.incarnation(static_cast<int>(r)) : 0;
    v.sum += inc;
    for (int b = 0; b < 4; ++b)
      v.digest = (v.digest ^ ((inc >> (8 * b)) & 0xffu)) * 1099511628211ull;
  }
  return v;
}

int MeshCollective::forwarder(int x) const {
  const int h = host_of_[static_cast<size_t>(x)];
  const std::vector<int>& mates = hosts_[static_cast<size_t>(h)];
  const auto local = static_cast<size_t>(std::find(mates.begin(), mates.end(), x) - mates.begin());
  const std::vector<int>& next = hosts_[static_cast<size_t>(h + 1) % hosts_.size()];
  return next[local % next.size()];
}

void MeshCollective::allgather(const void* in, void* out, size_t bytes) {
  UBEP_CHECK_ARG(bytes == 0 || (in && out), "group allgather: null buffer for ", bytes, " bytes");
  run("group allgather", in, out, bytes);
}

void MeshCollective::run(const char* what, const void* in, void* out, size_t bytes) {
  const uint64_t index = ++calls_;
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    if (hooks_.pump) hooks_.pump();  // replacements waiting: taken before the view is fixed
    const View v = view();
    if (!(v == last_view_)) {
      last_view_ = v;
      seq_ = 0;
    }
    Call call(*this, what, index, v, seq_++, in, bytes);
    if (wait(call, deadline)) return call.finish(out);
    // A replacement was taken while waiting: the call again, from round 1, in the new view (the
    // attempt's destructor withdrew its receives and sends).
  }
}

// Until the call completes (true) or the view changes (false); throws when a rank it waits for
// is lost or dead, or at the deadline. Between steps it blocks in the transport until bytes
// arrive (Remote::wait_for_progress), at most kCheckEvery, so deaths, the door and the deadline
// are looked at every kCheckEvery at least. It used to yield for 2 ms, then nap 20 us doubling to
// 500 us: each of the call's two hops then waited out a nap (and the yielding ranks took the CPU
// their peers needed, 6 ranks on 2 cores), so a barrier of 3x2 took about 1 ms against the star's
// 0.17 ms (docs/ELASTIC.md, "Latency: the mesh against the star").
bool MeshCollective::wait(Call& call, Clock::time_point deadline) {
  constexpr auto kCheckEvery = std::chrono::microseconds(1000);
  auto checked = Clock::now() - kCheckEvery;  // look at once
  for (;;) {
    if (call.step()) return true;
    const auto now = Clock::now();
    if (now - checked >= kCheckEvery) {
      checked = now;
      if (hooks_.deaths)
        for (int r : call.awaited()) hooks_.deaths->check(r, [&] { return call.name(); });
      if (hooks_.pump) {
        hooks_.pump();
        if (!(view() == call.view())) return false;
      }
      UBEP_CHECK(now <= deadline, TimeoutError, "rank ", rank_, " timed out after ",
                 std::chrono::duration<double>(timeout_).count(), " s in ", call.name(),
                 " waiting for ", call.missing(),
                 " (is that rank alive and making the same group call?)");
    }
    remote_.wait_for_progress(kCheckEvery);
  }
}

}  // namespace ubep::bootstrap
