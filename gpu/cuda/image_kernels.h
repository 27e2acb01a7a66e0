// CudaImageKernels: the ImageKernels (cuda/jpeg_decode.h) that run the resize kernels
// (image_kernels.cu) on a real GPU. Built only with CUDA.
//
// Per call, the plan's tables and the intermediate image go to stream-ordered device memory
// (cudaMallocAsync / cudaFreeAsync on the caller's stream: freed once the kernels have run, never
// under them); the host tables are copied from pageable memory, which CUDA stages before the call
// returns, so the plan may go at once.
//
// Thread safety: safe to share (each call uses only its own memory).
#pragma once

#include "cuda/jpeg_decode.h"

namespace spdl::cuda {

class CudaImageKernels final : public ImageKernels {
 public:
  // `device`: the CUDA ordinal the streams passed in belong to.
  explicit CudaImageKernels(int device) : device_(device) {}
  Status ResizeInto(const DeviceImage& src, const imgmath::ResizePlan& plan, const imgmath::OutputSpec& o, void* dst,
                    Stream stream) override;

 private:
  const int device_;
};

}  // namespace spdl::cuda
