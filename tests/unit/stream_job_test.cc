// StreamJob (jobs/stream_job.h) through the real JobRegistry, a real ThreadPool, a real stream and
// real JPEG files: stream jobs decode on the daemon's shared worker pool (the pool held busy holds
// two stream jobs' decodes in its queue, and they go on with a file job once it is free), a
// garbage sample fails per on_error without stalling the stream (a full batch stays full), and
// max_batch_delay_ms sends a partial batch; a pool stopped at shutdown fails the job and
// consumes nothing.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/daemon_config.h"
#include "e2e/dataset.h"
#include "jobs/job_registry.h"
#include "pipeline/thread_pool.h"
#include "proto/job_stats_fields.h"
#include "streams/stream.h"

namespace spdl::jobs {
namespace {

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// A folder of real JPEGs (2 classes x 4), read back as bytes for the producer.
struct Data {
  Data() {
    char t[] = "/tmp/spdl-stream-job-XXXXXX";
    REQUIRE(mkdtemp(t) != nullptr);
    path = t;
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 4;
    o.min_side = 40;
    o.max_side = 80;
    REQUIRE(testdata::MakeImageFolder(path + "/data", o).ok());
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(path + "/data")) {
      if (e.is_regular_file()) files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      std::ifstream in(f, std::ios::binary);
      jpegs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    REQUIRE(jpegs.size() == 8);
  }
  ~Data() { std::filesystem::remove_all(path); }
  std::string path;
  std::vector<std::vector<uint8_t>> jpegs;
};

proto::SubmitJob Yaml(const std::string& source, const std::string& extra = "") {
  proto::SubmitJob r;
  r.set_config_yaml("source: " + source + "\nbatch: {size: 4}\ntransforms: [{resize: {height: 32, width: 32}}]\n" +
                    "prefetch: 2\n" + extra);
  r.set_config_name("job.yaml");
  r.set_epochs(1);  // a file job's one epoch (a stream job has none: it ends with its stream)
  return r;
}

// Holds every thread of a pool busy until Open().
class PoolGate {
 public:
  PoolGate(pipeline::ThreadPool* pool, int threads) {
    for (int i = 0; i < threads; ++i) {
      pool->Post([this] {
        std::unique_lock<std::mutex> lock(mu_);
        ++entered_;
        cv_.notify_all();
        cv_.wait(lock, [&] { return open_; });
      });
    }
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_ == threads; });
  }
  ~PoolGate() { Open(); }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;
  bool open_ = false;
};

// Takes every batch the job delivers until its last (or `limit`), releasing each; returns the rows
// of each batch.
std::vector<uint32_t> Drain(JobHandle& job, bool* ended, std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  std::vector<uint32_t> rows;
  *ended = false;
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!*ended && std::chrono::steady_clock::now() < until && job.failure().ok()) {
    std::optional<Delivery> d = job.TakeNext();
    if (!d) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    rows.push_back(d->batch.rows());
    if (d->job_end) {
      *ended = true;
    } else {
      REQUIRE(job.Release(d->batch.slot(), d->batch.generation()).ok());
    }
  }
  return rows;
}

uint32_t Sum(const std::vector<uint32_t>& v) {
  uint32_t n = 0;
  for (uint32_t x : v) n += x;
  return n;
}

// What every case sets up: the dataset, a registry on a 2-thread pool (file jobs may read the
// dataset) and one stream, `name`, defined by this process's user. The registry goes first.
struct Rig {
  explicit Rig(const std::string& name) {
    cfg.allowed_roots = {data.path};
    registry = std::make_unique<JobRegistry>(cfg, pool.get(), 2);
    streams::StreamConfig sc;
    sc.name = name;
    auto defined = registry->streams()->Define(sc, me.uid);
    REQUIRE(defined.ok());
    stream = *defined;
  }
  auto parts() { return std::tie(data, pool, me, *registry, stream); }

  Data data;
  config::DaemonConfig cfg;
  std::unique_ptr<pipeline::ThreadPool> pool = std::make_unique<pipeline::ThreadPool>(2);
  const PeerInfo me{::getpid(), ::getuid(), ::getgid()};
  std::unique_ptr<JobRegistry> registry;
  std::shared_ptr<streams::Stream> stream;
};

