// BatchPipeline: the engine that turns a job's sample order into filled slots.
//
// Contract between the parts:
//   - the sample order comes from an EpochOrderFn (a pure function of the epoch);
//   - a free slot of the SlotRing is taken for each batch (no free slot = backpressure: nothing is
//     dispatched until the control thread releases one and calls Pump() again); the batch's rows
//     enter the queue of the first stage;
//   - the RowProcessor declares its stages (e.g. read (io) -> decode (cpu)); each row goes through
//     them in order, one task per (row, stage). A stage runs at most `concurrency` tasks of this
//     job at once; the queue in front of each later stage holds at most `queue` rows. A row that
//     finished a stage whose next queue is full waits there and keeps its place in the stage's
//     concurrency, so a slow stage throttles the ones before it, and the ring throttles the source.
//     No buffer is unbounded: every row in flight belongs to a slot.
//   - read-ahead: a stage that feeds another (read) also holds at most about as many rows as it
//     takes to keep the next stage fed (Little's law: its task time, from hand-off to done, times
//     the rate rows move on, + kAheadSlack), re-estimated every kAheadWindow: rows read far ahead of
//     a slow decode are memory (each holds its encoded file), not speed. Before the first estimate
//     the bound is the next stage's parallelism + kAheadSlack rows (beyond its queue's), so a job's
//     start does not read its whole ring at once. A window in which the
//     bound held rows back while the next stage had none waiting (the feeding stage is the
//     bottleneck) raises the bound by half, up to the stage's concurrency: slow reads (a remote
//     source) reach their full concurrency within a few windows; fast local reads keep a few rows
//     ahead.
//   - io stages run on the I/O executor, cpu stages on the worker executor, each through a queue of
//     its own (Executor::NewQueue(weight)) so the node-wide pools share out fairly between jobs;
//   - the last stage writes the sample straight into its row of the slot (no collate copy); when
//     every row is done the slot is marked ready and `notify` is called; the control thread then
//     takes ready slots from the ring in sequence order and asks TakeMeta(slot) what they hold.
// A failed sample (on_error: skip) is replaced by the next sample of the same epoch, so a batch keeps
// its shape; only when the epoch has no samples left does a batch come out short (its valid rows
// packed to the front). With on_error: fail the first failure fails the job; with max_failures the
// job fails once more samples failed than allowed (after a warm-up). An epoch always ends with a
// batch marked last_in_epoch, even one left with no sample (a resumed epoch): that batch has 0 rows.
// An exception out of RowProcessor::RunStage is that sample's failure like any other (kInternal,
// naming the sample and the stage); one out of the pipeline's own part of a task fails the job.
// Neither reaches the executor.
//
// Threading: Pump(), Cancel(), TakeMeta and the stats readers are called from the control thread;
// stage tasks run on the executors; internal state is guarded by mu_. Every posted task holds a
// shared_ptr to `owner` (the job that owns this pipeline, its ring and its processor), so nothing a
// task touches is destroyed before the task ends.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "pipeline/executor.h"
#include "pipeline/stage_stats.h"
#include "shm/slot_ring.h"

