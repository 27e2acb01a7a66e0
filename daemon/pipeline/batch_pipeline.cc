#include "pipeline/batch_pipeline.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

namespace spdl::pipeline {
namespace {

// Skipped samples: the first kLoggedSkips of a job are logged one by one, then one summary line at
// most every kSkipSummaryInterval.
constexpr uint64_t kLoggedSkips = 10;
constexpr auto kSkipSummaryInterval = std::chrono::seconds(10);
// The stats window: figures over the last ~10 s, from snapshots kept at most once a second.
constexpr auto kWindow = std::chrono::seconds(10);
constexpr auto kHistoryStep = std::chrono::seconds(1);

uint64_t Nanos(std::chrono::steady_clock::duration d) {
  return static_cast<uint64_t>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()));
}

std::string FailureLimit(const PipelineOptions& o) {
  if (o.max_failures_count >= 0) return std::to_string(o.max_failures_count);
  std::ostringstream s;
  s << o.max_failures_fraction;
  return s.str();
}

}  // namespace

uint64_t BatchesIn(uint64_t samples, uint32_t batch_size, bool drop_last) {
  if (batch_size == 0) return 0;
  return drop_last ? samples / batch_size : (samples + batch_size - 1) / batch_size;
}

Status CheckResumePoint(const ResumePoint& p, uint64_t samples, uint32_t batch_size, bool drop_last) {
  const uint64_t batches = BatchesIn(samples, batch_size, drop_last);
  if (p.prefix > samples) {
    return InvalidArgument("the resume token's position " + std::to_string(p.prefix) + " is past the " +
                           std::to_string(samples) + " samples of the epoch");
  }
  std::set<uint64_t> seen;
  for (uint64_t e : p.extras) {
    if (e < p.prefix || e >= samples || !seen.insert(e).second) {
      return InvalidArgument("the resume token's extra position " + std::to_string(e) + " is not between " +
                             std::to_string(p.prefix) + " and " + std::to_string(samples) + " (or is repeated)");
    }
  }
  if (p.next_batch >= batches) {
    return InvalidArgument("the resume token's next batch " + std::to_string(p.next_batch) + " is past the " +
                           std::to_string(batches) + " batches of the epoch");
  }
  if (samples - p.prefix - p.extras.size() == 0) {
    return InvalidArgument("the resume token leaves no sample in its epoch (it should name the next epoch)");
  }
  return Status::Ok();
}

BatchPipeline::BatchPipeline(Executor* cpu, Executor* io, shm::SlotRing* ring, RowProcessor* processor,
                             EpochOrderFn order, PipelineOptions options, std::function<void()> notify,
                             std::weak_ptr<void> owner)
    : ring_(ring),
      processor_(processor),
      order_fn_(std::move(order)),
      options_(std::move(options)),
      notify_(std::move(notify)),
      owner_(std::move(owner)),
      specs_(processor_->Stages()),
      cpu_queue_(cpu->NewQueue(options_.weight)),
      io_queue_(io->NewQueue(options_.weight)),
      sub_stats_(processor_->SubStageStats()) {
  if (options_.resume) dispatch_epoch_ = options_.resume->epoch;
  stages_.resize(specs_.size());
  for (size_t s = 0; s < specs_.size(); ++s) {
    StageState& st = stages_[s];
    st.executor = specs_[s].kind == StageKind::kIo ? io_queue_.get() : cpu_queue_.get();
    st.auto_capacity = s > 0;
    if (s < options_.stages.size()) {
      st.concurrency = options_.stages[s].concurrency;
      st.capacity = s == 0 ? 0 : options_.stages[s].queue;  // the first queue is bounded by the ring
      st.auto_capacity = s > 0 && st.capacity == 0;
    }
    stats_.push_back(std::make_unique<StageStats>(specs_[s].name, specs_[s].kind, st.concurrency, st.capacity));
  }
  // The window starts at zero: until it is ~10 s old it covers the job's whole life.
  history_.push_back({Clock::now(), std::vector<StageSnapshot>(specs_.size() + sub_stats_.size()), 0});
}

