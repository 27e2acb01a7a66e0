// The jobs layer as the control server sees it: submit a job, then drive it. Interfaces only, so
// the server's session logic can be tested with a fake job and no threads or files.
//
// Threading: every method is called from the control (io) thread, except that `notify` (given at
// Submit) is called by the job from worker threads (it must only schedule work on the io thread),
// and that the task Prepare returns runs on any thread.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "config/config_error.h"
#include "pipeline/stage_stats.h"
#include "proto/control.pb.h"
#include "streams/stream.h"

namespace spdl::jobs {

// Who is on the other end of a session (from SO_PEERCRED).
struct PeerInfo {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// What the session sends after taking one ready slot: the batch, then possibly the end of its
// epoch, then possibly the end of the job.
struct Delivery {
  proto::BatchReady batch;
  std::optional<proto::EpochEnd> epoch_end;
  std::optional<proto::JobEnd> job_end;
};

class JobHandle {
 public:
  virtual ~JobHandle() = default;
  // The answer to SubmitJob (layout, counts). Constant.
  virtual const proto::JobAccepted& accepted() const = 0;
  // The descriptor of the job's shared region, to pass to the client. Owned by the job.
  virtual int region_fd() const = 0;
  // The next ready batch in sampler order, if it is ready; leases its slot to the client.
  virtual std::optional<Delivery> TakeNext() = 0;
  // The client is done with `slot`; frees it and lets the pipeline fill it again.
  virtual Status Release(uint32_t slot, uint64_t generation) = 0;
  // Non-OK once the job has failed (on_error: fail): the message names the sample and the reason.
  virtual Status failure() const = 0;
  // Stops the job: no more batches; in-flight work is dropped. Idempotent.
  virtual void Cancel() = 0;
  // The job's figures so far.
  virtual proto::JobStats Stats() const = 0;
  // Stops the job as failed with `reason` (e.g. cancelled by an operator): the owning session
  // reports it to its client like any failure. Idempotent; the first reason wins.
  virtual void Abort(Status reason) = 0;

  // GPU delivery (output.device cuda:N, copy: daemon; jobs/gpu_delivery.h). A job without it keeps
  // these defaults. The device handles to send once right after JobAccepted; null = none.
  virtual const proto::CudaHandles* cuda_handles() const { return nullptr; }
  // The client's per-slot consumer-done events (once, before its first Release).
  virtual Status ImportConsumerEvents(const proto::CudaConsumerEvents& /*events*/) {
    return FailedPrecondition("CudaConsumerEvents for a job without GPU delivery");
  }
};

// Facts about a live job, shared by the registry (for spdlctl) and the session that owns it.
// The atomic is written by the session and read by the registry, both on the control thread
// today; it is atomic so that need not stay true.
struct JobRecord {
  uint64_t job_id = 0;
  PeerInfo owner;
  std::string source;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  uint32_t epochs = 1;
  uint64_t region_bytes = 0;
  std::atomic<double> client_wait_seconds{0};  // as last reported by the client
  // Per Release, the growth of client_wait_seconds since the previous one, in
  // pipeline::StageStats::Bucket buckets (RecordClientWait).
  std::array<std::atomic<uint64_t>, pipeline::kHistogramBuckets> client_wait_histogram{};

