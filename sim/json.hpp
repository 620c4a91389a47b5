// A minimal JSON writer for experiment results (objects, arrays, numbers, strings).
#pragma once

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ubep/error.hpp"

namespace ubep::sim {

class Json {
 public:
  Json& begin_object() {
    sep();
    os_ << '{';
    first_ = true;
    return *this;
  }
  Json& end_object() {
    os_ << '}';
    first_ = false;
    return *this;
  }
  Json& begin_array() {
    sep();
    os_ << '[';
    first_ = true;
    return *this;
  }
  Json& end_array() {
    os_ << ']';
    first_ = false;
    return *this;
  }
  Json& key(const std::string& k) {
    sep();
    str(k);
    os_ << ':';
    first_ = true;
    return *this;
  }
  Json& value(double v) {
    sep();
    if (std::isfinite(v))
      os_ << v;
    else
      os_ << "null";
    return *this;
  }
  Json& value(const std::string& v) {
    sep();
    str(v);
    return *this;
  }
  Json& value(const char* v) { return value(std::string(v)); }
  Json& value(bool v) {
    sep();
    os_ << (v ? "true" : "false");
    return *this;
  }
  Json& value(int v) { return value(static_cast<double>(v)); }
  template <typename T>
  Json& kv(const std::string& k, const T& v) {
    key(k);
    return value(v);
  }
  std::string text() const { return os_.str(); }
  void write(const std::string& path) const {
    std::ofstream out(path);
    UBEP_CHECK_ARG(out.good(), "cannot write JSON file '", path, "'");
    out << os_.str() << '\n';
  }

 private:
  void sep() {
    if (!first_) os_ << ',';
    first_ = false;
  }
  void str(const std::string& s) {
    os_ << '"';
    for (char ch : s) {
      if (ch == '"' || ch == '\\') os_ << '\\';
      os_ << ch;
    }
    os_ << '"';
  }
  std::ostringstream os_;
  bool first_ = true;
};

}  // namespace ubep::sim
