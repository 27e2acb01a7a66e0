// Tests of media/: the torchvision geometry, the JPEG decoder against an independent analytic
// reference and against its own reference path, and its handling of bad input.
//
// Every test image is made here: a smooth synthetic RGB pattern (gradients and low-frequency
// sinusoids, different per channel), so the exact value of any output pixel is known in closed
// form and the decoder can be checked without another imaging library.
#include <turbojpeg.h>  // only to build CMYK JPEGs and to time a bare decode
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>  // ASAN_POISON_MEMORY_REGION: no-ops without ASan
#else                                  // a compiler without it (a linter's): no ASan either
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "media/ffmpeg_image.h"
#include "media/image_decoder.h"
#include "media/image_encoder.h"
#include "media/pixel_convert.h"
#include "media/resample.h"
#include "media/sample_random.h"
#include "skip.h"

namespace spdl::media {
namespace {

// ---- tolerances (levels of 8-bit output) ----
// Against the analytic pattern. Error sources: JPEG quantisation at quality 95 (< 1 level on
// this smooth pattern), chroma subsampling and its upsampling, the resampling filter (its blur
// on the sinusoids and its clamping at the image and crop-window edges, where the pattern's
// slope of up to ~2 levels per output pixel turns into a few levels of bias), integer rounding
// of the source window (< 1/2 source pixel) and, for big downscales, DCT-domain scaling.
constexpr double kMaxMeanAbsVsAnalytic = 1.2;
constexpr double kMaxP99VsAnalytic = 5.0;
// Against ReferenceDecodeInto (full decode, resize of the whole image, then crop): the two
// resample the same decoded data with the same filter, differing in YUV vs RGB resampling,
// window rounding, DCT scaling and the filter's edge handling at the crop window.
constexpr double kMaxMeanAbsVsReference = 0.8;
constexpr double kMaxP99VsReference = 4.0;
// Grayscale JPEGs: the three channels must be identical, not merely close.
constexpr int kMaxGrayChannelSpread = 0;

constexpr double kPi = std::numbers::pi;

// The pattern, channel c at normalised coordinates (u, v) in [0, 1] (u = x / width). Values stay
// in [25, 230], away from clipping.
double Pattern(int c, double u, double v) {
  switch (c) {
    case 0:
      return 128 + 50 * std::sin(2 * kPi * (1.3 * u + 0.4 * v) + 0.3) + 40 * (u - 0.5);
    case 1:
      return 128 + 50 * std::cos(2 * kPi * (0.5 * u - 1.1 * v)) + 40 * (v - 0.5);
    default:
      return 128 + 45 * std::sin(2 * kPi * (0.9 * u + 0.9 * v) + 1.0) - 30 * (u - v);
  }
}

uint8_t ToByte(double x) { return static_cast<uint8_t>(std::clamp(std::lround(x), 0L, 255L)); }

// The pattern sampled at pixel centres, packed RGB.
std::vector<uint8_t> MakePattern(int w, int h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] = ToByte(Pattern(c, (x + 0.5) / w, (y + 0.5) / h));
      }
    }
  }
  return rgb;
}

std::vector<uint8_t> MakeJpeg(int w, int h, ChromaSubsampling s = ChromaSubsampling::k420) {
  std::vector<uint8_t> rgb = MakePattern(w, h);
  Result<std::vector<uint8_t>> jpeg = EncodeJpeg(rgb.data(), w, h, 95, s);
  REQUIRE(jpeg.ok());
  return std::move(jpeg).value();
}

// torchvision's geometry written out independently of media/image_ops.cc: Resize(S) then
// CenterCrop(C), with Python's round-half-to-even.
struct Geometry {
  int rw, rh;        // resized size
  int ow, oh;        // output size
  int off_x, off_y;  // output (x, y) shows resized pixel (x + off_x, y + off_y)
};

Geometry TorchvisionGeometry(int w, int h, int resize_shorter, int crop) {
  Geometry g{w, h, w, h, 0, 0};
  if (resize_shorter > 0) {
    if (w <= h) {
      g.rw = resize_shorter;
      g.rh = static_cast<int>(static_cast<double>(resize_shorter) * h / w);
    } else {
      g.rh = resize_shorter;
      g.rw = static_cast<int>(static_cast<double>(resize_shorter) * w / h);
    }
  }
  g.ow = g.rw;
  g.oh = g.rh;
  if (crop > 0) {
    auto axis = [&](int size, int* off) {
      if (crop > size) {
        *off = -((crop - size) / 2);  // padded before
      } else {
        *off = static_cast<int>(std::nearbyint((size - crop) / 2.0));  // half to even
      }
    };
    axis(g.rw, &g.off_x);
    axis(g.rh, &g.off_y);
    g.ow = g.oh = crop;
  }
  return g;
}

// An output buffer with guard bytes between rows and after the last one: a decoder that writes
// outside its rows (into a neighbouring sample of the batch) is caught.
struct GuardedImage {
  static constexpr uint8_t kGuard = 0xA5;
  static constexpr int kGap = 29;  // odd, so rows are not aligned
  int w, h;
  size_t stride;
  std::vector<uint8_t> bytes;

  GuardedImage(int width, int height)
      : w(width), h(height), stride(static_cast<size_t>(width) * 3 + kGap), bytes(stride * height + 64, kGuard) {}
  uint8_t* data() { return bytes.data(); }
  uint8_t at(int x, int y, int c) const { return bytes[y * stride + x * 3 + c]; }
  bool GuardsIntact() const {
    for (int y = 0; y < h; ++y) {
      for (size_t i = static_cast<size_t>(w) * 3; i < stride; ++i) {
        if (bytes[y * stride + i] != kGuard) return false;
      }
    }
    for (size_t i = stride * h; i < bytes.size(); ++i) {
      if (bytes[i] != kGuard) return false;
    }
    return true;
  }
};

struct ErrorStats {
  double mean = 0;
  double p99 = 0;
  double max = 0;
};

ErrorStats Stats(std::vector<double> errors) {
  ErrorStats s;
  if (errors.empty()) return s;
  double sum = 0;
  for (double e : errors) sum += e;
  s.mean = sum / errors.size();
  std::sort(errors.begin(), errors.end());
  s.p99 = errors[static_cast<size_t>(0.99 * (errors.size() - 1))];
  s.max = errors.back();
  return s;
}

// Absolute errors of img against the pattern at the output pixel centres mapped back to the
// source. Padding pixels must be exactly 0 (their error is counted as the value itself).
ErrorStats VsAnalytic(const GuardedImage& img, const Geometry& g) {
  std::vector<double> errors;
  errors.reserve(static_cast<size_t>(img.w) * img.h * 3);
  for (int y = 0; y < img.h; ++y) {
    for (int x = 0; x < img.w; ++x) {
      const int rx = x + g.off_x, ry = y + g.off_y;
      const bool pad = rx < 0 || ry < 0 || rx >= g.rw || ry >= g.rh;
      for (int c = 0; c < 3; ++c) {
        const double want = pad ? 0.0 : std::clamp(Pattern(c, (rx + 0.5) / g.rw, (ry + 0.5) / g.rh), 0.0, 255.0);
        errors.push_back(std::abs(img.at(x, y, c) - want));
      }
    }
  }
  return Stats(std::move(errors));
}

ErrorStats VsImage(const GuardedImage& a, const GuardedImage& b) {
  std::vector<double> errors;
  for (int y = 0; y < a.h; ++y) {
    for (int x = 0; x < a.w; ++x) {
      for (int c = 0; c < 3; ++c) errors.push_back(std::abs(a.at(x, y, c) - b.at(x, y, c)));
    }
  }
  return Stats(std::move(errors));
}

bool SamePixels(const GuardedImage& a, const GuardedImage& b) {
  for (int y = 0; y < a.h; ++y) {
    for (int x = 0; x < a.w; ++x) {
      for (int c = 0; c < 3; ++c) {
        if (a.at(x, y, c) != b.at(x, y, c)) return false;
      }
    }
  }
  return true;
}

ImageOps ResizeCrop(int shorter, int crop, Interpolation interp = Interpolation::kBilinear) {
  ImageOps ops;
  ops.resize_shorter = shorter;
  ops.crop_width = ops.crop_height = crop;
  ops.interpolation = interp;
  return ops;
}

// The same ops on the fast path (Resample::kFast: DCT scaling, swscale).
ImageOps Fast(ImageOps ops) {
  ops.resample = Resample::kFast;
  return ops;
}

const char* PathName(JpegDecodePath p) { return p == JpegDecodePath::kYuvPlanes ? "yuv" : "rgb"; }

// ---------------------------------------------------------------------------------------------

TEST_CASE("OutputSize and PlanResizeCrop follow torchvision") {
  int w = 0, h = 0;
  OutputSize(ImageOps{}, 500, 375, &w, &h);
  CHECK((w == 500 && h == 375));

  OutputSize(ResizeCrop(256, 0), 500, 375, &w, &h);
  CHECK((w == 341 && h == 256));  // int(256 * 500 / 375) = int(341.33)
  OutputSize(ResizeCrop(256, 0), 375, 500, &w, &h);
  CHECK((w == 256 && h == 341));
  OutputSize(ResizeCrop(256, 224), 2000, 1500, &w, &h);
  CHECK((w == 224 && h == 224));
  OutputSize(ResizeCrop(256, 0), 1, 1, &w, &h);
  CHECK((w == 256 && h == 256));

  ImageOps exact;
  exact.resize_shorter = 999;  // ignored: an exact size wins
  exact.resize_height = 100;
  exact.resize_width = 200;
  OutputSize(exact, 500, 375, &w, &h);
  CHECK((w == 200 && h == 100));

  ImageOps crop_only;
  crop_only.crop_height = 90;
  crop_only.crop_width = 120;
  OutputSize(crop_only, 1000, 1000, &w, &h);
  CHECK((w == 120 && h == 90));

  // Crop offsets: round((341 - 224) / 2) = round(58.5) = 58 (half to even).
  ResizeCropPlan p = PlanResizeCrop(ResizeCrop(256, 224), 500, 375);
  CHECK(p.resized_width == 341);
  CHECK(p.resized_height == 256);
  CHECK(p.keep_x == 58);
  CHECK(p.keep_y == 16);
  CHECK((p.keep_width == 224 && p.keep_height == 224));
  CHECK((p.dst_x == 0 && p.dst_y == 0));
  CHECK_FALSE(p.padded());
  // int(256 * 1340 / 1000) = 343: round(59.5) = 60.
  p = PlanResizeCrop(ResizeCrop(256, 224), 1340, 1000);
  CHECK(p.resized_width == 343);
  CHECK(p.keep_x == 60);
  // int(256 * 1350 / 1000) = 345: round(60.5) = 60.
  p = PlanResizeCrop(ResizeCrop(256, 224), 1350, 1000);
  CHECK(p.resized_width == 345);
  CHECK(p.keep_x == 60);

  // A crop larger than the image pads (crop - size) // 2 before, the rest after.
  crop_only.crop_width = 121;
  crop_only.crop_height = 91;
  p = PlanResizeCrop(crop_only, 100, 80);
  CHECK((p.out_width == 121 && p.out_height == 91));
  CHECK((p.keep_x == 0 && p.keep_y == 0 && p.keep_width == 100 && p.keep_height == 80));
  CHECK((p.dst_x == 10 && p.dst_y == 5));
  CHECK(p.padded());

  // The independent geometry used by the analytic checks agrees.
  for (auto [sw, sh] : {std::pair{500, 375}, {375, 500}, {1340, 1000}, {1350, 1000}, {7, 5}}) {
    const Geometry g = TorchvisionGeometry(sw, sh, 256, 224);
    p = PlanResizeCrop(ResizeCrop(256, 224), sw, sh);
    CHECK(g.rw == p.resized_width);
    CHECK(g.rh == p.resized_height);
    CHECK(g.off_x == p.keep_x - p.dst_x);
    CHECK(g.off_y == p.keep_y - p.dst_y);
  }
}

TEST_CASE("ValidateImageOps names every bad field") {
  CHECK(ValidateImageOps(ImageOps{}).ok());
  CHECK(ValidateImageOps(ResizeCrop(256, 224)).ok());
  ImageOps bad;
  bad.resize_shorter = -1;
  bad.resize_height = 10;  // width missing
  bad.crop_width = 5;      // height missing
  bad.max_pixels = 0;
  Status s = ValidateImageOps(bad);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("resize_shorter"));
  CHECK_THAT(s.message(), Catch::Contains("resize_height and resize_width"));
  CHECK_THAT(s.message(), Catch::Contains("crop_height and crop_width"));
  CHECK_THAT(s.message(), Catch::Contains("max_pixels"));
}

TEST_CASE("EncodeJpeg rejects bad arguments") {
  std::vector<uint8_t> rgb(12, 0);
  CHECK(EncodeJpeg(rgb.data(), 0, 2).status().code() == StatusCode::kInvalidArgument);
  CHECK(EncodeJpeg(rgb.data(), 2, 2, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(EncodeJpeg(nullptr, 2, 2).status().code() == StatusCode::kInvalidArgument);
  Result<std::vector<uint8_t>> j = EncodeJpeg(rgb.data(), 2, 2, 100);
  REQUIRE(j.ok());
  CHECK(j->size() > 100);
  CHECK(((*j)[0] == 0xFF && (*j)[1] == 0xD8));
}

// Decodes `jpeg` with `ops` on the exact path and on both JPEG paths of the fast one and checks
// each against the analytic pattern and against the reference path. expect_dct_scale is the fast
// path's (the exact path never scales in the DCT domain).
void CheckAgainstReferences(const std::vector<uint8_t>& jpeg, int w, int h, const ImageOps& ops, int expect_dct_scale) {
  const Geometry g = TorchvisionGeometry(w, h, ops.resize_shorter, ops.crop_width);
  int ow = 0, oh = 0;
  OutputSize(ops, w, h, &ow, &oh);
  REQUIRE((ow == g.ow && oh == g.oh));

  GuardedImage ref(ow, oh);
  ImageDecoder ref_decoder;
  ImageInfo info;
  REQUIRE(ref_decoder.ReferenceDecodeInto(jpeg, ops, ref.data(), ow, oh, ref.stride, 0, &info).ok());
  CHECK((info.width == w && info.height == h && info.dct_scale == 1));
  CHECK(ref.GuardsIntact());
  const ErrorStats ref_err = VsAnalytic(ref, g);
  INFO("reference vs analytic: mean " << ref_err.mean << " p99 " << ref_err.p99 << " max " << ref_err.max);
  CHECK(ref_err.mean <= kMaxMeanAbsVsAnalytic);
  CHECK(ref_err.p99 <= kMaxP99VsAnalytic);

  struct Path {
    const char* name;
    Resample resample;
    JpegDecodePath jpeg_path;
    int dct_scale;
  };
  for (Path path : {Path{"exact", Resample::kExact, JpegDecodePath::kYuvPlanes, 1},
                    Path{"fast yuv", Resample::kFast, JpegDecodePath::kYuvPlanes, expect_dct_scale},
                    Path{"fast rgb", Resample::kFast, JpegDecodePath::kRgb, expect_dct_scale}}) {
    INFO("path " << path.name);
    ImageOps o = ops;
    o.resample = path.resample;
    ImageDecoder decoder(path.jpeg_path);
    GuardedImage out(ow, oh);
    REQUIRE(decoder.DecodeJpegInto(jpeg, o, out.data(), ow, oh, out.stride, &info).ok());
    CHECK((info.width == w && info.height == h));
    CHECK(info.dct_scale == path.dct_scale);
    CHECK(out.GuardsIntact());
    const ErrorStats a = VsAnalytic(out, g);
    const ErrorStats r = VsImage(out, ref);
    INFO("vs analytic: mean " << a.mean << " p99 " << a.p99 << " max " << a.max);
    INFO("vs reference: mean " << r.mean << " p99 " << r.p99 << " max " << r.max);
    CHECK(a.mean <= kMaxMeanAbsVsAnalytic);
    CHECK(a.p99 <= kMaxP99VsAnalytic);
    CHECK(r.mean <= kMaxMeanAbsVsReference);
    CHECK(r.p99 <= kMaxP99VsReference);
  }
}

TEST_CASE("Resize 256 + center crop 224 matches the analytic pattern and the reference path") {
  struct Case {
    int w, h, dct_scale;
  };
  // 2000x1500: the 224 crop covers 1312 source pixels -> 1/4 scale (328 >= 224; 1/8 gives 164).
  // 1024x768: 672 source pixels -> 1/2 (336); 500x375 and smaller: no DCT scaling.
  for (Case c : {Case{500, 375, 1}, Case{375, 500, 1}, Case{1024, 768, 2}, Case{2000, 1500, 4}, Case{224, 224, 1},
                 Case{100, 80, 1}, Case{333, 517, 1}, Case{641, 479, 1}, Case{1341, 999, 2}, Case{4000, 3000, 8}}) {
    INFO("image " << c.w << "x" << c.h);
    CheckAgainstReferences(MakeJpeg(c.w, c.h), c.w, c.h, ResizeCrop(256, 224), c.dct_scale);
  }
}

TEST_CASE("Other geometries: resize only, crop only, identity, exact size, padding") {
  const std::vector<uint8_t> jpeg = MakeJpeg(500, 375);
  CheckAgainstReferences(jpeg, 500, 375, ResizeCrop(256, 0), 1);
  CheckAgainstReferences(jpeg, 500, 375, ResizeCrop(0, 224), 1);
  CheckAgainstReferences(jpeg, 500, 375, ImageOps{}, 1);
  CheckAgainstReferences(jpeg, 500, 375, ResizeCrop(100, 0), 2);  // 133x100: at most half
  // Crop larger than the image: zero padding around it.
  CheckAgainstReferences(MakeJpeg(100, 80), 100, 80, ResizeCrop(0, 121), 1);
  CheckAgainstReferences(MakeJpeg(100, 80), 100, 80, ResizeCrop(64, 101), 1);

  // Exact size (aspect not kept): compare with the analytic pattern directly.
  ImageOps exact;
  exact.resize_height = 150;
  exact.resize_width = 320;
  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    INFO("path " << PathName(path));
    ImageDecoder decoder(path);
    GuardedImage out(320, 150);
    REQUIRE(decoder.DecodeJpegInto(jpeg, exact, out.data(), 320, 150, out.stride).ok());
    CHECK(out.GuardsIntact());
    const ErrorStats a = VsAnalytic(out, Geometry{320, 150, 320, 150, 0, 0});
    INFO("vs analytic: mean " << a.mean << " p99 " << a.p99);
    CHECK(a.mean <= kMaxMeanAbsVsAnalytic);
    CHECK(a.p99 <= kMaxP99VsAnalytic);
  }
}

TEST_CASE("Padding pixels are zeroed even when the buffer held other data") {
  const std::vector<uint8_t> jpeg = MakeJpeg(100, 80);
  const ImageOps ops = ResizeCrop(0, 121);
  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    ImageDecoder decoder(path);
    GuardedImage out(121, 121);
    for (int y = 0; y < 121; ++y) std::memset(out.data() + y * out.stride, 0x77, 121 * 3);
    REQUIRE(decoder.DecodeJpegInto(jpeg, ops, out.data(), 121, 121, out.stride).ok());
    // 121 - 100 = 21 columns: 10 before, 11 after; 121 - 80 = 41 rows: 20 before, 21 after.
    for (int c = 0; c < 3; ++c) {
      CHECK(out.at(9, 60, c) == 0);
      CHECK(out.at(110, 60, c) == 0);
      CHECK(out.at(60, 19, c) == 0);
      CHECK(out.at(60, 100, c) == 0);
      CHECK(out.at(10, 20, c) != 0);
      CHECK(out.at(109, 99, c) != 0);
    }
    CHECK(out.GuardsIntact());
  }
}

