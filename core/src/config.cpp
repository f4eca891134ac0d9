#include "plexus/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>
#include <variant>

#include "toml_util.hpp"

namespace plexus {

// ---- the keys ----

const std::vector<ConfigKey>& Config::keys() {
  static const std::vector<ConfigKey> k = [] {
    std::vector<ConfigKey> v;
    auto add = [&](std::string path, ConfigType type, std::string def, std::string doc) -> ConfigKey& {
      ConfigKey key;
      key.path = std::move(path);
      key.type = type;
      key.default_value = std::move(def);
      key.doc = std::move(doc);
      v.push_back(std::move(key));
      return v.back();
    };
    add("plugins.paths", ConfigType::StringList, "[]",
        "Plugin files or directories searched first, before PLEXUS_PLUGIN_PATH and the "
        "install's plugin directory (relative paths are taken from the working directory)");
    add("plugins.disable", ConfigType::StringList, "[]", "Names of plugins not to load");
    add("plugins.options", ConfigType::Options, "{}",
        "Options per plugin, one table each: [plugins.options.cpu] threads = 2");
    add("backend.name", ConfigType::String, "\"auto\"",
        "Backend to run on: auto (the first backend with a device of its own, not host "
        "memory, else cpu) or the name of a loaded backend");
    add("backend.device", ConfigType::Int, "0", "Device index on that backend").min = 0;
    add("backend.fallback", ConfigType::String, "\"\"",
        "Backend that runs ops the chosen backend has no kernel for, each fallback logged and "
        "counted; empty: such an op is an error");
    auto& kernels = add("backend.kernels", ConfigType::String, "\"auto\"",
                        "Which kernel runs each op when the backend has several: auto (time "
                        "the candidates once per shape when a graph is prepared, keep the "
                        "fastest, remember it in backend.tune_cache), native (the plugin's own "
                        "kernels first) or library (cuBLAS, cuDNN, OpenBLAS first)");
    kernels.choices = {"auto", "native", "library"};
    add("backend.exclude_kernels", ConfigType::StringList, "[]",
        "Kernels never to run: shell patterns (fnmatch) matched against each kernel's name as "
        "`plexus info` lists it and each fused kernel's, e.g. [\"igemm_wgmma_*\", "
        "\"cudnn_graph\"]; a node goes to its next kernel, a fused group runs its nodes apart");
    add("backend.tune_timeout_s", ConfigType::Float, "60",
        "Seconds the tuner waits for one timing run of a candidate before it takes the device "
        "for stuck: it logs the kernel and how to exclude it, and the process exits with "
        "status 3")
        .fmin = 0;
    add("backend.check_kernels", ConfigType::Bool, "false",
        "Wait for each kernel of a step before the next and stop at the first that fails on "
        "the device (a fault that leaves it unusable), naming it and how to exclude it, with "
        "status 3; the step is not captured. Slow: for finding a faulting kernel");
    add("backend.step_timeout_s", ConfigType::Float, "600",
        "Seconds the host waits for a step's kernels to finish (with check_kernels, for each "
        "kernel) before it takes the device for stuck: it says what it waited for and exits "
        "with status 3; 0: no limit")
        .fmin = 0;
    add("backend.tune_cache", ConfigType::String, "\"\"",
        "File that keeps the tuned choices: empty for $PLEXUS_CACHE_DIR/kernels.tsv, else "
        "$XDG_CACHE_HOME/plexus/kernels.tsv or ~/.cache/plexus/kernels.tsv; \"off\": this "
        "process only");
    add("memory.limit", ConfigType::Bytes, "0",
        "Most memory each device's caching allocator may reserve: bytes, a string with a "
        "unit (\"6GiB\", \"512MB\"), or a fraction of the device's memory (0.8 or \"80%\"); "
        "0: the device's memory")
        .min = 0;
    auto& level = add("logging.level", ConfigType::String, "\"info\"",
                      "trace, debug, info, warn, error or off; PLEXUS_LOG_LEVEL overrides it");
    level.choices = {"trace", "debug", "info", "warn", "error", "off"};
    add("logging.file", ConfigType::String, "\"\"", "Also append log lines to this file");
    auto& progress = add("logging.progress", ConfigType::String, "\"auto\"",
                         "Progress of `plexus train`: auto (a bar on a terminal, plain lines "
                         "otherwise), bar, plain or none");
    progress.choices = {"auto", "bar", "plain", "none"};

    // ---- plexus train ----
    add("model.name", ConfigType::String, "\"convnet\"",
        "Built-in model: simplecnn, convnet, mlp or resnet (ignored when model.file is set)");
    add("model.file", ConfigType::String, "\"\"",
        "A model description (TOML, docs/models.md); relative to the config file's directory");
    auto& dataset = add("data.dataset", ConfigType::String, "\"fashion-mnist\"",
                        "fashion-mnist, mnist, cifar10 or synthetic");
    dataset.choices = {"fashion-mnist", "mnist", "cifar10", "synthetic"};
    add("data.path", ConfigType::String, "\"\"",
        "Directory of the dataset's files; empty: /usr/share/datasets/<dataset> (Debian's "
        "dataset-fashion-mnist installs Fashion-MNIST there); relative to the config file");
    auto& partial = add("data.partial_batch", ConfigType::String, "\"drop\"",
                        "The last training batch of an epoch when the set does not divide: drop "
                        "it, or pad it with rows the loss ignores (evaluation always pads)");
    partial.choices = {"drop", "pad"};
    add("data.shuffle", ConfigType::Bool, "true", "Shuffle the training set each epoch (from train.seed and the epoch)");
    add("data.prefetch", ConfigType::Int, "2", "Batches assembled ahead on the loader thread").min = 1;
    auto& res = add("data.resident", ConfigType::String, "\"auto\"",
                    "Keep the data set on the device and gather batches there: on, off, or auto "
                    "(on for a GPU when it takes at most a quarter of the free memory)");
    res.choices = {"auto", "on", "off"};
    add("data.limit", ConfigType::Int, "0", "Train on the first N samples only; 0: all").min = 0;
    add("data.synthetic_samples", ConfigType::Int, "2048",
        "Training samples of the synthetic dataset (the test set is a quarter of it)").min = 1;
    add("train.epochs", ConfigType::Int, "10", "Passes over the training set").min = 1;
    auto& batch = add("train.batch_size", ConfigType::Int, "128", "Samples per step");
    batch.min = 1;
    batch.max = 1 << 20;
    add("train.seed", ConfigType::Int, "0",
        "Seeds initialisation and shuffling; on the CPU a run is bit-reproducible from it")
        .min = 0;
    auto& opt = add("train.optimizer", ConfigType::String, "\"sgd\"", "sgd or adamw");
    opt.choices = {"sgd", "adamw"};
    auto& lr = add("train.lr", ConfigType::Float, "0.05", "Base (peak) learning rate");
    lr.fmin = 0;
    add("train.momentum", ConfigType::Float, "0.9", "SGD momentum (0: none)").fmin = 0;
    add("train.nesterov", ConfigType::Bool, "false", "SGD with Nesterov momentum");
    add("train.weight_decay", ConfigType::Float, "0",
        "Weight decay: L2 added to the gradient for sgd, decoupled for adamw").fmin = 0;
    auto& b1 = add("train.beta1", ConfigType::Float, "0.9", "AdamW's first-moment decay");
    b1.fmin = 0;
    b1.fmax = 0.999999;
    auto& b2 = add("train.beta2", ConfigType::Float, "0.999", "AdamW's second-moment decay");
    b2.fmin = 0;
    b2.fmax = 0.999999;
    add("train.eps", ConfigType::Float, "1e-8", "AdamW's epsilon").fmin = 0;
    auto& sched = add("train.schedule", ConfigType::String, "\"constant\"",
                      "Learning-rate schedule: constant, step or cosine (to train.min_lr at the last step)");
    sched.choices = {"constant", "step", "cosine"};
    add("train.warmup_epochs", ConfigType::Float, "0",
        "Linear warm-up from train.lr/warm-up steps to train.lr over this many epochs").fmin = 0;
    add("train.step_epochs", ConfigType::Int, "3", "step schedule: multiply the rate by train.gamma every this many epochs").min = 1;
    add("train.gamma", ConfigType::Float, "0.1", "step schedule: the factor").fmin = 0;
    add("train.min_lr", ConfigType::Float, "0", "cosine schedule: the final rate").fmin = 0;
    auto& smooth = add("train.label_smoothing", ConfigType::Float, "0",
                       "The training loss's label smoothing (PyTorch's CrossEntropyLoss "
                       "label_smoothing): the target puts this share of its weight evenly on "
                       "every class; the test loss is the plain cross-entropy");
    smooth.fmin = 0;
    smooth.fmax = 1;
    add("train.eval", ConfigType::Bool, "true", "Evaluate on the test set after each epoch");
    add("train.graph_capture", ConfigType::Bool, "true",
        "Record the training step once and replay it (CUDA graphs) where the backend can; "
        "false runs it op by op every step");
    add("train.fusion", ConfigType::Bool, "true",
        "Let the backend run groups of nodes as one kernel (a multi-tensor optimizer update, a "
        "layer with its activation, a conv layer with its max pool, the classifier head with "
        "its loss); false runs every node by itself");
    add("train.channels_last", ConfigType::Bool, "true",
        "Let the layout planner store 4-D activations channels-last (NHWC) where every kernel "
        "that writes or reads them takes it (the CUDA plugin's 16-bit convolutions prefer it), "
        "so no kernel converts them in between; false keeps every activation NCHW");
    auto& prec = add("train.precision", ConfigType::String, "\"f32\"",
                     "Compute precision: f32; tf32 (f32 tensors, TF32 matrix math where the "
                     "backend has it: cuda; the CPU computes f32); bf16 or f16 (the model computes "
                     "in the 16-bit type; parameters, optimizer, loss and softmax stay f32)");
    prec.choices = {"f32", "tf32", "bf16", "f16"};
    // The scale and its count of finite steps are f32 states of the step (loss_scale_update).
    auto& scale_init = add("train.loss_scale_init", ConfigType::Float, "65536",
                           "f16: the loss scale at the start (dynamic loss scaling halves it and "
                           "skips the step when a gradient is not finite)");
    scale_init.fmin = 1;
    scale_init.fmax = 3.4e38;
    auto& window = add("train.loss_scale_window", ConfigType::Int, "2000",
                       "f16: finite steps in a row after which the loss scale doubles");
    window.min = 1;
    window.max = int64_t{1} << 24;
    add("train.recompute", ConfigType::StringList, "[]",
        "Ops whose outputs backward computes again instead of keeping them from the forward, "
        "where that frees memory: any of relu, gelu, sigmoid, tanh, cast, max_pool2d, "
        "avg_pool2d, add, sub, mul, scale, batch_norm (recomputed from its saved statistics) "
        "(docs/training.md, \"Memory\")");
    add("train.max_steps", ConfigType::Int, "0",
        "Stop after this many steps in all (a checkpoint is written there); 0: no limit").min = 0;
    auto& target = add("train.target_accuracy", ConfigType::Float, "0",
                       "Stop after the first epoch whose test accuracy reaches this fraction, and "
                       "record the time to it (training seconds without evaluation, and wall "
                       "seconds) in the summary; 0: off. Needs train.eval");
    target.fmin = 0;
    target.fmax = 1;
    // ---- parallel training (docs/parallel.md) ----
    auto& pc = add("parallel.comm", ConfigType::String, "\"auto\"",
                   "Communicator between the ranks of a launch (mpirun, srun): auto (nccl for "
                   "the cuda backend, mpi otherwise), mpi or nccl; a single process uses none");
    pc.choices = {"auto", "mpi", "nccl"};
    add("parallel.bucket_size", ConfigType::Bytes, "\"25MiB\"",
        "Data parallelism: gradients are all-reduced in buckets of about this size, each "
        "started as soon as its last gradient is written (PyTorch DDP's bucket_cap_mb)")
        .min = 1;
    add("parallel.overlap", ConfigType::Bool, "true",
        "Start each gradient bucket during backward; false: all of them after it (to measure "
        "how much communication the overlap hides)");
    add("parallel.pipeline_stages", ConfigType::Int, "1",
        "Pipeline parallelism: the model's layers are cut into this many stages, one per rank; "
        "the ranks of a launch form (ranks / stages) data-parallel pipelines")
        .min = 1;
    add("parallel.pipeline_split", ConfigType::StringList, "[]",
        "Names of the layers that start stages 2, 3, ...; empty: cuts that balance the "
        "parameters");
    add("parallel.micro_batches", ConfigType::Int, "0",
        "Micro-batches each pipeline splits its share of a batch into (1F1B schedule); 0: a "
        "divisor of that share from 2 to 4 times the stages (else the largest below)")
        .min = 0;
    add("parallel.timeout_s", ConfigType::Float, "300",
        "A rank waiting longer than this for its peers in one operation fails the run (a hung "
        "or dead peer)")
        .fmin = 0.001;
    add("output.dir", ConfigType::String, "\"runs/{model}\"",
        "Where a run writes metrics.jsonl, manifest.json and its checkpoint ({model} is the "
        "model's name); an existing run there is never overwritten: a new run takes dir-2, "
        "dir-3, ...; relative to the working directory");
    add("output.checkpoint_steps", ConfigType::Int, "0",
        "Also write the checkpoint every this many steps; 0: at the end of each epoch only").min = 0;
    return v;
  }();
  return k;
}

const char* config_type_name(ConfigType t) {
  switch (t) {
    case ConfigType::Bool: return "a boolean";
    case ConfigType::Int: return "an integer";
    case ConfigType::Float: return "a number";
    case ConfigType::String: return "a string";
    case ConfigType::StringList: return "an array of strings";
    case ConfigType::Bytes:
      return "a size in bytes (an integer, or a string like \"512MiB\"), or a fraction of the "
             "device (a number in (0, 1] or a string like \"80%\")";
    case ConfigType::Options: return "a table of plugin tables";
  }
  return "?";
}

// ---- values ----

namespace {

using OptionMap = std::map<std::string, std::map<std::string, std::string>>;
using Value = std::variant<bool, int64_t, double, std::string, std::vector<std::string>, OptionMap>;

const ConfigKey* find_key(std::string_view path) {
  for (const auto& k : Config::keys())
    if (k.path == path) return &k;
  return nullptr;
}

bool is_section(std::string_view path) {
  const std::string prefix = std::string(path) + ".";
  for (const auto& k : Config::keys())
    if (k.path.rfind(prefix, 0) == 0) return true;
  return false;
}

using toml_util::where;
const char* node_type_name(const toml::node& n) { return toml_util::type_name(n); }

std::string known_in(std::string_view section) {
  std::string list;
  const std::string prefix = section.empty() ? "" : std::string(section) + ".";
  std::vector<std::string> seen;
  for (const auto& k : Config::keys()) {
    if (k.path.rfind(prefix, 0) != 0) continue;
    std::string rest = k.path.substr(prefix.size());
    rest = rest.substr(0, rest.find('.'));
    if (std::find(seen.begin(), seen.end(), rest) != seen.end()) continue;
    seen.push_back(rest);
    list += (list.empty() ? "" : ", ") + rest;
  }
  return list;
}

// "512MiB" -> bytes; false if it is not a size.
bool parse_bytes(std::string s, uint64_t& out) {
  s.erase(std::remove_if(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); }),
          s.end());
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return false;
  double num;
  try {
    num = std::stod(s.substr(0, i));
  } catch (...) {
    return false;
  }
  std::string unit = s.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> units[] = {
      {"", 1},           {"b", 1},          {"kb", 1e3},        {"mb", 1e6},
      {"gb", 1e9},       {"tb", 1e12},      {"kib", 1024.0},    {"mib", 1048576.0},
      {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [name, mult] : units) {
    if (unit == name) {
      const double v = num * mult;
      if (!(v >= 0) || v > 1.8e19) return false;
      out = static_cast<uint64_t>(std::llround(v));
      return true;
    }
  }
  return false;
}

std::string scalar_text(const toml::node& n) {
  if (auto s = n.value<std::string>(); s && n.is_string()) return *s;
  std::ostringstream os;
  if (n.is_integer()) os << *n.value<int64_t>();
  else if (n.is_floating_point()) os << *n.value<double>();
  else if (n.is_boolean()) os << (*n.value<bool>() ? "true" : "false");
  return os.str();
}

// Converts and checks one value against its key. Returns "" or the problem (without location).
std::string convert(const ConfigKey& k, const toml::node& n, Value& out) {
  const std::string got = std::string(", got ") + node_type_name(n);
  switch (k.type) {
    case ConfigType::Bool:
      if (!n.is_boolean()) return std::string("expected ") + config_type_name(k.type) + got;
      out = *n.value<bool>();
      return "";
    case ConfigType::Int: {
      if (!n.is_integer()) return std::string("expected ") + config_type_name(k.type) + got;
      const int64_t v = *n.value<int64_t>();
      if (v < k.min || v > k.max) {
        std::ostringstream os;
        os << "expected an integer";
        if (k.min != INT64_MIN && k.max != INT64_MAX) os << " in " << k.min << ".." << k.max;
        else if (k.min != INT64_MIN) os << " >= " << k.min;
        else os << " <= " << k.max;
        os << ", got " << v;
        return os.str();
      }
      out = v;
      return "";
    }
    case ConfigType::Float: {
      if (!n.is_number()) return std::string("expected ") + config_type_name(k.type) + got;
      const double v = *n.value<double>();
      if (!(v >= k.fmin && v <= k.fmax)) {
        std::ostringstream os;
        os << "expected a number in " << k.fmin << ".." << k.fmax << ", got " << v;
        return os.str();
      }
      out = v;
      return "";
    }
    case ConfigType::String: {
      if (!n.is_string()) return std::string("expected ") + config_type_name(k.type) + got;
      const std::string v = *n.value<std::string>();
      if (!k.choices.empty() && std::find(k.choices.begin(), k.choices.end(), v) == k.choices.end()) {
        std::string list;
        for (const auto& c : k.choices) list += (list.empty() ? "" : ", ") + c;
        return "expected one of " + list + ", got \"" + v + "\"";
      }
      out = v;
      return "";
    }
    case ConfigType::StringList: {
      const toml::array* a = n.as_array();
      if (!a) return std::string("expected ") + config_type_name(k.type) + got;
      std::vector<std::string> v;
      for (size_t i = 0; i < a->size(); ++i) {
        const toml::node& e = *a->get(i);
        if (!e.is_string())
          return "expected an array of strings, element " + std::to_string(i) + " is " +
                 node_type_name(e);
        v.push_back(*e.value<std::string>());
      }
      out = v;
      return "";
    }
    case ConfigType::Bytes: {
      uint64_t b = 0;
      if (n.is_integer()) {
        const int64_t v = *n.value<int64_t>();
        if (v < 0) return "expected a size >= 0, got " + std::to_string(v);
        b = static_cast<uint64_t>(v);
      } else if (n.is_floating_point()) {
        const double f = *n.value<double>();
        if (!(f > 0 && f <= 1))
          return "expected a fraction of the device in (0, 1] (or a size in bytes), got " +
                 scalar_text(n);
        out = f;
        return "";
      } else if (n.is_string()) {
        const std::string text = *n.value<std::string>();
        if (!text.empty() && text.back() == '%') {
          char* end = nullptr;
          const double pct = std::strtod(text.c_str(), &end);
          if (end != text.c_str() + text.size() - 1 || !(pct > 0 && pct <= 100))
            return "expected a percentage in (0%, 100%], got \"" + text + "\"";
          out = pct / 100.0;
          return "";
        }
        if (!parse_bytes(text, b))
          return "expected a size like 512MiB, 2GB or 1048576, or a fraction like \"80%\", got \"" +
                 text + "\"";
      } else {
        return std::string("expected ") + config_type_name(k.type) + got;
      }
      out = static_cast<int64_t>(b);
      return "";
    }
    case ConfigType::Options: {
      const toml::table* t = n.as_table();
      if (!t) return std::string("expected ") + config_type_name(k.type) + got;
      OptionMap m;
      for (const auto& [plugin, sub] : *t) {
        const toml::table* st = sub.as_table();
        if (!st)
          return "plugins.options." + std::string(plugin.str()) +
                 ": expected a table of options, got " + node_type_name(sub);
        auto& opts = m[std::string(plugin.str())];
        for (const auto& [key, val] : *st) {
          if (!(val.is_string() || val.is_integer() || val.is_floating_point() || val.is_boolean()))
            return "plugins.options." + std::string(plugin.str()) + "." + std::string(key.str()) +
                   ": expected a string, number or boolean, got " + node_type_name(val);
          opts[std::string(key.str())] = scalar_text(val);
        }
      }
      out = m;
      return "";
    }
  }
  return "unhandled type";
}

}  // namespace

