// MediaJob: one running job of any media kind (image, audio, video) — its sample source, shared
// region, slot ring, row processor and pipeline — as a JobHandle for the session that submitted
// it. What differs between the kinds (the decode and its tensors) is the spec's SampleDecoder; the
// job adds the `label` tensor (int64 [B]) after the decoder's tensors, then per extra output
// (config extra_outputs: a sidecar's bytes, read in the read stage) `<name>` uint8 [B, max_bytes]
// and `<name>_length` int32 [B].
//
// Threading: JobHandle methods run on the control thread; the pipeline's row tasks run on the
// shared worker pool and keep the job alive (shared_ptr) until they end, so the region is unmapped
// only after the last row is written. The destructor may therefore run on a worker thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "io/mixed_source.h"
#include "io/sample_source.h"
#include "jobs/gpu_batch_decode.h"
#include "jobs/job_service.h"
#include "jobs/resume_token.h"
#include "jobs/sample_decoder.h"
#include "jobs/targets.h"
#include "pipeline/batch_pipeline.h"
#include "pipeline/executor.h"
#include "proto/shm_layout.h"
#include "shm/shared_region.h"
#include "shm/slot_ring.h"

namespace spdl::jobs {

// Everything a job needs, resolved and validated by the registry.
class DecodedCacheSource;

struct MediaJobSpec {
  uint64_t job_id = 0;
  config::JobConfig config;
  std::shared_ptr<const io::SampleSource> source;  // the dataset (immutable, read from worker threads)
  // A mix (config `sources:`): source is the sources' MixedSource (wrapped), ordered by
  // io::MixedEpochOrder over this plan; nullptr for a single source.
  std::shared_ptr<const io::MixPlan> mix;
  std::shared_ptr<const SampleDecoder> decoder;  // MakeSampleDecoder(config)
  // With cache.decoded: `source` itself. Its misses are read as they are by the read stage and
  // shrunk and cached by the decode stage (on the worker pool, not the I/O pool).
  std::shared_ptr<const DecodedCacheSource> decoded;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t epochs = 1;  // 0 = endless
  PeerInfo owner;
  Fingerprint fingerprint;                      // JobFingerprint(): ties resume tokens to this job
  std::optional<pipeline::ResumePoint> resume;  // continue from a resume token
  // decode.device: cuda: the batch decode on the job's GPU (its device slots attached by the GPU
  // delivery); null for a CPU decode. The decode stage then only keeps each row's file bytes, and
  // the batch stage decodes the whole batch into the device slot.
  std::shared_ptr<GpuBatchDecode> gpu_decode;
#if SPDL_TEST_HOOKS
  // A test seam: called at the start of every stage of every sample (stage, sample index), on the
  // stage's thread; it may throw, to test that an exception in a task fails only that sample.
  std::function<void(uint32_t stage, uint64_t index)> stage_hook;
#endif
};

// Returned by the registry's admission; releases the job's share of the memory budget when
// destroyed (whichever thread destroys the job).
class BudgetLease {
 public:
  virtual ~BudgetLease() = default;
};

class MediaJob final : public JobHandle, public pipeline::RowProcessor {
 public:
  // Creates the region and ring and starts filling slots. `notify` as in JobService::Submit.
  // The read stage runs on `io_executor` (nullptr: on `executor`), decode on `executor`.
  static Result<std::shared_ptr<MediaJob>> Start(MediaJobSpec spec, pipeline::Executor* executor,
                                                 std::unique_ptr<BudgetLease> budget, std::function<void()> notify,
                                                 pipeline::Executor* io_executor = nullptr);
  // The region size a job with this spec needs (for admission before anything is allocated).
  static proto::SlotLayout LayoutFor(const MediaJobSpec& spec);
  ~MediaJob() override;

  // JobHandle.
  const proto::JobAccepted& accepted() const override { return accepted_; }
  int region_fd() const override { return region_.fd(); }
  std::optional<Delivery> TakeNext() override;
  Status Release(uint32_t slot, uint64_t generation) override;
  Status failure() const override { return pipeline_->failure(); }
  void Cancel() override;
  void Abort(Status reason) override { pipeline_->Abort(std::move(reason)); }
  proto::JobStats Stats() const override;

