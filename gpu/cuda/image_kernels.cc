#include "cuda/image_kernels.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/device_scope.h"
#include "cuda/image_kernels_launch.h"

namespace spdl::cuda {
namespace {

struct CudaRuntime {
  Status GetDevice(int* device) {
    return cudaGetDevice(device) == cudaSuccess ? Status::Ok() : Internal("cudaGetDevice failed");
  }
  Status SetDevice(int device) {
    return cudaSetDevice(device) == cudaSuccess ? Status::Ok() : Internal("cudaSetDevice failed");
  }
};

Status Check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();
  return Status(e == cudaErrorMemoryAllocation ? StatusCode::kResourceExhausted : StatusCode::kInternal,
                std::string("gpu decode kernels: ") + call + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Appends v's bytes to `blob` at an 8-byte aligned offset; returns the offset.
template <typename T>
size_t Append(std::vector<uint8_t>& blob, const T* v, size_t n) {
  const size_t off = (blob.size() + 7) / 8 * 8;
  blob.resize(off + n * sizeof(T));
  if (n > 0) std::memcpy(blob.data() + off, v, n * sizeof(T));
  return off;
}

}  // namespace

Status CudaImageKernels::ResizeInto(const DeviceImage& src, const imgmath::ResizePlan& plan,
                                    const imgmath::OutputSpec& o, void* dst, Stream stream) {
  CudaRuntime rt;
  ScopedDevice<CudaRuntime> scope(rt, device_);
  SPDL_RETURN_IF_ERROR(scope.status());
  const auto s = static_cast<cudaStream_t>(stream.handle);
  // One blob: the axis tables and the value table, then the intermediate image.
  std::vector<uint8_t> blob;
  const size_t hf = Append(blob, plan.h_first.data(), plan.h_first.size());
  const size_t hc = Append(blob, plan.h_count.data(), plan.h_count.size());
  const size_t hw = Append(blob, plan.h_weights.data(), plan.h_weights.size());
  const size_t vf = Append(blob, plan.v_first.data(), plan.v_first.size());
  const size_t vc = Append(blob, plan.v_count.data(), plan.v_count.size());
  const size_t vw = Append(blob, plan.v_weights.data(), plan.v_weights.size());
  size_t lut = 0;
  if (o.dtype == imgmath::kOutF32) lut = Append(blob, o.lut_f32, size_t(o.channels) * 256);
  if (o.dtype == imgmath::kOutU16Bits) lut = Append(blob, o.lut_u16, size_t(o.channels) * 256);
  const size_t mid_pitch = static_cast<size_t>(o.width) * o.channels;
  const size_t mid_off = (blob.size() + 255) / 256 * 256;
  const size_t total = mid_off + mid_pitch * static_cast<size_t>(plan.geometry.rows);
  void* mem = nullptr;
  SPDL_RETURN_IF_ERROR(Check(cudaMallocAsync(&mem, total, s), "cudaMallocAsync"));
  auto* d = static_cast<uint8_t*>(mem);
  Status st = Check(cudaMemcpyAsync(d, blob.data(), blob.size(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
  if (st.ok()) {
    imgmath::AxisTaps h = plan.horizontal();
    h.first = reinterpret_cast<const int*>(d + hf);
    h.count = reinterpret_cast<const int*>(d + hc);
    h.weights = reinterpret_cast<const int32_t*>(d + hw);
    imgmath::AxisTaps v = plan.vertical();
    v.first = reinterpret_cast<const int*>(d + vf);
    v.count = reinterpret_cast<const int*>(d + vc);
    v.weights = reinterpret_cast<const int32_t*>(d + vw);
    imgmath::OutputSpec od = o;
    od.lut_f32 = o.dtype == imgmath::kOutF32 ? reinterpret_cast<const float*>(d + lut) : nullptr;
    od.lut_u16 = o.dtype == imgmath::kOutU16Bits ? reinterpret_cast<const uint16_t*>(d + lut) : nullptr;
    st = Check(static_cast<cudaError_t>(kernels::LaunchResize(src.data, src.pitch, plan.geometry, h, v, d + mid_off,
                                                              mid_pitch, od, dst, stream.handle)),
               "resize kernels");
  }
  // Freed in stream order: after the kernels that read it.
  const Status freed = Check(cudaFreeAsync(mem, s), "cudaFreeAsync");
  return st.ok() ? freed : st;
}

}  // namespace spdl::cuda
