// Tests of the JPEG window decode (media/jpeg_window.h) and of ImageDecoder's partial path:
//   - the window decoder's pixels against TurboJPEG's full decode at the same scale (the product's
//     full-decode path), over 4:4:4, 4:2:2, 4:2:0, 4:4:0, gray, progressive and restart-marker JPEGs
//     of many sizes, every DCT scale, and windows touching every edge;
//   - ImageDecoder with window decode on against off (random_resized_crop and resize + center_crop,
//     both resample paths, RGB and gray): the bound (mean absolute difference <= 0.5, max
//     within 1 level), and on the exact path bit-identical output (PIL's pixels are kept);
//   - bad input: cut, corrupt, empty, over the pixel limit, bad requests.
// The photos are made here: a textured synthetic scene (gradients, sinusoids of several
// frequencies, hard edges and noise), encoded by libjpeg with the options under test.
#include "media/jpeg_window.h"

#include <turbojpeg.h>  // the full-decode reference

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "media/image_decoder.h"
#include "media/jpeg_encoder.h"
#include "media/resample.h"

namespace spdl::media {
namespace {

// A photo-like RGB image: smooth shading, textures of several frequencies, hard-edged shapes and
// sensor-like noise (so every DCT coefficient and the chroma upsampler have something to do).
std::vector<uint8_t> Scene(int w, int h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(-12, 12);
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  const double fx = 0.05 + (seed % 7) * 0.03, fy = 0.04 + (seed % 5) * 0.05;
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const bool disc = (x - w / 3) * (x - w / 3) + (y - h / 2) * (y - h / 2) < (w * h) / 16;
      const bool stripe = ((x + 2 * y) / 5) % 3 == 0;
      for (int c = 0; c < 3; ++c) {
        double v = 60 + 120.0 * x / std::max(w, 1) + 40 * std::sin(fx * x * (c + 1) + fy * y) +
                   30 * std::cos(0.7 * x - 0.3 * y + c);
        if (disc) v = 220 - 60 * c;
        if (stripe && c == 1) v -= 50;
        v += noise(rng);
        px[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0));
      }
    }
  }
  return px;
}

struct Kind {
  const char* name;
  JpegEncodeOptions options;
};

std::vector<Kind> Kinds() {
  std::vector<Kind> k;
  auto add = [&](const char* name, ChromaSubsampling s, bool vertical, bool progressive, int restart) {
    JpegEncodeOptions o;
    o.quality = 88;
    o.subsampling = s;
    o.vertical_only = vertical;
    o.progressive = progressive;
    o.restart_interval = restart;
    k.push_back({name, o});
  };
  add("444", ChromaSubsampling::k444, false, false, 0);
  add("422", ChromaSubsampling::k422, false, false, 0);
  add("420", ChromaSubsampling::k420, false, false, 0);
  add("440", ChromaSubsampling::k422, true, false, 0);
  add("gray", ChromaSubsampling::kGray, false, false, 0);
  add("420 progressive", ChromaSubsampling::k420, false, true, 0);
  add("444 progressive", ChromaSubsampling::k444, false, true, 0);
  add("420 restart 3", ChromaSubsampling::k420, false, false, 3);
  add("422 restart 1 progressive", ChromaSubsampling::k422, false, true, 1);
  return k;
}

// A full decode by TurboJPEG at scale 1/k: RGB, or its grayscale output.
std::vector<uint8_t> FullDecode(const std::vector<uint8_t>& jpeg, int k, bool gray, int* w, int* h) {
  std::unique_ptr<void, int (*)(void*)> tj(tjInitDecompress(), tjDestroy);
  int width, height, subsamp, cs;
  REQUIRE(tjDecompressHeader3(tj.get(), jpeg.data(), jpeg.size(), &width, &height, &subsamp, &cs) == 0);
  const tjscalingfactor sf{1, k};
  *w = TJSCALED(width, sf);
  *h = TJSCALED(height, sf);
  const int c = gray ? 1 : 3;
  std::vector<uint8_t> out(static_cast<size_t>(*w) * *h * c);
  REQUIRE(tjDecompress2(tj.get(), jpeg.data(), jpeg.size(), out.data(), *w, *w * c, *h, gray ? TJPF_GRAY : TJPF_RGB,
                        TJFLAG_STOPONWARNING) == 0);
  return out;
}

