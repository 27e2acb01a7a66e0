// Node-wide sharing: the sample cache (io/sample_cache.h) on its own and under concurrent
// readers, and share groups (jobs/shared_job.h) through the real JobRegistry running real image
// jobs on a generated folder, inline (every task runs on the calling thread, so the order of
// events is the test's).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <thread>
#include <vector>

#include "config/daemon_config.h"
#include "config/job_config.h"
#include "e2e/dataset.h"
#include "io/sample_cache.h"
#include "jobs/job_registry.h"
#include "jobs/shared_job.h"
#include "pipeline/executor.h"
#include "temp_dir.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

// A source of `n` samples whose bytes are a function of the index, counting its reads.
class CountingSource final : public io::SampleSource {
 public:
  explicit CountingSource(uint64_t n, size_t bytes = 100) : bytes_(bytes) {
    for (uint64_t i = 0; i < n; ++i) refs_.push_back(io::SampleRef{"s" + std::to_string(i), 0});
  }
  uint64_t size() const override { return refs_.size(); }
  const io::SampleRef& sample(uint64_t index) const override { return refs_[index]; }
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override {
    if (index >= refs_.size()) return InvalidArgument("index out of range");
    reads.fetch_add(1);
    out->assign(bytes_, static_cast<uint8_t>(index * 7 + 1));
    return Status::Ok();
  }
  std::string Describe() const override { return "counting"; }
  std::string Identity() const override { return "counting /x"; }
  mutable std::atomic<int> reads{0};

 private:
  size_t bytes_;
  std::vector<io::SampleRef> refs_;
};

TEST_CASE("sample cache: least recently used entries go first and the budget is never exceeded") {
  io::SampleCache cache(1000);
  REQUIRE(cache.Insert("a", Bytes(300, 1)));
  REQUIRE(cache.Insert("b", Bytes(300, 2)));
  REQUIRE(cache.Insert("c", Bytes(300, 3)));
  REQUIRE(cache.Lookup("a") != nullptr);  // a is now the most recently used: b goes first
  REQUIRE(cache.Insert("d", Bytes(300, 4)));
  CHECK(cache.Lookup("b") == nullptr);
  CHECK(cache.Lookup("a") != nullptr);
  CHECK(cache.Lookup("c") != nullptr);
  CHECK((*cache.Lookup("d"))[0] == 4);
  auto c = cache.counters();
  CHECK(c.evictions == 1);
  CHECK(c.entries == 3);
  CHECK(c.bytes == 3 * 301);
  CHECK(c.bytes <= 1000);
  // Too big for the whole budget: not cached, nothing evicted.
  CHECK_FALSE(cache.Insert("huge", Bytes(1000, 9)));
  CHECK(cache.counters().entries == 3);
  // Replacing a key does not count twice.
  REQUIRE(cache.Insert("a", Bytes(10, 5)));
  CHECK(cache.counters().bytes == 2 * 301 + 11);
  CHECK((*cache.Lookup("a"))[0] == 5);
}

TEST_CASE("cached source: the second pass reads nothing when the dataset fits, and part of it when not") {
  auto inner = std::make_shared<CountingSource>(20);
  auto cache = std::make_shared<io::SampleCache>(20 * 200);
  io::CachedSource src(inner, cache);
  CHECK(src.Identity() == inner->Identity());
  std::vector<uint8_t> buf;
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t i = 0; i < 20; ++i) {
      REQUIRE(src.Read(i, &buf).ok());
      REQUIRE(buf == Bytes(100, static_cast<uint8_t>(i * 7 + 1)));
    }
  }
  CHECK(inner->reads == 20);
  CHECK(src.hits() == 20);
  CHECK(src.misses() == 20);
  CHECK_FALSE(src.Read(20, &buf).ok());  // the inner source's error

  // Half the dataset fits: a sequential second pass under LRU misses everything again (each
  // insert evicts the entry needed soonest after it), and the budget holds.
  auto small = std::make_shared<io::SampleCache>(10 * 110);
  auto inner2 = std::make_shared<CountingSource>(20);
  io::CachedSource src2(inner2, small);
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t i = 0; i < 20; ++i) REQUIRE(src2.Read(i, &buf).ok());
  }
  CHECK(small->counters().bytes <= 10 * 110);
  CHECK(small->counters().evictions > 0);
  CHECK(inner2->reads == 40);
}

TEST_CASE("cached source: two sources of the same dataset share entries, another dataset does not") {
  auto cache = std::make_shared<io::SampleCache>(1 << 20);
  auto a = std::make_shared<CountingSource>(5);
  auto b = std::make_shared<CountingSource>(5);  // the same identity and keys: the same dataset
  io::CachedSource ca(a, cache), cb(b, cache);
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < 5; ++i) REQUIRE(ca.Read(i, &buf).ok());
  for (uint64_t i = 0; i < 5; ++i) REQUIRE(cb.Read(i, &buf).ok());
  CHECK(a->reads == 5);
  CHECK(b->reads == 0);
  CHECK(cb.hits() == 5);
}

