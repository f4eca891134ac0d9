// `plexus compare`: running the sections and measuring each row (compare.hpp).
#include "plexus/compare.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <set>
#include <sstream>

#include <unistd.h>

#include "../train/step_graph.hpp"
#include "../train/step_pipeline.hpp"
#include "plexus/backend.hpp"
#include "plexus/error.hpp"
#include "plexus/executor.hpp"
#include "plexus/graph.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"
#include "plexus/trainer.hpp"

namespace fs = std::filesystem;

namespace plexus {

// ---- tolerances and error statistics ----

double default_nmse(plx_dtype d, bool step) {
  const double f = step ? 100.0 : 1.0;
  switch (d) {
    case PLX_F64: return 1e-20 * f;
    case PLX_F32: return 1e-9 * f;
    case PLX_F16: return 1e-5 * f;
    case PLX_BF16: return 1e-4 * f;
    default: return 0;
  }
}

void ErrorStats::merge(const ErrorStats& o) {
  max_abs = std::max(max_abs, o.max_abs);
  max_rel = std::max(max_rel, o.max_rel);
  nmse = std::max(nmse, o.nmse);
  nonfinite_mismatch += o.nonfinite_mismatch;
  elements += o.elements;
}

ErrorStats error_stats(const std::vector<double>& got, const std::vector<double>& want) {
  ErrorStats s;
  s.elements = static_cast<int64_t>(want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(g) || !std::isfinite(w)) {
      const bool same = (std::isnan(g) && std::isnan(w)) || g == w;
      if (!same) ++s.nonfinite_mismatch;
      continue;
    }
    const double d = std::fabs(g - w);
    s.max_abs = std::max(s.max_abs, d);
    if (w != 0) s.max_rel = std::max(s.max_rel, d / std::fabs(w));
    num += d * d;
    den += w * w;
  }
  s.nonfinite_mismatch += static_cast<int64_t>(std::max(got.size(), want.size()) -
                                               std::min(got.size(), want.size()));
  s.nmse = den > 0 ? num / den : num;
  return s;
}

const char* status_name(CompareRow::Status s) {
  switch (s) {
    case CompareRow::Status::Pass: return "pass";
    case CompareRow::Status::Fail: return "FAIL";
    case CompareRow::Status::UnsupportedA: return "unsupported on a";
    case CompareRow::Status::UnsupportedB: return "unsupported on b";
    case CompareRow::Status::Error: return "ERROR";
  }
  return "?";
}

int64_t CompareReport::passed() const {
  return std::count_if(rows.begin(), rows.end(),
                       [](const CompareRow& r) { return r.status == CompareRow::Status::Pass; });
}
int64_t CompareReport::failed() const {
  return std::count_if(rows.begin(), rows.end(), [](const CompareRow& r) { return r.failed(); });
}
int64_t CompareReport::unsupported() const {
  return std::count_if(rows.begin(), rows.end(), [](const CompareRow& r) {
    return r.status == CompareRow::Status::UnsupportedA || r.status == CompareRow::Status::UnsupportedB;
  });
}

std::string pick_backend_b(Runtime& rt, const std::string& a) {
  Backend* any = nullptr;
  for (Backend* b : rt.backends()) {
    if (b->name() == a || b->device_count() == 0) continue;
    if (!(b->device(0).caps & PLX_CAP_UNIFIED_HOST)) return b->name();
    if (!any) any = b;
  }
  return any ? any->name() : a;
}

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// splitmix64: neighbouring seeds share no structure.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A tensor's bytes on the host.
struct HostTensor {
  plx_dtype dtype = PLX_DTYPE_NONE;
  Shape shape;
  std::vector<uint8_t> bytes;
  bool present() const { return dtype != PLX_DTYPE_NONE; }
};

HostTensor make_input(const SuiteInput& in, plx_dtype item_dtype, uint64_t seed) {
  HostTensor h;
  if (in.kind == SuiteInput::Kind::Absent) return h;
  h.dtype = in.dtype == PLX_DTYPE_NONE ? item_dtype : in.dtype;
  h.shape = in.shape;
  const size_t n = static_cast<size_t>(shape_numel(in.shape));
  std::vector<double> v(n);
  std::mt19937_64 rng(seed);
  const bool integer_dtype = !dtype_is_float(h.dtype);
  switch (in.kind) {
    case SuiteInput::Kind::Uniform:
    case SuiteInput::Kind::Nonzero: {
      std::uniform_real_distribution<double> u(in.lo, in.hi);
      for (double& x : v) {
        x = u(rng);
        if (integer_dtype) x = std::floor(x);
        if (in.kind == SuiteInput::Kind::Nonzero) {
          if (integer_dtype) x = std::max(1.0, x);
          if (rng() & 1) x = -x;
        }
      }
      break;
    }
    case SuiteInput::Kind::Ints: {
      std::uniform_int_distribution<int64_t> u(static_cast<int64_t>(std::ceil(in.lo)),
                                               static_cast<int64_t>(std::ceil(in.hi)) - 1);
      for (double& x : v) x = static_cast<double>(u(rng));
      break;
    }
    case SuiteInput::Kind::Value: std::fill(v.begin(), v.end(), in.lo); break;
    case SuiteInput::Kind::Absent: break;
  }
  h.bytes.resize(std::max<size_t>(1, n * dtype_size(h.dtype)));
  visit_dtype(h.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = reinterpret_cast<T*>(h.bytes.data());
    for (size_t i = 0; i < n; ++i) {
      if constexpr (std::is_integral_v<T>)
        p[i] = static_cast<T>(static_cast<int64_t>(v[i]));
      else
        p[i] = convert<T>(v[i]);
    }
  });
  return h;
}

