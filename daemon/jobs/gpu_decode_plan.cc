#include "jobs/gpu_decode_plan.h"

#include <algorithm>
#include <string>

#include "media/pixel_convert.h"
#include "media/resample.h"
#include "media/sample_random.h"

namespace spdl::jobs {
namespace {

static_assert(cuda::imgmath::kPrecisionBits == media::kResamplePrecisionBits);

media::ResampleFilter FilterOf(media::Interpolation i) {
  switch (i) {
    case media::Interpolation::kBilinear:
      return media::ResampleFilter::kBilinear;
    case media::Interpolation::kBicubic:
      return media::ResampleFilter::kBicubic;
    case media::Interpolation::kArea:
      return media::ResampleFilter::kBox;
    case media::Interpolation::kNearest:
      return media::ResampleFilter::kNearest;
    case media::Interpolation::kHamming:
      return media::ResampleFilter::kHamming;
    case media::Interpolation::kLanczos:
      return media::ResampleFilter::kLanczos;
  }
  return media::ResampleFilter::kBilinear;
}

// The taps of outputs [begin, begin + n) of an in -> out resize of one axis, in decoded-image
// coordinates (offset: the source rectangle's start).
void AxisTables(int in, int out, media::ResampleFilter f, int begin, int n, int offset, int* taps,
                std::vector<int>* first, std::vector<int>* count, std::vector<int32_t>* weights) {
  if (f == media::ResampleFilter::kNearest) {
    std::vector<int> index;
    media::ComputeNearestIndex(in, out, begin, begin + n, &index);
    *taps = 1;
    first->resize(index.size());
    for (size_t i = 0; i < index.size(); ++i) (*first)[i] = index[i] + offset;
    count->assign(index.size(), 1);
    weights->assign(index.size(), int32_t{1} << cuda::imgmath::kPrecisionBits);
    return;
  }
  media::AxisWeights w;
  media::ComputeAxisWeights(in, out, f, begin, begin + n, &w);
  *taps = w.taps;
  *first = w.first;
  for (int& v : *first) v += offset;
  *count = w.count;
  *weights = w.weights;
}

}  // namespace

Status CheckGpuDecodeOps(const media::ImageOps& ops) {
  if (ops.channels != 3)
    return InvalidArgument("decode.device: cuda decodes to RGB only (decode.color: gray is not supported there)");
  if (ops.exif_orientation) {
    return InvalidArgument(
        "decode.device: cuda does not apply EXIF orientation (set decode.exif_orientation: false, or decode on the "
        "CPU)");
  }
  return Status::Ok();
}

GpuValueTables MakeGpuValueTables(const media::ImageOps& ops) {
  GpuValueTables t;
  t.spec.channels = 3;
  t.spec.nchw = ops.layout == media::OutputLayout::kNCHW;
  media::ValueTable table;
  table.Build(ops);
  switch (ops.dtype) {
    case media::OutputDType::kUInt8:
      t.spec.dtype = cuda::imgmath::kOutU8;
      break;
    case media::OutputDType::kFloat32:
      t.spec.dtype = cuda::imgmath::kOutF32;
      t.f32.resize(3 * 256);
      for (int c = 0; c < 3; ++c) std::copy_n(table.f32(c), 256, t.f32.begin() + c * 256);
      break;
    case media::OutputDType::kFloat16:
    case media::OutputDType::kBFloat16:
      t.spec.dtype = cuda::imgmath::kOutU16Bits;
      t.u16.resize(3 * 256);
      for (int c = 0; c < 3; ++c) std::copy_n(table.u16(c), 256, t.u16.begin() + c * 256);
      break;
  }
  return t;
}

Result<cuda::imgmath::ResizePlan> PlanGpuImage(const media::ImageOps& ops, int width, int height, int out_width,
                                               int out_height, uint64_t seed, bool* flip) {
  media::ResizeCropPlan g;
  int sx = 0, sy = 0, sw = width, sh = height;
  if (ops.random_crop()) {
    media::SampleRng rng(seed, media::RandomStream::kResizedCrop);
    const media::CropRect r = media::PlanRandomResizedCrop(ops, width, height, rng);
    g.resized_width = g.out_width = g.keep_width = ops.random_crop_width;
    g.resized_height = g.out_height = g.keep_height = ops.random_crop_height;
    sx = r.x;
    sy = r.y;
    sw = r.width;
    sh = r.height;
  } else {
    g = media::PlanResizeCrop(ops, width, height);
  }
  if (g.out_width != out_width || g.out_height != out_height) {
    return InvalidArgument("a " + std::to_string(width) + "x" + std::to_string(height) + " image becomes " +
                           std::to_string(g.out_width) + "x" + std::to_string(g.out_height) + ", not the expected " +
                           std::to_string(out_width) + "x" + std::to_string(out_height));
  }
  if (g.padded()) return FailedPrecondition("the crop is larger than the resized image (padding): CPU path");
  *flip = false;
  if (ops.flip_probability > 0) {
    media::SampleRng rng(seed, media::RandomStream::kFlip);
    *flip = rng.Bernoulli(ops.flip_probability);
  }
  cuda::imgmath::ResizePlan p;
  cuda::imgmath::ResizeGeometry& geo = p.geometry;
  geo.src_x = sx;
  geo.src_y = sy;
  geo.src_width = sw;
  geo.src_height = sh;
  geo.window_x = g.keep_x;
  geo.window_y = g.keep_y;
  const media::ResampleFilter f = FilterOf(ops.interpolation);
  // PIL's rule: an axis is resampled when its size changes (nearest: always, as an index map).
  geo.need_h = f == media::ResampleFilter::kNearest || g.resized_width != sw;
  geo.need_v = f == media::ResampleFilter::kNearest || g.resized_height != sh;
  if (geo.need_h) {
    AxisTables(sw, g.resized_width, f, g.keep_x, g.keep_width, sx, &p.h_taps, &p.h_first, &p.h_count, &p.h_weights);
  }
  if (geo.need_v) {
    AxisTables(sh, g.resized_height, f, g.keep_y, g.keep_height, sy, &p.v_taps, &p.v_first, &p.v_count, &p.v_weights);
    geo.row0 = p.v_first.front();
    int end = geo.row0;
    for (size_t i = 0; i < p.v_first.size(); ++i) end = std::max(end, p.v_first[i] + p.v_count[i]);
    geo.row0 = *std::min_element(p.v_first.begin(), p.v_first.end());
    geo.rows = end - geo.row0;
  } else {
    geo.row0 = sy + g.keep_y;
    geo.rows = g.keep_height;
  }
  return p;
}

}  // namespace spdl::jobs
