// ShareGroups: the job registry's live share groups (jobs/shared_job.h) by their key. Jobs with
// share: true whose uid, config text and overrides, dataset fingerprint (dataset, sampler, batching,
// rank, world size) and epochs are the same join the group that has not handed out a batch yet,
// instead of starting their own pipeline. A group is added only once its job has started, so a
// failed start leaves no group behind.
//
// Not thread-safe: the control thread only (the registry's Start and Submit).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "io/sample_cache.h"
#include "jobs/decoded_cache.h"
#include "jobs/job_service.h"
#include "jobs/shared_job.h"

namespace spdl::jobs {

class ShareGroups {
 public:
  // A live group, the cached source its job reads (for the members' cache figures; null without a
  // sample cache) and its job's decoded-sample cache (cache.decoded; null without one, or once the
  // group's pipeline has ended and freed it).
  struct Entry {
    std::shared_ptr<ShareGroup> group;
    std::shared_ptr<const io::CachedSource> cached;
    std::shared_ptr<const DecodedCacheSource> decoded;
  };

  // The key of the jobs that may share one pipeline with `req` of `peer`.
  static std::string Key(const proto::SubmitJob& req, const PeerInfo& peer, uint64_t fingerprint, uint32_t epochs);

  // The live group under `key` that a new member may still join; nullopt when there is none.
  std::optional<Entry> FindJoinable(const std::string& key) const;
  // Records `group` (whose job has started) under `key`, replacing an older one, and drops
  // expired groups. `decoded` is held weakly (it is the job's memory, freed when its pipeline ends).
  // REQUIRES: group != nullptr.
  void Add(const std::string& key, const std::shared_ptr<ShareGroup>& group,
           std::shared_ptr<const io::CachedSource> cached,
           const std::shared_ptr<const DecodedCacheSource>& decoded = nullptr);
  // Drops the entries whose group is gone.
  void DropExpired();
  // Entries recorded (live or not yet dropped).
  size_t size() const { return groups_.size(); }

 private:
  struct Weak {
    std::weak_ptr<ShareGroup> group;
    std::shared_ptr<const io::CachedSource> cached;
    // Weak: a job's decoded cache is its memory, freed when the group's pipeline ends.
    std::weak_ptr<const DecodedCacheSource> decoded;
  };
  std::map<std::string, Weak> groups_;
};

}  // namespace spdl::jobs
