// Sample sources in S3-compatible object storage. Immutable after Open: safe to share between
// threads (see sample_source.h); the S3 transport (s3_client.h) is internally locked.
//
//   S3ObjectSource    one object per sample: the s3:// URLs of a list file ("s3://b/k[,label]"
//                     lines, format in sample_list.h), or every object below an s3:// prefix with
//                     the class = the first path component after the prefix (label = index of the
//                     sorted class names; objects directly at the prefix are skipped and counted).
//                     Keys (sample(i).path) are the s3:// URLs.
//   S3TarShardSource  WebDataset tar shards named by s3:// URLs or brace patterns
//                     ("s3://b/train-{000..099}.tar"), grouped into samples exactly as
//                     TarShardSource does (tar_shard_source.h: keys, image extensions in order of
//                     preference, label member, sidecars). Streamed: each shard is read once,
//                     sequentially, into a shard cache file (shard_cache.h: the node's on disk when
//                     the daemon has cache_dir, else a private in-memory one), and its tar headers
//                     are parsed as the bytes arrive; a sample is served as soon as its members
//                     are there (keys complete: the next key has started, or the shard ended).
//                     The sample counts the sampler needs come from the spdl-shard manifest next to
//                     the shards (NAME.manifest.json for NAME-000000.tar ...), read at Open: the
//                     job starts after one small GET. Without a manifest, Open streams every shard
//                     through the header parse first (into the cache, so a node cache keeps them).
//                     ShardSizes lets the sampler shuffle whole shards per epoch, and resume stays
//                     exact (the order is a pure function of the job and the counts).
// Each source owns the job's S3Client, and with it the job's credentials: sources are never shared
// between jobs. What jobs share is the node's shard cache, keyed by the object's identity
// (endpoint, bucket, key, ETag), and served to a job only after a 1-byte ranged GET of the object
// under that job's own credentials (the probe that also gives the ETag): a job never reads a
// cached shard it could not fetch itself. The bytes the cache fetches carry If-Match with that ETag.
// Describe and Identity name the endpoint and the s3:// URLs, never a credential.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "io/s3_client.h"
#include "io/sample_source.h"
#include "io/shard_cache.h"

namespace spdl::io {

class S3ObjectSource final : public SampleSource {
 public:
  // The s3:// lines of the list file `list` (below allowed_roots). Every bad line at once (not an
  // s3:// URL, a bad bucket name, a URL outside the allowed prefixes) -> kInvalidArgument; no
  // sample -> kNotFound.
  static Result<std::unique_ptr<S3ObjectSource>> OpenList(const std::string& list,
                                                          const std::vector<std::string>& allowed_roots,
                                                          std::shared_ptr<const S3Client> client);
  // Every object below `prefix` ("s3://bucket/train/") whose name ends with one of `extensions`
  // (".jpg", any case). No class folder with a matching object -> kNotFound.
  static Result<std::unique_ptr<S3ObjectSource>> OpenPrefix(const std::string& prefix,
                                                            const std::vector<std::string>& extensions,
                                                            std::shared_ptr<const S3Client> client);

  uint64_t size() const override { return samples_.size(); }
  const SampleRef& sample(uint64_t index) const override { return samples_[index]; }
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  std::string Identity() const override { return "s3 " + origin_ + " endpoint " + client_->endpoint(); }
  std::vector<std::string> ClassNames() const override { return classes_; }
  SourceCounters Counters() const override;

  uint64_t skipped() const { return skipped_; }  // objects not taken (extension, no class folder)

 private:
  S3ObjectSource() = default;
  std::string origin_;  // the list file or the prefix
  std::shared_ptr<const S3Client> client_;
  std::vector<SampleRef> samples_;
  std::vector<std::string> classes_;
  uint64_t skipped_ = 0;
};

struct S3TarShardOptions {
  std::vector<std::string> shards;  // s3:// URLs or brace patterns
  std::vector<std::string> image_extensions = {"jpg", "jpeg", "png", "webp"};
  std::string label_extension = "cls";
  std::vector<std::string> sidecar_extensions;
  // The node's shard cache (may be null or disabled: a private in-memory one is used).
  std::shared_ptr<ShardCache> node_cache;
  // The private in-memory stream buffer's budget, when there is no node cache: the shards being
  // read are kept besides (pinned), plus the most recent ones within this many bytes.
  uint64_t stream_buffer_bytes = uint64_t{256} << 20;
  // "auto": NAME.manifest.json next to the first shard when it exists; "none": scan at Open;
  // or an s3:// URL of the manifest.
  std::string manifest = "auto";
  uint64_t max_sample_bytes = uint64_t{1} << 30;
};

class S3TarShardSource final : public SampleSource {
 public:
  // REQUIRES: every entry of options.shards is an s3:// URL or pattern. Errors: a bad pattern or URL
  // -> kInvalidArgument; a manifest that cannot be read (other than missing) or that does not match
  // the shards -> its error; without a manifest, every shard's problem at once (missing, denied,
  // corrupt tar -> kDataLoss), with the first's code; no sample -> kNotFound.
  static Result<std::unique_ptr<S3TarShardSource>> Open(const S3TarShardOptions& options,
                                                        const std::shared_ptr<const S3Client>& client);
  ~S3TarShardSource() override;

  uint64_t size() const override;
  // With a manifest, waits until the sample's shard has streamed up to it (a key not yet known).
  const SampleRef& sample(uint64_t index) const override;
  // Waits for the sample's members to arrive in the shard's cache file, then reads them from it.
  // Errors name the key (or the shard and position), the shard and the store's error.
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  std::string Identity() const override;
  std::vector<uint64_t> ShardSizes() const override;
  std::optional<std::string> DatasetDigest() const override;
  SourceCounters Counters() const override;

  bool has_manifest() const { return !manifest_digest_.empty(); }

 private:
  struct Shard;  // one shard's state (s3_source.cc)
  struct Location {
    uint64_t offset = 0;
    uint64_t size = 0;  // kNoMember: absent (sidecars)
  };
  static constexpr uint64_t kNoMember = ~uint64_t{0};
  S3TarShardSource() = default;
  // Shard s and the position in it of sample `index`.
  std::pair<size_t, uint64_t> Locate(uint64_t index) const;
  // Makes sample `pos` of shard `s` known (probing, opening and parsing the shard as needed); with
  // pos = kAll, the whole shard.
  Status Ensure(size_t s, uint64_t pos) const;
  // The shard's bytes: a pinned cache handle (the node's, else the private one), kept in a small
  // table of recently used shards.
  Result<std::shared_ptr<const ShardCache::Handle>> OpenShard(size_t s) const;
  void ForgetShard(size_t s) const;
  Status ReadMember(uint64_t index, size_t s, uint64_t pos, int sidecar, std::vector<uint8_t>* out) const;

  std::string description_;
  std::shared_ptr<const S3Client> client_;
  std::vector<std::string> image_exts_;
  std::string label_ext_;
  std::vector<std::string> sidecar_exts_;  // lower-case, no '.'
  uint64_t max_sample_bytes_ = 0;
  std::shared_ptr<ShardCache> node_cache_;
  std::shared_ptr<ShardCache> stream_;  // private, in memory
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<uint64_t> starts_;  // sample index of each shard's first sample; back() = size()
  std::string manifest_digest_;   // "" = no manifest
  uint64_t total_ = 0;
  // The table of open shards (at most kOpenShards pinned) and the counters.
  mutable std::mutex open_mu_;
  mutable std::vector<std::pair<size_t, std::shared_ptr<const ShardCache::Handle>>> open_;  // most recent last
  mutable uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace spdl::io