namespace spdl::pipeline {

// One stage as a RowProcessor declares it.
struct StageSpec {
  std::string name;                  // e.g. "read", "decode"
  StageKind kind = StageKind::kCpu;  // io: runs on the I/O pool; cpu: on the worker pool
};

// One sample on its way through the stages. `bytes` is the row's scratch, carried from one stage
// to the next (e.g. the encoded file the read stage filled and the decode stage consumes); the
// pipeline frees it once the last stage has run.
struct RowTask {
  uint64_t index = 0;  // the sample
  uint32_t epoch = 0;  // its epoch (random transforms draw from it)
  uint32_t slot = 0;
  uint32_t row = 0;
  std::vector<uint8_t> bytes;
  uint32_t mark = 0;  // the RowProcessor's own, carried from one stage to the next; 0 for a new row or a spare
};

// Produces one sample into one row of one slot, one stage at a time. RunStage is called
// concurrently from many threads, each call for a distinct row; for one row, stage k+1 runs only
// after stage k returned OK, possibly on another thread.
class RowProcessor {
 public:
  virtual ~RowProcessor() = default;
  // The stages, in order. Constant.
  virtual std::vector<StageSpec> Stages() const = 0;
  // Runs `stage` of `t`. A non-OK status means the sample is bad; the message must name the sample
  // (e.g. its path). The last stage writes the row.
  virtual Status RunStage(uint32_t stage, RowTask& t) = 0;
  // Copies row `from` of `slot` over row `to` (to pack a short batch). REQUIRES: to < from.
  virtual void MoveRow(uint32_t slot, uint32_t from, uint32_t to) = 0;
  // ---- batch stage (GPU decode) ----
  // Called once all rows of a batch are written and packed (`rows` valid rows, at the front),
  // before BatchWritten; on the thread that finished its last row, never twice at once for one
  // slot. A step over the whole batch (decode.device: cuda decodes the batch here). Rows it fails
  // go into *failed (row index in the batch as given, and why, naming the sample): the pipeline
  // counts each as a failed sample of the last stage (on_error, max_failures) and drops it from the
  // batch, which comes out short (no spare replaces it here); the processor has already packed its
  // rows (the survivors at the front, in order). A non-OK return fails the job (the step itself
  // failed: a device, not a sample). Default: nothing.
  struct BatchRowFailure {
    uint32_t row = 0;
    Status status;
  };
  virtual Status BatchStage(uint32_t /*slot*/, uint32_t /*rows*/, std::vector<BatchRowFailure>* /*failed*/) {
    return Status::Ok();
  }
  // ---- batch-level transforms (mix) ----
  // Called once all rows of a batch are written and packed (`rows` valid rows, at the front),
  // before it is marked ready; on the thread that finished its last row, never twice at once for
  // one slot. (epoch, batch_in_epoch) name the batch, for deterministic draws. Default: nothing.
  virtual void BatchWritten(uint32_t /*slot*/, uint32_t /*epoch*/, uint64_t /*batch_in_epoch*/, uint32_t /*rows*/) {}
  // Figures of parts timed inside a stage (a job's user ops inside decode), reported after the
  // stages with their totals and window; their time is also counted in their stage's. Constant;
  // the objects outlive the pipeline.
  virtual std::vector<const StageStats*> SubStageStats() const { return {}; }
};

using EpochOrderFn = std::function<std::vector<uint64_t>(uint64_t epoch)>;

// Where a job stands after a delivered batch, in terms of its epoch's sample order (positions into
// EpochOrderFn(epoch)): starting a pipeline from it delivers exactly the samples that were not yet
// delivered, in the same order, then the later epochs as if it had never stopped (exact when no
// sample fails after the point).
struct ResumePoint {
  uint32_t epoch = 0;
  uint64_t prefix = 0;           // every position below was delivered (or skipped as bad)
  std::vector<uint64_t> extras;  // positions >= prefix that were delivered too (spares)
  uint64_t next_batch = 0;       // batch_in_epoch of the next batch
};

// Batches an epoch of `samples` samples gives in batches of `batch_size`.
uint64_t BatchesIn(uint64_t samples, uint32_t batch_size, bool drop_last);

// OK when `point` can be resumed in an epoch of `samples` samples batched by `batch_size`: the
// prefix and every extra lie inside the epoch, the extras are above the prefix and distinct, the
// next batch is one of the epoch's, and some sample is left for it. kInvalidArgument says which.
Status CheckResumePoint(const ResumePoint& point, uint64_t samples, uint32_t batch_size, bool drop_last);

// Per-stage settings of a job (by stage index; zero = the default).
inline constexpr uint32_t kMinAutoQueue = 4;
// Read-ahead (see the header comment): rows a feeding stage may hold beyond its measured need, the
// least it may hold, and how often the need is re-estimated.
inline constexpr uint32_t kAheadSlack = 2;
inline constexpr uint32_t kMinAhead = 2;
inline constexpr std::chrono::milliseconds kAheadWindow{50};

struct StageOptions {
  uint32_t concurrency = 0;  // most tasks of this stage at once for this job; 0 = as many as the pool runs
  uint32_t queue = 0;        // rows waiting to start in the stage (queued or handed to the pool, not
                             // started); 0 = automatic: twice the stage executor's Parallelism() at
                             // the time (at least kMinAutoQueue), or the ring only when the executor
                             // cannot say. Ignored for the first stage. Each waiting row holds its
                             // encoded sample: a deep queue is memory, not speed.
};

struct PipelineOptions {
  uint32_t batch_size = 32;
  bool drop_last = false;      // drop an epoch's last, partial batch
  uint32_t epochs = 1;         // 0 = endless
  bool fail_on_error = false;  // on_error: fail
  // max_failures: fail the job once more than `max_failures_count` samples failed, or more than
  // `max_failures_fraction` of the samples tried, counted only once `max_failures_warmup` samples
  // were tried. Negative = no limit.
  int64_t max_failures_count = -1;
  double max_failures_fraction = -1;
  uint64_t max_failures_warmup = 100;
  int weight = 1;                    // share of the pools against other jobs
  std::vector<StageOptions> stages;  // by stage index; missing = defaults
  std::string log_name = "job";      // prefix of log lines ("job 7")
  // order: completion — batches of the current epoch are delivered as they complete (see
  // ClaimForDelivery); the epoch's last batch still comes last, and a later epoch's batches only
  // after it. Resume points are not kept (TakeMeta leaves them empty): a job in completion order
  // cannot be resumed exactly, so it hands out no state token.
  bool completion_order = false;
  std::optional<ResumePoint> resume;  // start from here instead of epoch 0
};

// What a ready slot holds. Written by the pipeline, read by the control thread after TakeNextReady.
struct SlotMeta {
  uint64_t seq = 0;
  uint32_t epoch = 0;
  uint64_t batch_in_epoch = 0;
  uint32_t rows = 0;              // valid rows, packed to the front
  std::vector<uint64_t> indices;  // sample index per valid row
  bool last_in_epoch = false;
  bool last_in_job = false;
  ResumePoint resume;  // where the job stands once this batch is delivered
};

// Figures over the recent window (about `window_seconds`), next to the totals.
struct PipelineStats {
  std::vector<StageSnapshot> stages;  // totals
  std::vector<StageSnapshot> window;  // the same over the window
  double window_seconds = 0;
  uint64_t samples_done = 0;  // rows written (good samples), in total
  double window_samples_per_second = 0;
  uint64_t samples_failed = 0;
  uint64_t samples_tried = 0;
};

class BatchPipeline {
 public:
  // *cpu and *io must outlive every posted task (io may be the same as cpu); *ring and *processor
  // are kept alive by `owner`. `notify` is called (from any thread) whenever a slot became ready
  // or the job failed.
  BatchPipeline(Executor* cpu, Executor* io, shm::SlotRing* ring, RowProcessor* processor, EpochOrderFn order,
                PipelineOptions options, std::function<void()> notify, std::weak_ptr<void> owner);
  // Runs everything on one executor.
  BatchPipeline(Executor* executor, shm::SlotRing* ring, RowProcessor* processor, EpochOrderFn order,
                PipelineOptions options, std::function<void()> notify, std::weak_ptr<void> owner)
      : BatchPipeline(executor, executor, ring, processor, std::move(order), std::move(options), std::move(notify),
                      std::move(owner)) {}

