#include "sim/json_read.hpp"

#include <fstream>
#include <sstream>

#include "ubep/error.hpp"

namespace ubep::sim {

namespace {

using Kind = JsonValue::Kind;

const JsonValue* config_member(const BenchJson& b, const std::string& key, Kind kind) {
  const JsonValue* config = b.doc.find("config");
  const JsonValue* v = config ? config->find(key) : nullptr;
  UBEP_CHECK_ARG(v && v->kind == kind, "ubep-bench JSON '", b.path, "' has no config \"", key, "\"",
                 v ? detail::concat(" (", v->kind_name(), ")") : std::string());
  return v;
}

const std::string* string_member(const JsonValue& row, const char* key) {
  const JsonValue* v = row.find(key);
  return v && v->kind == Kind::kString ? &v->text : nullptr;
}

}  // namespace

JsonValue read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  UBEP_CHECK_ARG(in.good(), "cannot read ", what, " '", path, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return sched::detail::parse_json(ss.str(), path);
}

const JsonValue* number_member(const JsonValue& object, const std::string& key,
                               const std::string& path) {
  const JsonValue* v = object.find(key);
  if (!v || v->kind == Kind::kNull) return nullptr;
  UBEP_CHECK_ARG(v->kind == Kind::kNumber, path, ":", v->line, ":", v->col, ": \"", key,
                 "\" must be a number, got ", v->kind_name());
  return v;
}

std::string BenchJson::config_str(const std::string& key) const {
  return config_member(*this, key, Kind::kString)->text;
}

double BenchJson::config_num(const std::string& key) const {
  return config_member(*this, key, Kind::kNumber)->number;
}

std::string BenchJson::workload() const {
  const JsonValue* config = doc.find("config");
  const JsonValue* w = config ? config->find("workload") : nullptr;
  return w && w->kind == Kind::kString ? w->text : "";
}

std::map<std::pair<std::string, std::string>, double> BenchJson::medians() const {
  std::map<std::pair<std::string, std::string>, double> out;
  const JsonValue* results = doc.find("results");
  if (!results || results->kind != Kind::kArray) return out;
  for (const JsonValue& row : results->array) {
    const std::string* impl = string_member(row, "impl");
    const std::string* op = string_member(row, "op");
    const std::string* sync = string_member(row, "sync");
    const JsonValue* median = row.find("median_us");
    if (!impl || !op || !median || median->kind != Kind::kNumber) continue;
    if (sync && *sync != "fused") continue;
    out[{*impl, *op}] = median->number;
  }
  return out;
}

BenchJson read_bench_json(const std::string& path) {
  BenchJson b;
  b.path = path;
  b.doc = read_json_file(path, "ubep-bench JSON");
  UBEP_CHECK_ARG(b.doc.kind == Kind::kObject, "ubep-bench JSON '", path, "' is not an object, got ",
                 b.doc.kind_name());
  return b;
}

}  // namespace ubep::sim
