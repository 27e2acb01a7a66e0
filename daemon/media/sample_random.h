// Per-sample randomness for the random transforms (random resized crop, horizontal flip).
//
// The draws for one sample are a pure function of (job seed, epoch, sample index): they do not
// depend on which thread decodes the sample, in what order, or whether the job was resumed, so a
// rerun delivers the same pixels. Each transform draws from its own stream of the sample's seed,
// so the number of draws one transform makes (random resized crop: up to ten attempts) never
// shifts another's.
//
// SampleSeed is a pure function; a SampleRng is a small value, used by one thread at a time.
#pragma once

#include <cstdint>

namespace spdl::media {

// The seed of one sample's random transforms: a 64-bit hash (SplitMix64 finalizer, chained) of
// the job's seed, the epoch and the sample's index in the dataset.
uint64_t SampleSeed(uint64_t job_seed, uint64_t epoch, uint64_t sample_index);

// Streams of a sample's seed, one per random transform. User op i of a job's chain (its i-th `op`
// entry, from 0) draws from stream kUserOp + i (see UserOpSeed).
// Built-in augmentation i of the chain (media/augment.h) draws from stream kAugment + i, random
// erasing from kErase, random_crop from kRandomCrop.
enum class RandomStream : uint64_t {
  kResizedCrop = 1,
  kFlip = 2,
  kErase = 3,
  kRandomCrop = 4,
  kUserOp = 16,
  kAugment = 64
};

// The seed handed to user op `op_index` (0-based among the chain's ops) for one sample: the first
// draw of its own stream of the sample's seed, so each op's randomness is independent of the
// others' and of the built-in transforms'.
uint64_t UserOpSeed(uint64_t sample_seed, uint32_t op_index);

// A SplitMix64 generator (Steele, Lea, Flood 2014): 64 bits of state, statistically strong enough
// for augmentation, and cheap to seed per sample.
class SampleRng {
 public:
  SampleRng(uint64_t sample_seed, RandomStream stream);

  // The next 64 random bits.
  uint64_t Next();
  // Uniform in [lo, hi) with 53 bits of resolution. REQUIRES: lo <= hi.
  double Uniform(double lo, double hi);
  // Uniform integer in [lo, hi] (multiply-shift: bias below 2^-32 for any span that fits an
  // image). REQUIRES: lo <= hi.
  int64_t UniformInt(int64_t lo, int64_t hi);
  // True with probability p (p <= 0: never; p >= 1: always; one draw either way).
  bool Bernoulli(double p);

 private:
  uint64_t state_;
};

}  // namespace spdl::media
