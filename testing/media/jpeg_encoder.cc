#include "media/jpeg_encoder.h"

#include "datagen/jpeg_writer.h"

namespace spdl::media {
namespace {

datagen::Subsampling ToWriter(ChromaSubsampling s) {
  switch (s) {
    case ChromaSubsampling::k444:
      return datagen::Subsampling::k444;
    case ChromaSubsampling::k422:
      return datagen::Subsampling::k422;
    case ChromaSubsampling::k420:
      return datagen::Subsampling::k420;
    case ChromaSubsampling::kGray:
      return datagen::Subsampling::kGray;
  }
  return datagen::Subsampling::k420;
}

}  // namespace

Result<std::vector<uint8_t>> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality,
                                        ChromaSubsampling subsampling) {
  return datagen::CompressJpeg(rgb, width, height, quality, ToWriter(subsampling));
}

}  // namespace spdl::media
