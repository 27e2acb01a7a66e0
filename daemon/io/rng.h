// The deterministic random numbers of the samplers (sampler.cc, mixed_source.cc): splitmix64
// (Steele, Lea, Flood) and xoshiro256** 1.0 (Blackman, Vigna), from their public domain reference
// implementations. Orders drawn from them are part of the resume contract (a token replays them)
// and pinned by tests, so neither may change.
//
// Thread safety: Xoshiro256StarStar is a plain value (one per draw sequence); the functions are pure.
#pragma once

#include <cstdint>

namespace spdl::io {

// One step of the splitmix64 sequence: advances *state, returns the next value.
inline uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Two splitmix64 steps over (a, b): unrelated seeds for nearby inputs (a seed and an epoch).
inline uint64_t MixSeeds(uint64_t a, uint64_t b) {
  uint64_t s = a;
  uint64_t t = SplitMix64(&s) ^ b;
  return SplitMix64(&t);
}

// xoshiro256**, seeded with four splitmix64 draws from `seed`.
class Xoshiro256StarStar {
 public:
  explicit Xoshiro256StarStar(uint64_t seed) {
    for (uint64_t& w : s_) w = SplitMix64(&seed);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, bound) with no modulo bias: draws below 2^64 mod bound are rejected.
  // REQUIRES: bound > 0.
  uint64_t Below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;  // == 2^64 mod bound
    for (;;) {
      const uint64_t r = Next();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace spdl::io
