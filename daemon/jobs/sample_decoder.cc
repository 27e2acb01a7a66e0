#include "jobs/sample_decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <variant>

#include "media/audio_decoder.h"
#include "media/augment.h"
#include "media/image_decoder.h"
#include "media/image_format.h"
#include "media/pixel_convert.h"
#include "media/sample_random.h"
#include "media/video_decoder.h"
#include "plugins/op_loader.h"

namespace spdl::jobs {
namespace {

media::Interpolation ToMedia(config::Interpolation i) {
  switch (i) {
    case config::Interpolation::kBilinear:
      return media::Interpolation::kBilinear;
    case config::Interpolation::kBicubic:
      return media::Interpolation::kBicubic;
    case config::Interpolation::kArea:
      return media::Interpolation::kArea;
    case config::Interpolation::kNearest:
      return media::Interpolation::kNearest;
    case config::Interpolation::kHamming:
      return media::Interpolation::kHamming;
    case config::Interpolation::kLanczos:
      return media::Interpolation::kLanczos;
  }
  return media::Interpolation::kBilinear;
}

media::OutputDType ToMedia(config::DType d) {
  switch (d) {
    case config::DType::kUInt8:
      return media::OutputDType::kUInt8;
    case config::DType::kFloat32:
      return media::OutputDType::kFloat32;
    case config::DType::kFloat16:
      return media::OutputDType::kFloat16;
    case config::DType::kBFloat16:
      return media::OutputDType::kBFloat16;
  }
  return media::OutputDType::kUInt8;
}

proto::DType ImageDType(const media::ImageOps& ops) {
  switch (ops.dtype) {
    case media::OutputDType::kUInt8:
      return proto::UINT8;
    case media::OutputDType::kFloat32:
      return proto::FLOAT32;
    case media::OutputDType::kFloat16:
      return proto::FLOAT16;
    case media::OutputDType::kBFloat16:
      return proto::BFLOAT16;
  }
  return proto::UINT8;
}

// Writes one int64 (a length or frame count) into its row.
void PutInt64(uint8_t* row, int64_t v) { std::memcpy(row, &v, sizeof(v)); }

// Maps the job's transform chain, decode and output settings onto the image decoder's ops: one
// fused resize + center crop (or one random resized crop), then the flip and the normalization
// in the output pass.
Result<media::ImageOps> ImageOpsFor(const config::JobConfig& c) {
  media::ImageOps ops;
  bool seen_crop = false;
  for (const auto& t : c.transforms) {
    if (const auto* r = std::get_if<config::ResizeOp>(&t)) {
      if (seen_crop || ops.resize_shorter || ops.resize_height || ops.random_crop())
        return InvalidArgument("transforms: only one resize, before center_crop, is supported in this version");
      ops.resize_shorter = r->shorter;
      ops.resize_max_size = r->max_size;
      ops.resize_height = r->height;
      ops.resize_width = r->width;
      ops.interpolation = ToMedia(r->interpolation);
    } else if (const auto* cc = std::get_if<config::CenterCropOp>(&t)) {
      if (seen_crop || ops.random_crop())
        return InvalidArgument("transforms: only one center_crop is supported in this version");
      seen_crop = true;
      ops.crop_height = cc->height;
      ops.crop_width = cc->width;
    } else if (const auto* rc = std::get_if<config::RandomResizedCropOp>(&t)) {
      if (seen_crop || ops.resize_shorter || ops.resize_height || ops.random_crop())
        return InvalidArgument("transforms: random_resized_crop cannot be combined with resize or center_crop");
      ops.random_crop_height = rc->height;
      ops.random_crop_width = rc->width;
      ops.random_crop_scale = {rc->scale_min, rc->scale_max};
      ops.random_crop_ratio = {rc->ratio_min, rc->ratio_max};
      ops.interpolation = ToMedia(rc->interpolation);
    } else if (const auto* f = std::get_if<config::HorizontalFlipOp>(&t)) {
      ops.flip_probability = f->p;
    } else if (const auto* n = std::get_if<config::NormalizeOp>(&t)) {
      ops.normalize = true;
      ops.mean = n->mean;
      ops.stddev = n->stddev;
    }
  }
  ops.dtype = ToMedia(c.output.dtype);
  ops.layout = c.output.layout == config::Layout::kNCHW ? media::OutputLayout::kNCHW : media::OutputLayout::kNHWC;
  ops.channels = c.decode.color == config::ColorMode::kGray ? 1 : 3;
  ops.exif_orientation = c.decode.exif_orientation;
  ops.alpha = c.decode.alpha == config::AlphaMode::kComposite ? media::AlphaMode::kComposite : media::AlphaMode::kDrop;
  for (int i = 0; i < 3; ++i) ops.background[i] = static_cast<uint8_t>(c.decode.background[i]);
  ops.max_pixels = c.decode.max_pixels;
  ops.resample = c.decode.resample == config::Resample::kFast ? media::Resample::kFast : media::Resample::kExact;
  Status valid = media::ValidateImageOps(ops);
  if (!valid.ok()) return InvalidArgument("transforms: " + valid.message());
  return ops;
}

}  // namespace

Result<MemoryBudget::Lease> ReserveDecodeScratch(MemoryBudget* budget, std::span<const uint8_t> bytes,
                                                 int64_t max_pixels) {
  if (budget == nullptr) return MemoryBudget::Lease();
  uint64_t pixels = 0;
  const uint64_t need = EstimateDecodeScratch(bytes, &pixels);
  if (need < kScratchAccountFrom || pixels > static_cast<uint64_t>(max_pixels)) return MemoryBudget::Lease();
  int w = 0, h = 0;
  const media::ImageFormat f = media::SniffImageFormat(bytes);
  (void)media::ReadImageSize(f, bytes, &w, &h);
  const std::string what = std::string(media::ImageFormatName(f)) + " image" +
                           (w > 0 ? " " + std::to_string(w) + "x" + std::to_string(h) : std::string());
  return budget->ReserveScratch(need, what);
}

namespace {

class ImageSampleDecoder final : public SampleDecoder {
 public:
  ImageSampleDecoder(media::ImageOps ops, int width, int height, std::shared_ptr<MemoryBudget> budget)
      : ops_(ops), width_(width), height_(height), budget_(std::move(budget)) {
    const std::vector<int64_t> shape = ops.layout == media::OutputLayout::kNCHW
                                           ? std::vector<int64_t>{ops.channels, height, width}
                                           : std::vector<int64_t>{height, width, ops.channels};
    tensors_ = {{"image", ImageDType(ops), shape, media::OutputImageBytes(ops, width, height)}};
  }
  const std::vector<RowTensor>& tensors() const override { return tensors_; }
  bool random() const override { return ops_.random_crop() || ops_.flip_probability > 0; }
  const media::ImageOps* image_ops() const override { return &ops_; }
  Status Decode(std::span<const uint8_t> bytes, uint64_t seed, std::span<uint8_t* const> rows) const override {
    return DecodeImage(bytes, seed, rows, nullptr);
  }
  Status DecodeImage(std::span<const uint8_t> bytes, uint64_t seed, std::span<uint8_t* const> rows,
                     media::ImageInfo* info) const override {
    thread_local media::ImageDecoder decoder;  // decoders are not thread-safe: one per worker thread
    // A large image's scratch comes out of the daemon's memory budget first (memory_budget.h).
    SPDL_ASSIGN_OR_RETURN(MemoryBudget::Lease scratch, ReserveDecodeScratch(budget_.get(), bytes, ops_.max_pixels));
    return decoder.DecodeInto(bytes, ops_, rows[0], width_, height_, seed, info);
  }

