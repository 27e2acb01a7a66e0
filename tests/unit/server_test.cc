// The session protocol, without sockets: SessionLogic against a fake job service.
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "cuda/device_handles.h"
#include "cuda/fake_backend.h"
#include "cuda/ipc_messages.h"
#include "jobs/gpu_delivery.h"
#include "proto/framing.h"
#include "server/session_logic.h"

namespace spdl::server {
namespace {

std::string Frame(const proto::ClientMessage& m) { return m.SerializeAsString(); }

proto::ClientMessage Hello(uint32_t v = proto::kProtocolVersion) {
  proto::ClientMessage m;
  m.mutable_hello()->set_protocol_version(v);
  return m;
}

proto::ClientMessage Submit() {
  proto::ClientMessage m;
  m.mutable_submit()->set_config_yaml("source: {root: /x}");
  return m;
}

proto::ClientMessage Release(uint32_t slot, uint64_t gen) {
  proto::ClientMessage m;
  m.mutable_release()->set_slot(slot);
  m.mutable_release()->set_generation(gen);
  return m;
}

// A job with two batches in one epoch; slot 0 then slot 1.
class FakeJob : public jobs::JobHandle {
 public:
  FakeJob() { accepted_.set_job_id(7); }
  const proto::JobAccepted& accepted() const override { return accepted_; }
  int region_fd() const override { return 42; }
  std::optional<jobs::Delivery> TakeNext() override {
    if (ready == 0) return std::nullopt;
    --ready;
    jobs::Delivery d;
    d.batch.set_slot(static_cast<uint32_t>(taken));
    d.batch.set_generation(100 + taken);
    d.batch.set_rows(rows);
    d.batch.set_seq(taken);
    if (++taken == 2) {
      d.epoch_end.emplace().set_epoch(0);
      d.job_end.emplace().mutable_stats()->set_batches(2);
    }
    return d;
  }
  Status Release(uint32_t slot, uint64_t generation) override {
    if (generation != 100 + slot) return InvalidArgument("stale generation");
    releases.push_back(slot);
    return Status::Ok();
  }
  Status failure() const override { return fail; }
  void Cancel() override { cancelled = true; }
  void Abort(Status reason) override {
    cancelled = true;
    if (fail.ok()) fail = std::move(reason);
  }
  proto::JobStats Stats() const override {
    proto::JobStats s;
    s.set_batches(taken);
    return s;
  }

  proto::JobAccepted accepted_;
  uint32_t rows = 4;  // of each batch
  int ready = 0;
  uint64_t taken = 0;
  std::vector<uint32_t> releases;
  Status fail;
  bool cancelled = false;
};

// A host region for GPU jobs: 2 slots of 4096 bytes after a 4096-byte header.
struct GpuHost {
  static constexpr uint64_t kStride = 4096, kOffset = 4096, kBytes = 3 * 4096;
  GpuHost() : base(static_cast<uint8_t*>(std::aligned_alloc(4096, kBytes))) { std::memset(base, 0, kBytes); }
  ~GpuHost() { std::free(base); }
  uint8_t* slot(uint32_t i) const { return base + kOffset + i * kStride; }
  uint8_t* base;
};

class FakeService : public jobs::JobService {
 public:
  jobs::SubmitResult Submit(const proto::SubmitJob&, const jobs::PeerInfo& peer,
                            std::function<void()> notify) override {
    jobs::SubmitResult r;
    last_uid = peer.uid;
    if (refuse) {
      r.status = InvalidArgument("bad config");
      r.config_errors.push_back(config::ConfigError{3, 0, "", ""});
      return r;
    }
    job = std::make_shared<FakeJob>();
    r.job = job;
    if (gpu_backend) {
      job->accepted_.set_num_slots(2);
      job->accepted_.set_slots_offset(GpuHost::kOffset);
      job->accepted_.set_slot_stride(GpuHost::kStride);
      job->accepted_.set_region_bytes(GpuHost::kBytes);
      jobs::GpuDeliveryOptions g;
      g.output.device = "cuda:0";
      g.output.cuda_device = 0;
      g.host_base = gpu_host->base;
      g.notify = std::move(notify);
      g.on_close = [this](uint64_t) { ++gpu_closed; };
      auto w = jobs::WrapGpuJob(job, gpu_backend, std::move(g));
      REQUIRE(w.ok());
      r.job = *w;
    }
    return r;
  }
  proto::DaemonStatus Status(const jobs::PeerInfo& peer) override {
    proto::DaemonStatus s;
    if (job && (peer.uid == 0 || peer.uid == 1000)) s.add_jobs()->set_job_id(7);
    return s;
  }
  spdl::Status Cancel(uint64_t id, const jobs::PeerInfo& peer) override {
    if (!job || id != 7 || (peer.uid != 0 && peer.uid != 1000)) return NotFound("no job " + std::to_string(id));
    job->Abort(Cancelled("cancelled by uid " + std::to_string(peer.uid)));
    return spdl::Status::Ok();
  }
  std::shared_ptr<FakeJob> job;
  bool refuse = false;
  cuda::DeviceBackend* gpu_backend = nullptr;  // set: jobs get GPU delivery (copy: daemon) on it
  GpuHost* gpu_host = nullptr;
  int gpu_closed = 0;
  uid_t last_uid = 0;
  // Streams: a real registry (the stream core is pure logic), no budget.
  streams::StreamRegistry* streams() override { return &stream_registry; }
  streams::StreamRegistry stream_registry;
};

jobs::PeerInfo Peer() { return {123, 1000, 1000}; }

proto::ClientMessage OpenProducer(const std::string& name, uint64_t max_samples) {
  proto::ClientMessage m;
  m.mutable_open_producer()->set_stream(name);
  m.mutable_open_producer()->set_max_samples(max_samples);
  m.mutable_open_producer()->set_buffer_bytes(1 << 16);
  return m;
}

proto::ClientMessage Put(const std::string& data, int64_t label, bool block) {
  proto::ClientMessage m;
  m.mutable_put_sample()->set_data(data);
  m.mutable_put_sample()->set_label(label);
  m.mutable_put_sample()->set_block(block);
  return m;
}

TEST_CASE("producer: open passes the put buffer, puts answer with offsets, close ends the stream") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(OpenProducer("clicks", 4)));
  REQUIRE(o.messages.size() == 1);
  REQUIRE(o.messages[0].message.has_producer_opened());
  CHECK(o.messages[0].pass_fd >= 0);
  CHECK(o.messages[0].message.producer_opened().owner_uid() == 1000);
  CHECK(o.messages[0].message.producer_opened().buffer_bytes() == (1 << 16));
  for (int i = 0; i < 3; ++i) {
    o = s.OnFrame(Frame(Put("bytes", i, true)));
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0].message.put_done().offset() == static_cast<uint64_t>(i));
    CHECK_FALSE(o.messages[0].message.put_done().has_error());
  }
  // A sample in the put buffer, beyond it: the session closes.
  proto::ClientMessage beyond;
  beyond.mutable_put_sample()->set_buffer_length((1 << 16) + 1);
  auto stream = svc.stream_registry.Open("clicks", 1000);
  REQUIRE(stream.ok());
  CHECK((*stream)->Stats().producers == 1);
  proto::ClientMessage close;
  close.mutable_close_producer()->set_end_stream(true);
  o = s.OnFrame(Frame(close));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.has_producer_closed());
  CHECK((*stream)->closed());
  CHECK((*stream)->Stats().producers == 0);
  o = s.OnFrame(Frame(OpenProducer("other", 4)));
  REQUIRE(o.messages[0].message.has_producer_opened());  // the session is usable again
  o = s.OnFrame(Frame(beyond));
  CHECK(o.close);
}

