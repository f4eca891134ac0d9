// A little JSON: builders that write one object or array as compact text (metrics lines, run
// manifests), and a parser that reads it back (metrics files, tests).
//
// Writing rules:
// - Strings are UTF-8. '"', '\\' and control characters are escaped (\n, \t, ... or \u00XX);
//   other characters, non-ASCII included, pass through as they are. A byte sequence that is not
//   valid UTF-8 becomes U+FFFD, so every line stays valid JSON.
// - Doubles are written in the shortest form that reads back to the same double (std::to_chars).
//   NaN and +-Inf, which JSON cannot express, are written as null: every JSON reader accepts the
//   line, and a reader of metrics takes null for "not a number".
// - Keys are written in the order they were added; adding a key twice is an Error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace plexus {

class JsonArray;

class JsonObject {
 public:
  // Each add() appends one member and returns *this, so calls chain.
  JsonObject& add(std::string_view key, std::string_view value);
  JsonObject& add(std::string_view key, const char* value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, const std::string& value) {
    return add(key, std::string_view(value));
  }
  JsonObject& add(std::string_view key, bool value);
  JsonObject& add(std::string_view key, double value);  // NaN/Inf -> null
  // Any integer type but bool, written exactly.
  template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) JsonObject& add(std::string_view key,
                                                                              T value) {
    if constexpr (std::is_signed_v<T>)
      return add_raw_unchecked(key, std::to_string(static_cast<long long>(value)));
    else
      return add_raw_unchecked(key, std::to_string(static_cast<unsigned long long>(value)));
  }
  JsonObject& add(std::string_view key, const JsonObject& value);
  JsonObject& add(std::string_view key, const JsonArray& value);
  // A member whose value is null.
  JsonObject& add_null(std::string_view key);
  // A member whose value is the JSON text `json` (an object, array, number...), checked to be
  // one valid JSON value; throws Error naming the key otherwise.
  JsonObject& add_raw(std::string_view key, std::string_view json);

  bool empty() const { return members_ == 0; }
  bool contains(std::string_view key) const;
  // The compact text, "{...}" with no newline.
  std::string str() const { return text_ + "}"; }

 private:
  JsonObject& add_raw_unchecked(std::string_view key, std::string_view json);
  std::string text_ = "{";
  std::vector<std::string> keys_;
  size_t members_ = 0;
};

class JsonArray {
 public:
  // Each push() appends one element and returns *this.
  JsonArray& push(std::string_view value);
  JsonArray& push(const char* value) { return push(std::string_view(value)); }
  JsonArray& push(const std::string& value) { return push(std::string_view(value)); }
  JsonArray& push(bool value);
  JsonArray& push(double value);  // NaN/Inf -> null
  template <class T>
  requires(std::is_integral_v<T> && !std::is_same_v<T, bool>) JsonArray& push(T value) {
    if constexpr (std::is_signed_v<T>)
      return push_raw_unchecked(std::to_string(static_cast<long long>(value)));
    else
      return push_raw_unchecked(std::to_string(static_cast<unsigned long long>(value)));
  }
  JsonArray& push(const JsonObject& value);
  JsonArray& push(const JsonArray& value);
  JsonArray& push_null();
  // Appends the JSON text `json`, checked to be one valid JSON value (throws Error otherwise).
  JsonArray& push_raw(std::string_view json);

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // The compact text, "[...]".
  std::string str() const { return text_ + "]"; }

 private:
  JsonArray& push_raw_unchecked(std::string_view json);
  std::string text_ = "[";
  size_t size_ = 0;
};

// `s` as a JSON string literal, quotes included (escaping as described above).
std::string json_quote(std::string_view s);
// `v` as a JSON number in the shortest round-trip form, or "null" for NaN/Inf.
std::string json_number(double v);

// A parsed JSON value.
struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;        // every number, as the nearest double
  bool is_integer = false;  // the number was written without fraction or exponent and fits
  int64_t integer = 0;      // ... in an int64, which holds it exactly
  std::string string;  // a String's value; a Number's text as written (dump() keeps it exactly)
  std::vector<JsonValue> items;                            // Array
  std::vector<std::pair<std::string, JsonValue>> members;  // Object, in file order

  bool is_null() const { return kind == Kind::Null; }
  // The member `key` of an object, or nullptr (also when this is not an object).
  const JsonValue* find(std::string_view key) const;
  // The member `key`; throws Error naming the key when absent or when this is not an object.
  const JsonValue& at(std::string_view key) const;
  // Compact text (indent < 0) or pretty text indented by `indent` spaces per level.
  std::string dump(int indent = -1) const;
};

// Parses exactly one JSON value (surrounding whitespace allowed). Throws Error naming `source`
// (a file name, "line 3 of x.jsonl") and the byte offset on malformed input.
JsonValue parse_json(std::string_view text, std::string_view source = "JSON text");

}  // namespace plexus
