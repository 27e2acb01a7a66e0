#include "media/pixel_convert.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace spdl::media {
namespace {

// Rounds |x| (finite, >= 0) to an IEEE format with `mantissa_bits` explicit significand bits and
// exponent bias `bias`, ties to even, and returns the bits without the sign. Scaling by powers of
// two is exact in double, and nearbyint rounds to nearest-even in the default rounding mode.
uint16_t RoundMagnitude(double a, int mantissa_bits, int bias, int max_biased_exp) {
  const int min_normal_exp = 1 - bias;
  const uint32_t implicit = 1u << mantissa_bits;
  if (a < std::ldexp(1.0, min_normal_exp)) {
    // Subnormal: units of the smallest subnormal. 2^mantissa_bits rounds up to the smallest
    // normal, whose encoding is exactly that integer.
    return static_cast<uint16_t>(std::nearbyint(std::ldexp(a, mantissa_bits - min_normal_exp)));
  }
  int e2 = 0;
  std::frexp(a, &e2);                                           // a = m * 2^e2, m in [0.5, 1)
  int e = e2 - 1;                                               // a in [2^e, 2^(e+1))
  double q = std::nearbyint(std::ldexp(a, mantissa_bits - e));  // in [2^mb, 2^(mb+1)]
  if (q >= 2.0 * implicit) {
    q /= 2;
    ++e;
  }
  const int biased = e + bias;
  if (biased >= max_biased_exp) return static_cast<uint16_t>(max_biased_exp << mantissa_bits);
  return static_cast<uint16_t>((static_cast<uint32_t>(biased) << mantissa_bits) |
                               (static_cast<uint32_t>(q) - implicit));
}

uint16_t ToSmallFloat(double x, int mantissa_bits, int bias, int max_biased_exp, uint16_t quiet_nan) {
  if (std::isnan(x)) return quiet_nan;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | static_cast<uint16_t>(max_biased_exp << mantissa_bits);
  return sign | RoundMagnitude(a, mantissa_bits, bias, max_biased_exp);
}

template <typename T>
const T* Row(const ValueTable& t, int c);
template <>
const float* Row<float>(const ValueTable& t, int c) {
  return t.f32(c);
}
template <>
const uint16_t* Row<uint16_t>(const ValueTable& t, int c) {
  return t.u16(c);
}

// The pass for one element type, layout, source sample type and channel count. `origin` is the
// source pixel shown at (dst_x, dst_y); moving one output pixel right moves the source pointer by
// xstep bytes, one down by ystep.
template <typename T, OutputLayout L, typename S, int C>
void ConvertTyped(const uint8_t* origin, ptrdiff_t xstep, ptrdiff_t ystep, int w, int h, int dst_x, int dst_y,
                  const ValueTable& table, const OutputImage& out) {
  // The output value of channel c for source sample v (8-bit: a table entry; 16-bit: computed).
  const T* tab[3] = {nullptr, nullptr, nullptr};
  if constexpr (!std::is_same_v<T, uint8_t> && std::is_same_v<S, uint8_t>) {
    for (int c = 0; c < 3; ++c) tab[c] = Row<T>(table, c);
  }
  auto value = [&](int c, S v) -> T {
    if constexpr (std::is_same_v<S, uint8_t>) {
      if constexpr (std::is_same_v<T, uint8_t>) {
        return v;
      } else {
        return tab[c][v];
      }
    } else if constexpr (std::is_same_v<T, float>) {
      return table.Wide32(c, v);
    } else if constexpr (std::is_same_v<T, uint16_t>) {
      return table.Wide16(c, v);
    } else {
      return static_cast<T>(v >> 8);
    }
  };
  T pad[C];
  for (int c = 0; c < C; ++c) pad[c] = value(c, 0);
  const size_t plane = static_cast<size_t>(out.width) * out.height;
  for (int y = 0; y < out.height; ++y) {
    const bool in_rows = y >= dst_y && y < dst_y + h;
    const int x_begin = in_rows ? dst_x : out.width;
    const int x_end = in_rows ? dst_x + w : out.width;
    if constexpr (L == OutputLayout::kNHWC) {
      T* row = reinterpret_cast<T*>(static_cast<uint8_t*>(out.data) + y * out.row_stride);
      for (int x = 0; x < x_begin; ++x) {
        for (int c = 0; c < C; ++c) row[C * x + c] = pad[c];
      }
      if (in_rows) {
        const uint8_t* p = origin + (y - dst_y) * ystep;
        T* o = row + C * static_cast<size_t>(dst_x);
        for (int x = 0; x < w; ++x, p += xstep, o += C) {
          const S* px = reinterpret_cast<const S*>(p);
          for (int c = 0; c < C; ++c) o[c] = value(c, px[c]);
        }
      }
      for (int x = x_end; x < out.width; ++x) {
        for (int c = 0; c < C; ++c) row[C * x + c] = pad[c];
      }
    } else {
      T* planes[C];
      for (int c = 0; c < C; ++c) {
        planes[c] = static_cast<T*>(out.data) + c * plane + static_cast<size_t>(y) * out.width;
      }
      for (int c = 0; c < C; ++c) {
        for (int x = 0; x < x_begin; ++x) planes[c][x] = pad[c];
        for (int x = x_end; x < out.width; ++x) planes[c][x] = pad[c];
      }
      if (in_rows) {
        const uint8_t* p = origin + (y - dst_y) * ystep;
        for (int x = 0; x < w; ++x, p += xstep) {
          const S* px = reinterpret_cast<const S*>(p);
          for (int c = 0; c < C; ++c) planes[c][dst_x + x] = value(c, px[c]);
        }
      }
    }
  }
}

template <OutputLayout L, typename S, int C>
void ConvertLayout(const uint8_t* origin, ptrdiff_t xstep, ptrdiff_t ystep, int w, int h, int dst_x, int dst_y,
                   const ValueTable& table, const OutputImage& out) {
  switch (table.dtype()) {
    case OutputDType::kUInt8:
      return ConvertTyped<uint8_t, L, S, C>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out);
    case OutputDType::kFloat32:
      return ConvertTyped<float, L, S, C>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out);
    case OutputDType::kFloat16:
    case OutputDType::kBFloat16:
      return ConvertTyped<uint16_t, L, S, C>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out);
  }
}

