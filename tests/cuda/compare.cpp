#include "cuda/compare.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/op_schema.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"

namespace plexus::test::cmp {

namespace {

// splitmix64: seeds of neighbouring cases and tensors share no structure.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A CPU tensor from int64 values (integer dtypes wrap as static_cast does; callers pass values
// in range) or, for float dtypes, from the values converted once.
Tensor tensor_from_ints(const Shape& s, plx_dtype d, const std::vector<int64_t>& v) {
  REQUIRE(static_cast<int64_t>(v.size()) == shape_numel(s));
  std::vector<uint8_t> bytes(std::max<size_t>(1, v.size() * dtype_size(d)));
  const bool known = visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = reinterpret_cast<T*>(bytes.data());
    for (size_t i = 0; i < v.size(); ++i) {
      if constexpr (std::is_integral_v<T>)
        p[i] = static_cast<T>(v[i]);
      else
        p[i] = convert<T>(static_cast<double>(v[i]));
    }
  });
  if (!known) FAIL("bad dtype " << d);
  return Tensor::from_host(cpu(), bytes.data(), s, d);
}

// Values of an integer tensor, exactly (i64 values past 2^53 do not survive a double).
std::vector<int64_t> int_values_of(const Tensor& t) {
  std::vector<uint8_t> bytes(std::max<size_t>(1, static_cast<size_t>(t.nbytes())));
  if (t.nbytes()) t.copy_to_host(bytes.data());
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      const T* p = reinterpret_cast<const T*>(bytes.data());
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(p[i]);
    }
  });
  return v;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> b(static_cast<size_t>(t.nbytes()));
  if (!b.empty()) t.copy_to_host(b.data());
  return b;
}

std::vector<double> doubles_of(const Tensor& t) {
  return t.numel() ? t.to_doubles() : std::vector<double>{};
}

std::string index_string(const Shape& s, size_t flat) {
  std::vector<int64_t> idx(s.size());
  uint64_t r = flat;
  for (size_t k = s.size(); k-- > 0;) {
    const uint64_t d = static_cast<uint64_t>(std::max<int64_t>(s[k], 1));
    idx[k] = static_cast<int64_t>(r % d);
    r /= d;
  }
  std::string out = "[";
  for (size_t k = 0; k < idx.size(); ++k) out += (k ? ", " : "") + std::to_string(idx[k]);
  return out + "]";
}

std::string num(double v) {
  std::ostringstream os;
  os.precision(9);
  os << v;
  return os.str();
}

std::string hex_byte(uint8_t b) {
  static const char* digits = "0123456789ABCDEF";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

// The value an element of dtype `d` holds when every byte is `poison`.
double poison_value(plx_dtype d, uint8_t poison) {
  double v = 0;
  visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T x;
    std::memset(static_cast<void*>(&x), poison, sizeof x);
    v = convert<double>(x);
  });
  return v;
}