// ---- Config ----

struct Config::Impl {
  std::map<std::string, Value> values;
  std::map<std::string, std::string> origins;
  std::string source;

  void apply(const ConfigKey& k, Value v, const std::string& origin) {
    if (k.type == ConfigType::Options) {
      // Options merge table by table: a file and several --set may each add some.
      auto& cur = std::get<OptionMap>(values[k.path]);
      for (auto& [plugin, opts] : std::get<OptionMap>(v))
        for (auto& [key, val] : opts) cur[plugin][key] = val;
    } else {
      values[k.path] = std::move(v);
    }
    origins[k.path] = origin;
  }

  // Walks a parsed table, collecting every problem as "where: key: problem".
  void walk(const toml::table& t, const std::string& prefix, const std::string& fallback,
            std::vector<std::string>& errors) {
    for (const auto& [key, node] : t) {
      const std::string path = prefix.empty() ? std::string(key.str()) : prefix + "." + std::string(key.str());
      const std::string loc = where(key.source(), fallback);
      if (const ConfigKey* k = find_key(path)) {
        Value v;
        const std::string problem = convert(*k, node, v);
        if (!problem.empty())
          errors.push_back(where(node.source(), fallback) + ": " + path + ": " + problem);
        else
          apply(*k, std::move(v), loc);
        continue;
      }
      if (is_section(path)) {
        if (const toml::table* sub = node.as_table()) {
          walk(*sub, path, fallback, errors);
        } else {
          errors.push_back(where(node.source(), fallback) + ": " + path +
                           ": expected a table (section [" + path + "]), got " +
                           node_type_name(node));
        }
        continue;
      }
      const std::string known = known_in(prefix);
      errors.push_back(loc + ": unknown key '" + path + "'" +
                       (prefix.empty() ? " (known sections: " : " (known keys in [" + prefix + "]: ") +
                       known + ")");
    }
  }
};

