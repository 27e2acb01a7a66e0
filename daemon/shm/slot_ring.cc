#include "shm/slot_ring.h"

#include <algorithm>
#include <cassert>
#include <string>
#include <utility>
#include <vector>

namespace spdl::shm {

const char* SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "free";
    case SlotState::kFilling:
      return "filling";
    case SlotState::kReady:
      return "ready";
    case SlotState::kLeased:
      return "leased";
  }
  return "unknown";
}

SlotRing::SlotRing(uint32_t num_slots) : SlotRing(num_slots, num_slots) {}

SlotRing::SlotRing(uint32_t num_slots, uint32_t initial_slots, std::function<bool(uint32_t slot)> prepare,
                   std::function<void(uint32_t slot)> discard)
    : num_slots_(num_slots),
      adaptive_(initial_slots < num_slots),
      prepare_(std::move(prepare)),
      discard_(std::move(discard)),
      slots_(num_slots),
      active_(std::clamp<uint32_t>(initial_slots, 1, num_slots)) {
  assert(num_slots > 0);
  for (uint32_t i = 0; i < active_; ++i) free_.push_back(i);
}

uint32_t SlotRing::active_slots() const {
  std::lock_guard lock(mu_);
  return active_;
}

Status SlotRing::CheckRange(uint32_t slot, const char* op) const {
  if (slot < num_slots_) return Status::Ok();
  return InvalidArgument(std::string(op) + " of slot " + std::to_string(slot) + ": out of range (the ring has " +
                         std::to_string(num_slots_) + " slots)");
}

void SlotRing::FreeLocked(uint32_t slot) {
  slots_[slot] = Slot{};
  free_.push_back(slot);
  free_cv_.notify_one();
}

void SlotRing::SkipAbandonedLocked() {
  while (!abandoned_.empty() && *abandoned_.begin() == next_deliver_) {
    abandoned_.erase(abandoned_.begin());
    ++next_deliver_;
  }
}

std::optional<SlotRing::Acquired> SlotRing::TryAcquire() {
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    if (adaptive_ && active_ < num_slots_ && std::none_of(slots_.begin(), slots_.begin() + active_, [](const Slot& s) {
          return s.state == SlotState::kFilling;
        })) {
      starved_at_ = releases_;  // the pipeline has nothing to fill and no slot to fill
    }
    return std::nullopt;
  }
  const uint32_t slot = free_.front();
  free_.pop_front();
  const uint64_t seq = next_seq_++;
  slots_[slot] = Slot{SlotState::kFilling, seq, 0};
  return Acquired{slot, seq};
}

Status SlotRing::MarkReady(uint32_t slot) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "MarkReady"));
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (s.state != SlotState::kFilling) {
    return FailedPrecondition("MarkReady of slot " + std::to_string(slot) + ": the slot is " + SlotStateName(s.state) +
                              ", not filling");
  }
  s.state = SlotState::kReady;
  ready_.emplace(s.seq, slot);
  return Status::Ok();
}

Status SlotRing::Abandon(uint32_t slot) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "Abandon"));
  std::lock_guard lock(mu_);
  Slot& s = slots_[slot];
  if (s.state != SlotState::kFilling) {
    return FailedPrecondition("Abandon of slot " + std::to_string(slot) + ": the slot is " + SlotStateName(s.state) +
                              ", not filling");
  }
  abandoned_.insert(s.seq);
  SkipAbandonedLocked();
  FreeLocked(slot);
  return Status::Ok();
}

std::optional<SlotRing::Lease> SlotRing::TakeNextReady() {
  std::lock_guard lock(mu_);
  SkipAbandonedLocked();
  auto it = ready_.find(next_deliver_);
  if (it == ready_.end()) return std::nullopt;
  const uint32_t slot = it->second;
  ready_.erase(it);
  Slot& s = slots_[slot];
  s.state = SlotState::kLeased;
  s.generation = next_generation_++;
  ++next_deliver_;
  SkipAbandonedLocked();
  GrowIfAllLeasedLocked();
  return Lease{slot, s.seq, s.generation};
}

