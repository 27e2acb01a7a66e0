// control_fuzz: the daemon's side of the control channel under arbitrary input. Bytes go through a
// FrameParser with a small limit, fed in arbitrary chunks; every whole frame goes through
// ParseClientMessage and a SessionLogic whose JobService and JobHandle are fakes driven by the
// input (batches become ready, the job fails, an operator cancels it). No sockets, no threads.
// The loop mirrors the daemon's read loop (server/control_server.cc: Session::Read).
//
// Input: FuzzedDataProvider takes the stream's bytes from the front and control values from the
// back, so a seed is "the bytes a client sends" followed by a short trailer read backwards:
//   last byte         settings: bits 0-2: max frame = 16 << n bytes; bit 3: Submit is refused;
//                     bit 4: a job ends after 1 + (bits 5-7) batches, else it runs until EndJob
//   each byte before  one step: bits 0-5: feed that many stream bytes (63 = all the rest), then
//                     bits 6-7: 0 nothing, 1 two batches become ready, 2 the job fails, 3 an
//                     operator cancels the job (JobService::Cancel, as spdlctl does); then the
//                     session is told of a job event (SessionLogic::OnJobEvent)
// make_control_corpus.cc writes seeds in this form.
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - the chunked parser yields exactly the frames of a parser fed the whole stream at once; no
//     frame is over the limit; buffered() accounts for every byte; kBad is sticky and reports a
//     length over the limit;
//   - a parsed ClientMessage has a message set and re-serializes to the same bytes;
//   - nothing is emitted after the session closed; a close comes with an Error, last;
//   - a closed session holds no job; the session holds a job iff exactly one job is live (neither
//     cancelled nor ended); every job has been cancelled or has ended once the session closes;
//   - every emitted DaemonMessage has a message set and survives EncodeFrame/ParseDaemonMessage;
//     an Error has a message; only JobAccepted passes a descriptor, the new job's; batches come
//     only from OnJobEvent while a job is live, in seq order from 0.
#include <fuzzer/FuzzedDataProvider.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "proto/framing.h"
#include "server/session_logic.h"

namespace {

using namespace spdl;

constexpr uint32_t kSlots = 4;
constexpr int kFirstFd = 1000;  // fake descriptors: job n has kFirstFd + n (never used as an fd)

// A job with kSlots slots; batches become ready when the input says so; generation counters catch
// stale or duplicate releases as the real slot ring does.
class FuzzJob : public jobs::JobHandle {
 public:
  FuzzJob(uint64_t id, std::optional<uint64_t> total_batches) : total_(total_batches) {
    accepted_.set_job_id(id);
    accepted_.set_num_slots(kSlots);
  }
  const proto::JobAccepted& accepted() const override { return accepted_; }
  int region_fd() const override { return kFirstFd + static_cast<int>(accepted_.job_id()); }
  std::optional<jobs::Delivery> TakeNext() override {
    FUZZ_CHECK(!cancelled_ && !ended_);  // the session drops a job that is cancelled or ended
    if (ready_ == 0 || !fail_.ok()) return std::nullopt;
    uint32_t slot = 0;
    while (slot < kSlots && leased_[slot]) ++slot;
    if (slot == kSlots) return std::nullopt;  // backpressure: every slot is with the client
    --ready_;
    leased_[slot] = true;
    generation_[slot] = ++next_generation_;
    jobs::Delivery d;
    d.batch.set_slot(slot);
    d.batch.set_generation(generation_[slot]);
    d.batch.set_seq(delivered_++);
    d.batch.set_rows(1);  // a batch with rows: the session withholds 0-row ones (server_test covers that)
    if (total_ && delivered_ == *total_) {
      d.epoch_end.emplace().set_batches(delivered_);
      d.job_end.emplace().mutable_stats()->set_batches(delivered_);
      ended_ = true;
    }
    return d;
  }
  Status Release(uint32_t slot, uint64_t generation) override {
    FUZZ_CHECK(!cancelled_ && !ended_);
    if (slot >= kSlots) return InvalidArgument("no slot " + std::to_string(slot));
    if (!leased_[slot] || generation_[slot] != generation) return InvalidArgument("stale generation");
    leased_[slot] = false;
    return Status::Ok();
  }
  Status failure() const override { return fail_; }
  void Cancel() override { cancelled_ = true; }
  proto::JobStats Stats() const override {
    proto::JobStats s;
    s.set_batches(delivered_);
    return s;
  }
  void Abort(Status reason) override {
    if (fail_.ok()) fail_ = std::move(reason);
  }

