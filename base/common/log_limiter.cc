#include "common/log_limiter.h"

namespace spdl {

LogLimiter::LogLimiter(int burst, Clock::duration window) : burst_(burst), window_(window) {}

bool LogLimiter::Allow(std::string_view kind, uint64_t* dropped, Clock::time_point now) {
  std::lock_guard lock(mu_);
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) {
    if (kinds_.size() >= 1024) kinds_.clear();  // kinds are a small fixed set; never grow without bound
    it = kinds_.emplace(std::string(kind), Kind{now, 0, 0}).first;
  }
  Kind& k = it->second;
  if (now - k.window_start >= window_) {
    k.window_start = now;
    k.used = 0;
  }
  if (k.used >= burst_) {
    ++k.dropped;
    return false;
  }
  ++k.used;
  if (dropped) *dropped = k.dropped;
  k.dropped = 0;
  return true;
}

std::string LogLimiter::Note(uint64_t dropped) {
  if (dropped == 0) return "";
  return " (" + std::to_string(dropped) + " similar line" + (dropped == 1 ? "" : "s") + " suppressed)";
}

}  // namespace spdl