struct Rect {
  int x0, y0, x1, y1;
};

// Windows of a w x h image: the whole, strips along each edge, each corner, single pixels at the
// corners, and a few random ones.
std::vector<Rect> Windows(int w, int h, std::mt19937& rng) {
  const int sw = std::max(1, w / 3), sh = std::max(1, h / 3);
  std::vector<Rect> r = {{0, 0, w, h},           {0, 0, sw, h},        {w - sw, 0, w, h},  {0, 0, w, sh},
                         {0, h - sh, w, h},      {0, 0, sw, sh},       {w - sw, 0, w, sh}, {0, h - sh, sw, h},
                         {w - sw, h - sh, w, h}, {w - 1, h - 1, w, h}, {0, 0, 1, 1}};
  for (int i = 0; i < 2; ++i) {
    const int x0 = std::uniform_int_distribution<int>(0, w - 1)(rng);
    const int y0 = std::uniform_int_distribution<int>(0, h - 1)(rng);
    const int x1 = std::uniform_int_distribution<int>(x0 + 1, w)(rng);
    const int y1 = std::uniform_int_distribution<int>(y0 + 1, h)(rng);
    r.push_back({x0, y0, x1, y1});
  }
  return r;
}

TEST_CASE("jpeg window decode gives the full decode's pixels inside the window", "[jpeg_window]") {
  // Sizes on and off the iMCU grid; the largest for the sequential kinds only (test time under ASan).
  const std::vector<std::pair<int, int>> sizes = {{1, 1},     {7, 5},    {33, 17},  {100, 75},
                                                  {257, 131}, {64, 480}, {500, 375}};
  JpegWindowDecoder dec;
  std::mt19937 rng(18);
  int windows = 0;
  long long differing = 0, max_diff = 0;
  for (const Kind& kind : Kinds()) {
    for (auto [w, h] : sizes) {
      if (w * h > 100000 && kind.options.progressive) continue;
      const std::vector<uint8_t> rgb = Scene(w, h, static_cast<uint32_t>(w * 31 + h));
      auto jpeg = EncodeJpegWith(rgb.data(), w, h, kind.options);
      REQUIRE(jpeg.ok());
      for (int k : {1, 2, 4, 8}) {
        for (bool gray : {false, true}) {
          if (gray && k != 1) continue;  // gray output: one scale is enough
          int fw, fh;
          const std::vector<uint8_t> full = FullDecode(*jpeg, k, gray, &fw, &fh);
          const int c = gray ? 1 : 3;
          for (const Rect& r : Windows(fw, fh, rng)) {
            CAPTURE(kind.name, w, h, k, gray, r.x0, r.y0, r.x1, r.y1);
            JpegWindowRequest req{k, r.x0, r.y0, r.x1, r.y1, gray};
            JpegWindowImage img;
            const Status s = dec.Decode(*jpeg, req, int64_t{1} << 30, &img);
            REQUIRE(s.ok());
            REQUIRE(img.channels == c);
            REQUIRE(img.image_width == fw);
            REQUIRE(img.image_height == fh);
            REQUIRE(img.x <= r.x0);
            REQUIRE(img.y <= r.y0);
            REQUIRE(img.x + img.width >= r.x1);
            REQUIRE(img.y + img.height >= r.y1);
            long long bad = 0, worst = 0;
            for (int y = r.y0; y < r.y1; ++y) {
              const uint8_t* a = img.At(r.x0, y);
              const uint8_t* b = full.data() + (static_cast<size_t>(y) * fw + r.x0) * c;
              for (int i = 0; i < (r.x1 - r.x0) * c; ++i) {
                const int d = std::abs(int{a[i]} - int{b[i]});
                bad += d != 0;
                worst = std::max<long long>(worst, d);
              }
            }
            CHECK(bad == 0);
            differing += bad;
            max_diff = std::max(max_diff, worst);
            ++windows;
          }
        }
      }
    }
  }
  std::printf("jpeg_window: %d windows, %lld samples differ from the full decode (max %lld)\n", windows, differing,
              max_diff);
}

