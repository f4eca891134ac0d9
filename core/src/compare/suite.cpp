// The ops suite of `plexus compare`: its TOML format (docs/compare.md) and the built-in suite.
#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "../toml_util.hpp"
#include "plexus/compare.hpp"
#include "plexus/error.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus {

namespace detail {
struct EmbeddedModel {
  const char* name;
  const unsigned char* text;
  size_t size;
};
extern const EmbeddedModel kEmbeddedSuites[];
extern const size_t kEmbeddedSuitesCount;
}  // namespace detail

namespace {

using toml_util::type_name;
using toml_util::where;

const char* const kTopKeys = "name, description, tolerance, item";
const char* const kItemKeys = "op, what, attrs, inputs, dtypes, backward, nmse";
const char* const kInputKeys = "shape, range, nonzero, ints, value, dtype, absent";

struct Parser {
  std::string source;
  const OpRegistry* ops;
  std::vector<std::string> problems;

  std::string at(const toml::node& n) const { return where(n.source(), source); }
  void problem(const toml::node& n, const std::string& what) { problems.push_back(at(n) + ": " + what); }

  bool dtype(const toml::node& n, const std::string& key, plx_dtype& out) {
    const auto s = n.value<std::string>();
    const plx_dtype d = s ? dtype_from_name(*s) : PLX_DTYPE_NONE;
    if (d == PLX_DTYPE_NONE) {
      problem(n, key + ": expected a dtype name (f32, f16, bf16, f64, i32, i64, u8), got " +
                     (s ? "\"" + *s + "\"" : std::string(type_name(n))));
      return false;
    }
    out = d;
    return true;
  }

  bool number(const toml::node& n, const std::string& key, double& out) {
    if (n.is_integer()) {
      out = static_cast<double>(*n.value<int64_t>());
      return true;
    }
    if (n.is_floating_point()) {
      out = *n.value<double>();
      return true;
    }
    problem(n, key + ": expected a number, got " + type_name(n));
    return false;
  }

