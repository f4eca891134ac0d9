#include "plexus/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "plexus/error.hpp"

namespace plexus {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not one (overlong forms,
// surrogates and code points past U+10FFFF are invalid).
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const size_t left = s.size() - i;
  const unsigned c = b(i);
  const auto cont = [&](size_t k) { return (b(k) & 0xC0) == 0x80; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (left < 3 || !cont(i + 1) || !cont(i + 2)) return 0;
    if (c == 0xE0 && b(i + 1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(i + 1) >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (left < 4 || !cont(i + 1) || !cont(i + 2) || !cont(i + 3)) return 0;
    if (c == 0xF0 && b(i + 1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(i + 1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

constexpr uint32_t kReplacement = 0xFFFD;

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  JsonValue parse_document() {
    skip_ws();
    JsonValue v = value(0);
    skip_ws();
    if (i_ != s_.size()) fail("unexpected text after the value");
    return v;
  }

 private:
  static constexpr int kMaxDepth =
      256;  // deeper nesting is refused rather than overflowing the stack

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(std::string(source_) + ": invalid JSON at byte " + std::to_string(i_) + ": " +
                what);
  }
  bool at_end() const { return i_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[i_]; }
  void skip_ws() {
    while (!at_end() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect_word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) fail("expected a value");
    i_ += w.size();
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    JsonValue v;
    switch (peek()) {
      case '{':
        object(v, depth);
        break;
      case '[':
        array(v, depth);
        break;
      case '"':
        v.kind = JsonValue::Kind::String;
        v.string = string();
        break;
      case 't':
        expect_word("true");
        v.kind = JsonValue::Kind::Bool;
        v.boolean = true;
        break;
      case 'f':
        expect_word("false");
        v.kind = JsonValue::Kind::Bool;
        break;
      case 'n':
        expect_word("null");
        break;
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) {
          number(v);
          break;
        }
        fail(at_end() ? "unexpected end of text, expected a value" : "expected a value");
    }
    return v;
  }

  void object(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::Object;
    ++i_;
    skip_ws();
    if (peek() == '}') {
      ++i_;
      return;
    }
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = string();
      skip_ws();
      if (peek() != ':') fail("expected ':' after key \"" + key + "\"");
      ++i_;
      skip_ws();
      v.members.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == '}') {
        ++i_;
        return;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  void array(JsonValue& v, int depth) {
    v.kind = JsonValue::Kind::Array;
    ++i_;
    skip_ws();
    if (peek() == ']') {
      ++i_;
      return;
    }
    for (;;) {
      skip_ws();
      v.items.push_back(value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == ']') {
        ++i_;
        return;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  uint32_t hex4() {
    if (s_.size() - i_ < 4) fail("truncated \\u escape");
    uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      cp <<= 4;
      if (c >= '0' && c <= '9')
        cp |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        cp |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        cp |= static_cast<uint32_t>(c - 'A' + 10);
      else
        fail("bad hex digit in a \\u escape");
    }
    return cp;
  }

  std::string string() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) fail("raw control character in a string (must be escaped)");
      if (c != '\\') {
        const size_t n = utf8_sequence(s_, i_);
        if (n == 0) fail("invalid UTF-8 in a string");
        out.append(s_.substr(i_, n));
        i_ += n;
        continue;
      }
      ++i_;
      if (at_end()) fail("unterminated escape");
      const char e = s_[i_++];
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
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must pair with a low one; a lone one becomes U+FFFD.
            if (s_.substr(i_, 2) == "\\u") {
              const size_t save = i_;
              i_ += 2;
              const uint32_t lo = hex4();
              if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
              } else {
                cp = kReplacement;
                i_ = save;
              }
            } else {
              cp = kReplacement;
            }
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            cp = kReplacement;
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --i_;
          fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  void number(JsonValue& v) {
    // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const size_t start = i_;
    const auto digits = [&] {
      const size_t from = i_;
      while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - from;
    };
    bool integral = true;
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
    } else if (digits() == 0) {
      fail("bad number");
    }
    if (peek() == '.') {
      ++i_;
      integral = false;
      if (digits() == 0) fail("bad number: digits expected after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      integral = false;
      if (peek() == '+' || peek() == '-') ++i_;
      if (digits() == 0) fail("bad number: digits expected in the exponent");
    }
    const char* b = s_.data() + start;
    const char* e = s_.data() + i_;
    v.kind = JsonValue::Kind::Number;
    v.string.assign(b, e);
    const auto r = std::from_chars(b, e, v.number);
    if (r.ec == std::errc::result_out_of_range) {
      // Out of double's range: +-Inf for huge magnitudes, 0 for tiny ones.
      const bool neg = *b == '-';
      bool tiny = false;
      for (const char* p = b; p != e; ++p)
        if (*p == 'e' || *p == 'E') tiny = p[1] == '-';
      v.number = tiny ? (neg ? -0.0 : 0.0) : (neg ? -HUGE_VAL : HUGE_VAL);
    } else if (r.ec != std::errc() || r.ptr != e) {
      fail("bad number");
    }
    if (integral) {
      const auto ri = std::from_chars(b, e, v.integer);
      v.is_integer = ri.ec == std::errc() && ri.ptr == e;
    }
  }

  std::string_view s_;
  std::string_view source_;
  size_t i_ = 0;
};

void dump_value(const JsonValue& v, int indent, int level, std::string& out) {
  const auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * lvl), ' ');
  };
  switch (v.kind) {
    case JsonValue::Kind::Null:
      out += "null";
      break;
    case JsonValue::Kind::Bool:
      out += v.boolean ? "true" : "false";
      break;
    case JsonValue::Kind::Number:
      // The text as parsed keeps integers past int64 (a u64 seed) exact.
      out += v.string.empty() ? json_number(v.number) : v.string;
      break;
    case JsonValue::Kind::String:
      out += json_quote(v.string);
      break;
    case JsonValue::Kind::Array:
      out += '[';
      for (size_t k = 0; k < v.items.size(); ++k) {
        if (k) out += ',';
        newline(level + 1);
        dump_value(v.items[k], indent, level + 1, out);
      }
      if (!v.items.empty()) newline(level);
      out += ']';
      break;
    case JsonValue::Kind::Object:
      out += '{';
      for (size_t k = 0; k < v.members.size(); ++k) {
        if (k) out += ',';
        newline(level + 1);
        out += json_quote(v.members[k].first);
        out += indent < 0 ? ":" : ": ";
        dump_value(v.members[k].second, indent, level + 1, out);
      }
      if (!v.members.empty()) newline(level);
      out += '}';
      break;
  }
}

void check_json(std::string_view json, const std::string& what) {
  try {
    parse_json(json, what);
  } catch (const Error& e) {
    throw Error(std::string("raw JSON for ") + e.what());
  }
}

}  // namespace

std::string json_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = utf8_sequence(s, i);
      if (n == 0) {
        append_utf8(out, kReplacement);
        ++i;
      } else {
        out.append(s.substr(i, n));
        i += n;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
  return out;
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  // Shortest text that reads back to the same double; its forms ("1e+20", "-0", "0.1") are
  // all valid JSON numbers.
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// ---- JsonObject ----

bool JsonObject::contains(std::string_view key) const {
  for (const std::string& k : keys_)
    if (k == key) return true;
  return false;
}

JsonObject& JsonObject::add_raw_unchecked(std::string_view key, std::string_view json) {
  // A repeated key is legal JSON but readers disagree on which value wins: refuse it.
  if (contains(key)) throw Error("JSON object: key \"" + std::string(key) + "\" added twice");
  keys_.emplace_back(key);
  if (members_++) text_ += ',';
  text_ += json_quote(key);
  text_ += ':';
  text_ += json;
  return *this;
}

JsonObject& JsonObject::add(std::string_view key, std::string_view value) {
  return add_raw_unchecked(key, json_quote(value));
}
JsonObject& JsonObject::add(std::string_view key, bool value) {
  return add_raw_unchecked(key, value ? "true" : "false");
}
JsonObject& JsonObject::add(std::string_view key, double value) {
  return add_raw_unchecked(key, json_number(value));
}
JsonObject& JsonObject::add(std::string_view key, const JsonObject& value) {
  return add_raw_unchecked(key, value.str());
}
JsonObject& JsonObject::add(std::string_view key, const JsonArray& value) {
  return add_raw_unchecked(key, value.str());
}
JsonObject& JsonObject::add_null(std::string_view key) {
  return add_raw_unchecked(key, "null");
}
JsonObject& JsonObject::add_raw(std::string_view key, std::string_view json) {
  check_json(json, "key \"" + std::string(key) + "\"");
  return add_raw_unchecked(key, json);
}

// ---- JsonArray ----

JsonArray& JsonArray::push_raw_unchecked(std::string_view json) {
  if (size_++) text_ += ',';
  text_ += json;
  return *this;
}
JsonArray& JsonArray::push(std::string_view value) {
  return push_raw_unchecked(json_quote(value));
}
JsonArray& JsonArray::push(bool value) {
  return push_raw_unchecked(value ? "true" : "false");
}
JsonArray& JsonArray::push(double value) {
  return push_raw_unchecked(json_number(value));
}
JsonArray& JsonArray::push(const JsonObject& value) {
  return push_raw_unchecked(value.str());
}
JsonArray& JsonArray::push(const JsonArray& value) {
  return push_raw_unchecked(value.str());
}
JsonArray& JsonArray::push_null() {
  return push_raw_unchecked("null");
}
JsonArray& JsonArray::push_raw(std::string_view json) {
  check_json(json, "array element " + std::to_string(size_));
  return push_raw_unchecked(json);
}

// ---- JsonValue ----

const JsonValue* JsonValue::find(std::string_view key) const {
  if (kind != Kind::Object) return nullptr;
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

const JsonValue& JsonValue::at(std::string_view key) const {
  if (kind != Kind::Object)
    throw Error("JSON: looked up key \"" + std::string(key) +
                "\" in a value that is not an object");
  if (const JsonValue* v = find(key)) return *v;
  throw Error("JSON: no key \"" + std::string(key) + "\"");
}

std::string JsonValue::dump(int indent) const {
  std::string out;
  dump_value(*this, indent, 0, out);
  return out;
}

JsonValue parse_json(std::string_view text, std::string_view source) {
  return Parser(text, source).parse_document();
}

}  // namespace plexus
