#include "media/augment.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numbers>
#include <vector>

namespace spdl::media {
namespace {

constexpr double kPi = std::numbers::pi;

uint8_t* Row(const ImageView& img, int y) { return img.data + static_cast<size_t>(y) * img.stride; }
size_t RowBytes(const ImageView& img) { return static_cast<size_t>(img.width) * static_cast<size_t>(img.channels); }

// A copy of the image, packed (stride = width * channels), in a per-thread buffer.
std::vector<uint8_t>& PackedCopy(const ImageView& img, int slot) {
  thread_local std::vector<uint8_t> buffers[2];
  std::vector<uint8_t>& buf = buffers[slot];
  const size_t row = RowBytes(img);
  buf.resize(row * static_cast<size_t>(img.height));
  for (int y = 0; y < img.height; ++y) std::copy_n(Row(img, y), row, buf.data() + row * static_cast<size_t>(y));
  return buf;
}

// PIL's convert("L") of one RGB pixel (ITU-R 601 in 16.16 fixed point).
inline uint8_t Luma(const uint8_t* p) {
  return static_cast<uint8_t>((19595u * p[0] + 38470u * p[1] + 7471u * p[2] + 0x8000u) >> 16);
}

// PIL's Image.blend(degenerate, image, alpha) of one value: float arithmetic, truncated; clipped
// only when alpha is outside [0, 1] (inside, the result cannot leave [0, 255]).
inline uint8_t Blend(int degenerate, int value, float alpha) {
  const float t = static_cast<float>(degenerate) + alpha * static_cast<float>(value - degenerate);
  if (t <= 0.0f) return 0;
  if (t >= 255.0f) return 255;
  return static_cast<uint8_t>(t);
}

// Blends every value of `img` with `degenerate(x, y, c)` by `factor`, as ImageEnhance does (factor
// exactly 0 or 1 copies one side).
template <typename Degenerate>
void BlendWith(ImageView img, double factor, Degenerate degenerate) {
  const float alpha = static_cast<float>(factor);
  if (alpha == 1.0f) return;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* row = Row(img, y);
    for (int x = 0; x < img.width; ++x) {
      for (int c = 0; c < img.channels; ++c) {
        uint8_t& v = row[x * img.channels + c];
        const int d = degenerate(x, y, c);
        v = alpha == 0.0f ? static_cast<uint8_t>(d) : Blend(d, v, alpha);
      }
    }
  }
}

void ApplyLut(ImageView img, const std::array<uint8_t, 256>* luts, bool per_channel) {
  for (int y = 0; y < img.height; ++y) {
    uint8_t* row = Row(img, y);
    for (int x = 0; x < img.width; ++x) {
      for (int c = 0; c < img.channels; ++c)
        row[x * img.channels + c] = luts[per_channel ? c : 0][row[x * img.channels + c]];
    }
  }
}

void Histograms(const ImageView& img, std::array<std::array<uint64_t, 256>, 3>* h) {
  for (auto& a : *h) a.fill(0);
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* row = Row(img, y);
    for (int x = 0; x < img.width; ++x) {
      for (int c = 0; c < img.channels; ++c) ++(*h)[c][row[x * img.channels + c]];
    }
  }
}

// torch.linspace(start, end, steps)[i] in float32 (its halfway-symmetric formula).
double Linspace(double start, double end, int steps, int i) {
  if (steps <= 1) return static_cast<float>(start);
  const float s = static_cast<float>(start), e = static_cast<float>(end);
  const float step = (e - s) / static_cast<float>(steps - 1);
  if (i < steps / 2) return static_cast<double>(s + step * static_cast<float>(i));
  return static_cast<double>(e - step * static_cast<float>(steps - i - 1));
}

// torchvision _get_inverse_affine_matrix: output point -> input point (PIL's AFFINE data).
std::array<double, 6> InverseAffine(const AffineParams& p, int width, int height) {
  const double cx = p.has_center ? p.center_x : width * 0.5;
  const double cy = p.has_center ? p.center_y : height * 0.5;
  const double rot = p.angle * kPi / 180.0, sx = p.shear_x * kPi / 180.0, sy = p.shear_y * kPi / 180.0;
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  std::array<double, 6> m = {d, -b, 0.0, -c, a, 0.0};
  for (double& v : m) v /= p.scale;
  m[2] += m[0] * (-cx - p.translate_x) + m[1] * (-cy - p.translate_y);
  m[5] += m[3] * (-cx - p.translate_x) + m[4] * (-cy - p.translate_y);
  m[2] += cx;
  m[5] += cy;
  return m;
}

double Round15(double v) { return std::nearbyint(v * 1e15) / 1e15; }

// PIL's Image.rotate matrix (output point -> input point) and output size.
std::array<double, 6> InverseRotate(double angle, bool expand, int w, int h, int* out_w, int* out_h) {
  const double r =
      -(std::fmod(angle, 360.0) < 0 ? std::fmod(angle, 360.0) + 360.0 : std::fmod(angle, 360.0)) * kPi / 180.0;
  std::array<double, 6> m = {Round15(std::cos(r)),  Round15(std::sin(r)), 0.0,
                             Round15(-std::sin(r)), Round15(std::cos(r)), 0.0};
  const double cx = w / 2.0, cy = h / 2.0;
  auto apply = [&m](double x, double y) {
    return std::array<double, 2>{m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]};
  };
  const auto t = apply(-cx, -cy);
  m[2] = t[0] + cx;
  m[5] = t[1] + cy;
  *out_w = w;
  *out_h = h;
  if (expand) {
    double xmin = 1e300, xmax = -1e300, ymin = 1e300, ymax = -1e300;
    for (auto [x, y] : {std::array<double, 2>{0, 0}, {double(w), 0}, {double(w), double(h)}, {0, double(h)}}) {
      const auto q = apply(x, y);
      xmin = std::min(xmin, q[0]);
      xmax = std::max(xmax, q[0]);
      ymin = std::min(ymin, q[1]);
      ymax = std::max(ymax, q[1]);
    }
    const int nw = static_cast<int>(std::ceil(xmax) - std::floor(xmin));
    const int nh = static_cast<int>(std::ceil(ymax) - std::floor(ymin));
    const auto t2 = apply(-(nw - w) / 2.0, -(nh - h) / 2.0);
    m[2] = t2[0];
    m[5] = t2[1];
    *out_w = nw;
    *out_h = nh;
  }
  return m;
}

