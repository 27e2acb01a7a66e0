#include "media/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#define SPDL_RESAMPLE_AVX2 1
#endif

namespace spdl::media {
namespace {

constexpr double kPi = 3.14159265358979323846;

double BoxFilter(double x) { return x > -0.5 && x <= 0.5 ? 1.0 : 0.0; }

double TriangleFilter(double x) {
  if (x < 0.0) x = -x;
  return x < 1.0 ? 1.0 - x : 0.0;
}

double HammingFilter(double x) {
  if (x < 0.0) x = -x;
  if (x == 0.0) return 1.0;
  if (x >= 1.0) return 0.0;
  x = x * kPi;
  return std::sin(x) / x * (0.54 + 0.46 * std::cos(x));
}

// Keys' cubic convolution with a = -0.5.
double CubicFilter(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

double Sinc(double x) {
  if (x == 0.0) return 1.0;
  x = x * kPi;
  return std::sin(x) / x;
}

double LanczosFilter(double x) { return -3.0 <= x && x < 3.0 ? Sinc(x) * Sinc(x / 3) : 0.0; }

struct Filter {
  double (*fn)(double);
  double support;
};

Filter FilterOf(ResampleFilter f) {
  switch (f) {
    case ResampleFilter::kBox:
      return {BoxFilter, 0.5};
    case ResampleFilter::kHamming:
      return {HammingFilter, 1.0};
    case ResampleFilter::kBicubic:
      return {CubicFilter, 2.0};
    case ResampleFilter::kLanczos:
      return {LanczosFilter, 3.0};
    case ResampleFilter::kBilinear:
    case ResampleFilter::kNearest:
      break;
  }
  return {TriangleFilter, 1.0};
}

template <typename T>
constexpr int64_t kMaxSample = T(~T(0));

// A fixed-point sum back to a sample: drop the fraction bits, clip.
template <typename T, typename Acc>
inline T ClipSample(Acc v) {
  v >>= kResamplePrecisionBits;
  if (v < 0) return 0;
  if (v > kMaxSample<T>) return static_cast<T>(kMaxSample<T>);
  return static_cast<T>(v);
}

template <typename T>
const T* Row(const uint8_t* base, size_t stride, int y) {
  return reinterpret_cast<const T*>(base + static_cast<size_t>(y) * stride);
}

template <typename T>
T* Row(uint8_t* base, size_t stride, int y) {
  return reinterpret_cast<T*>(base + static_cast<size_t>(y) * stride);
}

// Horizontal pass: rows [y0, y0 + rows) of src, outputs w (one per window column), into dst.
template <typename T, typename Acc, int C>
void Horizontal(const PackedImage& src, int y0, int rows, const AxisWeights& w, uint8_t* dst, size_t dst_stride) {
  const Acc half = Acc{1} << (kResamplePrecisionBits - 1);
  const int n = static_cast<int>(w.first.size());
  for (int y = 0; y < rows; ++y) {
    const T* in = Row<T>(src.data, src.stride, y0 + y);
    T* out = Row<T>(dst, dst_stride, y);
    for (int i = 0; i < n; ++i) {
      const int32_t* k = w.weights.data() + static_cast<size_t>(i) * w.taps;
      const T* p = in + static_cast<size_t>(w.first[i]) * C;
      const int count = w.count[i];
      Acc s[C];
      for (int c = 0; c < C; ++c) s[c] = half;
      for (int t = 0; t < count; ++t) {
        const Acc kt = k[t];
        for (int c = 0; c < C; ++c) s[c] += static_cast<Acc>(p[t * C + c]) * kt;
      }
      for (int c = 0; c < C; ++c) out[i * C + c] = ClipSample<T, Acc>(s[c]);
    }
  }
}

// Vertical pass: output row i of w reads rows w.first[i] - row0 ... of `in`, columns [x0, x0 + n)
// (n = window width * channels samples), into dst.
template <typename T, typename Acc>
void Vertical(const uint8_t* in, size_t in_stride, int row0, int x0, int n, const AxisWeights& w, uint8_t* dst,
              size_t dst_stride, std::vector<Acc>& sums) {
  const Acc half = Acc{1} << (kResamplePrecisionBits - 1);
  sums.resize(static_cast<size_t>(n));
  Acc* s = sums.data();
  for (size_t i = 0; i < w.first.size(); ++i) {
    std::fill(s, s + n, half);
    const int32_t* k = w.weights.data() + i * w.taps;
    for (int t = 0; t < w.count[i]; ++t) {
      const T* row = Row<T>(in, in_stride, w.first[i] + t - row0) + x0;
      const Acc kt = k[t];
      for (int j = 0; j < n; ++j) s[j] += static_cast<Acc>(row[j]) * kt;
    }
    T* out = Row<T>(dst, dst_stride, static_cast<int>(i));
    for (int j = 0; j < n; ++j) out[j] = ClipSample<T, Acc>(s[j]);
  }
}

template <typename T, typename Acc>
void HorizontalAny(const PackedImage& src, int y0, int rows, const AxisWeights& w, uint8_t* dst, size_t dst_stride) {
  switch (src.channels) {
    case 1:
      return Horizontal<T, Acc, 1>(src, y0, rows, w, dst, dst_stride);
    case 3:
      return Horizontal<T, Acc, 3>(src, y0, rows, w, dst, dst_stride);
    default:
      return Horizontal<T, Acc, 4>(src, y0, rows, w, dst, dst_stride);
  }
}

#ifdef SPDL_RESAMPLE_AVX2
// AVX2 versions of the 8-bit passes (chosen at run time when the CPU has AVX2). They compute the
// scalar code's sums bit for bit, with 16-bit multiplies (_mm256_madd_epi16: sixteen 16 x 16-bit
// products, added in pairs into eight 32-bit lanes, one instruction) instead of 32-bit ones
// (_mm256_mullo_epi32, two uops of ten cycles' latency on Intel):
//   - each fixed-point weight k is split as k = kh * 2^15 + kl, kl = k & 0x7FFF in [0, 2^15) and
//     kh = k >> 15 (arithmetic), so both fit int16 when -2^30 <= k < 2^30, i.e. a weight in
//     [-256, 256) (normalized weights are within a few units of [0, 1]; a pass with a weight
//     outside takes the scalar code);
//   - samples (0-255) are widened to 16 bits and paired tap by tap with (kh_t, kh_t+1) and
//     (kl_t, kl_t+1), so one madd adds two taps' products into a 32-bit lane, exactly;
//   - the sum is (sum of sample * kh) * 2^15 + (sum of sample * kl) + half, all in 32-bit lanes
//     that wrap modulo 2^32 like the scalar code's int32 sums: the same sum, so after the shift and
//     the clip (saturating packs) the same sample.

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

constexpr int kSplitBits = 15;

// Whether every weight splits into int16 halves (see above).
bool WeightsSplit(const AxisWeights& w) {
  return std::all_of(w.weights.begin(), w.weights.end(),
                     [](int32_t k) { return k >= -(int32_t{1} << 30) && k < (int32_t{1} << 30); });
}

// The high (kh) and low (kl) halves of weights a and b as the int16 pair (a's, b's) of one 32-bit
// word, the layout _mm256_madd_epi16 pairs with two samples.
inline int32_t PackPair(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(a)) |
                              static_cast<uint32_t>(static_cast<uint16_t>(b)) << 16);
}
inline int32_t HighPair(int32_t a, int32_t b) { return PackPair(a >> kSplitBits, b >> kSplitBits); }
inline int32_t LowPair(int32_t a, int32_t b) {
  constexpr int32_t kLowMask = (1 << kSplitBits) - 1;
  return PackPair(a & kLowMask, b & kLowMask);
}

// The horizontal pass's layout (HorizontalMadd<C>, C = 1 or 3). Outputs go in groups of eight;
// vector v (0-3) of group g holds output 8g + v in its low 128-bit half and output 8g + 4 + v in
// its high half (so that the packs at the end put the eight outputs in order). Each half is four
// 32-bit lanes, each an int16 pair of samples times an int16 pair of weight halves:
//   - C = 3: a unit is two taps; lanes 0-2 are R, G and B of taps (t, t + 1), lane 3 is unused
//     (weight 0). One 16-byte load at the output's first pixel + 12 m gives the 12 bytes of taps
//     4m .. 4m + 3, i.e. units 2m and 2m + 1, spread into lanes by a byte shuffle.
//   - C = 1: a unit is eight taps, lane d holding taps (2d, 2d + 1); one 8-byte load per unit.
// Per group, `lanes` holds kLaneInts ints: the group's first word in `words`, its unit count (the
// most its eight outputs need; taps past an output's count have weight 0), whether its loads read
// the row's copy in the tail buffer (1) or the row itself (0), and the eight outputs' byte offsets
// (vector v: 3 + 2v low half, 4 + 2v high half; an output past the last repeats the last's, with
// weight 0). `words` holds per group, per vector, per unit the high then the low weight halves
// (eight 32-bit words each). Loads read bytes past an output's last tap (weighted 0): a group whose
// loads would cross the row's end reads instead from a copy of the row's last bytes, from
// *tail_start on, followed by zeros (*tail_bytes in all; 0: no group needs it), made per row.
constexpr int kLaneInts = 11;

template <int C>
constexpr int UnitTaps() {
  return C == 3 ? 2 : 8;
}

// Bytes past an output's first byte that its loads read, for `units` units.
template <int C>
int LoadReach(int units) {
  if (units == 0) return 0;
  return C == 3 ? 12 * ((units - 1) / 2) + 16 : 8 * units;
}

template <int C>
void LayoutHorizontal(const AxisWeights& w, int row_bytes, std::vector<int32_t>& words, std::vector<int32_t>& lanes,
                      int* tail_start, int* tail_bytes) {
  constexpr int kTaps = UnitTaps<C>();
  const int n = static_cast<int>(w.first.size());
  const int groups = (n + 7) / 8;
  lanes.assign(static_cast<size_t>(groups) * kLaneInts, 0);
  int start = row_bytes, end = row_bytes;
  size_t total = 0;
  for (int g = 0; g < groups; ++g) {
    int32_t* lane = lanes.data() + static_cast<size_t>(g) * kLaneInts;
    int units = 0;
    for (int o = 8 * g; o < std::min(8 * g + 8, n); ++o) units = std::max(units, (w.count[o] + kTaps - 1) / kTaps);
    lane[0] = static_cast<int32_t>(total);
    lane[1] = units;
    total += static_cast<size_t>(units) * 4 * 2 * 8;
    int lo = row_bytes, hi = 0;
    for (int v = 0; v < 4; ++v) {
      for (int h = 0; h < 2; ++h) {
        const int offset = w.first[std::min(8 * g + 4 * h + v, n - 1)] * C;
        lane[3 + 2 * v + h] = offset;
        lo = std::min(lo, offset);
        hi = std::max(hi, offset + LoadReach<C>(units));
      }
    }
    if (hi > row_bytes) {
      lane[2] = 1;
      start = std::min(start, lo);
      end = std::max(end, hi);
    }
  }
  // The weights: zero (outputs past n, taps past an output's count, C = 3's lane 3), then each
  // output's pairs written where its vector, unit, part and half put them.
  words.assign(total, 0);
  for (int o = 0; o < n; ++o) {
    const int g = o / 8, v = o % 4, h = (o % 8) / 4;
    const int32_t* lane = lanes.data() + static_cast<size_t>(g) * kLaneInts;
    const int units = lane[1];
    const int32_t* k = w.weights.data() + static_cast<size_t>(o) * w.taps;
    const int count = w.count[o];
    for (int u = 0; u < units; ++u) {
      int32_t* d = words.data() + lane[0] + (static_cast<size_t>(v) * units + u) * 16 + h * 4;
      for (int j = 0; j < (C == 3 ? 1 : 4); ++j) {
        const int t = u * kTaps + 2 * j;
        if (t >= count) break;
        const int32_t a = k[t], b = t + 1 < count ? k[t + 1] : 0;
        const int32_t high = HighPair(a, b), low = LowPair(a, b);
        if (C == 3) {
          d[0] = d[1] = d[2] = high;
          d[8] = d[9] = d[10] = low;
        } else {
          d[j] = high;
          d[8 + j] = low;
        }
      }
    }
  }
  for (int g = 0; g < groups; ++g) {
    int32_t* lane = lanes.data() + static_cast<size_t>(g) * kLaneInts;
    if (lane[2] != 0) {
      for (int j = 3; j < kLaneInts; ++j) lane[j] -= start;
    }
  }
  *tail_start = start;
  *tail_bytes = start < row_bytes ? end - start : 0;
}

// hi += x madd the high weight halves at k, lo += x madd the low ones at k + 8; k moves to the next unit.
__attribute__((target("avx2"), always_inline)) inline void MaddSplit(__m256i x, const int32_t*& k, __m256i& hi,
                                                                     __m256i& lo) {
  hi = _mm256_add_epi32(hi, _mm256_madd_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k))));
  lo = _mm256_add_epi32(lo, _mm256_madd_epi16(x, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + 8))));
  k += 16;
}

