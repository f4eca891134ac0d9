#include "plexus/kernel_bench.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <ostream>

#include "../text.hpp"
#include "../train/step_graph.hpp"
#include "plexus/backend.hpp"
#include "plexus/dispatch.hpp"
#include "plexus/error.hpp"
#include "plexus/json.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"
#include "plexus/sdk/tensor.hpp"

namespace plexus {

std::vector<std::array<int64_t, 3>> parse_gemm_shapes(const std::string& list,
                                                      const std::string& option) {
  std::vector<std::array<int64_t, 3>> out;
  for (const std::string& item : text::split(list, ',')) {
    if (item.empty()) continue;
    const auto dims = text::split(item, 'x');
    std::vector<int64_t> v;
    for (const std::string& d : dims) {
      char* end = nullptr;
      const long long x = std::strtoll(d.c_str(), &end, 10);
      if (d.empty() || *end || x < 1)
        throw ConfigError(option + ": '" + item +
                          "' is not a GEMM shape; expected N (square) or MxNxK with sizes >= 1");
      v.push_back(x);
    }
    if (v.size() == 1)
      out.push_back({v[0], v[0], v[0]});
    else if (v.size() == 3)
      out.push_back({v[0], v[1], v[2]});
    else
      throw ConfigError(option + ": '" + item + "' has " + std::to_string(v.size()) +
                        " sizes; expected N (square) or MxNxK");
  }
  return out;
}

namespace {

// Multiply-adds times two of one run, for the ops whose speed is counted in FLOP/s.
double gflop(const std::string& op, const std::vector<plx_tensor>& in,
             const std::vector<plx_tensor>& out, const Attrs& attrs) {
  auto last = [](const plx_tensor& t, int32_t from_end) { return t.shape[t.ndim - from_end]; };
  double f = 0;
  if (op == "linear" && in.size() >= 2 && in[1].ndim == 2) {
    f = 2.0 * static_cast<double>(sdk::numel(out[0])) * static_cast<double>(in[1].shape[1]);
  } else if (op == "matmul" && !in.empty() && in[0].ndim >= 2) {
    const AttrValue* ta = attrs.find("trans_a");
    const bool t = ta && std::get_if<int64_t>(ta) && *std::get_if<int64_t>(ta) != 0;
    f = 2.0 * static_cast<double>(sdk::numel(out[0])) *
        static_cast<double>(t ? last(in[0], 2) : last(in[0], 1));
  } else if ((op == "conv2d" || op == "conv2d_backward_data") && in.size() >= 2 &&
             in[1].ndim == 4) {
    const plx_tensor& y = op == "conv2d" ? out[0] : in[0];
    f = 2.0 * static_cast<double>(sdk::numel(y)) *
        static_cast<double>(in[1].shape[1] * in[1].shape[2] * in[1].shape[3]);
  } else if (op == "conv2d_backward_weight" && !out.empty() && out[0].ndim == 4) {
    f = 2.0 * static_cast<double>(sdk::numel(in[0])) *
        static_cast<double>(out[0].shape[1] * out[0].shape[2] * out[0].shape[3]);
  }
  return f / 1e9;
}

std::string problem_string(const std::vector<plx_tensor>& in, const std::vector<plx_tensor>& out) {
  auto one = [](const plx_tensor& t) {
    if (t.dtype == PLX_DTYPE_NONE) return std::string("-");
    std::string s = std::string(dtype_name(t.dtype)) + "[";
    for (int32_t i = 0; i < t.ndim; ++i) s += (i ? "x" : "") + std::to_string(t.shape[i]);
    return s + "]";
  };
  std::string s;
  for (size_t i = 0; i < in.size(); ++i) s += (i ? " " : "") + one(in[i]);
  s += " -> ";
  for (size_t i = 0; i < out.size(); ++i) s += (i ? " " : "") + one(out[i]);
  return s;
}

void print_row(std::ostream& os, const KernelBenchRow& r) {
  os << r.where << "  " << r.op << "  " << r.problem << "\n";
  double lib = -1;
  for (const CandidateTime& t : r.kernels)
    if (t.library && t.ms >= 0 && (lib < 0 || t.ms < lib)) lib = t.ms;
  double best = -1;
  int width = 26;  // the names' column: as wide as the longest name
  for (const CandidateTime& t : r.kernels) {
    if (t.ms >= 0 && (best < 0 || t.ms < best)) best = t.ms;
    width = std::max(width, static_cast<int>(t.impl.size()));
  }
  for (const CandidateTime& t : r.kernels) {
    char line[256];
    if (t.ms < 0) {
      std::snprintf(line, sizeof line, "    %-*s %-8s %s\n", width, t.impl.c_str(),
                    t.library ? "library" : "native", t.error.c_str());
    } else {
      char rate[32] = "", ratio[48] = "";
      if (r.gflop > 0) std::snprintf(rate, sizeof rate, "%10.1f GFLOP/s", r.gflop / (t.ms / 1e3));
      if (lib > 0) std::snprintf(ratio, sizeof ratio, "  %.2fx the library's speed", lib / t.ms);
      std::snprintf(line, sizeof line, "    %-*s %-8s %10.4f ms%s%s%s\n", width, t.impl.c_str(),
                    t.library ? "library" : "native", t.ms, rate, ratio,
                    t.ms == best ? "  fastest" : "");
    }
    os << line;
  }
}

}  // namespace

KernelBenchReport run_kernel_bench(Runtime& rt, const Config& cfg, const KernelBenchOptions& o,
                                   std::ostream* out) {
  Backend& backend =
      rt.select_backend(o.backend.empty() ? cfg.get_string("backend.name") : o.backend);
  const int32_t dev =
      o.device >= 0 ? o.device : static_cast<int32_t>(cfg.get_int("backend.device"));
  KernelBenchReport rep;
  rep.backend = backend.name();
  rep.device = backend.device(dev).name;
  const plx_dtype compute = compute_dtype(cfg);
  if (cfg.get_string("train.precision") == "tf32") enable_tf32(backend);
  if (out)
    *out << "Kernel candidates on " << rep.backend << " [" << dev << "] " << rep.device
         << " (median of runs over about " << o.budget_ms << " ms each)\n\n";

  auto bench = [&](const std::string& where, const OpSchema& s, const std::vector<plx_tensor>& in,
                   const std::vector<plx_tensor>& outs, const Attrs& attrs) {
    KernelBenchRow r;
    r.where = where;
    r.op = s.name;
    r.problem = problem_string(in, outs);
    r.gflop = gflop(s.name, in, outs, attrs);
    r.kernels = time_all_kernels(backend, s, in, outs, attrs, dev, o.budget_ms);
    if (out) {
      print_row(*out, r);
      out->flush();
    }
    rep.rows.push_back(std::move(r));
  };

  if (o.step) {
    const ModelSpec spec = model_of(cfg);
    std::vector<int64_t> sample = spec.input_shape;
    if (sample.empty()) sample = load_data(cfg, spec, false).train.sample_shape;
    const int64_t batch = cfg.get_int("train.batch_size");
    auto sg = build_step(rt.ops(), spec, batch, sample, true, optimizer_options(cfg), false,
                         compute, nullptr, {}, cfg.get_float("train.label_smoothing"));
    const Graph& g = sg->graph;
    // One row per distinct problem, naming every node that has it.
    std::map<std::string, size_t> seen;
    std::vector<
        std::tuple<std::string, const GraphNode*, std::vector<plx_tensor>, std::vector<plx_tensor>>>
        todo;
    for (const GraphNode& node : g.nodes()) {
      if (!node.schema) continue;
      std::vector<plx_tensor> in, outs;
      for (Var v : node.inputs)
        in.push_back(v.valid() ? make_desc(g.value(v).desc, dev) : Tensor().view());
      for (Var v : node.outputs) outs.push_back(make_desc(g.value(v).desc, dev));
      const int32_t dtype =
          in.empty() ? PLX_F32 : in[static_cast<size_t>(node.schema->type_input)].dtype;
      if (!o.all && backend.kernels(node.schema->id, dtype).size() < 2) continue;
      const std::string key = tune_key(backend, dev, *node.schema, in, outs, node.attrs);
      if (auto it = seen.find(key); it != seen.end()) {
        std::get<0>(todo[it->second]) += ", " + node.name;
        continue;
      }
      seen[key] = todo.size();
      todo.emplace_back(node.name, &node, std::move(in), std::move(outs));
    }
    if (out)
      *out << "Training step of model '" << spec.name << "', batch " << batch << ", "
           << dtype_name(compute) << ": " << todo.size() << " problem(s)"
           << (o.all ? "" : " with more than one kernel") << "\n";
    for (auto& [where, node, in, outs] : todo) bench(where, *node->schema, in, outs, node->attrs);
    if (out) *out << "\n";
  }

  if (!o.gemm.empty()) {
    const plx_dtype dt = o.gemm_dtype == PLX_DTYPE_NONE ? compute : o.gemm_dtype;
    const OpSchema& s = rt.ops().get("linear");
    if (out) *out << "GEMMs as linear (x (M, K), w (N, K), bias (N)) in " << dtype_name(dt) << "\n";
    for (const auto& [M, N, K] : o.gemm) {
      std::vector<plx_tensor> in{make_desc({dt, {M, K}}, dev), make_desc({dt, {N, K}}, dev),
                                 make_desc({dt, {N}}, dev)};
      std::vector<plx_tensor> outs{make_desc({dt, {M, N}}, dev)};
      bench("gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K), s, in,
            outs, s.complete_attrs({}));
    }
  }
  return rep;
}

std::string kernel_bench_json(const KernelBenchReport& r) {
  JsonArray rows;
  for (const KernelBenchRow& row : r.rows) {
    JsonArray ks;
    for (const CandidateTime& t : row.kernels) {
      JsonObject k;
      k.add("kernel", t.impl).add("side", std::string(t.library ? "library" : "native"));
      if (t.ms >= 0) {
        k.add("ms", t.ms);
        if (row.gflop > 0) k.add("gflops", row.gflop / (t.ms / 1e3));
      } else {
        k.add("error", t.error);
      }
      ks.push(k);
    }
    rows.push(JsonObject()
                  .add("where", row.where)
                  .add("op", row.op)
                  .add("problem", row.problem)
                  .add("gflop", row.gflop)
                  .add("kernels", ks));
  }
  return JsonObject().add("backend", r.backend).add("device", r.device).add("rows", rows).str();
}

}  // namespace plexus