TEST_CASE("Every interpolation works and they differ") {
  const int w = 100, h = 80;  // upscaled: where the filters differ most
  const std::vector<uint8_t> jpeg = MakeJpeg(w, h);
  const ImageOps base = ResizeCrop(256, 224);
  const Geometry g = TorchvisionGeometry(w, h, 256, 224);
  std::vector<GuardedImage> outs;
  for (Interpolation interp : {Interpolation::kBilinear, Interpolation::kBicubic, Interpolation::kArea}) {
    INFO("interpolation " << static_cast<int>(interp));
    ImageOps ops = base;
    ops.interpolation = interp;
    ImageDecoder decoder;
    outs.emplace_back(224, 224);
    REQUIRE(decoder.DecodeJpegInto(jpeg, ops, outs.back().data(), 224, 224, outs.back().stride).ok());
    const ErrorStats a = VsAnalytic(outs.back(), g);
    INFO("vs analytic: mean " << a.mean << " p99 " << a.p99);
    CHECK(a.mean <= kMaxMeanAbsVsAnalytic);
    CHECK(a.p99 <= kMaxP99VsAnalytic);
    // A big downscale too (DCT scaling plus the filter).
    CheckAgainstReferences(MakeJpeg(2000, 1500), 2000, 1500, ops, 4);
  }
  CHECK_FALSE(SamePixels(outs[0], outs[1]));  // bicubic != bilinear when upscaling

  // Area and bilinear are the same filter when upscaling; they differ when downscaling.
  const std::vector<uint8_t> big = MakeJpeg(500, 375);
  GuardedImage bilinear(224, 224), area(224, 224);
  ImageDecoder decoder;
  REQUIRE(decoder.DecodeJpegInto(big, base, bilinear.data(), 224, 224, bilinear.stride).ok());
  ImageOps area_ops = base;
  area_ops.interpolation = Interpolation::kArea;
  REQUIRE(decoder.DecodeJpegInto(big, area_ops, area.data(), 224, 224, area.stride).ok());
  CHECK_FALSE(SamePixels(bilinear, area));
}

TEST_CASE("Chroma subsamplings decode alike") {
  for (ChromaSubsampling s : {ChromaSubsampling::k444, ChromaSubsampling::k422, ChromaSubsampling::k420}) {
    INFO("subsampling " << static_cast<int>(s));
    CheckAgainstReferences(MakeJpeg(500, 375, s), 500, 375, ResizeCrop(256, 224), 1);
    CheckAgainstReferences(MakeJpeg(1024, 768, s), 1024, 768, ResizeCrop(256, 224), 2);
  }
}

TEST_CASE("A grayscale JPEG gives three equal channels") {
  const int w = 500, h = 375;
  const std::vector<uint8_t> jpeg = MakeJpeg(w, h, ChromaSubsampling::kGray);
  const Geometry g = TorchvisionGeometry(w, h, 256, 224);
  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    INFO("path " << PathName(path));
    ImageDecoder decoder(path);
    GuardedImage out(224, 224);
    REQUIRE(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).ok());
    int spread = 0;
    std::vector<double> errors;
    for (int y = 0; y < 224; ++y) {
      for (int x = 0; x < 224; ++x) {
        const int r = out.at(x, y, 0), gr = out.at(x, y, 1), b = out.at(x, y, 2);
        spread = std::max({spread, std::abs(r - gr), std::abs(r - b)});
        // The luma the encoder stored: BT.601 of the pattern.
        const double u = (x + g.off_x + 0.5) / g.rw, v = (y + g.off_y + 0.5) / g.rh;
        const double luma = 0.299 * Pattern(0, u, v) + 0.587 * Pattern(1, u, v) + 0.114 * Pattern(2, u, v);
        errors.push_back(std::abs(r - luma));
      }
    }
    CHECK(spread <= kMaxGrayChannelSpread);
    const ErrorStats a = Stats(errors);
    INFO("vs analytic luma: mean " << a.mean << " p99 " << a.p99);
    CHECK(a.mean <= kMaxMeanAbsVsAnalytic);
    CHECK(a.p99 <= kMaxP99VsAnalytic);
  }
}

// libjpeg-turbo's RGB -> CMYK (cmyk.h), which the decoder inverts with R = C * K / 255.
void RgbToCmyk(const uint8_t* rgb, uint8_t* cmyk) {
  double c = 1.0 - rgb[0] / 255.0, m = 1.0 - rgb[1] / 255.0, y = 1.0 - rgb[2] / 255.0;
  const double k = std::min({c, m, y});
  if (k == 1.0) {
    c = m = y = 0.0;
  } else {
    c = (c - k) / (1.0 - k);
    m = (m - k) / (1.0 - k);
    y = (y - k) / (1.0 - k);
  }
  cmyk[0] = static_cast<uint8_t>(255.0 - c * 255.0 + 0.5);
  cmyk[1] = static_cast<uint8_t>(255.0 - m * 255.0 + 0.5);
  cmyk[2] = static_cast<uint8_t>(255.0 - y * 255.0 + 0.5);
  cmyk[3] = static_cast<uint8_t>(255.0 - k * 255.0 + 0.5);
}

// Encodes with TurboJPEG directly, for what EncodeJpeg does not offer (CMYK input, 4:4:0 and
// 4:1:1 subsampling, progressive coding).
std::vector<uint8_t> TjEncode(const uint8_t* px, int w, int h, int pixel_format, int subsamp, int flags) {
  tjhandle tj = tjInitCompress();
  REQUIRE(tj != nullptr);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, px, w, 0, h, pixel_format, &buf, &size, subsamp, 95, flags);
  INFO((rc == 0 ? "" : tjGetErrorStr2(tj)));
  tjDestroy(tj);
  REQUIRE(rc == 0);
  std::vector<uint8_t> jpeg(buf, buf + size);
  tjFree(buf);
  return jpeg;
}

TEST_CASE("A CMYK JPEG decodes to RGB") {
  const int w = 500, h = 375;
  const std::vector<uint8_t> rgb = MakePattern(w, h);
  std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) RgbToCmyk(&rgb[3 * i], &cmyk[4 * i]);
  const std::vector<uint8_t> jpeg = TjEncode(cmyk.data(), w, h, TJPF_CMYK, TJSAMP_444, 0);
  CheckAgainstReferences(jpeg, w, h, ResizeCrop(256, 224), 1);
  CheckAgainstReferences(jpeg, w, h, ResizeCrop(100, 80), 2);
}

TEST_CASE("4:4:0, 4:1:1 and progressive JPEGs decode") {
  for (auto [w, h] : {std::pair{500, 375}, {1024, 768}, {100, 80}}) {
    const std::vector<uint8_t> rgb = MakePattern(w, h);
    const int dct_scale = w == 1024 ? 2 : 1;
    for (int samp : {TJSAMP_440, TJSAMP_411}) {
      // Not when upscaling a 100x80 image: its 4:1:1 chroma plane is 25 samples wide, magnified
      // 12.8 times, and even libjpeg-turbo's own RGB output is outside the error budget.
      if (w == 100) continue;
      INFO("image " << w << "x" << h << " subsampling " << samp);
      CheckAgainstReferences(TjEncode(rgb.data(), w, h, TJPF_RGB, samp, 0), w, h, ResizeCrop(256, 224), dct_scale);
    }
    INFO("image " << w << "x" << h << " progressive");
    CheckAgainstReferences(TjEncode(rgb.data(), w, h, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE), w, h,
                           ResizeCrop(256, 224), dct_scale);
  }
}

TEST_CASE("Tiny images decode without trouble") {
  for (auto [w, h] : {std::pair{1, 1}, {2, 3}, {7, 5}, {16, 9}, {1, 300}}) {
    INFO("image " << w << "x" << h);
    const std::vector<uint8_t> jpeg = MakeJpeg(w, h);
    for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
      ImageDecoder decoder(path);
      GuardedImage out(224, 224);
      REQUIRE(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).ok());
      CHECK(out.GuardsIntact());
      GuardedImage ref(224, 224);
      REQUIRE(decoder.ReferenceDecodeInto(jpeg, ResizeCrop(256, 224), ref.data(), 224, 224, ref.stride).ok());
    }
  }
}

TEST_CASE("The output size must be the expected one") {
  const std::vector<uint8_t> jpeg = MakeJpeg(500, 375);
  ImageDecoder decoder;
  GuardedImage out(341, 256);
  // Resize only: a 500x375 image becomes 341x256, not 256x256.
  Status s = decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 0), out.data(), 256, 256, out.stride);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("341x256"));
  CHECK(decoder.ReferenceDecodeInto(jpeg, ResizeCrop(256, 0), out.data(), 256, 256, out.stride).code() ==
        StatusCode::kInvalidArgument);
  CHECK(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 0), out.data(), 341, 256, out.stride).ok());
  // A stride too small for the row, no buffer, bad ops.
  CHECK(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 0), out.data(), 341, 256, 341 * 3 - 1).code() ==
        StatusCode::kInvalidArgument);
  CHECK(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 0), nullptr, 341, 256, out.stride).code() ==
        StatusCode::kInvalidArgument);
  ImageOps bad;
  bad.crop_width = 10;
  CHECK(decoder.DecodeJpegInto(jpeg, bad, out.data(), 341, 256, out.stride).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Corrupt, truncated and non-JPEG data is kDataLoss, never a crash") {
  const std::vector<uint8_t> jpeg = MakeJpeg(500, 375);
  const ImageOps ops = ResizeCrop(256, 224);
  GuardedImage out(224, 224);
  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    INFO("path " << PathName(path));
    ImageDecoder decoder(path);
    auto decode = [&](const std::vector<uint8_t>& bytes) {
      return decoder.DecodeJpegInto(bytes, ops, out.data(), 224, 224, out.stride);
    };
    auto reference = [&](const std::vector<uint8_t>& bytes) {
      return decoder.ReferenceDecodeInto(bytes, ops, out.data(), 224, 224, out.stride);
    };

    CHECK(decode({}).code() == StatusCode::kDataLoss);
    CHECK(decode({0xFF, 0xD8}).code() == StatusCode::kDataLoss);
    const std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0, 13};
    Status s = decode(png);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK_FALSE(s.message().empty());

    uint32_t state = 12345;
    std::vector<uint8_t> noise(5000);
    for (uint8_t& b : noise) {
      state = state * 1664525u + 1013904223u;
      b = static_cast<uint8_t>(state >> 24);
    }
    CHECK(decode(noise).code() == StatusCode::kDataLoss);
    noise[0] = 0xFF;  // a JPEG start followed by noise
    noise[1] = 0xD8;
    CHECK(decode(noise).code() == StatusCode::kDataLoss);

    // Truncated anywhere: in the headers, in the scan, just before the end-of-image marker.
    for (double frac : {0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99}) {
      INFO("truncated to " << frac);
      const std::vector<uint8_t> cut(jpeg.begin(), jpeg.begin() + jpeg.size() * frac);
      CHECK(decode(cut).code() == StatusCode::kDataLoss);
      // A failure must not poison the decoder for the next, valid, image.
      CHECK(decode(jpeg).ok());
      CHECK(reference(cut).code() == StatusCode::kDataLoss);
      CHECK(reference(jpeg).ok());
    }
    const std::vector<uint8_t> no_eoi(jpeg.begin(), jpeg.end() - 2);
    CHECK(decode(no_eoi).code() == StatusCode::kDataLoss);

    // Bytes flipped inside the entropy-coded data: decoded (garbage) or refused, never a crash.
    for (size_t at = jpeg.size() / 3; at < jpeg.size() - 2; at += jpeg.size() / 7) {
      std::vector<uint8_t> bad = jpeg;
      bad[at] ^= 0x5A;
      bad[at + 1] = 0xFF;
      Status b = decode(bad);
      CHECK((b.ok() || b.code() == StatusCode::kDataLoss));
      CHECK(out.GuardsIntact());
    }
    // The decoder still works afterwards.
    Status last = decode(jpeg);
    INFO(last.ToString());
    CHECK(last.ok());
  }
}

// Rewrites the frame size in the SOF0 marker of a baseline JPEG.
std::vector<uint8_t> PatchFrameSize(std::vector<uint8_t> jpeg, int w, int h) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {
      jpeg[i + 5] = static_cast<uint8_t>(h >> 8);
      jpeg[i + 6] = static_cast<uint8_t>(h);
      jpeg[i + 7] = static_cast<uint8_t>(w >> 8);
      jpeg[i + 8] = static_cast<uint8_t>(w);
      return jpeg;
    }
  }
  FAIL("no SOF0 marker");
  return jpeg;
}

TEST_CASE("A decompression bomb is refused from its header") {
  const std::vector<uint8_t> bomb = PatchFrameSize(MakeJpeg(64, 48), 60000, 60000);
  ImageDecoder decoder;
  ImageInfo info;
  REQUIRE(decoder.ReadJpegHeader(bomb, &info).ok());
  CHECK((info.width == 60000 && info.height == 60000));

  GuardedImage out(224, 224);
  const auto start = std::chrono::steady_clock::now();
  Status s = decoder.DecodeJpegInto(bomb, ResizeCrop(256, 224), out.data(), 224, 224, out.stride, &info);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::Contains("60000x60000"));
  CHECK_THAT(s.message(), Catch::Contains("178956970"));
  CHECK(ms < 50);  // refused from the header: nothing was decoded (a 3.6 Gpixel decode is not)
  CHECK(decoder.ReferenceDecodeInto(bomb, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).code() ==
        StatusCode::kResourceExhausted);

  // The limit is the caller's: a small one refuses a small image.
  ImageOps ops = ResizeCrop(256, 224);
  ops.max_pixels = 64 * 48 - 1;
  CHECK(decoder.DecodeJpegInto(MakeJpeg(64, 48), ops, out.data(), 224, 224, out.stride).code() ==
        StatusCode::kResourceExhausted);
  ops.max_pixels = 64 * 48;
  CHECK(decoder.DecodeJpegInto(MakeJpeg(64, 48), ops, out.data(), 224, 224, out.stride).ok());
}

TEST_CASE("A decoder reused across many sizes gives what a fresh one gives") {
  struct Item {
    std::vector<uint8_t> jpeg;
    ImageOps ops;
    int ow, oh;
  };
  std::vector<Item> items;
  for (auto [w, h] :
       {std::pair{500, 375}, {2000, 1500}, {100, 80}, {375, 500}, {1024, 768}, {333, 517}, {500, 375}, {7, 5}}) {
    for (const ImageOps& ops : {ResizeCrop(256, 224), ResizeCrop(0, 121), ResizeCrop(160, 128, Interpolation::kArea)}) {
      int ow = 0, oh = 0;
      OutputSize(ops, w, h, &ow, &oh);
      items.push_back({MakeJpeg(w, h), ops, ow, oh});
    }
  }
  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    INFO("path " << PathName(path));
    ImageDecoder reused(path);
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < items.size(); ++i) {
        INFO("item " << i << " round " << round);
        const Item& it = items[i];
        GuardedImage a(it.ow, it.oh), b(it.ow, it.oh);
        REQUIRE(reused.DecodeJpegInto(it.jpeg, it.ops, a.data(), it.ow, it.oh, a.stride).ok());
        ImageDecoder fresh(path);
        REQUIRE(fresh.DecodeJpegInto(it.jpeg, it.ops, b.data(), it.ow, it.oh, b.stride).ok());
        CHECK(SamePixels(a, b));
      }
    }
  }
}

TEST_CASE("swscale contexts are cached") {
  const std::vector<uint8_t> jpeg = MakeJpeg(500, 375);
  ImageDecoder decoder;
  GuardedImage out(224, 224);
  for (int i = 0; i < 5; ++i) {
    REQUIRE(decoder.DecodeJpegInto(jpeg, Fast(ResizeCrop(256, 224)), out.data(), 224, 224, out.stride).ok());
  }
  CHECK(decoder.sws_contexts_built() == 1);
  // The exact path resamples JPEGs without swscale.
  REQUIRE(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).ok());
  CHECK(decoder.sws_contexts_built() == 1);
}

TEST_CASE("A moved decoder keeps working") {
  const std::vector<uint8_t> jpeg = MakeJpeg(500, 375);
  ImageDecoder a;
  GuardedImage out(224, 224);
  const ImageOps fast = Fast(ResizeCrop(256, 224));
  REQUIRE(a.DecodeJpegInto(jpeg, fast, out.data(), 224, 224, out.stride).ok());
  ImageDecoder b(std::move(a));
  REQUIRE(b.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).ok());
  ImageDecoder c;
  c = std::move(b);
  REQUIRE(c.DecodeJpegInto(jpeg, fast, out.data(), 224, 224, out.stride).ok());
  CHECK(c.sws_contexts_built() == 1);
}

// ---- output dtype, layout and normalization (the output pass) ----

// One element of an output image, as a double.
double Element(const uint8_t* buf, OutputDType dtype, size_t i) {
  switch (dtype) {
    case OutputDType::kUInt8:
      return buf[i];
    case OutputDType::kFloat32: {
      float f;
      std::memcpy(&f, buf + 4 * i, 4);
      return f;
    }
    case OutputDType::kFloat16:
    case OutputDType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, buf + 2 * i, 2);
      return dtype == OutputDType::kFloat16 ? HalfToDouble(b) : BFloat16ToDouble(b);
    }
  }
  return 0;
}

