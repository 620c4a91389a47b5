#include "ep/membership.hpp"

#include <algorithm>

#include "bootstrap/death_watch.hpp"
#include "bootstrap/group_hooks.hpp"
#include "core/log.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

namespace {
constexpr int kFieldsBeforeView = MemberRecord::kView - 1;  // the words after the stamp
// " [0 1m 2'1]": rank, m if masked, 'incarnation if not 0.
std::string view_text(const std::vector<uint32_t>& view) {
  std::string out = " [";
  for (size_t r = 0; r < view.size(); ++r) {
    // Appended piece by piece: `"literal" + std::string` trips GCC 12's -Wrestrict (bug 105329).
    if (r) out += ' ';
    out += std::to_string(r);
    if (view[r] & 1u) out += 'm';
    if (view[r] >> 1) (out += '\'') += std::to_string(view[r] >> 1);
  }
  return out + "]";
}
}  // namespace

Membership::Membership(Group& group, const Window& win, uint32_t config)
    : group_(group),
      win_(win),
      me_(group.rank()),
      ranks_(group.size()),
      config_(config),
      view_(static_cast<size_t>(group.size()), 0u),
      agreed_(view_),
      masked_(static_cast<size_t>(group.size()), 0),
      link_(group, win, kFieldsBeforeView + group.size()),
      failures_(group, link_.buffer_number()),
      refused_(static_cast<size_t>(group.size()), 0),
      partly_since_(static_cast<size_t>(group.size())) {
  // Ranks that are replacements already carry their incarnation; a replacement itself agrees
  // with the live ranks at its first dispatch.
  for (int r = 0; r < ranks_; ++r)
    view_[static_cast<size_t>(r)] = bootstrap::hooks_of(group).incarnation_of(r) << 1;
  agreed_ = view_;
  must_agree_ = bootstrap::hooks_of(group).mirrors_buffers();
}

bool Membership::replaced(int r) const {
  if (link_.remote(r)) return remote_replaced(r);
  const uint32_t stamp = win_.peer_incarnation(r);  // incarnation + 1, 0: none
  return r != me_ && stamp > 1 && stamp - 1 > (view_[static_cast<size_t>(r)] >> 1);
}

// A replacement host's rank (issue 32) is taken once the group has its new connection (the
// incarnation it said in its hello) and its first record of this buffer has arrived, naming
// itself live at that incarnation with this buffer's config digest: until then the live ranks
// go on masked, so a replacement still creating its buffers never holds up their calls.
bool Membership::remote_replaced(int r) const {
  return replaced_here(r) && (!joint_replaced_ || joint_replaced_(r));
}

bool Membership::knows_replacement(int r) const {
  const uint32_t inc = bootstrap::hooks_of(group_).incarnation_of(r);
  return (view_[static_cast<size_t>(r)] >> 1) >= inc || replaced_here(r);
}

bool Membership::replaced_here(int r) const {
  const uint32_t inc = bootstrap::hooks_of(group_).incarnation_of(r);
  const auto ru = static_cast<size_t>(r);
  if (inc <= (view_[ru] >> 1) || dead(r)) return false;
  Record rec;
  if (!read(r, &rec) || rec.view[ru] != (inc << 1)) return false;
  if (rec.config != config_) {
    if (refused_[ru] != inc)
      log::warn("rank ", me_, ": rank ", r, "'s replacement (incarnation ", inc,
                ") has a different BufferConfig (config digest ", rec.config, ", ours ", config_,
                "): not taken");
    refused_[ru] = inc;
    return false;
  }
  return true;
}

void Membership::check_config(int r, const Record& rec, const char* what) const {
  if (!bootstrap::hooks_of(group_).rejoining() || rec.config == 0 || rec.config == config_) return;
  throw InvalidArgument(detail::concat(
      what, ": this replacement's BufferConfig differs from live rank ", r, "'s (config digest ",
      config_, ", theirs ", rec.config,
      "): a replacement creates the same Buffers with the same configs as the live ranks "
      "(docs/ELASTIC.md)"));
}

