#include "jobs/stream_job.h"

#include <spdlog/spdlog.h>

#include <cstring>

#include "jobs/job_region.h"
#include "media/sample_random.h"
#include "proto/framing.h"

namespace spdl::jobs {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kTokenMagic[] = "spdl-stream-token-v1";

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::string EncodeStreamToken(const std::string& stream, const std::string& group, uint64_t offset,
                              uint64_t next_batch) {
  return std::string(kTokenMagic) + "\n" + stream + "\n" + group + "\n" + std::to_string(offset) + "\n" +
         std::to_string(next_batch);
}

Result<StreamToken> DecodeStreamToken(const std::string& token) {
  const std::string bad = "the resume token is not a stream job's (a token of an epoch job, or damaged)";
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t nl = token.find('\n', start);
    parts.push_back(token.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  if (parts.size() != 5 || parts[0] != kTokenMagic || parts[1].empty() || parts[2].empty()) {
    return InvalidArgument(bad);
  }
  auto number = [](const std::string& text, uint64_t* out) {
    if (text.empty() || text.size() > 19) return false;
    *out = 0;
    for (char c : text) {
      if (c < '0' || c > '9') return false;
      *out = *out * 10 + static_cast<uint64_t>(c - '0');
    }
    return true;
  };
  StreamToken t;
  t.stream = parts[1];
  t.group = parts[2];
  if (!number(parts[3], &t.offset) || !number(parts[4], &t.next_batch)) return InvalidArgument(bad);
  return t;
}

StreamJob::StreamJob(MediaJobSpec spec, std::shared_ptr<streams::Stream> stream, streams::ConsumerId consumer,
                     shm::SharedRegion region, proto::SlotLayout layout, std::unique_ptr<BudgetLease> budget,
                     std::function<void()> notify, pipeline::Executor* executor)
    : budget_(std::move(budget)),
      spec_(std::move(spec)),
      stream_(std::move(stream)),
      consumer_(consumer),
      region_(std::move(region)),
      layout_(std::move(layout)),
      notify_(std::move(notify)),
      started_(Clock::now()),
      ring_(layout_.num_slots),
      queue_(executor->NewQueue(spec_.config.weight)) {
  tensors_ = spec_.decoder->tensors();
  tensors_.push_back({"label", proto::INT64, {}, sizeof(int64_t)});
}

StreamJob::~StreamJob() {
  stop_ = true;
  stream_->Cancel(consumer_);
  ring_.Close();
  if (filler_.joinable()) filler_.join();
  // Whatever was not acknowledged (filling, ready, leased) goes back to the group.
  stream_->Leave(consumer_);
  spdlog::info("job {}: stream '{}' group '{}': closed after {} batches, {} samples", spec_.job_id, stream_->name(),
               spec_.config.source.stream.group, delivered_batches_, delivered_samples_);
}

Result<std::shared_ptr<StreamJob>> StreamJob::Start(MediaJobSpec spec, std::shared_ptr<streams::Stream> stream,
                                                    std::optional<uint64_t> resume_after, uint64_t first_batch,
                                                    std::unique_ptr<BudgetLease> budget, std::function<void()> notify,
                                                    pipeline::Executor* executor) {
  if (executor == nullptr) return Internal("stream job: no worker pool to decode on");
  proto::SlotLayout layout = LayoutFor(spec);
  SPDL_ASSIGN_OR_RETURN(shm::SharedRegion region, CreateJobRegion(spec.job_id, layout));
  SPDL_ASSIGN_OR_RETURN(streams::ConsumerId consumer, stream->Join(spec.config.source.stream.group, resume_after));
  auto job = std::make_shared<StreamJob>(std::move(spec), std::move(stream), consumer, std::move(region), layout,
                                         std::move(budget), std::move(notify), executor);
  job->batch_base_ = first_batch;
  const MediaJobSpec& s = job->spec_;
  const auto b = static_cast<uint32_t>(s.config.batch.size);
  if (job->tensors_.size() != layout.tensor_offsets.size()) {
    return Internal("stream job: the layout has " + std::to_string(layout.tensor_offsets.size()) +
                    " tensors, the job " + std::to_string(job->tensors_.size()));
  }
  proto::JobAccepted& a = job->accepted_;
  a.set_job_id(s.job_id);
  a.set_batches_per_epoch(0);  // unbounded
  a.set_samples_per_epoch(0);
  a.set_dataset_size(0);
  DescribeSlots(layout, job->tensors_, b, &a);
  spdlog::info("job {}: started for uid {} pid {}: stream '{}' group '{}'{}, batches of {}, {} slots ({} MiB)",
               s.job_id, s.owner.uid, s.owner.pid, job->stream_->name(), s.config.source.stream.group,
               resume_after ? " resuming after offset " + std::to_string(*resume_after) : std::string(), b,
               layout.num_slots, layout.region_bytes >> 20);
  job->filler_ = std::thread([raw = job.get()] { raw->Fill(); });
  return job;
}

Status StreamJob::DecodeInto(const streams::StreamSample& s, uint32_t slot, uint32_t row) {
  uint8_t* base = region_.data() + layout_.SlotOffset(slot);
  const size_t n = tensors_.size() - 1;  // the decoder's tensors, then the label
  std::vector<uint8_t*> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = base + layout_.tensor_offsets[i] + row * tensors_[i].row_bytes;
  // Random transforms draw from (seed, offset): a redelivered sample decodes the same.
  const uint64_t seed = spec_.decoder->random() ? media::SampleSeed(spec_.config.sampler.seed, 0, s.offset) : 0;
  Status st = spec_.decoder->Decode(std::span<const uint8_t>(s.data.data(), s.data.size()), seed, rows);
  if (!st.ok()) {
    const std::string key =
        s.key.empty() ? "stream '" + stream_->name() + "' offset " + std::to_string(s.offset) : s.key;
    return st.WithPrefix(key);
  }
  reinterpret_cast<int64_t*>(base + layout_.tensor_offsets[n])[row] = s.label;
  return Status::Ok();
}

void StreamJob::Fail(Status reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = std::move(reason);
  }
  stop_ = true;
  stream_->Cancel(consumer_);
  ring_.Close();
  if (notify_) notify_();
}

void StreamJob::Completions::Report(uint32_t row, Status st, bool ran) {
  std::lock_guard<std::mutex> lock(mu);
  done.push_back({row, std::move(st), ran});
  cv.notify_all();
}

void StreamJob::MoveRow(uint32_t slot, uint32_t from, uint32_t to) {
  uint8_t* base = region_.data() + layout_.SlotOffset(slot);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const uint64_t n = tensors_[i].row_bytes;
    std::memmove(base + layout_.tensor_offsets[i] + to * n, base + layout_.tensor_offsets[i] + from * n, n);
  }
}

