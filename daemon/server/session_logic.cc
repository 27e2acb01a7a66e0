#include "server/session_logic.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "proto/framing.h"

namespace spdl::server {

std::string EscapeForLog(std::string_view text, size_t max_bytes) {
  std::string out;
  out.reserve(std::min(text.size(), max_bytes) + 16);
  for (size_t i = 0; i < text.size(); ++i) {
    if (out.size() >= max_bytes) {
      out += "... (" + std::to_string(text.size() - i) + " more bytes)";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n' && i + 1 < text.size()) {
      out += " | ";  // one log line per event: a client's text cannot forge the next line
    } else if (c < 0x20 || c == 0x7f) {
      static const char* kHex = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

proto::Error RefusalError(const jobs::SubmitResult& refused) {
  proto::Error e;
  switch (refused.status.code()) {
    case StatusCode::kInvalidArgument:
      e.set_code(proto::Error::INVALID_CONFIG);
      break;
    case StatusCode::kPermissionDenied:
      e.set_code(proto::Error::PERMISSION_DENIED);
      break;
    case StatusCode::kNotFound:
      e.set_code(proto::Error::NOT_FOUND);
      break;
    case StatusCode::kResourceExhausted:
    case StatusCode::kUnavailable:
      e.set_code(proto::Error::RESOURCE_EXHAUSTED);
      break;
    // A bad dataset (a corrupt tar shard, a changed file) is the request's problem, not spdld's.
    case StatusCode::kDataLoss:
    case StatusCode::kFailedPrecondition:
      e.set_code(proto::Error::BAD_REQUEST);
      break;
    default:
      e.set_code(proto::Error::INTERNAL);
      break;
  }
  e.set_message(refused.status.ok() ? std::string("the job was refused without a reason (a bug)")
                                    : refused.status.message());
  for (const config::ConfigError& c : refused.config_errors) {
    auto* ce = e.add_config_errors();
    ce->set_line(static_cast<uint32_t>(c.line));
    ce->set_column(static_cast<uint32_t>(c.column));
    ce->set_path(c.path);
    ce->set_message(c.message);
  }
  return e;
}

SessionLogic::SessionLogic(jobs::JobService* jobs, jobs::PeerInfo peer, std::function<void()> notify,
                           DaemonControl* control)
    : jobs_(jobs), peer_(peer), notify_(std::move(notify)), control_(control) {}

SessionLogic::~SessionLogic() { DropJob(); }

void SessionLogic::DropJob() {
  awaiting_consumer_events_ = false;
  if (job_) {
    job_->Cancel();
    RetireJob();
  }
  record_.reset();
}

void SessionLogic::RetireJob() {
  // A GPU job's device side (memory, ready events) lives on until the client says it has closed its
  // mapping, or the session ends: on every path (EndJob, JobEnd, failure, cancel).
  if (job_->cuda_handles()) {
    job_->Cancel();  // stops its copies and closes the client's consumer-done events (also after JobEnd)
    if (!mapping_closed_) retired_gpu_jobs_.push_back(std::move(job_));
  }
  job_.reset();
  mapping_closed_ = false;
}

std::string SessionLogic::Who() const {
  if (job_) return fmt::format("job {} (pid {} uid {})", job_->accepted().job_id(), peer_.pid, peer_.uid);
  return fmt::format("session pid {} uid {}", peer_.pid, peer_.uid);
}

bool SessionLogic::MayLog(const std::string& kind, std::string* note) const {
  uint64_t dropped = 0;
  if (control_ && control_->log_limiter && !control_->log_limiter->Allow(kind, &dropped)) return false;
  *note = LogLimiter::Note(dropped);
  return true;
}

Output SessionLogic::Fatal(proto::Error::Code code, std::string message) {
  std::string note;
  if (MayLog("session closed: " + proto::Error::Code_Name(code), &note)) {
    spdlog::warn("{}: closing the session: {}{}", Who(), EscapeForLog(message), note);
  }
  Output out;
  auto* e = out.messages.emplace_back().message.mutable_error();
  e->set_code(code);
  e->set_message(std::move(message));
  out.close = true;
  DropJob();
  state_ = State::kClosed;
  return out;
}

Output SessionLogic::OnOversizedFrame(uint32_t length, uint32_t max) {
  return Fatal(proto::Error::BAD_REQUEST, "a control message of " + std::to_string(length) +
                                              " bytes exceeds the daemon's max_frame_bytes of " + std::to_string(max) + " bytes");
}

Output SessionLogic::OnFrame(std::string_view payload) {
  if (state_ == State::kClosed) return {};
  proto::ClientMessage msg;
  if (!proto::ParseClientMessage(payload, &msg)) {
    return Fatal(proto::Error::BAD_REQUEST, "not a valid spdld control message (" + std::to_string(payload.size()) + " bytes)");
  }
  if (state_ == State::kAwaitHello) {
    if (!msg.has_hello()) return Fatal(proto::Error::BAD_REQUEST, "the first message must be Hello");
    if (msg.hello().protocol_version() != proto::kProtocolVersion) {
      return Fatal(proto::Error::VERSION_MISMATCH,
                   "the client speaks control protocol version " + std::to_string(msg.hello().protocol_version()) +
                       " but this spdld speaks version " + std::to_string(proto::kProtocolVersion) +
                       "; use a client library of the same spdld release");
    }
    Output out;
    auto* h = out.messages.emplace_back().message.mutable_hello();
    h->set_protocol_version(proto::kProtocolVersion);
    h->set_daemon_version(SPDLD_VERSION);
    state_ = State::kIdle;
    return out;
  }
  switch (msg.msg_case()) {
    case proto::ClientMessage::kHello:
      return Fatal(proto::Error::BAD_REQUEST, "Hello sent twice");
    case proto::ClientMessage::kSubmit: {
      if (state_ == State::kRunning || state_ == State::kSubmitting) {
        return Fatal(proto::Error::BAD_REQUEST, "a session runs one job at a time");
      }
      if (control_ && control_->draining) return DrainingRefusal();  // the session stays open
      jobs::PrepareTask task = jobs_->Prepare(msg.submit(), peer_);
      if (!control_ || !control_->async_submit) return StartPrepared(task());
      Output out;
      state_ = State::kSubmitting;
      out.prepare = PendingSubmit{++submit_seq_, std::move(task)};
      return out;
    }
    case proto::ClientMessage::kRelease: {
      if (state_ == State::kSubmitting) return Fatal(proto::Error::BAD_REQUEST, "Release before JobAccepted");
      if (state_ != State::kRunning) {
        if (!had_job_) return Fatal(proto::Error::BAD_REQUEST, "Release without a job (no job was accepted)");
        return {};  // late releases after the job ended are harmless
      }
      if (awaiting_consumer_events_) {
        return Fatal(proto::Error::BAD_REQUEST, "Release before CudaConsumerEvents in a GPU job");
      }
      if (record_) record_->RecordClientWait(msg.release().client_wait_seconds());
      Status s = job_->Release(msg.release().slot(), msg.release().generation());
      if (!s.ok()) return Fatal(proto::Error::BAD_REQUEST, "bad Release: " + s.message());
      return {};
    }
    case proto::ClientMessage::kEndJob: {
      // Answered with the job's figures so far, so the client knows the job is over.
      Output out;
      if (state_ == State::kSubmitting) {  // abandon it: the result, when it comes, is dropped
        ++submit_seq_;
        state_ = State::kIdle;
        return out;
      }
      if (state_ != State::kRunning) return out;
      *out.messages.emplace_back().message.mutable_job_end()->mutable_stats() = job_->Stats();
      DropJob();
      state_ = State::kIdle;
      return out;
    }
    case proto::ClientMessage::kStatus: {
      Output out;
      *out.messages.emplace_back().message.mutable_status() = jobs_->Status(peer_);
      return out;
    }
    case proto::ClientMessage::kCancel: {
      Output out;
      Status s = jobs_->Cancel(msg.cancel().job_id(), peer_);
      auto& m = out.messages.emplace_back().message;
      if (s.ok()) {
        m.mutable_cancelled()->set_job_id(msg.cancel().job_id());
      } else {
        m.mutable_error()->set_code(proto::Error::NOT_FOUND);
        m.mutable_error()->set_message(s.message());
      }
      return out;
    }
    case proto::ClientMessage::kDrain: {
      Output out;
      auto& m = out.messages.emplace_back().message;
      if (!control_ || !control_->request_drain) {
        m.mutable_error()->set_code(proto::Error::BAD_REQUEST);
        m.mutable_error()->set_message("this spdld cannot drain on request");
      } else if (peer_.uid != 0 && peer_.uid != control_->admin_uid) {
        m.mutable_error()->set_code(proto::Error::PERMISSION_DENIED);
        m.mutable_error()->set_message("only root or uid " + std::to_string(control_->admin_uid) +
                                       " (spdld's user) may drain spdld; you are uid " + std::to_string(peer_.uid));
      } else {
        *m.mutable_draining() = control_->request_drain(peer_, msg.drain().seconds());
      }
      return out;
    }
    case proto::ClientMessage::kCudaConsumerEvents: {
      if (state_ == State::kSubmitting) {
        return Fatal(proto::Error::BAD_REQUEST, "CudaConsumerEvents before JobAccepted");
      }
      if (state_ != State::kRunning) return {};  // the job ended first: nothing to wire
      if (!awaiting_consumer_events_) {
        return Fatal(proto::Error::BAD_REQUEST, job_->cuda_handles() ? "CudaConsumerEvents sent twice"
                                                                       : "CudaConsumerEvents for a job that is not a GPU "
                                                                         "job (output.device cpu or copy: client)");
      }
      Status s = job_->ImportConsumerEvents(msg.cuda_consumer_events());
      if (!s.ok()) return Fatal(proto::Error::BAD_REQUEST, "bad CudaConsumerEvents: " + s.message());
      awaiting_consumer_events_ = false;
      return {};
    }
    case proto::ClientMessage::kCudaMappingClosed: {
      // In any state: it may name an earlier job of the session while the next one is submitted.
      const uint64_t id = msg.cuda_mapping_closed().job_id();
      if (job_ && job_->accepted().job_id() == id) mapping_closed_ = true;
      // The device side goes now (its frees run on the GPU teardown thread, not here).
      std::erase_if(retired_gpu_jobs_, [id](const auto& j) { return j->accepted().job_id() == id; });
      return {};
    }
    case proto::ClientMessage::MSG_NOT_SET:
      break;
  }
  return Fatal(proto::Error::BAD_REQUEST, "unknown control message");
}

Output SessionLogic::DrainingRefusal() {
  Output out;
  auto* e = out.messages.emplace_back().message.mutable_error();
  e->set_code(proto::Error::SHUTTING_DOWN);
  e->set_message("spdld is draining (" + control_->drain_reason +
                 "): it takes no new jobs and exits when the running ones end; submit again once it "
                 "has restarted");
  if (std::string note; MayLog("job refused: draining", &note)) {
    spdlog::info("{}: job refused: draining{}", Who(), note);
  }
  return out;
}

Output SessionLogic::OnSubmitPrepared(uint64_t seq, std::shared_ptr<jobs::PreparedJob> prepared) {
  if (state_ != State::kSubmitting || seq != submit_seq_) return {};  // stale: dropped, nothing started
  state_ = State::kIdle;
  // Draining began while the source was opened: refuse as a Submit would have been.
  if (control_ && control_->draining) return DrainingRefusal();
  if (prepared == nullptr) {  // the preparation threw (ControlServer logged it)
    Output out;
    auto* e = out.messages.emplace_back().message.mutable_error();
    e->set_code(proto::Error::INTERNAL);
    e->set_message("opening the job failed with an internal error (the daemon's log has it)");
    return out;
  }
  return StartPrepared(std::move(prepared));
}

Output SessionLogic::StartPrepared(std::shared_ptr<jobs::PreparedJob> prepared) {
  jobs::SubmitResult r = jobs_->Start(std::move(prepared), notify_);
  if (r.continuation) {
    // The start's slow rest (a GPU job's pinning and device memory) runs off the control thread,
    // like the preparation; its result comes back to OnSubmitPrepared, which starts it.
    if (!control_ || !control_->async_submit) return StartPrepared(r.continuation());
    Output out;
    state_ = State::kSubmitting;
    out.prepare = PendingSubmit{++submit_seq_, std::move(r.continuation)};
    return out;
  }
  Output out;
  if (!r.ok()) {
    proto::Error error = RefusalError(r);
    if (std::string note; MayLog("job refused: " + proto::Error::Code_Name(error.code()), &note)) {
      spdlog::info("{}: job refused: {}{}", Who(), EscapeForLog(error.message()), note);
    }
    *out.messages.emplace_back().message.mutable_error() = std::move(error);
    return out;  // the client may fix its config and submit again
  }
  job_ = std::move(r.job);
  record_ = std::move(r.record);
  state_ = State::kRunning;
  had_job_ = true;
  Outgoing& o = out.messages.emplace_back();
  *o.message.mutable_accepted() = job_->accepted();
  o.pass_fd = job_->region_fd();
  if (const proto::CudaHandles* h = job_->cuda_handles()) {
    *out.messages.emplace_back().message.mutable_cuda_handles() = *h;
    awaiting_consumer_events_ = true;
  }
  return out;
}

Output SessionLogic::OnJobEvent() {
  Output out;
  if (state_ != State::kRunning || !job_) return out;
  while (auto d = job_->TakeNext()) {
    if (d->batch.rows() == 0) {
      // Every sample of the batch failed and no spare was left: the client never gets an empty
      // batch; the slot goes straight back (the epoch's and the job's ends still go out). Not
      // into a job this delivery ends: an ended job takes no more releases.
      if (!d->job_end) (void)job_->Release(d->batch.slot(), d->batch.generation());
    } else {
      *out.messages.emplace_back().message.mutable_batch() = std::move(d->batch);
    }
    if (d->epoch_end) *out.messages.emplace_back().message.mutable_epoch_end() = std::move(*d->epoch_end);
    if (d->job_end) {
      if (record_) d->job_end->mutable_stats()->set_client_wait_seconds(record_->client_wait_seconds.load());
      *out.messages.emplace_back().message.mutable_job_end() = std::move(*d->job_end);
      // The client keeps its mapping; its late Releases are ignored. A GPU job's device slots stay
      // too (the client may still read the last batches through its IPC mapping, which it closes
      // before its connection): kept until the session ends or submits again.
      RetireJob();
      record_.reset();
      awaiting_consumer_events_ = false;
      state_ = State::kIdle;
      return out;
    }
  }
  if (Status f = job_->failure(); !f.ok()) {
    auto* e = out.messages.emplace_back().message.mutable_error();
    e->set_code(proto::Error::JOB_FAILED);
    e->set_message("job failed: " + f.message());
    if (std::string note; MayLog("job failed", &note))
      spdlog::warn("{}: {}{}", Who(), EscapeForLog(e->message()), note);
    DropJob();
    state_ = State::kIdle;
  }
  return out;
}

Output SessionLogic::OnDrain(const proto::Draining& notice) {
  Output out;
  if (state_ != State::kRunning || told_draining_) return out;
  told_draining_ = true;
  *out.messages.emplace_back().message.mutable_draining() = notice;
  return out;
}

void SessionLogic::OnDisconnect() {
  DropJob();
  retired_gpu_jobs_.clear();  // the session ended: the client's mappings went with its process or it closed them
  state_ = State::kClosed;
}

}  // namespace spdl::server
