#include "plexus/executor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>

#include "plexus/backend.hpp"
#include "plexus/error.hpp"
#include <spdlog/spdlog.h>

#include "plexus/log.hpp"
#include "plexus/plugin.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"
#include "plexus/sdk/philox.hpp"
#include "plexus/sdk/tensor.hpp"
#include "plexus/watchdog.hpp"

namespace plexus {

// ---- the store ----

bool TensorStore::contains(std::string_view name) const { return tensors_.count(name) != 0; }

const Tensor& TensorStore::get(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error("no tensor '" + std::string(name) + "' in the store");
  return it->second;
}

void TensorStore::set(const std::string& name, Tensor t) { tensors_[name] = std::move(t); }

// ---- initialisation ----

namespace {

// FNV-1a: a stable hash of a parameter's name, so its random stream does not depend on the order
// parameters are created in.
uint64_t name_hash(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

void initialize(Tensor& t, const InitSpec& init, uint64_t seed, std::string_view name) {
  const int64_t n = t.numel();
  std::vector<double> v(static_cast<size_t>(n));
  const uint64_t stream = name_hash(name);
  switch (init.kind) {
    case InitSpec::Kind::Zeros: break;
    case InitSpec::Kind::Ones: std::fill(v.begin(), v.end(), 1.0); break;
    case InitSpec::Kind::Constant: std::fill(v.begin(), v.end(), init.a); break;
    case InitSpec::Kind::Uniform:
      for (int64_t i = 0; i < n; ++i)
        v[static_cast<size_t>(i)] =
            init.a + (init.b - init.a) * philox_uniform(seed, stream, static_cast<uint64_t>(i));
      break;
    case InitSpec::Kind::Normal:
      // Box-Muller on two uniforms per element; 1 - u keeps the log's argument in (0, 1].
      for (int64_t i = 0; i < n; ++i) {
        const double u1 = 1.0 - philox_uniform(seed, stream, 2 * static_cast<uint64_t>(i));
        const double u2 = philox_uniform(seed, stream, 2 * static_cast<uint64_t>(i) + 1);
        v[static_cast<size_t>(i)] =
            init.a + init.b * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
      }
      break;
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(t.nbytes()));
  const bool ok = visit_dtype(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = reinterpret_cast<T*>(bytes.data());
    for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(v[static_cast<size_t>(i)]);
  });
  if (!ok) throw Error("initialize '" + std::string(name) + "': invalid dtype");
  t.copy_from_host(bytes.data());
}

// ---- the executable ----

// A node inside a fused kernel whose kernel the host chose among several (kernel_hint).
struct MemberChoice {
  int32_t node = -1;
  std::string impl;
  bool library = false;
  KernelChoice choice;  // the node's own: its candidates timed alone
  // Where the group was timed as a whole and kept around another of this node's candidates than
  // its fastest alone: the group's timings ("tuned" the one around the fastest alone).
  std::vector<CandidateTime> group_times;
};

struct Executable::Step {
  int32_t node = -1;           // the node it runs; a fused step: its group's last node
  std::vector<int32_t> fused;  // a fused step: every node it runs, in graph order
  std::string label;           // a fused step: for errors
  std::string fused_name;      // a fused step: the backend's name for the group
  std::unique_ptr<PreparedKernel> kernel;
  KernelChoice choice;  // how the kernel was chosen among the backend's
  std::vector<MemberChoice> members;  // a fused step: its nodes' chosen kernels
  std::vector<Var> in_vars, out_vars;  // the values bound to in and out (invalid: absent)
  std::vector<plx_tensor> in, out;
};

struct Executable::Fused {
  std::vector<int32_t> nodes;  // ascending
  std::string name;            // the backend's
  std::vector<Var> in, out;    // the values crossing its boundary, in compute() order
  std::unique_ptr<PreparedKernel> kernel;
  std::vector<MemberChoice> members;
};

namespace {

constexpr uint64_t kArenaAlign = 256;

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

uint64_t desc_bytes(const TensorDesc& d) {
  return static_cast<uint64_t>(d.numel()) * dtype_size(d.dtype);
}

[[noreturn]] void rethrow_with(const std::exception& e, const std::string& where) {
  const std::string msg = where + ": " + e.what();
  if (dynamic_cast<const OutOfMemoryError*>(&e)) throw OutOfMemoryError(msg);
  if (dynamic_cast<const OpError*>(&e)) throw OpError(msg);
  if (dynamic_cast<const KernelFaultError*>(&e)) throw KernelFaultError(msg);
  if (dynamic_cast<const BackendError*>(&e)) throw BackendError(msg);
  throw Error(msg);
}

std::string node_label(const GraphNode& node) {
  return "node '" + node.name + "' (" + node.op_name() + ")";
}

[[noreturn]] void rethrow_for_node(const std::exception& e, const GraphNode& node) {
  rethrow_with(e, node_label(node));
}

// What the claim callback checks against: the graph and the claims accepted so far.
struct ClaimHost {
  const Graph& graph;
  std::vector<int32_t> group;                // per node: the claim it is in, or -1
  std::vector<std::vector<int32_t>> claims;  // accepted, each ascending
  std::vector<std::string> names;
  std::vector<int32_t> root;                 // per value: its storage root's id
  uint16_t plugin_minor = PLX_ABI_MINOR;     // the ABI minor the backend's plugin was built for
  std::vector<std::vector<int32_t>> declined;  // claims create_fused declined, each ascending
  std::vector<Var> exchanged;                  // ExecutableOptions::exchanged

  // Empty if `nodes` may run as one kernel at the place of the last of them, else why not.
  std::string check(std::vector<int32_t> nodes) const {
    const auto& all = graph.nodes();
    std::sort(nodes.begin(), nodes.end());
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int32_t n = nodes[i];
      const std::string which = "node " + std::to_string(n);
      if (n < 0 || n >= static_cast<int32_t>(all.size())) return which + " does not exist";
      if (i && nodes[i - 1] == n) return which + " is listed twice";
      if (group[static_cast<size_t>(n)] >= 0) return which + " is in an earlier claim";
      if (!all[static_cast<size_t>(n)].schema) return which + " is a reshape view";
      std::string newer;
      const GraphNode& node = all[static_cast<size_t>(n)];
      std::vector<bool> given;
      for (Var v : node.inputs) given.push_back(v.valid());
      if (schema::abi_minor_needed(*node.schema, node.attrs, &newer, given) > plugin_minor)
        return "node '" + node.name + "' sets " + newer + ", newer than the plugin's ABI 1." +
               std::to_string(plugin_minor);
    }
    if (std::find(declined.begin(), declined.end(), nodes) != declined.end())
      return "the backend declined these nodes as one kernel in an earlier round";
    auto in_group = [&](int32_t n) { return std::binary_search(nodes.begin(), nodes.end(), n); };
    for (Var v : exchanged) {
      // The kernel that writes it: a view's source's producer.
      const int32_t p = graph.value(Var{root[static_cast<size_t>(v.id)]}).producer;
      if (!in_group(p)) continue;
      for (const int32_t m : nodes)
        for (Var in : all[static_cast<size_t>(m)].inputs)
          if (in.valid() && root[static_cast<size_t>(in.id)] == root[static_cast<size_t>(v.id)])
            return "node '" + all[static_cast<size_t>(m)].name + "' reads '" + graph.value(v).name +
                   "', which the group writes and which is exchanged in between (data parallelism)";
      // The group writes v at its last node: other nodes between would hold its exchange back
      // (16-bit gradients' casts gathered into one launch at the end of backward would start
      // every all-reduce after it).
      for (int32_t k = p + 1; k < nodes.back(); ++k)
        if (!in_group(k) && all[static_cast<size_t>(k)].schema)
          return "node '" + all[static_cast<size_t>(k)].name + "', between them, would hold back '" +
                 graph.value(v).name + "', which is exchanged as soon as it is written (data parallelism)";
    }
    auto r = [&](Var v) { return root[static_cast<size_t>(v.id)]; };
    auto mutates = [](const GraphNode& node, size_t k) {
      return k < node.schema->inputs.size() && (node.schema->inputs[k].flags & PLX_ARG_MUTATED);
    };
    std::vector<int32_t> written;  // roots the group writes
    for (int32_t m : nodes)
      for (Var o : all[static_cast<size_t>(m)].outputs) written.push_back(r(o));
    for (int32_t k = nodes.front() + 1; k < nodes.back(); ++k) {
      if (in_group(k)) continue;
      const GraphNode& other = all[static_cast<size_t>(k)];
      if (!other.schema) continue;  // a view runs nothing; the nodes reading it are checked
      for (size_t i = 0; i < other.inputs.size(); ++i) {
        if (!other.inputs[i].valid()) continue;
        const int32_t v = r(other.inputs[i]);
        if (std::find(written.begin(), written.end(), v) != written.end())
          return "node '" + other.name + "', between them, reads a value the group writes";
        // A member before k that shares v with k, one of them writing it in place, would now
        // run after k.
        for (int32_t m : nodes) {
          if (m > k) break;
          const GraphNode& mn = all[static_cast<size_t>(m)];
          for (size_t j = 0; j < mn.inputs.size(); ++j)
            if (mn.inputs[j].valid() && r(mn.inputs[j]) == v && (mutates(mn, j) || mutates(other, i)))
              return "node '" + other.name + "', between them, and node '" + mn.name +
                     "' use a value one of them writes in place";
        }
      }
    }
    return "";
  }
};

plx_status on_claim(void* user, const int32_t* nodes, int32_t num_nodes, const char* name) noexcept {
  try {
    auto* host = static_cast<ClaimHost*>(user);
    const std::string label = name && *name ? name : "fused";
    if (!nodes || num_nodes <= 0) {
      spdlog::debug("fusion: claim '{}' names no nodes", label);
      return PLX_ERR_INVALID_ARGUMENT;
    }
    std::vector<int32_t> v(nodes, nodes + num_nodes);
    const std::string why = host->check(v);
    if (!why.empty()) {
      spdlog::debug("fusion: claim '{}' of {} node(s) refused: {}", label, num_nodes, why);
      return PLX_ERR_INVALID_ARGUMENT;
    }
    std::sort(v.begin(), v.end());
    for (int32_t n : v) host->group[static_cast<size_t>(n)] = static_cast<int32_t>(host->claims.size());
    host->claims.push_back(std::move(v));
    host->names.push_back(label);
    return PLX_OK;
  } catch (...) {
    return PLX_ERR_INTERNAL;
  }
}

}  // namespace

// The graph as the ABI's view, with each value's descriptor as kernels will see it.
struct Executable::AbiGraph {
  std::vector<plx_tensor> values;
  std::vector<std::vector<int32_t>> ins, outs;
  std::vector<std::unique_ptr<AttrPack>> packs;
  std::vector<plx_graph_node> gn;
  plx_graph_view view{};

