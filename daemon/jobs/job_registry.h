// JobRegistry: the daemon's JobService. Turns a SubmitJob request into a running job: validates
// the config (every problem listed), opens the job's sample source (an image folder scan, a list,
// a tar index or a URL list; every local path checked against the allowed roots, every URL
// against the allowed URL prefixes), admits the job against the limits and the node's
// shared-memory budget (a refused job is never half-started), and starts it on the shared worker
// pool.
//
// Thread-safe: Submit runs on the control thread (so a large folder scan or tar index delays the
// other sessions until it ends; moving it off that thread needs an asynchronous Submit); budget
// leases are returned from whichever thread destroys a job (guarded by mu_).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "config/daemon_config.h"
#include "cuda/device_backend.h"
#include "jobs/job_service.h"
#include "pipeline/executor.h"

namespace spdl::jobs {

class JobRegistry final : public JobService {
 public:
  // *executor must outlive every job (the daemon joins the pool before destroying the registry).
  // `worker_threads` is only reported (Status). io stages run on *io_executor (nullptr: *executor),
  // which must outlive every job too.
  JobRegistry(const config::DaemonConfig& config, pipeline::Executor* executor, int worker_threads = 0,
              pipeline::Executor* io_executor = nullptr);
  ~JobRegistry() override;

  SubmitResult Submit(const proto::SubmitJob& request, const PeerInfo& peer, std::function<void()> notify) override;
  proto::DaemonStatus Status(const PeerInfo& peer) override;
  spdl::Status Cancel(uint64_t job_id, const PeerInfo& peer) override;

  // Config reload (SIGHUP): the limits (memory_budget_bytes, max_jobs_per_client,
  // max_slots_per_job, allowed_roots) that jobs submitted from now on are admitted against; running
  // jobs keep what they hold, even above a lowered budget. Control thread only.
  void UpdateLimits(const config::DaemonConfig& config);
  // The worker pool's size after a reload resized it (reported by Status). Control thread only.
  void SetWorkerThreads(int threads) { worker_threads_ = threads; }

  // GPU delivery: the backend of CUDA device N (made lazily, owned by the caller, alive as long as
  // the registry); an error says why there is none. Unset (a daemon built without CUDA): output.device
  // cuda:N jobs with copy: daemon are refused with a clear message. Before the first Submit.
  using DeviceBackendFn = std::function<Result<cuda::DeviceBackend*>(int device)>;
  void SetDeviceBackends(DeviceBackendFn fn) { device_backends_ = std::move(fn); }
  // Device bytes held by live copy: daemon jobs on CUDA device N.
  uint64_t device_bytes_in_use(int device) const {
    std::lock_guard lock(mu_);
    auto it = device_bytes_in_use_.find(device);
    return it == device_bytes_in_use_.end() ? 0 : it->second;
  }

  // Shared-memory bytes held by live jobs.
  uint64_t bytes_in_use() const;
  // Jobs alive (including ones whose last tasks are still finishing).
  int live_jobs() const;

 private:
  class Lease;
  void Return(uid_t uid, uint64_t bytes);

  // Written by UpdateLimits and read by Submit/Status, all on the control thread.
  config::DaemonConfig config_;
  // Constant after construction.
  pipeline::Executor* const executor_;
  pipeline::Executor* const io_executor_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  int worker_threads_;  // control thread only (SetWorkerThreads)
  DeviceBackendFn device_backends_;  // set before the first Submit

  // Control thread only: live jobs for Status / Cancel (expired entries are dropped lazily).
  std::map<uint64_t, std::shared_ptr<JobRecord>> records_;

  std::atomic<uint64_t> next_job_id_{1};
  mutable std::mutex mu_;
  // Guarded by mu_.
  uint64_t bytes_in_use_ = 0;
  std::map<uid_t, int> jobs_per_uid_;
  std::map<int, uint64_t> device_bytes_in_use_;  // per CUDA device
  int live_jobs_ = 0;
};

}  // namespace spdl::jobs
