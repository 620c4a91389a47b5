// ubep.deep_ep's normal (throughput) mode in one native call each (python/ubep/_deep_ep_normal.py):
// DeepEP's get_dispatch_layout, and its dispatch with the handle's arrays and the count exchange.
// From Python these took some twenty torch ops a call, twenty times the native dispatch of a
// small call (docs/DEEPEP.md, Performance). Part of the _ubep.Buffer binding (buffer.cpp binds
// the method, module.cpp the layout function).
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "buffer.hpp"
#include "interrupt.hpp"
#include "ubep/error.hpp"

namespace ubep::python {

namespace {

// Small arrays made for one call, carved out of one block (each 64-byte aligned): one
// allocation and one owner for all of them.
class ArrayBlock {
 public:
  // Reserves an array of `shape` (up to 2 dimensions) and returns its index.
  size_t add(DType t, std::initializer_list<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    TensorView v(nullptr, t, shape);
    offsets_.push_back(bytes_);
    views_.push_back(v);
    bytes_ += (static_cast<size_t>(n) * dtype_size(t) + 63) / 64 * 64;
    return views_.size() - 1;
  }
  // Allocates the block: the views point into it from here on.
  void make() {
    block_ = make_host_block(bytes_);
    for (size_t i = 0; i < views_.size(); ++i) views_[i].data = block_.data + offsets_[i];
  }
  template <typename T>
  T* data(size_t i) {
    return static_cast<T*>(views_[i].data);
  }
  pb::object tensor(size_t i) { return to_array(views_[i], block_.owner, Kind::kTorch); }

 private:
  std::vector<TensorView> views_;
  std::vector<size_t> offsets_;
  size_t bytes_ = 0;
  HostBlock block_{nullptr, pb::none()};
};

std::string ranks_of_row(const uint8_t* flags, int64_t R) {
  std::string s = "[";
  for (int64_t r = 0; r < R; ++r)
    if (flags[r]) s += (s.size() > 1 ? ", " : "") + std::to_string(r);
  return s + "]";
}

// The layout of topk_idx [T, k] over E experts on R ranks (get_dispatch_layout's): tokens per
// rank and per expert, and per token the ranks it goes to (flags [T, R], zeroed by the caller).
// Returns the index of the first entry outside [-1, E), or -1.
int64_t count_layout(const int64_t* idx, int64_t T, int64_t k, int64_t E, int64_t R,
                     int32_t* per_rank, int32_t* per_expert, uint8_t* flags) {
  const int64_t El = E / R;
  for (int64_t t = 0; t < T; ++t) {
    uint8_t* row = flags + t * R;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = idx[t * k + j];
      if (e == -1) continue;
      if (e < -1 || e >= E) return t * k + j;
      ++per_expert[e];
      if (!row[e / El]) {
        row[e / El] = 1;
        ++per_rank[e / El];
      }
    }
  }
  return -1;
}

// One call's layout arguments as the native dispatch reads them.
struct LayoutArgs {
  const uint8_t* flags;       // is_token_in_rank [T, R], 0 or not
  const int32_t* per_rank;    // num_tokens_per_rank [R]
  const int32_t* per_expert;  // num_tokens_per_expert [E]
  int64_t T, R, E;
};

// The layout arguments against the routing they describe (DeepEP trusts them; a mismatch there
// sends rows where the counts say none go). With topk_idx (idx [T, k], else nullptr) the layout
// is recomputed and compared whole; without it is_token_in_rank is the routing and the counts
// per rank follow it.
void check_layout(const LayoutArgs& l, const int64_t* idx, int64_t k) {
  const int64_t T = l.T, R = l.R, E = l.E;
  if (idx) {
    std::vector<int32_t> want_rank(static_cast<size_t>(R)), want_expert(static_cast<size_t>(E));
    std::vector<uint8_t> want_flags(static_cast<size_t>(T * R));
    const int64_t bad =
        count_layout(idx, T, k, E, R, want_rank.data(), want_expert.data(), want_flags.data());
    UBEP_CHECK_ARG(bad < 0, "dispatch: topk_idx row ", bad / std::max<int64_t>(k, 1),
                   " has expert id ", bad < 0 ? 0 : idx[bad], " outside [-1, ", E,
                   ") (num_tokens_per_expert has ", E, " experts)");
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < R; ++r)
        UBEP_CHECK_ARG((l.flags[t * R + r] != 0) == (want_flags[t * R + r] != 0),
                       "dispatch: is_token_in_rank row ", t, " marks ranks ",
                       ranks_of_row(l.flags + t * R, R), ", topk_idx row ", t, " goes to ranks ",
                       ranks_of_row(&want_flags[t * R], R));
    for (int64_t e = 0; e < E; ++e)
      UBEP_CHECK_ARG(l.per_expert[e] == want_expert[e], "dispatch: num_tokens_per_expert[", e,
                     "] is ", l.per_expert[e], ", topk_idx routes ", want_expert[e],
                     " tokens to expert ", e);
  }
  std::vector<int32_t> marked(static_cast<size_t>(R), 0);
  for (int64_t i = 0; i < T * R; ++i) marked[static_cast<size_t>(i % R)] += l.flags[i] != 0;
  for (int64_t r = 0; r < R; ++r)
    UBEP_CHECK_ARG(l.per_rank[r] == marked[static_cast<size_t>(r)],
                   "dispatch: num_tokens_per_rank[", r, "] is ", l.per_rank[r],
                   ", is_token_in_rank marks ", marked[static_cast<size_t>(r)], " tokens for rank ",
                   r);
}

