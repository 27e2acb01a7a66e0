// The sampler: which samples this rank reads in an epoch, and in which order.
//
// The order is a pure function of (dataset size, seed, shuffle, epoch, rank, world size, uneven
// policy), identical on every machine and standard library: the permutation is our own
// Fisher-Yates shuffle driven by xoshiro256** seeded through splitmix64 from (seed, epoch), with an
// unbiased bounded draw. Changing any of that changes every job's order: the tests pin it.
// Sharding follows torch's DistributedSampler: pad (or drop) the global order to a multiple of the
// world size, then rank r takes positions r, r + world, r + 2 * world, ...
//
// Pure functions: safe from any thread.
#pragma once

#include <cstdint>
#include <vector>

namespace spdl::io {

// What to do when the dataset size is not a multiple of the world size.
enum class Uneven {
  kPad,   // repeat the start of the global order so every rank gets ceil(n / world) samples
  kDrop,  // drop the tail of the global order so every rank gets floor(n / world) samples
};

struct SamplerOptions {
  uint64_t seed = 0;        // the job's seed; with the epoch it fixes the permutation
  bool shuffle = true;      // false: the global order is 0, 1, ..., n - 1 in every epoch
  uint32_t rank = 0;        // this trainer's rank. REQUIRES: rank < world_size
  uint32_t world_size = 1;  // how many ranks share the dataset. REQUIRES: world_size > 0
  Uneven uneven = Uneven::kPad;
};

// How many samples each rank gets per epoch: kDrop -> n / world (floor), kPad -> ceil(n / world).
// Every rank gets the same number. Returns 0 when world_size == 0.
uint64_t SamplesPerRank(uint64_t n, const SamplerOptions& options);

// Batches per epoch for a rank with `samples_per_rank` samples: floor when drop_last (the partial
// last batch is dropped), else ceil. Returns 0 when batch_size == 0.
uint64_t BatchesPerEpoch(uint64_t samples_per_rank, uint32_t batch_size, bool drop_last);

// This rank's indices into the manifest for `epoch`, SamplesPerRank(n, options) of them. With kPad
// and n < world size, an index may repeat within a rank. Returns an empty vector when the
// options break their REQUIRES.
std::vector<uint64_t> EpochOrder(uint64_t n, const SamplerOptions& options, uint64_t epoch);

// The shard-aware order for sources read best in sequence (tar shards). `shard_sizes[s]` samples
// belong to shard s, numbered consecutively from shard 0 (SampleSource::ShardSizes). Per epoch:
//   1. the shards are shuffled (when options.shuffle), by the same generator as EpochOrder, seeded
//      from (seed, epoch);
//   2. their samples stream shard by shard, each shard in index order, through a shuffle buffer of
//      `shuffle_buffer` samples: once the buffer is full, each incoming sample replaces a uniformly
//      drawn one, which is emitted; at the end the buffer drains in random order. A buffer of 1 (or
//      shuffle false) keeps the stream as it is;
//   3. the resulting global order of n = sum(shard_sizes) is padded (repeating its start) or
//      truncated to SamplesPerRank(n) * world_size, and rank r takes the contiguous run
//      [r * per_rank, (r + 1) * per_rank): each rank reads its own stretch of shards in sequence.
// So every sample appears exactly once over the ranks (plus the padding), every rank gets
// SamplesPerRank(n, options) samples, and the order is a pure function of (shard sizes, buffer,
// seed, shuffle, epoch, rank, world size, uneven). Returns an empty vector when the options break
// their REQUIRES or n == 0. REQUIRES: shuffle_buffer >= 1 (0 is taken as 1).
std::vector<uint64_t> ShardedEpochOrder(const std::vector<uint64_t>& shard_sizes, uint64_t shuffle_buffer,
                                        const SamplerOptions& options, uint64_t epoch);

}  // namespace spdl::io