// Uniform in [-1, 1) in `d`: the output gradient of backward rows.
HostTensor make_uniform(const TensorDesc& d, uint64_t seed) {
  SuiteInput in;
  in.shape = d.shape;
  in.dtype = d.dtype;
  return make_input(in, d.dtype, seed);
}

// A copy on the cpu backend that later runs cannot change (Tensor::to shares memory when the
// tensor is already there).
Tensor snapshot(const Tensor& t, Backend& cpu) {
  std::vector<uint8_t> bytes(std::max<uint64_t>(1, t.nbytes()));
  if (t.nbytes()) t.contiguous().copy_to_host(bytes.data());
  return Tensor::from_host(cpu, bytes.data(), t.shape(), t.dtype());
}

std::vector<double> host_doubles(const Tensor& t) {
  return t.numel() ? t.to_doubles() : std::vector<double>{};
}

// The item's dtypes: its own list, else the float dtypes or, when an input that follows the
// item's dtype is drawn with `ints`, the integer ones.
std::vector<plx_dtype> item_dtypes(const SuiteItem& it) {
  if (!it.dtypes.empty()) return it.dtypes;
  bool ints = false;
  for (const SuiteInput& in : it.inputs)
    ints = ints || (in.kind == SuiteInput::Kind::Ints && in.dtype == PLX_DTYPE_NONE);
  if (ints) return {PLX_I32, PLX_I64, PLX_U8};
  return {PLX_F32, PLX_F16, PLX_BF16, PLX_F64};
}

std::string default_what(const SuiteItem& it, const OpSchema& s) {
  std::string w;
  for (size_t i = 0; i < it.inputs.size(); ++i) {
    if (it.inputs[i].kind == SuiteInput::Kind::Absent) continue;
    const std::string name = i < s.inputs.size() ? s.inputs[i].name : "in" + std::to_string(i);
    w += (w.empty() ? "" : " ") + name + shape_string(it.inputs[i].shape);
  }
  for (const auto& [k, v] : it.attrs) w += " " + k + "=" + attr_value_string(v);
  return w;
}

bool no_kernel(const std::string& message) {
  return message.find("has no kernel on backend") != std::string::npos;
}

// One (item, dtype) as a graph: the op on its inputs (parameters where a gradient can flow,
// states where the op writes them in place, inputs otherwise), its outputs marked, and, if asked
// and possible, its gradient formula seeded from the input "dy".
struct OpGraph {
  std::unique_ptr<Graph> g;
  std::vector<std::string> in_names;   // per input: "in<i>", "" if absent
  std::vector<bool> persistent;        // per input: a parameter or state (set in the store)
  std::vector<bool> mutated;           // per input: the op writes it
  std::vector<std::string> labels;     // per input: the schema's name for it
  std::vector<std::pair<std::string, Var>> outs, grads;  // name -> value, read after the run
  bool backward = false;
  std::string backward_ops;  // the ops of the gradient formula's nodes
};