// Index of element (x, y, c) of a w x h image in `layout`.
size_t ElementIndex(OutputLayout layout, int w, int h, int x, int y, int c) {
  return layout == OutputLayout::kNHWC ? (static_cast<size_t>(y) * w + x) * 3 + c
                                       : (static_cast<size_t>(c) * h + y) * w + x;
}

// The value an output element must hold for an 8-bit pixel value v, rounded as the dtype rounds,
// written independently of pixel_convert: float via the compiler's double -> float conversion,
// float16 via the compiler's _Float16 where it has one, bfloat16 from the float's bits (exact for
// these values: a double tie that the float rounding could create never occurs here, checked
// against the direct rounding below).
double Expected(const ImageOps& ops, int c, int v) {
  double x = ops.dtype == OutputDType::kUInt8 ? v : v / 255.0;
  if (ops.normalize) x = (x - ops.mean[c]) / ops.stddev[c];
  switch (ops.dtype) {
    case OutputDType::kUInt8:
      return x;
    case OutputDType::kFloat32:
      return static_cast<float>(x);
    case OutputDType::kFloat16:
#ifdef __FLT16_MAX__
      return static_cast<double>(static_cast<_Float16>(x));
#else
      return HalfToDouble(DoubleToHalf(x));
#endif
    case OutputDType::kBFloat16: {
      const float f = static_cast<float>(x);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
      float r;
      std::memcpy(&r, &bits, 4);
      return r;
    }
  }
  return 0;
}

const char* DTypeName(OutputDType d) {
  switch (d) {
    case OutputDType::kUInt8:
      return "uint8";
    case OutputDType::kFloat32:
      return "float32";
    case OutputDType::kFloat16:
      return "float16";
    case OutputDType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

TEST_CASE("DoubleToHalf and DoubleToBFloat16 round to nearest, ties to even") {
  // Exact cases: halves of the last place go to the even neighbour.
  CHECK(DoubleToHalf(0.0) == 0x0000);
  CHECK(DoubleToHalf(-0.0) == 0x8000);
  CHECK(DoubleToHalf(1.0) == 0x3C00);
  CHECK(DoubleToHalf(1.0 + std::ldexp(1.0, -11)) == 0x3C00);      // tie -> even (down)
  CHECK(DoubleToHalf(1.0 + 3 * std::ldexp(1.0, -11)) == 0x3C02);  // tie -> even (up)
  CHECK(DoubleToHalf(65504.0) == 0x7BFF);
  CHECK(DoubleToHalf(65519.0) == 0x7BFF);
  CHECK(DoubleToHalf(65520.0) == 0x7C00);  // rounds to infinity
  CHECK(DoubleToHalf(-1e9) == 0xFC00);
  CHECK(DoubleToHalf(std::ldexp(1.0, -24)) == 0x0001);     // smallest subnormal
  CHECK(DoubleToHalf(std::ldexp(1.0, -25)) == 0x0000);     // tie -> even (0)
  CHECK(DoubleToHalf(std::ldexp(1.5, -24)) == 0x0002);     // tie -> even (2)
  CHECK(DoubleToHalf(std::ldexp(1023.5, -24)) == 0x0400);  // up to the smallest normal
  CHECK((DoubleToHalf(std::nan("")) & 0x7E00) == 0x7E00);
  CHECK(DoubleToBFloat16(1.0) == 0x3F80);
  CHECK(DoubleToBFloat16(1.0 + std::ldexp(1.0, -8)) == 0x3F80);      // tie -> even
  CHECK(DoubleToBFloat16(1.0 + 3 * std::ldexp(1.0, -8)) == 0x3F82);  // tie -> even
  CHECK(DoubleToBFloat16(-2.0) == 0xC000);
  CHECK(DoubleToBFloat16(1e39) == 0x7F80);
  CHECK(DoubleToBFloat16(std::ldexp(1.0, -133)) == 0x0001);  // smallest subnormal
  // Against the compiler's float16 and float's bits for bfloat16, over a sweep of values like
  // the ones the output pass makes (and far beyond).
  for (int i = -200000; i <= 200000; i += 7) {
    const double x = i * 0.000731 + (i % 13) * 1e-7;
    INFO("x = " << x);
#ifdef __FLT16_MAX__
    CHECK(HalfToDouble(DoubleToHalf(x)) == static_cast<double>(static_cast<_Float16>(x)));
#endif
    ImageOps ops;
    ops.dtype = OutputDType::kBFloat16;
    const double b = BFloat16ToDouble(DoubleToBFloat16(x));
    CHECK(std::abs(b - x) <= std::ldexp(std::abs(x), -8));
  }
}

// Decodes jpeg with `ops` in every dtype and layout, normalized or not, and checks every element
// against Expected() of the uint8 HWC decode of the same image (which the output pass must only
// convert, never resample differently).
void CheckOutputPass(const std::vector<uint8_t>& jpeg, const ImageOps& base, int ow, int oh) {
  ImageDecoder decoder;
  GuardedImage rgb(ow, oh);
  REQUIRE(decoder.DecodeRgbInto(jpeg, base, rgb.data(), ow, oh, rgb.stride).ok());
  for (OutputDType dtype :
       {OutputDType::kUInt8, OutputDType::kFloat32, OutputDType::kFloat16, OutputDType::kBFloat16}) {
    for (OutputLayout layout : {OutputLayout::kNHWC, OutputLayout::kNCHW}) {
      for (bool normalize : {false, true}) {
        if (dtype == OutputDType::kUInt8 && normalize) continue;
        INFO(DTypeName(dtype) << (layout == OutputLayout::kNCHW ? " NCHW" : " NHWC")
                              << (normalize ? " normalized" : ""));
        ImageOps ops = base;
        ops.dtype = dtype;
        ops.layout = layout;
        ops.normalize = normalize;
        ops.mean = {0.485, 0.456, 0.406};
        ops.stddev = {0.229, 0.224, 0.225};
        const size_t bytes = OutputImageBytes(ops, ow, oh);
        REQUIRE(bytes == static_cast<size_t>(ow) * oh * 3 * DTypeSize(dtype));
        std::vector<uint8_t> out(bytes + 64, 0xA5);
        REQUIRE(decoder.DecodeInto(jpeg, ops, out.data(), ow, oh).ok());
        CHECK(std::all_of(out.begin() + bytes, out.end(), [](uint8_t b) { return b == 0xA5; }));
        int bad = 0;
        for (int y = 0; y < oh; ++y) {
          for (int x = 0; x < ow; ++x) {
            for (int c = 0; c < 3; ++c) {
              const double got = Element(out.data(), dtype, ElementIndex(layout, ow, oh, x, y, c));
              if (got != Expected(ops, c, rgb.at(x, y, c)) && ++bad < 5) {
                INFO("at " << x << "," << y << "," << c << " v " << int(rgb.at(x, y, c)));
                CHECK(got == Expected(ops, c, rgb.at(x, y, c)));
              }
            }
          }
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("Output dtypes and layouts hold exactly the converted uint8 pixels") {
  CheckOutputPass(MakeJpeg(500, 375), ResizeCrop(256, 224), 224, 224);
  // Padding (a crop larger than the image): padded elements hold the normalized value of 0.
  CheckOutputPass(MakeJpeg(100, 80), ResizeCrop(0, 121), 121, 121);
  CheckOutputPass(MakeJpeg(333, 517), ResizeCrop(64, 0), 64, 99);  // not square
}

TEST_CASE("Output ops are validated") {
  ImageOps ops = ResizeCrop(256, 224);
  ops.normalize = true;
  Status s = ValidateImageOps(ops);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("normalize needs a floating-point output dtype"));
  ImageDecoder decoder;
  std::vector<uint8_t> out(224 * 224 * 3);
  CHECK(decoder.DecodeInto(MakeJpeg(500, 375), ops, out.data(), 224, 224).code() == StatusCode::kInvalidArgument);
  ops.dtype = OutputDType::kFloat32;
  ops.stddev = {1, 0, 1};
  CHECK_THAT(ValidateImageOps(ops).message(), Catch::Contains("stddev non-zero"));
  // The strided call writes uint8 NHWC only.
  ops.stddev = {1, 1, 1};
  CHECK(decoder.DecodeRgbInto(MakeJpeg(500, 375), ops, out.data(), 224, 224, 224 * 3).code() ==
        StatusCode::kInvalidArgument);
}

// ---- random transforms ----

TEST_CASE("SampleSeed and SampleRng are pure functions of their inputs") {
  CHECK(SampleSeed(1, 2, 3) == SampleSeed(1, 2, 3));
  std::set<uint64_t> seeds;
  for (uint64_t job : {0, 1}) {
    for (uint64_t epoch : {0, 1, 2}) {
      for (uint64_t index = 0; index < 100; ++index) seeds.insert(SampleSeed(job, epoch, index));
    }
  }
  CHECK(seeds.size() == 600);
  SampleRng a(42, RandomStream::kResizedCrop), b(42, RandomStream::kResizedCrop);
  SampleRng other_stream(42, RandomStream::kFlip);
  int differ = 0;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Next();
    CHECK(x == b.Next());
    differ += x != other_stream.Next();
  }
  CHECK(differ == 100);
  // Uniform in range, both ends of an integer range reached.
  SampleRng r(7, RandomStream::kResizedCrop);
  int lo = 0, hi = 0;
  double sum = 0;
  for (int i = 0; i < 20000; ++i) {
    const double u = r.Uniform(2.0, 3.0);
    REQUIRE((u >= 2.0 && u < 3.0));
    sum += u;
    const int64_t k = r.UniformInt(5, 9);
    REQUIRE((k >= 5 && k <= 9));
    lo += k == 5;
    hi += k == 9;
  }
  CHECK(std::abs(sum / 20000 - 2.5) < 0.01);
  CHECK((lo > 3500 && hi > 3500));
}

// torchvision's RandomResizedCrop.get_params, transcribed from torchvision/transforms/transforms.py
// with its torch.empty().uniform_() / torch.randint draws replaced by the same SampleRng calls in
// the same order (scale, log-ratio; then top, left).
CropRect TorchvisionGetParams(int width, int height, std::array<double, 2> scale, std::array<double, 2> ratio,
                              SampleRng& rng) {
  const double area = static_cast<double>(height) * width;
  const double log_ratio[2] = {std::log(ratio[0]), std::log(ratio[1])};
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(scale[0], scale[1]);
    const double aspect_ratio = std::exp(rng.Uniform(log_ratio[0], log_ratio[1]));
    const int w = static_cast<int>(std::nearbyint(std::sqrt(target_area * aspect_ratio)));
    const int h = static_cast<int>(std::nearbyint(std::sqrt(target_area / aspect_ratio)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int i = static_cast<int>(rng.UniformInt(0, height - h));
      const int j = static_cast<int>(rng.UniformInt(0, width - w));
      return {j, i, w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w, h;
  if (in_ratio < std::min(ratio[0], ratio[1])) {
    w = width;
    h = static_cast<int>(std::nearbyint(w / std::min(ratio[0], ratio[1])));
  } else if (in_ratio > std::max(ratio[0], ratio[1])) {
    h = height;
    w = static_cast<int>(std::nearbyint(h * std::max(ratio[0], ratio[1])));
  } else {
    w = width;
    h = height;
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

ImageOps RandomCrop(int size, std::array<double, 2> scale = {0.08, 1.0},
                    std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0}) {
  ImageOps ops;
  ops.random_crop_height = ops.random_crop_width = size;
  ops.random_crop_scale = scale;
  ops.random_crop_ratio = ratio;
  return ops;
}

TEST_CASE("PlanRandomResizedCrop follows torchvision's get_params") {
  for (auto [w, h] : {std::pair{500, 375}, {375, 500}, {64, 48}, {2000, 300}, {1, 1}, {3, 200}}) {
    INFO("image " << w << "x" << h);
    const ImageOps ops = RandomCrop(224);
    std::set<std::pair<int, int>> origins;
    for (uint64_t seed = 0; seed < 500; ++seed) {
      SampleRng a(seed, RandomStream::kResizedCrop), b(seed, RandomStream::kResizedCrop);
      const CropRect r = PlanRandomResizedCrop(ops, w, h, a);
      const CropRect t = TorchvisionGetParams(w, h, ops.random_crop_scale, ops.random_crop_ratio, b);
      REQUIRE(r == t);
      REQUIRE((r.x >= 0 && r.y >= 0 && r.width >= 1 && r.height >= 1));
      REQUIRE((r.x + r.width <= w && r.y + r.height <= h));
      origins.insert({r.x, r.y});
    }
    if (w >= 64 && h >= 48) CHECK(origins.size() > 100);  // the crops move about
  }
  // Every attempt fails: the central fallback, clamped to the ratio range.
  SampleRng rng(1, RandomStream::kResizedCrop);
  CHECK(PlanRandomResizedCrop(RandomCrop(224, {0.99, 1.0}, {2.0, 3.0}), 500, 375, rng) == CropRect{0, 62, 500, 250});
  CHECK(PlanRandomResizedCrop(RandomCrop(224, {0.99, 1.0}, {0.1, 0.2}), 500, 375, rng) == CropRect{212, 0, 75, 375});
  CHECK(PlanRandomResizedCrop(RandomCrop(224, {1.0, 1.0}, {1.0, 1.0}), 500, 500, rng) == CropRect{0, 0, 500, 500});
}

TEST_CASE("A random resized crop matches the analytic pattern and the reference path") {
  const int w = 640, h = 480;
  const std::vector<uint8_t> jpeg = MakeJpeg(w, h);
  int dct_scaled = 0;
  for (uint64_t seed = 0; seed < 24; ++seed) {
    INFO("seed " << seed);
    for (int variant = 0; variant < 3; ++variant) {  // exact, fast yuv, fast rgb
      const JpegDecodePath path = variant == 2 ? JpegDecodePath::kRgb : JpegDecodePath::kYuvPlanes;
      const ImageOps ops = variant == 0 ? RandomCrop(160) : Fast(RandomCrop(160));
      INFO((variant == 0 ? "exact" : "fast ") << PathName(path));
      ImageDecoder decoder(path);
      GuardedImage out(160, 160), ref(160, 160);
      ImageInfo info, ref_info;
      REQUIRE(decoder.DecodeRgbInto(jpeg, ops, out.data(), 160, 160, out.stride, seed, &info).ok());
      REQUIRE(decoder.ReferenceDecodeInto(jpeg, ops, ref.data(), 160, 160, ref.stride, seed, &ref_info).ok());
      CHECK(out.GuardsIntact());
      SampleRng rng(seed, RandomStream::kResizedCrop);
      CHECK(info.crop == PlanRandomResizedCrop(ops, w, h, rng));
      CHECK(ref_info.crop == info.crop);
      dct_scaled += info.dct_scale > 1;
      // Output pixel (x, y) shows the crop's point at (x + 0.5) / 160 of its size.
      const CropRect& r = info.crop;
      std::vector<double> errors;
      for (int y = 0; y < 160; ++y) {
        for (int x = 0; x < 160; ++x) {
          const double u = (r.x + (x + 0.5) * r.width / 160.0) / w;
          const double v = (r.y + (y + 0.5) * r.height / 160.0) / h;
          for (int c = 0; c < 3; ++c) errors.push_back(std::abs(out.at(x, y, c) - Pattern(c, u, v)));
        }
      }
      const ErrorStats a = Stats(errors);
      const ErrorStats vs_ref = VsImage(out, ref);
      INFO("crop " << r.x << "," << r.y << " " << r.width << "x" << r.height << " dct 1/" << info.dct_scale);
      INFO("vs analytic: mean " << a.mean << " p99 " << a.p99);
      INFO("vs reference: mean " << vs_ref.mean << " p99 " << vs_ref.p99);
      CHECK(a.mean <= kMaxMeanAbsVsAnalytic);
      CHECK(a.p99 <= kMaxP99VsAnalytic);
      CHECK(vs_ref.mean <= kMaxMeanAbsVsReference);
      CHECK(vs_ref.p99 <= kMaxP99VsReference);
    }
  }
  CHECK(dct_scaled > 0);  // big crops of a 640x480 image go through DCT scaling (fast path)
}

// out mirrored left-right equals ref, element for element (any dtype, either layout).
bool Mirrored(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, const ImageOps& ops, int w, int h) {
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        if (Element(a.data(), ops.dtype, ElementIndex(ops.layout, w, h, x, y, c)) !=
            Element(b.data(), ops.dtype, ElementIndex(ops.layout, w, h, w - 1 - x, y, c))) {
          return false;
        }
      }
    }
  }
  return true;
}

TEST_CASE("The horizontal flip mirrors the whole output, padding included") {
  struct Case {
    int w, h;
    ImageOps ops;
    int ow, oh;
  };
  ImageOps float_nchw = ResizeCrop(0, 121);
  float_nchw.dtype = OutputDType::kFloat32;
  float_nchw.layout = OutputLayout::kNCHW;
  float_nchw.normalize = true;
  float_nchw.mean = {0.5, 0.4, 0.3};
  ImageOps random = RandomCrop(96);
  random.dtype = OutputDType::kBFloat16;
  for (const Case& k : {Case{500, 375, ResizeCrop(256, 224), 224, 224},
                        Case{100, 80, ResizeCrop(0, 121), 121, 121},  // 10 columns padded left, 11 right
                        Case{100, 80, float_nchw, 121, 121}, Case{300, 200, random, 96, 96}}) {
    INFO("case " << k.w << "x" << k.h << " -> " << k.ow << "x" << k.oh << " " << DTypeName(k.ops.dtype));
    const std::vector<uint8_t> jpeg = MakeJpeg(k.w, k.h);
    ImageDecoder decoder;
    ImageOps plain = k.ops, flipped = k.ops;
    plain.flip_probability = 0;
    flipped.flip_probability = 1;
    const size_t bytes = OutputImageBytes(k.ops, k.ow, k.oh);
    std::vector<uint8_t> a(bytes), b(bytes);
    ImageInfo ia, ib;
    REQUIRE(decoder.DecodeInto(jpeg, plain, a.data(), k.ow, k.oh, 5, &ia).ok());
    REQUIRE(decoder.DecodeInto(jpeg, flipped, b.data(), k.ow, k.oh, 5, &ib).ok());
    CHECK_FALSE(ia.flipped);
    CHECK(ib.flipped);
    CHECK(ia.crop == ib.crop);  // the flip draws from its own stream
    CHECK(Mirrored(a, b, k.ops, k.ow, k.oh));
    CHECK(a != b);
  }
  // p = 0.5: about half; the pixels agree with what info says.
  const std::vector<uint8_t> jpeg = MakeJpeg(200, 150);
  ImageOps half = ResizeCrop(64, 64);
  half.flip_probability = 0;
  std::vector<uint8_t> plain(64 * 64 * 3), out(64 * 64 * 3);
  ImageDecoder decoder;
  REQUIRE(decoder.DecodeInto(jpeg, half, plain.data(), 64, 64).ok());
  half.flip_probability = 0.5;
  int flips = 0;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    ImageInfo info;
    REQUIRE(decoder.DecodeInto(jpeg, half, out.data(), 64, 64, SampleSeed(3, 0, seed), &info).ok());
    flips += info.flipped;
    CHECK((info.flipped ? Mirrored(out, plain, half, 64, 64) : out == plain));
  }
  CHECK((flips > 70 && flips < 130));
}

TEST_CASE("Random transforms repeat for a seed and change with it") {
  const std::vector<uint8_t> jpeg = MakeJpeg(400, 300);
  ImageOps ops = RandomCrop(64);
  ops.flip_probability = 0.5;
  ops.dtype = OutputDType::kFloat16;
  ops.layout = OutputLayout::kNCHW;
  const size_t bytes = OutputImageBytes(ops, 64, 64);
  // Distinct outputs by ==, not a std::set: its ordering (vector <=>) is a false -Wstringop-overread
  // of gcc 12 at -O3.
  std::vector<std::vector<uint8_t>> distinct;
  for (uint64_t epoch = 0; epoch < 4; ++epoch) {
    std::vector<uint8_t> a(bytes), b(bytes);
    ImageDecoder one, two;
    const uint64_t seed = SampleSeed(11, epoch, 7);
    REQUIRE(one.DecodeInto(jpeg, ops, a.data(), 64, 64, seed).ok());
    // A decoder that has seen other images and sizes gives the same bytes.
    std::vector<uint8_t> other(OutputImageBytes(ops, 64, 64));
    REQUIRE(two.DecodeInto(MakeJpeg(90, 700), ops, other.data(), 64, 64, seed + 1).ok());
    REQUIRE(two.DecodeInto(jpeg, ops, b.data(), 64, 64, seed).ok());
    CHECK(a == b);
    if (std::find(distinct.begin(), distinct.end(), a) == distinct.end()) distinct.push_back(a);
  }
  CHECK(distinct.size() == 4);
}

// ---- one conformance suite for every decoder: JPEG (libjpeg-turbo) and the FFmpeg formats ----
//
// Each case is a real file encoded here (libjpeg-turbo for JPEG, FFmpeg's encoders for the rest)
// from a known source image, and every case goes through the same checks: format detection and
// header size, an identity decode against the source samples, resize + crop against the analytic
// pattern and the reference path, a random crop + flip into float NCHW against the reference
// path, truncation and corruption, and the pixel-count guard.

// 16-bit version of the pattern (the same function at 16-bit precision).
std::vector<uint8_t> MakePattern16(int w, int h, int channels) {
  std::vector<uint8_t> out(static_cast<size_t>(w) * h * channels * 2);
  auto* px = reinterpret_cast<uint16_t*>(out.data());
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < channels; ++c) {
        const double v = channels == 1 ? 0.299 * Pattern(0, (x + 0.5) / w, (y + 0.5) / h) +
                                             0.587 * Pattern(1, (x + 0.5) / w, (y + 0.5) / h) +
                                             0.114 * Pattern(2, (x + 0.5) / w, (y + 0.5) / h)
                                       : Pattern(c, (x + 0.5) / w, (y + 0.5) / h);
        px[(static_cast<size_t>(y) * w + x) * channels + c] =
            static_cast<uint16_t>(std::clamp(std::lround(v * 257), 0L, 65535L));
      }
    }
  }
  return out;
}

// An alpha ramp across the image (0 at the left, 255 at the right).
uint8_t AlphaAt(int x, int w) { return static_cast<uint8_t>(x * 255 / std::max(w - 1, 1)); }

// The 8-bit RGB a decoder must give for `raw` at identity (alpha dropped, or composited over bg).
std::vector<uint8_t> ExpectedRgb(const RawImage& raw, bool composite, std::array<uint8_t, 3> bg) {
  const size_t n = static_cast<size_t>(raw.width) * raw.height;
  std::vector<uint8_t> rgb(n * 3);
  const auto* u16 = reinterpret_cast<const uint16_t*>(raw.data.data());
  for (size_t i = 0; i < n; ++i) {
    int r = 0, g = 0, b = 0, a = 255;
    switch (raw.pixels) {
      case RawPixels::kRgb24:
        r = raw.data[3 * i], g = raw.data[3 * i + 1], b = raw.data[3 * i + 2];
        break;
      case RawPixels::kRgba:
        r = raw.data[4 * i], g = raw.data[4 * i + 1], b = raw.data[4 * i + 2], a = raw.data[4 * i + 3];
        break;
      case RawPixels::kGray8:
        r = g = b = raw.data[i];
        break;
      case RawPixels::kGrayAlpha8:
        r = g = b = raw.data[2 * i], a = raw.data[2 * i + 1];
        break;
      case RawPixels::kRgb48:
        r = (u16[3 * i] + 128) / 257, g = (u16[3 * i + 1] + 128) / 257, b = (u16[3 * i + 2] + 128) / 257;
        break;
      case RawPixels::kRgba64:
        r = (u16[4 * i] + 128) / 257, g = (u16[4 * i + 1] + 128) / 257, b = (u16[4 * i + 2] + 128) / 257;
        a = (u16[4 * i + 3] + 128) / 257;
        break;
      case RawPixels::kGray16:
        r = g = b = (u16[i] + 128) / 257;
        break;
      case RawPixels::kPal8: {
        const uint32_t e = raw.palette[raw.data[i]];
        r = (e >> 16) & 0xFF, g = (e >> 8) & 0xFF, b = e & 0xFF, a = e >> 24;
        break;
      }
    }
    const int v[3] = {r, g, b};
    for (int c = 0; c < 3; ++c) {
      rgb[3 * i + c] = static_cast<uint8_t>(composite ? (a * v[c] + (255 - a) * bg[c] + 127) / 255 : v[c]);
    }
  }
  return rgb;
}

RawImage MakeRaw(RawPixels kind, int w, int h) {
  RawImage raw;
  raw.pixels = kind;
  raw.width = w;
  raw.height = h;
  const std::vector<uint8_t> rgb = MakePattern(w, h);
  const size_t n = static_cast<size_t>(w) * h;
  auto gray = [&](size_t i) {
    return static_cast<uint8_t>(std::lround(0.299 * rgb[3 * i] + 0.587 * rgb[3 * i + 1] + 0.114 * rgb[3 * i + 2]));
  };
  switch (kind) {
    case RawPixels::kRgb24:
      raw.data = rgb;
      break;
    case RawPixels::kRgba:
      for (size_t i = 0; i < n; ++i) {
        raw.data.insert(raw.data.end(),
                        {rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], AlphaAt(static_cast<int>(i % w), w)});
      }
      break;
    case RawPixels::kGray8:
      for (size_t i = 0; i < n; ++i) raw.data.push_back(gray(i));
      break;
    case RawPixels::kGrayAlpha8:
      for (size_t i = 0; i < n; ++i) raw.data.insert(raw.data.end(), {gray(i), AlphaAt(static_cast<int>(i % w), w)});
      break;
    case RawPixels::kRgb48:
      raw.data = MakePattern16(w, h, 3);
      break;
    case RawPixels::kGray16:
      raw.data = MakePattern16(w, h, 1);
      break;
    case RawPixels::kRgba64: {
      const std::vector<uint8_t> p = MakePattern16(w, h, 3);
      const auto* s = reinterpret_cast<const uint16_t*>(p.data());
      raw.data.resize(n * 8);
      auto* d = reinterpret_cast<uint16_t*>(raw.data.data());
      for (size_t i = 0; i < n; ++i) {
        d[4 * i] = s[3 * i], d[4 * i + 1] = s[3 * i + 1], d[4 * i + 2] = s[3 * i + 2];
        d[4 * i + 3] = static_cast<uint16_t>(AlphaAt(static_cast<int>(i % w), w) * 257);
      }
      break;
    }
    case RawPixels::kPal8: {
      // A 6 x 7 x 6 colour cube (252 entries): the pattern quantised to its nearest entry.
      for (int r = 0; r < 6; ++r) {
        for (int g = 0; g < 7; ++g) {
          for (int b = 0; b < 6; ++b) {
            raw.palette.push_back(0xFF000000u | (uint32_t(r * 51) << 16) | (uint32_t(g * 255 / 6) << 8) |
                                  uint32_t(b * 51));
          }
        }
      }
      for (size_t i = 0; i < n; ++i) {
        const int r = (rgb[3 * i] * 5 + 127) / 255, g = (rgb[3 * i + 1] * 6 + 127) / 255,
                  b = (rgb[3 * i + 2] * 5 + 127) / 255;
        raw.data.push_back(static_cast<uint8_t>((r * 7 + g) * 6 + b));
      }
      break;
    }
  }
  return raw;
}

struct FormatCase {
  std::string name;
  ImageFormat format;
  RawPixels pixels;
  EncodeOptions options;
  // Identity decode against the source samples (8-bit): the largest and the mean absolute error.
  int max_identity_error;
  double mean_identity_error;
  // The source is the analytic pattern (false: quantised to a palette, or gray).
  bool analytic;
  AlphaMode alpha = AlphaMode::kDrop;
  // Added to the budget against the reference path. JPEG: the fast path decodes YUV planes,
  // DCT-scaled, where the reference decodes RGB at full size (measured worst here 1.14 mean,
  // 4 p99, for a 96x96 random crop of a 320x240 image). Palette images: their colours step by up
  // to 51 levels from pixel to pixel, and the fast path's source window, rounded to whole
  // pixels, sits up to half a source pixel off the reference's whole-image resize (measured
  // worst 0.23 mean, 7 p99); smooth images hide the same offset.
  double reference_mean_slack = 0;
  double reference_p99_slack = 0;
};

// Tolerances, per format. Lossless formats decode exactly (16-bit sources: within one level of
// the 8-bit rounding, swscale's 16 -> 8 conversion); lossy ones within their codec's error on
// this smooth pattern: JPEG at quality 95 (4:2:0), WebP at quality 90 (4:2:0, limited-range
// BT.601, its own RGB -> YUV conversion). Resized output is held to the JPEG error budget
// against the analytic pattern (plus the codec's own mean error for lossy formats) and to the
// reference budget against the reference path.
std::vector<FormatCase> FormatCases() {
  EncodeOptions q95;
  q95.quality = 95;
  EncodeOptions lossless;
  lossless.lossless = true;
  return {
      {"JPEG 4:2:0 q95", ImageFormat::kJpeg, RawPixels::kRgb24, q95, 12, 1.5, true, AlphaMode::kDrop, 0.6, 1.5},
      {"JPEG gray", ImageFormat::kJpeg, RawPixels::kGray8, q95, 3, 0.5, false, AlphaMode::kDrop, 0.6, 1.5},
      {"PNG RGB", ImageFormat::kPng, RawPixels::kRgb24, {}, 0, 0, true},
      {"PNG RGBA, alpha dropped", ImageFormat::kPng, RawPixels::kRgba, {}, 0, 0, true},
      {"PNG RGBA, composited", ImageFormat::kPng, RawPixels::kRgba, {}, 1, 0.01, false, AlphaMode::kComposite},
      {"PNG gray", ImageFormat::kPng, RawPixels::kGray8, {}, 0, 0, false},
      {"PNG gray + alpha", ImageFormat::kPng, RawPixels::kGrayAlpha8, {}, 0, 0, false},
      {"PNG 16-bit RGB", ImageFormat::kPng, RawPixels::kRgb48, {}, 1, 0.6, true},
      {"PNG 16-bit RGBA, composited", ImageFormat::kPng, RawPixels::kRgba64, {}, 2, 0.5, false, AlphaMode::kComposite},
      {"PNG 16-bit gray", ImageFormat::kPng, RawPixels::kGray16, {}, 1, 0.6, false},
      {"PNG palette", ImageFormat::kPng, RawPixels::kPal8, {}, 0, 0, false, AlphaMode::kDrop, 0, 4},
      {"WebP lossless", ImageFormat::kWebp, RawPixels::kRgb24, lossless, 0, 0, true},
      {"WebP lossy q90", ImageFormat::kWebp, RawPixels::kRgb24, {}, 24, 2.0, true},
      {"WebP lossy RGBA, alpha dropped", ImageFormat::kWebp, RawPixels::kRgba, {}, 24, 2.0, true},
      {"BMP RGB", ImageFormat::kBmp, RawPixels::kRgb24, {}, 0, 0, true},
      {"BMP palette", ImageFormat::kBmp, RawPixels::kPal8, {}, 0, 0, false, AlphaMode::kDrop, 0, 4},
      {"TIFF RGB", ImageFormat::kTiff, RawPixels::kRgb24, {}, 0, 0, true},
      {"TIFF RGBA, composited", ImageFormat::kTiff, RawPixels::kRgba, {}, 1, 0.01, false, AlphaMode::kComposite},
      {"TIFF 16-bit RGB", ImageFormat::kTiff, RawPixels::kRgb48, {}, 1, 0.6, true},
      {"TIFF gray", ImageFormat::kTiff, RawPixels::kGray8, {}, 0, 0, false},
      {"GIF palette", ImageFormat::kGif, RawPixels::kPal8, {}, 0, 0, false, AlphaMode::kDrop, 0, 4},
      {"GIF gray", ImageFormat::kGif, RawPixels::kGray8, {}, 0, 0, false},
  };
}

constexpr std::array<uint8_t, 3> kBackground = {40, 200, 90};

// Encodes a case's source at w x h; empty (with a warning) when this FFmpeg has no encoder.
std::vector<uint8_t> EncodeCase(const FormatCase& fc, const RawImage& raw) {
  Result<std::vector<uint8_t>> bytes = EncodeImage(fc.format, raw, fc.options);
  if (!bytes.ok() && bytes.status().code() == StatusCode::kFailedPrecondition) {
    SPDL_SKIP_PART(fc.name << ": " << bytes.status().message());
    return {};
  }
  INFO(fc.name << ": " << bytes.status().ToString());
  REQUIRE(bytes.ok());
  return std::move(bytes).value();
}

ImageOps WithAlpha(ImageOps ops, const FormatCase& fc) {
  ops.alpha = fc.alpha;
  ops.background = kBackground;
  return ops;
}

TEST_CASE("Conformance: every format is detected, sized and decoded exactly at identity") {
  const int w = 123, h = 77;  // odd sizes: odd chroma planes, BMP row padding
  for (const FormatCase& fc : FormatCases()) {
    INFO(fc.name);
    const RawImage raw = MakeRaw(fc.pixels, w, h);
    const std::vector<uint8_t> file = EncodeCase(fc, raw);
    if (file.empty()) continue;
    CHECK(SniffImageFormat(file) == fc.format);
    if (fc.format != ImageFormat::kJpeg) {
      int fw = 0, fh = 0;
      REQUIRE(ReadImageSize(fc.format, file, &fw, &fh).ok());
      CHECK((fw == w && fh == h));
    }
    const ImageOps ops = WithAlpha(ImageOps{}, fc);
    GuardedImage out(w, h);
    ImageInfo info;
    ImageDecoder decoder;
    const Status s = decoder.DecodeRgbInto(file, ops, out.data(), w, h, out.stride, 0, &info);
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(info.format == fc.format);
    CHECK((info.width == w && info.height == h));
    CHECK(out.GuardsIntact());
    std::vector<uint8_t> want = ExpectedRgb(raw, fc.alpha == AlphaMode::kComposite, kBackground);
    if (fc.format == ImageFormat::kJpeg && fc.pixels == RawPixels::kGray8) {
      // A gray JPEG stores the gray values: the same expectation.
    }
    std::vector<double> errors;
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int c = 0; c < 3; ++c) {
          errors.push_back(std::abs(out.at(x, y, c) - want[(static_cast<size_t>(y) * w + x) * 3 + c]));
        }
      }
    }
    const ErrorStats e = Stats(errors);
    double bias = 0;
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        for (int c = 0; c < 3; ++c) bias += out.at(x, y, c) - want[(static_cast<size_t>(y) * w + x) * 3 + c];
      }
    }
    bias /= 3.0 * w * h;
    INFO("identity vs source: mean " << e.mean << " max " << e.max << " bias " << bias);
    CHECK(e.max <= fc.max_identity_error);
    CHECK(e.mean <= fc.mean_identity_error);
    // The reference path decodes the same pixels at identity.
    GuardedImage ref(w, h);
    REQUIRE(decoder.ReferenceDecodeInto(file, ops, ref.data(), w, h, ref.stride).ok());
    if (fc.format != ImageFormat::kJpeg) CHECK(SamePixels(out, ref));
  }
}

