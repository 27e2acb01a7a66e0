// JobRegistry: the daemon's JobService. Turns a SubmitJob request into a running job: validates
// the config (every problem listed), opens the job's sample source (an image folder scan, a list,
// a tar index or a URL list; every local path checked against the allowed roots, every URL
// against the allowed URL prefixes), admits the job against the limits and the node's
// shared-memory budget (a refused job is never half-started), and starts it on the shared worker
// pool.
//
// With the daemon config's cache_bytes > 0 every job's source reads through one node-wide
// io::SampleCache (io/sample_cache.h), and the job's stats carry its hits and misses. A job with
// share: true joins a live ShareGroup (jobs/shared_job.h) of the same uid, config text (and
// overrides), dataset fingerprint, rank, world size and epochs that has not handed out a batch yet,
// instead of starting its own pipeline; a member that joins takes no memory budget and does not
// count against max_jobs_per_client (the group's one job holds both). Resumed jobs never share.
//
// Roles, each its own class: Admission (jobs/admission.h: the budgets, granted as RAII leases),
// ShareGroups (jobs/share_groups.h: the live share groups by key) and DevicePlacement
// (jobs/device_placement.h: the daemon's GPU and backend of a copy: daemon job). Start is
// transactional: every step that can fail runs after the reservations it needs are held by RAII
// guards, so a failure at any step returns the budget, cancels a started job and registers no group.
// Errors leave the jobs layer as Status (SubmitResult); the server turns them into wire errors.
//
// Thread-safe: Submit, Prepare and Start run on the control thread, Prepare's task on any thread (the
// control server runs it on its own pool, so a large folder scan or tar index does not delay the
// other sessions); budget leases are returned from whichever thread destroys a job (Admission is thread-safe).
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>

#include "config/daemon_config.h"
#include "cuda/device_backend.h"
#include "io/sample_cache.h"
#include "io/shard_cache.h"
#include "io/source_index_cache.h"
#include "jobs/admission.h"
#include "jobs/decoded_cache.h"
#include "jobs/device_placement.h"
#include "jobs/gpu_batch_decode.h"
#include "jobs/gpu_delivery.h"
#include "jobs/job_service.h"
#include "jobs/memory_budget.h"
#include "jobs/share_groups.h"
#include "jobs/watch_feeder.h"
#include "pipeline/executor.h"
#include "plugins/op_loader.h"

namespace spdl::jobs {

class ShareGroup;

// A stream's figures as DaemonStatus lists them (spdlctl streams, the spdld_stream_* metrics): every
// field of proto::StreamStatus and of each of its groups' StreamGroupStatus from `s` (their rows:
// proto/job_stats_fields.h; stream_job_test checks each row is filled).
proto::StreamStatus StreamStatusOf(const streams::StreamStats& s);

class JobRegistry final : public JobService {
 public:
  // *executor must outlive every job (the daemon joins the pool before destroying the registry).
  // `worker_threads` is only reported (Status). io stages run on *io_executor (nullptr: *executor),
  // which must outlive every job too.
  JobRegistry(const config::DaemonConfig& config, pipeline::Executor* executor, int worker_threads = 0,
              pipeline::Executor* io_executor = nullptr);
  ~JobRegistry() override;

  SubmitResult Submit(const proto::SubmitJob& request, const PeerInfo& peer, std::function<void()> notify) override;
  // Prepare's task parses the config, opens the source (the scan, list or tar index), fingerprints
  // it and checks a resume token, with the daemon config as it was at Prepare; Start checks
  // max_slots_per_job and the device, joins a share group or admits against the budget, and starts.
  PrepareTask Prepare(const proto::SubmitJob& request, const PeerInfo& peer) override;
  SubmitResult Start(std::shared_ptr<PreparedJob> prepared, std::function<void()> notify) override;
  proto::DaemonStatus Status(const PeerInfo& peer) override;
  spdl::Status Cancel(uint64_t job_id, const PeerInfo& peer) override;
  streams::StreamRegistry* streams() override { return streams_.get(); }
  bool ChargeProducerBuffer(uint64_t bytes) override { return budget_->TryChargeStreams(bytes); }
  void ReleaseProducerBuffer(uint64_t bytes) override { budget_->ReleaseStreams(bytes); }

  // Config reload (SIGHUP): the limits (memory_budget_bytes, max_jobs_per_client,
  // max_slots_per_job, allowed_roots, allowed_url_prefixes) that jobs submitted from now on are
  // admitted against; running jobs keep what they hold, even above a lowered budget.
  // `worker_threads` is the resized pool's size, for Status. Control thread only.
  void UpdateLimits(const config::DaemonConfig& config, int worker_threads);

