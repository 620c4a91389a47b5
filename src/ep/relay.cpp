#include "ep/relay.hpp"

#include <algorithm>
#include <cstring>

#include "bootstrap/group_hooks.hpp"
#include "ubep/error.hpp"

namespace ubep {

using protocol::relay_wire::Header;
using protocol::relay_wire::kHeader;
using protocol::relay_wire::meta_offset;
using protocol::relay_wire::PackedToken;
using protocol::relay_wire::read_header;
using protocol::relay_wire::write_header;

HostRelay::HostRelay(Group& g, const BufferConfig& cfg, ep::Window& win)
    : g_(g),
      cfg_(cfg),
      win_(win),
      remote_(bootstrap::hooks_of(g).remote()),
      local_experts_(cfg.num_experts / g.size()),
      max_tokens_(cfg.max_tokens_per_rank) {
  hosts_.resize(static_cast<size_t>(g.num_hosts()));
  local_index_.resize(static_cast<size_t>(g.size()));
  for (int r = 0; r < g.size(); ++r) {
    auto& h = hosts_[static_cast<size_t>(g.host_of(r))];
    local_index_[static_cast<size_t>(r)] = static_cast<int>(h.size());
    h.push_back(r);
  }
  my_host_ = g.host_of(g.rank());
  const size_t cap = kHeader + static_cast<size_t>(max_tokens_) * record_bytes();
  const auto R = static_cast<size_t>(g.size()), El = static_cast<size_t>(local_experts_);
  const size_t TH = static_cast<size_t>(max_tokens_) * static_cast<size_t>(cfg.hidden);
  for (int s = 0; s < g.size(); ++s) {
    const int hs = g.host_of(s);
    if (hs == my_host_) continue;
    const auto& mine = hosts_[static_cast<size_t>(my_host_)];
    if (mine[static_cast<size_t>(local_index_[static_cast<size_t>(s)]) % mine.size()] != g.rank())
      continue;
    Relayed r;
    r.source = s;
    r.msg[0].resize(cap);
    r.msg[1].resize(cap);
    r.row_off.resize(R);
    r.expert_off.resize(R * El);
    r.partial.resize(TH);
    r.rows_seen.resize(R);
    r.experts_seen.resize(R * El);
    relayed_.push_back(std::move(r));
  }
  out_.resize(hosts_.size());
  in_partial_.resize(hosts_.size());
  in_partial_req_.assign(hosts_.size(), -1);
  for (size_t h = 0; h < hosts_.size(); ++h) {
    if (static_cast<int>(h) == my_host_) continue;
    out_[h].resize(cap);
    in_partial_[h].resize(TH);
  }
  host_slot_.resize(static_cast<size_t>(max_tokens_) * hosts_.size());
  scratch_rows_.resize(R);
  scratch_expert_.resize(R * El);
  count_rows_.resize(R);
  // A token has at most max(K, ranks of this host) contributions on this host.
  const size_t most =
      std::max(static_cast<size_t>(cfg.max_topk), hosts_[static_cast<size_t>(my_host_)].size());
  gather_rows_.resize(most);
  gather_weights_.resize(most);
  gather_slots_.resize(most);
  count_experts_.resize(R * El);
}

bool HostRelay::local(int r) const { return g_.host_of(r) == my_host_; }

size_t HostRelay::record_bytes() const {
  return protocol::relay_wire::record_bytes(win_.codec().row_bytes(), cfg_.max_topk);
}

HostRelay::~HostRelay() {
  if (!remote_) return;
  for (Relayed& s : relayed_)
    if (s.request >= 0) remote_->abandon(s.request);
  for (int r : in_partial_req_)
    if (r >= 0) remote_->abandon(r);
  for (int r : out_req_) remote_->abandon(r);  // sends still queued read from out_ / partials
}

bool HostRelay::host_masked(size_t h) const {
  for (int r : hosts_[h])
    if (!call_->masked(r)) return false;
  return true;
}

void HostRelay::abandon_call() {
  for (Relayed& s : relayed_)
    if (s.request >= 0) {
      remote_->abandon(s.request);
      s.request = -1;
    }
  for (int& r : in_partial_req_)
    if (r >= 0) {
      remote_->abandon(r);
      r = -1;
    }
  for (int r : out_req_) remote_->abandon(r);
  out_req_.clear();
  in_combine_ = false;
}

void HostRelay::start_dispatch(const ep::DispatchCall& call) {
  call_ = &call;
  seq_ = win_.seq();
  sent_bytes_ = sent_rows_ = 0;
  const int half = win_.half();
  // Only messages of this call may wait unmatched: a peer cannot be a dispatch ahead of this
  // rank (its dispatch needs this rank's message), so any other relay tag is an earlier call's.
  const int tag = dispatch_tag();
  remote_->drop_unexpected([tag](int, int t) {
    return protocol::relay_wire::is_relay_tag(t) && t != tag && t != tag + 1;
  });
  for (Relayed& s : relayed_) {
    // A masked source sends nothing: its count records stay empty, as receivers expect.
    const bool gone = call.masked(s.source);
    s.counted = s.forwarded = s.partial_sent = gone;
    s.request = gone ? -1 : remote_->irecv(s.source, tag, s.msg[half].data(), s.msg[half].size());
  }
  pack();
}

void HostRelay::pack() {
  const int K = call_->routing().topk, El = local_experts_;
  // A wire row is the codec's: payload then scales (protocol.hpp).
  const protocol::RowCodec& codec = win_.codec();
  const size_t rec = record_bytes(), RB = codec.row_bytes();
  const size_t nh = hosts_.size();
  for (size_t h = 0; h < nh; ++h) {
    if (static_cast<int>(h) == my_host_) continue;
    if (host_masked(h)) {  // its experts are dropped from the routing (-1): no token goes there
      for (int64_t t = 0; t < call_->routing().num_tokens; ++t)
        host_slot_[static_cast<size_t>(t) * nh + h] = -1;
      continue;
    }
    char* out = out_[h].data();
    int32_t n = 0;
    for (int64_t t = 0; t < call_->routing().num_tokens; ++t) {
      const int32_t* idx = &call_->routing().topk_idx[static_cast<size_t>(t * K)];
      bool there = false;
      for (int j = 0; j < K && !there; ++j)
        there = idx[j] >= 0 && g_.host_of(idx[j] / El) == static_cast<int>(h);
      host_slot_[static_cast<size_t>(t) * nh + h] = there ? n : -1;
      if (!there) continue;
      const PackedToken p{out + kHeader + static_cast<size_t>(n) * rec, RB, K};
      p.write(codec, call_->rows().row(t), static_cast<int32_t>(t), idx,
              &call_->routing().topk_weights[static_cast<size_t>(t * K)]);
      ++n;
    }
    write_header(out, Header{n, K, call_->shape()});
    const size_t bytes = kHeader + static_cast<size_t>(n) * rec;
    const auto& target = hosts_[h];
    const int relay =
        target[static_cast<size_t>(local_index_[static_cast<size_t>(g_.rank())]) % target.size()];
    out_req_.push_back(remote_->isend(relay, dispatch_tag(), out, bytes));
    sent_bytes_ += bytes;
    sent_rows_ += static_cast<uint64_t>(n);
  }
}

// Visits every (token, local destination) of a relayed message in order, with the token's slot
// among the source's rows for that destination and its per-k expert slots.
template <typename Visit>
void HostRelay::walk(const Relayed& s, Visit&& visit) const {
  const char* msg = s.msg[win_.half()].data();
  const Header header = read_header(msg);
  const int n = header.tokens, K = header.topk, El = local_experts_;
  auto& rows = const_cast<std::vector<int64_t>&>(scratch_rows_);
  auto& experts = const_cast<std::vector<int64_t>&>(scratch_expert_);
  std::fill(rows.begin(), rows.end(), 0);
  std::fill(experts.begin(), experts.end(), 0);
  int32_t slots[64];
  for (int i = 0; i < n; ++i) {
    PackedToken p{const_cast<char*>(msg) + kHeader + static_cast<size_t>(i) * record_bytes(),
                  win_.codec().row_bytes(), K};
    for (int j = 0; j < K; ++j) {
      const int32_t e = p.idx()[j];
      slots[j] = -1;
      if (e >= 0 && local(e / El))
        slots[j] = static_cast<int32_t>(experts[static_cast<size_t>(e)]++);
    }
    for (int d : hosts_[static_cast<size_t>(my_host_)]) {
      bool there = false;
      for (int j = 0; j < K && !there; ++j) there = p.idx()[j] >= 0 && p.idx()[j] / El == d;
      if (there) visit(i, p, d, rows[static_cast<size_t>(d)]++, slots);
    }
  }
}

void HostRelay::write_counts(Relayed& s) {
  const int El = local_experts_;
  std::vector<int32_t>& rows = count_rows_;
  std::vector<int32_t>& experts = count_experts_;
  std::fill(rows.begin(), rows.end(), 0);
  std::fill(experts.begin(), experts.end(), 0);
  int K = 0;
  walk(s, [&](int, const PackedToken& p, int d, int64_t, const int32_t*) {
    K = p.K;
    ++rows[static_cast<size_t>(d)];
    for (int j = 0; j < p.K; ++j)
      if (p.idx()[j] >= 0 && p.idx()[j] / El == d) ++experts[static_cast<size_t>(p.idx()[j])];
  });
  const Header header = read_header(s.msg[win_.half()].data());
  if (K == 0) K = header.topk;
  for (int d : hosts_[static_cast<size_t>(my_host_)])  // the source's call shape, as it sent it
    win_.publish_count(d, s.source, rows[static_cast<size_t>(d)], K, header.shape,
                       &experts[static_cast<size_t>(d * El)]);
  s.counted = true;
}

bool HostRelay::lower_counts_ready(const Relayed& s, int dest) const {
  if (!call_->offsets_need_counts()) return true;  // per-source placement: nothing to wait for
  for (int lower = 0; lower < s.source; ++lower)
    if (!win_.count_arrived(dest, lower)) return false;
  return true;
}

void HostRelay::forward(Relayed& s) {
  const int El = local_experts_;
  if (read_header(s.msg[win_.half()].data()).shape !=
      call_->shape()) {  // a different call: receivers name it from the count record
    s.forwarded = true;
    return;
  }
  for (int d : hosts_[static_cast<size_t>(my_host_)]) {
    if (!call_->offsets_need_counts()) {  // per-source: the source's fixed region
      int64_t* eo = &s.expert_off[static_cast<size_t>(d * El)];
      std::fill(eo, eo + El, s.source * max_tokens_);
      s.row_off[static_cast<size_t>(d)] = s.source * max_tokens_;
      continue;
    }
    int64_t rows = 0;
    int64_t* eo = &s.expert_off[static_cast<size_t>(d * El)];
    std::fill(eo, eo + El, 0);
    for (int lower = 0; lower < s.source; ++lower) {
      protocol::CountRecord rec = win_.count(d, lower);
      rows += *rec.rows();
      for (int e = 0; e < El; ++e) eo[e] += rec.expert_rows()[e];
    }
    s.row_off[static_cast<size_t>(d)] = rows;
  }
  walk(s, [&](int, const PackedToken& p, int d, int64_t slot, const int32_t* slots) {
    call_->place_row(win_, d, s.source, *p.token(), protocol::wire_row(p.row(), win_.codec()),
                     p.idx(), nullptr, p.w(), p.K, slot, slots, s.row_off[static_cast<size_t>(d)],
                     &s.expert_off[static_cast<size_t>(d * El)],
                     [&](protocol::Tag* tag) { win_.complete(tag); });
  });
  s.forwarded = true;
}

bool HostRelay::counts_forwarded() const {
  return std::all_of(relayed_.begin(), relayed_.end(), [](const Relayed& s) { return s.counted; });
}

bool HostRelay::progress() {
  bool done = true;
  for (Relayed& s : relayed_) {
    if (s.request >= 0) {
      if (!remote_->test(s.request, nullptr)) {
        done = false;
        continue;
      }
      s.request = -1;
      write_counts(s);
    }
    if (!s.forwarded) {
      bool ready = true;
      for (int d : hosts_[static_cast<size_t>(my_host_)]) ready = ready && lower_counts_ready(s, d);
      if (ready) forward(s);
    }
    if (in_combine_ && s.forwarded && !s.partial_sent) advance_partials(s);
    done = done && s.forwarded && (!in_combine_ || s.partial_sent);
  }
  for (size_t i = 0; i < out_req_.size();) {
    if (remote_->test(out_req_[i], nullptr)) {
      out_req_[i] = out_req_.back();
      out_req_.pop_back();
    } else {
      ++i;
    }
  }
  return done && out_req_.empty();
}

// ---- combine ----

void HostRelay::start_combine(const ep::DispatchCall& call) {
  call_ = &call;
  sent_bytes_ = sent_rows_ = 0;
  in_combine_ = true;
  for (Relayed& s : relayed_) {
    s.partial_sent = call.masked(s.source);  // nothing to send back to a masked source
    s.cursor = 0;
  }
  for (size_t h = 0; h < hosts_.size(); ++h) {
    in_partial_req_[h] = -1;
    if (static_cast<int>(h) == my_host_ || host_masked(h)) continue;
    const auto& target = hosts_[h];
    const int relay =
        target[static_cast<size_t>(local_index_[static_cast<size_t>(g_.rank())]) % target.size()];
    in_partial_req_[h] = remote_->irecv(relay, combine_tag(), in_partial_[h].data(),
                                        in_partial_[h].size() * sizeof(float));
  }
}

// Reduces the relayed tokens of source s in order, as far as their rows have arrived, resuming
// where the last call stopped (cursor and slot counters live in Relayed); sends the partials
// once every token is done. Throughput: ascending rank; latency: ascending k (DESIGN §2).
void HostRelay::advance_partials(Relayed& s) {
  const int El = local_experts_;
  const int64_t H = cfg_.hidden;
  const char* msg = s.msg[win_.half()].data();
  const Header header = read_header(msg);
  const int n = header.tokens, K = header.topk;
  if (s.cursor == 0) {
    std::fill(s.rows_seen.begin(), s.rows_seen.end(), 0);
    std::fill(s.experts_seen.begin(), s.experts_seen.end(), 0);
  }
  const void** rows = gather_rows_.data();
  float* weights = gather_weights_.data();
  int64_t* dslot = gather_slots_.data();
  for (; s.cursor < n; ++s.cursor) {
    PackedToken p{const_cast<char*>(msg) + kHeader + static_cast<size_t>(s.cursor) * record_bytes(),
                  win_.codec().row_bytes(), K};
    int count = 0;
    bool ready = true;
    if (call_->layout() == Layout::kThroughput) {
      for (int d : hosts_[static_cast<size_t>(my_host_)]) {
        bool there = false;
        for (int j = 0; j < K && !there; ++j) there = p.idx()[j] >= 0 && p.idx()[j] / El == d;
        if (!there) continue;
        const int64_t pos = s.row_off[static_cast<size_t>(d)] + s.rows_seen[static_cast<size_t>(d)];
        dslot[count] = d;
        ready = ready && win_.arrived(win_.at<protocol::Tag>(d, win_.map().comb_tag) + pos);
        rows[count++] =
            win_.at<char>(d, win_.map().comb_x) + static_cast<size_t>(pos) * win_.row_bytes();
      }
    } else {
      for (int j = 0; j < K; ++j) {
        const int32_t e = p.idx()[j];
        if (e < 0 || !local(e / El)) continue;
        const int d = e / El;
        const int64_t pos = (e % El) * call_->expert_slots() +
                            s.expert_off[static_cast<size_t>(d * El + e % El)] +
                            s.experts_seen[static_cast<size_t>(e)];
        dslot[count] = e;
        weights[count] = p.w()[j];
        ready = ready && win_.arrived(win_.at<protocol::Tag>(d, win_.map().comb_tag) + pos);
        rows[count++] =
            win_.at<char>(d, win_.map().comb_x) + static_cast<size_t>(pos) * win_.row_bytes();
      }
    }
    if (!ready) return;  // resume here on the next progress()
    float* part = &s.partial[static_cast<size_t>(s.cursor) * static_cast<size_t>(H)];
    std::fill(part, part + H, 0.0f);
    for (int c = 0; c < count; ++c) {
      if (call_->layout() == Layout::kThroughput) {
        win_.dp().accumulate_row(part, rows[c], combine_dtype(cfg_), H, nullptr);
        ++s.rows_seen[static_cast<size_t>(dslot[c])];
      } else {
        win_.dp().accumulate_row(part, rows[c], combine_dtype(cfg_), H, &weights[c]);
        ++s.experts_seen[static_cast<size_t>(dslot[c])];
      }
    }
  }
  const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(H) * sizeof(float);
  out_req_.push_back(remote_->isend(s.source, combine_tag(), s.partial.data(), bytes));
  sent_bytes_ += bytes;
  sent_rows_ += static_cast<uint64_t>(n);
  s.partial_sent = true;
}

bool HostRelay::combine_partial_arrived(int h) {
  int& req = in_partial_req_[static_cast<size_t>(h)];
  if (req >= 0 && remote_->test(req, nullptr)) req = -1;
  return req < 0;
}

const float* HostRelay::partial(int h, int64_t t) const {
  const int32_t slot = host_slot_[static_cast<size_t>(t) * hosts_.size() + static_cast<size_t>(h)];
  if (slot < 0) return nullptr;
  return in_partial_[static_cast<size_t>(h)].data() +
         static_cast<size_t>(slot) * static_cast<size_t>(cfg_.hidden);
}

bool HostRelay::combine_done() {
  bool done = progress();
  for (size_t h = 0; h < hosts_.size(); ++h)
    if (static_cast<int>(h) != my_host_)
      done = combine_partial_arrived(static_cast<int>(h)) && done;
  if (done) in_combine_ = false;
  return done;
}

}  // namespace ubep
