// Resampler: a separable image resampler that gives the pixels PIL's Image.resize gives (the
// filters torchvision's Resize uses on PIL images), computing only a window of the resized image.
//
// Not thread-safe: one Resampler per thread (ImageDecoder owns one); it keeps its weight tables and
// intermediate rows between calls. The free functions are pure.
//
// The algorithm (PIL's, re-implemented from its public description and checked value for value
// against PIL 9.4 in tests/python/test_parity.py and tests/unit/media_test.cc):
//   - Each axis is resized on its own, horizontally first, then vertically; the intermediate image is
//     rounded and clipped to the sample type (uint8), as in PIL. An axis whose size does not change
//     is not resampled (PIL skips that pass; the weights would be the identity anyway).
//   - Output sample i of an axis scaled by s = in / out has its centre at (i + 0.5) * s; the filter is
//     stretched by max(s, 1) (antialiasing when downscaling), so its support is support(f) * max(s, 1)
//     source samples each side; its taps are the source samples j in [int(centre - support + 0.5),
//     int(centre + support + 0.5)) clipped to the image, weighted f((j - centre + 0.5) / max(s, 1)),
//     normalized to sum 1, then rounded to fixed point with kResamplePrecisionBits fraction bits
//     (away from zero at .5). A sample is the sum of tap * weight plus half, shifted right and
//     clipped.
//   - Filters: box (support 0.5), bilinear / triangle (1), hamming (1), bicubic with a = -0.5 (2),
//     lanczos-3 (3). Nearest is not a convolution: output i takes source sample int(x_i), where x_i
//     starts at s / 2 and grows by s per sample (accumulated in double, as PIL's affine scaler).
// The crop is fused: the caller names the window of the resized image it wants, and only that
// window's samples are computed, with exactly the weights the whole resize would use (so a resize
// followed by a crop gives the same values as computing the window alone).
// 16-bit samples (wide) go through the same weights with 64-bit sums (PIL has no such mode: this
// keeps a 16-bit source's precision for floating-point outputs).
// Speed: the 8-bit passes use AVX2 when the CPU has it (chosen at run time), else portable scalar
// code. The AVX2 code multiplies in 16 bits (madd: two taps' products summed per 32-bit lane), each
// fixed-point weight split into a high and a low 15-bit part; the 32-bit sums are the scalar code's
// bit for bit (resample.cc says why), so the values are the same. The horizontal pass of RGB and
// gray rows computes eight output pixels per step, each output's taps read by one 16-byte load per
// four taps (RGB) or one 8-byte load per eight (gray) from the row (or, near its end, from a copy
// of its last bytes, so no load crosses it); RGBA rows take the scalar code. The vertical pass does
// 32 samples per step, two source rows per madd.
// A horizontal flip of the window (ResampleRequest::mirror) costs nothing: the horizontal pass
// writes its outputs in reverse order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace spdl::media {

enum class ResampleFilter { kNearest, kBox, kBilinear, kHamming, kBicubic, kLanczos };

// Fraction bits of the fixed-point weights (PIL's PRECISION_BITS for 8-bit images).
inline constexpr int kResamplePrecisionBits = 22;

// The weights of some outputs of one axis: output first_output + i reads source samples
// [first[i], first[i] + count[i]) with weights weights[i * taps + k] (fixed point).
struct AxisWeights {
  int taps = 0;
  int first_output = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;
};

// Fills *w with the weights of outputs [out_begin, out_end) of an in_size -> out_size resize with
// filter f (not kNearest). REQUIRES: in_size >= 1, out_size >= 1, 0 <= out_begin < out_end <= out_size.
void ComputeAxisWeights(int in_size, int out_size, ResampleFilter f, int out_begin, int out_end, AxisWeights* w);

// Fills *index with the source sample of outputs [out_begin, out_end) of an in_size -> out_size
// nearest-neighbour resize. Same REQUIRES as ComputeAxisWeights.
void ComputeNearestIndex(int in_size, int out_size, int out_begin, int out_end, std::vector<int>* index);

// A packed image: height rows of width pixels of `channels` samples, uint8 or (wide) native-endian
// uint16, rows stride bytes apart. The resampler only reads it.
struct PackedImage {
  const uint8_t* data = nullptr;
  size_t stride = 0;
  int width = 0;
  int height = 0;
  int channels = 3;  // 1, 3 or 4
  bool wide = false;
};

// What to compute: the src image resized to out_width x out_height, of which only the window
// [window_x, window_x + window_width) x [window_y, window_y + window_height) is written.
struct ResampleRequest {
  int out_width = 0;
  int out_height = 0;
  int window_x = 0;
  int window_y = 0;
  int window_width = 0;
  int window_height = 0;
  ResampleFilter filter = ResampleFilter::kBilinear;
  // src may be only a part of the image being resized (a window decode): its columns [src_x, src_x +
  // src.width) and rows [src_y, src_y + src.height) of a full_width x full_height image (0, 0: src is
  // the whole image). The weights are the whole image's; the part must hold every source sample the
  // window reads (SourceSpan), else kInvalidArgument.
  int src_x = 0;
  int src_y = 0;
  int full_width = 0;
  int full_height = 0;
  // Write the window mirrored left to right (a horizontal flip folded into the horizontal pass:
  // output column j gets what column window_width - 1 - j would; the values are the unmirrored
  // window's, bit for bit). An axis that keeps its size is then still passed through horizontally,
  // with identity weights.
  bool mirror = false;
};

// The source samples [*begin, *end) that outputs [out_begin, out_end) of an in_size -> out_size
// resize with filter f read (an axis whose size does not change reads exactly its outputs).
// Same REQUIRES as ComputeAxisWeights.
void SourceSpan(int in_size, int out_size, ResampleFilter f, int out_begin, int out_end, int* begin, int* end);

class Resampler {
 public:
  // simd: use the CPU's vector unit when it has AVX2 (false: the portable code only, for tests).
  explicit Resampler(bool simd = true) : simd_(simd) {}
  Resampler(Resampler&&) noexcept = default;
  Resampler& operator=(Resampler&&) noexcept = default;
  Resampler(const Resampler&) = delete;
  Resampler& operator=(const Resampler&) = delete;

  // Writes the request's window of the resized src to dst: window_height rows of window_width
  // packed pixels (src's channels and sample width), dst_stride bytes apart. kInvalidArgument for
  // an empty source or output, a window outside the output, channels other than 1, 3 or 4, or a
  // dst_stride too small. dst must not overlap src.
  Status Resample(const PackedImage& src, const ResampleRequest& r, uint8_t* dst, size_t dst_stride);

  // Frees intermediate buffers larger than max_bytes (a huge image should not pin memory).
  void Trim(size_t max_bytes);

 private:
  bool simd_ = true;
  AxisWeights horizontal_;
  AxisWeights vertical_;
  std::vector<int> index_x_;
  std::vector<int> index_y_;
  std::vector<uint8_t> rows_;        // the horizontal pass's rows, before the vertical pass
  std::vector<int64_t> sums_;        // one output row's sums in the vertical pass (16-bit samples)
  std::vector<int32_t> sums32_;      // the same for 8-bit samples (AVX2: the weight pairs)
  std::vector<int32_t> simd_words_;  // the horizontal weights laid out for the AVX2 pass
  std::vector<int32_t> simd_lanes_;  // per group of eight outputs: where its weights and pixels are
  std::vector<uint8_t> simd_tail_;   // a copy of a row's end, for loads that would cross it
};

}  // namespace spdl::media
