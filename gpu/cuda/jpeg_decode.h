// GPU JPEG decode (decode.device: cuda): the seams to nvJPEG and to the resize kernels, and the
// batch logic above them.
//
//   JpegDecodeBackend  nvJPEG's part: read a JPEG's header, decode a batch of JPEGs (the hardware
//                      decoder where the GPU has one) into device images, asynchronously on a
//                      stream. Real: NvjpegBackend (cuda/nvjpeg_backend.h, libnvjpeg.so.13 loaded at
//                      run time); the unit tests put their own in its place.
//   ImageKernels       the resize / crop / flip / normalise step from a decoded device image straight
//                      into the output row (the job's device slot), asynchronously on a stream. Real:
//                      CudaImageKernels (cuda/image_kernels.h), whose pixel math
//                      (cuda/image_math.h) also runs on the host.
//   GpuJpegBatchDecoder one batch: headers read, samples nvJPEG refuses or cannot take (CMYK,
//                      oversized, a refused header) decoded on the CPU instead and uploaded, the rest
//                      decoded as one nvJPEG batch (a batch that fails as a whole is retried image by
//                      image, so one bad file costs only itself), then the kernels write every
//                      sample's output; every outcome counted (GpuDecodeStats).
//
// Errors follow nvJPEG: a failed call's Status names the call and the nvjpegStatus_t
// (NvjpegStatusName), with a code from it (NvjpegStatusCode): a bad or truncated JPEG is kDataLoss,
// an unsupported one kFailedPrecondition (-> the CPU fallback), an allocator failure
// kResourceExhausted, anything else kInternal.
//
// Thread safety: backends and kernels are shared by the decode threads of one device (they lock
// what they need); a GpuJpegBatchDecoder is used by one thread at a time (it owns the batch's
// scratch memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "cuda/device_backend.h"
#include "cuda/image_math.h"

