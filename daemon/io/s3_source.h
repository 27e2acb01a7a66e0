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
//                     preference, label member, sidecars). Open streams each shard once through
//                     the tar header scan (in memory: a memfd the size of the shard; 4 shards at
//                     once, joined in shard order) and keeps per sample its shard, offset and size; Read is one ranged
//                     GET of the member. ShardSizes lets the sampler shuffle whole shards per epoch
//                     and give ranks whole shards, and resume stays exact (the order is a pure
//                     function of the job).
// Each source owns the job's S3Client, and with it the job's credentials: sources are never shared
// between jobs, so another job, of another uid or not, never reads with them. What S3TarShardSource
// shares through the source index cache is only its index (keys, labels, offsets), and only between
// jobs of the same user (the caller's `scope`: the FsIdentity key) with the same access key id,
// endpoint and shards: the ranks of one run scan the shards once. The index holds no credential.
// Describe and Identity name the endpoint and the s3:// URLs, never a credential.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/s3_client.h"
#include "io/sample_source.h"
#include "io/source_index_cache.h"

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

  uint64_t skipped() const { return skipped_; }  // objects not taken (extension, no class folder)

 private:
  S3ObjectSource() = default;
  std::string origin_;  // the list file or the prefix
  std::shared_ptr<const S3Client> client_;
  std::vector<SampleRef> samples_;
  std::vector<std::string> classes_;
  uint64_t skipped_ = 0;
};

class S3TarShardSource final : public SampleSource {
 public:
  // REQUIRES: every entry of `shards` is an s3:// URL or pattern. Extensions as TarShardSource's
  // (lower-case, with or without '.'). Errors: a bad pattern or URL -> kInvalidArgument; then every
  // shard's problem at once (missing, denied, corrupt tar -> kDataLoss), with the first's code; no
  // sample -> kNotFound.
  static Result<std::unique_ptr<S3TarShardSource>> Open(
      const std::vector<std::string>& shards, const std::vector<std::string>& image_extensions,
      const std::string& label_extension, const std::vector<std::string>& sidecar_extensions,
      std::shared_ptr<const S3Client> client, SourceIndexCache* index_cache = nullptr, const std::string& scope = "");

  uint64_t size() const override;
  const SampleRef& sample(uint64_t index) const override;
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  std::string Identity() const override;
  std::vector<uint64_t> ShardSizes() const override;

  struct Index;  // the scan's result (s3_source.cc); immutable, possibly shared

 private:
  struct Location {
    uint32_t shard = 0;
    uint64_t offset = 0;
    uint64_t size = 0;  // kNoMember: absent (sidecars)
  };
  static constexpr uint64_t kNoMember = ~uint64_t{0};
  S3TarShardSource() = default;
  static Result<std::shared_ptr<const Index>> Scan(std::vector<S3Location> shards,
                                                   const std::vector<std::string>& image_exts,
                                                   const std::string& label_ext,
                                                   const std::vector<std::string>& sidecar_exts, const S3Client& client,
                                                   const std::string& description);
  Status ReadAt(uint64_t index, const Location& at, const std::string& what, std::vector<uint8_t>* out) const;

  std::string description_;
  std::shared_ptr<const S3Client> client_;
  std::vector<std::string> sidecar_exts_;  // lower-case, no '.'
  std::shared_ptr<const Index> index_;
};

}  // namespace spdl::io
