// StreamJob: a job of source.type: stream (issue 21) as a JobHandle — a consumer of one group of a
// named stream (streams/stream.h) that decodes the samples as they arrive into the job's shared
// slots, with the same decoder, tensors and delivery as any image job (MediaJob), but no epochs and
// no sampler: batches are filled in the order the stream hands samples out.
//
// A batch is sent when full or, with max_batch_delay_ms, that long after its first sample with the
// rows it has (BatchReady.rows). The job ends when the stream is closed and drained (or after
// source.max_samples), with a last batch that may hold 0 rows and carries JobEnd.
// Exactness: a sample is acknowledged to the stream when the client releases the slot that holds
// it; when the job ends in any other way (the client died: kill -9, a cancel, a failure) its
// un-acknowledged samples (filling, ready or leased) go back to its group. A sample that fails to
// decode is acknowledged at once (it is consumed, counted in skipped / samples_failed) and, with
// on_error: fail, fails the job. BatchReady.resume_token is a stream token (EncodeStreamToken): the
// highest offset the job has delivered.
//
// Threading: JobHandle methods run on the control thread. Decoding and transforms run on the
// daemon's shared worker pool (the executor given to Start, through the job's own weighted queue,
// like a file job's decode stage), so stream jobs share the node's thread budget with every other
// job. One light dispatcher thread per job takes samples from the stream (waiting at most 100 ms
// at a time, so Cancel is seen at once), gives each a row of the slot being filled and posts its
// decode; it closes the batch (full, max_batch_delay_ms, the end, max_samples) once the batch's
// decodes are done, moving rows together over failed ones, and a failed sample frees its row for
// the next one, so a full batch stays full. The ring's free slots are its backpressure. The
// destructor (control thread, or whichever drops the last reference) stops and joins the
// dispatcher, which first waits for its posted decodes, then leaves the group.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "jobs/job_service.h"
#include "jobs/media_job.h"
#include "pipeline/executor.h"
#include "pipeline/stage_stats.h"
#include "proto/shm_layout.h"
#include "shm/shared_region.h"
#include "shm/slot_ring.h"
#include "streams/stream.h"

namespace spdl::jobs {

// A stream job's resume token: the stream, the group, the last offset delivered, and the number of
// the next batch (a resumed job goes on numbering its batches from there, as epoch jobs do).
std::string EncodeStreamToken(const std::string& stream, const std::string& group, uint64_t offset,
                              uint64_t next_batch);
struct StreamToken {
  std::string stream;
  std::string group;
  uint64_t offset = 0;
  uint64_t next_batch = 0;
};
// kInvalidArgument when `token` is not a stream token (an epoch job's token, garbage).
Result<StreamToken> DecodeStreamToken(const std::string& token);

class StreamJob final : public JobHandle {
 public:
  // Joins `group` of `stream` (right after *resume_after, see Stream::Join), creates the region and
  // starts the filler. spec.config.source.type is stream; spec.source is unused (null).
  // Errors: Stream::Join's (an evicted resume point: kDataLoss), the region's.
  // A resumed job's first batch is numbered `first_batch` (its token's next_batch).
  // Decodes run on `executor` (the daemon's worker pool, or its group for the job's uid).
  // REQUIRES: executor != nullptr and it outlives the job.
  static Result<std::shared_ptr<StreamJob>> Start(MediaJobSpec spec, std::shared_ptr<streams::Stream> stream,
                                                  std::optional<uint64_t> resume_after, uint64_t first_batch,
                                                  std::unique_ptr<BudgetLease> budget, std::function<void()> notify,
                                                  pipeline::Executor* executor);
  // The region a job with this spec needs: the decoder's tensors and the label (MediaJob's layout
  // for a job without extra outputs, targets or mix, which stream jobs refuse).
  static proto::SlotLayout LayoutFor(const MediaJobSpec& spec) { return MediaJob::LayoutFor(spec); }
  ~StreamJob() override;

  const proto::JobAccepted& accepted() const override { return accepted_; }
  int region_fd() const override { return region_.fd(); }
  std::optional<Delivery> TakeNext() override;
  Status Release(uint32_t slot, uint64_t generation) override;
  Status failure() const override;
  void Cancel() override;
  void Abort(Status reason) override;
  proto::JobStats Stats() const override;

  StreamJob(MediaJobSpec spec, std::shared_ptr<streams::Stream> stream, streams::ConsumerId consumer,
            shm::SharedRegion region, proto::SlotLayout layout, std::unique_ptr<BudgetLease> budget,
            std::function<void()> notify, pipeline::Executor* executor);

 private:
  struct Batch {
    uint32_t rows = 0;
    bool last = false;
    std::vector<uint64_t> offsets;
    std::vector<std::string> keys;
    std::vector<int64_t> labels;
    std::vector<std::string> metadata;
  };
  // What the decode tasks of the slot being filled report back to the dispatcher (shared with
  // the tasks, so a task that finishes after the dispatcher moved on touches only this).
  struct Completions {
    std::mutex mu;
    std::condition_variable cv;
    struct Done {
      uint32_t row;
      Status status;
      bool ran;  // false: the pool dropped the task (it stopped), the sample was not decoded
    };
    std::vector<Done> done;  // guarded by mu
    void Report(uint32_t row, Status st, bool ran);
  };
  void Fill();  // the dispatcher thread
  // Decodes `s` into row `row` of `slot` (a worker thread). Errors name the sample's key.
  Status DecodeInto(const streams::StreamSample& s, uint32_t slot, uint32_t row);
  // Copies row `from` of `slot` over row `to` (every tensor, the label included).
  void MoveRow(uint32_t slot, uint32_t from, uint32_t to);
  void Fail(Status reason);

  // Constant after construction (teardown order: the thread is joined in the destructor first).
  std::unique_ptr<BudgetLease> budget_;
  const MediaJobSpec spec_;
  const std::shared_ptr<streams::Stream> stream_;
  const streams::ConsumerId consumer_;
  shm::SharedRegion region_;
  const proto::SlotLayout layout_;
  std::vector<RowTensor> tensors_;  // the decoder's, then the label
  const std::function<void()> notify_;
  const std::chrono::steady_clock::time_point started_;
  proto::JobAccepted accepted_;
  shm::SlotRing ring_;
  std::unique_ptr<pipeline::Executor> queue_;  // this job's queue on the shared worker pool
  // The decode tasks' figures (JobStats.stages "decode", as a file job's decode stage): tasks,
  // failures, task times; decodes posted and not started, and running.
  pipeline::StageStats decode_stats_{"decode", pipeline::StageKind::kCpu, 0, 0};
  std::atomic<uint64_t> decodes_queued_{0};
  std::atomic<uint64_t> decodes_running_{0};

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> failed_{0};
  std::atomic<uint64_t> tried_{0};
  mutable std::mutex mu_;
  // Guarded by mu_.
  std::map<uint32_t, Batch> ready_;  // by slot: written by the filler, taken by TakeNext
  Status failure_;

  // Control thread only.
  std::map<uint32_t, std::vector<uint64_t>> leased_;  // by slot: offsets to acknowledge at Release
  uint64_t max_delivered_ = 0;
  bool delivered_any_ = false;
  uint64_t delivered_samples_ = 0;
  uint64_t delivered_batches_ = 0;
  uint64_t batch_base_ = 0;  // a resumed job's first batch number
  double first_batch_seconds_ = -1;
  bool ended_ = false;

  std::thread filler_;  // last: started when everything above is built (the dispatcher)
};

}  // namespace spdl::jobs