TEST_CASE("producer: a full stream queues a blocking put until a consumer acknowledges, refuses a non-blocking one") {
  FakeService svc;
  int notified = 0;
  SessionLogic s(&svc, Peer(), [&] { ++notified; });
  s.OnFrame(Frame(Hello()));
  s.OnFrame(Frame(OpenProducer("full", 2)));
  auto stream = svc.stream_registry.Open("full", 1000);
  REQUIRE(stream.ok());
  auto consumer = (*stream)->Join("g");
  REQUIRE(consumer.ok());
  CHECK(s.OnFrame(Frame(Put("a", 0, true))).messages.size() == 1);
  CHECK(s.OnFrame(Frame(Put("b", 1, true))).messages.size() == 1);
  Output o = s.OnFrame(Frame(Put("c", 2, false)));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.put_done().error().code() == proto::Error::RESOURCE_EXHAUSTED);
  o = s.OnFrame(Frame(Put("d", 3, true)));
  CHECK(o.messages.empty());                                    // waits in the session: the control thread never blocks
  CHECK(s.OnFrame(Frame(Put("e", 4, true))).messages.empty());  // behind it, in order
  CHECK(notified == 0);
  auto taken = (*stream)->Take(*consumer, 1, std::chrono::milliseconds(0));
  REQUIRE(taken.ok());
  (*stream)->Ack(*consumer, {taken->samples[0]->offset});
  CHECK(notified == 1);
  o = s.OnJobEvent();
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.put_done().offset() == 2);  // "d"; "e" still waits
  taken = (*stream)->Take(*consumer, 1, std::chrono::milliseconds(0));
  (*stream)->Ack(*consumer, {taken->samples[0]->offset});
  o = s.OnJobEvent();
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.put_done().offset() == 3);
  CHECK((*stream)->Stats().tail_offset == 4);
}

TEST_CASE("producer: another uid cannot write into a stream it is not allowed, PutSample needs OpenProducer") {
  FakeService svc;
  streams::StreamConfig c;
  c.name = "mine";
  REQUIRE(svc.stream_registry.Define(c, 2000).ok());
  SessionLogic s(&svc, Peer(), [] {});
  s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(OpenProducer("mine", 4)));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.error().code() == proto::Error::PERMISSION_DENIED);
  CHECK(o.messages[0].message.error().message().find("uid 1000") != std::string::npos);
  CHECK_FALSE(o.close);
  o = s.OnFrame(Frame(Put("x", 0, true)));
  CHECK(o.close);
}

TEST_CASE("hello, submit, batches in order, end of job") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  Output o = s.OnFrame(Frame(Hello()));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.hello().protocol_version() == proto::kProtocolVersion);
  CHECK_FALSE(o.close);

  o = s.OnFrame(Frame(Submit()));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.accepted().job_id() == 7);
  CHECK(o.messages[0].pass_fd == 42);
  CHECK(svc.last_uid == 1000);

  svc.job->ready = 1;
  o = s.OnJobEvent();
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.batch().seq() == 0);
  CHECK(s.OnFrame(Frame(Release(0, 100))).messages.empty());
  CHECK(svc.job->releases == std::vector<uint32_t>{0});

  svc.job->ready = 1;
  o = s.OnJobEvent();
  REQUIRE(o.messages.size() == 3);
  CHECK(o.messages[0].message.has_batch());
  CHECK(o.messages[1].message.has_epoch_end());
  CHECK(o.messages[2].message.job_end().stats().batches() == 2);
  CHECK_FALSE(s.has_job());
  // A release after the end is harmless.
  o = s.OnFrame(Frame(Release(1, 101)));
  CHECK(o.messages.empty());
  CHECK_FALSE(o.close);
}

TEST_CASE("a batch left with 0 rows is never sent: its slot goes back, the epoch's and job's ends still go out") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  s.OnFrame(Frame(Hello()));
  s.OnFrame(Frame(Submit()));
  svc.job->rows = 0;
  svc.job->ready = 2;
  Output o = s.OnJobEvent();
  REQUIRE(o.messages.size() == 2);
  CHECK(o.messages[0].message.has_epoch_end());
  CHECK(o.messages[1].message.has_job_end());
  // Slot 0 goes back at once; slot 1's delivery ended the job, which takes no more releases.
  CHECK(svc.job->releases == std::vector<uint32_t>{0});
}

