// EncodeJpeg: RGB pixels -> JPEG bytes, for tests (datagen::CompressJpeg, tools/datagen, underneath); the
// daemon itself only decodes.
//
// A pure function: safe to call from any thread (each call uses its own compressor).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace spdl::media {

// Chroma subsampling of an encoded JPEG. kGray stores luminance only (a grayscale JPEG).
enum class ChromaSubsampling { k444, k422, k420, kGray };

// Encodes an RGB HWC uint8 image (rows packed, width * 3 bytes each) as a baseline JPEG.
// REQUIRES: rgb holds width * height * 3 bytes. kInvalidArgument for a bad size or quality
// outside [1, 100]; kInternal when libjpeg-turbo fails.
Result<std::vector<uint8_t>> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality = 90,
                                        ChromaSubsampling subsampling = ChromaSubsampling::k420);

}  // namespace spdl::media

namespace spdl::media {

// The knobs of EncodeJpegWith (libjpeg API): what TurboJPEG's compressor cannot write.
struct JpegEncodeOptions {
  int quality = 90;  // 1..100
  // k444, k422, k420, or kGray (a grayscale JPEG from the RGB input's luma); h1v2 (4:4:0) when
  // vertical_only is set with k422 (chroma halved vertically instead of horizontally).
  ChromaSubsampling subsampling = ChromaSubsampling::k420;
  bool vertical_only = false;
  bool progressive = false;  // jpeg_simple_progression's scan script
  int restart_interval = 0;  // MCUs between restart markers (0: none)
};

// Encodes an RGB HWC uint8 image (rows packed) as a JPEG with libjpeg's API. Same errors as
// EncodeJpeg (kInternal with libjpeg's message when it fails).
Result<std::vector<uint8_t>> EncodeJpegWith(const uint8_t* rgb, int width, int height,
                                            const JpegEncodeOptions& options);

}  // namespace spdl::media
