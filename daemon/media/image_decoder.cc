#include "media/image_decoder.h"

#include <turbojpeg.h>

extern "C" {
#include <libavutil/pixdesc.h>
}

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "media/ffmpeg_image.h"
#include "media/jpeg_window.h"
#include "media/pixel_convert.h"
#include "media/resample.h"
#include "media/sws_cache.h"

namespace spdl::media {
namespace {

// Every warning (a truncated file, corrupt entropy data) is an error, and a progressive JPEG may
// not have more than 500 scans (a cheap denial-of-service guard).
constexpr int kTjFlags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
// Slack after decoded pixels: swscale's SIMD readers may read a few bytes past a row's end.
constexpr size_t kBufferSlack = 256;
// A buffer above this size is freed after use rather than kept for the next image, so one huge
// image does not pin memory in every worker.
constexpr size_t kMaxRetainedBytes = size_t{64} << 20;
// Row alignment of YUV planes and of the scratch image (swscale's SIMD prefers aligned rows).
constexpr size_t kPlaneAlign = 64;
// swscale may write past the end of a very narrow output row (measured, FFmpeg 5.1: gray rows of
// 1 or 2 pixels get up to 5 bytes more). Inside an image the next row is written afterwards, but
// past the destination's last row those bytes belong to the next sample of the batch (found by
// tests/fuzz/image_fuzz). Rows narrower than this are resampled into the scratch image (which
// has slack) and copied, never straight into the destination.
constexpr size_t kMinDirectRowBytes = 16;

struct TjDeleter {
  void operator()(void* h) const noexcept { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

int InterpolationFlag(Interpolation i) {
  switch (i) {
    case Interpolation::kBilinear:
      return SWS_BILINEAR;
    case Interpolation::kBicubic:
      return SWS_BICUBIC;
    case Interpolation::kArea:
      return SWS_AREA;
    case Interpolation::kNearest:
      return SWS_POINT;
    case Interpolation::kLanczos:
      return SWS_LANCZOS;
    case Interpolation::kHamming:
      break;  // no fast path (ValidateImageOps refuses it)
  }
  return SWS_BILINEAR;
}

// swscale flags for every context. ACCURATE_RND keeps rounding exact and stops swscale from
// picking its low-precision unscaled YUV->RGB converters; FULL_CHR_H_INT/INP keep full chroma
// resolution inside swscale instead of halving it horizontally. Measured: they cost under 5% of
// DecodeJpegInto's time, and without them media_test's error budget is exceeded (mean error
// 1.2 levels against the analytic pattern, 1.06 against the reference path).
int SwsFlags(Interpolation i) {
  return InterpolationFlag(i) | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_FULL_CHR_H_INP;
}

// What a JPEG header says.
struct JpegHeader {
  int width = 0;
  int height = 0;
  int subsamp = 0;
  int colorspace = 0;
};

// Horizontal and vertical chroma subsampling factors of a TurboJPEG subsampling, and the
// matching planar swscale format; false when there is none.
bool YuvLayout(int subsamp, int* hsf, int* vsf, AVPixelFormat* format) {
  switch (subsamp) {
    case TJSAMP_444:
      *hsf = 1;
      *vsf = 1;
      *format = AV_PIX_FMT_YUV444P;
      return true;
    case TJSAMP_422:
      *hsf = 2;
      *vsf = 1;
      *format = AV_PIX_FMT_YUV422P;
      return true;
    case TJSAMP_420:
      *hsf = 2;
      *vsf = 2;
      *format = AV_PIX_FMT_YUV420P;
      return true;
    case TJSAMP_440:
      *hsf = 1;
      *vsf = 2;
      *format = AV_PIX_FMT_YUV440P;
      return true;
    case TJSAMP_411:
      *hsf = 4;
      *vsf = 1;
      *format = AV_PIX_FMT_YUV411P;
      return true;
    case TJSAMP_GRAY:
      *hsf = 1;
      *vsf = 1;
      *format = AV_PIX_FMT_GRAY8;
      return true;
    default:
      return false;
  }
}

// The first pixel of each plane of a swscale source, and the plane's row stride.
struct SourcePlanes {
  const uint8_t* data[4] = {nullptr, nullptr, nullptr, nullptr};
  int stride[4] = {0, 0, 0, 0};
};

// The part of the resized image that survives the crop, mapped back to source pixels.
Window MapKeptRegion(const ResizeCropPlan& p, int src_width, int src_height) {
  const double sx = static_cast<double>(src_width) / p.resized_width;
  const double sy = static_cast<double>(src_height) / p.resized_height;
  return {p.keep_x * sx, p.keep_y * sy, (p.keep_x + p.keep_width) * sx, (p.keep_y + p.keep_height) * sy};
}

// The DCT scaling denominator (1, 2, 4 or 8): the largest whose scaled window still has at
// least as many pixels as the target in both directions.
int ChooseDctScale(const Window& w, int target_width, int target_height) {
  for (int k : {8, 4, 2}) {
    if ((w.x1 - w.x0) / k >= target_width && (w.y1 - w.y0) / k >= target_height) return k;
  }
  return 1;
}

// Whether the fast path decodes only the window `w` (stored pixels) rather than the whole image.
// The window decoder gives RGB (libjpeg upsamples and converts colour), which swscale resamples
// at more cost than the full path's Y/Cb/Cr planes. Measured with bench/ops (one thread, 200
// ImageNet-like JPEGs, every window taking the window path): a center crop 224 of a 256 resize
// (about 57 % of the image) gained nothing (404 against 411 img/s, within noise), a random resized
// crop (mean share about half) 1.10x. So only windows of at most half the image take the window
// path (with that rule: bench/README.md).
constexpr double kWindowMaxShare = 0.5;
bool WindowPays(const Window& w, int width, int height) {
  return (w.x1 - w.x0) * (w.y1 - w.y0) <= kWindowMaxShare * width * height;
}

// One axis of the integer source rectangle at decode scale 1/k: [*start, *start + *len) within
// [0, limit).
void RoundWindow(double lo, double hi, int k, int limit, int* start, int* len) {
  const int a = std::clamp(static_cast<int>(std::lround(lo / k)), 0, limit - 1);
  const int b = std::clamp(static_cast<int>(std::lround(hi / k)), a + 1, limit);
  *start = a;
  *len = b - a;
}

// For a window starting at luma sample `start` of a plane subsampled by `factor`: the first
// chroma sample it needs, and where that sample sits relative to luma sample `start`, in 1/256
// luma pixel (JPEG and WebP centre chroma sample j on luma coordinate
// factor * j + (factor - 1) / 2).
void ChromaStart(int start, int factor, int* chroma_index, int* pos) {
  *chroma_index = start / factor;
  *pos = 256 * (factor * *chroma_index - start) + 128 * (factor - 1);
}

// Zeroes every output pixel outside the placed image (uint8, `channels` per pixel; only the first
// out_width * channels bytes of each row are touched).
void ZeroPadding(uint8_t* dst, size_t stride, const ResizeCropPlan& p, int channels) {
  if (!p.padded()) return;
  const size_t row_bytes = static_cast<size_t>(p.out_width) * channels;
  const size_t left = static_cast<size_t>(p.dst_x) * channels;
  const size_t right = static_cast<size_t>(p.dst_x + p.keep_width) * channels;
  for (int y = 0; y < p.out_height; ++y) {
    uint8_t* row = dst + y * stride;
    if (y < p.dst_y || y >= p.dst_y + p.keep_height) {
      std::memset(row, 0, row_bytes);
    } else {
      std::memset(row, 0, left);
      std::memset(row + right, 0, row_bytes - right);
    }
  }
}

// Converts n packed CMYK pixels to packed RGB in place, as libjpeg-turbo does (Adobe's inverted
// CMYK: R = C * K / 255). The RGB output never overtakes the CMYK input.
void CmykToRgbInPlace(uint8_t* px, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const unsigned c = px[4 * i], m = px[4 * i + 1], y = px[4 * i + 2], k = px[4 * i + 3];
    px[3 * i] = static_cast<uint8_t>((c * k + 127) / 255);
    px[3 * i + 1] = static_cast<uint8_t>((m * k + 127) / 255);
    px[3 * i + 2] = static_cast<uint8_t>((y * k + 127) / 255);
  }
}

// Blends n packed RGBA pixels over `bg` by alpha into packed RGB, in place (the RGB output never
// overtakes the RGBA input): (a * c + (255 - a) * bg) / 255, rounded.
void CompositeInPlace(uint8_t* px, size_t n, const std::array<uint8_t, 3>& bg) {
  for (size_t i = 0; i < n; ++i) {
    const unsigned a = px[4 * i + 3];
    for (int c = 0; c < 3; ++c) {
      px[3 * i + c] = static_cast<uint8_t>((a * px[4 * i + c] + (255 - a) * bg[c] + 127) / 255);
    }
  }
}

bool HasAlpha(AVPixelFormat f) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(f);
  return d != nullptr && (d->flags & (AV_PIX_FMT_FLAG_ALPHA | AV_PIX_FMT_FLAG_PAL));
}

// Points *src at pixel (x0, y0) of every plane of `f` and sets key's source format, range and
// chroma positions. False when swscale should not resample the format directly: bit-packed
// formats (1-bit monochrome) and hardware frames cannot be addressed at a pixel, and palette
// images are resampled through swscale's YUV palette at a loss of up to 7 levels (measured): the
// caller converts those frames to RGB first (FrameToRgb).
bool FrameWindow(const AVFrame* f, int x0, int y0, SwsKey* key, SourcePlanes* src) {
  const auto format = static_cast<AVPixelFormat>(f->format);
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(format);
  if (d == nullptr || (d->flags & (AV_PIX_FMT_FLAG_BITSTREAM | AV_PIX_FMT_FLAG_HWACCEL | AV_PIX_FMT_FLAG_PAL))) {
    return false;
  }
  key->src_format = format;
  const bool yuv = !(d->flags & AV_PIX_FMT_FLAG_RGB) && d->nb_components >= 3;
  // YUV is limited range unless said otherwise; gray is full range unless said otherwise.
  key->src_full_range = yuv ? f->color_range == AVCOL_RANGE_JPEG : f->color_range != AVCOL_RANGE_MPEG;
  const int planes = av_pix_fmt_count_planes(format);
  for (int p = 0; p < planes && p < 4; ++p) {
    int step = 0;
    for (int c = 0; c < d->nb_components; ++c) {
      if (d->comp[c].plane == p) step = std::max(step, d->comp[c].step);
    }
    int x = x0, y = y0;
    if (yuv && (p == 1 || p == 2)) {
      ChromaStart(x0, 1 << d->log2_chroma_w, &x, &key->src_h_chroma_pos);
      ChromaStart(y0, 1 << d->log2_chroma_h, &y, &key->src_v_chroma_pos);
    }
    src->data[p] = f->data[p] + static_cast<ptrdiff_t>(y) * f->linesize[p] + static_cast<ptrdiff_t>(x) * step;
    src->stride[p] = f->linesize[p];
  }
  return true;
}

// The packed format the resampled image has before the output pass: 1 or 3 channels, 8 or
// (wide) 16 bits per sample in native byte order.
AVPixelFormat PackedFormat(int channels, bool wide) {
  if (channels == 1) return wide ? AV_PIX_FMT_GRAY16 : AV_PIX_FMT_GRAY8;
  return wide ? AV_PIX_FMT_RGB48 : AV_PIX_FMT_RGB24;
}

// Whether a decoded frame has more than 8 bits per sample (a 16-bit PNG or TIFF).
bool IsWide(AVPixelFormat f) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(f);
  return d != nullptr && d->comp[0].depth > 8;
}

std::string SizeString(int64_t w, int64_t h) { return std::to_string(w) + "x" + std::to_string(h); }

ResampleFilter FilterOf(Interpolation i) {
  switch (i) {
    case Interpolation::kBilinear:
      return ResampleFilter::kBilinear;
    case Interpolation::kBicubic:
      return ResampleFilter::kBicubic;
    case Interpolation::kArea:
      return ResampleFilter::kBox;
    case Interpolation::kNearest:
      return ResampleFilter::kNearest;
    case Interpolation::kHamming:
      return ResampleFilter::kHamming;
    case Interpolation::kLanczos:
      return ResampleFilter::kLanczos;
  }
  return ResampleFilter::kBilinear;
}

// Packed RGB24 to its luma in place, as PIL's convert("L"): (19595 R + 38470 G + 7471 B + 0x8000) >> 16
// (ITU-R 601 weights in 16-bit fixed point). The one-byte output never overtakes the input.
void RgbToLumaInPlace(uint8_t* px, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = 19595u * px[3 * i] + 38470u * px[3 * i + 1] + 7471u * px[3 * i + 2] + 0x8000u;
    px[i] = static_cast<uint8_t>(v >> 16);
  }
}

}  // namespace