TEST_CASE("stream job: decodes on the shared worker pool, with the file jobs") {
  Rig rig("pool-test");
  auto [data, pool, me, reg, stream] = rig.parts();
  {
    SubmitResult a = reg.Submit(Yaml("{type: stream, name: pool-test, group: a}"), me, [] {});
    SubmitResult b = reg.Submit(Yaml("{type: stream, name: pool-test, group: b}"), me, [] {});
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    {
      // Every pool thread busy: the stream jobs' decodes wait in the pool's queue, nothing decodes
      // them anywhere else (no batch comes out).
      PoolGate gate(pool.get(), 2);
      for (size_t i = 0; i < data.jpegs.size(); ++i) {
        REQUIRE(stream->Put(data.jpegs[i], static_cast<int64_t>(i), "").ok());
      }
      // Each job's dispatcher fills one slot of 4 rows and waits for its decodes.
      CHECK(WaitFor([&] { return pool->queued() >= 8; }));
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      CHECK_FALSE(a.job->TakeNext().has_value());
      CHECK_FALSE(b.job->TakeNext().has_value());
      INFO("pool tasks queued while its threads were held: " << pool->queued());
      CHECK(pool->queued() >= 8);
      // A file job submitted meanwhile queues on the same pool.
      SubmitResult file = reg.Submit(Yaml("{type: image_folder, root: " + data.path + "/data}"), me, [] {});
      REQUIRE(file.ok());
      gate.Open();
      bool ended = false;
      CHECK(Sum(Drain(*file.job, &ended)) == 8);
      CHECK(ended);
    }
    stream->Close();
    for (SubmitResult* r : {&a, &b}) {
      bool ended = false;
      const std::vector<uint32_t> rows = Drain(*r->job, &ended);
      CHECK(ended);
      CHECK(Sum(rows) == 8);  // each group sees every sample
      CHECK(r->job->failure().ok());
      const proto::JobStats st = r->job->Stats();
      CHECK(st.samples_tried() == 8);
      // The decode stage's figures, as a file job's (spdlctl, /metrics).
      REQUIRE(st.stages_size() == 1);
      CHECK(st.stages(0).name() == "decode");
      CHECK(st.stages(0).kind() == "cpu");
      CHECK(st.stages(0).tasks() == 8);
      CHECK(st.stages(0).failures() == 0);
      CHECK(st.stages(0).queue_length() == 0);
      CHECK(st.stages(0).running() == 0);
    }
    a = SubmitResult{};
    b = SubmitResult{};
    pool->Join();  // the daemon's order: the pool joins before the registry goes
  }
}

TEST_CASE("stream job: a garbage sample is skipped per on_error, the batch still fills") {
  Rig rig("garbage-test");
  auto [data, pool, me, reg, stream] = rig.parts();
  {
    SubmitResult skip =
        reg.Submit(Yaml("{type: stream, name: garbage-test, group: skip}", "on_error: skip\n"), me, [] {});
    SubmitResult fail =
        reg.Submit(Yaml("{type: stream, name: garbage-test, group: fail}", "on_error: fail\n"), me, [] {});
    REQUIRE(skip.ok());
    REQUIRE(fail.ok());
    const std::vector<uint8_t> garbage(300, 0x5a);
    for (size_t i = 0; i < 3; ++i) REQUIRE(stream->Put(data.jpegs[i], 0, "").ok());
    REQUIRE(stream->Put(garbage, 0, "").ok());
    for (size_t i = 3; i < 8; ++i) REQUIRE(stream->Put(data.jpegs[i], 0, "").ok());
    stream->Close();
    bool ended = false;
    const std::vector<uint32_t> rows = Drain(*skip.job, &ended);
    CHECK(ended);
    CHECK(skip.job->failure().ok());
    REQUIRE(rows.size() >= 2);
    CHECK(rows[0] == 4);  // the garbage sample's row was filled by the next sample
    CHECK(rows[1] == 4);
    CHECK(Sum(rows) == 8);
    CHECK(skip.job->Stats().samples_failed() == 1);
    CHECK(skip.job->Stats().samples_tried() == 9);
    CHECK(skip.job->Stats().stages(0).failures() == 1);
    // on_error: fail: the job fails naming why; the stream is not stuck for the other group.
    CHECK(WaitFor([&] { return !fail.job->failure().ok(); }));
    CHECK_THAT(fail.job->failure().message(), Catch::Contains("on_error: fail"));
    skip = SubmitResult{};
    fail = SubmitResult{};
    pool->Join();
  }
}

