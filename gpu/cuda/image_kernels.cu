// The resize / crop / flip / value kernels of GPU decode: one thread per sample, each running
// image_math.h's functions (the same code the CPU tests run on the host).
#include <cuda_runtime.h>

#include "cuda/image_kernels_launch.h"

namespace spdl::cuda::kernels {
namespace {

__global__ void HorizontalPass(const uint8_t* src, size_t pitch, imgmath::ResizeGeometry g, imgmath::AxisTaps h,
                               uint8_t* mid, size_t mid_pitch, int out_width, int channels) {
  const size_t n = static_cast<size_t>(g.rows) * out_width * channels;
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(k % channels);
    const int i = static_cast<int>(k / channels % out_width);
    const int r = static_cast<int>(k / channels / out_width);
    mid[r * mid_pitch + static_cast<size_t>(i) * channels + c] =
        imgmath::HorizontalSample(src, pitch, channels, g, h, r, i, c);
  }
}

__global__ void VerticalPass(const uint8_t* mid, size_t mid_pitch, imgmath::ResizeGeometry g, imgmath::AxisTaps v,
                             imgmath::OutputSpec o, void* dst) {
  const size_t n = static_cast<size_t>(o.height) * o.width * o.channels;
  for (size_t k = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(k % o.channels);
    const int i = static_cast<int>(k / o.channels % o.width);
    const int y = static_cast<int>(k / o.channels / o.width);
    imgmath::StoreSample(dst, o, i, y, c, imgmath::VerticalSample(mid, mid_pitch, o.channels, g, v, y, i, c));
  }
}

unsigned Blocks(size_t n, unsigned threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}

}  // namespace

int LaunchResize(const uint8_t* src, size_t pitch, const imgmath::ResizeGeometry& g, const imgmath::AxisTaps& h,
                 const imgmath::AxisTaps& v, uint8_t* mid, size_t mid_pitch, const imgmath::OutputSpec& o, void* dst,
                 void* stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  constexpr unsigned kThreads = 256;
  const size_t n1 = static_cast<size_t>(g.rows) * o.width * o.channels;
  HorizontalPass<<<Blocks(n1, kThreads), kThreads, 0, s>>>(src, pitch, g, h, mid, mid_pitch, o.width, o.channels);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  const size_t n2 = static_cast<size_t>(o.height) * o.width * o.channels;
  VerticalPass<<<Blocks(n2, kThreads), kThreads, 0, s>>>(mid, mid_pitch, g, v, o, dst);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace spdl::cuda::kernels
