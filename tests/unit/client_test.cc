// The client library against a fake daemon: a thread in this process that listens on a temporary
// Unix socket, speaks the control protocol with the real framing code, and hands out a memfd region
// over SCM_RIGHTS, as spdld does.
#include "spdl/client.h"

#include <dirent.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/unique_fd.h"
#include "proto/control.pb.h"
#include "proto/framing.h"
#include "proto/shm_layout.h"
#include "temp_dir.h"

namespace spdl::client {
namespace {

using proto::ClientMessage;
using proto::DaemonMessage;

constexpr uint32_t kBatchSize = 2;
constexpr uint32_t kSlots = 2;
// image uint8 [2, 4, 4, 3] and label int64 [2].
constexpr uint64_t kImageBytes = kBatchSize * 4 * 4 * 3;
constexpr uint64_t kLabelBytes = kBatchSize * 8;

uint8_t PixelByte(uint32_t slot, uint64_t i) { return static_cast<uint8_t>(slot * 100 + i); }

// A memfd region laid out as the daemon would: header page, then kSlots slots holding known bytes.
struct FakeRegion {
  UniqueFd fd;
  proto::SlotLayout layout;
  uint8_t* data = nullptr;

  explicit FakeRegion(uint64_t magic = proto::kRegionMagic) {
    layout = proto::ComputeSlotLayout({kImageBytes, kLabelBytes}, kSlots);
    fd.reset(::memfd_create("client_test", MFD_CLOEXEC));
    REQUIRE(fd.valid());
    REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(layout.region_bytes)) == 0);
    void* p = ::mmap(nullptr, layout.region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    REQUIRE(p != MAP_FAILED);
    data = static_cast<uint8_t*>(p);
    proto::RegionHeader h{
        magic, proto::kProtocolVersion, kSlots, layout.slots_offset, layout.slot_stride, layout.region_bytes};
    std::memcpy(data, &h, sizeof(h));
    for (uint32_t s = 0; s < kSlots; ++s) {
      uint8_t* img = data + layout.SlotOffset(s) + layout.tensor_offsets[0];
      for (uint64_t i = 0; i < kImageBytes; ++i) img[i] = PixelByte(s, i);
      auto* lab = reinterpret_cast<int64_t*>(data + layout.SlotOffset(s) + layout.tensor_offsets[1]);
      for (uint32_t r = 0; r < kBatchSize; ++r) lab[r] = s * 10 + r;
    }
  }
  ~FakeRegion() { ::munmap(data, layout.region_bytes); }

  DaemonMessage Accepted() const {
    DaemonMessage m;
    auto* a = m.mutable_accepted();
    a->set_job_id(42);
    a->set_num_slots(kSlots);
    a->set_slots_offset(layout.slots_offset);
    a->set_slot_stride(layout.slot_stride);
    a->set_region_bytes(layout.region_bytes);
    a->set_batch_size(kBatchSize);
    a->set_batches_per_epoch(2);
    a->set_samples_per_epoch(3);
    a->set_dataset_size(3);
    auto* img = a->add_tensors();
    img->set_name("image");
    img->set_dtype(proto::UINT8);
    for (int64_t d : {int64_t{kBatchSize}, int64_t{4}, int64_t{4}, int64_t{3}}) img->add_shape(d);
    img->set_offset(layout.tensor_offsets[0]);
    img->set_bytes(kImageBytes);
    auto* lab = a->add_tensors();
    lab->set_name("label");
    lab->set_dtype(proto::INT64);
    lab->add_shape(kBatchSize);
    lab->set_offset(layout.tensor_offsets[1]);
    lab->set_bytes(kLabelBytes);
    return m;
  }
};

DaemonMessage BatchMsg(uint32_t slot, uint64_t generation, uint64_t seq, uint32_t rows) {
  DaemonMessage m;
  auto* b = m.mutable_batch();
  b->set_slot(slot);
  b->set_generation(generation);
  b->set_seq(seq);
  b->set_epoch(0);
  b->set_batch_in_epoch(seq);
  b->set_rows(rows);
  for (uint32_t r = 0; r < rows; ++r) {
    b->add_paths("class" + std::to_string(r) + "/img" + std::to_string(seq * kBatchSize + r) + ".jpg");
    b->add_labels(static_cast<int64_t>(slot) * 10 + r);
  }
  return m;
}

DaemonMessage EpochEndMsg() {
  DaemonMessage m;
  auto* e = m.mutable_epoch_end();
  e->set_epoch(0);
  e->set_samples(3);
  e->set_batches(2);
  e->set_skipped(1);
  e->set_seconds(0.5);
  return m;
}

DaemonMessage JobEndMsg() {
  DaemonMessage m;
  auto* s = m.mutable_job_end()->mutable_stats();
  s->set_samples(3);
  s->set_batches(2);
  s->set_skipped(1);
  s->set_seconds(1.5);
  s->set_first_batch_seconds(0.25);
  auto* st = s->add_stages();
  st->set_name("decode");
  st->set_tasks(4);
  st->set_failures(1);
  st->set_busy_seconds(0.75);
  return m;
}

DaemonMessage ErrorMsg(proto::Error::Code code, const std::string& message) {
  DaemonMessage m;
  m.mutable_error()->set_code(code);
  m.mutable_error()->set_message(message);
  return m;
}

// Catch2 v2's assertions are not thread-safe: the fake daemon's thread throws instead, which ends
// its script (closing the connection, so the client sees EOF) and marks the FakeDaemon failed.
#define FAKE_EXPECT(cond)                                                                    \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw std::runtime_error(std::string("fake daemon: expected ") + #cond + " at line " + \
                               std::to_string(__LINE__));                                    \
  } while (0)

