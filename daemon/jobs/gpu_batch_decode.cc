#include "jobs/gpu_batch_decode.h"

#include <spdlog/spdlog.h>

#include <string>
#include <thread>
#include <utility>

#include "jobs/sample_decoder.h"

namespace spdl::jobs {
namespace {

using Clock = std::chrono::steady_clock;

// How long a finished batch waits for the delivery's device slots (they are made right after the
// job starts, off the control thread).
constexpr std::chrono::seconds kAttachTimeout{120};

}  // namespace

Status GpuBatchDecode::Check(const SampleDecoder& cpu) {
  const media::ImageOps* ops = cpu.image_ops();
  if (ops == nullptr) return InvalidArgument("decode.device: cuda decodes images only");
  if (cpu.tensors().size() != 1) {
    return InvalidArgument("decode.device: cuda writes one image tensor per sample (this job's decoder writes " +
                           std::to_string(cpu.tensors().size()) + ")");
  }
  return CheckGpuDecodeOps(*ops);
}

GpuBatchDecode::GpuBatchDecode(const config::JobConfig& config, std::shared_ptr<const SampleDecoder> cpu,
                               GpuDecodePartsFn parts)
    : cpu_(std::move(cpu)),
      parts_fn_(std::move(parts)),
      tables_(MakeGpuValueTables(*cpu_->image_ops())),
      out_width_(config.out_width),
      out_height_(config.out_height),
      row_bytes_(cpu_->tensors().at(0).row_bytes) {}

GpuBatchDecode::~GpuBatchDecode() { Detach(); }

Status GpuBatchDecode::Attach(Target target) {
  std::lock_guard lock(mu_);
  if (detached_ || cancelled_.load()) return FailedPrecondition("the job has ended");
  if (attached_) return FailedPrecondition("GPU decode: attached twice");
  if (!parts_fn_) return FailedPrecondition("this spdld has no GPU JPEG decode (built without nvJPEG)");
  SPDL_ASSIGN_OR_RETURN(parts_, parts_fn_(target.device, target.backend));
  if (parts_.device == nullptr || parts_.jpeg == nullptr || parts_.kernels == nullptr) {
    return Internal("GPU decode: the device's decode parts are incomplete");
  }
  cuda::GpuJpegBatchDecoder::Options o;
  o.output_bytes = row_bytes_;
  if (const media::ImageOps* ops = cpu_->image_ops(); ops != nullptr && ops->max_pixels > 0) {
    o.max_pixels = ops->max_pixels;
  }
  decoder_ = std::make_unique<cuda::GpuJpegBatchDecoder>(
      *parts_.device, *parts_.jpeg, *parts_.kernels,
      [this](std::span<const uint8_t> jpeg, void* out, size_t bytes) -> Status {
        // The CPU path, exactly as the CPU decode stage runs it (the batch's thread, mu_ held).
        if (bytes != row_bytes_) return Internal("GPU decode: the CPU fallback's row has the wrong size");
        uint64_t seed = 0;
        for (size_t i = 0; i < seed_keys_.size(); ++i) {
          if (seed_keys_[i] == jpeg.data()) seed = seeds_[i];
        }
        uint8_t* row = static_cast<uint8_t*>(out);
        return cpu_->Decode(jpeg, seed, std::span<uint8_t* const>(&row, 1));
      },
      o);
  target_ = std::move(target);
  attached_ = true;
  spdlog::info("GPU decode on cuda:{} with {}{}", target_.device, parts_.jpeg->name(),
               parts_.jpeg->hardware() ? " (hardware decoder)" : "");
  cv_.notify_all();
  return Status::Ok();
}

void GpuBatchDecode::Detach() {
  cancelled_.store(true);
  cv_.notify_all();
  std::lock_guard lock(mu_);  // waits for a running batch (its waits give up at once now)
  detached_ = true;
  decoder_.reset();  // waits for its last batch, frees its device memory and staging
}

void GpuBatchDecode::Cancel() {
  cancelled_.store(true);
  cv_.notify_all();
}

Status GpuBatchDecode::WaitAttachedLocked(std::unique_lock<std::mutex>& lock) {
  const bool ok = cv_.wait_for(lock, kAttachTimeout, [this] { return attached_ || detached_ || cancelled_.load(); });
  if (detached_ || cancelled_.load()) return Cancelled("the job has ended");
  if (!ok || !decoder_) return Unavailable("GPU decode: the job's device slots were not set up in time");
  return Status::Ok();
}

Status GpuBatchDecode::WaitSlotFree(uint32_t slot) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    if (cancelled_.load()) return Cancelled("the job has ended");
    SPDL_ASSIGN_OR_RETURN(bool free, target_.slot_free(slot));
    if (free) return Status::Ok();
    if (Clock::now() - start > target_.consumer_timeout) {
      return Unavailable("GPU decode: the trainer's GPU work on device slot " + std::to_string(slot) +
                         " did not finish within " + std::to_string(target_.consumer_timeout.count()) +
                         " ms of its release (its consumer-done event never completed: is the trainer stalled or "
                         "dead?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

Result<std::vector<Status>> GpuBatchDecode::DecodeBatch(uint32_t slot, std::span<const std::span<const uint8_t>> jpegs,
                                                        std::span<const uint64_t> seeds) {
  std::unique_lock lock(mu_);
  SPDL_RETURN_IF_ERROR(WaitAttachedLocked(lock));
  SPDL_RETURN_IF_ERROR(WaitSlotFree(slot));
  auto* images = static_cast<uint8_t*>(target_.images(slot));
  seeds_.assign(seeds.begin(), seeds.end());
  seed_keys_.clear();
  std::vector<cuda::GpuDecodeSample> samples(jpegs.size());
  for (size_t i = 0; i < jpegs.size(); ++i) {
    seed_keys_.push_back(jpegs[i].data());
    cuda::GpuDecodeSample& s = samples[i];
    s.jpeg = jpegs[i];
    s.dst = images + i * row_bytes_;
    const media::ImageOps* ops = cpu_->image_ops();
    s.plan = [this, ops, seed = seeds[i]](int w, int h,
                                          cuda::imgmath::OutputSpec* o) -> Result<cuda::imgmath::ResizePlan> {
      bool flip = false;
      SPDL_ASSIGN_OR_RETURN(auto plan, PlanGpuImage(*ops, w, h, out_width_, out_height_, seed, &flip));
      *o = tables_.spec;
      o->width = out_width_;
      o->height = out_height_;
      o->flip = flip;
      o->lut_f32 = tables_.f32.empty() ? nullptr : tables_.f32.data();
      o->lut_u16 = tables_.u16.empty() ? nullptr : tables_.u16.data();
      return plan;
    };
  }
  std::vector<Status> result = decoder_->DecodeBatch(samples, target_.stream);
  // The rows are complete (and the files' bytes free to go) once the device has run the batch.
  Status finished = decoder_->Finish();
  {
    std::lock_guard stats_lock(stats_mu_);
    stats_ = decoder_->stats();
  }
  SPDL_RETURN_IF_ERROR(finished);
  // A failure of the device or of the decoder itself (not of a file) fails the job, not a sample.
  for (const Status& s : result) {
    if (s.code() == StatusCode::kInternal || s.code() == StatusCode::kUnavailable) return s;
  }
  return result;
}

void GpuBatchDecode::FillStats(proto::JobStats* st) const {
  std::lock_guard lock(stats_mu_);
  st->set_gpu_decode_batches(stats_.batches);
  st->set_gpu_decoded(stats_.gpu_decoded);
  st->set_gpu_decode_fallbacks(stats_.cpu_fallback);
  st->set_gpu_decode_fallback_header(stats_.fallback_header);
  st->set_gpu_decode_fallback_unsupported(stats_.fallback_unsupported);
  st->set_gpu_decode_fallback_decode(stats_.fallback_decode);
  st->set_gpu_decode_batch_retries(stats_.batch_retries);
  st->set_gpu_decode_failed(stats_.failed);
}

}  // namespace spdl::jobs
