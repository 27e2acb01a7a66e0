#include "jobs/resume_token.h"

#include <array>
#include <cstring>
#include <optional>
#include <type_traits>
#include <variant>

#include "jobs/struct_fields.h"
#include "proto/control.pb.h"

namespace spdl::jobs {
namespace {

constexpr uint32_t kTokenVersion = 2;

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  }
  void U64(uint64_t v) { Bytes(&v, sizeof(v)); }
  void Str(const std::string& s) {
    U64(s.size());
    Bytes(s.data(), s.size());
  }
};

template <typename T, template <typename...> class Template>
struct IsSpecialization : std::false_type {};
template <template <typename...> class Template, typename... A>
struct IsSpecialization<Template<A...>, Template> : std::true_type {};
template <typename T>
struct IsStdArray : std::false_type {};
template <typename T, size_t N>
struct IsStdArray<std::array<T, N>> : std::true_type {};

// Hashes any value of the job config: scalars, strings, containers, variants, and plain structs
// field by field (so a field added to a config struct is covered without touching this).
template <typename T>
void Hash(Fnv& f, const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    f.U64(v ? 1 : 0);
  } else if constexpr (std::is_enum_v<T>) {
    f.U64(static_cast<uint64_t>(static_cast<std::underlying_type_t<T>>(v)));
  } else if constexpr (std::is_integral_v<T>) {
    f.U64(static_cast<uint64_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    double d = v == 0 ? 0.0 : static_cast<double>(v);  // -0 == 0
    uint64_t bits = 0;
    std::memcpy(&bits, &d, sizeof(bits));
    f.U64(bits);
  } else if constexpr (std::is_same_v<T, std::string>) {
    f.Str(v);
  } else if constexpr (IsSpecialization<T, std::vector>::value || IsStdArray<T>::value) {
    f.U64(v.size());
    for (const auto& e : v) Hash(f, e);
  } else if constexpr (IsSpecialization<T, std::optional>::value) {
    f.U64(v.has_value() ? 1 : 0);
    if (v) Hash(f, *v);
  } else if constexpr (IsSpecialization<T, std::variant>::value) {
    f.U64(v.index());
    std::visit([&f](const auto& alt) { Hash(f, alt); }, v);
  } else if constexpr (std::is_class_v<T> && std::is_aggregate_v<T>) {
    f.U64(fields::kFieldCount<T>);
    fields::ForEachField(v, [&f](const auto& field) { Hash(f, field); });
  } else {
    static_assert(!sizeof(T), "the resume fingerprint cannot hash this config field type: add it to Hash()");
  }
}

template <typename T>
uint64_t HashOf(const T& v) {
  Fnv f;
  Hash(f, v);
  return f.h;
}

// The dataset as the sampler sees it: identity, size, every key and label, the shard sizes.
void HashSamples(Fnv& f, const io::SampleSource& source) {
  f.Str(source.Identity());
  f.U64(source.size());
  const std::optional<std::string> digest = source.DatasetDigest();
  // Keys known only as the data streams: the source's digest stands for them (sample_source.h).
  if (digest) f.Str(*digest);
  for (uint64_t i = 0; i < source.size() && !digest; ++i) {
    const io::SampleRef& s = source.sample(i);
    f.Str(s.path);
    f.U64(static_cast<uint64_t>(s.label));
  }
  const std::vector<uint64_t> shards = source.ShardSizes();
  f.U64(shards.size());
  for (uint64_t n : shards) f.U64(n);
}

// Version 1's fingerprint (dataset, sampler, batching, rank, world size), for older tokens.
uint64_t V1Fingerprint(const io::SampleSource& source, const config::JobConfig& config, uint32_t rank,
                       uint32_t world_size) {
  Fnv f;
  HashSamples(f, source);
  if (!source.ShardSizes().empty()) f.U64(static_cast<uint64_t>(config.source.shuffle_buffer));
  f.U64(config.sampler.seed);
  f.U64(config.sampler.shuffle ? 1 : 0);
  f.U64(config.sampler.uneven == config::Uneven::kPad ? 1 : 0);
  f.U64(static_cast<uint64_t>(config.batch.size));
  f.U64(config.batch.drop_last ? 1 : 0);
  f.U64(rank);
  f.U64(world_size);
  return f.h;
}

}  // namespace