// The sums of vector v (two outputs) of a group of HorizontalMadd<C>: (high part << 15) + low
// part, before half and the shift. kUnits: the group's unit count when fixed at compile time (0:
// `units`). `even` and `odd` (C = 3): the byte shuffles of units 2m and 2m + 1.
template <int C, int kUnits>
__attribute__((target("avx2"), always_inline)) inline __m256i VectorSum(const uint8_t* base, const int32_t* lane, int v,
                                                                        const int32_t* k, int units, __m256i even,
                                                                        __m256i odd) {
  const int count = kUnits > 0 ? kUnits : units;
  const uint8_t* a = base + lane[3 + 2 * v];
  const uint8_t* b = base + lane[4 + 2 * v];
  k += static_cast<size_t>(v) * count * 16;
  __m256i hi = _mm256_setzero_si256(), lo = _mm256_setzero_si256();
  for (int u = 0; u < count; u += C == 3 ? 2 : 1) {
    if (C == 3) {
      const size_t at = static_cast<size_t>(u / 2) * 12;
      const __m256i px =
          _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + at))),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + at)), 1);
      MaddSplit(_mm256_shuffle_epi8(px, even), k, hi, lo);
      if (u + 1 < count) MaddSplit(_mm256_shuffle_epi8(px, odd), k, hi, lo);
    } else {
      const size_t at = static_cast<size_t>(u) * 8;
      MaddSplit(_mm256_cvtepu8_epi16(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a + at)),
                                                        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + at)))),
                k, hi, lo);
    }
  }
  return _mm256_add_epi32(_mm256_slli_epi32(hi, kSplitBits), lo);
}