template <OutputLayout L>
void ConvertSource(const uint8_t* origin, ptrdiff_t xstep, ptrdiff_t ystep, int w, int h, int dst_x, int dst_y,
                   const ValueTable& table, const OutputImage& out, int channels, bool wide) {
  if (wide) {
    if (channels == 1) return ConvertLayout<L, uint16_t, 1>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out);
    return ConvertLayout<L, uint16_t, 3>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out);
  }
  if (channels == 1) return ConvertLayout<L, uint8_t, 1>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out);
  return ConvertLayout<L, uint8_t, 3>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out);
}

}  // namespace

Orientation OrientationFromExif(int tag) {
  switch (tag) {
    case 2:
      return {false, true, false};
    case 3:
      return {false, true, true};
    case 4:
      return {false, false, true};
    case 5:
      return {true, false, false};
    case 6:
      return {true, false, true};
    case 7:
      return {true, true, true};
    case 8:
      return {true, true, false};
    default:
      return {};
  }
}

Orientation MirrorHorizontally(Orientation o) {
  // The displayed x runs along the stored u axis, which is sx (or sy when transposed).
  if (o.transpose) {
    o.flip_y = !o.flip_y;
  } else {
    o.flip_x = !o.flip_x;
  }
  return o;
}

Window DisplayedToStored(const Window& w, Orientation o, int sw, int sh) {
  double u0 = w.x0, u1 = w.x1, v0 = w.y0, v1 = w.y1;
  if (o.transpose) {
    std::swap(u0, v0);
    std::swap(u1, v1);
  }
  if (o.flip_x) {
    const double a = sw - u1, b = sw - u0;
    u0 = a;
    u1 = b;
  }
  if (o.flip_y) {
    const double a = sh - v1, b = sh - v0;
    v0 = a;
    v1 = b;
  }
  return {u0, v0, u1, v1};
}

