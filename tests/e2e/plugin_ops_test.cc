// User ops (include/spdl/op.h) end to end: op libraries compiled here, outside the build, with
// `cc -shared -fPIC` against the public header only (the source include/ dir stands for the
// installed <prefix>/include), loaded by a real spdld from its plugin_dirs and run in real jobs
// whose batches a real client reads from shared memory.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "media/sample_random.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunCommand;
using testing::TempDir;

constexpr uint64_t kSeed = 7;
constexpr int kSize = 48;

// Compiles `source` (relative to the source tree) into `out` with `compiler` -shared -fPIC and
// the public include dir only; mode 0755. Returns the compiler's output on failure.
std::string Compile(const std::string& compiler, const std::string& source, const std::string& out,
                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv = {compiler, "-shared", "-fPIC",
                                   "-O1",    "-I",      std::string(SPDL_SOURCE_DIR) + "/include",
                                   "-o",     out,       std::string(SPDL_SOURCE_DIR) + "/" + source};
  argv.insert(argv.end(), extra.begin(), extra.end());
  std::string log;
  const int rc = testing::RunCommandAs({}, argv, &log, /*merge_stderr=*/true);
  if (rc != 0) return "compile failed (" + std::to_string(rc) + "): " + log;
  ::chmod(out.c_str(), 0755);
  return "";
}

