#include "jobs/targets.h"

#include <cstring>

#include "media/image_format.h"
#include "media/targets.h"

namespace spdl::jobs {

TargetWriter::TargetWriter(const config::JobConfig& c) {
  if (c.media != config::Media::kImage) return;
  out_width_ = c.out_width;
  out_height_ = c.out_height;
  if (c.source.type == config::SourceType::kCoco) {
    const config::CocoConfig& k = c.source.coco;
    boxes_ = true;
    max_boxes_ = k.max_boxes;
    truncate_ = k.on_overflow == config::CocoConfig::OnOverflow::kTruncate;
    min_size_ = k.min_box_size;
    min_visibility_ = k.min_visibility;
    contiguous_ = k.contiguous_ids;
    coco_masks_ = k.masks;
    const auto n = static_cast<uint64_t>(max_boxes_);
    tensors_.push_back({"boxes", proto::FLOAT32, {max_boxes_, 4}, n * 4 * sizeof(float)});
    tensors_.push_back({"box_labels", proto::INT64, {max_boxes_}, n * sizeof(int64_t)});
    tensors_.push_back({"box_count", proto::INT32, {}, sizeof(int32_t)});
  }
  mask_from_ = c.mask.from;
  mask_empty_on_missing_ = c.mask.empty_on_missing;
  if (coco_masks_ || !mask_from_.empty()) {
    tensors_.push_back({"mask",
                        proto::UINT8,
                        {out_height_, out_width_},
                        static_cast<uint64_t>(out_height_) * static_cast<uint64_t>(out_width_)});
  }
}

Status TargetWriter::Write(const io::SampleSource& source, uint64_t index, const media::ImageOps& ops,
                           const media::ImageInfo& info, std::span<uint8_t* const> rows) const {
  const media::GeometryChain chain = media::ImageGeometry(ops, info);
  size_t next = 0;
  const std::vector<io::ObjectAnnotation>* objects = source.Objects(index);
  if (boxes_ || coco_masks_) {
    if (objects == nullptr) return FailedPrecondition("the source has no box annotations");
  }
  if (boxes_) {
    auto* boxes = reinterpret_cast<float*>(rows[0]);
    auto* labels = reinterpret_cast<int64_t*>(rows[1]);
    std::memset(rows[0], 0, tensors_[0].row_bytes);
    std::memset(rows[1], 0, tensors_[1].row_bytes);
    const media::BoxFilter filter{min_size_, min_visibility_};
    int64_t kept = 0, moved = 0;
    for (const io::ObjectAnnotation& o : *objects) {
      media::Box out;
      if (!media::MoveBoxSteps({o.x1, o.y1, o.x2, o.y2}, chain, filter, &out)) {
        continue;
      }
      ++moved;
      if (kept == max_boxes_) continue;
      boxes[4 * kept + 0] = out.x1;
      boxes[4 * kept + 1] = out.y1;
      boxes[4 * kept + 2] = out.x2;
      boxes[4 * kept + 3] = out.y2;
      labels[kept] = o.category;
      ++kept;
    }
    if (moved > max_boxes_ && !truncate_) {
      return ResourceExhausted("sample " + source.sample(index).path + " has " + std::to_string(moved) +
                               " boxes, more than source.max_boxes " + std::to_string(max_boxes_) +
                               " (source.on_overflow: truncate keeps the first " + std::to_string(max_boxes_) + ")");
    }
    const auto count = static_cast<int32_t>(kept);
    std::memcpy(rows[2], &count, sizeof(count));
    next = 3;
  }
  if (!coco_masks_ && mask_from_.empty()) return Status::Ok();

  // The mask at the stored image's size, then moved to the output by nearest sampling.
  thread_local std::vector<uint8_t> stored;
  uint8_t* dst = rows[next];
  const int sw = info.width, sh = info.height;
  if (coco_masks_) {
    stored.assign(static_cast<size_t>(sw) * static_cast<size_t>(sh), 0);
    for (const io::ObjectAnnotation& o : *objects) {
      const auto value = static_cast<uint8_t>(contiguous_ ? o.category + 1 : o.category);
      for (const std::vector<float>& poly : o.polygons) media::FillPolygon(poly, value, stored.data(), sw, sh);
    }
  } else {
    thread_local std::vector<uint8_t> bytes;
    Status s = source.ReadSidecar(index, mask_from_, &bytes);
    if (!s.ok()) {
      if (s.code() == StatusCode::kNotFound && mask_empty_on_missing_) {
        std::memset(dst, 0, tensors_[next].row_bytes);
        return Status::Ok();
      }
      return Status(s.code(),
                    "mask (" + mask_from_ + "): " + s.message() +
                        (s.code() == StatusCode::kNotFound ? " (mask.on_missing: empty gives an all-zero mask)" : ""));
    }
    int mw = 0, mh = 0;
    const std::span<const uint8_t> data(bytes.data(), bytes.size());
    const media::ImageFormat format = media::SniffImageFormat(data);
    if (Status size = media::ReadImageSize(format, data, &mw, &mh); !size.ok()) {
      return DataLoss("mask (" + mask_from_ + "): " + size.message());
    }
    if (mw != sw || mh != sh) {
      return InvalidArgument("mask (" + mask_from_ + ") is " + std::to_string(mw) + "x" + std::to_string(mh) +
                             ", not the image's " + std::to_string(sw) + "x" + std::to_string(sh));
    }
    media::ImageOps gray;  // the whole mask, one channel, as stored
    gray.channels = 1;
    gray.max_pixels = ops.max_pixels;
    thread_local media::ImageDecoder decoder;
    stored.resize(static_cast<size_t>(sw) * static_cast<size_t>(sh));
    if (Status d = decoder.DecodeInto(data, gray, stored.data(), sw, sh); !d.ok()) {
      return Status(d.code(), "mask (" + mask_from_ + "): " + d.message());
    }
  }
  media::WarpMaskSteps(stored.data(), chain, dst);
  return Status::Ok();
}

}  // namespace spdl::jobs
