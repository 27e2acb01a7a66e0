#include "io/mixed_source.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <sstream>

#include "io/rng.h"

namespace spdl::io {
namespace {

// The mix's own streams (io/rng.h), pinned by the tests (tests/unit/mix_test.cc).
using Rng = Xoshiro256StarStar;
uint64_t Mix2(uint64_t a, uint64_t b) { return MixSeeds(a, b); }

constexpr uint64_t kDrawSalt = 0x6d69782d64726177ull;    // "mix-draw"
constexpr uint64_t kSourceSalt = 0x6d69782d73726373ull;  // "mix-srcs"

std::string FormatWeight(double w, int precision = 6) {
  std::ostringstream o;
  o.precision(precision);
  o << w;
  return o.str();
}

}  // namespace

uint64_t MixEpochSamples(const MixPlan& plan) {
  if (plan.epoch_samples > 0) return plan.epoch_samples;
  uint64_t n = 0;
  for (const MixComponent& c : plan.components) n += c.size;
  return n;
}

uint64_t MixSamplesPerRank(const MixPlan& plan, const SamplerOptions& options) {
  return SamplesPerRank(MixEpochSamples(plan), options);
}

std::vector<uint64_t> MixQuotas(const MixPlan& plan, const SamplerOptions& options) {
  if (plan.components.empty()) return {};
  long double total_weight = 0;
  for (const MixComponent& c : plan.components) {
    if (!(c.weight > 0) || !std::isfinite(c.weight)) return {};
    total_weight += c.weight;
  }
  const uint64_t m = MixSamplesPerRank(plan, options);
  const size_t k = plan.components.size();
  std::vector<uint64_t> q(k);
  std::vector<long double> remainder(k);
  uint64_t given = 0;
  for (size_t i = 0; i < k; ++i) {
    const long double exact = static_cast<long double>(m) * plan.components[i].weight / total_weight;
    q[i] = static_cast<uint64_t>(std::floor(exact));
    remainder[i] = exact - static_cast<long double>(q[i]);
    given += q[i];
  }
  // Largest remainder first; ties go to the earlier source.
  std::vector<size_t> by(k);
  std::iota(by.begin(), by.end(), size_t{0});
  std::stable_sort(by.begin(), by.end(), [&](size_t a, size_t b) { return remainder[a] > remainder[b]; });
  for (size_t j = 0; given < m; j = (j + 1) % k, ++given) ++q[by[j]];
  return q;
}

std::vector<uint32_t> MixDraw(const std::vector<uint64_t>& quotas, uint64_t seed, uint64_t epoch) {
  std::vector<uint64_t> left = quotas;
  uint64_t remaining = std::accumulate(left.begin(), left.end(), uint64_t{0});
  std::vector<uint32_t> out;
  out.reserve(remaining);
  Rng rng(Mix2(seed ^ kDrawSalt, epoch));
  while (remaining > 0) {
    uint64_t u = rng.Below(remaining);
    uint32_t i = 0;
    while (u >= left[i]) u -= left[i++];
    out.push_back(i);
    --left[i];
    --remaining;
  }
  return out;
}

std::vector<uint64_t> MixedEpochOrder(const MixPlan& plan, const SamplerOptions& options, uint64_t epoch) {
  const uint64_t world = options.world_size;
  if (world == 0 || options.rank >= world || plan.components.empty()) return {};
  const std::vector<uint64_t> quotas = MixQuotas(plan, options);
  if (quotas.empty()) return {};
  const size_t k = plan.components.size();
  // Per source: this rank's run of its stream, in order.
  std::vector<std::vector<uint64_t>> runs(k);
  uint64_t offset = 0;
  for (size_t i = 0; i < k; ++i) {
    const MixComponent& c = plan.components[i];
    if (c.size == 0) return {};
    SamplerOptions pass_options;
    pass_options.seed = Mix2(options.seed ^ kSourceSalt, i);
    pass_options.shuffle = options.shuffle;
    pass_options.rank = 0;
    pass_options.world_size = 1;
    pass_options.uneven = Uneven::kPad;
    std::map<uint64_t, std::vector<uint64_t>> passes;  // the passes this run touches
    const uint64_t n = quotas[i] * world;              // the source's draws this epoch, all ranks
    const uint64_t start = epoch * n + options.rank * quotas[i];
    runs[i].reserve(quotas[i]);
    for (uint64_t p = start; p < start + quotas[i]; ++p) {
      const uint64_t pass = p / c.size;
      auto it = passes.find(pass);
      if (it == passes.end()) {
        std::vector<uint64_t> order = c.shard_sizes.empty()
                                          ? EpochOrder(c.size, pass_options, pass)
                                          : ShardedEpochOrder(c.shard_sizes, c.shuffle_buffer, pass_options, pass);
        if (order.size() != c.size) return {};  // shard sizes that do not add up to the size
        it = passes.emplace(pass, std::move(order)).first;
      }
      runs[i].push_back(offset + it->second[p % c.size]);
    }
    offset += c.size;
  }
  const std::vector<uint32_t> draw = MixDraw(quotas, options.seed, epoch);
  std::vector<size_t> next(k, 0);
  std::vector<uint64_t> out;
  out.reserve(draw.size());
  for (uint32_t i : draw) out.push_back(runs[i][next[i]++]);
  return out;
}

uint32_t MixSourceOf(const MixPlan& plan, uint64_t index) {
  uint32_t i = 0;
  for (const MixComponent& c : plan.components) {
    if (index < c.size) return i;
    index -= c.size;
    ++i;
  }
  return i == 0 ? 0 : i - 1;
}

MixedSource::MixedSource(std::vector<std::shared_ptr<const SampleSource>> sources, MixPlan plan)
    : sources_(std::move(sources)), plan_(std::move(plan)) {
  for (const auto& s : sources_) {
    offsets_.push_back(total_);
    total_ += s->size();
  }
}

std::pair<uint32_t, uint64_t> MixedSource::Locate(uint64_t index) const {
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), index);
  const auto i = static_cast<uint32_t>((it - offsets_.begin()) - 1);
  return {i, index - offsets_[i]};
}