TEST_CASE("stream job: max_batch_delay_ms sends the rows it has") {
  Rig rig("delay-test");
  auto [data, pool, me, reg, stream] = rig.parts();
  {
    SubmitResult j =
        reg.Submit(Yaml("{type: stream, name: delay-test, group: g}", "max_batch_delay_ms: 20\n"), me, [] {});
    REQUIRE(j.ok());
    REQUIRE(stream->Put(data.jpegs[0], 0, "").ok());
    REQUIRE(stream->Put(data.jpegs[1], 1, "").ok());
    std::optional<Delivery> d;
    CHECK(WaitFor([&] { return (d = j.job->TakeNext()).has_value(); }));
    REQUIRE(d.has_value());
    CHECK(d->batch.rows() == 2);
    CHECK_FALSE(d->job_end.has_value());
    REQUIRE(d->batch.offsets_size() == 2);
    CHECK(d->batch.offsets(0) == 0);
    CHECK(d->batch.offsets(1) == 1);
    CHECK(j.job->Release(d->batch.slot(), d->batch.generation()).ok());
    stream->Close();
    bool ended = false;
    CHECK(Sum(Drain(*j.job, &ended)) == 0);
    CHECK(ended);
    // Acknowledged on release: the group has nothing in flight.
    const streams::StreamStats st = stream->Stats();
    REQUIRE(st.groups.size() == 1);
    CHECK(st.groups[0].in_flight == 0);
    CHECK(st.groups[0].lag == 0);
    j = SubmitResult{};
    pool->Join();
  }
}

TEST_CASE("stream job: decodes the stopped pool drops fail the job, their samples go back to the group") {
  Rig rig("stopped-pool");
  auto [data, pool, me, reg, stream] = rig.parts();
  {
    SubmitResult j = reg.Submit(Yaml("{type: stream, name: stopped-pool, group: g}"), me, [] {});
    REQUIRE(j.ok());
    pool->Join();  // daemon shutdown: later posts are dropped without running
    for (size_t i = 0; i < 4; ++i) REQUIRE(stream->Put(data.jpegs[i], 0, "").ok());
    CHECK(WaitFor([&] { return !j.job->failure().ok(); }));
    CHECK_THAT(j.job->failure().message(), Catch::Contains("worker pool stopped"));
    CHECK(j.job->Stats().samples_failed() == 0);  // not decoded is not failed: nothing consumed
    j = SubmitResult{};
    // The job left: its samples wait for the group's next consumer, none acknowledged.
    const streams::StreamStats st = stream->Stats();
    REQUIRE(st.groups.size() == 1);
    CHECK(st.groups[0].lag == 4);  // nothing acknowledged
    CHECK(st.groups[0].in_flight == 0);
    CHECK(st.groups[0].redeliver >= 1);  // those the job had taken (the rest were never handed out)
  }
}

TEST_CASE("every stream and group figure described for spdlctl and the metrics is filled from the stream's stats") {
  // Each figure of the engine's stats a value of its own: a row of proto/job_stats_fields.h whose
  // field StreamStatusOf does not fill reads 0 here.
  streams::StreamStats s;
  s.name = "frames";
  s.owner_uid = 1000;
  s.max_samples = 3;
  s.max_bytes = 4;
  s.head_offset = 5;
  s.tail_offset = 6;
  s.retained_samples = 7;
  s.retained_bytes = 8;
  s.put_bytes = 9;
  s.evicted = 10;
  s.blocked_puts = 11;
  s.producers = 12;
  s.closed = true;
  streams::GroupStats g;
  g.name = "train";
  g.consumers = 13;
  g.next_offset = 14;
  g.acked_below = 15;
  g.lag = 16;
  g.in_flight = 17;
  g.redeliver = 18;
  g.delivered = 19;
  g.redelivered = 20;
  s.groups.push_back(g);
  const proto::StreamStatus o = StreamStatusOf(s);
  CHECK(o.name() == "frames");
  for (const auto& f : proto::StreamStatFields()) {
    CAPTURE(f.name);
    CHECK(proto::StatValue(o, f) != 0);
  }
  CHECK(o.retained_samples() == 7);
  CHECK(o.tail_offset() == 6);
  REQUIRE(o.groups_size() == 1);
  CHECK(o.groups(0).name() == "train");
  for (const auto& f : proto::StreamGroupStatFields()) {
    CAPTURE(f.name);
    CHECK(proto::StatValue(o.groups(0), f) != 0);
  }
  CHECK(o.groups(0).lag() == 16);
  CHECK(o.groups(0).next_offset() == 14);
}

}  // namespace
}  // namespace spdl::jobs