TEST_CASE("Conformance: resize + crop and random crop + flip, against the pattern and the reference") {
  const int w = 320, h = 240;
  for (const FormatCase& fc : FormatCases()) {
    INFO(fc.name);
    const RawImage raw = MakeRaw(fc.pixels, w, h);
    const std::vector<uint8_t> file = EncodeCase(fc, raw);
    if (file.empty()) continue;
    ImageDecoder decoder;
    // Resize 256 + center crop 224; and an exact size with an odd window and padding.
    for (const ImageOps& geometry : {ResizeCrop(256, 224), ResizeCrop(113, 127)}) {
      const ImageOps ops = WithAlpha(geometry, fc);
      int ow, oh;
      OutputSize(ops, w, h, &ow, &oh);
      INFO("output " << ow << "x" << oh);
      GuardedImage out(ow, oh), ref(ow, oh);
      REQUIRE(decoder.DecodeRgbInto(file, ops, out.data(), ow, oh, out.stride).ok());
      REQUIRE(decoder.ReferenceDecodeInto(file, ops, ref.data(), ow, oh, ref.stride).ok());
      CHECK(out.GuardsIntact());
      const ErrorStats r = VsImage(out, ref);
      INFO("vs reference: mean " << r.mean << " p99 " << r.p99);
      CHECK(r.mean <= kMaxMeanAbsVsReference + fc.reference_mean_slack);
      CHECK(r.p99 <= kMaxP99VsReference + fc.reference_p99_slack);
      if (fc.analytic && fc.alpha == AlphaMode::kDrop) {
        const ErrorStats a = VsAnalytic(out, TorchvisionGeometry(w, h, geometry.resize_shorter, geometry.crop_width));
        INFO("vs analytic: mean " << a.mean << " p99 " << a.p99);
        CHECK(a.mean <= kMaxMeanAbsVsAnalytic + fc.mean_identity_error);
        CHECK(a.p99 <= kMaxP99VsAnalytic + fc.max_identity_error / 2.0);
      }
    }
    // Random resized crop + flip into normalized float NCHW, against the reference path's uint8.
    ImageOps rnd = WithAlpha(RandomCrop(96), fc);
    rnd.flip_probability = 0.5;
    ImageOps f32 = rnd;
    f32.dtype = OutputDType::kFloat32;
    f32.layout = OutputLayout::kNCHW;
    f32.normalize = true;
    f32.mean = {0.485, 0.456, 0.406};
    f32.stddev = {0.229, 0.224, 0.225};
    for (uint64_t seed : {1, 2, 3}) {
      INFO("seed " << seed);
      GuardedImage ref(96, 96);
      REQUIRE(decoder.ReferenceDecodeInto(file, rnd, ref.data(), 96, 96, ref.stride, seed).ok());
      std::vector<uint8_t> out(OutputImageBytes(f32, 96, 96));
      REQUIRE(decoder.DecodeInto(file, f32, out.data(), 96, 96, seed).ok());
      std::vector<double> errors;  // in 8-bit levels
      for (int y = 0; y < 96; ++y) {
        for (int x = 0; x < 96; ++x) {
          for (int c = 0; c < 3; ++c) {
            const double v =
                Element(out.data(), OutputDType::kFloat32, ElementIndex(OutputLayout::kNCHW, 96, 96, x, y, c));
            const double level = (v * f32.stddev[c] + f32.mean[c]) * 255;
            errors.push_back(std::abs(level - ref.at(x, y, c)));
          }
        }
      }
      const ErrorStats e = Stats(errors);
      INFO("float NCHW vs reference uint8: mean " << e.mean << " p99 " << e.p99);
      CHECK(e.mean <= kMaxMeanAbsVsReference + fc.reference_mean_slack);
      CHECK(e.p99 <= kMaxP99VsReference + fc.reference_p99_slack + 1e-4);
    }
  }
}