void Membership::take_replacements() {
  for (int r = 0; r < ranks_; ++r) {
    if (link_.remote(r)) {
      if (!remote_replaced(r)) continue;
      const uint32_t inc = bootstrap::hooks_of(group_).incarnation_of(r);
      log::info("rank ", me_, ": rank ", r, "'s replacement (incarnation ", inc, ") taken");
      view_[static_cast<size_t>(r)] = inc << 1;
      continue;
    }
    // The mapping follows the rendezvous, not the view: a rank may learn of a replacement by
    // merging a peer's view before it has looked itself, and must map it all the same.
    if (r == me_ || !win_.refresh_peer(r)) continue;
    bootstrap::hooks_of(group_).peer_replaced(r);
    const uint32_t inc = win_.peer_incarnation(r) - 1;
    log::info("rank ", me_, ": rank ", r, "'s replacement (incarnation ", inc, ") mapped");
    // Live again as its new incarnation (merging moves every live rank's view here too); if
    // that process is dead already, absorb_deaths masks it at this incarnation, so it is not
    // taken again.
    if (inc > (view_[static_cast<size_t>(r)] >> 1)) view_[static_cast<size_t>(r)] = inc << 1;
  }
}

std::vector<int> Membership::masked_ranks() const {
  std::vector<int> out;
  for (int r = 0; r < ranks_; ++r)
    if (masked(r)) out.push_back(r);
  return out;
}

bool Membership::dead(int r) const {
  const bootstrap::DeathWatch* w = bootstrap::hooks_of(group_).death_watch();
  return w != nullptr && w->dead(r);
}

std::string Membership::death_note(int r) const { return group_.death_of(r); }

void Membership::mask(int r) {
  UBEP_CHECK_ARG(r >= 0 && r < ranks_, "mask: rank ", r, " out of range [0, ", ranks_, ")");
  UBEP_CHECK_ARG(r != me_, "mask: rank ", r, " cannot mask itself");
  UBEP_CHECK_ARG(group_.same_host(r, me_), "mask: rank ", r,
                 " is on another host; masking ranks works on one host (docs/ELASTIC.md)");
  view_[static_cast<size_t>(r)] |= 1u;
}

void Membership::rejoin() {
  uint32_t& v = view_[static_cast<size_t>(me_)];
  v = ((v >> 1) + 1) << 1;  // a new incarnation, unmasked
}

int Membership::dead_unmasked() const {
  for (int r = 0; r < ranks_; ++r)
    if (r != me_ && !masked(r) && dead(r)) return r;
  return -1;
}

bool Membership::read(int r, Record* out) const {
  std::vector<uint32_t> f(static_cast<size_t>(kFieldsBeforeView + ranks_));
  if (!win_.read_member(r, f.data(), static_cast<int>(f.size()))) return false;
  const auto word = [&](int i) { return f[static_cast<size_t>(i - 1)]; };
  out->round = word(MemberRecord::kRound);
  out->calls = word(MemberRecord::kCalls) | uint64_t{word(MemberRecord::kCalls + 1)} << 32;
  out->seq = word(MemberRecord::kSeq) | uint64_t{word(MemberRecord::kSeq + 1)} << 32;
  out->flags = word(MemberRecord::kFlags);
  out->config = word(MemberRecord::kConfig);
  out->view.assign(f.begin() + kFieldsBeforeView, f.end());
  return true;
}

int Membership::peer_ahead(uint64_t call) const {
  for (int r = 0; r < ranks_; ++r) {
    if (r == me_ || !linked(r) || dead(r)) continue;
    if (call > 0 && masked(r)) continue;  // takes no part in this call
    if (win_.member_round(r) <= round_) continue;
    if (call == 0) return r;
    Record rec;
    if (!read(r, &rec)) return r;  // being rewritten: it is changing, so it left this call too
    const uint64_t done = rec.calls - ((rec.flags & MemberRecord::kAbandoned) ? 1 : 0);
    if (done < call) return r;
  }
  return -1;
}

bool Membership::change_pending() const {
  if (must_agree_ || view_ != agreed_ || dead_unmasked() >= 0 || peer_ahead() >= 0) return true;
  for (int r = 0; r < ranks_; ++r)
    if (masked(r) && replaced(r)) return true;
  return false;
}

uint32_t Membership::max_round_seen() const {
  uint32_t m = round_;
  for (int r = 0; r < ranks_; ++r)
    if (r != me_ && linked(r) && !dead(r)) m = std::max(m, win_.member_round(r));
  return m;
}

