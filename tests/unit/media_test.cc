// Tests of media/: the torchvision geometry, the JPEG decoder against an independent analytic
// reference and against its own reference path, and its handling of bad input.
//
// Every test image is made here: a smooth synthetic RGB pattern (gradients and low-frequency
// sinusoids, different per channel), so the exact value of any output pixel is known in closed
// form and the decoder can be checked without another imaging library.
#include <turbojpeg.h>  // only to build CMYK JPEGs and to time a bare decode

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "media/image_decoder.h"

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
    case 0: return 128 + 50 * std::sin(2 * kPi * (1.3 * u + 0.4 * v) + 0.3) + 40 * (u - 0.5);
    case 1: return 128 + 50 * std::cos(2 * kPi * (0.5 * u - 1.1 * v)) + 40 * (v - 0.5);
    default: return 128 + 45 * std::sin(2 * kPi * (0.9 * u + 0.9 * v) + 1.0) - 30 * (u - v);
  }
}

uint8_t ToByte(double x) { return static_cast<uint8_t>(std::clamp(std::lround(x), 0L, 255L)); }

// The pattern sampled at pixel centres, packed RGB.
std::vector<uint8_t> MakePattern(int w, int h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) {
        rgb[(static_cast<size_t>(y) * w + x) * 3 + c] =
            ToByte(Pattern(c, (x + 0.5) / w, (y + 0.5) / h));
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
  int rw, rh;          // resized size
  int ow, oh;          // output size
  int off_x, off_y;    // output (x, y) shows resized pixel (x + off_x, y + off_y)
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
      : w(width), h(height), stride(static_cast<size_t>(width) * 3 + kGap),
        bytes(stride * height + 64, kGuard) {}
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
        const double want =
            pad ? 0.0 : std::clamp(Pattern(c, (rx + 0.5) / g.rw, (ry + 0.5) / g.rh), 0.0, 255.0);
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

const char* PathName(JpegDecodePath p) {
  return p == JpegDecodePath::kYuvPlanes ? "yuv" : "rgb";
}

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

// Decodes `jpeg` with `ops` on both paths and checks each against the analytic pattern, and the
// default path against the reference path.
void CheckAgainstReferences(const std::vector<uint8_t>& jpeg, int w, int h, const ImageOps& ops,
                            int expect_dct_scale) {
  const Geometry g = TorchvisionGeometry(w, h, ops.resize_shorter, ops.crop_width);
  int ow = 0, oh = 0;
  OutputSize(ops, w, h, &ow, &oh);
  REQUIRE((ow == g.ow && oh == g.oh));

  GuardedImage ref(ow, oh);
  ImageDecoder ref_decoder;
  ImageInfo info;
  REQUIRE(ref_decoder.ReferenceDecodeInto(jpeg, ops, ref.data(), ow, oh, ref.stride, &info)
              .ok());
  CHECK((info.width == w && info.height == h && info.dct_scale == 1));
  CHECK(ref.GuardsIntact());
  const ErrorStats ref_err = VsAnalytic(ref, g);
  INFO("reference vs analytic: mean " << ref_err.mean << " p99 " << ref_err.p99 << " max "
                                      << ref_err.max);
  CHECK(ref_err.mean <= kMaxMeanAbsVsAnalytic);
  CHECK(ref_err.p99 <= kMaxP99VsAnalytic);

  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    INFO("path " << PathName(path));
    ImageDecoder decoder(path);
    GuardedImage out(ow, oh);
    REQUIRE(decoder.DecodeJpegInto(jpeg, ops, out.data(), ow, oh, out.stride, &info).ok());
    CHECK((info.width == w && info.height == h));
    CHECK(info.dct_scale == expect_dct_scale);
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
  for (Case c : {Case{500, 375, 1}, Case{375, 500, 1}, Case{1024, 768, 2}, Case{2000, 1500, 4},
                 Case{224, 224, 1}, Case{100, 80, 1}, Case{333, 517, 1}, Case{641, 479, 1},
                 Case{1341, 999, 2}, Case{4000, 3000, 8}}) {
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
  for (Interpolation interp :
       {Interpolation::kBilinear, Interpolation::kBicubic, Interpolation::kArea}) {
    INFO("interpolation " << static_cast<int>(interp));
    ImageOps ops = base;
    ops.interpolation = interp;
    ImageDecoder decoder;
    outs.emplace_back(224, 224);
    REQUIRE(decoder.DecodeJpegInto(jpeg, ops, outs.back().data(), 224, 224, outs.back().stride)
                .ok());
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
  for (ChromaSubsampling s :
       {ChromaSubsampling::k444, ChromaSubsampling::k422, ChromaSubsampling::k420}) {
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
    REQUIRE(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224,
                                   out.stride).ok());
    int spread = 0;
    std::vector<double> errors;
    for (int y = 0; y < 224; ++y) {
      for (int x = 0; x < 224; ++x) {
        const int r = out.at(x, y, 0), gr = out.at(x, y, 1), b = out.at(x, y, 2);
        spread = std::max({spread, std::abs(r - gr), std::abs(r - b)});
        // The luma the encoder stored: BT.601 of the pattern.
        const double u = (x + g.off_x + 0.5) / g.rw, v = (y + g.off_y + 0.5) / g.rh;
        const double luma =
            0.299 * Pattern(0, u, v) + 0.587 * Pattern(1, u, v) + 0.114 * Pattern(2, u, v);
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
std::vector<uint8_t> TjEncode(const uint8_t* px, int w, int h, int pixel_format, int subsamp,
                              int flags) {
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
      CheckAgainstReferences(TjEncode(rgb.data(), w, h, TJPF_RGB, samp, 0), w, h,
                             ResizeCrop(256, 224), dct_scale);
    }
    INFO("image " << w << "x" << h << " progressive");
    CheckAgainstReferences(TjEncode(rgb.data(), w, h, TJPF_RGB, TJSAMP_420, TJFLAG_PROGRESSIVE),
                           w, h, ResizeCrop(256, 224), dct_scale);
  }
}

TEST_CASE("Tiny images decode without trouble") {
  for (auto [w, h] : {std::pair{1, 1}, {2, 3}, {7, 5}, {16, 9}, {1, 300}}) {
    INFO("image " << w << "x" << h);
    const std::vector<uint8_t> jpeg = MakeJpeg(w, h);
    for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
      ImageDecoder decoder(path);
      GuardedImage out(224, 224);
      REQUIRE(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224,
                                     out.stride).ok());
      CHECK(out.GuardsIntact());
      GuardedImage ref(224, 224);
      REQUIRE(decoder.ReferenceDecodeInto(jpeg, ResizeCrop(256, 224), ref.data(), 224, 224,
                                          ref.stride).ok());
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
  CHECK(decoder.ReferenceDecodeInto(jpeg, ResizeCrop(256, 0), out.data(), 256, 256, out.stride)
            .code() == StatusCode::kInvalidArgument);
  CHECK(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 0), out.data(), 341, 256, out.stride).ok());
  // A stride too small for the row, no buffer, bad ops.
  CHECK(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 0), out.data(), 341, 256, 341 * 3 - 1)
            .code() == StatusCode::kInvalidArgument);
  CHECK(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 0), nullptr, 341, 256, out.stride).code() ==
        StatusCode::kInvalidArgument);
  ImageOps bad;
  bad.crop_width = 10;
  CHECK(decoder.DecodeJpegInto(jpeg, bad, out.data(), 341, 256, out.stride).code() ==
        StatusCode::kInvalidArgument);
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
  Status s = decoder.DecodeJpegInto(bomb, ResizeCrop(256, 224), out.data(), 224, 224,
                                    out.stride, &info);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start).count();
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Catch::Contains("60000x60000"));
  CHECK_THAT(s.message(), Catch::Contains("178956970"));
  CHECK(ms < 50);  // refused from the header: nothing was decoded (a 3.6 Gpixel decode is not)
  CHECK(decoder.ReferenceDecodeInto(bomb, ResizeCrop(256, 224), out.data(), 224, 224,
                                    out.stride).code() == StatusCode::kResourceExhausted);

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
  for (auto [w, h] : {std::pair{500, 375}, {2000, 1500}, {100, 80}, {375, 500}, {1024, 768},
                      {333, 517}, {500, 375}, {7, 5}}) {
    for (const ImageOps& ops : {ResizeCrop(256, 224), ResizeCrop(0, 121),
                                ResizeCrop(160, 128, Interpolation::kArea)}) {
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
    REQUIRE(decoder.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride)
                .ok());
  }
  CHECK(decoder.sws_contexts_built() == 1);
}