Affine2D ForwardOf(const std::array<double, 6>& inverse) { return Affine2D{inverse}.Inverse(); }

inline int Coord(double v) { return v < 0.0 ? -1 : static_cast<int>(v); }

// PIL's Image.transform(AFFINE) with the output -> input matrix `a`.
void WarpInverse(const ImageView& src, ImageView dst, const std::array<double, 6>& a, WarpFilter filter,
                 const std::array<uint8_t, 3>& fill) {
  const int C = src.channels;
  for (int y = 0; y < dst.height; ++y) {
    uint8_t* out = Row(dst, y);
    for (int x = 0; x < dst.width; ++x) {
      for (int c = 0; c < C; ++c) out[x * C + c] = fill[c];
    }
  }
  const int sw = src.width, sh = src.height;
  if (filter == WarpFilter::kNearest) {
    auto copy_px = [&](uint8_t* out, int xin, int yin) {
      const uint8_t* in = Row(src, yin) + static_cast<size_t>(xin) * C;
      for (int c = 0; c < C; ++c) out[c] = in[c];
    };
    if (a[1] == 0 && a[3] == 0) {  // ImagingScaleAffine
      double xo = a[2] + a[0] * 0.5, yo = a[5] + a[4] * 0.5;
      std::vector<int> xin(dst.width, -1);
      for (int x = 0; x < dst.width; ++x, xo += a[0]) {
        const int v = Coord(xo);
        if (v >= 0 && v < sw) xin[x] = v;
      }
      for (int y = 0; y < dst.height; ++y, yo += a[4]) {
        const int yi = Coord(yo);
        if (yi < 0 || yi >= sh) continue;
        uint8_t* out = Row(dst, y);
        for (int x = 0; x < dst.width; ++x) {
          if (xin[x] >= 0) copy_px(out + x * C, xin[x], yi);
        }
      }
      return;
    }
    auto fits = [&a](int x, int y) {
      return std::fabs(x * a[0] + y * a[1] + a[2]) < 32768.0 && std::fabs(x * a[3] + y * a[4] + a[5]) < 32768.0;
    };
    const int W = dst.width, H = dst.height;
    if (fits(0, 0) && fits(W, H) && fits(0, H) && fits(W, 0)) {  // affine_fixed: 16.16
      auto fix = [](double v) { return static_cast<int>(std::floor(v * 65536.0 + 0.5)); };
      const int a0 = fix(a[0]), a1 = fix(a[1]), a3 = fix(a[3]), a4 = fix(a[4]);
      int a2 = fix(a[2] + a[0] * 0.5 + a[1] * 0.5), a5 = fix(a[5] + a[3] * 0.5 + a[4] * 0.5);
      for (int y = 0; y < H; ++y, a2 += a1, a5 += a4) {
        uint8_t* out = Row(dst, y);
        int xx = a2, yy = a5;
        for (int x = 0; x < W; ++x, xx += a0, yy += a3) {
          const int xi = xx >> 16, yi = yy >> 16;
          if (xi >= 0 && xi < sw && yi >= 0 && yi < sh) copy_px(out + x * C, xi, yi);
        }
      }
      return;
    }
    double xo = a[2] + a[1] * 0.5 + a[0] * 0.5, yo = a[5] + a[4] * 0.5 + a[3] * 0.5;
    for (int y = 0; y < H; ++y, xo += a[1], yo += a[4]) {
      uint8_t* out = Row(dst, y);
      double xx = xo, yy = yo;
      for (int x = 0; x < W; ++x, xx += a[0], yy += a[3]) {
        const int xi = Coord(xx), yi = Coord(yy);
        if (xi >= 0 && xi < sw && yi >= 0 && yi < sh) copy_px(out + x * C, xi, yi);
      }
    }
    return;
  }
  // PIL's generic transform with its bilinear / bicubic filters (edge-clamped taps, truncation).
  auto xclip = [sw](int x) { return x < 0 ? 0 : (x < sw ? x : sw - 1); };
  auto yclip = [sh](int y) { return y < 0 ? 0 : (y < sh ? y : sh - 1); };
  auto at = [&](int x, int y, int c) { return static_cast<double>(Row(src, y)[x * C + c]); };
  for (int y = 0; y < dst.height; ++y) {
    uint8_t* out = Row(dst, y);
    for (int x = 0; x < dst.width; ++x) {
      const double px = x + 0.5, py = y + 0.5;
      double xin = a[0] * px + a[1] * py + a[2];
      double yin = a[3] * px + a[4] * py + a[5];
      if (xin < 0.0 || xin >= sw || yin < 0.0 || yin >= sh) continue;
      xin -= 0.5;
      yin -= 0.5;
      const int xf = static_cast<int>(std::floor(xin)), yf = static_cast<int>(std::floor(yin));
      const double dx = xin - xf, dy = yin - yf;
      for (int c = 0; c < C; ++c) {
        if (filter == WarpFilter::kBilinear) {
          const int x0 = xclip(xf), x1 = xclip(xf + 1);
          const int r0 = yclip(yf);
          double v1 = at(x0, r0, c) + (at(x1, r0, c) - at(x0, r0, c)) * dx;
          double v2 = v1;
          if (yf + 1 >= 0 && yf + 1 < sh) v2 = at(x0, yf + 1, c) + (at(x1, yf + 1, c) - at(x0, yf + 1, c)) * dx;
          v1 = v1 + (v2 - v1) * dy;
          out[x * C + c] = static_cast<uint8_t>(v1);
        } else {
          auto cubic = [](double v1, double v2, double v3, double v4, double d) {
            const double p1 = v2, p2 = -v1 + v3, p3 = 2 * (v1 - v2) + v3 - v4, p4 = -v1 + v2 - v3 + v4;
            return p1 + d * (p2 + d * (p3 + d * p4));
          };
          const int xb = xf - 1, yb = yf - 1;
          const int xs[4] = {xclip(xb), xclip(xb + 1), xclip(xb + 2), xclip(xb + 3)};
          auto row_at = [&](int r) {
            return cubic(at(xs[0], r, c), at(xs[1], r, c), at(xs[2], r, c), at(xs[3], r, c), dx);
          };
          double v[4];
          v[0] = row_at(yclip(yb));
          for (int k = 1; k < 4; ++k) v[k] = (yb + k >= 0 && yb + k < sh) ? row_at(yb + k) : v[k - 1];
          const double r = cubic(v[0], v[1], v[2], v[3], dy);
          out[x * C + c] = r <= 0.0 ? 0 : (r >= 255.0 ? 255 : static_cast<uint8_t>(r));
        }
      }
    }
  }
}

