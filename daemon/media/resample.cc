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
// AVX2 versions of the 8-bit passes (chosen at run time when the CPU has AVX2). The same integer
// arithmetic as the scalar code, eight 32-bit lanes at a time, so the values are identical.

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2");
  return have;
}

// Horizontal, 8-bit, C = 1 or 3. C = 3: two taps per vector (lanes 0-2 tap t, 3-5 tap t + 1, 6-7
// weight 0); C = 1: eight taps per vector. `wide` holds the weights laid out that way; `safe` says
// whether an output's 8-byte loads stay inside the row (else it takes the scalar code).
template <int C>
__attribute__((target("avx2"))) void HorizontalAvx2(const PackedImage& src, int y0, int rows, const AxisWeights& w,
                                                    uint8_t* dst, size_t dst_stride, std::vector<int32_t>& wide,
                                                    std::vector<uint8_t>& safe) {
  constexpr int kTapsPerVector = C == 3 ? 2 : 8;
  const int n = static_cast<int>(w.first.size());
  const int vectors = (w.taps + kTapsPerVector - 1) / kTapsPerVector;
  wide.assign(static_cast<size_t>(n) * vectors * 8, 0);
  safe.assign(n, 0);
  const int row_bytes = src.width * C;
  for (int i = 0; i < n; ++i) {
    int32_t* out = wide.data() + static_cast<size_t>(i) * vectors * 8;
    const int32_t* k = w.weights.data() + static_cast<size_t>(i) * w.taps;
    for (int t = 0; t < w.count[i]; ++t) {
      if (C == 3) {
        for (int c = 0; c < 3; ++c) out[(t / 2) * 8 + (t % 2) * 3 + c] = k[t];
      } else {
        out[t] = k[t];
      }
    }
    const int used = (w.count[i] + kTapsPerVector - 1) / kTapsPerVector;
    safe[i] = used == 0 || (w.first[i] + (used - 1) * kTapsPerVector) * C + 8 <= row_bytes;
  }
  constexpr int32_t half = 1 << (kResamplePrecisionBits - 1);
  const __m128i half4 = _mm_set1_epi32(half);
  const __m256i next_tap = _mm256_setr_epi32(3, 4, 5, 6, 7, 0, 0, 0);  // lanes 3-5 onto 0-2
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src.data + static_cast<size_t>(y0 + y) * src.stride;
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    for (int i = 0; i < n; ++i) {
      const uint8_t* p = in + static_cast<size_t>(w.first[i]) * C;
      if (!safe[i]) {
        const int32_t* k = w.weights.data() + static_cast<size_t>(i) * w.taps;
        for (int c = 0; c < C; ++c) {
          int32_t sum = half;
          for (int t = 0; t < w.count[i]; ++t) sum += p[t * C + c] * k[t];
          out[i * C + c] = ClipSample<uint8_t, int32_t>(sum);
        }
        continue;
      }
      const int used = (w.count[i] + kTapsPerVector - 1) / kTapsPerVector;
      const int32_t* k = wide.data() + static_cast<size_t>(i) * vectors * 8;
      __m256i acc = _mm256_setzero_si256();
      for (int v = 0; v < used; ++v) {
        const __m256i px = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + static_cast<size_t>(v) * kTapsPerVector * C)));
        const __m256i kv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + v * 8));
        acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, kv));
      }
      // Sum the lanes of one channel, add half, shift, clip to bytes (as ClipSample).
      __m128i sum;
      if (C == 3) {
        sum = _mm_add_epi32(_mm256_castsi256_si128(acc),
                            _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(acc, next_tap)));
      } else {
        sum = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
        sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4E));
        sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xB1));
      }
      sum = _mm_srai_epi32(_mm_add_epi32(sum, half4), kResamplePrecisionBits);
      sum = _mm_packus_epi16(_mm_packs_epi32(sum, sum), sum);
      const auto bytes = static_cast<uint32_t>(_mm_cvtsi128_si32(sum));
      if (C == 3 && i + 1 < n) {
        std::memcpy(out + i * 3, &bytes, 4);  // the fourth byte is the next pixel's, written next
      } else {
        std::memcpy(out + i * C, &bytes, C);
      }
    }
  }
}

// Eight fixed-point sums to eight samples in 32-bit lanes: drop the fraction bits, clip to [lo, hi].
__attribute__((target("avx2"))) inline __m256i ClipLanes(__m256i v, __m256i lo, __m256i hi) {
  return _mm256_min_epi32(_mm256_max_epi32(_mm256_srai_epi32(v, kResamplePrecisionBits), lo), hi);
}

// The most taps an output may have for HorizontalGather3 (beyond it, HorizontalAvx2<3>: a gather per
// tap and eight outputs costs more than two taps per vector when there are many).
constexpr int kGatherMaxTaps = 12;