TEST_CASE("a version mismatch is refused with a clear message and closes") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  Output o = s.OnFrame(Frame(Hello(99)));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.error().code() == proto::Error::VERSION_MISMATCH);
  CHECK_THAT(o.messages[0].message.error().message(), Catch::Contains("version 99") && Catch::Contains("version 1"));
  CHECK(o.close);
  CHECK(s.closed());
}

TEST_CASE("anything but Hello first closes the session") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  Output o = s.OnFrame(Frame(Submit()));
  CHECK(o.close);
  CHECK(o.messages[0].message.error().code() == proto::Error::BAD_REQUEST);
}

TEST_CASE("garbage and oversized frames close the session and cancel its job") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  (void)s.OnFrame(Frame(Hello()));
  (void)s.OnFrame(Frame(Submit()));
  auto job = svc.job;
  SECTION("garbage") {
    Output o = s.OnFrame("\xff\xff\xff garbage");
    CHECK(o.close);
    CHECK(o.messages[0].message.error().code() == proto::Error::BAD_REQUEST);
  }
  SECTION("oversized") {
    Output o = s.OnOversizedFrame(1 << 30, 1 << 20);
    CHECK(o.close);
    CHECK_THAT(o.messages[0].message.error().message(), Catch::Contains("1073741824"));
  }
  CHECK(job->cancelled);
  CHECK_FALSE(s.has_job());
}

TEST_CASE("a stale release closes the session") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  (void)s.OnFrame(Frame(Hello()));
  (void)s.OnFrame(Frame(Submit()));
  Output o = s.OnFrame(Frame(Release(0, 5)));
  CHECK(o.close);
  CHECK_THAT(o.messages[0].message.error().message(), Catch::Contains("stale generation"));
}

TEST_CASE("a refused job reports its errors and the session stays usable") {
  FakeService svc;
  svc.refuse = true;
  SessionLogic s(&svc, Peer(), [] {});
  (void)s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(Submit()));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.error().code() == proto::Error::INVALID_CONFIG);
  CHECK(o.messages[0].message.error().config_errors(0).line() == 3);
  CHECK_FALSE(o.close);
  svc.refuse = false;
  o = s.OnFrame(Frame(Submit()));
  CHECK(o.messages[0].message.has_accepted());
}

TEST_CASE("a refusal's Status becomes the wire's error code at the server, its message whole") {
  const std::vector<std::pair<StatusCode, proto::Error::Code>> map = {
      {StatusCode::kInvalidArgument, proto::Error::INVALID_CONFIG},
      {StatusCode::kFailedPrecondition, proto::Error::BAD_REQUEST},
      {StatusCode::kDataLoss, proto::Error::BAD_REQUEST},
      {StatusCode::kResourceExhausted, proto::Error::RESOURCE_EXHAUSTED},
      {StatusCode::kUnavailable, proto::Error::RESOURCE_EXHAUSTED},
      {StatusCode::kPermissionDenied, proto::Error::PERMISSION_DENIED},
      {StatusCode::kNotFound, proto::Error::NOT_FOUND},
      {StatusCode::kInternal, proto::Error::INTERNAL},
      {StatusCode::kCancelled, proto::Error::INTERNAL},
  };
  for (const auto& [code, wire] : map) {
    INFO(StatusCodeName(code));
    jobs::SubmitResult r = jobs::SubmitResult::Refused(Status(code, "why: it says"));
    const proto::Error e = RefusalError(r);
    CHECK(e.code() == wire);
    CHECK(e.message() == "why: it says");
    CHECK(e.config_errors_size() == 0);
  }
  jobs::SubmitResult bad = jobs::SubmitResult::Refused(InvalidArgument("invalid job config"));
  bad.config_errors.push_back(config::ConfigError{4, 7, "batch.size", "must be at least 1 (got 0)"});
  bad.config_errors.push_back(config::ConfigError{0, 0, "--set prefetch", "not a number"});
  const proto::Error e = RefusalError(bad);
  REQUIRE(e.config_errors_size() == 2);
  CHECK(e.config_errors(0).line() == 4);
  CHECK(e.config_errors(0).column() == 7);
  CHECK(e.config_errors(0).path() == "batch.size");
  CHECK(e.config_errors(0).message() == "must be at least 1 (got 0)");
  CHECK(e.config_errors(1).path() == "--set prefetch");
}

TEST_CASE("a failed job tells the client why, after the batches that were ready") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  (void)s.OnFrame(Frame(Hello()));
  (void)s.OnFrame(Frame(Submit()));
  svc.job->ready = 1;
  svc.job->fail = DataLoss("cat/1.jpg: not a JPEG");
  Output o = s.OnJobEvent();
  REQUIRE(o.messages.size() == 2);
  CHECK(o.messages[0].message.has_batch());
  CHECK(o.messages[1].message.error().code() == proto::Error::JOB_FAILED);
  CHECK_THAT(o.messages[1].message.error().message(), Catch::Contains("cat/1.jpg: not a JPEG"));
  CHECK(svc.job->cancelled);
}

TEST_CASE("EndJob stops the job and answers with its figures") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  (void)s.OnFrame(Frame(Hello()));
  (void)s.OnFrame(Frame(Submit()));
  svc.job->ready = 1;
  (void)s.OnJobEvent();
  proto::ClientMessage end;
  end.mutable_end_job();
  Output o = s.OnFrame(Frame(end));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.job_end().stats().batches() == 1);
  CHECK(svc.job->cancelled);
  CHECK_FALSE(s.has_job());
  CHECK_FALSE(o.close);
}

