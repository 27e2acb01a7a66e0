// daemon/ops: the start-up checks (memory budget against RAM and the cgroup limit, allowed roots)
// on files and directories the test writes; the notifier's no-op path.
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "common/log_limiter.h"
#include "ops/metrics.h"
#include "ops/notifier.h"
#include "ops/startup_checks.h"
#include "pipeline/stage_stats.h"
#include "temp_dir.h"

namespace spdl::ops {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t GiB = 1ull << 30;

using spdl::testing::TempDir;  // temp_dir.h

bool AnyContains(const std::vector<std::string>& v, const std::string& needle) {
  for (const auto& s : v) {
    if (s.find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST_CASE("memory facts come from meminfo and the v2 cgroup of the process") {
  TempDir t;
  t.Write("proc/meminfo", "MemTotal:       16384000 kB\nMemFree: 1 kB\nMemAvailable:    8192000 kB\n");
  t.Write("proc/self/cgroup", "0::/system.slice/spdld.service\n");
  t.Write("cg/system.slice/spdld.service/memory.max", "2147483648\n");
  MemoryFacts f = ReadMemoryFacts(t.path + "/proc", t.path + "/cg", t.path);
  CHECK(f.mem_total == 16384000ull * 1024);
  CHECK(f.mem_available == 8192000ull * 1024);
  REQUIRE(f.cgroup_limit);
  CHECK(*f.cgroup_limit == 2 * GiB);
  CHECK_THAT(f.cgroup_limit_file, Catch::EndsWith("spdld.service/memory.max"));
  CHECK(f.dev_shm_bytes > 0);  // statvfs of the temp dir's file system
}

TEST_CASE("a v2 memory.max of max means no limit") {
  TempDir t;
  t.Write("proc/self/cgroup", "0::/a\n");
  t.Write("cg/a/memory.max", "max\n");
  CHECK_FALSE(ReadMemoryFacts(t.path + "/proc", t.path + "/cg").cgroup_limit);
}

TEST_CASE("a v1 memory cgroup missing under the mount falls back to the mount root, and huge means none") {
  TempDir t;
  t.Write("proc/self/cgroup", "9:cpu:/x\n4:memory:/docker/abc\n");
  t.Write("cg/memory/memory.limit_in_bytes", "1073741824\n");
  MemoryFacts f = ReadMemoryFacts(t.path + "/proc", t.path + "/cg");
  REQUIRE(f.cgroup_limit);
  CHECK(*f.cgroup_limit == GiB);
  t.Write("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
  CHECK_FALSE(ReadMemoryFacts(t.path + "/proc", t.path + "/cg").cgroup_limit);
}

TEST_CASE("a budget over the cgroup limit is an error that says what to do") {
  MemoryFacts f;
  f.mem_total = 64 * GiB;
  f.mem_available = 60 * GiB;
  f.cgroup_limit = 2 * GiB;
  f.cgroup_limit_file = "/sys/fs/cgroup/memory.max";
  f.dev_shm_bytes = 64ull << 20;  // Docker's default /dev/shm
  CheckReport r = CheckMemoryBudget(4 * GiB, f);
  REQUIRE(r.errors.size() == 1);
  CHECK_THAT(r.errors[0], Catch::Contains("memory_budget_bytes (4.0 GiB) is more than spdld's memory limit (2.0 GiB"));
  CHECK_THAT(r.errors[0], Catch::Contains("docker run --memory"));
  // A small /dev/shm is only a note: memfd slots do not live there.
  CHECK(AnyContains(r.notes, "/dev/shm's size (64.0 MiB) does not limit them"));

  r = CheckMemoryBudget(GiB + GiB / 2 + GiB / 4, f);  // 1.75 GiB of 2: over 80%
  CHECK(r.ok());
  CHECK(AnyContains(r.warnings, "over 80%"));
  r = CheckMemoryBudget(GiB, f);
  CHECK(r.ok());
  CHECK(r.warnings.empty());
}

TEST_CASE("a budget over RAM is an error, over what is available a warning") {
  MemoryFacts f;
  f.mem_total = 8 * GiB;
  f.mem_available = 3 * GiB;
  CheckReport r = CheckMemoryBudget(16 * GiB, f);
  REQUIRE(r.errors.size() == 1);
  CHECK_THAT(r.errors[0], Catch::Contains("more than this machine's RAM (8.0 GiB)"));
  r = CheckMemoryBudget(4 * GiB, f);
  CHECK(r.ok());
  CHECK(AnyContains(r.warnings, "available right now (3.0 GiB)"));
}

TEST_CASE("allowed roots: missing or not a directory are warned about, none usable is an error") {
  TempDir t;
  t.Write("file", "x");
  fs::create_directories(t.path + "/data");
  CheckReport r = CheckAllowedRoots({t.path + "/data", t.path + "/missing", t.path + "/file"});
  CHECK(r.ok());
  CHECK(AnyContains(r.warnings, t.path + "/missing does not exist"));
  CHECK(AnyContains(r.warnings, t.path + "/file is not a directory"));
  r = CheckAllowedRoots({t.path + "/missing", t.path + "/file"});
  REQUIRE(r.errors.size() == 1);
  CHECK_THAT(r.errors[0], Catch::Contains("none of the allowed_roots is a readable directory"));
  r = CheckAllowedRoots({});
  CHECK(r.ok());
  CHECK(AnyContains(r.warnings, "every job will be refused"));
}

TEST_CASE("without NOTIFY_SOCKET the notifier sends nothing and has no watchdog") {
  ::unsetenv("NOTIFY_SOCKET");
  ::unsetenv("WATCHDOG_USEC");
  Notifier n;
  CHECK_FALSE(n.enabled());
  CHECK(n.watchdog_interval().count() == 0);
  n.Ready();  // no-ops
  n.SetStatus("x");
}

TEST_CASE("the Prometheus text: job_id labels, _total counters, histograms in seconds, build info") {
  proto::DaemonStatus st;
  st.set_live_jobs(2);
  st.set_memory_budget_bytes(1 << 30);
  for (int id : {3, 4}) {
    auto* j = st.add_jobs();
    j->set_job_id(id);
    j->set_uid(1000);
    j->set_rank(id - 3);
    j->mutable_stats()->set_samples(100 * id);
    j->mutable_stats()->set_client_wait_seconds(0.25);
    auto* stage = j->mutable_stats()->add_stages();
    stage->set_name(id == 3 ? "read" : "de\"code");
    stage->set_tasks(7);
    stage->set_busy_seconds(0.5);
    stage->set_queue_length(3);
    // 7 task times in the stage's buckets: 2 under 16 us (bucket 5), 4 in (0.5 ms, 1 ms], 1 open-ended.
    for (int b = 0; b < pipeline::kHistogramBuckets; ++b) stage->add_task_histogram(0);
    stage->set_task_histogram(pipeline::StageStats::Bucket(10'000), 2);
    stage->set_task_histogram(pipeline::StageStats::Bucket(900'000), 4);
    stage->set_task_histogram(pipeline::kHistogramBuckets - 1, 1);
    for (int b = 0; b < pipeline::kHistogramBuckets; ++b) j->mutable_stats()->add_client_wait_histogram(0);
    j->mutable_stats()->set_client_wait_histogram(pipeline::StageStats::Bucket(200'000'000), 3);  // 0.2 s
  }
  const std::string text = RenderPrometheus(st, DaemonFacts{true});
  INFO(text);
  CHECK_THAT(text, Catch::Contains("# TYPE spdld_job_samples_total counter\n"));
  CHECK_THAT(text, Catch::Contains("spdld_job_samples_total{job_id=\"3\",uid=\"1000\",rank=\"0\"} 300\n"));
  CHECK_THAT(text, Catch::Contains("spdld_job_samples_total{job_id=\"4\",uid=\"1000\",rank=\"1\"} 400\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_tasks_total{job_id=\"4\",stage=\"de\\\"code\"} 7\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_queue_length{job_id=\"3\",stage=\"read\"} 3\n"));
  CHECK_THAT(text, !Catch::Contains("job=\""));  // never a `job` label: it clashes with the scrape's
  CHECK_THAT(text, !Catch::Contains("_ms"));     // base units only
  // Stage task times: a histogram in seconds, cumulative buckets at octave bounds, sum and count.
  CHECK_THAT(text, Catch::Contains("# TYPE spdld_stage_task_seconds histogram\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_task_seconds_bucket{job_id=\"3\",stage=\"read\",le=\"1.6e-05\"} 2\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_task_seconds_bucket{job_id=\"3\",stage=\"read\",le=\"0.000512\"} 2\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_task_seconds_bucket{job_id=\"3\",stage=\"read\",le=\"0.001024\"} 6\n"));
  CHECK_THAT(text,
             Catch::Contains("spdld_stage_task_seconds_bucket{job_id=\"3\",stage=\"read\",le=\"67.108864\"} 6\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_task_seconds_bucket{job_id=\"3\",stage=\"read\",le=\"+Inf\"} 7\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_task_seconds_sum{job_id=\"3\",stage=\"read\"} 0.5\n"));
  CHECK_THAT(text, Catch::Contains("spdld_stage_task_seconds_count{job_id=\"3\",stage=\"read\"} 7\n"));
  // The client's waits: a histogram per job.
  CHECK_THAT(text, Catch::Contains("# TYPE spdld_client_wait_seconds histogram\n"));
  CHECK_THAT(text, Catch::Contains(
                       "spdld_client_wait_seconds_bucket{job_id=\"3\",uid=\"1000\",rank=\"0\",le=\"0.131072\"} 0\n"));
  CHECK_THAT(text, Catch::Contains(
                       "spdld_client_wait_seconds_bucket{job_id=\"3\",uid=\"1000\",rank=\"0\",le=\"0.262144\"} 3\n"));
  CHECK_THAT(text, Catch::Contains("spdld_client_wait_seconds_sum{job_id=\"3\",uid=\"1000\",rank=\"0\"} 0.25\n"));
  CHECK_THAT(text, Catch::Contains("spdld_client_wait_seconds_count{job_id=\"3\",uid=\"1000\",rank=\"0\"} 3\n"));
  CHECK_THAT(text, Catch::Contains(std::string("spdld_build_info{version=\"") + SPDLD_VERSION + "\"} 1\n"));
  CHECK_THAT(text, Catch::Contains("spdld_jobs 2\n"));
  CHECK_THAT(text, Catch::Contains("spdld_draining 1\n"));
  CHECK_THAT(text, Catch::Contains("spdld_memory_budget_bytes 1073741824\n"));
  for (const char* family : {"# TYPE spdld_job_samples_total ", "# TYPE spdld_stage_task_seconds "}) {
    size_t n = 0;
    for (size_t p = 0; (p = text.find(family, p)) != std::string::npos; ++p) ++n;
    CHECK(n == 1);
  }
  CHECK(text.back() == '\n');
}

TEST_CASE("metrics listen on metrics_bind: loopback by default, any address given, a bad one refused") {
  boost::asio::io_context io;
  MetricsServer loopback(&io, [](std::optional<uid_t>) { return std::string("x 1\n"); });
  REQUIRE(loopback.Start("127.0.0.1", 0).ok());
  CHECK_THAT(loopback.endpoint(), Catch::StartsWith("127.0.0.1:"));
  MetricsServer any(&io, [](std::optional<uid_t>) { return std::string("x 1\n"); });
  REQUIRE(any.Start("0.0.0.0", 0).ok());
  CHECK(any.endpoint() == "0.0.0.0:" + std::to_string(any.port()));
  MetricsServer bad(&io, [](std::optional<uid_t>) { return std::string(); });
  auto s = bad.Start("localhost", 0);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("metrics_bind 'localhost'"));
  MetricsServer taken(&io, [](std::optional<uid_t>) { return std::string(); });
  s = taken.Start("127.0.0.1", loopback.port());
  CHECK(s.code() == StatusCode::kUnavailable);
}

TEST_CASE("the log limiter lets a burst of each kind through per window and counts the rest") {
  LogLimiter limiter(3, std::chrono::seconds(10));
  const auto t0 = LogLimiter::Clock::time_point{} + std::chrono::hours(1);
  uint64_t dropped = 99;
  for (int i = 0; i < 3; ++i) {
    CHECK(limiter.Allow("bad frame", &dropped, t0 + std::chrono::milliseconds(i)));
    CHECK(dropped == 0);
  }
  for (int i = 0; i < 7; ++i) CHECK_FALSE(limiter.Allow("bad frame", &dropped, t0 + std::chrono::seconds(1)));
  CHECK(limiter.Allow("accept", &dropped, t0 + std::chrono::seconds(1)));  // other kinds are separate
  CHECK(dropped == 0);
  // A new window: allowed again, and told how many were dropped.
  CHECK(limiter.Allow("bad frame", &dropped, t0 + std::chrono::seconds(11)));
  CHECK(dropped == 7);
  CHECK(LogLimiter::Note(dropped) == " (7 similar lines suppressed)");
  CHECK(limiter.Allow("bad frame", &dropped, t0 + std::chrono::seconds(12)));
  CHECK(dropped == 0);
  CHECK(LogLimiter::Note(0).empty());
  CHECK(LogLimiter::Note(1) == " (1 similar line suppressed)");
}

TEST_CASE("LoopbackPeerUid: the kernel's socket table names who scrapes /metrics") {
  boost::asio::io_context io;
  using boost::asio::ip::tcp;
  tcp::acceptor acceptor(io, tcp::endpoint(boost::asio::ip::address_v4::loopback(), 0));
  tcp::socket client(io);
  client.connect(acceptor.local_endpoint());
  tcp::socket server = acceptor.accept();
  auto uid = LoopbackPeerUid(server.local_endpoint(), server.remote_endpoint());
  REQUIRE(uid.has_value());
  CHECK(*uid == ::getuid());
  // A connection that does not exist: unknown.
  CHECK_FALSE(LoopbackPeerUid(server.local_endpoint(), tcp::endpoint(boost::asio::ip::address_v4::loopback(), 1)));
  // Read from a given table: uid 1234 owns 127.0.0.1:40000 -> 127.0.0.1:9464.
  TempDir t;
  fs::create_directories(t.path + "/net");
  std::ofstream(t.path + "/net/tcp")
      << "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
      << "   0: 0100007F:9C40 0100007F:24F8 01 00000000:00000000 00:00000000 00000000  1234        0 4242 1\n";
  auto given = LoopbackPeerUid(tcp::endpoint(boost::asio::ip::address_v4::loopback(), 9464),
                               tcp::endpoint(boost::asio::ip::address_v4::loopback(), 40000), t.path);
  REQUIRE(given.has_value());
  CHECK(*given == 1234u);
}

}  // namespace
}  // namespace spdl::ops