struct ImageDecoder::Impl {
  explicit Impl(JpegDecodePath p) : path(p) {}

  // Everything Begin() works out about one image before decoding it.
  struct Plan {
    ImageFormat format = ImageFormat::kUnknown;
    int width = 0;  // stored size
    int height = 0;
    JpegHeader jpeg;          // JPEG only
    Orientation upright;      // EXIF: displayed = upright(stored)
    ResizeCropPlan geometry;  // in the displayed image
    Window window;            // the displayed source rectangle that survives
    bool flipped = false;     // the random horizontal flip was drawn
    Orientation final;        // upright, then the flip
    Window stored_window;     // `window` in stored pixels
    int scaled_width = 0;     // the resampled kept region, in stored orientation
    int scaled_height = 0;
    int place_x = 0;  // where the kept region lands in the output (after the flip)
    int place_y = 0;
  };

  // Creates the TurboJPEG handle on first use.
  Status EnsureHandle();
  // Returns a kDataLoss Status with libjpeg-turbo's message, and drops the handle: TurboJPEG
  // 2.1 leaves a handle whose header read failed mid-marker in a state that makes it refuse the
  // next, valid, image. A fresh handle (a few microseconds) is made on the next call.
  Status TjError(const char* what);
  // Reads and checks a JPEG header.
  Status ReadHeader(std::span<const uint8_t> jpeg, JpegHeader* h);
  // The checks and planning shared by every path; fills *plan.
  Status Begin(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out, uint64_t seed,
               bool jpeg_only, ImageInfo* info, Plan* plan);
  // Decodes a JPEG to packed RGB at scale 1/k into `pixels` (rows of *pitch bytes); CMYK
  // converted. With gray (not for CMYK/YCCK): libjpeg-turbo's own grayscale output, one byte
  // per pixel (the Y of a YCbCr JPEG, chroma never decoded).
  Status DecodeRgb(std::span<const uint8_t> jpeg, const JpegHeader& h, int k, int* width, int* height, int* pitch,
                   bool gray = false);
  // Returns a buffer of at least n bytes (plus slack) from `v`, reused across calls.
  static uint8_t* Buffer(std::vector<uint8_t>& v, size_t n);
  // Frees buffers that grew past kMaxRetainedBytes.
  void TrimBuffers();
  // Decodes a JPEG to Y/Cb/Cr (or Y) planes at scale 1/k into `pixels`, rounds the window to
  // whole luma pixels, and points *src at it; fills key's source size and chroma positions.
  Status DecodeYuvWindow(std::span<const uint8_t> jpeg, const JpegHeader& h, int k, int hsf, int vsf,
                         const Window& window, SwsKey* key, SourcePlanes* src);
  // Converts a whole decoded frame to packed RGB24 in `pixels` (alpha dropped or composited by
  // ops.alpha); *pitch receives the row stride.
  Status FrameToRgb(const AVFrame* f, const ImageOps& ops, int* pitch);
  // Decodes plan.stored_window of the image and resamples it to scaled_width x scaled_height
  // packed pixels at dst (rows dst_stride bytes apart): RGB24 or GRAY8 by ops.channels.
  // DecodeFrameWindow writes 16-bit samples (RGB48 / GRAY16, native endian) instead when
  // allow_wide and the frame has more than 8 bits per sample, and says so in *wide.
  Status DecodeJpegWindow(std::span<const uint8_t> jpeg, const ImageOps& ops, const Plan& plan, uint8_t* dst,
                          size_t dst_stride, ImageInfo* info);
  Status DecodeFrameWindow(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan, uint8_t* dst,
                           size_t dst_stride, bool allow_wide, bool* wide);
  // Decodes the whole image, in stored orientation, to packed RGB in `pixels`.
  Status DecodeWhole(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan, int* pitch);
  // One swscale pass from the source planes into dst (packed, key.dst_format).
  Status Scale(const SwsKey& key, const SourcePlanes& src, uint8_t* dst, size_t dst_stride);

