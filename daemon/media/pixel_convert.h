// The output pass: one resampled image (1 or 3 channels, 8- or 16-bit samples, in the orientation
// it was stored in) becomes the output image — turned upright (EXIF orientation), mirrored (random
// horizontal flip), padded, normalized, converted to the output dtype and laid out HWC or CHW — in
// one pass over the pixels, straight into the caller's buffer (a row of a batch slot).
//
// 8-bit values go through a per-channel table of the 256 possible results, computed once in
// double precision and rounded once (to nearest, ties to even) to the output type, so the pass is
// a gather and a store per element and its values are exact. 16-bit values (floating-point
// outputs of 16-bit sources) are computed per element the same way: v / 65535, normalized, rounded
// once.
//
// Pure functions and plain values: safe from any thread. A ValueTable is read-only once built.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "media/image_ops.h"

namespace spdl::media {

// A dihedral transform between an image as displayed (D, what the output shows) and as stored
// (S, what the decoder produced), S being sw x sh:
//   D(x, y) = S(sx, sy), where (u, v) = transpose ? (y, x) : (x, y),
//                              sx = flip_x ? sw - 1 - u : u,  sy = flip_y ? sh - 1 - v : v.
// D is sh x sw when transposed, else sw x sh.
struct Orientation {
  bool transpose = false;
  bool flip_x = false;
  bool flip_y = false;

  bool identity() const { return !transpose && !flip_x && !flip_y; }
  bool operator==(const Orientation&) const = default;
};

// The transform that makes an image with EXIF Orientation `tag` upright (1..8, as PIL's
// exif_transpose: 2 mirror, 3 rotate 180, 4 flip, 5 transpose, 6 rotate 90 clockwise,
// 7 transverse, 8 rotate 90 counter-clockwise). Any other value: identity.
Orientation OrientationFromExif(int tag);
// `o` followed by mirroring the displayed image left-right.
Orientation MirrorHorizontally(Orientation o);

// A rectangle [x0, x1) x [y0, y1) in continuous pixel coordinates.
struct Window {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};
// Maps a window of the displayed image to the stored image (stored size sw x sh).
Window DisplayedToStored(const Window& w, Orientation o, int sw, int sh);

// Nearest float16 / bfloat16 (IEEE binary16 / the top half of binary32) to x, ties to even,
// as bits; overflow gives infinity, NaN a quiet NaN.
uint16_t DoubleToHalf(double x);
uint16_t DoubleToBFloat16(double x);
double HalfToDouble(uint16_t bits);
double BFloat16ToDouble(uint16_t bits);

// The output value of every (channel, 8-bit value): v for uint8; v / 255 for floating point
// outputs; (v / 255 - mean[c]) / stddev[c] with normalize.
class ValueTable {
 public:
  // Fills the table for ops' dtype and normalization. REQUIRES: ValidateImageOps(ops).ok().
  void Build(const ImageOps& ops);
  // True when the table was built for ops' dtype and normalization (a cache check).
  bool BuiltFor(const ImageOps& ops) const;

  OutputDType dtype() const { return dtype_; }
  const float* f32(int c) const { return f32_[c].data(); }
  const uint16_t* u16(int c) const { return u16_[c].data(); }
  // The output value of channel c for a 16-bit sample v, as the table's entries are made but
  // from v / 65535: a float for kFloat32, the bits for kFloat16 / kBFloat16, v >> 8 for kUInt8.
  float Wide32(int c, uint16_t v) const;
  uint16_t Wide16(int c, uint16_t v) const;

 private:
  bool built_ = false;
  OutputDType dtype_ = OutputDType::kUInt8;
  bool normalize_ = false;
  std::array<double, 3> mean_{};
  std::array<double, 3> stddev_{};
  std::array<std::array<float, 256>, 3> f32_{};
  std::array<std::array<uint16_t, 256>, 3> u16_{};
};

// Where the output pass writes: a width x height image of `channels` (1 or 3) channels, in
// `table`'s dtype.
// NHWC: rows of width * channels elements, row_stride bytes apart (>= width * channels * element
// size). NCHW: `channels` packed planes of width * height elements (row_stride is ignored).
struct OutputImage {
  void* data = nullptr;
  int width = 0;
  int height = 0;
  size_t row_stride = 0;
  OutputLayout layout = OutputLayout::kNHWC;
  int channels = 3;
};

// What the output pass reads: width x height packed pixels of `channels` (1 or 3, the output's)
// samples each, 8-bit or (wide) 16-bit in native byte order, rows stride bytes apart.
struct SourceImage {
  const uint8_t* data = nullptr;
  size_t stride = 0;
  int width = 0;
  int height = 0;
  int channels = 3;
  bool wide = false;
};

// Writes `src` (in stored orientation) into `out`, turned by `o` and placed with its top-left
// corner at (dst_x, dst_y); every output pixel outside it becomes the table's value for 0 (the zero
// padding of torchvision's CenterCrop, normalized). Only the image's elements are written (not the
// bytes between NHWC rows).
// REQUIRES: src.channels == out.channels; the turned image fits in `out` at (dst_x, dst_y); `src`
// does not overlap `out`; a wide source only with a floating-point table.
void ConvertInto(const SourceImage& src, Orientation o, int dst_x, int dst_y, const ValueTable& table,
                 const OutputImage& out);

}  // namespace spdl::media