  // Dispatches a batch into every free slot, until the ring is full or the job's samples are
  // all dispatched. Cheap when there is nothing to do. Control thread only.
  void Pump();
  // Stops at once: rows not yet started are dropped, running ones end their stage and stop, and
  // the slots being filled are abandoned (no waiting for the epoch).
  void Cancel();
  // Cancels and records `reason` as the job's failure (unless one is recorded already).
  void Abort(Status reason) { Fail(std::move(reason)); }
  bool cancelled() const { return cancelled_.load(); }
  // The failure that stopped the job (on_error: fail, max_failures, Abort); OK otherwise.
  Status failure() const;
  // Every batch of the job has been dispatched.
  bool all_dispatched() const;

  // Completion order: whether the ready batch in `slot` may be delivered now, ahead of earlier ones
  // still filling: it must belong to the epoch being delivered, and the epoch's last batch must
  // wait for every other batch of its epoch. When true the batch counts as delivered. For
  // SlotRing::TakeFirstReady's predicate (called without the ring's lock; takes only mu_).
  bool ClaimForDelivery(uint32_t slot, uint64_t seq);
  // What a delivered slot holds, with its resume point (none in completion order). Call once per
  // delivery, in delivery order. REQUIRES: `slot` was returned by TakeNextReady or TakeFirstReady
  // and not yet released.
  SlotMeta TakeMeta(uint32_t slot);
  // Samples skipped so far in `epoch`.
  uint64_t EpochSkipped(uint32_t epoch) const;
  uint64_t TotalSkipped() const { return skipped_total_.load(); }
  std::vector<StageSnapshot> StageSnapshots() const;
  // Totals and the recent window (~10 s). Any thread.
  PipelineStats Stats() const;
  // Stage tasks posted but not finished (0 when idle).
  uint64_t tasks_in_flight() const { return in_flight_.load(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Row {
    RowTask task;
    uint64_t seq = 0;  // its batch's sequence number: earlier batches go first
    uint32_t stage = 0;
    Clock::time_point since;   // when it entered its current queue (or started waiting to)
    Clock::time_point handed;  // when its current stage's task was posted
  };
  // Rows are served oldest batch first (then by row), whatever order the stage before finished
  // them in, so the next batch to deliver is filled first.
  struct ByBatch {
    bool operator()(const Row* a, const Row* b) const {
      return a->seq != b->seq ? a->seq < b->seq : a->task.row < b->task.row;
    }
  };
  using RowSet = std::set<Row*, ByBatch>;
  // A stage's rows: blocked -> queue (bounded by capacity) -> handed (a task is posted for each;
  // the task takes the first row of `handed` when it starts) -> running.
  struct StageState {
    Executor* executor = nullptr;
    uint32_t concurrency = 0;    // 0 = no limit
    uint32_t capacity = 0;       // bound of queue + handed; 0 = no limit (or automatic, below)
    bool auto_capacity = false;  // capacity follows the executor's Parallelism() (StageOptions::queue)
    RowSet queue;                // rows waiting for this stage
    RowSet blocked;              // rows done with the stage before, waiting for room in `queue`
    RowSet handed;               // rows with a task posted, not yet started
    uint32_t occupied = 0;       // posted or running tasks + rows of this stage blocked before the next
    // Read-ahead (a stage that feeds another): `ahead` bounds `occupied` too; 0 = no bound (before
    // the first Schedule, or when the next stage's room is unbounded).
    uint32_t ahead = 0;
    bool held_back = false;   // this window: `ahead` held rows back while the next stage had none waiting
    double task_seconds = 0;  // moving average of a task's time from hand-off to done
    uint64_t moved = 0;       // rows that moved on to the next stage's queue in this window
    Clock::time_point window_start{};
  };
  struct EpochState {
    std::vector<uint64_t> order;
    size_t next = 0;          // next position of `order` to hand out
    uint64_t batches = 0;     // batches this epoch will deliver
    uint64_t dispatched = 0;  // batches dispatched so far
    uint32_t last_slot = 0;   // slot of the batch dispatched last (valid when dispatched > 0)
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
    bool delivered = false;   // taken by the control thread (TakeMeta or ClaimForDelivery)
    std::vector<uint8_t> ok;  // per row: 1 when the row holds a good sample
    uint32_t remaining = 0;   // rows not finished
    std::vector<std::unique_ptr<Row>> rows;
  };
  struct Post {
    uint32_t stage;
  };
  struct History {
    Clock::time_point at;
    std::vector<StageSnapshot> stages;
    uint64_t samples_done;
  };

  // One task of `stage`: runs the first row handed to the stage.
  void RunTask(uint32_t stage);
  // RunTask, with any exception it lets out failing the job (never the daemon).
  void RunTaskCaught(uint32_t stage);
  // processor_->RunStage, with an exception turned into the sample's failure (kInternal, naming
  // the sample and the stage).
  Status RunStageCaught(uint32_t stage, RowTask& t);
  // Under mu_: moves rows into queues with room and starts the tasks the concurrency allows.
  void ScheduleLocked(std::vector<Post>* posts);
  // Under mu_: the bound of stage s's queue + handed rows now (capacity, or the automatic one); 0 = none.
  size_t CapacityLocked(size_t s) const;
  // Under mu_: re-estimates stage s's read-ahead once its window is over.
  void UpdateAheadLocked(size_t s, Clock::time_point now);
  // Under mu_: `row` is finished (good or not); appends its slot to *finished when it was the last.
  void RowDoneLocked(Row* row, bool good, std::vector<uint32_t>* finished);
  // Under mu_: a sample failed in `stage`; applies the error policy. Returns the failure that stops
  // the job, or OK to skip it.
  Status CountFailureLocked(uint32_t stage, const Status& error);
  // Under mu_: sets cancelled_ and drops every queued row.
  void CancelLocked(std::vector<uint32_t>* finished);
  void PostAll(std::vector<Post>& posts);
  // Under mu_: the epoch's state, computing its order on first use.
  EpochState& EpochLocked(uint32_t epoch);
  // Under mu_: the next unused sample of `epoch`, if any.
  std::optional<uint64_t> TakeSpareLocked(uint32_t epoch, uint64_t taker_seq);
  void FinishBatch(uint32_t slot);
  // FinishBatch's call of the processor's BatchStage: counts its failed rows and drops them from
  // the batch (*rows updated). False when the job failed (the slot is abandoned, nothing to do).
  bool BatchStageDone(uint32_t slot, uint32_t* rows);
  void Fail(Status status);

  // Constant after construction.
  shm::SlotRing* const ring_;
  RowProcessor* const processor_;
  const EpochOrderFn order_fn_;
  const PipelineOptions options_;
  const std::function<void()> notify_;
  const std::weak_ptr<void> owner_;
  const std::vector<StageSpec> specs_;
  std::unique_ptr<Executor> cpu_queue_;  // this job's queues on the shared pools
  std::unique_ptr<Executor> io_queue_;
  std::vector<std::unique_ptr<StageStats>> stats_;  // by stage; the counters are atomic
  const std::vector<const StageStats*> sub_stats_;  // processor_->SubStageStats(), reported after stats_

  std::atomic<bool> cancelled_{false};
  std::atomic<uint64_t> in_flight_{0};
  std::atomic<uint64_t> skipped_total_{0};
  std::atomic<uint64_t> samples_done_{0};

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::vector<StageState> stages_;
  std::map<uint32_t, EpochState> epochs_;  // epochs with batches not yet all delivered
  std::map<uint32_t, InFlight> slots_;     // by slot: batches being filled or delivered
  uint32_t dispatch_epoch_ = 0;
  bool done_dispatching_ = false;
  Status failure_;
  uint64_t tried_ = 0;           // samples finished, good or bad
  uint64_t failed_ = 0;          // samples that failed
  uint64_t logged_skips_ = 0;    // skipped samples logged one by one (the first few)
  uint64_t unlogged_skips_ = 0;  // skipped since the last summary line
  Clock::time_point last_skip_summary_{};
  std::string last_error_;  // "stage 'x': message" of the last failed sample

  mutable std::mutex history_mu_;
  mutable std::deque<History> history_;  // guarded by history_mu_: snapshots for the window
};

}  // namespace spdl::pipeline
