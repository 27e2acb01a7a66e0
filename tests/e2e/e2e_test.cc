// End to end: a real spdld process, real clients over the real socket, real JPEG files decoded by
// libjpeg-turbo and resized by swscale into real shared memory.
#include <dirent.h>
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "media/image_decoder.h"
#include "proto/job_stats_fields.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunCommand;
using testing::TempDir;

// Mean absolute difference allowed between what the daemon delivers and a full-size reference
// decode + bilinear resize of the same file. These images carry fine noise (like photographs), and
// DCT-domain downscaling averages it where a bilinear resize of the full decode samples it, so
// single pixels differ by more than on smooth images; the media tests bound smooth images tightly.
// Measured worst image here: 4.2.
constexpr double kMeanAbsTolerance = 6.0;

std::string JobYaml(const std::string& root, int batch, int prefetch, const std::string& extra = "") {
  std::ostringstream y;
  y << "source: {type: image_folder, root: " << root << "}\n"
    << "sampler: {shuffle: true, seed: 7}\n"
    << "batch: {size: " << batch << ", drop_last: false}\n"
    << "transforms:\n"
    << "  - resize: {shorter: 80}\n"
    << "  - center_crop: {size: 64}\n"
    << "prefetch: " << prefetch << "\n"
    << extra;
  return y.str();
}

std::set<std::string> ShmEntries() {
  std::set<std::string> out;
  std::error_code ec;
  for (auto& e : fs::directory_iterator("/dev/shm", ec)) out.insert(e.path().filename().string());
  return out;
}

struct Fixture {
  Fixture(int classes = 4, int per_class = 24) {
    const testdata::DatasetOptions o = testing::SmallImages(classes, per_class, 90, 400);
    auto r = testdata::MakeImageFolder(data_root(), o);
    REQUIRE(r.ok());
    images = *r;
    for (auto& g : images) label_of[g.path] = g.label;
  }
  std::string data_root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  TempDir dir;
  std::vector<testdata::GeneratedImage> images;
  std::map<std::string, int64_t> label_of;
};

client::Options Opts(const Fixture& f, const std::string& yaml, uint32_t rank, uint32_t world, uint32_t epochs) {
  client::Options o;
  o.socket_path = f.socket();
  o.config_yaml = yaml;
  o.config_name = "job.yaml";
  o.rank = rank;
  o.world_size = world;
  o.epochs = epochs;
  return o;
}

// What one rank received: per epoch, the paths in order; plus pixel checks done on the way.
struct RankRun {
  std::vector<std::vector<std::string>> epochs;
  uint64_t batches = 0;
  uint64_t pixel_mismatches = 0;
  double worst_mean_abs = 0;
  client::JobStats stats;
  std::string error;
};

RankRun RunRank(const Fixture& f, const client::Options& opts, bool check_pixels) {
  RankRun run;
  auto loader = client::Loader::Open(opts);
  if (!loader.ok()) {
    run.error = loader.status().ToString();
    return run;
  }
  media::ImageDecoder decoder;
  media::ImageOps ops;
  ops.resize_shorter = 80;
  ops.crop_height = ops.crop_width = 64;
  std::vector<uint8_t> expect(64 * 64 * 3), ref(64 * 64 * 3);
  const auto* base = static_cast<const uint8_t*>((*loader)->region_data());
  for (;;) {
    auto ev = (*loader)->Next();
    if (!ev.ok()) {
      run.error = ev.status().ToString();
      return run;
    }
    if (auto* b = std::get_if<client::Batch>(&*ev)) {
      ++run.batches;
      if (run.epochs.size() <= b->epoch()) run.epochs.resize(b->epoch() + 1);
      const client::TensorView* image = b->tensor("image");
      const client::TensorView* label = b->tensor("label");
      REQUIRE(image);
      REQUIRE(label);
      REQUIRE(image->shape == std::vector<int64_t>{b->rows(), 64, 64, 3});
      // Zero copy: the tensors lie inside the shared mapping.
      const auto* p = static_cast<const uint8_t*>(image->data);
      REQUIRE(p >= base);
      REQUIRE(p + image->bytes <= base + (*loader)->region_size());
      for (uint32_t r = 0; r < b->rows(); ++r) {
        const std::string& path = b->paths()[r];
        run.epochs[b->epoch()].push_back(path);
        REQUIRE(f.label_of.count(path));
        CHECK(static_cast<const int64_t*>(label->data)[r] == f.label_of.at(path));
        CHECK(b->labels()[r] == f.label_of.at(path));
        if (!check_pixels) continue;
        auto bytes = testing::ReadBytes(f.data_root() + "/" + path);
        REQUIRE(decoder.DecodeJpegInto(bytes, ops, expect.data(), 64, 64, 64 * 3).ok());
        REQUIRE(decoder.ReferenceDecodeInto(bytes, ops, ref.data(), 64, 64, 64 * 3).ok());
        const uint8_t* row = p + static_cast<size_t>(r) * 64 * 64 * 3;
        if (std::memcmp(row, expect.data(), expect.size()) != 0) ++run.pixel_mismatches;
        double sum = 0;
        for (size_t i = 0; i < ref.size(); ++i) sum += std::abs(int(row[i]) - int(ref[i]));
        run.worst_mean_abs = std::max(run.worst_mean_abs, sum / static_cast<double>(ref.size()));
      }
    } else if (auto* st = std::get_if<client::JobStats>(&*ev)) {
      run.stats = *st;
      return run;
    }
  }
}

