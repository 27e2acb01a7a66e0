#include "media/image_decoder.h"

#include <turbojpeg.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "media/sws_cache.h"

namespace spdl::media {
namespace {

// Every warning (a truncated file, corrupt entropy data) is an error, and a progressive JPEG may
// not have more than 500 scans (a cheap denial-of-service guard).
constexpr int kTjFlags = TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS;
// Slack after decoded pixels: swscale's SIMD readers may read a few bytes past a row's end.
constexpr size_t kBufferSlack = 256;
// A decode buffer above this size is freed after use rather than kept for the next image, so one
// huge image does not pin memory in every worker.
constexpr size_t kMaxRetainedBytes = size_t{64} << 20;
// Row alignment of YUV planes (swscale's SIMD prefers aligned rows).
constexpr size_t kPlaneAlign = 64;

struct TjDeleter {
  void operator()(void* h) const noexcept { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

size_t AlignUp(size_t n, size_t a) { return (n + a - 1) / a * a; }

int InterpolationFlag(Interpolation i) {
  switch (i) {
    case Interpolation::kBilinear: return SWS_BILINEAR;
    case Interpolation::kBicubic: return SWS_BICUBIC;
    case Interpolation::kArea: return SWS_AREA;
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

struct Header {
  int width = 0;
  int height = 0;
  int subsamp = 0;
  int colorspace = 0;
};

// Horizontal and vertical chroma subsampling factors of a TurboJPEG subsampling, and the
// matching planar swscale format; false when there is none.
bool YuvLayout(int subsamp, int* hsf, int* vsf, AVPixelFormat* format) {
  switch (subsamp) {
    case TJSAMP_444: *hsf = 1; *vsf = 1; *format = AV_PIX_FMT_YUV444P; return true;
    case TJSAMP_422: *hsf = 2; *vsf = 1; *format = AV_PIX_FMT_YUV422P; return true;
    case TJSAMP_420: *hsf = 2; *vsf = 2; *format = AV_PIX_FMT_YUV420P; return true;
    case TJSAMP_440: *hsf = 1; *vsf = 2; *format = AV_PIX_FMT_YUV440P; return true;
    case TJSAMP_411: *hsf = 4; *vsf = 1; *format = AV_PIX_FMT_YUV411P; return true;
    case TJSAMP_GRAY: *hsf = 1; *vsf = 1; *format = AV_PIX_FMT_GRAY8; return true;
    default: return false;
  }
}

// The first pixel of each plane of a swscale source, and the plane's row stride.
struct SourcePlanes {
  const uint8_t* data[4] = {nullptr, nullptr, nullptr, nullptr};
  int stride[4] = {0, 0, 0, 0};
};

// The part of the source that survives the crop, in source pixels (not yet rounded).
struct SourceWindow {
  double x0, y0, x1, y1;
};

SourceWindow MapKeptRegion(const ResizeCropPlan& p, int src_width, int src_height) {
  const double sx = static_cast<double>(src_width) / p.resized_width;
  const double sy = static_cast<double>(src_height) / p.resized_height;
  return {p.keep_x * sx, p.keep_y * sy, (p.keep_x + p.keep_width) * sx,
          (p.keep_y + p.keep_height) * sy};
}

// The DCT scaling denominator (1, 2, 4 or 8): the largest whose scaled window still has at
// least as many pixels as the target in both directions.
int ChooseDctScale(const SourceWindow& w, const ResizeCropPlan& p) {
  for (int k : {8, 4, 2}) {
    if ((w.x1 - w.x0) / k >= p.keep_width && (w.y1 - w.y0) / k >= p.keep_height) return k;
  }
  return 1;
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
// luma pixel (JPEG centres chroma sample j on luma coordinate factor * j + (factor - 1) / 2).
void ChromaStart(int start, int factor, int* chroma_index, int* pos) {
  *chroma_index = start / factor;
  *pos = 256 * (factor * *chroma_index - start) + 128 * (factor - 1);
}

// Zeroes every output pixel outside the placed image (only the first out_width * 3 bytes of
// each row are touched).
void ZeroPadding(uint8_t* dst, size_t stride, const ResizeCropPlan& p) {
  if (!p.padded()) return;
  const size_t row_bytes = static_cast<size_t>(p.out_width) * 3;
  const size_t left = static_cast<size_t>(p.dst_x) * 3;
  const size_t right = static_cast<size_t>(p.dst_x + p.keep_width) * 3;
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

std::string SizeString(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h);
}

}  // namespace

struct ImageDecoder::Impl {
  explicit Impl(JpegDecodePath p) : path(p) {}

  // Creates the TurboJPEG handle on first use.
  Status EnsureHandle();
  // Returns a kDataLoss Status with libjpeg-turbo's message, and drops the handle: TurboJPEG
  // 2.1 leaves a handle whose header read failed mid-marker in a state that makes it refuse the
  // next, valid, image. A fresh handle (a few microseconds) is made on the next call.
  Status TjError(const char* what);
  // Reads and checks the header.
  Status ReadHeader(std::span<const uint8_t> jpeg, Header* h);
  // The checks shared by both decode paths; fills *h and *plan.
  Status Begin(std::span<const uint8_t> jpeg, const ImageOps& ops, const uint8_t* dst,
               int out_width, int out_height, size_t dst_stride, ImageInfo* info, Header* h,
               ResizeCropPlan* plan);
  // Decodes to packed RGB at scale 1/k into `pixels` (rows of *pitch bytes); CMYK converted.
  Status DecodeRgb(std::span<const uint8_t> jpeg, const Header& h, int k, int* width,
                   int* height, int* pitch);
  // Returns a buffer of at least n bytes (plus slack) from `v`, reused across calls.
  static uint8_t* Buffer(std::vector<uint8_t>& v, size_t n);
  // Frees buffers that grew past kMaxRetainedBytes.
  void TrimBuffers();
  // Decodes to Y/Cb/Cr (or Y) planes at scale 1/k into `pixels`, rounds the window to whole
  // luma pixels, and points *src at it; fills key's source size and chroma positions.
  Status DecodeYuvWindow(std::span<const uint8_t> jpeg, const Header& h, int k, int hsf, int vsf,
                         const SourceWindow& window, SwsKey* key, SourcePlanes* src);
  // One swscale pass from the source planes into dst (packed RGB24).
  Status Scale(const SwsKey& key, const SourcePlanes& src, uint8_t* dst, size_t dst_stride);

  Status Decode(std::span<const uint8_t> jpeg, const ImageOps& ops, uint8_t* dst, int out_width,
                int out_height, size_t dst_stride, ImageInfo* info);
  Status Reference(std::span<const uint8_t> jpeg, const ImageOps& ops, uint8_t* dst,
                   int out_width, int out_height, size_t dst_stride, ImageInfo* info);

  // The members are independent of each other; their destruction order does not matter.
  const JpegDecodePath path;
  TjHandle tj;
  SwsCache sws;
  std::vector<uint8_t> pixels;   // decoded RGB or YUV planes of the current image
  std::vector<uint8_t> resized;  // the reference path's whole resized image
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

Status ImageDecoder::Impl::ReadHeader(std::span<const uint8_t> jpeg, Header* h) {
  SPDL_RETURN_IF_ERROR(EnsureHandle());
  if (jpeg.empty()) return DataLoss("not a JPEG: no data");
  if (tjDecompressHeader3(tj.get(), jpeg.data(), jpeg.size(), &h->width, &h->height,
                          &h->subsamp, &h->colorspace) != 0) {
    return TjError("not a decodable JPEG");
  }
  if (h->width <= 0 || h->height <= 0) {
    tj.reset();  // a tables-only stream: be as careful as after an error
    return DataLoss("JPEG header gives no image size (tables only, or cut short)");
  }
  return Status::Ok();
}

Status ImageDecoder::Impl::Begin(std::span<const uint8_t> jpeg, const ImageOps& ops,
                                 const uint8_t* dst, int out_width, int out_height,
                                 size_t dst_stride, ImageInfo* info, Header* h,
                                 ResizeCropPlan* plan) {
  SPDL_RETURN_IF_ERROR(ValidateImageOps(ops));
  if (dst == nullptr || out_width <= 0 || out_height <= 0) {
    return InvalidArgument("no destination, or an empty one (" +
                           SizeString(out_width, out_height) + ")");
  }
  if (dst_stride < static_cast<size_t>(out_width) * 3 || dst_stride > INT_MAX) {
    return InvalidArgument("destination stride " + std::to_string(dst_stride) +
                           " does not fit rows of " + std::to_string(out_width) +
                           " RGB pixels");
  }
  SPDL_RETURN_IF_ERROR(ReadHeader(jpeg, h));
  if (info != nullptr) *info = {h->width, h->height, 1};
  const int64_t pixels = int64_t{h->width} * h->height;
  if (pixels > ops.max_pixels) {
    return ResourceExhausted("image " + SizeString(h->width, h->height) + " has " +
                             std::to_string(pixels) + " pixels, over the limit of " +
                             std::to_string(ops.max_pixels));
  }
  *plan = PlanResizeCrop(ops, h->width, h->height);
  if (plan->out_width != out_width || plan->out_height != out_height) {
    return InvalidArgument("a " + SizeString(h->width, h->height) + " image becomes " +
                           SizeString(plan->out_width, plan->out_height) +
                           ", not the expected " + SizeString(out_width, out_height));
  }
  return Status::Ok();
}

uint8_t* ImageDecoder::Impl::Buffer(std::vector<uint8_t>& v, size_t n) {
  if (v.size() < n + kBufferSlack) v.resize(n + kBufferSlack);
  return v.data();
}

void ImageDecoder::Impl::TrimBuffers() {
  for (std::vector<uint8_t>* v : {&pixels, &resized}) {
    if (v->size() > kMaxRetainedBytes) std::vector<uint8_t>().swap(*v);
  }
}

Status ImageDecoder::Impl::DecodeRgb(std::span<const uint8_t> jpeg, const Header& h, int k,
                                     int* width, int* height, int* pitch) {
  const tjscalingfactor sf{1, k};
  *width = TJSCALED(h.width, sf);
  *height = TJSCALED(h.height, sf);
  const bool cmyk = h.colorspace == TJCS_CMYK || h.colorspace == TJCS_YCCK;
  const int in_pitch = *width * (cmyk ? 4 : 3);
  uint8_t* buf = Buffer(pixels, static_cast<size_t>(in_pitch) * *height);
  if (tjDecompress2(tj.get(), jpeg.data(), jpeg.size(), buf, *width, in_pitch, *height,
                    cmyk ? TJPF_CMYK : TJPF_RGB, kTjFlags) != 0) {
    return TjError("JPEG decode failed");
  }
  if (cmyk) CmykToRgbInPlace(buf, static_cast<size_t>(*width) * *height);
  *pitch = *width * 3;
  return Status::Ok();
}

Status ImageDecoder::Impl::Scale(const SwsKey& key, const SourcePlanes& src, uint8_t* dst,
                                 size_t dst_stride) {
  SwsContext* c = sws.Get(key);
  if (c == nullptr) {
    return Internal("swscale refused " + SizeString(key.src_width, key.src_height) + " -> " +
                    SizeString(key.dst_width, key.dst_height));
  }
  uint8_t* const dst_planes[4] = {dst, nullptr, nullptr, nullptr};
  const int dst_strides[4] = {static_cast<int>(dst_stride), 0, 0, 0};
  const int rows =
      sws_scale(c, src.data, src.stride, 0, key.src_height, dst_planes, dst_strides);
  if (rows != key.dst_height) {
    return Internal("swscale wrote " + std::to_string(rows) + " rows, not " +
                    std::to_string(key.dst_height));
  }
  return Status::Ok();
}

Status ImageDecoder::Impl::DecodeYuvWindow(std::span<const uint8_t> jpeg, const Header& h,
                                            int k, int hsf, int vsf, const SourceWindow& window,
                                            SwsKey* key, SourcePlanes* src) {
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
  if (tjDecompressToYUVPlanes(tj.get(), jpeg.data(), jpeg.size(), plane_ptrs, width, strides,
                              height, kTjFlags) != 0) {
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

Status ImageDecoder::Impl::Decode(std::span<const uint8_t> jpeg, const ImageOps& ops,
                                  uint8_t* dst, int out_width, int out_height, size_t dst_stride,
                                  ImageInfo* info) {
  Header h;
  ResizeCropPlan plan;
  SPDL_RETURN_IF_ERROR(
      Begin(jpeg, ops, dst, out_width, out_height, dst_stride, info, &h, &plan));
  const SourceWindow window = MapKeptRegion(plan, h.width, h.height);
  const int k = ops.allow_dct_scaling ? ChooseDctScale(window, plan) : 1;
  if (info != nullptr) info->dct_scale = k;

  int hsf = 1, vsf = 1;
  AVPixelFormat yuv_format = AV_PIX_FMT_NONE;
  const bool yuv = path == JpegDecodePath::kYuvPlanes &&
                   (h.colorspace == TJCS_YCbCr || h.colorspace == TJCS_GRAY) &&
                   YuvLayout(h.subsamp, &hsf, &vsf, &yuv_format);

  SwsKey key;
  key.dst_width = plan.keep_width;
  key.dst_height = plan.keep_height;
  key.dst_format = AV_PIX_FMT_RGB24;
  key.flags = SwsFlags(ops.interpolation);
  SourcePlanes src;
  if (yuv) {
    key.src_format = yuv_format;
    SPDL_RETURN_IF_ERROR(DecodeYuvWindow(jpeg, h, k, hsf, vsf, window, &key, &src));
  } else {
    int width, height, pitch;
    SPDL_RETURN_IF_ERROR(DecodeRgb(jpeg, h, k, &width, &height, &pitch));
    int x0, y0;
    RoundWindow(window.x0, window.x1, k, width, &x0, &key.src_width);
    RoundWindow(window.y0, window.y1, k, height, &y0, &key.src_height);
    key.src_format = AV_PIX_FMT_RGB24;
    src.data[0] = pixels.data() + static_cast<size_t>(y0) * pitch + static_cast<size_t>(x0) * 3;
    src.stride[0] = pitch;
  }

  uint8_t* placed = dst + static_cast<size_t>(plan.dst_y) * dst_stride +
                    static_cast<size_t>(plan.dst_x) * 3;
  SPDL_RETURN_IF_ERROR(Scale(key, src, placed, dst_stride));
  ZeroPadding(dst, dst_stride, plan);
  return Status::Ok();
}

Status ImageDecoder::Impl::Reference(std::span<const uint8_t> jpeg, const ImageOps& ops,
                                     uint8_t* dst, int out_width, int out_height,
                                     size_t dst_stride, ImageInfo* info) {
  Header h;
  ResizeCropPlan plan;
  SPDL_RETURN_IF_ERROR(
      Begin(jpeg, ops, dst, out_width, out_height, dst_stride, info, &h, &plan));
  int width, height, pitch;
  SPDL_RETURN_IF_ERROR(DecodeRgb(jpeg, h, 1, &width, &height, &pitch));

  // The whole image, resized.
  const size_t rpitch = static_cast<size_t>(plan.resized_width) * 3;
  uint8_t* rbuf = Buffer(resized, rpitch * plan.resized_height);
  SwsKey key;
  key.src_width = width;
  key.src_height = height;
  key.src_format = AV_PIX_FMT_RGB24;
  key.dst_width = plan.resized_width;
  key.dst_height = plan.resized_height;
  key.dst_format = AV_PIX_FMT_RGB24;
  key.flags = SwsFlags(ops.interpolation);
  SourcePlanes src;
  src.data[0] = pixels.data();
  src.stride[0] = pitch;
  SPDL_RETURN_IF_ERROR(Scale(key, src, rbuf, rpitch));

  // Then the crop.
  for (int y = 0; y < plan.keep_height; ++y) {
    std::memcpy(dst + (plan.dst_y + y) * dst_stride + static_cast<size_t>(plan.dst_x) * 3,
                rbuf + (plan.keep_y + y) * rpitch + static_cast<size_t>(plan.keep_x) * 3,
                static_cast<size_t>(plan.keep_width) * 3);
  }
  ZeroPadding(dst, dst_stride, plan);
  return Status::Ok();
}

ImageDecoder::ImageDecoder(JpegDecodePath path) : impl_(std::make_unique<Impl>(path)) {}
ImageDecoder::~ImageDecoder() = default;
ImageDecoder::ImageDecoder(ImageDecoder&&) noexcept = default;
ImageDecoder& ImageDecoder::operator=(ImageDecoder&&) noexcept = default;

Status ImageDecoder::DecodeJpegInto(std::span<const uint8_t> jpeg, const ImageOps& ops,
                                    uint8_t* dst, int out_width, int out_height,
                                    size_t dst_stride, ImageInfo* info) {
  Status s = impl_->Decode(jpeg, ops, dst, out_width, out_height, dst_stride, info);
  impl_->TrimBuffers();
  return s;
}

Status ImageDecoder::ReferenceDecodeInto(std::span<const uint8_t> jpeg, const ImageOps& ops,
                                         uint8_t* dst, int out_width, int out_height,
                                         size_t dst_stride, ImageInfo* info) {
  Status s = impl_->Reference(jpeg, ops, dst, out_width, out_height, dst_stride, info);
  impl_->TrimBuffers();
  return s;
}

Status ImageDecoder::ReadJpegHeader(std::span<const uint8_t> jpeg, ImageInfo* info) {
  Header h;
  SPDL_RETURN_IF_ERROR(impl_->ReadHeader(jpeg, &h));
  *info = {h.width, h.height, 1};
  return Status::Ok();
}

uint64_t ImageDecoder::sws_contexts_built() const { return impl_->sws.builds(); }

}  // namespace spdl::media