OpGraph build_op_graph(const OpRegistry& ops, const SuiteItem& it,
                       const std::vector<HostTensor>& ins, bool with_backward) {
  const OpSchema& s = ops.get(it.op);
  OpGraph og;
  og.g = std::make_unique<Graph>(ops);
  Graph& g = *og.g;
  std::vector<Var> vars, params;
  std::vector<size_t> param_input;
  for (size_t i = 0; i < ins.size(); ++i) {
    const HostTensor& h = ins[i];
    const uint32_t flags = i < s.inputs.size() ? s.inputs[i].flags : 0;
    og.in_names.push_back(h.present() ? "in" + std::to_string(i) : "");
    og.labels.push_back(i < s.inputs.size() ? s.inputs[i].name : og.in_names.back());
    og.mutated.push_back((flags & PLX_ARG_MUTATED) != 0);
    og.persistent.push_back(false);
    if (!h.present()) {
      vars.emplace_back();
      continue;
    }
    const TensorDesc d{h.dtype, h.shape};
    if (flags & PLX_ARG_MUTATED) {
      vars.push_back(g.state(og.in_names.back(), d, init::zeros()));
      og.persistent.back() = true;
    } else if (dtype_is_float(h.dtype) && !(flags & PLX_ARG_NO_GRAD) && with_backward) {
      vars.push_back(g.parameter(og.in_names.back(), d, init::zeros()));
      og.persistent.back() = true;
      params.push_back(vars.back());
      param_input.push_back(i);
    } else {
      vars.push_back(g.input(og.in_names.back(), d));
    }
  }
  const std::vector<Var> outs = g.add(it.op, vars, it.attrs, it.op);
  auto keep = [&](Var v, const std::string& name, std::vector<std::pair<std::string, Var>>& into) {
    if (g.value(g.storage_root(v)).kind == ValueKind::Activation) g.mark_output(v, name);
    into.emplace_back(name, v);
  };
  for (size_t k = 0; k < outs.size(); ++k) {
    const std::string name = k < s.outputs.size() ? s.outputs[k].name : "out" + std::to_string(k);
    keep(outs[k], "out:" + name, og.outs);
  }
  if (with_backward && s.grad && !params.empty() && !outs.empty() &&
      dtype_is_float(g.desc(outs[0]).dtype)) {
    const Var dy = g.input("dy", g.desc(outs[0]));
    const size_t first = g.nodes().size();
    const std::vector<Var> gs = backward(g, outs[0], params, dy);
    std::set<std::string> seen;
    for (size_t n = first; n < g.nodes().size(); ++n) {
      const std::string op = g.nodes()[n].op_name();
      if (op != "reshape" && seen.insert(op).second) og.backward_ops += (og.backward_ops.empty() ? "" : ", ") + op;
    }
    for (size_t j = 0; j < gs.size(); ++j) {
      if (!gs[j].valid()) continue;
      const size_t i = param_input[j];
      const std::string name = i < s.inputs.size() ? s.inputs[i].name : "in" + std::to_string(i);
      keep(gs[j], "grad:" + name, og.grads);
    }
    og.backward = !og.grads.empty();
  }
  return og;
}

// The results of one backend's run of an OpGraph.
struct OpRun {
  std::string unsupported;  // why the backend cannot run it ("" if it can)
  std::string error;        // what failed
  std::map<std::string, Tensor> values;  // outputs, gradients and written inputs, by name
  double fwd_ms = -1, bwd_ms = -1;
  std::vector<std::string> kernels;  // "op: backend/impl" per node
};

OpRun run_op_graph(Backend& b, int32_t device, const OpGraph& og, const std::vector<HostTensor>& ins,
                   const HostTensor& dy, const CompareOptions& o) {
  OpRun r;
  try {
    TensorStore store;
    for (size_t i = 0; i < ins.size(); ++i)
      if (og.persistent[i])
        store.set(og.in_names[i], Tensor::from_host(b, ins[i].bytes.data(), ins[i].shape, ins[i].dtype, device));
    ExecutableOptions eo;
    eo.device = device;
    eo.capture = false;  // events between the forward and the backward kernels
    eo.fuse = false;     // the op's own kernel
    std::unique_ptr<Executable> exe;
    try {
      exe = std::make_unique<Executable>(b, *og.g, store, eo);
    } catch (const std::exception& e) {
      if (no_kernel(e.what())) {
        r.unsupported = e.what();
        return r;
      }
      throw;
    }
    auto feed = [&] {
      for (size_t i = 0; i < ins.size(); ++i)
        if (ins[i].present() && !og.persistent[i]) exe->tensor(og.in_names[i]).copy_from_host(ins[i].bytes.data());
      if (og.backward) exe->tensor("dy").copy_from_host(dy.bytes.data());
    };
    // Events: before the op's kernel, before the first backward kernel, after the last.
    const int32_t nk = exe->num_kernels();
    int32_t first_bwd = -1;
    for (size_t n = 0; n < og.g->nodes().size(); ++n) {
      if (og.g->nodes()[n].phase != Phase::Backward) continue;
      const int32_t k = exe->kernel_index(static_cast<int32_t>(n));
      if (k >= 0 && (first_bwd < 0 || k < first_bwd)) first_bwd = k;
    }
    Events ev(b, device, 3);
    const plx_stream st = exe->stream();
    if (nk > 0) {
      exe->add_hook(0, Executable::HookPoint::Before, [&] { b.record(ev[0], st); }, true);
      if (first_bwd > 0) exe->add_hook(first_bwd, Executable::HookPoint::Before, [&] { b.record(ev[1], st); }, true);
      exe->add_hook(nk - 1, Executable::HookPoint::After, [&, fb = first_bwd] { b.record(ev[fb > 0 ? 2 : 1], st); }, true);
    }
    feed();
    exe->run();
    exe->sync();
    for (const auto& [name, v] : og.outs) r.values[name] = exe->tensor(v);
    for (const auto& [name, v] : og.grads) r.values[name] = exe->tensor(v);
    for (size_t i = 0; i < ins.size(); ++i)
      if (og.mutated[i] && ins[i].present()) r.values["written:" + og.labels[i]] = exe->tensor(og.in_names[i]);
    // Host copies now: the timed runs below write the same memory again.
    std::map<std::string, Tensor> host;
    for (auto& [name, t] : r.values) host[name] = snapshot(t, b.runtime().backend("cpu"));
    r.values = std::move(host);
    r.kernels = exe->kernel_names();
    if (nk == 0) return r;
    for (int i = 0; i < o.warmup; ++i) {
      exe->run();
      exe->sync();
    }
    std::vector<double> f, bw;
    for (int i = 0; i < o.repeats; ++i) {
      exe->run();
      exe->sync();
      if (first_bwd > 0) {
        f.push_back(b.elapsed_ms(ev[0], ev[1]));
        bw.push_back(b.elapsed_ms(ev[1], ev[2]));
      } else {
        f.push_back(b.elapsed_ms(ev[0], ev[1]));
      }
    }
    r.fwd_ms = median(f);
    if (first_bwd > 0) r.bwd_ms = median(bw);
  } catch (const std::exception& e) {
    r.error = e.what();
    try {
      b.sync(device);
    } catch (...) {
    }
  }
  return r;
}

