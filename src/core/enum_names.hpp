// One table per enum gives both its names and its parser, so names and error messages never
// drift apart.
#pragma once

#include <string>

#include "ubep/error.hpp"

namespace ubep::detail {

template <typename E>
struct EnumName {
  E value;
  const char* name;
  // Another spelling parse_enum accepts (e.g. "column-major" for "column_major"); never printed,
  // so names stay canonical in output and the error lists each value once.
  const char* alias = nullptr;
};

template <typename E, size_t N>
const char* enum_name(const EnumName<E> (&table)[N], E value) {
  for (const auto& e : table)
    if (e.value == value) return e.name;
  return "?";
}

// Throws InvalidArgument naming the value and every accepted name.
template <typename E, size_t N>
E parse_enum(const EnumName<E> (&table)[N], const std::string& name, const char* what) {
  for (const auto& e : table)
    if (name == e.name || (e.alias && name == e.alias)) return e.value;
  std::string expected;
  for (size_t i = 0; i < N; ++i)
    expected += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + table[i].name;
  throw InvalidArgument(concat("unknown ", what, " '", name, "' (expected ", expected, ")"));
}

}  // namespace ubep::detail
