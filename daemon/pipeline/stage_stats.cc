#include "pipeline/stage_stats.h"

#include <bit>
#include <cmath>

namespace spdl::pipeline {

const char* StageKindName(StageKind kind) { return kind == StageKind::kIo ? "io" : "cpu"; }

int StageStats::Bucket(uint64_t nanos) {
  const uint64_t us4 = nanos / 250;                          // quarter microseconds: 4 = 1 µs
  if (us4 < 8) return 0;                                     // below 2 µs
  const int log = 63 - std::countl_zero(us4);                // floor(log2), >= 3
  const int sub = static_cast<int>((us4 >> (log - 2)) & 3);  // the next two bits: quarter of the octave
  const int b = (log - 3) * 4 + sub + 1;
  return b < kHistogramBuckets ? b : kHistogramBuckets - 1;
}

double StageStats::BucketUpperNanos(int bucket) {
  if (bucket <= 0) return 2000;
  const int log = (bucket - 1) / 4 + 3;
  const int sub = (bucket - 1) % 4;
  return std::ldexp(1.0 + (sub + 1) / 4.0, log) * 250.0;
}

double StageSnapshot::PercentileSeconds(double q) const {
  uint64_t total = 0;
  for (uint64_t c : histogram) total += c;
  if (total == 0) return 0;
  const double rank = q * static_cast<double>(total);
  uint64_t seen = 0;
  for (int b = 0; b < kHistogramBuckets; ++b) {
    seen += histogram[b];
    if (static_cast<double>(seen) >= rank && histogram[b] > 0) return StageStats::BucketUpperNanos(b) * 1e-9;
  }
  return StageStats::BucketUpperNanos(kHistogramBuckets - 1) * 1e-9;
}

StageSnapshot StageStats::Snapshot() const {
  StageSnapshot s;
  s.name = name_;
  s.kind = kind_;
  s.concurrency = concurrency_;
  s.queue_capacity = queue_capacity_;
  s.queue_length = queue_length_.load(std::memory_order_relaxed);
  s.running = running_.load(std::memory_order_relaxed);
  s.tasks = tasks_.load(std::memory_order_relaxed);
  s.failures = failures_.load(std::memory_order_relaxed);
  s.busy_seconds = static_cast<double>(busy_ns_.load(std::memory_order_relaxed)) * 1e-9;
  s.put_wait_seconds = static_cast<double>(put_wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
  s.get_wait_seconds = static_cast<double>(get_wait_ns_.load(std::memory_order_relaxed)) * 1e-9;
  for (int b = 0; b < kHistogramBuckets; ++b) s.histogram[b] = histogram_[b].load(std::memory_order_relaxed);
  return s;
}

StageSnapshot Difference(const StageSnapshot& now, const StageSnapshot& before) {
  StageSnapshot d = now;
  d.tasks -= std::min(now.tasks, before.tasks);
  d.failures -= std::min(now.failures, before.failures);
  d.busy_seconds = std::max(0.0, now.busy_seconds - before.busy_seconds);
  d.put_wait_seconds = std::max(0.0, now.put_wait_seconds - before.put_wait_seconds);
  d.get_wait_seconds = std::max(0.0, now.get_wait_seconds - before.get_wait_seconds);
  for (int b = 0; b < kHistogramBuckets; ++b) d.histogram[b] -= std::min(now.histogram[b], before.histogram[b]);
  return d;
}

}  // namespace spdl::pipeline
