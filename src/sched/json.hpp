// A small, strict JSON reader (internal): RFC 8259 values, no comments, no trailing commas,
// no duplicate keys, nothing after the top-level value. Every error is an InvalidArgument
// "<origin>:<line>:<col>: <what>". The one JSON reader of the project: topology files here, and
// ubep-sim's inputs (sim/json_read.hpp), so no file format is read by pattern matching.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ubep::sched::detail {

struct JsonMember;

struct JsonValue {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string text;  // string value; for numbers, the literal as written
  std::vector<JsonValue> array;
  // In file order. (A named member type, not std::pair: a pair of an incomplete JsonValue does
  // not compile with clang and libstdc++.)
  std::vector<JsonMember> object;
  int line = 1, col = 1;  // where the value starts

  const char* kind_name() const;
  // The member `key` of an object; nullptr when absent or when this is not an object.
  const JsonValue* find(const std::string& key) const;
};

struct JsonMember {
  JsonMember(std::string key, JsonValue value) : first(std::move(key)), second(std::move(value)) {}
  std::string first;
  JsonValue second;
};

JsonValue parse_json(const std::string& text, const std::string& origin);

}  // namespace ubep::sched::detail
