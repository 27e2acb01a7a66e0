#include "spdl/cuda/cuda_device.h"

#include "cuda/cuda_backend.h"

namespace spdl::client {

Result<std::unique_ptr<cuda::DeviceBackend>> OpenDaemonDevice(const cuda::CudaJobHandles& handles) {
  SPDL_ASSIGN_OR_RETURN(int ordinal, cuda::FindCudaDevice(handles.device_uuid));
  return OpenCudaDevice(ordinal);
}

Result<std::unique_ptr<cuda::DeviceBackend>> OpenCudaDevice(int ordinal) {
  cuda::CudaBackend::Options o;
  o.device = ordinal;
  SPDL_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::Create(std::move(o)));
  return std::unique_ptr<cuda::DeviceBackend>(std::move(backend));
}

BackendFactory CudaBackendFactory() {
  return [](const cuda::CudaJobHandles* handles, int ordinal) -> Result<std::unique_ptr<cuda::DeviceBackend>> {
    if (handles != nullptr && ordinal < 0) return OpenDaemonDevice(*handles);
    return OpenCudaDevice(ordinal < 0 ? 0 : ordinal);
  };
}

}  // namespace spdl::client