// DeepEP's notify step: every rank's tokens per rank and per expert (R + E values), sent as one
// fp32 row to every rank through the `counts` window (exact: counts are far below 2^24); a
// masked rank sends none and counts as zeros. Returns its dispatch and the counts [source,
// R + E].
std::vector<int64_t> exchange_counts(Buffer& counts, const LayoutArgs& l, DispatchResult* g) {
  const int64_t R = l.R, W = l.R + l.E;
  const Device& dev = counts.config().device;
  std::vector<float> mine(static_cast<size_t>(W)), ones(static_cast<size_t>(R), 1.0f);
  std::vector<int64_t> everyone(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) mine[i] = static_cast<float>(l.per_rank[i]);
  for (int64_t e = 0; e < l.E; ++e) mine[R + e] = static_cast<float>(l.per_expert[e]);
  std::iota(everyone.begin(), everyone.end(), int64_t{0});
  DispatchArgs a{TensorView(mine.data(), DType::kFP32, {1, W}),
                 TensorView(everyone.data(), DType::kInt64, {1, R}),
                 TensorView(ones.data(), DType::kFP32, {1, R}), Layout::kThroughput};
  for (TensorView* v : {&a.x, &a.topk_idx, &a.topk_weights}) v->device = dev;
  *g = without_gil([&] { return counts.dispatch(a); });
  std::vector<int64_t> gathered(static_cast<size_t>(R * W), 0);
  const auto* rows = g->recv_x.as<const float>();
  const auto* src = g->recv_src.as<const int64_t>();
  for (int64_t i = 0; i < g->num_recv_rows; ++i)
    for (int64_t c = 0; c < W; ++c)
      gathered[static_cast<size_t>(src[2 * i] * W + c)] = static_cast<int64_t>(rows[i * W + c]);
  return gathered;
}

// The handle's arrays of dispatch r: rank_prefix_matrix [i][j] = tokens ranks 0..i send to j
// (from the exchanged counts); channel_prefix_matrix zeros (one channel per rank);
// recv_channel_prefix_matrix the first row of each source; send_head each token's position
// among those sent to a rank (-1: not sent there).
void fill_handle(const LayoutArgs& l, const DispatchResult& r, const std::vector<int64_t>& gathered,
                 int32_t* prefix, int32_t* channel, int32_t* begins, int32_t* send_head) {
  const int64_t R = l.R, W = l.R + l.E;
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < R; ++j)
      prefix[i * R + j] = static_cast<int32_t>(gathered[static_cast<size_t>(i * W + j)]) +
                          (i ? prefix[(i - 1) * R + j] : 0);
  std::memset(channel, 0, static_cast<size_t>(R) * sizeof(int32_t));
  const auto* range = r.recv_range.as<const int64_t>();
  for (int64_t i = 0; i < R; ++i) begins[i] = static_cast<int32_t>(range[2 * i]);
  std::vector<int32_t> sent(static_cast<size_t>(R), 0);
  for (int64_t i = 0; i < l.T * R; ++i)
    send_head[i] = l.flags[i] ? sent[static_cast<size_t>(i % R)]++ : -1;
}

// DeepEP's num_recv_tokens_per_expert_list: per local expert of rank `me`, the tokens all ranks
// send it, rounded up to `alignment`.
pb::list per_local_expert(const LayoutArgs& l, const std::vector<int64_t>& gathered, int64_t me,
                          int64_t alignment) {
  const int64_t R = l.R, W = l.R + l.E, El = l.E / l.R;
  pb::list out;
  for (int64_t e = 0; e < El; ++e) {
    int64_t c = 0;
    for (int64_t s = 0; s < R; ++s) c += gathered[static_cast<size_t>(s * W + R + me * El + e)];
    out.append((c + alignment - 1) / alignment * alignment);
  }
  return out;
}

}  // namespace