// Warps `img` in place (same size) by the output -> input matrix.
void WarpInPlace(ImageView img, const std::array<double, 6>& inverse, WarpFilter filter,
                 const std::array<uint8_t, 3>& fill) {
  std::vector<uint8_t>& copy = PackedCopy(img, 1);
  const ImageView src{copy.data(), img.width, img.height, img.channels, RowBytes(img)};
  WarpInverse(src, img, inverse, filter, fill);
}

// The ops of torchvision's _apply_op (autoaugment.py).
enum class PolicyOp {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
  kInvert,
};

// Applies one policy op; returns its point map (identity for the photometric ones).
Affine2D ApplyPolicyOp(PolicyOp op, double magnitude, ImageView img, const AugmentSpec& spec) {
  switch (op) {
    case PolicyOp::kIdentity:
      return Affine2D::Identity();
    case PolicyOp::kShearX:
    case PolicyOp::kShearY: {
      AffineParams p;
      const double deg = std::atan(magnitude) * 180.0 / kPi;
      (op == PolicyOp::kShearX ? p.shear_x : p.shear_y) = deg;
      p.has_center = true;  // center [0, 0]
      const auto inv = InverseAffine(p, img.width, img.height);
      WarpInPlace(img, inv, spec.filter, spec.fill);
      return ForwardOf(inv);
    }
    case PolicyOp::kTranslateX:
    case PolicyOp::kTranslateY: {
      AffineParams p;
      (op == PolicyOp::kTranslateX ? p.translate_x : p.translate_y) = static_cast<double>(static_cast<int>(magnitude));
      const auto inv = InverseAffine(p, img.width, img.height);
      WarpInPlace(img, inv, spec.filter, spec.fill);
      return ForwardOf(inv);
    }
    case PolicyOp::kRotate: {
      int w = 0, h = 0;
      const auto inv = InverseRotate(magnitude, false, img.width, img.height, &w, &h);
      WarpInPlace(img, inv, spec.filter, spec.fill);
      return ForwardOf(inv);
    }
    case PolicyOp::kBrightness:
      AdjustBrightness(img, 1.0 + magnitude);
      return Affine2D::Identity();
    case PolicyOp::kColor:
      AdjustSaturation(img, 1.0 + magnitude);
      return Affine2D::Identity();
    case PolicyOp::kContrast:
      AdjustContrast(img, 1.0 + magnitude);
      return Affine2D::Identity();
    case PolicyOp::kSharpness:
      AdjustSharpness(img, 1.0 + magnitude);
      return Affine2D::Identity();
    case PolicyOp::kPosterize:
      Posterize(img, static_cast<int>(magnitude));
      return Affine2D::Identity();
    case PolicyOp::kSolarize:
      Solarize(img, magnitude);
      return Affine2D::Identity();
    case PolicyOp::kAutoContrast:
      Autocontrast(img);
      return Affine2D::Identity();
    case PolicyOp::kEqualize:
      Equalize(img);
      return Affine2D::Identity();
    case PolicyOp::kInvert:
      Invert(img);
      return Affine2D::Identity();
  }
  return Affine2D::Identity();
}

// One op's magnitude for bin `bin` of `bins` (RandAugment / TrivialAugmentWide / AutoAugment
// _augmentation_space), and whether it is signed. `wide`: TrivialAugmentWide's ranges.
double Magnitude(PolicyOp op, int bin, int bins, bool wide, int width, int height, bool* is_signed) {
  *is_signed = true;
  switch (op) {
    case PolicyOp::kShearX:
    case PolicyOp::kShearY:
      return Linspace(0, wide ? 0.99 : 0.3, bins, bin);
    case PolicyOp::kTranslateX:
      return Linspace(0, wide ? 32.0 : 150.0 / 331.0 * width, bins, bin);
    case PolicyOp::kTranslateY:
      return Linspace(0, wide ? 32.0 : 150.0 / 331.0 * height, bins, bin);
    case PolicyOp::kRotate:
      return Linspace(0, wide ? 135.0 : 30.0, bins, bin);
    case PolicyOp::kBrightness:
    case PolicyOp::kColor:
    case PolicyOp::kContrast:
    case PolicyOp::kSharpness:
      return Linspace(0, wide ? 0.99 : 0.9, bins, bin);
    case PolicyOp::kPosterize: {
      *is_signed = false;
      const float q = static_cast<float>(bin) / (static_cast<float>(bins - 1) / (wide ? 6.0f : 4.0f));
      return 8 - static_cast<int>(std::nearbyint(q));
    }
    case PolicyOp::kSolarize:
      *is_signed = false;
      return Linspace(255.0, 0.0, bins, bin);
    default:
      *is_signed = false;
      return 0;
  }
}