  AbiGraph(const Graph& graph, const std::vector<plx_tensor>& descs, int32_t dev) : values(descs) {
    const auto& nodes = graph.nodes();
    ins.resize(nodes.size());
    outs.resize(nodes.size());
    gn.resize(nodes.size());
    for (size_t n = 0; n < nodes.size(); ++n) {
      const GraphNode& node = nodes[n];
      for (Var v : node.inputs) ins[n].push_back(v.valid() ? v.id : -1);
      for (Var v : node.outputs) outs[n].push_back(v.id);
      packs.push_back(std::make_unique<AttrPack>(node.attrs));
      plx_graph_node& g = gn[n];
      g.op = node.schema ? node.schema->name.c_str() : "reshape";
      g.inputs = ins[n].data();
      g.outputs = outs[n].data();
      g.attrs = packs.back()->data();
      g.num_inputs = static_cast<int32_t>(ins[n].size());
      g.num_outputs = static_cast<int32_t>(outs[n].size());
      g.num_attrs = packs.back()->size();
    }
    view.struct_size = sizeof view;
    view.device = dev;
    view.values = values.data();
    view.nodes = gn.data();
    view.num_values = static_cast<int32_t>(values.size());
    view.num_nodes = static_cast<int32_t>(nodes.size());
  }
  AbiGraph(const AbiGraph&) = delete;
  AbiGraph& operator=(const AbiGraph&) = delete;
};

namespace {

// The dtype of a node's type input, which its kernels are registered for (f32 without one).
plx_dtype type_dtype(const Graph& g, const GraphNode& node) {
  const size_t ti = static_cast<size_t>(node.schema->type_input);
  return ti < node.inputs.size() && node.inputs[ti].valid() ? g.value(node.inputs[ti]).desc.dtype
                                                            : PLX_F32;
}

// A fused kernel made by the backend for one set of member hints.
struct MadeGroup {
  plx_status status = PLX_ERR_UNSUPPORTED;
  std::string why;  // the backend's reason, where it declined
  const plx_kernel* kernel = nullptr;
  void* state = nullptr;
  uint64_t ws = 0;
};

// Another kernel a member node of a fused group could run on (a candidate the tuner timed for
// it, other than its fastest): the backend may build a different fused kernel around it.
struct MemberAlternative {
  size_t slot = 0;    // the node's index in the group
  size_t member = 0;  // its index in Fused::members
  int32_t hint = 0;   // plx_graph_node.kernel_hint
  std::string impl;
  bool library = false;
};

// The tuner's margin for the backend's first choice (dispatch.cpp): an alternative replaces the
// first fused kernel only when it takes at most this share of its time.
constexpr double kGroupTuneMargin = 0.9;

}  // namespace

std::string Executable::create_group(Fused& f, const AbiGraph& ag, const KernelFilter& accept) {
  const plx_backend& t = backend_.table();
  const auto& nodes = graph_.nodes();
  const int32_t dev = options_.device;
  std::vector<plx_graph_node> sub;
  for (int32_t m : f.nodes) sub.push_back(ag.gn[static_cast<size_t>(m)]);
  KernelTuner& tuner = backend_.runtime().tuner();
  plx_graph_view sv = ag.view;
  sv.nodes = sub.data();
  sv.num_nodes = static_cast<int32_t>(sub.size());
  std::string label = "fused kernel '" + f.name + "' (";
  for (size_t i = 0; i < f.nodes.size(); ++i)
    label += (i ? ", " : "") + nodes[static_cast<size_t>(f.nodes[i])].name;
  label += ")";
  std::vector<int32_t> in_ids, out_ids;
  for (Var v : f.in) in_ids.push_back(v.id);
  for (Var v : f.out) out_ids.push_back(v.id);
  auto make = [&]() {
    MadeGroup m;
    m.status = t.create_fused(t.ctx, &sv, in_ids.data(), static_cast<int32_t>(in_ids.size()),
                              out_ids.data(), static_cast<int32_t>(out_ids.size()), &m.kernel,
                              &m.state, &m.ws);
    if (m.status == PLX_ERR_UNSUPPORTED) m.why = backend_.plugin().last_error();
    if (m.status != PLX_OK && m.status != PLX_ERR_UNSUPPORTED)
      backend_.fail(m.status, "preparing " + label);
    if (m.status == PLX_OK && !m.kernel)
      throw BackendError("backend '" + backend_.name() + "' returned no kernel for " + label);
    if (m.status == PLX_OK) {
      if (std::string why = tuner.exclusion(m.kernel->impl ? m.kernel->impl : "?"); !why.empty()) {
        m.kernel->destroy(m.state);  // made, never run
        m = MadeGroup{};
        m.status = PLX_ERR_UNSUPPORTED;
        m.why = std::move(why);
      }
    }
    return m;
  };
  auto prepared = [&](const MadeGroup& m) {
    return std::make_unique<PreparedKernel>(backend_, label, m.kernel, m.state, m.ws);
  };
  // A fused kernel that runs every node with its own code (PLX_KERNEL_SELF_CONTAINED, ABI 1.6)
  // reads no hints, so it is asked for first without them: such a kernel needs none of its
  // members' kernels chosen, nor timed. Any other kernel made so is the group's where no member
  // gets a hint below; else it is destroyed and made again around the members' kernels (a
  // plugin's create caches what it measures, as the CUDA plugin's convolution algorithms are,
  // so the second making is cheap).
  const uint32_t minor = backend_.plugin().abi_minor();
  MadeGroup probe;
  bool probed = false;
  if (minor >= 6) {
    try {
      probe = make();
      probed = true;
    } catch (const std::exception& e) {  // made around the members' kernels below, or failing there
      probe = MadeGroup{};
      spdlog::debug("fusion: {} without member hints: {}", label, e.what());
    }
    // backend.kernels = "library" puts a node on a vendor library's kernel where one takes it:
    // the plugin's own code doing nodes such a kernel exists for is the other side's, and the
    // group's nodes go back to the backend for its other claims (the parts, on their hints).
    auto library_node = [&]() -> const GraphNode* {
      for (int32_t m : f.nodes) {
        const GraphNode& node = nodes[static_cast<size_t>(m)];
        if (!node.schema) continue;
        for (const plx_kernel* k : backend_.kernels(node.schema->id, type_dtype(graph_, node)))
          if (is_library_kernel(*k) && !tuner.excluded_by(k->impl ? k->impl : "?")) return &node;
      }
      return nullptr;
    };
    if (probe.status == PLX_OK && is_self_contained_kernel(*probe.kernel, minor)) {
      const bool library_side =
          tuner.side() == KernelSide::Library && !is_library_kernel(*probe.kernel);
      if (const GraphNode* lib = library_side ? library_node() : nullptr) {
        probe.kernel->destroy(probe.state);  // made, never run
        const std::string why = std::string("backend.kernels = \"library\": ") +
                                (probe.kernel->impl ? probe.kernel->impl : "?") +
                                " does node '" + lib->name + "' (" + lib->schema->name +
                                ", which a library kernel takes) with the plugin's own code";
        spdlog::debug("fusion: '{}' declined {}: {}", backend_.name(), label, why);
        return why;
      }
      f.members.clear();
      spdlog::debug("fusion: {} runs as {}/{}, every node with its own code", label,
                    backend_.name(), probe.kernel->impl ? probe.kernel->impl : "?");
      f.kernel = prepared(probe);
      return "";
    }
  }
  // Owns what the probe made until it is kept or dropped (also where choosing the members'
  // kernels below throws).
  std::unique_ptr<PreparedKernel> probe_kernel =
      probe.status == PLX_OK ? prepared(probe) : std::unique_ptr<PreparedKernel>();
  // Nodes with several kernels: the host's choice (the tuner's, or the forced side's first), for
  // the backend to run inside the fused kernel.
  f.members.clear();
  std::vector<MemberAlternative> alts;
  std::vector<std::vector<const plx_kernel*>> regs(f.nodes.size());  // members' kernels
  std::vector<size_t> member_of(f.nodes.size(), 0);
  std::vector<double> alone(f.nodes.size(), -1);  // each member's fastest time on its own
  std::vector<std::vector<plx_tensor>> ins(f.nodes.size()), outs(f.nodes.size());
  const bool tune_groups = options_.tune && tuner.side() == KernelSide::Auto;
  auto kernel_index = [&](const plx_kernel* k) {
    for (int32_t i = 0, nk = t.kernel_count(t.ctx); i < nk; ++i)
      if (t.get_kernel(t.ctx, i) == k) return i + 1;
    return 0;
  };
  for (size_t k = 0; k < f.nodes.size(); ++k) {
    const GraphNode& node = nodes[static_cast<size_t>(f.nodes[k])];
    if (!node.schema) continue;
    std::vector<plx_tensor>& nin = ins[k];
    std::vector<plx_tensor>& nout = outs[k];
    for (Var v : node.inputs)
      nin.push_back(v.valid() ? ag.values[static_cast<size_t>(v.id)] : Tensor().view());
    for (Var v : node.outputs) nout.push_back(ag.values[static_cast<size_t>(v.id)]);
    const int32_t dt =
        nin.empty() ? PLX_F32 : nin[static_cast<size_t>(node.schema->type_input)].dtype;
    const auto registered = backend_.kernels(node.schema->id, dt);
    if (registered.size() < 2) continue;
    KernelResolution r;
    try {
      r = resolve_kernel(backend_, *node.schema, nin, nout, node.attrs, dev, options_.tune, accept);
    } catch (const std::exception& e) {
      rethrow_for_node(e, node);
    }
    if (!r.kernel) continue;  // the fused kernel will say why it cannot run the node
    const plx_kernel* chosen = &r.kernel->kernel();
    sub[k].kernel_hint = kernel_index(chosen);
    for (const plx_kernel* cand : registered)  // what a cached group decision may name
      if (!tuner.excluded_by(cand->impl ? cand->impl : "?")) regs[k].push_back(cand);
    member_of[k] = f.members.size();
    // The other candidates the tuner timed: a fused kernel around one of them may beat the one
    // around the fastest alone (a kernel that also does a neighbour's pass, say).
    if (tune_groups && r.choice.how == KernelChoice::How::Tuned) {
      for (const CandidateTime& c : r.choice.times) {
        if (c.ms < 0) continue;
        alone[k] = alone[k] < 0 ? c.ms : std::min(alone[k], c.ms);
        if (c.impl == (chosen->impl ? chosen->impl : "?")) continue;
        for (const plx_kernel* cand : registered)
          if (cand->impl && c.impl == cand->impl)
            alts.push_back({k, f.members.size(), kernel_index(cand), c.impl, c.library});
      }
    }
    f.members.push_back({f.nodes[k], chosen->impl ? chosen->impl : "?", is_library_kernel(*chosen),
                         std::move(r.choice)});
  }
  // The group with one member on another of its candidates (the others on their own).
  auto make_with = [&](const MemberAlternative& a) {
    const int32_t keep = sub[a.slot].kernel_hint;
    sub[a.slot].kernel_hint = a.hint;
    MadeGroup m = make();
    sub[a.slot].kernel_hint = keep;
    return m;
  };

  // Made (or declined) without hints above: the group's where no member has one.
  const bool hinted = std::any_of(sub.begin(), sub.end(),
                                  [](const plx_graph_node& n) { return n.kernel_hint != 0; });
  const bool keep_probe = probed && !hinted;
  if (!keep_probe) probe_kernel.reset();  // made without the hints, never run
  MadeGroup base = keep_probe ? probe : make();
  std::unique_ptr<PreparedKernel> kernel =
      keep_probe ? std::move(probe_kernel)
                 : base.status == PLX_OK ? prepared(base) : std::unique_ptr<PreparedKernel>();
  // A cached decision holds wherever the side is "auto" (the layout planner remakes groups
  // without timing); timing needs `tune`.
  if (tuner.side() == KernelSide::Auto && !f.members.empty()) {
    // The group tuned as a whole: the fused kernel the backend makes around each member's
    // other candidates, timed against the one around the fastest alone; where the backend
    // declined that one, against the group's nodes one by one (each on its fastest kernel).
    std::vector<plx_tensor> gin, gout;
    for (int32_t id : in_ids) gin.push_back(ag.values[static_cast<size_t>(id)]);
    for (int32_t id : out_ids) gout.push_back(ag.values[static_cast<size_t>(id)]);
    std::string key = "fused|" + f.name;
    for (size_t k = 0; k < f.nodes.size(); ++k) {
      const GraphNode& node = nodes[static_cast<size_t>(f.nodes[k])];
      if (node.schema)
        key += " & " + tune_key(backend_, dev, *node.schema, ins[k], outs[k], node.attrs);
    }
    // "node:op=impl". A gradient's data and weight nodes share the node's name and may share
    // the op (a linear's dx and dW are both matmuls): the second such member of the group is
    // "node#2:op=impl", so that each alternative has a name of its own (in the cache and as a
    // key of the manifest's group_ms).
    auto name_of = [&](const MemberAlternative* a) {
      if (!a) return std::string("tuned");
      const GraphNode& node = nodes[static_cast<size_t>(f.nodes[a->slot])];
      int before = 0;
      for (size_t j = 0; j < a->slot; ++j) {
        const GraphNode& o = nodes[static_cast<size_t>(f.nodes[j])];
        before += o.schema && o.name == node.name && o.schema == node.schema;
      }
      return node.name + (before ? "#" + std::to_string(before + 1) : "") + ":" +
             node.schema->name + "=" + a->impl;
    };
    const MemberAlternative* picked = nullptr;
    MemberAlternative cached;
    bool decided = false;
    if (const auto hit = tuner.lookup(key)) {  // an earlier run's decision: "node:op=impl"
      for (size_t k = 0; k < f.nodes.size() && !picked; ++k)
        for (const plx_kernel* cand : regs[k]) {
          cached = {k, member_of[k], kernel_index(cand), cand->impl ? cand->impl : "?",
                    is_library_kernel(*cand)};
          if (cand->impl && *hit == name_of(&cached)) {
            picked = &cached;
            break;
          }
        }
      decided = picked || (*hit == "tuned" && kernel) || (*hit == "unfused" && !kernel);
    }
    std::vector<CandidateTime> times;
    double best_ms = -1;
    if (!decided && tune_groups && !alts.empty()) {
      auto time_of = [&](const PreparedKernel& pk, CandidateTime& c) {
        try {
          c.ms = time_kernel(backend_, pk, gin, gout, dev);
        } catch (const std::exception& e) {
          c.ms = -1;
          c.error = e.what();
          spdlog::warn("{}: timing it as {} failed, so that is not a candidate: {}", label,
                       c.impl, c.error);
        }
        return c.ms >= 0;
      };
      if (kernel) {
        CandidateTime c;
        c.impl = name_of(nullptr);
        if (time_of(*kernel, c)) best_ms = c.ms;
        times.push_back(c);
      }
      std::unique_ptr<PreparedKernel> best;
      for (const MemberAlternative& a : alts) {
        const MadeGroup m = make_with(a);
        if (m.status != PLX_OK) continue;
        std::unique_ptr<PreparedKernel> pk = prepared(m);
        CandidateTime c;
        c.impl = name_of(&a);
        c.library = a.library;
        const bool timed = time_of(*pk, c);
        times.push_back(c);
        if (kernel && times.front().ms < 0) continue;  // the first could not be timed: it stays
        if (timed &&
            (best_ms < 0 || c.ms < best_ms * (picked || !kernel ? 1.0 : kGroupTuneMargin))) {
          best_ms = c.ms;
          picked = &a;
          best = std::move(pk);
        }
      }
      if (picked && !kernel) {
        // The backend declined the group around the fastest kernels alone: the nodes would run
        // one by one (or in smaller groups), which this group must beat.
        double unfused = 0;
        for (size_t k = 0; k < f.nodes.size() && unfused >= 0; ++k) {
          const GraphNode& node = nodes[static_cast<size_t>(f.nodes[k])];
          if (!node.schema) continue;
          double ms = alone[k];
          if (ms < 0) {
            for (const CandidateTime& c :
                 time_all_kernels(backend_, *node.schema, ins[k], outs[k], node.attrs, dev, 20))
              if (c.ms >= 0) ms = ms < 0 ? c.ms : std::min(ms, c.ms);
          }
          unfused = ms < 0 ? -1 : unfused + ms;
        }
        CandidateTime c;
        c.impl = "unfused";
        c.ms = unfused;
        times.push_back(c);
        if (unfused >= 0 && best_ms >= unfused) picked = nullptr;
      }
      backend_.allocator(dev).release_cached();  // the scratch buffers are not the step's memory
      tuner.remember(key, picked ? name_of(picked) : (kernel ? "tuned" : "unfused"),
                     std::max(best_ms, 0.0),  // -1: none could be timed
                     times);
      sort_fastest_first(times);
      std::string listed;
      for (const CandidateTime& c : times)
        listed += (listed.empty() ? "" : ", ") + c.impl + " " +
                  (c.ms >= 0 ? fmt::format("{:.4f} ms", c.ms) : std::string("failed"));
      spdlog::debug("fusion: {} timed as a whole: {}; keeps {}", label, listed,
                    picked ? name_of(picked) : (kernel ? "tuned" : "unfused"));
      if (picked) kernel = std::move(best);
    } else if (picked) {
      const MadeGroup m = make_with(*picked);
      if (m.status == PLX_OK) kernel = prepared(m);
      else picked = nullptr;
    }
    if (picked) {
      MemberChoice& mc = f.members[picked->member];
      mc.impl = picked->impl;
      mc.library = picked->library;
      mc.group_times = times;  // empty where the decision came from the cache
      spdlog::debug("fusion: {} with {} on {}, timed as a whole ({:.4f} ms)", label,
                    nodes[static_cast<size_t>(f.nodes[picked->slot])].name, picked->impl,
                    best_ms);
    }
  }
  if (!kernel) {
    const std::string why = base.why;
    spdlog::debug("fusion: '{}' declined {}: {}", backend_.name(), label, why);
    return why.empty() ? "declined" : why;
  }
  spdlog::debug("fusion: {} runs as {}/{}", label, backend_.name(),
                kernel->kernel().impl ? kernel->kernel().impl : "?");
  f.kernel = std::move(kernel);
  return "";
}

std::vector<Executable::Fused> Executable::fuse() {
  std::vector<Fused> fused;
  const plx_backend& t = backend_.table();
  if (!options_.fuse || !t.get_capability || !t.create_fused) return fused;
  const auto& nodes = graph_.nodes();
  const size_t nv = static_cast<size_t>(graph_.num_values());

  const AbiGraph ag(graph_, descs_, options_.device);
  ClaimHost host{graph_, std::vector<int32_t>(nodes.size(), -1), {}, {}, {}};
  host.plugin_minor = backend_.plugin().abi_minor();
  host.exchanged = options_.exchanged;
  for (size_t i = 0; i < nv; ++i) host.root.push_back(graph_.storage_root(Var{static_cast<int32_t>(i)}).id);

  // Who reads each value; which values the host reads after the step.
  std::vector<std::vector<int32_t>> readers(nv);
  for (size_t n = 0; n < nodes.size(); ++n)
    for (Var v : nodes[n].inputs)
      if (v.valid()) readers[static_cast<size_t>(v.id)].push_back(static_cast<int32_t>(n));
  std::vector<char> is_output(nv, 0);
  for (const auto& [name, v] : graph_.outputs()) is_output[static_cast<size_t>(v.id)] = 1;
  for (Var v : options_.exchanged) is_output[static_cast<size_t>(v.id)] = 1;

  // Rounds: a claim the backend declines when it sees the group's boundary (a value it would
  // keep inside is a graph output, which the view does not show) frees its nodes, and the graph
  // is offered again with that exact claim refused, so the backend's other patterns (a conv
  // with its ReLU, when conv + ReLU + pool declined) can take them. A round without a decline
  // ends it; each further round refuses one more node set.
  constexpr int kMaxRounds = 8;
  for (int round = 0; round < kMaxRounds; ++round) {
    const size_t first_claim = host.claims.size();
    backend_.check(t.get_capability(t.ctx, &ag.view, &on_claim, &host), "get_capability");
    bool declined = false;
    for (size_t c = first_claim; c < host.claims.size(); ++c) {
      Fused f;
      f.nodes = host.claims[c];
      f.name = host.names[c];
      auto member = [&](int32_t n) {
        return n >= 0 && host.group[static_cast<size_t>(n)] == static_cast<int32_t>(c);
      };
      // Boundary: values the group reads from outside (first use first), and values it writes
      // that are read outside, are graph outputs, or are read by nobody (still written).
      std::vector<int32_t> out_ids;
      for (int32_t m : f.nodes) {
        const GraphNode& node = nodes[static_cast<size_t>(m)];
        for (Var v : node.inputs) {
          if (!v.valid() || member(graph_.value(v).producer)) continue;
          if (std::none_of(f.in.begin(), f.in.end(), [&](Var w) { return w.id == v.id; }))
            f.in.push_back(v);
        }
        for (Var v : node.outputs) {
          const auto& rd = readers[static_cast<size_t>(v.id)];
          if (rd.empty() || is_output[static_cast<size_t>(v.id)] ||
              std::any_of(rd.begin(), rd.end(), [&](int32_t n) { return !member(n); }))
            f.out.push_back(v);
        }
      }
      if (!create_group(f, ag, {}).empty()) {
        for (int32_t m : f.nodes) host.group[static_cast<size_t>(m)] = -1;
        host.declined.push_back(f.nodes);
        declined = true;
        continue;
      }
      for (int32_t m : f.nodes) {
        pos_[static_cast<size_t>(m)] = f.nodes.back();
        for (Var v : nodes[static_cast<size_t>(m)].outputs)
          if (std::none_of(f.out.begin(), f.out.end(), [&](Var w) { return w.id == v.id; })) {
            internal_[static_cast<size_t>(v.id)] = 1;
            ++plan_.internal_values;
          }
      }
      ++plan_.fused_kernels;
      plan_.fused_nodes += static_cast<int32_t>(f.nodes.size());
      fused.push_back(std::move(f));
    }
    if (!declined) break;
  }
  return fused;
}

Executable::Executable(Backend& backend, const Graph& graph, TensorStore& store,
                       ExecutableOptions options)
    : backend_(backend), graph_(graph), store_(store), options_(options) {
  const int32_t dev = options_.device;
  stream_ = backend_.stream(dev);
  const size_t nv = static_cast<size_t>(graph_.num_values());
  tensors_.resize(nv);
  for (size_t i = 0; i < nv; ++i) descs_.push_back(make_desc(graph_.values()[i].desc, dev));

  // Inputs placed together (ExecutableOptions::input_block): their offsets in one block.
  std::vector<int64_t> block_at(nv, -1);
  const uint64_t head = align_up(options_.input_block_head, kArenaAlign);
  uint64_t block_bytes = head;
  for (const std::string& name : options_.input_block) {
    const Var v = graph_.find(name);
    if (!v.valid()) continue;
    const GraphValue& gv = graph_.value(v);
    if (gv.kind != ValueKind::Input)
      throw Error("ExecutableOptions::input_block: '" + name + "' is a " +
                  value_kind_name(gv.kind) + ", not an input");
    if (block_at[static_cast<size_t>(v.id)] >= 0)
      throw Error("ExecutableOptions::input_block: '" + name + "' is named twice");
    block_at[static_cast<size_t>(v.id)] = static_cast<int64_t>(block_bytes);
    block_bytes += align_up(desc_bytes(gv.desc), kArenaAlign);
  }
  if (block_bytes > head) {
    input_block_ = Tensor::zeros(backend_, {static_cast<int64_t>(block_bytes)}, PLX_U8, dev);
    plan_.persistent_bytes += block_bytes;
  }

  // Persistent values: inputs and constants belong to this executable; parameters and states
  // to the store, created and initialised here if this is the first graph to use them.
  for (size_t i = 0; i < nv; ++i) {
    const GraphValue& v = graph_.values()[i];
    switch (v.kind) {
      case ValueKind::Input:
        if (block_at[i] >= 0) {
          tensors_[i] = input_block_.alias(v.desc.dtype, v.desc.shape, static_cast<uint64_t>(block_at[i]));
          break;
        }
        tensors_[i] = Tensor::zeros(backend_, v.desc.shape, v.desc.dtype, dev);
        plan_.persistent_bytes += desc_bytes(v.desc);
        break;
      case ValueKind::Constant:
        tensors_[i] = Tensor::from_host(backend_, v.data.data(), v.desc.shape, v.desc.dtype, dev);
        plan_.persistent_bytes += desc_bytes(v.desc);
        break;
      case ValueKind::Parameter:
      case ValueKind::State:
        if (store_.contains(v.name)) {
          const Tensor& t = store_.get(v.name);
          if (t.dtype() != v.desc.dtype || t.shape() != v.desc.shape)
            throw Error(std::string(value_kind_name(v.kind)) + " '" + v.name + "' is " +
                        desc_string(t.desc()) + " in the store but the graph wants " +
                        desc_string(v.desc));
          if (&t.backend() != &backend_ || t.device() != dev)
            throw Error(std::string(value_kind_name(v.kind)) + " '" + v.name + "' lives on " +
                        t.str() + ", the graph runs on " + backend_.name() + ":" +
                        std::to_string(dev));
          tensors_[i] = t;
        } else {
          Tensor t = Tensor::empty(backend_, v.desc.shape, v.desc.dtype, dev);
          initialize(t, v.init, options_.seed, v.name);
          store_.set(v.name, t);
          tensors_[i] = t;
          plan_.persistent_bytes += desc_bytes(v.desc);
        }
        break;
      case ValueKind::Activation: break;
    }
  }

  // Offer the graph to the backend for fusion; then resolve every other node's kernel once.
  const auto& nodes = graph_.nodes();
  pos_.resize(nodes.size());
  std::iota(pos_.begin(), pos_.end(), 0);
  internal_.assign(nv, 0);
  std::vector<Fused> fused;
  try {
    fused = fuse();
  } catch (const std::exception& e) {
    rethrow_with(e, "fusing the graph's nodes on backend '" + backend_.name() + "'");
  }
  std::vector<int32_t> group_of(nodes.size(), -1);
  for (size_t g = 0; g < fused.size(); ++g)
    for (int32_t m : fused[g].nodes) group_of[static_cast<size_t>(m)] = static_cast<int32_t>(g);
  auto descs = [&](Step& st) {
    for (Var in : st.in_vars)
      st.in.push_back(in.valid() ? descs_[static_cast<size_t>(in.id)] : Tensor().view());
    for (Var out : st.out_vars) st.out.push_back(descs_[static_cast<size_t>(out.id)]);
  };
  for (size_t n = 0; n < nodes.size(); ++n) {
    const GraphNode& node = nodes[n];
    if (!node.schema) continue;
    Step st;
    st.node = static_cast<int32_t>(n);
    if (const int32_t g = group_of[n]; g >= 0) {
      Fused& f = fused[static_cast<size_t>(g)];
      if (f.nodes.back() != st.node) continue;  // the group runs at its last node
      st.fused = f.nodes;
      st.in_vars = f.in;
      st.out_vars = f.out;
      st.kernel = std::move(f.kernel);
      st.members = std::move(f.members);
      st.label = "fused kernel '" + f.name + "'";
      st.fused_name = f.name;
      descs(st);
    } else {
      st.in_vars = node.inputs;
      st.out_vars = node.outputs;
      descs(st);
      KernelResolution r;
      try {
        r = resolve_kernel(backend_, *node.schema, st.in, st.out, node.attrs, dev, options_.tune);
      } catch (const std::exception& e) {
        rethrow_for_node(e, node);
      }
      if (!r.kernel) {
        throw OpError("node '" + node.name + "': " +
                      no_kernel_message(backend_, *node.schema, type_dtype(graph_, node), r.declines) +
                      " (a graph runs every node on its backend: no fallback)");
      }
      st.kernel = std::move(r.kernel);
      st.choice = std::move(r.choice);
    }
    steps_.push_back(std::move(st));
  }
  if (options_.channels_last) plan_layouts();
  for (const Step& st : steps_)
    plan_.workspace_bytes = std::max(plan_.workspace_bytes, st.kernel->workspace_bytes());

  // Where each node runs in the kernel order (hooks and gradient buckets ask by node).
  std::vector<int32_t> step_at(nodes.size(), -1);
  for (size_t k = 0; k < steps_.size(); ++k) step_at[static_cast<size_t>(steps_[k].node)] = static_cast<int32_t>(k);
  kernel_of_.resize(nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) kernel_of_[n] = step_at[static_cast<size_t>(pos_[n])];

  backend_.runtime().tuner().flush();  // what was timed is kept, even if the plan fails
  plan_memory();

  if (plan_.arena_bytes) arena_ = Tensor::empty(backend_, {static_cast<int64_t>(plan_.arena_bytes)}, PLX_U8, dev);
  if (plan_.workspace_bytes)
    workspace_ = Tensor::empty(backend_, {static_cast<int64_t>(plan_.workspace_bytes)}, PLX_U8, dev);
  for (size_t i = 0; i < nv; ++i) {
    const GraphValue& v = graph_.values()[i];
    if (v.kind != ValueKind::Activation || internal_[i]) continue;
    const Var root = graph_.storage_root(Var{static_cast<int32_t>(i)});
    const GraphValue& r = graph_.value(root);
    if (r.kind != ValueKind::Activation) {  // a view of a persistent tensor
      tensors_[i] = tensors_[static_cast<size_t>(root.id)].reshape(v.desc.shape);
      continue;
    }
    const int64_t off = plan_.offset[static_cast<size_t>(root.id)];
    if (!arena_.defined()) continue;
    if (sdk::is_contiguous(descs_[i])) {
      tensors_[i] = arena_.alias(v.desc.dtype, v.desc.shape, static_cast<uint64_t>(off));
    } else {  // channels-last (plan_layouts): NHWC memory seen as (N, C, H, W)
      const Shape& sh = v.desc.shape;
      tensors_[i] =
          arena_.alias(v.desc.dtype, {sh[0], sh[2], sh[3], sh[1]}, static_cast<uint64_t>(off))
              .permute({0, 3, 1, 2});
    }
  }
  for (Step& st : steps_) {
    for (size_t k = 0; k < st.in_vars.size(); ++k)
      if (st.in_vars[k].valid()) st.in[k] = tensors_[static_cast<size_t>(st.in_vars[k].id)].view();
    for (size_t k = 0; k < st.out_vars.size(); ++k)
      st.out[k] = tensors_[static_cast<size_t>(st.out_vars[k].id)].view();
  }

  // Capture needs the backend's four slots and kernels that promise to behave inside one.
  const plx_backend& t = backend_.table();
  can_capture_ = options_.capture && t.capture_begin && t.capture_end && t.graph_launch &&
                 t.graph_destroy && (backend_.device(dev).caps & PLX_CAP_GRAPH_CAPTURE);
  for (const Step& st : steps_)
    if (!(st.kernel->kernel().flags & PLX_KERNEL_CAPTURABLE)) can_capture_ = false;
  // A step that waits for each kernel cannot be captured.
  check_kernels_ = backend_.runtime().options().check_kernels;
  if (check_kernels_) can_capture_ = false;
  spdlog::debug("executable: {} nodes, {} kernels ({} fused from {} nodes, {} values never "
                "stored), arena {} (unplanned {}), workspace {}, persistent {}, {} in place, "
                "capture {}",
                nodes.size(), steps_.size(), plan_.fused_kernels, plan_.fused_nodes,
                plan_.internal_values, format_bytes(plan_.arena_bytes),
                format_bytes(plan_.unplanned_bytes), format_bytes(plan_.workspace_bytes),
                format_bytes(plan_.persistent_bytes), plan_.inplace_nodes, can_capture_);
}

// ---- the layout planner ----
//
// A 4-D activation may be stored channels-last (NHWC strides over its NCHW shape) when every
// kernel that writes or reads it takes that (ABI 1.5, abi/ops.h): kernels that prefer NHWC take
// either layout for each of their 4-D tensors, and PLX_KERNEL_DENSE kernels (elementwise maps)
// take any layout their same-shape operands share, so a dense kernel ties those operands
// together. A group of values tied this way goes NHWC when
//  - each is a plain activation: no reshape view of it (a view needs row-major memory), not a
//    graph output (the host reads those), not exchanged (data parallelism), 4-D with more than
//    one channel and more than one pixel (else the two layouts are the same memory);
//  - every other kernel touching it prefers NHWC;
//  - at least one kernel touching it prefers NHWC (nothing to gain otherwise).
// The conversions are then at the group's edges, inside the NHWC kernels that read or write an
// NCHW neighbour (igemm's staging, cuDNN's own), and no longer between two NHWC kernels.
//
// Kernels were created for NCHW tensors; those that touch a value that changes are created again
// for the new strides, among the candidates that take them (a tuned choice is timed again under
// the new key). Where one cannot be (every candidate declines, or a fused group's kernel comes
// back wanting NCHW), its channels-last tensors are offered to it one at a time (untimed), those
// it refuses alone are kept NCHW (all of them where it takes none alone), and the plan is made
// again without them.
void Executable::plan_layouts() {
  const size_t nv = static_cast<size_t>(graph_.num_values());
  const int32_t dev = options_.device;
  constexpr uint16_t kLayoutMinor = 5;
  struct Caps {
    bool nhwc = false, dense = false;
  };
  auto caps_of = [&](const plx_kernel& k, bool fused) {
    const uint16_t minor =
        fused ? backend_.plugin().abi_minor() : backend_.kernel_plugin(&k).abi_minor();
    Caps c;
    if (minor < kLayoutMinor) return c;
    c.nhwc = k.layout == PLX_LAYOUT_NHWC;
    c.dense = (k.flags & PLX_KERNEL_DENSE) != 0;
    return c;
  };

  // Values that could be NHWC by themselves.
  std::vector<char> candidate(nv, 0);
  for (size_t i = 0; i < nv; ++i) {
    const GraphValue& v = graph_.values()[i];
    if (v.kind != ValueKind::Activation || v.view_of >= 0 || internal_[i] || v.desc.ndim() != 4)
      continue;
    const Shape& sh = v.desc.shape;
    candidate[i] = sh[0] > 0 && sh[1] > 1 && sh[2] * sh[3] > 1;
  }
  for (size_t i = 0; i < nv; ++i)
    if (graph_.values()[i].view_of >= 0)
      candidate[static_cast<size_t>(graph_.storage_root(Var{static_cast<int32_t>(i)}).id)] = 0;
  for (const auto& [name, v] : graph_.outputs())
    candidate[static_cast<size_t>(graph_.storage_root(v).id)] = 0;
  for (Var v : options_.exchanged) candidate[static_cast<size_t>(graph_.storage_root(v).id)] = 0;

  std::vector<Caps> caps;
  for (const Step& st : steps_) caps.push_back(caps_of(st.kernel->kernel(), !st.fused.empty()));
  auto operands = [](const Step& st) {
    std::vector<int32_t> ids;
    for (Var v : st.in_vars)
      if (v.valid()) ids.push_back(v.id);
    for (Var v : st.out_vars) ids.push_back(v.id);
    return ids;
  };

  // The descriptors for a choice of channels-last values. A value inside a fused group is
  // described in the layout of the group's boundary output of its shape where that is
  // channels-last (a conv's pre-activation as its ReLU's output), else NCHW.
  auto describe = [&](const std::vector<char>& nhwc) {
    auto set_nhwc = [](plx_tensor& d) {
      const int64_t C = d.shape[1], H = d.shape[2], W = d.shape[3];
      d.strides[0] = H * W * C, d.strides[1] = 1, d.strides[2] = W * C, d.strides[3] = C;
    };
    for (size_t i = 0; i < nv; ++i) {
      descs_[i] = make_desc(graph_.values()[i].desc, dev);
      if (nhwc[i]) set_nhwc(descs_[i]);
    }
    for (const Step& st : steps_) {
      if (st.fused.empty()) continue;
      for (int32_t m : st.fused)
        for (Var o : graph_.nodes()[static_cast<size_t>(m)].outputs) {
          const size_t i = static_cast<size_t>(o.id);
          if (!internal_[i] || graph_.values()[i].desc.ndim() != 4) continue;
          for (Var b : st.out_vars)
            if (nhwc[static_cast<size_t>(b.id)] &&
                graph_.value(b).desc.shape == graph_.values()[i].desc.shape) {
              set_nhwc(descs_[i]);
              break;
            }
        }
    }
  };

  // Step k's kernel created again for the current descriptors: "" and the kernel, or why not.
  struct Remade {
    std::string why;
    std::unique_ptr<PreparedKernel> kernel;
    KernelChoice choice;
    std::vector<MemberChoice> members;
  };
  auto remake = [&](size_t k, bool tune) {
    const Step& st = steps_[k];
    // A kernel that preferred NHWC is replaced by one that does; a dense one by a dense one or
    // one that prefers NHWC.
    const bool was_nhwc = caps[k].nhwc;
    const KernelFilter accept = [&](const plx_kernel& kn) -> std::string {
      const Caps c = caps_of(kn, false);
      if (c.nhwc || (!was_nhwc && c.dense)) return "";
      return "it does not take channels-last tensors";
    };
    const bool tune0 = options_.tune;
    options_.tune = tune0 && tune;
    Remade r;
    try {
      if (!st.fused.empty()) {
        const AbiGraph ag(graph_, descs_, dev);
        Fused f;
        f.nodes = st.fused;
        f.name = st.fused_name;
        f.in = st.in_vars;
        f.out = st.out_vars;
        r.why = create_group(f, ag, accept);
        if (r.why.empty()) {
          const Caps c = caps_of(f.kernel->kernel(), true);
          if (!(c.nhwc || (!was_nhwc && c.dense)))
            r.why = "its fused kernel " +
                    std::string(f.kernel->kernel().impl ? f.kernel->kernel().impl : "?") +
                    " takes NCHW tensors only";
        }
        r.kernel = std::move(f.kernel);
        r.members = std::move(f.members);
      } else {
        const GraphNode& node = graph_.nodes()[static_cast<size_t>(st.node)];
        std::vector<plx_tensor> in, out;
        for (Var v : st.in_vars)
          in.push_back(v.valid() ? descs_[static_cast<size_t>(v.id)] : Tensor().view());
        for (Var v : st.out_vars) out.push_back(descs_[static_cast<size_t>(v.id)]);
        KernelResolution res;
        try {
          res = resolve_kernel(backend_, *node.schema, in, out, node.attrs, dev, options_.tune,
                               accept);
        } catch (const std::exception& e) {
          rethrow_for_node(e, node);
        }
        if (!res.kernel) {
          r.why = "no kernel takes its channels-last tensors";
          for (const std::string& d : res.declines) r.why += "; " + d;
        }
        r.kernel = std::move(res.kernel);
        r.choice = std::move(res.choice);
      }
    } catch (...) {
      options_.tune = tune0;
      throw;
    }
    options_.tune = tune0;
    return r;
  };

  // Every kernel touching a channels-last value created again; on success they replace the
  // old ones and `why` stays empty, else `why` says why the returned step's kernel cannot be.
  auto remake_all = [&](const std::vector<char>& nhwc, std::string& why) -> size_t {
    describe(nhwc);
    std::vector<std::pair<size_t, Remade>> done;
    for (size_t k = 0; k < steps_.size(); ++k) {
      const std::vector<int32_t> ids = operands(steps_[k]);
      if (std::none_of(ids.begin(), ids.end(),
                       [&](int32_t id) { return nhwc[static_cast<size_t>(id)]; }))
        continue;
      Remade r = remake(k, true);
      if (!r.why.empty()) {
        why = r.why;
        return k;
      }
      done.emplace_back(k, std::move(r));
    }
    plan_.channels_last.clear();
    plan_.channels_last_values = 0;
    plan_.channels_last_bytes = 0;
    for (size_t i = 0; i < nv; ++i) {
      if (!nhwc[i]) continue;
      const GraphValue& v = graph_.values()[i];
      ++plan_.channels_last_values;
      plan_.channels_last_bytes += desc_bytes(v.desc);
      const std::string name = v.name.empty() && v.producer >= 0
                                   ? graph_.nodes()[static_cast<size_t>(v.producer)].name
                                   : v.name;
      plan_.channels_last.push_back(name + " " + desc_string(v.desc));
    }
    for (auto& [k, r] : done) {
      Step& st = steps_[k];
      st.kernel = std::move(r.kernel);
      if (st.fused.empty())
        st.choice = std::move(r.choice);
      else
        st.members = std::move(r.members);
      st.in.clear();
      st.out.clear();
      for (Var in : st.in_vars)
        st.in.push_back(in.valid() ? descs_[static_cast<size_t>(in.id)] : Tensor().view());
      for (Var out : st.out_vars) st.out.push_back(descs_[static_cast<size_t>(out.id)]);
    }
    spdlog::debug(
        "layout: {} activation(s) channels-last ({}), {} kernel(s) created again for them",
        plan_.channels_last_values, format_bytes(plan_.channels_last_bytes), done.size());
    return 0;
  };

  std::vector<char> blocked(nv, 0);
  for (;;) {
    // Groups tied by dense kernels (union-find), and what the other kernels allow.
    std::vector<int32_t> parent(nv);
    std::iota(parent.begin(), parent.end(), 0);
    std::function<int32_t(int32_t)> find = [&](int32_t x) {
      while (parent[static_cast<size_t>(x)] != x)
        x = parent[static_cast<size_t>(x)] =
            parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
      return x;
    };
    std::vector<char> stop = blocked, wanted(nv, 0);
    for (size_t k = 0; k < steps_.size(); ++k) {
      const Step& st = steps_[k];
      const std::vector<int32_t> ids = operands(st);
      if (caps[k].nhwc) {
        for (int32_t id : ids) wanted[static_cast<size_t>(id)] = 1;
      } else if (caps[k].dense && !st.out_vars.empty()) {
        const Shape& shape = graph_.value(st.out_vars[0]).desc.shape;
        for (int32_t id : ids) {
          const TensorDesc& d = graph_.values()[static_cast<size_t>(id)].desc;
          if (d.shape == shape)
            parent[static_cast<size_t>(find(id))] = find(st.out_vars[0].id);
          else if (d.ndim() == 4)
            stop[static_cast<size_t>(id)] = 1;
        }
      } else {
        for (int32_t id : ids) stop[static_cast<size_t>(id)] = 1;
      }
    }
    std::vector<char> group_ok(nv, 1), group_wanted(nv, 0);
    for (size_t i = 0; i < nv; ++i) {
      const size_t r = static_cast<size_t>(find(static_cast<int32_t>(i)));
      if (!candidate[i] || stop[i]) group_ok[r] = 0;
      if (wanted[i]) group_wanted[r] = 1;
    }
    std::vector<char> nhwc(nv, 0);
    bool any = false;
    for (size_t i = 0; i < nv; ++i) {
      const size_t r = static_cast<size_t>(find(static_cast<int32_t>(i)));
      nhwc[i] = candidate[i] && group_ok[r] && group_wanted[r];
      any = any || nhwc[i];
    }
    if (!any) return;

    const std::vector<char> plan = nhwc;
    std::string why;
    const size_t failed = remake_all(plan, why);
    if (why.empty()) return;
    // Which of its channels-last tensors the kernel refuses: each offered to it alone (a fused
    // conv + pool takes its conv's side channels-last and not its pool's). Those are kept NCHW,
    // or all of them where it takes none alone, and the plan is made again.
    const Step& st = steps_[failed];
    const std::string label =
        st.fused.empty() ? node_label(graph_.nodes()[static_cast<size_t>(st.node)]) : st.label;
    std::vector<int32_t> mine;
    for (int32_t id : operands(st))
      if (plan[static_cast<size_t>(id)] && std::find(mine.begin(), mine.end(), id) == mine.end())
        mine.push_back(id);
    std::vector<int32_t> refused;
    if (mine.size() > 1)
      for (int32_t id : mine) {
        std::vector<char> alone(nv, 0);
        alone[static_cast<size_t>(id)] = 1;
        describe(alone);
        if (!remake(failed, false).why.empty()) refused.push_back(id);
      }
    if (refused.empty()) refused = mine;
    std::string names;
    for (int32_t id : refused) {
      const GraphValue& v = graph_.values()[static_cast<size_t>(id)];
      names +=
          (names.empty() ? "" : ", ") + (v.name.empty() && v.producer >= 0
                                             ? graph_.nodes()[static_cast<size_t>(v.producer)].name
                                             : v.name);
    }
    spdlog::debug("layout: {} cannot run on channels-last {} ({}); they stay NCHW", label, names,
                  why);
    for (int32_t id : refused) blocked[static_cast<size_t>(id)] = 1;
    describe(std::vector<char>(nv, 0));
  }
}

Executable::~Executable() {
  try {
    backend_.sync_stream(stream_);
  } catch (...) {
    // Destruction must not throw; the error already reached whoever ran the step.
  }
  for (auto& [variant, g] : graphs_) backend_.table().graph_destroy(backend_.table().ctx, g);
}

void Executable::plan_memory() {
  const auto& nodes = graph_.nodes();
  const size_t nv = static_cast<size_t>(graph_.num_values());
  const int32_t end = static_cast<int32_t>(nodes.size());
  plan_.offset.assign(nv, -1);

  // Live range of each activation root: from its producer to its last reader (through views).
  std::vector<int32_t> first(nv, -1), last(nv, -1);
  std::vector<Var> root(nv);
  for (size_t i = 0; i < nv; ++i) {
    root[i] = graph_.storage_root(Var{static_cast<int32_t>(i)});
    const GraphValue& v = graph_.values()[i];
    if (v.kind == ValueKind::Activation && v.view_of < 0 && !internal_[i]) {
      first[i] = last[i] = pos_[static_cast<size_t>(v.producer)];
      ++plan_.activation_buffers;
      plan_.unplanned_bytes += align_up(desc_bytes(v.desc), kArenaAlign);
    }
  }
  auto is_planned = [&](Var r) { return first[static_cast<size_t>(r.id)] >= 0; };
  for (size_t n = 0; n < nodes.size(); ++n)
    for (Var in : nodes[n].inputs)
      if (in.valid()) {
        const Var r = root[static_cast<size_t>(in.id)];
        if (is_planned(r)) last[static_cast<size_t>(r.id)] = std::max(last[static_cast<size_t>(r.id)], pos_[n]);
      }
  for (const auto& [name, v] : graph_.outputs()) {
    const Var r = root[static_cast<size_t>(v.id)];
    if (is_planned(r)) last[static_cast<size_t>(r.id)] = end;
  }

  // Buffers: a root, or several when in-place nodes chain them. buf[root] -> buffer id.
  std::vector<int32_t> buf(nv, -1);
  struct Buffer {
    uint64_t bytes;
    int32_t start, stop;
    int64_t offset = -1;
  };
  std::vector<Buffer> buffers;
  for (size_t i = 0; i < nv; ++i)
    if (first[i] >= 0) {
      buf[i] = static_cast<int32_t>(buffers.size());
      buffers.push_back(Buffer{align_up(std::max<uint64_t>(desc_bytes(graph_.values()[i].desc), 1),
                                        kArenaAlign),
                               first[i], last[i]});
    }
  if (options_.inplace) {
    for (const Step& st : steps_) {
      if (!st.fused.empty() || !(st.kernel->kernel().flags & PLX_KERNEL_INPLACE)) continue;
      const GraphNode& node = nodes[static_cast<size_t>(st.node)];
      if (node.inputs.empty() || !node.inputs[0].valid() || node.outputs.empty()) continue;
      const Var in_root = root[static_cast<size_t>(node.inputs[0].id)];
      if (!is_planned(in_root)) continue;
      const int32_t b = buf[static_cast<size_t>(in_root.id)];
      Buffer& B = buffers[static_cast<size_t>(b)];
      if (B.stop != st.node) continue;  // read later (or a graph output): keep it
      bool read_twice = false;
      for (size_t k = 1; k < node.inputs.size(); ++k)
        if (node.inputs[k].valid() && buf[static_cast<size_t>(root[static_cast<size_t>(node.inputs[k].id)].id)] == b)
          read_twice = true;
      if (read_twice) continue;
      const Var out = node.outputs[0];
      const GraphValue& ov = graph_.value(out);
      if (desc_bytes(ov.desc) != desc_bytes(graph_.value(node.inputs[0]).desc)) continue;
      // Element i of the output over element i of the input: the same layout.
      const plx_tensor& di = descs_[static_cast<size_t>(node.inputs[0].id)];
      const plx_tensor& dout = descs_[static_cast<size_t>(out.id)];
      const bool same_layout =
          sdk::is_contiguous(di) && sdk::is_contiguous(dout)
              ? true
              : di.ndim == dout.ndim && std::equal(di.strides, di.strides + di.ndim, dout.strides);
      if (!same_layout) continue;
      const int32_t ob = buf[static_cast<size_t>(out.id)];
      // The output's buffer folds into the input's, which then lives as long as the output.
      B.stop = buffers[static_cast<size_t>(ob)].stop;
      B.bytes = std::max(B.bytes, buffers[static_cast<size_t>(ob)].bytes);
      buffers[static_cast<size_t>(ob)].bytes = 0;
      for (int32_t& x : buf)
        if (x == ob) x = b;
      ++plan_.inplace_nodes;
    }
  }

  // Packing: buffers in some order, each at the lowest offset (or the tightest gap) free during
  // its whole live range. No one order packs every graph best: largest first leaves holes where
  // a long-lived mid-sized buffer lands above a short large one (convnet at batch 1024: 447 MiB
  // for 399 live), so several orders and both gap rules are tried and the smallest arena kept
  // (some dozen buffers each: microseconds).
  std::vector<int32_t> live_ids;
  for (size_t i = 0; i < buffers.size(); ++i)
    if (buffers[i].bytes) live_ids.push_back(static_cast<int32_t>(i));
  auto pack = [&](const std::vector<int32_t>& order, bool best_fit, std::vector<int64_t>& offset) {
    uint64_t arena = 0;
    std::vector<int32_t> placed;
    for (int32_t id : order) {
      const Buffer& B = buffers[static_cast<size_t>(id)];
      uint64_t off = 0;
      if (options_.reuse) {
        std::vector<std::pair<uint64_t, uint64_t>> busy;  // [offset, end) live at the same time
        for (int32_t p : placed) {
          const Buffer& P = buffers[static_cast<size_t>(p)];
          if (P.start <= B.stop && B.start <= P.stop)
            busy.emplace_back(static_cast<uint64_t>(offset[static_cast<size_t>(p)]),
                              static_cast<uint64_t>(offset[static_cast<size_t>(p)]) + P.bytes);
        }
        std::sort(busy.begin(), busy.end());
        if (!best_fit) {  // the lowest gap that fits, else above everything
          for (const auto& [lo, hi] : busy) {
            if (off + B.bytes <= lo) break;
            off = std::max(off, hi);
          }
        } else {  // the smallest gap that fits, else above everything
          uint64_t at = 0, gap = UINT64_MAX;
          bool found = false;
          for (const auto& [lo, hi] : busy) {
            if (at + B.bytes <= lo && lo - at < gap) gap = lo - at, off = at, found = true;
            at = std::max(at, hi);
          }
          if (!found) off = at;
        }
      } else {
        off = arena;
      }
      offset[static_cast<size_t>(id)] = static_cast<int64_t>(off);
      arena = std::max(arena, off + B.bytes);
      placed.push_back(id);
    }
    return arena;
  };
  using Key = std::function<bool(const Buffer&, const Buffer&)>;
  const std::vector<Key> keys = {
      [](const Buffer& a, const Buffer& b) { return a.bytes > b.bytes; },
      [](const Buffer& a, const Buffer& b) {  // bytes x lifetime
        return static_cast<double>(a.bytes) * (a.stop - a.start + 1) >
               static_cast<double>(b.bytes) * (b.stop - b.start + 1);
      },
      [](const Buffer& a, const Buffer& b) {  // longest-lived first
        return a.stop - a.start != b.stop - b.start ? a.stop - a.start > b.stop - b.start
                                                    : a.bytes > b.bytes;
      },
      [](const Buffer& a, const Buffer& b) {  // in order of first use
        return a.start != b.start ? a.start < b.start : a.bytes > b.bytes;
      },
  };
  uint64_t arena = UINT64_MAX;
  std::vector<int64_t> best(buffers.size(), -1), trial(buffers.size(), -1);
  for (const Key& key : keys) {
    std::vector<int32_t> order = live_ids;
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return key(buffers[static_cast<size_t>(a)], buffers[static_cast<size_t>(b)]);
    });
    for (bool best_fit : {false, true}) {
      const uint64_t got = pack(order, best_fit, trial);
      if (got < arena) arena = got, best = trial;
      if (!options_.reuse) break;
    }
    if (!options_.reuse) break;
  }
  if (live_ids.empty()) arena = 0;
  for (int32_t id : live_ids) buffers[static_cast<size_t>(id)].offset = best[static_cast<size_t>(id)];
  plan_.arena_bytes = arena;
  for (size_t i = 0; i < nv; ++i)
    if (buf[i] >= 0) plan_.offset[i] = buffers[static_cast<size_t>(buf[i])].offset;

  // The live peak: bytes of the buffers live at each kernel's position, and at the fullest one
  // the values they hold then (a buffer in-place nodes chained holds the one written last).
  std::vector<uint64_t> live(static_cast<size_t>(end) + 1, 0);
  for (const Buffer& B : buffers)
    if (B.bytes)
      for (int32_t p = B.start; p <= B.stop; ++p) live[static_cast<size_t>(p)] += B.bytes;
  int32_t peak = 0;
  for (int32_t p = 1; p <= end; ++p)
    if (live[static_cast<size_t>(p)] > live[static_cast<size_t>(peak)]) peak = p;
  plan_.live_peak_bytes = live[static_cast<size_t>(peak)];
  plan_.peak_node.clear();
  plan_.peak_live.clear();
  if (plan_.live_peak_bytes == 0) return;
  if (peak < end) {
    const GraphNode& pn = nodes[static_cast<size_t>(peak)];
    plan_.peak_node = pn.name + " (" + pn.op_name() + ")";
  } else {
    plan_.peak_node = "the end of the step (outputs)";
  }
  std::vector<int32_t> holder(buffers.size(), -1);  // buffer -> value live in it at the peak
  for (size_t i = 0; i < nv; ++i) {
    if (buf[i] < 0 || first[i] > peak || last[i] < peak) continue;
    int32_t& h = holder[static_cast<size_t>(buf[i])];
    if (h < 0 || first[static_cast<size_t>(h)] <= first[i]) h = static_cast<int32_t>(i);
  }
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (!buffers[b].bytes || buffers[b].start > peak || buffers[b].stop < peak) continue;
    std::string what = "(an in-place chain)";  // no value of it is live at the peak
    if (const int32_t h = holder[b]; h >= 0) {
      const GraphValue& v = graph_.values()[static_cast<size_t>(h)];
      const GraphNode* pn = v.producer >= 0 ? &nodes[static_cast<size_t>(v.producer)] : nullptr;
      what = (v.name.empty() && pn ? pn->name : v.name) + (pn ? " " + pn->op_name() : "") + " " +
             desc_string(v.desc);
    }
    plan_.peak_live.push_back({std::move(what), buffers[b].bytes});
  }
  std::stable_sort(plan_.peak_live.begin(), plan_.peak_live.end(),
                   [](const MemoryPlan::LiveValue& a, const MemoryPlan::LiveValue& b) {
                     return a.bytes > b.bytes;
                   });
}