namespace spdl::cuda {

// nvjpegStatus_t's values (nvjpeg.h), so that the fake and the logic speak nvJPEG without its
// header.
enum class NvjpegStatus : int {
  kSuccess = 0,
  kNotInitialized = 1,
  kInvalidParameter = 2,
  kBadJpeg = 3,
  kJpegNotSupported = 4,
  kAllocatorFailure = 5,
  kExecutionFailed = 6,
  kArchMismatch = 7,
  kInternalError = 8,
  kImplementationNotSupported = 9,
  kIncompleteBitstream = 10,
};
// "NVJPEG_STATUS_BAD_JPEG", ...
const char* NvjpegStatusName(int status);
// The StatusCode for an nvjpegStatus_t (see the header comment).
StatusCode NvjpegStatusCode(int status);
// The Status of a failed nvJPEG call: "<call>: NVJPEG_STATUS_...".
Status NvjpegError(int status, const std::string& call);

// nvjpegChromaSubsampling_t's NVJPEG_CSS_UNKNOWN etc. are not needed: what the logic needs of a
// header is this.
struct JpegHeader {
  int width = 0;
  int height = 0;
  int components = 0;  // 1 (gray), 3 (YCbCr / RGB), 4 (CMYK / YCCK)
};

// A decoded image in device memory: interleaved RGB, `pitch` bytes a row.
struct DeviceImage {
  uint8_t* data = nullptr;
  size_t pitch = 0;
  int width = 0;
  int height = 0;
};

class JpegDecodeBackend {
 public:
  virtual ~JpegDecodeBackend() = default;
  // "nvjpeg" or "fake-nvjpeg", for logs.
  virtual const char* name() const = 0;
  // True when batches go to the GPU's hardware JPEG decoder (A100, H100, ...).
  virtual bool hardware() const = 0;
  // The largest width or height the decoder takes (larger: the CPU path).
  virtual int max_side() const = 0;
  // nvjpegGetImageInfo: the header of `jpeg` (host memory). Never blocks on the GPU.
  virtual Result<JpegHeader> ReadHeader(std::span<const uint8_t> jpeg) = 0;
  // Enqueues on `stream` the decode of jpegs[i] into out[i] (RGB, out[i] sized from its header),
  // as one batch (nvjpegDecodeBatched). An error fails the whole batch (none of out[] may be used).
  // REQUIRES: jpegs.size() == out.size(); the jpegs' bytes stay valid and unchanged until the
  // stream has run the work (the caller syncs before reusing them).
  virtual Status DecodeBatch(std::span<const std::span<const uint8_t>> jpegs, std::span<const DeviceImage> out,
                             Stream stream) = 0;
  // Enqueues on `stream` the decode of one JPEG (nvjpegDecode); same REQUIRES.
  virtual Status DecodeOne(std::span<const uint8_t> jpeg, const DeviceImage& out, Stream stream) = 0;
};

class ImageKernels {
 public:
  virtual ~ImageKernels() = default;
  // Enqueues on `stream` the plan's resize / crop / flip / value mapping of `src` into `dst`
  // (device memory: o.width * o.height * channels samples of o's dtype), reading the plan's tables
  // now (they may go once this returns). REQUIRES: src and dst stay valid until the work has run.
  virtual Status ResizeInto(const DeviceImage& src, const imgmath::ResizePlan& plan, const imgmath::OutputSpec& o,
                            void* dst, Stream stream) = 0;
};

// One sample of a batch.
struct GpuDecodeSample {
  std::span<const uint8_t> jpeg;  // the file's bytes (host)
  void* dst = nullptr;            // its output row (device memory)
  // Its plan, made once the header is known (width, height as stored) — the daemon's PlanGpuImage;
  // kFailedPrecondition: decode it on the CPU path instead (CpuDecode's `full` = false).
  std::function<Result<imgmath::ResizePlan>(int width, int height, imgmath::OutputSpec* o)> plan;
};

// What happened to the samples of the batches so far.
struct GpuDecodeStats {
  uint64_t batches = 0;
  uint64_t gpu_decoded = 0;           // decoded by nvJPEG
  uint64_t cpu_fallback = 0;          // decoded on the CPU (all reasons below)
  uint64_t fallback_header = 0;       //   nvJPEG refused the header
  uint64_t fallback_unsupported = 0;  //   CMYK / YCCK, too large a side, or a plan the GPU lacks
  uint64_t fallback_decode = 0;       //   nvJPEG failed on the image itself
  uint64_t batch_retries = 0;         // batches that failed as a whole, retried image by image
  uint64_t failed = 0;                // failed on the CPU too (the sample's Status says why)
};

class GpuJpegBatchDecoder {
 public:
  // The CPU path for one sample: decodes `jpeg` and writes the sample's finished output (what the
  // CPU decode stage would write) to host memory `out` of `bytes` bytes. kDataLoss etc. as the CPU
  // path. Called on the batch's thread.
  using CpuDecode = std::function<Status(std::span<const uint8_t> jpeg, void* out, size_t bytes)>;
  struct Options {
    int64_t max_pixels = 178956970;  // as decode.max_pixels: refused before decoding (kResourceExhausted)
    size_t output_bytes = 0;         // bytes of one sample's output (the row)
  };
  // REQUIRES: device, jpeg and kernels outlive the decoder; options.output_bytes > 0.
  GpuJpegBatchDecoder(DeviceBackend& device, JpegDecodeBackend& jpeg, ImageKernels& kernels, CpuDecode cpu,
                      Options options);
  ~GpuJpegBatchDecoder();
  GpuJpegBatchDecoder(const GpuJpegBatchDecoder&) = delete;
  GpuJpegBatchDecoder& operator=(const GpuJpegBatchDecoder&) = delete;

  // Decodes the samples into their dst on `stream` and returns once the work is enqueued, one
  // Status per sample (a failed sample's dst is left as it was). The batch's scratch memory is
  // reused only after `stream` has run this batch's work: the next call waits for it first (on the
  // calling thread: never call this from a thread that must not block).
  // REQUIRES: the samples' bytes and dst stay valid until Finish() or the next DecodeBatch returns.
  std::vector<Status> DecodeBatch(std::span<const GpuDecodeSample> samples, Stream stream);

  // Blocks until the last batch's work has run (then its outputs are complete).
  Status Finish();

  const GpuDecodeStats& stats() const { return stats_; }

 private:
  Status EnsureScratch(size_t bytes);
  Status EnsureStaging(size_t bytes);

  DeviceBackend& device_;
  JpegDecodeBackend& jpeg_;
  ImageKernels& kernels_;
  CpuDecode cpu_;
  Options options_;
  GpuDecodeStats stats_;
  void* scratch_ = nullptr;  // device: the batch's decoded images
  size_t scratch_bytes_ = 0;
  uint8_t* staging_ = nullptr;  // host, page-locked: the CPU fallbacks' outputs, uploaded
  size_t staging_bytes_ = 0;
  Event done_;  // recorded after each batch's work
  bool pending_ = false;
};

}  // namespace spdl::cuda