void Membership::publish(uint32_t flags) {
  fields_.assign(static_cast<size_t>(kFieldsBeforeView + ranks_), 0u);
  const auto set = [&](int i, uint32_t v) { fields_[static_cast<size_t>(i - 1)] = v; };
  set(MemberRecord::kRound, round_);
  set(MemberRecord::kCalls, static_cast<uint32_t>(calls_));
  set(MemberRecord::kCalls + 1, static_cast<uint32_t>(calls_ >> 32));
  set(MemberRecord::kSeq, static_cast<uint32_t>(seq_));
  set(MemberRecord::kSeq + 1, static_cast<uint32_t>(seq_ >> 32));
  set(MemberRecord::kFlags, flags);
  set(MemberRecord::kConfig, config_);
  std::copy(view_.begin(), view_.end(), fields_.begin() + kFieldsBeforeView);
  published_view_ = view_;
  // Every peer on this host that can read it, masked ones included (a masked rank that
  // rejoins learns the round from them); not the dead.
  win_.publish_member(me_, ++version_, fields_.data(), static_cast<int>(fields_.size()),
                      [&](int r) { return !dead(r); });
  link_.publish(version_, fields_, [&](int r) { return !dead(r); });
}

void Membership::absorb_deaths(bool auto_mask, const char* what) {
  const bool hosts = !group_.single_host();
  for (int r = 0; r < ranks_; ++r) {
    if (!dead(r)) partly_since_[static_cast<size_t>(r)] = {};
    if (r == me_ || !live_in_view(r) || !dead(r)) continue;
    UBEP_CHECK(auto_mask, PeerFailedError, what, ": rank ", r, " ", death_note(r),
               hosts ? "; BufferConfig::mask_dead_ranks goes on without its host"
                     : detail::concat("; Buffer::mask(", r,
                                      ") on every surviving rank goes on without it "
                                      "(or BufferConfig::mask_dead_ranks)"));
    // Across hosts only whole hosts are masked (the relay needs every rank of a live host).
    // A host whose ranks are not all known dead yet is left for a later poll: its other
    // connections close (or its heartbeat stops) within the detection time.
    UBEP_CHECK(!hosts || !group_.same_host(r, me_), PeerFailedError, what, ": rank ", r, " ",
               death_note(r), "; across hosts only a whole lost host is masked, not a host-mate");
    if (hosts && !host_dead(group_.host_of(r))) {
      check_partly_lost(r, what);
      continue;
    }
    view_[static_cast<size_t>(r)] |= 1u;
    log::debug("rank ", me_, ": masks dead rank ", r, " (incarnation ", view_[r] >> 1, ", ",
               death_note(r), ")");
  }
  if (hosts) check_partition(what);
}

bool Membership::host_dead(int h) const {
  for (int r = 0; r < ranks_; ++r)
    if (group_.host_of(r) == h && live_in_view(r) && !dead(r)) return false;
  return true;
}

// A single rank lost while its host-mates live (issue 32): they fail at once (the check above,
// on their side), and every other host learns of the death at once too (its connections close,
// or its host-mates forward it: DeathNotices). Such a host cannot be masked (the relay needs
// every rank of a live host), but a whole host lost looks the same until its last rank is
// known dead, a few ms later (connections closing one after another, or heartbeat verdicts a
// period apart). So: a named error once kPartlyLostGrace has passed with a host-mate of r still
// alive; if the rest of the host ends later (its launcher may end it), it is masked as a lost
// host at the next dispatch.
void Membership::check_partly_lost(int r, const char* what) {
  constexpr auto kPartlyLostGrace = std::chrono::milliseconds(100);
  auto& since = partly_since_[static_cast<size_t>(r)];
  const auto now = std::chrono::steady_clock::now();
  if (since == std::chrono::steady_clock::time_point{}) since = now;
  if (now - since < kPartlyLostGrace) return;
  const int h = group_.host_of(r);
  std::string live;
  for (int q = 0; q < ranks_; ++q)
    if (group_.host_of(q) == h && live_in_view(q) && !dead(q))
      live += (live.empty() ? "" : ", ") + std::to_string(q);
  throw PeerFailedError(detail::concat(
      what, ": rank ", r, " ", death_note(r), ", but host ", h, " is partly lost: its rank(s) ",
      live, " still live after ",
      std::chrono::duration_cast<std::chrono::milliseconds>(now - since).count(),
      " ms; across hosts only a whole lost host is masked (the relay needs every rank of a live "
      "host): end that host (its ranks are then masked at the next dispatch, and a replacement "
      "host may rejoin) or make a new group"));
}

