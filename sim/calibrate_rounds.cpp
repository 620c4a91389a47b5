// calibrate_rounds.hpp: the best-of-rounds calibration and each round's own.
#include "sim/calibrate_rounds.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "sim/json.hpp"
#include "sim/json_read.hpp"
#include "ubep/error.hpp"

namespace ubep::sim {

CalibrationFields read_calibration_fields(const std::string& path) {
  const JsonValue doc = read_json_file(path, "calibration file");
  UBEP_CHECK_ARG(doc.kind == JsonValue::Kind::kObject, "calibration file '", path,
                 "' is not a JSON object, got ", doc.kind_name());
  CalibrationFields out;
  for (const auto& [key, value] : doc.object) {
    const JsonValue* v = number_member(doc, key, path);  // throws on a non-number
    out.emplace_back(key, v ? v->number : std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

void write_calibration_fields(const CalibrationFields& fields, const std::string& path) {
  Json j;
  j.begin_object();
  for (const auto& [k, v] : fields) j.kv(k, v);  // NaN is written null
  j.end_object();
  j.write(path);
}

CalibrationFields best_of_rounds(const std::vector<CalibrationFields>& rounds,
                                 const std::vector<std::string>& names) {
  UBEP_CHECK_ARG(!rounds.empty(), "calibrate --rounds: no calibration files");
  std::vector<std::map<std::string, double>> by_key;
  for (const CalibrationFields& r : rounds) by_key.emplace_back(r.begin(), r.end());
  auto values = [&](const std::string& key) {
    std::vector<double> v;
    for (size_t i = 0; i < rounds.size(); ++i) {
      auto it = by_key[i].find(key);
      UBEP_CHECK_ARG(it != by_key[i].end(), "calibrate --rounds: '",
                     i < names.size() ? names[i] : std::to_string(i + 1), "' has no \"", key,
                     "\" (every round's calibration must have the same members)");
      v.push_back(it->second);
    }
    return v;
  };
  const std::string in_cache = "reuse_in_cache_GBps";
  const bool curves = std::all_of(by_key.begin(), by_key.end(), [&](const auto& m) {
    auto it = m.find(in_cache);
    return it != m.end() && std::isfinite(it->second);
  });
  CalibrationFields best;
  for (const auto& [key, first] : rounds.front()) {
    const std::vector<double> v = values(key);
    double x = first;
    if (key == "reuse_capacity_bytes" && curves) {
      const std::vector<double> fast = values(in_cache);
      x = v[static_cast<size_t>(std::max_element(fast.begin(), fast.end()) - fast.begin())];
    } else if (key.ends_with("GBps") || key == "reuse_capacity_bytes") {
      x = *std::max_element(v.begin(), v.end());
    } else if (key.ends_with("_us") || key == "handoff_ns" ||
               key.starts_with("oversubscribed_ratio")) {
      x = *std::min_element(v.begin(), v.end());
    }
    best.emplace_back(key, x);
  }
  return best;
}

CalibrationFields round_calibration(const CalibrationFields& best, const CalibrationFields& round) {
  const std::map<std::string, double> own(round.begin(), round.end());
  CalibrationFields out = best;
  for (auto& [key, value] : out)
    if (key.starts_with("cache_"))
      if (auto it = own.find(key); it != own.end()) value = it->second;
  return out;
}

}  // namespace ubep::sim