// PIL's convert("L"): ITU-R 601 luma with 16-bit fixed-point weights, rounded.
uint8_t PilLuma(int r, int g, int b) { return static_cast<uint8_t>((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16); }

TEST_CASE("Conformance: gray output is one channel, the luma of every format") {
  const int w = 123, h = 77;
  for (const FormatCase& fc : FormatCases()) {
    INFO(fc.name);
    const RawImage raw = MakeRaw(fc.pixels, w, h);
    const std::vector<uint8_t> file = EncodeCase(fc, raw);
    if (file.empty()) continue;
    ImageOps ops = WithAlpha(ImageOps{}, fc);
    ops.channels = 1;
    std::vector<uint8_t> out(OutputImageBytes(ops, w, h) + 16, 0xA5);
    REQUIRE(out.size() == static_cast<size_t>(w) * h + 16);
    ImageDecoder decoder;
    const Status s = decoder.DecodeInto(file, ops, out.data(), w, h);
    INFO(s.ToString());
    REQUIRE(s.ok());
    CHECK(std::all_of(out.end() - 16, out.end(), [](uint8_t v) { return v == 0xA5; }));  // nothing past the image
    // Against PIL's luma of the RGB the decoder must give: the lossless formats' luma is rounded
    // once on each side (1 level); lossy formats add their codec's error, which the luma averages.
    const std::vector<uint8_t> rgb = ExpectedRgb(raw, fc.alpha == AlphaMode::kComposite, kBackground);
    std::vector<double> errors;
    errors.reserve(static_cast<size_t>(w) * h);
    for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
      errors.push_back(std::abs(out[i] - PilLuma(rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2])));
    }
    const ErrorStats e = Stats(errors);
    INFO("gray vs luma of the source: mean " << e.mean << " max " << e.max);
    CHECK(e.max <= fc.max_identity_error + 1);
    CHECK(e.mean <= fc.mean_identity_error + 0.5);

    // The same geometry as RGB, in float NCHW with one normalize value: the luma of the RGB
    // output within resampling error.
    ImageOps rgb_ops = WithAlpha(ResizeCrop(113, 97), fc);
    ImageOps gray_ops = rgb_ops;
    gray_ops.channels = 1;
    gray_ops.dtype = OutputDType::kFloat32;
    gray_ops.layout = OutputLayout::kNCHW;
    gray_ops.normalize = true;
    gray_ops.mean = {0.5, 0.5, 0.5};
    gray_ops.stddev = {0.25, 0.25, 0.25};
    GuardedImage ref(97, 97);
    REQUIRE(decoder.DecodeRgbInto(file, rgb_ops, ref.data(), 97, 97, ref.stride).ok());
    std::vector<uint8_t> g(OutputImageBytes(gray_ops, 97, 97));
    REQUIRE(g.size() == 97u * 97 * 4);
    REQUIRE(decoder.DecodeInto(file, gray_ops, g.data(), 97, 97).ok());
    errors.clear();
    for (int y = 0; y < 97; ++y) {
      for (int x = 0; x < 97; ++x) {
        const double v = Element(g.data(), OutputDType::kFloat32, static_cast<size_t>(y) * 97 + x);
        errors.push_back(std::abs((v * 0.25 + 0.5) * 255 - PilLuma(ref.at(x, y, 0), ref.at(x, y, 1), ref.at(x, y, 2))));
      }
    }
    const ErrorStats r = Stats(errors);
    INFO("resized gray vs luma of resized RGB: mean " << r.mean << " p99 " << r.p99);
    CHECK(r.mean <= 1.0 + fc.reference_mean_slack);
    CHECK(r.p99 <= 3.0 + fc.reference_p99_slack);
  }
}

TEST_CASE("Conformance: 16-bit sources keep 16 bits in floating-point output") {
  const int w = 61, h = 43;
  for (const FormatCase& fc : FormatCases()) {
    if (fc.pixels != RawPixels::kRgb48 && fc.pixels != RawPixels::kGray16) continue;
    INFO(fc.name);
    const RawImage raw = MakeRaw(fc.pixels, w, h);
    const std::vector<uint8_t> file = EncodeCase(fc, raw);
    if (file.empty()) continue;
    const int src_channels = fc.pixels == RawPixels::kGray16 ? 1 : 3;
    const auto* src = reinterpret_cast<const uint16_t*>(raw.data.data());
    for (int channels : {3, 1}) {
      if (channels == 1 && src_channels == 3) continue;  // gray of RGB is a luma, checked above
      INFO("channels " << channels);
      for (OutputLayout layout : {OutputLayout::kNHWC, OutputLayout::kNCHW}) {
        ImageOps ops;
        ops.channels = channels;
        ops.dtype = OutputDType::kFloat32;
        ops.layout = layout;
        std::vector<uint8_t> out(OutputImageBytes(ops, w, h));
        ImageDecoder decoder;
        ImageInfo info;
        REQUIRE(decoder.DecodeInto(file, ops, out.data(), w, h, 0, &info).ok());
        CHECK(info.sample_bits == 16);
        int wrong = 0;
        for (int y = 0; y < h; ++y) {
          for (int x = 0; x < w; ++x) {
            for (int c = 0; c < channels; ++c) {
              const size_t at = layout == OutputLayout::kNHWC ? (static_cast<size_t>(y) * w + x) * channels + c
                                                              : (static_cast<size_t>(c) * h + y) * w + x;
              float v;
              std::memcpy(&v, out.data() + 4 * at, 4);
              const uint16_t want = src[(static_cast<size_t>(y) * w + x) * src_channels + (src_channels == 1 ? 0 : c)];
              if (v != static_cast<float>(want / 65535.0)) ++wrong;
            }
          }
        }
        CHECK(wrong == 0);
      }
    }
    // Normalized half floats: one rounding of (v / 65535 - mean) / std.
    ImageOps half;
    half.dtype = OutputDType::kFloat16;
    half.normalize = true;
    half.mean = {0.485, 0.456, 0.406};
    half.stddev = {0.229, 0.224, 0.225};
    std::vector<uint8_t> out(OutputImageBytes(half, w, h));
    ImageDecoder decoder;
    REQUIRE(decoder.DecodeInto(file, half, out.data(), w, h).ok());
    int wrong = 0;
    for (size_t i = 0; i < static_cast<size_t>(w) * h * 3; ++i) {
      const int c = static_cast<int>(i % 3);
      const uint16_t v = src[src_channels == 1 ? i / 3 : i];
      uint16_t bits;
      std::memcpy(&bits, out.data() + 2 * i, 2);
      if (bits != DoubleToHalf((v / 65535.0 - half.mean[c]) / half.stddev[c])) ++wrong;
    }
    CHECK(wrong == 0);
    // uint8 output still reads the 8-bit path.
    ImageOps u8;
    std::vector<uint8_t> small(OutputImageBytes(u8, w, h));
    ImageInfo info;
    REQUIRE(decoder.DecodeInto(file, u8, small.data(), w, h, 0, &info).ok());
    CHECK(info.sample_bits == 8);
  }
}

// Rewrites the size in a file's header to w x h (the file's pixels stay as they were).
std::vector<uint8_t> PatchSize(ImageFormat f, std::vector<uint8_t> b, uint32_t w, uint32_t h) {
  auto be32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
  };
  auto le = [&](size_t at, uint32_t v, int n) {
    for (int i = 0; i < n; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * i));
  };
  switch (f) {
    case ImageFormat::kJpeg:
      return PatchFrameSize(std::move(b), static_cast<int>(w), static_cast<int>(h));
    case ImageFormat::kPng:
      be32(16, w), be32(20, h);
      break;
    case ImageFormat::kGif:
      le(6, w, 2), le(8, h, 2);
      break;
    case ImageFormat::kBmp:
      le(18, w, 4), le(22, h, 4);
      break;
    case ImageFormat::kWebp:
      if (b[15] == 'L')
        le(21, (w - 1) | ((h - 1) << 14) | (b[24] & 0xF0u) << 24, 4);
      else if (b[15] == ' ')
        le(26, w, 2), le(28, h, 2);
      else
        le(24, w - 1, 3), le(27, h - 1, 3);
      break;
    case ImageFormat::kTiff: {
      // Little-endian (FFmpeg writes II): ImageWidth / ImageLength entries as LONG.
      uint32_t ifd = b[4] | b[5] << 8 | b[6] << 16 | uint32_t(b[7]) << 24;
      const int entries = b[ifd] | b[ifd + 1] << 8;
      for (int i = 0; i < entries; ++i) {
        const size_t e = ifd + 2 + 12 * i;
        const int tag = b[e] | b[e + 1] << 8;
        if (tag == 256 || tag == 257) {
          le(e + 2, 4, 2);
          le(e + 8, tag == 256 ? w : h, 4);
        }
      }
      break;
    }
    case ImageFormat::kUnknown:
      break;
  }
  return b;
}

TEST_CASE("Conformance: truncated and corrupt files are kDataLoss, never a crash and bombs are refused") {
  const int w = 160, h = 120;
  std::set<ImageFormat> formats_seen;
  for (const FormatCase& fc : FormatCases()) {
    INFO(fc.name);
    const RawImage raw = MakeRaw(fc.pixels, w, h);
    const std::vector<uint8_t> file = EncodeCase(fc, raw);
    if (file.empty()) continue;
    const ImageOps ops = WithAlpha(ResizeCrop(64, 56), fc);
    ImageDecoder decoder;
    GuardedImage out(56, 56);
    auto decode = [&](const std::vector<uint8_t>& bytes, ImageOps o = {}) {
      if (o.resize_shorter == 0) o = ops;
      return decoder.DecodeRgbInto(bytes, o, out.data(), 56, 56, out.stride);
    };
    REQUIRE(decode(file).ok());
    // Cut anywhere before the end of the pixel data: refused. (A cut that loses only trailing
    // metadata, e.g. a PNG's IEND chunk, may decode.)
    for (double frac : {0.002, 0.02, 0.1, 0.3, 0.6, 0.85}) {
      INFO("truncated to " << frac << " of " << file.size() << " bytes");
      const std::vector<uint8_t> cut(file.begin(), file.begin() + static_cast<ptrdiff_t>(file.size() * frac));
      const Status s = decode(cut);
      CHECK(s.code() == StatusCode::kDataLoss);
      CHECK(decode(file).ok());  // and the decoder still works
    }
    // Flipped bytes: decoded (garbage) or refused, never a crash, never outside the buffer.
    for (size_t at = file.size() / 5; at + 1 < file.size(); at += file.size() / 9 + 1) {
      std::vector<uint8_t> bad = file;
      bad[at] ^= 0x5A;
      bad[at + 1] ^= 0xFF;
      const Status s = decode(bad);
      CHECK((s.ok() || s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kResourceExhausted));
      CHECK(out.GuardsIntact());
    }
    CHECK(decode(file).ok());
    // The pixel-count guard, from the header, in every format.
    if (formats_seen.insert(fc.format).second) {
      ImageOps small = ops;
      small.max_pixels = int64_t{w} * h - 1;
      Status s = decode(file, small);
      CHECK(s.code() == StatusCode::kResourceExhausted);
      CHECK_THAT(s.message(), Catch::Contains("160x120"));
      // WebP sizes have 14 bits (16383 at most): 16383 x 16383 is 268 Mpixel, over the limit.
      const uint32_t side = fc.format == ImageFormat::kWebp ? 16383 : 60000;
      const std::vector<uint8_t> bomb = PatchSize(fc.format, file, side, side);
      ImageInfo info;
      const auto start = std::chrono::steady_clock::now();
      s = decoder.DecodeRgbInto(bomb, ops, out.data(), 56, 56, out.stride, 0, &info);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      INFO(s.ToString());
      CHECK(s.code() == StatusCode::kResourceExhausted);
      CHECK((info.width == int(side) && info.height == int(side)));
      CHECK(ms < 50);
      CHECK(decode(file).ok());
    }
  }
  CHECK(formats_seen.size() >= 5);  // WebP may be missing from a build without libwebp
}

TEST_CASE("The FFmpeg decoder frees a big picture and its codec, and carries on") {
  Result<std::vector<uint8_t>> png = EncodeImage(ImageFormat::kPng, MakeRaw(RawPixels::kRgb24, 64, 48));
  REQUIRE(png.ok());
  FfmpegImageDecoder decoder;
  for (int i = 0; i < 3; ++i) {
    Result<const AVFrame*> f = decoder.Decode(ImageFormat::kPng, *png, 1 << 20);
    REQUIRE(f.ok());
    CHECK(((*f)->width == 64 && (*f)->height == 48));
    decoder.Trim(1 << 20);  // small: kept
    CHECK((*f)->width == 64);
    decoder.Trim(0);  // freed
  }
  CHECK(decoder.Decode(ImageFormat::kPng, *png, 64 * 48 - 1).status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("Formats are told by their bytes, not their names and unknown data is kDataLoss") {
  CHECK(SniffImageFormat(std::vector<uint8_t>{}) == ImageFormat::kUnknown);
  CHECK(SniffImageFormat(std::vector<uint8_t>{'B', 'M', 0, 0}) == ImageFormat::kUnknown);  // too short
  CHECK(SniffImageFormat(std::vector<uint8_t>{'G', 'I', 'F', '8', '9', 'a'}) == ImageFormat::kGif);
  CHECK(SniffImageFormat(std::vector<uint8_t>{'M', 'M', 0, 42}) == ImageFormat::kTiff);
  CHECK(std::string(ImageFormatName(ImageFormat::kWebp)) == "WebP");
  ImageDecoder decoder;
  GuardedImage out(8, 8);
  const std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'};
  Status s = decoder.DecodeRgbInto(text, ResizeCrop(8, 8), out.data(), 8, 8, out.stride);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("unrecognised image data"));
  CHECK(decoder.DecodeRgbInto({}, ResizeCrop(8, 8), out.data(), 8, 8, out.stride).code() == StatusCode::kDataLoss);
  // DecodeJpegInto takes JPEG only.
  Result<std::vector<uint8_t>> png = EncodeImage(ImageFormat::kPng, MakeRaw(RawPixels::kRgb24, 20, 20));
  REQUIRE(png.ok());
  s = decoder.DecodeJpegInto(*png, ResizeCrop(8, 8), out.data(), 8, 8, out.stride);
  CHECK(s.code() == StatusCode::kDataLoss);
  CHECK_THAT(s.message(), Catch::Contains("not a JPEG (PNG data)"));
  CHECK(decoder.DecodeRgbInto(*png, ResizeCrop(8, 8), out.data(), 8, 8, out.stride).ok());
}

// ---- EXIF orientation ----

// An APP1 Exif segment holding one IFD0 entry: Orientation = tag, in either byte order.
std::vector<uint8_t> ExifSegment(int tag, bool big_endian) {
  std::vector<uint8_t> tiff;
  auto u16 = [&](uint32_t v) {
    if (big_endian)
      tiff.insert(tiff.end(), {uint8_t(v >> 8), uint8_t(v)});
    else
      tiff.insert(tiff.end(), {uint8_t(v), uint8_t(v >> 8)});
  };
  auto u32 = [&](uint32_t v) {
    if (big_endian) {
      u16(v >> 16);
      u16(v & 0xFFFF);
    } else {
      u16(v & 0xFFFF);
      u16(v >> 16);
    }
  };
  tiff.insert(tiff.end(),
              big_endian ? std::initializer_list<uint8_t>{'M', 'M'} : std::initializer_list<uint8_t>{'I', 'I'});
  u16(42);
  u32(8);                                        // IFD0 right after the header
  u16(2);                                        // two entries: a harmless one first
  u16(0x010F), u16(2), u32(4), u32(0x41424300);  // Make = "ABC"
  u16(0x0112), u16(3), u32(1), u16(static_cast<uint32_t>(tag)), u16(0);
  u32(0);  // no next IFD
  // Sized once and copied into (an insert that grows the vector trips GCC 12's -Warray-bounds).
  const uint8_t header[] = {0xFF, 0xE1, 0, 0, 'E', 'x', 'i', 'f', 0, 0};
  std::vector<uint8_t> seg(sizeof(header) + tiff.size());
  std::copy(std::begin(header), std::end(header), seg.begin());
  std::copy(tiff.begin(), tiff.end(), seg.begin() + sizeof(header));
  const size_t len = seg.size() - 2;
  seg[2] = static_cast<uint8_t>(len >> 8);
  seg[3] = static_cast<uint8_t>(len);
  return seg;
}

// `jpeg` with `segment` inserted right after SOI.
std::vector<uint8_t> WithSegment(const std::vector<uint8_t>& jpeg, const std::vector<uint8_t>& segment) {
  // Copied into place, not inserted: gcc 12 at -O3 reports vector::insert's growth here as a false
  // -Warray-bounds.
  std::vector<uint8_t> out(jpeg.size() + segment.size());
  auto end = std::copy(jpeg.begin(), jpeg.begin() + 2, out.begin());
  end = std::copy(segment.begin(), segment.end(), end);
  std::copy(jpeg.begin() + 2, jpeg.end(), end);
  return out;
}

// A JPEG whose stored pixels, turned upright by EXIF Orientation `tag`, show the pattern at
// w x h: each displayed pixel (x, y) is stored where the orientation reads it from.
std::vector<uint8_t> MakeOrientedJpeg(int w, int h, int tag, bool big_endian = false) {
  const std::vector<uint8_t> display = MakePattern(w, h);
  const Orientation o = OrientationFromExif(tag);
  const int sw = o.transpose ? h : w, sh = o.transpose ? w : h;
  std::vector<uint8_t> stored(display.size());
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const int u = o.transpose ? y : x, v = o.transpose ? x : y;
      const int sx = o.flip_x ? sw - 1 - u : u, sy = o.flip_y ? sh - 1 - v : v;
      std::memcpy(&stored[(static_cast<size_t>(sy) * sw + sx) * 3], &display[(static_cast<size_t>(y) * w + x) * 3], 3);
    }
  }
  Result<std::vector<uint8_t>> jpeg = EncodeJpeg(stored.data(), sw, sh, 95, ChromaSubsampling::k444);
  REQUIRE(jpeg.ok());
  return WithSegment(*jpeg, ExifSegment(tag, big_endian));
}

