// NvjpegBackend: the JpegDecodeBackend over NVIDIA's nvJPEG (cuda/jpeg_decode.h). Built only with
// CUDA and nvJPEG's header (CMake: SPDL_HAVE_NVJPEG; scripts/install-deps.sh unpacks NVIDIA's
// nvidia-nvjpeg wheel into /opt/spdld-nvjpeg).
//
// spdld never links nvJPEG: Create loads libnvjpeg.so.13 with dlopen (the loader's search path,
// then Options::library_dirs), only when a job asks for GPU decode, so machines without it run
// everything else; without it the job is refused naming the library and where it was looked for.
// (The directory the build found nvJPEG in, SPDL_NVJPEG_LIB_DIR, is tried last.)
// Batches go to the hardware JPEG decoder (NVJPEG_BACKEND_HARDWARE: A100, H100, ...) when the GPU
// has one, else to the default GPU backend; single images (DecodeOne: what the batch refused)
// always to the default backend, which also takes progressive JPEGs.
//
// Thread safety: safe to share; one mutex serialises the decode calls (an nvjpegJpegState_t is
// not thread-safe); ReadHeader (nvjpegGetImageInfo, thread-safe) does not take it.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/jpeg_decode.h"

namespace spdl::cuda {

// The library's file name: spdld is built against CUDA 13.
inline constexpr const char* kNvjpegLibrary = "libnvjpeg.so.13";

class NvjpegBackend final : public JpegDecodeBackend {
 public:
  struct Options {
    int device = 0;                         // the CUDA ordinal (current while nvJPEG is created)
    std::vector<std::string> library_dirs;  // tried after the loader's search path
    bool hardware = true;                   // use the hardware decoder when the GPU has one
    int max_side = 16384;                   // larger images: the CPU path
  };
  // Loads nvJPEG and creates its handles on the device. kUnavailable naming the library and the
  // directories tried when it cannot be loaded; the nvJPEG error otherwise.
  static Result<std::unique_ptr<NvjpegBackend>> Create(Options options);
  ~NvjpegBackend() override;

  const char* name() const override { return "nvjpeg"; }
  bool hardware() const override;
  int max_side() const override { return options_.max_side; }
  Result<JpegHeader> ReadHeader(std::span<const uint8_t> jpeg) override;
  Status DecodeBatch(std::span<const std::span<const uint8_t>> jpegs, std::span<const DeviceImage> out,
                     Stream stream) override;
  Status DecodeOne(std::span<const uint8_t> jpeg, const DeviceImage& out, Stream stream) override;

 private:
  struct Api;
  explicit NvjpegBackend(Options options);

  const Options options_;
  std::unique_ptr<Api> api_;
  std::mutex mu_;
  int batch_initialized_ = 0;  // guarded by mu_: the batch size nvjpegDecodeBatchedInitialize was given
};

}  // namespace spdl::cuda