  void MakeReady(uint32_t n) { ready_ += n; }
  bool live() const { return !cancelled_ && !ended_; }
  uint64_t id() const { return accepted_.job_id(); }

 private:
  proto::JobAccepted accepted_;
  const std::optional<uint64_t> total_;
  uint32_t ready_ = 0;
  uint64_t delivered_ = 0;
  uint64_t next_generation_ = 0;
  std::array<bool, kSlots> leased_{};
  std::array<uint64_t, kSlots> generation_{};
  Status fail_;
  bool cancelled_ = false;
  bool ended_ = false;
};

class FuzzService : public jobs::JobService {
 public:
  FuzzService(bool refuse, std::optional<uint64_t> total_batches) : refuse_(refuse), total_(total_batches) {}

  jobs::SubmitResult Submit(const proto::SubmitJob& request, const jobs::PeerInfo&, std::function<void()>) override {
    jobs::SubmitResult r;
    if (refuse_ || request.config_yaml().empty()) {
      r.status = InvalidArgument("invalid job config");
      r.config_errors.push_back(config::ConfigError{1, 0, "", "bogus: unknown key"});
      return r;
    }
    auto job = std::make_shared<FuzzJob>(jobs_.size() + 1, total_);
    jobs_.push_back(job);
    r.job = job;
    r.record = std::make_shared<jobs::JobRecord>();
    r.record->job_id = job->id();
    r.record->job = job;
    return r;
  }
  proto::DaemonStatus Status(const jobs::PeerInfo&) override {
    proto::DaemonStatus s;
    s.set_live_jobs(LiveCount());
    for (const auto& j : jobs_) {
      if (j->live()) s.add_jobs()->set_job_id(j->id());
    }
    return s;
  }
  spdl::Status Cancel(uint64_t job_id, const jobs::PeerInfo& peer) override {
    for (const auto& j : jobs_) {
      if (j->id() == job_id && j->live()) {
        j->Abort(Cancelled("cancelled by uid " + std::to_string(peer.uid)));
        return spdl::Status::Ok();
      }
    }
    return NotFound("no job " + std::to_string(job_id));
  }

  FuzzJob* Live() const {
    for (const auto& j : jobs_) {
      if (j->live()) return j.get();
    }
    return nullptr;
  }
  int LiveCount() const {
    int n = 0;
    for (const auto& j : jobs_) n += j->live() ? 1 : 0;
    return n;
  }
  uint64_t last_id() const { return jobs_.size(); }

 private:
  const bool refuse_;
  const std::optional<uint64_t> total_;
  std::vector<std::shared_ptr<FuzzJob>> jobs_;
};

enum class Call { kFrame, kOversized, kJobEvent };

// CONTROL_FUZZ_TRACE=1 prints what goes in and out (to read a seed or a crash input).
bool g_trace = false;

void Trace(const char* what, const google::protobuf::Message& m) {
  if (g_trace) std::fprintf(stderr, "%s %s\n", what, m.ShortDebugString().c_str());
}

// Checks one Output of the session against the invariants above.
class Checker {
 public:
  Checker(const server::SessionLogic* session, const FuzzService* svc) : session_(session), svc_(svc) {}