  Status Decode(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out, uint64_t seed,
                bool jpeg_only, ImageInfo* info);
  // The exact path's part of a JPEG: [x0, x1) x [y0, y1) of the stored image alone, decoded by jwin
  // (a full decode's pixels there), as packed pixels of ops.channels channels, PIL's way (gray
  // output: a gray JPEG's samples, else convert("L") of the RGB). *img points into jwin's buffer.
  Status DecodeJpegPart(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan, int x0, int y0, int x1,
                        int y1, PackedImage* img);
  // Resample::kExact: the whole image decoded to packed pixels (ops.channels; 16-bit when wide),
  // turned upright, then PIL's resampling of the kept window, then the output pass.
  Status DecodeExact(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out, uint64_t seed,
                     bool jpeg_only, ImageInfo* info);
  // The whole image, in stored orientation, as packed pixels of ops.channels channels in `pixels`
  // (a colour image's luma for one channel, as PIL's convert("L")); 16-bit samples when allow_wide
  // and the source has more than 8 bits (then *wide is set).
  Status DecodePacked(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan, bool allow_wide,
                      PackedImage* img, bool* wide);
  // The full-size path (no DCT scaling, no window decode; swscale resize): ReferenceDecodeInto for
  // the tests, and DecodeWithHookInto for user ops that run before the geometry.
  Status Reference(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out, uint64_t seed,
                   ImageInfo* info, const PixelHook* before_geometry = nullptr);

  // The members are independent of each other; their destruction order does not matter.
  const JpegDecodePath path;
  bool window_decode = true;  // JPEG: decode only the window (jpeg_window.h) where it applies
  TjHandle tj;
  JpegWindowDecoder jwin;
  FfmpegImageDecoder ffmpeg;
  SwsCache sws;
  Resampler resampler;
  ValueTable table;              // for the ops seen last
  std::vector<uint8_t> pixels;   // decoded RGB or YUV planes of the current image
  std::vector<uint8_t> scratch;  // the resampled image, before the output pass
  std::vector<uint8_t> resized;  // the reference path's whole resized image
  std::vector<uint8_t> upright;  // the reference path's whole upright image
};

Status ImageDecoder::Impl::EnsureHandle() {
  if (tj) return Status::Ok();
  tj.reset(tjInitDecompress());
  if (!tj) return Internal(std::string("tjInitDecompress: ") + tjGetErrorStr2(nullptr));
  return Status::Ok();
}

Status ImageDecoder::Impl::TjError(const char* what) {
  Status s = DataLoss(std::string(what) + ": " + tjGetErrorStr2(tj.get()));
  tj.reset();
  return s;
}

Status ImageDecoder::Impl::ReadHeader(std::span<const uint8_t> jpeg, JpegHeader* h) {
  SPDL_RETURN_IF_ERROR(EnsureHandle());
  if (jpeg.empty()) return DataLoss("not a JPEG: no data");
  if (tjDecompressHeader3(tj.get(), jpeg.data(), jpeg.size(), &h->width, &h->height, &h->subsamp, &h->colorspace) !=
      0) {
    return TjError("not a decodable JPEG");
  }
  if (h->width <= 0 || h->height <= 0) {
    tj.reset();  // a tables-only stream: be as careful as after an error
    return DataLoss("JPEG header gives no image size (tables only, or cut short)");
  }
  return Status::Ok();
}

