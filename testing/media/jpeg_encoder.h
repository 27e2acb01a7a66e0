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
Result<std::vector<uint8_t>> EncodeJpeg(const uint8_t* rgb, int width, int height,
                                        int quality = 90,
                                        ChromaSubsampling subsampling = ChromaSubsampling::k420);

}  // namespace spdl::media
