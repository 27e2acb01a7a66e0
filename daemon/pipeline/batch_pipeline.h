// BatchPipeline: the engine that turns a job's sample order into filled slots.
//
// Contract between the parts:
//   - the sample order comes from an EpochOrderFn (a pure function of the epoch);
//   - a free slot of the SlotRing is taken for each batch (no free slot = backpressure: nothing is
//     dispatched until the control thread releases one and calls Pump() again);
//   - each row of the batch is one task on the shared Executor; the RowProcessor writes the sample
//     straight into its row of the slot (no collate copy);
//   - when every row is done the slot is marked ready and `notify` is called; the control thread
//     then takes ready slots from the ring in sequence order and asks meta(slot) what they hold.
// A failed sample (on_error: skip) is replaced by the next sample of the same epoch, so a batch keeps
// its shape; only when the epoch has no samples left does a batch come out short (its valid rows
// packed to the front). With on_error: fail the first failure fails the job.
//
// Threading: Pump(), Cancel() and the meta/EpochSkipped readers are called from the control thread;
// row tasks run on the executor; internal state is guarded by mu_. Every posted task holds a
// shared_ptr to `owner` (the job that owns this pipeline, its ring and its processor), so nothing a
// task touches is destroyed before the task ends.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/executor.h"
#include "pipeline/stage_stats.h"
#include "shm/slot_ring.h"

namespace spdl::pipeline {

// Produces one sample into one row of one slot. Called concurrently from many workers, each call for
// a distinct (slot, row). Records its per-stage timings in `stages` (indices it chose itself).
class RowProcessor {
 public:
  virtual ~RowProcessor() = default;
  // Names of the stages this processor records, in index order (e.g. {"read", "decode"}).
  virtual std::vector<std::string> StageNames() const = 0;
  // Writes sample `index` (of epoch `epoch`: random transforms draw from it) into `row` of `slot`.
  // A non-OK status means the sample is bad; the message must name the sample (e.g. its path).
  virtual Status Process(uint64_t index, uint32_t epoch, uint32_t slot, uint32_t row,
                         std::vector<StageStats>& stages) = 0;
  // Copies row `from` of `slot` over row `to` (to pack a short batch). REQUIRES: to < from.
  virtual void MoveRow(uint32_t slot, uint32_t from, uint32_t to) = 0;
};

using EpochOrderFn = std::function<std::vector<uint64_t>(uint64_t epoch)>;

// Where a job stands after a delivered batch, in terms of its epoch's sample order (positions into
// EpochOrderFn(epoch)): starting a pipeline from it delivers exactly the samples that were not yet
// delivered, in the same order, then the later epochs as if it had never stopped (exact when no
// sample fails after the point).
struct ResumePoint {
  uint32_t epoch = 0;
  uint64_t prefix = 0;               // every position below was delivered (or skipped as bad)
  std::vector<uint64_t> extras;      // positions >= prefix that were delivered too (spares)
  uint64_t next_batch = 0;           // batch_in_epoch of the next batch
};

struct PipelineOptions {
  uint32_t batch_size = 32;
  bool drop_last = false;        // drop an epoch's last, partial batch
  uint32_t epochs = 1;           // 0 = endless
  bool fail_on_error = false;    // on_error: fail
  std::optional<ResumePoint> resume;  // start from here instead of epoch 0
};

// What a ready slot holds. Written by the pipeline, read by the control thread after TakeNextReady.
struct SlotMeta {
  uint64_t seq = 0;
  uint32_t epoch = 0;
  uint64_t batch_in_epoch = 0;
  uint32_t rows = 0;                  // valid rows, packed to the front
  std::vector<uint64_t> indices;      // sample index per valid row
  bool last_in_epoch = false;
  bool last_in_job = false;
  ResumePoint resume;                 // where the job stands once this batch is delivered
};

class BatchPipeline {
 public:
  // *executor must outlive every posted task; *ring and *processor are kept alive by `owner`.
  // `notify` is called (from any thread) whenever a slot became ready or the job failed.
  BatchPipeline(Executor* executor, shm::SlotRing* ring, RowProcessor* processor, EpochOrderFn order,
                PipelineOptions options, std::function<void()> notify, std::weak_ptr<void> owner);

