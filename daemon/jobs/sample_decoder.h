// SampleDecoder: what differs between job kinds (image, audio, video) — the tensors a sample
// fills and how its bytes are decoded into them. MediaJob owns everything else (region, ring,
// pipeline, delivery) and appends the `label` tensor itself.
//
// Tensors per media kind (B = batch size; each tensor's rows are C-contiguous, batch first):
//   image  image  uint8|float32|float16|bfloat16 [B, H, W, C] or [B, C, H, W] (C = 3, or 1 with
//                 decode.color: gray)
//   audio  audio  float32|int16 [B, C, L] (channels first)   length  int64 [B]: valid samples
//   video  video  uint8 [B, T, H, W, 3] (RGB)                 frames  int64 [B]: real frames
//
// User ops (config `op:` transforms, include/spdl/op.h) in an image job: the decoder makes the
// uint8 HWC image at the output size (the geometry: resize, crops; ops placed before the geometry
// run inside that, on the whole decoded image, through media::ImageDecoder::DecodeWithHookInto's
// full-size path), then runs the ops and the horizontal flip in the order the config lists them on
// it, then normalizes / converts it to the output dtype and layout. With output uint8 NHWC that image is the batch row
// itself (the ops edit shared memory in place, nothing is copied); otherwise it is a per-thread scratch image and the
// conversion is the same output pass the decoder uses (media/pixel_convert.h), so a job whose ops
// change nothing delivers the same values as one without them (16-bit sources excepted: with ops
// they go through 8 bits). Each op's seed is media::UserOpSeed(sample seed, its index among the
// ops); each op's time is its own row of the job's stage figures ("op:NAME", part of decode's
// time, see SubStageStats).
//
// Threading: a SampleDecoder is immutable after MakeSampleDecoder (its op figures are atomic
// counters); Decode may run on many worker threads at once (each thread keeps its own FFmpeg /
// libjpeg-turbo decoder and scratch image, thread_local).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/job_config.h"
#include "jobs/memory_budget.h"
#include "media/image_decoder.h"
#include "pipeline/stage_stats.h"
#include "proto/control.pb.h"

namespace spdl::plugins {
class OpLoader;
}

namespace spdl::jobs {

// One output tensor of a sample: its shape without the batch dimension and its bytes per row.
struct RowTensor {
  std::string name;
  proto::DType dtype = proto::UINT8;
  std::vector<int64_t> row_shape;
  uint64_t row_bytes = 0;
};

class SampleDecoder {
 public:
  virtual ~SampleDecoder() = default;

  // The tensors Decode fills, in order (the label is not among them).
  virtual const std::vector<RowTensor>& tensors() const = 0;

  // Whether Decode draws from `sample_seed` (random crops and starts). When false the caller may
  // pass 0.
  virtual bool random() const = 0;

  // Decodes one sample's bytes into its rows: rows[i] points at tensors()[i].row_bytes bytes.
  // `sample_seed` is media::SampleSeed(job seed, epoch, sample index). Errors are the decoder's
  // (kDataLoss for bad data, kResourceExhausted for a guard, ...); rows may then hold partial output.
  virtual Status Decode(std::span<const uint8_t> bytes, uint64_t sample_seed, std::span<uint8_t* const> rows) const = 0;

  // ---- targets that follow the image (boxes, masks: jobs/targets.h) ----
  // Image decoders without user ops: the ops that place the image; nullptr for every other decoder.
  virtual const media::ImageOps* image_ops() const { return nullptr; }
  // As Decode; *info (when given) gets what the image decoder did (stored size, EXIF orientation,
  // random crop, flip) and, in info->after, the geometric steps run after it (random_crop, the
  // flip as a pixel step, the augmentations' drawn maps) for targets to follow.
  // REQUIRES: image_ops() != nullptr.
  virtual Status DecodeImage(std::span<const uint8_t> bytes, uint64_t sample_seed, std::span<uint8_t* const> rows,
                             media::ImageInfo* /*info*/) const {
    return Decode(bytes, sample_seed, rows);
  }

  // Figures timed inside Decode: one per user op ("op:NAME"), in chain order; alive as long as
  // the decoder. Empty without ops.
  virtual std::vector<const pipeline::StageStats*> SubStageStats() const { return {}; }
};

// The decoder for a validated job config (its media, transforms / audio / video blocks).
// The decoder for a validated job config (its media, transforms / audio / video blocks).
// kInvalidArgument naming the key when the config asks for something the decoders refuse. User
// ops are made through *ops (their libraries loaded, `create` run with their args); an op that
// cannot be made refuses the job with its reason and its entry's path and line. `ops` may be null
// when the config has no op entries (else: ops are disabled).
// With `budget`, an image decode whose scratch (estimated from the header: the decoded frame and
// its conversion, at the format's bit depth) is kScratchAccountFrom or more reserves it from the
// budget first, and fails the sample (kResourceExhausted) when it does not fit. (Jobs with user ops
// decode through the full-size path without this accounting: their libraries are an
// administrator's choice, and decode.max_pixels still bounds them.)
Result<std::shared_ptr<const SampleDecoder>> MakeSampleDecoder(const config::JobConfig& config,
                                                               plugins::OpLoader* ops = nullptr,
                                                               std::shared_ptr<MemoryBudget> budget = nullptr);

// Decodes that need less scratch than this are not accounted (they are what the worker threads'
// ordinary working set covers).
inline constexpr uint64_t kScratchAccountFrom = 32ull << 20;

// The scratch a decode of the encoded image `bytes` needs, estimated from its header alone; 0 when
// the header says nothing (the decoder then reports the problem). JPEG: 3 bytes per pixel; PNG:
// 4, or 8 at 16 bits; other formats 8; twice that for the frame and its conversion.
// *pixels (when given) gets the header's width x height (0 when unknown).
uint64_t EstimateDecodeScratch(std::span<const uint8_t> bytes, uint64_t* pixels = nullptr);

// A large image's decode scratch, reserved from the daemon's memory budget (memory_budget.h) for
// as long as the lease lives; an empty lease without a budget, for a small image, or for one over
// max_pixels (the decoder refuses it from the header, naming the limit).
Result<MemoryBudget::Lease> ReserveDecodeScratch(MemoryBudget* budget, std::span<const uint8_t> bytes,
                                                 int64_t max_pixels);

}  // namespace spdl::jobs