// RandAugment / TrivialAugmentWide op lists (Identity first, no Invert).
constexpr PolicyOp kRandOps[] = {
    PolicyOp::kIdentity,  PolicyOp::kShearX,     PolicyOp::kShearY,       PolicyOp::kTranslateX, PolicyOp::kTranslateY,
    PolicyOp::kRotate,    PolicyOp::kBrightness, PolicyOp::kColor,        PolicyOp::kContrast,   PolicyOp::kSharpness,
    PolicyOp::kPosterize, PolicyOp::kSolarize,   PolicyOp::kAutoContrast, PolicyOp::kEqualize,
};

struct PolicyStep {
  PolicyOp op;
  double p;
  int bin;  // -1: no magnitude
};
// AutoAugmentPolicy.IMAGENET (torchvision 0.14).
constexpr PolicyStep kImageNetPolicy[25][2] = {
    {{PolicyOp::kPosterize, 0.4, 8}, {PolicyOp::kRotate, 0.6, 9}},
    {{PolicyOp::kSolarize, 0.6, 5}, {PolicyOp::kAutoContrast, 0.6, -1}},
    {{PolicyOp::kEqualize, 0.8, -1}, {PolicyOp::kEqualize, 0.6, -1}},
    {{PolicyOp::kPosterize, 0.6, 7}, {PolicyOp::kPosterize, 0.6, 6}},
    {{PolicyOp::kEqualize, 0.4, -1}, {PolicyOp::kSolarize, 0.2, 4}},
    {{PolicyOp::kEqualize, 0.4, -1}, {PolicyOp::kRotate, 0.8, 8}},
    {{PolicyOp::kSolarize, 0.6, 3}, {PolicyOp::kEqualize, 0.6, -1}},
    {{PolicyOp::kPosterize, 0.8, 5}, {PolicyOp::kEqualize, 1.0, -1}},
    {{PolicyOp::kRotate, 0.2, 3}, {PolicyOp::kSolarize, 0.6, 8}},
    {{PolicyOp::kEqualize, 0.6, -1}, {PolicyOp::kPosterize, 0.4, 6}},
    {{PolicyOp::kRotate, 0.8, 8}, {PolicyOp::kColor, 0.4, 0}},
    {{PolicyOp::kRotate, 0.4, 9}, {PolicyOp::kEqualize, 0.6, -1}},
    {{PolicyOp::kEqualize, 0.0, -1}, {PolicyOp::kEqualize, 0.8, -1}},
    {{PolicyOp::kInvert, 0.6, -1}, {PolicyOp::kEqualize, 1.0, -1}},
    {{PolicyOp::kColor, 0.6, 4}, {PolicyOp::kContrast, 1.0, 8}},
    {{PolicyOp::kRotate, 0.8, 8}, {PolicyOp::kColor, 1.0, 2}},
    {{PolicyOp::kColor, 0.8, 8}, {PolicyOp::kSolarize, 0.8, 7}},
    {{PolicyOp::kSharpness, 0.4, 7}, {PolicyOp::kInvert, 0.6, -1}},
    {{PolicyOp::kShearX, 0.6, 5}, {PolicyOp::kEqualize, 1.0, -1}},
    {{PolicyOp::kColor, 0.4, 0}, {PolicyOp::kEqualize, 0.6, -1}},
    {{PolicyOp::kEqualize, 0.4, -1}, {PolicyOp::kSolarize, 0.2, 4}},
    {{PolicyOp::kSolarize, 0.6, 5}, {PolicyOp::kAutoContrast, 0.6, -1}},
    {{PolicyOp::kInvert, 0.6, -1}, {PolicyOp::kEqualize, 1.0, -1}},
    {{PolicyOp::kColor, 0.6, 4}, {PolicyOp::kContrast, 1.0, 8}},
    {{PolicyOp::kEqualize, 0.8, -1}, {PolicyOp::kEqualize, 0.6, -1}},
};

}  // namespace

void AdjustBrightness(ImageView img, double factor) {
  BlendWith(img, factor, [](int, int, int) { return 0; });
}

void AdjustContrast(ImageView img, double factor) {
  uint64_t sum = 0;
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* row = Row(img, y);
    for (int x = 0; x < img.width; ++x) sum += img.channels == 3 ? Luma(row + 3 * x) : row[x];
  }
  const double mean = static_cast<double>(sum) / (static_cast<double>(img.width) * img.height);
  const int m = static_cast<int>(mean + 0.5);  // NOLINT(bugprone-incorrect-roundings): mean >= 0
  BlendWith(img, factor, [m](int, int, int) { return m; });
}

void AdjustSaturation(ImageView img, double factor) {
  if (img.channels != 3) return;
  const std::vector<uint8_t>& src = PackedCopy(img, 0);  // the luma of the original pixels
  const size_t row = RowBytes(img);
  BlendWith(img, factor, [&src, row](int x, int y, int) { return Luma(src.data() + row * y + 3 * x); });
}

