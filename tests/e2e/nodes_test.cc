// Many nodes, simulated on one machine: one spdld per "node" (two daemons, two sockets), the ranks
// of one 4-rank run spread over them (ranks 0-1 on node A, 2-3 on node B), as torchrun or Slurm
// would give each trainer its global RANK and WORLD_SIZE. The daemons share nothing: the epoch is
// covered exactly once only because the order is a pure function of (dataset, seed, epoch, rank,
// world size). Also: a rank gets the same samples whichever node serves it, and a rank whose node
// daemon is killed resumes on the restarted daemon from its last state token, exactly.
#include <signal.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"

namespace spdl {
namespace {

using testing::DaemonProcess;
using testing::RunCommand;
using testing::TempDir;

constexpr int kWorld = 4;

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

struct Cluster {
  Cluster() {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 12;  // 24 samples: 6 per rank, 2 batches of 3
    o.min_side = 50;
    o.max_side = 90;
    REQUIRE(testdata::MakeImageFolder(data(), o).ok());
    testing::WriteFile(job(), "source: {type: image_folder, root: " + data() +
                                  "}\nsampler: {shuffle: true, seed: 7}\nbatch: {size: 3}\n"
                                  "transforms:\n  - resize: {height: 16, width: 16}\nprefetch: 2\n");
  }
  std::string data() const { return dir.path + "/data"; }
  std::string job() const { return dir.path + "/job.yaml"; }
  std::string socket(char node) const { return dir.path + "/node-" + node + ".sock"; }
  std::unique_ptr<DaemonProcess> Start(char node) const {
    auto d = std::make_unique<DaemonProcess>(socket(node),
                                             std::vector<std::string>{"--allow-root", dir.path, "--threads", "1"});
    REQUIRE(d->Connectable());
    return d;
  }
  // Runs one rank's trainer against `node`; returns its --json output. `record` gets its samples.
  nlohmann::json Trainer(char node, int rank, const std::string& record, std::vector<std::string> extra = {}) const {
    std::vector<std::string> argv = {std::string(SPDL_BIN_DIR) + "/spdl-client",
                                     "--socket",
                                     socket(node),
                                     "--config",
                                     job(),
                                     "--rank",
                                     std::to_string(rank),
                                     "--world-size",
                                     std::to_string(kWorld),
                                     "--epochs",
                                     "2",
                                     "--record",
                                     record,
                                     "--json"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::string out;
    REQUIRE(RunCommand(argv, &out) == 0);
    return nlohmann::json::parse(out);
  }
  TempDir dir;
};

// "epoch,rank,path,label" lines -> per epoch, how many times each path was delivered.
void Count(const std::vector<std::string>& lines, std::map<int, std::map<std::string, int>>* seen) {
  for (const auto& l : lines) {
    const size_t a = l.find(','), b = l.find(',', a + 1), c = l.rfind(',');
    (*seen)[std::stoi(l.substr(0, a))][l.substr(b + 1, c - b - 1)]++;
  }
}

TEST_CASE("two node daemons with two ranks each cover every epoch of a 4-rank run exactly once") {
  Cluster c;
  auto a = c.Start('A');
  auto b = c.Start('B');
  std::map<int, std::map<std::string, int>> seen;
  for (int rank = 0; rank < kWorld; ++rank) {
    const std::string record = c.dir.path + "/rank" + std::to_string(rank) + ".csv";
    const auto j = c.Trainer(rank < 2 ? 'A' : 'B', rank, record);
    CHECK(j.at("samples").get<int>() == 12);  // 6 per epoch
    Count(Lines(record), &seen);
  }
  REQUIRE(seen.size() == 2);
  for (const auto& [epoch, paths] : seen) {
    INFO("epoch " << epoch);
    CHECK(paths.size() == 24);
    for (const auto& [path, n] : paths) CHECK(n == 1);
  }
  CHECK(a->Stop() == std::optional<int>(0));
  CHECK(b->Stop() == std::optional<int>(0));
}

TEST_CASE("a rank gets the same samples from any node, and resumes on a restarted node daemon exactly") {
  Cluster c;
  auto a = c.Start('A');
  auto b = c.Start('B');
  const std::string on_a = c.dir.path + "/rank2-on-a.csv";
  c.Trainer('A', 2, on_a);
  const std::string on_b = c.dir.path + "/rank2-on-b.csv";
  const auto first = c.Trainer('B', 2, on_b, {"--stop-after", "3"});  // into the second epoch
  const std::string state = first.at("state").get<std::string>();
  REQUIRE_FALSE(state.empty());

  // Node B's daemon dies; it is restarted on the same socket and the trainer resumes there.
  REQUIRE(b->Stop(SIGKILL) == std::optional<int>(-SIGKILL));
  b = c.Start('B');
  const std::string rest = c.dir.path + "/rank2-rest.csv";
  const auto second = c.Trainer('B', 2, rest, {"--resume", state});
  CHECK(first.at("samples").get<int>() + second.at("samples").get<int>() == 12);

  std::vector<std::string> resumed = Lines(on_b);
  for (const auto& l : Lines(rest)) resumed.push_back(l);
  CHECK(resumed == Lines(on_a));
  CHECK(a->Stop() == std::optional<int>(0));
  CHECK(b->Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