// Mean and max absolute difference of two equally sized byte images.
struct Diff {
  double mean = 0;
  int max = 0;
};
Diff Compare(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  Diff d;
  long long sum = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const int v = std::abs(int{a[i]} - int{b[i]});
    sum += v;
    d.max = std::max(d.max, v);
  }
  d.mean = a.empty() ? 0 : static_cast<double>(sum) / a.size();
  return d;
}

TEST_CASE("image decoder partial path matches the full-decode path", "[jpeg_window]") {
  // Every kind at two sizes; 4:2:0 (the common case) also at sizes where DCT scaling applies more.
  const std::vector<std::pair<int, int>> sizes = {{96, 64}, {333, 250}, {240, 600}, {1200, 900}};
  const std::vector<Kind> kinds = Kinds();
  int samples = 0;
  double worst_mean_fast = 0, worst_mean_exact = 0;
  int worst_max_fast = 0, worst_max_exact = 0, dct_scaled = 0;
  double yuv_mean = 0;
  int yuv_max = 0;
  for (const Kind& kind : kinds) {
    for (auto [w, h] : sizes) {
      if (w * h > 333 * 250 && std::string(kind.name) != "420") continue;  // test time under ASan
      const std::vector<uint8_t> rgb = Scene(w, h, static_cast<uint32_t>(w + h * 7));
      auto jpeg = EncodeJpegWith(rgb.data(), w, h, kind.options);
      REQUIRE(jpeg.ok());
      for (Resample resample : {Resample::kFast, Resample::kExact}) {
        for (int geometry = 0; geometry < 2; ++geometry) {
          for (int channels : {3, 1}) {
            ImageOps ops;
            ops.resample = resample;
            ops.channels = channels;
            static constexpr Interpolation kFilters[] = {Interpolation::kBilinear, Interpolation::kBicubic,
                                                         Interpolation::kNearest, Interpolation::kLanczos,
                                                         Interpolation::kArea};
            ops.interpolation = kFilters[(w + geometry + channels) % 5];
            int ow, oh;
            if (geometry == 0) {
              ops.random_crop_width = ops.random_crop_height = 56;
              ops.flip_probability = 0.5;
              ow = oh = 56;
            } else {
              ops.resize_shorter = 48;
              ops.crop_width = ops.crop_height = 28;  // under half the image: the fast path's window too
              ow = oh = 28;
            }
            const size_t n = static_cast<size_t>(ow) * oh * channels;
            for (uint64_t seed : {1u, 2u}) {
              if (channels == 1 && seed != 1) continue;
              CAPTURE(kind.name, w, h, resample == Resample::kFast, geometry, channels, seed);
              ImageDecoder on(JpegDecodePath::kRgb), off(JpegDecodePath::kRgb), yuv(JpegDecodePath::kYuvPlanes);
              off.set_jpeg_window_decode(false);
              yuv.set_jpeg_window_decode(false);
              std::vector<uint8_t> a(n), b(n), c(n);
              ImageInfo ia, ib;
              REQUIRE(on.DecodeInto(*jpeg, ops, a.data(), ow, oh, seed, &ia).ok());
              REQUIRE(off.DecodeInto(*jpeg, ops, b.data(), ow, oh, seed, &ib).ok());
              CHECK(ia.dct_scale == ib.dct_scale);
              dct_scaled += ia.dct_scale > 1;
              const Diff d = Compare(a, b);
              CHECK(d.mean <= 0.5);
              CHECK(d.max <= 1);
              if (resample == Resample::kExact) {
                CHECK(d.max == 0);  // PIL's pixels, unchanged
                worst_mean_exact = std::max(worst_mean_exact, d.mean);
                worst_max_exact = std::max(worst_max_exact, d.max);
              } else {
                worst_mean_fast = std::max(worst_mean_fast, d.mean);
                worst_max_fast = std::max(worst_max_fast, d.max);
                if (channels == 3 && kind.options.subsampling != ChromaSubsampling::kGray) {
                  // Against the default full path (Y/Cb/Cr planes, swscale's YUV -> RGB): reported.
                  REQUIRE(yuv.DecodeInto(*jpeg, ops, c.data(), ow, oh, seed).ok());
                  const Diff dy = Compare(a, c);
                  yuv_mean = std::max(yuv_mean, dy.mean);
                  yuv_max = std::max(yuv_max, dy.max);
                }
              }
              ++samples;
            }
          }
        }
      }
    }
  }
  CHECK(dct_scaled > 0);  // the DCT-scaled window decode was exercised
  std::printf(
      "partial vs full: %d samples (%d DCT-scaled); fast: mean <= %.3f, max %d; exact: mean <= %.3f, max %d; "
      "fast window vs full YUV planes: mean <= %.3f, max %d\n",
      samples, dct_scaled, worst_mean_fast, worst_max_fast, worst_mean_exact, worst_max_exact, yuv_mean, yuv_max);
}

