#include "fuzz_check.hpp"

#include <cstring>
#include <sstream>

#include "ubep/bf16.hpp"

namespace ubep::fuzz {

namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <typename... Args>
std::string say(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// Expected rows of (expert e, source s) in token order: indices into the reference's list.
std::vector<size_t> rows_of(const test::ExpectedDispatch& ex, Layout layout, int e, int s) {
  const auto& list = layout == Layout::kLatency ? ex.expert_rows[static_cast<size_t>(e)] : ex.src;
  std::vector<size_t> out;
  for (size_t k = 0; k < list.size(); ++k)
    if (list[k][0] == s) out.push_back(k);
  return out;
}

// Calls fn(e, source rank, source token, row of recv_x counted over all experts) for every
// received row, in the reference's order, after checking the range that holds it.
template <typename Fn>
std::string for_each_row(const RankView& v, const DispatchResult& r, Fn&& fn) {
  const test::Problem& p = v.problem;
  const int R = p.ranks, El = p.experts / p.ranks;
  const int64_t T = v.config.max_tokens_per_rank;
  const test::ExpectedDispatch ex = test::expected_dispatch(p, v.me);
  const bool latency = v.layout == Layout::kLatency;
  const bool per_source = v.placement == Placement::kPerSource;
  const auto* range = r.recv_range.as<const int64_t>();
  for (int e = 0; e < (latency ? El : 1); ++e) {
    int64_t prefix = 0;
    for (int s = 0; s < R; ++s) {
      const std::vector<size_t> ks = rows_of(ex, v.layout, e, s);
      const int64_t* rr = range + 2 * (latency ? e * R + s : s);
      const auto count = static_cast<int64_t>(ks.size());
      const int64_t begin = per_source ? s * T : prefix;
      if (rr[0] != begin || rr[1] != count)
        return say("range of expert ", e, " source ", s, " is (", rr[0], ", ", rr[1], "), want (",
                   begin, ", ", count, ")");
      prefix += count;
      for (int64_t i = 0; i < count; ++i) {
        const auto& want = latency
                               ? ex.expert_rows[static_cast<size_t>(e)][ks[static_cast<size_t>(i)]]
                               : ex.src[ks[static_cast<size_t>(i)]];
        const int64_t row = (latency ? e * r.recv_x.dim(1) : 0) + begin + i;
        std::string err =
            fn(e, static_cast<int>(want[0]), want[1], row, ks[static_cast<size_t>(i)], ex);
        if (!err.empty()) return err;
      }
    }
  }
  return "";
}

float expert_value(const RankView& v, float x, int local_expert) {
  const int El = v.problem.experts / v.problem.ranks;
  return test::expert_fn(x, v.layout == Layout::kLatency ? v.me * El + local_expert : v.me);
}

}  // namespace

std::string check_dispatch(const RankView& v, const DispatchResult& r) {
  const test::Problem& p = v.problem;
  const int R = p.ranks, El = p.experts / p.ranks;
  const int64_t T = v.config.max_tokens_per_rank, H = p.hidden;
  const DType dt = p.dtype;
  if (r.layout != v.layout) return say("result layout ", layout_name(r.layout));
  if (r.placement != v.placement) return say("result placement ", placement_name(r.placement));
  const test::ExpectedDispatch ex = test::expected_dispatch(p, v.me);
  const auto* counts = r.recv_count.as<const int64_t>();
  if (r.recv_count.numel() != El) return say("recv_count has ", r.recv_count.numel(), " entries");
  for (int e = 0; e < El; ++e)
    if (counts[e] != static_cast<int64_t>(ex.expert_rows[static_cast<size_t>(e)].size()))
      return say("recv_count[", e, "] = ", counts[e], ", want ",
                 ex.expert_rows[static_cast<size_t>(e)].size());
  const bool latency = v.layout == Layout::kLatency;
  if (!latency) {
    if (r.num_recv_rows != static_cast<int64_t>(ex.src.size()))
      return say("num_recv_rows ", r.num_recv_rows, ", want ", ex.src.size());
    const int64_t span = v.placement == Placement::kPerSource ? T * R : r.num_recv_rows;
    if (r.recv_x.dim(0) != span || r.recv_x.dim(1) != H)
      return say("recv_x is ", r.recv_x.describe(), ", want ", span, " rows");
  } else if (r.recv_x.dim(0) != El || r.recv_x.dim(1) != T * R || r.recv_x.dim(2) != H) {
    return say("recv_x is ", r.recv_x.describe());
  }
  const auto* src = r.recv_src.as<const int64_t>();
  const char* x = static_cast<const char*>(r.recv_x.data);
  return for_each_row(v, r,
                      [&](int e, int s, int64_t t, int64_t row, size_t k,
                          const test::ExpectedDispatch& ex2) -> std::string {
                        if (src[2 * row] != s || src[2 * row + 1] != t)
                          return say("expert ", e, " row ", row, ": src (", src[2 * row], ", ",
                                     src[2 * row + 1], "), want (", s, ", ", t, ")");
                        for (int64_t h = 0; h < H; ++h)
                          if (!same_bits(load_value(x, row * H + h, dt), p.value(s, t, h)))
                            return say("expert ", e, " row ", row, " h ", h, ": x ",
                                       load_value(x, row * H + h, dt), ", want ", p.value(s, t, h));
                        if (latency) return "";
                        const int K = p.inputs[0].topk;
                        const auto* idx = r.recv_topk_idx.as<const int32_t>();
                        const auto* w = r.recv_topk_weights.as<const float>();
                        for (int j = 0; j < K; ++j) {
                          if (idx[row * K + j] != ex2.local_idx[k][static_cast<size_t>(j)])
                            return say("row ", row, " k ", j, ": local expert ", idx[row * K + j],
                                       ", want ", ex2.local_idx[k][static_cast<size_t>(j)]);
                          if (!same_bits(w[row * K + j], ex2.weights[k][static_cast<size_t>(j)]))
                            return say("row ", row, " k ", j, ": weight ", w[row * K + j],
                                       ", want ", ex2.weights[k][static_cast<size_t>(j)]);
                        }
                        return "";
                      });
}

std::vector<char> expert_outputs(const RankView& v, const DispatchResult& r) {
  const int64_t H = v.problem.hidden;
  const DType dt = v.problem.dtype;
  std::vector<char> out(r.recv_x.bytes(), 0);
  const char* x = static_cast<const char*>(r.recv_x.data);
  for_each_row(v, r, [&](int e, int, int64_t, int64_t row, size_t, const auto&) {
    for (int64_t h = 0; h < H; ++h)
      store_value(out.data(), row * H + h, expert_value(v, load_value(x, row * H + h, dt), e), dt);
    return std::string();
  });
  return out;
}

std::string check_compact(const RankView& v, const TensorView& rows, std::vector<char>* outputs) {
  const test::Problem& p = v.problem;
  const int El = p.experts / p.ranks;
  const int64_t H = p.hidden;
  const test::ExpectedDispatch ex = test::expected_dispatch(p, v.me);
  // Reference order: by local expert (latency) or overall, then source rank, then token.
  std::vector<std::array<int64_t, 3>> want;  // (expert, rank, token)
  if (v.layout == Layout::kLatency) {
    for (int e = 0; e < El; ++e)
      for (const auto& st : ex.expert_rows[static_cast<size_t>(e)])
        want.push_back({e, st[0], st[1]});
  } else {
    for (const auto& st : ex.src) want.push_back({0, st[0], st[1]});
  }
  if (rows.ndim != 2 || rows.dim(0) != static_cast<int64_t>(want.size()) || rows.dim(1) != H)
    return say("compact() is ", rows.describe(), ", want ", want.size(), " rows");
  outputs->assign(rows.bytes(), 0);
  const char* x = static_cast<const char*>(rows.data);
  for (size_t i = 0; i < want.size(); ++i) {
    const auto row = static_cast<int64_t>(i);
    for (int64_t h = 0; h < H; ++h) {
      const float got = load_value(x, row * H + h, p.dtype);
      if (!same_bits(got, p.value(static_cast<int>(want[i][1]), want[i][2], h)))
        return say("compact() row ", i, " h ", h, ": ", got);
      store_value(outputs->data(), row * H + h, expert_value(v, got, static_cast<int>(want[i][0])),
                  p.dtype);
    }
  }
  return "";
}

std::string check_combine(const RankView& v, const TensorView& y) {
  const test::Problem& p = v.problem;
  const test::RankInput& in = p.inputs[static_cast<size_t>(v.me)];
  const int64_t H = p.hidden;
  if (y.ndim != 2 || y.dim(0) != in.tokens || y.dim(1) != H || y.dtype != p.dtype)
    return say("combine output is ", y.describe(), ", want [", in.tokens, ", ", H, "]");
  const std::vector<float> want = test::expected_combine(p, v.me, v.layout);
  for (int64_t i = 0; i < in.tokens * H; ++i) {
    const float got = load_value(y.data, i, p.dtype);
    if (!same_bits(got, want[static_cast<size_t>(i)]))
      return say("combine token ", i / H, " h ", i % H, ": ", got, ", want ",
                 want[static_cast<size_t>(i)]);
  }
  return "";
}

}  // namespace ubep::fuzz