TEST_CASE("status and cancel are answered in any state after Hello") {
  FakeService svc;
  SessionLogic owner(&svc, Peer(), [] {});
  (void)owner.OnFrame(Frame(Hello()));
  (void)owner.OnFrame(Frame(Submit()));
  SessionLogic other(&svc, {9, 2000, 2000}, [] {});
  (void)other.OnFrame(Frame(Hello()));
  proto::ClientMessage st;
  st.mutable_status();
  CHECK(other.OnFrame(Frame(st)).messages[0].message.status().jobs_size() == 0);  // another uid's job is hidden
  CHECK(owner.OnFrame(Frame(st)).messages[0].message.status().jobs_size() == 1);
  proto::ClientMessage cancel;
  cancel.mutable_cancel()->set_job_id(7);
  Output o = other.OnFrame(Frame(cancel));
  CHECK(o.messages[0].message.error().code() == proto::Error::NOT_FOUND);
  CHECK_FALSE(svc.job->cancelled);
  SessionLogic root(&svc, {1, 0, 0}, [] {});
  (void)root.OnFrame(Frame(Hello()));
  o = root.OnFrame(Frame(cancel));
  CHECK(o.messages[0].message.cancelled().job_id() == 7);
  // The owner's session reports the cancellation as the job's failure.
  o = owner.OnJobEvent();
  REQUIRE(o.messages.size() == 1);
  CHECK_THAT(o.messages[0].message.error().message(), Catch::Contains("cancelled by uid 0"));
}

TEST_CASE("a disconnect cancels the job") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  (void)s.OnFrame(Frame(Hello()));
  (void)s.OnFrame(Frame(Submit()));
  s.OnDisconnect();
  CHECK(svc.job->cancelled);
}

// ---- draining ----

proto::ClientMessage DrainMsg(uint32_t seconds = 0) {
  proto::ClientMessage m;
  m.mutable_drain()->set_seconds(seconds);
  return m;
}

// A DaemonControl whose drain request records who asked and flips `draining`, as the daemon does.
struct ControlFixture {
  ControlFixture() {
    control.admin_uid = 999;
    control.request_drain = [this](const jobs::PeerInfo& by, uint32_t seconds) {
      requests.push_back({by.uid, seconds});
      control.draining = true;
      control.drain_reason = "spdlctl drain by uid " + std::to_string(by.uid);
      proto::Draining d;
      d.set_deadline_seconds(seconds ? seconds : 20);
      d.set_live_jobs(1);
      d.set_reason(control.drain_reason);
      return d;
    };
  }
  DaemonControl control;
  std::vector<std::pair<uid_t, uint32_t>> requests;
};

TEST_CASE("while draining a submit is refused with SHUTTING_DOWN and the session stays open") {
  FakeService svc;
  ControlFixture cf;
  cf.control.draining = true;
  cf.control.drain_reason = "SIGTERM";
  SessionLogic s(
      &svc, Peer(), [] {}, &cf.control);
  s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(Submit()));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.error().code() == proto::Error::SHUTTING_DOWN);
  CHECK_THAT(o.messages[0].message.error().message(), Catch::Contains("draining (SIGTERM)"));
  CHECK_FALSE(o.close);
  CHECK_FALSE(s.has_job());
  CHECK_FALSE(svc.job);  // the job service was never asked
  // Status still answers.
  proto::ClientMessage st;
  st.mutable_status();
  o = s.OnFrame(Frame(st));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.has_status());
}

TEST_CASE("a running job is told once that the daemon drains, and its batches keep coming") {
  FakeService svc;
  ControlFixture cf;
  SessionLogic s(
      &svc, Peer(), [] {}, &cf.control);
  s.OnFrame(Frame(Hello()));
  s.OnFrame(Frame(Submit()));
  REQUIRE(s.has_job());
  proto::Draining notice;
  notice.set_deadline_seconds(12.5);
  notice.set_reason("SIGTERM");
  Output o = s.OnDrain(notice);
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.draining().deadline_seconds() == 12.5);
  CHECK(o.messages[0].message.draining().reason() == "SIGTERM");
  CHECK_FALSE(o.close);
  CHECK(s.OnDrain(notice).messages.empty());  // once
  svc.job->ready = 2;
  o = s.OnJobEvent();
  REQUIRE(o.messages.size() == 4);  // batch, batch, epoch end, job end
  CHECK(o.messages[3].message.has_job_end());
  CHECK_FALSE(s.has_job());
}

TEST_CASE("a session without a job gets no drain notice") {
  FakeService svc;
  ControlFixture cf;
  SessionLogic s(
      &svc, Peer(), [] {}, &cf.control);
  s.OnFrame(Frame(Hello()));
  CHECK(s.OnDrain(proto::Draining()).messages.empty());
}

TEST_CASE("drain is allowed to root and to the daemon's uid and refused to others") {
  FakeService svc;
  ControlFixture cf;
  {
    SessionLogic other(
        &svc, Peer(), [] {}, &cf.control);  // uid 1000
    other.OnFrame(Frame(Hello()));
    Output o = other.OnFrame(Frame(DrainMsg()));
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0].message.error().code() == proto::Error::PERMISSION_DENIED);
    CHECK_THAT(o.messages[0].message.error().message(), Catch::Contains("only root or uid 999"));
    CHECK_FALSE(o.close);
    CHECK(cf.requests.empty());
    CHECK_FALSE(cf.control.draining);
  }
  {
    SessionLogic admin(
        &svc, jobs::PeerInfo{5, 999, 999}, [] {}, &cf.control);
    admin.OnFrame(Frame(Hello()));
    Output o = admin.OnFrame(Frame(DrainMsg(7)));
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0].message.draining().deadline_seconds() == 7);
    CHECK(o.messages[0].message.draining().reason() == "spdlctl drain by uid 999");
  }
  {
    SessionLogic root(
        &svc, jobs::PeerInfo{6, 0, 0}, [] {}, &cf.control);
    root.OnFrame(Frame(Hello()));
    Output o = root.OnFrame(Frame(DrainMsg()));
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0].message.has_draining());
  }
  REQUIRE(cf.requests.size() == 2);
  CHECK(cf.requests[0] == std::pair<uid_t, uint32_t>{999, 7});
  CHECK(cf.requests[1] == std::pair<uid_t, uint32_t>{0, 0});
}