TEST_CASE("a CMYK JPEG's window decode matches the full decode", "[jpeg_window]") {
  // TurboJPEG writes the CMYK JPEG (Adobe-style YCCK) from 4-byte pixels.
  const int w = 301, h = 203;
  const std::vector<uint8_t> rgb = Scene(w, h, 3);
  std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    for (int c = 0; c < 3; ++c) cmyk[4 * i + c] = rgb[3 * i + c];
    cmyk[4 * i + 3] = static_cast<uint8_t>(200 + (i % 50));
  }
  std::unique_ptr<void, int (*)(void*)> tj(tjInitCompress(), tjDestroy);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  REQUIRE(tjCompress2(tj.get(), cmyk.data(), w, 0, h, TJPF_CMYK, &buf, &size, TJSAMP_420, 90, 0) == 0);
  const std::vector<uint8_t> jpeg(buf, buf + size);
  tjFree(buf);
  for (Resample resample : {Resample::kFast, Resample::kExact}) {
    for (int channels : {3, 1}) {
      for (int geometry = 0; geometry < 2; ++geometry) {
        ImageOps ops;
        ops.resample = resample;
        ops.channels = channels;
        if (geometry == 0) {
          ops.random_crop_width = ops.random_crop_height = 32;
        } else {
          ops.resize_shorter = 64;
          ops.crop_width = ops.crop_height = 32;
        }
        CAPTURE(resample == Resample::kFast, channels, geometry);
        ImageDecoder on(JpegDecodePath::kRgb), off(JpegDecodePath::kRgb);
        off.set_jpeg_window_decode(false);
        const size_t n = size_t{32} * 32 * channels;
        for (uint64_t seed : {5u, 6u, 7u}) {
          std::vector<uint8_t> a(n), b(n);
          REQUIRE(on.DecodeInto(jpeg, ops, a.data(), 32, 32, seed).ok());
          REQUIRE(off.DecodeInto(jpeg, ops, b.data(), 32, 32, seed).ok());
          CHECK(a == b);
        }
      }
    }
  }
}

