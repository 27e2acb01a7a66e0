// Image math of GPU decode (decode.device: cuda): the per-sample arithmetic of the resize / crop /
// flip / normalise step, written once as functions that compile both for the host (plain C++) and,
// inside a .cu file, for the GPU (__host__ __device__). The CUDA kernels (cuda/image_kernels.cu)
// run one thread per output sample through these functions; RunResizeOnHost runs the same functions
// in loops, for the fake kernels of the CPU tests, so the CPU tests check the very code the GPU
// runs.
//
// The arithmetic is the CPU path's (daemon/media/resample.h: PIL's separable filters): the weights
// are the CPU path's own fixed-point tables (computed on the host by media::ComputeAxisWeights and
// handed over as a ResizePlan), a sample is half + sum(tap * weight), shifted right by
// kPrecisionBits and clipped, the horizontal pass first, its result rounded to uint8, then the
// vertical pass; an axis whose size does not change is copied, as PIL does. Floating-point outputs
// come from a per-channel table of the 256 uint8 values (the CPU path's ValueTable, computed in
// double on the host), so the output of one resampled pixel is bit-equal to the CPU path's. The
// only difference between the two paths is then the JPEG decoder (nvJPEG vs libjpeg-turbo).
//
// Thread safety: pure functions on caller-owned memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define SPDL_HD __host__ __device__ __forceinline__
#else
#define SPDL_HD inline
#endif

