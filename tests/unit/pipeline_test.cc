// The batch pipeline with a fake row processor: order, backpressure, skip-and-replace, packing,
// the fail policy, epochs and cancellation. Runs inline (InlineExecutor) and on a real pool.
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SPDL_TEST_SANITIZER_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SPDL_TEST_SANITIZER_ALLOCATOR 1
#endif
#endif
#ifdef SPDL_TEST_SANITIZER_ALLOCATOR
// The sanitizer runtimes' allocator statistics (sanitizer/allocator_interface.h, which gcc 12 does
// not ship; libasan and libtsan export the function).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#else
#include <malloc.h>
#endif
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "pipeline/batch_pipeline.h"
#include "pipeline/thread_pool.h"

namespace spdl::pipeline {
namespace {

// Two stages like a real job: "read" (io) fills the row's buffer, "decode" (cpu) writes the sample
// index into its row of a fake slot memory. Fails indices in `bad` at decode, in `bad_read` at read.
class FakeProcessor : public RowProcessor {
 public:
  FakeProcessor(uint32_t slots, uint32_t batch) : rows_(slots, std::vector<int64_t>(batch, -1)) {}
  std::vector<StageSpec> Stages() const override { return {{"read", StageKind::kIo}, {"decode", StageKind::kCpu}}; }
  Status RunStage(uint32_t stage, RowTask& t) override {
    if (stage == 0) {
      if (bad_read.count(t.index)) return NotFound("sample " + std::to_string(t.index) + " is missing");
      t.bytes.assign(8, 0);
      std::memcpy(t.bytes.data(), &t.index, 8);
      return Status::Ok();
    }
    if (delay_us) std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    if (on_decode) on_decode(t.index);
    if (bad.count(t.index)) return DataLoss("sample " + std::to_string(t.index) + " is bad");
    uint64_t read = 0;
    if (t.bytes.size() != 8) return Internal("decode ran before read");
    std::memcpy(&read, t.bytes.data(), 8);
    if (read != t.index) return Internal("the read buffer holds another sample");
    rows_[t.slot][t.row] = static_cast<int64_t>(t.index);
    return Status::Ok();
  }
  void MoveRow(uint32_t slot, uint32_t from, uint32_t to) override { rows_[slot][to] = rows_[slot][from]; }
  // The batch stage: fails the rows holding an index of `batch_bad` and packs the rest (as the GPU
  // decode does); `batch_error` fails the step itself.
  Status BatchStage(uint32_t slot, uint32_t rows, std::vector<BatchRowFailure>* failed) override {
    ++batch_stages;
    if (!batch_error.ok()) return batch_error;
    uint32_t write = 0;
    for (uint32_t r = 0; r < rows; ++r) {
      const auto index = static_cast<uint64_t>(rows_[slot][r]);
      if (batch_bad.count(index)) {
        failed->push_back({r, DataLoss("sample " + std::to_string(index) + " failed in the batch stage")});
        continue;
      }
      if (r != write) MoveRow(slot, r, write);
      ++write;
    }
    return Status::Ok();
  }
  int64_t at(uint32_t slot, uint32_t row) const { return rows_[slot][row]; }
  std::set<uint64_t> batch_bad;
  Status batch_error;
  std::atomic<int> batch_stages{0};  // pool threads count concurrently
  std::set<uint64_t> bad;
  std::set<uint64_t> bad_read;
  int delay_us = 0;
  std::function<void(uint64_t)> on_decode;  // called at the start of each decode

 private:
  std::vector<std::vector<int64_t>> rows_;
};

std::vector<uint64_t> Iota(uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

// A fixed pseudo-random permutation per epoch, like the real sampler's.
std::vector<uint64_t> Shuffled(uint64_t n, uint64_t epoch) {
  std::vector<uint64_t> v = Iota(n);
  uint64_t s = 0x9e3779b97f4a7c15ull * (epoch + 1);
  for (uint64_t i = n; i > 1; --i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(v[i - 1], v[(s >> 33) % i]);
  }
  return v;
}

struct Harness {
  Harness(uint32_t slots, uint64_t n, const PipelineOptions& o, Executor* ex, bool shuffle = false)
      : ring(slots), proc(slots, o.batch_size), owner(std::make_shared<int>(0)) {
    pipe = std::make_unique<BatchPipeline>(
        ex, &ring, &proc, [n, shuffle](uint64_t e) { return shuffle ? Shuffled(n, e) : Iota(n); }, o,
        [this] { notified++; }, owner);
  }
  // Drains every ready batch in order, checking that the slot's rows match the meta.
  std::vector<SlotMeta> Drain(bool release = true) {
    std::vector<SlotMeta> out;
    while (auto l = ring.TakeNextReady()) {
      SlotMeta m = pipe->TakeMeta(l->slot);
      for (uint32_t r = 0; r < m.rows; ++r) REQUIRE(proc.at(l->slot, r) == static_cast<int64_t>(m.indices[r]));
      out.push_back(m);
      if (release) {
        REQUIRE(ring.Release(l->slot, l->generation).ok());
        pipe->Pump();
      }
    }
    return out;
  }
  shm::SlotRing ring;
  FakeProcessor proc;
  std::shared_ptr<int> owner;
  std::atomic<int> notified{0};
  std::unique_ptr<BatchPipeline> pipe;
};

TEST_CASE("batches come out in order, epoch by epoch, then stop") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  o.epochs = 2;
  Harness h(3, 10, o, &inline_ex);
  h.pipe->Pump();
  auto metas = h.Drain();
  REQUIRE(metas.size() == 6);  // 3 batches (4, 4, 2) per epoch
  CHECK(metas[0].rows == 4);
  CHECK(metas[2].rows == 2);
  CHECK(metas[2].last_in_epoch);
  CHECK_FALSE(metas[2].last_in_job);
  CHECK(metas[3].epoch == 1);
  CHECK(metas[3].batch_in_epoch == 0);
  CHECK(metas[5].last_in_job);
  for (size_t i = 0; i < metas.size(); ++i) CHECK(metas[i].seq == i);
  CHECK(h.pipe->all_dispatched());
  CHECK(h.ring.counts().free == 3);
}

TEST_CASE("no free slot means nothing is dispatched") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 2;
  o.epochs = 0;  // endless
  Harness h(2, 100, o, &inline_ex);
  h.pipe->Pump();
  auto first = h.Drain(/*release=*/false);
  CHECK(first.size() == 2);
  h.pipe->Pump();  // the ring is full: nothing happens
  CHECK(h.ring.counts().leased == 2);
  CHECK(h.ring.counts().filling == 0);
  CHECK(h.proc.at(0, 0) == 0);
}

TEST_CASE("a bad sample is replaced by the next one, keeping batches full") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  o.drop_last = true;
  Harness h(2, 10, o, &inline_ex);
  h.proc.bad = {1, 5};
  h.pipe->Pump();
  auto metas = h.Drain();
  REQUIRE(metas.size() == 2);
  std::multiset<uint64_t> seen;
  for (auto& m : metas) {
    CHECK(m.rows == 4);
    seen.insert(m.indices.begin(), m.indices.end());
  }
  CHECK(seen == std::multiset<uint64_t>{0, 2, 3, 4, 6, 7, 8, 9});
  CHECK(h.pipe->EpochSkipped(0) == 2);
  CHECK(h.pipe->TotalSkipped() == 2);
  auto stats = h.pipe->StageSnapshots();
  CHECK(stats[0].name == "read");
  CHECK(stats[0].tasks == 10);
  CHECK(stats[0].failures == 0);
  CHECK(stats[1].name == "decode");
  CHECK(stats[1].failures == 2);
  CHECK(stats[1].tasks == 10);
}

