// Soak, end to end: one real spdld, 8 trainer processes (ranks 0..7 of one job) over several
// epochs. Trainers are killed with SIGKILL at random and restarted from the resume token of the
// last batch they recorded, like a trainer restarted from its checkpoint; in the first round the
// daemon itself is killed once and restarted. At the end of every round each rank has received
// exactly its samples, each once per epoch, and the 8 ranks together every sample once per epoch.
// Between two quiet points (no job live) the daemon's open descriptors must not grow, nor its
// resident memory beyond a small tolerance.
//
// Bounded for CI (well under 2 minutes). For a longer manual run:
//   SPDL_SOAK_ROUNDS=20 SPDL_SOAK_EPOCHS=10 build/bin/soak_test
// SPDL_SOAK_SEED changes the kill pattern (printed on failure).
#include <fcntl.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
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
using testing::TempDir;

constexpr uint32_t kRanks = 8;
constexpr int kBatch = 4;

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  int n = 0;  // not a number: 0, as atoi gives
  (void)std::from_chars(v, v + std::strlen(v), n);
  return n;
}

std::string Hex(const std::string& bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}
std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// One trainer, in a forked child: runs its rank from `token` (empty = from the start), appends
// one line per batch to `record` ("EPOCH TOKEN PATH,PATH,...", written with one write(2)), sleeps
// `pause_ms` per batch like a training step. Exits 0 at the job's end, 3 on any error. Never returns.
[[noreturn]] void Trainer(const client::Options& base, uint32_t rank, const std::string& token,
                          const std::string& record, int pause_ms) {
  int fd = ::open(record.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) _exit(4);
  client::Options o = base;
  o.rank = rank;
  o.resume_token = token;
  auto l = client::Loader::Open(o);
  if (!l.ok()) _exit(3);
  for (;;) {
    auto ev = (*l)->Next();
    if (!ev.ok()) _exit(3);
    if (auto* b = std::get_if<client::Batch>(&*ev)) {
      std::string line = std::to_string(b->epoch()) + " " + Hex(b->resume_token()) + " ";
      for (size_t i = 0; i < b->paths().size(); ++i) line += (i ? "," : "") + b->paths()[i];
      line += '\n';
      if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(5);
      std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    } else if (std::holds_alternative<client::JobStats>(*ev)) {
      _exit(0);
    }
  }
}

// What a rank's record file says: the samples per epoch and the last token, from whole lines.
struct Record {
  std::map<uint32_t, std::vector<std::string>> epochs;
  std::string token;
  uint64_t batches = 0;
};
Record ReadRecord(const std::string& path) {
  Record r;
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream lines(all);
  size_t consumed = 0;
  for (std::string line; std::getline(lines, line);) {
    consumed += line.size() + 1;
    if (consumed > all.size()) break;  // the last line has no newline: cut short by a kill
    std::istringstream f(line);
    uint32_t epoch = 0;
    std::string token, paths;
    f >> epoch >> token >> paths;
    r.token = Unhex(token);
    ++r.batches;
    std::stringstream ps(paths);
    for (std::string p; std::getline(ps, p, ',');) r.epochs[epoch].push_back(p);
  }
  return r;
}

struct Soak {
  TempDir dir;
  std::set<std::string> all;
  uint32_t epochs = 0;
  uint64_t batches_per_rank = 0;
  int pause_ms = 0;
  std::mt19937_64 rng;
  client::Options base;

  std::string socket() const { return dir.path + "/spdld.sock"; }
  std::unique_ptr<DaemonProcess> StartDaemon() {
    auto d = std::make_unique<DaemonProcess>(
        socket(), std::vector<std::string>{"--allow-root", dir.path + "/data", "--threads", "2"});
    REQUIRE(d->Connectable());
    return d;
  }

