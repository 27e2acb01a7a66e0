// SlotRing: the state machine of a job's N batch slots (bookkeeping only; the memory is a
// SharedRegion laid out by proto/shm_layout.h).
//
// The contract between the pipeline (producers) and the control thread (consumer):
//
//   free    -> filling  TryAcquire: a producer takes a free slot; the ring assigns it the next batch
//                       sequence number (0, 1, 2, ...).
//   filling -> ready    MarkReady: every row of the slot is written.
//   filling -> free     Abandon: the batch was cancelled or failed. Its sequence number is skipped:
//                       it is never delivered, and later batches are not held back by it.
//   ready   -> leased   TakeNextReady: strictly in sequence order. A later batch that is ready
//                       first waits until every earlier one was delivered or abandoned.
//                       (TakeFirstReady: the first ready one a predicate accepts, for completion order.)
//   leased  -> free     Release(slot, generation): the generation handed out with the lease must
//                       match, so a stale or duplicated release is refused and changes nothing.
//                       ReleaseAll frees every leased slot (the client went away).
//
// No free slot is the pipeline's backpressure: TryAcquire returns nullopt, WaitForFree blocks.
//
// Adaptive size (SlotRing(num_slots, initial_slots)): only the first `initial_slots` slots are
// used at first; the others stay inactive (never handed out, so their shared-memory pages are
// never touched and cost nothing). Release activates one more slot, up to num_slots, when both
// sides of the ring were waiting on each other: the pipeline found no free slot while it had
// nothing left to fill (no slot filling: its workers idle for lack of a slot) within the last
// kStarvedWindow releases, and this release leaves the consumer with nothing in hand and nothing
// ready (it is about to wait for data). A consumer slower than the pipeline never waits, and a
// pipeline slower than the consumer always has a slot filling: neither grows the ring. A lease
// that leaves the consumer holding every active slot also adds one (the consumer could not get
// another batch otherwise, where a fixed ring of num_slots would give it one). Slots are
// only ever added (a slot once touched stays paid for); which batch a slot holds never affects
// what the batch contains, so sequence numbers, delivery order and resume are the same at any size.
// Discard (SlotRing(num_slots, initial_slots, prepare, discard)): `discard`, when given, runs (under
// the ring's lock, after the release was accepted and before the slot can be taken again) for a
// released slot that will wait: one released while another slot is already free (that one is
// filled first), and every slot ReleaseAll frees; e.g. to give the slot's pages back while it
// waits. A slot released while no other is free is the next one filled and is not discarded
// (warm reuse: its pages are written over in place instead of faulting in again). So at most one
// free slot of a ring keeps its pages, besides abandoned ones.
// Generations are unique across the whole ring (a ring-wide counter bumped on every lease), so a
// release naming the right generation but the wrong slot is refused too.
//
// Thread safety: safe to share between threads (one internal mutex; no call blocks except
// WaitForFree). Neither copyable nor movable.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "common/status.h"

namespace spdl::shm {

enum class SlotState { kFree, kFilling, kReady, kLeased };

// "free", "filling", "ready" or "leased".
const char* SlotStateName(SlotState state);

class SlotRing {
 public:
  // All slots start free and active (a fixed-size ring). REQUIRES: num_slots > 0.
  explicit SlotRing(uint32_t num_slots);
  // An adaptive ring: `initial_slots` active slots (clamped to 1..num_slots), growing on demand
  // (see above) up to num_slots. `prepare`, when given, runs (under the ring's lock, on the thread
  // calling Release) before a slot becomes active, e.g. to reserve its memory; false keeps the
  // ring at its current size for good. `discard`, when given, runs (under the ring's lock, on the
  // thread releasing) for each slot ReleaseAll frees and each slot Release frees while another slot
  // is free (see above), before it can be acquired again.
  // REQUIRES: num_slots > 0.
  SlotRing(uint32_t num_slots, uint32_t initial_slots, std::function<bool(uint32_t slot)> prepare = nullptr,
           std::function<void(uint32_t slot)> discard = nullptr);
  SlotRing(const SlotRing&) = delete;
  SlotRing& operator=(const SlotRing&) = delete;

  struct Acquired {
    uint32_t slot;
    uint64_t seq;
  };
  // free -> filling: a free slot (the one freed longest ago) for the next sequence number, or
  // nullopt when none is free (backpressure). Not affected by Close().
  std::optional<Acquired> TryAcquire();

  // filling -> ready. Out of range -> kInvalidArgument; not filling -> kFailedPrecondition.
  Status MarkReady(uint32_t slot);