  // [lo, hi] with lo < hi (lo <= hi for integers it still checks lo < hi: the range is [lo, hi)).
  bool range(const toml::node& n, const std::string& key, double& lo, double& hi) {
    const toml::array* a = n.as_array();
    if (!a || a->size() != 2 || !(*a)[0].is_number() || !(*a)[1].is_number()) {
      problem(n, key + ": expected [low, high], two numbers");
      return false;
    }
    number((*a)[0], key, lo);
    number((*a)[1], key, hi);
    if (!(lo < hi)) {
      problem(n, key + ": expected low < high, got [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
      return false;
    }
    return true;
  }

  SuiteInput input(const toml::node& n, size_t index) {
    SuiteInput in;
    const std::string name = "inputs[" + std::to_string(index) + "]";
    const toml::table* t = n.as_table();
    if (!t) {
      problem(n, name + ": expected an inline table such as { shape = [2, 3] }, got " + type_name(n));
      return in;
    }
    int kinds = 0;
    bool has_shape = false;
    for (const auto& [k, v] : *t) {
      const std::string key = name + "." + std::string(k.str());
      if (k == "shape") {
        const toml::array* a = v.as_array();
        bool ok = a != nullptr;
        if (ok)
          for (const auto& e : *a) ok = ok && e.is_integer() && *e.value<int64_t>() >= 0;
        if (!ok) {
          problem(v, key + ": expected an array of integers >= 0 ([] for a 0-d tensor)");
          continue;
        }
        for (const auto& e : *a) in.shape.push_back(*e.value<int64_t>());
        has_shape = true;
      } else if (k == "range" || k == "nonzero" || k == "ints") {
        ++kinds;
        in.kind = k == "range" ? SuiteInput::Kind::Uniform
                  : k == "nonzero" ? SuiteInput::Kind::Nonzero
                                   : SuiteInput::Kind::Ints;
        range(v, key, in.lo, in.hi);
        if (k == "nonzero" && in.lo < 0) problem(v, key + ": the magnitudes must be >= 0");
      } else if (k == "value") {
        ++kinds;
        in.kind = SuiteInput::Kind::Value;
        number(v, key, in.lo);
      } else if (k == "dtype") {
        dtype(v, key, in.dtype);
      } else if (k == "absent") {
        if (!v.is_boolean() || !*v.value<bool>()) {
          problem(v, key + ": expected true (an optional input left out)");
          continue;
        }
        ++kinds;
        in.kind = SuiteInput::Kind::Absent;
      } else {
        problems.push_back(where(k.source(), source) + ": " + key + ": unknown key (known: " +
                           kInputKeys + ")");
      }
    }
    if (kinds > 1) problem(n, name + ": give one of range, nonzero, ints, value or absent");
    if (in.kind != SuiteInput::Kind::Absent && !has_shape)
      problem(n, name + ": missing shape (write shape = [] for a 0-d tensor)");
    return in;
  }

  void item(const toml::table& t, Suite& suite) {
    SuiteItem it;
    it.where = at(t);
    const OpSchema* schema = nullptr;
    if (const toml::node* on = t.get("op")) {
      if (!on->is_string() || on->value<std::string>()->empty()) {
        problem(*on, "op: expected an op name, got " + std::string(type_name(*on)));
      } else {
        it.op = *on->value<std::string>();
        if (ops) {
          schema = ops->find(it.op);
          if (!schema) problem(*on, "op: unknown op '" + it.op + "' (plexus info lists the ops)");
        }
      }
    } else {
      problems.push_back(it.where + ": missing op");
    }
    for (const auto& [k, v] : t) {
      const std::string key(k.str());
      if (key == "op") continue;
      if (key == "what") {
        if (!v.is_string()) problem(v, "what: expected a string, got " + std::string(type_name(v)));
        else it.what = *v.value<std::string>();
      } else if (key == "attrs") {
        const toml::table* at_ = v.as_table();
        if (!at_) {
          problem(v, "attrs: expected an inline table such as { axis = 1 }, got " +
                         std::string(type_name(v)));
          continue;
        }
        for (const auto& [ak, av] : *at_) {
          const std::string an(ak.str());
          AttrValue value;
          std::string bad = toml_util::attr_from_toml(av, value);
          if (bad.empty() && schema) bad = schema->attr_problem(an, value);
          if (bad.empty())
            it.attrs.set(an, std::move(value));
          else
            problems.push_back(where(ak.source(), source) + ": attrs." + an + ": " + bad);
        }
      } else if (key == "inputs") {
        const toml::array* a = v.as_array();
        if (!a) {
          problem(v, "inputs: expected an array of inline tables, got " + std::string(type_name(v)));
          continue;
        }
        for (size_t i = 0; i < a->size(); ++i) it.inputs.push_back(input((*a)[i], i));
      } else if (key == "dtypes") {
        const toml::array* a = v.as_array();
        if (!a) {
          problem(v, "dtypes: expected an array of dtype names, got " + std::string(type_name(v)));
          continue;
        }
        for (const auto& e : *a) {
          plx_dtype d;
          if (dtype(e, "dtypes", d)) it.dtypes.push_back(d);
        }
      } else if (key == "backward") {
        if (!v.is_boolean()) problem(v, "backward: expected true or false, got " + std::string(type_name(v)));
        else it.backward = *v.value<bool>();
      } else if (key == "nmse") {
        double x = 0;
        if (number(v, "nmse", x)) {
          if (x < 0) problem(v, "nmse: expected a tolerance >= 0");
          it.nmse = x;
        }
      } else {
        problems.push_back(where(k.source(), source) + ": unknown key '" + key +
                           "' in an item (known: " + kItemKeys + ")");
      }
    }
    if (schema) {
      if (it.inputs.size() > schema->inputs.size())
        problem(t, "op '" + it.op + "' takes " + std::to_string(schema->inputs.size()) +
                       " inputs, the item gives " + std::to_string(it.inputs.size()));
      for (size_t i = it.inputs.size(); i < schema->inputs.size(); ++i)
        if (!(schema->inputs[i].flags & PLX_ARG_OPTIONAL)) {
          problem(t, "op '" + it.op + "': input " + std::to_string(i) + " '" +
                         schema->inputs[i].name + "' is required, the item gives " +
                         std::to_string(it.inputs.size()) + " inputs");
          break;
        }
      try {
        (void)schema->complete_attrs(it.attrs);
      } catch (const std::exception& e) {
        problem(t, e.what());
      }
    }
    suite.items.push_back(std::move(it));
  }
};

}  // namespace

Suite parse_suite(std::string_view text, const std::string& source, const OpRegistry* ops) {
  toml::table root;
  try {
    root = toml::parse(text, std::string_view(source));
  } catch (const toml::parse_error& e) {
    throw ConfigError(where(e.source(), source) + ": TOML syntax error: " + std::string(e.description()));
  }
  Parser p{source, ops, {}};
  Suite suite;
  suite.source = source;
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key == "name" || key == "description") {
      if (!v.is_string()) p.problem(v, key + ": expected a string, got " + type_name(v));
      else if (key == "name") suite.name = *v.value<std::string>();
    } else if (key == "tolerance") {
      const toml::table* t = v.as_table();
      if (!t) {
        p.problem(v, "tolerance: expected a table of dtype = NMSE, such as [tolerance] f32 = 1e-8");
        continue;
      }
      for (const auto& [dk, dv] : *t) {
        const plx_dtype d = dtype_from_name(dk.str());
        double x = 0;
        if (d == PLX_DTYPE_NONE) {
          p.problems.push_back(where(dk.source(), source) + ": tolerance." + std::string(dk.str()) +
                               ": not a dtype (f32, f16, bf16, f64, i32, i64, u8)");
        } else if (p.number(dv, "tolerance." + std::string(dk.str()), x)) {
          if (x < 0) p.problem(dv, "tolerance." + std::string(dk.str()) + ": expected a value >= 0");
          suite.nmse[d] = x;
        }
      }
    } else if (key == "item") {
      const toml::array* a = v.as_array();
      if (!a || !a->is_array_of_tables()) {
        p.problem(v, "item: expected [[item]] tables");
        continue;
      }
      for (const auto& e : *a) p.item(*e.as_table(), suite);
    } else {
      p.problems.push_back(where(k.source(), source) + ": unknown key '" + key + "' (known: " +
                           kTopKeys + ")");
    }
  }
  if (suite.name.empty()) suite.name = source;
  if (suite.items.empty() && p.problems.empty())
    p.problems.push_back(source + ": no [[item]] tables: a suite lists the ops to compare");
  if (!p.problems.empty()) {
    std::string all;
    for (const auto& s : p.problems) all += (all.empty() ? "" : "\n") + s;
    throw ConfigError(all);
  }
  return suite;
}

Suite load_suite(const std::string& path, const OpRegistry* ops) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(path + ": cannot open the suite file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse_suite(ss.str(), path, ops);
}

const std::string& default_suite_text() {
  static const std::string text = [] {
    for (size_t i = 0; i < detail::kEmbeddedSuitesCount; ++i)
      if (std::string(detail::kEmbeddedSuites[i].name) == "ops")
        return std::string(reinterpret_cast<const char*>(detail::kEmbeddedSuites[i].text),
                           detail::kEmbeddedSuites[i].size);
    throw Error("the built-in compare suite (configs/compare/ops.toml) was not compiled in");
  }();
  return text;
}

Suite default_suite(const OpRegistry* ops) {
  return parse_suite(default_suite_text(), "configs/compare/ops.toml (built in)", ops);
}

}  // namespace plexus