// The daemon's end of one connection, used from the fake daemon's thread.
class Peer {
 public:
  explicit Peer(UniqueFd fd) : fd_(std::move(fd)) {}

  // Sends one frame, with `fds` attached (SCM_RIGHTS) when there are any.
  void Send(const DaemonMessage& m, const std::vector<int>& fds = {}) {
    std::string frame;
    FAKE_EXPECT(proto::EncodeFrame(m, &frame));
    iovec iov{frame.data(), frame.size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 4)] = {};
    if (!fds.empty()) {
      mh.msg_control = cbuf;
      mh.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&mh);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(fd_.get(), &mh, MSG_NOSIGNAL);
    FAKE_EXPECT(n == static_cast<ssize_t>(frame.size()));
  }

  // The next client message; Release messages are recorded (and returned too). MSG_NOT_SET on
  // EOF or after 10 s of silence.
  ClientMessage Read() {
    std::string payload;
    for (;;) {
      if (parser_.Next(&payload) == proto::FrameParser::Result::kFrame) {
        ClientMessage m;
        FAKE_EXPECT(proto::ParseClientMessage(payload, &m));
        if (m.has_release()) {
          std::lock_guard<std::mutex> lock(mu_);
          releases_.emplace_back(m.release().slot(), m.release().generation());
        }
        return m;
      }
      pollfd pfd{fd_.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 10'000) <= 0) return {};
      char buf[4096];
      const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
      if (n <= 0) return {};
      parser_.Feed(buf, static_cast<size_t>(n));
    }
  }

  // Reads until a message of `which` kind arrives (REQUIREd).
  ClientMessage ReadUntil(ClientMessage::MsgCase which) {
    for (;;) {
      ClientMessage m = Read();
      FAKE_EXPECT(m.msg_case() != ClientMessage::MSG_NOT_SET);
      if (m.msg_case() == which) return m;
    }
  }

  // Reads (recording releases) until the client hangs up.
  void DrainUntilEof() {
    while (Read().msg_case() != ClientMessage::MSG_NOT_SET) {
    }
  }

  size_t release_count() {
    std::lock_guard<std::mutex> lock(mu_);
    return releases_.size();
  }
  std::vector<std::pair<uint32_t, uint64_t>> releases() {
    std::lock_guard<std::mutex> lock(mu_);
    return releases_;
  }

  void Close() { fd_.reset(); }

  // The usual opening: Hello -> HelloReply, then SubmitJob (returned).
  proto::SubmitJob Greet() {
    ClientMessage hello = Read();
    FAKE_EXPECT(hello.has_hello());
    FAKE_EXPECT(hello.hello().protocol_version() == proto::kProtocolVersion);
    DaemonMessage reply;
    reply.mutable_hello()->set_protocol_version(proto::kProtocolVersion);
    reply.mutable_hello()->set_daemon_version("fake");
    Send(reply);
    ClientMessage submit = Read();
    FAKE_EXPECT(submit.has_submit());
    return submit.submit();
  }

 private:
  UniqueFd fd_;
  proto::FrameParser parser_;
  std::mutex mu_;
  std::vector<std::pair<uint32_t, uint64_t>> releases_;
};