TEST_CASE("EXIF Orientation is read from the APP1 segment, defensively") {
  const std::vector<uint8_t> plain = MakeJpeg(40, 30);
  CHECK(ReadJpegExifOrientation(plain) == 1);
  for (int tag = 1; tag <= 8; ++tag) {
    for (bool be : {false, true}) {
      CHECK(ReadJpegExifOrientation(WithSegment(plain, ExifSegment(tag, be))) == tag);
    }
  }
  CHECK(ReadJpegExifOrientation(WithSegment(plain, ExifSegment(9, false))) == 1);  // out of range
  // Cut anywhere inside the segment, or with lengths and offsets pointing outside: never a crash.
  const std::vector<uint8_t> with = WithSegment(plain, ExifSegment(6, true));
  for (size_t n = 0; n < 60; ++n) {
    const std::vector<uint8_t> cut(with.begin(), with.begin() + static_cast<ptrdiff_t>(n));
    const int t = ReadJpegExifOrientation(cut);
    CHECK((t == 1 || t == 6));
  }
  for (size_t at = 4; at < 50; ++at) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0xFF}, uint8_t{0x7F}}) {
      std::vector<uint8_t> bad = with;
      bad[at] = v;
      const int t = ReadJpegExifOrientation(bad);
      CHECK((t >= 1 && t <= 8));
    }
  }
  // Dimensions of the transforms: 5..8 swap width and height.
  for (int tag = 1; tag <= 8; ++tag) CHECK(OrientationFromExif(tag).transpose == (tag >= 5));
}

TEST_CASE("EXIF orientation turns JPEGs upright before the geometry") {
  const int w = 360, h = 240;  // as displayed
  for (int tag = 1; tag <= 8; ++tag) {
    INFO("orientation " << tag);
    const std::vector<uint8_t> jpeg = MakeOrientedJpeg(w, h, tag, tag % 2 == 0);
    ImageOps ops = ResizeCrop(128, 112);
    ops.exif_orientation = true;
    ImageDecoder decoder;
    for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
      INFO("path " << PathName(path));
      ImageDecoder d(path);
      GuardedImage out(112, 112), ref(112, 112);
      ImageInfo info;
      REQUIRE(d.DecodeRgbInto(jpeg, ops, out.data(), 112, 112, out.stride, 0, &info).ok());
      CHECK(info.orientation == tag);
      CHECK(info.width == (tag >= 5 ? h : w));  // the stored size
      REQUIRE(d.ReferenceDecodeInto(jpeg, ops, ref.data(), 112, 112, ref.stride).ok());
      const ErrorStats a = VsAnalytic(out, TorchvisionGeometry(w, h, 128, 112));
      const ErrorStats ra = VsAnalytic(ref, TorchvisionGeometry(w, h, 128, 112));
      const ErrorStats r = VsImage(out, ref);
      INFO("vs analytic: mean " << a.mean << " p99 " << a.p99 << "; reference vs analytic: mean " << ra.mean
                                << "; vs reference: mean " << r.mean << " p99 " << r.p99);
      CHECK(a.mean <= kMaxMeanAbsVsAnalytic);
      CHECK(a.p99 <= kMaxP99VsAnalytic);
      CHECK(ra.mean <= kMaxMeanAbsVsAnalytic);
      CHECK(r.mean <= kMaxMeanAbsVsReference);
      CHECK(r.p99 <= kMaxP99VsReference);
    }
    // Identity: the upright size comes out (the stored one is refused as the wrong size).
    ImageOps identity;
    identity.exif_orientation = true;
    GuardedImage full(w, h);
    REQUIRE(decoder.DecodeRgbInto(jpeg, identity, full.data(), w, h, full.stride).ok());
    const ErrorStats a = VsAnalytic(full, Geometry{w, h, w, h, 0, 0});
    INFO("identity vs analytic: mean " << a.mean << " p99 " << a.p99);
    CHECK(a.mean <= kMaxMeanAbsVsAnalytic);
    if (tag >= 5) {
      identity.exif_orientation = false;
      CHECK(decoder.DecodeRgbInto(jpeg, identity, full.data(), w, h, full.stride).code() ==
            StatusCode::kInvalidArgument);
    }
    // Random crop + flip, float NCHW: the crop is drawn in the upright image.
    ImageOps rnd = RandomCrop(64);
    rnd.exif_orientation = true;
    rnd.flip_probability = 1;
    rnd.dtype = OutputDType::kFloat32;
    rnd.layout = OutputLayout::kNCHW;
    std::vector<uint8_t> f32(OutputImageBytes(rnd, 64, 64));
    ImageInfo info;
    REQUIRE(decoder.DecodeInto(jpeg, rnd, f32.data(), 64, 64, 9, &info).ok());
    SampleRng rng(9, RandomStream::kResizedCrop);
    CHECK(info.crop == PlanRandomResizedCrop(rnd, w, h, rng));
    std::vector<double> errors;
    const CropRect& c = info.crop;
    for (int y = 0; y < 64; ++y) {
      for (int x = 0; x < 64; ++x) {
        const double u = (c.x + (63 - x + 0.5) * c.width / 64.0) / w;  // flipped
        const double v = (c.y + (y + 0.5) * c.height / 64.0) / h;
        for (int ch = 0; ch < 3; ++ch) {
          const double got =
              Element(f32.data(), OutputDType::kFloat32, ElementIndex(OutputLayout::kNCHW, 64, 64, x, y, ch));
          errors.push_back(std::abs(got * 255 - Pattern(ch, u, v)));
        }
      }
    }
    const ErrorStats e = Stats(errors);
    INFO("random crop + flip vs analytic: mean " << e.mean << " p99 " << e.p99);
    CHECK(e.mean <= kMaxMeanAbsVsAnalytic);
    CHECK(e.p99 <= kMaxP99VsAnalytic);
  }
}

// ---- informational throughput (hidden: run with `media_test [.bench]`) ----

// A photo-like 500x400 JPEG: the smooth pattern plus deterministic texture, so that its entropy
// (bytes per pixel) is close to an ImageNet photo's rather than a flat image's.
std::vector<uint8_t> MakePhotoLikeJpeg(int w, int h) {
  std::vector<uint8_t> rgb = MakePattern(w, h);
  uint32_t state = 99;
  for (size_t i = 0; i < rgb.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    const int noise = static_cast<int>(state >> 26) - 32;  // [-32, 31]
    rgb[i] = static_cast<uint8_t>(std::clamp(rgb[i] + noise, 0, 255));
  }
  Result<std::vector<uint8_t>> jpeg = EncodeJpeg(rgb.data(), w, h, 90);
  REQUIRE(jpeg.ok());
  return std::move(jpeg).value();
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Runs decode_one for about two seconds; prints images per wall-clock second and per CPU second
// of this thread (the second is the steadier figure on a shared machine).
template <typename F>
void Measure(const char* name, F&& decode_one) {
  for (int i = 0; i < 20; ++i) decode_one();  // warm up caches and buffers
  int n = 0;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ThreadCpuSeconds();
  double elapsed = 0;
  while (elapsed < 2.0) {
    for (int i = 0; i < 20; ++i) decode_one();
    n += 20;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double cpu = ThreadCpuSeconds() - cpu_start;
  std::printf("  %-48s %6.0f images/s wall, %6.0f images/CPU-s\n", name, n / elapsed, n / cpu);
}

// ---- the exact path: PIL's resampling (media/resample.h) ----

// Resamples packed src (w x h, c channels) to ow x oh and returns the window's pixels.
std::vector<uint8_t> ResampleWindow(const std::vector<uint8_t>& src, int w, int h, int c, int ow, int oh,
                                    ResampleFilter f, int wx, int wy, int ww, int wh, bool simd = true) {
  PackedImage img;
  img.data = src.data();
  img.stride = static_cast<size_t>(w) * c;
  img.width = w;
  img.height = h;
  img.channels = c;
  ResampleRequest r{ow, oh, wx, wy, ww, wh, f};
  std::vector<uint8_t> out(static_cast<size_t>(ww) * wh * c);
  Resampler rs(simd);
  REQUIRE(rs.Resample(img, r, out.data(), static_cast<size_t>(ww) * c).ok());
  return out;
}

TEST_CASE("Resample: the weights are PIL's (support scaled by the downscale, fixed point)") {
  // Bilinear 4 -> 2: output 0 is centred on 1.0 with support 2: taps 0, 1, 2 weighted
  // f(-0.25), f(0.25), f(0.75) = 0.75, 0.75, 0.25, normalized: 3/7, 3/7, 1/7.
  AxisWeights w;
  ComputeAxisWeights(4, 2, ResampleFilter::kBilinear, 0, 2, &w);
  CHECK(w.taps == 5);
  CHECK(w.first == std::vector<int>{0, 1});
  CHECK(w.count == std::vector<int>{3, 3});
  const double one = 1 << kResamplePrecisionBits;
  CHECK(w.weights[0] == static_cast<int32_t>(3.0 / 7 * one + 0.5));
  CHECK(w.weights[1] == static_cast<int32_t>(3.0 / 7 * one + 0.5));
  CHECK(w.weights[2] == static_cast<int32_t>(1.0 / 7 * one + 0.5));
  // A window's weights are the whole axis's, shifted.
  AxisWeights part;
  ComputeAxisWeights(4, 2, ResampleFilter::kBilinear, 1, 2, &part);
  CHECK(part.first == std::vector<int>{1});
  CHECK(std::equal(part.weights.begin(), part.weights.end(), w.weights.begin() + w.taps));
  // Bicubic has negative lobes, rounded away from zero.
  ComputeAxisWeights(10, 3, ResampleFilter::kBicubic, 0, 3, &w);
  CHECK(*std::min_element(w.weights.begin(), w.weights.end()) < 0);
}

TEST_CASE("Resample: every filter gives PIL 9.4's values on a row") {
  // Values written by PIL 9.4: Image.fromarray(row).resize((n, 1), filter) of this 13-pixel row.
  const std::vector<uint8_t> row = {171, 206, 5, 206, 120, 131, 161, 73, 250, 13, 71, 98, 146};
  struct Case {
    ResampleFilter f;
    std::vector<uint8_t> down5, up29;
  };
  const std::vector<Case> cases = {
      {ResampleFilter::kNearest, {206, 206, 161, 13, 98}, {171, 171, 206, 206, 5,   5,   5,  206, 206, 120,
                                                           120, 131, 131, 161, 161, 161, 73, 73,  250, 250,
                                                           13,  13,  71,  71,  71,  98,  98, 146, 146}},
      {ResampleFilter::kBox, {127, 163, 122, 132, 105}, {171, 171, 206, 206, 5,   5,   5,  206, 206, 120,
                                                         120, 131, 131, 161, 161, 161, 73, 73,  250, 250,
                                                         13,  13,  71,  71,  71,  98,  98, 146, 146}},
      {ResampleFilter::kBilinear, {149, 132, 138, 107, 100}, {171, 177, 193, 192, 102, 12,  88,  178, 179, 141,
                                                              122, 127, 134, 148, 161, 122, 82,  134, 213, 193,
                                                              87,  21,  47,  72,  84,  96,  116, 138, 146}},
      {ResampleFilter::kHamming, {155, 142, 133, 113, 107}, {171, 172, 198, 205, 97,  6,   67,  202, 194, 126,
                                                             121, 129, 131, 150, 161, 127, 74,  106, 242, 233,
                                                             45,  14,  53,  71,  83,  98,  110, 144, 146}},
      {ResampleFilter::kBicubic, {147, 131, 140, 107, 99}, {168, 177, 207, 198, 90,  6,   74,  190, 197, 140,
                                                            116, 122, 134, 155, 161, 115, 72,  131, 236, 215,
                                                            79,  6,   34,  72,  85,  96,  118, 141, 151}},
      {ResampleFilter::kLanczos, {146, 127, 147, 105, 95}, {158, 184, 219, 195, 78,  5,   68,  185, 211, 150,
                                                            106, 111, 138, 166, 161, 102, 66,  138, 240, 220,
                                                            87,  0,   20,  74,  90,  95,  119, 141, 152}},
  };
  for (const Case& c : cases) {
    INFO("filter " << static_cast<int>(c.f));
    CHECK(ResampleWindow(row, 13, 1, 1, 5, 1, c.f, 0, 0, 5, 1) == c.down5);
    CHECK(ResampleWindow(row, 13, 1, 1, 5, 1, c.f, 0, 0, 5, 1, /*simd=*/false) == c.down5);
    CHECK(ResampleWindow(row, 13, 1, 1, 29, 1, c.f, 0, 0, 29, 1) == c.up29);
    // The same row as a column: the vertical pass gives the same values.
    CHECK(ResampleWindow(row, 1, 13, 1, 1, 5, c.f, 0, 0, 1, 5) == c.down5);
  }
}

TEST_CASE("Resample: a window equals the same crop of the whole resize, for every filter and size") {
  uint64_t state = 12345;
  auto next = [&state](int lo, int hi) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + static_cast<int>((state >> 33) % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int trial = 0; trial < 120; ++trial) {
    const int w = next(1, 200), h = next(1, 90), c = trial % 3 == 0 ? 1 : 3;
    std::vector<uint8_t> src(static_cast<size_t>(w) * h * c);
    for (auto& v : src) v = static_cast<uint8_t>(next(0, 255));
    const int ow = next(1, 120), oh = next(1, 120);
    const int wx = next(0, ow - 1), wy = next(0, oh - 1);
    const int ww = next(1, ow - wx), wh = next(1, oh - wy);
    const auto f = static_cast<ResampleFilter>(trial % 6);
    INFO(w << "x" << h << "x" << c << " -> " << ow << "x" << oh << " window " << ww << "x" << wh << "+" << wx << "+"
           << wy << " filter " << static_cast<int>(f));
    const std::vector<uint8_t> whole = ResampleWindow(src, w, h, c, ow, oh, f, 0, 0, ow, oh);
    const std::vector<uint8_t> window = ResampleWindow(src, w, h, c, ow, oh, f, wx, wy, ww, wh);
    // The vector code (AVX2, where the CPU has it) and the portable code agree value for value.
    CHECK(ResampleWindow(src, w, h, c, ow, oh, f, 0, 0, ow, oh, /*simd=*/false) == whole);
    bool same = true;
    for (int y = 0; y < wh && same; ++y) {
      same = std::memcmp(window.data() + static_cast<size_t>(y) * ww * c,
                         whole.data() + (static_cast<size_t>(wy + y) * ow + wx) * c, static_cast<size_t>(ww) * c) == 0;
    }
    CHECK(same);
  }
}

TEST_CASE("Resample: a mirrored window is the window reversed, value for value") {
  uint64_t state = 777;
  auto next = [&state](int lo, int hi) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + static_cast<int>((state >> 33) % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int trial = 0; trial < 144; ++trial) {
    const int c = trial % 4 == 0 ? 1 : trial % 4 == 1 ? 4 : 3;
    const int w = next(1, 160), h = next(1, 70);
    std::vector<uint8_t> src(static_cast<size_t>(w) * h * c);
    for (auto& v : src) v = static_cast<uint8_t>(next(0, 255));
    // Every third trial keeps the width (no horizontal resize: identity weights), every sixth the
    // height too (a plain copy without the mirror).
    const int ow = trial % 3 == 0 ? w : next(1, 120);
    const int oh = trial % 6 == 0 ? h : next(1, 120);
    const int wx = next(0, ow - 1), wy = next(0, oh - 1);
    const int ww = next(1, ow - wx), wh = next(1, oh - wy);
    const auto f = static_cast<ResampleFilter>(trial % 6);
    const bool simd = trial % 2 == 0;
    INFO(w << "x" << h << "x" << c << " -> " << ow << "x" << oh << " window " << ww << "x" << wh << "+" << wx << "+"
           << wy << " filter " << static_cast<int>(f) << " simd " << simd);
    const std::vector<uint8_t> plain = ResampleWindow(src, w, h, c, ow, oh, f, wx, wy, ww, wh, simd);
    PackedImage img;
    img.data = src.data();
    img.stride = static_cast<size_t>(w) * c;
    img.width = w;
    img.height = h;
    img.channels = c;
    ResampleRequest r{ow, oh, wx, wy, ww, wh, f};
    r.mirror = true;
    std::vector<uint8_t> mirrored(static_cast<size_t>(ww) * wh * c);
    Resampler rs(simd);
    REQUIRE(rs.Resample(img, r, mirrored.data(), static_cast<size_t>(ww) * c).ok());
    bool same = true;
    for (int y = 0; y < wh && same; ++y) {
      for (int x = 0; x < ww && same; ++x) {
        same = std::memcmp(mirrored.data() + (static_cast<size_t>(y) * ww + x) * c,
                           plain.data() + (static_cast<size_t>(y) * ww + (ww - 1 - x)) * c, c) == 0;
      }
    }
    CHECK(same);
  }
  // 16-bit samples too.
  std::vector<uint16_t> wide(37 * 11 * 3);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  PackedImage img;
  img.data = reinterpret_cast<const uint8_t*>(wide.data());
  img.stride = 37 * 3 * 2;
  img.width = 37;
  img.height = 11;
  img.channels = 3;
  img.wide = true;
  for (const int ow : {37, 20, 53}) {
    ResampleRequest r{ow, 9, 0, 0, ow, 9, ResampleFilter::kBicubic};
    std::vector<uint16_t> plain(static_cast<size_t>(ow) * 9 * 3), mirrored(plain.size());
    Resampler rs;
    REQUIRE(rs.Resample(img, r, reinterpret_cast<uint8_t*>(plain.data()), static_cast<size_t>(ow) * 6).ok());
    r.mirror = true;
    REQUIRE(rs.Resample(img, r, reinterpret_cast<uint8_t*>(mirrored.data()), static_cast<size_t>(ow) * 6).ok());
    bool same = true;
    for (int y = 0; y < 9; ++y) {
      for (int x = 0; x < ow; ++x) {
        for (int k = 0; k < 3; ++k) {
          same = same && mirrored[(static_cast<size_t>(y) * ow + x) * 3 + k] ==
                             plain[(static_cast<size_t>(y) * ow + (ow - 1 - x)) * 3 + k];
        }
      }
    }
    CHECK(same);
  }
}

TEST_CASE("Resample: identity is a copy, constant images stay constant, 16-bit keeps its precision") {
  std::vector<uint8_t> src(7 * 5 * 3);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37);
  for (int f = 0; f < 6; ++f) {
    CHECK(ResampleWindow(src, 7, 5, 3, 7, 5, static_cast<ResampleFilter>(f), 0, 0, 7, 5) == src);
  }
  const std::vector<uint8_t> flat(40 * 30 * 3, 200);
  for (int f = 0; f < 6; ++f) {
    const auto out = ResampleWindow(flat, 40, 30, 3, 17, 61, static_cast<ResampleFilter>(f), 0, 0, 17, 61);
    CHECK(std::all_of(out.begin(), out.end(), [](uint8_t v) { return v == 200; }));
  }
  // 16-bit: a constant 1000 * 65.5 stays exact (no 8-bit rounding on the way).
  std::vector<uint16_t> wide(40 * 30, 65500);
  wide[0] = 0;
  PackedImage img;
  img.data = reinterpret_cast<const uint8_t*>(wide.data());
  img.stride = 40 * 2;
  img.width = 40;
  img.height = 30;
  img.channels = 1;
  img.wide = true;
  std::vector<uint16_t> out(20 * 15);
  Resampler rs;
  REQUIRE(rs.Resample(img, ResampleRequest{20, 15, 0, 0, 20, 15, ResampleFilter::kBilinear},
                      reinterpret_cast<uint8_t*>(out.data()), 20 * 2)
              .ok());
  CHECK(out[19] == 65500);
  CHECK(out[0] < 65500);
  CHECK(out[0] > 65500 / 2);
  // Bad requests are refused.
  CHECK(rs.Resample(img, ResampleRequest{20, 15, 10, 0, 11, 15, ResampleFilter::kBilinear},
                    reinterpret_cast<uint8_t*>(out.data()), 20 * 2)
            .code() == StatusCode::kInvalidArgument);
  img.channels = 2;
  CHECK(rs.Resample(img, ResampleRequest{20, 15, 0, 0, 20, 15, ResampleFilter::kBilinear},
                    reinterpret_cast<uint8_t*>(out.data()), 20 * 2)
            .code() == StatusCode::kInvalidArgument);
}

// An image whose rows lie stride bytes apart with guard bytes between them (after each row's
// width * channels bytes, up to the next row): ASan-poisoned in an ASan build, so a load that crosses
// a row's end is reported where it happens; they also hold a pattern (CheckGuards) so that a write
// past a row's end shows in any build.
class PoisonedRows {
 public:
  static constexpr uint8_t kPattern = 0xa5;

  PoisonedRows(int width, int height, int channels)
      : row_bytes_(static_cast<size_t>(width) * channels),
        stride_((row_bytes_ + 7) / 8 * 8 + 16),
        height_(height),
        mem_(stride_ * static_cast<size_t>(height), kPattern) {
    for (int y = 0; y < height_; ++y) ASAN_POISON_MEMORY_REGION(row(y) + row_bytes_, stride_ - row_bytes_);
  }
  ~PoisonedRows() { ASAN_UNPOISON_MEMORY_REGION(mem_.data(), mem_.size()); }
  PoisonedRows(const PoisonedRows&) = delete;
  PoisonedRows& operator=(const PoisonedRows&) = delete;

  uint8_t* row(int y) { return mem_.data() + static_cast<size_t>(y) * stride_; }
  size_t stride() const { return stride_; }

  // Whether every guard byte still holds the pattern.
  bool GuardsIntact() {
    bool intact = true;
    for (int y = 0; y < height_; ++y) {
      ASAN_UNPOISON_MEMORY_REGION(row(y) + row_bytes_, stride_ - row_bytes_);
      intact = intact && std::all_of(row(y) + row_bytes_, row(y) + stride_, [](uint8_t v) { return v == kPattern; });
      ASAN_POISON_MEMORY_REGION(row(y) + row_bytes_, stride_ - row_bytes_);
    }
    return intact;
  }

  // The rows' bytes, packed.
  std::vector<uint8_t> Packed() {
    std::vector<uint8_t> out;
    for (int y = 0; y < height_; ++y) out.insert(out.end(), row(y), row(y) + row_bytes_);
    return out;
  }

 private:
  size_t row_bytes_;
  size_t stride_;
  int height_;
  std::vector<uint8_t> mem_;
};

TEST_CASE("Resample: the AVX2 passes give the portable code's bytes for every filter, scale and width") {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) SPDL_SKIP("this CPU has no AVX2: both paths are the portable code");
#else
  SPDL_SKIP("not x86-64: no AVX2 passes");
#endif
  uint64_t state = 2026;
  auto next = [&state](int lo, int hi) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return lo + static_cast<int>((state >> 33) % static_cast<uint64_t>(hi - lo + 1));
  };
  // A size scaled by a factor drawn log-uniformly from [0.05, 4].
  auto scaled = [&next](int size) {
    const double s = std::exp(std::log(0.05) + (std::log(4.0) - std::log(0.05)) * next(0, 1000) / 1000.0);
    return std::max(1, static_cast<int>(std::lround(size * s)));
  };
  // One of each across all trials: their buffers and layouts are reused from call to call, as in
  // the daemon.
  Resampler vector_code(/*simd=*/true), portable(/*simd=*/false);
  int mismatches = 0;
  for (int trial = 0; trial < 240; ++trial) {
    const int c = trial % 5 == 4 ? 4 : trial % 5 < 2 ? 1 : 3;
    // Widths 1 .. 2000 drawn log-uniformly; heights small enough to keep the case fast, but up
    // to 400 rows (many vertical taps when shrunk 20x).
    const int w = std::max(1, static_cast<int>(std::exp(next(0, 760) / 100.0)));
    const int h = next(1, std::max(1, std::min(400, 40000 / w)));
    const auto f = static_cast<ResampleFilter>(trial % 6);
    // Every fourth trial keeps the width (mirrored: identity weights), every fifth the height.
    const bool mirror = next(0, 1) == 1;
    const int ow = trial % 4 == 3 ? w : scaled(w);
    const int oh = trial % 5 == 2 ? h : scaled(h);
    // The window: the whole output, one touching the right edge (the last outputs read the
    // row's last pixels), or anywhere.
    int ww = ow, wx = 0, wh = oh, wy = 0;
    if (trial % 3 == 1) {
      ww = next(1, ow);
      wx = ow - ww;
      wh = next(1, oh);
      wy = next(0, oh - wh);
    } else if (trial % 3 == 2) {
      wx = next(0, ow - 1);
      ww = next(1, ow - wx);
      wy = next(0, oh - 1);
      wh = next(1, oh - wy);
    }
    INFO("trial " << trial << ": " << w << "x" << h << "x" << c << " -> " << ow << "x" << oh << " window " << ww << "x"
                  << wh << "+" << wx << "+" << wy << " filter " << static_cast<int>(f) << " mirror " << mirror);
    PoisonedRows src(w, h, c);
    for (int y = 0; y < h; ++y) {
      // Mostly noise, some rows of extremes (the sums' largest magnitudes with negative lobes).
      for (int x = 0; x < w * c; ++x) {
        src.row(y)[x] = static_cast<uint8_t>(y % 7 == 3 ? ((x / c) % 2) * 255 : next(0, 255));
      }
    }
    PackedImage img;
    img.data = src.row(0);
    img.stride = src.stride();
    img.width = w;
    img.height = h;
    img.channels = c;
    ResampleRequest r{ow, oh, wx, wy, ww, wh, f};
    r.mirror = mirror;
    PoisonedRows fast(ww, wh, c), slow(ww, wh, c);
    REQUIRE(vector_code.Resample(img, r, fast.row(0), fast.stride()).ok());
    REQUIRE(portable.Resample(img, r, slow.row(0), slow.stride()).ok());
    const bool same = fast.Packed() == slow.Packed();
    CHECK(same);
    CHECK(fast.GuardsIntact());
    mismatches += same ? 0 : 1;
  }
  CHECK(mismatches == 0);
}

