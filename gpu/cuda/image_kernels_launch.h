// The launch functions of the resize kernels (image_kernels.cu), in a header nvcc can read (C++17,
// no project headers but image_math.h): CudaImageKernels (image_kernels.h) calls them.
// Thread safety: as CUDA launches (any thread, the device current).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/image_math.h"

namespace spdl::cuda::kernels {

// Enqueues on `stream` (a cudaStream_t) the two passes of imgmath over one image: the horizontal
// pass from `src` (decoded RGB, `pitch` bytes a row) into `mid` (g.rows rows of mid_pitch bytes),
// then the vertical pass + StoreSample into `dst`. h, v and o's tables are device pointers.
// Returns the cudaError_t of the launches (0: enqueued).
int LaunchResize(const uint8_t* src, size_t pitch, const imgmath::ResizeGeometry& g, const imgmath::AxisTaps& h,
                 const imgmath::AxisTaps& v, uint8_t* mid, size_t mid_pitch, const imgmath::OutputSpec& o, void* dst,
                 void* stream);

}  // namespace spdl::cuda::kernels
