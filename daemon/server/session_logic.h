// SessionLogic: the control protocol of one client session as a pure state machine — frames in,
// messages out — with no sockets, so every rule is tested without I/O (tests/unit/server_test.cc).
//
//   awaiting hello --Hello(version ok)--> idle --SubmitJob--> submitting --(prepared, ok)--> running
//   running --JobEnd/EndJob--> idle;  submitting --(prepared, refused)/EndJob--> idle
//   any state --bad frame, garbage, wrong version, protocol violation--> closed
//
// Submit in two steps (DaemonControl::async_submit): the slow part (config, opening the source) is
// handed to the server as Output::prepare, which runs it off the control thread and returns its
// result with OnSubmitPrepared; meanwhile the session answers Status/Cancel/Drain, while a second
// SubmitJob, a Release or a CudaConsumerEvents (nothing was accepted yet) close it. EndJob abandons
// the pending submit (its result is dropped, nothing is started). A disconnect drops it too. The
// limits (budget, max jobs, share groups) and draining are checked when the result comes back.
// A start may hand back a continuation (jobs::SubmitResult::continuation: a GPU job's pinning and
// device memory, which wait on CUDA): it goes out as Output::prepare too, and the session stays
// submitting until its result comes back and is started. Without async_submit these tasks run
// inline in OnFrame (unit tests, tools).
//
// A Release in a session that never had a job accepted is a protocol violation (closes it); after
// a job ended, late Releases are ignored.
//
// GPU jobs (JobHandle::cuda_handles() non-null: output.device cuda:N, copy: daemon): JobAccepted is
// followed at once by CudaHandles (once per job); the client must answer with CudaConsumerEvents
// (once) before its first Release: a Release before it, a second one, one for a job without GPU
// delivery, or one the job refuses closes the session (BAD_REQUEST). BatchReady is as for any job
// (the device slot has the host slot's index). However a GPU job ends — JobEnd, EndJob, a failure,
// a cancel (spdlctl), a protocol error — its device side (device memory, ready events) is kept until
// the client sends CudaMappingClosed for it or the session ends: the trainer may still read its
// batches through its IPC mapping, and freeing exported memory or destroying an exported event
// while an importer has it open is undefined in CUDA. (The frees then run on the GPU teardown
// thread: jobs/gpu_delivery.h.)
//
// Draining (DaemonControl::draining): SubmitJob is refused with SHUTTING_DOWN (the session stays
// open); a running job is told once with a Draining message (OnDrain) and runs on until it ends or
// the daemon exits at the deadline. Drain (spdlctl drain) is allowed to root and to the daemon's
// own uid; it starts the drain through DaemonControl::request_drain and is answered with Draining.
//
// Producers (streams, issue 21): in the idle state OpenProducer makes the session a producer of the
// named stream (defining it, owned by the peer's uid, when it does not exist; else the peer needs
// access): ProducerOpened passes a put buffer (a memfd of buffer_bytes, charged to the memory
// budget). Each PutSample's bytes (at the start of the buffer, or inline) are copied into the
// stream at once; PutDone answers it with the offset. A blocking put into a full stream waits in the
// session (in order, later puts behind it; at most kMaxQueuedPuts / kMaxQueuedPutBytes, more closes
// the session) and is retried when the stream has room (Stream::NotifyOnRoom -> notify ->
// OnJobEvent): the control thread never blocks. CloseProducer (optionally ending the stream) is
// answered with ProducerClosed once the queued puts are done. A disconnect drops the queued puts
// (they were never acknowledged) and never ends the stream.
//
// Not thread-safe: a session's logic runs on the control thread only.
#pragma once

#include <sys/types.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/log_limiter.h"
#include "jobs/job_service.h"
#include "proto/control.pb.h"
#include "shm/shared_region.h"
#include "streams/stream.h"

