// ImageDecoder: JPEG bytes -> resized, center-cropped RGB pixels (uint8, HWC, 3 channels),
// written straight into the caller's buffer (a row of a shared-memory batch slot).
//
// Not thread-safe: use one ImageDecoder per worker thread. It caches a libjpeg-turbo handle,
// swscale contexts and a decode buffer between calls. Move-only.
//
// How it decodes (DecodeJpegInto):
//   1. Reads the header; refuses sources over ops.max_pixels before decoding anything.
//   2. Plans the torchvision geometry (image_ops.h) and maps the part of the image that survives
//      the crop back to a source rectangle.
//   3. When the target is at most half that rectangle, decodes at 1/2, 1/4 or 1/8 scale in the
//      DCT domain (3/4 and 7/8 measured slower than a full decode, so they are never used).
//   4. Decodes to Y/Cb/Cr planes (JpegDecodePath::kYuvPlanes, the default) or RGB (kRgb), and one
//      swscale pass converts and resamples only the source rectangle into the destination:
//      there is no intermediate output image and no copy.
// CMYK/YCCK and RGB-coded JPEGs are decoded through RGB on either path (CMYK converted as
// libjpeg-turbo does: R = C * K / 255, for Adobe's inverted CMYK). Grayscale JPEGs become three
// equal channels.
//
// Strictness: every libjpeg warning is an error (kDataLoss): truncation, but also "Corrupt JPEG
// data: N extraneous bytes before marker", which PIL accepts silently; a few ImageNet files do
// this. After any decode error the decoder drops its libjpeg-turbo handle (TurboJPEG 2.1 can
// leave one unusable) and makes a fresh one for the next image.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "media/image_ops.h"
#include "media/jpeg_encoder.h"  // EncodeJpeg, for tests and dataset generation

namespace spdl::media {

// What the header of a decoded image said.
struct ImageInfo {
  int width = 0;   // source width, from the header
  int height = 0;  // source height, from the header
  // The image was decoded at 1/dct_scale of its size (1, 2, 4 or 8) by DCT-domain scaling.
  int dct_scale = 1;
};

// How JPEG data becomes RGB before resampling. Both give the same pixels within tolerance; the
// YUV path is faster because libjpeg-turbo skips chroma upsampling and colour conversion and
// swscale does both with the resampling, in one pass (measured, one thread, 500x400 JPEG,
// Resize(256) + CenterCrop(224): ~700 images per CPU-second against ~580 for kRgb).
enum class JpegDecodePath {
  kYuvPlanes,  // libjpeg-turbo -> Y/Cb/Cr planes; swscale: YUV -> RGB + resample (default)
  kRgb,        // libjpeg-turbo -> RGB; swscale: RGB resample
};

class ImageDecoder {
 public:
  // Cheap and never fails: the libjpeg-turbo handle is created on first use. A moved-from
  // decoder may only be destroyed or assigned to.
  explicit ImageDecoder(JpegDecodePath path = JpegDecodePath::kYuvPlanes);
  ~ImageDecoder();
  ImageDecoder(ImageDecoder&&) noexcept;
  ImageDecoder& operator=(ImageDecoder&&) noexcept;
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Decodes JPEG bytes and writes the transformed RGB image to dst.
  // REQUIRES: dst holds out_height rows of dst_stride bytes, dst_stride >= out_width * 3. Only
  // the first out_width * 3 bytes of each row are written (padding pixels are set to zero).
  // The caller passes the expected output size (the batch has a fixed shape) and gets
  // kInvalidArgument when OutputSize(ops, image) differs, or for bad ops or buffer arguments;
  // kDataLoss (with libjpeg-turbo's message) for corrupt, truncated or non-JPEG data, libjpeg
  // warnings included; kResourceExhausted, naming the size and the limit, when the header's
  // width * height exceeds ops.max_pixels (checked before any decoding). On error dst may hold
  // partial output. info, when given, receives the source size whenever the header was read, and
  // the DCT scale once decoding starts.
  Status DecodeJpegInto(std::span<const uint8_t> jpeg, const ImageOps& ops, uint8_t* dst,
                        int out_width, int out_height, size_t dst_stride,
                        ImageInfo* info = nullptr);

  // The reference path, for tests: a full-size decode to RGB (never DCT-scaled), a plain swscale
  // resize of the whole image to the resize size, then a copy of the crop. Same contract and
  // errors as DecodeJpegInto.
  Status ReferenceDecodeInto(std::span<const uint8_t> jpeg, const ImageOps& ops, uint8_t* dst,
                             int out_width, int out_height, size_t dst_stride,
                             ImageInfo* info = nullptr);

  // Reads only the header. kDataLoss when the bytes do not start a decodable JPEG.
  Status ReadJpegHeader(std::span<const uint8_t> jpeg, ImageInfo* info);

  // swscale contexts built so far by this decoder (cache misses), for tests and stats.
  uint64_t sws_contexts_built() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spdl::media