TEST_CASE("drain without a daemon control is refused, not fatal") {
  FakeService svc;
  SessionLogic s(&svc, jobs::PeerInfo{1, 0, 0}, [] {});
  s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(DrainMsg()));
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.error().code() == proto::Error::BAD_REQUEST);
  CHECK_FALSE(o.close);
}

TEST_CASE("session warnings are rate-limited per kind and name the job") {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(
      std::make_shared<spdlog::logger>("test", std::make_shared<spdlog::sinks::ostream_sink_st>(log)));
  FakeService svc;
  LogLimiter limiter(2, std::chrono::hours(1));
  DaemonControl control;
  control.log_limiter = &limiter;
  for (int i = 0; i < 10; ++i) {
    SessionLogic s(
        &svc, Peer(), [] {}, &control);
    s.OnFrame(Frame(Hello(proto::kProtocolVersion + 1)));  // wrong version: the session is closed
  }
  SessionLogic s(
      &svc, Peer(), [] {}, &control);
  s.OnFrame(Frame(Hello()));
  s.OnFrame(Frame(Submit()));
  s.OnFrame(Frame(Release(0, 12345)));  // a stale release: fatal, with a job
  spdlog::set_default_logger(previous);
  const std::string text = log.str();
  size_t closing = 0;
  for (size_t p = 0; (p = text.find("session pid 123 uid 1000: closing the session", p)) != std::string::npos; ++p) {
    ++closing;
  }
  CHECK(closing == 2);  // the burst; the other 8 were suppressed
  CHECK_THAT(text, Catch::Contains("job 7 (pid 123 uid 1000): closing the session: bad Release"));
}

}  // namespace
}  // namespace spdl::server