 private:
  const media::ImageOps ops_;
  const int width_, height_;
  const std::shared_ptr<MemoryBudget> budget_;
  std::vector<RowTensor> tensors_;
};

// One step run on the uint8 image after the geometry: a user op, a built-in augmentation or the
// horizontal flip.
struct PixelStep {
  int op = -1;                   // index into the ops; -1 = the flip (or an augmentation)
  double flip_p = 0;             // the flip's probability
  bool before_geometry = false;  // an op on the whole decoded image, before resize / crops
  int augment = -1;              // >= 0: index into the built-in augmentations (op is then -1)
};

// ---- built-in augmentations (media/augment.h) and random erasing ----
struct AugmentChain {
  std::vector<media::AugmentSpec> specs;           // in chain order; step.augment indexes it
  std::optional<config::RandomErasingOp> erasing;  // the last transform, on the output tensor
  std::optional<config::RandomCropSpec> crop;      // random_crop, right after the geometry
  bool empty() const { return specs.empty() && !erasing && !crop; }
};

// Writes one value of the output tensor (dtype of `ops`) at element index `i` of `row`.
void PutValue(const media::ImageOps& ops, uint8_t* row, size_t i, double v) {
  switch (ops.dtype) {
    case media::OutputDType::kUInt8:
      row[i] = static_cast<uint8_t>(std::clamp(std::nearbyint(v), 0.0, 255.0));
      return;
    case media::OutputDType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(row + 4 * i, &f, 4);
      return;
    }
    case media::OutputDType::kFloat16: {
      const uint16_t h = media::DoubleToHalf(v);
      std::memcpy(row + 2 * i, &h, 2);
      return;
    }
    case media::OutputDType::kBFloat16: {
      const uint16_t h = media::DoubleToBFloat16(v);
      std::memcpy(row + 2 * i, &h, 2);
      return;
    }
  }
}

// torchvision RandomErasing on one output image (any dtype and layout): the value per channel, or
// standard normal noise (Box-Muller from the sample's erase stream).
void RandomErase(const config::RandomErasingOp& e, const media::ImageOps& ops, uint8_t* row, int width, int height,
                 uint64_t seed) {
  media::SampleRng rng(seed, media::RandomStream::kErase);
  if (!rng.Bernoulli(e.p)) return;
  const media::EraseRect r = media::PlanErase(width, height, e.scale, e.ratio, rng);
  if (r.width == 0) return;
  const int c = ops.channels;
  for (int ch = 0; ch < c; ++ch) {
    for (int y = r.y; y < r.y + r.height; ++y) {
      for (int x = r.x; x < r.x + r.width; ++x) {
        double v = e.value[ch];
        if (e.random) {
          const double u1 = 1.0 - rng.Uniform(0, 1), u2 = rng.Uniform(0, 1);
          v = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * 3.14159265358979323846 * u2);
        }
        const size_t i = ops.layout == media::OutputLayout::kNCHW ? (static_cast<size_t>(ch) * height + y) * width + x
                                                                  : (static_cast<size_t>(y) * width + x) * c + ch;
        PutValue(ops, row, i, v);
      }
    }
  }
}

