// SampleSource: a dataset as N samples addressable by index, each with a key (a path or a URL, for
// logs and --record), a label, and bytes. The sampler's global order indexes into it; the job reads
// sample i from worker threads.
//
// Thread safety: every implementation is immutable after its factory returns, except for internal,
// locked caches (HttpSource's connection pool). size(), sample() and Describe() may be called from
// any thread; Read() is called concurrently from many worker threads, each with its own buffer.
//
// Implementations (one header each):
//   ImageFolderSource  root/<class>/<file>, torchvision's ImageFolder        (this header)
//   FileListSource     a text/CSV file of "path[,label]" lines below a root  (file_list_source.h)
//   TarShardSource     WebDataset tar shards, read in place                   (tar_shard_source.h)
//   HttpSource         URLs, or a base URL + relative paths                   (http_source.h)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/manifest.h"
#include "io/read_file.h"
#include "io/source_index_cache.h"

namespace spdl::io {

// One object of a sample, in the stored image's pixels (COCO instances: coco_source.h). Polygons
// are flat [x0, y0, x1, y1, ...] lists in the same pixels (a COCO segmentation's polygons).
struct ObjectAnnotation {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;  // the box, x2 >= x1, y2 >= y1
  int64_t category = 0;                  // the label the batch carries (a category id, or a contiguous index)
  std::vector<std::vector<float>> polygons;
};

// Counters of a source's reads from remote storage, for the job's stats (all 0 for local sources).
struct SourceCounters {
  uint64_t shard_cache_hits = 0;    // shards this source opened that were there (cached or arriving)
  uint64_t shard_cache_misses = 0;  // shards whose download this source started
  uint64_t fetched_bytes = 0;       // body bytes this source received from the store
  uint64_t requests = 0;            // requests sent (attempts, retries included)
  uint64_t retries = 0;             // attempts that repeated a failed one
  uint64_t errors_4xx = 0;          // answers 4xx other than 429 (denied, missing, changed)
  uint64_t errors_5xx = 0;          // answers 5xx and 429
  uint64_t errors_network = 0;      // connection failures, cut or stalled transfers, timeouts
};

// The label of a sample that has none (a file list line without a label, a tar sample without a
// .cls member).
inline constexpr int64_t kNoLabel = -1;

class SampleSource {
 public:
  virtual ~SampleSource() = default;

  // The number of samples. Fixed for the source's lifetime.
  virtual uint64_t size() const = 0;

  // Sample `index`'s key (in .path: a path or URL, as the source's documentation says) and label
  // (kNoLabel when it has none). The reference lives as long as the source.
  // REQUIRES: index < size().
  virtual const SampleRef& sample(uint64_t index) const = 0;

  // Replaces *out with sample `index`'s bytes, reusing out's capacity. On error *out is left empty
  // and the message names the sample's key (and, for tar shards, the shard and offset).
  // An index >= size() -> kInvalidArgument. REQUIRES: out != nullptr.
  virtual Status Read(uint64_t index, std::vector<uint8_t>* out) const = 0;

  // Replaces *out with the bytes of sample `index`'s sidecar with ending `extension` (".txt"), read
  // like the sample itself: in tar shards the member of the sample's key with that extension (one
  // of TarShardOptions::sidecar_extensions); in a folder or a list the file SidecarPath(key,
  // extension), beneath the same root. kNotFound when the sample has none; other errors as Read's,
  // naming the sidecar. On error *out is left empty. Default: kFailedPrecondition (this source
  // type has no sidecars).
  // (Defined here, not in sample_source.cc: with no out-of-line virtual the class's type info is
  // emitted wherever it is used, so code that only hashes a source need not link all of io.)
  virtual Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
    out->clear();
    return FailedPrecondition(Describe() + ": sample " + std::to_string(index) + ": this source type has no " +
                              extension + " sidecar files");
  }

  // One line for logs and spdlctl, e.g. "image folder /data (1000 samples, 10 classes)".
  virtual std::string Describe() const = 0;

