// Topology files. Format (docs/SCHEDULING.md has the full description):
//
//   {
//     "name": "two-racks",                 optional; default: the file name
//     "ranks": 8,                          optional if the caller gives the rank count or a
//                                          level gives "domain_of"
//     "levels": [                          closest first; at least 2
//       {"name": "self", "latency_ns": 100, "bandwidth_gbps": 20},
//       {"name": "rack", "latency_ns": 900, "bandwidth_gbps": 100, "group_size": 4},
//       {"name": "net",  "latency_ns": 5000, "bandwidth_gbps": 25}
//     ],
//     "sim": {...}                         optional; ignored here: settings of a tool that reads
//                                          the same file (ubep-sim's ports and costs,
//                                          docs/sim/TOPOLOGY.md); must be an object
//   }
//
// The first level is "same rank" and the last joins every rank; each middle level places the
// ranks with exactly one of "group_size": n (ranks r with equal r / n share a domain) or
// "domain_of": [id per rank]. A group_size must divide the rank count (no partial group).
#include <cmath>
#include <fstream>
#include <sstream>

#include "json.hpp"
#include "ubep/error.hpp"
#include "ubep/topology.hpp"

namespace ubep::sched {

namespace {

using detail::JsonValue;

class Reader {
 public:
  explicit Reader(const std::string& origin) : origin_(origin) {}

  template <typename... Args>
  [[noreturn]] void fail(const JsonValue& at, const Args&... args) const {
    throw InvalidArgument(
        ::ubep::detail::concat(origin_, ":", at.line, ":", at.col, ": ", args...));
  }

  void need(const JsonValue& v, JsonValue::Kind kind, const std::string& what) const {
    if (v.kind != kind) {
      JsonValue want;
      want.kind = kind;
      fail(v, what, " must be ", want.kind_name(), ", got ", v.kind_name(),
           v.kind == JsonValue::Kind::kNumber || v.kind == JsonValue::Kind::kString
               ? " '" + v.text + "'"
               : std::string());
    }
  }
  double number(const JsonValue& v, const std::string& what) const {
    need(v, JsonValue::Kind::kNumber, what);
    if (!std::isfinite(v.number)) fail(v, what, " is out of range: ", v.text);
    return v.number;
  }
  int integer(const JsonValue& v, const std::string& what, int min) const {
    const double d = number(v, what);
    if (d != std::floor(d) || d < min || d > 1e9)
      fail(v, what, " must be an integer >= ", min, ", got ", v.text);
    return static_cast<int>(d);
  }
  void only_keys(const JsonValue& obj, std::initializer_list<const char*> allowed,
                 const std::string& what) const {
    for (const auto& [key, val] : obj.object) {
      bool ok = false;
      for (const char* a : allowed) ok = ok || key == a;
      if (!ok) {
        std::string list;
        for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
        fail(val, "unknown key \"", key, "\" in ", what, " (allowed: ", list, ")");
      }
    }
  }
  static const JsonValue* find(const JsonValue& obj, const char* key) {
    for (const auto& kv : obj.object)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }

