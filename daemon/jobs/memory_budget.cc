#include "jobs/memory_budget.h"

#include <algorithm>
#include <thread>

namespace spdl::jobs {
namespace {
std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }
}  // namespace

Result<MemoryBudget::Lease> MemoryBudget::ReserveScratch(uint64_t bytes, const std::string& what,
                                                         std::chrono::milliseconds wait) {
  auto refuse = [&](const char* why) -> Status {
    return ResourceExhausted(what + ": decoding it needs about " + MiB(bytes) + " of memory, " + why +
                             " (memory_budget_bytes " + MiB(limit()) + ": " + MiB(slots_.load()) + " in job slots, " +
                             MiB(scratch_.load()) + " in other decodes and decoded-sample caches)");
  };
  if (bytes > limit()) return refuse("more than the daemon's whole memory budget");
  const auto deadline = std::chrono::steady_clock::now() + wait;
  auto pause = std::chrono::milliseconds(2);
  for (;;) {
    uint64_t held = scratch_.load();
    while (slots_.load() + streams_.load() + held + bytes <= limit()) {
      if (scratch_.compare_exchange_weak(held, held + bytes)) return Lease(this, bytes);
    }
    if (std::chrono::steady_clock::now() >= deadline) return refuse("more than is free now");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
}

bool MemoryBudget::TryChargeStreams(uint64_t bytes) {
  uint64_t held = streams_.load();
  while (slots_.load() + scratch_.load() + held + bytes <= limit()) {
    if (streams_.compare_exchange_weak(held, held + bytes)) return true;
  }
  return false;
}

Result<MemoryBudget::Lease> MemoryBudget::TryReserve(uint64_t bytes, uint64_t keep_free) {
  uint64_t held = scratch_.load();
  while (slots_.load() + streams_.load() + held + bytes + keep_free <= limit()) {
    if (scratch_.compare_exchange_weak(held, held + bytes)) return Lease(this, bytes);
  }
  return ResourceExhausted("no room in the memory budget for " + MiB(bytes) + " (memory_budget_bytes " + MiB(limit()) +
                           ", " + MiB(keep_free) + " kept free)");
}

}  // namespace spdl::jobs