Config::Config() : impl_(std::make_unique<Impl>()) {
  for (const auto& k : keys()) {
    if (k.type == ConfigType::Options) {
      impl_->values[k.path] = OptionMap{};
      impl_->origins[k.path] = "default";
      continue;
    }
    toml::table t = toml::parse("v = " + k.default_value);
    Value v;
    const std::string problem = convert(k, *t.get("v"), v);
    if (!problem.empty()) throw ConfigError("built-in default of " + k.path + ": " + problem);
    impl_->values[k.path] = std::move(v);
    impl_->origins[k.path] = "default";
  }
}

Config::~Config() = default;
Config::Config(const Config& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
Config& Config::operator=(const Config& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;

Config Config::parse(std::string_view text, const std::string& source) {
  Config c;
  c.impl_->source = source;
  toml::table t;
  try {
    t = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(where(e.source(), source) + ": TOML syntax error: " +
                      std::string(e.description()));
  }
  std::vector<std::string> errors;
  c.impl_->walk(t, "", source, errors);
  if (!errors.empty()) {
    std::string msg;
    for (const auto& e : errors) msg += (msg.empty() ? "" : "\n") + e;
    throw ConfigError(msg);
  }
  return c;
}

Config Config::load(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(path + ": cannot open the config file");
  std::ostringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path);
}

void Config::set(std::string_view assignment) {
  const std::string what = "--set " + std::string(assignment);
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos)
    throw ConfigError(what + ": expected key=value, e.g. --set backend.name=cpu");
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
    return s;
  };
  const std::string path = trim(std::string(assignment.substr(0, eq)));
  const std::string text = trim(std::string(assignment.substr(eq + 1)));
  if (path.empty()) throw ConfigError(what + ": empty key");
  // The value as TOML; a bare word that is not TOML is a string.
  toml::table t;
  try {
    t = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    t = toml::table{};
    t.insert("v", text);
  }
  const toml::node& node = *t.get("v");

  constexpr std::string_view kOptions = "plugins.options.";
  if (path.rfind(kOptions, 0) == 0) {
    const std::string rest = path.substr(kOptions.size());
    const auto dot = rest.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == rest.size())
      throw ConfigError(what + ": expected plugins.options.<plugin>.<option>=value");
    if (!(node.is_string() || node.is_integer() || node.is_floating_point() || node.is_boolean()))
      throw ConfigError(what + ": expected a string, number or boolean, got " + node_type_name(node));
    OptionMap m;
    m[rest.substr(0, dot)][rest.substr(dot + 1)] = scalar_text(node);
    impl_->apply(*find_key("plugins.options"), m, what);
    return;
  }
  const ConfigKey* k = find_key(path);
  if (!k) {
    const auto dot = path.rfind('.');
    const std::string section = dot == std::string::npos ? "" : path.substr(0, dot);
    throw ConfigError(what + ": unknown key '" + path + "'" +
                      (is_section(section) ? " (known keys in [" + section + "]: " + known_in(section) + ")"
                                           : " (known sections: " + known_in("") + ")"));
  }
  Value v;
  const std::string problem = convert(*k, node, v);
  if (!problem.empty()) throw ConfigError(what + ": " + path + ": " + problem);
  impl_->apply(*k, std::move(v), what);
}