bool same_value(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

// Compares one output (or mutated input); returns "" if it matches, else what differs. An
// element still holding the poison (a byte, or -1 for none) is pointed out.
std::string compare_tensor(const Tensor& got, const Tensor& want, const Tolerance& tol,
                           int poison) {
  if (got.shape() != want.shape() || got.dtype() != want.dtype())
    return "is " + got.str() + ", the reference " + want.str();
  const Shape& s = want.shape();
  const bool poisoned = poison >= 0;
  const double pv = poisoned ? poison_value(want.dtype(), static_cast<uint8_t>(poison)) : 0.0;
  std::ostringstream os;
  if (!dtype_is_float(want.dtype())) {
    const std::vector<int64_t> g = int_values_of(got), w = int_values_of(want);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i] && bad++ == 0) first = i;
    if (!bad) return "";
    os << bad << " of " << w.size() << " elements differ (integers must match exactly); first at "
       << index_string(s, first) << ": got " << g[first] << ", want " << w[first];
    if (poisoned && static_cast<double>(g[first]) == pv) os << " (the poison value: never written?)";
    return os.str();
  }
  const std::vector<double> g = doubles_of(got), w = doubles_of(want);
  size_t bad = 0, first = 0, worst = 0;
  double worst_excess = -INFINITY, num2 = 0, den2 = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    bool ok;
    double excess = 0;
    if (tol.exact) {
      ok = same_value(g[i], w[i]);
      excess = ok ? 0 : INFINITY;
    } else if (std::isnan(w[i])) {
      ok = std::isnan(g[i]);
      excess = ok ? 0 : INFINITY;
    } else if (std::isinf(w[i])) {
      ok = g[i] == w[i];
      excess = ok ? 0 : INFINITY;
    } else {
      const double err = std::fabs(g[i] - w[i]);
      const double allowed = tol.atol + tol.rtol * std::fabs(w[i]);
      ok = std::isfinite(g[i]) && err <= allowed;
      excess = std::isfinite(g[i]) ? err - allowed : INFINITY;
      if (std::isfinite(g[i])) {
        num2 += (g[i] - w[i]) * (g[i] - w[i]);
        den2 += w[i] * w[i];
      }
    }
    if (!ok && bad++ == 0) first = i;
    if (!ok && excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  const double nmse_v = den2 > 0 ? num2 / den2 : num2;
  const bool nmse_bad = !tol.exact && nmse_v > tol.nmse;
  if (!bad && !nmse_bad) return "";
  if (bad) {
    os << bad << " of " << w.size() << " elements out of tolerance";
    if (tol.exact)
      os << " (must match exactly)";
    else
      os << " (atol " << num(tol.atol) << ", rtol " << num(tol.rtol) << ")";
    os << "; first at " << index_string(s, first) << ": got " << num(g[first]) << ", want "
       << num(w[first]);
    if (poisoned && same_value(g[first], pv)) os << " (the poison value: never written?)";
    if (worst != first)
      os << "; worst at " << index_string(s, worst) << ": got " << num(g[worst]) << ", want "
         << num(w[worst]);
  }
  if (nmse_bad) os << (bad ? "; " : "") << "NMSE " << num(nmse_v) << " above " << num(tol.nmse);
  return os.str();
}

std::string attrs_string(const Attrs& a) {
  std::string s;
  for (const auto& [k, v] : a) s += (s.empty() ? "" : ", ") + k + " = " + attr_value_string(v);
  return s;
}

// The result of one run on the backend under test.
struct UnderTest {
  bool no_kernel = false;
  bool f64 = false;  // an input or output is f64
  std::vector<std::string> declines;
  std::string error;  // what it threw, "" if nothing
  std::string impl;
  std::vector<Tensor> bases;  // the copied inputs before views
  std::vector<Tensor> ins;    // as passed to the kernel
  std::vector<Tensor> outs, bufs;
};