// The tolerance of a tensor of dtype `d` in a row: --nmse, then the item's, then the suite's,
// then the default.
double tolerance_of(plx_dtype d, const CompareOptions& o, const SuiteItem* it, const Suite* suite,
                    bool step) {
  if (!dtype_is_float(d)) return 0;
  if (auto i = o.nmse.find(d); i != o.nmse.end()) return i->second;
  if (it && it->nmse) return *it->nmse;
  if (suite)
    if (auto i = suite->nmse.find(d); i != suite->nmse.end()) return i->second;
  return default_nmse(d, step);
}

// Compares the named tensors of b against a's into `row`: statistics merged over them, the row
// failing if any fails its dtype's tolerance (integers and masks: exactly), and the worst one
// named in the note when there are several.
void compare_values(CompareRow& row, const std::map<std::string, Tensor>& a,
                    const std::map<std::string, Tensor>& b, const std::vector<std::string>& names,
                    const std::function<double(plx_dtype)>& tol) {
  bool ok = true;
  double worst = -1;
  std::string worst_name;
  for (const std::string& n : names) {
    const Tensor& ta = a.at(n);
    const Tensor& tb = b.at(n);
    if (ta.shape() != tb.shape() || ta.dtype() != tb.dtype()) {
      ok = false;
      row.note = n + ": " + tb.str() + " against " + ta.str();
      continue;
    }
    const ErrorStats s = error_stats(host_doubles(tb), host_doubles(ta));
    row.err.merge(s);
    const bool exact = !dtype_is_float(ta.dtype());
    const double t = tol(ta.dtype());
    const bool pass = s.nonfinite_mismatch == 0 && (exact ? s.max_abs == 0 : s.nmse <= t);
    // Failures rank above passes; then by NMSE over the tolerance.
    const double score = (pass ? 0.0 : 1e300) + (exact ? s.max_abs : (t > 0 ? s.nmse / t : s.nmse));
    ok = ok && pass;
    if (score > worst) {
      worst = score;
      worst_name = n;
    }
  }
  auto note = [&](const std::string& t) { row.note += (row.note.empty() ? "" : "; ") + t; };
  if (!worst_name.empty() && names.size() > 1) note("worst: " + worst_name);
  if (ok) return;
  row.status = CompareRow::Status::Fail;
  if (!worst_name.empty() && !dtype_is_float(a.at(worst_name).dtype())) note("integers must match exactly");
  if (row.err.nonfinite_mismatch) note(std::to_string(row.err.nonfinite_mismatch) + " NaN/inf mismatches");
}

// The implementation that ran the item's op: the first kernel's ("<node> <op>: backend/impl").
std::string forward_kernel(const OpRun& r) {
  if (r.kernels.empty()) return "";
  const std::string& k = r.kernels.front();
  const size_t colon = k.find(": ");
  return colon == std::string::npos ? k : k.substr(colon + 2);
}

class Runner {
 public:
  Runner(Runtime& rt, const Config& cfg, const CompareOptions& o, CompareReport& rep, std::ostream* live)
      : rt_(rt), cfg_(cfg), o_(o), rep_(rep), live_(live), a_(rt.backend(o.a)), b_(rt.backend(rep.b)) {}

  void add(CompareRow row) {
    rep_.rows.push_back(std::move(row));
    if (live_) {
      *live_ << compare_table_row(rep_, rep_.rows.back());
      live_->flush();
    }
  }