// Listens on a fresh socket in a temporary directory; serves one connection with `script` on its
// own thread. Join() (or the destructor) waits for the script.
class FakeDaemon {
 public:
  explicit FakeDaemon(std::function<void(Peer&)> script) {
    path_ = dir_ / "spdld.sock";
    UniqueFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(listener.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size());
    REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(listener.get(), 4) == 0);
    thread_ = std::thread([this, l = std::move(listener), script = std::move(script)]() mutable {
      pollfd pfd{l.get(), POLLIN, 0};
      if (::poll(&pfd, 1, 10'000) <= 0) return;  // the client never came
      UniqueFd conn(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!conn) return;
      peer_ = std::make_unique<Peer>(std::move(conn));
      try {
        script(*peer_);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu_);
        error_ = e.what();
      }
      peer_->Close();
    });
  }
  ~FakeDaemon() { Join(); }

  const std::string& path() const { return path_; }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }
  // REQUIRES: Join() returned.
  std::vector<std::pair<uint32_t, uint64_t>> releases() { return peer_ ? peer_->releases() : decltype(releases()){}; }
  // REQUIRES: Join() returned. Empty when the script ran to its end.
  std::string error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

 private:
  const testing::TempDir dir_;  // removed after the thread has been joined
  std::string path_;
  std::thread thread_;
  std::unique_ptr<Peer> peer_;
  std::mutex mu_;
  std::string error_;
};

Options TestOptions(const std::string& socket) {
  Options o;
  o.socket_path = socket;
  o.config_yaml = "source: {folder: /data}\n";
  o.config_name = "job.yaml";
  return o;
}

int CountOpenFds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  REQUIRE(d != nullptr);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

bool Inside(const void* p, size_t bytes, const Loader& l) {
  const auto* b = static_cast<const uint8_t*>(l.region_data());
  const auto* q = static_cast<const uint8_t*>(p);
  return q >= b && q + bytes <= b + l.region_size();
}

template <typename T>
T Take(Result<Event> ev) {
  INFO(ev.status().ToString());
  REQUIRE(ev.ok());
  REQUIRE(std::holds_alternative<T>(*ev));
  return std::get<T>(std::move(ev).value());
}

TEST_CASE("connecting to a missing socket says the daemon is not running") {
  const testing::TempDir dir;
  const std::string path = dir / "nobody.sock";
  auto r = Loader::Open(TestOptions(path));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::StartsWith("cannot connect to spdld at " + path + ": "));
  CHECK_THAT(r.status().message(), Catch::EndsWith("(is the daemon running?)"));
}

TEST_CASE("bad options are refused before connecting") {
  Options o = TestOptions("/nonexistent.sock");
  o.rank = 2;
  o.world_size = 2;
  auto r = Loader::Open(o);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  o = TestOptions(std::string(200, 'x'));
  r = Loader::Open(o);
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(r.status().message(), Catch::Contains("too long"));
}

TEST_CASE("a protocol version mismatch surfaces the daemon's message") {
  SECTION("the daemon refuses the Hello") {
    FakeDaemon d([](Peer& p) {
      FAKE_EXPECT(p.Read().has_hello());
      p.Send(ErrorMsg(proto::Error::VERSION_MISMATCH, "client speaks protocol 1, spdld 0.2 speaks 2"));
    });
    auto r = Loader::Open(TestOptions(d.path()));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK(r.status().message() == "client speaks protocol 1, spdld 0.2 speaks 2");
  }
  SECTION("the daemon answers with another version") {
    FakeDaemon d([](Peer& p) {
      FAKE_EXPECT(p.Read().has_hello());
      DaemonMessage reply;
      reply.mutable_hello()->set_protocol_version(99);
      reply.mutable_hello()->set_daemon_version("9.9");
      p.Send(reply);
      p.DrainUntilEof();
    });
    auto r = Loader::Open(TestOptions(d.path()));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.status().message(), Catch::Contains("spdld 9.9") && Catch::Contains("speaks 99"));
  }
}

