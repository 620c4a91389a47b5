#include "harness.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <sstream>

namespace ubep::test {

const char* impl_name(Impl i) {
  switch (i) {
    case Impl::kBsp:
      return "bsp";
    case Impl::kUbep:
      return "ubep";
    case Impl::kBaseline:
      return "baseline";
  }
  return "?";
}

std::string Case::describe() const {
  std::ostringstream os;
  os << "experts=" << experts << " hidden=" << hidden << " dtype=" << dtype_name(dtype)
     << " capacity=" << capacity << " topk=" << topk << " routing=" << static_cast<int>(routing)
     << " layout=" << layout_name(layout) << " placement=" << placement_name(placement)
     << " seed=" << seed << " tokens=[";
  for (auto t : tokens) os << t << " ";
  os << "]";
  return os.str();
}

BufferConfig config_for(const Case& c, Algorithm algo) {
  BufferConfig cfg;
  cfg.max_tokens_per_rank = c.capacity;
  cfg.hidden = c.hidden;
  cfg.dtype = c.dtype;
  cfg.num_experts = c.experts;
  cfg.max_topk = std::max(c.topk, 1);
  cfg.algorithm = algo;
  cfg.placement = c.placement;
  cfg.device = test_device();
  return cfg;
}

// Records the first mismatch and stops checking, but keeps the rank communicating so peers
// are not left waiting.
#define UBEP_TEST_EQ(a, b, ...)                                                         \
  do {                                                                                  \
    if (!bad && !((a) == (b))) {                                                        \
      ADD_FAILURE() << #a " == " #b ": " << (a) << " vs " << (b) << " " << __VA_ARGS__; \
      bad = true;                                                                       \
    }                                                                                   \
  } while (0)

using ubep::load_value;
using ubep::store_value;

std::vector<char> run_and_check(Group& g, const Case& c, const Problem& p, Buffer* buffer,
                                AlltoallBaseline* baseline, bool zero_copy_combine,
                                const std::function<Problem()>& expect,
                                const std::function<void()>& before_combine) {
  const int me = g.rank();
  const int El = c.experts / g.size();
  const int64_t H = c.hidden;
  const size_t es = dtype_size(c.dtype);
  const RankInput& in = p.inputs[static_cast<size_t>(me)];
  DispatchArgs args = in.args(c.dtype, H, c.layout);
  DispatchResult r = buffer ? buffer->dispatch(args) : baseline->dispatch(args);
  const Problem want_p = expect ? expect() : Problem{};
  const Problem& checked = expect ? want_p : p;
  ExpectedDispatch exp = expected_dispatch(checked, me);
  SCOPED_TRACE(c.describe() + " rank " + std::to_string(me));
  bool bad = false;

  const auto* counts = r.recv_count.as<const int64_t>();
  for (int e = 0; e < El; ++e)
    EXPECT_EQ(counts[e], static_cast<int64_t>(exp.expert_rows[static_cast<size_t>(e)].size()))
        << "expert " << e;

  // Where the rows of each (expert, source) are. The baseline returns no ranges: its rows are
  // packed (compact), which is what an empty recv_range means here.
  const bool per_source = buffer && r.placement == Placement::kPerSource;
  const int R = g.size();
  const int experts_dim = c.layout == Layout::kLatency ? El : 1;
  auto range_of = [&](int e, int s, int64_t expected_begin, int64_t expected_count) {
    int64_t begin = expected_begin, count = expected_count;
    if (r.recv_range.data) {
      const auto* rr =
          r.recv_range.as<const int64_t>() + 2 * (c.layout == Layout::kLatency ? e * R + s : s);
      begin = rr[0];
      count = rr[1];
    }
    UBEP_TEST_EQ(count, expected_count,
                 ""
                     << "range count of expert " << e << " source " << s);
    UBEP_TEST_EQ(begin, per_source ? s * c.capacity : expected_begin,
                 ""
                     << "range begin of expert " << e << " source " << s);
    return begin;
  };
  // expected rows of (e, s), in token order: indices into exp.src / exp.expert_rows[e]
  auto rows_of = [&](int e, int s) {
    std::vector<size_t> out;
    const auto& list =
        c.layout == Layout::kLatency ? exp.expert_rows[static_cast<size_t>(e)] : exp.src;
    for (size_t k = 0; k < list.size(); ++k)
      if (list[k][0] == s) out.push_back(k);
    return out;
  };

  std::vector<char> comb_in;
  if (c.layout == Layout::kThroughput) {
    EXPECT_EQ(r.num_recv_rows, static_cast<int64_t>(exp.src.size()));
    bad = r.num_recv_rows != static_cast<int64_t>(exp.src.size());
    EXPECT_EQ(r.recv_x.dim(0), per_source ? c.capacity * R : r.num_recv_rows);
    const auto* src = r.recv_src.as<const int64_t>();
    const auto* idx = r.recv_topk_idx.as<const int32_t>();
    const auto* w = r.recv_topk_weights.as<const float>();
    const auto* x = static_cast<const char*>(r.recv_x.data);
    comb_in.assign(static_cast<size_t>(r.recv_x.dim(0) * H) * es, 0);
    int64_t prefix = 0;
    for (int s = 0; s < R && !bad; ++s) {
      const std::vector<size_t> ks = rows_of(0, s);
      const int64_t begin = range_of(0, s, prefix, static_cast<int64_t>(ks.size()));
      prefix += static_cast<int64_t>(ks.size());
      for (size_t i = 0; i < ks.size() && !bad; ++i) {
        const size_t k = ks[i];
        const int64_t row = begin + static_cast<int64_t>(i);
        const auto& es_ = exp.src[k];
        UBEP_TEST_EQ(src[2 * row], es_[0],
                     ""
                         << "row " << row);
        UBEP_TEST_EQ(src[2 * row + 1], es_[1],
                     ""
                         << "row " << row);
        for (int j = 0; j < c.topk; ++j) {
          UBEP_TEST_EQ(idx[row * c.topk + j], exp.local_idx[k][static_cast<size_t>(j)],
                       ""
                           << "row " << row);
          UBEP_TEST_EQ(w[row * c.topk + j], exp.weights[k][static_cast<size_t>(j)],
                       ""
                           << "row " << row);
        }
        for (int64_t h = 0; h < H; ++h) {
          const float v = load_value(x, row * H + h, c.dtype);
          UBEP_TEST_EQ(v, p.value(static_cast<int>(es_[0]), es_[1], h),
                       ""
                           << "row " << row << " h " << h);
          store_value(comb_in.data(), row * H + h, expert_fn(v, me), c.dtype);
        }
      }
    }
  } else {
    const int64_t RT = r.recv_x.dim(1);
    EXPECT_EQ(RT, c.capacity * g.size());
    const auto* src = r.recv_src.as<const int64_t>();
    const auto* x = static_cast<const char*>(r.recv_x.data);
    comb_in.assign(static_cast<size_t>(El * RT * H) * es, 0);
    for (int e = 0; e < experts_dim; ++e) {
      const auto& rows = exp.expert_rows[static_cast<size_t>(e)];
      int64_t prefix = 0;
      for (int s = 0; s < R && !bad; ++s) {
        const std::vector<size_t> ks = rows_of(e, s);
        const int64_t begin = range_of(e, s, prefix, static_cast<int64_t>(ks.size()));
        prefix += static_cast<int64_t>(ks.size());
        for (size_t i = 0; i < ks.size() && !bad; ++i) {
          const auto& want = rows[ks[i]];
          const int64_t pos = e * RT + begin + static_cast<int64_t>(i);
          UBEP_TEST_EQ(src[2 * pos], want[0],
                       ""
                           << "expert " << e << " slot " << pos);
          UBEP_TEST_EQ(src[2 * pos + 1], want[1],
                       ""
                           << "expert " << e << " slot " << pos);
          for (int64_t h = 0; h < H; ++h) {
            const float v = load_value(x, pos * H + h, c.dtype);
            UBEP_TEST_EQ(v, p.value(static_cast<int>(want[0]), want[1], h), "");
            store_value(comb_in.data(), pos * H + h,
                        expert_fn(v, static_cast<int64_t>(me) * El + e), c.dtype);
          }
        }
      }
    }
  }

  CombineArgs ca;
  ca.handle = r.handle;
  if (c.layout == Layout::kThroughput)
    ca.x = TensorView(comb_in.data(), c.dtype, {r.recv_x.dim(0), H});
  else
    ca.x = TensorView(comb_in.data(), c.dtype, {El, r.recv_x.dim(1), H});
  ca.x.device = test_device();
  if (zero_copy_combine && buffer) {
    // The experts write straight into the buffer's shared combine input.
    TensorView zc = buffer->combine_buffer();
    EXPECT_EQ(zc.bytes(), comb_in.size());
    if (!comb_in.empty())  // no rows: nothing to copy (and data() may be null)
      std::memcpy(zc.data, comb_in.data(), std::min(zc.bytes(), comb_in.size()));
    ca.x = zc;
  }
  if (before_combine) before_combine();
  TensorView y = buffer ? buffer->combine(ca) : baseline->combine(ca);
  EXPECT_EQ(y.dim(0), in.tokens);
  std::vector<float> want = expected_combine(checked, me, c.layout);
  const auto* yb = static_cast<const char*>(y.data);
  for (int64_t i = 0; i < in.tokens * H; ++i) {
    const float got = load_value(yb, i, c.dtype);
    const float w = want[static_cast<size_t>(i)];
    uint32_t gb, wb;
    std::memcpy(&gb, &got, 4);
    std::memcpy(&wb, &w, 4);
    if (gb != wb) {
      ADD_FAILURE() << "combine mismatch at token " << i / H << " h " << i % H << ": got " << got
                    << " want " << w;
      break;
    }
  }
  return std::vector<char>(yb, yb + in.tokens * H * static_cast<int64_t>(es));
}

}  // namespace ubep::test