// An image job with user ops: geometry into a uint8 HWC image (the row, or a per-thread scratch),
// the steps in config order, then the output pass (see the header).
class OpImageSampleDecoder final : public SampleDecoder {
 public:
  OpImageSampleDecoder(media::ImageOps ops, int width, int height, std::vector<std::unique_ptr<plugins::Op>> user_ops,
                       const std::vector<PixelStep>& steps, uint32_t decode_concurrency, AugmentChain augments,
                       std::shared_ptr<MemoryBudget> budget)
      : ops_(ops),
        width_(width),
        height_(height),
        user_ops_(std::move(user_ops)),
        augments_(std::move(augments)),
        budget_(std::move(budget)) {
    for (const PixelStep& step : steps) (step.before_geometry ? pre_steps_ : steps_).push_back(step);
    pixel_ops_ = ops;
    pixel_ops_.dtype = media::OutputDType::kUInt8;
    pixel_ops_.layout = media::OutputLayout::kNHWC;
    pixel_ops_.normalize = false;
    pixel_ops_.mean = {0, 0, 0};
    pixel_ops_.stddev = {1, 1, 1};
    pixel_ops_.flip_probability = 0;  // a step, in its place among the ops
    const std::vector<int64_t> shape = ops.layout == media::OutputLayout::kNCHW
                                           ? std::vector<int64_t>{ops.channels, height, width}
                                           : std::vector<int64_t>{height, width, ops.channels};
    tensors_ = {{"image", ImageDType(ops), shape, media::OutputImageBytes(ops, width, height)}};
    for (const auto& op : user_ops_) {
      std::string name = "op:" + op->name();
      for (const auto& s : stats_) {
        if (s->name() == name) name += "#" + std::to_string(stats_.size());
      }
      stats_.push_back(std::make_unique<pipeline::StageStats>(name, pipeline::StageKind::kCpu, decode_concurrency, 0));
    }
    for (size_t i = 0; i < augments_.specs.size(); ++i) {  // "aug:NAME", "#i" when a name repeats
      std::string name = std::string("aug:") + media::AugmentName(augments_.specs[i].kind);
      for (size_t j = 0; j < i; ++j) {
        if (augments_.specs[j].kind == augments_.specs[i].kind) name += "#" + std::to_string(i);
      }
      aug_stats_.push_back(
          std::make_unique<pipeline::StageStats>(name, pipeline::StageKind::kCpu, decode_concurrency, 0));
    }
    if (augments_.erasing) {
      aug_stats_.push_back(std::make_unique<pipeline::StageStats>("aug:random_erasing", pipeline::StageKind::kCpu,
                                                                  decode_concurrency, 0));
    }
    geo_width_ = width_;
    geo_height_ = height_;
    if (augments_.crop) {  // the geometry's own (fixed) size, before the crop
      media::OutputSize(ops_, 1, 1, &geo_width_, &geo_height_);
      crop_stats_ =
          std::make_unique<pipeline::StageStats>("aug:random_crop", pipeline::StageKind::kCpu, decode_concurrency, 0);
    }
  }
  const std::vector<RowTensor>& tensors() const override { return tensors_; }
  bool random() const override { return true; }  // every op gets its seed
  std::vector<const pipeline::StageStats*> SubStageStats() const override {
    std::vector<const pipeline::StageStats*> out;
    out.reserve(stats_.size() + aug_stats_.size());
    for (const auto& s : stats_) out.push_back(s.get());
    for (const auto& s : aug_stats_) out.push_back(s.get());
    if (crop_stats_) out.push_back(crop_stats_.get());
    return out;
  }