TEST_CASE("with no spare left, a short batch packs its good rows to the front") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  Harness h(2, 8, o, &inline_ex);
  h.proc.bad = {1, 6};
  h.pipe->Pump();
  auto metas = h.Drain();
  REQUIRE(metas.size() == 2);
  CHECK(metas[0].rows + metas[1].rows == 6);
  std::set<uint64_t> seen;
  for (auto& m : metas) seen.insert(m.indices.begin(), m.indices.end());
  CHECK(seen == std::set<uint64_t>{0, 2, 3, 4, 5, 7});
}

TEST_CASE("when spares use up the epoch, the batch dispatched last still ends it") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  o.epochs = 2;
  // 14 samples: batches 0-3, 4-7, 8-11, 12-13. Bad 8 and 9 take 12 and 13 as spares, so the
  // fourth batch never exists and the third must carry the end of the epoch.
  Harness h(3, 14, o, &inline_ex);
  h.proc.bad = {8, 9};
  h.pipe->Pump();
  auto metas = h.Drain();
  REQUIRE(metas.size() == 6);
  CHECK(metas[2].last_in_epoch);
  CHECK(metas[2].rows == 4);
  CHECK(metas[3].epoch == 1);
  CHECK(metas[5].last_in_job);
  CHECK(h.pipe->EpochSkipped(1) == 2);
}

// Runs a job to the end and returns its batches.
std::vector<SlotMeta> RunAll(uint32_t slots, uint64_t n, const PipelineOptions& o, std::set<uint64_t> bad) {
  InlineExecutor ex;
  Harness h(slots, n, o, &ex, /*shuffle=*/true);
  h.proc.bad = std::move(bad);
  h.pipe->Pump();
  return h.Drain();
}

TEST_CASE("resuming after any batch delivers exactly the rest of the run, in the same order") {
  PipelineOptions o;
  o.batch_size = 4;
  o.epochs = 3;
  const uint64_t n = 23;
  auto full = RunAll(3, n, o, {});
  REQUIRE(full.size() == 18);
  for (size_t k = 0; k + 1 < full.size(); ++k) {
    PipelineOptions ro = o;
    ro.resume = full[k].resume;
    auto rest = RunAll(3, n, ro, {});
    REQUIRE(rest.size() == full.size() - k - 1);
    for (size_t i = 0; i < rest.size(); ++i) {
      CHECK(rest[i].indices == full[k + 1 + i].indices);
      CHECK(rest[i].epoch == full[k + 1 + i].epoch);
      CHECK(rest[i].batch_in_epoch == full[k + 1 + i].batch_in_epoch);
      CHECK(rest[i].last_in_epoch == full[k + 1 + i].last_in_epoch);
    }
    CHECK(rest.back().last_in_job);
  }
}

TEST_CASE("with bad samples, stopped + resumed still delivers every good sample once per epoch") {
  PipelineOptions o;
  o.batch_size = 4;
  o.epochs = 2;
  const uint64_t n = 30;
  const std::set<uint64_t> bad = {3, 11, 12, 20, 29};
  auto full = RunAll(3, n, o, bad);
  for (size_t k = 0; k + 1 < full.size(); ++k) {
    PipelineOptions ro = o;
    ro.resume = full[k].resume;
    // Resume twice: from the resumed run's own tokens too.
    auto rest = RunAll(3, n, ro, bad);
    std::vector<SlotMeta> all(full.begin(), full.begin() + static_cast<ptrdiff_t>(k + 1));
    if (rest.size() > 2) {
      PipelineOptions ro2 = o;
      ro2.resume = rest[1].resume;
      auto rest2 = RunAll(3, n, ro2, bad);
      all.insert(all.end(), rest.begin(), rest.begin() + 2);
      all.insert(all.end(), rest2.begin(), rest2.end());
    } else {
      all.insert(all.end(), rest.begin(), rest.end());
    }
    std::vector<std::multiset<uint64_t>> per_epoch(2);
    for (auto& m : all) per_epoch[m.epoch].insert(m.indices.begin(), m.indices.end());
    for (auto& e : per_epoch) {
      CHECK(e.size() == n - bad.size());
      CHECK(std::set<uint64_t>(e.begin(), e.end()).size() == n - bad.size());
    }
  }
}

TEST_CASE("on_error: fail stops the job with the sample's error") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  o.fail_on_error = true;
  Harness h(2, 16, o, &inline_ex);
  h.proc.bad = {2};
  h.pipe->Pump();
  CHECK(h.pipe->failure().code() == StatusCode::kDataLoss);
  CHECK(h.pipe->failure().message() == "sample 2 is bad (stage 'decode', on_error: fail)");
  CHECK(h.pipe->cancelled());
  CHECK(h.notified > 0);
}