  // `live_before`: the job that was live before the call, if any.
  void Check(const server::Output& out, Call call, const FuzzJob* live_before) {
    if (closed_) {
      FUZZ_CHECK(out.messages.empty());
      FUZZ_CHECK(!out.close);
    }
    for (size_t i = 0; i < out.messages.size(); ++i) {
      const server::Outgoing& m = out.messages[i];
      Trace("  out:", m.message);
      FUZZ_CHECK(m.message.msg_case() != proto::DaemonMessage::MSG_NOT_SET);
      std::string frame;
      FUZZ_CHECK(proto::EncodeFrame(m.message, &frame));
      FUZZ_CHECK(frame.size() >= proto::kFrameHeaderBytes);
      proto::DaemonMessage back;
      FUZZ_CHECK(proto::ParseDaemonMessage(std::string_view(frame).substr(proto::kFrameHeaderBytes), &back));
      FUZZ_CHECK(back.SerializeAsString() == m.message.SerializeAsString());
      if (m.message.has_error()) FUZZ_CHECK(!m.message.error().message().empty());
      if (m.message.has_accepted()) {
        FUZZ_CHECK(call == Call::kFrame);
        const FuzzJob* job = svc_->Live();
        FUZZ_CHECK(job != nullptr && session_->has_job());
        FUZZ_CHECK(m.message.accepted().job_id() == job->id());
        FUZZ_CHECK(m.pass_fd == job->region_fd());
        next_seq_ = 0;
      } else {
        FUZZ_CHECK(m.pass_fd == -1);
      }
      if (m.message.has_batch()) {
        FUZZ_CHECK(call == Call::kJobEvent);
        FUZZ_CHECK(live_before != nullptr);
        FUZZ_CHECK(m.message.batch().seq() == next_seq_);
        ++next_seq_;
      }
    }
    if (out.close) {
      if (g_trace) std::fprintf(stderr, "  (close)\n");
      FUZZ_CHECK(!out.messages.empty());
      FUZZ_CHECK(out.messages.back().message.has_error());
      closed_ = true;
    }
    FUZZ_CHECK(session_->closed() == closed_);
    if (session_->closed()) FUZZ_CHECK(!session_->has_job());
    FUZZ_CHECK(svc_->LiveCount() <= 1);
    FUZZ_CHECK(session_->has_job() == (svc_->LiveCount() == 1));
  }

  // The client went away (SessionLogic::OnDisconnect).
  void Disconnected() { closed_ = true; }