Tensor Executable::tensor(Var v) const {
  graph_.value(v);  // validates
  return tensors_[static_cast<size_t>(v.id)];
}

Tensor Executable::tensor(std::string_view name) const {
  const Var v = graph_.find(name);
  if (!v.valid())
    throw Error("no input, parameter, state or output named '" + std::string(name) +
                "' in this graph");
  return tensor(v);
}

std::string Executable::blame(const Step& st, const std::string& what) const {
  const char* impl = st.kernel->kernel().impl ? st.kernel->kernel().impl : "?";
  return fmt::format(
      "{}: kernel {} on '{}' {}; keep it out with backend.exclude_kernels = [\"{}\"] or "
      "PLEXUS_EXCLUDE_KERNELS={}",
      st.fused.empty() ? node_label(graph_.nodes()[static_cast<size_t>(st.node)]) : st.label,
      impl, backend_.name(), what, impl, impl);
}

void Executable::check_kernel(const Step& st, const char* error) {
  try {
    wait_for_kernels(&st);
  } catch (const std::exception& e) {
    throw KernelFaultError(blame(st, std::string("failed on the device (") +
                                        (error ? error : e.what()) + ")"));
  }
}

void Executable::wait_for_kernels(const Step* st) {
  const double limit = backend_.runtime().options().step_timeout_s;
  const WaitWatch watch(limit, [&] {
    const std::string stuck = fmt::format(
        "completed in {:g} s (backend.step_timeout_s), so the device is taken for stuck and the "
        "process exits",
        limit);
    if (st) return blame(*st, "has not " + stuck);
    return fmt::format("the kernels of a graph on '{}' have not {}; a kernel may hang on the "
                       "device (backend.check_kernels = true names the kernel)",
                       backend_.name(), stuck);
  });
  backend_.sync_stream(stream_);
}

