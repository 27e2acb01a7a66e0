// Resume tokens: a job's position after a delivered batch, as the small opaque bytes a client
// saves (BatchReady.resume_token) and hands back (SubmitJob.resume_token) to continue exactly there.
// The token is a serialized proto::ResumeState; its fingerprint ties it to everything that decides
// which samples a rank gets and what their values are, so a token from another job is refused,
// naming what differs, rather than misapplied.
//
// What the fingerprint covers, in named parts (a token of another job names the parts that differ):
//   dataset     the source's identity (type and what it was opened from), its size, every sample's
//               key and label, tar shard sizes, and every source.* key except the HTTP transport
//               ones (timeout_ms, connect_timeout_ms, max_attempts, max_in_flight)
//   sampler     sampler.* (seed, shuffle, uneven)
//   batch       batch.* (size, drop_last)
//   rank, world size
//   media       media, audio.*, video.*
//   decode      decode.*
//   transforms  the whole transform chain, every parameter; a user op by its library's file name,
//               its name and its args (as canonical JSON), not by the library's contents
//   output      output.* except device and copy (dtype, layout, ... )
//   other       every other field of the job config — any field added later lands here (or in the
//               struct it is added to) by itself: the config structs are hashed field by field
//               (jobs/struct_fields.h), not from a list of names.
// What may differ between the job that made a token and the one that resumes it (it changes
// neither which samples nor their values): prefetch, stages.*, weight, share, share_members,
// share_wait_seconds, order, on_error, max_failures, max_failures_warmup, output.device and output.copy.
//
// Tokens of version 1 (before transforms were covered) are still accepted when their dataset,
// sampler, batch, rank and world size match.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "config/job_config.h"
#include "io/sample_source.h"
#include "pipeline/batch_pipeline.h"

namespace spdl::jobs {

struct Fingerprint {
  uint64_t whole = 0;                                   // hashes every part
  std::vector<std::pair<std::string, uint64_t>> parts;  // (name, hash), in a fixed order
  uint64_t v1 = 0;  // version 1's fingerprint, to accept the tokens of an older spdld
  Fingerprint() = default;
  Fingerprint(uint64_t bare) : whole(bare), v1(bare) {}  // NOLINT(google-explicit-constructor): a bare one, for tests
};

// The fingerprint of a job reading `source` with `config` as rank `rank` of `world_size`.
Fingerprint JobFingerprint(const io::SampleSource& source, const config::JobConfig& config, uint32_t rank,
                           uint32_t world_size);

std::string EncodeResumeToken(const pipeline::ResumePoint& point, const Fingerprint& fingerprint);

// kInvalidArgument when the bytes are not a token, or the token belongs to another job; the
// message names the parts that differ (e.g. "its transforms differ").
Result<pipeline::ResumePoint> DecodeResumeToken(std::string_view token, const Fingerprint& fingerprint);

}  // namespace spdl::jobs
