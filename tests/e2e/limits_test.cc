// Limits end to end: a real spdld with small limits in its config, real clients. Each limit —
// max_frame_bytes, max_jobs_per_client, max_slots_per_job, memory_budget_bytes — refuses what
// exceeds it with a message naming it, and a refused job is never half-started: the daemon's live
// jobs, shared memory in use and open descriptors are as before, and the jobs already running go on.
#include <catch2/catch.hpp>
#include <filesystem>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "spdl/client.h"
#include "spdl/control.h"

namespace spdl {
namespace {

using testing::DaemonProcess;
using testing::TempDir;
using testing::WriteFile;

struct Fixture {
  explicit Fixture(const std::string& limits) {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 10;
    o.min_side = 60;
    o.max_side = 120;
    REQUIRE(testdata::MakeImageFolder(root(), o).ok());
    WriteFile(dir.path + "/spdld.yaml",
              "socket_path: " + socket() + "\nallowed_roots: [" + root() + "]\nworker_threads: 2\n" + limits);
    daemon.emplace(socket(), std::vector<std::string>{"--config", dir.path + "/spdld.yaml"});
    REQUIRE(daemon->Connectable());
  }
  std::string root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  // A job of `side` x `side` RGB images in batches of `batch` with `prefetch` slots.
  client::Options Job(int prefetch, int side = 32, int batch = 4, uint32_t epochs = 0) const {
    client::Options o;
    o.socket_path = socket();
    o.config_yaml = "source: {type: image_folder, root: " + root() + "}\nbatch: {size: " + std::to_string(batch) +
                    "}\ntransforms: [{resize: {height: " + std::to_string(side) + ", width: " + std::to_string(side) +
                    "}}]\nprefetch: " + std::to_string(prefetch) + "\n";
    o.config_name = "job.yaml";
    o.epochs = epochs;
    return o;
  }
  proto::DaemonStatus Status() const {
    proto::ClientMessage req;
    req.mutable_status();
    auto r = client::ControlCall(socket(), req);
    REQUIRE(r.ok());
    return r->status();
  }
  TempDir dir;
  std::optional<DaemonProcess> daemon;
};

// The daemon's state that a refused job must not change.
struct Snapshot {
  explicit Snapshot(const Fixture& f) {
    auto s = f.Status();
    live_jobs = s.live_jobs();
    memory_in_use = s.memory_in_use_bytes();
    // The status call's own connection closes asynchronously: wait for the count to settle.
    fds = testing::FdCount(f.daemon->pid());
    for (int i = 0, prev = -2; i < 50 && fds != prev; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      prev = fds;
      fds = testing::FdCount(f.daemon->pid());
    }
  }
  bool operator==(const Snapshot&) const = default;
  uint32_t live_jobs = 0;
  uint64_t memory_in_use = 0;
  int fds = 0;
};

// True once the daemon's state equals `before` again (within 2 s).
bool Settles(const Fixture& f, const Snapshot& before) {
  for (int i = 0; i < 100; ++i) {
    if (Snapshot(f) == before) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A job that is running: it delivers its next batch.
void CheckAlive(client::Loader& l) {
  auto ev = l.Next();
  REQUIRE(ev.ok());
  CHECK((std::holds_alternative<client::Batch>(*ev) || std::holds_alternative<client::EpochEnd>(*ev)));
}

TEST_CASE("a job over max_jobs_per_client is refused naming the limit and the others run on") {
  Fixture f("max_jobs_per_client: 2\n");
  auto a = client::Loader::Open(f.Job(2));
  auto b = client::Loader::Open(f.Job(2));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const Snapshot before(f);
  CHECK(before.live_jobs == 2);
  auto c = client::Loader::Open(f.Job(2));
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(c.status().message(), Catch::Contains("max_jobs_per_client"));
  CHECK(Settles(f, before));
  CheckAlive(**a);
  CheckAlive(**b);
  // A finished job frees its place.
  a->reset();
  bool admitted = false;
  for (int i = 0; i < 200 && !admitted; ++i) {
    admitted = client::Loader::Open(f.Job(2)).ok();
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(admitted);
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

TEST_CASE("a job asking for more slots than max_slots_per_job is refused naming the limit") {
  Fixture f("max_slots_per_job: 3\n");
  const Snapshot before(f);
  auto l = client::Loader::Open(f.Job(4));
  REQUIRE_FALSE(l.ok());
  CHECK(l.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(l.status().message(), Catch::Contains("max_slots_per_job") && Catch::Contains("prefetch 4"));
  CHECK(Settles(f, before));
  auto ok = client::Loader::Open(f.Job(3));
  REQUIRE(ok.ok());
  CHECK((*ok)->info().num_slots == 3);
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// Without a GPU (CI): a cuda job is refused with a clear message on both sides, and leaves nothing.
// On a GPU machine the copy: daemon job is admitted by the daemon, and a plain Loader refuses it,
// pointing at the GPU layer (GpuLoader) that delivers it (tests/gpu, tests/e2e/gpu_e2e_test.cc).
TEST_CASE("a cuda job is refused clearly where it cannot be delivered and never half-started") {
  Fixture f("");
  const Snapshot before(f);
  SECTION("copy: daemon") {
    client::Options o = f.Job(2);
    o.config_yaml += "output: {device: cuda:0}\n";
    auto l = client::Loader::Open(o);
    REQUIRE_FALSE(l.ok());
    INFO(l.status().message());
    CHECK_THAT(l.status().message(), Catch::Contains("cuda:0"));
    CHECK_THAT(l.status().message(), Catch::Contains("CUDA device(s)") || Catch::Contains("built without CUDA") ||
                                         Catch::Contains("delivers batches in host memory only"));
  }
  SECTION("copy: client") {
    client::Options o = f.Job(2);
    o.config_yaml += "output: {device: cuda:0, copy: client}\n";
    auto l = client::Loader::Open(o);
    REQUIRE_FALSE(l.ok());
    CHECK(l.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(l.status().message(), Catch::Contains("output.device is cuda:0 (copy: client)"));
  }
  CHECK(Settles(f, before));
  CheckAlive(**client::Loader::Open(f.Job(2)));
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

TEST_CASE("a job that would exceed the memory budget is refused naming it, never half-started") {
  // Each job: 2 slots of 8 x 256 x 256 x 3 bytes (1.5 MiB) plus labels and a header: ~3 MiB.
  Fixture f("memory_budget_bytes: 4MiB\n");
  auto first = client::Loader::Open(f.Job(2, 256, 8));
  REQUIRE(first.ok());
  const Snapshot before(f);
  CHECK(before.memory_in_use > 3u << 20);
  auto second = client::Loader::Open(f.Job(2, 256, 8));
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(second.status().message(), Catch::Contains("memory_budget"));
  CHECK(Settles(f, before));
  CheckAlive(**first);
  // A job that fits what is left is admitted.
  auto small = client::Loader::Open(f.Job(2, 32, 4));
  CHECK(small.ok());
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

TEST_CASE("a control message over max_frame_bytes closes that session with an error naming the limit") {
  Fixture f("max_frame_bytes: 1KiB\n");
  const Snapshot before(f);
  SECTION("a job config bigger than the limit, from the real client") {
    auto o = f.Job(2);
    o.config_yaml += "# " + std::string(2000, 'x') + "\n";
    auto l = client::Loader::Open(o);
    REQUIRE_FALSE(l.ok());
    CHECK_THAT(l.status().message(), Catch::Contains("max_frame_bytes") && Catch::Contains("1024"));
  }
  SECTION("a frame header announcing 64 MiB, by hand") {
    testing::RawConnection c(f.socket());
    REQUIRE(c.connected());
    REQUIRE(c.SendHello());
    auto hello = c.Receive();
    REQUIRE(hello);
    REQUIRE(hello->has_hello());
    const uint32_t n = 64u << 20;
    std::string header(reinterpret_cast<const char*>(&n), 4);  // little-endian on every host we build for
    REQUIRE(c.SendBytes(header));
    std::vector<proto::DaemonMessage> seen;
    CHECK(c.WaitClosed(&seen));
    REQUIRE(seen.size() == 1);
    CHECK(seen[0].has_error());
    CHECK_THAT(seen[0].error().message(), Catch::Contains("max_frame_bytes"));
  }
  // Nothing was started, and the daemon serves a job that fits.
  CHECK(Settles(f, before));
  auto ok = client::Loader::Open(f.Job(2));
  CHECK(ok.ok());
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