void AdjustHue(ImageView img, double factor) {
  if (img.channels != 3) return;
  const uint8_t shift = static_cast<uint8_t>(static_cast<int>(factor * 255));
  for (int y = 0; y < img.height; ++y) {
    uint8_t* px = Row(img, y);
    for (int x = 0; x < img.width; ++x, px += 3) {
      // PIL rgb2hsv_row
      const uint8_t r = px[0], g = px[1], b = px[2];
      const uint8_t maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
      uint8_t uh = 0, us = 0;
      const uint8_t uv = maxc;
      if (minc != maxc) {
        const float cr = static_cast<float>(maxc - minc);
        const float s = cr / static_cast<float>(maxc);
        const float rc = static_cast<float>(maxc - r) / cr, gc = static_cast<float>(maxc - g) / cr,
                    bc = static_cast<float>(maxc - b) / cr;
        float h = r == maxc ? bc - gc : static_cast<float>(g == maxc ? 2.0 + rc - bc : 4.0 + gc - rc);
        h = static_cast<float>(std::fmod(h / 6.0 + 1.0, 1.0));
        uh = static_cast<uint8_t>(std::clamp(static_cast<int>(h * 255.0), 0, 255));
        us = static_cast<uint8_t>(std::clamp(static_cast<int>(s * 255.0), 0, 255));
      }
      uh = static_cast<uint8_t>(uh + shift);
      // PIL hsv2rgb
      if (us == 0) {
        px[0] = px[1] = px[2] = uv;
        continue;
      }
      const int i = static_cast<int>(std::floor(static_cast<float>(uh) * 6.0 / 255.0));
      const float f = static_cast<float>(static_cast<float>(uh) * 6.0 / 255.0 - static_cast<float>(i));
      const float fs = static_cast<float>(us) / 255.0f;
      auto clip = [](double v) { return static_cast<uint8_t>(std::clamp(static_cast<int>(std::round(v)), 0, 255)); };
      const uint8_t p = clip(static_cast<float>(uv) * (1.0 - fs));
      const uint8_t q = clip(static_cast<float>(uv) * (1.0 - fs * f));
      const uint8_t t = clip(static_cast<float>(uv) * (1.0 - fs * (1.0 - f)));
      uint8_t o[3];
      switch (i % 6) {
        case 0:
          o[0] = uv, o[1] = t, o[2] = p;
          break;
        case 1:
          o[0] = q, o[1] = uv, o[2] = p;
          break;
        case 2:
          o[0] = p, o[1] = uv, o[2] = t;
          break;
        case 3:
          o[0] = p, o[1] = q, o[2] = uv;
          break;
        case 4:
          o[0] = t, o[1] = p, o[2] = uv;
          break;
        default:
          o[0] = uv, o[1] = p, o[2] = q;
          break;
      }
      px[0] = o[0], px[1] = o[1], px[2] = o[2];
    }
  }
}

void AdjustSharpness(ImageView img, double factor) {
  if (static_cast<float>(factor) == 1.0f) return;
  std::vector<uint8_t>& src = PackedCopy(img, 0);
  const size_t row = RowBytes(img);
  const int C = img.channels;
  // PIL's SMOOTH kernel (1 1 1 / 1 5 1 / 1 1 1) / 13 as float taps, + 0.5 rounding, border kept.
  const float k1 = 1.0f / 13.0f, k5 = 5.0f / 13.0f;
  auto smooth = [&](int x, int y, int c) -> int {
    if (x == 0 || y == 0 || x == img.width - 1 || y == img.height - 1) return src[row * y + x * C + c];
    auto tap = [&](int yy, int xx) { return static_cast<float>(src[row * yy + xx * C + c]); };
    auto line = [&](int yy, float mid) { return tap(yy, x - 1) * k1 + tap(yy, x) * mid + tap(yy, x + 1) * k1; };
    float ss = 0.5f;
    ss += line(y + 1, k1);
    ss += line(y, k5);
    ss += line(y - 1, k1);
    return ss <= 0.0f ? 0 : (ss >= 255.0f ? 255 : static_cast<int>(ss));
  };
  BlendWith(img, factor, smooth);
}

void Posterize(ImageView img, int bits) {
  std::array<uint8_t, 256> lut;
  const int mask = ~((1 << (8 - bits)) - 1);
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i & mask);
  ApplyLut(img, &lut, false);
}

void Solarize(ImageView img, double threshold) {
  std::array<uint8_t, 256> lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(i < threshold ? i : 255 - i);
  ApplyLut(img, &lut, false);
}

void Equalize(ImageView img) {
  std::array<std::array<uint64_t, 256>, 3> h;
  Histograms(img, &h);
  std::array<uint8_t, 256> luts[3];
  for (int c = 0; c < img.channels; ++c) {
    uint64_t total = 0, last = 0, nonzero = 0;
    for (int i = 0; i < 256; ++i) {
      if (h[c][i]) {
        total += h[c][i];
        last = h[c][i];
        ++nonzero;
      }
    }
    const uint64_t step = nonzero <= 1 ? 0 : (total - last) / 255;
    if (step == 0) {
      for (int i = 0; i < 256; ++i) luts[c][i] = static_cast<uint8_t>(i);
      continue;
    }
    uint64_t n = step / 2;
    for (int i = 0; i < 256; ++i) {
      luts[c][i] = static_cast<uint8_t>(std::min<uint64_t>(n / step, 255));
      n += h[c][i];
    }
  }
  ApplyLut(img, luts, true);
}

void Autocontrast(ImageView img) {
  std::array<std::array<uint64_t, 256>, 3> h;
  Histograms(img, &h);
  std::array<uint8_t, 256> luts[3];
  for (int c = 0; c < img.channels; ++c) {
    int lo = 0, hi = 255;
    while (lo < 255 && h[c][lo] == 0) ++lo;
    while (hi > 0 && h[c][hi] == 0) --hi;
    if (hi <= lo) {
      for (int i = 0; i < 256; ++i) luts[c][i] = static_cast<uint8_t>(i);
      continue;
    }
    const double scale = 255.0 / (hi - lo), offset = -lo * scale;
    for (int i = 0; i < 256; ++i)
      luts[c][i] = static_cast<uint8_t>(std::clamp(static_cast<int>(i * scale + offset), 0, 255));
  }
  ApplyLut(img, luts, true);
}