  // A short identity of the dataset for resume fingerprints: the type and what it was opened
  // from (root, list, shards, base URL), e.g. "image_folder /data/train". Two sources with the
  // same identity and the same samples are the same dataset.
  virtual std::string Identity() const = 0;

  // For sources read best in sequence (tar shards): the number of samples in each shard, in
  // index order (shard 0 holds samples [0, sizes[0]), shard 1 the next sizes[1], ...). Empty for
  // random-access sources. The sampler uses it for a shard-aware order (sampler.h).
  virtual std::vector<uint64_t> ShardSizes() const { return {}; }

  // A digest of the dataset for resume fingerprints, for sources whose keys are only known once
  // their data has streamed in (remote shards with a manifest): the fingerprint then hashes this
  // instead of every key and label. nullopt (the default): hash the keys and labels.
  virtual std::optional<std::string> DatasetDigest() const { return std::nullopt; }

  // The source's remote-read counters (SourceCounters); all 0 by default.
  virtual SourceCounters Counters() const { return {}; }

  // The objects annotated on sample `index` (detection / segmentation sources: coco), in the
  // stored image's pixels; nullptr for sources without annotations. The pointer lives as long as
  // the source. REQUIRES: index < size().
  virtual const std::vector<ObjectAnnotation>* Objects(uint64_t /*index*/) const { return nullptr; }

  // The class names by label, for sources that have them (an image folder: its sub-directories);
  // empty otherwise. Sent to the client in JobAccepted.classes.
  virtual std::vector<std::string> ClassNames() const { return {}; }
};

// The path of a file sample's sidecar: `path` up to the last '.' of its base name (all of it when
// the base name has none, or only a leading one), then `extension`: ("a/000123.jpg", ".txt") ->
// "a/000123.txt".
std::string SidecarPath(const std::string& path, const std::string& extension);

// The largest sample any source reads by default (the limit io::ReadFile has).
inline constexpr uint64_t kDefaultMaxSampleBytes = uint64_t{1} << 30;

// An image folder (see ScanImageFolder in manifest.h). Keys are paths relative to the root;
// labels are class indices. Each sample is opened beneath the root (RootDir): a symbolic link in
// the folder that leads out of it fails that sample's Read, it is not followed.
class ImageFolderSource final : public SampleSource {
 public:
  // Resolves `root` under `allowed_roots` (ResolveUnderRoots), then scans it (ScanImageFolder), or
  // shares the scan of another source open on the same resolved root and extensions (index_cache,
  // see source_index_cache.h; nullptr = always scan).
  // Errors: those of ResolveUnderRoots and ScanImageFolder, prefixed with nothing more.
  static Result<std::unique_ptr<ImageFolderSource>> Open(const std::string& root,
                                                         const std::vector<std::string>& extensions,
                                                         const std::vector<std::string>& allowed_roots,
                                                         uint64_t max_sample_bytes = kDefaultMaxSampleBytes,
                                                         SourceIndexCache* index_cache = nullptr);

  // Wraps a manifest already scanned (and its root already checked) by the caller; `root` is the
  // manifest's root, opened. REQUIRES: root != nullptr.
  ImageFolderSource(Manifest manifest, std::shared_ptr<const RootDir> root,
                    uint64_t max_sample_bytes = kDefaultMaxSampleBytes);
  // The same over a manifest shared with other sources (the index cache's). REQUIRES: both non-null.
  ImageFolderSource(std::shared_ptr<const Manifest> manifest, std::shared_ptr<const RootDir> root,
                    uint64_t max_sample_bytes = kDefaultMaxSampleBytes);

  uint64_t size() const override { return manifest_->samples.size(); }
  const SampleRef& sample(uint64_t index) const override { return manifest_->samples[index]; }
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  std::string Identity() const override { return "image_folder " + manifest_->root; }
  std::vector<std::string> ClassNames() const override { return manifest_->classes; }

  const Manifest& manifest() const { return *manifest_; }

 private:
  // Constant after construction.
  const std::shared_ptr<const Manifest> manifest_;  // possibly shared with other sources
  const std::shared_ptr<const RootDir> root_;
  const uint64_t max_sample_bytes_;
};

}  // namespace spdl::io