// Horizontal, 8-bit, C = 1 or 3, eight outputs per step with the layout above. False (nothing
// written) when the weights do not split into int16 halves.
template <int C>
__attribute__((target("avx2"))) bool HorizontalMadd(const PackedImage& src, int y0, int rows, const AxisWeights& w,
                                                    uint8_t* dst, size_t dst_stride, std::vector<int32_t>& words,
                                                    std::vector<int32_t>& lanes, std::vector<uint8_t>& tail) {
  if (!WeightsSplit(w)) return false;
  const int n = static_cast<int>(w.first.size());
  const int groups = (n + 7) / 8;
  const int row_bytes = src.width * C;
  int tail_start = 0, tail_bytes = 0;
  LayoutHorizontal<C>(w, row_bytes, words, lanes, &tail_start, &tail_bytes);
  tail.assign(static_cast<size_t>(tail_bytes), 0);
  const __m256i half = _mm256_set1_epi32(1 << (kResamplePrecisionBits - 1));
  // C = 3: taps (0, 1) and (2, 3) of a 16-byte load as the int16 pairs of lanes R, G, B (lane 3 zero).
  const __m256i even = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 0, -1, 3, -1, 1, -1,
                                        4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i odd = _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, 6, -1, 9, -1, 7, -1,
                                       10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
  // C = 3: per 128-bit half, four RGBx outputs to twelve RGB bytes.
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2, 4, 5, 6, 8, 9,
                                        10, 12, 13, 14, -1, -1, -1, -1);
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src.data + static_cast<size_t>(y0 + y) * src.stride;
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    if (tail_bytes > 0) std::memcpy(tail.data(), in + tail_start, static_cast<size_t>(row_bytes - tail_start));
    for (int g = 0; g < groups; ++g) {
      const int32_t* lane = lanes.data() + static_cast<size_t>(g) * kLaneInts;
      const uint8_t* base = lane[2] != 0 ? tail.data() : in;
      const int32_t* k = words.data() + lane[0];
      const int units = lane[1];
      __m256i s[4];
      switch (units) {  // the common counts unrolled
        case 1:
          for (int v = 0; v < 4; ++v) s[v] = VectorSum<C, 1>(base, lane, v, k, units, even, odd);
          break;
        case 2:
          for (int v = 0; v < 4; ++v) s[v] = VectorSum<C, 2>(base, lane, v, k, units, even, odd);
          break;
        case 3:
          for (int v = 0; v < 4; ++v) s[v] = VectorSum<C, 3>(base, lane, v, k, units, even, odd);
          break;
        case 4:
          for (int v = 0; v < 4; ++v) s[v] = VectorSum<C, 4>(base, lane, v, k, units, even, odd);
          break;
        default:
          for (int v = 0; v < 4; ++v) s[v] = VectorSum<C, 0>(base, lane, v, k, units, even, odd);
      }
      const int first = 8 * g;
      const int valid = std::min(8, n - first);
      if (C == 3) {
        // Per vector: RGBx of two outputs; shift, clip, in order: the low halves hold outputs 0-3.
        for (auto& x : s) x = _mm256_srai_epi32(_mm256_add_epi32(x, half), kResamplePrecisionBits);
        const __m256i bytes = _mm256_shuffle_epi8(
            _mm256_packus_epi16(_mm256_packs_epi32(s[0], s[1]), _mm256_packs_epi32(s[2], s[3])), pack);
        uint8_t* o = out + static_cast<size_t>(first) * 3;
        if ((first + 8) * 3 + 4 <= n * 3) {  // 16-byte stores: the last 4 bytes of each are overwritten next
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_castsi256_si128(bytes));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 12), _mm256_extracti128_si256(bytes, 1));
        } else {
          alignas(32) uint8_t tmp[32];
          _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), bytes);
          std::memcpy(o, tmp, static_cast<size_t>(std::min(valid, 4)) * 3);
          if (valid > 4) std::memcpy(o + 12, tmp + 16, static_cast<size_t>(valid - 4) * 3);
        }
      } else {
        // Per vector: four partial sums of two outputs; add them up (lanes 0-3 of the low half:
        // outputs 0-3, of the high half: 4-7), shift, clip.
        const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
        const __m256i v = _mm256_srai_epi32(_mm256_add_epi32(sums, half), kResamplePrecisionBits);
        const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(v, v), v);
        const __m128i eight = _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
        if (valid == 8) {
          _mm_storel_epi64(reinterpret_cast<__m128i*>(out + first), eight);
        } else {
          alignas(16) uint8_t tmp[16];
          _mm_store_si128(reinterpret_cast<__m128i*>(tmp), eight);
          std::memcpy(out + first, tmp, static_cast<size_t>(valid));
        }
      }
    }
  }
  return true;
}

