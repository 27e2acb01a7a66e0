#include "media/image_ops.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace spdl::media {
namespace {

// Python's int(round(d / 2.0)) for an integer d >= 0: half-way cases go to the even neighbour.
int HalfRoundEven(int d) {
  int q = d / 2;
  if ((d & 1) && (q & 1)) ++q;
  return q;
}

// One axis of torchvision's CenterCrop applied to a line of `size` pixels: which part survives
// and where it lands.
void CropAxis(int size, int crop, int* keep_start, int* keep_len, int* dst_start) {
  if (crop <= 0) {  // no crop on this axis
    *keep_start = 0;
    *keep_len = size;
    *dst_start = 0;
  } else if (crop <= size) {
    *keep_start = HalfRoundEven(size - crop);
    *keep_len = crop;
    *dst_start = 0;
  } else {  // pad (crop - size) // 2 before; the crop offset into the padded line is then 0
    *keep_start = 0;
    *keep_len = size;
    *dst_start = (crop - size) / 2;
  }
}

}  // namespace

Status ValidateImageOps(const ImageOps& ops) {
  std::vector<std::string> errors;
  if (ops.resize_shorter < 0) errors.push_back("resize_shorter < 0");
  if (ops.resize_max_size < 0 || (ops.resize_max_size > 0 && ops.resize_max_size <= ops.resize_shorter))
    errors.push_back("resize_max_size must be 0 or > resize_shorter");
  if (ops.resize_height < 0 || ops.resize_width < 0) errors.push_back("resize size < 0");
  if ((ops.resize_height > 0) != (ops.resize_width > 0)) {
    errors.push_back("resize_height and resize_width must be set together");
  }
  if (ops.crop_height < 0 || ops.crop_width < 0) errors.push_back("crop size < 0");
  if ((ops.crop_height > 0) != (ops.crop_width > 0)) {
    errors.push_back("crop_height and crop_width must be set together");
  }
  if (ops.max_pixels <= 0) errors.push_back("max_pixels <= 0");
  if (ops.random_crop_height < 0 || ops.random_crop_width < 0) {
    errors.push_back("random crop size < 0");
  }
  if ((ops.random_crop_height > 0) != (ops.random_crop_width > 0)) {
    errors.push_back("random_crop_height and random_crop_width must be set together");
  }
  if (ops.random_crop()) {
    if (ops.resize_shorter || ops.resize_height || ops.resize_width || ops.crop_height || ops.crop_width) {
      errors.push_back("a random crop replaces resize and crop: they must not be set with it");
    }
    const auto& s = ops.random_crop_scale;
    const auto& r = ops.random_crop_ratio;
    if (!(s[0] > 0 && s[0] <= s[1] && std::isfinite(s[1]))) {
      errors.push_back("random_crop_scale must be a range 0 < min <= max");
    }
    if (!(r[0] > 0 && r[0] <= r[1] && std::isfinite(r[1]))) {
      errors.push_back("random_crop_ratio must be a range 0 < min <= max");
    }
  }
  if (ops.channels != 1 && ops.channels != 3) errors.push_back("channels must be 1 or 3");
  if (ops.resample == Resample::kFast && ops.interpolation == Interpolation::kHamming) {
    errors.push_back("hamming interpolation has no fast path (resample: exact)");
  }
  if (!(ops.flip_probability >= 0 && ops.flip_probability <= 1)) {
    errors.push_back("flip_probability outside [0, 1]");
  }
  if (ops.normalize && ops.dtype == OutputDType::kUInt8) {
    errors.push_back("normalize needs a floating-point output dtype, not uint8");
  }
  for (int c = 0; c < 3; ++c) {
    if (!std::isfinite(ops.mean[c]) || !std::isfinite(ops.stddev[c]) || ops.stddev[c] == 0) {
      errors.push_back("mean and stddev must be finite, stddev non-zero");
      break;
    }
  }
  if (errors.empty()) return Status::Ok();
  std::string msg = "bad image ops:";
  for (const std::string& e : errors) msg += " " + e + ";";
  msg.pop_back();
  return InvalidArgument(msg);
}