namespace spdl::server {
namespace {

proto::ClientMessage ConsumerEvents(cuda::FakeBackend& trainer, std::vector<cuda::EventHandle>* keep) {
  std::vector<cuda::IpcEventHandle> handles;
  for (int i = 0; i < 2; ++i) {
    auto ev = trainer.CreateEvent(/*interprocess=*/true);
    REQUIRE(ev.ok());
    keep->emplace_back(&trainer, *ev);
    auto h = trainer.ExportEvent(*ev);
    REQUIRE(h.ok());
    handles.push_back(*h);
  }
  proto::ClientMessage m;
  cuda::BuildCudaConsumerEvents(handles, m.mutable_cuda_consumer_events());
  return m;
}

TEST_CASE("gpu job: handles once, copy before BatchReady, host slot reused only after the copy") {
  cuda::FakeDevice dev;
  cuda::FakeBackend daemon(dev, "daemon");
  cuda::FakeBackend trainer(dev, "trainer");
  GpuHost host;
  FakeService svc;
  svc.gpu_backend = &daemon;
  svc.gpu_host = &host;
  std::atomic<int> notified{0};
  std::vector<cuda::EventHandle> consumer;
  {
    SessionLogic s(&svc, Peer(), [&] { ++notified; });
    s.OnFrame(Frame(Hello()));
    Output o = s.OnFrame(Frame(Submit()));
    REQUIRE(o.messages.size() == 2);
    CHECK(o.messages[0].message.accepted().device() == "cuda:0");
    CHECK_FALSE(o.messages[0].message.accepted().client_copy());
    REQUIRE(o.messages[1].message.has_cuda_handles());
    auto handles = cuda::ParseCudaHandles(o.messages[1].message.cuda_handles(), 2, GpuHost::kStride);
    REQUIRE(handles.ok());
    auto dev_base = trainer.OpenMemory(handles->memory[0].handle);
    REQUIRE(dev_base.ok());
    CHECK(s.OnFrame(Frame(ConsumerEvents(trainer, &consumer))).messages.empty());

    // The batch is on the device when BatchReady goes out, and no other CudaHandles follows.
    std::memset(host.slot(0), 0xab, GpuHost::kStride);
    svc.job->ready = 1;
    o = s.OnJobEvent();
    REQUIRE(o.messages.size() == 1);
    REQUIRE(o.messages[0].message.batch().slot() == 0);
    const auto* d0 = static_cast<const uint8_t*>(*dev_base) + handles->slots[0].offset;
    CHECK(d0[0] == 0xab);
    CHECK(d0[GpuHost::kStride - 1] == 0xab);

    // The copy is still "in flight" when the client releases: the ring gets the slot back only once
    // it ran, through the job's notify and the next event.
    auto ready0 = trainer.OpenEvent(handles->ready_events[0]);
    REQUIRE(ready0.ok());
    trainer.SetEventPending(*ready0, true);
    CHECK(s.OnFrame(Frame(Release(0, 100))).messages.empty());
    CHECK(svc.job->releases.empty());
    s.OnJobEvent();
    CHECK(svc.job->releases.empty());
    trainer.SetEventPending(*ready0, false);
    for (int i = 0; i < 5000 && notified.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(notified.load() > 0);
    s.OnJobEvent();
    CHECK(svc.job->releases == std::vector<uint32_t>{0});
    REQUIRE(trainer.DestroyEvent(*ready0).ok());

    // A stale release is refused by the device side too. (The client closes its mapping before
    // the daemon frees the memory, as a real client does before closing the connection.)
    REQUIRE(trainer.CloseMemory(*dev_base).ok());
    CHECK(s.OnFrame(Frame(Release(0, 100))).close);
  }
  // The session closed: the job was cancelled and its device side torn down.
  CHECK(svc.job->cancelled);
  CHECK(svc.gpu_closed == 1);
  consumer.clear();
  const cuda::FakeDevice::Live live = dev.live();
  INFO("allocations " << live.allocations << " streams " << live.streams << " events " << live.events
                      << " registrations " << live.registrations << " mappings " << live.mappings);
  CHECK(live.empty());
  CHECK(daemon.teardown_errors().empty());
}

TEST_CASE("gpu job: a Release before CudaConsumerEvents, or events sent twice, close the session") {
  cuda::FakeDevice dev;
  cuda::FakeBackend daemon(dev, "daemon");
  cuda::FakeBackend trainer(dev, "trainer");
  GpuHost host;
  FakeService svc;
  svc.gpu_backend = &daemon;
  svc.gpu_host = &host;
  std::vector<cuda::EventHandle> consumer;
  SECTION("release first") {
    SessionLogic s(&svc, Peer(), [] {});
    s.OnFrame(Frame(Hello()));
    s.OnFrame(Frame(Submit()));
    svc.job->ready = 1;
    REQUIRE(s.OnJobEvent().messages.size() == 1);
    Output o = s.OnFrame(Frame(Release(0, 100)));
    CHECK(o.close);
    CHECK(o.messages[0].message.error().message() == "Release before CudaConsumerEvents in a GPU job");
    CHECK(svc.job->cancelled);
    CHECK(svc.job->releases.empty());
  }
  SECTION("twice") {
    SessionLogic s(&svc, Peer(), [] {});
    s.OnFrame(Frame(Hello()));
    s.OnFrame(Frame(Submit()));
    CHECK(s.OnFrame(Frame(ConsumerEvents(trainer, &consumer))).messages.empty());
    Output o = s.OnFrame(Frame(ConsumerEvents(trainer, &consumer)));
    CHECK(o.close);
    CHECK(o.messages[0].message.error().message() == "CudaConsumerEvents sent twice");
  }
  SECTION("disconnect with a leased slot releases everything") {
    {
      SessionLogic s(&svc, Peer(), [] {});
      s.OnFrame(Frame(Hello()));
      s.OnFrame(Frame(Submit()));
      CHECK(s.OnFrame(Frame(ConsumerEvents(trainer, &consumer))).messages.empty());
      svc.job->ready = 1;
      REQUIRE(s.OnJobEvent().messages.size() == 1);
      s.OnDisconnect();
      CHECK(svc.job->cancelled);
    }
    CHECK(svc.gpu_closed == 1);
  }
  consumer.clear();
  CHECK(dev.live().empty());
}

proto::ClientMessage MappingClosed(uint64_t job_id) {
  proto::ClientMessage m;
  m.mutable_cuda_mapping_closed()->set_job_id(job_id);
  return m;
}

// The trainer's side of a GPU job as the real client holds it: the IPC mapping of the device slots
// and the daemon's ready events, opened; closed before it says CudaMappingClosed.
struct TrainerMapping {
  cuda::FakeBackend& trainer;
  void* base = nullptr;
  std::vector<cuda::Event> ready;
  TrainerMapping(cuda::FakeBackend& t, const proto::CudaHandles& msg) : trainer(t) {
    auto handles = cuda::ParseCudaHandles(msg, 2, GpuHost::kStride);
    REQUIRE(handles.ok());
    base = *trainer.OpenMemory(handles->memory[0].handle);
    for (const auto& h : handles->ready_events) ready.push_back(*trainer.OpenEvent(h));
  }
  void Close() {
    for (cuda::Event e : ready) REQUIRE(trainer.DestroyEvent(e).ok());
    ready.clear();
    REQUIRE(trainer.CloseMemory(base).ok());
  }
};

// However the job ends, its device memory and ready events stay until the client says its mapping
// is closed (freeing them under an importer is undefined in CUDA; the fake records it).
TEST_CASE("gpu job: the device side stays until the client closed its mapping, however the job ends") {
  cuda::FakeDevice dev;
  cuda::FakeBackend daemon(dev, "daemon");
  cuda::FakeBackend trainer(dev, "trainer");
  GpuHost host;
  FakeService svc;
  svc.gpu_backend = &daemon;
  svc.gpu_host = &host;
  std::vector<cuda::EventHandle> consumer;
  {
    SessionLogic s(&svc, Peer(), [] {});
    s.OnFrame(Frame(Hello()));
    Output o = s.OnFrame(Frame(Submit()));
    REQUIRE(o.messages.size() == 2);
    TrainerMapping mapping(trainer, o.messages[1].message.cuda_handles());
    CHECK(s.OnFrame(Frame(ConsumerEvents(trainer, &consumer))).messages.empty());
    svc.job->ready = 1;
    REQUIRE(s.OnJobEvent().messages.size() == 1);  // a batch the trainer still reads

    const std::string how = GENERATE(std::string("EndJob"), std::string("failure"), std::string("cancel"),
                                     std::string("job end"), std::string("protocol error"));
    INFO(how);
    if (how == "EndJob") {
      proto::ClientMessage end;
      end.mutable_end_job();
      CHECK(s.OnFrame(Frame(end)).messages.at(0).message.has_job_end());
    } else if (how == "failure") {
      svc.job->fail = Internal("the disk went away");
      CHECK(s.OnJobEvent().messages.at(0).message.error().code() == proto::Error::JOB_FAILED);
    } else if (how == "cancel") {  // spdlctl cancel, from another session
      REQUIRE(svc.Cancel(7, jobs::PeerInfo{1, 0, 0}).ok());
      CHECK(s.OnJobEvent().messages.at(0).message.error().code() == proto::Error::JOB_FAILED);
    } else if (how == "job end") {
      svc.job->ready = 1;
      CHECK(s.OnJobEvent().messages.back().message.has_job_end());
    } else {
      CHECK(s.OnFrame(Frame(Release(1, 999))).close);
    }
    CHECK(svc.job->cancelled);
    if (how != "protocol error") {
      // Still mapped: nothing freed, nothing destroyed, whatever the job's end.
      CHECK(svc.gpu_closed == 0);
      CHECK(dev.live().allocations == 1);
      CHECK(dev.violations().empty());
      // The session goes on (a new job may come) and the old device side waits for the client.
      mapping.Close();
      CHECK(s.OnFrame(Frame(MappingClosed(7))).messages.empty());
      CHECK(svc.gpu_closed == 1);
    } else {
      // The session is closed: its end frees the device side (the client closes its mapping as it
      // sees the error; a dead client's mappings die with it).
      mapping.Close();
    }
  }
  CHECK(svc.gpu_closed == 1);
  consumer.clear();
  CHECK(dev.violations().empty());
  CHECK(dev.live().empty());
}

TEST_CASE("gpu job: a client that closed its mapping first frees the device side at EndJob, unknown ids are ignored") {
  cuda::FakeDevice dev;
  cuda::FakeBackend daemon(dev, "daemon");
  cuda::FakeBackend trainer(dev, "trainer");
  GpuHost host;
  FakeService svc;
  svc.gpu_backend = &daemon;
  svc.gpu_host = &host;
  std::vector<cuda::EventHandle> consumer;
  SessionLogic s(&svc, Peer(), [] {});
  s.OnFrame(Frame(Hello()));
  CHECK(s.OnFrame(Frame(MappingClosed(99))).messages.empty());  // no job: harmless
  Output o = s.OnFrame(Frame(Submit()));
  TrainerMapping mapping(trainer, o.messages[1].message.cuda_handles());
  CHECK(s.OnFrame(Frame(ConsumerEvents(trainer, &consumer))).messages.empty());
  mapping.Close();
  CHECK(s.OnFrame(Frame(MappingClosed(99))).messages.empty());  // another job's id: ignored
  CHECK(s.OnFrame(Frame(MappingClosed(7))).messages.empty());
  CHECK(svc.gpu_closed == 0);  // the job still runs
  proto::ClientMessage end;
  end.mutable_end_job();
  CHECK(s.OnFrame(Frame(end)).messages.at(0).message.has_job_end());
  CHECK(svc.gpu_closed == 1);  // freed at once
  consumer.clear();
  CHECK(dev.violations().empty());
}

TEST_CASE("a CudaConsumerEvents for a cpu job closes the session") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(Submit()));
  REQUIRE(o.messages.size() == 1);  // no CudaHandles
  proto::ClientMessage m;
  m.mutable_cuda_consumer_events();
  o = s.OnFrame(Frame(m));
  CHECK(o.close);
  CHECK(o.messages[0].message.error().message() ==
        "CudaConsumerEvents for a job that is not a GPU job (output.device cpu or copy: client)");
}

// ---- asynchronous submit (DaemonControl::async_submit) ----

TEST_CASE("async submit: the source opens off the control thread and the session answers meanwhile") {
  FakeService svc;
  DaemonControl control;
  control.async_submit = true;
  SessionLogic s(
      &svc, Peer(), [] {}, &control);
  (void)s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(Submit()));
  CHECK(o.messages.empty());  // nothing yet: the server runs the task
  REQUIRE(o.prepare);
  CHECK(s.submitting());
  CHECK_FALSE(svc.job);  // nothing started before the result came back
  proto::ClientMessage st;
  st.mutable_status();
  Output status = s.OnFrame(Frame(st));
  REQUIRE(status.messages.size() == 1);
  CHECK(status.messages[0].message.has_status());
  // The task runs on another thread, as the server runs it.
  std::shared_ptr<jobs::PreparedJob> prepared;
  std::thread([&] { prepared = o.prepare->task(); }).join();
  o = s.OnSubmitPrepared(o.prepare->seq, prepared);
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.has_accepted());
  CHECK(o.messages[0].pass_fd == 42);
  CHECK(s.has_job());
}