UnderTest run_under_test(Backend& b, const Case& c, const std::vector<Input>& inputs,
                         const std::vector<std::vector<uint8_t>>& bytes, uint8_t poison) {
  UnderTest u;
  const int32_t dev = 0;
  try {
    const OpSchema& s = b.runtime().ops().get(c.op);
    const Attrs full = s.complete_attrs(c.attrs);
    std::vector<TensorDesc> in_descs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i].tensor;
      if (!t.defined()) {
        u.bases.emplace_back();
        u.ins.emplace_back();
        in_descs.emplace_back();
        continue;
      }
      Tensor base = Tensor::from_host(b, bytes[i].data(), t.shape(), t.dtype(), dev);
      u.bases.push_back(base);
      u.ins.push_back(inputs[i].view ? inputs[i].view(base) : base);
      in_descs.push_back(u.ins.back().desc());
    }
    const std::vector<TensorDesc> out_descs = s.infer_outputs(in_descs, full);
    const plx_dtype dtype = in_descs.at(static_cast<size_t>(s.type_input)).dtype;

    // As dispatch does: contiguous inputs unless a kernel for the op accepts strides.
    bool strided_ok = false;
    for (const plx_kernel* k : b.kernels(s.id, dtype))
      strided_ok = strided_ok || (k->flags & PLX_KERNEL_STRIDED);
    for (const TensorDesc& d : in_descs) u.f64 = u.f64 || d.dtype == PLX_F64;
    for (const TensorDesc& d : out_descs) u.f64 = u.f64 || d.dtype == PLX_F64;
    std::vector<Tensor> args = u.ins;
    args.resize(s.inputs.size());
    for (Tensor& t : args) {
      if (!t.defined() || strided_ok || t.is_contiguous()) continue;
      // Tensor::contiguous() runs copy itself: a copy without strided kernels cannot work.
      if (c.op == "copy")
        throw std::runtime_error("no copy kernel takes strided inputs (PLX_KERNEL_STRIDED), but "
                                 "copy is what makes any tensor contiguous");
      t = t.contiguous();
    }

    std::vector<plx_tensor> in_views, out_views;
    for (const Tensor& t : args) {
      plx_tensor v = t.view();
      v.data = nullptr;
      in_views.push_back(v);
    }
    for (const TensorDesc& d : out_descs) out_views.push_back(make_desc(d, dev));
    KernelResolution r = resolve_kernel(b, s, in_views, out_views, full, dev);
    if (!r.kernel) {
      u.no_kernel = true;
      u.declines = r.declines;
      return u;
    }
    u.impl = b.name() + "/" + (r.kernel->kernel().impl ? r.kernel->kernel().impl : "?");

    const plx_stream stream = b.stream(dev);
    for (size_t k = 0; k < out_descs.size(); ++k) {
      const uint64_t n = static_cast<uint64_t>(out_descs[k].numel()) * dtype_size(out_descs[k].dtype);
      Tensor buf = Tensor::empty(b, {static_cast<int64_t>(n + 2 * kGuardBytes)}, PLX_U8, dev);
      b.memset(dev, buf.data(), poison, n + 2 * kGuardBytes, stream);
      u.bufs.push_back(buf);
      u.outs.push_back(buf.alias(out_descs[k].dtype, out_descs[k].shape, kGuardBytes));
      out_views[k] = u.outs.back().view();
    }
    Tensor ws;
    if (r.kernel->workspace_bytes() > 0) {
      ws = Tensor::empty(b, {static_cast<int64_t>(r.kernel->workspace_bytes())}, PLX_U8, dev);
      b.memset(dev, ws.data(), poison, r.kernel->workspace_bytes(), stream);
    }
    for (size_t i = 0; i < args.size(); ++i) in_views[i] = args[i].view();
    r.kernel->run(in_views.data(), static_cast<int32_t>(in_views.size()), out_views.data(),
                  static_cast<int32_t>(out_views.size()), ws.defined() ? ws.data() : nullptr,
                  stream);
    b.sync(dev);
  } catch (const std::exception& e) {
    u.error = e.what();
    try {
      b.sync(dev);  // errors of work still queued, so the next case starts clean
    } catch (...) {
    }
  }
  return u;
}

// Bytes around an output that are no longer the poison: "" if none.
std::string check_guards(const Tensor& buf, uint64_t out_bytes, uint8_t poison) {
  const std::vector<uint8_t> b = bytes_of(buf);
  for (uint64_t i = 0; i < kGuardBytes; ++i)
    if (b[i] != poison)
      return "wrote " + std::to_string(kGuardBytes - i) + " bytes before the output's start";
  for (uint64_t i = kGuardBytes + out_bytes; i < b.size(); ++i)
    if (b[i] != poison)
      return "wrote at byte " + std::to_string(i - kGuardBytes - out_bytes) + " past the output's end";
  return "";
}

}  // namespace

// ---- Gen ----

std::mt19937_64 Gen::next_rng() { return std::mt19937_64(mix(seed_ + mix(++counter_))); }

