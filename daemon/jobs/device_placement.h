// DevicePlacement: where a copy: daemon GPU job's device side lives. The job's output.device cuda:N
// is the trainer's ordinal; the daemon's own ordinal for that GPU is found by the UUID the client
// sends (CUDA_VISIBLE_DEVICES may number the GPUs differently in the two processes); a client that
// sends none gets the daemon's cuda:N, and refuses it itself if its UUID differs. The device's
// backend (a CUDA context, made at the first job on the device: slow) is made in the Prepare task,
// off the control thread; Start only checks it (made, not poisoned by a sticky error).
//
// Thread-safe: SetBackends / SetFinder before the first job; Resolve on any thread; Check, NoteUsed
// and Used on any thread (used_ is guarded by mu_).
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "config/job_config.h"
#include "cuda/device_backend.h"

namespace spdl::jobs {

class DevicePlacement {
 public:
  // The backend of the daemon's CUDA device N (made lazily, owned by the caller); an error says why
  // there is none. Must be thread-safe (called from Prepare tasks).
  using BackendFn = std::function<Result<cuda::DeviceBackend*>(int device)>;
  // The daemon's ordinal of the device with a UUID; an error when the daemon does not see it.
  using FinderFn = std::function<Result<int>(const cuda::DeviceUuid& uuid)>;

  struct Placement {
    int device = -1;                         // the daemon's ordinal; -1: no device side
    cuda::DeviceBackend* backend = nullptr;  // made by Resolve (null: Check makes it or says why not)
  };

  // Unset (a daemon built without CUDA): copy: daemon jobs are refused with a clear message.
  void SetBackends(BackendFn fn) { backends_ = std::move(fn); }
  void SetFinder(FinderFn fn) { finder_ = std::move(fn); }
  bool has_backends() const { return static_cast<bool>(backends_); }

  // True when `output` asks the daemon to copy to a GPU (cuda:N with copy: daemon).
  static bool DaemonCopies(const config::OutputConfig& output);

  // The Prepare task's part: the daemon's ordinal of the trainer's GPU (by `device_uuid`, empty: the
  // job's cuda:N) and its backend, made now. A placement with device -1 for jobs without a device
  // side. Errors: kFailedPrecondition for a malformed UUID, kResourceExhausted for a GPU spdld does
  // not see. A backend that cannot be made is not an error here: Check reports it.
  Result<Placement> Resolve(const config::OutputConfig& output, const std::string& device_uuid) const;

  // Start's part (REQUIRES: DaemonCopies(output)): the placement's backend (made now if Resolve
  // could not), checked healthy. kResourceExhausted naming output.device and the way out
  // (copy: client or device: cpu) when there is no backend, it cannot be made, or it is poisoned.
  Result<Placement> Check(const config::OutputConfig& output, Placement prepared) const;

  // Records that a job now uses `backend` on `device` (for Used: status and metrics).
  void NoteUsed(int device, cuda::DeviceBackend* backend);
  // The devices jobs have used, with their backends, by ordinal.
  std::vector<std::pair<int, cuda::DeviceBackend*>> Used() const;

 private:
  BackendFn backends_;  // set before the first job
  FinderFn finder_;     // set before the first job
  mutable std::mutex mu_;
  std::map<int, cuda::DeviceBackend*> used_;  // guarded by mu_
};

}  // namespace spdl::jobs