void Executable::run_nodes() {
  const auto& nodes = graph_.nodes();
  void* ws = workspace_.defined() ? workspace_.data() : nullptr;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& st = steps_[k];
    const std::vector<Hook>* hooks = hooks_.empty() ? nullptr : &hooks_[k];
    if (hooks)
      for (const Hook& h : *hooks)
        if (h.when == HookPoint::Before) h.fn();
    // backend.check_kernels: what ran before this kernel has finished, so a failure from here on
    // that leaves the stream failing is this kernel's fault (a failure before it comes out here
    // as it is).
    if (check_kernels_) wait_for_kernels(nullptr);
    try {
      st.kernel->run(st.in.data(), static_cast<int32_t>(st.in.size()), st.out.data(),
                     static_cast<int32_t>(st.out.size()), ws, stream_);
    } catch (const std::exception& e) {
      // It faulted, and a launch of its own said so.
      if (check_kernels_) check_kernel(st, e.what());
      if (!st.fused.empty()) throw;  // the kernel's label names the fused kernel and its nodes
      rethrow_for_node(e, nodes[static_cast<size_t>(st.node)]);
    }
    if (check_kernels_) check_kernel(st, nullptr);
    if (hooks)
      for (const Hook& h : *hooks)
        if (h.when == HookPoint::After) h.fn();
  }
}