namespace spdl::server {

struct Outgoing {
  proto::DaemonMessage message;
  int pass_fd = -1;  // a descriptor to pass with this message (SCM_RIGHTS); owned by the job
};

// The slow part of a SubmitJob, for the server to run off the control thread (any thread, once),
// then to hand its result to OnSubmitPrepared(seq, result) on the control thread.
struct PendingSubmit {
  uint64_t seq = 0;
  jobs::PrepareTask task;
};

// `text` made safe for one log line: a newline becomes " | ", other control characters (ESC of
// ANSI sequences, CR, NUL) "\xNN", and it is cut at `max_bytes`. Config names, paths and errors
// that carry a client's text go through it before they reach the log.
std::string EscapeForLog(std::string_view text, size_t max_bytes = 4096);

// The wire's Error for a refused submit (jobs::SubmitResult's Status and config problems): the
// error code by the Status code (kInvalidArgument: INVALID_CONFIG; kFailedPrecondition, kDataLoss:
// BAD_REQUEST; kResourceExhausted, kUnavailable: RESOURCE_EXHAUSTED; kPermissionDenied,
// kNotFound: the same; else INTERNAL), the message whole, every config problem with its line.
proto::Error RefusalError(const jobs::SubmitResult& refused);

struct Output {
  std::vector<Outgoing> messages;
  bool close = false;                    // close the session after sending `messages`
  std::optional<PendingSubmit> prepare;  // set only with DaemonControl::async_submit
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
  // SubmitJob's slow part is returned as Output::prepare instead of running in OnFrame.
  bool async_submit = false;
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
  // The result of Output::prepare number `seq`: starts the job (JobAccepted) or sends the error.
  // A stale one (the session ended, EndJob, or closed meanwhile) is dropped: nothing is started.
  // A null `prepared` (the preparation threw) is answered with an INTERNAL error.
  Output OnSubmitPrepared(uint64_t seq, std::shared_ptr<jobs::PreparedJob> prepared);
  // The job signalled progress: sends every batch that is ready, in order, and the job's end.
  Output OnJobEvent();
  // The daemon started draining: a running job's client gets `notice` (once); otherwise nothing.
  Output OnDrain(const proto::Draining& notice);
  // The client went away: the job (if any) is cancelled and dropped.
  void OnDisconnect();

  bool has_job() const { return job_ != nullptr; }
  bool hello_done() const { return state_ != State::kAwaitHello; }
  bool submitting() const { return state_ == State::kSubmitting; }
  bool closed() const { return state_ == State::kClosed; }

 private:
  enum class State { kAwaitHello, kIdle, kSubmitting, kRunning, kProducing, kClosed };
  static constexpr size_t kMaxQueuedPuts = 256;
  static constexpr uint64_t kMaxQueuedPutBytes = uint64_t{256} << 20;
  struct QueuedPut {
    std::vector<uint8_t> data;
    int64_t label = -1;
    std::string metadata;
    std::string key;
    bool block = true;
  };
  Output OpenProducer(const proto::OpenProducer& m);
  Output PutSample(const proto::PutSample& m);
  Output CloseProducer(const proto::CloseProducer& m);
  // Puts queued puts into the stream while it has room; appends their PutDone to *out. Once one
  // does not fit, asks the stream to notify when there is room and stops.
  void DrainPuts(Output* out);
  void DropProducer();
  // Admits and starts a prepared job (control thread): JobAccepted (+ CudaHandles) or the error.
  Output StartPrepared(std::shared_ptr<jobs::PreparedJob> prepared);
  Output DrainingRefusal();
  Output Fatal(proto::Error::Code code, std::string message);
  // "job N (pid P uid U)" with a job, "session pid P uid U" without: the prefix of every log line.
  std::string Who() const;
  // Whether a line of `kind` may be logged now; `note` gets the suppressed-lines note.
  bool MayLog(const std::string& kind, std::string* note) const;
  void DropJob();
  // job_ -> retired_gpu_jobs_ (a GPU job whose client has not closed its mapping) or gone.
  void RetireJob();

  jobs::JobService* const jobs_;
  const jobs::PeerInfo peer_;
  const std::function<void()> notify_;
  DaemonControl* const control_;
  bool told_draining_ = false;
  bool awaiting_consumer_events_ = false;  // a GPU job was accepted and its CudaConsumerEvents not seen
  State state_ = State::kAwaitHello;
  bool had_job_ = false;     // a job was accepted in this session (late Releases are then harmless)
  uint64_t submit_seq_ = 0;  // numbers Output::prepare; a result of another number is stale
  std::shared_ptr<jobs::JobHandle> job_;
  std::shared_ptr<jobs::JobRecord> record_;
  bool mapping_closed_ = false;  // the client sent CudaMappingClosed for job_
  // Ended GPU jobs whose client has not closed its IPC mapping yet: kept until it does (their
  // CudaMappingClosed) or the session ends. Bounded by the device budget they still hold.
  std::vector<std::shared_ptr<jobs::JobHandle>> retired_gpu_jobs_;
  // A producer session's stream, its put buffer (charged to the budget) and the puts waiting for room.
  std::shared_ptr<streams::Stream> producer_stream_;
  shm::SharedRegion put_buffer_;
  uint64_t put_buffer_charged_ = 0;
  std::deque<QueuedPut> queued_puts_;
  uint64_t queued_put_bytes_ = 0;
  bool room_wait_ = false;  // NotifyOnRoom asked, not yet fired
  std::optional<proto::CloseProducer> close_after_puts_;
};

}  // namespace spdl::server
