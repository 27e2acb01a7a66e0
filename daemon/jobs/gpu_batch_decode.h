// GpuBatchDecode: the batch half of one job's GPU JPEG decode (decode.device: cuda).
//
// The job's read stage reads the files; its decode stage only keeps each row's bytes and writes the
// label; then, once a batch's rows are all there (BatchPipeline's batch stage), DecodeBatch decodes
// them with cuda::GpuJpegBatchDecoder (one nvJPEG batch; resize / crop / flip / normalise on the
// device per jobs::PlanGpuImage) straight into the image tensor of the job's device slot, and the
// samples nvJPEG cannot take on the CPU (the job's own SampleDecoder, into a page-locked staging row,
// uploaded into the device slot row). The rest of the slot (labels, ...) goes with the slot's copy
// (DeviceSlotPoolOptions::copy_offset: the copy skips the image tensor).
//
// Life cycle: made with the job (MediaJobSpec::gpu_decode), before the device slots exist; the GPU
// delivery Attaches the slots once it has made them (its parts — nvJPEG, the kernels — are made
// then, off the control thread); a batch finished before that waits for it (bounded). Detach (the
// delivery's teardown, off the control thread) waits for a running batch, then frees the decoder's
// device memory and staging, before the slots go. Cancel wakes every wait (the job ended).
//
// Device slot reuse: a batch is decoded into device slot S only once the client's consumer-done
// event of S's last use has completed (Target::slot_free, a host query polled every ms), never
// while the trainer may still read it; past consumer_timeout only this job fails.
//
// Thread safety: DecodeBatch from the pipeline's threads (one batch at a time: a mutex), Attach /
// Detach / Cancel / stats from any thread. stats() never waits for a batch.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "common/status.h"
#include "config/job_config.h"
#include "cuda/device_backend.h"
#include "cuda/jpeg_decode.h"
#include "jobs/gpu_decode_plan.h"
#include "proto/control.pb.h"

namespace spdl::jobs {

class SampleDecoder;

// The device's decode parts (borrowed from the daemon: they outlive every job of the device).
struct GpuDecodeParts {
  cuda::DeviceBackend* device = nullptr;
  cuda::JpegDecodeBackend* jpeg = nullptr;
  cuda::ImageKernels* kernels = nullptr;
};
// Makes (or finds) the parts of the daemon's device `device` whose DeviceBackend is `backend`; an
// error says why there are none (no nvJPEG, ...). Thread-safe; may be slow (loads nvJPEG).
using GpuDecodePartsFn = std::function<Result<GpuDecodeParts>(int device, cuda::DeviceBackend* backend)>;

class GpuBatchDecode {
 public:
  // Where a batch's images go: the job's device slots.
  struct Target {
    int device = -1;                             // the daemon's ordinal
    cuda::DeviceBackend* backend = nullptr;      // its backend
    std::function<void*(uint32_t slot)> images;  // device address of slot S's image tensor
    cuda::Stream stream;                         // the slots' copy stream (the decode is ordered before the copy)
    std::function<Result<bool>(uint32_t slot)> slot_free;  // the device slot may be written (consumer done)
    std::chrono::milliseconds consumer_timeout{60000};
  };

  // REQUIRES: CheckGpuDecodeOps(*cpu->image_ops()).ok(); cpu has one tensor (the image).
  // `parts` makes the device's parts at Attach.
  GpuBatchDecode(const config::JobConfig& config, std::shared_ptr<const SampleDecoder> cpu, GpuDecodePartsFn parts);
  ~GpuBatchDecode();
  GpuBatchDecode(const GpuBatchDecode&) = delete;
  GpuBatchDecode& operator=(const GpuBatchDecode&) = delete;

  // Ok when the job can decode on the GPU (image ops the GPU path runs); else kInvalidArgument.
  static Status Check(const SampleDecoder& cpu);

  // The delivery's device slots are there: makes the device's parts and the batch decoder. Errors:
  // the parts' (kUnavailable naming nvJPEG when it cannot be loaded), or kFailedPrecondition after
  // Detach / Cancel.
  Status Attach(Target target);
  // Waits for a running batch, then frees the decoder's device memory and staging; later batches
  // fail (kCancelled). Call before the device slots go. Idempotent.
  void Detach();
  // The job ended: batches waiting (for Attach or for a device slot) give up at once. Idempotent.
  void Cancel();

  // Decodes jpegs[i] (with sample seed seeds[i]) into row i of slot `slot`'s image tensor and waits
  // until the device has run it. One Status per row (a failed row's output is undefined; the
  // caller drops it). A non-OK return: the batch as a whole failed (the device, a timeout waiting
  // for the trainer, no Attach) and the job fails.
  // REQUIRES: jpegs.size() == seeds.size() <= the job's batch size.
  Result<std::vector<Status>> DecodeBatch(uint32_t slot, std::span<const std::span<const uint8_t>> jpegs,
                                          std::span<const uint64_t> seeds);

  // The counts so far, as JobStats fields (gpu_decode_*).
  void FillStats(proto::JobStats* stats) const;

 private:
  // Waits until attached (or detached / cancelled / timed out). REQUIRES: mu_ held via `lock`.
  Status WaitAttachedLocked(std::unique_lock<std::mutex>& lock);
  // Polls target_.slot_free(slot) until true. REQUIRES: mu_ held (the batch's).
  Status WaitSlotFree(uint32_t slot);

  const std::shared_ptr<const SampleDecoder> cpu_;
  const GpuDecodePartsFn parts_fn_;
  GpuValueTables tables_;
  int out_width_ = 0, out_height_ = 0;
  size_t row_bytes_ = 0;

  std::mutex mu_;  // held for a whole batch
  std::condition_variable cv_;
  // Guarded by mu_.
  bool attached_ = false;
  bool detached_ = false;
  Target target_;
  GpuDecodeParts parts_;
  std::unique_ptr<cuda::GpuJpegBatchDecoder> decoder_;
  std::vector<uint64_t> seeds_;            // the running batch's, for the CPU path
  std::vector<const uint8_t*> seed_keys_;  // the jpeg each seed belongs to
  std::atomic<bool> cancelled_{false};     // Cancel or Detach: waits give up

  mutable std::mutex stats_mu_;
  cuda::GpuDecodeStats stats_;  // guarded by stats_mu_: the decoder's, after each batch
};

}  // namespace spdl::jobs