TEST_CASE("sample cache: concurrent readers get the right bytes and the budget holds") {
  auto inner = std::make_shared<CountingSource>(200, 64);
  auto cache = std::make_shared<io::SampleCache>(100 * 80);  // about half the dataset
  io::CachedSource src(inner, cache);
  {  // a repeated read is a hit (the threads below stride through more than the cache holds, so
     // when the scheduler runs them one after another they may never hit)
    std::vector<uint8_t> buf;
    REQUIRE(src.Read(5, &buf).ok());
    REQUIRE(src.Read(5, &buf).ok());
    CHECK(src.hits() == 1);
    CHECK(buf == Bytes(64, static_cast<uint8_t>(5 * 7 + 1)));
  }
  std::atomic<int> wrong{0};
  std::atomic<bool> over{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> buf;
      for (int k = 0; k < 2000; ++k) {
        const uint64_t i = (static_cast<uint64_t>(k) * 37 + static_cast<uint64_t>(t) * 11) % 200;
        if (!src.Read(i, &buf).ok() || buf != Bytes(64, static_cast<uint8_t>(i * 7 + 1))) ++wrong;
        if (cache->counters().bytes > cache->budget()) over = true;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
  CHECK_FALSE(over);
  CHECK(src.hits() + src.misses() == 8 * 2000 + 2);
}

TEST_CASE("config: cache_bytes, share and share_members parse, and bad values name their line") {
  auto d = config::ParseDaemonConfig("cache_bytes: 256MiB\n");
  REQUIRE(d.config);
  CHECK(d.config->cache_bytes == (256u << 20));
  CHECK(config::ParseDaemonConfig("log_level: info\n").config->cache_bytes == 0);
  auto bad = config::ParseDaemonConfig("log_level: info\ncache_bytes: lots\n");
  REQUIRE(bad.errors.size() == 1);
  CHECK(bad.errors[0].line == 2);

  const std::string job =
      "source: {type: image_folder, root: /data}\n"
      "batch: {size: 4}\n"
      "transforms: [{resize: {shorter: 24}}, {center_crop: {size: 16}}]\n";
  auto j = config::ParseJobConfig(job + "share: true\nshare_members: 4\n");
  REQUIRE(j.config);
  CHECK(j.config->share);
  CHECK(j.config->share_members == 4);
  auto jb = config::ParseJobConfig(job + "share: sometimes\nshare_members: 0\n");
  CHECK(jb.errors.size() == 2);
}

// ---- share groups through the real registry, inline ----

// A temporary directory (dir) with a small image folder (2 classes x 6 images) at dir/data.
struct Folder {
  Folder() {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 6;  // 12 images, batches of 4: 3 batches an epoch
    o.min_side = 40;
    o.max_side = 80;
    REQUIRE(testdata::MakeImageFolder(dir + "/data", o).ok());
  }
  testing::TempDir tmp;
  const std::string dir = tmp.path;
};

proto::SubmitJob Request(const Folder& f, const std::string& extra) {
  proto::SubmitJob r;
  r.set_config_yaml("source: {type: image_folder, root: " + f.dir +
                    "/data}\n"
                    "sampler: {shuffle: true, seed: 3}\n"
                    "batch: {size: 4}\n"
                    "transforms: [{resize: {shorter: 24}}, {center_crop: {size: 16}}]\n"
                    "prefetch: 2\n" +
                    extra);
  r.set_epochs(2);
  return r;
}

config::DaemonConfig Config(const Folder& f, uint64_t cache_bytes = 0) {
  config::DaemonConfig c;
  c.allowed_roots = {f.dir};
  c.cache_bytes = cache_bytes;
  return c;
}

// A client: takes every ready batch, keeps (seq, first path) and holds its slots until told.
struct Client {
  std::shared_ptr<jobs::JobHandle> job;
  std::vector<std::pair<uint64_t, std::string>> got;
  std::vector<proto::BatchReady> held;
  bool ended = false;
  int notified = 0;
  void Take() {
    while (job && !ended) {
      auto d = job->TakeNext();
      if (!d) return;
      got.emplace_back(d->batch.seq(), d->batch.paths(0));
      held.push_back(d->batch);
      if (d->job_end) ended = true;
    }
  }
  void ReleaseAll() {
    for (const auto& b : held) REQUIRE(job->Release(b.slot(), b.generation()).ok());
    held.clear();
  }
};

jobs::PeerInfo Me() { return {::getpid(), ::getuid(), ::getgid()}; }

TEST_CASE("share: identical jobs run one pipeline and every member gets every batch") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f), &ex);
  std::vector<Client> clients(3);
  for (auto& c : clients) {
    auto r = reg.Submit(Request(f, "share: true\nshare_members: 3\n"), Me(), [&c] { ++c.notified; });
    REQUIRE(r.ok());
    c.job = r.job;
  }
  CHECK(reg.live_jobs() == 1);  // one pipeline, one budget lease
  CHECK(clients[0].job->accepted().job_id() != clients[1].job->accepted().job_id());
  CHECK(clients[0].job->region_fd() == clients[2].job->region_fd());
  CHECK(clients[1].job->Stats().share_members() == 3);

  // Round robin with the slowest pace: everyone takes what is ready, then releases.
  for (int round = 0; round < 20; ++round) {
    for (auto& c : clients) c.Take();
    for (auto& c : clients) c.ReleaseAll();
  }
  for (auto& c : clients) {
    CHECK(c.ended);
    CHECK(c.got.size() == 6);  // 3 batches x 2 epochs
    CHECK(c.got == clients[0].got);
  }
  for (auto& c : clients) c.job.reset();
  CHECK(reg.live_jobs() == 0);
}

