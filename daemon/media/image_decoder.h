// ImageDecoder: image bytes (JPEG, PNG, WebP, BMP, TIFF, GIF) -> transformed pixels, written
// straight into the caller's buffer (a row of a shared-memory batch slot).
//
// Not thread-safe: use one ImageDecoder per worker thread. It caches a libjpeg-turbo handle,
// libavcodec contexts, swscale contexts, a decode buffer and a scratch image between calls.
// Move-only.
//
// How it decodes (DecodeInto):
//   1. Tells the format from the magic bytes (never the file name) and reads the image size from
//      the header; refuses sources over ops.max_pixels before decoding anything, in every format.
//   2. JPEG with ops.exif_orientation: reads the EXIF Orientation tag; the geometry then applies
//      to the upright image.
//   3. Plans the torchvision geometry (image_ops.h): resize + center crop, or a random resized
//      crop drawn from the sample's seed; maps the part of the image that survives to a source
//      rectangle (in stored orientation).
//   4. ops.resample == Resample::kExact (the default; PIL's pixels): decodes the whole image —
//      JPEG by libjpeg-turbo with its defaults (ISLOW DCT, fancy upsampling, its YCbCr -> RGB:
//      what PIL does), other formats by libavcodec then swscale to packed RGB at the same size
//      (alpha dropped or composited, palettes expanded) — turns it upright, and resamples it with
//      PIL's separable filters (resample.h), computing only the kept window of the resized image
//      (a random resized crop: its rectangle resized as an image of its own, as torchvision's
//      resized_crop). Gray output is PIL's convert("L") of the RGB image (a gray JPEG's own
//      samples). The random horizontal flip is folded into the resampler's horizontal pass
//      (ResampleRequest::mirror: the same values, written right to left). It writes straight into
//      the destination when the output is uint8 NHWC, flipped or not; else through the output pass
//      (step 6).
//   5. Resample::kFast: JPEG (libjpeg-turbo): when the target is at most half that rectangle,
//      decodes at 1/2, 1/4 or 1/8 scale in the DCT domain (3/4 and 7/8 measured slower than a
//      full decode, so they are never used); decodes to Y/Cb/Cr planes (JpegDecodePath::kYuvPlanes,
//      the default) or RGB (kRgb). Other formats (libavcodec): one full decode to the codec's own
//      pixel format (RGB, RGBA, palette, gray, 16-bit, YUV 4:2:0 for lossy WebP). Then one swscale
//      pass converts and resamples only the source rectangle, straight into the destination when
//      the output is uint8 NHWC and nothing is mirrored or rotated.
//   Window decode (JPEG, set_jpeg_window_decode, on by default; media/jpeg_window.h): on the
//      exact path, for an upright JPEG, a random resized crop decodes only the crop's rectangle,
//      and a resize + center crop only the source samples the resampler reads for the kept window
//      (its filter's support included); those pixels are a full decode's, bit for bit, so PIL's
//      output is unchanged. A JPEG with an EXIF rotation is decoded whole there. On the fast path
//      the source rectangle (at the chosen DCT scale) is decoded alone, to RGB or gray, when it is
//      at most half the image (larger windows keep the Y/Cb/Cr planes path, which swscale resamples
//      more cheaply than RGB: measured, image_decoder.cc WindowPays). Rows below the window are
//      never decoded: corrupt entropy data there goes unnoticed (a file cut short is still
//      kDataLoss, jpeg_window.h).
//   6. Otherwise the resampled image goes to a scratch image (per decoder, so per thread), and one
//      pass (pixel_convert.h) turns it upright (fast path), mirrors it (random horizontal flip, fast path),
//      pads, normalizes, converts to the output dtype and lays it out HWC or CHW into the
//      destination.
// CMYK/YCCK and RGB-coded JPEGs are decoded through RGB on either path (CMYK converted as
// libjpeg-turbo does: R = C * K / 255, for Adobe's inverted CMYK). Grayscale images become three
// equal channels, or, with ops.channels = 1, stay one: then every image is gray, a colour one
// converted to its luma (ITU-R 601, full range, as PIL's convert("L")) — a JPEG by libjpeg-turbo's
// own grayscale output on the fast path (the Y plane; chroma is not decoded), CMYK through RGB, other
// formats by swscale in the resampling pass (the exact path: PIL's formula on the RGB image). Alpha is dropped, or
// composited over ops.background at the source resolution (ops.alpha; at 8 bits). 16-bit images are resampled from
// their 16-bit samples (exact path: resample.h with 64-bit sums; fast path: swscale): for floating-point outputs into a
// 16-bit scratch image, so the output is v / 65535 at full precision (ImageInfo::sample_bits = 16);
// for uint8 the 8-bit value is the high byte, as PIL makes it (within one level of v / 257). Palette
// images are expanded to RGB before resampling. A GIF gives its first frame (checked to be complete: FFmpeg
// would show a cut one); an animated WebP is refused.
//
// Strictness: every libjpeg warning is an error (kDataLoss): truncation, but also "Corrupt JPEG
// data: N extraneous bytes before marker", which PIL accepts silently; a few ImageNet files do
// this. libavcodec runs with AV_EF_EXPLODE | AV_EF_CRCCHECK (a PNG chunk with a bad CRC is an
// error). After any decode error the decoder drops its libjpeg-turbo handle (TurboJPEG 2.1 can
// leave one unusable) or the codec's context, and makes a fresh one for the next image.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "media/geometry.h"
#include "media/image_format.h"
#include "media/image_ops.h"