pb::tuple deep_ep_dispatch_layout(pb::handle topk_idx, int64_t num_experts, int64_t num_ranks) {
  UBEP_CHECK_ARG(num_ranks > 0 && num_experts > 0 && num_experts % num_ranks == 0,
                 "get_dispatch_layout: num_experts ", num_experts, " is not a multiple of the ",
                 num_ranks, " ranks");
  const Borrowed bi = borrow(topk_idx, "get_dispatch_layout: topk_idx", DType::kInt64, Device{});
  UBEP_CHECK_ARG(bi.view.ndim == 2, "get_dispatch_layout: topk_idx must be [tokens, topk], got ",
                 bi.view.describe());
  const int64_t T = bi.view.dim(0), k = bi.view.dim(1), R = num_ranks, E = num_experts;
  ArrayBlock out;
  const size_t per_rank = out.add(DType::kInt32, {R});
  const size_t per_expert = out.add(DType::kInt32, {E});
  const size_t flags = out.add(DType::kFP8E4M3, {T, R});  // bytes, viewed as bool by the caller
  out.make();
  const auto* idx = bi.view.as<const int64_t>();
  const int64_t bad = without_gil([&] {
    std::memset(out.data<int32_t>(per_rank), 0, static_cast<size_t>(R) * 4);
    std::memset(out.data<int32_t>(per_expert), 0, static_cast<size_t>(E) * 4);
    std::memset(out.data<uint8_t>(flags), 0, static_cast<size_t>(T * R));
    return count_layout(idx, T, k, E, R, out.data<int32_t>(per_rank), out.data<int32_t>(per_expert),
                        out.data<uint8_t>(flags));
  });
  UBEP_CHECK_ARG(bad < 0, "get_dispatch_layout: expert id ", bad < 0 ? 0 : idx[bad],
                 " outside [-1, ", E, ") (topk_idx row ", bad / std::max<int64_t>(k, 1), ")");
  return pb::make_tuple(out.tensor(per_rank), out.tensor(per_expert), out.tensor(flags));
}

