// The client's entry to the real CUDA backend (library spdl_client_cuda, built only with CUDA):
// picks this process's ordinal for the daemon's device and makes the CudaBackend that
// DeviceSlotView / ClientCopyPool run on.
//
// Thread safety: free functions; the backend returned is safe to share between threads.
#pragma once

#include <memory>

#include "common/status.h"
#include "cuda/device_backend.h"
#include "cuda/ipc_messages.h"
#include "spdl/cuda/gpu_loader.h"

namespace spdl::client {

// A CudaBackend on the device the daemon exported `handles` from, found by UUID (the ordinals of
// the daemon and of this process may differ under CUDA_VISIBLE_DEVICES). kNotFound when this
// process cannot see that device; kUnavailable when there is no CUDA device or driver at all.
Result<std::unique_ptr<cuda::DeviceBackend>> OpenDaemonDevice(const cuda::CudaJobHandles& handles);

// A CudaBackend on this process's ordinal `ordinal` (for copy: client). kUnavailable if absent.
Result<std::unique_ptr<cuda::DeviceBackend>> OpenCudaDevice(int ordinal);

// The factory GpuOptions::open_backend wants, on CUDA: OpenDaemonDevice(*handles) for copy: daemon,
// OpenCudaDevice(ordinal) for copy: client.
BackendFactory CudaBackendFactory();

}  // namespace spdl::client