TEST_CASE("the batch stage drops the rows it fails (counted, per on_error) or fails the job") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  SECTION("on_error: skip: the batch comes out short, the sample counted as failed") {
    Harness h(2, 10, o, &inline_ex);
    h.proc.batch_bad = {1, 6};
    h.pipe->Pump();
    auto metas = h.Drain();  // checks every delivered row against its meta
    REQUIRE(metas.size() == 3);
    CHECK(metas[0].rows == 3);
    CHECK(metas[0].indices == std::vector<uint64_t>{0, 2, 3});
    CHECK(metas[1].indices == std::vector<uint64_t>{4, 5, 7});
    CHECK(metas[2].rows == 2);
    CHECK(h.proc.batch_stages == 3);
    CHECK(h.pipe->Stats().samples_failed == 2);
    CHECK(h.pipe->EpochSkipped(0) == 2);
    CHECK(h.pipe->failure().ok());
  }
  SECTION("on_error: fail: the job fails with the sample's error") {
    o.fail_on_error = true;
    Harness h(2, 10, o, &inline_ex);
    h.proc.batch_bad = {2};
    h.pipe->Pump();
    CHECK(h.pipe->failure().code() == StatusCode::kDataLoss);
    CHECK(h.pipe->failure().message() == "sample 2 failed in the batch stage (stage 'decode', on_error: fail)");
    CHECK(h.pipe->cancelled());
  }
  SECTION("a failed step (the device) fails the job whatever on_error says") {
    Harness h(2, 10, o, &inline_ex);
    h.proc.batch_error = Unavailable("GPU decode: the device is gone");
    h.pipe->Pump();
    CHECK(h.pipe->failure().code() == StatusCode::kUnavailable);
    CHECK(h.pipe->cancelled());
  }
}

TEST_CASE("a resource error (kUnavailable) fails the job even under on_error: skip") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  // A processor whose read of sample 5 fails with EMFILE-like trouble, as io reports it.
  struct Unavailable5 : FakeProcessor {
    using FakeProcessor::FakeProcessor;
    Status RunStage(uint32_t stage, RowTask& t) override {
      if (stage == 0 && t.index == 5)
        return Unavailable("reading x: Too many open files; still failing after 6 attempts");
      return FakeProcessor::RunStage(stage, t);
    }
  };
  shm::SlotRing ring(2);
  Unavailable5 proc(2, 4);
  auto owner = std::make_shared<int>(0);
  int notified = 0;
  BatchPipeline pipe(
      &inline_ex, &ring, &proc, [](uint64_t) { return Iota(16); }, o, [&] { notified++; }, owner);
  pipe.Pump();
  CHECK(pipe.failure().code() == StatusCode::kUnavailable);
  CHECK_THAT(pipe.failure().message(), Catch::Contains("Too many open files") &&
                                           Catch::Contains("a resource error fails the job; it is not a bad sample"));
  CHECK(pipe.cancelled());
  CHECK(pipe.TotalSkipped() == 0);
}

TEST_CASE("many workers fill a long endless job exactly and in order") {
  ThreadPool pool(4);
  PipelineOptions o;
  o.batch_size = 8;
  o.epochs = 3;
  const uint64_t n = 1000;
  Harness h(4, n, o, &pool);
  h.proc.bad = {17, 500};
  h.pipe->Pump();
  std::vector<SlotMeta> all;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(all.size() && all.back().last_in_job) && std::chrono::steady_clock::now() < deadline) {
    auto got = h.Drain();
    all.insert(all.end(), got.begin(), got.end());
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  REQUIRE(!all.empty());
  REQUIRE(all.back().last_in_job);
  std::vector<std::multiset<uint64_t>> per_epoch(3);
  for (size_t i = 0; i < all.size(); ++i) {
    CHECK(all[i].seq == i);
    per_epoch[all[i].epoch].insert(all[i].indices.begin(), all[i].indices.end());
  }
  for (auto& e : per_epoch) {
    CHECK(e.size() == n - 2);
    CHECK(std::set<uint64_t>(e.begin(), e.end()).size() == n - 2);
    CHECK(e.count(17) == 0);
  }
  pool.Join();
  CHECK(h.pipe->tasks_in_flight() == 0);
}

TEST_CASE("cancel abandons the batches being filled") {
  ThreadPool pool(2);
  PipelineOptions o;
  o.batch_size = 16;
  o.epochs = 0;
  Harness h(4, 100000, o, &pool);
  h.pipe->Pump();
  h.pipe->Cancel();
  pool.Join();
  CHECK(h.pipe->tasks_in_flight() == 0);
  auto c = h.ring.counts();
  CHECK(c.filling == 0);
  CHECK(c.free + c.ready == 4);
}

// ---- resume: the two fuzzer findings (tests/fuzz/corpus/resume) ----

TEST_CASE("a resumed epoch left with fewer samples than a batch still ends, as the full run does") {
  // 14 samples, batch 6, drop_last, 1 slot, samples 0 2 3 4 bad: the full run delivers
  // [6,1,7,8,9,5] then [10..13] short with the end of the job.
  PipelineOptions o;
  o.batch_size = 6;
  o.drop_last = true;
  const std::set<uint64_t> bad = {0, 2, 3, 4};
  InlineExecutor ex;
  Harness full(1, 14, o, &ex);
  full.proc.bad = bad;
  full.pipe->Pump();
  auto all = full.Drain();
  REQUIRE(all.size() == 2);
  REQUIRE(all[1].last_in_job);
  PipelineOptions ro = o;
  ro.resume = all[0].resume;
  CHECK(ro.resume->prefix == 10);
  Harness rest(1, 14, ro, &ex);
  rest.proc.bad = bad;
  rest.pipe->Pump();
  auto got = rest.Drain();
  REQUIRE(got.size() == 1);
  CHECK(got[0].indices == all[1].indices);
  CHECK(got[0].batch_in_epoch == 1);
  CHECK(got[0].last_in_epoch);
  CHECK(got[0].last_in_job);
  CHECK(rest.pipe->all_dispatched());
}

