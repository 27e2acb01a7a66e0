// image_fuzz: an image sample's bytes through ImageDecoder::DecodeInto — the call every image job
// makes per sample (jobs/sample_decoder.cc) — into a buffer of exactly one slot row
// (OutputImageBytes), so that ASan sees any write past the row. Every decoder path: JPEG through
// libjpeg-turbo (YUV planes or RGB, DCT-scaled partial decodes or full ones, gray, CMYK, EXIF
// orientation), PNG, WebP, TIFF, GIF and BMP through libavcodec, swscale and the output pass.
//
// Input (FuzzedDataProvider): the image file first, then, from the end, the ops:
//   geometry (0 resize shorter side + center crop, 1 resize to exactly h x w, 2 random resized
//   crop, 3 center crop alone, padded when the image is smaller), output width and height (1..48),
//   the shorter side (1..64), dtype, layout, gray output, EXIF orientation, alpha composite, DCT
//   scaling allowed, the JPEG RGB path instead of YUV planes, interpolation, flip probability
//   (0, 1/2, 1), normalize (float outputs), max_pixels (4096, 65536, 2^20 or 2^22), the sample seed.
// The seeds (corpus/image/, written by make_media_corpus.sh) are real files with such a trailer.
// From those fields (no more bytes read, so older inputs keep their meaning) a hash also picks
// whether ImageDecoder's JPEG window decode is on, and, for a JPEG, a window of the image at a
// DCT scale (1, 1/2, 1/4, 1/8) and RGB or gray for JpegWindowDecoder (media/jpeg_window.h) itself.
//
// max_pixels stays at most 2^22 so that what the decoders may allocate by design (a few bytes per
// source pixel) stays far under libFuzzer's -malloc_limit_mb (scripts/fuzz.sh sets 512): a larger
// allocation means something sized a buffer from the file before the guard refused it.
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - the status is OK, kDataLoss, kResourceExhausted or kFailedPrecondition (never
//     kInvalidArgument for valid ops and the right output size, never kInternal);
//   - kResourceExhausted names the limit; on OK the header's size is within max_pixels, the
//     format known, the DCT scale 1, 2, 4 or 8 (1 without DCT scaling or for non-JPEG);
//   - decoding twice into rows prefilled with different bytes — once with a decoder kept across
//     inputs, as a worker's is, once with a fresh one — gives the same status and, on OK, the
//     same bytes: every byte of the row is written (padding included), and nothing depends on
//     uninitialised memory or on the images decoded before;
//   - nothing is written outside the row (GuardedRow: poisoned guards with a pattern checked after
//     each call, for writes by the uninstrumented libraries);
//   - JpegWindowDecoder: only OK, kDataLoss or kResourceExhausted for a window inside the image;
//     on OK the region holds the window, inside the scaled image, and every byte of the window is
//     read (ASan sees a region past the buffer); when the whole image decodes too, the window's
//     pixels equal the whole decode's there (the window decode's contract).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "guarded_row.h"
#include "media/image_decoder.h"
#include "media/image_format.h"
#include "media/image_ops.h"
#include "media/jpeg_window.h"

namespace {

using namespace spdl;
using namespace spdl::media;

struct Case {
  ImageOps ops;
  int width = 0, height = 0;
  bool rgb_path = false;
  uint64_t seed = 0;
};

Case ReadCase(FuzzedDataProvider& in) {
  Case c;
  ImageOps& o = c.ops;
  const int geometry = in.ConsumeIntegralInRange(0, 3);
  c.width = in.ConsumeIntegralInRange(1, 48);
  c.height = in.ConsumeIntegralInRange(1, 48);
  const int shorter = in.ConsumeIntegralInRange(1, 64);
  switch (geometry) {
    case 0:
      o.resize_shorter = shorter;
      o.crop_height = c.height;
      o.crop_width = c.width;
      break;
    case 1:
      o.resize_height = c.height;
      o.resize_width = c.width;
      break;
    case 2:
      o.random_crop_height = c.height;
      o.random_crop_width = c.width;
      break;
    default:
      o.crop_height = c.height;
      o.crop_width = c.width;
      break;
  }
  o.dtype = static_cast<OutputDType>(in.ConsumeIntegralInRange(0, 3));
  o.layout = in.ConsumeBool() ? OutputLayout::kNCHW : OutputLayout::kNHWC;
  o.channels = in.ConsumeBool() ? 1 : 3;
  o.exif_orientation = in.ConsumeBool();
  o.alpha = in.ConsumeBool() ? AlphaMode::kComposite : AlphaMode::kDrop;
  o.background = {17, 128, 240};
  o.allow_dct_scaling = in.ConsumeBool();
  c.rgb_path = in.ConsumeBool();
  o.interpolation = static_cast<Interpolation>(in.ConsumeIntegralInRange(0, 2));
  o.flip_probability = in.ConsumeIntegralInRange(0, 2) * 0.5;
  const bool normalize = in.ConsumeBool();
  if (normalize && o.dtype != OutputDType::kUInt8) {
    o.normalize = true;
    o.mean = {0.485, 0.456, 0.406};
    o.stddev = {0.229, 0.224, 0.225};
  }
  static constexpr int64_t kMaxPixels[] = {4096, 65536, int64_t{1} << 20, int64_t{1} << 22};
  o.max_pixels = kMaxPixels[in.ConsumeIntegralInRange(0, 3)];
  c.seed = in.ConsumeIntegral<uint8_t>() * 0x9e3779b97f4a7c15ull;
  return c;
}

// The window decoder on its own: a window and scale picked by `h`, then the whole image at the same
// scale, whose pixels must agree with the window's.
void FuzzJpegWindow(const std::vector<uint8_t>& file, int width, int height, int64_t max_pixels, uint64_t h) {
  static JpegWindowDecoder* jwin = new JpegWindowDecoder;
  JpegWindowRequest r;
  r.scale_denom = 1 << ((h >> 3) & 3);
  const int sw = JpegScaledSize(width, r.scale_denom), sh = JpegScaledSize(height, r.scale_denom);
  r.x0 = static_cast<int>((h >> 8) % static_cast<uint64_t>(sw));
  r.y0 = static_cast<int>((h >> 20) % static_cast<uint64_t>(sh));
  r.x1 = r.x0 + 1 + static_cast<int>((h >> 32) % static_cast<uint64_t>(sw - r.x0));
  r.y1 = r.y0 + 1 + static_cast<int>((h >> 44) % static_cast<uint64_t>(sh - r.y0));
  r.gray = ((h >> 58) & 1) != 0;
  JpegWindowImage w;
  const Status s = jwin->Decode(file, r, max_pixels, &w);
  FUZZ_TRACE("image_fuzz: window [%d, %d) x [%d, %d) at 1/%d%s: %s\n", r.x0, r.x1, r.y0, r.y1, r.scale_denom,
             r.gray ? " gray" : "", s.ok() ? "OK" : s.message().c_str());
  const StatusCode code = s.code();
  FUZZ_CHECK(code == StatusCode::kOk || code == StatusCode::kDataLoss || code == StatusCode::kResourceExhausted);
  FUZZ_CHECK(s.ok() || !s.message().empty());
  if (!s.ok()) return;
  FUZZ_CHECK(w.image_width == sw && w.image_height == sh);
  FUZZ_CHECK(w.channels == 1 || w.channels == 3);
  FUZZ_CHECK(w.x >= 0 && w.y >= 0 && w.x + w.width <= sw && w.y + w.height <= sh);
  FUZZ_CHECK(w.x <= r.x0 && w.y <= r.y0 && w.x + w.width >= r.x1 && w.y + w.height >= r.y1);
  const size_t row = static_cast<size_t>(r.x1 - r.x0) * w.channels;
  std::vector<uint8_t> window;
  for (int y = r.y0; y < r.y1; ++y) window.insert(window.end(), w.At(r.x0, y), w.At(r.x0, y) + row);
  const int channels = w.channels;
  JpegWindowRequest all = r;
  all.x0 = all.y0 = 0;
  all.x1 = sw;
  all.y1 = sh;
  if (!jwin->Decode(file, all, max_pixels, &w).ok()) return;  // corruption outside the window
  FUZZ_CHECK(w.channels == channels && w.x == 0 && w.y == 0 && w.width == sw && w.height == sh);
  for (int y = r.y0; y < r.y1; ++y) {
    FUZZ_CHECK(std::memcmp(w.At(r.x0, y), window.data() + static_cast<size_t>(y - r.y0) * row, row) == 0);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ImageDecoder* yuv = new ImageDecoder(JpegDecodePath::kYuvPlanes);
  static ImageDecoder* rgb = new ImageDecoder(JpegDecodePath::kRgb);

  FuzzedDataProvider in(data, size);
  const Case c = ReadCase(in);
  const std::vector<uint8_t> file = in.ConsumeRemainingBytes<uint8_t>();
  FUZZ_CHECK(ValidateImageOps(c.ops).ok());
  ImageDecoder& decoder = c.rgb_path ? *rgb : *yuv;
  // Derived from the ops already read (FuzzedDataProvider takes them from the end of the input).
  const uint64_t hash =
      (c.seed ^ (uint64_t(c.width) << 8) ^ (uint64_t(c.height) << 16) ^ (uint64_t(c.ops.resize_shorter) << 24)) *
      0xbf58476d1ce4e5b9ull;
  const bool window_decode = (hash >> 61) != 0;  // on for 7 inputs in 8, as in the product
  decoder.set_jpeg_window_decode(window_decode);

  // One slot row each, on the heap and exactly sized: ASan flags a byte written past it.
  const size_t row = OutputImageBytes(c.ops, c.width, c.height);
  GuardedRow a(row, 0x55), b(row, 0xaa);

  ImageInfo info;
  const Status s = decoder.DecodeInto(file, c.ops, a.data(), c.width, c.height, c.seed, &info);
  const StatusCode code = s.code();
  FUZZ_TRACE(
      "image_fuzz: %s %dx%d dct 1/%d -> %dx%d (shorter %d, resize %dx%d, crop %dx%d, random crop %dx%d, dtype %d, %s, "
      "%d ch, interp %d, exif %d, alpha %d, flip %.1f, %s path, max_pixels %lld): %s\n",
      ImageFormatName(info.format), info.width, info.height, info.dct_scale, c.width, c.height, c.ops.resize_shorter,
      c.ops.resize_width, c.ops.resize_height, c.ops.crop_width, c.ops.crop_height, c.ops.random_crop_width,
      c.ops.random_crop_height, static_cast<int>(c.ops.dtype), c.ops.layout == OutputLayout::kNCHW ? "NCHW" : "NHWC",
      c.ops.channels, static_cast<int>(c.ops.interpolation), c.ops.exif_orientation ? 1 : 0,
      static_cast<int>(c.ops.alpha), c.ops.flip_probability, c.rgb_path ? "rgb" : "yuv",
      static_cast<long long>(c.ops.max_pixels), s.ok() ? "OK" : s.message().c_str());
  a.CheckGuards();
  FUZZ_CHECK(code == StatusCode::kOk || code == StatusCode::kDataLoss || code == StatusCode::kResourceExhausted ||
             code == StatusCode::kFailedPrecondition);
  FUZZ_CHECK(s.ok() || !s.message().empty());
  if (code == StatusCode::kResourceExhausted) FUZZ_CHECK(s.message().find("limit") != std::string::npos);
  if (s.ok()) {
    FUZZ_CHECK(info.format != ImageFormat::kUnknown);
    FUZZ_CHECK(info.width >= 1 && info.height >= 1);
    FUZZ_CHECK(int64_t{info.width} * info.height <= c.ops.max_pixels);
    FUZZ_CHECK(info.dct_scale == 1 || info.dct_scale == 2 || info.dct_scale == 4 || info.dct_scale == 8);
    if (!c.ops.allow_dct_scaling || info.format != ImageFormat::kJpeg) FUZZ_CHECK(info.dct_scale == 1);
  }

  // A fresh decoder for the second decode: what the first one carries over from earlier inputs
  // (libavcodec contexts, swscale contexts, the resampler's tables, scratch buffers) must not
  // change the result (2026-12-01: a WebP decoded after another WebP differed).
  ImageDecoder fresh(c.rgb_path ? JpegDecodePath::kRgb : JpegDecodePath::kYuvPlanes);
  fresh.set_jpeg_window_decode(window_decode);
  ImageInfo again;
  const Status s2 = fresh.DecodeInto(file, c.ops, b.data(), c.width, c.height, c.seed, &again);
  b.CheckGuards();
  FUZZ_CHECK(s2.code() == code);
  if (s.ok()) {
    FUZZ_CHECK(again.width == info.width && again.height == info.height && again.dct_scale == info.dct_scale);
    FUZZ_CHECK(std::memcmp(a.data(), b.data(), row) == 0);
  }
  if (SniffImageFormat(file) == ImageFormat::kJpeg && info.width >= 1 && info.height >= 1 &&
      int64_t{info.width} * info.height <= c.ops.max_pixels) {
    FuzzJpegWindow(file, info.width, info.height, c.ops.max_pixels, hash);
  }
  return 0;
}