// Horizontal, 8-bit, RGB, eight outputs at a time: per tap, one gather loads the eight outputs'
// source pixels as 32-bit words (R, G, B and one byte more, masked off), and each channel sums in
// eight lanes. The same integer arithmetic as the scalar code (32-bit wrap-around sums, then shift
// and clip), so the same values. `lanes` holds per group of eight outputs and per tap the eight
// byte offsets then the eight weights (taps past an output's count: its first pixel, weight 0);
// `safe` says whether a group's loads stay inside the row (a 32-bit load at the row's last pixel
// reads one byte past it: such a group takes the scalar code).
__attribute__((target("avx2"))) void HorizontalGather3(const PackedImage& src, int y0, int rows, const AxisWeights& w,
                                                       uint8_t* dst, size_t dst_stride, std::vector<int32_t>& lanes,
                                                       std::vector<uint8_t>& safe) {
  constexpr int kLanes = 8;
  const int n = static_cast<int>(w.first.size());
  const int groups = n / kLanes;
  const int taps = w.taps;
  const size_t group_ints = static_cast<size_t>(taps) * 2 * kLanes;
  lanes.assign(static_cast<size_t>(groups) * group_ints, 0);
  safe.assign(static_cast<size_t>(groups), 0);
  const int row_bytes = src.width * 3;
  std::vector<int> group_taps(static_cast<size_t>(groups), 0);
  for (int g = 0; g < groups; ++g) {
    int32_t* d = lanes.data() + static_cast<size_t>(g) * group_ints;
    bool ok = true;
    int most = 0;
    for (int l = 0; l < kLanes; ++l) {
      const int i = g * kLanes + l;
      const int32_t* k = w.weights.data() + static_cast<size_t>(i) * taps;
      most = std::max(most, w.count[i]);
      ok = ok && (w.first[i] + std::max(w.count[i], 1) - 1) * 3 + 4 <= row_bytes;
      for (int t = 0; t < taps; ++t) {
        const bool used = t < w.count[i];
        d[t * 2 * kLanes + l] = (w.first[i] + (used ? t : 0)) * 3;
        d[t * 2 * kLanes + kLanes + l] = used ? k[t] : 0;
      }
    }
    safe[g] = ok ? 1 : 0;
    group_taps[g] = most;
  }
  constexpr int32_t half = 1 << (kResamplePrecisionBits - 1);
  const __m256i h = _mm256_set1_epi32(half);
  const __m256i byte = _mm256_set1_epi32(0xFF);
  const __m256i zero = _mm256_setzero_si256();
  // Per 128-bit half: four RGBx words to twelve RGB bytes.
  const __m256i pack = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, -1, -1, -1, -1, 0, 1, 2, 4, 5, 6, 8, 9,
                                        10, 12, 13, 14, -1, -1, -1, -1);
  for (int y = 0; y < rows; ++y) {
    const uint8_t* in = src.data + static_cast<size_t>(y0 + y) * src.stride;
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    for (int g = 0; g < groups; ++g) {
      if (safe[g] == 0) {
        for (int i = g * kLanes; i < (g + 1) * kLanes; ++i) {
          const uint8_t* p = in + static_cast<size_t>(w.first[i]) * 3;
          const int32_t* k = w.weights.data() + static_cast<size_t>(i) * taps;
          for (int c = 0; c < 3; ++c) {
            int32_t sum = half;
            for (int t = 0; t < w.count[i]; ++t) sum += p[t * 3 + c] * k[t];
            out[i * 3 + c] = ClipSample<uint8_t, int32_t>(sum);
          }
        }
        continue;
      }
      const int32_t* d = lanes.data() + static_cast<size_t>(g) * group_ints;
      __m256i r = h, gr = h, b = h;
      for (int t = 0; t < group_taps[g]; ++t) {
        const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + t * 2 * kLanes));
        const __m256i kv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + t * 2 * kLanes + kLanes));
        const __m256i px = _mm256_i32gather_epi32(reinterpret_cast<const int*>(in), idx, 1);
        r = _mm256_add_epi32(r, _mm256_mullo_epi32(_mm256_and_si256(px, byte), kv));
        gr = _mm256_add_epi32(gr, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(px, 8), byte), kv));
        b = _mm256_add_epi32(b, _mm256_mullo_epi32(_mm256_and_si256(_mm256_srli_epi32(px, 16), byte), kv));
      }
      const __m256i words =
          _mm256_or_si256(ClipLanes(r, zero, byte), _mm256_or_si256(_mm256_slli_epi32(ClipLanes(gr, zero, byte), 8),
                                                                    _mm256_slli_epi32(ClipLanes(b, zero, byte), 16)));
      alignas(32) uint8_t bytes[32];
      _mm256_store_si256(reinterpret_cast<__m256i*>(bytes), _mm256_shuffle_epi8(words, pack));
      std::memcpy(out + g * kLanes * 3, bytes, 12);
      std::memcpy(out + g * kLanes * 3 + 12, bytes + 16, 12);
    }
    for (int i = groups * kLanes; i < n; ++i) {
      const uint8_t* p = in + static_cast<size_t>(w.first[i]) * 3;
      const int32_t* k = w.weights.data() + static_cast<size_t>(i) * taps;
      for (int c = 0; c < 3; ++c) {
        int32_t sum = half;
        for (int t = 0; t < w.count[i]; ++t) sum += p[t * 3 + c] * k[t];
        out[i * 3 + c] = ClipSample<uint8_t, int32_t>(sum);
      }
    }
  }
}