TEST_CASE("a resume point past the end of the epoch is refused, and the pipeline still ends") {
  PipelineOptions o;
  o.batch_size = 5;
  o.drop_last = true;
  o.epochs = 2;
  ResumePoint p;
  p.epoch = 0;
  p.prefix = 70;  // past the 63 samples
  Status check = CheckResumePoint(p, 63, 5, true);
  CHECK(check.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(check.message(), Catch::Contains("past the 63 samples"));
  // The registry refuses it; should one reach the pipeline anyway, the epoch ends with an empty batch.
  o.resume = p;
  InlineExecutor ex;
  Harness h(2, 63, o, &ex);
  h.pipe->Pump();
  auto got = h.Drain();
  REQUIRE(got.size() == 1 + 12);
  CHECK(got[0].rows == 0);
  CHECK(got[0].epoch == 0);
  CHECK(got[0].last_in_epoch);
  CHECK_FALSE(got[0].last_in_job);
  CHECK(got[0].resume.epoch == 1);
  CHECK(got.back().last_in_job);
}

TEST_CASE("resume points the daemon hands out pass the check, made-up ones do not") {
  PipelineOptions o;
  o.batch_size = 4;
  o.epochs = 1;
  auto full = RunAll(2, 23, o, {5, 6});
  for (auto& m : full) {
    if (m.last_in_job) continue;
    CHECK(CheckResumePoint(m.resume, 23, 4, false).ok());
  }
  ResumePoint p;
  p.prefix = 8;
  p.extras = {3};
  CHECK_FALSE(CheckResumePoint(p, 23, 4, false).ok());  // an extra below the prefix
  p.extras = {30};
  CHECK_FALSE(CheckResumePoint(p, 23, 4, false).ok());  // an extra past the end
  p.extras = {};
  p.next_batch = 6;
  CHECK_FALSE(CheckResumePoint(p, 23, 4, false).ok());  // 23 samples make 6 batches: 0..5
  p.next_batch = 2;
  p.prefix = 23;
  CHECK_FALSE(CheckResumePoint(p, 23, 4, false).ok());  // nothing left
}

// ---- stages: concurrency, bounded queues, the I/O pool ----

// Counts how many rows are between stages and how many decodes run at once.
class MeteredProcessor : public FakeProcessor {
 public:
  using FakeProcessor::FakeProcessor;
  Status RunStage(uint32_t stage, RowTask& t) override {
    if (stage == 0) {
      Status s = FakeProcessor::RunStage(0, t);
      std::lock_guard lock(mu);
      ++between;
      max_between = std::max(max_between, between);
      return s;
    }
    {
      std::lock_guard lock(mu);
      --between;
      ++decoding;
      max_decoding = std::max(max_decoding, decoding);
    }
    Status s = FakeProcessor::RunStage(1, t);
    std::lock_guard lock(mu);
    --decoding;
    return s;
  }
  std::mutex mu;
  int between = 0, max_between = 0, decoding = 0, max_decoding = 0;
};

// Pumps a pipeline on pools, releasing every batch as it comes, until its last batch (30 s at most);
// returns the rows delivered.
uint64_t RunToEnd(shm::SlotRing& ring, BatchPipeline& pipe) {
  pipe.Pump();
  uint64_t rows = 0;
  bool last = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!last && std::chrono::steady_clock::now() < deadline) {
    while (auto l = ring.TakeNextReady()) {
      SlotMeta m = pipe.TakeMeta(l->slot);
      rows += m.rows;
      last = m.last_in_job;
      REQUIRE(ring.Release(l->slot, l->generation).ok());
      pipe.Pump();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  REQUIRE(last);
  return rows;
}

TEST_CASE("a stage runs at most its concurrency, and a full queue holds back the stage before it") {
  ThreadPool cpu(4);
  ThreadPool io(4);
  PipelineOptions o;
  o.batch_size = 8;
  o.epochs = 1;
  o.stages = {{/*concurrency=*/2, 0}, {/*concurrency=*/1, /*queue=*/3}};
  shm::SlotRing ring(4);
  MeteredProcessor proc(4, 8);
  proc.delay_us = 300;
  auto owner = std::make_shared<int>(0);
  BatchPipeline pipe(
      &cpu, &io, &ring, &proc, [](uint64_t) { return Iota(200); }, o, [] {}, owner);
  const uint64_t rows = RunToEnd(ring, pipe);
  CHECK(rows == 200);
  CHECK(proc.max_decoding == 1);
  // Rows read but not yet decoding: at most the queue (3), the reads holding their place (2) and the
  // one decode handed to the pool but not yet started (1).
  CHECK(proc.max_between <= 6);
  CHECK(proc.max_between >= 1);
  auto st = pipe.StageSnapshots();
  CHECK(st[0].kind == StageKind::kIo);
  CHECK(st[1].concurrency == 1);
  CHECK(st[1].queue_capacity == 3);
  CHECK(st[0].put_wait_seconds > 0);  // the slow decode held reads back
  io.Join();
  cpu.Join();
  CHECK(pipe.tasks_in_flight() == 0);
}

TEST_CASE("an absent queue bound follows the pool: twice its threads, at least 4, not the whole ring") {
  ThreadPool cpu(1);
  ThreadPool io(4);
  auto q = cpu.NewQueue(1);
  CHECK(q->Parallelism() == 1);
  PipelineOptions o;
  o.batch_size = 8;
  o.epochs = 1;
  o.stages = {{/*concurrency=*/2, 0}, {0, /*queue=*/0}};  // decode queue: automatic
  shm::SlotRing ring(4);                                  // 32 rows of room
  MeteredProcessor proc(4, 8);
  proc.delay_us = 300;
  auto owner = std::make_shared<int>(0);
  BatchPipeline pipe(
      &cpu, &io, &ring, &proc, [](uint64_t) { return Iota(120); }, o, [] {}, owner);
  const uint64_t rows = RunToEnd(ring, pipe);
  CHECK(rows == 120);
  // Read, not yet decoding: the automatic queue (max(4, 2 x 1 thread) = 4) and the 2 reads holding
  // their place (+1 as above); bounded by the ring alone it would be most of the ring's 32 rows.
  CHECK(proc.max_between <= 4 + 2 + 1);
  CHECK(proc.max_between >= 1);
  cpu.SetThreads(3);
  CHECK(q->Parallelism() == 3);
  io.Join();
  cpu.Join();
}

TEST_CASE("read-ahead: fast reads in front of a slow decode hold a few rows, not the read concurrency") {
  ThreadPool cpu(1);
  ThreadPool io(16);
  PipelineOptions o;
  o.batch_size = 16;
  o.epochs = 1;
  o.stages = {{/*concurrency=*/16, 0}, {0, /*queue=*/0}};  // decode queue: automatic, max(4, 2 x 1) = 4
  shm::SlotRing ring(4);                                   // 64 rows of room
  MeteredProcessor proc(4, 16);
  proc.delay_us = 2000;
  int after_warmup = 0;  // the most rows read and not yet decoding, once the first windows are over
  proc.on_decode = [&](uint64_t index) {
    std::lock_guard lock(proc.mu);
    if (index >= 60) after_warmup = std::max(after_warmup, proc.between);
  };
  auto owner = std::make_shared<int>(0);
  BatchPipeline pipe(
      &cpu, &io, &ring, &proc, [](uint64_t) { return Iota(240); }, o, [] {}, owner);
  const uint64_t rows = RunToEnd(ring, pipe);
  CHECK(rows == 240);
  // Without read-ahead the 16 reads would all hold a read row ahead of the queue: 4 + 16 + 1. With it
  // the reads keep what a 2 ms decode needs: a read's time (well under a decode's, even on a loaded
  // machine) x the decode's rate + kAheadSlack, so the queue (4), a couple of reads and the decode
  // handed to the pool but not started (1).
  INFO("rows read and not yet decoding, after the first 60: " << after_warmup << " (at any time: " << proc.max_between
                                                              << ")");
  CHECK(after_warmup <= 14);
  CHECK(after_warmup >= 1);
  io.Join();
  cpu.Join();
}

TEST_CASE("read-ahead: a job's start reads what the decode can take at once, not its whole ring") {
  ThreadPool cpu(1);
  ThreadPool io(16);
  PipelineOptions o;
  o.batch_size = 16;
  o.epochs = 1;
  o.stages = {{/*concurrency=*/0, 0}, {0, /*queue=*/0}};  // reads unbounded; decode queue max(4, 2 x 1) = 4
  shm::SlotRing ring(4);                                  // 64 rows dispatched at the first Pump
  MeteredProcessor proc(4, 16);
  proc.delay_us = 2000;
  auto owner = std::make_shared<int>(0);
  BatchPipeline pipe(
      &cpu, &io, &ring, &proc, [](uint64_t) { return Iota(96); }, o, [] {}, owner);
  const uint64_t rows = RunToEnd(ring, pipe);
  CHECK(rows == 96);
  // Before the first estimate the reads hold the decode's thread (1) + kAheadSlack (2), at least
  // kMinAhead, beyond its queue (4); the first window may raise that by half (the decode waited for
  // rows at the very start): 4 + 5. Unbounded, the 16 I/O threads would read the ring's 64 rows in
  // the first milliseconds.
  INFO("rows read and not yet decoding, at any time: " << proc.max_between);
  CHECK(proc.max_between <= 10);
  CHECK(proc.max_between >= 1);
  io.Join();
  cpu.Join();
}

// Bytes the process's allocator has handed out and not taken back (the sanitizers' allocator when
// built with one).
size_t AllocatedBytes() {
#ifdef SPDL_TEST_SANITIZER_ALLOCATOR
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
}

// Reads 2 MiB per sample; counts, at each decode, how many samples' worth of bytes are allocated.
class BigReadProcessor : public MeteredProcessor {
 public:
  static constexpr size_t kBytes = 2 << 20;
  using MeteredProcessor::MeteredProcessor;
  Status RunStage(uint32_t stage, RowTask& t) override {
    if (stage == 0) {
      t.bytes.assign(kBytes, 1);
      return Status::Ok();
    }
    const size_t now = AllocatedBytes();
    {
      std::lock_guard lock(mu);
      most_held = std::max(most_held, now > baseline ? (now - baseline) / kBytes : 0);
    }
    t.bytes.assign(8, 0);  // what FakeProcessor's decode checks
    std::memcpy(t.bytes.data(), &t.index, 8);
    return MeteredProcessor::RunStage(stage, t);
  }
  size_t baseline = 0;
  size_t most_held = 0;
};

TEST_CASE("a row's bytes are given back once its last stage ran, not when its batch is done") {
  ThreadPool cpu(1);
  ThreadPool io(2);
  PipelineOptions o;
  o.batch_size = 24;
  o.epochs = 1;
  o.stages = {{/*concurrency=*/2, 0}, {0, /*queue=*/0}};
  shm::SlotRing ring(2);
  BigReadProcessor proc(2, 24);
  proc.delay_us = 200;
  auto owner = std::make_shared<int>(0);
  BatchPipeline pipe(
      &cpu, &io, &ring, &proc, [](uint64_t) { return Iota(96); }, o, [] {}, owner);
  proc.baseline = AllocatedBytes();
  const uint64_t rows = RunToEnd(ring, pipe);
  CHECK(rows == 96);
  // Held at a decode: the rows read and not yet decoding (the decode's queue of 4, the two reads,
  // one handed to the pool) and the one decoding. Were the bytes kept until the batch is done, a
  // batch's decoded rows would hold theirs too: up to 24 more.
  INFO("most samples' bytes allocated at a decode: " << proc.most_held);
  CHECK(proc.most_held <= 10);
  io.Join();
  cpu.Join();
}

// Reads that take a while (a remote source) and a fast decode: counts the reads running at once.
class SlowReadProcessor : public FakeProcessor {
 public:
  using FakeProcessor::FakeProcessor;
  Status RunStage(uint32_t stage, RowTask& t) override {
    if (stage == 0) {
      {
        std::lock_guard lock(mu);
        ++reading;
        if (t.index >= 100) max_reading = std::max(max_reading, reading);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::lock_guard lock(mu);
      --reading;
    }
    return FakeProcessor::RunStage(stage, t);
  }
  std::mutex mu;
  int reading = 0, max_reading = 0;
};

TEST_CASE("read-ahead: slow reads in front of a fast decode keep their whole concurrency") {
  ThreadPool cpu(1);
  ThreadPool io(16);
  PipelineOptions o;
  o.batch_size = 16;
  o.epochs = 1;
  o.stages = {{/*concurrency=*/12, 0}, {0, 0}};
  shm::SlotRing ring(4);
  SlowReadProcessor proc(4, 16);
  auto owner = std::make_shared<int>(0);
  BatchPipeline pipe(
      &cpu, &io, &ring, &proc, [](uint64_t) { return Iota(400); }, o, [] {}, owner);
  const uint64_t rows = RunToEnd(ring, pipe);
  CHECK(rows == 400);
  // Reads are the bottleneck: the bound is what they hold + the slack every window, so it stays at
  // the concurrency (12) and the reads run 12 at once.
  INFO("most reads at once after the first 100 rows: " << proc.max_reading);
  CHECK(proc.max_reading >= 10);
  CHECK(proc.max_reading <= 12);
  io.Join();
  cpu.Join();
}

TEST_CASE("stats add up: every sample read once, decoded once if read, delivered or skipped") {
  ThreadPool pool(3);
  PipelineOptions o;
  o.batch_size = 5;
  o.epochs = 2;
  const uint64_t n = 57;
  Harness h(3, n, o, &pool);
  h.proc.bad = {4, 9, 33};
  h.proc.bad_read = {10, 50};
  h.pipe->Pump();
  std::vector<SlotMeta> all;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(all.size() && all.back().last_in_job) && std::chrono::steady_clock::now() < deadline) {
    auto got = h.Drain();
    all.insert(all.end(), got.begin(), got.end());
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  REQUIRE(all.back().last_in_job);
  pool.Join();
  uint64_t delivered = 0;
  for (auto& m : all) delivered += m.rows;
  const uint64_t skipped = h.pipe->TotalSkipped();
  CHECK(skipped == 2 * 5);
  CHECK(delivered == 2 * (n - 5));
  auto st = h.pipe->StageSnapshots();
  CHECK(st[0].tasks == delivered + skipped);
  CHECK(st[0].failures == 2 * 2);
  CHECK(st[1].tasks == st[0].tasks - st[0].failures);
  CHECK(st[1].tasks - st[1].failures == delivered);
  PipelineStats ps = h.pipe->Stats();
  CHECK(ps.samples_done == delivered);
  CHECK(ps.samples_tried == delivered + skipped);
  CHECK(ps.samples_failed == skipped);
  CHECK(ps.window.size() == 2);
  CHECK(st[1].PercentileSeconds(0.5) > 0);
  CHECK(st[1].PercentileSeconds(0.5) <= st[1].PercentileSeconds(0.99));
}

TEST_CASE("the task-time histogram: buckets grow with the time and bound it within a quarter octave") {
  CHECK(StageStats::Bucket(500) == 0);
  int last = 0;
  for (uint64_t ns = 2000; ns < 100'000'000'000ull; ns = ns * 5 / 4 + 1) {
    const int b = StageStats::Bucket(ns);
    CHECK(b >= last);
    last = b;
    CHECK(StageStats::BucketUpperNanos(b) > static_cast<double>(ns));
    CHECK(StageStats::BucketUpperNanos(b) <= static_cast<double>(ns) * 1.26);
  }
  StageStats s("x", StageKind::kCpu, 0, 0);
  for (int i = 0; i < 90; ++i) s.Record(1'000'000, true);     // 1 ms
  for (int i = 0; i < 10; ++i) s.Record(100'000'000, false);  // 100 ms
  StageSnapshot snap = s.Snapshot();
  CHECK(snap.PercentileSeconds(0.5) == Approx(1e-3).epsilon(0.26));
  CHECK(snap.PercentileSeconds(0.99) == Approx(0.1).epsilon(0.26));
  CHECK(snap.AvgSeconds() == Approx(0.0109));
  CHECK(snap.failures == 10);
}

// ---- error policy ----

TEST_CASE("max_failures: a count fails the job after the warm-up, naming the stage, the sample and the counts") {
  InlineExecutor ex;
  PipelineOptions o;
  o.batch_size = 4;
  o.max_failures_count = 2;
  o.max_failures_warmup = 10;
  Harness h(2, 40, o, &ex);
  h.proc.bad = {1, 2, 3, 25};  // three failures in the warm-up: the job fails when it ends
  h.pipe->Pump();
  h.Drain();
  Status f = h.pipe->failure();
  REQUIRE_FALSE(f.ok());
  CHECK_THAT(f.message(), Catch::Contains("3 of 10 failed"));
  CHECK_THAT(f.message(), Catch::Contains("max_failures: 2"));
  CHECK_THAT(f.message(), Catch::Contains("stage 'decode': sample 3 is bad"));
  CHECK(h.pipe->cancelled());
}

TEST_CASE("max_failures: a fraction not exceeded lets the job finish, an exceeded one fails it") {
  PipelineOptions o;
  o.batch_size = 4;
  o.max_failures_fraction = 0.1;
  o.max_failures_warmup = 20;
  {
    InlineExecutor ex;
    Harness h(2, 100, o, &ex);
    h.proc.bad = {3, 40, 77};  // 3 %
    h.pipe->Pump();
    auto got = h.Drain();
    CHECK(h.pipe->failure().ok());
    REQUIRE(!got.empty());
    CHECK(got.back().last_in_job);
  }
  {
    InlineExecutor ex;
    Harness h(2, 100, o, &ex);
    h.proc.bad_read = {30, 31, 32, 33};  // 4 of ~35 tried = 11 % once the 4th fails
    h.pipe->Pump();
    h.Drain();
    Status f = h.pipe->failure();
    REQUIRE_FALSE(f.ok());
    CHECK_THAT(f.message(), Catch::Contains("stage 'read': sample 3"));
    CHECK_THAT(f.message(), Catch::Contains("4 of 3"));  // 4 of the first 30-odd tried
    CHECK_THAT(f.message(), Catch::Contains("max_failures: 0.1,"));
  }
}

TEST_CASE("cancel drops the rows not started instead of finishing the epoch") {
  ThreadPool pool(1);
  PipelineOptions o;
  o.batch_size = 16;
  o.epochs = 0;
  Harness h(4, 100000, o, &pool);
  h.proc.delay_us = 2000;
  h.pipe->Pump();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  h.pipe->Cancel();
  pool.Join();
  CHECK(h.pipe->tasks_in_flight() == 0);
  auto st = h.pipe->StageSnapshots();
  CHECK(st[1].tasks < 64);  // 4 slots x 16 rows were queued; only the few started ran
  CHECK(h.ring.counts().filling == 0);
  CHECK(h.ring.counts().free == 4);
}

// ---- order: completion ----

TEST_CASE("completion order: later batches overtake a held-up one, but the epoch's end comes last") {
  ThreadPool pool(2);
  PipelineOptions o;
  o.batch_size = 4;
  o.epochs = 2;
  o.completion_order = true;
  Harness h(4, 20, o, &pool);  // 5 batches per epoch
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  // Sample 1 (batch 0 of epoch 0) waits for the gate. The hook stays set for the whole run (the pool's
  // threads read it without a lock); once the gate is open the wait returns at once.
  h.proc.on_decode = [&](uint64_t index) {
    if (index != 1) return;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return open; });
  };
  h.pipe->Pump();
  std::vector<SlotMeta> got;
  auto take = [&] {
    while (auto l = h.ring.TakeFirstReady(
               [&](uint32_t slot, uint64_t seq) { return h.pipe->ClaimForDelivery(slot, seq); })) {
      SlotMeta m = h.pipe->TakeMeta(l->slot);
      for (uint32_t r = 0; r < m.rows; ++r) REQUIRE(h.proc.at(l->slot, r) == static_cast<int64_t>(m.indices[r]));
      got.push_back(m);
      REQUIRE(h.ring.Release(l->slot, l->generation).ok());
      h.pipe->Pump();
    }
  };
  // Batches 1, 2, 3 fill while batch 0 is held; they are delivered at once. Batch 4 (the epoch's
  // last) waits for batch 0, and epoch 1 waits for the end of epoch 0.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.size() < 3 && std::chrono::steady_clock::now() < deadline) {
    take();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(got.size() == 3);
  for (auto& m : got) {
    CHECK(m.epoch == 0);
    CHECK(m.seq != 0);
    CHECK_FALSE(m.last_in_epoch);
    CHECK(m.resume.extras.empty());
  }
  {
    std::lock_guard lock(mu);
    open = true;
  }
  cv.notify_all();
  while (!(got.size() && got.back().last_in_job) && std::chrono::steady_clock::now() < deadline) {
    take();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(got.back().last_in_job);
  REQUIRE(got.size() == 10);
  std::vector<std::set<uint64_t>> per_epoch(2);
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].epoch == (i < 5 ? 0u : 1u));  // no batch of epoch 1 before the end of epoch 0
    CHECK(got[i].last_in_epoch == (i == 4 || i == 9));
    per_epoch[got[i].epoch].insert(got[i].indices.begin(), got[i].indices.end());
  }
  CHECK(per_epoch[0].size() == 20);
  CHECK(per_epoch[1].size() == 20);
  pool.Join();
}

