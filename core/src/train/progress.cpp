#include "plexus/progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace plexus {

namespace {

constexpr double kBarInterval = 0.1;  // seconds between redraws: ~10 per second
constexpr int kBarWidth = 24;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string loss_text(double loss) {
  return fmt("%.4f", loss);
}
std::string loss_acc(std::string_view what, double loss, double acc) {
  return std::string(what) + " loss " + loss_text(loss) + " acc " + format_accuracy(acc);
}

}  // namespace

ProgressMode resolve_progress_mode(ProgressMode mode) {
  if (mode != ProgressMode::Auto) return mode;
  const char* term = std::getenv("TERM");
  const bool dumb = term && std::strcmp(term, "dumb") == 0;
  return ::isatty(::fileno(stdout)) && !dumb ? ProgressMode::Bar : ProgressMode::Plain;
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds >= 1e9) return "--:--";
  const long long s = std::llround(seconds);
  const long long h = s / 3600, m = (s / 60) % 60, sec = s % 60;
  char buf[48];
  if (h > 0)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", h, m, sec);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", m, sec);
  return buf;
}

std::string format_accuracy(double fraction) { return fmt("%.2f", fraction * 100.0) + "%"; }

std::string format_rate(double v) {
  if (!std::isfinite(v) || v < 0) return "-";
  if (v < 10) return fmt("%.2f", v);
  if (v < 100) return fmt("%.1f", v);
  if (v < 1e4) return fmt("%.0f", v);
  if (v < 1e6) return fmt("%.1fk", v / 1e3);
  return fmt("%.2fM", v / 1e6);
}

Progress::Progress(std::ostream& os, ProgressMode mode, Clock clock)
    : os_(os), mode_(resolve_progress_mode(mode)), clock_(std::move(clock)) {
  if (!clock_) {
    const auto origin = std::chrono::steady_clock::now();
    clock_ = [origin] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - origin).count();
    };
  }
}

double Progress::now() const {
  return clock_();
}

void Progress::start_epoch(int epoch, int epochs, int64_t steps) {
  epoch_ = epoch;
  epochs_ = epochs;
  steps_ = steps;
  step_ = images_ = 0;
  loss_ = accuracy_ = 0;
  epoch_start_ = last_update_ = now();
  last_draw_ = -1;
  last_decile_ = 0;
}

std::string Progress::status_text(bool with_bar) const {
  const double elapsed = last_update_ - epoch_start_;
  const double rate = elapsed > 0 ? static_cast<double>(images_) / elapsed : -1;
  // The mean time per step so far, times the steps left.
  const double eta = step_ > 0 ? elapsed / static_cast<double>(step_) *
                                     static_cast<double>(std::max<int64_t>(steps_ - step_, 0))
                               : -1;
  const double frac =
      steps_ > 0 ? std::clamp(static_cast<double>(step_) / static_cast<double>(steps_), 0.0, 1.0)
                 : 0.0;
  std::string s = "epoch " + std::to_string(epoch_) + "/" + std::to_string(epochs_) + " ";
  if (with_bar) {
    const int full = static_cast<int>(frac * kBarWidth);
    s += '[';
    s.append(static_cast<size_t>(full), '=');
    if (full < kBarWidth) {
      s += '>';
      s.append(static_cast<size_t>(kBarWidth - full - 1), ' ');
    }
    s += "] ";
  }
  char pct[16];
  std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(frac * 100.0));
  s += pct;
  s += " " + std::to_string(step_) + "/" + std::to_string(steps_);
  s += " loss " + loss_text(loss_) + " acc " + format_accuracy(accuracy_);
  s += " " + format_rate(rate) + " img/s";
  s += " ETA " + format_duration(eta);
  return s;
}

void Progress::draw_bar() {
  const std::string s = status_text(true);
  os_ << '\r' << s;
  // Blank out what a longer previous line left behind.
  if (s.size() < bar_len_) os_ << std::string(bar_len_ - s.size(), ' ');
  os_ << std::flush;
  bar_len_ = std::max(bar_len_, s.size());
}

void Progress::print_line(const std::string& line) {
  if (bar_len_ > 0) {
    // Overwrite the bar with the line, then move on.
    os_ << '\r' << line;
    if (line.size() < bar_len_) os_ << std::string(bar_len_ - line.size(), ' ');
    bar_len_ = 0;
  } else {
    os_ << line;
  }
  os_ << '\n' << std::flush;
}

void Progress::update(int64_t step, int64_t images, double loss, double accuracy) {
  if (mode_ == ProgressMode::None) return;
  step_ = step;
  images_ = images;
  loss_ = loss;
  accuracy_ = accuracy;
  const double t = now();
  last_update_ = t;
  const bool last = step >= steps_;
  if (mode_ == ProgressMode::Bar) {
    if (last || last_draw_ < 0 || t - last_draw_ >= kBarInterval) {
      last_draw_ = t;
      draw_bar();
    }
    return;
  }
  // Plain: one line each time a 10% boundary is crossed (steps_ < 10 prints at every step that
  // crosses one), and always the last step.
  const int decile =
      steps_ > 0 ? static_cast<int>(std::min<int64_t>(step, steps_) * 10 / steps_) : 10;
  if (decile > last_decile_ || (last && last_decile_ < 10)) {
    last_decile_ = last ? 10 : decile;
    print_line(status_text(false));
  }
}

void Progress::end_epoch(const EpochResult& r) {
  if (mode_ == ProgressMode::None) return;
  const double seconds = r.seconds ? *r.seconds : now() - epoch_start_;
  double rate = -1;
  if (r.images_per_s) {
    rate = *r.images_per_s;
  } else if (last_update_ > epoch_start_) {
    rate = static_cast<double>(images_) / (last_update_ - epoch_start_);
  }
  std::string s = "epoch " + std::to_string(epoch_) + "/" + std::to_string(epochs_) + ": " +
                  loss_acc("train", r.train_loss, r.train_accuracy);
  if (r.test_loss && r.test_accuracy)
    s += ", " + loss_acc("test", *r.test_loss, *r.test_accuracy);
  else if (r.test_loss)
    s += ", test loss " + loss_text(*r.test_loss);
  s += ", " + format_duration(seconds);
  if (rate >= 0) s += ", " + format_rate(rate) + " img/s";
  print_line(s);
}

void Progress::note(std::string_view line) {
  if (mode_ == ProgressMode::None) return;
  const bool redraw = bar_len_ > 0;
  print_line(std::string(line));
  if (redraw) draw_bar();
}

void Progress::finish(const RunSummary& sum) {
  if (mode_ == ProgressMode::None) return;
  std::string s = "done: " + std::to_string(sum.epochs) + (sum.epochs == 1 ? " epoch" : " epochs") +
                  " in " + format_duration(sum.seconds);
  if (sum.images_per_s) s += " (" + format_rate(*sum.images_per_s) + " img/s)";
  std::string parts;
  if (sum.train_loss && sum.train_accuracy)
    parts += loss_acc("train", *sum.train_loss, *sum.train_accuracy);
  if (sum.test_loss && sum.test_accuracy)
    parts += (parts.empty() ? "" : ", ") + loss_acc("test", *sum.test_loss, *sum.test_accuracy);
  if (!parts.empty()) s += ": " + parts;
  print_line(s);
}

}  // namespace plexus