  // Targets follow the geometry only without user ops (an op may move pixels in ways spdld does not know).
  const media::ImageOps* image_ops() const override { return user_ops_.empty() ? &pixel_ops_ : nullptr; }
  Status Decode(std::span<const uint8_t> bytes, uint64_t seed, std::span<uint8_t* const> rows) const override {
    return DecodeImage(bytes, seed, rows, nullptr);
  }
  // *info (if given): the decoder's geometry, then in info->after each step run here that moves
  // pixels (random_crop, the flip when drawn, a geometric augmentation's drawn map).
  Status DecodeImage(std::span<const uint8_t> bytes, uint64_t seed, std::span<uint8_t* const> rows,
                     media::ImageInfo* info) const override {
    thread_local media::ImageDecoder decoder;
    thread_local std::vector<uint8_t> scratch;  // the uint8 image when the output is not uint8 NHWC
    SPDL_ASSIGN_OR_RETURN(MemoryBudget::Lease lease, ReserveDecodeScratch(budget_.get(), bytes, ops_.max_pixels));
    const int c = ops_.channels;
    const size_t stride = static_cast<size_t>(width_) * static_cast<size_t>(c);
    uint8_t* pixels = rows[0];
    if (!ops_.raw_output()) {
      scratch.resize(stride * static_cast<size_t>(height_));
      pixels = scratch.data();
    }
    // With random_crop the geometry goes to a per-thread image of its own size, cropped into `pixels`.
    thread_local std::vector<uint8_t> geometry;
    uint8_t* geo = pixels;
    size_t geo_stride = stride;
    if (augments_.crop) {
      geo_stride = static_cast<size_t>(geo_width_) * static_cast<size_t>(c);
      geometry.resize(geo_stride * static_cast<size_t>(geo_height_));
      geo = geometry.data();
    }
    if (pre_steps_.empty()) {
      SPDL_RETURN_IF_ERROR(
          decoder.DecodeRgbInto(bytes, pixel_ops_, geo, geo_width_, geo_height_, geo_stride, seed, info));
    } else {
      // Ops before the geometry: the full-size path, the ops on the whole upright RGB image.
      const media::ImageDecoder::PixelHook hook = [this, seed](uint8_t* px, int w, int h, size_t pitch) {
        for (const PixelStep& step : pre_steps_) SPDL_RETURN_IF_ERROR(RunOp(step.op, px, h, w, 3, pitch, seed));
        return Status::Ok();
      };
      SPDL_RETURN_IF_ERROR(
          decoder.DecodeWithHookInto(bytes, pixel_ops_, geo, geo_width_, geo_height_, geo_stride, seed, hook, info));
    }
    std::vector<media::GeometryStep>* after = info != nullptr ? &info->after : nullptr;
    if (augments_.crop) SPDL_RETURN_IF_ERROR(RandomCrop(geo, geo_stride, pixels, stride, seed, after));
    for (const PixelStep& step : steps_) {
      if (step.augment >= 0) {
        RunAugmentStep(step.augment, pixels, stride, seed, after);
        continue;
      }
      if (step.op < 0) {
        media::SampleRng rng(seed, media::RandomStream::kFlip);  // the draw the decoder's own flip makes
        if (rng.Bernoulli(step.flip_p)) {
          Mirror(pixels, stride, c);
          if (after != nullptr) after->push_back({media::Affine2D::FlipX(width_), width_, height_});
        }
        continue;
      }
      SPDL_RETURN_IF_ERROR(RunOp(step.op, pixels, height_, width_, c, stride, seed));
    }
    if (!ops_.raw_output()) {
      thread_local media::ValueTable table;
      if (!table.BuiltFor(ops_)) table.Build(ops_);
      media::SourceImage src{pixels, stride, width_, height_, c, false};
      media::OutputImage out{rows[0], width_, height_, stride * media::DTypeSize(ops_.dtype), ops_.layout, c};
      media::ConvertInto(src, media::Orientation{}, 0, 0, table, out);
    }
    if (augments_.erasing) {
      const auto t0 = std::chrono::steady_clock::now();
      RandomErase(*augments_.erasing, ops_, rows[0], width_, height_, seed);
      const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
      aug_stats_.back()->Record(static_cast<uint64_t>(nanos.count()), true);
    }
    return Status::Ok();
  }