TEST_CASE("completion order with skipped samples: the epoch still ends with its last batch") {
  ThreadPool pool(3);
  PipelineOptions o;
  o.batch_size = 4;
  o.epochs = 3;
  o.completion_order = true;
  Harness h(3, 30, o, &pool, /*shuffle=*/true);
  h.proc.bad = {2, 3, 11, 17, 18, 19, 28};
  h.proc.delay_us = 200;
  h.pipe->Pump();
  std::vector<SlotMeta> got;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(got.size() && got.back().last_in_job) && std::chrono::steady_clock::now() < deadline) {
    while (auto l = h.ring.TakeFirstReady(
               [&](uint32_t slot, uint64_t seq) { return h.pipe->ClaimForDelivery(slot, seq); })) {
      got.push_back(h.pipe->TakeMeta(l->slot));
      REQUIRE(h.ring.Release(l->slot, l->generation).ok());
      h.pipe->Pump();
    }
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  REQUIRE(got.back().last_in_job);
  std::vector<std::multiset<uint64_t>> per_epoch(3);
  uint32_t epoch = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].epoch == epoch);
    per_epoch[got[i].epoch].insert(got[i].indices.begin(), got[i].indices.end());
    if (got[i].last_in_epoch) ++epoch;
  }
  CHECK(epoch == 3);
  for (auto& e : per_epoch) {
    CHECK(e.size() == 23);
    CHECK(std::set<uint64_t>(e.begin(), e.end()).size() == 23);
  }
  pool.Join();
}