TEST_CASE("share: the group waits for its slowest member up to the ring's depth") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f), &ex);
  Client fast, slow;
  auto a = reg.Submit(Request(f, "share: true\nshare_members: 2\n"), Me(), [] {});
  REQUIRE(a.ok());
  fast.job = a.job;
  fast.Take();
  CHECK(fast.got.empty());  // the first batch waits for the second member
  auto b = reg.Submit(Request(f, "share: true\nshare_members: 2\n"), Me(), [] {});
  REQUIRE(b.ok());
  slow.job = b.job;
  fast.Take();
  CHECK(fast.got.size() == 2);  // the whole ring (prefetch 2)
  fast.ReleaseAll();
  fast.Take();
  CHECK(fast.got.size() == 2);  // the slow member still holds both slots
  slow.Take();
  CHECK(slow.got.size() == 2);
  CHECK(slow.got == fast.got);
  slow.held.erase(slow.held.begin() + 1);  // keeps its second batch
  slow.ReleaseAll();
  fast.Take();
  CHECK(fast.got.size() == 3);                // one slot came back
  CHECK_FALSE(fast.job->Release(7, 1).ok());  // not a slot it holds
}

TEST_CASE("share: a member that leaves mid-epoch releases its holds and the rest finish exactly") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f), &ex);
  std::vector<Client> clients(3);
  for (auto& c : clients) {
    auto r = reg.Submit(Request(f, "share: true\nshare_members: 3\n"), Me(), [] {});
    REQUIRE(r.ok());
    c.job = r.job;
  }
  for (auto& c : clients) c.Take();
  clients[1].ReleaseAll();
  // Member 2 goes away holding both slots (a session that disconnects cancels its job).
  clients[2].job->Cancel();
  clients[2].job.reset();
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 2; ++i) clients[i].Take();
    for (int i = 0; i < 2; ++i) clients[i].ReleaseAll();
  }
  for (int i = 0; i < 2; ++i) {
    CHECK(clients[i].ended);
    CHECK(clients[i].got.size() == 6);
  }
  CHECK(clients[0].got == clients[1].got);
}

TEST_CASE("share: spdlctl cancel of one member stops only that member") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f), &ex);
  Client a, b;
  a.job = reg.Submit(Request(f, "share: true\nshare_members: 2\n"), Me(), [] {}).job;
  b.job = reg.Submit(Request(f, "share: true\nshare_members: 2\n"), Me(), [] {}).job;
  REQUIRE(a.job);
  REQUIRE(b.job);
  a.Take();
  b.Take();
  REQUIRE(reg.Cancel(b.job->accepted().job_id(), Me()).ok());
  CHECK_FALSE(b.job->failure().ok());
  CHECK(a.job->failure().ok());
  for (int round = 0; round < 20; ++round) {
    a.Take();
    a.ReleaseAll();
  }
  CHECK(a.ended);
  CHECK(a.got.size() == 6);
}

TEST_CASE("share: late joiners, other configs and unshared jobs get pipelines of their own") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f), &ex);
  Client first;
  first.job = reg.Submit(Request(f, "share: true\n"), Me(), [] {}).job;
  REQUIRE(first.job);
  first.Take();  // share_members 1: starts at once
  REQUIRE_FALSE(first.got.empty());
  auto late = reg.Submit(Request(f, "share: true\n"), Me(), [] {});
  REQUIRE(late.ok());
  CHECK(reg.live_jobs() == 2);
  auto other_config = reg.Submit(Request(f, "share: true\nweight: 2\n"), Me(), [] {});
  auto unshared = reg.Submit(Request(f, ""), Me(), [] {});
  CHECK(other_config.ok());
  CHECK(reg.live_jobs() == 4);
  CHECK(unshared.job->Stats().share_members() == 0);
}

