#include "json.hpp"

#include <cctype>
#include <cstdlib>

#include "ubep/error.hpp"

namespace ubep::sched::detail {

const char* JsonValue::kind_name() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kArray:
      return "an array";
    case Kind::kObject:
      return "an object";
  }
  return "?";
}

const JsonValue* JsonValue::find(const std::string& key) const {
  for (const JsonMember& m : object)
    if (m.first == key) return &m.second;
  return nullptr;
}

namespace {

class Parser {
 public:
  Parser(const std::string& text, const std::string& origin) : s_(text), origin_(origin) {}

  JsonValue document() {
    skip_ws();
    JsonValue v = value(0);
    skip_ws();
    if (pos_ < s_.size()) fail("unexpected text after the JSON value: ", shown());
    return v;
  }

 private:
  // Deep nesting is never a topology; refusing it keeps the recursion bounded.
  static constexpr int kMaxDepth = 64;

  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    throw InvalidArgument(::ubep::detail::concat(origin_, ":", line_, ":", col_, ": ", args...));
  }
  // The next few characters, quoted, for error messages.
  std::string shown() const {
    if (pos_ >= s_.size()) return "end of input";
    std::string t = s_.substr(pos_, 12);
    if (const size_t nl = t.find('\n'); nl != std::string::npos) t.resize(nl);
    return "'" + t + "'";
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void advance() {
    if (s_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }
  void skip_ws() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      advance();
  }
  void expect(char c) {
    if (peek() != c || pos_ >= s_.size()) fail("expected '", c, "', got ", shown());
    advance();
  }
  bool literal(const char* word) {
    const std::string w(word);
    if (s_.compare(pos_, w.size(), w) != 0) return false;
    for (size_t i = 0; i < w.size(); ++i) advance();
    return true;
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than ", kMaxDepth);
    JsonValue v;
    v.line = line_;
    v.col = col_;
    const char c = peek();
    if (pos_ >= s_.size()) fail("expected a value, got end of input");
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v.kind = JsonValue::Kind::kString;
      v.text = string();
      return v;
    }
    if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) return number(v);
    if (literal("true")) {
      v.kind = JsonValue::Kind::kBool;
      v.boolean = true;
      return v;
    }
    if (literal("false")) {
      v.kind = JsonValue::Kind::kBool;
      return v;
    }
    if (literal("null")) return v;
    fail("expected a value, got ", shown());
  }

  // At '{': the members of an object at nesting depth (keys unique), into v.
  JsonValue object(JsonValue v, int depth) {
    v.kind = JsonValue::Kind::kObject;
    advance();
    skip_ws();
    if (peek() == '}') {
      advance();
      return v;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a quoted key, got ", shown());
      const int kl = line_, kc = col_;
      std::string key = string();
      for (const auto& kv : v.object)
        if (kv.first == key) {
          line_ = kl;
          col_ = kc;
          fail("duplicate key \"", key, "\"");
        }
      skip_ws();
      expect(':');
      skip_ws();
      v.object.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        advance();
        continue;
      }
      if (peek() == '}') {
        advance();
        return v;
      }
      fail("expected ',' or '}' in object, got ", shown());
    }
  }

  // At '[': the elements of an array at nesting depth, into v.
  JsonValue array(JsonValue v, int depth) {
    v.kind = JsonValue::Kind::kArray;
    advance();
    skip_ws();
    if (peek() == ']') {
      advance();
      return v;
    }
    for (;;) {
      skip_ws();
      v.array.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        advance();
        continue;
      }
      if (peek() == ']') {
        advance();
        return v;
      }
      fail("expected ',' or ']' in array, got ", shown());
    }
  }

  // RFC 8259 number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  JsonValue number(JsonValue v) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t d = pos_;
      while (std::isdigit(static_cast<unsigned char>(peek())) && pos_ < s_.size()) advance();
      return pos_ > d;
    };
    if (peek() == '-') advance();
    if (peek() == '0') {
      advance();
    } else if (!digits()) {
      fail("malformed number ", shown());
    }
    if (peek() == '.') {
      advance();
      if (!digits()) fail("malformed number: digits expected after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      advance();
      if (peek() == '+' || peek() == '-') advance();
      if (!digits()) fail("malformed number: digits expected in the exponent");
    }
    v.kind = JsonValue::Kind::kNumber;
    v.text = s_.substr(start, pos_ - start);
    v.number = std::strtod(v.text.c_str(), nullptr);
    return v;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = peek();
      if (c == '"') {
        advance();
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c != '\\') {
        out += c;
        advance();
        continue;
      }
      advance();
      const char e = peek();
      if (pos_ >= s_.size()) fail("unterminated string");
      advance();
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = peek();
            if (!std::isxdigit(static_cast<unsigned char>(h)) || pos_ >= s_.size())
              fail("bad \\u escape: 4 hex digits expected");
            cp = cp * 16 + static_cast<unsigned>(std::isdigit(static_cast<unsigned char>(h))
                                                     ? h - '0'
                                                     : (std::tolower(h) - 'a' + 10));
            advance();
          }
          // Names in topology files are ASCII in practice; encode the BMP as UTF-8 and refuse
          // surrogates rather than half-support them.
          if (cp >= 0xD800 && cp <= 0xDFFF) fail("\\u surrogate escapes are not supported");
          if (cp < 0x80) {
            out += static_cast<char>(cp);
          } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          } else {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
          }
          break;
        }
        default:
          fail("bad escape '\\", e, "' in string");
      }
    }
  }

  const std::string& s_;
  const std::string& origin_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

}  // namespace

JsonValue parse_json(const std::string& text, const std::string& origin) {
  return Parser(text, origin).document();
}

}  // namespace ubep::sched::detail