// Eight sums of two taps, x's int16 sample pairs times the weights' high halves (kh) << 15 plus
// their low halves (kl): exactly sample * k summed, modulo 2^32.
__attribute__((target("avx2"))) inline __m256i SplitMadd(__m256i x, __m256i kh, __m256i kl) {
  return _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(x, kh), kSplitBits), _mm256_madd_epi16(x, kl));
}

// Vertical, 8-bit: 32 columns per step (the last step overlaps the one before when n is not a
// multiple of 32: it recomputes the same values). Rows t and t + 1 of a pair are interleaved
// column by column into int16 pairs, one madd per pair of rows and weight half. `pairs` is
// scratch. False (nothing written) when n < 32 or the weights do not split into int16 halves.
__attribute__((target("avx2"))) bool VerticalMadd(const uint8_t* in, size_t in_stride, int row0, int x0, int n,
                                                  const AxisWeights& w, uint8_t* dst, size_t dst_stride,
                                                  std::vector<int32_t>& pairs) {
  if (n < 32 || !WeightsSplit(w)) return false;
  const __m256i half = _mm256_set1_epi32(1 << (kResamplePrecisionBits - 1));
  const __m256i zero = _mm256_setzero_si256();
  for (size_t i = 0; i < w.first.size(); ++i) {
    const int32_t* k = w.weights.data() + i * w.taps;
    const int count = w.count[i];
    const int np = (count + 1) / 2;
    pairs.resize(static_cast<size_t>(np) * 2);
    for (int p = 0; p < np; ++p) {
      const int32_t k1 = 2 * p + 1 < count ? k[2 * p + 1] : 0;
      pairs[2 * p] = HighPair(k[2 * p], k1);
      pairs[2 * p + 1] = LowPair(k[2 * p], k1);
    }
    const uint8_t* base = in + static_cast<size_t>(w.first[i] - row0) * in_stride + x0;
    uint8_t* out = dst + i * dst_stride;
    for (int j = 0;; j += 32) {
      j = std::min(j, n - 32);
      // Sums (half included) of columns 0-3 and 16-19 (s0), 4-7 and 20-23, 8-11 and 24-27, 12-15
      // and 28-31; each pair of rows adds its high part << 15 plus its low part (modulo 2^32).
      __m256i s0 = half, s1 = half, s2 = half, s3 = half;
      for (int p = 0; p < np; ++p) {
        const uint8_t* r0 = base + static_cast<size_t>(2 * p) * in_stride + j;
        const uint8_t* r1 = 2 * p + 1 < count ? r0 + in_stride : r0;  // an odd count's last: weight 0
        const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1));
        const __m256i ab_lo = _mm256_unpacklo_epi8(a, b);
        const __m256i ab_hi = _mm256_unpackhi_epi8(a, b);
        const __m256i kh = _mm256_set1_epi32(pairs[2 * p]);
        const __m256i kl = _mm256_set1_epi32(pairs[2 * p + 1]);
        s0 = _mm256_add_epi32(s0, SplitMadd(_mm256_unpacklo_epi8(ab_lo, zero), kh, kl));
        s1 = _mm256_add_epi32(s1, SplitMadd(_mm256_unpackhi_epi8(ab_lo, zero), kh, kl));
        s2 = _mm256_add_epi32(s2, SplitMadd(_mm256_unpacklo_epi8(ab_hi, zero), kh, kl));
        s3 = _mm256_add_epi32(s3, SplitMadd(_mm256_unpackhi_epi8(ab_hi, zero), kh, kl));
      }
      // The packs work per 128-bit half: columns 0-7, 16-23 then 8-15, 24-31, then 0-31 in order.
      const __m256i c01 = _mm256_packs_epi32(_mm256_srai_epi32(s0, kResamplePrecisionBits),
                                             _mm256_srai_epi32(s1, kResamplePrecisionBits));
      const __m256i c23 = _mm256_packs_epi32(_mm256_srai_epi32(s2, kResamplePrecisionBits),
                                             _mm256_srai_epi32(s3, kResamplePrecisionBits));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_packus_epi16(c01, c23));
      if (j + 32 >= n) break;
    }
  }
  return true;
}
#endif  // SPDL_RESAMPLE_AVX2

