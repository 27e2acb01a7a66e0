// Session robustness end to end, against a real spdld: a Submit whose source takes long to open
// does not hold up the other sessions (SPDLD_TEST_OPEN_GATE holds the opening of every job whose
// config_name starts with "gated" until a file exists); a Release before any job closes the session; share groups that
// wait for members that never come start after share_wait_seconds; the acceptor survives running out of descriptors.
#include <sys/resource.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "spdl/client.h"
#include "spdl/control.h"

namespace spdl {
namespace {

using testing::DaemonProcess;
using testing::RawConnection;
using testing::TempDir;
using testing::WriteFile;

struct Fixture {
  // `env`: NAME=VALUE set for the daemon only.
  explicit Fixture(const std::string& extra = "", const std::vector<std::pair<std::string, std::string>>& env = {}) {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 8;
    o.min_side = 40;
    o.max_side = 80;
    REQUIRE(testdata::MakeImageFolder(root(), o).ok());
    WriteFile(dir.path + "/spdld.yaml",
              "socket_path: " + socket() + "\nallowed_roots: [" + root() + "]\nworker_threads: 2\n" + extra);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    daemon.emplace(socket(), std::vector<std::string>{"--config", dir.path + "/spdld.yaml"});
    for (const auto& [k, v] : env) ::unsetenv(k.c_str());
    REQUIRE(daemon->Connectable());
  }
  std::string root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  std::string JobYaml(const std::string& extra = "") const {
    return "source: {type: image_folder, root: " + root() + "}\nbatch: {size: 4}\nprefetch: 2\n" +
           "transforms: [{resize: {height: 16, width: 16}}]\n" + extra;
  }
  client::Options Job(const std::string& extra = "", uint32_t epochs = 1) const {
    client::Options o;
    o.socket_path = socket();
    o.config_yaml = JobYaml(extra);
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
  bool SettlesTo(uint32_t live_jobs) const {
    for (int i = 0; i < 250; ++i) {
      if (Status().live_jobs() == live_jobs) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  TempDir dir;
  std::optional<DaemonProcess> daemon;
};

// Runs a job to its end; the number of batches.
Result<int> RunToEnd(const client::Options& o) {
  SPDL_ASSIGN_OR_RETURN(auto loader, client::Loader::Open(o));
  int batches = 0;
  for (;;) {
    SPDL_ASSIGN_OR_RETURN(client::Event ev, loader->Next());
    if (std::holds_alternative<client::Batch>(ev)) ++batches;
    if (std::holds_alternative<client::JobStats>(ev)) return batches;
  }
}

proto::ClientMessage SubmitMsg(const std::string& yaml, const std::string& name = "job.yaml") {
  proto::ClientMessage m;
  m.mutable_submit()->set_config_yaml(yaml);
  m.mutable_submit()->set_config_name(name);
  m.mutable_submit()->set_epochs(1);
  return m;
}

TEST_CASE("a source that takes long to open does not hold up the other sessions") {
  TempDir gate_dir;
  const std::string gate = gate_dir.path + "/open";
  Fixture f("", {{"SPDLD_TEST_OPEN_GATE", gate}});

  // A client that goes away while its source is being opened: nothing of its job may start.
  {
    RawConnection gone(f.socket());
    REQUIRE(gone.SendHello());
    REQUIRE(gone.Receive());
    REQUIRE(gone.Send(SubmitMsg(f.JobYaml(), "gated.yaml")));
  }
  // A client whose source is being opened (held by the gate).
  RawConnection slow(f.socket());
  REQUIRE(slow.SendHello());
  REQUIRE(slow.Receive());
  REQUIRE(slow.Send(SubmitMsg(f.JobYaml(), "gated.yaml")));

  // Meanwhile another client gets Hello and status, and runs a whole job of its own.
  std::atomic<bool> gate_opened{false};
  auto other = std::async(std::launch::async, [&] {
    const bool status_ok = !f.Status().daemon_version().empty();
    Result<int> batches = RunToEnd(f.Job());
    return std::make_pair(status_ok && !gate_opened.load(), batches.ok() ? *batches : -1);
  });
  const bool served_meanwhile = other.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  gate_opened = true;
  WriteFile(gate, "");
  CHECK(served_meanwhile);
  auto [before_gate, batches] = other.get();
  CHECK(before_gate);
  CHECK(batches == 4);  // 16 images in batches of 4

  // Once the source is open the slow client's job is accepted and runs.
  auto accepted = slow.Receive();
  REQUIRE(accepted);
  CHECK(accepted->has_accepted());
  CHECK(f.SettlesTo(1));  // the other client's job has ended; the departed one's never started
  proto::ClientMessage end;
  end.mutable_end_job();
  REQUIRE(slow.Send(end));
  // The departed client's job was never started: nothing stays alive.
  CHECK(f.SettlesTo(0));
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// ---- resume tokens and the job's settings ----

TEST_CASE("a resume token is refused for a job with other transforms and accepted when only prefetch differs") {
  Fixture f;
  std::string token;
  {
    auto l = client::Loader::Open(f.Job());
    REQUIRE(l.ok());
    auto ev = (*l)->Next();
    REQUIRE(ev.ok());
    REQUIRE(std::holds_alternative<client::Batch>(*ev));
    token = std::get<client::Batch>(*ev).resume_token();
  }
  REQUIRE_FALSE(token.empty());
  client::Options other = f.Job();
  other.config_yaml = "source: {type: image_folder, root: " + f.root() +
                      "}\nbatch: {size: 4}\nprefetch: 2\ntransforms: [{resize: {height: 24, width: 24}}]\n";
  other.resume_token = token;
  auto refused = client::Loader::Open(other);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(),
             Catch::Contains("resume token belongs to another job") && Catch::Contains("its transforms differ"));
  client::Options same = f.Job();
  same.config_yaml = "source: {type: image_folder, root: " + f.root() +
                     "}\nbatch: {size: 4}\nprefetch: 3\ntransforms: [{resize: {height: 16, width: 16}}]\n";
  same.resume_token = token;
  auto resumed = client::Loader::Open(same);
  INFO((resumed.ok() ? std::string() : resumed.status().message()));
  REQUIRE(resumed.ok());
  auto ev = (*resumed)->Next();
  REQUIRE(ev.ok());
  REQUIRE(std::holds_alternative<client::Batch>(*ev));
  CHECK(std::get<client::Batch>(*ev).batch_in_epoch() == 1);  // right after the first batch
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// ---- share groups that wait for members ----

TEST_CASE("a share group whose members do not all come starts after share_wait_seconds") {
  Fixture f;
  client::Options o = f.Job("share: true\nshare_members: 2\nshare_wait_seconds: 1\n", 1);
  auto run = std::async(std::launch::async, [&] { return RunToEnd(o); });
  const bool ended = run.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  if (!ended) f.daemon->Stop();  // lets the client go (with an error) so the test can end
  CHECK(ended);
  Result<int> batches = run.get();
  REQUIRE(batches.ok());
  CHECK(*batches == 4);  // every batch, to the lone member
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

TEST_CASE("share_wait_seconds out of range is refused with its line") {
  Fixture f;
  auto l = client::Loader::Open(f.Job("share: true\nshare_wait_seconds: 0\n"));
  REQUIRE_FALSE(l.ok());
  CHECK_THAT(l.status().message(), Catch::Contains("share_wait_seconds") && Catch::Contains("job.yaml:6"));
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// ---- protocol order and the acceptor ----

TEST_CASE("a Release before any job closes that session only") {
  Fixture f;
  RawConnection c(f.socket());
  REQUIRE(c.SendHello());
  REQUIRE(c.Receive());
  proto::ClientMessage release;
  release.mutable_release()->set_slot(0);
  release.mutable_release()->set_generation(1);
  REQUIRE(c.Send(release));
  std::vector<proto::DaemonMessage> seen;
  CHECK(c.WaitClosed(&seen));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].error().code() == proto::Error::BAD_REQUEST);
  CHECK_THAT(seen[0].error().message(), Catch::Contains("Release without a job"));
  CHECK(f.Status().live_jobs() == 0);  // the daemon serves on
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// The daemon's user + system CPU seconds so far (/proc/PID/stat).
double CpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
  }
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

TEST_CASE("out of descriptors the acceptor backs off instead of spinning and recovers") {
  Fixture f;
  const pid_t pid = f.daemon->pid();
  (void)f.Status();
  // Room for two more connections, then accept() fails with EMFILE.
  int fds = testing::FdCount(pid);
  for (int i = 0, prev = -1; i < 50 && fds != prev; ++i) {  // the status call's socket closes late
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    prev = fds;
    fds = testing::FdCount(pid);
  }
  rlimit old{};
  REQUIRE(::prlimit(pid, RLIMIT_NOFILE, nullptr, &old) == 0);
  rlimit low{static_cast<rlim_t>(fds + 2), old.rlim_max};
  REQUIRE(::prlimit(pid, RLIMIT_NOFILE, &low, nullptr) == 0);
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 4; ++i) {  // the last two wait in the listen backlog
    held.push_back(std::make_unique<RawConnection>(f.socket()));
    REQUIRE(held.back()->connected());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // A spinning acceptor burns a core for as long as the connections wait; a backing-off one sleeps.
  const double cpu0 = CpuSeconds(pid);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double cpu = CpuSeconds(pid) - cpu0;
  CHECK(cpu < 0.25);
  // Descriptors come back: the waiting connections are served, and new ones too.
  REQUIRE(::prlimit(pid, RLIMIT_NOFILE, &old, nullptr) == 0);
  held.clear();
  CHECK(f.Status().live_jobs() == 0);
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// ---- stats surfaces ----

// spdl-client --json for `job_yaml` (a file) as rank/world_size.
nlohmann::json ClientJson(const Fixture& f, const std::string& job, uint32_t rank, uint32_t world, uint32_t epochs) {
  std::string out;
  const int rc = testing::RunCommand(
      {std::string(SPDL_BIN_DIR) + "/spdl-client", "--socket", f.socket(), "--config", job, "--json", "--epochs",
       std::to_string(epochs), "--rank", std::to_string(rank), "--world-size", std::to_string(world)},
      &out);
  INFO(out);
  REQUIRE(rc == 0);
  return nlohmann::json::parse(out);
}

TEST_CASE("spdl-client --json checksums every tensor by name and reports the sample cache") {
  Fixture f("cache_bytes: 64MiB\n");
  const std::string job = f.dir.path + "/job.yaml";
  WriteFile(job, f.JobYaml());
  const nlohmann::json whole = ClientJson(f, job, 0, 1, 2);
  INFO(whole.dump());
  REQUIRE(whole["checksums"].is_object());
  CHECK(whole["checksums"].size() == 2);  // image and label
  CHECK(whole["checksums"]["image"] == whole["pixel_checksum"]);
  // Every sample exactly once per epoch over the ranks: the two ranks' sums add up to the whole.
  const nlohmann::json r0 = ClientJson(f, job, 0, 2, 2), r1 = ClientJson(f, job, 1, 2, 2);
  for (const char* name : {"image", "label"}) {
    const uint64_t sum =
        std::stoull(r0["checksums"][name].get<std::string>()) + std::stoull(r1["checksums"][name].get<std::string>());
    CHECK(std::to_string(sum) == whole["checksums"][name].get<std::string>());
  }
  // Two epochs of 16 files with a cache: the second epoch is served from it.
  REQUIRE(whole["cache"].is_object());
  CHECK(whole["cache"]["budget_bytes"] == 64u << 20);
  CHECK(whole["cache"]["misses"] == 16);
  CHECK(whole["cache"]["hits"] == 16);
  CHECK(whole["cache"]["bytes"] > 0);
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