 private:
  // Runs user op `op` on an image, timing it into its stats row; its seed from the sample's.
  Status RunOp(int op, uint8_t* pixels, int height, int width, int channels, size_t stride, uint64_t seed) const {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = user_ops_[op]->Apply(pixels, height, width, channels, static_cast<int64_t>(stride),
                                    media::UserOpSeed(seed, static_cast<uint32_t>(op)));
    const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
    stats_[op]->Record(static_cast<uint64_t>(nanos.count()), s.ok());
    return s;
  }

  // random_crop from the geometry's image into the output-size one, from its own stream.
  // *after (if given) gets its map.
  Status RandomCrop(const uint8_t* geo, size_t geo_stride, uint8_t* pixels, size_t stride, uint64_t seed,
                    std::vector<media::GeometryStep>* after) const {
    const auto t0 = std::chrono::steady_clock::now();
    media::SampleRng rng(seed, media::RandomStream::kRandomCrop);
    if (!augments_.crop) return Internal("random_crop without its settings");  // callers check
    const auto& crop = *augments_.crop;
    std::string error;
    const media::CropDraw d = media::DrawRandomCrop(crop, geo_width_, geo_height_, rng, &error);
    if (error.empty()) {
      const media::ImageView src{const_cast<uint8_t*>(geo), geo_width_, geo_height_, ops_.channels, geo_stride};
      media::PadCrop(src, media::ImageView{pixels, width_, height_, ops_.channels, stride}, d, crop.mode, crop.fill);
      if (after != nullptr) after->push_back({media::RandomCropMap(d), width_, height_});
    }
    const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
    crop_stats_->Record(static_cast<uint64_t>(nanos.count()), error.empty());
    if (!error.empty()) return InvalidArgument(error);
    return Status::Ok();
  }