TEST_CASE("config errors are listed one per line") {
  FakeDaemon d([](Peer& p) {
    proto::SubmitJob s = p.Greet();
    FAKE_EXPECT(s.config_name() == "job.yaml");
    // As spdld words it: a summary line, then the list, which also comes as config_errors.
    DaemonMessage m = ErrorMsg(proto::Error::INVALID_CONFIG,
                               "invalid job config job.yaml:\n"
                               "job.yaml:3:5: transforms.0.resize.shorter: must be > 0, got -1\n"
                               "job.yaml: batch_size: not an integer: \"x\"");
    auto* e1 = m.mutable_error()->add_config_errors();
    e1->set_line(3);
    e1->set_column(5);
    e1->set_path("transforms.0.resize.shorter");
    e1->set_message("must be > 0, got -1");
    auto* e2 = m.mutable_error()->add_config_errors();
    e2->set_path("batch_size");
    e2->set_message("not an integer: \"x\"");
    p.Send(m);
  });
  auto r = Loader::Open(TestOptions(d.path()));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message() ==
        "invalid job config job.yaml:\n"
        "job.yaml:3:5: transforms.0.resize.shorter: must be > 0, got -1\n"
        "job.yaml: batch_size: not an integer: \"x\"");
}

TEST_CASE("the trainer's S3 access goes only with a job that may read s3://") {
  ::setenv("AWS_ACCESS_KEY_ID", "AKIDTESTKEY", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "test-secret", 1);
  for (const bool s3 : {false, true}) {
    CAPTURE(s3);
    bool sent = false;
    std::string key;
    FakeDaemon d([&](Peer& p) {
      proto::SubmitJob s = p.Greet();
      sent = s.has_s3();
      key = s.s3().access_key_id();
      p.Send(ErrorMsg(proto::Error::INVALID_CONFIG, "stop here"));
    });
    Options o = TestOptions(d.path());
    o.config_yaml =
        s3 ? "source: {type: tar, shards: 's3://b/train-{0..3}.tar'}\n" : "source: {type: image_folder, root: /data}\n";
    auto r = Loader::Open(o);
    CHECK_FALSE(r.ok());
    d.Join();
    CHECK(d.error() == "");
    CHECK(sent == s3);
    CHECK(key == (s3 ? "AKIDTESTKEY" : ""));
  }
  ::unsetenv("AWS_ACCESS_KEY_ID");
  ::unsetenv("AWS_SECRET_ACCESS_KEY");
}