namespace {
template <class T>
const T& get_as(const std::map<std::string, Value>& values, std::string_view path, const char* want) {
  auto it = values.find(std::string(path));
  if (it == values.end()) throw ConfigError("no config key '" + std::string(path) + "'");
  if (const T* p = std::get_if<T>(&it->second)) return *p;
  throw ConfigError("config key '" + std::string(path) + "' is not " + want);
}
}  // namespace

bool Config::get_bool(std::string_view p) const { return get_as<bool>(impl_->values, p, "a boolean"); }
int64_t Config::get_int(std::string_view p) const { return get_as<int64_t>(impl_->values, p, "an integer"); }
double Config::get_float(std::string_view p) const { return get_as<double>(impl_->values, p, "a number"); }
std::string Config::get_string(std::string_view p) const {
  return get_as<std::string>(impl_->values, p, "a string");
}
std::vector<std::string> Config::get_strings(std::string_view p) const {
  return get_as<std::vector<std::string>>(impl_->values, p, "an array of strings");
}
uint64_t Config::get_bytes(std::string_view p) const {
  auto it = impl_->values.find(std::string(p));
  if (it != impl_->values.end() && std::holds_alternative<double>(it->second)) return 0;
  return static_cast<uint64_t>(get_as<int64_t>(impl_->values, p, "a size"));
}
double Config::get_fraction(std::string_view p) const {
  auto it = impl_->values.find(std::string(p));
  if (it == impl_->values.end()) throw ConfigError("no config key '" + std::string(p) + "'");
  const double* f = std::get_if<double>(&it->second);
  return f ? *f : 0.0;
}
std::map<std::string, std::map<std::string, std::string>> Config::plugin_options() const {
  return get_as<OptionMap>(impl_->values, "plugins.options", "a table of options");
}

