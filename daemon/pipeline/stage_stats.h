// StageStats: counters of one pipeline stage (read, decode, ...), updated by many worker threads
// at once with relaxed atomics and read as a consistent-enough snapshot by the control thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace spdl::pipeline {

struct StageSnapshot {
  std::string name;
  uint64_t tasks = 0;     // tasks finished, failed ones included
  uint64_t failures = 0;
  double busy_seconds = 0;  // summed over workers
};

class StageStats {
 public:
  explicit StageStats(std::string name) : name_(std::move(name)) {}
  // Only for building a container of stages before any worker uses them.
  StageStats(StageStats&& o) noexcept
      : name_(o.name_), tasks_(o.tasks_.load()), failures_(o.failures_.load()), busy_ns_(o.busy_ns_.load()) {}
  // Records one finished task that took `nanos` of a worker's time.
  void Record(uint64_t nanos, bool ok) {
    tasks_.fetch_add(1, std::memory_order_relaxed);
    if (!ok) failures_.fetch_add(1, std::memory_order_relaxed);
    busy_ns_.fetch_add(nanos, std::memory_order_relaxed);
  }
  StageSnapshot Snapshot() const {
    return {name_, tasks_.load(std::memory_order_relaxed), failures_.load(std::memory_order_relaxed),
            static_cast<double>(busy_ns_.load(std::memory_order_relaxed)) * 1e-9};
  }
  const std::string& name() const { return name_; }

 private:
  const std::string name_;
  std::atomic<uint64_t> tasks_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> busy_ns_{0};
};

}  // namespace spdl::pipeline
