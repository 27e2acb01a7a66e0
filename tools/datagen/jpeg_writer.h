// CompressJpeg: RGB pixels -> JPEG bytes, with libjpeg-turbo, for dataset generation (the shipped
// spdl-make-dataset) and the tests' encoder (testing/media/jpeg_encoder.h). The daemon only decodes.
//
// A pure function: safe to call from any thread (each call uses its own compressor).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace spdl::datagen {

// Chroma subsampling of a written JPEG. kGray stores luminance only (a grayscale JPEG).
enum class Subsampling { k444, k422, k420, kGray };

// Compresses an RGB HWC uint8 image (rows packed, width * 3 bytes each) as a baseline JPEG.
// REQUIRES: rgb holds width * height * 3 bytes. kInvalidArgument for a bad size or quality
// outside [1, 100]; kInternal when libjpeg-turbo fails.
Result<std::vector<uint8_t>> CompressJpeg(const uint8_t* rgb, int width, int height, int quality = 90,
                                          Subsampling subsampling = Subsampling::k420);

}  // namespace spdl::datagen