// The 8-bit passes: AVX2 when the CPU has it (and the weights split), else the portable code.
void Horizontal8(bool simd, const PackedImage& src, int y0, int rows, const AxisWeights& w, uint8_t* dst,
                 size_t dst_stride, std::vector<int32_t>& words, std::vector<int32_t>& lanes,
                 std::vector<uint8_t>& tail) {
#ifdef SPDL_RESAMPLE_AVX2
  if (simd && HaveAvx2()) {
    if (src.channels == 3 && HorizontalMadd<3>(src, y0, rows, w, dst, dst_stride, words, lanes, tail)) return;
    if (src.channels == 1 && HorizontalMadd<1>(src, y0, rows, w, dst, dst_stride, words, lanes, tail)) return;
  }
#endif
  (void)simd;
  (void)words;
  (void)lanes;
  (void)tail;
  HorizontalAny<uint8_t, int32_t>(src, y0, rows, w, dst, dst_stride);
}

void Vertical8(bool simd, const uint8_t* in, size_t in_stride, int row0, int x0, int n, const AxisWeights& w,
               uint8_t* dst, size_t dst_stride, std::vector<int32_t>& sums) {
#ifdef SPDL_RESAMPLE_AVX2
  if (simd && HaveAvx2() && VerticalMadd(in, in_stride, row0, x0, n, w, dst, dst_stride, sums)) return;
#endif
  (void)simd;
  Vertical<uint8_t, int32_t>(in, in_stride, row0, x0, n, w, dst, dst_stride, sums);
}