  // Runs built-in augmentation `i` on the uint8 image, from its own stream of the sample's seed;
  // *after (if given) gets the map it drew unless that is the identity (photometric ops).
  void RunAugmentStep(int i, uint8_t* pixels, size_t stride, uint64_t seed,
                      std::vector<media::GeometryStep>* after) const {
    const auto t0 = std::chrono::steady_clock::now();
    media::SampleRng rng(seed, static_cast<media::RandomStream>(static_cast<uint64_t>(media::RandomStream::kAugment) +
                                                                static_cast<uint64_t>(i)));
    media::Affine2D map;
    media::RunAugment(augments_.specs[i], media::ImageView{pixels, width_, height_, ops_.channels, stride}, rng,
                      after != nullptr ? &map : nullptr);
    if (after != nullptr && !(map == media::Affine2D::Identity())) after->push_back({map, width_, height_});
    const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0);
    aug_stats_[i]->Record(static_cast<uint64_t>(nanos.count()), true);
  }

  // Mirrors the image left-right in place.
  void Mirror(uint8_t* pixels, size_t stride, int c) const {
    for (int y = 0; y < height_; ++y) {
      uint8_t* row = pixels + static_cast<size_t>(y) * stride;
      for (int l = 0, r = width_ - 1; l < r; ++l, --r) {
        for (int k = 0; k < c; ++k) std::swap(row[l * c + k], row[r * c + k]);
      }
    }
  }

  const media::ImageOps ops_;
  media::ImageOps pixel_ops_;  // the geometry only: uint8 HWC, no flip, no normalize
  const int width_, height_;
  std::vector<RowTensor> tensors_;
  const std::vector<std::unique_ptr<plugins::Op>> user_ops_;
  std::vector<PixelStep> pre_steps_;  // ops on the whole decoded image (constant after construction)
  std::vector<PixelStep> steps_;      // ops and the flip after the geometry (constant after construction)
  std::vector<std::unique_ptr<pipeline::StageStats>> stats_;  // per op; atomic counters
  const AugmentChain augments_;
  std::vector<std::unique_ptr<pipeline::StageStats>> aug_stats_;  // per augmentation, then random erasing
  int geo_width_ = 0, geo_height_ = 0;                // the geometry's output: the image's size unless random_crop
  std::unique_ptr<pipeline::StageStats> crop_stats_;  // random_crop's row, when there is one
  const std::shared_ptr<MemoryBudget> budget_;        // large decodes' scratch (may be null)
};

// The chain's user ops, made through *loader, and the steps around the geometry. An error names
// the entry's path and line.
Status MakeUserOps(const config::JobConfig& c, plugins::OpLoader* loader,
                   std::vector<std::unique_ptr<plugins::Op>>* ops, std::vector<PixelStep>* steps,
                   AugmentChain* augments) {
  bool seen_geometry = false;
  for (const auto& t : c.transforms) {
    if (const auto* a = std::get_if<config::AugmentOp>(&t)) {  // built-in augmentation
      if (const std::string bad = media::ValidateAugment(a->spec); !bad.empty()) {
        return InvalidArgument(std::string("transforms: ") + media::AugmentName(a->spec.kind) + ": " + bad);
      }
      PixelStep step;
      step.augment = static_cast<int>(augments->specs.size());
      steps->push_back(step);
      augments->specs.push_back(a->spec);
      continue;
    }
    if (const auto* e = std::get_if<config::RandomErasingOp>(&t)) {
      augments->erasing = *e;
      continue;
    }
    if (const auto* rc = std::get_if<config::RandomCropOp>(&t)) {
      augments->crop = rc->spec;
      continue;
    }
    if (const auto* f = std::get_if<config::HorizontalFlipOp>(&t)) {
      steps->push_back({-1, f->p, false});
      continue;
    }
    const auto* u = std::get_if<config::UserOp>(&t);
    if (u == nullptr) {
      if (!std::holds_alternative<config::NormalizeOp>(t)) seen_geometry = true;
      continue;
    }
    const std::string where =
        u->path + (u->line > 0 ? " (line " + std::to_string(u->line) + ")" : std::string(" (--set)")) + ": ";
    if (loader == nullptr) {
      return InvalidArgument(where + "ops are disabled on this spdld (its daemon config has no plugin_dirs)");
    }
    if (!seen_geometry && c.decode.color != config::ColorMode::kRgb) {
      return InvalidArgument(where +
                             "an op before the geometry sees the whole decoded RGB image: it needs "
                             "decode.color: rgb (or put it after resize / center_crop / random_resized_crop)");
    }
    Result<std::unique_ptr<plugins::Op>> op = loader->Create(u->library, u->name, u->args_json);
    if (!op.ok()) return Status(op.status().code(), where + op.status().message());
    steps->push_back({static_cast<int>(ops->size()), 0, !seen_geometry});
    ops->push_back(std::move(op).value());
  }
  return Status::Ok();
}