void Invert(ImageView img) {
  std::array<uint8_t, 256> lut;
  for (int i = 0; i < 256; ++i) lut[i] = static_cast<uint8_t>(255 - i);
  ApplyLut(img, &lut, false);
}

void Grayscale(ImageView img) {
  if (img.channels != 3) return;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* px = Row(img, y);
    for (int x = 0; x < img.width; ++x, px += 3) px[0] = px[1] = px[2] = Luma(px);
  }
}

void GaussianBlur(ImageView img, int kx, int ky, double sx, double sy) {
  auto kernel = [](int k, double sigma) {
    std::vector<float> w(static_cast<size_t>(k));
    const float half = static_cast<float>((k - 1) * 0.5);
    float sum = 0;
    for (int i = 0; i < k; ++i) {
      const float x = static_cast<float>(Linspace(-half, half, k, i)) / static_cast<float>(sigma);
      w[i] = std::exp(-0.5f * x * x);
      sum += w[i];
    }
    for (float& v : w) v /= sum;
    return w;
  };
  const std::vector<float> wx = kernel(kx, sx), wy = kernel(ky, sy);
  auto reflect = [](int i, int n) {
    if (n == 1) return 0;
    while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
    return i;
  };
  const int W = img.width, H = img.height, C = img.channels;
  thread_local std::vector<float> tmp;
  tmp.assign(static_cast<size_t>(W) * H * C, 0.0f);
  for (int y = 0; y < H; ++y) {  // vertical pass into tmp
    for (int k = 0; k < ky; ++k) {
      const uint8_t* in = Row(img, reflect(y + k - ky / 2, H));
      float* out = tmp.data() + static_cast<size_t>(y) * W * C;
      for (int i = 0; i < W * C; ++i) out[i] += wy[k] * static_cast<float>(in[i]);
    }
  }
  for (int y = 0; y < H; ++y) {  // horizontal pass back into the image
    const float* in = tmp.data() + static_cast<size_t>(y) * W * C;
    uint8_t* out = Row(img, y);
    for (int x = 0; x < W; ++x) {
      for (int c = 0; c < C; ++c) {
        float s = 0;
        for (int k = 0; k < kx; ++k) s += wx[k] * in[reflect(x + k - kx / 2, W) * C + c];
        out[x * C + c] = static_cast<uint8_t>(std::clamp(std::nearbyint(s), 0.0f, 255.0f));
      }
    }
  }
}

void VerticalFlip(ImageView img) {
  const size_t row = RowBytes(img);
  for (int t = 0, b = img.height - 1; t < b; ++t, --b) std::swap_ranges(Row(img, t), Row(img, t) + row, Row(img, b));
}

Affine2D AffineMap(const AffineParams& p, int width, int height) { return ForwardOf(InverseAffine(p, width, height)); }

Affine2D RotateMap(double angle, bool expand, int in_w, int in_h, int* out_w, int* out_h) {
  return ForwardOf(InverseRotate(angle, expand, in_w, in_h, out_w, out_h));
}

void WarpAffine(const ImageView& src, ImageView dst, const Affine2D& map, WarpFilter filter,
                const std::array<uint8_t, 3>& fill) {
  WarpInverse(src, dst, map.Inverse().m, filter, fill);
}

const char* AugmentName(AugmentKind kind) {
  switch (kind) {
    case AugmentKind::kColorJitter:
      return "color_jitter";
    case AugmentKind::kGrayscale:
      return "grayscale";
    case AugmentKind::kGaussianBlur:
      return "gaussian_blur";
    case AugmentKind::kPosterize:
      return "posterize";
    case AugmentKind::kSolarize:
      return "solarize";
    case AugmentKind::kEqualize:
      return "equalize";
    case AugmentKind::kAutocontrast:
      return "autocontrast";
    case AugmentKind::kSharpness:
      return "sharpness";
    case AugmentKind::kInvert:
      return "invert";
    case AugmentKind::kRandAugment:
      return "rand_augment";
    case AugmentKind::kTrivialAugmentWide:
      return "trivial_augment_wide";
    case AugmentKind::kAutoAugment:
      return "auto_augment";
    case AugmentKind::kVerticalFlip:
      return "vertical_flip";
    case AugmentKind::kRotate:
      return "rotate";
    case AugmentKind::kAffine:
      return "affine";
  }
  return "?";
}

