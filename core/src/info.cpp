#include "plexus/info.hpp"

#include <toml++/toml.h>

#include <cstdio>
#include <sstream>

#include "plexus/allocator.hpp"
#include "plexus/runtime.hpp"
#include "plexus/sdk/dtype.hpp"
#include "plexus/version.hpp"
#include "text.hpp"

namespace plexus {

namespace {

// "conv2d f32" -> "im2col_blas [library], direct [native]" for every (op, dtype) of the backend
// with more than one kernel.
std::vector<std::pair<std::string, std::string>> kernel_candidates(const Backend& b) {
  std::vector<std::pair<std::string, std::string>> out;
  const OpRegistry& ops = b.runtime().ops();
  for (const auto& [name, dts] : b.supported_ops()) {
    const OpSchema& s = ops.get(name);
    for (plx_dtype d : dts) {
      const auto ks = b.kernels(s.id, d);
      if (ks.size() < 2) continue;
      std::string list;
      const KernelTuner& tuner = b.runtime().tuner();
      for (const plx_kernel* k : ks) {
        const char* impl = k->impl ? k->impl : "?";
        list += (list.empty() ? "" : ", ") + std::string(impl) +
                (is_library_kernel(*k) ? " [library" : " [native") +
                (tuner.excluded_by(impl) ? ", excluded]" : "]");
      }
      out.emplace_back(name + " " + dtype_name(d), list);
    }
  }
  return out;
}

std::string dtypes_string(const std::vector<plx_dtype>& ds) {
  std::string s;
  for (plx_dtype d : ds) s += (s.empty() ? "" : " ") + std::string(dtype_name(d));
  return s;
}
}  // namespace

std::string info_text(const Runtime& rt) {
  std::ostringstream os;
  os << "Plexus " << PLEXUS_VERSION_STRING << " (plugin ABI " << PLX_ABI_MAJOR << "." << PLX_ABI_MINOR
     << ")\n";
  os << "\nPlugin search path:\n";
  for (const auto& p : rt.searched()) os << "  " << p << "\n";
  os << "\nPlugins loaded (" << rt.plugins().size() << "):\n";
  for (const auto& p : rt.plugins())
    os << "  " << p->name() << " " << p->version() << "  ABI " << p->abi_major() << "." << p->abi_minor()
       << "  " << p->path() << "\n    " << p->description() << "\n";
  os << "\nPlugins skipped (" << rt.skipped().size() << "):\n";
  for (const auto& s : rt.skipped()) os << "  " << s.path << "\n    " << s.reason << "\n";
  os << "\nBackends (" << rt.backends().size() << "):\n";
  for (Backend* b : rt.backends()) {
    os << "  " << b->name() << " (plugin " << b->plugin().name() << "), " << b->device_count()
       << " device(s)";
    if (b->device_count() == 0) os << ": " << b->unavailable_reason() << " (not selectable)";
    os << "\n";
    for (int32_t d = 0; d < b->device_count(); ++d) {
      const DeviceInfo i = b->device(d);
      os << "    [" << d << "] " << i.name << ", " << format_bytes(i.total_memory) << " memory, "
         << i.compute_units << " compute units";
      if (i.arch_major) os << ", arch " << i.arch_major << "." << i.arch_minor;
      os << "\n        caps: " << caps_string(i.caps) << "\n";
    }
    const auto ops = b->supported_ops();
    os << "    ops (" << ops.size() << "):\n";
    for (const auto& [name, dts] : ops) {
      std::string padded = name;
      if (padded.size() < 32) padded.resize(32, ' ');
      os << "      " << padded << " " << dtypes_string(dts);
      // Which of them another plugin's kernel extensions provide.
      std::string from;
      for (const ExtensionKernel& x : rt.extension_kernels())
        if (x.problem.empty() && x.backend == b->name() && x.op == name &&
            from.find(x.plugin) == std::string::npos)
          from += (from.empty() ? "" : ", ") + x.plugin;
      if (!from.empty()) os << "  (kernel from plugin " << from << ")";
      os << "\n";
    }
  }
  // Ops with several kernels: what backend.kernels chooses among.
  for (Backend* b : rt.backends()) {
    const auto cands = kernel_candidates(*b);
    if (cands.empty()) continue;
    os << "\nKernel candidates on " << b->name() << " (backend.kernels = "
       << kernel_side_name(rt.options().kernels);
    if (!rt.options().exclude_kernels.empty()) {
      os << "; backend.exclude_kernels =";
      for (const std::string& p : rt.options().exclude_kernels) os << " '" << p << "'";
    }
    os << "):\n";
    for (const auto& [what, list] : cands) {
      std::string padded = what;
      if (padded.size() < 36) padded.resize(36, ' ');
      os << "  " << padded << " " << list << "\n";
    }
  }
  {
    KernelTuner& t = rt.tuner();
    const auto entries = t.entries();
    os << "\nTuned kernel choices (" << entries.size() << ") in "
       << (t.cache_path().empty() ? std::string("this process only") : t.cache_path()) << ":\n";
    for (const auto& [key, e] : entries) {
      const auto f = text::split(key, '|');
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.4g ms", e.ms);
      if (f.size() == 6)
        os << "  " << f[0] << " " << f[3] << " " << f[4] << (f[5].empty() ? "" : " " + f[5]) << ": "
           << e.impl << " (" << ms << ")\n";
      else
        os << "  " << key << ": " << e.impl << " (" << ms << ")\n";
    }
    for (const std::string& p : t.problems()) os << "  ignored: " << p << "\n";
  }
  os << "\nKernel extensions (" << rt.extension_kernels().size() << "):\n";
  for (const ExtensionKernel& x : rt.extension_kernels()) {
    os << "  " << x.op << " " << dtype_name(x.dtype) << " on " << x.backend << ": " << x.impl
       << " (plugin " << x.plugin << ")";
    if (!x.problem.empty()) os << "\n    not used: " << x.problem;
    os << "\n";
  }
  os << "\nCommunicators (" << rt.communicators().size() << "):\n";
  for (Communicator* c : rt.communicators()) {
    std::string list;
    for (const auto& b : c->backends()) list += (list.empty() ? "" : ", ") + b;
    os << "  " << c->name() << " (plugin " << c->plugin().name() << ") on backends: " << list << "\n";
  }
  return os.str();
}

std::string info_json(const Runtime& rt) {
  toml::table root;
  root.insert("version", PLEXUS_VERSION_STRING);
  root.insert("abi", toml::table{{"major", PLX_ABI_MAJOR}, {"minor", PLX_ABI_MINOR}});
  toml::array searched;
  for (const auto& p : rt.searched()) searched.push_back(p);
  root.insert("searched", searched);
  toml::array plugins;
  for (const auto& p : rt.plugins())
    plugins.push_back(toml::table{{"name", p->name()},
                                  {"version", p->version()},
                                  {"description", p->description()},
                                  {"path", p->path()},
                                  {"abi_major", static_cast<int64_t>(p->abi_major())},
                                  {"abi_minor", static_cast<int64_t>(p->abi_minor())}});
  root.insert("plugins", plugins);
  toml::array skipped;
  for (const auto& s : rt.skipped()) skipped.push_back(toml::table{{"path", s.path}, {"reason", s.reason}});
  root.insert("skipped", skipped);
  toml::array backends;
  for (Backend* b : rt.backends()) {
    toml::table bt{{"name", b->name()}, {"plugin", b->plugin().name()}};
    if (b->device_count() == 0) bt.insert("unavailable", b->unavailable_reason());
    toml::array devices;
    for (int32_t d = 0; d < b->device_count(); ++d) {
      const DeviceInfo i = b->device(d);
      toml::array caps;
      std::istringstream cs(caps_string(i.caps));
      for (std::string c; cs >> c;) caps.push_back(c);
      devices.push_back(toml::table{{"index", static_cast<int64_t>(d)},
                                    {"name", i.name},
                                    {"total_memory", static_cast<int64_t>(i.total_memory)},
                                    {"compute_units", static_cast<int64_t>(i.compute_units)},
                                    {"arch", std::to_string(i.arch_major) + "." + std::to_string(i.arch_minor)},
                                    {"caps", caps}});
    }
    bt.insert("devices", devices);
    toml::table ops;
    for (const auto& [name, dts] : b->supported_ops()) {
      toml::array a;
      for (plx_dtype d : dts) a.push_back(dtype_name(d));
      ops.insert(name, a);
    }
    bt.insert("ops", ops);
    toml::table cands;
    for (const auto& [what, list] : kernel_candidates(*b)) cands.insert(what, list);
    bt.insert("kernel_candidates", cands);
    backends.push_back(bt);
  }
  root.insert("backends", backends);
  toml::array extensions;
  for (const ExtensionKernel& x : rt.extension_kernels()) {
    toml::table xt{{"plugin", x.plugin}, {"backend", x.backend},
                   {"op", x.op},         {"dtype", dtype_name(x.dtype)},
                   {"impl", x.impl},     {"used", x.problem.empty()}};
    if (!x.problem.empty()) xt.insert("problem", x.problem);
    extensions.push_back(xt);
  }
  root.insert("extension_kernels", extensions);
  {
    KernelTuner& t = rt.tuner();
    toml::array choices;
    for (const auto& [key, e] : t.entries())
      choices.push_back(toml::table{{"key", key}, {"kernel", e.impl}, {"ms", e.ms}});
    toml::array excluded;
    for (const std::string& p : rt.options().exclude_kernels) excluded.push_back(p);
    root.insert("kernel_choice", toml::table{{"side", kernel_side_name(rt.options().kernels)},
                                             {"cache", t.cache_path()},
                                             {"excluded", excluded},
                                             {"tuned", choices}});
  }
  toml::array comms;
  for (Communicator* c : rt.communicators()) {
    toml::array bs;
    for (const auto& b : c->backends()) bs.push_back(b);
    comms.push_back(toml::table{{"name", c->name()}, {"plugin", c->plugin().name()}, {"backends", bs}});
  }
  root.insert("communicators", comms);
  std::ostringstream os;
  os << toml::json_formatter{root} << "\n";
  return os.str();
}

}  // namespace plexus