namespace {

// Owned by one posted decode task: reports the row once, also when the pool drops the task without
// running it (a pool that stopped at shutdown), so the dispatcher never waits for it forever.
class RowReport {
 public:
  explicit RowReport(std::function<void(Status, bool)> report) : report_(std::move(report)) {}
  ~RowReport() {
    if (report_) report_(Unavailable("the worker pool stopped before the sample was decoded"), false);
  }
  RowReport(const RowReport&) = delete;
  RowReport& operator=(const RowReport&) = delete;
  void Done(Status st) {
    report_(std::move(st), true);
    report_ = nullptr;
  }

 private:
  std::function<void(Status, bool)> report_;
};

}  // namespace

void StreamJob::Fill() {
  const auto b = static_cast<uint32_t>(spec_.config.batch.size);
  const auto delay = std::chrono::milliseconds(spec_.config.max_batch_delay_ms);
  const uint64_t max_samples = spec_.config.source.stream.max_samples;
  const bool fail_on_error = spec_.config.on_error == config::OnError::kFail;
  uint64_t good = 0;  // samples written into batches so far
  bool end = false;   // the stream ended (or max_samples): the batch being filled is the last
  while (!stop_ && !end) {
    std::optional<shm::SlotRing::Acquired> acquired = ring_.TryAcquire();
    if (!acquired) {
      ring_.WaitForFree(std::chrono::milliseconds(100));
      continue;
    }
    const uint32_t slot = acquired->slot;
    // The slot's rows: the sample each holds (null: free). A failed decode frees its row.
    std::vector<streams::SamplePtr> rows(b);
    std::vector<uint32_t> free_rows;
    for (uint32_t r = b; r > 0; --r) free_rows.push_back(r - 1);
    uint32_t live = 0;     // rows holding a sample (decoded, or being decoded)
    uint32_t pending = 0;  // decodes posted and not reported yet
    auto completions = std::make_shared<Completions>();
    bool have_first = false;
    Clock::time_point first;
    // Takes the reports of finished decodes; waits up to `wait` for one when none is there.
    auto collect = [&](std::chrono::milliseconds wait) {
      std::vector<Completions::Done> done;
      {
        std::unique_lock<std::mutex> lock(completions->mu);
        if (completions->done.empty() && wait.count() > 0) {
          completions->cv.wait_for(lock, wait, [&] { return !completions->done.empty(); });
        }
        done.swap(completions->done);
      }
      for (auto& [row, st, ran] : done) {
        --pending;
        if (st.ok()) continue;
        const streams::SamplePtr s = std::move(rows[row]);
        free_rows.push_back(row);
        --live;
        if (!ran) {  // not decoded at all: not consumed, Leave hands it back
          --decodes_queued_;
          Fail(std::move(st));
          continue;
        }
        ++failed_;
        stream_->Ack(consumer_, {s->offset});  // consumed: a bad sample is not redelivered
        if (fail_on_error) {
          Fail(st.WithPrefix("on_error: fail"));
          continue;
        }
        spdlog::warn("job {}: skipped {}", spec_.job_id, st.message());
      }
    };
    while (!stop_) {
      collect(std::chrono::milliseconds(0));
      if (stop_) break;
      const bool full = live >= b;
      const bool at_max = max_samples > 0 && good + live >= max_samples;
      bool late = false;
      auto wait = std::chrono::milliseconds(100);
      if (have_first && delay.count() > 0) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(first + delay - Clock::now());
        late = left.count() <= 0;
        wait = std::min(wait, std::max(left, std::chrono::milliseconds(0)));
      }
      if (late && live == 0 && pending == 0) {  // every sample so far failed: wait for the next one
        have_first = false;
        late = false;
      }
      if (full || at_max || late || end) {
        if (pending == 0) {
          if (at_max) end = true;
          break;  // the batch is complete
        }
        collect(std::chrono::milliseconds(100));  // its last decodes; a failure may free rows
        continue;
      }
      uint64_t want = b - live;
      if (max_samples > 0) want = std::min<uint64_t>(want, max_samples - good - live);
      Result<streams::Stream::Taken> taken = stream_->Take(consumer_, static_cast<size_t>(want), wait);
      if (!taken.ok()) {
        if (taken.status().code() != StatusCode::kCancelled) Fail(taken.status());
        break;
      }
      for (streams::SamplePtr& s : taken->samples) {
        if (!have_first) {
          have_first = true;
          first = Clock::now();
        }
        ++tried_;
        const uint32_t row = free_rows.back();
        free_rows.pop_back();
        rows[row] = s;
        ++live;
        ++pending;
        auto report = std::make_shared<RowReport>(
            [completions, row](Status st, bool ran) { completions->Report(row, std::move(st), ran); });
        ++decodes_queued_;
        queue_->Post([this, report, sample = std::move(s), slot, row] {
          --decodes_queued_;
          ++decodes_running_;
          const Clock::time_point t0 = Clock::now();
          Status st = DecodeInto(*sample, slot, row);
          decode_stats_.Record(
              static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()),
              st.ok());
          --decodes_running_;
          report->Done(std::move(st));
        });
      }
      if (taken->end) end = true;
    }
    if (stop_) {
      // The slot's decodes still write into it: wait for them, then give the slot up. Its samples
      // are not acknowledged: Leave hands them back to the group.
      while (pending > 0) collect(std::chrono::milliseconds(100));
      (void)ring_.Abandon(slot);
      break;
    }
    // Move the decoded rows together (in row order) over the rows freed by failures.
    Batch batch;
    for (uint32_t r = 0; r < b; ++r) {
      if (!rows[r]) continue;
      if (r != batch.rows) MoveRow(slot, r, batch.rows);
      const streams::StreamSample& s = *rows[r];
      batch.offsets.push_back(s.offset);
      batch.keys.push_back(s.key);
      batch.labels.push_back(s.label);
      batch.metadata.push_back(s.metadata);
      ++batch.rows;
    }
    batch.last = end;
    good += batch.rows;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ready_[slot] = std::move(batch);
    }
    (void)ring_.MarkReady(slot);
    if (notify_) notify_();
  }
}