const SampleRef& MixedSource::sample(uint64_t index) const {
  const auto [i, k] = Locate(index);
  return sources_[i]->sample(k);
}

Status MixedSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= total_) {
    out->clear();
    return InvalidArgument(Describe() + ": sample " + std::to_string(index) + " is past the end");
  }
  const auto [i, k] = Locate(index);
  return sources_[i]->Read(k, out);
}

Status MixedSource::ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
  if (index >= total_) {
    out->clear();
    return InvalidArgument(Describe() + ": sample " + std::to_string(index) + " is past the end");
  }
  const auto [i, k] = Locate(index);
  return sources_[i]->ReadSidecar(k, extension, out);
}

const std::vector<ObjectAnnotation>* MixedSource::Objects(uint64_t index) const {
  const auto [i, k] = Locate(index);
  return sources_[i]->Objects(k);
}

std::string MixedSource::Describe() const {
  std::string out = "mix of " + std::to_string(sources_.size()) + " sources (epoch " +
                    std::to_string(MixEpochSamples(plan_)) + " draws): ";
  for (size_t i = 0; i < sources_.size(); ++i) {
    out += (i ? " | " : "") + FormatWeight(plan_.components[i].weight) + " x " + sources_[i]->Describe();
  }
  return out;
}

std::string MixedSource::Identity() const {
  std::string out = "mix epoch_samples=" + std::to_string(plan_.epoch_samples);
  for (size_t i = 0; i < sources_.size(); ++i) {
    const MixComponent& c = plan_.components[i];
    out += " [weight=" + FormatWeight(c.weight, 17) +
           " buffer=" + std::to_string(c.shard_sizes.empty() ? 0 : c.shuffle_buffer) +
           " shards=" + std::to_string(c.shard_sizes.size()) + " " + sources_[i]->Identity() + "]";
  }
  return out;
}

std::vector<std::string> MixedSource::ClassNames() const {
  std::vector<std::string> first = sources_.front()->ClassNames();
  for (size_t i = 1; i < sources_.size(); ++i) {
    if (sources_[i]->ClassNames() != first) return {};
  }
  return first;
}

std::optional<std::string> MixedSource::DatasetDigest() const {
  bool any = false;
  for (const auto& src : sources_) any = any || src->DatasetDigest().has_value();
  if (!any) return std::nullopt;
  std::string out = "mix";
  for (const auto& src : sources_) {
    if (std::optional<std::string> d = src->DatasetDigest()) {
      out += " d:" + *d;
      continue;
    }
    uint64_t h = 14695981039346656037ull;  // FNV-1a 64 over each key, a 0 byte, the label's 8 bytes
    auto mix = [&h](uint8_t b) { h = (h ^ b) * 1099511628211ull; };
    for (uint64_t i = 0; i < src->size(); ++i) {
      const SampleRef& r = src->sample(i);
      for (char c : r.path) mix(static_cast<uint8_t>(c));
      mix(0);
      for (int k = 0; k < 8; ++k) mix(static_cast<uint8_t>(static_cast<uint64_t>(r.label) >> (8 * k)));
    }
    out += " k:" + std::to_string(h);
  }
  return out;
}

SourceCounters MixedSource::Counters() const {
  SourceCounters sum;
  for (const auto& src : sources_) {
    const SourceCounters c = src->Counters();
    sum.shard_cache_hits += c.shard_cache_hits;
    sum.shard_cache_misses += c.shard_cache_misses;
    sum.fetched_bytes += c.fetched_bytes;
    sum.requests += c.requests;
    sum.retries += c.retries;
    sum.errors_4xx += c.errors_4xx;
    sum.errors_5xx += c.errors_5xx;
    sum.errors_network += c.errors_network;
  }
  return sum;
}

}  // namespace spdl::io
