// Operations end to end, against the real spdld process: service-manager notification
// (READY/STATUS/WATCHDOG on a notify socket the test owns), reload, drain, start-up checks and the
// metrics endpoint.
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "spdl/client.h"
#include "spdl/control.h"

#include <nlohmann/json.hpp>

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunCommand;

struct TempDir {
  TempDir() {
    char tmpl[] = "/tmp/spdl-ops-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

// A datagram socket standing in for systemd's $NOTIFY_SOCKET.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  bool bound() const { return bound_; }
  // Collects messages until `done` says so or `timeout` passes; returns every message seen.
  template <typename Pred>
  std::vector<std::string> ReadUntil(Pred done, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done(seen_) && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n > 0) seen_.emplace_back(buf, static_cast<size_t>(n));
    }
    return seen_;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
  std::vector<std::string> seen_;
};

bool Has(const std::vector<std::string>& msgs, const std::string& prefix) {
  for (const auto& m : msgs) {
    std::istringstream lines(m);
    for (std::string l; std::getline(lines, l);) {
      if (l.rfind(prefix, 0) == 0) return true;
    }
  }
  return false;
}

TEST_CASE("spdld tells its notify socket READY then STATUS and WATCHDOG pings, and STOPPING at exit") {
#ifndef SPDL_HAVE_SYSTEMD
  WARN("skipped: spdld built without libsystemd (install libsystemd-dev)");
  return;
#endif
  TempDir dir;
  NotifySocket notify(dir.path + "/notify");
  REQUIRE(notify.bound());
  ::setenv("NOTIFY_SOCKET", (dir.path + "/notify").c_str(), 1);
  ::setenv("WATCHDOG_USEC", "400000", 1);  // pings every 200 ms
  DaemonProcess d(dir.path + "/spdld.sock", {"--allow-root", dir.path});
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  REQUIRE(d.Connectable());
  auto msgs = notify.ReadUntil(
      [](const std::vector<std::string>& m) { return Has(m, "READY=1") && Has(m, "STATUS=") && Has(m, "WATCHDOG=1"); },
      std::chrono::seconds(10));
  CHECK(Has(msgs, "READY=1"));
  CHECK(Has(msgs, "STATUS=0 jobs, 0 samples/s"));
  CHECK(Has(msgs, "WATCHDOG=1"));
  REQUIRE(d.Stop(SIGTERM) == 0);
  msgs = notify.ReadUntil([](const std::vector<std::string>& m) { return Has(m, "STOPPING=1"); },
                          std::chrono::seconds(5));
  CHECK(Has(msgs, "STOPPING=1"));
}


// A small image folder, a daemon config file and the socket, all in one temp dir.
struct OpsFixture {
  explicit OpsFixture(const std::string& extra_config = "", int per_class = 12) {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = per_class;
    o.min_side = 70;
    o.max_side = 160;
    REQUIRE(testdata::MakeImageFolder(data_root(), o).ok());
    WriteConfig(extra_config);
  }
  void WriteConfig(const std::string& extra) const {
    std::ofstream(config()) << "socket_path: " << socket() << "\nallowed_roots: [" << dir.path << "]\n"
                            << "worker_threads: 2\n" << extra;
  }
  std::string data_root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  std::string config() const { return dir.path + "/spdld.yaml"; }
  client::Options Job(uint32_t epochs = 0) const {
    client::Options o;
    o.socket_path = socket();
    o.config_name = "job.yaml";
    o.config_yaml = "source: {type: image_folder, root: " + data_root() +
                    "}\nbatch: {size: 4}\ntransforms:\n  - resize: {shorter: 40}\n  - center_crop: {size: 32}\n"
                    "prefetch: 2\n";
    o.epochs = epochs;
    return o;
  }
  TempDir dir;
};

// Reads events until `until` holds or the loader fails; returns the last status.
template <typename Pred>
Status ReadUntil(client::Loader& l, Pred until, int max_events = 100000) {
  for (int i = 0; i < max_events && !until(); ++i) {
    auto ev = l.Next();
    if (!ev.ok()) return ev.status();
    if (std::holds_alternative<client::JobStats>(*ev)) return Status::Ok();
  }
  return Status::Ok();
}

proto::DaemonStatus StatusOf(const std::string& socket) {
  proto::ClientMessage req;
  req.mutable_status();
  auto r = client::ControlCall(socket, req);
  REQUIRE(r.ok());
  return r->status();
}

