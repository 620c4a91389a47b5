// Where the bound puts each row: where the call puts it. The latency layout's API fixes the
// rows' addresses (recv_x [local experts, ranks * max tokens, hidden], each source's rows of an
// expert at its region, in token order), so no implementation can read or write them anywhere
// else; a bound that packs them instead measures a cheaper problem than the call solves
// (`packed`, kept for comparison: the layout's own cost).
#include "bench.hpp"
#include "ubep/error.hpp"

namespace ubep::tools {

RowPlaces place_rows(Group& g, const std::vector<SendRow>& sends, const BoundShape& shape,
                     bool packed) {
  const int R = g.size(), me = g.rank();
  const auto Rz = static_cast<size_t>(R);
  const bool latency = shape.layout == Layout::kLatency && !packed;
  const Placement placement = shape.placement != Placement::kAuto ? shape.placement
                              : shape.layout == Layout::kLatency  ? Placement::kPerSource
                                                                  : Placement::kCompact;
  const bool per_source = placement == Placement::kPerSource && !packed;
  const int El = latency ? shape.local_experts : 1;
  const auto Elz = static_cast<size_t>(El);
  const int64_t T = shape.max_tokens, RT = static_cast<int64_t>(R) * T;
  // Rows from me to each (destination, local expert) -- the whole destination when El is 1.
  auto bin = [&](const SendRow& r) {
    const int el = latency ? r.expert % El : 0;
    UBEP_CHECK_ARG(!latency || r.expert >= 0, "place_rows: a latency row without its expert");
    return static_cast<size_t>(r.dest) * Elz + static_cast<size_t>(el);
  };
  std::vector<int64_t> mine(Rz * Elz, 0), index(sends.size());
  for (size_t i = 0; i < sends.size(); ++i) index[i] = mine[bin(sends[i])]++;
  std::vector<int64_t> all(Rz * Rz * Elz);  // [source][destination][local expert]
  g.allgather(mine.data(), all.data(), mine.size() * sizeof(int64_t));
  auto count = [&](int s, int d, int el) {
    return all[(static_cast<size_t>(s) * Rz + static_cast<size_t>(d)) * Elz +
               static_cast<size_t>(el)];
  };
  // First row of source s's rows of local expert el at destination d.
  auto first = [&](int s, int d, int el) {
    int64_t begin = latency ? static_cast<int64_t>(el) * RT : 0;
    if (per_source) return begin + static_cast<int64_t>(s) * T;
    for (int q = 0; q < s; ++q) begin += count(q, d, el);
    return begin;
  };
  RowPlaces p;
  int64_t most = 1;  // rows any destination receives, as one region (packed or throughput)
  for (int d = 0; d < R; ++d) {
    int64_t rows = 0;
    for (int s = 0; s < R; ++s) rows += count(s, d, 0);
    most = std::max(most, rows);
  }
  p.region_rows = latency ? static_cast<int64_t>(El) * RT : per_source ? RT : most;
  p.pos.resize(sends.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    const int el = latency ? sends[i].expert % El : 0;
    p.pos[i] = first(me, sends[i].dest, el) + index[i];
  }
  for (int el = 0; el < El; ++el)  // as recv_range lists them: by expert, then source
    for (int s = 0; s < R; ++s)
      if (const int64_t n = count(s, me, el); n > 0) p.runs.emplace_back(first(s, me, el), n);
  return p;
}

}  // namespace ubep::tools
