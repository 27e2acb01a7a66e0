#include "io/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "io/rng.h"

namespace spdl::io {
namespace {

// The generator's seed for (seed, epoch): two splitmix64 steps, so nearby seeds and epochs give
// unrelated streams.
uint64_t EpochSeed(uint64_t seed, uint64_t epoch) { return MixSeeds(seed, epoch); }

}  // namespace

uint64_t SamplesPerRank(uint64_t n, const SamplerOptions& options) {
  const uint64_t world = options.world_size;
  if (world == 0) return 0;
  if (options.uneven == Uneven::kDrop) return n / world;
  return n / world + (n % world != 0 ? 1 : 0);
}

uint64_t BatchesPerEpoch(uint64_t samples_per_rank, uint32_t batch_size, bool drop_last) {
  if (batch_size == 0) return 0;
  const uint64_t full = samples_per_rank / batch_size;
  return drop_last ? full : full + (samples_per_rank % batch_size != 0 ? 1 : 0);
}

std::vector<uint64_t> EpochOrder(uint64_t n, const SamplerOptions& options, uint64_t epoch) {
  const uint64_t world = options.world_size;
  if (world == 0 || options.rank >= world || n == 0) return {};

  std::vector<uint64_t> global(n);
  std::iota(global.begin(), global.end(), uint64_t{0});
  if (options.shuffle) {
    Xoshiro256StarStar rng(EpochSeed(options.seed, epoch));
    for (uint64_t i = n - 1; i > 0; --i) std::swap(global[i], global[rng.Below(i + 1)]);
  }

  const uint64_t per_rank = SamplesPerRank(n, options);
  std::vector<uint64_t> mine;
  mine.reserve(per_rank);
  // Position p of the padded (or truncated) global order is global[p % n]: padding repeats the
  // order's own beginning, as many times as needed when n < world.
  for (uint64_t k = 0; k < per_rank; ++k) mine.push_back(global[(options.rank + k * world) % n]);
  return mine;
}

std::vector<uint64_t> ShardedEpochOrder(const std::vector<uint64_t>& shard_sizes, uint64_t shuffle_buffer,
                                        const SamplerOptions& options, uint64_t epoch) {
  const uint64_t world = options.world_size;
  uint64_t n = 0;
  for (uint64_t s : shard_sizes) n += s;
  if (world == 0 || options.rank >= world || n == 0) return {};

  // Where each shard's samples start.
  std::vector<uint64_t> first(shard_sizes.size());
  for (size_t s = 0, at = 0; s < shard_sizes.size(); at += shard_sizes[s], ++s) first[s] = at;
  std::vector<uint64_t> shards(shard_sizes.size());
  std::iota(shards.begin(), shards.end(), uint64_t{0});

  std::vector<uint64_t> global;
  global.reserve(n);
  Xoshiro256StarStar rng(EpochSeed(options.seed, epoch));
  if (!options.shuffle) {
    for (uint64_t i = 0; i < n; ++i) global.push_back(i);
  } else {
    for (uint64_t i = shards.size() > 0 ? shards.size() - 1 : 0; i > 0; --i) {
      std::swap(shards[i], shards[rng.Below(i + 1)]);
    }
    const uint64_t capacity = shuffle_buffer == 0 ? 1 : shuffle_buffer;
    std::vector<uint64_t> buffer;
    buffer.reserve(static_cast<size_t>(std::min(capacity, n)));
    for (uint64_t s : shards) {
      for (uint64_t i = first[s]; i < first[s] + shard_sizes[s]; ++i) {
        if (buffer.size() < capacity) {
          buffer.push_back(i);
          continue;
        }
        const uint64_t j = rng.Below(buffer.size());
        global.push_back(buffer[j]);
        buffer[j] = i;
      }
    }
    while (!buffer.empty()) {
      const uint64_t j = rng.Below(buffer.size());
      global.push_back(buffer[j]);
      buffer[j] = buffer.back();
      buffer.pop_back();
    }
  }

  const uint64_t per_rank = SamplesPerRank(n, options);
  std::vector<uint64_t> mine;
  mine.reserve(per_rank);
  // As in EpochOrder, position p of the padded global order is global[p % n].
  for (uint64_t k = 0; k < per_rank; ++k) mine.push_back(global[(options.rank * per_rank + k) % n]);
  return mine;
}

}  // namespace spdl::io