TEST_CASE("async submit: a refusal comes back as the error and the session stays usable") {
  FakeService svc;
  svc.refuse = true;
  DaemonControl control;
  control.async_submit = true;
  SessionLogic s(
      &svc, Peer(), [] {}, &control);
  (void)s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(Submit()));
  REQUIRE(o.prepare);
  o = s.OnSubmitPrepared(o.prepare->seq, o.prepare->task());
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.error().code() == proto::Error::INVALID_CONFIG);
  CHECK_FALSE(o.close);
  svc.refuse = false;
  o = s.OnFrame(Frame(Submit()));
  REQUIRE(o.prepare);
  o = s.OnSubmitPrepared(o.prepare->seq, o.prepare->task());
  CHECK(o.messages[0].message.has_accepted());
}

TEST_CASE("async submit: a disconnect, EndJob or a drain meanwhile start nothing") {
  FakeService svc;
  DaemonControl control;
  control.async_submit = true;
  SECTION("disconnect") {
    SessionLogic s(
        &svc, Peer(), [] {}, &control);
    (void)s.OnFrame(Frame(Hello()));
    Output o = s.OnFrame(Frame(Submit()));
    REQUIRE(o.prepare);
    s.OnDisconnect();
    CHECK(s.OnSubmitPrepared(o.prepare->seq, o.prepare->task()).messages.empty());
    CHECK_FALSE(svc.job);
  }
  SECTION("EndJob abandons it, and a new submit is answered") {
    SessionLogic s(
        &svc, Peer(), [] {}, &control);
    (void)s.OnFrame(Frame(Hello()));
    Output first = s.OnFrame(Frame(Submit()));
    REQUIRE(first.prepare);
    proto::ClientMessage end;
    end.mutable_end_job();
    CHECK_FALSE(s.OnFrame(Frame(end)).close);
    CHECK_FALSE(s.submitting());
    CHECK(s.OnSubmitPrepared(first.prepare->seq, first.prepare->task()).messages.empty());
    CHECK_FALSE(svc.job);
    Output second = s.OnFrame(Frame(Submit()));
    REQUIRE(second.prepare);
    CHECK(second.prepare->seq != first.prepare->seq);
    Output o = s.OnSubmitPrepared(second.prepare->seq, second.prepare->task());
    CHECK(o.messages[0].message.has_accepted());
  }
  SECTION("a drain that began meanwhile refuses it with SHUTTING_DOWN") {
    SessionLogic s(
        &svc, Peer(), [] {}, &control);
    (void)s.OnFrame(Frame(Hello()));
    Output o = s.OnFrame(Frame(Submit()));
    REQUIRE(o.prepare);
    control.draining = true;
    control.drain_reason = "SIGTERM";
    o = s.OnSubmitPrepared(o.prepare->seq, o.prepare->task());
    REQUIRE(o.messages.size() == 1);
    CHECK(o.messages[0].message.error().code() == proto::Error::SHUTTING_DOWN);
    CHECK_FALSE(o.close);
    CHECK_FALSE(svc.job);
  }
}