int32_t Executable::num_kernels() const { return static_cast<int32_t>(steps_.size()); }

int32_t Executable::kernel_index(int32_t node) const {
  if (node < 0 || node >= static_cast<int32_t>(kernel_of_.size()))
    throw Error("Executable::kernel_index: no node " + std::to_string(node));
  return kernel_of_[static_cast<size_t>(node)];
}

int32_t Executable::producer_kernel(Var v) const {
  const Var root = graph_.storage_root(v);
  const GraphValue& r = graph_.value(root);
  return r.producer < 0 ? -1 : kernel_index(r.producer);
}

int32_t Executable::first_reader_kernel(Var v) const {
  const Var root = graph_.storage_root(v);
  int32_t first = -1;
  const auto& nodes = graph_.nodes();
  for (size_t n = 0; n < nodes.size(); ++n) {
    if (!nodes[n].schema) continue;  // a reshape reads nothing; its readers are found below
    for (Var in : nodes[n].inputs) {
      if (!in.valid() || graph_.storage_root(in).id != root.id) continue;
      const int32_t k = kernel_index(static_cast<int32_t>(n));
      if (k >= 0 && (first < 0 || k < first)) first = k;
    }
  }
  return first;
}

void Executable::add_hook(int32_t k, HookPoint when, std::function<void()> fn, bool capturable) {
  if (runs_ > 0) throw Error("Executable::add_hook: hooks must be added before the first run");
  if (k < 0 || k >= num_kernels())
    throw Error("Executable::add_hook: kernel " + std::to_string(k) + " is outside [0, " +
                std::to_string(num_kernels()) + ")");
  if (hooks_.empty()) hooks_.resize(steps_.size());
  hooks_[static_cast<size_t>(k)].push_back(Hook{when, std::move(fn)});
  if (!capturable) can_capture_ = false;
}

