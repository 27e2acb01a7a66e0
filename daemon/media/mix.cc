#include "media/mix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "media/pixel_convert.h"

namespace spdl::media {
namespace {

double Normal(SampleRng& rng) {
  // Box-Muller; 1 - U keeps the log's argument in (0, 1].
  const double u1 = 1.0 - rng.Uniform(0, 1), u2 = rng.Uniform(0, 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

// Gamma(a, 1), Marsaglia and Tsang (2000); a < 1 by the boost U^(1/a).
double Gamma(double a, SampleRng& rng) {
  if (a < 1) {
    const double u = 1.0 - rng.Uniform(0, 1);
    return Gamma(a + 1, rng) * std::pow(u, 1.0 / a);
  }
  const double d = a - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0, v = 0;
    do {
      x = Normal(rng);
      v = 1.0 + c * x;
    } while (v <= 0);
    v = v * v * v;
    const double u = 1.0 - rng.Uniform(0, 1);
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

// Element access in any output dtype, as doubles.
double Load(const uint8_t* p, OutputDType dtype) {
  switch (dtype) {
    case OutputDType::kUInt8:
      return *p;
    case OutputDType::kFloat32: {
      float f;
      std::memcpy(&f, p, sizeof(f));
      return f;
    }
    case OutputDType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof(h));
      return HalfToDouble(h);
    }
    case OutputDType::kBFloat16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof(h));
      return BFloat16ToDouble(h);
    }
  }
  return 0;
}

void Store(uint8_t* p, OutputDType dtype, double v) {
  switch (dtype) {
    case OutputDType::kUInt8:
      *p = static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0, 255.0));
      return;
    case OutputDType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, sizeof(f));
      return;
    }
    case OutputDType::kFloat16: {
      const uint16_t h = DoubleToHalf(v);
      std::memcpy(p, &h, sizeof(h));
      return;
    }
    case OutputDType::kBFloat16: {
      const uint16_t h = DoubleToBFloat16(v);
      std::memcpy(p, &h, sizeof(h));
      return;
    }
  }
}

}  // namespace

double BetaSample(double a, SampleRng& rng) {
  const double x = Gamma(a, rng), y = Gamma(a, rng);
  return x + y > 0 ? x / (x + y) : 0.5;
}

MixDraw DrawMix(const MixOptions& o, int width, int height, SampleRng& rng) {
  MixDraw d;
  const double use = rng.Uniform(0, 1);
  const bool both = o.mixup_alpha > 0 && o.cutmix_alpha > 0;
  const double kind = rng.Uniform(0, 1);
  if (use >= o.prob) return d;
  d.mixed = true;
  d.cutmix = both ? kind < o.switch_prob : o.cutmix_alpha > 0;
  d.lam = BetaSample(d.cutmix ? o.cutmix_alpha : o.mixup_alpha, rng);
  if (!d.cutmix) return d;
  // timm's rand_bbox: integer cut sizes, a uniform centre, clipped; then correct_lam.
  const double cut = std::sqrt(1.0 - d.lam);
  const int cut_h = static_cast<int>(height * cut), cut_w = static_cast<int>(width * cut);
  const int cy = static_cast<int>(rng.UniformInt(0, height - 1));
  const int cx = static_cast<int>(rng.UniformInt(0, width - 1));
  d.box_y0 = std::clamp(cy - cut_h / 2, 0, height);
  d.box_y1 = std::clamp(cy + cut_h / 2, 0, height);
  d.box_x0 = std::clamp(cx - cut_w / 2, 0, width);
  d.box_x1 = std::clamp(cx + cut_w / 2, 0, width);
  const double area = double(d.box_y1 - d.box_y0) * double(d.box_x1 - d.box_x0);
  d.lam = 1.0 - area / (double(width) * double(height));
  return d;
}

void MixImages(const MixDraw& draw, const ImageOps& ops, int width, int height, uint8_t* images, uint32_t rows) {
  if (!draw.mixed || rows < 2) return;
  const size_t esize = DTypeSize(ops.dtype);
  const size_t image_bytes = OutputImageBytes(ops, width, height);
  const int c = ops.channels;
  const bool chw = ops.layout == OutputLayout::kNCHW;
  // Byte offset of element (x, y, channel k) within one image.
  auto at = [&](int x, int y, int k) -> size_t {
    const size_t e = chw ? (size_t(k) * height + y) * width + x : (size_t(y) * width + x) * c + k;
    return e * esize;
  };
  for (uint32_t i = 0; i < rows / 2; ++i) {
    uint8_t* a = images + i * image_bytes;
    uint8_t* b = images + (rows - 1 - i) * image_bytes;
    if (draw.cutmix) {
      // a gets b's box and b gets a's: swap the rectangles.
      for (int k = 0; k < c; ++k)
        for (int y = draw.box_y0; y < draw.box_y1; ++y)
          for (int x = draw.box_x0; x < draw.box_x1; ++x)
            std::swap_ranges(a + at(x, y, k), a + at(x, y, k) + esize, b + at(x, y, k));
    } else {
      const size_t n = image_bytes / esize;
      for (size_t e = 0; e < n; ++e) {
        const double va = Load(a + e * esize, ops.dtype), vb = Load(b + e * esize, ops.dtype);
        Store(a + e * esize, ops.dtype, draw.lam * va + (1 - draw.lam) * vb);
        Store(b + e * esize, ops.dtype, draw.lam * vb + (1 - draw.lam) * va);
      }
    }
  }
}

void SmoothedOneHot(int64_t label, int classes, double smoothing, float* row) {
  const double off = smoothing / classes, on = 1.0 - smoothing + off;
  for (int k = 0; k < classes; ++k) row[k] = static_cast<float>(k == label ? on : off);
}

void MixLabels(double lam, int classes, float* labels, uint32_t rows) {
  for (uint32_t i = 0; i < rows / 2; ++i) {
    float* a = labels + size_t(i) * classes;
    float* b = labels + size_t(rows - 1 - i) * classes;
    for (int k = 0; k < classes; ++k) {
      const double va = a[k], vb = b[k];
      a[k] = static_cast<float>(lam * va + (1 - lam) * vb);
      b[k] = static_cast<float>(lam * vb + (1 - lam) * va);
    }
  }
}

}  // namespace spdl::media
