// CocoSource: a COCO instances dataset — the annotations JSON (images, annotations, categories)
// and the folder its images' file_name values are relative to. One sample per image, in image id
// order (as torchvision's CocoDetection); each sample's objects (boxes, category, polygons) in
// the stored image's pixels (sample_source.h ObjectAnnotation). Samples have no class label
// (kNoLabel).
//
// Thread safety: immutable after Open; every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/read_file.h"
#include "io/sample_source.h"
#include "io/source_index_cache.h"

namespace spdl::io {

struct CocoOptions {
  std::string annotations;                 // the instances JSON; must resolve below allowed_roots
  std::string root;                        // the image folder; must resolve below allowed_roots
  std::vector<std::string> allowed_roots;  // the daemon's allowed data roots (empty refuses all)
  bool include_crowd = false;              // keep annotations with iscrowd: 1
  bool contiguous_ids = false;             // categories as 0..K-1 in id order, not their ids
  bool masks = false;                      // polygons are needed: each category must fit a uint8 mask
                                           // value (id, or index + 1, at most 255); an RLE
                                           // segmentation (crowd) is refused
  uint64_t max_sample_bytes = kDefaultMaxSampleBytes;
  uint64_t max_json_bytes = uint64_t{2} << 30;  // a larger annotations file is refused
  // Open shares the parsed annotations with other opens of the same file, root and options while
  // one of them lives (source_index_cache.h; reused while the JSON is unchanged): the ranks of a
  // run parse COCO's JSON once. nullptr = always parse.
  SourceIndexCache* index_cache = nullptr;
};

struct CocoIndex;  // the parsed annotations (coco_source.cc)

class CocoSource final : public SampleSource {
 public:
  // Reads and checks the JSON. Errors: paths outside the allowed roots or missing (ResolveUnderRoots'
  // errors); malformed JSON or a missing / mistyped field (kInvalidArgument, naming the entry: "annotations[12].bbox
  // ..."); an annotation of an unknown image or category; no image -> kNotFound.
  static Result<std::unique_ptr<CocoSource>> Open(const CocoOptions& options);

  uint64_t size() const override;
  const SampleRef& sample(uint64_t index) const override;
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  // "coco <annotations> root <root> <hash of the JSON>": a changed annotations file is another dataset.
  std::string Identity() const override;
  // The category names by label (contiguous ids: by index; else empty, as ids need not be dense).
  std::vector<std::string> ClassNames() const override;
  const std::vector<ObjectAnnotation>* Objects(uint64_t index) const override;

  uint64_t object_count() const;

 private:
  CocoSource(std::shared_ptr<const CocoIndex> index, std::shared_ptr<const RootDir> root, uint64_t max_sample_bytes)
      : index_(std::move(index)), root_(std::move(root)), max_sample_bytes_(max_sample_bytes) {}

  // Constant after Open.
  const std::shared_ptr<const CocoIndex> index_;  // possibly shared with other sources
  const std::shared_ptr<const RootDir> root_;
  const uint64_t max_sample_bytes_;
};

}  // namespace spdl::io
