// SampleCache: a node-wide, memory-budgeted cache of encoded sample bytes (what a SampleSource's
// Read returns: a JPEG file, a tar member, an HTTP body), shared by every job of the daemon, so a
// dataset that fits in the budget is read from disk or the network once and every later epoch (of
// this job or of any other job on the same dataset) costs no file read or fetch. Decoding and the
// random transforms still run on every read: only the bytes are cached.
//
// Policy: least recently used. An entry is charged its payload plus its key; the charged total
// never exceeds the budget (an insert evicts from the cold end first; a sample larger than the
// whole budget is not cached). With a shuffled order and a dataset larger than the budget the
// hit rate is about budget / dataset size; LRU is chosen for its O(1) bookkeeping, and because
// within a node many jobs reading the same dataset at nearby positions (ranks of one run,
// sweeps) keep the recently read part warm for each other.
//
// Staleness: the cache assumes a dataset does not change while the daemon runs. Keys name the
// source's identity, the sample index and the sample's key (its path or URL), so a folder that
// gains or loses files maps every index to its new file; but a file rewritten in place keeps being
// served from the cache until it is evicted. Run with cache_bytes: 0 for datasets that change.
//
// CachedSource: a SampleSource decorator that reads through a SampleCache and counts this
// source's own hits and misses (for the job's stats).
//
// Thread safety: SampleCache is safe to share between threads (one mutex; payloads are copied
// out after the lock is released). CachedSource is a SampleSource: Read may be called
// concurrently from any thread. Two threads that miss the same sample at once both read it; the
// second insert replaces the first.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/sample_source.h"

namespace spdl::io {

class SampleCache {
 public:
  struct Counters {
    uint64_t hits = 0;
    uint64_t misses = 0;
    uint64_t evictions = 0;
    uint64_t inserts = 0;
    uint64_t bytes = 0;    // charged bytes held now (payloads + keys); <= budget
    uint64_t entries = 0;  // samples held now
    uint64_t budget = 0;
  };

  // REQUIRES: budget_bytes > 0.
  explicit SampleCache(uint64_t budget_bytes);
  SampleCache(const SampleCache&) = delete;
  SampleCache& operator=(const SampleCache&) = delete;

  // The bytes cached under `key` (and marks them recently used), or nullptr.
  std::shared_ptr<const std::vector<uint8_t>> Lookup(const std::string& key);

  // Caches `bytes` under `key` (replacing an older entry), evicting least recently used entries
  // until it fits. Returns false (and caches nothing) when key + bytes exceed the whole budget.
  bool Insert(const std::string& key, std::vector<uint8_t> bytes);

  Counters counters() const;
  uint64_t budget() const { return budget_; }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const std::vector<uint8_t>> bytes;
    uint64_t charge = 0;
  };
  void EraseLocked(std::list<Entry>::iterator it);

  // Constant after construction.
  const uint64_t budget_;

  mutable std::mutex mu_;
  // Guarded by mu_. lru_ runs from the most recently used (front) to the least (back).
  std::list<Entry> lru_;
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  uint64_t bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t evictions_ = 0;
  uint64_t inserts_ = 0;
};

class CachedSource final : public SampleSource {
 public:
  // REQUIRES: inner != nullptr, cache != nullptr. Both are shared: the cache outlives the source
  // if other jobs still hold it. `scope` is part of every key: entries are shared only between
  // sources of the same scope (the job registry passes the user's FsIdentity::Key(), so that bytes
  // one user read are never served to another, who might not be allowed to read the file).
  CachedSource(std::shared_ptr<const SampleSource> inner, std::shared_ptr<SampleCache> cache, std::string scope = "");

  uint64_t size() const override { return inner_->size(); }
  const SampleRef& sample(uint64_t index) const override { return inner_->sample(index); }
  // A hit copies the cached bytes into *out; a miss reads from the inner source and caches a copy
  // when the read succeeds (failures are not cached: the next epoch tries again).
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  // Sidecars are not cached: read from the inner source.
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override {
    return inner_->ReadSidecar(index, extension, out);
  }
  std::string Describe() const override { return inner_->Describe(); }
  std::string Identity() const override { return identity_; }
  std::vector<uint64_t> ShardSizes() const override { return inner_->ShardSizes(); }
  std::vector<std::string> ClassNames() const override { return inner_->ClassNames(); }
  std::optional<std::string> DatasetDigest() const override { return inner_->DatasetDigest(); }
  SourceCounters Counters() const override { return inner_->Counters(); }
  const std::vector<ObjectAnnotation>* Objects(uint64_t index) const override { return inner_->Objects(index); }

  // Reads of this source served from the cache, and ones that went to the inner source.
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t misses() const { return misses_.load(std::memory_order_relaxed); }
  const SampleCache& cache() const { return *cache_; }

 private:
  std::string KeyFor(uint64_t index) const;

  // Constant after construction.
  const std::shared_ptr<const SampleSource> inner_;
  const std::shared_ptr<SampleCache> cache_;
  const std::string identity_;
  const std::string scope_;

  mutable std::atomic<uint64_t> hits_{0};
  mutable std::atomic<uint64_t> misses_{0};
};

}  // namespace spdl::io