// ---- the node-wide pool: fairness and resizing ----

TEST_CASE("thread pool: queues of weight 1 and 3 share one thread 1 to 3") {
  ThreadPool pool(1);
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  // Hold the thread until both queues are full, so the order is decided by the weights alone.
  pool.Post([&] {
    std::unique_lock lock(gate_mu);
    gate_cv.wait(lock, [&] { return open; });
  });
  auto a = pool.NewQueue(1);
  auto b = pool.NewQueue(3);
  std::atomic<int> done_a{0}, done_b{0}, at_a{0}, at_b{0};
  std::atomic<int> total{0};
  for (int i = 0; i < 4000; ++i) {
    auto task = [&](std::atomic<int>& mine) {
      mine.fetch_add(1);
      if (total.fetch_add(1) + 1 == 2000) {
        at_a = done_a.load();
        at_b = done_b.load();
      }
    };
    a->Post([&, task] { task(done_a); });
    b->Post([&, task] { task(done_b); });
  }
  {
    std::lock_guard lock(gate_mu);
    open = true;
  }
  gate_cv.notify_all();
  pool.Join();
  CHECK(done_a == 4000);
  CHECK(done_b == 4000);
  INFO("after 2000 tasks: a " << at_a << ", b " << at_b);
  const double ratio = static_cast<double>(at_b) / std::max(1, at_a.load());
  CHECK(ratio == Approx(3.0).epsilon(0.1));
}