std::string ValidateAugment(const AugmentSpec& s) {
  if (!(s.p >= 0 && s.p <= 1)) return "p must be in [0, 1]";
  auto range_ok = [](const std::array<double, 2>& r, double lo) { return r[0] >= lo && r[0] <= r[1]; };
  switch (s.kind) {
    case AugmentKind::kColorJitter:
      if (!range_ok(s.brightness, 0) || !range_ok(s.contrast, 0) || !range_ok(s.saturation, 0))
        return "brightness, contrast and saturation ranges must be [lo, hi] with 0 <= lo <= hi";
      if (!(s.hue[0] >= -0.5 && s.hue[0] <= s.hue[1] && s.hue[1] <= 0.5)) return "hue must lie in [-0.5, 0.5]";
      return "";
    case AugmentKind::kGaussianBlur:
      if (s.kernel_x < 1 || s.kernel_y < 1 || s.kernel_x % 2 == 0 || s.kernel_y % 2 == 0 || s.kernel_x > 255 ||
          s.kernel_y > 255)
        return "kernel_size must be odd, 1..255";
      if (!(s.sigma[0] > 0 && s.sigma[0] <= s.sigma[1])) return "sigma must be [lo, hi] with 0 < lo <= hi";
      return "";
    case AugmentKind::kPosterize:
      if (!(s.value >= 0 && s.value <= 8 && s.value == std::floor(s.value))) return "bits must be an integer 0..8";
      return "";
    case AugmentKind::kSolarize:
      if (!(s.value >= 0 && s.value <= 256)) return "threshold must be in [0, 256]";
      return "";
    case AugmentKind::kSharpness:
      if (!(s.value >= 0)) return "sharpness_factor must be >= 0";
      return "";
    case AugmentKind::kRandAugment:
    case AugmentKind::kTrivialAugmentWide:
      if (s.num_ops < 0 || s.num_ops > 16) return "num_ops must be 0..16";
      if (s.num_magnitude_bins < 2 || s.num_magnitude_bins > 1000) return "num_magnitude_bins must be 2..1000";
      if (s.magnitude < 0 || s.magnitude >= s.num_magnitude_bins) return "magnitude must be 0..num_magnitude_bins - 1";
      return "";
    case AugmentKind::kRotate:
    case AugmentKind::kAffine:
      if (!(s.degrees[0] <= s.degrees[1])) return "degrees must be [lo, hi] with lo <= hi";
      if (s.kind == AugmentKind::kRotate && s.expand && s.degrees[0] != s.degrees[1])
        return "expand needs a fixed angle (degrees: [a, a]): a batch holds images of one size";
      if (!(s.translate[0] >= 0 && s.translate[0] <= 1 && s.translate[1] >= 0 && s.translate[1] <= 1))
        return "translate must be two fractions in [0, 1]";
      if (!(s.scale[0] > 0 && s.scale[0] <= s.scale[1])) return "scale must be [lo, hi] with 0 < lo <= hi";
      if (!(s.shear[0] <= s.shear[1] && s.shear[2] <= s.shear[3]) ||
          std::any_of(s.shear.begin(), s.shear.end(), [](double v) { return std::fabs(v) >= 90; }))
        return "shear ranges must be [lo, hi] within (-90, 90) degrees";
      return "";
    default:
      return "";
  }
}

void RunAugment(const AugmentSpec& s, ImageView img, SampleRng& rng, Affine2D* map) {
  if (map != nullptr) *map = Affine2D::Identity();
  if (s.p < 1 && !rng.Bernoulli(s.p)) return;
  switch (s.kind) {
    case AugmentKind::kColorJitter: {
      int order[4] = {0, 1, 2, 3};  // a uniform permutation (Fisher-Yates), as torch.randperm(4)
      for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.UniformInt(0, i)]);
      const bool on[4] = {s.brightness[0] != 1 || s.brightness[1] != 1, s.contrast[0] != 1 || s.contrast[1] != 1,
                          s.saturation[0] != 1 || s.saturation[1] != 1, s.hue[0] != 0 || s.hue[1] != 0};
      double f[4] = {1, 1, 1, 0};
      if (on[0]) f[0] = rng.Uniform(s.brightness[0], s.brightness[1]);
      if (on[1]) f[1] = rng.Uniform(s.contrast[0], s.contrast[1]);
      if (on[2]) f[2] = rng.Uniform(s.saturation[0], s.saturation[1]);
      if (on[3]) f[3] = rng.Uniform(s.hue[0], s.hue[1]);
      for (int id : order) {
        if (!on[id]) continue;
        if (id == 0) AdjustBrightness(img, f[0]);
        if (id == 1) AdjustContrast(img, f[1]);
        if (id == 2) AdjustSaturation(img, f[2]);
        if (id == 3) AdjustHue(img, f[3]);
      }
      return;
    }
    case AugmentKind::kGrayscale:
      return Grayscale(img);
    case AugmentKind::kGaussianBlur: {
      const double sigma = rng.Uniform(s.sigma[0], s.sigma[1]);
      return GaussianBlur(img, s.kernel_x, s.kernel_y, sigma, sigma);
    }
    case AugmentKind::kPosterize:
      return Posterize(img, static_cast<int>(s.value));
    case AugmentKind::kSolarize:
      return Solarize(img, s.value);
    case AugmentKind::kEqualize:
      return Equalize(img);
    case AugmentKind::kAutocontrast:
      return Autocontrast(img);
    case AugmentKind::kSharpness:
      return AdjustSharpness(img, s.value);
    case AugmentKind::kInvert:
      return Invert(img);
    case AugmentKind::kRandAugment:
    case AugmentKind::kTrivialAugmentWide: {
      const bool wide = s.kind == AugmentKind::kTrivialAugmentWide;
      const int n = wide ? 1 : s.num_ops;
      for (int i = 0; i < n; ++i) {
        const PolicyOp op = kRandOps[rng.UniformInt(0, std::size(kRandOps) - 1)];
        const int bin = wide ? static_cast<int>(rng.UniformInt(0, s.num_magnitude_bins - 1)) : s.magnitude;
        bool is_signed = false;
        double m = Magnitude(op, bin, s.num_magnitude_bins, wide, img.width, img.height, &is_signed);
        if (is_signed && rng.Bernoulli(0.5)) m = -m;
        const Affine2D step = ApplyPolicyOp(op, m, img, s);
        if (map != nullptr) *map = map->Then(step);
      }
      return;
    }
    case AugmentKind::kAutoAugment: {
      const auto& policy = kImageNetPolicy[rng.UniformInt(0, 24)];
      const double probs[2] = {rng.Uniform(0, 1), rng.Uniform(0, 1)};
      const bool negative[2] = {rng.Bernoulli(0.5), rng.Bernoulli(0.5)};
      for (int i = 0; i < 2; ++i) {
        if (!(probs[i] <= policy[i].p)) continue;
        bool is_signed = false;
        double m = policy[i].bin < 0
                       ? 0.0
                       : Magnitude(policy[i].op, policy[i].bin, 10, false, img.width, img.height, &is_signed);
        if (is_signed && negative[i]) m = -m;
        const Affine2D step = ApplyPolicyOp(policy[i].op, m, img, s);
        if (map != nullptr) *map = map->Then(step);
      }
      return;
    }
    case AugmentKind::kVerticalFlip:
      VerticalFlip(img);
      if (map != nullptr) *map = VerticalFlipMap(img.height);
      return;
    case AugmentKind::kRotate: {
      const double angle = rng.Uniform(s.degrees[0], s.degrees[1]);
      int w = 0, h = 0;
      const auto inv = InverseRotate(angle, false, img.width, img.height, &w, &h);
      WarpInPlace(img, inv, s.filter, s.fill);
      if (map != nullptr) *map = ForwardOf(inv);
      return;
    }
    case AugmentKind::kAffine: {
      AffineParams p;
      p.angle = rng.Uniform(s.degrees[0], s.degrees[1]);
      const double max_dx = s.translate[0] * img.width, max_dy = s.translate[1] * img.height;
      if (max_dx > 0 || max_dy > 0) {
        p.translate_x = std::nearbyint(rng.Uniform(-max_dx, max_dx));
        p.translate_y = std::nearbyint(rng.Uniform(-max_dy, max_dy));
      }
      if (s.scale[0] != 1 || s.scale[1] != 1) p.scale = rng.Uniform(s.scale[0], s.scale[1]);
      if (s.shear[0] != 0 || s.shear[1] != 0) p.shear_x = rng.Uniform(s.shear[0], s.shear[1]);
      if (s.shear[2] != 0 || s.shear[3] != 0) p.shear_y = rng.Uniform(s.shear[2], s.shear[3]);
      const auto inv = InverseAffine(p, img.width, img.height);
      WarpInPlace(img, inv, s.filter, s.fill);
      if (map != nullptr) *map = ForwardOf(inv);
      return;
    }
  }
}