  // GPU delivery: the backend of CUDA device N (made lazily, owned by the caller, alive as long as
  // the registry); an error says why there is none. Called from Prepare tasks (any thread: making
  // a CUDA context is slow, so it happens there, off the control thread), so it must be thread-safe. Unset (a daemon
  // built without CUDA): output.device cuda:N jobs with copy: daemon are refused with a clear message. Before the first
  // Submit.
  using DeviceBackendFn = DevicePlacement::BackendFn;
  void SetDeviceBackends(DeviceBackendFn fn) { placement_->SetBackends(std::move(fn)); }
  // GPU delivery: the daemon's ordinal of the device with a UUID (the trainer's GPU, from
  // SubmitJob.device_uuid); an error when the daemon does not see it. Before the first Submit;
  // called from Prepare tasks (any thread).
  using DeviceFinderFn = DevicePlacement::FinderFn;
  void SetDeviceFinder(DeviceFinderFn fn) { placement_->SetFinder(std::move(fn)); }
  // GPU JPEG decode (decode.device: cuda): the decode parts (nvJPEG, the resize kernels) of the
  // daemon's device N, made when a job first needs them (off the control thread). Unset: such jobs
  // are refused, saying this spdld has no GPU decode. Thread-safe. Before the first Submit.
  void SetGpuDecodeParts(GpuDecodePartsFn fn) { gpu_decode_parts_ = std::move(fn); }
  // GPU delivery's bounds (jobs/gpu_delivery.h GpuDeliveryOptions; defaults 60 s and 10 s): how
  // long a batch waits for the trainer's consumer-done event before its job fails, and how long a
  // teardown waits for queued copies before it leaks the device memory. Before the first Submit.
  void SetGpuTimeouts(std::chrono::milliseconds consumer, std::chrono::milliseconds drain) {
    gpu_consumer_timeout_ = consumer;
    gpu_drain_timeout_ = drain;
  }
  // Device bytes held by live copy: daemon jobs on CUDA device N.
  uint64_t device_bytes_in_use(int device) const { return admission_.device_bytes_in_use(device); }
  // Device bytes on CUDA device N that GPU jobs could not free (their copies never drained): still
  // counted in device_bytes_in_use (not returned to the budget) and shown by Status / metrics.
  uint64_t leaked_device_bytes(int device) const { return admission_.leaked_device_bytes(device); }

  // The CUDA devices copy: daemon jobs have used (the daemon's ordinals), each with its sticky error
  // (empty: healthy) and the jobs whose device side is still held on it. Any thread.
  struct GpuDeviceState {
    int device = 0;
    std::string poisoned;  // the sticky error that poisoned this process's context; empty if none
    uint32_t jobs = 0;     // copy: daemon jobs whose device memory is not yet released
  };
  std::vector<GpuDeviceState> GpuDevices() const;

  // The cache of source indexes every source this registry opens shares (the Daemon owns one per
  // process; Prepare tasks hold a reference, so it outlives them). Unset: every open scans. Before
  // the first Submit.
  void SetSourceIndexCache(std::shared_ptr<io::SourceIndexCache> cache) { index_cache_ = std::move(cache); }
  // Start's steps after which it can fail: the device placed, the budgets reserved, the job
  // started, the job wrapped for GPU delivery (GPU jobs only).
  enum class StartStep { kPlaced, kAdmitted, kJobStarted, kGpuWrapped };
#if SPDL_TEST_HOOKS
  // A test seam: Start calls `fn` after each of its steps that can fail; a non-OK answer fails the
  // start there (as that step failing would), so tests prove every step's rollback. Before the
  // first Submit.
  using StartFaultFn = std::function<spdl::Status(StartStep)>;
  void SetStartFaultForTests(StartFaultFn fn) { start_fault_ = std::move(fn); }
  // A test seam: for each prepared job, `fn` returns the MediaJobSpec::stage_hook it runs with
  // (empty: none). Before the first Submit.
  using StageHookFn = std::function<std::function<void(uint32_t, uint64_t)>(const proto::SubmitJob&)>;
  void SetStageHookForTests(StageHookFn fn) { stage_hooks_ = std::move(fn); }
  // A test seam: `hook` runs at the start of every Prepare task with its request (on the thread
  // that runs it), e.g. to hold a source while it is being opened and watch the daemon meanwhile.
  // Before the first Submit.
  using PrepareHook = std::function<void(const proto::SubmitJob&)>;
  void SetPrepareHookForTests(PrepareHook hook) { prepare_hook_ = std::move(hook); }
#endif