  // Stores the client's reported total wait and counts its growth since the last report.
  void RecordClientWait(double total_seconds) {
    const double before = client_wait_seconds.exchange(total_seconds);
    const double grew = total_seconds > before ? total_seconds - before : 0.0;
    // The client's figure is untrusted: clamp before the conversion (NaN and huge values are UB).
    const double ns = grew * 1e9;
    const uint64_t grew_ns = ns >= 1.8e19 ? UINT64_MAX : (ns > 0 ? static_cast<uint64_t>(ns) : 0);
    const int b = pipeline::StageStats::Bucket(grew_ns);
    client_wait_histogram[static_cast<size_t>(b)].fetch_add(1, std::memory_order_relaxed);
  }
  std::weak_ptr<JobHandle> job;
};

class PreparedJob;

// The answer to a submit: the job, or why not as a Status (the server turns it into the wire's
// Error: kInvalidArgument is an invalid config, kFailedPrecondition and kDataLoss a bad request,
// kResourceExhausted and kUnavailable a limit, kPermissionDenied and kNotFound as named, else
// internal). An invalid config also lists every problem found, with its line.
struct SubmitResult {
  std::shared_ptr<JobHandle> job;                  // set on success
  std::shared_ptr<JobRecord> record;               // set on success
  spdl::Status status;                             // not OK on failure
  std::vector<config::ConfigError> config_errors;  // kInvalidArgument from the config: each problem
  // Set (job null, status OK) when the start is not done yet: its slow rest (a GPU job's device
  // memory, host pinning and IPC export, which wait on CUDA) must not run on the control thread.
  // Run it once on any thread, then Start what it returns on the control thread. Dropping it, or
  // what it returns, undoes the start.
  std::function<std::shared_ptr<PreparedJob>()> continuation;
  bool ok() const { return job != nullptr; }
  static SubmitResult Refused(spdl::Status why) {
    SubmitResult r;
    r.status = std::move(why);
    return r;
  }
};

// A submitted job whose slow part (config validation, opening its source: a folder scan, a list,
// a tar index) is done, ready to be admitted and started; or the error that part found. Opaque:
// only the JobService that made it reads it.
class PreparedJob {
 public:
  virtual ~PreparedJob() = default;
};

// The slow part of a Submit (see JobService::Prepare): self-contained, run once on any thread.
using PrepareTask = std::function<std::shared_ptr<PreparedJob>()>;

class JobService {
 public:
  virtual ~JobService() = default;
  // Validates and starts a job for `peer`. On failure the Error lists every problem found.
  // The same as Start(Prepare(request, peer)(), notify).
  virtual SubmitResult Submit(const proto::SubmitJob& request, const PeerInfo& peer, std::function<void()> notify) = 0;

  // Submit in two steps, so that opening a large source does not hold up the control thread:
  // Prepare (control thread) snapshots what the job needs and returns a task; the task may run on
  // any thread, touches no state of the service and may outlive it; Start (control thread) admits
  // the prepared job against the limits as they are then and starts it, or returns a continuation
  // (SubmitResult::continuation) to run like a Prepare task and Start again. A prepared job that is
  // never started is simply dropped. The defaults (for services without a slow part, e.g. test
  // fakes) defer everything to Submit.
  virtual PrepareTask Prepare(const proto::SubmitJob& request, const PeerInfo& peer);
  virtual SubmitResult Start(std::shared_ptr<PreparedJob> prepared, std::function<void()> notify);
  // The daemon's state and the live jobs `peer` may see: its own, or every job for root.
  virtual proto::DaemonStatus Status(const PeerInfo& peer) = 0;
  // Aborts job `job_id` on behalf of `peer`. kNotFound when there is no such live job or it belongs
  // to another uid (another user's jobs are not even confirmed to exist), unless peer is root.
  virtual spdl::Status Cancel(uint64_t job_id, const PeerInfo& peer) = 0;
  // The daemon's streams (issue 21), for producer sessions; nullptr: this service has none.
  virtual streams::StreamRegistry* streams() { return nullptr; }
  // The put buffer of a producer (its shared region's bytes) is charged here; false when the
  // memory budget has no room. Default: no budget (always true).
  virtual bool ChargeProducerBuffer(uint64_t /*bytes*/) { return true; }
  virtual void ReleaseProducerBuffer(uint64_t /*bytes*/) {}
};

namespace internal {
// The defaults' prepared job: the request, as it came.
struct DeferredSubmit final : PreparedJob {
  proto::SubmitJob request;
  PeerInfo peer;
};
}  // namespace internal

inline PrepareTask JobService::Prepare(const proto::SubmitJob& request, const PeerInfo& peer) {
  auto d = std::make_shared<internal::DeferredSubmit>();
  d->request = request;
  d->peer = peer;
  return [d] { return std::shared_ptr<PreparedJob>(d); };
}

inline SubmitResult JobService::Start(std::shared_ptr<PreparedJob> prepared, std::function<void()> notify) {
  const auto d = std::dynamic_pointer_cast<internal::DeferredSubmit>(std::move(prepared));
  if (d == nullptr) return SubmitResult::Refused(Internal("a prepared job of another job service"));
  return Submit(d->request, d->peer, std::move(notify));
}

}  // namespace spdl::jobs
