#include "jobs/resume_token.h"

#include "proto/control.pb.h"

namespace spdl::jobs {
namespace {

constexpr uint32_t kTokenVersion = 1;

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

}  // namespace

uint64_t JobFingerprint(const io::SampleSource& source, const config::JobConfig& config, uint32_t rank,
                        uint32_t world_size) {
  Fnv f;
  f.Str(source.Identity());
  f.U64(source.size());
  for (uint64_t i = 0; i < source.size(); ++i) {
    const io::SampleRef& s = source.sample(i);
    f.Str(s.path);
    f.U64(static_cast<uint64_t>(s.label));
  }
  const std::vector<uint64_t> shards = source.ShardSizes();
  f.U64(shards.size());
  for (uint64_t n : shards) f.U64(n);
  if (!shards.empty()) f.U64(static_cast<uint64_t>(config.source.shuffle_buffer));
  f.U64(config.sampler.seed);
  f.U64(config.sampler.shuffle ? 1 : 0);
  f.U64(config.sampler.uneven == config::Uneven::kPad ? 1 : 0);
  f.U64(static_cast<uint64_t>(config.batch.size));
  f.U64(config.batch.drop_last ? 1 : 0);
  f.U64(rank);
  f.U64(world_size);
  return f.h;
}

std::string EncodeResumeToken(const pipeline::ResumePoint& point, uint64_t fingerprint) {
  proto::ResumeState s;
  s.set_version(kTokenVersion);
  s.set_fingerprint(fingerprint);
  s.set_epoch(point.epoch);
  s.set_prefix(point.prefix);
  for (uint64_t e : point.extras) s.add_extras(e);
  s.set_next_batch(point.next_batch);
  return s.SerializeAsString();
}

Result<pipeline::ResumePoint> DecodeResumeToken(std::string_view token, uint64_t fingerprint) {
  proto::ResumeState s;
  if (!s.ParseFromArray(token.data(), static_cast<int>(token.size())) || s.version() == 0) {
    return InvalidArgument("the resume token is not a spdld resume token");
  }
  if (s.version() != kTokenVersion) {
    return InvalidArgument("the resume token has version " + std::to_string(s.version()) +
                           "; this spdld reads version " + std::to_string(kTokenVersion));
  }
  if (s.fingerprint() != fingerprint) {
    return InvalidArgument(
        "the resume token belongs to another job: the dataset, seed, batch size, rank or world size differ");
  }
  pipeline::ResumePoint p;
  p.epoch = s.epoch();
  p.prefix = s.prefix();
  p.extras.assign(s.extras().begin(), s.extras().end());
  p.next_batch = s.next_batch();
  return p;
}

}  // namespace spdl::jobs
