// plexus_compare_runs RUN_A RUN_B [--rtol R] [--atol A] [--skip-tensors PREFIX,...]
//
// Holds two training runs to each other: the same steps with losses equal within tolerance
// (metrics.jsonl), and every tensor of their final checkpoints equal within tolerance. The
// data-parallel and pipeline tests use it to check N ranks against one process. Prints the
// largest differences; exit 0 when within tolerance, 1 when not, 2 for unreadable runs.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "plexus/checkpoint.hpp"
#include "plexus/json.hpp"
#include "plexus/sdk/dtype.hpp"

using namespace plexus;

namespace {

std::vector<double> step_losses(const std::string& dir) {
  const std::string path = dir + "/metrics.jsonl";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<double> losses;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const JsonValue v = parse_json(line, "line " + std::to_string(n) + " of " + path);
    if (v.at("type").string != "step") continue;
    const JsonValue& l = v.at("loss");
    losses.push_back(l.is_null() ? NAN : l.number);
  }
  return losses;
}

double as_double(const CheckpointTensor& t, size_t i) {
  switch (t.dtype) {
    case PLX_F32: {
      float f;
      std::memcpy(&f, t.data.data() + i * 4, 4);
      return f;
    }
    case PLX_F64: {
      double d;
      std::memcpy(&d, t.data.data() + i * 8, 8);
      return d;
    }
    case PLX_I64: {
      int64_t x;
      std::memcpy(&x, t.data.data() + i * 8, 8);
      return static_cast<double>(x);
    }
    case PLX_I32: {
      int32_t x;
      std::memcpy(&x, t.data.data() + i * 4, 4);
      return x;
    }
    default: throw std::runtime_error("tensor '" + t.name + "': dtype not compared");
  }
}

bool close(double a, double b, double rtol, double atol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::abs(a - b) <= atol + rtol * std::abs(b);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> dirs, skip;
  double rtol = 1e-4, atol = 1e-6;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--rtol" || a == "--atol" || a == "--skip-tensors") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--rtol") rtol = std::stod(v);
      else if (a == "--atol") atol = std::stod(v);
      else {
        std::stringstream ss(v);
        for (std::string p; std::getline(ss, p, ',');) skip.push_back(p);
      }
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "plexus_compare_runs: unknown option " << a << "\n";
      return 2;
    } else {
      dirs.push_back(a);
    }
  }
  if (dirs.size() != 2) {
    std::cerr << "usage: plexus_compare_runs RUN_A RUN_B [--rtol R] [--atol A] [--skip-tensors P,...]\n";
    return 2;
  }
  bool ok = true;
  try {
    const std::vector<double> la = step_losses(dirs[0]), lb = step_losses(dirs[1]);
    if (la.size() != lb.size() || la.empty()) {
      std::cout << "steps differ: " << la.size() << " in " << dirs[0] << ", " << lb.size() << " in "
                << dirs[1] << "\n";
      return 1;
    }
    double worst = 0;
    size_t at = 0;
    for (size_t i = 0; i < la.size(); ++i) {
      const double diff = std::abs(la[i] - lb[i]);  // 0 is 0 of any tolerance, even of 0
      const double d = diff == 0 ? 0 : diff / (atol + rtol * std::abs(lb[i]));
      if (!close(la[i], lb[i], rtol, atol)) ok = false;
      if (d > worst || std::isnan(d)) worst = d, at = i;
    }
    std::printf("losses: %zu steps, largest difference at step %zu: %.9g vs %.9g (%.3g of the tolerance)\n",
                la.size(), at + 1, la[at], lb[at], worst);

    const Checkpoint ca = read_checkpoint(dirs[0] + "/checkpoint.plxckpt");
    const Checkpoint cb = read_checkpoint(dirs[1] + "/checkpoint.plxckpt");
    for (const char* key : {"step", "epoch", "batch"}) {
      const auto a = ca.meta.find(key), b = cb.meta.find(key);
      if (a == ca.meta.end() || b == cb.meta.end() || a->second != b->second) {
        std::cout << "checkpoint " << key << " differs\n";
        ok = false;
      }
    }
    int compared = 0;
    for (const CheckpointTensor& ta : ca.tensors) {
      bool skipped = false;
      for (const auto& p : skip) skipped |= ta.name.rfind(p, 0) == 0;
      if (skipped) continue;
      const CheckpointTensor* tb = cb.find(ta.name);
      if (!tb || tb->dtype != ta.dtype || tb->shape != ta.shape) {
        std::cout << "tensor '" << ta.name << "': missing or of another type in " << dirs[1] << "\n";
        ok = false;
        continue;
      }
      const size_t n = ta.data.size() / dtype_size(ta.dtype);
      double tw = 0;
      size_t ti = 0;
      for (size_t i = 0; i < n; ++i) {
        const double x = as_double(ta, i), y = as_double(*tb, i);
        const double diff = std::abs(x - y);
        const double d = diff == 0 ? 0 : diff / (atol + rtol * std::abs(y));
        if (!close(x, y, rtol, atol)) ok = false;
        if (d > tw) tw = d, ti = i;
      }
      if (tw > 1)
        std::printf("tensor '%s': element %zu differs: %.9g vs %.9g (%.3g of the tolerance)\n",
                    ta.name.c_str(), ti, as_double(ta, ti), as_double(*tb, ti), tw);
      ++compared;
    }
    if (cb.tensors.size() != ca.tensors.size()) {
      std::cout << "the checkpoints hold " << ca.tensors.size() << " and " << cb.tensors.size() << " tensors\n";
      ok = false;
    }
    std::printf("tensors: %d compared\n", compared);
  } catch (const std::exception& e) {
    std::cerr << "plexus_compare_runs: " << e.what() << "\n";
    return 2;
  }
  std::cout << (ok ? "runs agree" : "runs DIFFER") << " (rtol " << rtol << ", atol " << atol << ")\n";
  return ok ? 0 : 1;
}