namespace spdl::media {

// What the decoder found and chose for one image.
struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int width = 0;   // source width, from the header (as stored, before any EXIF rotation)
  int height = 0;  // source height, from the header
  // The image was decoded at 1/dct_scale of its size (1, 2, 4 or 8) by DCT-domain scaling (JPEG).
  int dct_scale = 1;
  // The EXIF Orientation applied (1 = upright or not read).
  int orientation = 1;
  // The random resized crop, in the upright image's pixels (all 0 without one).
  CropRect crop;
  // The random horizontal flip was drawn.
  bool flipped = false;
  // Bits per sample of the resampled image the output pass read: 16 when a 16-bit source kept
  // its precision (floating-point outputs), else 8.
  int sample_bits = 8;
  // Geometric steps applied after the decoder's own, in order (set by the caller that ran them,
  // e.g. the augmentations of jobs/sample_decoder.cc; the decoder leaves it empty): targets
  // (media/targets.h ImageGeometry) follow them too.
  std::vector<GeometryStep> after;
};

// Resample::kFast only: how JPEG data becomes RGB before resampling. Both give the same pixels
// within tolerance; the
// YUV path is faster because libjpeg-turbo skips chroma upsampling and colour conversion and
// swscale does both with the resampling, in one pass (measured, one thread, 500x400 JPEG,
// Resize(256) + CenterCrop(224): ~700 images per CPU-second against ~580 for kRgb).
enum class JpegDecodePath {
  kYuvPlanes,  // libjpeg-turbo -> Y/Cb/Cr planes; swscale: YUV -> RGB + resample (default)
  kRgb,        // libjpeg-turbo -> RGB; swscale: RGB resample
};

