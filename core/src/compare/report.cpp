// `plexus compare`'s outputs: the terminal table, JSON, CSV and the PNG chart (compare.hpp).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "plexus/compare.hpp"
#include "plexus/error.hpp"
#include "plexus/json.hpp"
#include "../text.hpp"

namespace fs = std::filesystem;

namespace plexus {

namespace {

std::string num(double v, int precision = 3) {
  std::ostringstream os;
  os << std::setprecision(precision) << v;
  return os.str();
}

std::string ms_text(double ms) {
  if (ms < 0) return "-";
  std::ostringstream os;
  if (ms < 1)
    os << std::setprecision(3) << ms;  // 0.000213: three figures however short
  else
    os << std::fixed << std::setprecision(ms < 100 ? 3 : 1) << ms;
  return os.str();
}

std::string fit(std::string s, size_t width) {
  if (s.size() > width) s = s.substr(0, width - 2) + "..";
  return s;
}

bool compared(const CompareRow& r) {
  return r.status == CompareRow::Status::Pass || r.status == CompareRow::Status::Fail;
}

std::string label(const CompareRow& r) {
  if (r.section == "ops") return r.name + " " + r.dtype + (r.pass == "backward" ? " bwd" : "");
  return r.section + " " + r.name;
}

}  // namespace

std::string compare_table_header(const CompareReport& r) {
  std::ostringstream os;
  os << "plexus compare: a = " << r.a << " (" << r.device_a << "), b = " << r.b << " ("
     << r.device_b << ")";
  if (r.a == r.b) os << "; only one backend here, so it is compared with itself";
  os << "\n"
     << "errors of b against a; NMSE = sum (b - a)^2 / sum a^2; speed-up = a ms / b ms (median)\n\n";
  os << std::left << std::setw(6) << "sect" << std::setw(24) << "item" << std::setw(9) << "pass"
     << std::setw(6) << "dtype" << std::setw(36) << "what" << std::right << std::setw(10)
     << "max abs" << std::setw(10) << "max rel" << std::setw(10) << "NMSE" << std::setw(9) << "tol"
     << "  " << std::left << std::setw(17) << "result" << std::right << std::setw(11)
     << (r.a + " ms") << std::setw(11) << (r.b + " ms") << std::setw(9) << "speed-up" << "\n";
  return os.str();
}

std::string compare_table_row(const CompareReport&, const CompareRow& row) {
  std::ostringstream os;
  const bool c = compared(row);
  os << std::left << std::setw(6) << row.section << std::setw(24) << fit(row.name, 23)
     << std::setw(9) << row.pass << std::setw(6) << row.dtype << std::setw(36) << fit(row.what, 35)
     << std::right << std::setw(10) << (c ? num(row.err.max_abs) : "-") << std::setw(10)
     << (c ? num(row.err.max_rel) : "-") << std::setw(10) << (c ? num(row.err.nmse) : "-")
     << std::setw(9) << num(row.tolerance, 2) << "  " << std::left << std::setw(17)
     << status_name(row.status) << std::right << std::setw(11) << ms_text(row.ms_a)
     << std::setw(11) << ms_text(row.ms_b) << std::setw(9)
     << (row.speedup() > 0 ? num(row.speedup()) + "x" : "-") << "\n";
  if (row.status != CompareRow::Status::Pass && !row.note.empty())
    os << "      " << row.note << "\n";
  return os.str();
}

std::string compare_summary(const CompareReport& r) {
  std::ostringstream os;
  os << "\n" << r.rows.size() << " rows: " << r.passed() << " passed, " << r.failed() << " failed, "
     << r.unsupported() << " unsupported on one side\n";
  // The geometric mean speed-up of the timed op rows, forward and backward apart.
  for (const char* pass : {"forward", "backward", "update"}) {
    double log_sum = 0;
    int n = 0;
    for (const CompareRow& row : r.rows)
      if (row.section == "ops" && row.pass == pass && row.speedup() > 0) {
        log_sum += std::log(row.speedup());
        ++n;
      }
    if (n) os << "ops " << pass << ": geometric mean speed-up of " << r.b << " over " << r.a << " "
              << num(std::exp(log_sum / n)) << "x over " << n << " rows\n";
  }
  if (!r.curves.a.empty() && !r.curves.b.empty())
    os << "train: " << r.curves.a.size() << " steps, " << ms_text(r.curves.ms_a) << " ms/step on "
       << r.a << ", " << ms_text(r.curves.ms_b) << " ms/step on " << r.b << "\n";
  if (r.failed()) {
    os << "FAILED:";
    for (const CompareRow& row : r.rows)
      if (row.failed()) os << " " << row.section << "/" << label(row);
    os << "\n";
  }
  return os.str();
}

std::string compare_json(const CompareReport& r) {
  JsonArray rows;
  for (const CompareRow& row : r.rows) {
    JsonObject o;
    o.add("section", row.section).add("item", row.name).add("pass", row.pass).add("dtype", row.dtype);
    o.add("what", row.what).add("ops", row.ops_run).add("status", status_name(row.status));
    o.add("failed", row.failed()).add("note", row.note);
    if (compared(row)) {
      o.add("max_abs", row.err.max_abs).add("max_rel", row.err.max_rel).add("nmse", row.err.nmse);
      o.add("nonfinite_mismatch", row.err.nonfinite_mismatch).add("elements", row.err.elements);
    }
    o.add("tolerance", row.tolerance);
    if (row.ms_a >= 0) o.add("ms_a", row.ms_a);
    if (row.ms_b >= 0) o.add("ms_b", row.ms_b);
    if (row.speedup() > 0) o.add("speedup", row.speedup());
    rows.push(o);
  }
  JsonObject covered;
  for (const auto& [op, dtypes] : r.ops_covered) {
    JsonArray d;
    for (const auto& x : dtypes) d.push(x);
    covered.add(op, d);
  }
  JsonObject top;
  top.add("a", r.a).add("b", r.b).add("device_a", r.device_a).add("device_b", r.device_b);
  top.add("suite", r.suite).add("model", r.model);
  top.add("passed", r.passed()).add("failed", r.failed()).add("unsupported", r.unsupported());
  top.add("rows", rows);
  if (!r.curves.a.empty() || !r.curves.b.empty()) {
    JsonArray a, b;
    for (double v : r.curves.a) a.push(v);
    for (double v : r.curves.b) b.push(v);
    JsonObject c;
    c.add("loss_a", a).add("loss_b", b).add("ms_per_step_a", r.curves.ms_a).add("ms_per_step_b", r.curves.ms_b);
    top.add("curves", c);
  }
  top.add("ops_covered", covered);
  return top.str();
}

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string csv_num(double v, bool present = true) {
  if (!present) return "";
  std::ostringstream os;
  os << std::setprecision(9) << v;
  return os.str();
}

}  // namespace