ResizeCropPlan PlanResizeCrop(const ImageOps& ops, int src_width, int src_height) {
  ResizeCropPlan p;
  if (ops.resize_height > 0 && ops.resize_width > 0) {
    p.resized_width = ops.resize_width;
    p.resized_height = ops.resize_height;
  } else if (ops.resize_shorter > 0) {
    // torchvision: new_short = S, new_long = int(S * long / short). Integer division gives the
    // same floor as Python's float division for any realistic size.
    const int64_t s = ops.resize_shorter;
    const int64_t shorter = std::min(src_width, src_height), longer = std::max(src_width, src_height);
    int64_t new_short = s, new_long = s * longer / shorter;
    if (ops.resize_max_size > 0 && new_long > ops.resize_max_size) {  // torchvision's max_size
      new_short = static_cast<int64_t>(static_cast<double>(ops.resize_max_size) * static_cast<double>(new_short) /
                                       static_cast<double>(new_long));
      new_long = ops.resize_max_size;
      new_short = std::max<int64_t>(new_short, 1);
    }
    if (src_width <= src_height) {
      p.resized_width = static_cast<int>(new_short);
      p.resized_height = static_cast<int>(new_long);
    } else {
      p.resized_height = static_cast<int>(new_short);
      p.resized_width = static_cast<int>(new_long);
    }
  } else {
    p.resized_width = src_width;
    p.resized_height = src_height;
  }
  const bool crop = ops.crop_height > 0 && ops.crop_width > 0;
  CropAxis(p.resized_width, crop ? ops.crop_width : 0, &p.keep_x, &p.keep_width, &p.dst_x);
  CropAxis(p.resized_height, crop ? ops.crop_height : 0, &p.keep_y, &p.keep_height, &p.dst_y);
  p.out_width = crop ? ops.crop_width : p.resized_width;
  p.out_height = crop ? ops.crop_height : p.resized_height;
  return p;
}

void OutputSize(const ImageOps& ops, int src_width, int src_height, int* out_width, int* out_height) {
  if (ops.random_crop()) {
    *out_width = ops.random_crop_width;
    *out_height = ops.random_crop_height;
    return;
  }
  const ResizeCropPlan p = PlanResizeCrop(ops, src_width, src_height);
  *out_width = p.out_width;
  *out_height = p.out_height;
}

size_t DTypeSize(OutputDType dtype) {
  switch (dtype) {
    case OutputDType::kUInt8:
      return 1;
    case OutputDType::kFloat32:
      return 4;
    case OutputDType::kFloat16:
      return 2;
    case OutputDType::kBFloat16:
      return 2;
  }
  return 1;
}

size_t OutputImageBytes(const ImageOps& ops, int out_width, int out_height) {
  return static_cast<size_t>(out_width) * static_cast<size_t>(out_height) * static_cast<size_t>(ops.channels) *
         DTypeSize(ops.dtype);
}

CropRect PlanRandomResizedCrop(const ImageOps& ops, int src_width, int src_height, SampleRng& rng) {
  // Python's round() is half-to-even, as is nearbyint in the default rounding mode.
  auto round_int = [](double v) { return static_cast<int64_t>(std::nearbyint(v)); };
  const double area = static_cast<double>(src_width) * src_height;
  const double log_lo = std::log(ops.random_crop_ratio[0]);
  const double log_hi = std::log(ops.random_crop_ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(ops.random_crop_scale[0], ops.random_crop_scale[1]);
    const double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    const int64_t w = round_int(std::sqrt(target_area * aspect));
    const int64_t h = round_int(std::sqrt(target_area / aspect));
    if (w > 0 && w <= src_width && h > 0 && h <= src_height) {
      const int64_t y = rng.UniformInt(0, src_height - h);
      const int64_t x = rng.UniformInt(0, src_width - w);
      return {static_cast<int>(x), static_cast<int>(y), static_cast<int>(w), static_cast<int>(h)};
    }
  }
  // The central fallback.
  const double in_ratio = static_cast<double>(src_width) / src_height;
  int64_t w = src_width, h = src_height;
  if (in_ratio < ops.random_crop_ratio[0]) {
    h = round_int(w / ops.random_crop_ratio[0]);
  } else if (in_ratio > ops.random_crop_ratio[1]) {
    w = round_int(h * ops.random_crop_ratio[1]);
  }
  w = std::clamp<int64_t>(w, 1, src_width);
  h = std::clamp<int64_t>(h, 1, src_height);
  return {static_cast<int>((src_width - w) / 2), static_cast<int>((src_height - h) / 2), static_cast<int>(w),
          static_cast<int>(h)};
}

}  // namespace spdl::media