template <typename T>
void Nearest(const PackedImage& src, const std::vector<int>& ix, const std::vector<int>& iy, uint8_t* dst,
             size_t dst_stride) {
  const int c = src.channels;
  for (size_t y = 0; y < iy.size(); ++y) {
    const T* in = Row<T>(src.data, src.stride, iy[y]);
    T* out = Row<T>(dst, dst_stride, static_cast<int>(y));
    for (size_t x = 0; x < ix.size(); ++x) {
      std::memcpy(out + x * c, in + static_cast<size_t>(ix[x]) * c, sizeof(T) * c);
    }
  }
}

}  // namespace

void ComputeAxisWeights(int in_size, int out_size, ResampleFilter f, int out_begin, int out_end, AxisWeights* w) {
  const Filter filter = FilterOf(f);
  const double scale = static_cast<double>(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filter.support * filterscale;
  const int taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  const int n = out_end - out_begin;
  w->taps = taps;
  w->first_output = out_begin;
  w->first.resize(n);
  w->count.resize(n);
  w->weights.assign(static_cast<size_t>(n) * taps, 0);
  std::vector<double> k(taps);
  const double ss = 1.0 / filterscale;
  for (int i = 0; i < n; ++i) {
    const int xx = out_begin + i;
    const double center = (xx + 0.5) * scale;
    int xmin = static_cast<int>(center - support + 0.5);  // NOLINT(bugprone-incorrect-roundings): PIL's, for parity
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);  // NOLINT(bugprone-incorrect-roundings): PIL's, for parity
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double v = filter.fn((x + xmin - center + 0.5) * ss);
      k[x] = v;
      ww += v;
    }
    int32_t* out = w->weights.data() + static_cast<size_t>(i) * taps;
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[x] / ww : k[x];
      const double fixed = v * (1 << kResamplePrecisionBits);
      out[x] = static_cast<int32_t>(v < 0 ? -0.5 + fixed : 0.5 + fixed);
    }
    w->first[i] = xmin;
    w->count[i] = std::max(xmax, 0);
  }
}

void ComputeNearestIndex(int in_size, int out_size, int out_begin, int out_end, std::vector<int>* index) {
  const double a = static_cast<double>(in_size) / out_size;
  double x = a * 0.5;
  index->resize(out_end - out_begin);
  for (int i = 0; i < out_end; ++i) {
    if (i >= out_begin) {
      const int v = x < 0.0 ? 0 : static_cast<int>(x);
      (*index)[i - out_begin] = std::min(v, in_size - 1);
    }
    x += a;  // accumulated, not multiplied: the same doubles as PIL's affine scaler
  }
}

void SourceSpan(int in_size, int out_size, ResampleFilter f, int out_begin, int out_end, int* begin, int* end) {
  if (in_size == out_size && f != ResampleFilter::kNearest) {
    *begin = out_begin;
    *end = out_end;
    return;
  }
  if (f == ResampleFilter::kNearest) {
    std::vector<int> index;
    ComputeNearestIndex(in_size, out_size, out_begin, out_end, &index);
    *begin = *std::min_element(index.begin(), index.end());
    *end = *std::max_element(index.begin(), index.end()) + 1;
    return;
  }
  AxisWeights w;
  ComputeAxisWeights(in_size, out_size, f, out_begin, out_end, &w);
  *begin = in_size;
  *end = 0;
  for (size_t i = 0; i < w.first.size(); ++i) {
    *begin = std::min(*begin, w.first[i]);
    *end = std::max(*end, w.first[i] + w.count[i]);
  }
}

