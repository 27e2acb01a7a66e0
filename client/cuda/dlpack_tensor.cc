#include "spdl/cuda/dlpack_tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace spdl::client {
namespace {

Status Check(const TensorView& view, void* data) {
  if (data == nullptr) return InvalidArgument("DLPack tensor '" + view.name + "': no data");
  if (view.shape.empty()) return InvalidArgument("DLPack tensor '" + view.name + "': no shape");
  for (int64_t d : view.shape) {
    if (d < 0) return InvalidArgument("DLPack tensor '" + view.name + "': negative extent");
  }
  if (reinterpret_cast<uintptr_t>(data) % DTypeSize(view.dtype) != 0) {
    return InvalidArgument("DLPack tensor '" + view.name + "': data not aligned to its " + DTypeName(view.dtype) +
                           " elements");
  }
  return Status::Ok();
}

// What a managed tensor owns; freed by its deleter.
struct ManagerContext {
  DLManagedTensor tensor{.dl_tensor = {.device = {kDLCPU, 0}}};  // filled in by MakeDLManagedTensor
  std::vector<int64_t> shape;
  std::shared_ptr<void> keepalive;
};

void DeleteManaged(DLManagedTensor* self) { delete static_cast<ManagerContext*>(self->manager_ctx); }

}  // namespace

DLDataType ToDLDataType(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return DLDataType{kDLUInt, 8, 1};
    case DType::kInt16:
      return DLDataType{kDLInt, 16, 1};
    case DType::kInt32:
      return DLDataType{kDLInt, 32, 1};
    case DType::kInt64:
      return DLDataType{kDLInt, 64, 1};
    case DType::kFloat16:
      return DLDataType{kDLFloat, 16, 1};
    case DType::kBFloat16:
      return DLDataType{kDLBfloat, 16, 1};
    case DType::kFloat32:
      return DLDataType{kDLFloat, 32, 1};
  }
  return DLDataType{kDLUInt, 8, 1};
}

Status FillDLTensor(const TensorView& view, void* data, DLDevice device, DLTensor* out) {
  SPDL_RETURN_IF_ERROR(Check(view, data));
  *out = DLTensor{.data = data,
                  .device = device,
                  .ndim = static_cast<int>(view.shape.size()),
                  .dtype = ToDLDataType(view.dtype),
                  .shape = const_cast<int64_t*>(view.shape.data()),  // DLPack's field is non-const; never written
                  .strides = nullptr,
                  .byte_offset = 0};
  return Status::Ok();
}

DLManagedTensor* MakeDLManagedTensor(const TensorView& view, void* data, DLDevice device,
                                     std::shared_ptr<void> keepalive, Status* status) {
  *status = Check(view, data);
  if (!status->ok()) return nullptr;
  auto* ctx = new ManagerContext;
  ctx->shape = view.shape;
  ctx->keepalive = std::move(keepalive);
  DLTensor& t = ctx->tensor.dl_tensor;
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int>(ctx->shape.size());
  t.dtype = ToDLDataType(view.dtype);
  t.shape = ctx->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  ctx->tensor.manager_ctx = ctx;
  ctx->tensor.deleter = &DeleteManaged;
  return &ctx->tensor;
}

}  // namespace spdl::client
