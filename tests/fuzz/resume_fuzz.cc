// resume_fuzz: SubmitJob.resume_token, from the client, through DecodeResumeToken into a
// BatchPipeline. A client can hand back any token: the fingerprint a token must carry is in every
// BatchReady.resume_token the daemon sends, so epoch, prefix, extras and next_batch are the
// client's to choose. Whatever they are, the job must run (or be refused as the registry does)
// without crashing, hanging or delivering a sample twice in an epoch.
//
// The job is small and runs inline (InlineExecutor, as pipeline_test does), with a fake row
// processor that writes each sample's index into its row and fails the samples the input marks bad.
//
// Input (FuzzedDataProvider): the job's shape (samples 1..64, batch 1..8, drop_last, epochs 0..3
// where 0 is endless, slots 1..4, shuffle, bad samples, on_error), then how to resume:
//   0  from a point the daemon itself handed out (after batch k of a full run), as is;
//   1  from such a point with one field replaced by the input's value;
//   2  from a point made of the input's values;
//   3  from the input's raw bytes as the token (DecodeResumeToken must refuse them or agree).
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - EncodeResumeToken / DecodeResumeToken round-trip; a token for another fingerprint is refused;
//   - every delivered batch: rows <= batch size, indices are samples of the job, not bad ones (on
//     skip), written into their rows; seq counts from 0; epochs do not go back;
//   - within an epoch no sample is delivered twice;
//   - a job with a finite number of epochs ends (last_in_job) within its number of batches, and
//     nothing is delivered after its end; it never stalls with nothing ready and nothing to do;
//   - resuming from a point the daemon handed out (mode 0), the points before plus the run after
//     deliver every good sample of each epoch exactly once, as the pipeline's contract promises.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "jobs/resume_token.h"
#include "pipeline/batch_pipeline.h"
#include "pipeline/executor.h"
#include "shm/slot_ring.h"

namespace {

using namespace spdl;
using pipeline::ResumePoint;
using pipeline::SlotMeta;

constexpr uint64_t kFingerprint = 0x5eed5eed5eed5eedull;

// RESUME_FUZZ_TRACE=1 prints the job, the resume point and every batch (to read a crash input).
bool Tracing() {
  static const bool on = [] {
    const char* t = std::getenv("RESUME_FUZZ_TRACE");
    return t != nullptr && *t != '\0' && *t != '0';
  }();
  return on;
}

std::string Join(const std::vector<uint64_t>& v) {
  std::string s;
  for (uint64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return "[" + s + "]";
}

void TracePoint(const char* what, const ResumePoint& p) {
  if (Tracing()) {
    std::fprintf(stderr, "%s: epoch %u prefix %llu extras %s next_batch %llu\n", what, p.epoch,
                 static_cast<unsigned long long>(p.prefix), Join(p.extras).c_str(),
                 static_cast<unsigned long long>(p.next_batch));
  }
}

class FakeProcessor : public pipeline::RowProcessor {
 public:
  FakeProcessor(uint32_t slots, uint32_t batch, uint64_t bad_mask)
      : rows_(slots, std::vector<int64_t>(batch, -1)), bad_mask_(bad_mask) {}
  std::vector<pipeline::StageSpec> Stages() const override { return {{"fake", pipeline::StageKind::kCpu}}; }
  Status RunStage(uint32_t, pipeline::RowTask& t) override {
    FUZZ_CHECK(t.slot < rows_.size() && t.row < rows_[t.slot].size());
    if (bad(t.index)) return DataLoss("sample " + std::to_string(t.index) + " is bad");
    rows_[t.slot][t.row] = static_cast<int64_t>(t.index);
    return Status::Ok();
  }
  void MoveRow(uint32_t slot, uint32_t from, uint32_t to) override {
    FUZZ_CHECK(slot < rows_.size() && to < from && from < rows_[slot].size());
    rows_[slot][to] = rows_[slot][from];
  }
  bool bad(uint64_t index) const { return index < 64 && ((bad_mask_ >> index) & 1); }
  int64_t at(uint32_t slot, uint32_t row) const { return rows_[slot][row]; }

 private:
  std::vector<std::vector<int64_t>> rows_;
  const uint64_t bad_mask_;
};

std::vector<uint64_t> Order(uint64_t n, uint64_t epoch, bool shuffle) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i;
  if (!shuffle) return v;
  uint64_t s = 0x9e3779b97f4a7c15ull * (epoch + 1);
  for (uint64_t i = n; i > 1; --i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    std::swap(v[i - 1], v[(s >> 33) % i]);
  }
  return v;
}

struct Job {
  uint64_t n = 1;
  uint32_t slots = 1;
  bool shuffle = false;
  uint64_t bad_mask = 0;
  pipeline::PipelineOptions options;