class ImageDecoder {
 public:
  // Cheap and never fails: the libjpeg-turbo handle and the codec contexts are created on first
  // use. A moved-from decoder may only be destroyed or assigned to.
  explicit ImageDecoder(JpegDecodePath path = JpegDecodePath::kYuvPlanes);
  ~ImageDecoder();
  ImageDecoder(ImageDecoder&&) noexcept;
  ImageDecoder& operator=(ImageDecoder&&) noexcept;
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Decodes an image of any supported format and writes one output image — out_width x
  // out_height, ops.channels channels, in ops.dtype, HWC or CHW by ops.layout, packed
  // (OutputImageBytes(ops, out_width, out_height) bytes) — to dst. `sample_seed` (SampleSeed of
  // the job seed, epoch and sample index) drives the random transforms; it is unused without
  // them.
  // The caller passes the expected output size (the batch has a fixed shape) and gets
  // kInvalidArgument when the ops produce another, or for bad ops or buffer arguments; kDataLoss
  // (with the codec's message) for corrupt, truncated or unrecognised data, libjpeg warnings
  // included; kResourceExhausted, naming the size and the limit, when the header's width * height
  // exceeds ops.max_pixels (checked before any decoding); kFailedPrecondition when this FFmpeg
  // build lacks the format's decoder. On error dst may hold partial output. info, when given,
  // receives the format and source size whenever the header was read, and the rest once decoding
  // starts.
  Status DecodeInto(std::span<const uint8_t> data, const ImageOps& ops, void* dst, int out_width, int out_height,
                    uint64_t sample_seed = 0, ImageInfo* info = nullptr);

  // As DecodeInto, for uint8 HWC output with a row stride.
  // REQUIRES: ops.raw_output(); dst holds out_height rows of dst_stride bytes, dst_stride >=
  // out_width * ops.channels. Only the first out_width * ops.channels bytes of each row are
  // written (padding pixels are set to zero).
  Status DecodeRgbInto(std::span<const uint8_t> data, const ImageOps& ops, uint8_t* dst, int out_width, int out_height,
                       size_t dst_stride, uint64_t sample_seed = 0, ImageInfo* info = nullptr);

  // As DecodeRgbInto with sample seed 0, for JPEG only: any other data is kDataLoss.
  Status DecodeJpegInto(std::span<const uint8_t> jpeg, const ImageOps& ops, uint8_t* dst, int out_width, int out_height,
                        size_t dst_stride, ImageInfo* info = nullptr);

#if SPDL_TEST_HOOKS
  // The swscale reference path, for tests of the fast path: a full-size decode to RGB (never
  // DCT-scaled, never YUV), the
  // whole image turned upright, a plain swscale resize of the whole image to the resize size
  // (or of the random crop's rectangle to the output size), a copy of the crop, then the flip.
  // Any format; uint8 HWC RGB output only (ops.channels = 3). Same contract and errors as
  // DecodeRgbInto.
  Status ReferenceDecodeInto(std::span<const uint8_t> data, const ImageOps& ops, uint8_t* dst, int out_width,
                             int out_height, size_t dst_stride, uint64_t sample_seed = 0, ImageInfo* info = nullptr);
#endif

  // A function run on the whole decoded image before the geometry: uint8 RGB HWC, upright, at the
  // size decoded (width x height, rows `stride` bytes apart), editable in place. Its error ends
  // the decode with that error.
  using PixelHook = std::function<Status(uint8_t* pixels, int width, int height, size_t stride)>;

  // As ReferenceDecodeInto (the full-size path: no DCT scaling, no crop-window decode; uint8 RGB
  // HWC output, ops.channels = 3), with `before_geometry` run on the whole upright image before
  // the resize / crop (user ops placed before the geometry, jobs/sample_decoder.h).
  Status DecodeWithHookInto(std::span<const uint8_t> data, const ImageOps& ops, uint8_t* dst, int out_width,
                            int out_height, size_t dst_stride, uint64_t sample_seed, const PixelHook& before_geometry,
                            ImageInfo* info = nullptr);

  // Reads only a JPEG header. kDataLoss when the bytes do not start a decodable JPEG.
  Status ReadJpegHeader(std::span<const uint8_t> jpeg, ImageInfo* info);

  // JPEG window decode (jpeg_window.h; on by default): only the part of the image the geometry
  // keeps is decoded, where it applies (see the class comment). Off: every JPEG is decoded whole,
  // as before (for tests comparing the two, and bench/ops).
  void set_jpeg_window_decode(bool on);

  // swscale contexts built so far by this decoder (cache misses), for tests and stats (the exact
  // path builds one only for non-JPEG formats that need a pixel-format conversion).
  uint64_t sws_contexts_built() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spdl::media