// The exact path by hand: libjpeg-turbo's full-size RGB decode with its defaults, the whole resize
// by the Resampler, then torchvision's crop.
std::vector<uint8_t> ExactByHand(const std::vector<uint8_t>& jpeg, int w, int h, int rw, int rh, int cx, int cy, int cw,
                                 int ch, ResampleFilter f) {
  tjhandle tj = tjInitDecompress();
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  REQUIRE(tjDecompress2(tj, jpeg.data(), jpeg.size(), rgb.data(), w, w * 3, h, TJPF_RGB, 0) == 0);
  tjDestroy(tj);
  const std::vector<uint8_t> whole = ResampleWindow(rgb, w, h, 3, rw, rh, f, 0, 0, rw, rh);
  std::vector<uint8_t> out(static_cast<size_t>(cw) * ch * 3);
  for (int y = 0; y < ch; ++y) {
    std::memcpy(out.data() + static_cast<size_t>(y) * cw * 3,
                whole.data() + (static_cast<size_t>(cy + y) * rw + cx) * 3, static_cast<size_t>(cw) * 3);
  }
  return out;
}

TEST_CASE("The exact path is a full decode, PIL's resize and torchvision's crop, computed on the window only") {
  for (ChromaSubsampling s : {ChromaSubsampling::k420, ChromaSubsampling::k422, ChromaSubsampling::k444}) {
    for (auto [w, h] : {std::pair{500, 375}, std::pair{385, 289}, std::pair{375, 500}}) {
      INFO(w << "x" << h << " subsampling " << static_cast<int>(s));
      const std::vector<uint8_t> jpeg = MakeJpeg(w, h, s);
      const Geometry g = TorchvisionGeometry(w, h, 256, 224);
      for (Interpolation interp : {Interpolation::kBilinear, Interpolation::kBicubic, Interpolation::kArea,
                                   Interpolation::kNearest, Interpolation::kHamming, Interpolation::kLanczos}) {
        ImageOps ops = ResizeCrop(256, 224, interp);
        ImageDecoder decoder;
        ImageInfo info;
        std::vector<uint8_t> out(224 * 224 * 3);
        REQUIRE(decoder.DecodeRgbInto(jpeg, ops, out.data(), 224, 224, 224 * 3, 0, &info).ok());
        CHECK(info.dct_scale == 1);
        const ResampleFilter f = interp == Interpolation::kBilinear  ? ResampleFilter::kBilinear
                                 : interp == Interpolation::kBicubic ? ResampleFilter::kBicubic
                                 : interp == Interpolation::kArea    ? ResampleFilter::kBox
                                 : interp == Interpolation::kNearest ? ResampleFilter::kNearest
                                 : interp == Interpolation::kHamming ? ResampleFilter::kHamming
                                                                     : ResampleFilter::kLanczos;
        CHECK(out == ExactByHand(jpeg, w, h, g.rw, g.rh, g.off_x, g.off_y, 224, 224, f));
      }
    }
  }
}

TEST_CASE("The exact path: a random resized crop resizes the crop alone, float output is the uint8 / 255") {
  const std::vector<uint8_t> jpeg = MakeJpeg(640, 480);
  ImageOps ops;
  ops.random_crop_height = ops.random_crop_width = 160;
  ops.interpolation = Interpolation::kBicubic;
  for (uint64_t seed : {1, 2, 3}) {
    ImageDecoder decoder;
    ImageInfo info;
    std::vector<uint8_t> out(160 * 160 * 3);
    REQUIRE(decoder.DecodeRgbInto(jpeg, ops, out.data(), 160, 160, 160 * 3, seed, &info).ok());
    // By hand: crop the full decode, then resize the crop as an image of its own.
    tjhandle tj = tjInitDecompress();
    std::vector<uint8_t> rgb(640 * 480 * 3);
    REQUIRE(tjDecompress2(tj, jpeg.data(), jpeg.size(), rgb.data(), 640, 640 * 3, 480, TJPF_RGB, 0) == 0);
    tjDestroy(tj);
    const CropRect r = info.crop;
    std::vector<uint8_t> crop(static_cast<size_t>(r.width) * r.height * 3);
    for (int y = 0; y < r.height; ++y) {
      std::memcpy(crop.data() + static_cast<size_t>(y) * r.width * 3,
                  rgb.data() + (static_cast<size_t>(r.y + y) * 640 + r.x) * 3, static_cast<size_t>(r.width) * 3);
    }
    CHECK(out == ResampleWindow(crop, r.width, r.height, 3, 160, 160, ResampleFilter::kBicubic, 0, 0, 160, 160));

    ImageOps f32 = ops;
    f32.dtype = OutputDType::kFloat32;
    f32.layout = OutputLayout::kNCHW;
    std::vector<float> planar(3 * 160 * 160);
    REQUIRE(decoder.DecodeInto(jpeg, f32, planar.data(), 160, 160, seed).ok());
    bool same = true;
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 160 * 160; ++i)
        same = same && planar[c * 160 * 160 + i] == static_cast<float>(out[i * 3 + c] / 255.0);
    }
    CHECK(same);
  }
}

TEST_CASE("The exact path: gray output is PIL's convert(\"L\") of the decoded RGB, then the resize") {
  const int w = 500, h = 375;
  const std::vector<uint8_t> jpeg = MakeJpeg(w, h);
  ImageOps ops = ResizeCrop(256, 224);
  ops.channels = 1;
  ImageDecoder decoder;
  std::vector<uint8_t> out(224 * 224);
  REQUIRE(decoder.DecodeRgbInto(jpeg, ops, out.data(), 224, 224, 224).ok());
  tjhandle tj = tjInitDecompress();
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3), luma(static_cast<size_t>(w) * h);
  REQUIRE(tjDecompress2(tj, jpeg.data(), jpeg.size(), rgb.data(), w, w * 3, h, TJPF_RGB, 0) == 0);
  tjDestroy(tj);
  for (size_t i = 0; i < luma.size(); ++i) {
    luma[i] =
        static_cast<uint8_t>((19595u * rgb[3 * i] + 38470u * rgb[3 * i + 1] + 7471u * rgb[3 * i + 2] + 0x8000u) >> 16);
  }
  const Geometry g = TorchvisionGeometry(w, h, 256, 224);
  CHECK(out == ResampleWindow(luma, w, h, 1, g.rw, g.rh, ResampleFilter::kBilinear, g.off_x, g.off_y, 224, 224));
  // Hamming has no fast path.
  ops.resample = Resample::kFast;
  ops.interpolation = Interpolation::kHamming;
  CHECK(decoder.DecodeRgbInto(jpeg, ops, out.data(), 224, 224, 224).code() == StatusCode::kInvalidArgument);
}

TEST_CASE("Decode throughput, one thread", "[.bench]") {
  const int w = 500, h = 400;
  const std::vector<uint8_t> jpeg = MakePhotoLikeJpeg(w, h);
  const ImageOps ops = ResizeCrop(256, 224);
  std::vector<uint8_t> out(224 * 224 * 3);
  std::printf("media bench: %dx%d JPEG, %zu bytes, Resize(256) + CenterCrop(224), one thread\n", w, h, jpeg.size());

  {
    std::vector<uint8_t> full(static_cast<size_t>(w) * h * 3);
    tjhandle tj = tjInitDecompress();
    REQUIRE(tj != nullptr);
    Measure("libjpeg-turbo full decode to RGB, no resize",
            [&] { REQUIRE(tjDecompress2(tj, jpeg.data(), jpeg.size(), full.data(), w, 0, h, TJPF_RGB, 0) == 0); });
    tjDestroy(tj);
  }
  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    ImageDecoder decoder(path);
    Measure(
        path == JpegDecodePath::kYuvPlanes ? "DecodeJpegInto, YUV planes + swscale" : "DecodeJpegInto, RGB + swscale",
        [&] { REQUIRE(decoder.DecodeJpegInto(jpeg, ops, out.data(), 224, 224, 224 * 3).ok()); });
  }
  {
    ImageDecoder decoder;
    Measure("ReferenceDecodeInto (RGB, whole resize, crop)",
            [&] { REQUIRE(decoder.ReferenceDecodeInto(jpeg, ops, out.data(), 224, 224, 224 * 3).ok()); });
  }

  // What DCT-domain scaling buys on a bigger image (decoded at 1/2).
  const std::vector<uint8_t> big = MakePhotoLikeJpeg(1024, 768);
  std::printf("media bench: 1024x768 JPEG, %zu bytes, Resize(256) + CenterCrop(224)\n", big.size());
  for (bool dct : {true, false}) {
    ImageOps big_ops = ops;
    big_ops.allow_dct_scaling = dct;
    ImageDecoder decoder;
    Measure(dct ? "DecodeJpegInto, YUV, DCT scaling 1/2" : "DecodeJpegInto, YUV, no DCT scaling",
            [&] { REQUIRE(decoder.DecodeJpegInto(big, big_ops, out.data(), 224, 224, 224 * 3).ok()); });
  }
}

