#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace spdl::client {
namespace {

std::string Duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  char b[32];
  if (t >= 3600) {
    std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
  } else {
    std::snprintf(b, sizeof b, "%ld:%02ld", t / 60, t % 60);
  }
  return b;
}

}  // namespace

std::string FormatProgress(const ProgressState& s, int columns) {
  const double rate = s.seconds > 0 ? s.samples / s.seconds : 0.0;
  double fraction = -1;  // of the bar
  std::string eta;
  if (s.batches_per_epoch > 0) {
    const double in_epoch = std::min(1.0, double(s.batch_in_epoch) / double(s.batches_per_epoch));
    if (s.epochs > 0) {
      fraction = std::min(1.0, (s.epoch + in_epoch) / s.epochs);
      const double total = double(s.epochs) * s.batches_per_epoch;
      const double done = double(s.epoch) * s.batches_per_epoch + s.batch_in_epoch;
      const double per_batch = s.batches > 0 ? s.seconds / s.batches : 0;
      eta = " ETA " + (s.batches > 0 ? Duration((total - done) * per_batch) : std::string("?"));
    } else {
      fraction = in_epoch;
    }
  }
  char head[64], tail[96];
  if (s.epochs > 0) {
    std::snprintf(head, sizeof head, "epoch %u/%u ", s.epoch + 1, s.epochs);
  } else {
    std::snprintf(head, sizeof head, "epoch %u ", s.epoch + 1);
  }
  std::snprintf(tail, sizeof tail, " %3.0f%% %.0f samples/s%s", fraction >= 0 ? 100 * fraction : 0.0, rate,
                eta.c_str());
  std::string note = s.note.empty() ? "" : " (" + s.note + ")";
  const int fixed = static_cast<int>(std::string(head).size() + std::string(tail).size() + note.size()) + 2;
  const int width = std::clamp(columns - 1 - fixed, 0, 40);
  std::string bar;
  if (width >= 5) {
    const int filled = fraction >= 0 ? static_cast<int>(std::floor(fraction * width)) : 0;
    bar = "[" + std::string(filled, '#') + std::string(width - filled, '.') + "]";
  }
  std::string line = std::string(head) + bar + tail + note;
  if (columns > 1 && static_cast<int>(line.size()) > columns - 1) line.resize(columns - 1);
  return line;
}

ProgressBar::ProgressBar(std::FILE* out, bool enabled) : out_(out), enabled_(enabled && ::isatty(::fileno(out))) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(const ProgressState& s, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  winsize ws{};
  const int columns = ::ioctl(::fileno(out_), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : 80;
  std::fprintf(out_, "\r%s\x1b[K", FormatProgress(s, columns).c_str());
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::Clear() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(out_, "\r\x1b[K");
  std::fflush(out_);
  drawn_ = false;
}

void ProgressBar::Finish() {
  if (!enabled_ || !drawn_) return;
  std::fprintf(out_, "\n");
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace spdl::client
