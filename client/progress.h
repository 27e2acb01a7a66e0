// ProgressBar: spdl-client's one-line progress display on a terminal — epoch, a bar of the whole
// run (or of the epoch when the run is endless), samples/s, ETA — redrawn in place on stderr at
// most every 100 ms. Disabled (every call a no-op) when the stream is not a terminal or the
// caller turned it off (--json, --quiet). Not thread-safe: one thread draws.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace spdl::client {

struct ProgressState {
  uint32_t epoch = 0;           // the epoch being read (0-based)
  uint32_t epochs = 0;          // epochs asked for; 0 = until stopped
  uint64_t batch_in_epoch = 0;  // batches of this epoch delivered so far
  uint64_t batches_per_epoch = 0;
  uint64_t batches = 0;  // since the run started (the first may be a resumed epoch)
  uint64_t samples = 0;  // since the run started
  double seconds = 0;    // since the run started
  std::string note;      // e.g. "daemon draining, 12 s left"; empty = none
};

// The line for `s` in `columns` terminal columns (no control characters). Pure; tested.
std::string FormatProgress(const ProgressState& s, int columns);

class ProgressBar {
 public:
  // Enabled iff `enabled` and `out` is a terminal.
  ProgressBar(std::FILE* out, bool enabled);
  ~ProgressBar();  // Finish()
  bool enabled() const { return enabled_; }
  // Redraws (at most every 100 ms unless `force`).
  void Update(const ProgressState& s, bool force = false);
  // Erases the line so other output can be printed; the next Update draws it again.
  void Clear();
  // Leaves the last drawn line on screen and moves to the next line.
  void Finish();

 private:
  std::FILE* const out_;
  const bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace spdl::client