TEST_CASE("thread pool: groups (users) share the threads equally, however many queues (jobs) each has") {
  ThreadPool pool(1);
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool open = false;
  pool.Post([&] {
    std::unique_lock lock(gate_mu);
    gate_cv.wait(lock, [&] { return open; });
  });
  // User 1000 has four jobs of weight 3; user 1001 has one job of weight 1.
  Executor* u1 = pool.ForGroup(1000);
  Executor* u2 = pool.ForGroup(1001);
  CHECK(pool.ForGroup(1000) == u1);  // one executor per group
  std::vector<std::unique_ptr<Executor>> many;
  many.reserve(4);
  for (int i = 0; i < 4; ++i) many.push_back(u1->NewQueue(3));
  auto one = u2->NewQueue(1);
  std::atomic<int> done_1{0}, done_2{0}, at_1{0}, at_2{0}, total{0};
  auto task = [&](std::atomic<int>& mine) {
    mine.fetch_add(1);
    if (total.fetch_add(1) + 1 == 2000) {
      at_1 = done_1.load();
      at_2 = done_2.load();
    }
  };
  for (int i = 0; i < 2000; ++i) {
    for (auto& q : many) q->Post([&] { task(done_1); });
    one->Post([&] { task(done_2); });
  }
  {
    std::lock_guard lock(gate_mu);
    open = true;
  }
  gate_cv.notify_all();
  pool.Join();
  CHECK(done_1 == 8000);
  CHECK(done_2 == 2000);
  INFO("after 2000 tasks: user 1000 ran " << at_1 << ", user 1001 ran " << at_2);
  CHECK(at_1 == 1000);  // one task per group turn
  CHECK(at_2 == 1000);
}