void Executable::run(const Around& around) {
  if (captures(around)) {
    // Once this variant's graph exists, a failure is no capture's.
    if (graph_of(around.variant) || runs_ == 0) return run_step(around, true);
    try {
      run_step(around, true);
      return;
    } catch (const std::exception& e) {
      // Capturing the step with the work around it failed. Run that work outside the graph from
      // now on rather than fail the run; an error that does not come from the capture (the step
      // itself) comes back from the run below.
      around_refused_ = true;
      spdlog::warn("capturing the work around the step with it failed ({}); it runs outside the "
                   "step's graph from now on",
                   e.what());
    }
  }
  run_step(around, false);
}

void* Executable::graph_of(int32_t key) const {
  for (const auto& [variant, g] : graphs_)
    if (variant == key) return g;
  return nullptr;
}

void Executable::run_step(const Around& around, bool inside) {
  const plx_backend& t = backend_.table();
  const int32_t key = inside ? around.variant : -1;
  void* graph = graph_of(key);
  auto step = [&] {
    if (inside && around.before) around.before();
    run_nodes();
    if (inside && around.after) around.after();
  };
  if (!inside && around.before) around.before();
  if (graph) {
    backend_.check(t.graph_launch(t.ctx, graph, stream_), "graph_launch");
  } else if (can_capture_ && runs_ >= 1) {
    // The first run went op by op (kernels may set themselves up); record the next of each variant.
    backend_.check(t.capture_begin(t.ctx, stream_), "capture_begin");
    try {
      step();
    } catch (...) {
      void* g = nullptr;
      if (t.capture_end(t.ctx, stream_, &g) == PLX_OK && g) t.graph_destroy(t.ctx, g);
      throw;
    }
    backend_.check(t.capture_end(t.ctx, stream_, &graph), "capture_end");
    graphs_.emplace_back(key, graph);
    backend_.check(t.graph_launch(t.ctx, graph, stream_), "graph_launch");
  } else {
    step();
  }
  if (!inside && around.after) around.after();
  ++runs_;
}