TEST_CASE("async submit: a second submit or a release before JobAccepted closes the session") {
  FakeService svc;
  DaemonControl control;
  control.async_submit = true;
  for (int variant = 0; variant < 2; ++variant) {
    SessionLogic s(
        &svc, Peer(), [] {}, &control);
    (void)s.OnFrame(Frame(Hello()));
    Output p = s.OnFrame(Frame(Submit()));
    REQUIRE(p.prepare);
    Output o = s.OnFrame(Frame(variant == 0 ? Submit() : Release(0, 100)));
    CHECK(o.close);
    CHECK(s.closed());
    CHECK(s.OnSubmitPrepared(p.prepare->seq, p.prepare->task()).messages.empty());
    CHECK_FALSE(svc.job);
  }
}

TEST_CASE("a Release before any job closes the session, a late one after a job ended does not") {
  FakeService svc;
  SessionLogic s(&svc, Peer(), [] {});
  (void)s.OnFrame(Frame(Hello()));
  Output o = s.OnFrame(Frame(Release(0, 100)));
  CHECK(o.close);
  REQUIRE(o.messages.size() == 1);
  CHECK(o.messages[0].message.error().code() == proto::Error::BAD_REQUEST);
  CHECK_THAT(o.messages[0].message.error().message(), Catch::Contains("Release without a job"));

  SessionLogic t(&svc, Peer(), [] {});
  (void)t.OnFrame(Frame(Hello()));
  (void)t.OnFrame(Frame(Submit()));
  proto::ClientMessage end;
  end.mutable_end_job();
  (void)t.OnFrame(Frame(end));
  o = t.OnFrame(Frame(Release(0, 100)));
  CHECK_FALSE(o.close);
  CHECK(o.messages.empty());
}

}  // namespace
}  // namespace spdl::server

// ---------------- a shared node: log lines, decode memory inside the budget ----------------

#include "jobs/memory_budget.h"
#include "jobs/sample_decoder.h"

namespace spdl::server {
namespace {

TEST_CASE("EscapeForLog: a client's text cannot forge log lines or send terminal escapes") {
  CHECK(EscapeForLog("job.yaml") == "job.yaml");
  CHECK(EscapeForLog("a\nFAKE: spdld ready") == "a | FAKE: spdld ready");
  CHECK(EscapeForLog("\x1b[31mred\r") == "\\x1b[31mred\\x0d");
  CHECK(EscapeForLog(std::string(5000, 'x'), 100).size() < 130);
}

TEST_CASE("MemoryBudget: decode scratch comes out of the budget the slots also spend") {
  jobs::MemoryBudget b(100 << 20);
  b.SetSlotBytes(60 << 20);
  auto a = b.ReserveScratch(30 << 20, "PNG image 2000x2000", std::chrono::milliseconds(0));
  REQUIRE(a.ok());
  CHECK(b.scratch_bytes() == (30u << 20));
  // 60 + 30 + 20 > 100: refused after the wait, naming the need and the budget.
  const auto t0 = std::chrono::steady_clock::now();
  auto c = b.ReserveScratch(20 << 20, "PNG image 3000x3000", std::chrono::milliseconds(200));
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(200));
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(c.status().message(), Catch::Contains("PNG image 3000x3000") && Catch::Contains("more than is free"));
  // It waits for room: the first lease ends meanwhile.
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    a = jobs::MemoryBudget::Lease();
  });
  auto d = b.ReserveScratch(20 << 20, "PNG image 3000x3000", std::chrono::milliseconds(5000));
  later.join();
  CHECK(d.ok());
  CHECK(b.scratch_bytes() == (20u << 20));
  // More than the whole budget: refused at once.
  auto e = b.ReserveScratch(200 << 20, "PNG image 13000x13000", std::chrono::milliseconds(5000));
  REQUIRE_FALSE(e.ok());
  CHECK_THAT(e.status().message(), Catch::Contains("whole memory budget"));
}

TEST_CASE("EstimateDecodeScratch: from the header, 16-bit PNGs at 8 bytes per pixel") {
  // A PNG signature and IHDR for 13000x13000, 16-bit RGBA (only the header is read).
  std::vector<uint8_t> png = {0x89, 'P',  'N',  'G', 0x0D, 0x0A, 0x1A, 0x0A, 0, 0, 0, 13, 'I', 'H', 'D', 'R', 0,
                              0,    0x32, 0xC8, 0,   0,    0x32, 0xC8, 16,   6, 0, 0, 0,  0,   0,   0,   0};
  CHECK(jobs::EstimateDecodeScratch(png) == uint64_t{13000} * 13000 * 8 * 2);
  png[24] = 8;
  CHECK(jobs::EstimateDecodeScratch(png) == uint64_t{13000} * 13000 * 4 * 2);
  // A JPEG's SOF0: 4000x3000.
  std::vector<uint8_t> jpeg = {0xFF, 0xD8, 0xFF, 0xE0, 0,    4,    0, 0, 0xFF, 0xC0, 0,
                               11,   8,    0x0B, 0xB8, 0x0F, 0xA0, 3, 0, 0,    0};
  CHECK(jobs::EstimateDecodeScratch(jpeg) == uint64_t{4000} * 3000 * 3 * 2);
  CHECK(jobs::EstimateDecodeScratch(std::vector<uint8_t>{1, 2, 3}) == 0);
}

}  // namespace
}  // namespace spdl::server