  // Dispatches a batch into every free slot, until the ring is full or the job's samples are
  // all dispatched. Cheap when there is nothing to do. Control thread only.
  void Pump();
  // Stops dispatching; rows not yet started are skipped and their slots abandoned.
  void Cancel();
  // Cancels and records `reason` as the job's failure (unless one is recorded already).
  void Abort(Status reason) { Fail(std::move(reason)); }
  bool cancelled() const { return cancelled_.load(); }
  // The first error under on_error: fail (OK otherwise).
  Status failure() const;
  // Every batch of the job has been dispatched.
  bool all_dispatched() const;

  // What a delivered slot holds, with its resume point. Call once per delivery, in delivery order.
  // REQUIRES: `slot` was returned by TakeNextReady and not yet released.
  SlotMeta TakeMeta(uint32_t slot);
  // Samples skipped so far in `epoch`.
  uint64_t EpochSkipped(uint32_t epoch) const;
  uint64_t TotalSkipped() const { return skipped_total_.load(); }
  std::vector<StageSnapshot> StageSnapshots() const;
  // Row tasks posted but not finished (0 when idle).
  uint64_t tasks_in_flight() const { return in_flight_.load(); }

 private:
  struct EpochState {
    std::vector<uint64_t> order;
    size_t next = 0;            // next position of `order` to hand out
    uint64_t batches = 0;       // batches this epoch will deliver
    uint64_t dispatched = 0;    // batches dispatched so far
    uint32_t last_slot = 0;     // slot of the batch dispatched last (valid when dispatched > 0)
    uint64_t skipped = 0;
    // For resume points: where each undelivered batch's rows start, and which batch took each spare.
    std::map<uint64_t, uint64_t> batch_start;  // seq -> position
    std::map<uint64_t, uint64_t> spare_taker;  // position -> seq
    // A resumed epoch: `order` holds only what was left; orig_pos maps its positions back to the
    // full order, `carried` holds the full-order extras of the point resumed from.
    uint64_t batch_offset = 0;
    uint64_t full_size = 0;
    std::vector<uint64_t> orig_pos;
    std::vector<uint64_t> carried;
    uint64_t Orig(uint64_t pos) const {
      if (orig_pos.empty()) return pos;
      return pos < orig_pos.size() ? orig_pos[pos] : full_size;
    }
  };
  struct InFlight {
    SlotMeta meta;
    std::vector<uint8_t> ok;     // per row: 1 when the row holds a good sample
    uint32_t remaining = 0;      // rows not finished
  };

  void RunRow(uint32_t slot, uint32_t row, uint64_t index, uint32_t epoch);
  // Under mu_: the epoch's state, computing its order on first use.
  EpochState& EpochLocked(uint32_t epoch);
  // Under mu_: the next unused sample of `epoch`, if any.
  std::optional<uint64_t> TakeSpareLocked(uint32_t epoch, uint64_t taker_seq);
  void FinishBatch(uint32_t slot);
  void Fail(Status status);

  // Constant after construction.
  Executor* const executor_;
  shm::SlotRing* const ring_;
  RowProcessor* const processor_;
  const EpochOrderFn order_fn_;
  const PipelineOptions options_;
  const std::function<void()> notify_;
  const std::weak_ptr<void> owner_;
  std::vector<StageStats> stages_;  // the vector is fixed; the counters are atomic

  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<uint64_t> skipped_total_{0};

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::map<uint32_t, EpochState> epochs_;   // epochs with batches not yet all delivered
  std::map<uint32_t, InFlight> slots_;      // by slot: batches being filled or delivered
  uint32_t dispatch_epoch_ = 0;
  uint64_t next_seq_ = 0;
  bool done_dispatching_ = false;
  Status failure_;
};

}  // namespace spdl::pipeline
