// Resume tokens: a job's position after a delivered batch, as the small opaque bytes a client
// saves (BatchReady.resume_token) and hands back (SubmitJob.resume_token) to continue exactly there.
// The token is a serialized proto::ResumeState; its fingerprint ties it to the job's dataset, seed,
// rank, world size and batching, so a token from another job is refused rather than misapplied.
//
// Pure functions; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "config/job_config.h"
#include "io/sample_source.h"
#include "pipeline/batch_pipeline.h"

namespace spdl::jobs {

// A hash of everything the sample order depends on: the source's identity (its type and what it
// was opened from), its size, every sample's key and label, its shard sizes (tar), the sampler
// settings (and the tar shuffle buffer), the batching, the rank and the world size. A token of
// another dataset, or of the same files reached as another source type, is therefore refused.
uint64_t JobFingerprint(const io::SampleSource& source, const config::JobConfig& config, uint32_t rank,
                        uint32_t world_size);

std::string EncodeResumeToken(const pipeline::ResumePoint& point, uint64_t fingerprint);

// kInvalidArgument when the bytes are not a token, or the token belongs to another job (a
// different dataset, seed, rank, world size or batch size).
Result<pipeline::ResumePoint> DecodeResumeToken(std::string_view token, uint64_t fingerprint);

}  // namespace spdl::jobs