 private:
  const std::string& origin_;
};

std::string stem(const std::string& path) {
  size_t b = path.find_last_of('/');
  b = b == std::string::npos ? 0 : b + 1;
  std::string s = path.substr(b);
  if (const size_t dot = s.rfind('.'); dot != std::string::npos && dot > 0) s.resize(dot);
  return s.empty() ? "topology" : s;
}

// The file's "name", else the file name's stem.
std::string read_name(const Reader& rd, const JsonValue& doc, const std::string& origin) {
  std::string name = stem(origin);
  if (const JsonValue* v = Reader::find(doc, "name")) {
    rd.need(*v, JsonValue::Kind::kString, "\"name\"");
    if (v->text.empty()) rd.fail(*v, "\"name\" must not be empty");
    name = v->text;
  }
  return name;
}

// Rank count: the file's "ranks", else the length of a domain_of list, else the caller's (ranks;
// 0 when the caller does not know it). Returns 0 when none says.
int rank_count(const Reader& rd, const JsonValue& doc, const JsonValue& lv, int ranks) {
  int file_ranks = 0;
  const JsonValue* ranks_at = Reader::find(doc, "ranks");
  if (ranks_at) file_ranks = rd.integer(*ranks_at, "\"ranks\"", 1);
  for (const JsonValue& l : lv.array) {
    if (l.kind != JsonValue::Kind::kObject) continue;  // reported by read_level
    if (const JsonValue* d = Reader::find(l, "domain_of")) {
      rd.need(*d, JsonValue::Kind::kArray, "\"domain_of\"");
      const int n = static_cast<int>(d->array.size());
      if (file_ranks && n != file_ranks)
        rd.fail(*d, "\"domain_of\" places ", n, " ranks but the topology has ", file_ranks);
      file_ranks = n;
      ranks_at = d;
    }
  }
  if (file_ranks && ranks && file_ranks != ranks)
    rd.fail(*ranks_at, "the file describes ", file_ranks, " ranks but the group has ", ranks);
  return file_ranks ? file_ranks : ranks;
}

// levels[i] of last + 1. A middle level's group_size or domain_of goes to placement (read once
// the rank count is known); the first and the last level have none.
Level read_level(const Reader& rd, const JsonValue& l, size_t i, size_t last,
                 const JsonValue*& placement) {
  const std::string what = "levels[" + std::to_string(i) + "]";
  rd.need(l, JsonValue::Kind::kObject, what);
  const bool middle = i > 0 && i < last;
  if (middle)
    rd.only_keys(l, {"name", "latency_ns", "bandwidth_gbps", "group_size", "domain_of"}, what);
  else
    rd.only_keys(l, {"name", "latency_ns", "bandwidth_gbps"},
                 what + (i == 0 ? " (the same-rank level)" : " (the top level, joins all ranks)"));
  Level level;
  const JsonValue* nm = Reader::find(l, "name");
  if (!nm) rd.fail(l, what, ": missing \"name\"");
  rd.need(*nm, JsonValue::Kind::kString, what + ".name");
  if (nm->text.empty()) rd.fail(*nm, what, ".name must not be empty");
  level.name = nm->text;
  const JsonValue* lat = Reader::find(l, "latency_ns");
  if (!lat) rd.fail(l, what, " ('", level.name, "'): missing \"latency_ns\"");
  level.latency_ns = rd.number(*lat, what + ".latency_ns");
  if (level.latency_ns < 0) rd.fail(*lat, what, ".latency_ns must be >= 0, got ", lat->text);
  const JsonValue* bw = Reader::find(l, "bandwidth_gbps");
  if (!bw) rd.fail(l, what, " ('", level.name, "'): missing \"bandwidth_gbps\"");
  level.bandwidth_gbps = rd.number(*bw, what + ".bandwidth_gbps");
  if (level.bandwidth_gbps <= 0) rd.fail(*bw, what, ".bandwidth_gbps must be > 0, got ", bw->text);
  placement = nullptr;
  if (!middle) return level;

  const JsonValue* gs = Reader::find(l, "group_size");
  const JsonValue* dm = Reader::find(l, "domain_of");
  if (!gs == !dm)
    rd.fail(l, what, " ('", level.name, "') needs exactly one of \"group_size\" and \"domain_of\"");
  placement = gs ? gs : dm;
  return level;
}

// The domain of each of n ranks at every middle level, from its group_size or domain_of.
std::vector<std::vector<int>> read_domains(const Reader& rd,
                                           const std::vector<const JsonValue*>& placements, int n) {
  std::vector<std::vector<int>> domains;
  for (size_t m = 0; m < placements.size(); ++m) {
    const JsonValue& p = *placements[m];
    const std::string what = "levels[" + std::to_string(m + 1) + "]";
    std::vector<int> d(static_cast<size_t>(n));
    if (p.kind != JsonValue::Kind::kArray) {
      const int g = rd.integer(p, what + ".group_size", 1);
      if (n % g != 0)
        rd.fail(p, what, ".group_size ", g, " does not divide the rank count ", n,
                " (every group must be full)");
      for (int r = 0; r < n; ++r) d[static_cast<size_t>(r)] = r / g;
    } else {
      for (int r = 0; r < n; ++r)
        d[static_cast<size_t>(r)] = rd.integer(p.array[static_cast<size_t>(r)],
                                               what + ".domain_of[" + std::to_string(r) + "]", 0);
    }
    domains.push_back(std::move(d));
  }
  return domains;
}

}  // namespace

Topology from_json_text(const std::string& text, int ranks, const std::string& origin) {
  UBEP_CHECK_ARG(ranks >= 0, origin, ": ranks must be >= 0 (0 = from the file), got ", ranks);
  const JsonValue doc = detail::parse_json(text, origin);
  const Reader rd(origin);
  rd.need(doc, JsonValue::Kind::kObject, "the top-level value");
  rd.only_keys(doc, {"name", "ranks", "levels", "sim"}, "the topology");
  if (const JsonValue* sim = Reader::find(doc, "sim"))
    rd.need(*sim, JsonValue::Kind::kObject, "\"sim\"");
  std::string name = read_name(rd, doc, origin);

  const JsonValue* lv = Reader::find(doc, "levels");
  if (!lv) rd.fail(doc, "missing key \"levels\"");
  rd.need(*lv, JsonValue::Kind::kArray, "\"levels\"");
  if (lv->array.size() < 2)
    rd.fail(*lv, "\"levels\" needs at least 2 levels (same rank, and one joining all ranks), got ",
            lv->array.size());
  const int n = rank_count(rd, doc, *lv, ranks);

  std::vector<Level> levels;
  std::vector<const JsonValue*> placements;  // per middle level: its group_size or domain_of
  const size_t last = lv->array.size() - 1;
  for (size_t i = 0; i <= last; ++i) {
    const JsonValue* placement = nullptr;
    levels.push_back(read_level(rd, lv->array[i], i, last, placement));
    if (placement) placements.push_back(placement);
  }
  // Placements need the rank count, known once every level has been read.
  if (n < 1) rd.fail(doc, "the rank count is unknown: add \"ranks\" or pass it");
  std::vector<std::vector<int>> domains = read_domains(rd, placements, n);
  try {
    return Topology(name, std::move(levels), n, std::move(domains));
  } catch (const InvalidArgument& e) {
    // Nesting errors and the like: say which file they come from.
    throw InvalidArgument(origin + ": " + e.what());
  }
}

Topology from_json(const std::string& path, int ranks) {
  std::ifstream in(path, std::ios::binary);
  UBEP_CHECK_ARG(in.good(), "cannot open topology file '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  UBEP_CHECK_ARG(!in.bad(), "cannot read topology file '", path, "'");
  return from_json_text(ss.str(), ranks, path);
}

}  // namespace ubep::sched
