// FakeNvjpeg / FakeImageKernels: TEST-ONLY stand-ins for nvJPEG and the resize kernels
// (cuda/jpeg_decode.h), on any DeviceBackend (FakeBackend in unit tests), so the GPU decode's
// batching, fallback and stats logic runs on machines without a GPU.
//
// FakeNvjpeg behaves like nvJPEG, not kinder:
//   - headers: what nvjpegGetImageInfo reads (SOI, then the SOF's size and components);
//     NVJPEG_STATUS_BAD_JPEG for data that is not a JPEG; arithmetic-coded and lossless JPEGs
//     are NVJPEG_STATUS_JPEG_NOT_SUPPORTED already there.
//   - decode: refuses (NVJPEG_STATUS_JPEG_NOT_SUPPORTED) progressive JPEGs (the hardware decoder
//     takes baseline only), CMYK / YCCK (4 components) and a side over max_side(); a corrupt or
//     truncated one is NVJPEG_STATUS_BAD_JPEG. A batch with any such image fails AS A WHOLE, as
//     nvjpegDecodeBatched does.
//   - asynchronous and stream-ordered: the pixels (decoded on the host by libjpeg-turbo) reach the
//     device image only through the backend's MemcpyH2DAsync on the caller's stream, so they are
//     ordered and completed as the backend's work (FakeBackend: SetEventPending holds them); an
//     output outside device memory is refused by the backend.
//   - FailNext(status) fails the next DecodeBatch / DecodeOne with that nvjpegStatus_t (an
//     execution failure, an allocator failure); called again, the call after that, and so on.
// FakeImageKernels runs cuda/image_math.h's functions on the host (the GPU kernels' very code): it
// reads the decoded image back with MemcpyD2HAsync and writes the output with MemcpyH2DAsync, on
// the stream, so bounds and ordering are the backend's.
//
// Thread safety: one mutex per object.
#pragma once

#include <deque>
#include <mutex>
#include <span>
#include <vector>

#include "cuda/jpeg_decode.h"

namespace spdl::cuda {

class FakeNvjpeg final : public JpegDecodeBackend {
 public:
  // REQUIRES: device outlives this.
  explicit FakeNvjpeg(DeviceBackend& device, int max_side = 16384) : device_(device), max_side_(max_side) {}

  const char* name() const override { return "fake-nvjpeg"; }
  bool hardware() const override { return true; }
  int max_side() const override { return max_side_; }
  Result<JpegHeader> ReadHeader(std::span<const uint8_t> jpeg) override;
  Status DecodeBatch(std::span<const std::span<const uint8_t>> jpegs, std::span<const DeviceImage> out,
                     Stream stream) override;
  Status DecodeOne(std::span<const uint8_t> jpeg, const DeviceImage& out, Stream stream) override;

  // Queues a failure: the next DecodeBatch / DecodeOne not yet given one fails with
  // `nvjpeg_status` (an NvjpegStatus value).
  void FailNext(int nvjpeg_status);
  // Calls so far.
  int batches() const;
  int ones() const;

 private:
  Status DecodeLocked(std::span<const uint8_t> jpeg, const DeviceImage& out, Stream stream, const char* call);

  DeviceBackend& device_;
  const int max_side_;
  mutable std::mutex mu_;
  std::deque<int> fail_next_;               // guarded by mu_
  int batches_ = 0;                         // guarded by mu_
  int ones_ = 0;                            // guarded by mu_
  std::vector<std::vector<uint8_t>> host_;  // decoded pixels of the last call (sources of its copies)
};

class FakeImageKernels final : public ImageKernels {
 public:
  explicit FakeImageKernels(DeviceBackend& device) : device_(device) {}
  Status ResizeInto(const DeviceImage& src, const imgmath::ResizePlan& plan, const imgmath::OutputSpec& o, void* dst,
                    Stream stream) override;
  int launches() const;

 private:
  DeviceBackend& device_;
  mutable std::mutex mu_;
  int launches_ = 0;                       // guarded by mu_
  std::vector<uint8_t> src_, mid_;         // guarded by mu_
  std::vector<std::vector<uint8_t>> out_;  // outputs of the launches so far (sources of their copies)
};

}  // namespace spdl::cuda
