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

SessionLogic::~SessionLogic() {
  DropJob();
  DropProducer();
}

void SessionLogic::DropProducer() {
  if (producer_stream_) producer_stream_->RemoveProducer();
  producer_stream_.reset();
  put_buffer_ = shm::SharedRegion();
  if (put_buffer_charged_ > 0) jobs_->ReleaseProducerBuffer(put_buffer_charged_);
  put_buffer_charged_ = 0;
  queued_puts_.clear();
  queued_put_bytes_ = 0;
  close_after_puts_.reset();
}

Output SessionLogic::OpenProducer(const proto::OpenProducer& m) {
  streams::StreamRegistry* registry = jobs_->streams();
  Output out;
  auto error = [&](proto::Error::Code code, std::string message) {
    auto* e = out.messages.emplace_back().message.mutable_error();
    e->set_code(code);
    e->set_message(std::move(message));
    return out;
  };
  if (registry == nullptr) return error(proto::Error::BAD_REQUEST, "this spdld has no streams");
  if (control_ && control_->draining) return DrainingRefusal();
  const uint64_t buffer = m.buffer_bytes() == 0 ? uint64_t{16} << 20 : m.buffer_bytes();
  if (buffer > (uint64_t{1} << 30)) {
    return error(proto::Error::BAD_REQUEST,
                 "OpenProducer.buffer_bytes " + std::to_string(buffer) + " is over the limit of 1 GiB");
  }
  streams::StreamConfig def;
  def.name = m.stream();
  if (m.max_samples() > 0) def.max_samples = m.max_samples();
  if (m.max_bytes() > 0) def.max_bytes = m.max_bytes();
  def.allowed_uids.assign(m.allowed_uids().begin(), m.allowed_uids().end());
  auto stream = registry->Define(def, peer_.uid);
  if (!stream.ok()) {
    const proto::Error::Code code = stream.status().code() == StatusCode::kPermissionDenied
                                        ? proto::Error::PERMISSION_DENIED
                                        : proto::Error::BAD_REQUEST;
    return error(code, stream.status().message());
  }
  if (!jobs_->ChargeProducerBuffer(buffer)) {
    return error(proto::Error::RESOURCE_EXHAUSTED, "the producer's put buffer of " + std::to_string(buffer >> 20) +
                                                       " MiB does not fit the daemon's memory budget now");
  }
  auto region = shm::SharedRegion::Create("spdld-producer-" + m.stream(), buffer);
  if (!region.ok()) {
    jobs_->ReleaseProducerBuffer(buffer);
    return error(proto::Error::INTERNAL, "the put buffer: " + region.status().message());
  }
  put_buffer_ = std::move(region).value();
  put_buffer_charged_ = buffer;
  producer_stream_ = std::move(stream).value();
  producer_stream_->AddProducer();
  state_ = State::kProducing;
  spdlog::info("{}: producer of stream '{}' (owner uid {})", Who(), EscapeForLog(producer_stream_->name()),
               producer_stream_->owner_uid());
  Outgoing& o = out.messages.emplace_back();
  auto* po = o.message.mutable_producer_opened();
  po->set_stream(producer_stream_->name());
  po->set_buffer_bytes(buffer);
  po->set_owner_uid(producer_stream_->owner_uid());
  po->set_max_samples(producer_stream_->config().max_samples);
  po->set_max_bytes(producer_stream_->config().max_bytes);
  o.pass_fd = put_buffer_.fd();
  return out;
}

Output SessionLogic::PutSample(const proto::PutSample& m) {
  if (m.metadata().size() > (64u << 10)) return Fatal(proto::Error::BAD_REQUEST, "PutSample.metadata over 64 KiB");
  if (m.key().size() > 4096) return Fatal(proto::Error::BAD_REQUEST, "PutSample.key over 4096 bytes");
  if (m.buffer_length() > 0 && !m.data().empty()) {
    return Fatal(proto::Error::BAD_REQUEST, "PutSample has both buffer_length and inline data");
  }
  if (m.buffer_length() > put_buffer_.size()) {
    return Fatal(proto::Error::BAD_REQUEST, "PutSample.buffer_length " + std::to_string(m.buffer_length()) +
                                                " is beyond the put buffer of " + std::to_string(put_buffer_.size()) +
                                                " bytes");
  }
  if (queued_puts_.size() >= kMaxQueuedPuts || queued_put_bytes_ > kMaxQueuedPutBytes) {
    return Fatal(proto::Error::BAD_REQUEST,
                 "more than " + std::to_string(kMaxQueuedPuts) + " puts sent without waiting for their PutDone");
  }
  QueuedPut q;
  if (m.buffer_length() > 0) {
    q.data.assign(put_buffer_.data(), put_buffer_.data() + m.buffer_length());  // the one copy
  } else {
    q.data.assign(m.data().begin(), m.data().end());
  }
  q.label = m.label();
  q.metadata = m.metadata();
  q.key = m.key();
  q.block = m.block();
  queued_put_bytes_ += q.data.size();
  queued_puts_.push_back(std::move(q));
  Output out;
  DrainPuts(&out);
  return out;
}