Status ImageDecoder::Impl::Begin(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out,
                                 uint64_t seed, bool jpeg_only, ImageInfo* info, Plan* plan) {
  SPDL_RETURN_IF_ERROR(ValidateImageOps(ops));
  if (out.channels != ops.channels) {
    return InvalidArgument("destination has " + std::to_string(out.channels) + " channel(s), the ops " +
                           std::to_string(ops.channels));
  }
  if (out.data == nullptr || out.width <= 0 || out.height <= 0) {
    return InvalidArgument("no destination, or an empty one (" + SizeString(out.width, out.height) + ")");
  }
  if (out.layout == OutputLayout::kNHWC) {
    const size_t row = static_cast<size_t>(out.width) * ops.channels * DTypeSize(ops.dtype);
    if (out.row_stride < row || out.row_stride > INT_MAX) {
      return InvalidArgument("destination stride " + std::to_string(out.row_stride) + " does not fit rows of " +
                             std::to_string(out.width) + " pixels of " + std::to_string(ops.channels) + " channel(s)");
    }
  }
  if (info != nullptr) *info = ImageInfo{};

  // The format and the stored size, from the header alone.
  plan->format = SniffImageFormat(data);
  if (jpeg_only && plan->format != ImageFormat::kJpeg) {
    if (data.empty()) return DataLoss("not a JPEG: no data");
    return DataLoss(std::string("not a JPEG (") + ImageFormatName(plan->format) + " data)");
  }
  if (plan->format == ImageFormat::kUnknown) {
    return DataLoss(data.empty() ? std::string("no data")
                                 : "unrecognised image data (not JPEG, PNG, WebP, BMP, TIFF "
                                   "or GIF)");
  }
  if (plan->format == ImageFormat::kJpeg) {
    SPDL_RETURN_IF_ERROR(ReadHeader(data, &plan->jpeg));
    plan->width = plan->jpeg.width;
    plan->height = plan->jpeg.height;
  } else {
    SPDL_RETURN_IF_ERROR(ReadImageSize(plan->format, data, &plan->width, &plan->height));
  }
  if (info != nullptr) {
    info->format = plan->format;
    info->width = plan->width;
    info->height = plan->height;
  }
  const int64_t pixels = int64_t{plan->width} * plan->height;
  if (pixels > ops.max_pixels) {
    return ResourceExhausted("image " + SizeString(plan->width, plan->height) + " has " + std::to_string(pixels) +
                             " pixels, over the limit of " + std::to_string(ops.max_pixels));
  }

  // Upright first: the geometry applies to the image as displayed.
  int tag = 1;
  if (ops.exif_orientation && plan->format == ImageFormat::kJpeg) {
    tag = ReadJpegExifOrientation(data);
  }
  plan->upright = OrientationFromExif(tag);
  const int dw = plan->upright.transpose ? plan->height : plan->width;
  const int dh = plan->upright.transpose ? plan->width : plan->height;
  if (info != nullptr) info->orientation = tag;

  ResizeCropPlan& g = plan->geometry;
  if (ops.random_crop()) {
    SampleRng rng(seed, RandomStream::kResizedCrop);
    const CropRect r = PlanRandomResizedCrop(ops, dw, dh, rng);
    g.resized_width = g.out_width = g.keep_width = ops.random_crop_width;
    g.resized_height = g.out_height = g.keep_height = ops.random_crop_height;
    plan->window = {double(r.x), double(r.y), double(r.x + r.width), double(r.y + r.height)};
    if (info != nullptr) info->crop = r;
  } else {
    g = PlanResizeCrop(ops, dw, dh);
    plan->window = MapKeptRegion(g, dw, dh);
  }
  if (g.out_width != out.width || g.out_height != out.height) {
    return InvalidArgument("a " + SizeString(dw, dh) + " image becomes " + SizeString(g.out_width, g.out_height) +
                           ", not the expected " + SizeString(out.width, out.height));
  }
  if (ops.flip_probability > 0) {
    SampleRng rng(seed, RandomStream::kFlip);
    plan->flipped = rng.Bernoulli(ops.flip_probability);
  }
  if (info != nullptr) info->flipped = plan->flipped;
  plan->final = plan->flipped ? MirrorHorizontally(plan->upright) : plan->upright;
  plan->place_x = plan->flipped ? g.out_width - g.dst_x - g.keep_width : g.dst_x;
  plan->place_y = g.dst_y;
  plan->stored_window = DisplayedToStored(plan->window, plan->upright, plan->width, plan->height);
  plan->scaled_width = plan->upright.transpose ? g.keep_height : g.keep_width;
  plan->scaled_height = plan->upright.transpose ? g.keep_width : g.keep_height;
  return Status::Ok();
}

uint8_t* ImageDecoder::Impl::Buffer(std::vector<uint8_t>& v, size_t n) {
  if (v.size() < n + kBufferSlack) v.resize(n + kBufferSlack);
  return v.data();
}

void ImageDecoder::Impl::TrimBuffers() {
  for (std::vector<uint8_t>* v : {&pixels, &scratch, &resized, &upright}) {
    if (v->size() > kMaxRetainedBytes) std::vector<uint8_t>().swap(*v);
  }
  resampler.Trim(kMaxRetainedBytes);
  ffmpeg.Trim(kMaxRetainedBytes);
  jwin.Trim(kMaxRetainedBytes);
}

Status ImageDecoder::Impl::DecodeRgb(std::span<const uint8_t> jpeg, const JpegHeader& h, int k, int* width, int* height,
                                     int* pitch, bool gray) {
  const tjscalingfactor sf{1, k};
  *width = TJSCALED(h.width, sf);
  *height = TJSCALED(h.height, sf);
  const bool cmyk = h.colorspace == TJCS_CMYK || h.colorspace == TJCS_YCCK;
  if (gray && cmyk) return Internal("CMYK JPEGs have no grayscale output: decode to RGB");
  const int in_pitch = *width * (gray ? 1 : cmyk ? 4 : 3);
  uint8_t* buf = Buffer(pixels, static_cast<size_t>(in_pitch) * *height);
  if (tjDecompress2(tj.get(), jpeg.data(), jpeg.size(), buf, *width, in_pitch, *height,
                    gray   ? TJPF_GRAY
                    : cmyk ? TJPF_CMYK
                           : TJPF_RGB,
                    kTjFlags) != 0) {
    return TjError("JPEG decode failed");
  }
  if (cmyk) CmykToRgbInPlace(buf, static_cast<size_t>(*width) * *height);
  *pitch = *width * (gray ? 1 : 3);
  return Status::Ok();
}