// A dataset, plugin dirs with the test's op libraries, and a daemon config naming them.
struct PluginFixture {
  explicit PluginFixture(int classes = 4, int per_class = 10, bool with_plugins = true) {
    const testdata::DatasetOptions o = testing::SmallImages(classes, per_class, 60, 140);
    auto r = testdata::MakeImageFolder(data_root(), o);
    REQUIRE(r.ok());
    images = *r;
    for (const auto& g : images) paths.push_back(g.path);  // sorted: the folder source's order
    fs::create_directories(plugins());
    fs::create_directories(bad_plugins());
    ::chmod(plugins().c_str(), 0755);
    ::chmod(bad_plugins().c_str(), 0777);  // world-writable: spdld must refuse it
    REQUIRE(Compile("/usr/bin/cc", "tests/e2e/plugin_ops/test_ops.c", plugins() + "/libtestops.so").empty());
    REQUIRE(
        Compile("/usr/bin/cc", "tests/e2e/plugin_ops/test_ops.c", plugins() + "/libabi99.so", {"-DTEST_ABI_VERSION=99"})
            .empty());
    REQUIRE(Compile("/usr/bin/cc", "tests/e2e/plugin_ops/test_ops.c", bad_plugins() + "/libplanted.so").empty());
    REQUIRE(Compile("/usr/bin/c++", "tests/e2e/plugin_ops/throwing_op.cc", plugins() + "/libthrows.so").empty());
    std::ofstream(config()) << "socket_path: " << socket() << "\nallowed_roots: [" << dir.path << "]\n"
                            << "worker_threads: 2\n"
                            << (with_plugins ? "plugin_dirs: [" + plugins() + ", " + bad_plugins() + "]\n" : "");
  }
  std::string data_root() const { return dir.path + "/data"; }
  std::string plugins() const { return dir.path + "/plugins"; }
  std::string bad_plugins() const { return dir.path + "/open-plugins"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  std::string config() const { return dir.path + "/spdld.yaml"; }
  TempDir dir;
  std::vector<testdata::GeneratedImage> images;
  std::vector<std::string> paths;
};

std::string Yaml(const PluginFixture& f, const std::string& transforms, const std::string& extra = "") {
  std::ostringstream y;
  y << "source: {type: image_folder, root: " << f.data_root() << "}\n"
    << "sampler: {shuffle: true, seed: " << kSeed << "}\n"
    << "batch: {size: 8}\n"
    << "prefetch: 2\n"
    << "transforms:\n"
    << "  - resize: {shorter: " << kSize << "}\n"
    << "  - center_crop: {size: " << kSize << "}\n"
    << transforms << extra;
  return y.str();
}

// What a job delivered: per (epoch, path) the image row's bytes; skips per epoch; the stats.
struct JobRun {
  std::map<std::pair<uint32_t, std::string>, std::vector<uint8_t>> rows;
  std::map<uint32_t, uint64_t> skipped;
  std::map<uint32_t, std::vector<std::string>> order;
  client::JobStats stats;
  std::string error;
};

JobRun Run(const PluginFixture& f, const std::string& yaml, uint32_t epochs = 1,
           const std::function<void(const client::Batch&)>& on_batch = {}) {
  JobRun run;
  client::Options o;
  o.socket_path = f.socket();
  o.config_yaml = yaml;
  o.config_name = "job.yaml";
  o.epochs = epochs;
  auto loader = client::Loader::Open(o);
  if (!loader.ok()) {
    run.error = loader.status().ToString();
    return run;
  }
  for (;;) {
    auto ev = (*loader)->Next();
    if (!ev.ok()) {
      run.error = ev.status().ToString();
      return run;
    }
    if (auto* b = std::get_if<client::Batch>(&*ev)) {
      const client::TensorView* image = b->tensor("image");
      REQUIRE(image != nullptr);
      const size_t row_bytes = image->bytes / image->shape[0];
      for (uint32_t r = 0; r < b->rows(); ++r) {
        const auto* p = static_cast<const uint8_t*>(image->data) + r * row_bytes;
        run.rows[{b->epoch(), b->paths()[r]}] = std::vector<uint8_t>(p, p + row_bytes);
        run.order[b->epoch()].push_back(b->paths()[r]);
      }
      if (on_batch) on_batch(*b);
    } else if (auto* e = std::get_if<client::EpochEnd>(&*ev)) {
      run.skipped[e->epoch] = e->skipped;
    } else if (auto* st = std::get_if<client::JobStats>(&*ev)) {
      run.stats = *st;
      return run;
    }
  }
}

const client::StageStats* Stage(const client::JobStats& st, const std::string& name) {
  for (const auto& s : st.stages) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

size_t IndexOf(const PluginFixture& f, const std::string& path) {
  auto it = std::lower_bound(f.paths.begin(), f.paths.end(), path);
  REQUIRE(it != f.paths.end());
  REQUIRE(*it == path);
  return static_cast<size_t>(it - f.paths.begin());
}

TEST_CASE(
    "an op built with cc against spdl/op.h alone runs in a job: exact pixels in place and through float output, "
    "its seed as documented, its own stats row") {
  PluginFixture f;
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  const std::string add = "  - op: {library: libtestops.so, name: add, args: {value: 37}}\n";
  const std::string flip = "  - horizontal_flip: {p: 0.5}\n";

  // uint8 NHWC: the op edits the row in shared memory; the flip after it is the decoder's draw.
  JobRun plain = Run(f, Yaml(f, flip));
  INFO(plain.error);
  REQUIRE(plain.error.empty());
  JobRun with_op = Run(f, Yaml(f, add + flip));
  REQUIRE(with_op.error.empty());
  REQUIRE(plain.rows.size() == f.images.size());
  REQUIRE(with_op.rows.size() == f.images.size());
  uint64_t mismatches = 0;
  for (const auto& [key, bytes] : plain.rows) {
    const std::vector<uint8_t>& got = with_op.rows.at(key);
    REQUIRE(got.size() == bytes.size());
    for (size_t i = 0; i < bytes.size(); ++i) mismatches += got[i] != static_cast<uint8_t>(bytes[i] + 37);
  }
  CHECK(mismatches == 0);
  const client::StageStats* op_row = Stage(with_op.stats, "op:add");
  REQUIRE(op_row != nullptr);
  CHECK(op_row->tasks == f.images.size());
  CHECK(op_row->failures == 0);
  CHECK(op_row->kind == "cpu");
  CHECK(Stage(plain.stats, "op:add") == nullptr);

  // float32 NCHW with normalize: the op runs on a per-thread scratch image, then the output pass.
  const std::string norm = "  - normalize: {mean: [0.5, 0.25, 0.75], std: [0.25, 0.5, 0.125]}\n";
  JobRun as_float = Run(f, Yaml(f, add + flip + norm, "output: {dtype: float32, layout: NCHW}\n"));
  REQUIRE(as_float.error.empty());
  REQUIRE(as_float.rows.size() == f.images.size());
  const double mean[3] = {0.5, 0.25, 0.75}, stddev[3] = {0.25, 0.5, 0.125};
  mismatches = 0;
  for (const auto& [key, bytes] : plain.rows) {
    const std::vector<uint8_t>& got = as_float.rows.at(key);
    REQUIRE(got.size() == bytes.size() * sizeof(float));
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < kSize * kSize; ++i) {
        const uint8_t v = static_cast<uint8_t>(bytes[static_cast<size_t>(i) * 3 + c] + 37);
        const float want = static_cast<float>((v / 255.0 - mean[c]) / stddev[c]);
        float have = 0;
        std::memcpy(&have, got.data() + (static_cast<size_t>(c) * kSize * kSize + i) * sizeof(float), sizeof(float));
        mismatches += have != want;
      }
    }
  }
  CHECK(mismatches == 0);

