// Dataset mixing (job config `sources:` with weights): several sample sources seen as one dataset,
// and the mixed order, a deterministic weighted draw from the job's seed.
//
// Epoch semantics (MosaicML Streaming's `proportion` and torchdata's weighted multiplexer, with a
// fixed epoch length): an epoch is a fixed number of draws N (sampler.epoch_samples; default the
// sum of the sources' sizes). Each rank gets SamplesPerRank(N) of them, and source i a fixed quota
// q_i of those: the rank's count times w_i / sum(w), rounded by largest remainder (ties to the
// earlier source), so the quotas add up exactly. Which source each position of the rank's epoch
// takes is drawn from (seed, epoch) by a weighted draw without replacement (each draw picks source i
// with probability remaining_i / remaining): every prefix of the epoch follows the weights, and the
// counts are exact.
// Each source is read as an endless stream of passes, pass p being the source's own order for
// "epoch" p (its seeded permutation, or for tar shards the shard-aware order of sampler.h), seeded
// from (seed, source index). Epoch e of the job takes positions [e * n_i, (e + 1) * n_i) of source
// i's stream, n_i = q_i * world_size, and rank r the contiguous run [e * n_i + r * q_i, + q_i)
// (whole shards stay on one rank). So the ranks are disjoint, no sample of a source repeats before
// every sample of that source has been delivered (a source drawn more than its size per epoch is
// up-sampled: whole extra passes; one drawn less is down-sampled: the next epoch continues where
// this one stopped), and with quotas equal to the sizes (weights proportional to the sizes, the
// default epoch length) every sample is delivered exactly once per epoch.
// Everything is a pure function of (plan, seed, shuffle, epoch, rank, world size, uneven): a resume
// token's (epoch, position) is exact, as for a single source.
//
// Thread safety: MixedSource is immutable after construction (its reads go to the sources, which
// are safe to read concurrently); the functions are pure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/sample_source.h"
#include "io/sampler.h"

namespace spdl::io {

// One source of a mix as the order sees it.
struct MixComponent {
  uint64_t size = 0;                  // its samples (> 0)
  std::vector<uint64_t> shard_sizes;  // its ShardSizes(): non-empty for tar shards (shard-aware passes)
  uint64_t shuffle_buffer = 1;        // tar shards: the shuffle buffer of its passes
  double weight = 1;                  // > 0 (relative to the others)
};

struct MixPlan {
  std::vector<MixComponent> components;  // in the job config's `sources:` order
  uint64_t epoch_samples = 0;            // draws per epoch over all ranks; 0 = the sum of the sizes
};

// The draws of an epoch over all ranks (plan.epoch_samples, or the sum of the sizes).
uint64_t MixEpochSamples(const MixPlan& plan);

// Samples per epoch for one rank: SamplesPerRank(MixEpochSamples(plan), options).
uint64_t MixSamplesPerRank(const MixPlan& plan, const SamplerOptions& options);

// Each source's share of one rank's epoch (in `components` order); they add up to
// MixSamplesPerRank. Empty when the plan has no component or a weight <= 0.
std::vector<uint64_t> MixQuotas(const MixPlan& plan, const SamplerOptions& options);

// The interleave of one epoch: for each position, the source it takes, drawn from (seed, epoch)
// without replacement by the remaining quotas (so source i appears exactly quotas[i] times).
std::vector<uint32_t> MixDraw(const std::vector<uint64_t>& quotas, uint64_t seed, uint64_t epoch);

// This rank's indices for `epoch` into the mixed index space (source i's sample k is
// offset_i + k, offset_i = the sum of the sizes before it): MixSamplesPerRank(plan, options) of
// them. Empty when the options break their REQUIRES or the plan is empty.
std::vector<uint64_t> MixedEpochOrder(const MixPlan& plan, const SamplerOptions& options, uint64_t epoch);

// The source (index into plan.components) of mixed index `index`. REQUIRES: index < the sum of the sizes.
uint32_t MixSourceOf(const MixPlan& plan, uint64_t index);

// The sources of a mix as one SampleSource: index offset_i + k is source i's sample k.
class MixedSource final : public SampleSource {
 public:
  // REQUIRES: sources.size() == plan.components.size() >= 1, every source non-null with
  // size() == its component's size.
  MixedSource(std::vector<std::shared_ptr<const SampleSource>> sources, MixPlan plan);

  uint64_t size() const override { return total_; }
  const SampleRef& sample(uint64_t index) const override;
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override;
  // "mix of 2 sources (epoch 100 draws): 0.7 x image folder ... | 0.3 x ..."
  std::string Describe() const override;
  // The sources' identities with their weights, shuffle buffers and the epoch length: a resume
  // token from another mix does not fit this one.
  std::string Identity() const override;
  const std::vector<ObjectAnnotation>* Objects(uint64_t index) const override;
  // The sources' class names when they all have the same ones; else none.
  std::vector<std::string> ClassNames() const override;
  // Empty: a mix is ordered by MixedEpochOrder, not by the single-source shard order.
  // When a source has a DatasetDigest (remote shards with a manifest, whose keys are known only as
  // they stream): every source's part in order, a digest where it has one, else an FNV-1a hash of
  // its keys and labels, so that fingerprinting a mix never downloads such a source. nullopt when
  // no source has one (the keys are hashed as for any source).
  std::optional<std::string> DatasetDigest() const override;
  // The sources' remote-read counters, summed.
  SourceCounters Counters() const override;

  const MixPlan& plan() const { return plan_; }

 private:
  // (source, index within it) of a mixed index. REQUIRES: index < size().
  std::pair<uint32_t, uint64_t> Locate(uint64_t index) const;

  const std::vector<std::shared_ptr<const SampleSource>> sources_;
  const MixPlan plan_;
  std::vector<uint64_t> offsets_;  // offsets_[i] = first mixed index of source i (constant after construction)
  uint64_t total_ = 0;
};

}  // namespace spdl::io
