// End to end for node-wide sharing: a real spdld, real spdl-client processes, a generated image
// folder. The sample cache serves a second job on the same dataset without reading a file (the
// files are overwritten with junk in between, which a read would turn into skipped samples: the
// documented "the cache assumes files do not change" behaviour, and proof that nothing was read);
// jobs with share: true get identical batches from one pipeline, and a member killed while it
// holds slots does not stop the others from finishing exactly.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "temp_dir.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;

const std::string kClient = std::string(SPDL_BIN_DIR) + "/spdl-client";
const std::string kCtl = std::string(SPDL_BIN_DIR) + "/spdlctl";

// "c0", "c1", ...
std::string ClientName(int i) { return "c" + std::to_string(i); }

struct Fixture {
  explicit Fixture(const std::string& daemon_extra = "") {
    testdata::DatasetOptions o;
    o.classes = 3;
    o.images_per_class = 8;  // 24 images
    o.min_side = 48;
    o.max_side = 120;
    REQUIRE(testdata::MakeImageFolder(dir + "/data", o).ok());
    std::ofstream(dir + "/spdld.yaml") << "allowed_roots: [" << dir << "]\n" << daemon_extra;
    daemon =
        std::make_unique<DaemonProcess>(dir + "/spdld.sock", std::vector<std::string>{"--config", dir + "/spdld.yaml"});
    REQUIRE(daemon->Connectable());
  }
  ~Fixture() { daemon.reset(); }
  std::string Job(const std::string& extra) const {
    const std::string path = dir + "/job-" + std::to_string(++jobs) + ".yaml";
    std::ofstream(path) << "source: {type: image_folder, root: " << dir << "/data}\n"
                        << "sampler: {shuffle: true, seed: 5}\n"
                        << "batch: {size: 2}\n"
                        << "transforms: [{resize: {shorter: 40}}, {center_crop: {size: 32}}]\n"
                        << "prefetch: 2\n"
                        << extra;
    return path;
  }
  // Starts a client writing its JSON to `name`.json and its record to `name`.csv.
  pid_t Start(const std::string& job, const std::string& name, int epochs) const {
    const std::vector<std::string> argv = {
        kClient,  "--socket", dir + "/spdld.sock",    "--config", job,
        "--json", "--epochs", std::to_string(epochs), "--record", dir + "/" + name + ".csv"};
    return testing::SpawnToFile(argv, dir + "/" + name + ".json");
  }
  nlohmann::json Result(const std::string& name) const {
    std::ifstream in(dir + "/" + name + ".json");
    return nlohmann::json::parse(in, nullptr, false);
  }
  std::string Record(const std::string& name) const {
    std::ifstream in(dir + "/" + name + ".csv");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Jobs the daemon lists for this uid (every member of a share group is one).
  int Jobs() const {
    std::string out;
    testing::RunCommand({kCtl, "--socket", dir + "/spdld.sock", "--json", "status"}, &out);
    auto j = nlohmann::json::parse(out, nullptr, false);
    if (j.is_discarded()) return -1;
    return j.contains("jobs") ? static_cast<int>(j["jobs"].size()) : 0;
  }

  testing::TempDir tmp;  // declared first: removed after everything else has gone
  const std::string dir = tmp.path;
  std::unique_ptr<DaemonProcess> daemon;
  mutable int jobs = 0;
};

int Wait(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

void Junk(const std::string& data_dir) {
  for (const auto& e : fs::recursive_directory_iterator(data_dir)) {
    if (e.is_regular_file()) std::ofstream(e.path(), std::ios::trunc) << "not an image any more";
  }
}

// One job reads the dataset; the files are then overwritten with junk; a second job on the same
// dataset gets the same pixels with nothing skipped when the cache holds it, and, when there is no
// cache, reads the junk: every sample fails, so the job fails (max_failures, and no sample
// delivered) and spdl-client exits non-zero.
void CacheRun(bool cache) {
  Fixture f(cache ? "cache_bytes: 64MiB\n" : "");
  const std::string job = f.Job("");
  REQUIRE(Wait(f.Start(job, "first", 1)) == 0);
  Junk(f.dir + "/data");
  const int second_rc = Wait(f.Start(job, "second", 1));
  const auto first = f.Result("first");
  REQUIRE_FALSE(first.is_discarded());
  CHECK(first["skipped"] == 0);
  if (cache) {
    REQUIRE(second_rc == 0);
    const auto second = f.Result("second");
    REQUIRE_FALSE(second.is_discarded());
    CHECK(second["skipped"] == 0);
    CHECK(second["pixel_checksum"] == first["pixel_checksum"]);
    CHECK(f.Record("second") == f.Record("first"));
  } else {
    CHECK(second_rc != 0);
  }
}

TEST_CASE("sample cache: a second job on a cached dataset reads no file") { CacheRun(true); }

TEST_CASE("sample cache: without the cache the same second job reads the junk") { CacheRun(false); }

TEST_CASE("share: three identical clients get identical batches from one pipeline") {
  Fixture f;
  const std::string job = f.Job("share: true\nshare_members: 3\n");
  std::vector<pid_t> pids;
  pids.reserve(3);
  for (int i = 0; i < 3; ++i) pids.push_back(f.Start(job, ClientName(i), 2));
  for (pid_t p : pids) CHECK(Wait(p) == 0);
  const auto c0 = f.Result("c0");
  REQUIRE_FALSE(c0.is_discarded());
  CHECK(c0["skipped"] == 0);
  CHECK(c0["batches"] == 24);  // 12 batches x 2 epochs
  for (int i = 1; i < 3; ++i) {
    const auto ci = f.Result(ClientName(i));
    REQUIRE_FALSE(ci.is_discarded());
    CHECK(ci["pixel_checksum"] == c0["pixel_checksum"]);
    CHECK(ci["batches"] == c0["batches"]);
    CHECK(f.Record(ClientName(i)) == f.Record("c0"));
  }
}

TEST_CASE("share: a member killed while holding slots leaves, and the others finish exactly") {
  Fixture f;
  const std::string job = f.Job("share: true\nshare_members: 3\n");
  // The victim joins first and is stopped: once the others join, the group fills the ring and
  // waits for it (it holds every slot it was sent).
  const pid_t victim = f.Start(job, "victim", 2);
  for (int i = 0; i < 500 && f.Jobs() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(f.Jobs() == 1);
  ::kill(victim, SIGSTOP);
  std::vector<pid_t> pids;
  pids.reserve(2);
  for (int i = 0; i < 2; ++i) pids.push_back(f.Start(job, ClientName(i), 2));
  for (int i = 0; i < 500 && f.Jobs() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(f.Jobs() == 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int status = 0;
  CHECK(::waitpid(pids[0], &status, WNOHANG) == 0);  // held back by the stopped member
  ::kill(victim, SIGKILL);
  CHECK(Wait(victim) == -SIGKILL);
  for (pid_t p : pids) CHECK(Wait(p) == 0);
  const auto c0 = f.Result("c0"), c1 = f.Result("c1");
  REQUIRE_FALSE(c0.is_discarded());
  REQUIRE_FALSE(c1.is_discarded());
  CHECK(c0["batches"] == 24);
  CHECK(c0["skipped"] == 0);
  CHECK(c1["pixel_checksum"] == c0["pixel_checksum"]);
  CHECK(f.Record("c1") == f.Record("c0"));
  // Exactly once per epoch: 24 distinct paths in each of the two epochs.
  std::istringstream in(f.Record("c0"));
  std::map<std::string, int> seen;
  for (std::string line; std::getline(in, line);) {
    const auto c1p = line.find(','), c2p = line.find(',', c1p + 1), c3p = line.find(',', c2p + 1);
    ++seen[line.substr(0, c1p) + "/" + line.substr(c2p + 1, c3p - c2p - 1)];
  }
  CHECK(seen.size() == 48);
  for (const auto& [k, n] : seen) CHECK(n == 1);
}

}  // namespace
}  // namespace spdl