void Executable::sync() { wait_for_kernels(nullptr); }

std::vector<std::string> Executable::kernel_names() const {
  std::vector<std::string> out;
  for (const Step& st : steps_) {
    const GraphNode& node = graph_.nodes()[static_cast<size_t>(st.node)];
    const char* impl = st.kernel->kernel().impl;
    std::string what = node.name + " " + node.schema->name;
    if (!st.fused.empty()) {
      what = st.label + " [";
      for (size_t i = 0; i < st.fused.size(); ++i)
        what += (i ? ", " : "") + graph_.nodes()[static_cast<size_t>(st.fused[i])].name;
      what += "]";
    }
    what += ": " + backend_.name() + "/" + (impl ? impl : "?");
    auto how = [](const KernelChoice& c) -> std::string {
      if (c.how == KernelChoice::How::Tuned) {
        std::string s = " (tuned:";
        for (size_t i = 0; i < c.times.size(); ++i) {
          char ms[32];
          std::snprintf(ms, sizeof ms, "%.4g ms", c.times[i].ms);
          s += (i ? ", " : " ") + c.times[i].impl + " " + (c.times[i].ms >= 0 ? ms : "failed");
        }
        return s + ")";
      }
      if (c.how != KernelChoice::How::Only) return std::string(" (") + choice_how_name(c.how) + ")";
      return "";
    };
    what += how(st.choice);
    for (const MemberChoice& m : st.members) {
      what += "; " + graph_.nodes()[static_cast<size_t>(m.node)].name + " on " + m.impl + how(m.choice);
      if (!m.group_times.empty()) {
        KernelChoice group;
        group.how = KernelChoice::How::Tuned;
        group.times = m.group_times;
        what += ", for the group as a whole" + how(group);
      }
    }
    out.push_back(std::move(what));
  }
  return out;
}

std::vector<Executable::KernelReport> Executable::kernel_choices() const {
  std::vector<KernelReport> out;
  for (const Step& st : steps_) {
    for (const MemberChoice& m : st.members) {
      const GraphNode& node = graph_.nodes()[static_cast<size_t>(m.node)];
      if (m.choice.how != KernelChoice::How::Only)
        out.push_back({node.name, node.schema->name, m.impl, m.library, m.choice, m.group_times});
    }
    if (st.choice.how == KernelChoice::How::Only) continue;
    const GraphNode& node = graph_.nodes()[static_cast<size_t>(st.node)];
    const plx_kernel& k = st.kernel->kernel();
    out.push_back({node.name, node.schema->name, k.impl ? k.impl : "?", is_library_kernel(k),
                   st.choice});
  }
  return out;
}

}  // namespace plexus