  // ---- ops ----
  void ops() {
    const Suite suite = o_.suite_file.empty() ? default_suite(&rt_.ops()) : load_suite(o_.suite_file, &rt_.ops());
    rep_.suite = suite.name + " (" + suite.source + ")";
    for (size_t idx = 0; idx < suite.items.size(); ++idx) {
      const SuiteItem& it = suite.items[idx];
      if (!o_.only_ops.empty() && std::find(o_.only_ops.begin(), o_.only_ops.end(), it.op) == o_.only_ops.end())
        continue;
      const OpSchema& s = rt_.ops().get(it.op);
      for (plx_dtype d : item_dtypes(it)) {
        if (!o_.dtypes.empty() && std::find(o_.dtypes.begin(), o_.dtypes.end(), d) == o_.dtypes.end()) continue;
        const bool on_a = a_.supports(s.id, d), on_b = b_.supports(s.id, d);
        if (!on_a && !on_b) continue;
        item(suite, idx, it, s, d, on_a, on_b);
      }
    }
  }

  void item(const Suite& suite, size_t idx, const SuiteItem& it, const OpSchema& s, plx_dtype d,
            bool on_a, bool on_b) {
    CompareRow fwd;
    fwd.section = "ops";
    fwd.name = it.op;
    fwd.pass = s.name.find("_update") != std::string::npos ? "update" : "forward";
    fwd.dtype = dtype_name(d);
    fwd.what = it.what.empty() ? default_what(it, s) : it.what;
    fwd.ops_run = it.op;
    fwd.tolerance = tolerance_of(d, o_, &it, &suite, false);
    const uint64_t base = mix(o_.seed ^ mix(idx * 64 + static_cast<uint64_t>(d)));
    std::vector<HostTensor> ins;
    OpGraph og;
    try {
      for (size_t i = 0; i < it.inputs.size(); ++i) ins.push_back(make_input(it.inputs[i], d, mix(base + i)));
      og = build_op_graph(rt_.ops(), it, ins, it.backward);
    } catch (const std::exception& e) {
      fwd.status = CompareRow::Status::Error;
      fwd.note = std::string("the item does not fit the op (") + it.where + "): " + e.what();
      add(std::move(fwd));
      return;
    }
    CompareRow bwd = fwd;
    bwd.pass = "backward";
    bwd.ops_run = og.backward_ops;
    HostTensor dy;
    if (og.backward) dy = make_uniform(og.g->desc(og.g->get("dy")), mix(base + 1000));
    if (!on_a || !on_b) {
      const bool a_missing = !on_a;
      fwd.status = a_missing ? CompareRow::Status::UnsupportedA : CompareRow::Status::UnsupportedB;
      fwd.note = "no kernel for " + it.op + " (" + dtype_name(d) + ") on " + (a_missing ? o_.a : rep_.b);
      if (og.backward) {
        bwd.status = fwd.status;
        bwd.note = fwd.note;
      }
      add(fwd);
      if (og.backward) add(bwd);
      return;
    }
    OpRun ra = run_op_graph(a_, o_.device_a, og, ins, dy, o_);
    OpRun rb = run_op_graph(b_, o_.device_b, og, ins, dy, o_);
    // A backend that cannot run the backward nodes still runs the forward alone.
    if (og.backward && (!ra.unsupported.empty() || !rb.unsupported.empty())) {
      OpGraph fo = build_op_graph(rt_.ops(), it, ins, false);
      OpRun fa = run_op_graph(a_, o_.device_a, fo, ins, dy, o_);
      OpRun fb = run_op_graph(b_, o_.device_b, fo, ins, dy, o_);
      bwd.status = !ra.unsupported.empty() ? CompareRow::Status::UnsupportedA : CompareRow::Status::UnsupportedB;
      bwd.note = !ra.unsupported.empty() ? ra.unsupported : rb.unsupported;
      finish_forward(fwd, fo, fa, fb);
      add(fwd);
      add(bwd);
      return;
    }
    finish_forward(fwd, og, ra, rb);
    add(fwd);
    if (!og.backward) return;
    // A failed forward still gets its backward compared (it says where the difference goes);
    // an error or an unsupported forward leaves nothing to compare.
    if (fwd.status != CompareRow::Status::Pass && fwd.status != CompareRow::Status::Fail) {
      bwd.status = fwd.status;
      bwd.note = fwd.note;
      add(bwd);
      return;
    }
    std::vector<std::string> names;
    for (const auto& [n, v] : og.grads) names.push_back(n);
    compare_values(bwd, ra.values, rb.values, names,
                   [&](plx_dtype t) { return tolerance_of(t, o_, &it, &suite, false); });
    bwd.ms_a = ra.bwd_ms;
    bwd.ms_b = rb.bwd_ms;
    if (bwd.status == CompareRow::Status::Pass) cover(*og.g, true);
    add(std::move(bwd));
  }

