#include "pipeline/batch_pipeline.h"

#include <algorithm>

namespace spdl::pipeline {

BatchPipeline::BatchPipeline(Executor* executor, shm::SlotRing* ring, RowProcessor* processor,
                             EpochOrderFn order, PipelineOptions options, std::function<void()> notify,
                             std::weak_ptr<void> owner)
    : executor_(executor),
      ring_(ring),
      processor_(processor),
      order_fn_(std::move(order)),
      options_(options),
      notify_(std::move(notify)),
      owner_(std::move(owner)) {
  if (options_.resume) dispatch_epoch_ = options_.resume->epoch;
  for (auto& name : processor_->StageNames()) stages_.emplace_back(name);
}

BatchPipeline::EpochState& BatchPipeline::EpochLocked(uint32_t epoch) {
  auto it = epochs_.find(epoch);
  if (it != epochs_.end()) return it->second;
  EpochState st;
  st.order = order_fn_(epoch);
  st.full_size = st.order.size();
  if (options_.resume && options_.resume->epoch == epoch) {
    // Keep only the positions not yet delivered before the resume point.
    const ResumePoint& r = *options_.resume;
    std::vector<uint64_t> kept;
    std::vector<uint64_t> extras = r.extras;
    std::sort(extras.begin(), extras.end());
    for (uint64_t pos = r.prefix; pos < st.full_size; ++pos) {
      if (std::binary_search(extras.begin(), extras.end(), pos)) continue;
      kept.push_back(st.order[pos]);
      st.orig_pos.push_back(pos);
    }
    st.order = std::move(kept);
    st.carried = std::move(extras);
    st.batch_offset = r.next_batch;
    if (st.orig_pos.empty()) st.orig_pos.push_back(st.full_size);  // keep the mapping non-identity
  }
  const uint64_t n = st.order.size();
  const uint64_t b = options_.batch_size;
  st.batches = options_.drop_last ? n / b : (n + b - 1) / b;
  return epochs_.emplace(epoch, std::move(st)).first->second;
}

std::optional<uint64_t> BatchPipeline::TakeSpareLocked(uint32_t epoch, uint64_t taker_seq) {
  EpochState& st = EpochLocked(epoch);
  // A spare is the next sample not yet dispatched: later batches of the epoch shift by one, and
  // every good sample is still delivered exactly once.
  if (st.next >= st.order.size()) return std::nullopt;
  st.spare_taker[st.next] = taker_seq;
  const uint64_t spare = st.order[st.next++];
  if (st.next == st.order.size() && st.dispatched < st.batches) {
    // Spares used up the samples of batches not yet dispatched: the epoch ends with the batch
    // dispatched last. It cannot have been delivered yet (delivery is in order and the batch
    // taking this spare is still being filled), so its end-of-epoch mark is still seen.
    st.batches = st.dispatched;
    SlotMeta& last = slots_.at(st.last_slot).meta;
    last.last_in_epoch = true;
    last.last_in_job = options_.epochs != 0 && epoch + 1 == options_.epochs;
  }
  return spare;
}

void BatchPipeline::Pump() {
  struct Post {
    uint32_t slot;
    uint32_t epoch;
    std::vector<uint64_t> indices;
  };
  std::vector<Post> posts;
  {
    std::lock_guard lock(mu_);
    while (!done_dispatching_ && !cancelled_.load() && failure_.ok()) {
      EpochState& st = EpochLocked(dispatch_epoch_);
      if (st.dispatched >= st.batches || st.next >= st.order.size()) {
        // This epoch is fully dispatched: move on (or stop after the last epoch).
        if (options_.epochs != 0 && dispatch_epoch_ + 1 >= options_.epochs) {
          done_dispatching_ = true;
          break;
        }
        ++dispatch_epoch_;
        // Forget epochs that no in-flight batch still draws spares from.
        uint32_t oldest = dispatch_epoch_;
        for (auto& [slot, f] : slots_) oldest = std::min(oldest, f.meta.epoch);
        for (auto it = epochs_.begin(); it != epochs_.end() && it->first < oldest;) it = epochs_.erase(it);
        continue;
      }
      auto acquired = ring_->TryAcquire();
      if (!acquired) break;  // backpressure: no free slot
      InFlight f;
      f.meta.seq = acquired->seq;
      f.meta.epoch = dispatch_epoch_;
      f.meta.batch_in_epoch = st.batch_offset + st.dispatched++;
      st.last_slot = acquired->slot;
      st.batch_start[acquired->seq] = st.next;
      const size_t take = std::min<size_t>(options_.batch_size, st.order.size() - st.next);
      f.meta.indices.assign(st.order.begin() + static_cast<ptrdiff_t>(st.next),
                            st.order.begin() + static_cast<ptrdiff_t>(st.next + take));
      st.next += take;
      f.meta.rows = static_cast<uint32_t>(take);
      f.meta.last_in_epoch = st.dispatched == st.batches || st.next >= st.order.size();
      f.meta.last_in_job = f.meta.last_in_epoch && options_.epochs != 0 && dispatch_epoch_ + 1 == options_.epochs;
      f.ok.assign(take, 0);
      f.remaining = static_cast<uint32_t>(take);
      posts.push_back({acquired->slot, f.meta.epoch, f.meta.indices});
      slots_[acquired->slot] = std::move(f);
    }
  }
  // Post outside the lock: an inline executor runs the row at once.
  std::shared_ptr<void> owner = owner_.lock();
  for (auto& p : posts) {
    for (uint32_t row = 0; row < p.indices.size(); ++row) {
      in_flight_.fetch_add(1);
      executor_->Post([owner, this, slot = p.slot, row, index = p.indices[row], epoch = p.epoch] {
        RunRow(slot, row, index, epoch);
      });
    }
  }
}

void BatchPipeline::RunRow(uint32_t slot, uint32_t row, uint64_t index, uint32_t epoch) {
  bool good = false;
  uint64_t current = index;
  while (!cancelled_.load()) {
    Status s = processor_->Process(current, epoch, slot, row, stages_);
    if (s.ok()) {
      good = true;
      break;
    }
    if (options_.fail_on_error) {
      Fail(Status(s.code(), s.message() + " (on_error: fail)"));
      break;
    }
    std::lock_guard lock(mu_);
    InFlight& f = slots_.at(slot);
    ++epochs_.at(f.meta.epoch).skipped;
    skipped_total_.fetch_add(1);
    auto spare = TakeSpareLocked(f.meta.epoch, f.meta.seq);
    if (!spare) break;
    current = *spare;
    f.meta.indices[row] = current;
  }
  bool finished = false;
  {
    std::lock_guard lock(mu_);
    InFlight& f = slots_.at(slot);
    f.ok[row] = good ? 1 : 0;
    finished = --f.remaining == 0;
  }
  if (finished) FinishBatch(slot);
  in_flight_.fetch_sub(1);
}

void BatchPipeline::FinishBatch(uint32_t slot) {
  if (cancelled_.load()) {
    {
      std::lock_guard lock(mu_);
      slots_.erase(slot);
    }
    (void)ring_->Abandon(slot);
    notify_();
    return;
  }
  std::vector<std::pair<uint32_t, uint32_t>> moves;
  {
    std::lock_guard lock(mu_);
    InFlight& f = slots_.at(slot);
    // Pack good rows to the front (only when some row had no spare to replace it).
    uint32_t write = 0;
    std::vector<uint64_t> packed;
    for (uint32_t r = 0; r < f.ok.size(); ++r) {
      if (!f.ok[r]) continue;
      if (r != write) moves.emplace_back(r, write);
      packed.push_back(f.meta.indices[r]);
      ++write;
    }
    f.meta.indices = std::move(packed);
    f.meta.rows = write;
  }
  for (auto [from, to] : moves) processor_->MoveRow(slot, from, to);
  Status s = ring_->MarkReady(slot);
  (void)s;  // the slot was acquired by Pump() and is filling: cannot fail
  notify_();
}

void BatchPipeline::Cancel() { cancelled_.store(true); }

void BatchPipeline::Fail(Status status) {
  {
    std::lock_guard lock(mu_);
    if (failure_.ok()) failure_ = std::move(status);
  }
  cancelled_.store(true);
  notify_();
}

Status BatchPipeline::failure() const {
  std::lock_guard lock(mu_);
  return failure_;
}

bool BatchPipeline::all_dispatched() const {
  std::lock_guard lock(mu_);
  return done_dispatching_;
}

SlotMeta BatchPipeline::TakeMeta(uint32_t slot) {
  std::lock_guard lock(mu_);
  SlotMeta m = slots_.at(slot).meta;
  ResumePoint& r = m.resume;
  if (m.last_in_epoch) {
    r.epoch = m.epoch + 1;
    return m;
  }
  EpochState& st = epochs_.at(m.epoch);
  // Every position below P belongs to a batch up to this one: later batches start at or after P
  // and take spares only after they start. Spares at or above P taken by batches up to this one
  // are the extras.
  uint64_t p = st.next;
  for (auto it = st.batch_start.upper_bound(m.seq); it != st.batch_start.end(); ++it) p = std::min(p, it->second);
  st.batch_start.erase(st.batch_start.begin(), st.batch_start.upper_bound(m.seq));
  r.epoch = m.epoch;
  r.prefix = st.Orig(p);
  r.next_batch = m.batch_in_epoch + 1;
  for (auto it = st.spare_taker.lower_bound(p); it != st.spare_taker.end(); ++it) {
    if (it->second <= m.seq) r.extras.push_back(st.Orig(it->first));
  }
  for (uint64_t c : st.carried) {
    if (c >= r.prefix) r.extras.push_back(c);
  }
  std::sort(r.extras.begin(), r.extras.end());
  return m;
}

uint64_t BatchPipeline::EpochSkipped(uint32_t epoch) const {
  std::lock_guard lock(mu_);
  auto it = epochs_.find(epoch);
  return it == epochs_.end() ? 0 : it->second.skipped;
}

std::vector<StageSnapshot> BatchPipeline::StageSnapshots() const {
  std::vector<StageSnapshot> out;
  for (auto& s : stages_) out.push_back(s.Snapshot());
  return out;
}

}  // namespace spdl::pipeline