namespace {

// Moves source indices from the whole image's axis to the part's, which starts at `origin` and has
// `size` samples; false when one falls outside the part.
bool Rebase(std::vector<int>& first, const std::vector<int>* count, int origin, int size) {
  for (size_t i = 0; i < first.size(); ++i) {
    first[i] -= origin;
    if (first[i] < 0 || first[i] + (count != nullptr ? (*count)[i] : 1) > size) return false;
  }
  return true;
}

// Identity weights (one tap of weight 1.0) for outputs [out_begin, out_end) of an axis that keeps
// its size: what a pass over it computes is a copy (sum = sample << bits + half, shifted back).
void IdentityAxisWeights(int out_begin, int out_end, AxisWeights* w) {
  const int n = out_end - out_begin;
  w->taps = 1;
  w->first_output = out_begin;
  w->first.resize(n);
  w->count.assign(n, 1);
  w->weights.assign(n, int32_t{1} << kResamplePrecisionBits);
  for (int i = 0; i < n; ++i) w->first[i] = out_begin + i;
}

// Reverses the order of the outputs: output i takes what output n - 1 - i had.
void MirrorAxisWeights(AxisWeights* w) {
  const size_t n = w->first.size();
  const auto taps = static_cast<size_t>(w->taps);
  std::reverse(w->first.begin(), w->first.end());
  std::reverse(w->count.begin(), w->count.end());
  for (size_t i = 0; i < n / 2; ++i) {
    std::swap_ranges(w->weights.begin() + static_cast<ptrdiff_t>(i * taps),
                     w->weights.begin() + static_cast<ptrdiff_t>((i + 1) * taps),
                     w->weights.begin() + static_cast<ptrdiff_t>((n - 1 - i) * taps));
  }
}

}  // namespace