std::string compare_csv(const CompareReport& r) {
  std::ostringstream os;
  os << "section,item,pass,dtype,what,ops,status,max_abs,max_rel,nmse,nonfinite_mismatch,tolerance,"
     << "ms_" << r.a << ",ms_" << r.b << ",speedup,note\n";
  for (const CompareRow& row : r.rows) {
    const bool c = compared(row);
    os << csv_field(row.section) << ',' << csv_field(row.name) << ',' << row.pass << ','
       << row.dtype << ',' << csv_field(row.what) << ',' << csv_field(row.ops_run) << ','
       << csv_field(status_name(row.status)) << ',' << csv_num(row.err.max_abs, c) << ','
       << csv_num(row.err.max_rel, c) << ',' << csv_num(row.err.nmse, c) << ','
       << (c ? std::to_string(row.err.nonfinite_mismatch) : "") << ',' << csv_num(row.tolerance)
       << ',' << csv_num(row.ms_a, row.ms_a >= 0) << ',' << csv_num(row.ms_b, row.ms_b >= 0) << ','
       << csv_num(row.speedup(), row.speedup() > 0) << ',' << csv_field(row.note) << "\n";
  }
  return os.str();
}

std::string compare_curves_csv(const CompareReport& r) {
  if (r.curves.a.empty() && r.curves.b.empty()) return "";
  std::ostringstream os;
  os << "step,loss_" << r.a << ",loss_" << r.b << "\n";
  const size_t n = std::max(r.curves.a.size(), r.curves.b.size());
  for (size_t i = 0; i < n; ++i)
    os << i + 1 << ',' << csv_num(i < r.curves.a.size() ? r.curves.a[i] : 0, i < r.curves.a.size())
       << ',' << csv_num(i < r.curves.b.size() ? r.curves.b[i] : 0, i < r.curves.b.size()) << "\n";
  return os.str();
}

