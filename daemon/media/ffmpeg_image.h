// FfmpegImageDecoder: one still image (PNG, GIF's first frame, BMP, TIFF, WebP) decoded from
// memory by libavcodec into an AVFrame, in whatever pixel format the codec gives (RGB24, RGBA,
// PAL8, GRAY8, RGB48BE, YUV420P, ...); the caller resamples it with swscale.
//
// Internal to media/. Not thread-safe: each ImageDecoder (one per worker thread) owns one. It
// keeps a packet and a frame between calls, and opens a fresh codec context for every image, so
// that one file can leave no state behind for the next (libavcodec's TIFF and WebP decoders keep
// some that flushing does not clear).
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavutil/frame.h>
}

#include <cstdint>
#include <memory>
#include <span>

#include "common/status.h"
#include "media/image_format.h"

namespace spdl::media {

struct AvCodecContextDeleter {
  void operator()(AVCodecContext* c) const noexcept { avcodec_free_context(&c); }
};
struct AvFrameDeleter {
  void operator()(AVFrame* f) const noexcept { av_frame_free(&f); }
};
struct AvPacketDeleter {
  void operator()(AVPacket* p) const noexcept { av_packet_free(&p); }
};
using AvCodecContextPtr = std::unique_ptr<AVCodecContext, AvCodecContextDeleter>;
using AvFramePtr = std::unique_ptr<AVFrame, AvFrameDeleter>;
using AvPacketPtr = std::unique_ptr<AVPacket, AvPacketDeleter>;

class FfmpegImageDecoder {
 public:
  FfmpegImageDecoder() = default;
  FfmpegImageDecoder(FfmpegImageDecoder&&) noexcept = default;
  FfmpegImageDecoder& operator=(FfmpegImageDecoder&&) noexcept = default;

  // Decodes the first image of `data` (a whole file) with the codec for `format`. Refuses an
  // image over max_pixels from its header (ReadImageSize) before decoding; the codec refuses to
  // allocate a bigger picture too (AVCodecContext::max_pixels), and the frame's size is checked
  // again here. Returns the frame, valid until the next call or destruction.
  // kDataLoss with libavcodec's message for corrupt or truncated data; kFailedPrecondition when
  // this FFmpeg has no decoder for the format; kResourceExhausted over max_pixels.
  // REQUIRES: format is kPng, kGif, kBmp, kTiff or kWebp.
  Result<const AVFrame*> Decode(ImageFormat format, std::span<const uint8_t> data, int64_t max_pixels);

  // Frees the last frame (and with it the picture pool of the context that made it) when the
  // picture was larger than max_bytes: one huge image must not pin memory in every worker.
  // Invalidates the frame Decode returned.
  void Trim(size_t max_bytes);

 private:
  // A new, opened context for `format`.
  static Result<AvCodecContextPtr> OpenContext(ImageFormat format);

  AvPacketPtr packet_;
  AvFramePtr frame_;
};

}  // namespace spdl::media