std::optional<Delivery> StreamJob::TakeNext() {
  if (ended_) return std::nullopt;
  auto lease = ring_.TakeNextReady();
  if (!lease) return std::nullopt;
  Batch batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ready_.find(lease->slot);
    if (it == ready_.end()) return std::nullopt;  // cannot happen: MarkReady follows the entry
    batch = std::move(it->second);
    ready_.erase(it);
  }
  Delivery d;
  proto::BatchReady& r = d.batch;
  r.set_slot(lease->slot);
  r.set_generation(lease->generation);
  r.set_seq(lease->seq);
  r.set_epoch(0);
  r.set_batch_in_epoch(batch_base_ + delivered_batches_);
  r.set_rows(batch.rows);
  for (size_t i = 0; i < batch.rows; ++i) {
    r.add_paths(batch.keys[i]);
    r.add_labels(batch.labels[i]);
    r.add_metadata(batch.metadata[i]);
    r.add_offsets(batch.offsets[i]);
    if (!delivered_any_ || batch.offsets[i] > max_delivered_) max_delivered_ = batch.offsets[i];
    delivered_any_ = true;
  }
  if (delivered_any_) {
    r.set_resume_token(EncodeStreamToken(stream_->name(), spec_.config.source.stream.group, max_delivered_,
                                         batch_base_ + delivered_batches_ + 1));
  }
  leased_[lease->slot] = std::move(batch.offsets);
  if (delivered_batches_ == 0) first_batch_seconds_ = SecondsSince(started_);
  ++delivered_batches_;
  delivered_samples_ += batch.rows;
  if (batch.last) {
    ended_ = true;
    // The last batch ends the job with it: the session drops the job once it is delivered, so no
    // release comes for it, nor for an earlier batch the client has not released yet (the client
    // keeps its mapping and reads what it was given). Every batch delivered counts as consumed now;
    // left unacknowledged, Leave would hand their samples to another consumer of the group as well
    // (duplicates at the tail of the stream).
    for (const auto& [leased_slot, offsets] : leased_) stream_->Ack(consumer_, offsets);
    leased_.clear();
    proto::EpochEnd e;
    e.set_epoch(0);
    e.set_samples(delivered_samples_);
    e.set_batches(batch_base_ + delivered_batches_);
    e.set_skipped(failed_.load());
    e.set_seconds(SecondsSince(started_));
    d.epoch_end = e;
    proto::JobEnd end;
    *end.mutable_stats() = Stats();
    d.job_end = end;
    spdlog::info("job {}: stream '{}' ended: {} batches, {} samples, {} skipped, {:.2f} s", spec_.job_id,
                 stream_->name(), delivered_batches_, delivered_samples_, failed_.load(), SecondsSince(started_));
  }
  return d;
}

