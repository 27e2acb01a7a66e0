// End to end for the source index cache (io/source_index_cache.h): the ranks of one run on one
// daemon scan their image folder once between them (spdlctl status: source_index_scans), still
// cover the epoch exactly once, and a later run after the dataset changed scans again and sees
// the change. A real spdld, real spdl-client processes, a generated image folder.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
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

// Sets the mtime of everything below `dir` a minute back: an index of a dataset modified within
// the last kRacyWindowNs is never reused, and this one was written just now.
void Backdate(const std::string& dir) {
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(1);
  fs::last_write_time(dir, old);
  for (const auto& e : fs::recursive_directory_iterator(dir)) fs::last_write_time(e.path(), old);
}

struct Fixture {
  Fixture() {
    testdata::DatasetOptions o;
    o.classes = 4;
    o.images_per_class = 10;  // 40 images: 10 per rank of 4
    o.min_side = 32;
    o.max_side = 64;
    REQUIRE(testdata::MakeImageFolder(dir + "/data", o).ok());
    Backdate(dir + "/data");
    std::ofstream(dir + "/spdld.yaml") << "allowed_roots: [" << dir << "]\n";
    std::ofstream(dir + "/job.yaml") << "source: {type: image_folder, root: " << dir << "/data}\n"
                                     << "sampler: {shuffle: true, seed: 3}\n"
                                     << "batch: {size: 1}\n"
                                     << "transforms: [{resize: {shorter: 24}}, {center_crop: {size: 16}}]\n"
                                     << "prefetch: 2\n";
    daemon =
        std::make_unique<DaemonProcess>(dir + "/spdld.sock", std::vector<std::string>{"--config", dir + "/spdld.yaml"});
    REQUIRE(daemon->Connectable());
  }
  ~Fixture() { daemon.reset(); }
  // Starts a client of the job; its stdout goes to `name`.json, its record to `name`.csv.
  pid_t Start(const std::string& name, std::vector<std::string> args) const {
    std::vector<std::string> argv = {kClient,           "--socket", dir + "/spdld.sock", "--config",
                                     dir + "/job.yaml", "--json",   "--record",          dir + "/" + name + ".csv"};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::SpawnToFile(argv, dir + "/" + name + ".json");
  }
  nlohmann::json Status() const {
    std::string out;
    testing::RunCommand({kCtl, "--socket", dir + "/spdld.sock", "--json", "status"}, &out);
    return nlohmann::json::parse(out, nullptr, false);
  }
  // (epoch, path) -> how many times the records of `names` hold it.
  std::map<std::string, int> Delivered(const std::vector<std::string>& names) const {
    std::map<std::string, int> seen;
    for (const std::string& name : names) {
      std::ifstream in(dir + "/" + name + ".csv");
      for (std::string line; std::getline(in, line);) {
        const auto c1 = line.find(','), c2 = line.find(',', c1 + 1), c3 = line.find(',', c2 + 1);
        ++seen[line.substr(0, c1) + "/" + line.substr(c2 + 1, c3 - c2 - 1)];
      }
    }
    return seen;
  }

  testing::TempDir tmp;  // declared first: removed after everything else has gone
  const std::string dir = tmp.path;
  std::unique_ptr<DaemonProcess> daemon;
};

int Wait(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

uint64_t Counter(const nlohmann::json& status, const char* name) {
  return status.contains(name) ? std::stoull(status[name].get<std::string>()) : 0;  // uint64 is a JSON string
}

TEST_CASE("source index: 4 ranks of one run share one folder scan and cover the epoch exactly once") {
  Fixture f;
  // A job that holds the index meanwhile (an unbounded run, stopped at the end), so that a rank
  // that happens to start after another has finished still finds the index live: the count
  // below does not depend on how the ranks' starts interleave.
  const pid_t holder = f.Start("holder", {"--epochs", "0", "--no-checksum"});
  for (int i = 0; i < 500; ++i) {
    const auto st = f.Status();
    if (!st.is_discarded() && st.contains("jobs") && !st["jobs"].empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto before = f.Status();
  REQUIRE_FALSE(before.is_discarded());
  REQUIRE(Counter(before, "source_index_scans") == 1);

  std::vector<pid_t> ranks;
  std::vector<std::string> names;
  for (int r = 0; r < 4; ++r) {
    names.push_back("rank" + std::to_string(r));
    ranks.push_back(f.Start(names.back(), {"--rank", std::to_string(r), "--world-size", "4", "--epochs", "2"}));
  }
  for (pid_t p : ranks) CHECK(Wait(p) == 0);
  const auto after = f.Status();
  REQUIRE_FALSE(after.is_discarded());
  CHECK(Counter(after, "source_index_scans") == 1);  // the holder's scan, shared by every rank
  CHECK(Counter(after, "source_index_shared") == 4);
  ::kill(holder, SIGKILL);
  Wait(holder);

  // Exactly once per epoch across the ranks: 40 distinct paths in each of the two epochs.
  const auto seen = f.Delivered(names);
  CHECK(seen.size() == 80);
  for (const auto& [key, n] : seen) CHECK(n == 1);

  // The dataset changes; with no job holding the index any more, the next run scans afresh (and
  // would, were one holding it: the class directory's mtime changed) and sees the new file.
  std::string cls, image;
  for (const auto& e : fs::directory_iterator(f.dir + "/data")) {
    if (e.is_directory()) cls = e.path().string();
  }
  REQUIRE_FALSE(cls.empty());
  for (const auto& e : fs::directory_iterator(cls)) image = e.path().string();
  fs::copy_file(image, cls + "/zz_added.jpg");
  REQUIRE(Wait(f.Start("later", {"--epochs", "1"})) == 0);
  CHECK(Counter(f.Status(), "source_index_scans") == 2);
  CHECK(f.Delivered({"later"}).size() == 41);
}

}  // namespace
}  // namespace spdl