  void finish_forward(CompareRow& row, const OpGraph& og, const OpRun& ra, const OpRun& rb) {
    if (!ra.unsupported.empty() || !rb.unsupported.empty()) {
      row.status = !ra.unsupported.empty() ? CompareRow::Status::UnsupportedA : CompareRow::Status::UnsupportedB;
      row.note = !ra.unsupported.empty() ? ra.unsupported : rb.unsupported;
      return;
    }
    if (!ra.error.empty() || !rb.error.empty()) {
      row.status = CompareRow::Status::Error;
      row.note = !ra.error.empty() ? "on " + o_.a + ": " + ra.error : "on " + rep_.b + ": " + rb.error;
      return;
    }
    std::vector<std::string> names;
    for (const auto& [n, v] : og.outs) names.push_back(n);
    for (const auto& [n, t] : ra.values)
      if (n.rfind("written:", 0) == 0) names.push_back(n);
    compare_values(row, ra.values, rb.values, names, [&](plx_dtype t) {
      // The row's own tolerance for its dtype; other float dtypes (f32 statistics of an f16
      // batch norm) take theirs.
      return t == dtype_from_name(row.dtype) ? row.tolerance : tolerance_of(t, o_, nullptr, nullptr, false);
    });
    row.ms_a = ra.fwd_ms;
    row.ms_b = rb.fwd_ms;
    const std::string ka = forward_kernel(ra), kb = forward_kernel(rb);
    if (!ka.empty() || !kb.empty()) row.ops_run = row.name + " (" + ka + " | " + kb + ")";
    if (row.status == CompareRow::Status::Pass) cover(*og.g, false);
  }

  // Records the ops a passing row ran on both backends (forward: the first node; backward: the
  // rest).
  void cover(const Graph& g, bool backward) {
    const auto& nodes = g.nodes();
    for (size_t n = 0; n < nodes.size(); ++n) {
      if (!nodes[n].schema) continue;
      if ((nodes[n].phase == Phase::Backward) != backward) continue;
      auto& v = rep_.ops_covered[nodes[n].schema->name];
      const plx_dtype t = g.desc(nodes[n].inputs.at(static_cast<size_t>(nodes[n].schema->type_input))).dtype;
      const std::string name = dtype_name(t);
      if (std::find(v.begin(), v.end(), name) == v.end()) v.push_back(name);
    }
  }