uint16_t DoubleToHalf(double x) { return ToSmallFloat(x, 10, 15, 31, 0x7E00); }
uint16_t DoubleToBFloat16(double x) { return ToSmallFloat(x, 7, 127, 255, 0x7FC0); }

double HalfToDouble(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exp = (bits >> 10) & 0x1F;
  const int mant = bits & 0x3FF;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  if (exp == 31) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  return sign * std::ldexp(1024 + mant, exp - 25);
}

double BFloat16ToDouble(uint16_t bits) {
  const uint32_t f = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &f, sizeof(v));
  return v;
}

void ValueTable::Build(const ImageOps& ops) {
  built_ = true;
  dtype_ = ops.dtype;
  normalize_ = ops.normalize;
  mean_ = ops.mean;
  stddev_ = ops.stddev;
  if (dtype_ == OutputDType::kUInt8) return;
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      double x = v / 255.0;
      if (normalize_) x = (x - mean_[c]) / stddev_[c];
      switch (dtype_) {
        case OutputDType::kFloat32:
          f32_[c][v] = static_cast<float>(x);
          break;
        case OutputDType::kFloat16:
          u16_[c][v] = DoubleToHalf(x);
          break;
        case OutputDType::kBFloat16:
          u16_[c][v] = DoubleToBFloat16(x);
          break;
        case OutputDType::kUInt8:
          break;
      }
    }
  }
}

namespace {

double WideValue(uint16_t v, bool normalize, double mean, double stddev) {
  double x = v / 65535.0;
  if (normalize) x = (x - mean) / stddev;
  return x;
}

}  // namespace

float ValueTable::Wide32(int c, uint16_t v) const {
  return static_cast<float>(WideValue(v, normalize_, mean_[c], stddev_[c]));
}

uint16_t ValueTable::Wide16(int c, uint16_t v) const {
  const double x = WideValue(v, normalize_, mean_[c], stddev_[c]);
  return dtype_ == OutputDType::kBFloat16 ? DoubleToBFloat16(x) : DoubleToHalf(x);
}

bool ValueTable::BuiltFor(const ImageOps& ops) const {
  if (!built_ || ops.dtype != dtype_) return false;
  if (dtype_ == OutputDType::kUInt8) return true;
  return ops.normalize == normalize_ && (!normalize_ || (ops.mean == mean_ && ops.stddev == stddev_));
}

void ConvertInto(const SourceImage& src, Orientation o, int dst_x, int dst_y, const ValueTable& table,
                 const OutputImage& out) {
  const ptrdiff_t px = static_cast<ptrdiff_t>(src.channels) * (src.wide ? 2 : 1);
  const ptrdiff_t row = static_cast<ptrdiff_t>(src.stride);
  // Steps along stored u (sx) and v (sy), and where displayed (0, 0) is in the source.
  const ptrdiff_t ustep = o.flip_x ? -px : px;
  const ptrdiff_t vstep = o.flip_y ? -row : row;
  const uint8_t* origin = src.data + (o.flip_x ? (src.width - 1) * px : 0) + (o.flip_y ? (src.height - 1) * row : 0);
  const ptrdiff_t xstep = o.transpose ? vstep : ustep;
  const ptrdiff_t ystep = o.transpose ? ustep : vstep;
  const int w = o.transpose ? src.height : src.width;
  const int h = o.transpose ? src.width : src.height;
  if (out.layout == OutputLayout::kNHWC) {
    ConvertSource<OutputLayout::kNHWC>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out, src.channels, src.wide);
  } else {
    ConvertSource<OutputLayout::kNCHW>(origin, xstep, ystep, w, h, dst_x, dst_y, table, out, src.channels, src.wide);
  }
}

}  // namespace spdl::media
