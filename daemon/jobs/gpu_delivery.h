// GpuDelivery: GPU delivery (output.device: cuda:N) for a started job, as a JobHandle that wraps
// the job (the job itself stays a CPU job: it fills host slots; this layer adds the device side).
//
// copy: daemon (a DeviceBackend is given): owns a cuda::DeviceSlotPool over the job's shared region
// (mapped a second time here from the job's region fd, or the memory a test gives), so that
//   - cuda_handles() is the CudaHandles the session sends once after JobAccepted;
//   - ImportConsumerEvents takes the client's per-slot consumer-done events;
//   - TakeNext: for each batch the job hands out, before BatchReady is sent: pool Submit (H2D copy
//     of the host slot + the slot's ready event, enqueued, never blocking) then pool Lease under the
//     ring's generation. The device slot must be free: when the client's consumer-done event of its
//     last use has not completed yet (host query; the copy stream never waits on the client's
//     event), the batch is held, the waiter thread polls the event and notifies, and past
//     consumer_timeout only this job fails (a stalled or dead trainer);
//   - Release: pool Release (its generation checked), then the ring Release — but only once the
//     slot's copy has finished reading the host slot (HostSlotReusable). When it has not (the
//     client released before its GPU reached the copy), the ring release is deferred: a waiter
//     thread of this object polls HostSlotReusable (every ms, only while one is deferred), then calls `notify`, and the
//     next TakeNext (control thread) forwards the release. So the pipeline never refills a host slot a copy may still
//     read, and the control thread never blocks on the GPU.
//   - Cancel (EndJob, disconnect, failure): pool Stop + ReleaseAll, then the job's Cancel.
// copy: client (no backend): only JobAccepted changes (device, client_copy = true); the client
// pins the shared slots in its own process and copies them itself.
//
// Teardown (destructor, any thread; in practice the control thread): the waiter thread is joined and
// the pool stopped (no more copies). With a GpuTeardownQueue, ALWAYS on the queue's thread (frees and
// unregistrations synchronize with the GPU, so never on the control thread): the pool's Shutdown
// waits for the queued copies (bounded by its drain timeout; they wait on nothing foreign), destroys
// events and stream, frees the device memory and unregisters the host region, then the second
// mapping is unmapped and on_close returns the device budget. When the copies never drain, the
// device memory, the registration and the second mapping are leaked (freeing under a copy would
// corrupt memory), and on_close gets the leaked bytes, which stay counted as used. The wrapped job
// is released at once. (The host pages stay valid for queued copies: they read through this
// object's own mapping of the region, not the job's.) When the wrapper goes is the session's
// business: it keeps a GPU job until the client has closed its IPC mapping (SessionLogic).
//
// Threading: like any JobHandle, control thread only, except the waiter thread described above
// (it touches only the pool, which is thread-safe, and the guarded pending lists).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/status.h"
#include "config/job_config.h"
#include "cuda/device_backend.h"
#include "jobs/gpu_batch_decode.h"
#include "jobs/job_service.h"

namespace spdl::jobs {

// Runs slow GPU teardowns (a device slot pool whose copies have not drained yet) on its own thread,
// one after another, so that the daemon's control thread never waits for the GPU. The thread starts
// with the first Post. The destructor runs what is still queued (each bounded by its pool's drain
// timeout) and joins: destroy the queue after every job that may post to it and before the device
// backends the work uses.
// Thread safety: Post and pending from any thread.
class GpuTeardownQueue {
 public:
  GpuTeardownQueue() = default;
  ~GpuTeardownQueue();
  GpuTeardownQueue(const GpuTeardownQueue&) = delete;
  GpuTeardownQueue& operator=(const GpuTeardownQueue&) = delete;

  void Post(std::function<void()> work);
  // Work posted and not yet finished.
  size_t pending() const;

 private:
  void Loop();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  std::deque<std::function<void()>> queue_;
  size_t running_ = 0;
  bool stop_ = false;
  std::thread thread_;  // started by the first Post
};

struct GpuDeliveryOptions {
  config::OutputConfig output;  // device (cuda:N) and copy
  // The job's shared region in this process; null = map the job's region_fd (accepted().region_bytes).
  void* host_base = nullptr;
  // Page-lock the host region (tests with an already registered region turn it off).
  bool register_host = true;
  // As JobService::Submit's notify: schedules the session's OnJobEvent on the control thread.
  std::function<void()> notify;
  // Called once when the wrapper is destroyed, after the device memory is freed (returns the
  // device budget), with the device bytes that could not be freed (leaked: a copy never drained;
  // they must stay counted as used). May be empty.
  std::function<void(uint64_t leaked_device_bytes)> on_close;
  // How long a batch may wait for the client's consumer-done event of its device slot (from when
  // it was first held) before this job fails: the trainer is stalled or dead.
  std::chrono::milliseconds consumer_timeout{60000};
  // How long the teardown waits for queued copies before it leaks the device memory.
  std::chrono::milliseconds drain_timeout{10000};
  // decode.device: cuda: the job's batch decode, attached to the device slots here (its images go
  // straight into them; the slot copy skips the image tensor) and detached at teardown before the
  // slots are freed. Null: the job decodes on the CPU.
  std::shared_ptr<GpuBatchDecode> gpu_decode;
  // Where a teardown that would wait for the GPU runs (borrowed; must outlive the job). Null: inline,
  // on the thread that drops the job (tests; bounded by the pool's drain timeout).
  GpuTeardownQueue* teardown = nullptr;
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