Fingerprint JobFingerprint(const io::SampleSource& source, const config::JobConfig& config, uint32_t rank,
                           uint32_t world_size) {
  Fingerprint fp;
  fp.v1 = V1Fingerprint(source, config, rank, world_size);

  // Settings that change neither which samples a rank gets nor their values: blanked everywhere.
  config::JobConfig c = config;
  const config::JobConfig defaults;
  c.prefetch = defaults.prefetch;
  c.stages = defaults.stages;
  c.weight = defaults.weight;
  c.share = defaults.share;
  c.share_members = defaults.share_members;
  c.share_wait_seconds = defaults.share_wait_seconds;
  c.order = defaults.order;
  c.on_error = defaults.on_error;
  c.max_failures = defaults.max_failures;
  c.max_failures_warmup = defaults.max_failures_warmup;
  c.output.device = defaults.output.device;
  c.output.cuda_device = defaults.output.cuda_device;
  c.output.copy = defaults.output.copy;
  c.source.timeout_ms = defaults.source.timeout_ms;
  c.source.connect_timeout_ms = defaults.source.connect_timeout_ms;
  c.source.max_attempts = defaults.source.max_attempts;
  c.source.max_in_flight = defaults.source.max_in_flight;
  for (auto& t : c.transforms) {  // an op's place in the YAML text is not part of it (library, name, args are)
    if (auto* op = std::get_if<config::UserOp>(&t)) {
      op->path.clear();
      op->line = 0;
    }
  }

  Fnv dataset;
  HashSamples(dataset, source);
  Hash(dataset, c.source);
  fp.parts.emplace_back("dataset", dataset.h);
  fp.parts.emplace_back("sampler", HashOf(c.sampler));
  fp.parts.emplace_back("batch", HashOf(c.batch));
  fp.parts.emplace_back("rank", HashOf(rank));
  fp.parts.emplace_back("world size", HashOf(world_size));
  Fnv media;
  Hash(media, c.media);
  Hash(media, c.audio);
  Hash(media, c.video);
  fp.parts.emplace_back("media", media.h);
  fp.parts.emplace_back("decode", HashOf(c.decode));
  fp.parts.emplace_back("transforms", HashOf(c.transforms));
  fp.parts.emplace_back("output", HashOf(c.output));
  // The rest: every field not in a part above, including any added later.
  c.source = defaults.source;
  c.sampler = defaults.sampler;
  c.batch = defaults.batch;
  c.media = defaults.media;
  c.audio = defaults.audio;
  c.video = defaults.video;
  c.decode = defaults.decode;
  c.transforms.clear();
  c.output = defaults.output;
  c.out_height = defaults.out_height;  // derived from media and transforms, hashed above
  c.out_width = defaults.out_width;
  fp.parts.emplace_back("other settings", HashOf(c));

  Fnv whole;
  for (const auto& [name, h] : fp.parts) whole.U64(h);
  fp.whole = whole.h;
  return fp;
}

std::string EncodeResumeToken(const pipeline::ResumePoint& point, const Fingerprint& fingerprint) {
  proto::ResumeState s;
  s.set_version(kTokenVersion);
  s.set_fingerprint(fingerprint.whole);
  for (const auto& part : fingerprint.parts) s.add_parts(part.second);
  s.set_epoch(point.epoch);
  s.set_prefix(point.prefix);
  for (uint64_t e : point.extras) s.add_extras(e);
  s.set_next_batch(point.next_batch);
  return s.SerializeAsString();
}

Result<pipeline::ResumePoint> DecodeResumeToken(std::string_view token, const Fingerprint& fingerprint) {
  proto::ResumeState s;
  if (!s.ParseFromArray(token.data(), static_cast<int>(token.size())) || s.version() == 0) {
    return InvalidArgument("the resume token is not a spdld resume token");
  }
  if (s.version() != kTokenVersion && s.version() != 1) {
    return InvalidArgument("the resume token has version " + std::to_string(s.version()) +
                           "; this spdld reads versions 1 and " + std::to_string(kTokenVersion));
  }
  if (s.version() == 1 && s.fingerprint() != fingerprint.v1) {
    return InvalidArgument(
        "the resume token belongs to another job: the dataset, seed, batch size, rank or world size differ");
  }
  if (s.version() == kTokenVersion && s.fingerprint() != fingerprint.whole) {
    std::string differ;
    if (static_cast<size_t>(s.parts_size()) == fingerprint.parts.size()) {
      for (size_t i = 0; i < fingerprint.parts.size(); ++i) {
        if (s.parts(static_cast<int>(i)) == fingerprint.parts[i].second) continue;
        differ += (differ.empty() ? "" : ", ") + fingerprint.parts[i].first;
      }
    }
    if (differ.empty()) differ = "dataset, sampler, batch, rank, world size, media, decode, transforms or output";
    return InvalidArgument("the resume token belongs to another job: its " + differ +
                           " differ (only prefetch, stages, weight, share, order, on_error, max_failures and "
                           "output.device/copy may change between the job that made a token and the one "
                           "resuming it)");
  }
  pipeline::ResumePoint p;
  p.epoch = s.epoch();
  p.prefix = s.prefix();
  p.extras.assign(s.extras().begin(), s.extras().end());
  p.next_batch = s.next_batch();
  return p;
}

}  // namespace spdl::jobs
