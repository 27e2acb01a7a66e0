// MemoryBudget: the daemon's memory budget (memory_budget_bytes) as one account for the two things
// that spend it: the jobs' shared slot regions (admitted by JobRegistry) and the scratch a decode
// needs for a large image (reserved by the image decoder before it decodes, from the size in the
// header; and a job's cache of decoded samples, jobs/decoded_cache.h). A decode whose scratch does not fit waits a
// little for room, then is refused; one that could never fit is refused at once. So two 13000x13000 16-bit PNGs cost
// budget, not an OOM kill.
//
// Thread-safe: lock-free counters. Reservations and admissions race benignly: each checks the
// others' current total, so the sum can pass the limit only by what was reserved in the same instant.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace spdl::jobs {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  // The limit (memory_budget_bytes); SetLimit on reload.
  uint64_t limit() const { return limit_.load(); }
  void SetLimit(uint64_t limit) { limit_.store(limit); }
  // Slot bytes of live jobs, as the registry admits and returns them (it keeps its own total).
  void SetSlotBytes(uint64_t bytes) { slots_.store(bytes); }
  uint64_t scratch_bytes() const { return scratch_.load(); }
  // Bytes streams retain (streams/stream.h) and their producers' put buffers: charged when the
  // budget has room for them beside the slots and scratch (true), else nothing is charged (false).
  bool TryChargeStreams(uint64_t bytes);
  void ReleaseStreams(uint64_t bytes) { streams_.fetch_sub(bytes); }
  uint64_t stream_bytes() const { return streams_.load(); }

  // Scratch held until the lease is destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(MemoryBudget* b, uint64_t n) : b_(b), n_(n) {}
    Lease(Lease&& o) noexcept : b_(o.b_), n_(o.n_) { o.b_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept {
      if (this != &o) {
        Reset();
        b_ = o.b_;
        n_ = o.n_;
        o.b_ = nullptr;
      }
      return *this;
    }
    ~Lease() { Reset(); }
    uint64_t bytes() const { return b_ ? n_ : 0; }

   private:
    void Reset() {
      if (b_) b_->scratch_.fetch_sub(n_);
      b_ = nullptr;
    }
    MemoryBudget* b_ = nullptr;
    uint64_t n_ = 0;
  };

  // Reserves `bytes` of scratch for `what` (an image "PNG 13000x13000, 16-bit"). Waits up to
  // `wait` for room while slots and other decodes hold the budget. kResourceExhausted naming the
  // need and the budget when it does not fit (at once when it never could).
  Result<Lease> ReserveScratch(uint64_t bytes, const std::string& what,
                               std::chrono::milliseconds wait = std::chrono::milliseconds(5000));

  // Reserves `bytes` (as scratch, held until the lease is destroyed) only if, with them, at least
  // `keep_free` bytes of the budget stay free; never waits. For memory that is a convenience, not a
  // need (a job's cache of decoded samples): kResourceExhausted when it does not fit now.
  Result<Lease> TryReserve(uint64_t bytes, uint64_t keep_free);

 private:
  std::atomic<uint64_t> limit_;
  std::atomic<uint64_t> slots_{0};
  std::atomic<uint64_t> scratch_{0};
  std::atomic<uint64_t> streams_{0};
};

}  // namespace spdl::jobs
