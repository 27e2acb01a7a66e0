// JpegWindowDecoder: decodes only a rectangle of a JPEG (optionally DCT-scaled by 1/2, 1/4 or 1/8)
// through the libjpeg API of libjpeg-turbo, to packed RGB or gray pixels.
//
// Not thread-safe: one decoder per thread (ImageDecoder owns one). It keeps a libjpeg decompress
// object and a pixel buffer between calls. Move-only.
//
// How: jpeg_read_header, the scale (scale_num / scale_denom), jpeg_start_decompress, then
// jpeg_crop_scanline to the iMCU columns covering the window, jpeg_skip_scanlines over the rows
// above it, jpeg_read_scanlines for the window's rows, and jpeg_abort_decompress: the rows below the
// window are never entropy-decoded; the blocks of the columns outside it are entropy-decoded (the
// Huffman stream has to be read) but never inverse-transformed, upsampled or colour-converted. A
// progressive JPEG is entropy-decoded whole before any row comes out (libjpeg buffers it), so there
// only the IDCT and colour work is saved.
// The settings are TurboJPEG's defaults (tjDecompress2 without flags: ISLOW DCT, fancy upsampling,
// libjpeg-turbo's YCbCr -> RGB), and the decoded region is widened inside by a margin of
// kJpegWindowMargin pixels on each side (where the image has them) before the crop, so that the
// upsampler's context around the window is real data: the pixels of the window are those of a full
// decode at the same scale, bit for bit (checked over 4:4:4, 4:2:2, 4:2:0, 4:4:0, gray, progressive and
// restart-marker files of many sizes in tests/unit/jpeg_window_test.cc).
// Strictness as ImageDecoder's: every libjpeg warning is an error (kDataLoss), and a progressive
// JPEG may not have more than 500 scans. A file cut short (no end-of-image marker after its scan
// data: a marker walk at memchr speed when the decode stops early) is kDataLoss wherever the cut is;
// but corrupt entropy data in the rows below the window, never decoded, is not seen.
// CMYK / YCCK JPEGs come out as RGB, converted as ImageDecoder does (Adobe's inverted CMYK: R = C *
// K / 255).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"

namespace spdl::media {

// Pixels decoded around the window on each side (where the image has them), at the output scale.
inline constexpr int kJpegWindowMargin = 2;

// What to decode: the rectangle [x0, x1) x [y0, y1) of the image scaled by 1/scale_denom (libjpeg's
// scaled size: ceil(width / scale_denom)).
struct JpegWindowRequest {
  int scale_denom = 1;  // 1, 2, 4 or 8
  int x0 = 0;
  int y0 = 0;
  int x1 = 0;
  int y1 = 0;
  bool gray = false;  // one channel: libjpeg's grayscale output (a colour JPEG's Y); else RGB
};

// The decoded region: height rows of width pixels of `channels` bytes, rows stride bytes apart,
// whose top-left pixel is pixel (x, y) of the scaled image (image_width x image_height). It contains
// the requested rectangle. The decoder's own buffer: the caller may edit it; valid until the
// decoder's next call.
struct JpegWindowImage {
  uint8_t* data = nullptr;
  size_t stride = 0;
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
  int channels = 3;
  int image_width = 0;
  int image_height = 0;

  // The first byte of scaled-image pixel (px, py). REQUIRES: the pixel lies in the region.
  uint8_t* At(int px, int py) const {
    return data + static_cast<size_t>(py - y) * stride + static_cast<size_t>(px - x) * channels;
  }
};

// The image's size at scale 1/scale_denom, as libjpeg computes it.
inline int JpegScaledSize(int size, int scale_denom) { return (size + scale_denom - 1) / scale_denom; }

class JpegWindowDecoder {
 public:
  // Cheap and never fails: the libjpeg object is made on first use.
  JpegWindowDecoder();
  ~JpegWindowDecoder();
  JpegWindowDecoder(JpegWindowDecoder&&) noexcept;
  JpegWindowDecoder& operator=(JpegWindowDecoder&&) noexcept;
  JpegWindowDecoder(const JpegWindowDecoder&) = delete;
  JpegWindowDecoder& operator=(const JpegWindowDecoder&) = delete;

  // Decodes the requested rectangle (clipped to the scaled image) into *out. kInvalidArgument for a
  // scale other than 1, 2, 4, 8 or an empty rectangle after clipping; kResourceExhausted when the
  // header's width * height exceeds max_pixels (checked before decoding); kDataLoss with libjpeg's
  // message for data it cannot decode or warns about.
  Status Decode(std::span<const uint8_t> jpeg, const JpegWindowRequest& request, int64_t max_pixels,
                JpegWindowImage* out);

  // Frees the pixel buffer when it grew past max_bytes.
  void Trim(size_t max_bytes);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace spdl::media