TEST_CASE("batches are zero-copy views of the slots, released exactly once") {
  FakeRegion region;
  proto::SubmitJob submitted;
  FakeDaemon d([&](Peer& p) {
    submitted = p.Greet();
    p.Send(region.Accepted(), {region.fd.get()});
    p.Send(BatchMsg(0, 7, 0, 2));
    p.Send(BatchMsg(1, 8, 1, 1));  // the last, partial batch
    p.Send(EpochEndMsg());
    p.Send(JobEndMsg());
    p.DrainUntilEof();
  });
  Options o = TestOptions(d.path());
  o.overrides = {{"transforms.0.resize.shorter", "128"}, {"batch_size", "2"}};
  o.rank = 1;
  o.world_size = 4;
  o.epochs = 3;
  {
    auto opened = Loader::Open(o);
    INFO(opened.status().ToString());
    REQUIRE(opened.ok());
    Loader& l = **opened;

    const JobInfo& info = l.info();
    CHECK(info.job_id == 42);
    CHECK(info.batch_size == kBatchSize);
    CHECK(info.num_slots == kSlots);
    CHECK(info.batches_per_epoch == 2);
    CHECK(info.samples_per_epoch == 3);
    CHECK(info.dataset_size == 3);
    REQUIRE(info.layout.size() == 2);
    CHECK(info.layout[0].name == "image");
    CHECK(info.layout[0].dtype == DType::kUInt8);
    CHECK(info.layout[0].shape == std::vector<int64_t>{2, 4, 4, 3});
    CHECK(info.layout[0].bytes == kImageBytes);
    CHECK(info.layout[0].data == nullptr);
    CHECK(info.layout[1].dtype == DType::kInt64);
    CHECK(l.region_size() == region.layout.region_bytes);

    {
      Batch b0 = Take<Batch>(l.Next());
      CHECK(b0.seq() == 0);
      CHECK(b0.slot() == 0);
      CHECK(b0.generation() == 7);
      CHECK(b0.rows() == 2);
      CHECK(b0.paths() == std::vector<std::string>{"class0/img0.jpg", "class1/img1.jpg"});
      CHECK(b0.labels() == std::vector<int64_t>{0, 1});
      REQUIRE(b0.tensors().size() == 2);
      const TensorView* img = b0.tensor("image");
      REQUIRE(img != nullptr);
      CHECK(b0.tensor("nope") == nullptr);
      CHECK(img->shape == std::vector<int64_t>{2, 4, 4, 3});
      CHECK(img->bytes == kImageBytes);
      CHECK(Inside(img->data, img->bytes, l));
      CHECK(img->data == static_cast<const uint8_t*>(l.region_data()) + region.layout.SlotOffset(0) +
                             region.layout.tensor_offsets[0]);
      bool same = true;
      for (uint64_t i = 0; i < kImageBytes; ++i) same &= static_cast<uint8_t*>(img->data)[i] == PixelByte(0, i);
      CHECK(same);
      // Zero copy: a byte the daemon writes now shows through the batch.
      region.data[region.layout.SlotOffset(0) + region.layout.tensor_offsets[0]] = 0xab;
      CHECK(static_cast<uint8_t*>(img->data)[0] == 0xab);
      const TensorView* lab = b0.tensor("label");
      REQUIRE(lab != nullptr);
      CHECK(Inside(lab->data, lab->bytes, l));
      CHECK(static_cast<int64_t*>(lab->data)[1] == 1);
      CHECK_FALSE(b0.released());
    }  // destroyed: Release{0, 7}

    Batch b1 = Take<Batch>(l.Next());
    CHECK(b1.slot() == 1);
    CHECK(b1.rows() == 1);
    CHECK(b1.paths().size() == 1);
    const TensorView* img1 = b1.tensor("image");
    REQUIRE(img1 != nullptr);
    CHECK(img1->shape == std::vector<int64_t>{1, 4, 4, 3});
    CHECK(img1->bytes == kImageBytes / kBatchSize);
    CHECK(static_cast<uint8_t*>(img1->data)[5] == PixelByte(1, 5));
    Batch moved = std::move(b1);
    CHECK(b1.released());  // NOLINT(bugprone-use-after-move): a moved-from batch holds nothing
    CHECK_FALSE(moved.released());
    moved.Release();
    moved.Release();
    CHECK(moved.released());

    EpochEnd e = Take<EpochEnd>(l.Next());
    CHECK(e.epoch == 0);
    CHECK(e.samples == 3);
    CHECK(e.batches == 2);
    CHECK(e.skipped == 1);
    CHECK(e.seconds == 0.5);

    JobStats js = Take<JobStats>(l.Next());
    CHECK(js.samples == 3);
    CHECK(js.first_batch_seconds == 0.25);
    REQUIRE(js.stages.size() == 1);
    CHECK(js.stages[0].name == "decode");
    CHECK(js.stages[0].failures == 1);
    CHECK(l.finished());

    auto after = l.Next();
    REQUIRE_FALSE(after.ok());
    CHECK(after.status().code() == StatusCode::kFailedPrecondition);
    CHECK(l.End().ok());  // nothing to end
  }                       // moved (released) is destroyed: no second release
  d.Join();
  CHECK(d.error() == "");
  CHECK(d.releases() == std::vector<std::pair<uint32_t, uint64_t>>{{0, 7}, {1, 8}});

  CHECK(submitted.config_yaml() == o.config_yaml);
  CHECK(submitted.rank() == 1);
  CHECK(submitted.world_size() == 4);
  CHECK(submitted.epochs() == 3);
  REQUIRE(submitted.overrides_size() == 2);
  CHECK(submitted.overrides(0).path() == "transforms.0.resize.shorter");
  CHECK(submitted.overrides(0).value() == "128");
}