pb::tuple PyBuffer::deep_ep_normal_dispatch(pb::handle self, PyBuffer& counts, pb::handle x,
                                            pb::handle x_scales, const std::string& x_dtype,
                                            pb::handle topk_idx, pb::handle topk_weights,
                                            pb::handle is_token_in_rank,
                                            pb::handle num_tokens_per_rank,
                                            pb::handle num_tokens_per_expert,
                                            int64_t expert_alignment) {
  PyBuffer& b = self.cast<PyBuffer&>();
  Buffer& buf = *b.buf_;
  check_host_memory(buf, "deep_ep_normal_dispatch");
  const BufferConfig& cfg = buf.config();
  const Device& dev = cfg.device;
  const int64_t R = buf.group().size(), me = buf.group().rank();
  const DispatchX bx = borrow_dispatch_x(cfg, x, x_scales, x_dtype);
  const int64_t T = bx.x.view.ndim >= 1 ? bx.x.view.dim(0) : 0;
  const Borrowed in_rank = borrow_flags(is_token_in_rank, "dispatch: is_token_in_rank", dev);
  const Borrowed per_rank =
      borrow(num_tokens_per_rank, "dispatch: num_tokens_per_rank", DType::kInt32, dev);
  const Borrowed per_expert =
      borrow(num_tokens_per_expert, "dispatch: num_tokens_per_expert", DType::kInt32, dev);
  const int64_t E = per_expert.view.numel();
  UBEP_CHECK_ARG(E == cfg.num_experts, "dispatch: num_tokens_per_expert has ", E,
                 " experts, this window ", cfg.num_experts);
  UBEP_CHECK_ARG(in_rank.view.ndim == 2 && in_rank.view.dim(0) == T && in_rank.view.dim(1) == R,
                 "dispatch: is_token_in_rank must be [", T, ", ", R, "], got ",
                 in_rank.view.describe());
  UBEP_CHECK_ARG(per_rank.view.numel() == R, "dispatch: num_tokens_per_rank must have ", R,
                 " entries (one per rank), got ", per_rank.view.describe());
  UBEP_CHECK_ARG(expert_alignment >= 1, "dispatch: expert_alignment must be >= 1, got ",
                 expert_alignment);
  const LayoutArgs l{.flags = static_cast<const uint8_t*>(in_rank.view.data),
                     .per_rank = per_rank.view.as<const int32_t>(),
                     .per_expert = per_expert.view.as<const int32_t>(),
                     .T = T,
                     .R = R,
                     .E = E};
  Borrowed bi, bw;
  const bool has_topk = !topk_idx.is_none();
  if (has_topk) {
    bi = borrow(topk_idx, "dispatch: topk_idx", DType::kInt64, dev);
    bw = borrow(topk_weights, "dispatch: topk_weights", DType::kFP32, dev);
    UBEP_CHECK_ARG(bi.view.ndim == 2 && bi.view.dim(0) == T, "dispatch: topk_idx must be [", T,
                   ", topk], got ", bi.view.describe());
  } else {
    UBEP_CHECK_ARG(topk_weights.is_none(),
                   "dispatch: pass topk_idx and topk_weights together (or neither)");
  }
  check_layout(l, has_topk ? bi.view.as<const int64_t>() : nullptr, has_topk ? bi.view.dim(1) : 0);
  const BufferConfig& ccfg = counts.buffer().config();
  UBEP_CHECK_ARG(ccfg.hidden == R + E && ccfg.num_experts == R && ccfg.dtype == DType::kFP32,
                 "deep_ep_normal_dispatch: the counts window must be fp32 [", R + E, "] over ", R,
                 " experts");

  // The handle's arrays sized by the call (the rest once the rows are counted): send_head
  // [T, R], rank_prefix_matrix, channel_prefix_matrix and recv_channel_prefix_matrix, and
  // without topk_idx the routing made from is_token_in_rank (kept for replays).
  ArrayBlock head;
  const size_t send_head = head.add(DType::kInt32, {T, R});
  const size_t prefix = head.add(DType::kInt32, {R, R});
  const size_t channel_prefix = head.add(DType::kInt32, {R, 1});
  const size_t begins = head.add(DType::kInt32, {R, 1});
  const size_t route = has_topk ? 0 : head.add(DType::kInt64, {T, R});
  head.make();
  DispatchArgs a;
  a.x = bx.x.view;
  a.x_scales = bx.scales.view;
  a.layout = Layout::kThroughput;
  if (has_topk) {
    a.topk_idx = bi.view;
    a.topk_weights = bw.view;
  } else {
    // One column per rank: its first expert where the token goes, else -1; weights ones.
    int64_t* rt = head.data<int64_t>(route);
    for (int64_t i = 0; i < T * R; ++i) rt[i] = l.flags[i] ? (i % R) * (E / R) : -1;
    a.topk_idx = TensorView(rt, DType::kInt64, {T, R});
    a.topk_idx.device = dev;
    a.topk_weights = b.ones(T, R);
  }
  const DispatchResult r = without_gil([&] { return buf.dispatch(a); });
  b.remember(r, T);

  DispatchResult g;
  const std::vector<int64_t> gathered = exchange_counts(counts.buffer(), l, &g);
  counts.remember(g, 1);
  fill_handle(l, r, gathered, head.data<int32_t>(prefix), head.data<int32_t>(channel_prefix),
              head.data<int32_t>(begins), head.data<int32_t>(send_head));

  // Per received row: its source token, and with topk_idx its top-k (int64 local expert ids or
  // -1) and weights, copied out of the window.
  const int64_t n = r.recv_x.dim(0);
  const int64_t rk = has_topk ? r.recv_topk_idx.dim(1) : 0;
  ArrayBlock rows;
  const size_t src_idx = rows.add(DType::kInt32, {n});
  const size_t recv_idx = has_topk ? rows.add(DType::kInt64, {n, rk}) : 0;
  const size_t recv_w = has_topk ? rows.add(DType::kFP32, {n, rk}) : 0;
  rows.make();
  const auto* rs = r.recv_src.as<const int64_t>();
  for (int64_t i = 0; i < n; ++i)
    rows.data<int32_t>(src_idx)[i] = static_cast<int32_t>(rs[2 * i + 1]);
  if (has_topk) {
    const auto* ri = r.recv_topk_idx.as<const int32_t>();
    int64_t* ti = rows.data<int64_t>(recv_idx);
    for (int64_t i = 0; i < n * rk; ++i) ti[i] = ri[i];
    std::memcpy(rows.data<float>(recv_w), r.recv_topk_weights.data,
                static_cast<size_t>(n * rk) * sizeof(float));
  }

  const pb::list per_local = per_local_expert(l, gathered, me, expert_alignment);
  pb::object none = pb::none();
  return pb::make_tuple(owned_copy(r.recv_x), owned_copy(r.recv_x_scales),
                        has_topk ? rows.tensor(recv_idx) : none,
                        has_topk ? rows.tensor(recv_w) : none, per_local, head.tensor(prefix),
                        head.tensor(channel_prefix), head.tensor(begins), rows.tensor(src_idx),
                        head.tensor(send_head), has_topk ? none : head.tensor(route), r.handle);
}

}  // namespace ubep::python
