// ShardCache: whole remote objects (tar shards in object storage) kept as local files while they
// stream in, so that every job and rank that asks for the same object reads one download.
//
// Two kinds:
//   OnDisk    the node-wide cache (daemon config cache_dir + cache_dir_bytes): files in a directory
//             owned by the daemon's user, mode 0700, surviving a daemon restart.
//   InMemory  a job's private stream buffer (memfd files) when there is no node cache: the same
//             pinning and LRU rules, nothing persists.
//
// An entry is keyed by the object's identity, which the caller builds from what names one version
// of one object (endpoint, bucket, key, ETag) and never from a credential. The first Acquire of a
// key starts the fetch on a thread of its own, writing the bytes to the entry's file as they
// arrive; every Acquire of the same key while it streams (or after) follows that download: Read and
// WaitFor block only until the bytes asked for are there. No object is fetched twice while its
// entry lives.
//
// Eviction: least recently acquired first, only entries that are complete and pinned by no Handle;
// the bytes held (complete and arriving entries) are trimmed to the budget whenever an entry
// completes or a handle is released, so they exceed it only by what is pinned or still arriving.
//
// Checks on reuse (on disk): each entry records its size and a 64-bit checksum of its bytes
// (computed as they stream, stored next to the file). An Acquire that finds a complete entry pinned
// by nobody compares the file's size, mtime and ctime with those recorded when it was last checked;
// after a change, and on the first use after a daemon restart, the whole file is hashed again. A
// mismatch drops the entry (counted as corrupt) and the Acquire fetches the object again.
//
// Failures: an unusable directory (cannot be created, not a directory, owned by another user, not
// writable) leaves the cache disabled with one logged warning (enabled() is false; Acquire fails
// with kFailedPrecondition and callers stream without it). A write that fails while an object
// streams (a full disk) disables the cache the same way, with one warning, and fails that entry
// with kUnavailable; the callers then stream the object without the cache.
//
// Thread safety: every method may be called from any thread; one mutex guards the table. The
// destructor stops the downloads in flight (their sinks refuse more bytes); an on-disk cache waits
// for them, an in-memory one does not (they own what they use and end on their own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::io {

class ShardCache {
 public:
  struct Counters {
    uint64_t bytes = 0;          // held now (complete entries and the bytes of arriving ones)
    uint64_t budget = 0;         // the budget
    uint64_t entries = 0;        // entries held now
    uint64_t hits = 0;           // acquires served by an entry already there (complete or arriving)
    uint64_t misses = 0;         // acquires that started a fetch
    uint64_t fetched_bytes = 0;  // bytes received by fetches
    uint64_t evictions = 0;      // entries evicted for the budget
    uint64_t corrupt = 0;        // entries that failed their check on reuse (dropped and fetched again)
  };
  using Sink = std::function<bool(const uint8_t* data, size_t size)>;
  // Streams the whole object, in order, into the sink (returns the sink's refusal as an error).
  using Fetch = std::function<Status(const Sink& sink)>;

  // A pinned entry: its file cannot be evicted while the handle lives.
  class Handle {
   public:
    ~Handle();
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    // Waits until at least `end` bytes have arrived or the fetch ended; returns how many are there
    // (fewer than `end` only when the object is complete and shorter). The fetch's error when it
    // failed first.
    Result<uint64_t> WaitFor(uint64_t end) const;
    // The object's size once complete; waits for the download. Errors as WaitFor's.
    Result<uint64_t> WaitComplete() const;
    // Replaces *out with bytes [offset, offset + n), waiting for them. kDataLoss when the object is
    // shorter. REQUIRES: out != nullptr.
    Status Read(uint64_t offset, uint64_t n, std::vector<uint8_t>* out) const;
    // The descriptor of the entry's file (valid while the handle lives); bytes below WaitFor's
    // answer may be pread from it.
    int fd() const;
    // True when this acquire found the entry there (no fetch started by it).
    bool hit() const { return hit_; }

   private:
    friend class ShardCache;
    struct Impl;
    struct Entry;
    Handle(std::shared_ptr<Impl> impl, std::shared_ptr<Entry> entry, bool hit);
    std::shared_ptr<Impl> impl_;
    std::shared_ptr<Entry> entry_;
    bool hit_ = false;
  };

  // A private cache of memory files (memfd), never persisted. budget_bytes 0 = keep only what is pinned.
  static std::shared_ptr<ShardCache> InMemory(uint64_t budget_bytes);
  // The node-wide cache in `dir` (created with mode 0700 when missing; an existing one must be a
  // directory owned by this process's effective user; its mode is set to 0700). Loads the entries
  // a previous run left (complete ones only; partial files are deleted) and trims them to the
  // budget. Never fails: an unusable dir gives a disabled cache, with one warning logged.
  static std::shared_ptr<ShardCache> OnDisk(const std::string& dir, uint64_t budget_bytes);
  ~ShardCache();
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  // False when the cache cannot be used (see Failures above).
  bool enabled() const;
  // "" for an in-memory cache.
  const std::string& dir() const { return dir_; }

  // Pins the entry of `key`, starting `fetch` on a new thread when there is none (or the one there
  // failed its check). `fetch` runs at most once per entry and may outlive the caller's interest:
  // it must own what it uses. Errors: the cache is disabled -> kFailedPrecondition; no memory file
  // or cache file can be created -> its errno's code. REQUIRES: key non-empty, fetch non-null.
  Result<std::shared_ptr<const Handle>> Acquire(const std::string& key, Fetch fetch);

  Counters counters() const;

  // The name of the files of `key` in the directory (hex digest of the key), for tests and tools.
  static std::string FileName(const std::string& key);

 private:
  using Impl = Handle::Impl;
  using Entry = Handle::Entry;
  explicit ShardCache(std::shared_ptr<Impl> impl, std::string dir);
  std::shared_ptr<Impl> impl_;
  std::string dir_;
};

}  // namespace spdl::io
