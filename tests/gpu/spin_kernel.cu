// A kernel that keeps the GPU busy for a while: stands for a trainer's slow kernel still reading a
// device slot after the trainer has released it.
#include "spin_kernel.h"

namespace {

__global__ void Spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

}  // namespace

cudaError_t SpdlLaunchSpin(double milliseconds, cudaStream_t stream) {
  int device = 0, khz = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device);
  if (e != cudaSuccess || khz <= 0) khz = 1500000;  // CUDA 13 may not report it: assume 1.5 GHz
  const long long cycles = static_cast<long long>(milliseconds * khz);
  Spin<<<1, 1, 0, stream>>>(cycles);
  return cudaGetLastError();
}