  // ---- one training step ----
  void step() {
    const ModelSpec spec = model_of(cfg_);
    rep_.model = spec.name;
    const DataSets sets = load_data(cfg_, spec, false);
    const int64_t batch = cfg_.get_int("train.batch_size");
    data::LoaderOptions lo;
    lo.batch_size = batch;
    lo.shuffle = cfg_.get_bool("data.shuffle");
    lo.seed = static_cast<uint64_t>(cfg_.get_int("train.seed"));
    lo.mean = sets.train.mean;
    lo.std = sets.train.std;
    lo.prefetch = 1;
    lo.limit = cfg_.get_int("data.limit");
    data::Batch bt;
    {
      data::Loader loader(sets.train, lo);
      loader.start(0);
      if (!loader.next(bt)) throw ConfigError("train.batch_size: the data set has no full batch");
    }
    const OptimizerOptions opt = optimizer_options(cfg_);
    // train.precision: the step computes as training would, f16 with its loss scale on the
    // device from train.loss_scale_init (the gradients compared are backward's, times S; the
    // scaler's states are compared with the others).
    const plx_dtype compute = compute_dtype(cfg_);
    if (cfg_.get_string("train.precision") == "tf32") {
      enable_tf32(a_);
      enable_tf32(b_);
    }
    LossScaling scaling;
    scaling.init = cfg_.get_float("train.loss_scale_init");
    scaling.window = cfg_.get_int("train.loss_scale_window");
    auto sg = build_step(rt_.ops(), spec, batch, sets.train.sample_shape, true, opt, false, compute,
                         compute == PLX_F16 ? &scaling : nullptr, {},
                         cfg_.get_float("train.label_smoothing"));
    Graph& g = sg->graph;
    std::vector<std::string> pnames;
    for (size_t i = 0; i < sg->params.size(); ++i) {
      pnames.push_back(g.value(sg->params[i]).name);
      if (sg->grads[i].valid() && g.value(g.storage_root(sg->grads[i])).kind == ValueKind::Activation)
        g.mark_output(sg->grads[i], "grad:" + pnames.back());
    }
    struct Side {
      TensorStore store;
      std::unique_ptr<Executable> exe;
      std::map<std::string, Tensor> values;
      std::string unsupported, error;
      double ms = -1;
    };
    Side sa, sb;
    Backend& cpu = rt_.backend("cpu");
    // Makes the side's executable; `init` gives the parameters and states to start from (b
    // starts from a's), otherwise the executable creates them from train.seed.
    auto prepare = [&](Backend& be, int32_t dev, Side& side, const TensorStore* init) {
      try {
        if (init)
          for (const auto& [n, t] : init->all()) side.store.set(n, t.to(be, dev));
        ExecutableOptions eo;
        eo.device = dev;
        eo.seed = static_cast<uint64_t>(cfg_.get_int("train.seed"));
        eo.capture = cfg_.get_bool("train.graph_capture");
        eo.fuse = cfg_.get_bool("train.fusion");
        eo.channels_last = cfg_.get_bool("train.channels_last");
        side.exe = std::make_unique<Executable>(be, g, side.store, eo);
      } catch (const std::exception& e) {
        (no_kernel(e.what()) ? side.unsupported : side.error) = e.what();
      }
    };
    const float lr = static_cast<float>(cfg_.get_float("train.lr"));
    const float first_step = 1.0f;
    // One step on the first batch (kept for comparison), then warm-up and timed steps.
    auto execute = [&](Side& side) {
      if (!side.exe) return;
      try {
        Executable& e = *side.exe;
        auto feed = [&] {
          e.tensor("x").copy_from_host(bt.images.data());
          e.tensor("labels").copy_from_host(bt.labels.data());
          e.tensor(kLearningRateInput).copy_from_host(&lr);
          if (g.find(kStepInput).valid()) e.tensor(kStepInput).copy_from_host(&first_step);
        };
        feed();
        e.run();
        e.sync();
        side.values["loss"] = snapshot(e.tensor("loss_value"), cpu);
        for (size_t i = 0; i < pnames.size(); ++i)
          if (sg->grads[i].valid()) side.values["grad " + pnames[i]] = snapshot(e.tensor(sg->grads[i]), cpu);
        for (const auto& [n, t] : side.store.all()) side.values[n] = snapshot(t, cpu);
        std::vector<double> ms;
        for (int i = 0; i < o_.warmup + o_.repeats; ++i) {
          feed();
          const auto t0 = Clock::now();
          e.run();
          e.sync();
          if (i >= o_.warmup) ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        }
        side.ms = median(ms);
      } catch (const std::exception& ex) {
        side.error = ex.what();
      }
    };
    prepare(a_, o_.device_a, sa, nullptr);
    TensorStore initial;  // a's starting point, before its step changes it
    for (const auto& [n, t] : sa.store.all()) initial.set(n, snapshot(t, cpu));
    prepare(b_, o_.device_b, sb, sa.exe ? &initial : nullptr);
    execute(sa);
    execute(sb);

    // A 16-bit step's f32 tensors (loss, master gradients and weights) carry its rounding: they
    // are held to the compute dtype's step tolerance.
    auto tol = [&](plx_dtype t) {
      return tolerance_of(dtype_is_float(t) && compute != PLX_F32 ? compute : t, o_, nullptr, nullptr, true);
    };
    auto base_row = [&](const std::string& name, const std::string& dt) {
      CompareRow r;
      r.section = "step";
      r.name = name;
      r.pass = "step";
      r.dtype = dt;
      r.what = spec.name + ", batch " + std::to_string(batch) + ", " + opt.kind + ", " +
               cfg_.get_string("train.precision");
      r.tolerance = tol(dtype_from_name(dt));
      return r;
    };
    CompareRow loss = base_row("loss", "f32");
    loss.ops_run = std::to_string(g.nodes().size()) + " nodes";
    if (!sa.unsupported.empty() || !sb.unsupported.empty()) {
      loss.status = !sa.unsupported.empty() ? CompareRow::Status::UnsupportedA : CompareRow::Status::UnsupportedB;
      loss.note = !sa.unsupported.empty() ? sa.unsupported : sb.unsupported;
      add(loss);
      return;
    }
    if (!sa.error.empty() || !sb.error.empty()) {
      loss.status = CompareRow::Status::Error;
      loss.note = !sa.error.empty() ? "on " + o_.a + ": " + sa.error : "on " + rep_.b + ": " + sb.error;
      add(loss);
      return;
    }
    compare_values(loss, sa.values, sb.values, {"loss"}, tol);
    loss.ms_a = sa.ms;
    loss.ms_b = sb.ms;
    add(loss);
    for (const auto& [n, t] : sa.values) {
      if (n == "loss") continue;
      const bool grad = n.rfind("grad ", 0) == 0;
      const bool param = std::find(pnames.begin(), pnames.end(), n) != pnames.end();
      CompareRow r = base_row(grad ? n : (param ? n + " (updated)" : n + " (state)"), dtype_name(t.dtype()));
      r.what = desc_string(t.desc());
      compare_values(r, sa.values, sb.values, {n}, tol);
      add(std::move(r));
    }
  }