// No split brain: when hosts cannot see each other, both sides see the other dead. Only the
// side holding a majority of the hosts live at the last agreement goes on; at a tie, the side
// with the lowest of them. The other side stops here with a named error (and masks nobody), so
// at most one side ever completes a call in a new view.
void Membership::check_partition(const char* what) const {
  int before = 0, after = 0, lowest = -1;
  bool lowest_here = false;
  for (int h = 0; h < group_.num_hosts(); ++h) {
    bool was = false, is = false;
    for (int r = 0; r < ranks_; ++r)
      if (group_.host_of(r) == h) {
        was = was || !(agreed_[static_cast<size_t>(r)] & 1u);
        is = is || live_in_view(r);
      }
    before += was;
    after += is;
    if (was && lowest < 0) {
      lowest = h;
      lowest_here = is;
    }
  }
  const bool goes_on = 2 * after > before || (2 * after == before && lowest_here);
  UBEP_CHECK(goes_on, PeerFailedError, what, ": partitioned: rank ", me_, " sees ", after, " of ",
             before, " hosts", (2 * after == before ? " (a tie, without host " : ""),
             (2 * after == before ? std::to_string(lowest) + ")" : std::string()),
             "; the other side goes on, this side stops (docs/ELASTIC.md, partitions)");
}

bool Membership::merge(const std::vector<uint32_t>& other) {
  bool changed = false;
  for (int r = 0; r < ranks_; ++r) {
    uint32_t& mine = view_[static_cast<size_t>(r)];
    const uint32_t theirs = other[static_cast<size_t>(r)];
    const uint32_t merged = (theirs >> 1) != (mine >> 1) ? std::max(mine, theirs) : mine | theirs;
    // This rank's own entry is its own to decide: a peer's older view never masks it again.
    if (r == me_ && (merged >> 1) == (mine >> 1) && (merged & 1u) && !(mine & 1u)) continue;
    if (merged != mine) {
      mine = merged;
      changed = true;
    }
  }
  return changed;
}

void Membership::abandon(uint64_t calls, uint64_t seq, bool auto_mask) {
  if (auto_mask)
    for (int r = 0; r < ranks_; ++r)
      if (r != me_ && dead(r) &&
          (group_.single_host() ||
           (!group_.same_host(r, me_) && host_dead(group_.host_of(r)))))  // as absorb_deaths
        view_[static_cast<size_t>(r)] |= 1u;
  calls_ = calls;
  seq_ = seq;
  must_agree_ = true;
  abandoned_ = true;
  bump();
  log::debug("rank ", me_, ": abandons call ", calls, ", round ", round_);
  publish(MemberRecord::kAbandoned);
}