// Eight 32-bit sums to eight clipped bytes, in order, in the low 64 bits.
__attribute__((target("avx2"))) inline __m256i PackSums(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab =
      _mm256_packs_epi32(_mm256_srai_epi32(a, kResamplePrecisionBits), _mm256_srai_epi32(b, kResamplePrecisionBits));
  const __m256i cd =
      _mm256_packs_epi32(_mm256_srai_epi32(c, kResamplePrecisionBits), _mm256_srai_epi32(d, kResamplePrecisionBits));
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Eight bytes widened to eight 32-bit lanes.
__attribute__((target("avx2"))) inline __m256i Load8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// Vertical, 8-bit: 32 (then 8) columns at a time.
__attribute__((target("avx2"))) void VerticalAvx2(const uint8_t* in, size_t in_stride, int row0, int x0, int n,
                                                  const AxisWeights& w, uint8_t* dst, size_t dst_stride) {
  constexpr int32_t half = 1 << (kResamplePrecisionBits - 1);
  const __m256i h = _mm256_set1_epi32(half);
  for (size_t i = 0; i < w.first.size(); ++i) {
    const int32_t* k = w.weights.data() + i * w.taps;
    const int count = w.count[i];
    const uint8_t* base = in + static_cast<size_t>(w.first[i] - row0) * in_stride + x0;
    uint8_t* out = dst + i * dst_stride;
    int j = 0;
    for (; j + 32 <= n; j += 32) {
      __m256i a0 = h, a1 = h, a2 = h, a3 = h;
      for (int t = 0; t < count; ++t) {
        const uint8_t* r = base + static_cast<size_t>(t) * in_stride + j;
        const __m256i kv = _mm256_set1_epi32(k[t]);
        a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(Load8(r), kv));
        a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(Load8(r + 8), kv));
        a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(Load8(r + 16), kv));
        a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(Load8(r + 24), kv));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), PackSums(a0, a1, a2, a3));
    }
    for (; j + 8 <= n; j += 8) {
      __m256i a = h;
      for (int t = 0; t < count; ++t) {
        a = _mm256_add_epi32(
            a, _mm256_mullo_epi32(Load8(base + static_cast<size_t>(t) * in_stride + j), _mm256_set1_epi32(k[t])));
      }
      _mm_storel_epi64(reinterpret_cast<__m128i*>(out + j), _mm256_castsi256_si128(PackSums(a, a, a, a)));
    }
    for (; j < n; ++j) {
      int32_t sum = half;
      for (int t = 0; t < count; ++t) sum += base[static_cast<size_t>(t) * in_stride + j] * k[t];
      out[j] = ClipSample<uint8_t, int32_t>(sum);
    }
  }
}
#endif  // SPDL_RESAMPLE_AVX2

// The 8-bit passes: AVX2 when the CPU has it, else the portable code.
void Horizontal8(bool simd, const PackedImage& src, int y0, int rows, const AxisWeights& w, uint8_t* dst,
                 size_t dst_stride, std::vector<int32_t>& wide, std::vector<uint8_t>& safe) {
#ifdef SPDL_RESAMPLE_AVX2
  if (simd && HaveAvx2() && src.channels == 3) {
    if (w.taps <= kGatherMaxTaps) return HorizontalGather3(src, y0, rows, w, dst, dst_stride, wide, safe);
    return HorizontalAvx2<3>(src, y0, rows, w, dst, dst_stride, wide, safe);
  }
  if (simd && HaveAvx2() && src.channels == 1) return HorizontalAvx2<1>(src, y0, rows, w, dst, dst_stride, wide, safe);
#endif
  (void)simd;
  (void)wide;
  (void)safe;
  HorizontalAny<uint8_t, int32_t>(src, y0, rows, w, dst, dst_stride);
}

void Vertical8(bool simd, const uint8_t* in, size_t in_stride, int row0, int x0, int n, const AxisWeights& w,
               uint8_t* dst, size_t dst_stride, std::vector<int32_t>& sums) {
#ifdef SPDL_RESAMPLE_AVX2
  if (simd && HaveAvx2()) return VerticalAvx2(in, in_stride, row0, x0, n, w, dst, dst_stride);
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
      Horizontal8(simd_, rows, 0, r.window_height, horizontal_, dst, dst_stride, simd_weights_, simd_safe_);
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
    Horizontal8(simd_, src, row0, row_end - row0, horizontal_, rows_.data(), rows_stride, simd_weights_, simd_safe_);
    Vertical8(simd_, rows_.data(), rows_stride, row0, 0, n, vertical_, dst, dst_stride, sums32_);
  }
  return Status::Ok();
}

void Resampler::Trim(size_t max_bytes) {
  if (rows_.size() > max_bytes) std::vector<uint8_t>().swap(rows_);
  if (sums_.size() * sizeof(int64_t) > max_bytes) std::vector<int64_t>().swap(sums_);
  if (sums32_.size() * sizeof(int32_t) > max_bytes) std::vector<int32_t>().swap(sums32_);
}

}  // namespace spdl::media