  // filling -> free; the slot's sequence number is never delivered (TakeNextReady skips it).
  // Out of range -> kInvalidArgument; not filling -> kFailedPrecondition.
  Status Abandon(uint32_t slot);

  struct Lease {
    uint32_t slot;
    uint64_t seq;
    uint64_t generation;  // pass back to Release
  };
  // ready -> leased for the slot holding the lowest undelivered (and not abandoned) sequence
  // number, if that slot is ready; nullopt otherwise (even when later batches are ready). May
  // activate a slot (adaptive ring: the consumer now holds every active one).
  std::optional<Lease> TakeNextReady();

  // Completion order: ready -> leased for the ready slot with the lowest sequence number that
  // `eligible(slot, seq)` accepts, even while earlier batches are still filling; TakeNextReady then
  // skips its sequence number, as an abandoned one. `eligible` runs without the ring's lock held
  // (it may take its own locks); it is called only for slots that were ready, and a slot it accepts
  // is taken: the caller must be the ring's only consumer. nullopt when no ready slot is accepted.
  std::optional<Lease> TakeFirstReady(const std::function<bool(uint32_t slot, uint64_t seq)>& eligible);

  // leased -> free. Out of range, not leased, or a generation other than the current lease's ->
  // kInvalidArgument saying which, and nothing changes. May activate one more slot (adaptive ring,
  // see above): active_slots() tells.
  Status Release(uint32_t slot, uint64_t generation);

  // Every leased slot -> free (the client is gone); returns how many were freed.
  uint32_t ReleaseAll();

  struct Counts {
    uint32_t free, filling, ready, leased;
  };
  // A consistent snapshot of how many active slots are in each state (inactive ones are not counted).
  Counts counts() const;

  // The state of one slot (for tests and stats). REQUIRES: slot < num_slots().
  SlotState state(uint32_t slot) const;

  uint32_t num_slots() const { return num_slots_; }

  // Slots in use so far (num_slots() for a fixed ring); only grows. Any thread.
  uint32_t active_slots() const;

  // Releases after which a starved pipeline still counts as a reason to grow.
  static constexpr uint64_t kStarvedWindow = 2;

  // Blocks until a slot is free, `timeout` passes, or Close() is called. Returns true if a slot was
  // free when it returned (another thread may still take it first: TryAcquire can return nullopt);
  // false on timeout or once closed.
  bool WaitForFree(std::chrono::milliseconds timeout);

  // Wakes every WaitForFree; from now on WaitForFree returns false at once. Idempotent.
  void Close();

 private:
  struct Slot {
    SlotState state = SlotState::kFree;
    uint64_t seq = 0;         // meaningful while filling, ready or leased
    uint64_t generation = 0;  // meaningful while leased
  };

  // Checks slot < num_slots_ for operation `op`.
  Status CheckRange(uint32_t slot, const char* op) const;
  // Moves a slot to free and wakes one waiter. REQUIRES: mu_ held.
  void FreeLocked(uint32_t slot);
  // Advances next_deliver_ past abandoned sequence numbers. REQUIRES: mu_ held.
  void SkipAbandonedLocked();
  // Activates one more slot (after prepare_), if the ring is adaptive and not at its size. REQUIRES: mu_ held.
  void GrowLocked();
  // GrowLocked when the consumer holds every active slot. REQUIRES: mu_ held.
  void GrowIfAllLeasedLocked();

  // Constant after construction.
  const uint32_t num_slots_;
  const bool adaptive_;
  const std::function<bool(uint32_t)> prepare_;
  const std::function<void(uint32_t)> discard_;

  mutable std::mutex mu_;
  std::condition_variable free_cv_;  // a slot became free, or closed_ was set (paired with mu_)

  // Guarded by mu_.
  std::vector<Slot> slots_;
  std::deque<uint32_t> free_;           // free slots, the longest-free first
  std::map<uint64_t, uint32_t> ready_;  // seq -> slot, for ready slots
  std::set<uint64_t> abandoned_;        // abandoned seqs, all >= next_deliver_
  uint64_t next_seq_ = 0;               // handed out by the next TryAcquire
  uint64_t next_deliver_ = 0;           // the lowest seq not yet delivered or skipped
  uint64_t next_generation_ = 1;        // handed out by the next lease
  bool closed_ = false;
  uint32_t active_;                     // slots [0, active_) are in use; the rest inactive
  bool growth_failed_ = false;          // prepare_ refused a slot: the ring stays as it is
  uint64_t releases_ = 0;               // Release calls so far
  std::optional<uint64_t> starved_at_;  // releases_ when TryAcquire last failed with nothing filling
};

}  // namespace spdl::shm
