// The batch pipeline with a fake row processor: order, backpressure, skip-and-replace, packing,
// the fail policy, epochs and cancellation. Runs inline (InlineExecutor) and on a real pool.
#include <catch2/catch.hpp>
#include <mutex>
#include <set>
#include <thread>

#include "pipeline/batch_pipeline.h"
#include "pipeline/thread_pool.h"

namespace spdl::pipeline {
namespace {

// Writes the sample index into its row of a fake slot memory; fails indices in `bad`.
class FakeProcessor : public RowProcessor {
 public:
  FakeProcessor(uint32_t slots, uint32_t batch) : rows_(slots, std::vector<int64_t>(batch, -1)) {}
  std::vector<std::string> StageNames() const override { return {"fake"}; }
  Status Process(uint64_t index, uint32_t /*epoch*/, uint32_t slot, uint32_t row,
                 std::vector<StageStats>& stages) override {
    const bool ok = !bad.count(index);
    stages[0].Record(1000, ok);
    if (!ok) return DataLoss("sample " + std::to_string(index) + " is bad");
    rows_[slot][row] = static_cast<int64_t>(index);
    return Status::Ok();
  }
  void MoveRow(uint32_t slot, uint32_t from, uint32_t to) override { rows_[slot][to] = rows_[slot][from]; }
  int64_t at(uint32_t slot, uint32_t row) const { return rows_[slot][row]; }
  std::set<uint64_t> bad;

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
  Harness(uint32_t slots, uint64_t n, PipelineOptions o, Executor* ex, bool shuffle = false)
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
  CHECK(stats[0].failures == 2);
  CHECK(stats[0].tasks == 10);
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
std::vector<SlotMeta> RunAll(uint32_t slots, uint64_t n, PipelineOptions o, std::set<uint64_t> bad) {
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
  CHECK(h.pipe->failure().message() == "sample 2 is bad (on_error: fail)");
  CHECK(h.pipe->cancelled());
  CHECK(h.notified > 0);
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

}  // namespace
}  // namespace spdl::pipeline
