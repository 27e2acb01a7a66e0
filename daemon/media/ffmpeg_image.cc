#include "media/ffmpeg_image.h"

extern "C" {
#include <libavutil/error.h>
#include <libavutil/log.h>
}

#include <climits>
#include <cstring>
#include <string>

namespace spdl::media {
namespace {

AVCodecID CodecIdFor(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng:
      return AV_CODEC_ID_PNG;
    case ImageFormat::kGif:
      return AV_CODEC_ID_GIF;
    case ImageFormat::kBmp:
      return AV_CODEC_ID_BMP;
    case ImageFormat::kTiff:
      return AV_CODEC_ID_TIFF;
    case ImageFormat::kWebp:
      return AV_CODEC_ID_WEBP;
    case ImageFormat::kJpeg:
    case ImageFormat::kUnknown:
      break;
  }
  return AV_CODEC_ID_NONE;
}

std::string AvError(int rc) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(rc, buf, sizeof(buf));
  return buf;
}

}  // namespace

Result<AvCodecContextPtr> FfmpegImageDecoder::OpenContext(ImageFormat format) {
  const AVCodecID id = CodecIdFor(format);
  const AVCodec* codec = id == AV_CODEC_ID_NONE ? nullptr : avcodec_find_decoder(id);
  if (codec == nullptr) {
    return FailedPrecondition(std::string("this FFmpeg build has no ") + ImageFormatName(format) + " decoder");
  }
  AvCodecContextPtr ctx(avcodec_alloc_context3(codec));
  if (!ctx) return ResourceExhausted("avcodec_alloc_context3: out of memory");
  ctx->thread_count = 1;  // one image per worker thread; the pool gives the parallelism
  // As strict as the JPEG side: a damaged chunk (bad CRC, a chunk running past the end) is an
  // error, not a half-decoded picture. Not for TIFF: there AV_EF_EXPLODE also refuses every tag
  // FFmpeg does not know (ResolutionUnit, Software, ...), which most TIFF writers put in.
  if (format != ImageFormat::kTiff) ctx->err_recognition |= AV_EF_EXPLODE | AV_EF_CRCCHECK;
  // A corrupt sample is reported through the returned Status; demote libavcodec's own messages
  // about it (ERROR -> DEBUG) so that bad data cannot flood the daemon's log.
  ctx->log_level_offset = AV_LOG_DEBUG - AV_LOG_ERROR;
  const int rc = avcodec_open2(ctx.get(), codec, nullptr);
  if (rc < 0) {
    return FailedPrecondition(std::string("cannot open the ") + ImageFormatName(format) + " decoder: " + AvError(rc));
  }
  return ctx;
}

void FfmpegImageDecoder::Trim(size_t max_bytes) {
  if (!frame_ || frame_->width <= 0) return;
  size_t bytes = 0;
  for (int p = 0; p < AV_NUM_DATA_POINTERS && frame_->buf[p]; ++p) bytes += frame_->buf[p]->size;
  if (bytes <= max_bytes) return;
  av_frame_unref(frame_.get());
}

Result<const AVFrame*> FfmpegImageDecoder::Decode(ImageFormat format, std::span<const uint8_t> data,
                                                  int64_t max_pixels) {
  const std::string name = ImageFormatName(format);
  if (data.empty()) return DataLoss("not a " + name + " image: no data");
  if (data.size() > static_cast<size_t>(INT_MAX - AV_INPUT_BUFFER_PADDING_SIZE)) {
    return ResourceExhausted(name + " file of " + std::to_string(data.size()) + " bytes is too large to decode");
  }
  // The guard from the header, before any pixel is decoded. (The codec checks max_pixels again
  // when it allocates the picture, but says only EINVAL.)
  int width = 0, height = 0;
  SPDL_RETURN_IF_ERROR(ReadImageSize(format, data, &width, &height));
  if (int64_t{width} * height > max_pixels) {
    return ResourceExhausted("image " + std::to_string(width) + "x" + std::to_string(height) + " has " +
                             std::to_string(int64_t{width} * height) + " pixels, over the limit of " +
                             std::to_string(max_pixels));
  }
  if (format == ImageFormat::kGif) SPDL_RETURN_IF_ERROR(CheckGifFirstImage(data));
  // A fresh codec context for every image: libavcodec's image decoders keep state from the last
  // file that flushing does not clear (found by tests/fuzz/image_fuzz): TIFF keeps the last file's
  // tags (StripByteCounts, Predictor, ...) for the next one that lacks them, and WebP's has no
  // flush at all: its inner VP8 decoder keeps its context (reference frames, probabilities,
  // segmentation, loop filter) from the last image, and a crafted keyframe decoded to different
  // pixels after another WebP than after none. The result must
  // depend on the file alone, not on what the worker decoded before, even after a refused file.
  // The cost (measured, FFmpeg 5.1, loaded 2-core machine): about 50 us more per image with the
  // new context's picture pool, a whole 32x24 WebP or PNG taking ~100 us instead of ~50, a
  // 256x256 PNG ~5 ms either way.
  SPDL_ASSIGN_OR_RETURN(AvCodecContextPtr context, OpenContext(format));
  AVCodecContext* ctx = context.get();
  ctx->max_pixels = max_pixels;
  if (!packet_) packet_.reset(av_packet_alloc());
  if (!frame_) frame_.reset(av_frame_alloc());
  if (!packet_ || !frame_) return ResourceExhausted("av_packet_alloc/av_frame_alloc: out of memory");
  av_frame_unref(frame_.get());
  // A refcounted packet with zeroed padding (the decoders' bitstream readers may read past the
  // end); avcodec_send_packet then takes a reference instead of copying it again.
  if (av_new_packet(packet_.get(), static_cast<int>(data.size())) < 0) {
    return ResourceExhausted("av_new_packet: out of memory");
  }
  std::memcpy(packet_->data, data.data(), data.size());
  packet_->flags |= AV_PKT_FLAG_KEY;

  int rc = avcodec_send_packet(ctx, packet_.get());
  if (rc >= 0) {
    rc = avcodec_receive_frame(ctx, frame_.get());
    if (rc == AVERROR(EAGAIN)) {  // a decoder that waits for more input: drain it
      rc = avcodec_send_packet(ctx, nullptr);
      if (rc >= 0) rc = avcodec_receive_frame(ctx, frame_.get());
    }
  }
  av_packet_unref(packet_.get());
  if (rc < 0) {
    if (rc == AVERROR(ENOMEM)) return ResourceExhausted(name + " decode: out of memory");
    if (rc == AVERROR_EOF || rc == AVERROR(EAGAIN)) {
      return DataLoss(name + " decode failed: the data holds no complete image");
    }
    return DataLoss(name + " decode failed: " + AvError(rc));
  }
  // The context goes now; the frame keeps its own reference to its buffers.
  const AVFrame* f = frame_.get();
  if (f->width <= 0 || f->height <= 0 || f->format < 0) {
    return DataLoss(name + " decode gave an empty picture");
  }
  const int64_t pixels = int64_t{f->width} * f->height;
  if (pixels > max_pixels) {
    return ResourceExhausted("image " + std::to_string(f->width) + "x" + std::to_string(f->height) + " has " +
                             std::to_string(pixels) + " pixels, over the limit of " + std::to_string(max_pixels));
  }
  return f;
}

}  // namespace spdl::media