TEST_CASE("two ranks on one daemon get every sample exactly once per epoch, with the right label and pixels") {
  Fixture f(4, 25);  // 100 images
  auto shm_before = ShmEntries();
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());

  const std::string yaml = JobYaml(f.data_root(), 8, 3);
  RankRun r0, r1;
  std::thread t0([&] { r0 = RunRank(f, Opts(f, yaml, 0, 2, 2), true); });
  std::thread t1([&] { r1 = RunRank(f, Opts(f, yaml, 1, 2, 2), true); });
  t0.join();
  t1.join();
  REQUIRE(r0.error.empty());
  REQUIRE(r1.error.empty());
  CHECK(r0.batches == r1.batches);  // every rank the same number of steps
  CHECK(r0.batches == 2 * 7);       // 50 samples per rank per epoch in batches of 8
  for (int e = 0; e < 2; ++e) {
    std::multiset<std::string> seen(r0.epochs[e].begin(), r0.epochs[e].end());
    seen.insert(r1.epochs[e].begin(), r1.epochs[e].end());
    CHECK(seen.size() == f.images.size());
    std::set<std::string> unique(seen.begin(), seen.end());
    CHECK(unique.size() == f.images.size());
  }
  CHECK(r0.epochs[0] != r0.epochs[1]);  // reshuffled each epoch
  CHECK(r0.pixel_mismatches == 0);
  CHECK(r1.pixel_mismatches == 0);
  CHECK(r0.worst_mean_abs <= kMeanAbsTolerance);
  CHECK(r1.worst_mean_abs <= kMeanAbsTolerance);
  CHECK(r0.stats.samples == 100);
  CHECK(r0.stats.skipped == 0);

  // The order is a pure function of (dataset, seed, epoch, rank, world size): a rerun repeats it.
  RankRun again = RunRank(f, Opts(f, yaml, 0, 2, 2), false);
  REQUIRE(again.error.empty());
  CHECK(again.epochs == r0.epochs);

  CHECK(d.Stop(SIGTERM) == std::optional<int>(0));
  CHECK_FALSE(fs::exists(f.socket()));
  CHECK(ShmEntries() == shm_before);
}

