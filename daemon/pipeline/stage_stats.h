// StageStats: the figures of one pipeline stage (read, decode, ...): tasks, failures, a task-time
// histogram, and the waits and occupancy of the bounded queue in front of the stage. Updated by
// many worker threads at once with relaxed atomics (lock-free) and read as a consistent-enough
// snapshot by the control thread.
//
// The histogram has fixed log-scale buckets: 4 per power of two from 2 µs to ~9 min, so a
// percentile is exact to within ~19 % (the width of a bucket), whatever the distribution.
// A "window" figure is the difference of two snapshots (see StageWindow).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace spdl::pipeline {

enum class StageKind { kCpu, kIo };
const char* StageKindName(StageKind kind);  // "cpu" or "io"

inline constexpr int kHistogramBuckets = 4 * 28;  // 4 per octave from 2 µs; the last one is open

struct StageSnapshot {
  std::string name;
  StageKind kind = StageKind::kCpu;
  uint32_t concurrency = 0;     // most tasks of the stage running at once
  uint32_t queue_capacity = 0;  // bound of the queue in front of the stage (0: automatic, see StageOptions)
  uint64_t queue_length = 0;    // rows waiting to start here now, queued or handed to the pool
                                // (<= queue_capacity when set)
  uint64_t running = 0;         // tasks running now, and rows done here waiting for room in the
                                // next queue
  uint64_t tasks = 0;           // tasks finished, failed ones included
  uint64_t failures = 0;
  double busy_seconds = 0;      // task time summed over workers
  double put_wait_seconds = 0;  // rows finished here waited this long for room in the next queue
  double get_wait_seconds = 0;  // rows waited this long in this stage's queue to be picked up
  std::array<uint64_t, kHistogramBuckets> histogram{};  // task times

  // Average task time and percentile (q in 0..1) in seconds; 0 with no tasks.
  double AvgSeconds() const { return tasks ? busy_seconds / static_cast<double>(tasks) : 0; }
  double PercentileSeconds(double q) const;
};

// `now` minus `before` (counters and histogram); the gauges (queue_length, running) are `now`'s.
StageSnapshot Difference(const StageSnapshot& now, const StageSnapshot& before);

class StageStats {
 public:
  StageStats(std::string name, StageKind kind, uint32_t concurrency, uint32_t queue_capacity)
      : name_(std::move(name)), kind_(kind), concurrency_(concurrency), queue_capacity_(queue_capacity) {}
  StageStats(const StageStats&) = delete;
  StageStats& operator=(const StageStats&) = delete;

  // Records one finished task that took `nanos` of a worker's time.
  void Record(uint64_t nanos, bool ok) {
    tasks_.fetch_add(1, std::memory_order_relaxed);
    if (!ok) failures_.fetch_add(1, std::memory_order_relaxed);
    busy_ns_.fetch_add(nanos, std::memory_order_relaxed);
    histogram_[Bucket(nanos)].fetch_add(1, std::memory_order_relaxed);
  }
  void AddPutWait(uint64_t nanos) { put_wait_ns_.fetch_add(nanos, std::memory_order_relaxed); }
  void AddGetWait(uint64_t nanos) { get_wait_ns_.fetch_add(nanos, std::memory_order_relaxed); }
  void SetGauges(uint64_t queue_length, uint64_t running) {
    queue_length_.store(queue_length, std::memory_order_relaxed);
    running_.store(running, std::memory_order_relaxed);
  }
  StageSnapshot Snapshot() const;
  const std::string& name() const { return name_; }
  StageKind kind() const { return kind_; }

  // The histogram bucket of a task time, and a bucket's upper bound in nanoseconds.
  static int Bucket(uint64_t nanos);
  static double BucketUpperNanos(int bucket);

 private:
  const std::string name_;
  const StageKind kind_;
  const uint32_t concurrency_;
  const uint32_t queue_capacity_;
  std::atomic<uint64_t> tasks_{0};
  std::atomic<uint64_t> failures_{0};
  std::atomic<uint64_t> busy_ns_{0};
  std::atomic<uint64_t> put_wait_ns_{0};
  std::atomic<uint64_t> get_wait_ns_{0};
  std::atomic<uint64_t> queue_length_{0};
  std::atomic<uint64_t> running_{0};
  std::array<std::atomic<uint64_t>, kHistogramBuckets> histogram_{};
};

}  // namespace spdl::pipeline