  // The seed: UserOpSeed(SampleSeed(sampler.seed, epoch, sample index), the op's index among the ops).
  JobRun stamped = Run(f, Yaml(f, add + "  - op: {library: libtestops.so, name: seed_stamp}\n"), 2);
  REQUIRE(stamped.error.empty());
  REQUIRE(stamped.rows.size() == 2 * f.images.size());
  uint64_t wrong_seeds = 0;
  for (const auto& [key, bytes] : stamped.rows) {
    uint64_t seed = 0;
    std::memcpy(&seed, bytes.data(), sizeof(seed));
    wrong_seeds += seed != media::UserOpSeed(media::SampleSeed(kSeed, key.first, IndexOf(f, key.second)), 1);
  }
  CHECK(wrong_seeds == 0);

  // spdlctl stats lists the op's row while the job runs.
  std::string stats_text;
  bool asked = false;
  JobRun live = Run(f, Yaml(f, add), 1, [&](const client::Batch&) {
    if (asked) return;
    asked = true;
    RunCommand({std::string(SPDL_BIN_DIR) + "/spdlctl", "--socket", f.socket(), "stats"}, &stats_text);
  });
  REQUIRE(live.error.empty());
  INFO(stats_text);
  CHECK(stats_text.find("op:add") != std::string::npos);

  CHECK(d.Stop(SIGTERM) == std::optional<int>(0));
}

TEST_CASE("a job with ops resumes exactly: the same pixels and seeds after the token, other args refuse the token") {
  PluginFixture f(3, 8);  // 24 images, 3 batches of 8
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  const std::string ops =
      "  - op: {library: libtestops.so, name: add, args: {value: 5}}\n"
      "  - horizontal_flip: {p: 0.5}\n"
      "  - op: {library: libtestops.so, name: seed_stamp}\n";
  JobRun whole = Run(f, Yaml(f, ops), 2);
  REQUIRE(whole.error.empty());
  REQUIRE(whole.rows.size() == 2 * f.images.size());

  // Stop after the first batch, keep its token, resume from it.
  std::string token;
  {
    client::Options o;
    o.socket_path = f.socket();
    o.config_yaml = Yaml(f, ops);
    o.epochs = 2;
    auto loader = client::Loader::Open(o);
    REQUIRE(loader.ok());
    for (;;) {
      auto ev = (*loader)->Next();
      REQUIRE(ev.ok());
      if (auto* b = std::get_if<client::Batch>(&*ev)) {
        token = b->resume_token();
        break;
      }
    }
  }
  REQUIRE_FALSE(token.empty());
  client::Options o;
  o.socket_path = f.socket();
  o.config_yaml = Yaml(f, ops);
  o.epochs = 2;
  o.resume_token = token;
  auto loader = client::Loader::Open(o);
  REQUIRE(loader.ok());
  uint64_t rows = 0, differing = 0;
  for (;;) {
    auto ev = (*loader)->Next();
    REQUIRE(ev.ok());
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::Batch>(&*ev);
    if (b == nullptr) continue;
    const client::TensorView* image = b->tensor("image");
    const size_t row_bytes = image->bytes / image->shape[0];
    for (uint32_t r = 0; r < b->rows(); ++r) {
      const auto* p = static_cast<const uint8_t*>(image->data) + r * row_bytes;
      differing += std::vector<uint8_t>(p, p + row_bytes) != whole.rows.at({b->epoch(), b->paths()[r]});
      ++rows;
    }
  }
  CHECK(rows == 2 * f.images.size() - 8);  // all but the first batch
  CHECK(differing == 0);

  // The op's args are in the fingerprint: the token of this job does not resume another.
  client::Options other = o;
  other.config_yaml = Yaml(f,
                           "  - op: {library: libtestops.so, name: add, args: {value: 6}}\n"
                           "  - horizontal_flip: {p: 0.5}\n"
                           "  - op: {library: libtestops.so, name: seed_stamp}\n");
  auto refused = client::Loader::Open(other);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("its transforms differ"));
  CHECK(d.Stop(SIGTERM) == std::optional<int>(0));
}

