// SourceIndexCache: a node-wide cache of source indexes (an image folder's scanned sample list, a
// file list's or an HTTP source's parsed and checked entries, tar shards' member index), so that the jobs that open the
// same dataset -- the 8 ranks of one training run, above all -- share one scan instead of doing it
// once each (ImageNet: 1.28 M files, seconds per scan, and the same memory 8 times).
//
// Contract:
//   - A key names everything the index depends on: the source type first, then the resolved
//     paths and the options that change the scan's result (extensions, label member, sidecars,
//     allowed roots). The caller builds it (see the Open functions in sample_source.cc,
//     file_list_source.cc, tar_shard_source.cc, http_source.cc); two keys of different source types never collide
//     because each starts with its type. An index of one key is always of one C++ type.
//   - An entry lives while a job holds it: the cache keeps only a weak_ptr, so a dataset no job
//     uses costs no memory, and the next open after the last holder went scans afresh.
//   - Concurrent opens of one key run one scan: the first runs it on its own thread, the others
//     wait for its result (an open arriving while a scan runs takes that scan's result, as if it
//     had arrived at the scan's start). A failed scan is not cached: every waiter gets its error,
//     and the next open scans again.
//   - Staleness: an index records what its scan read (FileStamp: each directory it listed, the
//     list file, each shard: device, inode, size, mtime), and an open that finds a live entry
//     re-stats those before reusing it (an image folder of 1000 class directories: 1001 stats,
//     about a millisecond). Any difference -> the entry is stale and is scanned again (jobs
//     already holding the old index keep it). Timestamps are coarse (a jiffy on ext4, seconds on
//     some network file systems), so a change made in the same tick as the scan could keep the
//     old mtime: an index that read anything modified less than kRacyWindowNs before its scan
//     began is never reused ("racy", as git calls it); it serves the opens that waited for its
//     scan, and later opens scan again until the dataset has been still for kRacyWindowNs.
//     Not covered (documented limits): a file list's entries that name files by absolute or ".."
//     paths are resolved at scan time and not re-resolved on reuse (a file removed since fails
//     its Read, like a relative entry's); a sample file rewritten in place under the same name is
//     not a change to any index (samples are read at Read time).
//
// Threading: safe to share between threads; one mutex guards the table and the counters, and it
// is never held during a scan or a validity check.
//
// Scope: one instance per daemon, owned by the Daemon (the composition root) and handed to the job
// registry, which gives it to every source it opens (the sources' options: index_cache). Without
// one (nullptr, the options' default) every open scans. Tests build their own instances.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace spdl::io {

// An index that read something modified less than this long before its scan began is not reused.
inline constexpr int64_t kRacyWindowNs = int64_t{2} * 1'000'000'000;

// What a scan saw of one file or directory it read, to tell on reuse whether it changed.
struct FileStamp {
  std::string path;  // as the scan reached it (links followed by stat)
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t size = 0;  // compared for regular files only (a directory's size is file-system noise)
  bool regular = false;
  int64_t mtime_ns = 0;
};

// The stamp of `path` from its stat (links followed).
FileStamp MakeStamp(std::string path, const struct stat& st);

// The current CLOCK_REALTIME in nanoseconds (what mtimes are compared with).
int64_t RealtimeNowNs();

// The base of every cached index: what its scan read, and when the scan began. The scan fills
// both before returning the index; after that the index is immutable (shared by many jobs).
class SourceIndex {
 public:
  virtual ~SourceIndex() = default;

  // True when reusing the index is safe: it is not racy (see the header comment) and every stamp
  // still matches a fresh stat. On false, *why (if not null) says which input changed.
  // Cost: one stat per stamp. Safe from any thread.
  bool StillValid(std::string* why) const;

  int64_t scan_start_ns = 0;      // RealtimeNowNs() before the scan read anything
  std::vector<FileStamp> inputs;  // every directory listed / file read that decides the index
};

class SourceIndexCache {
 public:
  struct Stats {
    uint64_t scans = 0;   // scans run (first opens, stale entries, retries after a failure)
    uint64_t hits = 0;    // opens that reused a live, still valid entry
    uint64_t joined = 0;  // opens that waited for a scan already running and took its result
    uint64_t stale = 0;   // live entries found changed (each also counts a scan)
    uint64_t failed = 0;  // scans that returned an error (not cached)
  };
  using ScanFn = std::function<Result<std::shared_ptr<const SourceIndex>>()>;

  SourceIndexCache() = default;
  SourceIndexCache(const SourceIndexCache&) = delete;
  SourceIndexCache& operator=(const SourceIndexCache&) = delete;

  // The index of `key`: a live valid entry, the result of the scan of `key` already running, or
  // the result of calling `scan` now on this thread. `scan` must return an index with its
  // scan_start_ns and inputs set, or an error (returned to this caller and to every waiter, and
  // not cached). `what` names the dataset in debug logs. Blocks while a scan of `key` runs.
  Result<std::shared_ptr<const SourceIndex>> GetOrScan(const std::string& key, const std::string& what,
                                                       const ScanFn& scan);

  // GetOrScan for an index of type T (the type every index of `key` has; see the key rule above).
  template <typename T>
  Result<std::shared_ptr<const T>> Get(const std::string& key, const std::string& what,
                                       const std::function<Result<std::shared_ptr<const T>>()>& scan) {
    auto r = GetOrScan(key, what, [&scan]() -> Result<std::shared_ptr<const SourceIndex>> {
      auto t = scan();
      if (!t.ok()) return t.status();
      return std::shared_ptr<const SourceIndex>(std::move(t).value());
    });
    if (!r.ok()) return r.status();
    auto typed = std::dynamic_pointer_cast<const T>(std::move(r).value());
    if (!typed) return Internal("source index cache: key " + what + " holds an index of another type");
    return typed;
  }

  Stats stats() const;
  // Entries some job still holds (those whose last holder went are dropped on the next open).
  size_t live_entries() const;

 private:
  using ScanResult = Result<std::shared_ptr<const SourceIndex>>;
  struct Slot {
    std::weak_ptr<const SourceIndex> index;  // the last successful scan's index
    bool scanning = false;
    std::shared_future<ScanResult> scan;  // valid while scanning
  };
  // Drops slots whose index expired and that no scan is filling. REQUIRES: mu_ held.
  void PruneLocked();

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::unordered_map<std::string, Slot> slots_;
  Stats stats_;
};

// Joins key parts with a separator no path or option holds ('\0').
std::string IndexKey(const std::vector<std::string>& parts);

}  // namespace spdl::io
