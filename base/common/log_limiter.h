// LogLimiter: rate-limits log lines per kind of event, so a flood of the same error (a client
// sending garbage in a loop, a failing accept) costs a few lines, not millions. Each kind may log
// `burst` lines per `window`; the first line allowed after some were dropped says how many.
//
//   uint64_t dropped = 0;
//   if (limiter.Allow("bad frame", &dropped)) spdlog::warn("...{}", LogLimiter::Note(dropped));
//
// Thread-safe (one mutex): workers and the control thread may share one limiter. Owned by the
// component that logs (the daemon hands one to the control server); no global state.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace spdl {

class LogLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogLimiter(int burst = 5, Clock::duration window = std::chrono::seconds(10));

  // Whether a line of `kind` may be logged at `now`. When it may, *dropped (if given) receives the
  // number of lines of this kind refused since the last one allowed.
  bool Allow(std::string_view kind, uint64_t* dropped = nullptr, Clock::time_point now = Clock::now());

  // " (N similar lines suppressed)" for N > 0, else "".
  static std::string Note(uint64_t dropped);

 private:
  struct Kind {
    Clock::time_point window_start{};
    int used = 0;
    uint64_t dropped = 0;
  };
  const int burst_;
  const Clock::duration window_;
  std::mutex mu_;
  std::map<std::string, Kind, std::less<>> kinds_;  // guarded by mu_
};

}  // namespace spdl
