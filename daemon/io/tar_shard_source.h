// TarShardSource: a WebDataset — samples stored as tar shards — read in place, without unpacking.
// Immutable after Open: safe to share between threads (see sample_source.h).
//
// Layout (WebDataset's): a sample is the group of members sharing a key, the member name up to the
// first dot of its basename; the rest is the member's extension:
//   train/000123.jpg + train/000123.cls  ->  sample "train/000123" with a "jpg" and a "cls" member.
// The sample's bytes are its image member (the first of options.image_extensions it has; compared
// case-insensitively, so "x.seg.png" has extension "seg.png", not "png"); its label is the decimal
// integer in its label member ("cls"; surrounding blanks allowed), kNoLabel when it has none. Keys
// with no image member (only .json, say) are skipped and counted. Members whose basename starts with
// '.' are ignored. When a shard holds the same member twice, the later one wins (as tar extracts).
//
// Open scans the headers of every shard once (tar_reader.h) and keeps an index: per sample its
// shard, offset and size, so Read is one pread. The index is global and in shard order (each shard's
// samples in the order their keys first appear); ShardSizes() tells the sampler where each shard's
// samples are, so a job's order can be shard-aware (ShardedEpochOrder in sampler.h: shuffled
// shards, a bounded shuffle buffer, contiguous runs per rank) while staying a pure function, and
// any global permutation still works as for a folder. The price: a header scan of all shards at
// job start.
// Shards are opened beneath the allowed root that holds them (RootSet), at Open and at each Read.
//
// Keys (sample(i).path) are WebDataset keys; two shards may hold the same key.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/sample_source.h"
#include "io/source_index_cache.h"

namespace spdl::io {

struct TarShardOptions {
  // The shards: paths, or brace patterns such as "/data/shard-{000000..000099}.tar" (see
  // brace_expand.h), expanded and taken in order. Each must resolve below allowed_roots.
  std::vector<std::string> shards;
  std::vector<std::string> image_extensions = {"jpg", "jpeg", "png", "webp"};  // in order of preference
  std::string label_extension = "cls";                                         // "" = no labels
  // Member extensions indexed as sidecars (ReadSidecar), e.g. {"txt"}; a leading '.' is allowed,
  // case-insensitive. A sample may lack any of them.
  std::vector<std::string> sidecar_extensions;
  std::vector<std::string> allowed_roots;              // the daemon's allowed data roots (empty refuses all)
  uint64_t max_sample_bytes = kDefaultMaxSampleBytes;  // a larger member fails its Read
  size_t max_reported_errors = 100;                    // problems listed in Open's error; the rest are counted
  // Open shares the index with other opens of the same resolved shards, extensions and allowed
  // roots while one of them lives (source_index_cache.h; reused while every shard keeps its inode,
  // size and mtime). nullptr = always scan.
  SourceIndexCache* index_cache = nullptr;
};

class TarShardSource final : public SampleSource {
 public:
  // Expands, resolves, opens and scans every shard, and reads every label member.
  // Errors: no shard given, a bad pattern -> kInvalidArgument; then every shard's problem at once
  // (outside the allowed roots, missing, not a regular file, a corrupt or truncated tar (kDataLoss
  // naming the shard and offset), a label member that is not an integer >= 0), with the code of the
  // first; no sample in any shard -> kNotFound.
  static Result<std::unique_ptr<TarShardSource>> Open(const TarShardOptions& options);

  uint64_t size() const override;
  const SampleRef& sample(uint64_t index) const override;
  // Opens the shard, checks it is the file that was scanned (same inode, size and mtime; else
  // kFailedPrecondition "changed since it was indexed"), preads the member. Errors name the key, the
  // shard and the offset. Opening per read keeps no descriptor per shard (a dataset may have
  // 100,000 shards) at the cost of an open/fstat/close (a few microseconds) per sample.
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  // The member of the sample's key with `extension` (one of options.sidecar_extensions, any case,
  // with or without its '.'), read as Read reads the image member. kNotFound when the key has no
  // such member (or the extension was not indexed at Open).
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  std::string Identity() const override;
  std::vector<uint64_t> ShardSizes() const override;

  size_t num_shards() const;
  uint64_t skipped_keys() const;  // keys without an image member
  uint64_t unlabelled() const;    // samples without a label member
  double scan_seconds() const;    // how long the header scan took (a shared index: the scan that built it)

 private:
  struct Shard {
    std::string path;  // resolved
    dev_t dev = 0;
    ino_t ino = 0;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
  };
  struct Location {
    uint32_t shard = 0;
    uint64_t offset = 0;  // of the image member's bytes
    uint64_t size = 0;
  };
  // A sidecar member: its bytes' offset in the sample's shard and its size; kNoMember when absent.
  struct Member {
    uint64_t offset = 0;
    uint64_t size = kNoMember;
  };
  static constexpr uint64_t kNoMember = ~uint64_t{0};
  // The result of the header scan (the .cc defines it): immutable, possibly shared with other
  // sources through the index cache.
  struct Index;

  TarShardSource() = default;
  // Scans the shards `paths` (expanded, not yet resolved) into an index.
  static Result<std::shared_ptr<const Index>> Scan(const std::vector<std::string>& paths,
                                                   const std::vector<std::string>& image_exts,
                                                   const std::string& label_ext,
                                                   const std::vector<std::string>& sidecar_exts,
                                                   const std::string& description, const TarShardOptions& options);
  // Opens the shard of sample `index`, checks it was not changed, preads [offset, offset + size).
  // `what` names the member in errors ("" = the image member).
  Status ReadMember(uint64_t index, uint64_t offset, uint64_t size, const std::string& what,
                    std::vector<uint8_t>* out) const;

  // Constant after Open.
  std::string description_;                // the patterns as given, for Describe
  std::vector<std::string> sidecar_exts_;  // normalized (lower-case, no '.')
  std::shared_ptr<const Index> index_;
  uint64_t max_sample_bytes_ = kDefaultMaxSampleBytes;
  std::shared_ptr<const RootSet> allowed_;
};

}  // namespace spdl::io