Status Resampler::Resample(const PackedImage& src, const ResampleRequest& r, uint8_t* dst, size_t dst_stride) {
  if (src.data == nullptr || src.width < 1 || src.height < 1) return InvalidArgument("resample: empty source");
  const bool part = r.full_width != 0 || r.full_height != 0;
  const int in_width = part ? r.full_width : src.width;
  const int in_height = part ? r.full_height : src.height;
  if (part && (r.src_x < 0 || r.src_y < 0 || r.src_x + src.width > in_width || r.src_y + src.height > in_height)) {
    return InvalidArgument("resample: the source part is not inside the " + std::to_string(in_width) + "x" +
                           std::to_string(in_height) + " image");
  }
  auto outside = [] { return InvalidArgument("resample: the window reads source samples outside the given part"); };
  if (src.channels != 1 && src.channels != 3 && src.channels != 4) {
    return InvalidArgument("resample: " + std::to_string(src.channels) + " channels (1, 3 or 4 only)");
  }
  if (r.out_width < 1 || r.out_height < 1 || r.window_width < 1 || r.window_height < 1 || r.window_x < 0 ||
      r.window_y < 0 || r.window_x + r.window_width > r.out_width || r.window_y + r.window_height > r.out_height) {
    return InvalidArgument("resample: window " + std::to_string(r.window_width) + "x" +
                           std::to_string(r.window_height) + "+" + std::to_string(r.window_x) + "+" +
                           std::to_string(r.window_y) + " is not inside the " + std::to_string(r.out_width) + "x" +
                           std::to_string(r.out_height) + " output");
  }
  const size_t bytes = src.wide ? 2 : 1;
  const size_t pixel = bytes * src.channels;
  if (dst == nullptr || dst_stride < pixel * r.window_width) return InvalidArgument("resample: destination too small");

  if (r.filter == ResampleFilter::kNearest) {
    ComputeNearestIndex(in_width, r.out_width, r.window_x, r.window_x + r.window_width, &index_x_);
    ComputeNearestIndex(in_height, r.out_height, r.window_y, r.window_y + r.window_height, &index_y_);
    if (!Rebase(index_x_, nullptr, r.src_x, src.width) || !Rebase(index_y_, nullptr, r.src_y, src.height)) {
      return outside();
    }
    if (r.mirror) std::reverse(index_x_.begin(), index_x_.end());
    if (src.wide) {
      Nearest<uint16_t>(src, index_x_, index_y_, dst, dst_stride);
    } else {
      Nearest<uint8_t>(src, index_x_, index_y_, dst, dst_stride);
    }
    return Status::Ok();
  }

  // A pass is needed when its axis changes size (PIL's rule); else that axis is copied. A mirrored
  // window always takes the horizontal pass (identity weights when the width is kept).
  const bool keep_width = r.out_width == in_width;
  const bool need_h = !keep_width || r.mirror;
  const bool need_v = r.out_height != in_height;
  const int n = r.window_width * src.channels;  // samples per output row
  // The window's first column and row in the part's coordinates (an axis that is not resampled).
  const int wx = r.window_x - r.src_x, wy = r.window_y - r.src_y;
  if ((!need_h && (wx < 0 || wx + r.window_width > src.width)) ||
      (!need_v && (wy < 0 || wy + r.window_height > src.height))) {
    return outside();
  }
  if (!need_h && !need_v) {
    for (int y = 0; y < r.window_height; ++y) {
      std::memcpy(dst + static_cast<size_t>(y) * dst_stride,
                  src.data + static_cast<size_t>(wy + y) * src.stride + wx * pixel, pixel * r.window_width);
    }
    return Status::Ok();
  }
  if (need_v) {
    ComputeAxisWeights(in_height, r.out_height, r.filter, r.window_y, r.window_y + r.window_height, &vertical_);
    if (!Rebase(vertical_.first, &vertical_.count, r.src_y, src.height)) return outside();
  }
  if (!need_h) {
    // Vertical only, straight from the source's window columns.
    if (src.wide) {
      Vertical<uint16_t, int64_t>(src.data, src.stride, 0, wx * src.channels, n, vertical_, dst, dst_stride, sums_);
    } else {
      Vertical8(simd_, src.data, src.stride, 0, wx * src.channels, n, vertical_, dst, dst_stride, sums32_);
    }
    return Status::Ok();
  }
  if (keep_width) {
    IdentityAxisWeights(r.window_x, r.window_x + r.window_width, &horizontal_);
  } else {
    ComputeAxisWeights(in_width, r.out_width, r.filter, r.window_x, r.window_x + r.window_width, &horizontal_);
  }
  if (!Rebase(horizontal_.first, &horizontal_.count, r.src_x, src.width)) return outside();
  if (r.mirror) MirrorAxisWeights(&horizontal_);
  if (!need_v) {
    // Horizontal only, straight into the destination.
    PackedImage rows = src;
    rows.data = src.data + static_cast<size_t>(wy) * src.stride;
    if (src.wide) {
      HorizontalAny<uint16_t, int64_t>(rows, 0, r.window_height, horizontal_, dst, dst_stride);
    } else {
      Horizontal8(simd_, rows, 0, r.window_height, horizontal_, dst, dst_stride, simd_words_, simd_lanes_, simd_tail_);
    }
    return Status::Ok();
  }
  // Both: the horizontal pass over the source rows the window's output rows read, then the
  // vertical pass from those rows.
  const int row0 = vertical_.first.front();
  int row_end = row0;
  for (size_t i = 0; i < vertical_.first.size(); ++i)
    row_end = std::max(row_end, vertical_.first[i] + vertical_.count[i]);
  const size_t rows_stride = (pixel * r.window_width + 63) / 64 * 64;
  const size_t need = rows_stride * static_cast<size_t>(row_end - row0);
  if (rows_.size() < need) rows_.resize(need);
  if (src.wide) {
    HorizontalAny<uint16_t, int64_t>(src, row0, row_end - row0, horizontal_, rows_.data(), rows_stride);
    Vertical<uint16_t, int64_t>(rows_.data(), rows_stride, row0, 0, n, vertical_, dst, dst_stride, sums_);
  } else {
    Horizontal8(simd_, src, row0, row_end - row0, horizontal_, rows_.data(), rows_stride, simd_words_, simd_lanes_,
                simd_tail_);
    Vertical8(simd_, rows_.data(), rows_stride, row0, 0, n, vertical_, dst, dst_stride, sums32_);
  }
  return Status::Ok();
}

void Resampler::Trim(size_t max_bytes) {
  if (rows_.size() > max_bytes) std::vector<uint8_t>().swap(rows_);
  if (sums_.size() * sizeof(int64_t) > max_bytes) std::vector<int64_t>().swap(sums_);
  if (sums32_.size() * sizeof(int32_t) > max_bytes) std::vector<int32_t>().swap(sums32_);
  if (simd_words_.size() * sizeof(int32_t) > max_bytes) std::vector<int32_t>().swap(simd_words_);
  if (simd_lanes_.size() * sizeof(int32_t) > max_bytes) std::vector<int32_t>().swap(simd_lanes_);
  if (simd_tail_.size() > max_bytes) std::vector<uint8_t>().swap(simd_tail_);
}

}  // namespace spdl::media