BatchPipeline::EpochState& BatchPipeline::EpochLocked(uint32_t epoch) {
  auto it = epochs_.find(epoch);
  if (it != epochs_.end()) return it->second;
  EpochState st;
  st.order = order_fn_(epoch);
  st.full_size = st.order.size();
  st.batches = BatchesIn(st.full_size, options_.batch_size, options_.drop_last);
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
    // The batches the uninterrupted run still had to deliver: counting them from what is left
    // instead (with drop_last) would drop a batch the uninterrupted run delivers short.
    st.batches = st.batches > r.next_batch ? st.batches - r.next_batch : 0;
  }
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
    // Spares used up the samples of batches not yet dispatched: the epoch ends with the batch of
    // the highest sequence number not yet delivered. In sampler order that is the batch dispatched
    // last (delivery is in order and the batch taking this spare is still being filled); in
    // completion order the one dispatched last may be delivered already. There is always one: the
    // batch taking this spare.
    st.batches = st.dispatched;
    InFlight* last = nullptr;
    for (auto& [slot, f] : slots_) {
      if (f.meta.epoch == epoch && !f.delivered && (!last || f.meta.seq > last->meta.seq)) last = &f;
    }
    last->meta.last_in_epoch = true;
    last->meta.last_in_job = options_.epochs != 0 && epoch + 1 == options_.epochs;
  }
  return spare;
}