  // Runs `fn` on the control thread after `delay` (the daemon's timers): share groups wake their
  // members when share_wait_seconds is over. Unset (unit tests): the members look again only when
  // their job notifies them. Before the first Submit.
  using ScheduleFn = std::function<void(std::chrono::steady_clock::duration delay, std::function<void()> fn)>;
  void SetScheduler(ScheduleFn fn) { schedule_ = std::move(fn); }

  // Shared-memory bytes held by live jobs.
  uint64_t bytes_in_use() const;
  // Jobs alive (including ones whose last tasks are still finishing).
  int live_jobs() const;

 private:
  // Wraps `job` for its session (cache stats) and records it for Status / Cancel.
  SubmitResult Finish(const proto::SubmitJob& req, const PeerInfo& peer, const std::string& description,
                      uint64_t region_bytes, std::shared_ptr<JobHandle> job,
                      std::shared_ptr<const io::CachedSource> cached,
                      std::shared_ptr<const DecodedCacheSource> decoded);
  // The test seam's answer at `step` (OK without test hooks).
  spdl::Status Fault(StartStep step) const;
  // The control thread's last step of a copy: daemon job whose GPU side was set up by its
  // continuation (jobs/job_registry.cc GpuStarted); signals `notify` once it is answered.
  SubmitResult FinishGpuStart(PreparedJob* started, const std::function<void()>& notify);

  // Written by UpdateLimits and read by Submit/Status, all on the control thread.
  config::DaemonConfig config_;
  // Constant after construction.
  pipeline::Executor* const executor_;
  pipeline::Executor* const io_executor_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  int worker_threads_;  // control thread only (UpdateLimits)
  std::chrono::milliseconds gpu_consumer_timeout_{60000};
  GpuDecodePartsFn gpu_decode_parts_;  // set before the first Submit
  std::chrono::milliseconds gpu_drain_timeout_{10000};
  std::shared_ptr<io::SourceIndexCache> index_cache_;  // set before the first Submit; may be null
#if SPDL_TEST_HOOKS
  StageHookFn stage_hooks_;   // set before the first Submit
  StartFaultFn start_fault_;  // set before the first Submit
  PrepareHook prepare_hook_;  // set before the first Submit
#endif
  ScheduleFn schedule_;  // set before the first Submit

  const std::shared_ptr<io::SampleCache> cache_;       // nullptr when cache_bytes is 0
  const std::shared_ptr<io::ShardCache> shard_cache_;  // nullptr when cache_dir is ""; thread-safe
  // User ops from plugin_dirs (as at construction: a change takes a restart); shared with the
  // Prepare tasks, which make each job's ops. Thread-safe.
  const std::shared_ptr<plugins::OpLoader> op_loader_;
  // memory_budget_bytes as one account of job slots (admission_, mirrored) and decode scratch.
  const std::shared_ptr<MemoryBudget> budget_;
  // The streams (issue 21), their retained bytes charged to budget_ (through stream_account_).
  // Shared with Prepare tasks, which define and open streams.
  std::unique_ptr<streams::MemoryAccount> stream_account_;
  std::shared_ptr<streams::StreamRegistry> streams_;
  // source.type: watch: the folders watched, each feeding a stream of streams_ (jobs/watch_feeder.h).
  // Shared with Prepare tasks, which attach to them; stopped before the streams close.
  std::shared_ptr<WatchHub> watches_;

  // The budgets (thread-safe; leases are returned from whichever thread destroys a job).
  Admission admission_;
  // GPU placement; shared with the Prepare tasks (thread-safe).
  const std::shared_ptr<DevicePlacement> placement_ = std::make_shared<DevicePlacement>();
  // copy: daemon jobs whose GPU side is set up (by their continuation) and not yet answered, by
  // ticket; the tickets hold it weakly, so a ticket dropped after the registry touches nothing.
  struct PendingStarts;
  const std::shared_ptr<PendingStarts> pending_;

  // Control thread only: live jobs for Status / Cancel (expired entries are dropped lazily).
  std::map<uint64_t, std::shared_ptr<JobRecord>> records_;
  // Control thread only: share groups by their key (each with its job's cached source and, weakly,
  // its decoded-sample cache).
  ShareGroups groups_;

  std::atomic<uint64_t> next_job_id_{1};

  // GPU jobs are torn down here (frees synchronize with the GPU), off the control thread. Declared
  // last: destroyed (finishing what is queued, which returns device budget above) first.
  GpuTeardownQueue gpu_teardown_;
};

}  // namespace spdl::jobs