// One poll of the agreement: merges the live peers' views (and where they resume, into resume_).
bool Membership::poll(bool auto_mask, const char* what) {
  // A replacement host's connections first (its ranks are alive again before anything reads
  // their records: a merge naming one live must not find it still dead here and mask it).
  bootstrap::hooks_of(group_).pump_rejoins();
  link_.pump();  // other hosts' records (and our sends to them) move only when pumped
  take_replacements();
  absorb_deaths(auto_mask, what);
  bool changed = false;
  uint32_t top = round_;
  Record rec;
  for (int r = 0; r < ranks_; ++r) {
    if (r == me_ || !linked(r) || dead(r) || !read(r, &rec)) continue;
    const auto ru = static_cast<size_t>(r), mu = static_cast<size_t>(me_);
    // A record names its writer at the writer's own incarnation, so one older than the
    // incarnation this view has for r is a predecessor's: r's slot keeps the last record of a
    // lost (cut-off) rank until its replacement's first one arrives, and r can be live in this
    // view before that (a merged view of the replacement's host-mate names it). That record
    // speaks for a process that is gone (a cut-off rank's masks the hosts it lost sight of):
    // never merged, never checked (issue 32, vhosts_tcp_host_cycles_host0).
    if ((rec.view[ru] >> 1) < (view_[ru] >> 1)) continue;
    top = std::max(top, rec.round);
    if (live_in_view(r)) check_config(r, rec, what);
    // Masked peers' views count only when they bring themselves back.
    if (!live_in_view(r) && (rec.view[ru] >> 1) <= (view_[ru] >> 1)) continue;
    // Another host's replacement counts once taken (its config agreed): its own view must not
    // bring it in past that check.
    if (!live_in_view(r) && link_.remote(r) && !remote_replaced(r)) continue;
    // A live peer masked this very incarnation of this rank: it must rejoin to come back.
    UBEP_CHECK((rec.view[mu] & 1u) == 0 || (rec.view[mu] >> 1) != (view_[mu] >> 1), PeerFailedError,
               what, ": rank ", r, " masked rank ", me_, "; Buffer::rejoin() brings it back");
    changed = merge(rec.view) || changed;
  }
  take_replacements();  // merged views may name a replacement this rank has not mapped
  absorb_deaths(auto_mask, what);
  // A change of this rank's own (a death absorbed, a replacement taken) counts like a merge:
  // the peers must see it before anyone can conclude.
  changed = changed || view_ != published_view_;
  if (changed || top > round_) {
    round_ = changed ? top + 1 : top;
    publish(MemberRecord::kAgreeing | (abandoned_ ? MemberRecord::kAbandoned : 0));
    return false;
  }
  resume_ = {calls_, seq_};
  for (int r = 0; r < ranks_; ++r) {
    if (r == me_ || !live_in_view(r)) continue;
    // A record not marked agreeing is only the news of a change (a rank that left a call): that
    // rank bumps the round when it enters, so concluding on it would leave it behind.
    if (!linked(r) || !read(r, &rec) || rec.round != round_ || rec.view != view_ ||
        !(rec.flags & MemberRecord::kAgreeing))
      return false;
    resume_.calls = std::max(resume_.calls, rec.calls);
    resume_.seq = std::max(resume_.seq, rec.seq);
  }
  return true;
}

// What each rank last said, so a stuck agreement can be read off the timeout's message.
std::string Membership::agreement_state(const char* what) const {
  std::string state = detail::concat(what, ": the live ranks' agreement on masked ranks (", "rank ",
                                     me_, " round ", round_, " view", view_text(view_));
  for (int r = 0; r < ranks_; ++r) {
    if (r == me_) continue;
    Record peer;
    state += detail::concat("; rank ", r, dead(r) ? " dead" : "");
    if (linked(r) && read(r, &peer))
      state += detail::concat(" round ", peer.round,
                              (peer.flags & MemberRecord::kAgreeing) ? " agreeing" : "",
                              (peer.flags & MemberRecord::kAbandoned) ? " abandoned" : "", " view",
                              view_text(peer.view));
  }
  return state + ")";
}

Membership::Resume Membership::agree(uint64_t calls, uint64_t seq, bool auto_mask,
                                     const WaitPolicy& policy, const char* what) {
  begin_agreement(calls, seq, auto_mask, what);
  wait_until([&] { return poll(auto_mask, what); }, policy, [&] { return agreement_state(what); });
  return end_agreement();
}

void Membership::begin_agreement(uint64_t calls, uint64_t seq, bool auto_mask, const char* what) {
  calls_ = calls;
  seq_ = seq;
  log::debug("rank ", me_, ": agreement at call ", calls + 1, " (must ", must_agree_, ", view ",
             view_ != agreed_, ", dead ", dead_unmasked(), ", ahead ", peer_ahead(), ")");
  take_replacements();
  absorb_deaths(auto_mask, what);
  bump();
  publish(MemberRecord::kAgreeing | (abandoned_ ? MemberRecord::kAbandoned : 0));
  resume_ = {calls, seq};
}

Membership::Resume Membership::end_agreement() {
  for (int r = 0; r < ranks_; ++r) {
    const auto ru = static_cast<size_t>(r);
    // A rank back as a new incarnation: its old failure word (kDeadWord) goes; it writes anew.
    if (r != me_ && (view_[ru] >> 1) != (agreed_[ru] >> 1) && !(view_[ru] & 1u)) {
      win_.set_failure_of(r, 0);
      failures_.clear(r);
    }
  }
  agreed_ = view_;
  must_agree_ = false;
  abandoned_ = false;
  for (int r = 0; r < ranks_; ++r) masked_[static_cast<size_t>(r)] = agreed_[r] & 1u;
  log::info("rank ", me_, ": round ", round_, " agreed, ", masked_ranks().size(),
            " masked, resuming after call ", resume_.calls);
  return resume_;
}

}  // namespace ubep::ep
