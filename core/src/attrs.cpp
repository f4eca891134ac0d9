#include "plexus/attrs.hpp"

#include <sstream>

#include "plexus/error.hpp"

namespace plexus {

plx_attr_type attr_type_of(const AttrValue& v) {
  switch (v.index()) {
    case 0: return PLX_ATTR_INT;
    case 1: return PLX_ATTR_FLOAT;
    case 2: return PLX_ATTR_INTS;
    case 3: return PLX_ATTR_FLOATS;
    default: return PLX_ATTR_STRING;
  }
}

const char* attr_type_name(int32_t type) {
  switch (type) {
    case PLX_ATTR_INT: return "int";
    case PLX_ATTR_FLOAT: return "float";
    case PLX_ATTR_INTS: return "ints";
    case PLX_ATTR_FLOATS: return "floats";
    case PLX_ATTR_STRING: return "string";
    default: return "invalid";
  }
}

std::string attr_value_string(const AttrValue& v) {
  std::ostringstream os;
  switch (v.index()) {
    case 0: os << std::get<int64_t>(v); break;
    case 1: os << std::get<double>(v); break;
    case 2: {
      os << '[';
      const auto& xs = std::get<Ints>(v);
      for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
      os << ']';
      break;
    }
    case 3: {
      os << '[';
      const auto& xs = std::get<Floats>(v);
      for (size_t i = 0; i < xs.size(); ++i) os << (i ? ", " : "") << xs[i];
      os << ']';
      break;
    }
    default: os << '"' << std::get<std::string>(v) << '"';
  }
  return os.str();
}

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [k, v] : items) set(k, v);
}

Attrs& Attrs::set(std::string name, AttrValue value) {
  for (auto& [k, v] : items_) {
    if (k == name) {
      v = std::move(value);
      return *this;
    }
  }
  items_.emplace_back(std::move(name), std::move(value));
  return *this;
}

const AttrValue* Attrs::find(std::string_view name) const {
  for (const auto& [k, v] : items_)
    if (k == name) return &v;
  return nullptr;
}

namespace {
template <class T>
const T& typed(const Attrs& a, std::string_view name, plx_attr_type want) {
  const AttrValue* v = a.find(name);
  if (!v) throw OpError("missing attribute '" + std::string(name) + "'");
  if (const T* p = std::get_if<T>(v)) return *p;
  throw OpError("attribute '" + std::string(name) + "' is " + attr_type_name(attr_type_of(*v)) +
                ", expected " + attr_type_name(want));
}
}  // namespace

int64_t Attrs::get_int(std::string_view name) const {
  return typed<int64_t>(*this, name, PLX_ATTR_INT);
}
double Attrs::get_float(std::string_view name) const {
  return typed<double>(*this, name, PLX_ATTR_FLOAT);
}
const Ints& Attrs::get_ints(std::string_view name) const {
  return typed<Ints>(*this, name, PLX_ATTR_INTS);
}
const Floats& Attrs::get_floats(std::string_view name) const {
  return typed<Floats>(*this, name, PLX_ATTR_FLOATS);
}
const std::string& Attrs::get_string(std::string_view name) const {
  return typed<std::string>(*this, name, PLX_ATTR_STRING);
}

AttrPack::AttrPack(const Attrs& attrs) {
  packed_.reserve(attrs.size());
  for (const auto& [name, v] : attrs) {
    plx_attr a{};
    a.name = name.c_str();
    a.type = attr_type_of(v);
    switch (v.index()) {
      case 0: a.i = std::get<int64_t>(v); break;
      case 1: a.f = std::get<double>(v); break;
      case 2:
        a.ints = std::get<Ints>(v).data();
        a.count = static_cast<int32_t>(std::get<Ints>(v).size());
        break;
      case 3:
        a.floats = std::get<Floats>(v).data();
        a.count = static_cast<int32_t>(std::get<Floats>(v).size());
        break;
      default: a.s = std::get<std::string>(v).c_str();
    }
    packed_.push_back(a);
  }
}

AttrValue attr_from_abi(const plx_attr& a) {
  switch (a.type) {
    case PLX_ATTR_INT: return a.i;
    case PLX_ATTR_FLOAT: return a.f;
    case PLX_ATTR_INTS: return Ints(a.ints, a.ints + a.count);
    case PLX_ATTR_FLOATS: return Floats(a.floats, a.floats + a.count);
    case PLX_ATTR_STRING: return std::string(a.s ? a.s : "");
    default: throw OpError("attribute '" + std::string(a.name ? a.name : "?") +
                           "' has invalid type " + std::to_string(a.type));
  }
}

}  // namespace plexus