TEST_CASE("resampling a part of the source gives the whole source's window", "[jpeg_window]") {
  const int w = 203, h = 157;
  const std::vector<uint8_t> rgb = Scene(w, h, 9);
  Resampler whole_r, part_r;
  for (ResampleFilter f : {ResampleFilter::kNearest, ResampleFilter::kBox, ResampleFilter::kBilinear,
                           ResampleFilter::kHamming, ResampleFilter::kBicubic, ResampleFilter::kLanczos}) {
    for (auto [ow, oh] : std::vector<std::pair<int, int>>{{64, 50}, {203, 80}, {90, 157}, {203, 157}, {300, 220}}) {
      ResampleRequest r;
      r.filter = f;
      r.out_width = ow;
      r.out_height = oh;
      r.window_x = ow / 5;
      r.window_y = oh / 4;
      r.window_width = ow / 2;
      r.window_height = oh / 2;
      CAPTURE(static_cast<int>(f), ow, oh);
      PackedImage src{rgb.data(), static_cast<size_t>(w) * 3, w, h, 3, false};
      std::vector<uint8_t> a(static_cast<size_t>(r.window_width) * r.window_height * 3), b(a.size());
      REQUIRE(whole_r.Resample(src, r, a.data(), static_cast<size_t>(r.window_width) * 3).ok());
      int x0, x1, y0, y1;
      SourceSpan(w, ow, f, r.window_x, r.window_x + r.window_width, &x0, &x1);
      SourceSpan(h, oh, f, r.window_y, r.window_y + r.window_height, &y0, &y1);
      CHECK((x1 - x0 < w || ow == w || f == ResampleFilter::kLanczos));
      PackedImage part{rgb.data() + (static_cast<size_t>(y0) * w + x0) * 3, src.stride, x1 - x0, y1 - y0, 3, false};
      r.src_x = x0;
      r.src_y = y0;
      r.full_width = w;
      r.full_height = h;
      REQUIRE(part_r.Resample(part, r, b.data(), static_cast<size_t>(r.window_width) * 3).ok());
      CHECK(a == b);
      // One column or row short of the span is refused, not read past.
      if (x1 - x0 > 1) {
        PackedImage cut = part;
        cut.width -= 1;
        CHECK(part_r.Resample(cut, r, b.data(), static_cast<size_t>(r.window_width) * 3).code() ==
              StatusCode::kInvalidArgument);
      }
      if (y1 - y0 > 1) {
        PackedImage cut = part;
        cut.height -= 1;
        CHECK(part_r.Resample(cut, r, b.data(), static_cast<size_t>(r.window_width) * 3).code() ==
              StatusCode::kInvalidArgument);
      }
    }
  }
}