  // RowProcessor (worker threads): "read" (io) reads the sample's bytes into the row's buffer,
  // "decode" (cpu) decodes them (with the image transforms, or the audio / video clip selection)
  // straight into the row.
  std::vector<pipeline::StageSpec> Stages() const override {
    return {{"read", pipeline::StageKind::kIo}, {"decode", pipeline::StageKind::kCpu}};
  }
  Status RunStage(uint32_t stage, pipeline::RowTask& t) override;
  void MoveRow(uint32_t slot, uint32_t from, uint32_t to) override;
  // decode.device: cuda: the batch's kept file bytes decoded on the GPU into the device slot (rows
  // that fail there are packed out and reported).
  Status BatchStage(uint32_t slot, uint32_t rows, std::vector<BatchRowFailure>* failed) override;
  // mix: the batch's images and soft labels mixed (media/mix.h), drawn from (seed, epoch, batch).
  void BatchWritten(uint32_t slot, uint32_t epoch, uint64_t batch_in_epoch, uint32_t rows) override;
  // The decoder's user-op figures ("op:NAME" rows, their time part of decode's).
  std::vector<const pipeline::StageStats*> SubStageStats() const override { return spec_.decoder->SubStageStats(); }

  MediaJob(MediaJobSpec spec, shm::SharedRegion region, proto::SlotLayout layout, std::unique_ptr<BudgetLease> budget);

 private:
  // Read stage: each extra output's sidecar bytes (zero-padded) and length into the row; the
  // sample fails by the output's on_missing / on_overflow policy.
  Status ReadExtraOutputs(const pipeline::RowTask& t) const;

  // Slots of the ring in use when the job starts; it grows up to `prefetch` while the client waits
  // for data and the pipeline waits for a slot (shm/slot_ring.h, "Adaptive size"). Two: one the
  // client holds, one being filled.
  static constexpr uint32_t kInitialSlots = 2;
  // RowTask::mark of a decoded-cache miss: the decode stage shrinks and caches it first.
  static constexpr uint32_t kMarkShrink = 1;

  // Constant after Start(). Declared in teardown order: the pipeline goes first, the region last
  // but one, the budget lease last (so the budget is freed only once the memory is).
  std::unique_ptr<BudgetLease> budget_;
  const MediaJobSpec spec_;
  shm::SharedRegion region_;
  const proto::SlotLayout layout_;
  std::vector<RowTensor> tensors_;  // the decoder's tensors, the label, two per extra output, the targets
  const size_t label_tensor_;       // the label's index in tensors_ (= the decoder's tensor count)
  const TargetWriter targets_;      // boxes / mask that follow the image (none for most jobs)
  const size_t targets_tensor_;     // the first target's index in tensors_
  const std::chrono::steady_clock::time_point started_;
  proto::JobAccepted accepted_;
  bool discard_failed_ = false;  // giving a released slot's pages back failed once: not tried again (ring_'s lock)
  // Set once the job will fill no more slots (its last batch was taken, or it was cancelled): a
  // slot released after that keeps its pages, since a trainer (or a share group's other members)
  // may still read its last batches, and no new batch needs the memory; it goes with the region.
  std::atomic<bool> filling_done_{false};
  shm::SlotRing ring_;
  std::unique_ptr<pipeline::BatchPipeline> pipeline_;

  // decode.device: cuda: per slot and row, the file's bytes (and the sample) kept by the decode
  // stage for the batch stage. Sized at Start; a row's entry is touched only by the thread that
  // runs that row's stage, then by the batch stage (after every row of the slot is done).
  struct GpuRow {
    std::vector<uint8_t> bytes;
    uint64_t index = 0;
    uint64_t seed = 0;
  };
  std::vector<std::vector<GpuRow>> gpu_rows_;

  // Control thread only.
  uint64_t delivered_samples_ = 0;
  uint64_t delivered_batches_ = 0;
  std::vector<uint64_t> source_samples_;  // a mix: samples delivered per source (JobStats.source_samples)
  uint64_t epoch_samples_ = 0;
  double first_batch_seconds_ = -1;
  std::chrono::steady_clock::time_point epoch_started_;
};

}  // namespace spdl::jobs
