#include "datagen/jpeg_writer.h"

#include <turbojpeg.h>

#include <memory>
#include <string>

namespace spdl::datagen {
namespace {

struct TjDeleter {
  void operator()(void* h) const noexcept { tjDestroy(h); }
};

int ToTjSamp(Subsampling s) {
  switch (s) {
    case Subsampling::k444:
      return TJSAMP_444;
    case Subsampling::k422:
      return TJSAMP_422;
    case Subsampling::k420:
      return TJSAMP_420;
    case Subsampling::kGray:
      return TJSAMP_GRAY;
  }
  return TJSAMP_420;
}

}  // namespace

Result<std::vector<uint8_t>> CompressJpeg(const uint8_t* rgb, int width, int height, int quality,
                                          Subsampling subsampling) {
  if (rgb == nullptr || width <= 0 || height <= 0) {
    return InvalidArgument("CompressJpeg: bad image " + std::to_string(width) + "x" + std::to_string(height));
  }
  if (quality < 1 || quality > 100) {
    return InvalidArgument("CompressJpeg: quality " + std::to_string(quality) + " is outside [1, 100]");
  }
  std::unique_ptr<void, TjDeleter> tj(tjInitCompress());
  if (!tj) return Internal(std::string("tjInitCompress: ") + tjGetErrorStr2(nullptr));
  const int samp = ToTjSamp(subsampling);
  // tjBufSize is the worst case, so the compressor never has to reallocate our buffer.
  const unsigned long cap = tjBufSize(width, height, samp);
  if (cap == static_cast<unsigned long>(-1)) {
    return InvalidArgument(std::string("CompressJpeg: ") + tjGetErrorStr2(nullptr));
  }
  std::vector<uint8_t> out(cap);
  unsigned char* buf = out.data();
  unsigned long size = cap;
  if (tjCompress2(tj.get(), rgb, width, 0, height, TJPF_RGB, &buf, &size, samp, quality, TJFLAG_NOREALLOC) != 0) {
    return Internal(std::string("tjCompress2: ") + tjGetErrorStr2(tj.get()));
  }
  out.resize(size);
  return out;
}

}  // namespace spdl::datagen