namespace {

// The gnuplot on the PATH, or "".
std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  for (const std::string& dir : text::split(path ? path : "/usr/bin:/bin", ':')) {
    const fs::path f = fs::path(dir) / "gnuplot";
    if (::access(f.c_str(), X_OK) == 0) return f.string();
  }
  return "";
}

std::string gp_string(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

}  // namespace

void write_compare_plot(const CompareReport& r, const std::string& png_path) {
  const std::string gnuplot = find_gnuplot();
  if (gnuplot.empty())
    throw Error("--plot " + png_path + ": gnuplot is not on the PATH (Debian: apt-get install gnuplot-nox)");
  std::vector<const CompareRow*> timed;
  for (const CompareRow& row : r.rows)
    if (row.speedup() > 0 && row.section != "train") timed.push_back(&row);
  const bool curves = !r.curves.a.empty() || !r.curves.b.empty();
  if (timed.empty() && !curves) throw Error("--plot " + png_path + ": nothing to draw (no timed rows, no loss curves)");

  const fs::path dir = fs::temp_directory_path() /
                       ("plexus-plot-" + std::to_string(::getpid()) + "-" +
                        std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::create_directories(dir);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{dir};
  {
    std::ofstream f(dir / "speedup.dat");
    for (size_t i = 0; i < timed.size(); ++i) {
      const CompareRow& row = *timed[i];
      std::string l = label(row);
      for (char& c : l)
        if (c == '"') c = '\'';
      // Green for a pass, red for a failure.
      f << i << " \"" << l << "\" " << row.speedup() << " " << (row.failed() ? 0xd62728 : 0x2ca02c) << "\n";
    }
  }
  if (curves) {
    std::ofstream f(dir / "curves.dat");
    const size_t n = std::max(r.curves.a.size(), r.curves.b.size());
    for (size_t i = 0; i < n; ++i)
      f << i + 1 << " " << (i < r.curves.a.size() ? num(r.curves.a[i], 9) : "NaN") << " "
        << (i < r.curves.b.size() ? num(r.curves.b[i], 9) : "NaN") << "\n";
  }
  const int panels = (timed.empty() ? 0 : 1) + (curves ? 1 : 0);
  const int width = std::max<int>(1000, static_cast<int>(timed.size()) * 12 + 160);
  const int height = panels == 2 ? 1100 : 600;
  std::ostringstream gp;
  gp << "set terminal pngcairo size " << width << "," << height << " font 'sans,9'\n"
     << "set output " << gp_string(png_path) << "\n"
     << "set datafile missing 'NaN'\n";
  if (panels == 2) gp << "set multiplot layout 2,1\n";
  if (!timed.empty()) {
    gp << "set title " << gp_string("speed-up of " + r.b + " (" + r.device_b + ") over " + r.a + " (" + r.device_a +
                                    "): " + r.a + " ms / " + r.b + " ms, median; red: failed its tolerance")
       << "\n"
       << "set logscale y 2\nset ylabel 'speed-up (log scale)'\nset grid ytics\n"
       << "set style fill solid 0.85 noborder\nset boxwidth 0.8\n"
       << "set xtics rotate by 90 right font ',7' nomirror\nset xrange [-1:" << timed.size() << "]\n"
       << "plot " << gp_string((dir / "speedup.dat").string())
       << " using 1:3:4:xtic(2) with boxes lc rgb variable notitle, 1 with lines lc rgb 'black' notitle\n"
       << "unset logscale y\nunset xtics\nset xtics autofreq\nunset xrange\n";
  }
  if (curves) {
    gp << "set title " << gp_string("training loss per step, " + r.model) << "\n"
       << "set xlabel 'step'\nset ylabel 'loss'\nset grid\nset key top right\n"
       << "plot " << gp_string((dir / "curves.dat").string()) << " using 1:2 with lines lw 2 title "
       << gp_string("a: " + r.a) << ", '' using 1:3 with lines lw 2 dt 2 title " << gp_string("b: " + r.b) << "\n";
  }
  if (panels == 2) gp << "unset multiplot\n";
  {
    std::ofstream f(dir / "plot.gp");
    f << gp.str();
  }
  const std::string cmd = "'" + gnuplot + "' '" + (dir / "plot.gp").string() + "' 2>'" + (dir / "err.txt").string() + "'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0 || !fs::exists(png_path)) {
    std::ifstream e(dir / "err.txt");
    std::stringstream ss;
    ss << e.rdbuf();
    throw Error("--plot " + png_path + ": gnuplot failed (exit " +
                std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : rc) + "): " + ss.str());
  }
}

}  // namespace plexus