Status StreamJob::Release(uint32_t slot, uint64_t generation) {
  SPDL_RETURN_IF_ERROR(ring_.Release(slot, generation));
  auto it = leased_.find(slot);
  if (it != leased_.end()) {
    stream_->Ack(consumer_, it->second);
    leased_.erase(it);
  }
  return Status::Ok();
}

Status StreamJob::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void StreamJob::Cancel() {
  stop_ = true;
  stream_->Cancel(consumer_);
  ring_.Close();
}

void StreamJob::Abort(Status reason) { Fail(std::move(reason)); }

proto::JobStats StreamJob::Stats() const {
  proto::JobStats st;
  const double seconds = SecondsSince(started_);
  st.set_samples(delivered_samples_);
  st.set_batches(delivered_batches_);
  st.set_skipped(failed_.load());
  st.set_seconds(seconds);
  st.set_first_batch_seconds(first_batch_seconds_ < 0 ? 0 : first_batch_seconds_);
  const shm::SlotRing::Counts counts = ring_.counts();
  st.set_batches_ready(counts.ready);
  st.set_batches_filling(counts.filling);
  st.set_weight(static_cast<uint32_t>(spec_.config.weight));
  st.set_samples_per_s(seconds > 0 ? static_cast<double>(delivered_samples_) / seconds : 0);
  st.set_samples_failed(failed_.load());
  st.set_samples_tried(tried_.load());
  // The decode stage's figures; its window is the job's life (a stream job keeps no window).
  pipeline::StageSnapshot decode = decode_stats_.Snapshot();
  decode.queue_length = decodes_queued_.load();
  decode.running = decodes_running_.load();
  FillStageStats(decode, decode, seconds, seconds, st.add_stages());
  return st;
}

}  // namespace spdl::jobs