void BatchPipeline::Pump() {
  std::vector<Post> posts;
  std::vector<uint32_t> empty;  // batches with no row (an epoch with nothing left): ready at once
  {
    std::lock_guard lock(mu_);
    while (!done_dispatching_ && !cancelled_.load() && failure_.ok()) {
      EpochState& st = EpochLocked(dispatch_epoch_);
      const bool exhausted = st.dispatched >= st.batches || st.next >= st.order.size();
      if (exhausted && st.dispatched > 0) {
        // This epoch is fully dispatched (its last batch carries the end mark): move on (or stop
        // after the last epoch).
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
      // With nothing left (exhausted before its first batch), the epoch still ends: one batch of 0 rows.
      const size_t take = exhausted ? 0 : std::min<size_t>(options_.batch_size, st.order.size() - st.next);
      f.meta.indices.assign(st.order.begin() + static_cast<ptrdiff_t>(st.next),
                            st.order.begin() + static_cast<ptrdiff_t>(st.next + take));
      st.next += take;
      if (exhausted) st.batches = st.dispatched;
      f.meta.rows = static_cast<uint32_t>(take);
      f.meta.last_in_epoch = st.dispatched >= st.batches || st.next >= st.order.size();
      f.meta.last_in_job = f.meta.last_in_epoch && options_.epochs != 0 && dispatch_epoch_ + 1 == options_.epochs;
      f.ok.assign(take, 0);
      f.remaining = static_cast<uint32_t>(take);
      const Clock::time_point now = Clock::now();
      for (uint32_t row = 0; row < take; ++row) {
        auto r = std::make_unique<Row>();
        r->task.index = f.meta.indices[row];
        r->task.epoch = f.meta.epoch;
        r->task.slot = acquired->slot;
        r->task.row = row;
        r->seq = acquired->seq;
        r->since = now;
        stages_[0].queue.insert(r.get());
        f.rows.push_back(std::move(r));
      }
      if (take == 0) empty.push_back(acquired->slot);
      slots_[acquired->slot] = std::move(f);
    }
    ScheduleLocked(&posts);
  }
  // An empty batch is ready at once, before the rows of later batches start (so it is never
  // abandoned by a failure of theirs while they are delivered).
  for (uint32_t slot : empty) FinishBatch(slot);
  PostAll(posts);
}

size_t BatchPipeline::CapacityLocked(size_t s) const {
  const StageState& st = stages_[s];
  if (!st.auto_capacity) return st.capacity;
  const int parallelism = st.executor->Parallelism();
  return parallelism > 0 ? std::max<size_t>(kMinAutoQueue, 2 * static_cast<size_t>(parallelism)) : 0;
}

void BatchPipeline::ScheduleLocked(std::vector<Post>* posts) {
  if (cancelled_.load()) return;
  const Clock::time_point now = Clock::now();
  // Read-ahead before the first estimate (only in front of a bounded queue): what the next stage
  // runs at once, + kAheadSlack, beyond the rows its queue holds.
  for (size_t s = 0; s + 1 < stages_.size(); ++s) {
    StageState& st = stages_[s];
    if (st.ahead != 0 || CapacityLocked(s + 1) == 0) continue;
    const int next_parallelism = stages_[s + 1].executor->Parallelism();
    size_t initial = std::max<size_t>(kMinAhead, static_cast<size_t>(std::max(1, next_parallelism)) + kAheadSlack);
    if (st.concurrency != 0) initial = std::min<size_t>(initial, st.concurrency);
    st.ahead = static_cast<uint32_t>(initial);
  }
  bool moved = true;
  while (moved) {
    moved = false;
    for (size_t s = stages_.size(); s-- > 0;) {
      StageState& st = stages_[s];
      // Rows done with the stage before enter this stage's queue while it has room.
      // The bound counts every row waiting to start here: queued, or handed to the pool.
      const size_t capacity = CapacityLocked(s);
      while (!st.blocked.empty() && (capacity == 0 || st.queue.size() + st.handed.size() < capacity)) {
        Row* r = *st.blocked.begin();
        st.blocked.erase(st.blocked.begin());
        stats_[s - 1]->AddPutWait(Nanos(now - r->since));
        r->since = now;
        st.queue.insert(r);
        --stages_[s - 1].occupied;
        ++stages_[s - 1].moved;
        moved = true;
      }
      while (!st.queue.empty() && (st.concurrency == 0 || st.occupied < st.concurrency) &&
             (st.ahead == 0 || st.occupied < st.ahead)) {
        Row* r = *st.queue.begin();
        st.queue.erase(st.queue.begin());
        r->handed = now;
        st.handed.insert(r);
        ++st.occupied;
        posts->push_back({static_cast<uint32_t>(s)});
        moved = true;
      }
    }
  }
  for (size_t s = 0; s < stages_.size(); ++s) {
    stats_[s]->SetGauges(stages_[s].queue.size() + stages_[s].handed.size(),
                         stages_[s].occupied - stages_[s].handed.size());
    if (s + 1 < stages_.size()) {
      StageState& st = stages_[s];
      const StageState& next = stages_[s + 1];
      if (st.ahead != 0 && !st.queue.empty() && st.occupied >= st.ahead && next.queue.empty() && next.handed.empty()) {
        st.held_back = true;
      }
      UpdateAheadLocked(s, now);
    }
  }
}

void BatchPipeline::UpdateAheadLocked(size_t s, Clock::time_point now) {
  StageState& st = stages_[s];
  if (st.window_start == Clock::time_point{}) st.window_start = now;
  const double seconds = std::chrono::duration<double>(now - st.window_start).count();
  if (now - st.window_start < kAheadWindow) return;
  const double most = st.concurrency == 0 ? 1e9 : st.concurrency;
  if (st.moved > 0 && st.task_seconds > 0) {
    // Little's law: rows the stage must hold to pass them on at the rate the next stage takes them.
    // A stage that is itself the bottleneck passes on occupied / task time, so the estimate is about
    // its bound: such a window (the bound held rows back while the next stage had none waiting)
    // raises the bound by half, until the stage's concurrency. A window where nothing moved (no
    // demand, or the ring full) keeps the bound.
    const double need = std::ceil(st.task_seconds * static_cast<double>(st.moved) / seconds);
    double bound = std::max<double>(kMinAhead, need + kAheadSlack);
    if (st.held_back) bound = std::max(bound, std::ceil(1.5 * static_cast<double>(st.ahead)));
    st.ahead = static_cast<uint32_t>(std::min(bound, most));
  } else if (st.held_back) {  // nothing came through yet (tasks longer than the window), rows held back
    st.ahead = static_cast<uint32_t>(std::min(std::ceil(1.5 * static_cast<double>(st.ahead)), most));
  }
  st.held_back = false;
  st.moved = 0;
  st.window_start = now;
}

void BatchPipeline::PostAll(std::vector<Post>& posts) {
  if (posts.empty()) return;
  std::shared_ptr<void> owner = owner_.lock();
  for (const Post& p : posts) {
    in_flight_.fetch_add(1);
    // Read the executor under no lock: stages_[s].executor is constant after construction.
    stages_[p.stage].executor->Post([owner, this, stage = p.stage] { RunTaskCaught(stage); });
  }
  posts.clear();
}

void BatchPipeline::RunTaskCaught(uint32_t stage) {
  // An exception outside a sample's stage (the pipeline's own bookkeeping) fails the job, not the
  // daemon. The task's row may be lost with it; the job is cancelled, so nothing waits for it.
  std::string what;
  try {
    RunTask(stage);
    return;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "an exception of unknown type";
  }
  in_flight_.fetch_sub(1);
  spdlog::error("{}: a task of stage '{}' threw outside a sample ({}); the job fails", options_.log_name,
                specs_[stage].name, what);
  Fail(Internal("stage '" + specs_[stage].name + "' threw outside a sample: " + what));
}

Status BatchPipeline::RunStageCaught(uint32_t stage, RowTask& t) {
  // RowProcessor::RunStage must not throw; one that does fails this sample only (counted, logged
  // with the sample, on_error applies), as a bad file would.
  try {
    return processor_->RunStage(stage, t);
  } catch (const std::exception& e) {
    return Internal("sample " + std::to_string(t.index) + ": an exception in stage '" + specs_[stage].name +
                    "': " + e.what());
  } catch (...) {
    return Internal("sample " + std::to_string(t.index) + ": an exception of unknown type in stage '" +
                    specs_[stage].name + "'");
  }
}

void BatchPipeline::RunTask(uint32_t stage) {
  Row* row = nullptr;
  {
    std::lock_guard lock(mu_);
    StageState& st = stages_[stage];
    if (st.handed.empty()) {  // its row was dropped by a cancel
      --st.occupied;
      in_flight_.fetch_sub(1);
      return;
    }
    row = *st.handed.begin();
    st.handed.erase(st.handed.begin());
    stats_[stage]->AddGetWait(Nanos(Clock::now() - row->since));
  }
  Status s;
  bool ran = false;
  if (!cancelled_.load()) {
    const Clock::time_point t0 = Clock::now();
    s = RunStageCaught(stage, row->task);
    stats_[stage]->Record(Nanos(Clock::now() - t0), s.ok());
    ran = true;
  }
  // After the last stage no stage reads the row's bytes again (a spare replacing a failed row reads
  // its own): the encoded sample is given back now, not when the whole batch is done. Only this
  // task holds the row here.
  if (stage + 1 == stages_.size()) std::vector<uint8_t>().swap(row->task.bytes);
  std::vector<Post> posts;
  std::vector<uint32_t> finished;
  bool failed_now = false;
  {
    std::lock_guard lock(mu_);
    StageState& st = stages_[stage];
    if (!ran || cancelled_.load()) {
      --st.occupied;
      RowDoneLocked(row, false, &finished);
    } else if (s.ok() && stage + 1 < stages_.size()) {
      row->stage = stage + 1;
      row->since = Clock::now();
      const double took = std::chrono::duration<double>(row->since - row->handed).count();
      st.task_seconds = st.task_seconds == 0 ? took : 0.8 * st.task_seconds + 0.2 * took;
      stages_[stage + 1].blocked.insert(row);  // keeps its place in this stage until it moves on
    } else if (s.ok()) {
      --st.occupied;
      ++tried_;
      samples_done_.fetch_add(1, std::memory_order_relaxed);
      RowDoneLocked(row, true, &finished);
      if (tried_ == options_.max_failures_warmup && failed_ > 0) {
        Status stop = CountFailureLocked(stage, Status::Ok());
        if (!stop.ok()) {
          if (failure_.ok()) failure_ = std::move(stop);
          CancelLocked(&finished);
          failed_now = true;
        }
      }
    } else {
      --st.occupied;
      ++tried_;
      ++failed_;
      // kUnavailable is the daemon's or the node's trouble (descriptors, memory, a device: io
      // retried it already), never the sample's: it fails the job whatever on_error says.
      Status stop = s.code() == StatusCode::kUnavailable
                        ? Status(s.code(), s.message() + " (stage '" + specs_[stage].name +
                                               "': a resource error fails the job; it is not a bad sample)")
                        : CountFailureLocked(stage, s);
      if (!stop.ok()) {
        if (failure_.ok()) failure_ = std::move(stop);
        CancelLocked(&finished);
        RowDoneLocked(row, false, &finished);
        failed_now = true;
      } else {
        InFlight& f = slots_.at(row->task.slot);
        ++epochs_.at(f.meta.epoch).skipped;
        skipped_total_.fetch_add(1);
        auto spare = TakeSpareLocked(f.meta.epoch, f.meta.seq);
        if (spare) {
          // The spare starts over at the first stage, ahead of rows of later batches.
          row->task.index = *spare;
          row->task.bytes.clear();
          row->task.mark = 0;
          row->stage = 0;
          row->since = Clock::now();
          f.meta.indices[row->task.row] = *spare;
          stages_[0].queue.insert(row);  // its batch is older than the rows queued after it
        } else {
          RowDoneLocked(row, false, &finished);
        }
      }
    }
    ScheduleLocked(&posts);
  }
  PostAll(posts);
  for (uint32_t slot : finished) FinishBatch(slot);
  if (failed_now) notify_();
  in_flight_.fetch_sub(1);
}

Status BatchPipeline::CountFailureLocked(uint32_t stage, const Status& error) {
  const std::string& stage_name = specs_[stage].name;
  if (!error.ok()) {
    if (options_.fail_on_error) {
      return Status(error.code(), error.message() + " (stage '" + stage_name + "', on_error: fail)");
    }
    // Log the skip, rate-limited.
    const Clock::time_point now = Clock::now();
    if (logged_skips_ < kLoggedSkips) {
      ++logged_skips_;
      spdlog::warn("{}: skipped a sample in stage '{}': {}{}", options_.log_name, stage_name, error.message(),
                   logged_skips_ == kLoggedSkips ? " (further skips are summed up every 10 s)" : "");
      last_skip_summary_ = now;
    } else {
      ++unlogged_skips_;
      if (now - last_skip_summary_ >= kSkipSummaryInterval) {
        spdlog::warn("{}: skipped {} more samples ({} of {} so far); the last in stage '{}': {}", options_.log_name,
                     unlogged_skips_, failed_, tried_, stage_name, error.message());
        unlogged_skips_ = 0;
        last_skip_summary_ = now;
      }
    }
    last_error_ = "stage '" + stage_name + "': " + error.message();
  }
  if (tried_ < options_.max_failures_warmup) return Status::Ok();
  bool over = false;
  if (options_.max_failures_count >= 0) over = failed_ > static_cast<uint64_t>(options_.max_failures_count);
  if (options_.max_failures_fraction >= 0) {
    over = over || static_cast<double>(failed_) > options_.max_failures_fraction * static_cast<double>(tried_);
  }
  if (!over) return Status::Ok();
  return DataLoss("too many bad samples: " + std::to_string(failed_) + " of " + std::to_string(tried_) +
                  " failed (max_failures: " + FailureLimit(options_) + ", after " +
                  std::to_string(options_.max_failures_warmup) + " samples); the last in " + last_error_);
}

void BatchPipeline::RowDoneLocked(Row* row, bool good, std::vector<uint32_t>* finished) {
  InFlight& f = slots_.at(row->task.slot);
  f.ok[row->task.row] = good ? 1 : 0;
  row->task.bytes = {};
  if (--f.remaining == 0) finished->push_back(row->task.slot);
}

void BatchPipeline::CancelLocked(std::vector<uint32_t>* finished) {
  cancelled_.store(true);
  for (size_t s = 0; s < stages_.size(); ++s) {
    StageState& st = stages_[s];
    for (Row* r : st.queue) RowDoneLocked(r, false, finished);
    st.queue.clear();
    // Their tasks are posted: each finds `handed` empty and gives back its place in `occupied`.
    for (Row* r : st.handed) RowDoneLocked(r, false, finished);
    st.handed.clear();
    for (Row* r : st.blocked) {
      --stages_[s - 1].occupied;
      RowDoneLocked(r, false, finished);
    }
    st.blocked.clear();
    stats_[s]->SetGauges(0, st.occupied);
  }
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
  uint32_t epoch = 0, rows = 0;  // for BatchWritten
  uint64_t batch_in_epoch = 0;
  {
    std::lock_guard lock(mu_);
    InFlight& f = slots_.at(slot);
    f.rows.clear();
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
    epoch = f.meta.epoch;
    batch_in_epoch = f.meta.batch_in_epoch;
    rows = write;
  }
  for (auto [from, to] : moves) processor_->MoveRow(slot, from, to);
  if (rows > 0 && !BatchStageDone(slot, &rows)) return;
  processor_->BatchWritten(slot, epoch, batch_in_epoch, rows);
  Status s = ring_->MarkReady(slot);
  (void)s;  // the slot was acquired by Pump() and is filling: cannot fail
  notify_();
}

bool BatchPipeline::BatchStageDone(uint32_t slot, uint32_t* rows) {
  std::vector<RowProcessor::BatchRowFailure> failed;
  Status s;
  try {
    s = processor_->BatchStage(slot, *rows, &failed);
  } catch (const std::exception& e) {
    s = Internal(std::string("the batch stage threw: ") + e.what());
  } catch (...) {
    s = Internal("the batch stage threw an exception of unknown type");
  }
  if (s.ok() && failed.empty()) return true;
  std::vector<uint32_t> finished;
  bool stop = !s.ok();
  {
    std::lock_guard lock(mu_);
    InFlight& f = slots_.at(slot);
    const uint32_t last_stage = static_cast<uint32_t>(specs_.size() - 1);
    std::vector<uint8_t> dropped(f.meta.indices.size(), 0);
    for (const RowProcessor::BatchRowFailure& r : failed) {
      if (stop || r.row >= dropped.size() || dropped[r.row]) continue;
      dropped[r.row] = 1;
      ++failed_;
      Status why = r.status.code() == StatusCode::kUnavailable
                       ? Status(r.status.code(), r.status.message() + " (stage '" + specs_[last_stage].name +
                                                     "': a resource error fails the job; it is not a bad sample)")
                       : CountFailureLocked(last_stage, r.status);
      if (!why.ok()) {
        s = std::move(why);
        stop = true;
        continue;
      }
      ++epochs_.at(f.meta.epoch).skipped;
      skipped_total_.fetch_add(1);
    }
    if (stop) {
      if (failure_.ok()) failure_ = s;
      CancelLocked(&finished);
    } else {
      std::vector<uint64_t> kept;
      for (size_t r = 0; r < f.meta.indices.size(); ++r) {
        if (!dropped[r]) kept.push_back(f.meta.indices[r]);
      }
      f.meta.indices = std::move(kept);
      f.meta.rows = static_cast<uint32_t>(f.meta.indices.size());
      *rows = f.meta.rows;
    }
  }
  if (!stop) return true;
  // The job fails: this batch is abandoned like every other one in flight.
  {
    std::lock_guard lock(mu_);
    slots_.erase(slot);
  }
  (void)ring_->Abandon(slot);
  for (uint32_t other : finished) FinishBatch(other);
  notify_();
  return false;
}

void BatchPipeline::Cancel() {
  std::vector<uint32_t> finished;
  {
    std::lock_guard lock(mu_);
    CancelLocked(&finished);
  }
  for (uint32_t slot : finished) FinishBatch(slot);
}

void BatchPipeline::Fail(Status status) {
  std::vector<uint32_t> finished;
  {
    std::lock_guard lock(mu_);
    if (failure_.ok()) failure_ = std::move(status);
    CancelLocked(&finished);
  }
  for (uint32_t slot : finished) FinishBatch(slot);
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

bool BatchPipeline::ClaimForDelivery(uint32_t slot, uint64_t seq) {
  std::lock_guard lock(mu_);
  auto it = slots_.find(slot);
  if (it == slots_.end() || it->second.meta.seq != seq || it->second.delivered) return false;
  const InFlight* lowest = nullptr;  // the undelivered batch with the lowest sequence number
  for (const auto& [s, f] : slots_) {
    if (!f.delivered && (!lowest || f.meta.seq < lowest->meta.seq)) lowest = &f;
  }
  const InFlight& f = it->second;
  if (f.meta.epoch != lowest->meta.epoch) return false;    // a later epoch waits for this one
  if (f.meta.last_in_epoch && lowest != &f) return false;  // the epoch's end comes last
  it->second.delivered = true;
  return true;
}

SlotMeta BatchPipeline::TakeMeta(uint32_t slot) {
  std::lock_guard lock(mu_);
  InFlight& f = slots_.at(slot);
  f.delivered = true;
  SlotMeta m = f.meta;
  ResumePoint& r = m.resume;
  if (m.last_in_epoch) {
    r.epoch = m.epoch + 1;
    return m;
  }
  EpochState& st = epochs_.at(m.epoch);
  if (options_.completion_order) {  // no resume points: batches are delivered out of order
    st.batch_start.erase(m.seq);
    return m;
  }
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
  out.reserve(stats_.size() + sub_stats_.size());
  for (auto& s : stats_) out.push_back(s->Snapshot());
  for (const StageStats* s : sub_stats_) out.push_back(s->Snapshot());
  return out;
}

PipelineStats BatchPipeline::Stats() const {
  PipelineStats out;
  const Clock::time_point now = Clock::now();
  out.stages = StageSnapshots();
  out.samples_done = samples_done_.load(std::memory_order_relaxed);
  {
    std::lock_guard lock(mu_);
    out.samples_failed = failed_;
    out.samples_tried = tried_;
  }
  std::lock_guard history_lock(history_mu_);
  if (history_.empty() || now - history_.back().at >= kHistoryStep) {
    history_.push_back({now, out.stages, out.samples_done});
  }
  // Keep one snapshot at least a window old as the base, none older.
  while (history_.size() > 1 && now - history_[1].at >= kWindow) history_.pop_front();
  const History& base = history_.front();
  out.window_seconds = std::chrono::duration<double>(now - base.at).count();
  for (size_t s = 0; s < out.stages.size(); ++s) out.window.push_back(Difference(out.stages[s], base.stages[s]));
  if (out.window_seconds > 0) {
    out.window_samples_per_second = static_cast<double>(out.samples_done - base.samples_done) / out.window_seconds;
  }
  return out;
}

}  // namespace spdl::pipeline
