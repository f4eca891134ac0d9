// Op attributes on the host side, and their packing into plx_attr arrays for the ABI.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "plexus/abi/types.h"

namespace plexus {

using Shape = std::vector<int64_t>;
using Ints = std::vector<int64_t>;
using Floats = std::vector<double>;
using AttrValue = std::variant<int64_t, double, Ints, Floats, std::string>;

// The plx_attr_type a value carries.
plx_attr_type attr_type_of(const AttrValue& v);
const char* attr_type_name(int32_t type);  // "int", "float", "ints", "floats", "string"
std::string attr_value_string(const AttrValue& v);  // "3", "0.5", "[1, 2]", "\"x\""

// An ordered list of named attributes. Small: looked up by linear scan, only when ops are
// prepared, never per step.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  Attrs& set(std::string name, AttrValue value);
  const AttrValue* find(std::string_view name) const;
  bool has(std::string_view name) const { return find(name) != nullptr; }

  // Typed access; throws OpError naming the attribute if missing or of another type.
  int64_t get_int(std::string_view name) const;
  double get_float(std::string_view name) const;
  const Ints& get_ints(std::string_view name) const;
  const Floats& get_floats(std::string_view name) const;
  const std::string& get_string(std::string_view name) const;

  size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::pair<std::string, AttrValue>> items_;
};

// plx_attr views of an Attrs; valid while the Attrs lives and is not modified.
class AttrPack {
 public:
  explicit AttrPack(const Attrs& attrs);
  const plx_attr* data() const { return packed_.data(); }
  int32_t size() const { return static_cast<int32_t>(packed_.size()); }

 private:
  std::vector<plx_attr> packed_;
};

// Back from the ABI (for plugin-defined schemas' defaults).
AttrValue attr_from_abi(const plx_attr& a);

}  // namespace plexus