// Every format path, and the output pass, at 224 output: one thread, a photo-like 500x400 image.
TEST_CASE("Decode throughput per format and output, one thread", "[.bench]") {
  const int w = 500, h = 400;
  std::vector<uint8_t> rgb = MakePattern(w, h);
  uint32_t state = 99;
  for (uint8_t& v : rgb) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint8_t>(std::clamp(v + static_cast<int>(state >> 26) - 32, 0, 255));
  }
  RawImage raw{RawPixels::kRgb24, w, h, rgb, {}};
  RawImage rgba{RawPixels::kRgba, w, h, {}, {}};
  RawImage gray{RawPixels::kGray8, w, h, {}, {}};
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    rgba.data.insert(rgba.data.end(), {rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], uint8_t(i)});
    gray.data.push_back(rgb[3 * i + 1]);
  }
  EncodeOptions lossless;
  lossless.lossless = true;
  struct Item {
    const char* name;
    ImageFormat format;
    const RawImage* image;
    EncodeOptions options;
  };
  const Item items[] = {
      {"JPEG q90 4:2:0", ImageFormat::kJpeg, &raw, {}},
      {"PNG RGB", ImageFormat::kPng, &raw, {}},
      {"PNG RGBA (alpha dropped)", ImageFormat::kPng, &rgba, {}},
      {"WebP lossy q90", ImageFormat::kWebp, &raw, {}},
      {"WebP lossless", ImageFormat::kWebp, &raw, lossless},
      {"BMP RGB", ImageFormat::kBmp, &raw, {}},
      {"TIFF RGB", ImageFormat::kTiff, &raw, {}},
      {"GIF gray", ImageFormat::kGif, &gray, {}},
  };
  ImageOps u8 = ResizeCrop(256, 224);
  ImageOps f32 = u8;
  f32.dtype = OutputDType::kFloat32;
  f32.layout = OutputLayout::kNCHW;
  f32.normalize = true;
  f32.mean = {0.485, 0.456, 0.406};
  f32.stddev = {0.229, 0.224, 0.225};
  ImageOps rnd = RandomCrop(224);
  rnd.flip_probability = 0.5;
  rnd.dtype = OutputDType::kFloat32;
  rnd.layout = OutputLayout::kNCHW;
  rnd.normalize = true;
  std::vector<uint8_t> out(OutputImageBytes(f32, 224, 224));
  std::printf("media bench: %dx%d photo-like image, one thread; Resize(256)+CenterCrop(224)\n", w, h);
  for (const Item& it : items) {
    Result<std::vector<uint8_t>> file = EncodeImage(it.format, *it.image, it.options);
    if (!file.ok()) {
      std::printf("  %-30s skipped: %s\n", it.name, file.status().message().c_str());
      continue;
    }
    ImageDecoder decoder;
    std::printf("  %s, %zu bytes\n", it.name, file->size());
    Measure("    uint8 NHWC", [&] { REQUIRE(decoder.DecodeInto(*file, u8, out.data(), 224, 224).ok()); });
    Measure("    float32 NCHW normalized", [&] { REQUIRE(decoder.DecodeInto(*file, f32, out.data(), 224, 224).ok()); });
    uint64_t seed = 0;
    Measure("    RandomResizedCrop(224)+flip, float32 NCHW",
            [&] { REQUIRE(decoder.DecodeInto(*file, rnd, out.data(), 224, 224, ++seed).ok()); });
  }
}

// Found by tests/fuzz/image_fuzz (corpus/image/regress_gray_1px_swscale_overrun): swscale writes
// a few bytes past a very narrow output row (gray, 1 or 2 pixels wide: up to 5 bytes), and the
// decoder let it write straight into the destination, so the bytes after the image — the next
// sample's row of the batch — were overwritten. Every row width and source format must keep to
// its own bytes, and give the pixels a roomy destination gets.
TEST_CASE("A narrow output writes nothing past its own bytes") {
  constexpr size_t kTail = 64;
  constexpr uint8_t kGuard = 0xA5;
  std::vector<std::pair<const char*, std::vector<uint8_t>>> files;
  files.emplace_back("JPEG", MakeJpeg(20, 12));
  for (ImageFormat f : {ImageFormat::kBmp, ImageFormat::kPng}) {
    Result<std::vector<uint8_t>> bytes = EncodeImage(f, MakeRaw(RawPixels::kRgba, 20, 12));
    REQUIRE(bytes.ok());
    files.emplace_back(ImageFormatName(f), std::move(bytes).value());
  }
  ImageDecoder decoder;
  for (const auto& [name, file] : files) {
    for (int channels : {1, 3}) {
      for (int w : {1, 2, 3, 5, 6, 16}) {
        for (int h : {1, 16}) {
          CAPTURE(name, channels, w, h);
          ImageOps ops;
          ops.resize_width = w;
          ops.resize_height = h;
          ops.channels = channels;
          const size_t row = OutputImageBytes(ops, w, h);
          std::vector<uint8_t> exact(row + kTail, kGuard);
          REQUIRE(decoder.DecodeInto(file, ops, exact.data(), w, h).ok());
          CHECK(std::all_of(exact.begin() + static_cast<ptrdiff_t>(row), exact.end(),
                            [](uint8_t b) { return b == kGuard; }));
          // The same image with 64 spare bytes after each row.
          const size_t stride = static_cast<size_t>(w) * channels + 64;
          std::vector<uint8_t> roomy(stride * h + kTail, 0);
          REQUIRE(decoder.DecodeRgbInto(file, ops, roomy.data(), w, h, stride).ok());
          for (int y = 0; y < h; ++y) {
            CHECK(std::equal(exact.begin() + static_cast<ptrdiff_t>(y * w * channels),
                             exact.begin() + static_cast<ptrdiff_t>((y + 1) * w * channels),
                             roomy.begin() + static_cast<ptrdiff_t>(y * stride)));
          }
        }
      }
    }
  }
}

// A little-endian RGB TIFF of one uncompressed strip, with or without the StripByteCounts tag
// (readers then take the strip to run to the end of the file).
std::vector<uint8_t> HandMadeTiff(int w, int h, bool strip_byte_counts) {
  std::vector<uint8_t> t = {'I', 'I', 42, 0, 8, 0, 0, 0};
  auto put16 = [&](uint32_t v) { t.insert(t.end(), {uint8_t(v), uint8_t(v >> 8)}); };
  auto put32 = [&](uint32_t v) {
    t.insert(t.end(), {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)});
  };
  const uint32_t n = strip_byte_counts ? 10 : 9;
  const uint32_t bits_at = 8 + 2 + 12 * n + 4, data_at = bits_at + 6;
  const uint32_t bytes = static_cast<uint32_t>(w * h * 3);
  auto entry = [&](uint16_t tag, uint16_t type, uint32_t value) {
    put16(tag);
    put16(type);
    put32(tag == 258 ? 3 : 1);
    if (type == 3 && tag != 258) {
      put16(value);
      put16(0);
    } else {
      put32(value);
    }
  };
  put16(n);
  entry(256, 4, static_cast<uint32_t>(w));  // ImageWidth
  entry(257, 4, static_cast<uint32_t>(h));  // ImageLength
  entry(258, 3, bits_at);                   // BitsPerSample 8, 8, 8
  entry(259, 3, 1);                         // no compression
  entry(262, 3, 2);                         // RGB
  entry(273, 4, data_at);                   // StripOffsets
  entry(277, 3, 3);                         // SamplesPerPixel
  entry(278, 4, static_cast<uint32_t>(h));  // RowsPerStrip
  if (strip_byte_counts) entry(279, 4, bytes);
  entry(284, 3, 1);  // PlanarConfiguration: chunky
  put32(0);          // no next directory
  put16(8);
  put16(8);
  put16(8);
  const std::vector<uint8_t> rgb = MakePattern(w, h);
  t.insert(t.end(), rgb.begin(), rgb.end());
  return t;
}

// Found by tests/fuzz/image_fuzz (corpus/image/regress_tiff_state_after_tiff): FFmpeg's TIFF
// decoder keeps the last file's tags in its context, and the decoder kept that context for the
// next TIFF (only flushing it), so a TIFF without StripByteCounts was read with the previous
// file's strip size: an error, or another image's layout, depending on what the worker had
// decoded before. Every TIFF must decode as it does on a fresh decoder.
TEST_CASE("A TIFF decodes the same whatever TIFF the decoder read before") {
  const std::vector<uint8_t> big = HandMadeTiff(24, 16, true);
  const std::vector<uint8_t> small = HandMadeTiff(8, 8, false);
  ImageOps ops;
  ops.resize_width = ops.resize_height = 8;
  std::vector<uint8_t> fresh(OutputImageBytes(ops, 8, 8)), after(fresh.size(), 0x55), out(fresh.size());
  {
    ImageDecoder decoder;
    REQUIRE(decoder.DecodeInto(small, ops, fresh.data(), 8, 8).ok());
  }
  ImageDecoder decoder;
  for (int round = 0; round < 2; ++round) {
    REQUIRE(decoder.DecodeInto(big, ops, out.data(), 8, 8).ok());
    const Status s = decoder.DecodeInto(small, ops, after.data(), 8, 8);
    CAPTURE(round, s.ToString());
    REQUIRE(s.ok());
    CHECK(after == fresh);
  }
}

// Two 32x24 lossy WebPs with alpha, found by tests/fuzz/image_fuzz (corpus/image/
// regress_webp_state_after_webp_{a,b}, without the fuzz trailer; A's VP8X canvas set to its VP8
// size). libavcodec's WebP decoder has no flush: its inner VP8 decoder keeps its context from the
// last image, and B's (fuzzed) keyframe decodes to different pixels after A than after nothing.
const std::vector<uint8_t> kWebpStateA = {
    0x52, 0x49, 0x46, 0x46, 0x02, 0x01, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50, 0x38, 0x58, 0x0a, 0x00, 0x00,
    0x00, 0x10, 0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x17, 0x00, 0x00, 0x01, 0x1a, 0x50, 0x48, 0x1c, 0x00, 0x00, 0x00,
    0x01, 0x99, 0x0a, 0x44, 0xf4, 0x3f, 0x60, 0xb4, 0x6d, 0x9b, 0x40, 0xf7, 0xff, 0xa7, 0x87, 0x87, 0x22, 0x26, 0x60,
    0x1d, 0x0a, 0x30, 0xc0, 0x1c, 0x03, 0x93, 0xef, 0x16, 0x56, 0x50, 0x38, 0x20, 0xc0, 0x00, 0x00, 0x00, 0xd0, 0x06,
    0x00, 0x9d, 0x01, 0x2a, 0x20, 0x00, 0x18, 0x00, 0x3e, 0xd1, 0x58, 0xa4, 0x4b, 0xa8, 0x25, 0x23, 0xa1, 0xb0, 0x08,
    0x01, 0x00, 0x1a, 0x09, 0x6c, 0x00, 0x9d, 0x32, 0x84, 0x79, 0x98, 0xd2, 0x74, 0xcb, 0xbc, 0xdb, 0xb9, 0x22, 0x93,
    0xe7, 0xdd, 0xd8, 0x5b, 0x68, 0x72, 0xec, 0xb1, 0x72, 0x65, 0x8b, 0x9e, 0xba, 0xa9, 0x2e, 0xb4, 0xb5, 0xdc, 0x37,
    0xdf, 0xa3, 0xd4, 0x00, 0x00, 0xfe, 0xf4, 0x70, 0xc4, 0xea, 0x02, 0x56, 0x05, 0x03, 0xb3, 0x2e, 0xb4, 0xa3, 0x15,
    0xc9, 0x2e, 0x85, 0xd8, 0x38, 0x1d, 0x83, 0xda, 0x9f, 0xb4, 0x2e, 0x4a, 0x61, 0xc7, 0xc4, 0x1a, 0x37, 0x52, 0xda,
    0xde, 0xdb, 0x27, 0x2b, 0x38, 0x8d, 0x63, 0xd3, 0xf3, 0xc5, 0xfc, 0xb2, 0x0f, 0x60, 0x75, 0xef, 0x95, 0x06, 0xc4,
    0x97, 0x66, 0x16, 0x95, 0x68, 0x84, 0xbb, 0xaf, 0xc5, 0xe7, 0xac, 0x14, 0x3d, 0x1c, 0x70, 0xec, 0x6b, 0x48, 0x6d,
    0xf7, 0xbd, 0xc4, 0x1d, 0x2a, 0x60, 0x33, 0x68, 0x2e, 0x53, 0xe9, 0xf8, 0xc7, 0x5a, 0x8a, 0xbf, 0x97, 0xde, 0x3c,
    0x73, 0x17, 0xb2, 0xae, 0x3a, 0x2b, 0x49, 0x44, 0x13, 0x54, 0x06, 0xd9, 0xe6, 0x6f, 0x8e, 0xa8, 0x5a, 0xb2, 0x97,
    0x7b, 0x88, 0x38, 0xde, 0xb8, 0xe2, 0x08, 0xff, 0x87, 0x18, 0x53, 0x03, 0x99, 0x23, 0x7c, 0x8d, 0xb0, 0x00, 0x00,
};
const std::vector<uint8_t> kWebpStateB = {
    0x52, 0x49, 0x46, 0x46, 0x02, 0x01, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50, 0x38, 0x58, 0x0a, 0x00, 0x00,
    0x00, 0x10, 0x00, 0x00, 0x00, 0x1f, 0x00, 0x00, 0x17, 0x00, 0x00, 0x41, 0x4c, 0x50, 0x48, 0x1c, 0x00, 0x00, 0x00,
    0x01, 0x99, 0x0a, 0x44, 0xf4, 0x3f, 0x60, 0xb4, 0x6d, 0x9b, 0x40, 0xf7, 0xff, 0xa7, 0x87, 0x87, 0x22, 0x26, 0x60,
    0x1d, 0x0a, 0x30, 0xc0, 0x1c, 0x03, 0x93, 0xef, 0x16, 0x56, 0x50, 0x38, 0x20, 0xc0, 0x00, 0x00, 0x00, 0xd4, 0x16,
    0x00, 0x9d, 0x01, 0x2a, 0x20, 0x80, 0x18, 0x00, 0x3e, 0xd1, 0x58, 0xa4, 0x4b, 0xa8, 0x25, 0x23, 0xa1, 0xb0, 0x08,
    0x01, 0x00, 0x1a, 0x09, 0x6c, 0x00, 0x9d, 0x32, 0x84, 0x79, 0x98, 0xd2, 0x74, 0xcb, 0xbc, 0xdb, 0x11, 0xb9, 0x22,
    0x93, 0xe7, 0xdd, 0xd8, 0x5b, 0x68, 0x72, 0xec, 0xb1, 0x72, 0x65, 0x8b, 0x9e, 0xba, 0xa9, 0x2e, 0xb4, 0xb5, 0xdc,
    0x37, 0xdf, 0xa3, 0xd4, 0x00, 0x00, 0xfe, 0xf4, 0x70, 0xc4, 0xea, 0x02, 0x56, 0x05, 0x03, 0xb3, 0x2e, 0xb4, 0xa3,
    0x15, 0xc9, 0x2e, 0x85, 0xd8, 0x38, 0x1d, 0x83, 0xda, 0x9f, 0xb4, 0x2e, 0x4a, 0x61, 0xc7, 0xc4, 0x1a, 0x37, 0x52,
    0xda, 0xde, 0xdb, 0x27, 0x2b, 0x38, 0x8d, 0x63, 0xd3, 0xf3, 0xc5, 0xfc, 0xb2, 0x0f, 0x60, 0x75, 0xe7, 0x95, 0x97,
    0xc4, 0x16, 0x95, 0x06, 0x66, 0x68, 0x84, 0xbb, 0xaf, 0xc5, 0xe7, 0xac, 0x14, 0x3d, 0x1c, 0x70, 0xec, 0x6b, 0x48,
    0x6d, 0xf7, 0xbd, 0xc4, 0x1d, 0x2a, 0x60, 0x32, 0x68, 0x2e, 0x53, 0xe9, 0xf8, 0xc7, 0x5a, 0x8a, 0xbf, 0x97, 0xde,
    0x3c, 0x73, 0x17, 0xb2, 0xae, 0x3a, 0x2b, 0x49, 0x44, 0x13, 0x54, 0x06, 0xd9, 0xe6, 0x6f, 0x8e, 0xa8, 0x5a, 0xb2,
    0x97, 0x7b, 0x88, 0x38, 0xde, 0xb8, 0xe2, 0x08, 0xff, 0x87, 0x18, 0x53, 0x03, 0x99, 0x23, 0x7c, 0x8d, 0xb0, 0x00,
};

TEST_CASE("A WebP decodes the same whatever WebP the decoder read before") {
  // Counts differing bytes (a short message in the log, not two dumps of 2304 bytes).
  auto differing = [](const std::vector<uint8_t>& x, const std::vector<uint8_t>& y) {
    size_t n = 0;
    for (size_t i = 0; i < x.size(); ++i) n += x[i] != y[i];
    return n;
  };
  ImageOps ops;
  ops.resize_width = 32;  // the stored size: the decoded pixels themselves are compared
  ops.resize_height = 24;
  std::vector<uint8_t> fresh(OutputImageBytes(ops, 32, 24), 0x11), after(fresh.size(), 0x55), out(fresh.size());
  {
    ImageDecoder decoder;
    REQUIRE(decoder.DecodeInto(kWebpStateB, ops, fresh.data(), 32, 24).ok());
  }
  // Before B: A itself, then A with a VP8X canvas of 1x589825 (refused as not the size the VP8
  // data decodes to, after libavcodec decoded it: a refused image must leave nothing either).
  std::vector<uint8_t> refused = kWebpStateA;
  const uint8_t canvas[6] = {0x00, 0x00, 0x00, 0x00, 0x00, 0x09};  // width - 1, height - 1 (24-bit LE)
  std::memcpy(refused.data() + 24, canvas, sizeof(canvas));
  ImageDecoder decoder;
  for (int round = 0; round < 2; ++round) {
    const Status a = decoder.DecodeInto(round == 0 ? kWebpStateA : refused, ops, out.data(), 32, 24);
    CAPTURE(round, a.ToString());
    REQUIRE(a.code() == (round == 0 ? StatusCode::kOk : StatusCode::kDataLoss));
    const Status s = decoder.DecodeInto(kWebpStateB, ops, after.data(), 32, 24);
    CAPTURE(s.ToString());
    REQUIRE(s.ok());
    CHECK(differing(after, fresh) == 0);
    // And with nothing in between: the decoder's own last image must not matter either.
    std::fill(after.begin(), after.end(), 0xaa);
    REQUIRE(decoder.DecodeInto(kWebpStateB, ops, after.data(), 32, 24).ok());
    CHECK(differing(after, fresh) == 0);
  }
}

}  // namespace
}  // namespace spdl::media