void SessionLogic::DrainPuts(Output* out) {
  while (!queued_puts_.empty() && producer_stream_) {
    QueuedPut& q = queued_puts_.front();
    streams::PutOptions o;
    o.block = false;
    o.key = q.key;
    const size_t n = q.data.size();
    Result<uint64_t> r = producer_stream_->PutFrom(&q.data, q.label, q.metadata, o);  // q.data kept if refused
    if (!r.ok() && r.status().code() == StatusCode::kResourceExhausted && q.block) {
      if (!room_wait_) {
        room_wait_ = true;
        producer_stream_->NotifyOnRoom([notify = notify_] {
          if (notify) notify();
        });
      }
      return;
    }
    auto* done = out->messages.emplace_back().message.mutable_put_done();
    if (r.ok()) {
      done->set_offset(*r);
    } else {
      const StatusCode c = r.status().code();
      done->mutable_error()->set_code(c == StatusCode::kResourceExhausted ? proto::Error::RESOURCE_EXHAUSTED
                                                                          : proto::Error::BAD_REQUEST);
      done->mutable_error()->set_message(r.status().message());
    }
    queued_put_bytes_ -= std::min<uint64_t>(queued_put_bytes_, n);
    queued_puts_.pop_front();
  }
  if (queued_puts_.empty() && close_after_puts_) {
    proto::CloseProducer c = *close_after_puts_;
    close_after_puts_.reset();
    Output more = CloseProducer(c);
    for (auto& m : more.messages) out->messages.push_back(std::move(m));
  }
}

Output SessionLogic::CloseProducer(const proto::CloseProducer& m) {
  Output out;
  if (!queued_puts_.empty()) {  // answered once the puts before it are in
    close_after_puts_ = m;
    return out;
  }
  if (m.end_stream() && producer_stream_) {
    producer_stream_->Close();
    spdlog::info("{}: stream '{}' closed by its producer", Who(), EscapeForLog(producer_stream_->name()));
  }
  DropProducer();
  state_ = State::kIdle;
  out.messages.emplace_back().message.mutable_producer_closed();
  return out;
}

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
                                              " bytes exceeds the daemon's max_frame_bytes of " + std::to_string(max) +
                                              " bytes");
}

Output SessionLogic::OnFrame(std::string_view payload) {
  if (state_ == State::kClosed) return {};
  proto::ClientMessage msg;
  if (!proto::ParseClientMessage(payload, &msg)) {
    return Fatal(proto::Error::BAD_REQUEST,
                 "not a valid spdld control message (" + std::to_string(payload.size()) + " bytes)");
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
      if (state_ == State::kRunning || state_ == State::kSubmitting || state_ == State::kProducing) {
        return Fatal(proto::Error::BAD_REQUEST, "a session runs one job (or one producer) at a time");
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
    case proto::ClientMessage::kOpenProducer:
      if (state_ != State::kIdle) {
        return Fatal(proto::Error::BAD_REQUEST, "OpenProducer in a session that runs a job or a producer");
      }
      return OpenProducer(msg.open_producer());
    case proto::ClientMessage::kPutSample:
      if (state_ != State::kProducing) return Fatal(proto::Error::BAD_REQUEST, "PutSample before OpenProducer");
      if (close_after_puts_) return Fatal(proto::Error::BAD_REQUEST, "PutSample after CloseProducer");
      return PutSample(msg.put_sample());
    case proto::ClientMessage::kCloseProducer:
      if (state_ != State::kProducing) return Fatal(proto::Error::BAD_REQUEST, "CloseProducer before OpenProducer");
      return CloseProducer(msg.close_producer());
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
  if (state_ == State::kProducing) {  // the stream may have room for a queued put
    room_wait_ = false;
    DrainPuts(&out);
    return out;
  }
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
  DropProducer();
  retired_gpu_jobs_.clear();  // the session ended: the client's mappings went with its process or it closed them
  state_ = State::kClosed;
}

}  // namespace spdl::server
