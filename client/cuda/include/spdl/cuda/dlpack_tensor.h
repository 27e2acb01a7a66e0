// DLPack descriptions of batch tensors, so a framework (PyTorch, JAX, CuPy) can take them without a
// copy: kDLCUDA on a device slot (copy: daemon / copy: client), or kDLCPU on the shared host slot.
//
// Pure functions; safe from any thread. Uses dlpack/dlpack.h (Debian: libdlpack-dev).
#pragma once

#include <dlpack/dlpack.h>

#include <memory>

#include "common/status.h"
#include "spdl/client.h"

namespace spdl::client {

// The DLPack data type of a client dtype: uint8 -> {kDLUInt, 8, 1}, int16/32/64 -> kDLInt,
// float16/32 -> kDLFloat, bfloat16 -> {kDLBfloat, 16, 1}.
DLDataType ToDLDataType(DType dtype);

// DLDevice{kDLCUDA, ordinal}: `ordinal` in THIS process's numbering (DeviceSlotView::device()).
inline DLDevice CudaDLDevice(int ordinal) { return DLDevice{kDLCUDA, ordinal}; }
inline DLDevice CpuDLDevice() { return DLDevice{kDLCPU, 0}; }

// Fills *out to describe `view` (C-contiguous, view.shape, view.dtype) at `data` on `device`.
// Borrowed: out->shape points into view.shape, so `view` must outlive *out and not change. strides
// is null (compact row-major), byte_offset 0. kInvalidArgument if data is null, the shape is empty
// or has a negative extent, or data is not aligned to the element size.
Status FillDLTensor(const TensorView& view, void* data, DLDevice device, DLTensor* out);

// An owned DLManagedTensor for handing to a framework (e.g. a Python capsule "dltensor"): it
// copies the shape and holds `keepalive` (e.g. a std::shared_ptr to the Batch, so the slot is not
// released while the framework uses the tensor) until the consumer calls its deleter, which frees
// everything. nullptr plus *status set on the same errors as FillDLTensor.
DLManagedTensor* MakeDLManagedTensor(const TensorView& view, void* data, DLDevice device,
                                     std::shared_ptr<void> keepalive, Status* status);

}  // namespace spdl::client
