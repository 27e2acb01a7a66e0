#include "jobs/device_placement.h"

#include <cstring>

namespace spdl::jobs {

bool DevicePlacement::DaemonCopies(const config::OutputConfig& output) {
  return output.cuda_device >= 0 && output.copy == config::OutputConfig::Copy::kDaemon;
}

Result<DevicePlacement::Placement> DevicePlacement::Resolve(const config::OutputConfig& output,
                                                            const std::string& device_uuid) const {
  Placement p;
  if (!DaemonCopies(output) || !backends_) return p;
  p.device = output.cuda_device;
  if (!device_uuid.empty()) {
    cuda::DeviceUuid uuid{};
    if (device_uuid.size() != uuid.size()) {
      return FailedPrecondition("SubmitJob.device_uuid is " + std::to_string(device_uuid.size()) +
                                " bytes; a CUDA device UUID is " + std::to_string(uuid.size()));
    }
    std::memcpy(uuid.data(), device_uuid.data(), uuid.size());
    auto found = finder_ ? finder_(uuid) : Result<int>(NotFound("no device lookup"));
    if (!found.ok()) {
      return ResourceExhausted("output.device " + output.device + ": the trainer's GPU " + cuda::FormatUuid(uuid) +
                               " is not one spdld sees (" + found.status().message() +
                               "): give spdld that GPU (its CUDA_VISIBLE_DEVICES must include it), or use "
                               "output.copy: client or output.device: cpu");
    }
    p.device = *found;
  }
  auto b = backends_(p.device);
  if (b.ok()) p.backend = *b;  // else Check asks again and reports why
  return p;
}

Result<DevicePlacement::Placement> DevicePlacement::Check(const config::OutputConfig& output,
                                                          Placement prepared) const {
  if (!backends_) {
    return ResourceExhausted("output.device " + output.device +
                             ": this spdld was built without CUDA, so it cannot copy batches to a GPU; use "
                             "output.copy: client (the client copies) or output.device: cpu");
  }
  if (prepared.device < 0) prepared.device = output.cuda_device;
  if (!prepared.backend) {
    auto b = backends_(prepared.device);
    if (!b.ok()) {
      return ResourceExhausted("output.device " + output.device + ": " + b.status().message() +
                               "; use output.copy: client or output.device: cpu");
    }
    prepared.backend = *b;
  }
  if (Status sticky = prepared.backend->sticky_error(); !sticky.ok()) {
    return ResourceExhausted("output.device " + output.device + ": " + sticky.message() +
                             " (restart spdld); use output.copy: client or output.device: cpu meanwhile");
  }
  return prepared;
}

void DevicePlacement::NoteUsed(int device, cuda::DeviceBackend* backend) {
  std::lock_guard lock(mu_);
  used_[device] = backend;
}

std::vector<std::pair<int, cuda::DeviceBackend*>> DevicePlacement::Used() const {
  std::lock_guard lock(mu_);
  return {used_.begin(), used_.end()};
}

}  // namespace spdl::jobs