TEST_CASE("an op before the geometry runs on the whole decoded image, then resize and crop, rgb only") {
  PluginFixture f(2, 6);  // images of 60..140 pixels a side
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  // fill refuses an image under 60 pixels a side: the output is 48x48, the decoded image is not.
  const std::string yaml = "source: {type: image_folder, root: " + f.data_root() +
                           "}\nbatch: {size: 4}\ntransforms:\n"
                           "  - op: {library: libtestops.so, name: fill, args: {value: 77, min_side: 60}}\n"
                           "  - resize: {shorter: 56}\n  - center_crop: {size: 48}\n  - horizontal_flip: {}\n";
  JobRun run = Run(f, yaml, 1);
  REQUIRE(run.error.empty());
  REQUIRE(run.rows.size() == f.images.size());
  uint64_t not_77 = 0;
  for (const auto& [key, bytes] : run.rows)
    not_77 += std::count_if(bytes.begin(), bytes.end(), [](uint8_t v) { return v != 77; });
  CHECK(not_77 == 0);  // a constant image stays constant through the resize
  CHECK(run.skipped.at(0) == 0);
  const client::StageStats* row = Stage(run.stats, "op:fill");
  REQUIRE(row != nullptr);
  CHECK(row->tasks == f.images.size());
  CHECK(row->failures == 0);

  JobRun gray = Run(f, yaml + "decode: {color: gray}\n");
  INFO(gray.error);
  CHECK(gray.error.find("transforms.0.op (line 4): an op before the geometry sees the whole decoded RGB image") !=
        std::string::npos);
  CHECK(d.Stop(SIGTERM) == std::optional<int>(0));
}