  uint64_t Good() const {
    uint64_t g = 0;
    for (uint64_t i = 0; i < n; ++i) g += (i < 64 && ((bad_mask >> i) & 1)) ? 0 : 1;
    return g;
  }
  // Upper bound on the batches of one epoch, spares and short batches included.
  uint64_t MaxBatchesPerEpoch() const { return n / options.batch_size + 2; }
};

struct Run {
  std::vector<SlotMeta> batches;
  bool ended = false;   // a batch with last_in_job was delivered
  bool failed = false;  // on_error: fail stopped the job
};

// Runs `job` (from `resume`, if set) until it ends, fails, stalls or `max_batches` were delivered,
// checking each batch.
Run RunJob(const Job& job, const std::optional<ResumePoint>& resume, uint64_t max_batches) {
  pipeline::InlineExecutor ex;
  shm::SlotRing ring(job.slots);
  FakeProcessor proc(job.slots, job.options.batch_size, job.bad_mask);
  auto owner = std::make_shared<int>(0);
  pipeline::PipelineOptions o = job.options;
  o.resume = resume;
  const uint64_t n = job.n;
  const bool shuffle = job.shuffle;
  pipeline::BatchPipeline pipe(
      &ex, &ring, &proc, [n, shuffle](uint64_t e) { return Order(n, e, shuffle); }, o, [] {}, owner);
  Run run;
  std::map<uint32_t, std::set<uint64_t>> seen;  // per epoch (a map: a token may name any epoch)
  uint32_t last_epoch = 0;
  pipe.Pump();
  while (run.batches.size() < max_batches) {
    auto lease = ring.TakeNextReady();
    if (!lease) {
      if (!pipe.failure().ok()) {
        run.failed = true;
        break;
      }
      // Inline: every dispatched row ran during Pump, so nothing ready means nothing left to do.
      FUZZ_CHECK(pipe.tasks_in_flight() == 0);
      break;
    }
    FUZZ_CHECK(!run.ended);  // nothing after the job's last batch
    SlotMeta m = pipe.TakeMeta(lease->slot);
    if (Tracing()) {
      std::fprintf(stderr, "  batch seq %llu epoch %u #%llu rows %u %s%s%s\n", static_cast<unsigned long long>(m.seq),
                   m.epoch, static_cast<unsigned long long>(m.batch_in_epoch), m.rows, Join(m.indices).c_str(),
                   m.last_in_epoch ? " last_in_epoch" : "", m.last_in_job ? " last_in_job" : "");
      TracePoint("    resume", m.resume);
    }
    FUZZ_CHECK(m.seq == run.batches.size());
    FUZZ_CHECK(m.rows <= o.batch_size);
    FUZZ_CHECK(m.indices.size() == m.rows);
    // Epochs do not go back, except that an endless job resumed (by a made-up token) at the
    // largest epoch number wraps to epoch 0: harmless, and left alone here.
    FUZZ_CHECK(m.epoch >= last_epoch || (o.epochs == 0 && last_epoch == UINT32_MAX && m.epoch == 0));
    last_epoch = m.epoch;
    if (o.epochs != 0) FUZZ_CHECK(m.epoch < o.epochs);
    for (uint32_t r = 0; r < m.rows; ++r) {
      const uint64_t index = m.indices[r];
      FUZZ_CHECK(index < n);
      FUZZ_CHECK(!proc.bad(index));
      FUZZ_CHECK(proc.at(lease->slot, r) == static_cast<int64_t>(index));
      FUZZ_CHECK(seen[m.epoch].insert(index).second);  // never twice in an epoch
    }
    if (m.last_in_job) run.ended = true;
    run.batches.push_back(std::move(m));
    FUZZ_CHECK(ring.Release(lease->slot, lease->generation).ok());
    pipe.Pump();
  }
  if (Tracing()) {
    std::fprintf(stderr, "  stopped after %zu batches: ended %d failed %d all_dispatched %d\n", run.batches.size(),
                 run.ended, run.failed, pipe.all_dispatched());
  }
  pipe.Cancel();
  return run;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Job job;
  job.n = in.ConsumeIntegralInRange<uint64_t>(1, 64);
  job.options.batch_size = in.ConsumeIntegralInRange<uint32_t>(1, 8);
  job.options.drop_last = in.ConsumeBool();
  job.options.epochs = in.ConsumeIntegralInRange<uint32_t>(0, 3);
  job.slots = in.ConsumeIntegralInRange<uint32_t>(1, 4);
  job.shuffle = in.ConsumeBool();
  job.options.fail_on_error = in.ConsumeBool();
  job.bad_mask = in.ConsumeBool() ? in.ConsumeIntegral<uint64_t>() : 0;
  const int mode = in.ConsumeIntegralInRange<int>(0, 3);

  if (Tracing()) {
    std::fprintf(
        stderr, "job: %llu samples, batch %u%s, epochs %u, slots %u, shuffle %d, on_error %s, bad mask %llx, mode %d\n",
        static_cast<unsigned long long>(job.n), job.options.batch_size, job.options.drop_last ? " drop_last" : "",
        job.options.epochs, job.slots, job.shuffle, job.options.fail_on_error ? "fail" : "skip",
        static_cast<unsigned long long>(job.bad_mask), mode);
  }
  // The job registry refuses a job without one batch per epoch (jobs/job_registry.cc).
  if (job.options.drop_last && job.n < job.options.batch_size) return 0;
  // An endless job is watched for a few epochs.
  const uint32_t epochs_run = job.options.epochs == 0 ? 3 : job.options.epochs;
  const uint64_t max_batches = epochs_run * job.MaxBatchesPerEpoch() + 1;

  // Points the daemon would hand out: after each batch of a full run.
  if (Tracing()) std::fprintf(stderr, "full run:\n");
  const Run full = RunJob(job, std::nullopt, max_batches);
  if (job.options.epochs != 0 && !full.failed) FUZZ_CHECK(full.ended);

  std::optional<ResumePoint> point;
  size_t k = 0;  // mode 0: resuming after batch k of the full run
  if (mode <= 1) {
    if (full.batches.empty()) return 0;
    k = in.ConsumeIntegralInRange<size_t>(0, full.batches.size() - 1);
    point = full.batches[k].resume;
    if (mode == 1) {
      switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
          point->epoch = in.ConsumeIntegral<uint32_t>();
          break;
        case 1:
          point->prefix = in.ConsumeIntegral<uint64_t>();
          break;
        case 2:
          point->extras.push_back(in.ConsumeIntegral<uint64_t>());
          break;
        case 3:
          point->next_batch = in.ConsumeIntegral<uint64_t>();
          break;
      }
    }
  } else if (mode == 2) {
    point.emplace();
    point->epoch = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint32_t>(0, 4) : in.ConsumeIntegral<uint32_t>();
    point->prefix = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 70) : in.ConsumeIntegral<uint64_t>();
    const size_t extras = in.ConsumeIntegralInRange<size_t>(0, 16);
    for (size_t i = 0; i < extras; ++i) {
      point->extras.push_back(in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 70)
                                               : in.ConsumeIntegral<uint64_t>());
    }
    point->next_batch = in.ConsumeBool() ? in.ConsumeIntegralInRange<uint64_t>(0, 20) : in.ConsumeIntegral<uint64_t>();
  }

  std::optional<ResumePoint> decoded;
  if (point) {
    const std::string token = jobs::EncodeResumeToken(*point, kFingerprint);
    FUZZ_CHECK(!jobs::DecodeResumeToken(token, kFingerprint + 1).ok());
    auto d = jobs::DecodeResumeToken(token, kFingerprint);
    FUZZ_CHECK(d.ok());
    FUZZ_CHECK(d->epoch == point->epoch && d->prefix == point->prefix && d->extras == point->extras &&
               d->next_batch == point->next_batch);
    decoded = std::move(*d);
  } else {
    const std::string token = in.ConsumeRemainingBytesAsString();
    auto d = jobs::DecodeResumeToken(token, kFingerprint);
    if (!d.ok()) {
      FUZZ_CHECK(!d.status().message().empty());
      return 0;
    }
    decoded = std::move(*d);
  }
  // What the job registry refuses before starting the job (jobs/job_registry.cc).
  if (job.options.epochs != 0 && decoded->epoch >= job.options.epochs) return 0;
  // The registry also refuses a point outside its epoch (pipeline::CheckResumePoint); every point
  // the daemon hands out must pass. Refused points are still run below: the pipeline must end anyway.
  const Status valid = pipeline::CheckResumePoint(*decoded, job.n, job.options.batch_size, job.options.drop_last);
  if (mode == 0) FUZZ_CHECK(valid.ok());

  TracePoint("resumed from", *decoded);
  const Run rest = RunJob(job, decoded, max_batches);
  if (job.options.epochs != 0 && !rest.failed) FUZZ_CHECK(rest.ended);

  if (mode == 0 && !full.failed && !rest.failed && job.options.epochs != 0 && !job.options.drop_last) {
    // Before the point plus after it: every good sample exactly once per epoch.
    std::vector<std::multiset<uint64_t>> per_epoch(job.options.epochs);
    for (size_t i = 0; i <= k; ++i) {
      per_epoch[full.batches[i].epoch].insert(full.batches[i].indices.begin(), full.batches[i].indices.end());
    }
    for (const SlotMeta& m : rest.batches) per_epoch[m.epoch].insert(m.indices.begin(), m.indices.end());
    for (const auto& e : per_epoch) {
      FUZZ_CHECK(e.size() == job.Good());
      FUZZ_CHECK(std::set<uint64_t>(e.begin(), e.end()).size() == job.Good());
    }
  }
  return 0;
}
