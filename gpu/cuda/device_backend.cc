#include "cuda/device_backend.h"

#include <algorithm>
#include <cstdio>

#include "cuda/device_handles.h"

namespace spdl::cuda {

std::string FormatUuid(const DeviceUuid& uuid) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[uuid[i] >> 4];
    out += kHex[uuid[i] & 0xf];
  }
  return out;
}

void DeviceBackend::ReportTeardownError(const Status& status) {
  std::fprintf(stderr, "spdl %s backend (device %d): %s\n", name(), device(), status.ToString().c_str());
}

Result<StreamHandle> MakeStream(DeviceBackend& backend) {
  SPDL_ASSIGN_OR_RETURN(Stream s, backend.CreateStream());
  return StreamHandle(&backend, s);
}

Result<EventHandle> MakeEvent(DeviceBackend& backend, bool interprocess) {
  SPDL_ASSIGN_OR_RETURN(Event e, backend.CreateEvent(interprocess));
  return EventHandle(&backend, e);
}

Result<EventHandle> OpenIpcEvent(DeviceBackend& backend, const IpcEventHandle& handle) {
  SPDL_ASSIGN_OR_RETURN(Event e, backend.OpenEvent(handle));
  return EventHandle(&backend, e);
}

Result<DeviceBuffer> AllocDevice(DeviceBackend& backend, size_t bytes) {
  SPDL_ASSIGN_OR_RETURN(void* p, backend.DeviceAlloc(bytes));
  return DeviceBuffer(&backend, internal::Span{p, bytes});
}

Result<HostRegistration> RegisterHost(DeviceBackend& backend, void* ptr, size_t bytes) {
  SPDL_RETURN_IF_ERROR(backend.HostRegister(ptr, bytes));
  return HostRegistration(&backend, internal::Span{ptr, bytes});
}

Status JoinStreams(DeviceBackend& backend, const std::vector<Stream>& from, Stream into) {
  std::vector<Stream> done{into};
  for (Stream s : from) {
    if (std::find(done.begin(), done.end(), s) != done.end()) continue;
    done.push_back(s);
    SPDL_ASSIGN_OR_RETURN(EventHandle ev, MakeEvent(backend, /*interprocess=*/false));
    SPDL_RETURN_IF_ERROR(backend.RecordEvent(ev.get(), s));
    SPDL_RETURN_IF_ERROR(backend.StreamWaitEvent(into, ev.get()));
    // Destroying it now is fine: the wait captured the record.
  }
  return Status::Ok();
}

Result<IpcMemMapping> OpenIpcMemory(DeviceBackend& backend, const IpcMemHandle& handle) {
  SPDL_ASSIGN_OR_RETURN(void* p, backend.OpenMemory(handle));
  return IpcMemMapping(&backend, p);
}

}  // namespace spdl::cuda