namespace spdl::cuda::imgmath {

// Fraction bits of the fixed-point weights (media::kResamplePrecisionBits; checked in the tests).
inline constexpr int kPrecisionBits = 22;

// The taps of the outputs of one axis: output i reads source samples [first[i], first[i] + count[i])
// with weights weights[i * taps + k]. first[] is in the decoded image's coordinates (the source
// rectangle's offset included).
struct AxisTaps {
  int taps = 0;
  int n = 0;  // outputs
  const int* first = nullptr;
  const int* count = nullptr;
  const int32_t* weights = nullptr;
};

// One fixed-point tap sum: the CPU path's ClipSample(half + sum p[t * step] * k[t]) for uint8.
SPDL_HD uint8_t TapSum8(const uint8_t* p, ptrdiff_t step, const int32_t* k, int count) {
  int32_t s = int32_t{1} << (kPrecisionBits - 1);
  for (int t = 0; t < count; ++t) s += static_cast<int32_t>(p[t * step]) * k[t];
  s >>= kPrecisionBits;
  return static_cast<uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

// How the output image is stored: out_width x out_height, `channels` (3) samples, uint8 or a
// 2- or 4-byte value from a table, HWC or CHW, mirrored left-right when flip.
enum OutDType : int { kOutU8 = 0, kOutF32 = 1, kOutU16Bits = 2 /* float16 / bfloat16 bits */ };
struct OutputSpec {
  int dtype = kOutU8;
  bool nchw = false;
  bool flip = false;
  int channels = 3;
  int width = 0;
  int height = 0;
  const float* lut_f32 = nullptr;     // [channels][256], for kOutF32
  const uint16_t* lut_u16 = nullptr;  // [channels][256], for kOutU16Bits
};

// Writes output sample (x, y, c) of value v (the resampled uint8) to dst.
SPDL_HD void StoreSample(void* dst, const OutputSpec& o, int x, int y, int c, uint8_t v) {
  const int ox = o.flip ? o.width - 1 - x : x;
  const size_t i = o.nchw ? (static_cast<size_t>(c) * o.height + y) * o.width + ox
                          : (static_cast<size_t>(y) * o.width + ox) * o.channels + c;
  switch (o.dtype) {
    case kOutF32:
      static_cast<float*>(dst)[i] = o.lut_f32[c * 256 + v];
      break;
    case kOutU16Bits:
      static_cast<uint16_t*>(dst)[i] = o.lut_u16[c * 256 + v];
      break;
    default:
      static_cast<uint8_t*>(dst)[i] = v;
      break;
  }
}

// Where one image goes: the decoded image (interleaved RGB, `pitch` bytes a row) is resized to
// resized_width x resized_height (the source rectangle [src_x, src_x + src_width) x ... only; the
// whole image unless a random resized crop chose one), and the window [window_x, + out width) x
// [window_y, + out height) of it is the output. need_h / need_v: whether that axis is resampled
// (else copied: the axis keeps its size).
struct ResizeGeometry {
  int src_x = 0, src_y = 0, src_width = 0, src_height = 0;
  int window_x = 0, window_y = 0;
  bool need_h = false, need_v = false;
  int row0 = 0;  // the first decoded row the vertical pass reads (rows of the horizontal pass)
  int rows = 0;  // how many decoded rows the horizontal pass produces
};

// Pass 1, one sample of the intermediate image: decoded row row0 + r, output column i, channel c.
SPDL_HD uint8_t HorizontalSample(const uint8_t* src, size_t pitch, int channels, const ResizeGeometry& g,
                                 const AxisTaps& h, int r, int i, int c) {
  const uint8_t* row = src + static_cast<size_t>(g.row0 + r) * pitch;
  if (!g.need_h) return row[static_cast<size_t>(g.src_x + g.window_x + i) * channels + c];
  return TapSum8(row + static_cast<size_t>(h.first[i]) * channels + c, channels,
                 h.weights + static_cast<size_t>(i) * h.taps, h.count[i]);
}

// Pass 2, one output sample: output row y, column i, channel c, from the intermediate image `mid`
// (g.rows rows of out_width * channels samples, mid_pitch bytes apart).
SPDL_HD uint8_t VerticalSample(const uint8_t* mid, size_t mid_pitch, int channels, const ResizeGeometry& g,
                               const AxisTaps& v, int y, int i, int c) {
  const size_t col = static_cast<size_t>(i) * channels + c;
  if (!g.need_v) return mid[static_cast<size_t>(g.src_y + g.window_y + y - g.row0) * mid_pitch + col];
  return TapSum8(mid + static_cast<size_t>(v.first[y] - g.row0) * mid_pitch + col, static_cast<ptrdiff_t>(mid_pitch),
                 v.weights + static_cast<size_t>(y) * v.taps, v.count[y]);
}

// The host-side tables of one image's resize (built by the daemon from the CPU path's weights:
// jobs/gpu_decode_plan.h), and views of them.
struct ResizePlan {
  ResizeGeometry geometry;
  int h_taps = 0;
  std::vector<int> h_first, h_count;
  std::vector<int32_t> h_weights;
  int v_taps = 0;
  std::vector<int> v_first, v_count;
  std::vector<int32_t> v_weights;

  AxisTaps horizontal() const {
    return {h_taps, static_cast<int>(h_first.size()), h_first.data(), h_count.data(), h_weights.data()};
  }
  AxisTaps vertical() const {
    return {v_taps, static_cast<int>(v_first.size()), v_first.data(), v_count.data(), v_weights.data()};
  }
};

// The same arithmetic as the kernels, in loops on the host: `src` is the decoded image (host
// memory), dst the output image. `mid` is scratch (resized to plan.geometry.rows * out width *
// channels). For the fake kernels and the CPU tests.
inline void RunResizeOnHost(const uint8_t* src, size_t pitch, const ResizePlan& plan, const OutputSpec& o, void* dst,
                            std::vector<uint8_t>& mid) {
  const ResizeGeometry& g = plan.geometry;
  const AxisTaps h = plan.horizontal();
  const AxisTaps v = plan.vertical();
  const size_t mid_pitch = static_cast<size_t>(o.width) * o.channels;
  mid.resize(mid_pitch * static_cast<size_t>(g.rows));
  for (int r = 0; r < g.rows; ++r)
    for (int i = 0; i < o.width; ++i)
      for (int c = 0; c < o.channels; ++c)
        mid[r * mid_pitch + static_cast<size_t>(i) * o.channels + c] =
            HorizontalSample(src, pitch, o.channels, g, h, r, i, c);
  for (int y = 0; y < o.height; ++y)
    for (int i = 0; i < o.width; ++i)
      for (int c = 0; c < o.channels; ++c)
        StoreSample(dst, o, i, y, c, VerticalSample(mid.data(), mid_pitch, o.channels, g, v, y, i, c));
}

}  // namespace spdl::cuda::imgmath