TEST_CASE(
    "refused ops: a world-writable plugin dir, a wrong ABI, create refusing its args, an unknown op, no plugin_dirs") {
  PluginFixture f(2, 4);
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  auto refused = [&](const std::string& op_line) {
    JobRun r = Run(f, Yaml(f, op_line));
    REQUIRE_FALSE(r.error.empty());
    return r.error;
  };

  const std::string planted = refused("  - op: {library: libplanted.so, name: add, args: {value: 1}}\n");
  INFO(planted);
  CHECK(planted.find(f.bad_plugins()) != std::string::npos);
  CHECK(planted.find("world-writable") != std::string::npos);
  CHECK(planted.find("transforms.2.op (line 8)") != std::string::npos);

  const std::string abi = refused("  - op: {library: libabi99.so, name: add, args: {value: 1}}\n");
  INFO(abi);
  CHECK(abi.find(f.plugins() + "/libabi99.so") != std::string::npos);
  CHECK(abi.find("op ABI version 99") != std::string::npos);

  const std::string args = refused("  - op: {library: libtestops.so, name: add, args: {value: 300}}\n");
  INFO(args);
  CHECK(args.find("line 8") != std::string::npos);
  CHECK(args.find("add: value must be an integer 0..255") != std::string::npos);

  const std::string unknown = refused("  - op: {library: libtestops.so, name: blur}\n");
  INFO(unknown);
  CHECK(unknown.find("has no op 'blur' (its ops: add, fail_one_in, seed_stamp, fill)") != std::string::npos);

  const std::string missing = refused("  - op: {library: libnothere.so, name: add}\n");
  INFO(missing);
  CHECK(missing.find("in none of the daemon's plugin_dirs") != std::string::npos);

  // The daemon is unharmed: a good op job runs after the refusals.
  JobRun good = Run(f, Yaml(f, "  - op: {library: libtestops.so, name: add, args: {value: 1}}\n"));
  CHECK(good.error.empty());
  CHECK(good.rows.size() == f.images.size());
  CHECK(d.Stop(SIGTERM) == std::optional<int>(0));

  // Without plugin_dirs ops are disabled, and a job asking for one is told so.
  PluginFixture none(1, 2, /*with_plugins=*/false);
  DaemonProcess d2(none.socket(), {"--config", none.config()});
  REQUIRE(d2.Connectable());
  JobRun r = Run(none, Yaml(none, "  - op: {library: libtestops.so, name: add, args: {value: 1}}\n"));
  INFO(r.error);
  CHECK(r.error.find("ops are disabled on this spdld") != std::string::npos);
}

TEST_CASE(
    "an op failing one sample in ten gives exact skip counts, an op throwing a C++ exception fails its job, "
    "not the daemon") {
  PluginFixture f(5, 20);  // 100 images
  DaemonProcess d(f.socket(), {"--config", f.config()});
  REQUIRE(d.Connectable());
  const uint32_t epochs = 2;
  JobRun run = Run(f, Yaml(f, "  - op: {library: libtestops.so, name: fail_one_in, args: {n: 10}}\n"), epochs);
  REQUIRE(run.error.empty());
  uint64_t total = 0;
  for (uint32_t e = 0; e < epochs; ++e) {
    std::set<std::string> failing;
    for (size_t i = 0; i < f.paths.size(); ++i) {
      if (media::UserOpSeed(media::SampleSeed(kSeed, e, i), 0) % 10 == 0) failing.insert(f.paths[i]);
    }
    INFO("epoch " << e << ": " << failing.size() << " samples whose seed the op refuses");
    CHECK(failing.size() > 0);
    CHECK(run.skipped.at(e) == failing.size());
    std::set<std::string> delivered(run.order[e].begin(), run.order[e].end());
    CHECK(delivered.size() == run.order[e].size());  // each once
    CHECK(delivered.size() + failing.size() == f.paths.size());
    for (const std::string& p : failing) CHECK(delivered.count(p) == 0);
    total += failing.size();
  }
  INFO("stats: " << run.stats.samples << " samples, " << run.stats.stages.size() << " stage rows");
  CHECK(run.stats.skipped == total);
  const client::StageStats* op_row = Stage(run.stats, "op:fail_one_in");
  REQUIRE(op_row != nullptr);
  CHECK(op_row->failures == total);
  CHECK(op_row->tasks == epochs * f.paths.size());

  JobRun thrown = Run(f, Yaml(f, "  - op: {library: libthrows.so, name: throws}\n", "on_error: fail\n"));
  INFO(thrown.error);
  CHECK(thrown.error.find("threw a C++ exception across the C ABI: boom from a C++ op") != std::string::npos);
  CHECK(d.Running());
  JobRun after = Run(f, Yaml(f, "  - op: {library: libtestops.so, name: add, args: {value: 3}}\n"));
  CHECK(after.error.empty());
  CHECK(after.rows.size() == f.paths.size());
  CHECK(d.Stop(SIGTERM) == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