TEST_CASE("thread pool: two jobs of weights 1 and 3 on one thread get samples in 1 to 3") {
  ThreadPool pool(1);
  PipelineOptions o1;
  o1.batch_size = 8;
  o1.epochs = 0;
  o1.weight = 1;
  PipelineOptions o3 = o1;
  o3.weight = 3;
  Harness a(8, 1000, o1, &pool);
  Harness b(8, 1000, o3, &pool);
  a.proc.delay_us = 50;
  b.proc.delay_us = 50;
  a.pipe->Pump();
  b.pipe->Pump();
  uint64_t at_a = 0, at_b = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    a.Drain();
    b.Drain();
    at_a = a.pipe->Stats().samples_done;
    at_b = b.pipe->Stats().samples_done;
    if (at_a + at_b >= 3000) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  a.pipe->Cancel();
  b.pipe->Cancel();
  pool.Join();
  INFO("samples: weight 1: " << at_a << ", weight 3: " << at_b);
  REQUIRE(at_a + at_b >= 3000);
  CHECK(static_cast<double>(at_b) / static_cast<double>(at_a) == Approx(3.0).epsilon(0.1));
}

TEST_CASE("thread pool: SetThreads grows and shrinks the pool while tasks run") {
  ThreadPool pool(1);
  CHECK(pool.size() == 1);
  std::atomic<int> ran{0};
  for (int i = 0; i < 200; ++i) pool.Post([&] { ran++; });
  pool.SetThreads(4);
  CHECK(pool.size() == 4);
  std::atomic<int> running{0}, max_running{0};
  for (int i = 0; i < 40; ++i) {
    pool.Post([&] {
      int now = ++running;
      int m = max_running.load();
      while (now > m && !max_running.compare_exchange_weak(m, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      --running;
      ran++;
    });
  }
  pool.SetThreads(2);
  CHECK(pool.size() == 2);
  for (int i = 0; i < 100; ++i) pool.Post([&] { ran++; });
  pool.Join();
  CHECK(ran == 340);
  CHECK(max_running <= 4);
  pool.Post([&] { ran++; });  // after Join: dropped
  CHECK(ran == 340);
}

// ---- exceptions in tasks: a sample's failure or the job's, never the process's ----

TEST_CASE("thread pool: a task that throws is caught and counted, and the pool goes on") {
  ThreadPool pool(1);
  pool.Post([] { throw std::runtime_error("a stray exception"); });
  pool.Post([] { throw 42; });  // NOLINT(bugprone-std-exception-baseclass): not even a std::exception
  std::promise<void> ran;
  pool.Post([&] { ran.set_value(); });
  REQUIRE(ran.get_future().wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  CHECK(pool.task_exceptions() == 2);
  pool.Join();
}

TEST_CASE("a decode that throws fails only its sample, and another job on the same pool is unharmed") {
  ThreadPool pool(2);
  PipelineOptions o;
  o.batch_size = 8;
  o.max_failures_warmup = 1000;
  const uint64_t n = 200;
  Harness throwing(4, n, o, &pool);
  Harness other(4, n, o, &pool);
  throwing.proc.on_decode = [](uint64_t index) {
    if (index % 10 == 3) throw std::runtime_error("decoder exploded on " + std::to_string(index));
  };
  throwing.pipe->Pump();
  other.pipe->Pump();
  std::vector<SlotMeta> a, b;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto done = [](const std::vector<SlotMeta>& v) { return !v.empty() && v.back().last_in_job; };
  while (!(done(a) && done(b)) && std::chrono::steady_clock::now() < deadline) {
    for (auto& m : throwing.Drain()) a.push_back(m);
    for (auto& m : other.Drain()) b.push_back(m);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  REQUIRE(done(a));
  REQUIRE(done(b));
  std::set<uint64_t> got_a, got_b;
  for (auto& m : a) got_a.insert(m.indices.begin(), m.indices.end());
  for (auto& m : b) got_b.insert(m.indices.begin(), m.indices.end());
  CHECK(got_a.size() == n - 20);  // 3, 13, ..., 193 failed
  for (uint64_t i = 3; i < n; i += 10) CHECK(got_a.count(i) == 0);
  CHECK(got_b.size() == n);
  CHECK(throwing.pipe->failure().ok());  // on_error: skip
  CHECK(throwing.pipe->Stats().samples_failed == 20);
  CHECK(throwing.pipe->TotalSkipped() == 20);
  CHECK(pool.task_exceptions() == 0);  // the pipeline caught them, as samples' failures
  pool.Join();
}

TEST_CASE("with on_error: fail, a decode that throws fails the job naming the sample and the stage") {
  ThreadPool pool(2);
  PipelineOptions o;
  o.batch_size = 4;
  o.fail_on_error = true;
  Harness h(2, 16, o, &pool);
  h.proc.on_decode = [](uint64_t index) {
    if (index == 2) throw std::runtime_error("decoder exploded");
  };
  h.pipe->Pump();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (h.pipe->failure().ok() && std::chrono::steady_clock::now() < deadline) {
    h.Drain();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  CHECK(h.pipe->failure().code() == StatusCode::kInternal);
  CHECK(h.pipe->failure().message() ==
        "sample 2: an exception in stage 'decode': decoder exploded (stage 'decode', on_error: fail)");
  CHECK(h.pipe->cancelled());
  pool.Join();
}

// A processor whose own part of a task (packing a short batch) throws: outside any sample.
class ThrowingMoveProcessor final : public FakeProcessor {
 public:
  using FakeProcessor::FakeProcessor;
  void MoveRow(uint32_t, uint32_t, uint32_t) override { throw std::runtime_error("MoveRow exploded"); }
};

TEST_CASE("an exception outside a sample's stage fails the job, not the process") {
  ThreadPool pool(2);
  PipelineOptions o;
  o.batch_size = 4;
  shm::SlotRing ring(2);
  ThrowingMoveProcessor proc(2, 4);
  proc.bad = {1, 6};  // no spare left: the short batch is packed (MoveRow)
  auto owner = std::make_shared<int>(0);
  std::atomic<int> notified{0};
  BatchPipeline pipe(
      &pool, &ring, &proc, [](uint64_t) { return Iota(8); }, o, [&] { notified++; }, owner);
  pipe.Pump();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  // The failure is recorded first, then the owner is notified (from the pool's thread): wait for both.
  while ((pipe.failure().ok() || notified == 0) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(pipe.failure().code() == StatusCode::kInternal);
  CHECK(pipe.failure().message().find("threw outside a sample: MoveRow exploded") != std::string::npos);
  CHECK(pipe.cancelled());
  CHECK(notified > 0);
  CHECK(pool.task_exceptions() == 0);
  // The pool still runs tasks.
  std::promise<void> ran;
  pool.Post([&] { ran.set_value(); });
  CHECK(ran.get_future().wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  pool.Join();
}

}  // namespace
}  // namespace spdl::pipeline