TEST_CASE("spdl-client records each sample once per epoch and reports JSON") {
  Fixture f(3, 10);  // 30 images
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path});
  REQUIRE(d.Connectable());
  const std::string job = f.dir.path + "/job.yaml";
  { std::ofstream(job) << JobYaml("/nonexistent", 4, 2); }
  const std::string record = f.dir.path + "/record.csv";
  std::string out;
  int rc = RunCommand({std::string(SPDL_BIN_DIR) + "/spdl-client", "--socket", f.socket(), "--config", job, "--set",
                       "source.root=" + f.data_root(), "--epochs", "3", "--json", "--record", record},
                      &out);
  REQUIRE(rc == 0);
  INFO(out);
  auto j = nlohmann::json::parse(out);
  CHECK(j.at("samples") == 90);
  CHECK(j.at("batches") == 24);
  CHECK(j.at("epochs") == 3);
  CHECK(j.at("skipped") == 0);
  CHECK(j.at("samples_per_s").get<double>() > 0);
  CHECK(j.at("first_batch_s").get<double>() > 0);
  CHECK(j.at("seconds").get<double>() > 0);
  // The daemon's figures by name (proto/job_stats_fields.h): every job and stage row described
  // for clients is in the JSON.
  for (const auto& row : proto::JobStatFields()) {
    if ((row.surfaces & proto::kClient) && row.per == nullptr) CHECK(j.at("daemon").contains(row.name));
  }
  REQUIRE_FALSE(j.at("stages").empty());
  for (const auto& stage : j.at("stages")) {
    CAPTURE(stage.dump());
    for (const auto& row : proto::StageStatFields()) {
      if (row.surfaces & proto::kClient) CHECK(stage.contains(row.name));
    }
  }
  CHECK(j.at("stages").back().at("tasks").get<uint64_t>() >= 90);

  std::ifstream in(record);
  std::map<int, std::multiset<std::string>> per_epoch;
  std::string line;
  while (std::getline(in, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    REQUIRE(cols.size() == 4);
    CHECK(cols[1] == "0");
    CHECK(std::stoll(cols[3]) == f.label_of.at(cols[2]));
    per_epoch[std::stoi(cols[0])].insert(cols[2]);
  }
  REQUIRE(per_epoch.size() == 3);
  for (auto& [e, paths] : per_epoch) {
    CHECK(paths.size() == 30);
    CHECK(std::set<std::string>(paths.begin(), paths.end()).size() == 30);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

TEST_CASE("a run stopped with --stop-after and resumed from its state equals an uninterrupted run") {
  Fixture f(3, 11);  // 33 images: batches of 4 leave a partial one each epoch
  DaemonProcess d(f.socket(), {"--allow-root", f.data_root(), "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string job = f.dir.path + "/job.yaml";
  std::ofstream(job) << JobYaml(f.data_root(), 4, 3);
  const std::string client = std::string(SPDL_BIN_DIR) + "/spdl-client";
  auto run = [&](std::vector<std::string> extra, const std::string& record) {
    std::vector<std::string> argv = {client, "--socket", f.socket(),      "--config", job,   "--epochs",
                                     "3",    "--json",   "--no-checksum", "--record", record};
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::string out;
    REQUIRE(RunCommand(argv, &out) == 0);
    return nlohmann::json::parse(out);
  };
  run({}, f.dir.path + "/full.csv");
  const auto full = Lines(f.dir.path + "/full.csv");
  REQUIRE(full.size() == 99);
  for (int stop : {1, 5, 9, 13, 17}) {  // inside the first epoch, on its last batch, in later epochs
    INFO("stop after " << stop);
    auto first = run({"--stop-after", std::to_string(stop)}, f.dir.path + "/a.csv");
    REQUIRE(first.at("state").is_string());
    CHECK(first.at("batches") == stop);
    auto second = run({"--resume", first.at("state").get<std::string>()}, f.dir.path + "/b.csv");
    auto joined = Lines(f.dir.path + "/a.csv");
    for (auto& l : Lines(f.dir.path + "/b.csv")) joined.push_back(l);
    CHECK(joined == full);
  }
  SECTION("a token from another job is refused") {
    auto first = run({"--stop-after", "2"}, f.dir.path + "/a.csv");
    std::string out;
    int rc = RunCommand({client, "--socket", f.socket(), "--config", job, "--set", "sampler.seed=8", "--resume",
                         first.at("state").get<std::string>()},
                        &out);
    CHECK(rc == 1);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("spdlctl shows the caller's jobs and stage figures and cancels a job") {
  Fixture f(2, 30);
  DaemonProcess d(f.socket(), {"--allow-root", f.data_root(), "--threads", "2"});
  REQUIRE(d.Connectable());
  auto l = client::Loader::Open(Opts(f, JobYaml(f.data_root(), 4, 2), 0, 1, 0));
  REQUIRE(l.ok());
  for (int i = 0; i < 6; ++i) {  // consume a few batches so there are figures
    auto ev = (*l)->Next();
    REQUIRE(ev.ok());
  }
  const std::string ctl = std::string(SPDL_BIN_DIR) + "/spdlctl";
  std::string out;
  REQUIRE(RunCommand({ctl, "--socket", f.socket(), "--json", "stats"}, &out) == 0);
  auto j = nlohmann::json::parse(out);
  const uint64_t id = (*l)->info().job_id;
  CHECK(j.at("job_id") == std::to_string(id));  // proto3 JSON writes 64-bit integers as strings
  CHECK(std::stoull(j.at("stats").at("samples").get<std::string>()) >= 20);
  REQUIRE(j.at("stats").at("stages").size() == 2);
  CHECK(j.at("stats").at("stages")[1].at("name") == "decode");
  CHECK(j.at("stats").at("client_wait_seconds").get<double>() >= 0);
  const auto& dec = j.at("stats").at("stages")[1];
  CHECK(dec.at("kind") == "cpu");
  CHECK(dec.at("p50_ms").get<double>() > 0);
  CHECK(dec.at("items_per_s").get<double>() > 0);
  CHECK(dec.contains("window_p99_ms"));
  CHECK(j.at("stats").at("samples_per_s").get<double>() > 0);
  out.clear();
  REQUIRE(RunCommand({ctl, "--socket", f.socket(), "jobs"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains(f.data_root()));
  out.clear();
  REQUIRE(RunCommand({ctl, "--socket", f.socket(), "cancel", std::to_string(id)}, &out) == 0);
  Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) s = (*l)->Next().status();
  CHECK_THAT(s.message(), Catch::Contains("cancelled by uid"));
  CHECK(RunCommand({ctl, "--socket", f.socket(), "cancel", std::to_string(id)}) == 1);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("bad jobs are refused with a clear error and the daemon carries on") {
  Fixture f(2, 4);
  DaemonProcess d(f.socket(), {"--allow-root", f.data_root()});
  REQUIRE(d.Connectable());

  SECTION("every config problem, with its line") {
    auto o = Opts(f, "source:\n  root: " + f.data_root() + "\nbatch:\n  size: 0\nprefetch: 99\nbogus: 1\n", 0, 1, 1);
    auto l = client::Loader::Open(o);
    REQUIRE_FALSE(l.ok());
    CHECK(l.status().code() == StatusCode::kInvalidArgument);
    const std::string& m = l.status().message();
    CHECK_THAT(m, Catch::Contains("job.yaml:4:") && Catch::Contains("batch.size"));
    CHECK_THAT(m, Catch::Contains("job.yaml:5:") && Catch::Contains("prefetch"));
    CHECK_THAT(m, Catch::Contains("job.yaml:6:") && Catch::Contains("bogus"));
  }
  SECTION("a root outside the allowed roots") {
    auto l = client::Loader::Open(Opts(f, JobYaml(f.dir.path, 4, 2), 0, 1, 1));
    REQUIRE_FALSE(l.ok());
    CHECK(l.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(l.status().message(), Catch::Contains("not below any allowed root"));
  }
  SECTION("a rank outside the world") {
    auto l = client::Loader::Open(Opts(f, JobYaml(f.data_root(), 4, 2), 2, 2, 1));
    REQUIRE_FALSE(l.ok());
    CHECK_THAT(l.status().message(), Catch::Contains("rank 2"));
  }
  SECTION("a job larger than the memory budget") {
    auto l = client::Loader::Open(Opts(f, JobYaml(f.data_root(), 65536, 64), 0, 1, 1));
    REQUIRE_FALSE(l.ok());
    CHECK(l.status().code() == StatusCode::kResourceExhausted);
    CHECK_THAT(l.status().message(), Catch::Contains("memory_budget"));
  }
  // The daemon still serves a good job.
  RankRun ok = RunRank(f, Opts(f, JobYaml(f.data_root(), 4, 2), 0, 1, 1), false);
  CHECK(ok.error.empty());
  CHECK(ok.stats.samples == 8);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a corrupt file is skipped and counted, or fails the job naming it") {
  Fixture f(2, 6);  // 12 good images
  {
    std::ofstream(f.data_root() + "/class_001/broken.jpg") << "this is not a jpeg";
    auto good = testing::ReadBytes(f.data_root() + "/class_000/img_00000.jpg");
    std::ofstream t(f.data_root() + "/class_000/truncated.jpg", std::ios::binary);
    t.write(reinterpret_cast<const char*>(good.data()), static_cast<std::streamsize>(good.size() / 2));
  }
  DaemonProcess d(f.socket(), {"--allow-root", f.data_root()});
  REQUIRE(d.Connectable());
  SECTION("skip") {
    RankRun r = RunRank(f, Opts(f, JobYaml(f.data_root(), 4, 2), 0, 1, 2), false);
    REQUIRE(r.error.empty());
    for (auto& e : r.epochs) {
      CHECK(e.size() == 12);
      CHECK(std::set<std::string>(e.begin(), e.end()).size() == 12);
    }
    CHECK(r.stats.skipped == 4);  // 2 bad files x 2 epochs
    // Stats add up: every sample tried was read once; what was read was decoded; what decoded was
    // delivered. The client's wait for data is reported back.
    uint64_t delivered = 0;
    for (auto& e : r.epochs) delivered += e.size();
    REQUIRE(r.stats.stages.size() == 2);
    const auto& read = r.stats.stages[0];
    const auto& decode = r.stats.stages[1];
    CHECK(read.name == "read");
    CHECK(read.kind == "io");
    CHECK(decode.kind == "cpu");
    CHECK(read.tasks == delivered + r.stats.skipped);
    CHECK(decode.tasks == read.tasks - read.failures);
    CHECK(decode.tasks - decode.failures == delivered);
    CHECK(decode.failures == 4);
    CHECK(decode.p50_ms > 0);
    CHECK(decode.p50_ms <= decode.p99_ms);
    CHECK(decode.avg_ms > 0);
    CHECK(r.stats.client_wait_seconds > 0);
  }
  SECTION("max_failures") {
    RankRun r =
        RunRank(f, Opts(f, JobYaml(f.data_root(), 4, 2, "max_failures: 1\nmax_failures_warmup: 0\n"), 0, 1, 2), false);
    CHECK_THAT(r.error, Catch::Contains("too many bad samples: 2 of"));
    CHECK_THAT(r.error, Catch::Contains("max_failures: 1"));
    CHECK_THAT(r.error, Catch::Contains("stage 'decode'"));
    CHECK_THAT(r.error, Catch::Contains("broken.jpg") || Catch::Contains("truncated.jpg"));
  }
  SECTION("fail") {
    RankRun r = RunRank(f, Opts(f, JobYaml(f.data_root(), 4, 2, "on_error: fail\n"), 0, 1, 1), false);
    CHECK_THAT(r.error, Catch::Contains("broken.jpg") || Catch::Contains("truncated.jpg"));
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("order: completion delivers every sample once per epoch, with the right pixels, and cannot be resumed") {
  Fixture f(3, 9);  // 27 images
  DaemonProcess d(f.socket(), {"--allow-root", f.data_root(), "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string yaml = JobYaml(f.data_root(), 4, 3, "order: completion\n");
  RankRun r = RunRank(f, Opts(f, yaml, 0, 1, 2), /*check_pixels=*/true);
  REQUIRE(r.error.empty());
  REQUIRE(r.epochs.size() == 2);
  for (auto& e : r.epochs) {
    CHECK(e.size() == 27);
    CHECK(std::set<std::string>(e.begin(), e.end()).size() == 27);
  }
  CHECK(r.pixel_mismatches == 0);
  client::Options o = Opts(f, yaml, 0, 1, 2);
  o.resume_token = "anything";
  auto l = client::Loader::Open(o);
  REQUIRE_FALSE(l.ok());
  CHECK_THAT(l.status().message(), Catch::Contains("order: completion cannot be resumed"));
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a client that goes away mid-epoch frees its job and others are unaffected") {
  Fixture f(2, 20);
  DaemonProcess d(f.socket(), {"--allow-root", f.data_root(), "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string yaml = JobYaml(f.data_root(), 4, 4);
  RankRun steady;
  std::thread other([&] { steady = RunRank(f, Opts(f, yaml, 0, 1, 3), false); });
  for (int i = 0; i < 5; ++i) {
    auto l = client::Loader::Open(Opts(f, yaml, 0, 1, 0));
    REQUIRE(l.ok());
    auto ev = (*l)->Next();
    REQUIRE(ev.ok());
    REQUIRE(std::holds_alternative<client::Batch>(*ev));
    // Dropped while holding a batch, with the job endless and slots leased.
  }
  other.join();
  REQUIRE(steady.error.empty());
  CHECK(steady.stats.samples == 120);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a daemon that dies gives its clients an error at once, not a hang") {
  Fixture f(1, 40);
  DaemonProcess d(f.socket(), {"--allow-root", f.data_root()});
  REQUIRE(d.Connectable());
  auto l = client::Loader::Open(Opts(f, JobYaml(f.data_root(), 4, 2), 0, 1, 0));
  REQUIRE(l.ok());
  REQUIRE((*l)->Next().ok());
  REQUIRE(d.Stop(SIGKILL) == std::optional<int>(-SIGKILL));
  auto t0 = std::chrono::steady_clock::now();
  Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) s = (*l)->Next().status();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));
}

}  // namespace
}  // namespace spdl
