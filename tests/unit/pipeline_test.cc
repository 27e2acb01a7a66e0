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
  Status Process(uint64_t index, uint32_t slot, uint32_t row, std::vector<StageStats>& stages) override {
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

struct Harness {
  Harness(uint32_t slots, uint64_t n, PipelineOptions o, Executor* ex)
      : ring(slots), proc(slots, o.batch_size), owner(std::make_shared<int>(0)) {
    pipe = std::make_unique<BatchPipeline>(ex, &ring, &proc, [n](uint64_t) { return Iota(n); }, o,
                                           [this] { notified++; }, owner);
  }
  // Drains every ready batch in order, checking that the slot's rows match the meta.
  std::vector<SlotMeta> Drain(bool release = true) {
    std::vector<SlotMeta> out;
    while (auto l = ring.TakeNextReady()) {
      SlotMeta m = pipe->meta(l->slot);
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

TEST_CASE("on_error: fail stops the job with the sample's error") {
  InlineExecutor inline_ex;
  PipelineOptions o;
  o.batch_size = 4;
  o.fail_on_error = true;
  Harness h(2, 16, o, &inline_ex);
  h.proc.bad = {2};
  h.pipe->Pump();
  CHECK(h.pipe->failure().code() == StatusCode::kDataLoss);
  CHECK(h.pipe->failure().message() == "sample 2 is bad");
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
