// End to end for dataset mixing (job config `sources:`, io/mixed_source.h): a real spdld mixing two
// generated image folders 0.7 / 0.3, driven by the real spdl-client. Two ranks: each epoch delivers
// every sample exactly once over the ranks, each rank 35 of the 70 and 15 of the 30, and the job
// stats count the samples per source; a fixed epoch_samples down-samples one source without a
// repeat before its whole pass; a run stopped mid-epoch and resumed records exactly the
// uninterrupted run; a mix that cannot work is refused naming its line.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "temp_dir.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;

using spdl::testing::TempDir;    // temp_dir.h
using spdl::testing::WriteFile;  // temp_dir.h

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

struct Record {
  int epoch = 0;
  int rank = 0;
  std::string path;
  int64_t label = 0;
};

std::vector<Record> Records(const std::string& csv) {
  std::vector<Record> out;
  for (const std::string& line : Lines(csv)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    REQUIRE(cols.size() == 4);
    out.push_back({std::stoi(cols[0]), std::stoi(cols[1]), cols[2], std::stoll(cols[3])});
  }
  return out;
}

// Folder A (7 classes x 10 = 70 images, class folders a_class_*) and B (3 x 10 = 30, b_class_*):
// distinct keys, so a record tells the source of each sample.
struct Fixture {
  Fixture() {
    for (auto [name, classes, seed] : {std::tuple{"a", 7, 1}, std::tuple{"b", 3, 2}}) {
      testdata::DatasetOptions o;
      o.classes = classes;
      o.images_per_class = 10;
      o.min_side = 32;
      o.max_side = 64;
      o.seed = static_cast<uint64_t>(seed);
      const std::string root = dir.path + "/" + name;
      auto r = testdata::MakeImageFolder(root, o);
      REQUIRE(r.ok());
      for (const auto& e : fs::directory_iterator(root)) {
        fs::rename(e.path(), fs::path(root) / (std::string(name) + "_" + e.path().filename().string()));
      }
      for (const auto& img : *r) keys[std::string(name) + "_" + img.path] = name;
    }
  }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  std::string Job(const std::string& body) const {
    const std::string path = dir.path + "/job-" + std::to_string(++jobs) + ".yaml";
    WriteFile(path, body +
                        "batch: {size: 10}\n"
                        "transforms: [{resize: {shorter: 24}}, {center_crop: {size: 24}}]\n"
                        "prefetch: 2\n");
    return path;
  }
  std::string Mix(const std::string& sampler = "sampler: {seed: 5}\n", const std::string& wa = "0.7",
                  const std::string& wb = "0.3") const {
    return Job("sources:\n  - {type: image_folder, root: " + dir.path + "/a, weight: " + wa +
               "}\n  - {type: image_folder, root: " + dir.path + "/b, weight: " + wb + "}\n" + sampler);
  }

  TempDir dir;
  std::map<std::string, std::string> keys;  // record path -> "a" or "b"
  mutable int jobs = 0;
};

const std::string kClient = std::string(SPDL_BIN_DIR) + "/spdl-client";

struct ClientRun {
  int rc = 0;
  nlohmann::json json;
  std::string out;
};