std::vector<double> Gen::doubles(size_t n, double lo, double hi) {
  std::mt19937_64 rng = next_rng();
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

Tensor Gen::uniform(const Shape& s, double lo, double hi, plx_dtype d) {
  return values(s, doubles(static_cast<size_t>(shape_numel(s)), lo, hi), d);
}

Tensor Gen::nonzero(const Shape& s, double lo, double hi, plx_dtype d) {
  d = pick(d);
  std::vector<double> v = doubles(static_cast<size_t>(shape_numel(s)), lo, hi);
  std::mt19937_64 rng = next_rng();
  for (double& x : v) {
    if (!dtype_is_float(d)) x = std::max(1.0, std::floor(x));
    if (rng() & 1) x = -x;
  }
  return values(s, v, d);
}

Tensor Gen::ints(const Shape& s, plx_dtype d, int64_t lo, int64_t hi) {
  std::mt19937_64 rng = next_rng();
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = dist(rng);
  return tensor_from_ints(s, d, v);
}

Tensor Gen::ints_with(const Shape& s, plx_dtype d, int64_t lo, int64_t hi, int64_t rare,
                      int every) {
  std::mt19937_64 rng = next_rng();
  std::uniform_int_distribution<int64_t> dist(lo, hi - 1);
  std::vector<int64_t> v(static_cast<size_t>(shape_numel(s)));
  for (auto& x : v) x = rng() % static_cast<uint64_t>(every) == 0 ? rare : dist(rng);
  return tensor_from_ints(s, d, v);
}

Tensor Gen::values(const Shape& s, const std::vector<double>& v, plx_dtype d) {
  d = pick(d);
  if (dtype_is_float(d)) return from_doubles(v, s, d);
  std::vector<int64_t> iv(v.size());
  for (size_t i = 0; i < v.size(); ++i) iv[i] = static_cast<int64_t>(v[i]);
  return tensor_from_ints(s, d, iv);
}

Tensor Gen::int_values(const Shape& s, const std::vector<int64_t>& v, plx_dtype d) {
  return tensor_from_ints(s, d, v);
}

Tensor Gen::with_specials(const Shape& s, double lo, double hi, const std::vector<double>& specials,
                          int every, plx_dtype d) {
  std::vector<double> v = doubles(static_cast<size_t>(shape_numel(s)), lo, hi);
  std::mt19937_64 rng = next_rng();
  for (size_t i = 0; i < v.size(); ++i) {
    if (i < specials.size())
      v[i] = specials[i];
    else if (!specials.empty() && rng() % static_cast<uint64_t>(every) == 0)
      v[i] = specials[rng() % specials.size()];
  }
  return values(s, v, d);
}

Tensor Gen::scalar(double v, plx_dtype d, const Shape& s) { return values(s, {v}, d); }

std::vector<Tensor> Gen::cpu(std::string_view op, const std::vector<Tensor>& inputs,
                             const Attrs& attrs) {
  return call(plexus::test::cpu(), op, inputs, attrs);
}

// ---- tolerances ----

Tolerance tolerance_for(plx_dtype d, int64_t terms, bool tf32) {
  // Rounding error of a sum grows like the square root of its length for random-signed terms
  // (blocked or pairwise summation, either side); atol follows, for outputs near zero after
  // cancellation. rtol covers one rounding of the stored result (1 ulp in f16/bf16, where the
  // backends may round f32 values that differ in their last bits to neighbouring values).
  const double g = std::sqrt(static_cast<double>(std::max<int64_t>(terms, 1)));
  switch (d) {
    case PLX_F64: return {1e-12 * g, 1e-10, 1e-20, false};
    case PLX_F32:
      // TF32 rounds each operand to 10 mantissa bits: about 1e-3 relative per product.
      if (tf32) return {2e-3 * g, 2e-3, 1e-5, false};
      // NMSE 1e-9: an rms error of 3e-5 relative, room for cuDNN's Winograd and FFT algorithms.
      return {1e-5 * g, 1e-5, 1e-9, false};
    case PLX_F16: return {2e-3 * g, 2e-3, 1e-5, false};
    case PLX_BF16: return {1.6e-2 * g, 1.6e-2, 1e-4, false};
    default: return {0, 0, 0, true};
  }
}

std::string compare_tensors(const Tensor& got, const Tensor& want, const Tolerance& tol) {
  return compare_tensor(got, want, tol, -1);
}

Nmse nmse_of(const Tensor& got, const Tensor& want) {
  Nmse r;
  const std::vector<double> g = doubles_of(got), w = doubles_of(want);
  double num2 = 0, den2 = 0;
  for (size_t i = 0; i < w.size() && i < g.size(); ++i) {
    if (std::isfinite(g[i]) && std::isfinite(w[i])) {
      num2 += (g[i] - w[i]) * (g[i] - w[i]);
      den2 += w[i] * w[i];
    } else if (!same_value(g[i], w[i])) {
      ++r.mismatched_nonfinite;
    }
  }
  r.nmse = den2 > 0 ? num2 / den2 : num2;
  return r;
}

// ---- options and report ----

Options options_from_env() {
  Options o;
  o.seed = 20240601;
  if (const char* s = std::getenv("PLEXUS_CMP_SEED")) {
    if (std::string(s) == "random")
      o.seed = mix(std::random_device{}() ^ (static_cast<uint64_t>(std::random_device{}()) << 32));
    else
      o.seed = std::strtoull(s, nullptr, 0);
  }
  if (const char* s = std::getenv("PLEXUS_CMP_OPS")) {
    std::string all = s, cur;
    for (char ch : all + ",") {
      if (ch == ',') {
        if (!cur.empty()) o.ops.push_back(cur);
        cur.clear();
      } else if (ch != ' ') {
        cur += ch;
      }
    }
  }
  if (const char* s = std::getenv("PLEXUS_CMP_CASE")) o.only_case = std::strtoll(s, nullptr, 10);
  return o;
}

std::string Report::summary() const {
  std::ostringstream os;
  os << "backend '" << backend << "': " << cases << " case/dtype combinations (" << runs
     << " runs) over " << per_op.size() << " ops; " << failed << " failed";
  if (!missing.empty()) {
    os << "; missing float kernels (" << missing.size() << "):";
    for (const auto& m : missing) os << " " << m;
  }
  if (!not_covered.empty()) {
    os << "; not covered (integer/f64 kernels the backend lacks, not a failure):";
    for (const auto& m : not_covered) os << " " << m;
  }
  for (const auto& f : failures) os << "\n\n" << f;
  if (failures.size() < static_cast<size_t>(failed))
    os << "\n\n... and " << (static_cast<size_t>(failed) - failures.size()) << " more failures";
  return os.str();
}

std::string Report::coverage() const {
  std::ostringstream os;
  for (const auto& [op, n] : per_op) {
    os << op << ": " << n << " (";
    const auto it = dtypes_run.find(op);
    if (it != dtypes_run.end())
      for (size_t i = 0; i < it->second.size(); ++i) os << (i ? " " : "") << dtype_name(it->second[i]);
    os << ")\n";
  }
  return os.str();
}

// ---- the engine ----

namespace {

const std::vector<plx_dtype> kAllDtypes = {PLX_F32, PLX_F16, PLX_BF16, PLX_I32,
                                           PLX_I64, PLX_U8,  PLX_F64};

bool required_float(plx_dtype d) { return d == PLX_F32 || d == PLX_F16 || d == PLX_BF16; }

class Engine {
 public:
  Engine(Backend& ut, const Options& o, Report& r) : ut_(ut), o_(o), rep_(r) {}

  void run(const Case& c, int64_t id) {
    Backend& ref = cpu();
    const OpSchema& rs = ref.runtime().ops().get(c.op);
    const OpSchema* us = ut_.runtime().ops().find(c.op);
    for (plx_dtype d : c.dtypes.empty() ? kAllDtypes : c.dtypes) {
      if (!ref.supports(rs.id, d)) continue;
      if (o_.tf32 && (!c.tf32 || d != PLX_F32)) continue;
      if (!us || !ut_.supports(us->id, d)) {
        const std::string key = c.op + " (" + dtype_name(d) + ")";
        auto& list = required_float(d) ? rep_.missing : rep_.not_covered;
        if (std::find(list.begin(), list.end(), key) == list.end()) list.push_back(key);
        continue;
      }
      run_dtype(c, id, d);
    }
  }

 private:
  void fail(const std::string& header, const std::string& what) {
    ++rep_.failed;
    if (rep_.failures.size() < o_.max_failures) rep_.failures.push_back(header + "\n  " + what);
  }

  void run_dtype(const Case& c, int64_t id, plx_dtype d) {
    ++rep_.cases;
    ++rep_.per_op[c.op];
    auto& seen = rep_.dtypes_run[c.op];
    if (std::find(seen.begin(), seen.end(), d) == seen.end()) seen.push_back(d);

    const uint64_t seed = mix(o_.seed ^ mix(static_cast<uint64_t>(id) * 64 + static_cast<uint64_t>(d)));
    std::ostringstream hdr;
    hdr << "op '" << c.op << "' " << dtype_name(d) << (c.what.empty() ? "" : " [" + c.what + "]")
        << (o_.tf32 ? " with TF32" : "") << ", case " << id << ", seed " << seed;
    const std::string rerun = "  rerun alone: PLEXUS_CMP_SEED=" + std::to_string(o_.seed) +
                              " PLEXUS_CMP_CASE=" + std::to_string(id);

    Gen g(d, seed);
    std::vector<Input> inputs;
    try {
      inputs = c.inputs(g);
    } catch (const std::exception& e) {
      fail(hdr.str(), std::string("making the inputs failed: ") + e.what());
      return;
    }
    std::vector<std::vector<uint8_t>> bytes;
    std::string ins_text;
    const OpSchema& rs = cpu().runtime().ops().get(c.op);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Tensor& t = inputs[i].tensor;
      bytes.push_back(t.defined() ? bytes_of(t) : std::vector<uint8_t>{});
      const std::string name = i < rs.inputs.size() ? rs.inputs[i].name : std::to_string(i);
      ins_text += (i ? ", " : "") + name + " " +
                  (t.defined() ? std::string(dtype_name(t.dtype())) + shape_string(t.shape()) +
                                     (inputs[i].view ? " (a view)" : "")
                               : std::string("absent"));
    }
    hdr << "\n  inputs: " << ins_text;
    if (c.attrs.size()) hdr << "\n  attrs: " << attrs_string(c.attrs);
    hdr << "\n" << rerun;
    const std::string header = hdr.str();

    // The reference, on fresh copies (it may write its inputs in place).
    std::vector<Tensor> ref_ins;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].tensor.defined()) {
        ref_ins.emplace_back();
        continue;
      }
      Tensor base = Tensor::from_host(cpu(), bytes[i].data(), inputs[i].tensor.shape(),
                                      inputs[i].tensor.dtype());
      ref_ins.push_back(inputs[i].view ? inputs[i].view(base) : base);
    }
    std::vector<Tensor> ref_outs;
    std::string ref_error;
    try {
      ref_outs = call(cpu(), c.op, ref_ins, c.attrs);
      cpu().sync(0);
    } catch (const std::exception& e) {
      ref_error = e.what();
    }

    if (c.error) {
      if (ref_error.empty()) {
        fail(header, "the case is wrong: the CPU reference accepted data the case marks invalid");
        return;
      }
      ++rep_.runs;
      const UnderTest u = run_under_test(ut_, c, inputs, bytes, 0xFF);
      if (u.no_kernel)
        declined(c, d, header, u);
      else if (u.error.empty())
        fail(header, "accepted invalid data without an error (" + u.impl +
                         "); the CPU reference said: " + ref_error);
      return;
    }
    if (!ref_error.empty()) {
      fail(header, "the case is wrong: the CPU reference failed: " + ref_error);
      return;
    }

    for (uint8_t poison : {uint8_t{0xFF}, uint8_t{0x5A}}) {
      ++rep_.runs;
      UnderTest u = run_under_test(ut_, c, inputs, bytes, poison);
      if (u.no_kernel) {
        declined(c, d, header, u);
        return;
      }
      if (!u.error.empty()) {
        fail(header, "failed on '" + ut_.name() + "': " + u.error);
        return;
      }
      if (o_.tamper) {
        RunState st{c, d, poison, u.outs, u.bufs, u.ins};
        o_.tamper(st);
      }
      std::string problems;
      auto note = [&](const std::string& what, const std::string& p) {
        if (!p.empty()) problems += "\n  " + what + ": " + p;
      };
      for (size_t k = 0; k < ref_outs.size(); ++k) {
        const std::string name =
            "output " + std::to_string(k) + " '" + (k < rs.outputs.size() ? rs.outputs[k].name : "?") + "'";
        Tolerance tol = tolerance_for(ref_outs[k].dtype(), c.terms, o_.tf32);
        if (c.exact) tol.exact = true;
        note(name, compare_tensor(u.outs.at(k), ref_outs[k], tol, poison));
        note(name, check_guards(u.bufs.at(k), ref_outs[k].nbytes(), poison));
      }
      for (size_t i = 0; i < inputs.size() && i < rs.inputs.size(); ++i) {
        if (!inputs[i].tensor.defined()) continue;
        const std::string name = "input " + std::to_string(i) + " '" + rs.inputs[i].name + "'";
        if (rs.inputs[i].flags & PLX_ARG_MUTATED) {
          Tolerance tol = tolerance_for(ref_ins[i].dtype(), c.terms, o_.tf32);
          if (c.exact) tol.exact = true;
          note(name + " (written in place)", compare_tensor(u.ins.at(i), ref_ins[i], tol, -1));
        } else if (bytes_of(u.bases.at(i)) != bytes[i]) {
          note(name, "was modified, but the op must not write it");
        }
      }
      if (!problems.empty()) {
        fail(header, "poison " + hex_byte(poison) + ", kernel " + u.impl + ":" + problems);
        return;  // the other poison would say the same again
      }
    }
  }

  // Every kernel declined a valid node: the op fails there for users. Cases with f64 tensors
  // (a cast to f64, say) are only reported, like missing f64 kernels.
  void declined(const Case& c, plx_dtype d, const std::string& header, const UnderTest& u) {
    if (!u.f64) {
      fail(header, declines_text(u));
      return;
    }
    const std::string key = c.op + " (" + dtype_name(d) + ", " + c.what + ": declined)";
    if (std::find(rep_.not_covered.begin(), rep_.not_covered.end(), key) == rep_.not_covered.end())
      rep_.not_covered.push_back(key);
  }

  static std::string declines_text(const UnderTest& u) {
    std::string s = "no kernel took the case (a valid node must not be declined)";
    for (const auto& d : u.declines) s += "\n    declined: " + d;
    return s;
  }

  Backend& ut_;
  const Options& o_;
  Report& rep_;
};

}  // namespace

Report run_cases(Backend& under_test, const std::vector<Case>& cases, const Options& options) {
  Report rep;
  rep.backend = under_test.name();
  Engine e(under_test, options, rep);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const int64_t id = c.id >= 0 ? c.id : static_cast<int64_t>(i);
    if (options.only_case >= 0 && id != options.only_case) continue;
    if (!options.ops.empty() &&
        std::find(options.ops.begin(), options.ops.end(), c.op) == options.ops.end())
      continue;
    e.run(c, id);
  }
  return rep;
}

Report run_cases(std::string_view backend, const std::vector<Case>& cases, const Options& options) {
  return run_cases(runtime().backend(backend), cases, options);
}

std::vector<Case> cases_of(std::string_view op) {
  std::vector<Case> out;
  for (const Case& c : all_cases())
    if (c.op == op) out.push_back(c);
  return out;
}

}  // namespace plexus::test::cmp