class AudioSampleDecoder final : public SampleDecoder {
 public:
  explicit AudioSampleDecoder(media::AudioOps ops) : ops_(ops) {
    tensors_ = {{"audio",
                 ops.dtype == media::AudioDType::kInt16 ? proto::INT16 : proto::FLOAT32,
                 {ops.channels, ops.num_samples},
                 media::AudioOutputBytes(ops)},
                {"length", proto::INT64, {}, sizeof(int64_t)}};
  }
  const std::vector<RowTensor>& tensors() const override { return tensors_; }
  bool random() const override { return ops_.crop == media::AudioCrop::kRandom; }
  Status Decode(std::span<const uint8_t> bytes, uint64_t seed, std::span<uint8_t* const> rows) const override {
    thread_local media::AudioDecoder decoder;
    SPDL_ASSIGN_OR_RETURN(int64_t valid, decoder.DecodeInto(bytes, ops_, rows[0], seed));
    PutInt64(rows[1], valid);
    return Status::Ok();
  }

 private:
  const media::AudioOps ops_;
  std::vector<RowTensor> tensors_;
};

class VideoSampleDecoder final : public SampleDecoder {
 public:
  explicit VideoSampleDecoder(media::VideoOps ops) : ops_(ops) {
    tensors_ = {{"video", proto::UINT8, {ops.num_frames, ops.height, ops.width, 3}, media::VideoOutputBytes(ops)},
                {"frames", proto::INT64, {}, sizeof(int64_t)}};
  }
  const std::vector<RowTensor>& tensors() const override { return tensors_; }
  bool random() const override { return ops_.start == media::VideoStart::kRandom; }
  Status Decode(std::span<const uint8_t> bytes, uint64_t seed, std::span<uint8_t* const> rows) const override {
    thread_local media::VideoDecoder decoder;
    SPDL_ASSIGN_OR_RETURN(int frames, decoder.DecodeInto(bytes, ops_, rows[0], seed));
    PutInt64(rows[1], frames);
    return Status::Ok();
  }

 private:
  const media::VideoOps ops_;
  std::vector<RowTensor> tensors_;
};

}  // namespace

uint64_t EstimateDecodeScratch(std::span<const uint8_t> bytes, uint64_t* pixels) {
  if (pixels != nullptr) *pixels = 0;
  const media::ImageFormat f = media::SniffImageFormat(bytes);
  uint64_t w = 0, h = 0, per_pixel = 8;
  if (f == media::ImageFormat::kJpeg) {
    // The first SOF marker's size: FF Cn, length, precision, height, width (not C4 DHT, C8, CC DAC).
    size_t i = 2;
    while (i + 9 < bytes.size()) {
      if (bytes[i] != 0xFF) return 0;
      const uint8_t m = bytes[i + 1];
      const size_t len = (size_t{bytes[i + 2]} << 8) | bytes[i + 3];
      if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
        h = (uint64_t{bytes[i + 5]} << 8) | bytes[i + 6];
        w = (uint64_t{bytes[i + 7]} << 8) | bytes[i + 8];
        break;
      }
      if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
        i += 2;
        continue;
      }
      i += 2 + len;
    }
    per_pixel = 3;
  } else {
    int iw = 0, ih = 0;
    if (!media::ReadImageSize(f, bytes, &iw, &ih).ok()) return 0;
    w = static_cast<uint64_t>(iw);
    h = static_cast<uint64_t>(ih);
    // PNG: IHDR's bit depth (byte 24); 16-bit images decode to 8 bytes per RGBA pixel.
    if (f == media::ImageFormat::kPng) per_pixel = bytes.size() > 24 && bytes[24] == 16 ? 8 : 4;
  }
  if (pixels != nullptr) *pixels = w * h;
  return w * h * per_pixel * 2;
}