TEST_CASE("batches may be released from other threads while Next() blocks") {
  FakeRegion region;
  FakeDaemon d([&](Peer& p) {
    p.Greet();
    p.Send(region.Accepted(), {region.fd.get()});
    p.Send(BatchMsg(0, 7, 0, 2));
    p.Send(BatchMsg(1, 8, 1, 2));
    // Both slots are leased: the daemon waits for a release before reusing one.
    while (p.release_count() < 2) FAKE_EXPECT(p.Read().has_release());
    p.Send(BatchMsg(0, 9, 2, 2));
    p.Send(JobEndMsg());
    p.DrainUntilEof();
  });
  {
    auto opened = Loader::Open(TestOptions(d.path()));
    REQUIRE(opened.ok());
    Loader& l = **opened;
    Batch b0 = Take<Batch>(l.Next());
    Batch b1 = Take<Batch>(l.Next());
    // The releasers start after the main thread is (very likely) blocked in Next().
    std::thread t0([b = std::move(b0)]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      b.Release();
    });
    std::thread t1([b = std::move(b1)]() mutable {
      std::this_thread::sleep_for(std::chrono::milliseconds(80));
      Batch gone = std::move(b);  // released by the destructor, on this thread
    });
    Batch b2 = Take<Batch>(l.Next());
    CHECK(b2.generation() == 9);
    t0.join();
    t1.join();
    Take<JobStats>(l.Next());
  }
  d.Join();
  CHECK(d.error() == "");
  auto rel = d.releases();
  std::sort(rel.begin(), rel.end());
  CHECK(rel == std::vector<std::pair<uint32_t, uint64_t>>{{0, 7}, {0, 9}, {1, 8}});
}

TEST_CASE("a batch may outlive its loader") {
  FakeRegion region;
  FakeDaemon d([&](Peer& p) {
    p.Greet();
    p.Send(region.Accepted(), {region.fd.get()});
    p.Send(BatchMsg(1, 3, 0, 2));
    p.DrainUntilEof();
  });
  Batch kept;
  {
    auto opened = Loader::Open(TestOptions(d.path()));
    REQUIRE(opened.ok());
    kept = Take<Batch>((*opened)->Next());
  }  // the Loader is gone: the connection is closed
  d.Join();
  const TensorView* img = kept.tensor("image");
  REQUIRE(img != nullptr);
  bool same = true;
  for (uint64_t i = 0; i < kImageBytes; ++i) same &= static_cast<uint8_t*>(img->data)[i] == PixelByte(1, i);
  CHECK(same);
  CHECK_FALSE(kept.released());
  kept.Release();  // a no-op now
  CHECK(kept.released());
  CHECK(d.releases().empty());
}

TEST_CASE("the daemon closing the connection mid-job ends Next() at once") {
  FakeRegion region;
  std::promise<void> closed;
  FakeDaemon d([&](Peer& p) {
    p.Greet();
    p.Send(region.Accepted(), {region.fd.get()});
    p.Send(BatchMsg(0, 1, 0, 2));
    p.Close();
    closed.set_value();
  });
  auto opened = Loader::Open(TestOptions(d.path()));
  REQUIRE(opened.ok());
  Loader& l = **opened;
  Batch b = Take<Batch>(l.Next());
  closed.get_future().wait();
  b.Release();  // to a dead peer: EPIPE, not SIGPIPE
  const auto t0 = std::chrono::steady_clock::now();
  auto r = l.Next();
  const auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(r.status().message(), Catch::StartsWith("spdld closed the connection"));
  CHECK(waited < std::chrono::seconds(2));
  auto again = l.Next();  // sticky
  REQUIRE_FALSE(again.ok());
  CHECK(again.status().message() == r.status().message());
  CHECK(l.End().ok());  // the job is over anyway
}

TEST_CASE("a failed job reports the daemon's message") {
  FakeRegion region;
  FakeDaemon d([&](Peer& p) {
    p.Greet();
    p.Send(region.Accepted(), {region.fd.get()});
    p.Send(ErrorMsg(proto::Error::JOB_FAILED, "decoding train/x.jpg: not a JPEG file"));
    p.DrainUntilEof();
  });
  auto opened = Loader::Open(TestOptions(d.path()));
  REQUIRE(opened.ok());
  auto r = (*opened)->Next();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK(r.status().message() == "decoding train/x.jpg: not a JPEG file");
  CHECK((*opened)->Next().status().code() == StatusCode::kDataLoss);
}