TEST_CASE("jpeg window decode refuses bad input and stays usable", "[jpeg_window]") {
  const int w = 160, h = 480;
  const std::vector<uint8_t> rgb = Scene(w, h, 5);
  JpegEncodeOptions o;
  auto jpeg = EncodeJpegWith(rgb.data(), w, h, o);
  REQUIRE(jpeg.ok());
  JpegWindowDecoder dec;
  JpegWindowImage img;
  const int64_t lots = int64_t{1} << 30;

  SECTION("empty and garbage") {
    CHECK(dec.Decode({}, JpegWindowRequest{1, 0, 0, 8, 8, false}, lots, &img).code() == StatusCode::kDataLoss);
    const std::vector<uint8_t> junk(100, 0x42);
    CHECK(dec.Decode(junk, JpegWindowRequest{1, 0, 0, 8, 8, false}, lots, &img).code() == StatusCode::kDataLoss);
  }
  SECTION("bad requests") {
    CHECK(dec.Decode(*jpeg, JpegWindowRequest{3, 0, 0, 8, 8, false}, lots, &img).code() ==
          StatusCode::kInvalidArgument);
    CHECK(dec.Decode(*jpeg, JpegWindowRequest{1, 8, 8, 8, 20, false}, lots, &img).code() ==
          StatusCode::kInvalidArgument);
    CHECK(dec.Decode(*jpeg, JpegWindowRequest{1, w, 0, w + 5, 8, false}, lots, &img).code() ==
          StatusCode::kInvalidArgument);
  }
  SECTION("over the pixel limit") {
    const Status s = dec.Decode(*jpeg, JpegWindowRequest{1, 0, 0, 8, 8, false}, int64_t{w} * h - 1, &img);
    CHECK(s.code() == StatusCode::kResourceExhausted);
  }
  SECTION("cut short anywhere, or without its end marker, is kDataLoss even for a window above the cut") {
    for (double frac : {0.3, 0.5, 0.9, 0.999}) {
      CAPTURE(frac);
      const std::vector<uint8_t> cut(jpeg->begin(), jpeg->begin() + static_cast<ptrdiff_t>(jpeg->size() * frac));
      for (int y0 : {0, h - 16}) {
        const Status s = dec.Decode(cut, JpegWindowRequest{1, 0, y0, w, y0 + 16, false}, lots, &img);
        CHECK(s.code() == StatusCode::kDataLoss);
        CHECK(s.message().find("JPEG") != std::string::npos);
      }
    }
    const std::vector<uint8_t> no_eoi(jpeg->begin(), jpeg->end() - 2);
    CHECK(dec.Decode(no_eoi, JpegWindowRequest{1, 0, 0, w, 16, false}, lots, &img).code() == StatusCode::kDataLoss);
    // Bytes after the end marker are ignored, as by a full decode.
    std::vector<uint8_t> trailing = *jpeg;
    trailing.insert(trailing.end(), {0x00, 0xFF, 0x12, 0x34});
    CHECK(dec.Decode(trailing, JpegWindowRequest{1, 0, 0, w, 16, false}, lots, &img).ok());
    CHECK(dec.Decode(trailing, JpegWindowRequest{1, 0, h - 16, w, h, false}, lots, &img).ok());
  }
  SECTION("a JPEG without its own tables never decodes with the previous image's") {
    // Found by image_fuzz (corpus/image/regress_jpeg_tables_of_the_previous_image): a reused libjpeg
    // object kept the last image's quantization tables, so a file without DQT decoded after another
    // JPEG but not alone. Every DQT segment (FF DB, then its 2-byte length) removed:
    std::vector<uint8_t> no_dqt;
    for (size_t i = 0; i < jpeg->size();) {
      if (i + 3 < jpeg->size() && (*jpeg)[i] == 0xFF && (*jpeg)[i + 1] == 0xDB) {
        i += 2 + ((size_t{(*jpeg)[i + 2]} << 8) | (*jpeg)[i + 3]);
        continue;
      }
      no_dqt.push_back((*jpeg)[i++]);
    }
    REQUIRE(no_dqt.size() < jpeg->size());
    JpegWindowDecoder fresh;
    const Status alone = fresh.Decode(no_dqt, JpegWindowRequest{1, 0, 0, w, 16, false}, lots, &img);
    CHECK(alone.code() == StatusCode::kDataLoss);
    REQUIRE(dec.Decode(*jpeg, JpegWindowRequest{1, 0, 0, w, 16, false}, lots, &img).ok());
    const Status after = dec.Decode(no_dqt, JpegWindowRequest{1, 0, 0, w, 16, false}, lots, &img);
    CHECK(after.code() == alone.code());
    CHECK(after.message() == alone.message());
  }
  SECTION("progressive and restart-marker files pass the end-marker walk") {
    for (int kind = 0; kind < 2; ++kind) {
      JpegEncodeOptions p;
      p.progressive = kind == 0;
      p.restart_interval = kind == 1 ? 2 : 0;
      auto other = EncodeJpegWith(rgb.data(), w, h, p);
      REQUIRE(other.ok());
      CHECK(dec.Decode(*other, JpegWindowRequest{1, 0, 0, w, 16, false}, lots, &img).ok());
      const std::vector<uint8_t> cut(other->begin(), other->end() - 2);
      CHECK(dec.Decode(cut, JpegWindowRequest{1, 0, 0, w, 16, false}, lots, &img).code() == StatusCode::kDataLoss);
    }
  }
  SECTION("corrupt entropy data inside the window is kDataLoss") {
    std::vector<uint8_t> bad = *jpeg;
    for (size_t i = bad.size() / 3; i < bad.size() / 3 + 64; ++i) bad[i] = static_cast<uint8_t>(i * 37);
    int failures = 0;
    for (int y0 = 0; y0 < h; y0 += 32) {
      failures += !dec.Decode(bad, JpegWindowRequest{1, 0, y0, w, std::min(h, y0 + 32), false}, lots, &img).ok();
    }
    CHECK(failures > 0);
  }
  // After any of the above, the same decoder decodes a good file.
  int fw, fh;
  const std::vector<uint8_t> full = FullDecode(*jpeg, 1, false, &fw, &fh);
  REQUIRE(dec.Decode(*jpeg, JpegWindowRequest{1, 10, 100, 50, 140, false}, lots, &img).ok());
  CHECK(std::equal(img.At(10, 100), img.At(10, 100) + 40 * 3, full.data() + (100 * fw + 10) * 3));
}

}  // namespace
}  // namespace spdl::media
