#include "media/sample_random.h"

namespace spdl::media {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// Separates these seeds from other uses of the job seed (the sampler's shuffle).
constexpr uint64_t kDomain = 0x7370646C2D617567ull;  // "spdl-aug"

uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t SampleSeed(uint64_t job_seed, uint64_t epoch, uint64_t sample_index) {
  uint64_t h = Mix(job_seed ^ kDomain);
  h = Mix(h + kGolden + epoch);
  return Mix(h + kGolden + sample_index);
}

SampleRng::SampleRng(uint64_t sample_seed, RandomStream stream)
    : state_(Mix(sample_seed + kGolden * static_cast<uint64_t>(stream))) {}

uint64_t SampleRng::Next() {
  state_ += kGolden;
  return Mix(state_);
}

double SampleRng::Uniform(double lo, double hi) {
  const double u = static_cast<double>(Next() >> 11) * 0x1.0p-53;
  return lo + (hi - lo) * u;
}

int64_t SampleRng::UniformInt(int64_t lo, int64_t hi) {
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;  // 0 means all 2^64 values
  const uint64_t r = Next();
  if (span == 0) return static_cast<int64_t>(r);
  const auto product = static_cast<unsigned __int128>(r) * span;
  return lo + static_cast<int64_t>(product >> 64);
}

bool SampleRng::Bernoulli(double p) { return Uniform(0.0, 1.0) < p; }

uint64_t UserOpSeed(uint64_t sample_seed, uint32_t op_index) {
  SampleRng rng(sample_seed, static_cast<RandomStream>(static_cast<uint64_t>(RandomStream::kUserOp) + op_index));
  return rng.Next();
}

}  // namespace spdl::media
