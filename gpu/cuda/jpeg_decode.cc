#include "cuda/jpeg_decode.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace spdl::cuda {

const char* NvjpegStatusName(int status) {
  switch (static_cast<NvjpegStatus>(status)) {
    case NvjpegStatus::kSuccess:
      return "NVJPEG_STATUS_SUCCESS";
    case NvjpegStatus::kNotInitialized:
      return "NVJPEG_STATUS_NOT_INITIALIZED";
    case NvjpegStatus::kInvalidParameter:
      return "NVJPEG_STATUS_INVALID_PARAMETER";
    case NvjpegStatus::kBadJpeg:
      return "NVJPEG_STATUS_BAD_JPEG";
    case NvjpegStatus::kJpegNotSupported:
      return "NVJPEG_STATUS_JPEG_NOT_SUPPORTED";
    case NvjpegStatus::kAllocatorFailure:
      return "NVJPEG_STATUS_ALLOCATOR_FAILURE";
    case NvjpegStatus::kExecutionFailed:
      return "NVJPEG_STATUS_EXECUTION_FAILED";
    case NvjpegStatus::kArchMismatch:
      return "NVJPEG_STATUS_ARCH_MISMATCH";
    case NvjpegStatus::kInternalError:
      return "NVJPEG_STATUS_INTERNAL_ERROR";
    case NvjpegStatus::kImplementationNotSupported:
      return "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED";
    case NvjpegStatus::kIncompleteBitstream:
      return "NVJPEG_STATUS_INCOMPLETE_BITSTREAM";
  }
  return "NVJPEG_STATUS_(unknown)";
}

StatusCode NvjpegStatusCode(int status) {
  switch (static_cast<NvjpegStatus>(status)) {
    case NvjpegStatus::kSuccess:
      return StatusCode::kOk;
    case NvjpegStatus::kBadJpeg:
    case NvjpegStatus::kIncompleteBitstream:
      return StatusCode::kDataLoss;
    case NvjpegStatus::kJpegNotSupported:
    case NvjpegStatus::kImplementationNotSupported:
    case NvjpegStatus::kArchMismatch:
      return StatusCode::kFailedPrecondition;
    case NvjpegStatus::kAllocatorFailure:
      return StatusCode::kResourceExhausted;
    case NvjpegStatus::kInvalidParameter:
      return StatusCode::kInvalidArgument;
    default:
      return StatusCode::kInternal;
  }
}

Status NvjpegError(int status, const std::string& call) {
  if (status == 0) return Status::Ok();
  return Status(NvjpegStatusCode(status), call + ": " + NvjpegStatusName(status));
}

GpuJpegBatchDecoder::GpuJpegBatchDecoder(DeviceBackend& device, JpegDecodeBackend& jpeg, ImageKernels& kernels,
                                         CpuDecode cpu, Options options)
    : device_(device), jpeg_(jpeg), kernels_(kernels), cpu_(std::move(cpu)), options_(options) {}

GpuJpegBatchDecoder::~GpuJpegBatchDecoder() {
  // Nothing is freed under queued work: wait for the last batch first; if that fails (a poisoned or
  // hung device) leak rather than free under it.
  if (!Finish().ok()) return;
  if (done_) (void)device_.DestroyEvent(done_);
  if (scratch_ != nullptr) {
    if (Status s = device_.DeviceFree(scratch_); !s.ok()) device_.ReportTeardownError(s);
  }
  if (staging_ != nullptr) {
    if (Status s = device_.HostUnregister(staging_); !s.ok()) {
      device_.ReportTeardownError(s);
      return;  // still registered: keep the pages
    }
    std::free(staging_);
  }
}

Status GpuJpegBatchDecoder::Finish() {
  if (!pending_) return Status::Ok();
  SPDL_RETURN_IF_ERROR(device_.SynchronizeEvent(done_).WithPrefix("gpu decode: waiting for the last batch"));
  pending_ = false;
  return Status::Ok();
}

Status GpuJpegBatchDecoder::EnsureScratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return Status::Ok();
  bytes = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
  if (scratch_ != nullptr) {
    SPDL_RETURN_IF_ERROR(device_.DeviceFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
  }
  SPDL_ASSIGN_OR_RETURN(scratch_, device_.DeviceAlloc(bytes));
  scratch_bytes_ = bytes;
  return Status::Ok();
}