std::optional<SlotRing::Lease> SlotRing::TakeFirstReady(
    const std::function<bool(uint32_t slot, uint64_t seq)>& eligible) {
  // The predicate runs without mu_ held (it takes its caller's own lock: holding ours around it
  // would order the two locks against the producers' order). A ready slot stays ready until the
  // consumer — the only caller of the Take* functions — takes it, so the snapshot stays valid.
  std::vector<std::pair<uint64_t, uint32_t>> candidates;
  {
    std::lock_guard lock(mu_);
    SkipAbandonedLocked();
    candidates.assign(ready_.begin(), ready_.end());
  }
  for (const auto& [seq, slot] : candidates) {
    if (!eligible(slot, seq)) continue;
    std::lock_guard lock(mu_);
    auto it = ready_.find(seq);
    if (it == ready_.end() || it->second != slot) return std::nullopt;  // not the consumer's own snapshot
    ready_.erase(it);
    Slot& s = slots_[slot];
    s.state = SlotState::kLeased;
    s.generation = next_generation_++;
    if (seq == next_deliver_) {
      ++next_deliver_;
    } else {
      abandoned_.insert(seq);  // delivered early: in-order delivery must not wait for it
    }
    SkipAbandonedLocked();
    GrowIfAllLeasedLocked();
    return Lease{slot, seq, s.generation};
  }
  return std::nullopt;
}

Status SlotRing::Release(uint32_t slot, uint64_t generation) {
  SPDL_RETURN_IF_ERROR(CheckRange(slot, "release"));
  std::lock_guard lock(mu_);
  const Slot& s = slots_[slot];
  const std::string what = "release of slot " + std::to_string(slot) + " generation " + std::to_string(generation);
  if (s.state != SlotState::kLeased) {
    return InvalidArgument(what + ": the slot is " + SlotStateName(s.state) +
                           ", not leased (a duplicate or stale release?)");
  }
  if (s.generation != generation) {
    return InvalidArgument(what + ": the slot's current lease has generation " + std::to_string(s.generation) +
                           " (a stale release?)");
  }
  // Warm reuse: with no other slot free, this one is the next to be filled, so its pages stay and
  // are written over in place (giving them back would cost a fault and a page clear per 4 KiB as
  // the next batch is written: ~8 % of the daemon's CPU on the benchmark). With a free slot
  // already waiting, this one would sit unused for a batch or more: its pages go back.
  if (discard_ && !free_.empty()) discard_(slot);
  FreeLocked(slot);
  ++releases_;
  if (starved_at_ && releases_ - *starved_at_ <= kStarvedWindow && ready_.empty() &&
      std::none_of(slots_.begin(), slots_.begin() + active_,
                   [](const Slot& x) { return x.state == SlotState::kLeased; })) {
    // The consumer is about to wait, and the pipeline was recently idle for lack of a slot: one more.
    GrowLocked();
  }
  return Status::Ok();
}

void SlotRing::GrowLocked() {
  if (!adaptive_ || growth_failed_ || active_ >= num_slots_) return;
  starved_at_.reset();
  if (prepare_ && !prepare_(active_)) {
    growth_failed_ = true;
    return;
  }
  free_.push_back(active_++);
  free_cv_.notify_one();
}

void SlotRing::GrowIfAllLeasedLocked() {
  if (std::all_of(slots_.begin(), slots_.begin() + active_,
                  [](const Slot& x) { return x.state == SlotState::kLeased; })) {
    GrowLocked();
  }
}

uint32_t SlotRing::ReleaseAll() {
  std::lock_guard lock(mu_);
  uint32_t n = 0;
  for (uint32_t i = 0; i < num_slots_; ++i) {
    if (slots_[i].state == SlotState::kLeased) {
      if (discard_) discard_(i);
      FreeLocked(i);
      ++n;
    }
  }
  return n;
}

SlotRing::Counts SlotRing::counts() const {
  std::lock_guard lock(mu_);
  Counts c{0, 0, 0, 0};
  for (uint32_t i = 0; i < active_; ++i) {
    const Slot& s = slots_[i];
    switch (s.state) {
      case SlotState::kFree:
        ++c.free;
        break;
      case SlotState::kFilling:
        ++c.filling;
        break;
      case SlotState::kReady:
        ++c.ready;
        break;
      case SlotState::kLeased:
        ++c.leased;
        break;
    }
  }
  return c;
}

SlotState SlotRing::state(uint32_t slot) const {
  assert(slot < num_slots_);
  std::lock_guard lock(mu_);
  return slots_[slot].state;
}

bool SlotRing::WaitForFree(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  free_cv_.wait_for(lock, timeout, [&] { return closed_ || !free_.empty(); });
  return !closed_ && !free_.empty();
}

void SlotRing::Close() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
  }
  free_cv_.notify_all();
}

}  // namespace spdl::shm
