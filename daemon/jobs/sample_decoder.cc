#include "jobs/sample_decoder.h"

#include <cstring>
#include <variant>

#include "media/audio_decoder.h"
#include "media/image_decoder.h"
#include "media/image_format.h"
#include "media/video_decoder.h"

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
  Status valid = media::ValidateImageOps(ops);
  if (!valid.ok()) return InvalidArgument("transforms: " + valid.message());
  return ops;
}

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
  Status Decode(std::span<const uint8_t> bytes, uint64_t seed, std::span<uint8_t* const> rows) const override {
    thread_local media::ImageDecoder decoder;  // decoders are not thread-safe: one per worker thread
    // A large image's scratch comes out of the daemon's memory budget first (memory_budget.h).
    MemoryBudget::Lease scratch;
    if (budget_) {
      uint64_t pixels = 0;
      const uint64_t need = EstimateDecodeScratch(bytes, &pixels);
      // Over max_pixels the decoder refuses it from the header, naming the limit: nothing to reserve.
      if (need >= kScratchAccountFrom && pixels <= static_cast<uint64_t>(ops_.max_pixels)) {
        int w = 0, h = 0;
        const media::ImageFormat f = media::SniffImageFormat(bytes);
        (void)media::ReadImageSize(f, bytes, &w, &h);
        const std::string what = std::string(media::ImageFormatName(f)) + " image" +
                                 (w > 0 ? " " + std::to_string(w) + "x" + std::to_string(h) : std::string());
        SPDL_ASSIGN_OR_RETURN(scratch, budget_->ReserveScratch(need, what));
      }
    }
    return decoder.DecodeInto(bytes, ops_, rows[0], width_, height_, seed);
  }

 private:
  const media::ImageOps ops_;
  const int width_, height_;
  const std::shared_ptr<MemoryBudget> budget_;
  std::vector<RowTensor> tensors_;
};

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

Result<std::shared_ptr<const SampleDecoder>> MakeSampleDecoder(const config::JobConfig& c,
                                                               std::shared_ptr<MemoryBudget> budget) {
  switch (c.media) {
    case config::Media::kImage: {
      SPDL_ASSIGN_OR_RETURN(media::ImageOps ops, ImageOpsFor(c));
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