  // One round: 8 ranks to the end, with random trainer kills and, if `restart_daemon`, one daemon
  // kill + restart in the middle. Checks the counts. Returns the number of trainer kills.
  int Round(int round, std::unique_ptr<DaemonProcess>* daemon, bool restart_daemon) {
    std::vector<std::string> records;
    records.reserve(kRanks);
    std::vector<pid_t> pids(kRanks, -1);
    std::vector<bool> done(kRanks, false);
    for (uint32_t r = 0; r < kRanks; ++r) {
      records.push_back(dir.path + "/round" + std::to_string(round) + "_rank" + std::to_string(r) + ".rec");
    }
    auto start = [&](uint32_t r) {
      const std::string token = ReadRecord(records[r]).token;
      pid_t p = ::fork();
      if (p == 0) Trainer(base, r, token, records[r], pause_ms);
      pids[r] = p;
    };
    for (uint32_t r = 0; r < kRanks; ++r) start(r);
    int kills = 0, restarts = 0;
    bool daemon_restarted = !restart_daemon;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
    while (std::count(done.begin(), done.end(), true) < static_cast<long>(kRanks)) {
      REQUIRE(std::chrono::steady_clock::now() < deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      uint64_t recorded = 0;
      for (uint32_t r = 0; r < kRanks; ++r) {
        if (pids[r] < 0) continue;
        int status = 0;
        if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
        pids[r] = -1;
        const Record rec = ReadRecord(records[r]);
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
          done[r] = true;
          continue;
        }
        // Killed, or lost its daemon: restart from the last recorded batch, unless it had them all.
        if (rec.batches == batches_per_rank) {
          done[r] = true;
          continue;
        }
        REQUIRE(++restarts < 500);
        start(r);
      }
      for (uint32_t r = 0; r < kRanks; ++r) recorded += ReadRecord(records[r]).batches;
      // Now and then kill a trainer that is running.
      if (rng() % 4 == 0) {
        const uint32_t r = static_cast<uint32_t>(rng() % kRanks);
        if (pids[r] > 0 && !done[r]) {
          ::kill(pids[r], SIGKILL);
          ++kills;
        }
      }
      // Once, about a third of the way through: the daemon dies and comes back.
      if (!daemon_restarted && recorded * 3 >= batches_per_rank * kRanks) {
        REQUIRE((*daemon)->Stop(SIGKILL) == std::optional<int>(-SIGKILL));
        daemon->reset();
        *daemon = StartDaemon();
        daemon_restarted = true;
      }
    }
    CHECK(daemon_restarted);
    // Counts: each rank its samples once per epoch; the ranks together every sample once.
    for (uint32_t e = 0; e < epochs; ++e) {
      std::multiset<std::string> union_of_ranks;
      for (uint32_t r = 0; r < kRanks; ++r) {
        const Record rec = ReadRecord(records[r]);
        INFO("round " << round << " rank " << r << " epoch " << e);
        REQUIRE(rec.epochs.count(e));
        const auto& got = rec.epochs.at(e);
        CHECK(got.size() == all.size() / kRanks);
        CHECK(std::set<std::string>(got.begin(), got.end()).size() == got.size());
        union_of_ranks.insert(got.begin(), got.end());
      }
      CHECK(union_of_ranks == std::multiset<std::string>(all.begin(), all.end()));
    }
    return kills;
  }
};

// The daemon with no job live: waits until its status says so, then reads fds and RSS.
struct Quiet {
  int fds = 0;
  long rss_kib = 0;
};
Quiet QuietPoint(const Soak& s, const DaemonProcess& d) {
  proto::ClientMessage req;
  req.mutable_status();
  for (int i = 0; i < 250; ++i) {
    auto r = client::ControlCall(s.socket(), req);
    REQUIRE(r.ok());
    if (r->status().live_jobs() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the status call's session closes
  return {testing::FdCount(d.pid()), testing::RssKiB(d.pid())};
}

TEST_CASE(
    "soak: 8 trainers killed at random and a daemon restart lose and repeat nothing, and the daemon does not grow") {
  Soak s;
  const uint64_t seed = static_cast<uint64_t>(EnvInt("SPDL_SOAK_SEED", 1));
  const int rounds = std::max(2, EnvInt("SPDL_SOAK_ROUNDS", 2));
  s.rng.seed(seed);
  s.epochs = static_cast<uint32_t>(EnvInt("SPDL_SOAK_EPOCHS", 4));
  s.pause_ms = EnvInt("SPDL_SOAK_PAUSE_MS", 40);
  INFO("SPDL_SOAK_SEED=" << seed << " SPDL_SOAK_ROUNDS=" << rounds << " SPDL_SOAK_EPOCHS=" << s.epochs);
  testdata::DatasetOptions o;
  o.classes = 4;
  o.images_per_class = 40;  // 160 samples: 20 per rank per epoch, 5 batches of 4
  o.min_side = 48;
  o.max_side = 96;
  auto images = testdata::MakeImageFolder(s.dir.path + "/data", o);
  REQUIRE(images.ok());
  for (auto& g : *images) s.all.insert(g.path);
  s.batches_per_rank = s.epochs * (s.all.size() / kRanks / kBatch);
  s.base.socket_path = s.socket();
  s.base.config_yaml = "source: {type: image_folder, root: " + s.dir.path +
                       "/data}\nsampler: {shuffle: true, seed: 11}\nbatch: {size: 4}\n"
                       "transforms: [{resize: {height: 24, width: 24}}]\nprefetch: 2\n";
  s.base.config_name = "soak.yaml";
  s.base.world_size = kRanks;
  s.base.epochs = s.epochs;

  auto daemon = s.StartDaemon();
  int kills = s.Round(0, &daemon, /*restart_daemon=*/true);
  // Round 1 warms the restarted daemon's caches; the quiet points bracket the rounds after it.
  kills += s.Round(1, &daemon, false);
  const Quiet first = QuietPoint(s, *daemon);
  for (int round = 2; round < rounds + 1; ++round) kills += s.Round(round, &daemon, false);
  const Quiet last = QuietPoint(s, *daemon);
  WARN("soak: " << rounds + 1 << " rounds, " << kills << " trainer kills, daemon fds " << first.fds << " -> "
                << last.fds << ", RSS " << first.rss_kib << " -> " << last.rss_kib << " KiB");
  CHECK(kills > 0);
  CHECK(last.fds == first.fds);
  // Allocator caches and per-thread decoders may settle a little; a leak of a few KiB per job or
  // per batch would show as megabytes here.
  CHECK(last.rss_kib <= first.rss_kib + 8 * 1024);
  CHECK(daemon->Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