TEST_CASE("cache: a job's second epoch reads nothing, and its stats say so") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f, 64 << 20), &ex);
  Client c;
  c.job = reg.Submit(Request(f, ""), Me(), [] {}).job;
  REQUIRE(c.job);
  for (int round = 0; round < 20; ++round) {
    c.Take();
    c.ReleaseAll();
  }
  REQUIRE(c.ended);
  const proto::JobStats s = c.job->Stats();
  CHECK(s.cache_misses() == 12);
  CHECK(s.cache_hits() == 12);
  CHECK(s.cache_budget_bytes() == (64u << 20));
  CHECK(s.cache_bytes() > 0);
  CHECK(s.cache_evictions() == 0);
}

TEST_CASE("cache: members of a share group report the group's cache figures") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f, 64 << 20), &ex);
  Client a, b;
  a.job = reg.Submit(Request(f, "share: true\nshare_members: 2\n"), Me(), [] {}).job;
  b.job = reg.Submit(Request(f, "share: true\nshare_members: 2\n"), Me(), [] {}).job;
  REQUIRE(a.job);
  REQUIRE(b.job);
  a.Take();
  b.Take();
  CHECK(a.job->Stats().cache_misses() > 0);
  CHECK(b.job->Stats().cache_misses() == a.job->Stats().cache_misses());
  CHECK(b.job->Stats().share_members() == 2);
  CHECK(b.job->Stats().share_group_job_id() == a.job->Stats().share_group_job_id());
}

// ---- SubmitJob.start_epoch (the Python client's set_epoch) ----

// Every batch of a job, as (epoch, paths), releasing each at once; the job must end.
std::vector<std::pair<uint32_t, std::vector<std::string>>> RunToEnd(jobs::JobRegistry& reg,
                                                                    const proto::SubmitJob& req) {
  auto r = reg.Submit(req, Me(), [] {});
  REQUIRE(r.ok());
  std::vector<std::pair<uint32_t, std::vector<std::string>>> got;
  bool ended = false;
  for (int round = 0; round < 100 && !ended; ++round) {
    while (auto d = r.job->TakeNext()) {
      got.emplace_back(d->batch.epoch(), std::vector<std::string>(d->batch.paths().begin(), d->batch.paths().end()));
      REQUIRE(r.job->Release(d->batch.slot(), d->batch.generation()).ok());
      if (d->job_end) {
        ended = true;
        break;
      }
    }
  }
  CHECK(ended);
  return got;
}

TEST_CASE("start_epoch: a job started at epoch 1 delivers exactly an uninterrupted run's epoch 1") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f), &ex);
  const auto full = RunToEnd(reg, Request(f, ""));  // epochs 0 and 1, 3 batches each
  REQUIRE(full.size() == 6);
  proto::SubmitJob req = Request(f, "");
  req.set_start_epoch(1);
  const auto from1 = RunToEnd(reg, req);
  REQUIRE(from1.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(from1[i].first == 1);
    CHECK(from1[i].second == full[3 + i].second);
  }
  CHECK(full[0].second != full[3].second);  // epochs differ: the check above can tell them apart
}

TEST_CASE("start_epoch: past the requested epochs, or with a resume token, is refused") {
  Folder f;
  pipeline::InlineExecutor ex;
  jobs::JobRegistry reg(Config(f), &ex);
  proto::SubmitJob past = Request(f, "");  // epochs: 2
  past.set_start_epoch(2);
  auto r = reg.Submit(past, Me(), [] {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(r.status.message(), Catch::Contains("start_epoch 2 is past the last of the 2 epochs"));
  proto::SubmitJob both = Request(f, "");
  both.set_start_epoch(1);
  both.set_resume_token("x");
  r = reg.Submit(both, Me(), [] {});
  REQUIRE_FALSE(r.ok());
  CHECK(r.status.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(r.status.message(), Catch::Contains("not both"));
  proto::SubmitJob endless = Request(f, "");
  endless.set_epochs(0);  // until ended: any start epoch
  endless.set_start_epoch(7);
  r = reg.Submit(endless, Me(), [] {});
  REQUIRE(r.ok());
  auto d = r.job->TakeNext();
  REQUIRE(d);
  CHECK(d->batch.epoch() == 7);
  CHECK(reg.live_jobs() == 1);
}

}  // namespace
}  // namespace spdl
