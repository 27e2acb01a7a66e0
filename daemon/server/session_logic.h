// SessionLogic: the control protocol of one client session as a pure state machine — frames in,
// messages out — with no sockets, so every rule is tested without I/O (tests/unit/server_test.cc).
//
//   awaiting hello --Hello(version ok)--> idle --SubmitJob(ok)--> running --JobEnd/EndJob--> idle
//   any state --bad frame, garbage, wrong version, protocol violation--> closed
//
// GPU jobs (JobHandle::cuda_handles() non-null: output.device cuda:N, copy: daemon): JobAccepted is
// followed at once by CudaHandles (once per job); the client must answer with CudaConsumerEvents
// (once) before its first Release: a Release before it, a second one, one for a job without GPU
// delivery, or one the job refuses closes the session (BAD_REQUEST). BatchReady is as for any job
// (the device slot has the host slot's index). When a GPU job ends by itself (JobEnd), its device
// side is kept until the session ends or submits again: the client may still read its last
// batches through its IPC mapping, which it closes before its connection.
//
// Draining (DaemonControl::draining): SubmitJob is refused with SHUTTING_DOWN (the session stays
// open); a running job is told once with a Draining message (OnDrain) and runs on until it ends or
// the daemon exits at the deadline. Drain (spdlctl drain) is allowed to root and to the daemon's
// own uid; it starts the drain through DaemonControl::request_drain and is answered with Draining.
//
// Not thread-safe: a session's logic runs on the control thread only.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/log_limiter.h"
#include "jobs/job_service.h"
#include "proto/control.pb.h"

namespace spdl::server {

struct Outgoing {
  proto::DaemonMessage message;
  int pass_fd = -1;  // a descriptor to pass with this message (SCM_RIGHTS); owned by the job
};

struct Output {
  std::vector<Outgoing> messages;
  bool close = false;  // close the session after sending `messages`
};

// The daemon-wide state a session reads and the daemon actions it may start. Owned by the
// ControlServer; control thread only.
struct DaemonControl {
  bool draining = false;
  std::string drain_reason;  // set with draining: "SIGTERM", "spdlctl drain by uid 0"
  uid_t admin_uid = 0;       // besides root, the uid allowed to drain (spdld's own)
  // Starts a drain (or returns the one under way) and returns the notice to answer Drain with.
  // Unset: Drain is refused as unsupported.
  std::function<proto::Draining(const jobs::PeerInfo& by, uint32_t seconds)> request_drain;
  // Rate-limits the sessions' warnings per kind (a client looping on a bad request); null = log all.
  LogLimiter* log_limiter = nullptr;
};

class SessionLogic {
 public:
  // *jobs must outlive this object, and *control too when given (nullptr: never draining, Drain
  // unsupported). `notify` is handed to each job (see JobService::Submit).
  SessionLogic(jobs::JobService* jobs, jobs::PeerInfo peer, std::function<void()> notify,
               DaemonControl* control = nullptr);
  ~SessionLogic();

  // One whole frame's payload from the client.
  Output OnFrame(std::string_view payload);
  // The framing layer saw a frame announcing `length` bytes, over the limit `max`.
  Output OnOversizedFrame(uint32_t length, uint32_t max);
  // The job signalled progress: sends every batch that is ready, in order, and the job's end.
  Output OnJobEvent();
  // The daemon started draining: a running job's client gets `notice` (once); otherwise nothing.
  Output OnDrain(const proto::Draining& notice);
  // The client went away: the job (if any) is cancelled and dropped.
  void OnDisconnect();

  bool has_job() const { return job_ != nullptr; }
  bool closed() const { return state_ == State::kClosed; }

 private:
  enum class State { kAwaitHello, kIdle, kRunning, kClosed };
  Output Fatal(proto::Error::Code code, std::string message);
  // "job N (pid P uid U)" with a job, "session pid P uid U" without: the prefix of every log line.
  std::string Who() const;
  // Whether a line of `kind` may be logged now; `note` gets the suppressed-lines note.
  bool MayLog(const std::string& kind, std::string* note) const;
  void DropJob();

  jobs::JobService* const jobs_;
  const jobs::PeerInfo peer_;
  const std::function<void()> notify_;
  DaemonControl* const control_;
  bool told_draining_ = false;
  bool awaiting_consumer_events_ = false;  // a GPU job was accepted and its CudaConsumerEvents not seen
  State state_ = State::kAwaitHello;
  std::shared_ptr<jobs::JobHandle> job_;
  std::shared_ptr<jobs::JobRecord> record_;
  std::shared_ptr<jobs::JobHandle> ended_gpu_job_;  // a finished GPU job, until the session ends
};

}  // namespace spdl::server