Status ImageDecoder::Impl::Scale(const SwsKey& key, const SourcePlanes& src, uint8_t* dst, size_t dst_stride) {
  SwsContext* c = sws.Get(key);
  if (c == nullptr) {
    return Internal("swscale refused " + SizeString(key.src_width, key.src_height) + " " +
                    av_get_pix_fmt_name(key.src_format) + " -> " + SizeString(key.dst_width, key.dst_height));
  }
  uint8_t* const dst_planes[4] = {dst, nullptr, nullptr, nullptr};
  const int dst_strides[4] = {static_cast<int>(dst_stride), 0, 0, 0};
  const int rows = sws_scale(c, src.data, src.stride, 0, key.src_height, dst_planes, dst_strides);
  if (rows != key.dst_height) {
    return Internal("swscale wrote " + std::to_string(rows) + " rows, not " + std::to_string(key.dst_height));
  }
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodeYuvWindow(std::span<const uint8_t> jpeg, const JpegHeader& h, int k, int hsf, int vsf,
                                           const Window& window, SwsKey* key, SourcePlanes* src) {
  const tjscalingfactor sf{1, k};
  const int width = TJSCALED(h.width, sf);
  const int height = TJSCALED(h.height, sf);
  const int planes = h.subsamp == TJSAMP_GRAY ? 1 : 3;
  size_t offset[3] = {0, 0, 0};
  int strides[3] = {0, 0, 0};
  size_t total = 0;
  for (int c = 0; c < planes; ++c) {
    const int pw = tjPlaneWidth(c, width, h.subsamp);
    const int ph = tjPlaneHeight(c, height, h.subsamp);
    if (pw <= 0 || ph <= 0) return DataLoss("JPEG has an unsupported plane layout");
    strides[c] = static_cast<int>(AlignUp(pw, kPlaneAlign));
    offset[c] = total;
    total += AlignUp(static_cast<size_t>(strides[c]) * ph + kBufferSlack, kPlaneAlign);
  }
  uint8_t* buf = Buffer(pixels, total);
  unsigned char* plane_ptrs[3] = {buf + offset[0], buf + offset[1], buf + offset[2]};
  if (tjDecompressToYUVPlanes(tj.get(), jpeg.data(), jpeg.size(), plane_ptrs, width, strides, height, kTjFlags) != 0) {
    return TjError("JPEG decode failed");
  }
  int x0, y0;
  RoundWindow(window.x0, window.x1, k, width, &x0, &key->src_width);
  RoundWindow(window.y0, window.y1, k, height, &y0, &key->src_height);
  src->data[0] = plane_ptrs[0] + static_cast<size_t>(y0) * strides[0] + x0;
  src->stride[0] = strides[0];
  if (planes == 3) {
    // The window may start mid chroma pair: start at the chroma sample covering it and tell
    // swscale where that sample sits, rather than shifting the luma window.
    int cx, cy;
    ChromaStart(x0, hsf, &cx, &key->src_h_chroma_pos);
    ChromaStart(y0, vsf, &cy, &key->src_v_chroma_pos);
    for (int c = 1; c < 3; ++c) {
      src->data[c] = plane_ptrs[c] + static_cast<size_t>(cy) * strides[c] + cx;
      src->stride[c] = strides[c];
    }
  }
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodeJpegWindow(std::span<const uint8_t> jpeg, const ImageOps& ops, const Plan& plan,
                                            uint8_t* dst, size_t dst_stride, ImageInfo* info) {
  const JpegHeader& h = plan.jpeg;
  const Window& window = plan.stored_window;
  const int k = ops.allow_dct_scaling ? ChooseDctScale(window, plan.scaled_width, plan.scaled_height) : 1;
  if (info != nullptr) info->dct_scale = k;

  // Gray output: libjpeg-turbo's own grayscale output (CMYK has none: through RGB, then
  // swscale's luma).
  const bool cmyk = h.colorspace == TJCS_CMYK || h.colorspace == TJCS_YCCK;
  const bool gray = ops.channels == 1 && !cmyk;
  int hsf = 1, vsf = 1;
  AVPixelFormat yuv_format = AV_PIX_FMT_NONE;
  const bool yuv = !gray && path == JpegDecodePath::kYuvPlanes &&
                   (h.colorspace == TJCS_YCbCr || h.colorspace == TJCS_GRAY) &&
                   YuvLayout(h.subsamp, &hsf, &vsf, &yuv_format);

  SwsKey key;
  key.dst_width = plan.scaled_width;
  key.dst_height = plan.scaled_height;
  key.dst_format = PackedFormat(ops.channels, /*wide=*/false);
  key.flags = SwsFlags(ops.interpolation);
  SourcePlanes src;
  if (window_decode && WindowPays(window, h.width, h.height)) {
    // Only the window (DCT-scaled as chosen), to RGB or gray by libjpeg: rows below it never
    // decoded, columns outside it never transformed.
    const int width = JpegScaledSize(h.width, k), height = JpegScaledSize(h.height, k);
    int x0, y0;
    RoundWindow(window.x0, window.x1, k, width, &x0, &key.src_width);
    RoundWindow(window.y0, window.y1, k, height, &y0, &key.src_height);
    JpegWindowRequest r;
    r.scale_denom = k;
    r.x0 = x0;
    r.y0 = y0;
    r.x1 = x0 + key.src_width;
    r.y1 = y0 + key.src_height;
    r.gray = gray;
    JpegWindowImage img;
    SPDL_RETURN_IF_ERROR(jwin.Decode(jpeg, r, ops.max_pixels, &img));
    key.src_format = img.channels == 1 ? AV_PIX_FMT_GRAY8 : AV_PIX_FMT_RGB24;
    src.data[0] = img.At(x0, y0);
    src.stride[0] = static_cast<int>(img.stride);
  } else if (yuv) {
    key.src_format = yuv_format;
    SPDL_RETURN_IF_ERROR(DecodeYuvWindow(jpeg, h, k, hsf, vsf, window, &key, &src));
  } else {
    int width, height, pitch;
    SPDL_RETURN_IF_ERROR(DecodeRgb(jpeg, h, k, &width, &height, &pitch, gray));
    int x0, y0;
    RoundWindow(window.x0, window.x1, k, width, &x0, &key.src_width);
    RoundWindow(window.y0, window.y1, k, height, &y0, &key.src_height);
    key.src_format = gray ? AV_PIX_FMT_GRAY8 : AV_PIX_FMT_RGB24;
    src.data[0] = pixels.data() + static_cast<size_t>(y0) * pitch + static_cast<size_t>(x0) * (gray ? 1 : 3);
    src.stride[0] = pitch;
  }
  return Scale(key, src, dst, dst_stride);
}

Status ImageDecoder::Impl::FrameToRgb(const AVFrame* f, const ImageOps& ops, int* pitch) {
  const auto format = static_cast<AVPixelFormat>(f->format);
  const bool composite = ops.alpha == AlphaMode::kComposite && HasAlpha(format);
  const int bpp = composite ? 4 : 3;
  *pitch = f->width * bpp;
  uint8_t* buf = Buffer(pixels, static_cast<size_t>(*pitch) * f->height);
  SwsKey key;
  key.src_width = key.dst_width = f->width;
  key.src_height = key.dst_height = f->height;
  key.dst_format = composite ? AV_PIX_FMT_RGBA : AV_PIX_FMT_RGB24;
  // The resampling flags, though the size does not change: chroma upsampling follows them.
  key.flags = SwsFlags(ops.interpolation);
  SourcePlanes src;
  if (!FrameWindow(f, 0, 0, &key, &src)) {
    key.src_format = format;  // bit-packed or palette: swscale reads the planes as they are
    for (int p = 0; p < 4; ++p) {
      src.data[p] = f->data[p];
      src.stride[p] = f->linesize[p];
    }
  }
  SPDL_RETURN_IF_ERROR(Scale(key, src, buf, *pitch));
  if (composite) {
    CompositeInPlace(buf, static_cast<size_t>(f->width) * f->height, ops.background);
    *pitch = f->width * 3;
  }
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodeFrameWindow(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan,
                                             uint8_t* dst, size_t dst_stride, bool allow_wide, bool* wide) {
  *wide = false;
  SPDL_ASSIGN_OR_RETURN(const AVFrame* f, ffmpeg.Decode(plan.format, data, ops.max_pixels));
  if (f->width != plan.width || f->height != plan.height) {
    return DataLoss(std::string(ImageFormatName(plan.format)) + " decoded to " + SizeString(f->width, f->height) +
                    ", not the header's " + SizeString(plan.width, plan.height));
  }
  const Window& w = plan.stored_window;
  int x0, y0;
  SwsKey key;
  RoundWindow(w.x0, w.x1, 1, f->width, &x0, &key.src_width);
  RoundWindow(w.y0, w.y1, 1, f->height, &y0, &key.src_height);
  key.dst_width = plan.scaled_width;
  key.dst_height = plan.scaled_height;
  key.dst_format = PackedFormat(ops.channels, /*wide=*/false);
  key.flags = SwsFlags(ops.interpolation);
  SourcePlanes src;
  const auto format = static_cast<AVPixelFormat>(f->format);
  const bool composite = ops.alpha == AlphaMode::kComposite && HasAlpha(format);
  if (!composite && FrameWindow(f, x0, y0, &key, &src)) {
    // 16-bit samples stay 16-bit through swscale when the output can hold them.
    *wide = allow_wide && IsWide(format);
    key.dst_format = PackedFormat(ops.channels, *wide);
  } else {
    int pitch;
    SPDL_RETURN_IF_ERROR(FrameToRgb(f, ops, &pitch));
    key.src_format = AV_PIX_FMT_RGB24;
    key.src_h_chroma_pos = key.src_v_chroma_pos = SwsKey::kDefaultChromaPos;
    src = SourcePlanes{};
    src.data[0] = pixels.data() + static_cast<size_t>(y0) * pitch + static_cast<size_t>(x0) * 3;
    src.stride[0] = pitch;
  }
  return Scale(key, src, dst, dst_stride);
}

Status ImageDecoder::Impl::Decode(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out,
                                  uint64_t seed, bool jpeg_only, ImageInfo* info) {
  if (ops.resample == Resample::kExact) return DecodeExact(data, ops, out, seed, jpeg_only, info);
  Plan plan;
  SPDL_RETURN_IF_ERROR(Begin(data, ops, out, seed, jpeg_only, info, &plan));
  const ResizeCropPlan& g = plan.geometry;
  // Straight into the destination when nothing is left to do after swscale; else into the
  // scratch image, then the output pass.
  const bool direct = ops.raw_output() && plan.final.identity() &&
                      static_cast<size_t>(plan.scaled_width) * ops.channels >= kMinDirectRowBytes;
  // Floating-point outputs keep a 16-bit source's precision (the scratch image is then 16-bit).
  const bool allow_wide = ops.dtype != OutputDType::kUInt8;
  const int c = ops.channels;
  uint8_t* target;
  size_t target_stride;
  if (direct) {
    target = static_cast<uint8_t*>(out.data) + static_cast<size_t>(g.dst_y) * out.row_stride +
             static_cast<size_t>(g.dst_x) * c;
    target_stride = out.row_stride;
  } else {
    target_stride = AlignUp(static_cast<size_t>(plan.scaled_width) * c * (allow_wide ? 2 : 1), kPlaneAlign);
    target = Buffer(scratch, target_stride * plan.scaled_height);
  }
  bool wide = false;
  if (plan.format == ImageFormat::kJpeg) {
    SPDL_RETURN_IF_ERROR(DecodeJpegWindow(data, ops, plan, target, target_stride, info));
  } else {
    SPDL_RETURN_IF_ERROR(DecodeFrameWindow(data, ops, plan, target, target_stride, allow_wide, &wide));
  }
  if (info != nullptr) info->sample_bits = wide ? 16 : 8;
  if (direct) {
    ZeroPadding(static_cast<uint8_t*>(out.data), out.row_stride, g, c);
    return Status::Ok();
  }
  if (!table.BuiltFor(ops)) table.Build(ops);
  SourceImage src;
  src.data = target;
  src.stride = target_stride;
  src.width = plan.scaled_width;
  src.height = plan.scaled_height;
  src.channels = c;
  src.wide = wide;
  ConvertInto(src, plan.final, plan.place_x, plan.place_y, table, out);
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodePacked(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan,
                                        bool allow_wide, PackedImage* img, bool* wide) {
  *wide = false;
  int pitch = 0;
  img->width = plan.width;
  img->height = plan.height;
  img->channels = ops.channels;
  if (plan.format == ImageFormat::kJpeg) {
    // libjpeg-turbo's defaults (ISLOW DCT, fancy upsampling, its own YCbCr -> RGB), as PIL decodes.
    // A grayscale JPEG gives its one channel directly for gray output (PIL's "L" image).
    const bool gray_source = plan.jpeg.colorspace == TJCS_GRAY;
    int width, height;
    SPDL_RETURN_IF_ERROR(
        DecodeRgb(data, plan.jpeg, 1, &width, &height, &pitch, /*gray=*/ops.channels == 1 && gray_source));
    if (ops.channels == 1 && !gray_source) {
      RgbToLumaInPlace(pixels.data(), static_cast<size_t>(width) * height);
      pitch = width;
    }
  } else {
    SPDL_ASSIGN_OR_RETURN(const AVFrame* f, ffmpeg.Decode(plan.format, data, ops.max_pixels));
    if (f->width != plan.width || f->height != plan.height) {
      return DataLoss(std::string(ImageFormatName(plan.format)) + " decoded to " + SizeString(f->width, f->height) +
                      ", not the header's " + SizeString(plan.width, plan.height));
    }
    const auto format = static_cast<AVPixelFormat>(f->format);
    const bool composite = ops.alpha == AlphaMode::kComposite && HasAlpha(format);
    SwsKey key;
    key.src_width = key.dst_width = f->width;
    key.src_height = key.dst_height = f->height;
    key.flags = SwsFlags(Interpolation::kBilinear);
    SourcePlanes src;
    if (allow_wide && IsWide(format) && !composite && FrameWindow(f, 0, 0, &key, &src)) {
      // 16 bits kept for floating-point outputs (swscale converts at full size, nothing resampled).
      *wide = true;
      key.dst_format = PackedFormat(ops.channels, /*wide=*/true);
      pitch = f->width * ops.channels * 2;
      SPDL_RETURN_IF_ERROR(Scale(key, src, Buffer(pixels, static_cast<size_t>(pitch) * f->height), pitch));
    } else {
      // As PIL's convert("RGB") (alpha dropped or composited, palettes expanded), then its luma
      // for gray output (a gray source's luma is itself).
      SPDL_RETURN_IF_ERROR(FrameToRgb(f, ops, &pitch));
      if (ops.channels == 1) {
        RgbToLumaInPlace(pixels.data(), static_cast<size_t>(f->width) * f->height);
        pitch = f->width;
      }
    }
  }
  img->data = pixels.data();
  img->stride = static_cast<size_t>(pitch);
  img->wide = *wide;
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodeJpegPart(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan, int x0,
                                          int y0, int x1, int y1, PackedImage* img) {
  const bool gray_source = plan.jpeg.colorspace == TJCS_GRAY;
  JpegWindowRequest r;
  r.x0 = x0;
  r.y0 = y0;
  r.x1 = x1;
  r.y1 = y1;
  r.gray = ops.channels == 1 && gray_source;
  JpegWindowImage w;
  SPDL_RETURN_IF_ERROR(jwin.Decode(data, r, ops.max_pixels, &w));
  uint8_t* first = w.At(r.x0, r.y0);
  const int width = r.x1 - r.x0, height = r.y1 - r.y0;
  if (ops.channels == 1 && w.channels == 3) {
    // PIL's convert("L") of the RGB pixels, row by row in place.
    for (int y = 0; y < height; ++y) RgbToLumaInPlace(first + static_cast<size_t>(y) * w.stride, width);
  }
  img->data = first;
  img->stride = w.stride;
  img->width = width;
  img->height = height;
  img->channels = ops.channels;
  img->wide = false;
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodeExact(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out,
                                       uint64_t seed, bool jpeg_only, ImageInfo* info) {
  Plan plan;
  SPDL_RETURN_IF_ERROR(Begin(data, ops, out, seed, jpeg_only, info, &plan));
  const ResizeCropPlan& g = plan.geometry;
  const bool allow_wide = ops.dtype != OutputDType::kUInt8;
  PackedImage img;
  bool wide = false;
  // An upright JPEG: only the part the output depends on is decoded (the same pixels as a full
  // decode's there, jpeg_window.h): a random resized crop's rectangle (what PIL resizes), or the
  // source samples the resampler reads for the kept window of a resize + center crop.
  const bool jpeg_part = window_decode && plan.format == ImageFormat::kJpeg && plan.upright.identity();
  const bool jpeg_crop = jpeg_part && ops.random_crop();
  ResampleRequest req;
  req.filter = FilterOf(ops.interpolation);
  int sx0 = 0, sx1 = plan.width, sy0 = 0, sy1 = plan.height;
  if (jpeg_part && !jpeg_crop) {
    SourceSpan(plan.width, g.resized_width, req.filter, g.keep_x, g.keep_x + g.keep_width, &sx0, &sx1);
    SourceSpan(plan.height, g.resized_height, req.filter, g.keep_y, g.keep_y + g.keep_height, &sy0, &sy1);
  }
  const bool jpeg_span =
      jpeg_part && !jpeg_crop && int64_t{sx1 - sx0} * (sy1 - sy0) < int64_t{plan.width} * plan.height;
  if (jpeg_crop) {
    SPDL_RETURN_IF_ERROR(DecodeJpegPart(data, ops, plan, static_cast<int>(plan.window.x0),
                                        static_cast<int>(plan.window.y0), static_cast<int>(plan.window.x1),
                                        static_cast<int>(plan.window.y1), &img));
  } else if (jpeg_span) {
    SPDL_RETURN_IF_ERROR(DecodeJpegPart(data, ops, plan, sx0, sy0, sx1, sy1, &img));
    req.src_x = sx0;
    req.src_y = sy0;
    req.full_width = plan.width;
    req.full_height = plan.height;
  } else {
    SPDL_RETURN_IF_ERROR(DecodePacked(data, ops, plan, allow_wide, &img, &wide));
  }
  if (info != nullptr) info->sample_bits = wide ? 16 : 8;
  const size_t pixel = static_cast<size_t>(ops.channels) * (wide ? 2 : 1);

  // Upright first (PIL's exif_transpose comes before the transforms), so the passes run in the
  // displayed image's order.
  const Orientation o = plan.upright;
  if (!o.identity()) {
    const int sw = img.width, sh = img.height;
    const int dw = o.transpose ? sh : sw, dh = o.transpose ? sw : sh;
    uint8_t* up = Buffer(upright, static_cast<size_t>(dw) * dh * pixel);
    for (int y = 0; y < dh; ++y) {
      for (int x = 0; x < dw; ++x) {
        const int u = o.transpose ? y : x, v = o.transpose ? x : y;
        const int sx = o.flip_x ? sw - 1 - u : u, sy = o.flip_y ? sh - 1 - v : v;
        std::memcpy(up + (static_cast<size_t>(y) * dw + x) * pixel,
                    img.data + static_cast<size_t>(sy) * img.stride + static_cast<size_t>(sx) * pixel, pixel);
      }
    }
    img.data = up;
    img.stride = static_cast<size_t>(dw) * pixel;
    img.width = dw;
    img.height = dh;
  }

  // What PIL resizes: the whole image, or (random_resized_crop: crop, then resize) the crop alone.
  if (ops.random_crop() && !jpeg_crop) {
    const auto x0 = static_cast<int>(plan.window.x0), y0 = static_cast<int>(plan.window.y0);
    img.data += static_cast<size_t>(y0) * img.stride + static_cast<size_t>(x0) * pixel;
    img.width = static_cast<int>(plan.window.x1) - x0;
    img.height = static_cast<int>(plan.window.y1) - y0;
  }
  req.out_width = g.resized_width;
  req.out_height = g.resized_height;
  req.window_x = g.keep_x;
  req.window_y = g.keep_y;
  req.window_width = g.keep_width;
  req.window_height = g.keep_height;
  // The random horizontal flip is folded into the resampler's horizontal pass (the same values,
  // written right to left), and the kept window lands where the flip puts it.
  req.mirror = plan.flipped;
  ResizeCropPlan placed = g;
  if (plan.flipped) placed.dst_x = g.out_width - g.dst_x - g.keep_width;

  // Straight into the destination when nothing is left to do; else into the scratch image, then
  // the output pass (dtype, normalization, layout).
  if (ops.raw_output()) {
    uint8_t* target = static_cast<uint8_t*>(out.data) + static_cast<size_t>(placed.dst_y) * out.row_stride +
                      static_cast<size_t>(placed.dst_x) * ops.channels;
    SPDL_RETURN_IF_ERROR(resampler.Resample(img, req, target, out.row_stride));
    ZeroPadding(static_cast<uint8_t*>(out.data), out.row_stride, placed, ops.channels);
    return Status::Ok();
  }
  const size_t target_stride = AlignUp(static_cast<size_t>(g.keep_width) * pixel, kPlaneAlign);
  uint8_t* target = Buffer(scratch, target_stride * g.keep_height);
  SPDL_RETURN_IF_ERROR(resampler.Resample(img, req, target, target_stride));
  if (!table.BuiltFor(ops)) table.Build(ops);
  SourceImage src;
  src.data = target;
  src.stride = target_stride;
  src.width = g.keep_width;
  src.height = g.keep_height;
  src.channels = ops.channels;
  src.wide = wide;
  ConvertInto(src, Orientation{}, placed.dst_x, placed.dst_y, table, out);
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodeWhole(std::span<const uint8_t> data, const ImageOps& ops, const Plan& plan,
                                       int* pitch) {
  if (plan.format == ImageFormat::kJpeg) {
    int width, height;
    return DecodeRgb(data, plan.jpeg, 1, &width, &height, pitch);
  }
  SPDL_ASSIGN_OR_RETURN(const AVFrame* f, ffmpeg.Decode(plan.format, data, ops.max_pixels));
  if (f->width != plan.width || f->height != plan.height) {
    return DataLoss("decoded size differs from the header's");
  }
  return FrameToRgb(f, ops, pitch);
}

Status ImageDecoder::Impl::Reference(std::span<const uint8_t> data, const ImageOps& ops, const OutputImage& out,
                                     uint64_t seed, ImageInfo* info, const PixelHook* before_geometry) {
  if (ops.channels != 3) return InvalidArgument("the reference path writes RGB only");
  Plan plan;
  SPDL_RETURN_IF_ERROR(Begin(data, ops, out, seed, /*jpeg_only=*/false, info, &plan));
  int pitch;
  SPDL_RETURN_IF_ERROR(DecodeWhole(data, ops, plan, &pitch));

  // The whole image, upright (written out plainly, independent of pixel_convert).
  const Orientation o = plan.upright;
  const int sw = plan.width, sh = plan.height;
  const int dw = o.transpose ? sh : sw, dh = o.transpose ? sw : sh;
  const uint8_t* whole = pixels.data();
  size_t whole_pitch = static_cast<size_t>(pitch);
  if (!o.identity()) {
    uint8_t* up = Buffer(upright, static_cast<size_t>(dw) * dh * 3);
    for (int y = 0; y < dh; ++y) {
      for (int x = 0; x < dw; ++x) {
        const int u = o.transpose ? y : x, v = o.transpose ? x : y;
        const int sx = o.flip_x ? sw - 1 - u : u, sy = o.flip_y ? sh - 1 - v : v;
        std::memcpy(up + (static_cast<size_t>(y) * dw + x) * 3,
                    whole + static_cast<size_t>(sy) * whole_pitch + static_cast<size_t>(sx) * 3, 3);
      }
    }
    whole = up;
    whole_pitch = static_cast<size_t>(dw) * 3;
  }
  if (before_geometry != nullptr && *before_geometry) {
    // The whole upright image is this decoder's own buffer (pixels or upright): the hook may edit it.
    SPDL_RETURN_IF_ERROR((*before_geometry)(const_cast<uint8_t*>(whole), dw, dh, whole_pitch));
  }

  // Resize the whole image (or the random crop's rectangle), then copy the kept part.
  const ResizeCropPlan& g = plan.geometry;
  SwsKey key;
  key.src_format = AV_PIX_FMT_RGB24;
  key.dst_format = AV_PIX_FMT_RGB24;
  key.flags = SwsFlags(ops.interpolation);
  SourcePlanes src;
  src.stride[0] = static_cast<int>(whole_pitch);
  if (ops.random_crop()) {
    const Window& w = plan.window;  // whole pixels
    src.data[0] = whole + static_cast<size_t>(w.y0) * whole_pitch + static_cast<size_t>(w.x0) * 3;
    key.src_width = static_cast<int>(w.x1 - w.x0);
    key.src_height = static_cast<int>(w.y1 - w.y0);
  } else {
    src.data[0] = whole;
    key.src_width = dw;
    key.src_height = dh;
  }
  key.dst_width = g.resized_width;
  key.dst_height = g.resized_height;
  const size_t rpitch = static_cast<size_t>(g.resized_width) * 3;
  uint8_t* rbuf = Buffer(resized, rpitch * g.resized_height);
  SPDL_RETURN_IF_ERROR(Scale(key, src, rbuf, rpitch));

  uint8_t* dst = static_cast<uint8_t*>(out.data);
  for (int y = 0; y < g.out_height; ++y) {
    std::memset(dst + y * out.row_stride, 0, static_cast<size_t>(g.out_width) * 3);
  }
  for (int y = 0; y < g.keep_height; ++y) {
    std::memcpy(dst + (g.dst_y + y) * out.row_stride + static_cast<size_t>(g.dst_x) * 3,
                rbuf + (g.keep_y + y) * rpitch + static_cast<size_t>(g.keep_x) * 3,
                static_cast<size_t>(g.keep_width) * 3);
  }
  if (plan.flipped) {
    for (int y = 0; y < g.out_height; ++y) {
      uint8_t* row = dst + y * out.row_stride;
      for (int a = 0, b = g.out_width - 1; a < b; ++a, --b) {
        for (int c = 0; c < 3; ++c) std::swap(row[3 * a + c], row[3 * b + c]);
      }
    }
  }
  return Status::Ok();
}

ImageDecoder::ImageDecoder(JpegDecodePath path) : impl_(std::make_unique<Impl>(path)) {}
ImageDecoder::~ImageDecoder() = default;
ImageDecoder::ImageDecoder(ImageDecoder&&) noexcept = default;
ImageDecoder& ImageDecoder::operator=(ImageDecoder&&) noexcept = default;

Status ImageDecoder::DecodeInto(std::span<const uint8_t> data, const ImageOps& ops, void* dst, int out_width,
                                int out_height, uint64_t sample_seed, ImageInfo* info) {
  OutputImage out;
  out.data = dst;
  out.width = out_width;
  out.height = out_height;
  out.row_stride = static_cast<size_t>(std::max(out_width, 0)) * ops.channels * DTypeSize(ops.dtype);
  out.layout = ops.layout;
  out.channels = ops.channels;
  Status s = impl_->Decode(data, ops, out, sample_seed, /*jpeg_only=*/false, info);
  impl_->TrimBuffers();
  return s;
}

namespace {

Status RequireRawOutput(const ImageOps& ops) {
  if (ops.raw_output()) return Status::Ok();
  return InvalidArgument("this call writes uint8 NHWC output only");
}

OutputImage RgbOutput(uint8_t* dst, int out_width, int out_height, size_t dst_stride, int channels) {
  OutputImage out;
  out.channels = channels;
  out.data = dst;
  out.width = out_width;
  out.height = out_height;
  out.row_stride = dst_stride;
  out.layout = OutputLayout::kNHWC;
  return out;
}

}  // namespace

Status ImageDecoder::DecodeRgbInto(std::span<const uint8_t> data, const ImageOps& ops, uint8_t* dst, int out_width,
                                   int out_height, size_t dst_stride, uint64_t sample_seed, ImageInfo* info) {
  SPDL_RETURN_IF_ERROR(RequireRawOutput(ops));
  Status s = impl_->Decode(data, ops, RgbOutput(dst, out_width, out_height, dst_stride, ops.channels), sample_seed,
                           /*jpeg_only=*/false, info);
  impl_->TrimBuffers();
  return s;
}

Status ImageDecoder::DecodeJpegInto(std::span<const uint8_t> jpeg, const ImageOps& ops, uint8_t* dst, int out_width,
                                    int out_height, size_t dst_stride, ImageInfo* info) {
  SPDL_RETURN_IF_ERROR(RequireRawOutput(ops));
  Status s = impl_->Decode(jpeg, ops, RgbOutput(dst, out_width, out_height, dst_stride, ops.channels),
                           /*seed=*/0, /*jpeg_only=*/true, info);
  impl_->TrimBuffers();
  return s;
}

#if SPDL_TEST_HOOKS
Status ImageDecoder::ReferenceDecodeInto(std::span<const uint8_t> data, const ImageOps& ops, uint8_t* dst,
                                         int out_width, int out_height, size_t dst_stride, uint64_t sample_seed,
                                         ImageInfo* info) {
  SPDL_RETURN_IF_ERROR(RequireRawOutput(ops));
  Status s =
      impl_->Reference(data, ops, RgbOutput(dst, out_width, out_height, dst_stride, ops.channels), sample_seed, info);
  impl_->TrimBuffers();
  return s;
}
#endif  // SPDL_TEST_HOOKS

Status ImageDecoder::DecodeWithHookInto(std::span<const uint8_t> data, const ImageOps& ops, uint8_t* dst, int out_width,
                                        int out_height, size_t dst_stride, uint64_t sample_seed,
                                        const PixelHook& before_geometry, ImageInfo* info) {
  SPDL_RETURN_IF_ERROR(RequireRawOutput(ops));
  Status s = impl_->Reference(data, ops, RgbOutput(dst, out_width, out_height, dst_stride, ops.channels), sample_seed,
                              info, &before_geometry);
  impl_->TrimBuffers();
  return s;
}

Status ImageDecoder::ReadJpegHeader(std::span<const uint8_t> jpeg, ImageInfo* info) {
  JpegHeader h;
  SPDL_RETURN_IF_ERROR(impl_->ReadHeader(jpeg, &h));
  *info = ImageInfo{};
  info->format = ImageFormat::kJpeg;
  info->width = h.width;
  info->height = h.height;
  return Status::Ok();
}

uint64_t ImageDecoder::sws_contexts_built() const { return impl_->sws.builds(); }

void ImageDecoder::set_jpeg_window_decode(bool on) { impl_->window_decode = on; }

}  // namespace spdl::media