CropDraw DrawRandomCrop(const RandomCropSpec& s, int in_w, int in_h, SampleRng& rng, std::string* error) {
  error->clear();
  CropDraw d;
  d.pad_left = s.padding[0];
  d.pad_top = s.padding[1];
  int w = in_w + s.padding[0] + s.padding[2], h = in_h + s.padding[1] + s.padding[3];
  // pad_if_needed: torchvision pads both sides by the shortfall (F.pad with [dw, 0], then [0, dh]).
  if (s.pad_if_needed && w < s.width) {
    d.pad_left += s.width - w;
    w += 2 * (s.width - w);
  }
  if (s.pad_if_needed && h < s.height) {
    d.pad_top += s.height - h;
    h += 2 * (s.height - h);
  }
  if (w < s.width || h < s.height) {
    *error = "random_crop: the " + std::to_string(w) + "x" + std::to_string(h) +
             " (padded) image is smaller than the " + std::to_string(s.width) + "x" + std::to_string(s.height) +
             " crop";
    return {};
  }
  d.width = s.width;
  d.height = s.height;
  if (w != s.width || h != s.height) {  // get_params: (0, 0) when the sizes are equal, no draw
    d.y = static_cast<int>(rng.UniformInt(0, h - s.height));
    d.x = static_cast<int>(rng.UniformInt(0, w - s.width));
  }
  return d;
}

void PadCrop(const ImageView& src, ImageView dst, const CropDraw& d, PadMode mode, const std::array<uint8_t, 3>& fill) {
  // The source index of padded coordinate p along an axis of n pixels, or -1 for the fill.
  auto source = [mode](int p, int n) {
    if (p >= 0 && p < n) return p;
    switch (mode) {
      case PadMode::kConstant:
        return -1;
      case PadMode::kEdge:
        return p < 0 ? 0 : n - 1;
      case PadMode::kReflect: {
        if (n == 1) return 0;
        const int period = 2 * (n - 1);
        int q = ((p % period) + period) % period;
        return q < n ? q : period - q;
      }
      case PadMode::kSymmetric: {
        const int period = 2 * n;
        int q = ((p % period) + period) % period;
        return q < n ? q : period - 1 - q;
      }
    }
    return -1;
  };
  const int C = src.channels;
  for (int y = 0; y < d.height; ++y) {
    uint8_t* out = Row(dst, y);
    const int sy = source(d.y + y - d.pad_top, src.height);
    for (int x = 0; x < d.width; ++x) {
      const int sx = source(d.x + x - d.pad_left, src.width);
      if (sx < 0 || sy < 0) {
        for (int c = 0; c < C; ++c) out[x * C + c] = fill[c];
      } else {
        const uint8_t* in = Row(src, sy) + static_cast<size_t>(sx) * C;
        for (int c = 0; c < C; ++c) out[x * C + c] = in[c];
      }
    }
  }
}

EraseRect PlanErase(int width, int height, std::array<double, 2> scale, std::array<double, 2> ratio, SampleRng& rng) {
  const double area = static_cast<double>(width) * height;
  const double lr0 = std::log(ratio[0]), lr1 = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * rng.Uniform(scale[0], scale[1]);
    const double aspect = std::exp(rng.Uniform(lr0, lr1));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(erase_area * aspect)));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(erase_area / aspect)));
    if (!(h < height && w < width) || h <= 0 || w <= 0) continue;
    EraseRect r;
    r.y = static_cast<int>(rng.UniformInt(0, height - h));
    r.x = static_cast<int>(rng.UniformInt(0, width - w));
    r.width = w;
    r.height = h;
    return r;
  }
  return {};
}

}  // namespace spdl::media
