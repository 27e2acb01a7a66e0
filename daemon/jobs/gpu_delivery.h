// GpuDelivery: GPU delivery (output.device: cuda:N) for a started job, as a JobHandle that wraps
// the job (the job itself stays a CPU job: it fills host slots; this layer adds the device side).
//
// copy: daemon (a DeviceBackend is given): owns a cuda::DeviceSlotPool over the job's shared region
// (mapped a second time here from the job's region fd, or the memory a test gives), so that
//   - cuda_handles() is the CudaHandles the session sends once after JobAccepted;
//   - ImportConsumerEvents takes the client's per-slot consumer-done events;
//   - TakeNext: for each batch the job hands out, before BatchReady is sent: pool Submit (H2D copy
//     of the host slot + the slot's ready event, enqueued, never blocking) then pool Lease under the
//     ring's generation;
//   - Release: pool Release (its generation checked), then the ring Release — but only once the
//     slot's copy has finished reading the host slot (HostSlotReusable). When it has not (the
//     client released before its GPU reached the copy), the ring release is deferred: a waiter
//     thread of this object polls HostSlotReusable (every ms, only while one is deferred), then calls `notify`, and the next
//     TakeNext (control thread) forwards the release. So the pipeline never refills a host slot a
//     copy may still read, and the control thread never blocks on the GPU.
//   - Cancel (EndJob, disconnect, failure): pool Stop + ReleaseAll, then the job's Cancel.
// copy: client (no backend): only JobAccepted changes (device, client_copy = true); the client
// pins the shared slots in its own process and copies them itself.
//
// Teardown (destructor, any thread): the waiter thread is joined, the pool is destroyed (it drains
// queued copies, destroys the events and stream, frees the device memory, unregisters the host
// region), the second mapping is unmapped, the device budget is returned (on_close), and only then
// is the wrapped job released.
//
// Threading: like any JobHandle, control thread only, except the waiter thread described above
// (it touches only the pool, which is thread-safe, and the guarded pending lists).
#pragma once

#include <functional>
#include <memory>

#include "common/status.h"
#include "config/job_config.h"
#include "cuda/device_backend.h"
#include "jobs/job_service.h"

namespace spdl::jobs {

struct GpuDeliveryOptions {
  config::OutputConfig output;  // device (cuda:N) and copy
  // The job's shared region in this process; null = map the job's region_fd (accepted().region_bytes).
  void* host_base = nullptr;
  // Page-lock the host region (tests with an already registered region turn it off).
  bool register_host = true;
  // As JobService::Submit's notify: schedules the session's OnJobEvent on the control thread.
  std::function<void()> notify;
  // Called once when the wrapper is destroyed, after the device memory is freed (returns the
  // device budget). May be empty.
  std::function<void()> on_close;
};

// The device bytes a copy: daemon job with this layout takes (for admission before anything is
// allocated).
uint64_t GpuDeviceBytes(const proto::JobAccepted& accepted);

// Wraps `job` (just started) for output.device cuda:N. `backend` (borrowed, must outlive the
// result) is required for copy: daemon and ignored for copy: client. Errors: the backend's, prefixed
// with what was being set up; the job is cancelled on error.
Result<std::shared_ptr<JobHandle>> WrapGpuJob(std::shared_ptr<JobHandle> job, cuda::DeviceBackend* backend,
                                              GpuDeliveryOptions options);

}  // namespace spdl::jobs
