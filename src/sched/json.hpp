// A small, strict JSON reader (internal): RFC 8259 values, no comments, no trailing commas,
// no duplicate keys, nothing after the top-level value. Every error is an InvalidArgument
// "<origin>:<line>:<col>: <what>".
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ubep::sched::detail {

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;  // string value; for numbers, the literal as written
  std::vector<JsonValue> array;
  std::vector<std::pair<std::string, JsonValue>> object;  // in file order
  int line = 1, col = 1;                                  // where the value starts

  const char* kind_name() const;
};

JsonValue parse_json(const std::string& text, const std::string& origin);

}  // namespace ubep::sched::detail