Result<std::shared_ptr<const SampleDecoder>> MakeSampleDecoder(const config::JobConfig& c, plugins::OpLoader* loader,
                                                               std::shared_ptr<MemoryBudget> budget) {
  switch (c.media) {
    case config::Media::kImage: {
      SPDL_ASSIGN_OR_RETURN(media::ImageOps ops, ImageOpsFor(c));
      std::vector<std::unique_ptr<plugins::Op>> user_ops;
      std::vector<PixelStep> steps;
      AugmentChain augments;
      SPDL_RETURN_IF_ERROR(MakeUserOps(c, loader, &user_ops, &steps, &augments));
      if (!user_ops.empty() || !augments.empty()) {
        // ---- targets (boxes, masks) ----
        // They follow the augmentations (the decoder reports each drawn map: DecodeImage's info->after), not
        // op: transforms (an op may move pixels in ways spdld does not know): refused, not delivered wrong.
        if (!user_ops.empty() && (c.source.type == config::SourceType::kCoco || !c.mask.from.empty())) {
          return InvalidArgument(
              "transforms: boxes and masks cannot follow op: transforms (their geometry is unknown to spdld); "
              "remove the op: entries, or the coco source / mask");
        }
        return std::shared_ptr<const SampleDecoder>(std::make_shared<OpImageSampleDecoder>(
            ops, c.out_width, c.out_height, std::move(user_ops), std::move(steps),
            static_cast<uint32_t>(c.stages.decode.concurrency), std::move(augments), std::move(budget)));
      }
      return std::shared_ptr<const SampleDecoder>(
          std::make_shared<ImageSampleDecoder>(ops, c.out_width, c.out_height, std::move(budget)));
    }
    case config::Media::kAudio: {
      media::AudioOps ops;
      ops.sample_rate = c.audio.sample_rate;
      ops.channels = c.audio.channels;
      ops.num_samples = c.audio.length;
      ops.crop = c.audio.crop == config::AudioCrop::kRandom ? media::AudioCrop::kRandom : media::AudioCrop::kStart;
      ops.dtype = c.audio.dtype == config::AudioDType::kInt16 ? media::AudioDType::kInt16 : media::AudioDType::kFloat32;
      ops.layout = media::AudioLayout::kChannelsFirst;
      ops.max_duration_seconds = c.audio.max_seconds;
      if (Status valid = media::ValidateAudioOps(ops); !valid.ok()) return InvalidArgument("audio: " + valid.message());
      return std::shared_ptr<const SampleDecoder>(std::make_shared<AudioSampleDecoder>(ops));
    }
    case config::Media::kVideo: {
      media::VideoOps ops;
      ops.num_frames = c.video.frames;
      ops.frame_stride = c.video.stride;
      ops.fps = c.video.fps;
      ops.start = c.video.random_start ? media::VideoStart::kRandom : media::VideoStart::kFixed;
      ops.start_seconds = c.video.start_seconds;
      ops.height = c.video.height;
      ops.width = c.video.width;
      ops.interpolation = ToMedia(c.video.interpolation);
      if (Status valid = media::ValidateVideoOps(ops); !valid.ok()) return InvalidArgument("video: " + valid.message());
      return std::shared_ptr<const SampleDecoder>(std::make_shared<VideoSampleDecoder>(ops));
    }
  }
  return InvalidArgument("media: unknown");
}

}  // namespace spdl::jobs