  // ---- N training steps ----
  void train_curves() {
    const fs::path tmp = fs::temp_directory_path() /
                         ("plexus-compare-" + std::to_string(::getpid()) + "-" +
                          std::to_string(Clock::now().time_since_epoch().count()));
    struct Cleanup {
      fs::path p;
      ~Cleanup() {
        std::error_code ec;
        fs::remove_all(p, ec);
      }
    } cleanup{tmp};
    CompareRow row;
    row.section = "train";
    row.name = "loss curve";
    row.pass = "train";
    row.dtype = "f32";
    row.tolerance = o_.curve_rtol;
    std::ostringstream sink;
    auto run_on = [&](const std::string& backend, int32_t dev, std::vector<double>& losses, double& ms,
                      std::string& error) {
      Config c = cfg_;
      c.set("backend.name=\"" + backend + "\"");
      c.set("backend.device=" + std::to_string(dev));
      c.set("train.max_steps=" + std::to_string(o_.steps));
      c.set("train.eval=false");
      c.set("logging.progress=\"none\"");
      c.set("output.dir=\"" + (tmp / backend).string() + "\"");
      TrainRequest req{c};
      req.out = &sink;
      req.keep_losses = true;
      try {
        const TrainResult res = train(rt_, req);
        losses = res.losses;
        row.what = rep_.model + ", batch " + std::to_string(c.get_int("train.batch_size")) + ", " +
                   std::to_string(res.losses.size()) + " steps";
        ms = res.images_per_s > 0 ? 1e3 * static_cast<double>(c.get_int("train.batch_size")) / res.images_per_s : -1;
      } catch (const DivergedError& e) {
        error = std::string("diverged: ") + e.what();
      } catch (const ConfigError&) {
        throw;
      } catch (const std::exception& e) {
        error = e.what();
      }
    };
    rep_.model = model_of(cfg_).name;  // read once; the trainer reads it for each run
    std::string ea, eb;
    run_on(o_.a, o_.device_a, rep_.curves.a, rep_.curves.ms_a, ea);
    run_on(rep_.b, o_.device_b, rep_.curves.b, rep_.curves.ms_b, eb);
    row.ms_a = rep_.curves.ms_a;
    row.ms_b = rep_.curves.ms_b;
    if (!ea.empty() || !eb.empty()) {
      row.status = no_kernel(ea) ? CompareRow::Status::UnsupportedA
                   : no_kernel(eb) ? CompareRow::Status::UnsupportedB
                                   : CompareRow::Status::Error;
      row.note = !ea.empty() ? "on " + o_.a + ": " + ea : "on " + rep_.b + ": " + eb;
      add(row);
      return;
    }
    const std::vector<double>& la = rep_.curves.a;
    const std::vector<double>& lb = rep_.curves.b;
    row.err = error_stats(lb, la);
    // The curves part ways after a few hundred steps however correct both are (rounding feeds
    // back through the weights); what must agree is where they go: the last tenth's mean loss.
    const size_t n = std::min(la.size(), lb.size());
    const size_t tail = std::max<size_t>(1, n / 10);
    double ma = 0, mb = 0;
    for (size_t i = n - tail; i < n; ++i) {
      ma += la[i];
      mb += lb[i];
    }
    ma /= static_cast<double>(tail);
    mb /= static_cast<double>(tail);
    const double rel = std::fabs(mb - ma) / std::max(std::fabs(ma), 1e-12);
    std::ostringstream note;
    note.precision(4);
    note << "mean loss of the last " << tail << " steps: " << ma << " against " << mb << " ("
         << rel * 100 << "% apart)";
    row.note = note.str();
    if (n == 0 || la.size() != lb.size() || !(rel <= o_.curve_rtol) || row.err.nonfinite_mismatch)
      row.status = CompareRow::Status::Fail;
    add(row);
  }

 private:
  Runtime& rt_;
  const Config& cfg_;
  const CompareOptions& o_;
  CompareReport& rep_;
  std::ostream* live_;
  Backend& a_;
  Backend& b_;
};

}  // namespace

CompareReport run_compare(Runtime& rt, const Config& config, const CompareOptions& options,
                          std::ostream* live) {
  if (options.repeats < 1) throw ConfigError("--repeats: must be at least 1, got " + std::to_string(options.repeats));
  if (options.warmup < 0) throw ConfigError("--warmup: must be at least 0, got " + std::to_string(options.warmup));
  if (options.steps < 1) throw ConfigError("--steps: must be at least 1, got " + std::to_string(options.steps));
  if (!(options.curve_rtol > 0)) throw ConfigError("--curve-rtol: must be > 0");
  for (const std::string& op : options.only_ops)
    if (!rt.ops().find(op)) throw ConfigError("--ops: unknown op '" + op + "' (plexus info lists the ops)");
  CompareReport rep;
  rep.a = options.a;
  rep.b = options.b.empty() ? pick_backend_b(rt, options.a) : options.b;
  Backend& a = rt.backend(rep.a);
  Backend& b = rt.backend(rep.b);
  auto device_name = [](Backend& be, int32_t dev, const char* which) {
    if (dev < 0 || dev >= be.device_count())
      throw ConfigError(std::string("--device-") + which + ": backend '" + be.name() + "' has " +
                        std::to_string(be.device_count()) + " device(s)" +
                        (be.unavailable_reason().empty() ? "" : " (" + be.unavailable_reason() + ")") +
                        ", not device " + std::to_string(dev));
    return be.device(dev).name;
  };
  rep.device_a = device_name(a, options.device_a, "a");
  rep.device_b = device_name(b, options.device_b, "b");
  Runner run(rt, config, options, rep, live);
  if (live) *live << compare_table_header(rep);
  if (options.ops) run.ops();
  if (options.step) run.step();
  if (options.train) run.train_curves();
  if (live) *live << compare_summary(rep);
  return rep;
}

}  // namespace plexus
