// WatchFeeder / WatchHub (jobs/watch_feeder.h): a watched folder feeding a real stream, on real files.
#include "jobs/watch_feeder.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "config/job_config.h"
#include "temp_dir.h"

namespace spdl::jobs {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using spdl::testing::TempDir;  // temp_dir.h

WatchSpec Spec(const TempDir& dir, bool include = true) {
  WatchSpec spec;
  spec.root = dir.path;
  spec.options.extensions = {".jpg"};
  spec.options.include_existing = include;
  spec.allowed_roots = {dir.path};
  spec.uid = ::getuid();
  return spec;
}

// Takes samples of consumer `id` until `n` arrived or 5 s passed; acknowledges them.
std::vector<streams::SamplePtr> TakeN(streams::Stream& s, streams::ConsumerId id, size_t n) {
  std::vector<streams::SamplePtr> got;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
    auto t = s.Take(id, n - got.size(), 100ms);
    REQUIRE(t.ok());
    std::vector<uint64_t> offsets;
    for (auto& p : t->samples) {
      offsets.push_back(p->offset);
      got.push_back(p);
    }
    s.Ack(id, offsets);
    if (t->end) break;
  }
  return got;
}

TEST_CASE("watch feeder: files become samples with their bytes, label and path") {
  TempDir dir;
  dir.Write("a/1.jpg", "one");
  dir.Write("b/2.jpg", "two!");
  streams::StreamRegistry registry;
  WatchHub hub(&registry);
  auto stream = hub.Attach(Spec(dir));
  INFO(stream.status().ToString());
  REQUIRE(stream.ok());
  CHECK((*stream)->name().rfind("watch-", 0) == 0);
  auto id = (*stream)->Join("g");
  REQUIRE(id.ok());
  auto got = TakeN(**stream, *id, 2);
  REQUIRE(got.size() == 2);
  CHECK(got[0]->key == "a/1.jpg");
  CHECK(got[0]->metadata == "a/1.jpg");
  CHECK(std::string(got[0]->data.begin(), got[0]->data.end()) == "one");
  CHECK(got[0]->label == 0);
  CHECK(got[1]->label == 1);
  dir.Write("b/.3.tmp", "three");
  fs::rename(dir / "b/.3.tmp", dir / "b/3.jpg");
  got = TakeN(**stream, *id, 1);
  REQUIRE(got.size() == 1);
  CHECK(got[0]->key == "b/3.jpg");
  CHECK(got[0]->offset == 2);
  // The same folder and settings: the same stream (a second group sees every file).
  auto again = hub.Attach(Spec(dir));
  REQUIRE(again.ok());
  CHECK(again->get() == stream->get());
  auto stats = hub.Stats();
  REQUIRE(stats.size() == 1);
  CHECK(stats[0].files_put == 3);
  CHECK(stats[0].watcher.files_reported == 3);
  // Another folder naming the same stream is refused.
  TempDir other;
  WatchSpec clash = Spec(other);
  clash.stream.name = (*stream)->name();
  CHECK(hub.Attach(clash).status().code() == StatusCode::kInvalidArgument);
  // Not an allowed root.
  WatchSpec outside = Spec(dir);
  outside.allowed_roots = {other.path};
  CHECK(hub.Attach(outside).status().code() == StatusCode::kPermissionDenied);
}

TEST_CASE("watch feeder: a full stream holds the feeder back, no file is lost") {
  TempDir dir;
  fs::create_directories(dir / "a");
  streams::StreamRegistry registry;
  WatchHub hub(&registry);
  WatchSpec spec = Spec(dir);
  spec.stream.name = "watch-bounded";
  spec.stream.max_samples = 3;
  auto stream = hub.Attach(spec);
  REQUIRE(stream.ok());
  auto id = (*stream)->Join("g");
  REQUIRE(id.ok());
  for (int i = 0; i < 12; ++i) dir.Write("a/" + std::to_string(100 + i) + ".jpg", "x");
  // Nothing acknowledged: at most 3 retained, the feeder blocked.
  std::this_thread::sleep_for(500ms);
  CHECK((*stream)->Stats().retained_samples <= 3);
  CHECK((*stream)->Stats().tail_offset == 3);
  auto got = TakeN(**stream, *id, 12);
  std::set<std::string> keys;
  for (auto& s : got) keys.insert(s->key);
  CHECK(got.size() == 12);
  CHECK(keys.size() == 12);
}

TEST_CASE("watch feeder: a deleted folder closes the stream, an unused one ends the watch") {
  TempDir dir;
  dir.Write("a/1.jpg", "one");
  streams::StreamRegistry registry;
  WatchHub hub(&registry);
  auto stream = hub.Attach(Spec(dir));
  REQUIRE(stream.ok());
  auto id = (*stream)->Join("g");
  REQUIRE(id.ok());
  REQUIRE(TakeN(**stream, *id, 1).size() == 1);
  fs::remove_all(dir.path);
  auto rest = (*stream)->Take(*id, 10, 3000ms);
  REQUIRE(rest.ok());
  CHECK(rest->samples.empty());
  CHECK(rest->end);

  TempDir idle;
  idle.Write("a/1.jpg", "one");
  WatchSpec spec = Spec(idle);
  spec.stream.group_retention = 100ms;
  auto s2 = hub.Attach(spec);
  REQUIRE(s2.ok());
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!(*s2)->closed() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(50ms);
  CHECK((*s2)->closed());
}

std::string Errors(const config::JobConfigResult& r) {
  std::string out;
  for (const auto& e : r.errors) out += e.path + ": " + e.message + "\n";
  return out;
}

TEST_CASE("watch config: keys, defaults and refusals") {
  auto good = config::ParseJobConfig(
      "source: {type: watch, root: /data/in, existing: skip, classes: [dog, cat], extensions: [.png]}\n"
      "batch: {size: 4}\ntransforms: [{center_crop: {size: 8}}]\n");
  INFO(Errors(good));
  REQUIRE(good.config.has_value());
  CHECK(good.config->source.type == config::SourceType::kWatch);
  CHECK(good.config->source.root == "/data/in");
  CHECK_FALSE(good.config->source.watch.include_existing);
  CHECK(good.config->source.watch.classes == std::vector<std::string>{"dog", "cat"});
  CHECK(good.config->source.extensions == std::vector<std::string>{".png"});
  auto plain = config::ParseJobConfig(
      "source: {type: watch, root: /data/in}\nbatch: {size: 4}\ntransforms: [{center_crop: {size: 8}}]\n");
  REQUIRE(plain.config.has_value());
  CHECK(plain.config->source.watch.include_existing);
  CHECK(plain.config->source.extensions == std::vector<std::string>{".jpg", ".jpeg"});

  // Every mistake once, each at its key.
  auto bad = config::ParseJobConfig(
      "source: {type: watch, existing: maybe, classes: [a, a, x/y], shards: [t.tar]}\nbatch: {size: 4}\n");
  CHECK_FALSE(bad.config.has_value());
  const std::string errors = Errors(bad);
  INFO(errors);
  CHECK(errors.find("source.root") != std::string::npos);
  CHECK(errors.find("include or skip") != std::string::npos);
  CHECK(errors.find("named twice") != std::string::npos);
  CHECK(errors.find("'x/y'") != std::string::npos);
  CHECK(errors.find("shards") != std::string::npos);
}

}  // namespace
}  // namespace spdl::jobs