std::string Config::origin(std::string_view path) const {
  auto it = impl_->origins.find(std::string(path));
  return it == impl_->origins.end() ? "" : it->second;
}

const std::string& Config::source() const { return impl_->source; }

std::string Config::dump() const {
  toml::table root;
  auto section_of = [&](const std::string& path) -> std::pair<toml::table*, std::string> {
    toml::table* t = &root;
    std::string rest = path;
    for (auto dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
      const std::string part = rest.substr(0, dot);
      if (!t->contains(part)) t->insert(part, toml::table{});
      t = t->get(part)->as_table();
      rest = rest.substr(dot + 1);
    }
    return {t, rest};
  };
  for (const auto& k : keys()) {
    auto [t, leaf] = section_of(k.path);
    const Value& v = impl_->values.at(k.path);
    std::visit(
        [&, t = t, leaf = leaf](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, std::vector<std::string>>) {
            toml::array a;
            for (const auto& s : x) a.push_back(s);
            t->insert(leaf, a);
          } else if constexpr (std::is_same_v<X, OptionMap>) {
            toml::table opts;
            for (const auto& [plugin, kv] : x) {
              toml::table pt;
              for (const auto& [key, val] : kv) {
                // Values were TOML text; keep their type when it parses back.
                try {
                  toml::table one = toml::parse("v = " + val);
                  pt.insert(key, *one.get("v"));
                } catch (...) {
                  pt.insert(key, val);
                }
              }
              opts.insert(plugin, pt);
            }
            t->insert(leaf, opts);
          } else {
            t->insert(leaf, x);
          }
        },
        v);
  }
  std::ostringstream os;
  os << root << "\n";
  return os.str();
}

}  // namespace plexus