TEST_CASE("SIGTERM drains: new jobs refused, the running job told and left to finish, then a clean exit") {
  OpsFixture f("drain_seconds: 60\n");
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  auto a = client::Loader::Open(f.Job(0));  // runs until End()
  REQUIRE(a.ok());
  REQUIRE((*a)->Next().ok());
  REQUIRE(::kill(d.pid(), SIGTERM) == 0);
  REQUIRE(ReadUntil(**a, [&] { return (*a)->draining(); }).ok());
  CHECK((*a)->draining());
  CHECK((*a)->drain_reason() == "SIGTERM");
  CHECK((*a)->drain_seconds_left() > 0);
  CHECK((*a)->drain_seconds_left() <= 60);

  auto b = client::Loader::Open(f.Job(1));
  REQUIRE_FALSE(b.ok());
  CHECK(b.status().code() == StatusCode::kUnavailable);
  CHECK_THAT(b.status().message(), Catch::Contains("draining (SIGTERM)"));
  CHECK(StatusOf(f.socket()).live_jobs() == 1);  // spdlctl still answers

  // The running job goes on until its trainer ends it; then the daemon exits by itself.
  REQUIRE((*a)->Next().ok());
  REQUIRE((*a)->End().ok());
  CHECK(ReadUntil(**a, [] { return false; }).ok());
  CHECK(d.Stop(0, std::chrono::seconds(20)) == std::optional<int>(0));
  CHECK_FALSE(fs::exists(f.socket()));
}

TEST_CASE("spdlctl drain with a deadline: the job that does not end is cancelled at the deadline") {
  OpsFixture f;
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  auto a = client::Loader::Open(f.Job(0));
  REQUIRE(a.ok());
  REQUIRE((*a)->Next().ok());
  std::string out;
  REQUIRE(RunCommand({std::string(SPDL_BIN_DIR) + "/spdlctl", "--socket", f.socket(), "--json", "drain", "--seconds",
                      "1"},
                     &out) == 0);
  INFO(out);
  auto j = nlohmann::json::parse(out);
  CHECK(j.at("deadline_seconds").get<double>() > 0);
  CHECK(j.at("deadline_seconds").get<double>() <= 1);
  CHECK(j.at("live_jobs") == 1);
  CHECK(j.at("reason") == "spdlctl drain by uid " + std::to_string(::geteuid()));
  // The trainer keeps reading; the daemon exits at the deadline and the loader says so.
  Status s = ReadUntil(**a, [] { return false; });
  CHECK((*a)->draining());
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(d.Stop(0, std::chrono::seconds(20)) == std::optional<int>(0));
}

TEST_CASE("spdlctl drain on an idle daemon exits at once") {
  OpsFixture f;
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  std::string out;
  REQUIRE(RunCommand({std::string(SPDL_BIN_DIR) + "/spdlctl", "--socket", f.socket(), "drain"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("spdld is draining"));
  CHECK(d.Stop(0, std::chrono::seconds(20)) == std::optional<int>(0));
}

TEST_CASE("SIGHUP applies new limits without dropping the running job, and a bad config keeps the old one") {
  OpsFixture f("max_jobs_per_client: 1\nmemory_budget_bytes: 64MiB\n");
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  auto a = client::Loader::Open(f.Job(0));
  REQUIRE(a.ok());
  REQUIRE((*a)->Next().ok());
  auto refused = client::Loader::Open(f.Job(1));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);

  f.WriteConfig("max_jobs_per_client: 2\nmemory_budget_bytes: 96MiB\n");
  REQUIRE(::kill(d.pid(), SIGHUP) == 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (StatusOf(f.socket()).memory_budget_bytes() != (96u << 20) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(StatusOf(f.socket()).memory_budget_bytes() == (96u << 20));
  auto b = client::Loader::Open(f.Job(0));
  REQUIRE(b.ok());             // the new max_jobs_per_client
  REQUIRE((*a)->Next().ok());  // the running job was not dropped
  REQUIRE((*b)->Next().ok());

  // A config with errors: refused, the running config kept (still 2 jobs per client, 96 MiB).
  std::ofstream(f.config()) << "socket_path: " << f.socket() << "\nmax_jobs_per_client: 0\nbogus_key: 1\n";
  REQUIRE(::kill(d.pid(), SIGHUP) == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(StatusOf(f.socket()).memory_budget_bytes() == (96u << 20));
  auto c = client::Loader::Open(f.Job(1));
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(), Catch::Contains("already has 2 jobs"));
  REQUIRE((*a)->Next().ok());
  a->reset();
  b->reset();
  CHECK(d.Stop(SIGTERM, std::chrono::seconds(20)) == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