 private:
  const server::SessionLogic* const session_;
  const FuzzService* const svc_;
  bool closed_ = false;
  uint64_t next_seq_ = 0;
};

// Every whole frame a parser yields from `bytes`, and whether it ended in kBad.
struct Framed {
  std::vector<std::string> frames;
  bool bad = false;
};

Framed FrameAll(const std::string& bytes, uint32_t max_frame) {
  proto::FrameParser p(max_frame);
  p.Feed(bytes.data(), bytes.size());
  Framed f;
  std::string payload;
  for (;;) {
    auto r = p.Next(&payload);
    if (r == proto::FrameParser::Result::kNeedMore) break;
    if (r == proto::FrameParser::Result::kBad) {
      f.bad = true;
      break;
    }
    f.frames.push_back(payload);
  }
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // SessionLogic logs every refusal
  const char* trace = std::getenv("CONTROL_FUZZ_TRACE");
  g_trace = trace != nullptr && *trace != '\0' && *trace != '0';
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const auto settings = in.ConsumeIntegral<uint8_t>();
  const uint32_t max_frame = 16u << (settings & 7);
  std::optional<uint64_t> total_batches;
  if (settings & 0x10) total_batches = 1 + (settings >> 5);

  FuzzService svc((settings & 0x08) != 0, total_batches);
  const jobs::PeerInfo peer{123, 1000, 1000};
  server::SessionLogic session(&svc, peer, [] {});
  Checker check(&session, &svc);
  proto::FrameParser parser(max_frame);

  std::string fed;      // every byte fed to the parser
  size_t consumed = 0;  // bytes of the whole frames taken out
  Framed got;
  std::string payload;
  while (in.remaining_bytes() > 0) {
    const auto step = in.ConsumeIntegral<uint8_t>();
    const size_t len = step & 0x3f;
    const std::string chunk = len == 0x3f ? in.ConsumeRemainingBytesAsString() : in.ConsumeBytesAsString(len);
    fed += chunk;
    parser.Feed(chunk.data(), chunk.size());
    while (!got.bad) {
      auto r = parser.Next(&payload);
      if (r == proto::FrameParser::Result::kNeedMore) break;
      if (r == proto::FrameParser::Result::kBad) {
        FUZZ_CHECK(parser.bad_length() > max_frame);
        FUZZ_CHECK(parser.Next(&payload) == proto::FrameParser::Result::kBad);  // sticky
        got.bad = true;
        if (g_trace) std::fprintf(stderr, "frame of %u bytes: over the limit of %u\n", parser.bad_length(), max_frame);
        // The daemon reports it once and stops reading; a closed session is not told again.
        if (!session.closed()) {
          check.Check(session.OnOversizedFrame(parser.bad_length(), max_frame), Call::kOversized, svc.Live());
          FUZZ_CHECK(session.closed());
        }
        break;
      }
      FUZZ_CHECK(payload.size() <= max_frame);
      consumed += proto::kFrameHeaderBytes + payload.size();
      got.frames.push_back(payload);

      proto::ClientMessage msg;
      const bool parsed = proto::ParseClientMessage(payload, &msg);
      if (g_trace)
        std::fprintf(stderr, "frame %zu bytes: %s\n", payload.size(),
                     parsed ? msg.ShortDebugString().c_str() : "(not a ClientMessage)");
      if (parsed) {
        FUZZ_CHECK(msg.msg_case() != proto::ClientMessage::MSG_NOT_SET);
        const std::string again = msg.SerializeAsString();
        proto::ClientMessage msg2;
        FUZZ_CHECK(proto::ParseClientMessage(again, &msg2));
        FUZZ_CHECK(msg2.SerializeAsString() == again);
      }
      // Also after the session closed (the daemon stops reading then): it must stay silent.
      const FuzzJob* live = svc.Live();
      check.Check(session.OnFrame(payload), Call::kFrame, live);
    }
    if (!got.bad) FUZZ_CHECK(parser.buffered() == fed.size() - consumed);

    if (g_trace && (step >> 6) != 0) std::fprintf(stderr, "event %d\n", step >> 6);
    switch (step >> 6) {
      case 0:
        continue;
      case 1:
        if (FuzzJob* j = svc.Live()) j->MakeReady(2);
        break;
      case 2:
        if (FuzzJob* j = svc.Live()) j->Abort(DataLoss("sample cat/1.jpg: corrupt JPEG"));
        break;
      case 3:
        (void)svc.Cancel(svc.last_id(), jobs::PeerInfo{1, 0, 0});
        break;
    }
    const FuzzJob* live = svc.Live();
    check.Check(session.OnJobEvent(), Call::kJobEvent, live);
  }

  session.OnDisconnect();
  check.Disconnected();
  FUZZ_CHECK(session.closed());
  FUZZ_CHECK(!session.has_job());
  FUZZ_CHECK(svc.LiveCount() == 0);
  check.Check(session.OnJobEvent(), Call::kJobEvent, nullptr);
  check.Check(session.OnFrame(std::string_view("\x0a\x02\x08\x01", 4)), Call::kFrame, nullptr);  // a Hello

  // Framing does not depend on how the bytes were split.
  const Framed whole = FrameAll(fed, max_frame);
  FUZZ_CHECK(whole.bad == got.bad);
  FUZZ_CHECK(whole.frames == got.frames);
  std::string reframed;
  for (const auto& f : got.frames) proto::AppendFrame(f, &reframed);
  FUZZ_CHECK(reframed == fed.substr(0, consumed));
  return 0;
}
