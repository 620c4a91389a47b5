// The JSON files ubep-sim reads (ubep-bench --json output, calibration files), through the
// library's strict reader (src/sched/json.hpp): a malformed file is an error naming its line and
// column, never a key that a pattern silently failed to find.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "sched/json.hpp"

namespace ubep::sim {

using JsonValue = sched::detail::JsonValue;

// The file at `path`, parsed. `what` names the kind of file in the error when it cannot be read.
JsonValue read_json_file(const std::string& path, const std::string& what);

// A number member of an object, or nullptr when it is absent or null (sim/json.hpp writes a
// non-finite number as null). Another kind of value is an error naming `path` and the key.
const JsonValue* number_member(const JsonValue& object, const std::string& key,
                               const std::string& path);

// One ubep-bench --json file: {"config": {...}, "results": [{"impl", "op", "median_us", ...}]}.
struct BenchJson {
  std::string path;
  JsonValue doc;

  // A member of "config"; throws InvalidArgument naming the key when it is absent.
  std::string config_str(const std::string& key) const;
  double config_num(const std::string& key) const;
  // The config's "workload", or "" when the file has none.
  std::string workload() const;
  // (impl, op) -> median_us of every result row. Rows of another sync mode than "fused" (the
  // ablation rows) are left out, and so are rows without impl, op or median_us.
  std::map<std::pair<std::string, std::string>, double> medians() const;
};

BenchJson read_bench_json(const std::string& path);

}  // namespace ubep::sim
