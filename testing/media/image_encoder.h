// EncodeImage: raw pixels -> a PNG, GIF, BMP, TIFF, WebP (FFmpeg's encoders) or JPEG
// (libjpeg-turbo) file in memory. For tests, benchmarks and dataset generation; the daemon itself
// only decodes.
//
// A pure function: safe to call from any thread (each call opens its own encoder).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "media/image_format.h"
#include "media/jpeg_encoder.h"  // EncodeJpeg, the JPEG path of EncodeImage

namespace spdl::media {

// How the samples of a RawImage are stored (rows packed, no padding).
enum class RawPixels {
  kRgb24,       // R, G, B bytes
  kRgba,        // R, G, B, A bytes
  kGray8,       // one byte
  kGrayAlpha8,  // gray, alpha bytes
  kRgb48,       // R, G, B as uint16 in host byte order
  kRgba64,      // R, G, B, A as uint16 in host byte order
  kGray16,      // uint16 in host byte order
  kPal8,        // one palette index per pixel; `palette` holds 0xAARRGGBB entries
};

struct RawImage {
  RawPixels pixels = RawPixels::kRgb24;
  int width = 0;
  int height = 0;
  std::vector<uint8_t> data;      // width * height pixels
  std::vector<uint32_t> palette;  // kPal8 only: at most 256 entries
};

struct EncodeOptions {
  int quality = 90;       // JPEG and lossy WebP, 1..100
  bool lossless = false;  // WebP: lossless (VP8L) instead of lossy (VP8)
};

// Encodes `image` as `format`. The samples are given to the encoder unchanged when it takes them
// (else converted without loss: a byte-order or channel-order change, gray -> RGB, RGB -> RGBA),
// so a lossless format decodes back to exactly these samples. Two exceptions: lossy WebP takes
// RGB and converts to YUV 4:2:0 itself; JPEG takes kRgb24 and kGray8 only. GIF takes kPal8 and
// kGray8 only (no quantisation here). kInvalidArgument for a bad image or a combination the
// format cannot store; kFailedPrecondition when this FFmpeg has no such encoder (libwebp is
// optional); kInternal when the encoder fails.
Result<std::vector<uint8_t>> EncodeImage(ImageFormat format, const RawImage& image, const EncodeOptions& options = {});

}  // namespace spdl::media