ClientRun RunClient(const Fixture& f, const std::string& job, std::vector<std::string> extra) {
  std::vector<std::string> argv = {kClient, "--socket", f.socket(), "--config", job, "--json", "--no-checksum"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  ClientRun r;
  r.rc = testing::RunCommandAs({}, argv, &r.out, /*merge_stderr=*/false);
  if (r.rc == 0) r.json = nlohmann::json::parse(r.out);
  return r;
}

ClientRun RunClientWithErrors(const Fixture& f, const std::string& job) {
  std::vector<std::string> argv = {kClient, "--socket", f.socket(), "--config", job, "--json"};
  ClientRun r;
  r.rc = testing::RunCommandAs({}, argv, &r.out, /*merge_stderr=*/true);
  return r;
}

TEST_CASE("mix e2e: two folders 0.7 / 0.3, two ranks, two epochs: exactly once per epoch, counts by source") {
  Fixture f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string job = f.Mix();
  std::map<int, std::map<std::string, int>> seen;  // epoch -> key -> deliveries over the ranks
  for (int rank : {0, 1}) {
    const std::string csv = f.dir.path + "/rank" + std::to_string(rank) + ".csv";
    ClientRun r =
        RunClient(f, job, {"--rank", std::to_string(rank), "--world-size", "2", "--epochs", "2", "--record", csv});
    INFO(r.out);
    REQUIRE(r.rc == 0);
    CHECK(r.json.at("samples") == 100);  // 50 per epoch
    // The job stats count per source: 35 + 15 per epoch on each rank.
    CHECK(r.json.at("source_samples") == nlohmann::json::array({70, 30}));
    CHECK(r.json.at("daemon").at("source_samples.0") == 70);
    CHECK(r.json.at("daemon").at("source_samples.1") == 30);
    std::map<int, std::map<std::string, int>> per_epoch_source;
    std::vector<std::string> first_half_sources;
    for (const Record& rec : Records(csv)) {
      INFO(rec.path);
      REQUIRE(f.keys.count(rec.path) == 1);
      CHECK(rec.rank == rank);
      ++seen[rec.epoch][rec.path];
      ++per_epoch_source[rec.epoch][f.keys.at(rec.path)];
      if (rec.epoch == 0 && first_half_sources.size() < 25) first_half_sources.push_back(f.keys.at(rec.path));
    }
    for (int epoch : {0, 1}) {
      CHECK(per_epoch_source[epoch]["a"] == 35);
      CHECK(per_epoch_source[epoch]["b"] == 15);
    }
    // Interleaved by the draw, not one source after the other: the first half of the epoch holds
    // both, near 0.7 / 0.3.
    const auto a_first = std::count(first_half_sources.begin(), first_half_sources.end(), "a");
    INFO("source a in the first 25: " << a_first);
    CHECK(a_first >= 12);
    CHECK(a_first <= 23);
  }
  for (int epoch : {0, 1}) {
    INFO("epoch " << epoch);
    CHECK(seen[epoch].size() == 100);  // all 70 + 30
    for (const auto& [key, n] : seen[epoch]) CHECK(n == 1);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("mix e2e: epoch_samples down-samples a source without repeats before its whole pass") {
  Fixture f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  // 60 draws per epoch, 0.5 / 0.5: B's 30 exactly once per epoch; A's 70 give 30 per epoch, and
  // none of A repeats within the two epochs (60 < 70).
  const std::string job = f.Mix("sampler: {seed: 9, epoch_samples: 60}\n", "1", "1");
  std::map<std::string, int> a_count;
  std::map<int, std::map<std::string, int>> b_count;
  for (int rank : {0, 1}) {
    const std::string csv = f.dir.path + "/r" + std::to_string(rank) + ".csv";
    ClientRun r =
        RunClient(f, job, {"--rank", std::to_string(rank), "--world-size", "2", "--epochs", "2", "--record", csv});
    INFO(r.out);
    REQUIRE(r.rc == 0);
    CHECK(r.json.at("samples") == 60);
    CHECK(r.json.at("source_samples") == nlohmann::json::array({30, 30}));
    for (const Record& rec : Records(csv)) {
      if (f.keys.at(rec.path) == "a")
        ++a_count[rec.path];
      else
        ++b_count[rec.epoch][rec.path];
    }
  }
  CHECK(a_count.size() == 60);
  for (const auto& [key, n] : a_count) CHECK(n == 1);
  for (int epoch : {0, 1}) {
    CHECK(b_count[epoch].size() == 30);
    for (const auto& [key, n] : b_count[epoch]) CHECK(n == 1);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("mix e2e: a run stopped mid-epoch and resumed records exactly the uninterrupted run") {
  Fixture f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string job = f.Mix();
  const std::vector<std::string> common = {"--rank", "1", "--world-size", "2", "--epochs", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = common;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  ClientRun full = RunClient(f, job, with({"--record", f.dir.path + "/full.csv"}));
  INFO(full.out);
  REQUIRE(full.rc == 0);
  const auto full_lines = Lines(f.dir.path + "/full.csv");
  REQUIRE(full_lines.size() == 100);
  for (int stop : {2, 5, 7}) {  // inside the first epoch, on its last batch, inside the second
    INFO("stop after " << stop);
    ClientRun a = RunClient(f, job, with({"--stop-after", std::to_string(stop), "--record", f.dir.path + "/a.csv"}));
    INFO(a.out);
    REQUIRE(a.rc == 0);
    REQUIRE(a.json.at("state").is_string());
    ClientRun b =
        RunClient(f, job, with({"--resume", a.json.at("state").get<std::string>(), "--record", f.dir.path + "/b.csv"}));
    INFO(b.out);
    REQUIRE(b.rc == 0);
    auto joined = Lines(f.dir.path + "/a.csv");
    for (auto& l : Lines(f.dir.path + "/b.csv")) joined.push_back(l);
    CHECK(joined == full_lines);
  }
  {  // another weight is another order: the token is refused
    ClientRun a = RunClient(f, job, with({"--stop-after", "1"}));
    REQUIRE(a.rc == 0);
    ClientRun b = RunClient(f, f.Mix("sampler: {seed: 5}\n", "0.6", "0.4"),
                            with({"--resume", a.json.at("state").get<std::string>()}));
    CHECK(b.rc == 1);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("mix e2e: two coco sets mix, each sample with its own boxes") {
  Fixture f;
  // A COCO instances JSON per folder: every image with one box of category 1 (a) or 2 (b).
  for (const char* name : {"a", "b"}) {
    nlohmann::json coco = {{"images", nlohmann::json::array()},
                           {"annotations", nlohmann::json::array()},
                           {"categories", {{{"id", 1}, {"name", "one"}}, {{"id", 2}, {"name", "two"}}}}};
    int id = 0;
    for (const auto& [key, source] : f.keys) {
      if (source != name) continue;
      ++id;
      coco["images"].push_back({{"id", id}, {"file_name", key}, {"width", 32}, {"height", 32}});
      coco["annotations"].push_back({{"id", id},
                                     {"image_id", id},
                                     {"category_id", source == "a" ? 1 : 2},
                                     {"bbox", {1, 1, 10, 10}},
                                     {"area", 100},
                                     {"iscrowd", 0}});
    }
    WriteFile(f.dir.path + "/" + name + ".json", coco.dump());
  }
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string job =
      f.Job("sources:\n  - {type: coco, annotations: " + f.dir.path + "/a.json, root: " + f.dir.path +
            "/a, max_boxes: 4, weight: 0.7}\n  - {type: coco, annotations: " + f.dir.path +
            "/b.json, root: " + f.dir.path + "/b, max_boxes: 4, weight: 0.3}\nsampler: {seed: 2}\n");
  std::vector<std::string> argv = {kClient, "--socket", f.socket(), "--config", job, "--json", "--epochs", "1"};
  std::string out;
  const int rc = testing::RunCommandAs({}, argv, &out, /*merge_stderr=*/false);
  INFO(out);
  REQUIRE(rc == 0);
  const nlohmann::json j = nlohmann::json::parse(out);
  CHECK(j.at("samples") == 100);
  CHECK(j.at("source_samples") == nlohmann::json::array({70, 30}));
  // The coco tensors of every source: boxes, box_labels, box_count.
  for (const char* t : {"boxes", "box_labels", "box_count"}) CHECK(j.at("checksums").contains(t));
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("mix e2e: a mix that cannot work is refused, naming the entry and its line") {
  Fixture f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  {  // different output tensors: a coco source beside an image folder (line 3 of the job file)
    ClientRun r = RunClientWithErrors(
        f, f.Job("sources:\n  - {type: image_folder, root: " + f.dir.path +
                 "/a}\n  - {type: coco, annotations: " + f.dir.path + "/c.json, root: " + f.dir.path + "/b}\n"));
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains(":3:") && Catch::Contains("sources.1") && Catch::Contains("coco"));
  }
  {  // a source that cannot be opened: named by its entry
    ClientRun r = RunClientWithErrors(f, f.Job("sources:\n  - {type: image_folder, root: " + f.dir.path +
                                               "/a}\n  - {type: image_folder, root: " + f.dir.path + "/missing}\n"));
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("sources.1 (line 3)") && Catch::Contains("missing"));
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
