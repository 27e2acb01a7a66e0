// Operations end to end, against the real spdld process: service-manager notification
// (READY/STATUS/WATCHDOG on a notify socket the test owns), reload, drain, start-up checks and the
// metrics endpoint.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "proto/job_stats_fields.h"
#include "skip.h"
#include "spdl/client.h"
#include "spdl/control.h"
#include "temp_dir.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunCommand;

using spdl::testing::TempDir;  // temp_dir.h

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
  SPDL_SKIP("spdld built without libsystemd (install libsystemd-dev)");
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
  msgs =
      notify.ReadUntil([](const std::vector<std::string>& m) { return Has(m, "STOPPING=1"); }, std::chrono::seconds(5));
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
                            << "worker_threads: 2\n"
                            << extra;
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
  REQUIRE(
      RunCommand({std::string(SPDL_BIN_DIR) + "/spdlctl", "--socket", f.socket(), "--json", "drain", "--seconds", "1"},
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

TEST_CASE(
    "SIGHUP applies new limits and thread count without dropping the running job, and a bad config keeps the old one") {
  OpsFixture f("max_jobs_per_client: 1\nmemory_budget_bytes: 64MiB\n");
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  auto a = client::Loader::Open(f.Job(0));
  REQUIRE(a.ok());
  REQUIRE((*a)->Next().ok());
  auto refused = client::Loader::Open(f.Job(1));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kResourceExhausted);

  // New limits and a bigger worker pool (the fixture starts with 2 threads).
  std::ofstream(f.config()) << "socket_path: " << f.socket() << "\nallowed_roots: [" << f.dir.path << "]\n"
                            << "worker_threads: 3\nmax_jobs_per_client: 2\nmemory_budget_bytes: 96MiB\n";
  REQUIRE(::kill(d.pid(), SIGHUP) == 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (StatusOf(f.socket()).memory_budget_bytes() != (96u << 20) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(StatusOf(f.socket()).memory_budget_bytes() == (96u << 20));
  CHECK(StatusOf(f.socket()).worker_threads() == 3);
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

// ---- start-up checks ----

// Appended, not `std::string(SPDL_BIN_DIR) + "/spdld"`: gcc 12 at -O1 (CI's test sources) reports a
// false -Warray-bounds / -Wstringop-overread inside libstdc++'s inlined operator+ here.
std::string Spdld() {
  std::string path = SPDL_BIN_DIR;
  path += "/spdld";
  return path;
}

TEST_CASE("a stale socket file left by a killed daemon is replaced") {
  TempDir dir;
  const std::string sock = dir.path + "/spdld.sock";
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, sock.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    ::close(fd);  // the file stays, nobody listens: what SIGKILL leaves behind
  }
  REQUIRE(fs::exists(sock));
  DaemonProcess d(sock, {"--allow-root", dir.path});
  REQUIRE(d.Connectable());
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a second daemon on a live socket, or on a path that is not a socket, refuses to start") {
  TempDir dir;
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--allow-root", dir.path});
  REQUIRE(d.Connectable());
  std::string out;
  CHECK(RunCommand({Spdld(), "--socket", sock, "--allow-root", dir.path}, &out) == 1);
  CHECK_THAT(out, Catch::Contains("another spdld is already serving " + sock));
  CHECK(d.Connectable());  // the first one is untouched
  CHECK(d.Stop() == std::optional<int>(0));

  std::ofstream(dir.path + "/file") << "x";
  out.clear();
  CHECK(RunCommand({Spdld(), "--socket", dir.path + "/file", "--allow-root", dir.path}, &out) == 1);
  CHECK_THAT(out, Catch::Contains("exists and is not a socket"));
  CHECK(fs::is_regular_file(dir.path + "/file"));
}

TEST_CASE("spdld refuses to start with a budget over the machine's memory or no usable data root, and says why") {
  TempDir dir;
  std::ofstream(dir.path + "/big.yaml") << "memory_budget_bytes: 1024TiB\nallowed_roots: [" << dir.path << "]\n";
  std::string out;
  CHECK(RunCommand({Spdld(), "--config", dir.path + "/big.yaml", "--socket", dir.path + "/a.sock"}, &out) == 1);
  CHECK_THAT(out, Catch::Contains("memory_budget_bytes (1048576.0 GiB) is more than"));
  CHECK_FALSE(fs::exists(dir.path + "/a.sock"));

  out.clear();
  CHECK(RunCommand({Spdld(), "--socket", dir.path + "/b.sock", "--allow-root", dir.path + "/missing"}, &out) == 1);
  CHECK_THAT(out, Catch::Contains("allowed root " + dir.path + "/missing does not exist"));
  CHECK_THAT(out, Catch::Contains("none of the allowed_roots is a readable directory"));
}

// ---- metrics ----

int FreeTcpPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  REQUIRE(ok);
  return ntohs(a.sin_port);
}

// Proto JSON prints 64-bit integers as strings.
double Num(const nlohmann::json& j) { return j.is_string() ? std::stod(j.get<std::string>()) : j.get<double>(); }

TEST_CASE(
    "the metrics endpoint, scraped over HTTP, parsed as Prometheus text and linted by promtool, matches spdlctl") {
  std::string probe;
  if (RunCommand({"/usr/bin/python3", "-c", "import prometheus_client"}, &probe) != 0) {
    SPDL_SKIP("python3-prometheus-client is not installed (apt-get install python3-prometheus-client)");
  }
  const int port = FreeTcpPort();
  OpsFixture f("metrics_port: " + std::to_string(port) + "\n");
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  auto a = client::Loader::Open(f.Job(0));
  REQUIRE(a.ok());
  // Hold both slots (prefetch 2): the job stops at backpressure, so its figures stay put.
  std::vector<client::Batch> held;
  while (held.size() < 2) {
    auto ev = (*a)->Next();
    REQUIRE(ev.ok());
    if (auto* b = std::get_if<client::Batch>(&*ev)) held.push_back(std::move(*b));
  }
  const std::string ctl = std::string(SPDL_BIN_DIR) + "/spdlctl";
  std::string stats_out, status_out, scrape_out, missing_out;
  REQUIRE(RunCommand({ctl, "--socket", f.socket(), "--json", "stats"}, &stats_out) == 0);
  REQUIRE(RunCommand({ctl, "--socket", f.socket(), "--json", "status"}, &status_out) == 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  const std::string raw = f.dir.path + "/scrape.txt";
  REQUIRE(RunCommand({"/usr/bin/python3", std::string(SPDL_SOURCE_DIR) + "/tests/ops/scrape.py", url + "/metrics", raw},
                     &scrape_out) == 0);
  INFO(stats_out);
  INFO(scrape_out);
  auto job = nlohmann::json::parse(stats_out);
  auto status = nlohmann::json::parse(status_out);
  auto m = nlohmann::json::parse(scrape_out);
  CHECK(m.at("status") == 200);
  CHECK_THAT(m.at("content_type").get<std::string>(), Catch::StartsWith("text/plain; version=0.0.4"));
  const auto& s = m.at("samples");
  const std::string id = std::to_string(static_cast<uint64_t>(Num(job.at("job_id"))));
  const std::string jl = "{job_id=" + id + ",rank=0,uid=" + std::to_string(::geteuid()) + "}";
  const auto& st = job.at("stats");
  CHECK(s.at("spdld_jobs").get<double>() == 1);
  CHECK(s.at("spdld_draining").get<double>() == 0);
  // Every daemon figure described for the metrics (proto/job_stats_fields.h) is scraped, with
  // spdlctl's value (but the uptime, which moved on between the two).
  for (const auto& row : proto::DaemonStatFields()) {
    if (!(row.surfaces & proto::kMetrics)) continue;
    CAPTURE(row.name, row.metric);
    REQUIRE(s.contains(row.metric));
    if (std::string(row.name) != "uptime_seconds") CHECK(s.at(row.metric).get<double>() == Num(status.at(row.name)));
  }
  CHECK(s.at("spdld_memory_in_use_bytes").get<double>() == Num(status.at("memory_in_use_bytes")));
  CHECK(s.at("spdld_memory_budget_bytes").get<double>() == Num(status.at("memory_budget_bytes")));
  CHECK(s.at("spdld_job_samples_total" + jl).get<double>() == Num(st.at("samples")));
  CHECK(Num(st.at("samples")) == 8);
  CHECK(s.at("spdld_job_batches_total" + jl).get<double>() == Num(st.at("batches")));
  CHECK(s.at("spdld_job_skipped_total" + jl).get<double>() == Num(st.at("skipped")));
  CHECK(s.at("spdld_job_batches_ready" + jl).get<double>() == Num(st.at("batches_ready")));
  CHECK(s.at("spdld_job_memory_bytes" + jl).get<double>() == Num(job.at("region_bytes")));
  // Every figure of the job's own described for the metrics (JobSummaryFields), with spdlctl's value.
  for (const auto& row : proto::JobSummaryFields()) {
    if (!(row.surfaces & proto::kMetrics)) continue;
    CAPTURE(row.name, row.metric);
    CHECK(s.at(row.metric + jl).get<double>() == Num(job.at(row.name)));
  }
  REQUIRE_FALSE(st.at("stages").empty());
  for (const auto& stage : st.at("stages")) {
    const std::string sl = "{job_id=" + id + ",stage=" + stage.at("name").get<std::string>() + "}";
    CHECK(s.at("spdld_stage_tasks_total" + sl).get<double>() == Num(stage.at("tasks")));
    CHECK(s.at("spdld_stage_failures_total" + sl).get<double>() == Num(stage.at("failures")));
    CHECK(s.at("spdld_stage_queue_length" + sl).get<double>() == Num(stage.at("queue_length")));
    // Task times as a histogram in seconds: every task counted, +Inf bucket = count.
    const std::string hl = "{job_id=" + id + ",le=+Inf,stage=" + stage.at("name").get<std::string>() + "}";
    CHECK(s.at("spdld_stage_task_seconds_bucket" + hl).get<double>() == Num(stage.at("tasks")));
    CHECK(s.at("spdld_stage_task_seconds_count" + sl).get<double>() == Num(stage.at("tasks")));
    CHECK(s.at("spdld_stage_task_seconds_sum" + sl).get<double>() == Approx(stage.at("busy_seconds").get<double>()));
  }
  // The client released nothing yet (it holds both batches): no wait counted.
  CHECK(s.at("spdld_client_wait_seconds_count" + jl).get<double>() == 0);
  CHECK(s.at("spdld_build_info{version=" + std::string(SPDLD_VERSION) + "}").get<double>() == 1);
  CHECK(m.at("types").at("spdld_stage_task_seconds") == "histogram");
  CHECK(m.at("types").at("spdld_client_wait_seconds") == "histogram");
  for (const auto& [name, v] : s.items()) {
    CHECK(name.find("job=") == std::string::npos);  // job_id, never job: Prometheus would rename it
    CHECK(name.find("_ms") == std::string::npos);
  }
  // promtool's own check (the Prometheus linter) on the body as served: no problem reported.
  std::string lint;
  if (RunCommand({"/bin/sh", "-c", "command -v promtool"}, &lint) != 0) {
    WARN("promtool part skipped: promtool is not installed (apt-get install prometheus)");
  } else {
    lint.clear();
    const int rc = testing::RunCommandAs({}, {"/bin/sh", "-c", "promtool check metrics < " + raw}, &lint, true);
    INFO(lint);
    CHECK(rc == 0);
    CHECK(lint.empty());
  }
  CHECK(m.at("types").at("spdld_job_samples") == "counter");
  CHECK(m.at("types").at("spdld_job_batches_ready") == "gauge");
  REQUIRE(RunCommand({"/usr/bin/python3", std::string(SPDL_SOURCE_DIR) + "/tests/ops/scrape.py", url + "/other"},
                     &missing_out) == 0);
  CHECK(nlohmann::json::parse(missing_out).at("status") == 404);
  held.clear();
  a->reset();
  CHECK(d.Stop() == std::optional<int>(0));
}

// ---- spdlctl and spdl-client output ----

// Runs `argv` with stdout and stderr captured separately; returns the exit code.
int RunSplit(const std::vector<std::string>& argv, std::string* out, std::string* err) {
  TempDir t;
  const std::string o = t.path + "/out", e = t.path + "/err";
  pid_t pid = ::fork();
  if (pid == 0) {
    std::freopen(o.c_str(), "w", stdout);
    std::freopen(e.c_str(), "w", stderr);
    std::vector<char*> a;
    a.reserve(argv.size() + 1);
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    _exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  *out = slurp(o);
  *err = slurp(e);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Runs `argv` on a pseudo-terminal (stdout and stderr both); returns everything it wrote.
std::string RunOnTerminal(const std::vector<std::string>& argv) {
  int master = -1;
  winsize ws{};
  ws.ws_col = 100;
  ws.ws_row = 30;
  pid_t pid = ::forkpty(&master, nullptr, nullptr, &ws);
  if (pid == 0) {
    std::vector<char*> a;
    a.reserve(argv.size() + 1);
    for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    _exit(127);
  }
  std::string all;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(master, buf, sizeof buf);
    if (n <= 0) break;  // EIO once the child has exited
    all.append(buf, static_cast<size_t>(n));
  }
  ::close(master);
  ::waitpid(pid, nullptr, 0);
  return all;
}

TEST_CASE("spdl-client draws a progress line on a terminal and none on a pipe or with --json") {
  OpsFixture f("", 20);
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  const std::string job = f.dir.path + "/job.yaml";
  std::ofstream(job) << f.Job().config_yaml;
  const std::vector<std::string> cmd = {
      std::string(SPDL_BIN_DIR) + "/spdl-client", "--socket", f.socket(), "--config", job, "--epochs", "2"};
  const std::string tty = RunOnTerminal(cmd);
  INFO(tty);
  CHECK_THAT(tty, Catch::Contains("\r"));
  CHECK_THAT(tty, Catch::Contains("epoch 2/2 ["));
  CHECK_THAT(tty, Catch::Contains("100% "));
  CHECK_THAT(tty, Catch::Contains("samples/s ETA "));
  CHECK_THAT(tty, Catch::Contains("samples in 20 batches over 2 epochs"));  // the summary still comes

  std::string out, err;
  REQUIRE(RunSplit(cmd, &out, &err) == 0);
  CHECK(err.empty());  // not a terminal: no progress
  CHECK_THAT(out, Catch::Contains("samples in 20 batches over 2 epochs"));
  auto with_json = cmd;
  with_json.push_back("--json");
  REQUIRE(RunSplit(with_json, &out, &err) == 0);
  CHECK(err.empty());
  CHECK(nlohmann::json::parse(out).at("batches") == 20);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("spdlctl: every command answers --json, and the status and jobs tables fit 100 columns") {
  OpsFixture f;
  // A long data root, so the SOURCE column has to be cut.
  const std::string deep = f.dir.path + "/a_rather_long_directory_name/with/several/levels/of/nesting";
  fs::create_directories(deep);
  fs::rename(f.data_root(), deep + "/data");
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  auto opts = f.Job(0);
  opts.config_yaml.replace(opts.config_yaml.find(f.data_root()), f.data_root().size(), deep + "/data");
  auto a = client::Loader::Open(opts);
  REQUIRE(a.ok());
  REQUIRE((*a)->Next().ok());
  const std::string ctl = std::string(SPDL_BIN_DIR) + "/spdlctl";
  const std::string id = std::to_string((*a)->info().job_id);
  for (const std::vector<std::string>& sub :
       std::vector<std::vector<std::string>>{{"status"}, {"jobs"}, {"stats", id}}) {
    std::vector<std::string> argv = {ctl, "--socket", f.socket()};
    argv.insert(argv.end(), sub.begin(), sub.end());
    std::string out;
    REQUIRE(RunCommand(argv, &out) == 0);
    INFO(out);
    std::istringstream lines(out);
    // `stats` rendering belongs to the pipeline-stats work (its first line carries the whole source).
    if (sub[0] != "stats") {
      for (std::string l; std::getline(lines, l);) CHECK(l.size() <= 100);
    }
    if (sub[0] == "jobs") CHECK_THAT(out, Catch::Contains("...") && Catch::Contains("nesting/data"));
    argv.insert(argv.begin() + 3, "--json");
    out.clear();
    REQUIRE(RunCommand(argv, &out) == 0);
    CHECK_NOTHROW(nlohmann::json::parse(out));
  }
  std::string out;
  REQUIRE(RunCommand({ctl, "--socket", f.socket(), "--json", "cancel", id}, &out) == 0);
  CHECK(nlohmann::json::parse(out).at("job_id") == id);  // proto JSON: 64-bit ids as strings
  REQUIRE(RunCommand({ctl, "--socket", f.socket(), "--json", "drain"}, &out) == 0);
  a->reset();
  CHECK(d.Stop(0, std::chrono::seconds(20)) == std::optional<int>(0));
}

// ---- the README's command lines, as written ----

// The command lines of README.md's ```sh blocks that start with `build/bin/PROGRAM ` (continuation
// lines joined, the `# comment` and a trailing `&` cut, `[optional parts]` dropped), split on
// blanks, with the README's places swapped for the test's: build/bin/ -> the build's bin directory,
// config/ -> the source tree's, /tmp/spdld.sock and /tmp/spdl-data -> `socket` and `data`.
std::vector<std::vector<std::string>> ReadmeCommands(const std::string& program, const std::string& socket,
                                                     const std::string& data) {
  std::ifstream in(std::string(SPDL_SOURCE_DIR) + "/README.md");
  REQUIRE(in);
  std::vector<std::vector<std::string>> commands;
  bool in_sh = false;
  std::string pending;
  auto replace_all = [](std::string s, const std::string& from, const std::string& to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
      s.replace(at, from.size(), to);
    return s;
  };
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) == 0) {
      in_sh = !in_sh && line == "```sh";
      continue;
    }
    if (!in_sh) continue;
    if (pending.empty() && line.rfind("build/bin/" + program + " ", 0) != 0) continue;
    const size_t hash = line.find(" #");
    if (hash != std::string::npos) line.resize(hash);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (!line.empty() && line.back() == '\\') {
      line.pop_back();
      pending += line + " ";
      continue;
    }
    line = pending + line;
    pending.clear();
    INFO(line);
    REQUIRE(line.find_first_of("'\"$;|") == std::string::npos);  // no shell syntax beyond what is cut here
    while (!line.empty() && (line.back() == '&' || line.back() == ' ')) line.pop_back();
    for (size_t open = line.find('['); open != std::string::npos; open = line.find('[')) {
      const size_t close = line.find(']', open);
      REQUIRE(close != std::string::npos);
      line.erase(open, close - open + 1);
    }
    line = replace_all(line, "/tmp/spdld.sock", socket);
    line = replace_all(line, "/tmp/spdl-data", data);
    std::vector<std::string> argv;
    std::istringstream words(line);
    for (std::string w; words >> w;) {
      if (w.rfind("build/bin/", 0) == 0) w = std::string(SPDL_BIN_DIR) + "/" + w.substr(10);
      if (w.rfind("config/", 0) == 0) w = std::string(SPDL_SOURCE_DIR) + "/" + w;
      argv.push_back(w);
    }
    commands.push_back(argv);
  }
  return commands;
}

std::string Joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// A program started from a README line (spdld), stopped with SIGTERM.
class Background {
 public:
  explicit Background(const std::vector<std::string>& argv) : pid_(::fork()) {
    if (pid_ == 0) {
      std::vector<char*> a;
      a.reserve(argv.size() + 1);
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      _exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0) Stop();
  }
  // SIGTERM and wait; the exit code (-1 when it did not exit by itself).
  int Stop() {
    if (pid_ <= 0) return exit_code_;
    ::kill(pid_, SIGTERM);
    Reap();
    return exit_code_;
  }
  // Waits for an exit that something else caused (spdlctl drain); true when it came within 20 s.
  bool WaitExit() {
    for (int i = 0; i < 2000 && pid_ > 0; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        pid_ = 0;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pid_ == 0;
  }

 private:
  void Reap() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    pid_ = 0;
  }
  pid_t pid_;
  int exit_code_ = -1;
};

bool WaitConnectable(const std::string& socket) {
  for (int i = 0; i < 1000; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (ok) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST_CASE(
    "the README's command lines run as written: spdl-make-dataset, spdld as a normal user, spdl-client, "
    "every spdlctl command with --json after it") {
  TempDir t;
  const std::string socket = t.path + "/spdld.sock", data = t.path + "/spdl-data";
  const auto make = ReadmeCommands("spdl-make-dataset", socket, data);
  const auto daemons = ReadmeCommands("spdld", socket, data);
  const auto clients = ReadmeCommands("spdl-client", socket, data);
  auto ctl = ReadmeCommands("spdlctl", socket, data);
  REQUIRE(make.size() == 1);
  REQUIRE(daemons.size() >= 2);
  REQUIRE(clients.size() >= 2);
  REQUIRE(ctl.size() >= 6);

  std::string out;
  INFO(Joined(make[0]));
  REQUIRE(RunCommand(make[0], &out) == 0);
  CHECK_THAT(out, Catch::StartsWith("wrote "));

  // Each spdld line starts a daemon that answers; the first (the quick start's) runs the rest.
  for (size_t i = daemons.size(); i-- > 1;) {
    INFO(Joined(daemons[i]));
    Background d(daemons[i]);
    REQUIRE(WaitConnectable(socket));
    REQUIRE(RunCommand({std::string(SPDL_BIN_DIR) + "/spdlctl", "status", "--socket", socket}, &out) == 0);
    CHECK(d.Stop() == 0);
  }
  INFO(Joined(daemons[0]));
  Background d(daemons[0]);
  REQUIRE(WaitConnectable(socket));

  for (const auto& c : clients) {
    INFO(Joined(c));
    out.clear();
    REQUIRE(RunCommand(c, &out) == 0);
    CHECK_THAT(out, Catch::Contains("samples in"));
  }

  // A job that runs until it is cancelled, for `stats JOB` and `cancel JOB`.
  client::Options job;
  job.socket_path = socket;
  job.config_name = "job.yaml";
  job.config_yaml = "source: {type: image_folder, root: " + data +
                    "}\nbatch: {size: 4}\ntransforms:\n  - resize: {shorter: 40}\n  - center_crop: {size: 32}\n"
                    "prefetch: 2\n";
  auto loader = client::Loader::Open(job);
  REQUIRE(loader.ok());
  REQUIRE((*loader)->Next().ok());
  const std::string id = std::to_string((*loader)->info().job_id);
  // cancel, then drain, last: each ends what the others look at.
  auto rank = [](const std::vector<std::string>& argv) {
    for (const auto& a : argv) {
      if (a == "cancel") return 1;
      if (a == "drain") return 2;
    }
    return 0;
  };
  std::stable_sort(ctl.begin(), ctl.end(), [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  bool drained = false;
  for (auto argv : ctl) {
    for (auto& a : argv) {
      if (a == "JOB") a = id;
    }
    const bool has_json = std::find(argv.begin(), argv.end(), "--json") != argv.end();
    if (rank(argv) == 0 && !has_json) {  // the same command with --json after it
      auto json = argv;
      json.push_back("--json");
      INFO(Joined(json));
      out.clear();
      REQUIRE(RunCommand(json, &out) == 0);
      CHECK_NOTHROW(nlohmann::json::parse(out));
    }
    INFO(Joined(argv));
    out.clear();
    REQUIRE(RunCommand(argv, &out) == 0);
    if (has_json) CHECK_NOTHROW(nlohmann::json::parse(out));
    if (rank(argv) == 1) CHECK(out == "cancelled job " + id + "\n");
    if (rank(argv) == 2) drained = true;
  }
  loader->reset();
  REQUIRE(drained);
  CHECK(d.WaitExit());
  CHECK(d.Stop() == 0);
}

TEST_CASE("a folder whose files all lack the example config's endings is refused, counting them") {
  OpsFixture f;
  // 48 PNG files (the refusal comes from the folder scan, before anything is decoded).
  for (int i = 0; i < 24; ++i) {
    for (const char* cls : {"cat", "dog"}) {
      fs::create_directories(f.dir.path + "/png/" + cls);
      std::ofstream(f.dir.path + "/png/" + cls + "/" + std::to_string(i) + ".png") << "not decoded";
    }
  }
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  std::string out;
  const int rc = testing::RunCommandAs({},
                                       {std::string(SPDL_BIN_DIR) + "/spdl-client", "--socket", f.socket(), "--config",
                                        std::string(SPDL_SOURCE_DIR) + "/config/examples/imagenet.yaml", "--set",
                                        "source.root=" + f.dir.path + "/png", "--epochs", "1"},
                                       &out, /*merge_stderr=*/true);
  INFO(out);
  CHECK(rc != 0);
  CHECK_THAT(out, Catch::Contains("found 48 files in its 2 class sub-directories, none with the endings [.jpg, "
                                  ".jpeg] (48 .png); set source.extensions"));
  // With the endings set, the same folder is scanned (and its fake PNGs fail to decode: skipped).
  out.clear();
  testing::RunCommandAs({},
                        {std::string(SPDL_BIN_DIR) + "/spdl-client", "--socket", f.socket(), "--config",
                         std::string(SPDL_SOURCE_DIR) + "/config/examples/imagenet.yaml", "--set",
                         "source.root=" + f.dir.path + "/png", "--set", "source.extensions=[.png]", "--epochs", "1"},
                        &out, true);
  CHECK_THAT(out, !Catch::Contains("none with the endings"));
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