TEST_CASE("a bad region or a missing descriptor is refused") {
  SECTION("bad magic") {
    FakeRegion region(0x1234);
    FakeDaemon d([&](Peer& p) {
      p.Greet();
      p.Send(region.Accepted(), {region.fd.get()});
      p.DrainUntilEof();
    });
    auto r = Loader::Open(TestOptions(d.path()));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInternal);
    CHECK_THAT(r.status().message(), Catch::Contains("magic"));
  }
  SECTION("a region smaller than announced") {
    FakeRegion region;
    FakeDaemon d([&](Peer& p) {
      p.Greet();
      DaemonMessage m = region.Accepted();
      m.mutable_accepted()->set_region_bytes(region.layout.region_bytes + proto::kPageBytes);
      p.Send(m, {region.fd.get()});
      p.DrainUntilEof();
    });
    auto r = Loader::Open(TestOptions(d.path()));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("smaller than"));
  }
  SECTION("no descriptor") {
    FakeRegion region;
    FakeDaemon d([&](Peer& p) {
      p.Greet();
      p.Send(region.Accepted());
      p.DrainUntilEof();
    });
    auto r = Loader::Open(TestOptions(d.path()));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("without the shared-memory descriptor"));
  }
}

TEST_CASE("End() stops the job early") {
  FakeRegion region;
  bool daemon_closes = GENERATE(false, true);
  FakeDaemon d([&](Peer& p) {
    p.Greet();
    p.Send(region.Accepted(), {region.fd.get()});
    p.Send(BatchMsg(0, 7, 0, 2));
    p.ReadUntil(ClientMessage::kEndJob);
    p.Send(BatchMsg(1, 8, 1, 2));  // was in flight
    p.Send(EpochEndMsg());
    if (daemon_closes) {  // without final stats, once the in-flight batch is back
      p.ReadUntil(ClientMessage::kRelease);
      return;
    }
    p.Send(JobEndMsg());
    p.DrainUntilEof();
  });
  {
    auto opened = Loader::Open(TestOptions(d.path()));
    REQUIRE(opened.ok());
    Loader& l = **opened;
    Batch b0 = Take<Batch>(l.Next());
    REQUIRE(l.End().ok());
    CHECK(l.End().ok());  // once is enough
    auto r = l.Next();
    if (daemon_closes) {
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().code() == StatusCode::kCancelled);
    } else {
      JobStats js = Take<JobStats>(std::move(r));
      CHECK(js.batches == 2);
    }
  }
  d.Join();
  CHECK(d.error() == "");
  auto rel = d.releases();
  REQUIRE_FALSE(rel.empty());
  CHECK(rel[0] == std::make_pair(uint32_t{1}, uint64_t{8}));  // the in-flight batch, at once
  if (!daemon_closes) CHECK(rel == std::vector<std::pair<uint32_t, uint64_t>>{{1, 8}, {0, 7}});
}

TEST_CASE("descriptors that come with the wrong frames are closed") {
  const int before = CountOpenFds();
  {
    FakeRegion region;
    FakeRegion extra1, extra2;
    FakeDaemon d([&](Peer& p) {
      p.Greet();
      p.Send(region.Accepted(), {region.fd.get(), extra1.fd.get()});
      p.Send(BatchMsg(0, 7, 0, 2), {extra2.fd.get()});
      p.Send(JobEndMsg());
      p.DrainUntilEof();
    });
    {
      auto opened = Loader::Open(TestOptions(d.path()));
      REQUIRE(opened.ok());
      Take<Batch>((*opened)->Next());
      Take<JobStats>((*opened)->Next());
      // Open: the socket and the region's descriptor (kept for Loader::region_fd()), which maps the
      // region (helper processes of the trainer map it through a dup).
      const off_t size = ::lseek((*opened)->region_fd(), 0, SEEK_END);
      REQUIRE(size >= 0);
      CHECK(static_cast<uint64_t>(size) >= (*opened)->region_size());
    }
    d.Join();
    CHECK(d.error() == "");
  }
  CHECK(CountOpenFds() == before);
}

}  // namespace
}  // namespace spdl::client
