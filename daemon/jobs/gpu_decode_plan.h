// GPU decode plans (decode.device: cuda): what the GPU does to one decoded JPEG, worked out on the
// host with the CPU path's own geometry and weights, so that the GPU's pixels are the CPU path's
// for the same decoded image.
//
// PlanGpuImage follows media::ImageDecoder's exact path step for step: the geometry
// (PlanResizeCrop, or PlanRandomResizedCrop drawn from the sample's seed with the same random
// stream), the flip (its own random stream), PIL's fixed-point weights of each axis
// (media::ComputeAxisWeights; nearest as one tap of weight 1.0), and the output values of the 256
// uint8 levels per channel (media::ValueTable: x / 255, normalised, in the output dtype). The GPU
// kernels (gpu/cuda/image_kernels.cu) and the fake kernels run gpu/cuda/image_math.h on it.
//
// What a plan cannot express goes to the CPU path for that sample (kFailedPrecondition, with the
// reason, counted as a CPU fallback): EXIF orientation, gray output, padding (a crop larger than the
// resized image), 16-bit sources (JPEG has none here).
//
// Thread safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "cuda/image_math.h"
#include "media/image_ops.h"

namespace spdl::jobs {

// The output value tables of one job's ops (shared by its samples).
struct GpuValueTables {
  cuda::imgmath::OutputSpec spec;  // dtype, layout, channels (sizes and flip per sample)
  std::vector<float> f32;          // [3][256] for float32
  std::vector<uint16_t> u16;       // [3][256] for float16 / bfloat16
};

// Ok when ops can run on the GPU path at all (RGB output; no EXIF orientation); else
// kInvalidArgument naming the setting.
Status CheckGpuDecodeOps(const media::ImageOps& ops);

// The value tables of ops. REQUIRES: CheckGpuDecodeOps(ops).ok(), ValidateImageOps(ops).ok().
GpuValueTables MakeGpuValueTables(const media::ImageOps& ops);

// The plan of one width x height image (as stored) whose output is out_width x out_height, for the
// sample seed `seed`; *flip receives the drawn flip. kFailedPrecondition (-> CPU fallback) for a
// padded geometry; kInvalidArgument when the ops give another output size (as the CPU path).
// REQUIRES: CheckGpuDecodeOps(ops).ok(), width, height >= 1.
Result<cuda::imgmath::ResizePlan> PlanGpuImage(const media::ImageOps& ops, int width, int height, int out_width,
                                               int out_height, uint64_t seed, bool* flip);

}  // namespace spdl::jobs
