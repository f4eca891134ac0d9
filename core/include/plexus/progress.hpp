// The training progress display: per epoch, loss, accuracy, images/s and ETA. On a terminal a
// single bar line redrawn in place (\r), at most ~10 times a second; elsewhere (a log file, a
// pipe, CI) plain lines at every 10% of the epoch, never \r.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

namespace plexus {

enum class ProgressMode {
  Auto,   // Bar when stdout is a terminal (and TERM is not "dumb"), Plain otherwise
  Bar,    // one line redrawn with \r
  Plain,  // whole lines at every 10% of an epoch
  None    // prints nothing
};

// `mode` with Auto decided by isatty(fileno(stdout)) and $TERM; other modes unchanged.
ProgressMode resolve_progress_mode(ProgressMode mode);

// Whole seconds as "m:ss" under an hour, "h:mm:ss" from an hour ("0:05", "1:05", "1:02:03");
// "--:--" for a negative, non-finite or absurd (>= 1e9 s) value, as an ETA may be at first.
std::string format_duration(double seconds);
// A rate with 3-4 significant digits: "4.25", "42.5", "2345", "12.3k", "1.23M"; "-" when
// negative or non-finite.
std::string format_rate(double per_second);
// An accuracy (a fraction) as a percentage with two decimals: "91.47%".
std::string format_accuracy(double fraction);

// What end_epoch() reports. Accuracies are fractions in [0, 1].
struct EpochResult {
  double train_loss = 0;
  double train_accuracy = 0;
  std::optional<double> test_loss, test_accuracy;  // absent when the epoch had no evaluation
  std::optional<double> seconds;                   // absent: measured from start_epoch()
  std::optional<double> images_per_s;              // absent: from the last update()
};

// What finish() reports.
struct RunSummary {
  int epochs = 0;  // epochs run
  double seconds = 0;
  std::optional<double> images_per_s;
  std::optional<double> train_loss, train_accuracy, test_loss, test_accuracy;
};

class Progress {
 public:
  // Seconds from any fixed origin, never decreasing. Tests pass a fake clock.
  using Clock = std::function<double()>;

  // Prints to `os` in `mode` (Auto resolved at once); `clock` defaults to std::steady_clock.
  Progress(std::ostream& os, ProgressMode mode, Clock clock = {});

  // The resolved mode (never Auto).
  ProgressMode mode() const { return mode_; }

  // Starts epoch `epoch` (1-based) of `epochs`, which will run `steps` steps.
  void start_epoch(int epoch, int epochs, int64_t steps);
  // After step `step` (1-based, <= steps) of the epoch: `images` seen so far in the epoch, and
  // the running mean loss and accuracy over them. Draws when due (throttled in Bar mode, at each
  // 10% boundary in Plain mode, always at the last step).
  void update(int64_t step, int64_t images, double loss, double accuracy);
  // Prints the end-of-epoch line (train and test loss/accuracy, epoch time, rate), replacing the
  // bar in Bar mode.
  void end_epoch(const EpochResult& result);
  // Prints a line of its own (a checkpoint saved, a warning) without garbling the bar.
  void note(std::string_view line);
  // Prints the final summary line of the run.
  void finish(const RunSummary& summary);

 private:
  double now() const;
  std::string status_text(bool with_bar) const;
  void draw_bar();
  void print_line(const std::string& line);  // ends a pending bar line first

  std::ostream& os_;
  ProgressMode mode_;
  Clock clock_;
  int epoch_ = 0, epochs_ = 0;
  int64_t steps_ = 0, step_ = 0, images_ = 0;
  double loss_ = 0, accuracy_ = 0;
  double epoch_start_ = 0, last_update_ = 0, last_draw_ = -1;
  int last_decile_ = 0;
  size_t bar_len_ = 0;  // length of the bar line on screen; 0 when none is pending
};

}  // namespace plexus