TEST_CASE("A moved decoder keeps working") {
  const std::vector<uint8_t> jpeg = MakeJpeg(500, 375);
  ImageDecoder a;
  GuardedImage out(224, 224);
  REQUIRE(a.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).ok());
  ImageDecoder b(std::move(a));
  REQUIRE(b.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).ok());
  ImageDecoder c;
  c = std::move(b);
  REQUIRE(c.DecodeJpegInto(jpeg, ResizeCrop(256, 224), out.data(), 224, 224, out.stride).ok());
  CHECK(c.sws_contexts_built() == 1);
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

TEST_CASE("Decode throughput, one thread", "[.bench]") {
  const int w = 500, h = 400;
  const std::vector<uint8_t> jpeg = MakePhotoLikeJpeg(w, h);
  const ImageOps ops = ResizeCrop(256, 224);
  std::vector<uint8_t> out(224 * 224 * 3);
  std::printf("media bench: %dx%d JPEG, %zu bytes, Resize(256) + CenterCrop(224), one thread\n",
              w, h, jpeg.size());

  {
    std::vector<uint8_t> full(static_cast<size_t>(w) * h * 3);
    tjhandle tj = tjInitDecompress();
    REQUIRE(tj != nullptr);
    Measure("libjpeg-turbo full decode to RGB, no resize", [&] {
      REQUIRE(tjDecompress2(tj, jpeg.data(), jpeg.size(), full.data(), w, 0, h, TJPF_RGB, 0) ==
              0);
    });
    tjDestroy(tj);
  }
  for (JpegDecodePath path : {JpegDecodePath::kYuvPlanes, JpegDecodePath::kRgb}) {
    ImageDecoder decoder(path);
    Measure(path == JpegDecodePath::kYuvPlanes ? "DecodeJpegInto, YUV planes + swscale"
                                               : "DecodeJpegInto, RGB + swscale",
            [&] { REQUIRE(decoder.DecodeJpegInto(jpeg, ops, out.data(), 224, 224, 224 * 3).ok()); });
  }
  {
    ImageDecoder decoder;
    Measure("ReferenceDecodeInto (RGB, whole resize, crop)", [&] {
      REQUIRE(decoder.ReferenceDecodeInto(jpeg, ops, out.data(), 224, 224, 224 * 3).ok());
    });
  }

  // What DCT-domain scaling buys on a bigger image (decoded at 1/2).
  const std::vector<uint8_t> big = MakePhotoLikeJpeg(1024, 768);
  std::printf("media bench: 1024x768 JPEG, %zu bytes, Resize(256) + CenterCrop(224)\n",
              big.size());
  for (bool dct : {true, false}) {
    ImageOps big_ops = ops;
    big_ops.allow_dct_scaling = dct;
    ImageDecoder decoder;
    Measure(dct ? "DecodeJpegInto, YUV, DCT scaling 1/2" : "DecodeJpegInto, YUV, no DCT scaling",
            [&] {
              REQUIRE(decoder.DecodeJpegInto(big, big_ops, out.data(), 224, 224, 224 * 3).ok());
            });
  }
}

}  // namespace
}  // namespace spdl::media
