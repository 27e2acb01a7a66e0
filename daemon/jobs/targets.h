// TargetWriter: the per-sample targets of an image job that follow the image's geometry — boxes
// from a coco source (`boxes` float32 [max_boxes, 4] x1 y1 x2 y2 in output pixels, `box_labels`
// int64 [max_boxes], `box_count` int32; rows past the count are zero) and a segmentation mask
// (`mask` uint8 [H, W]: coco polygons with source.masks, or a sidecar image with mask.from) — and
// how one sample's are written from what the image decoder did (media/targets.h moves them).
//
// Threading: immutable after construction; Write may run on many worker threads at once (each
// keeps its own scratch and mask decoder, thread_local).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"
#include "config/job_config.h"
#include "io/sample_source.h"
#include "jobs/sample_decoder.h"
#include "media/image_decoder.h"
#include "media/image_ops.h"

namespace spdl::jobs {

class TargetWriter {
 public:
  // The targets a validated job config asks for (none for most jobs).
  explicit TargetWriter(const config::JobConfig& config);

  // The tensors Write fills, in order (empty: the job has no targets).
  const std::vector<RowTensor>& tensors() const { return tensors_; }
  bool empty() const { return tensors_.empty(); }

  // Writes sample `index`'s targets into rows (rows[i]: tensors()[i].row_bytes bytes), moved by
  // the geometry the decoder reported in `info` for an image decoded with `ops`. Errors: the
  // source has no annotations (kFailedPrecondition); more boxes than max_boxes with on_overflow:
  // error (kResourceExhausted, naming the count); a missing mask sidecar (kNotFound, unless
  // on_missing: empty), an undecodable one or one of another size than the image (kDataLoss /
  // kInvalidArgument).
  Status Write(const io::SampleSource& source, uint64_t index, const media::ImageOps& ops, const media::ImageInfo& info,
               std::span<uint8_t* const> rows) const;

 private:
  // Constant after construction.
  std::vector<RowTensor> tensors_;
  bool boxes_ = false;       // boxes, box_labels, box_count come first
  bool coco_masks_ = false;  // mask from the coco polygons
  std::string mask_from_;    // mask from this sidecar ("" = none)
  bool mask_empty_on_missing_ = false;
  int64_t max_boxes_ = 0;
  bool truncate_ = false;
  double min_size_ = 1.0, min_visibility_ = 0.0;
  bool contiguous_ = false;
  int out_width_ = 0, out_height_ = 0;
};

}  // namespace spdl::jobs