Status GpuJpegBatchDecoder::EnsureStaging(size_t bytes) {
  if (bytes <= staging_bytes_) return Status::Ok();
  bytes = (std::max(bytes, staging_bytes_ * 2) + 4095) / 4096 * 4096;
  if (staging_ != nullptr) {
    SPDL_RETURN_IF_ERROR(device_.HostUnregister(staging_));
    std::free(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
  }
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  if (p == nullptr) return ResourceExhausted("gpu decode: no host memory for the CPU fallback's staging");
  if (Status s = device_.HostRegister(p, bytes); !s.ok()) {
    std::free(p);
    return s;
  }
  staging_ = p;
  staging_bytes_ = bytes;
  return Status::Ok();
}

std::vector<Status> GpuJpegBatchDecoder::DecodeBatch(std::span<const GpuDecodeSample> samples, Stream stream) {
  const size_t n = samples.size();
  std::vector<Status> result(n);
  auto fail_all = [&](const Status& s) {
    for (auto& r : result) r = s;
    // Work of this batch may be queued already: the scratch is reused only after it ran.
    if (done_ && device_.RecordEvent(done_, stream).ok()) pending_ = true;
    return result;
  };
  ++stats_.batches;
  // The previous batch's scratch and staging are reused: its work must have run.
  if (Status s = Finish(); !s.ok()) {
    for (auto& r : result) r = s;
    return result;
  }
  if (!done_) {
    auto ev = device_.CreateEvent(/*interprocess=*/false);
    if (!ev.ok()) return fail_all(ev.status());
    done_ = *ev;
  }

  // 1. Headers and plans: which samples nvJPEG takes, and where each decoded image goes.
  struct Item {
    bool gpu = false;
    bool fallback = false;
    imgmath::ResizePlan plan;
    imgmath::OutputSpec spec;
    DeviceImage image;
  };
  std::vector<Item> items(n);
  size_t scratch = 0;
  size_t fallbacks = 0;
  for (size_t i = 0; i < n; ++i) {
    Item& it = items[i];
    auto header = jpeg_.ReadHeader(samples[i].jpeg);
    if (!header.ok()) {
      // The CPU path decides (it decodes what nvJPEG's parser refuses, or gives its own error).
      ++stats_.fallback_header;
      it.fallback = true;
    } else if (int64_t{header->width} * header->height > options_.max_pixels) {
      result[i] = ResourceExhausted("image " + std::to_string(header->width) + "x" + std::to_string(header->height) +
                                    " has " + std::to_string(int64_t{header->width} * header->height) +
                                    " pixels, over the limit of " + std::to_string(options_.max_pixels));
      ++stats_.failed;
      continue;
    } else if (header->components == 4 || header->width > jpeg_.max_side() || header->height > jpeg_.max_side()) {
      ++stats_.fallback_unsupported;
      it.fallback = true;
    } else {
      auto plan = samples[i].plan(header->width, header->height, &it.spec);
      if (!plan.ok()) {
        if (plan.status().code() != StatusCode::kFailedPrecondition) {
          result[i] = plan.status();
          ++stats_.failed;
          continue;
        }
        ++stats_.fallback_unsupported;
        it.fallback = true;
      } else {
        it.gpu = true;
        it.plan = std::move(*plan);
        it.image.width = header->width;
        it.image.height = header->height;
        it.image.pitch = (static_cast<size_t>(header->width) * 3 + 255) / 256 * 256;
        scratch += it.image.pitch * static_cast<size_t>(header->height);
      }
    }
    if (it.fallback) ++fallbacks;
  }
  if (Status s = EnsureScratch(std::max<size_t>(scratch, 1)); !s.ok()) return fail_all(s);
  size_t offset = 0;
  std::vector<std::span<const uint8_t>> jpegs;
  std::vector<DeviceImage> outs;
  std::vector<size_t> gpu_index;
  for (size_t i = 0; i < n; ++i) {
    if (!items[i].gpu) continue;
    items[i].image.data = static_cast<uint8_t*>(scratch_) + offset;
    offset += items[i].image.pitch * static_cast<size_t>(items[i].image.height);
    jpegs.push_back(samples[i].jpeg);
    outs.push_back(items[i].image);
    gpu_index.push_back(i);
  }

  // 2. nvJPEG: one batch; when it fails as a whole, image by image (one bad file costs only itself).
  if (!jpegs.empty()) {
    const Status batch = jpeg_.DecodeBatch(jpegs, outs, stream);
    if (!batch.ok()) {
      ++stats_.batch_retries;
      for (size_t k = 0; k < gpu_index.size(); ++k) {
        Item& it = items[gpu_index[k]];
        if (Status one = jpeg_.DecodeOne(jpegs[k], outs[k], stream); !one.ok()) {
          if (one.code() == StatusCode::kInternal || one.code() == StatusCode::kResourceExhausted) {
            // The device or the decoder failed, not the file: the batch fails (no silent CPU run).
            return fail_all(one);
          }
          it.gpu = false;
          it.fallback = true;
          ++stats_.fallback_decode;
          ++fallbacks;
        }
      }
    }
  }

  // 3. The kernels: every decoded image into its row.
  for (size_t i = 0; i < n; ++i) {
    Item& it = items[i];
    if (!it.gpu) continue;
    if (Status s = kernels_.ResizeInto(it.image, it.plan, it.spec, samples[i].dst, stream); !s.ok()) {
      return fail_all(s.WithPrefix("gpu decode: resize kernel"));
    }
    ++stats_.gpu_decoded;
  }

  // 4. The CPU path for the rest: decoded into page-locked staging, uploaded on the same stream.
  if (fallbacks > 0) {
    if (Status s = EnsureStaging(fallbacks * options_.output_bytes); !s.ok()) return fail_all(s);
    size_t slot = 0;
    for (size_t i = 0; i < n; ++i) {
      if (!items[i].fallback) continue;
      uint8_t* host = staging_ + slot * options_.output_bytes;
      ++slot;
      ++stats_.cpu_fallback;
      if (Status s = cpu_(samples[i].jpeg, host, options_.output_bytes); !s.ok()) {
        result[i] = s;
        ++stats_.failed;
        continue;
      }
      if (Status s = device_.MemcpyH2DAsync(samples[i].dst, host, options_.output_bytes, stream); !s.ok()) {
        return fail_all(s.WithPrefix("gpu decode: uploading a CPU-decoded sample"));
      }
    }
  }
  if (Status s = device_.RecordEvent(done_, stream); !s.ok()) return fail_all(s);
  pending_ = true;
  return result;
}

}  // namespace spdl::cuda
