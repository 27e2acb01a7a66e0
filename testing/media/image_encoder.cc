#include "media/image_encoder.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavutil/error.h>
#include <libavutil/frame.h>
#include <libavutil/log.h>
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include <cstring>
#include <memory>
#include <string>

#include "media/ffmpeg_image.h"
#include "media/jpeg_encoder.h"
#include "media/sws_cache.h"

namespace spdl::media {
namespace {

std::string AvError(int rc) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(rc, buf, sizeof(buf));
  return buf;
}

AVPixelFormat SourceFormat(RawPixels p) {
  switch (p) {
    case RawPixels::kRgb24:
      return AV_PIX_FMT_RGB24;
    case RawPixels::kRgba:
      return AV_PIX_FMT_RGBA;
    case RawPixels::kGray8:
      return AV_PIX_FMT_GRAY8;
    case RawPixels::kGrayAlpha8:
      return AV_PIX_FMT_YA8;
    case RawPixels::kRgb48:
      return AV_PIX_FMT_RGB48;
    case RawPixels::kRgba64:
      return AV_PIX_FMT_RGBA64;
    case RawPixels::kGray16:
      return AV_PIX_FMT_GRAY16;
    case RawPixels::kPal8:
      return AV_PIX_FMT_PAL8;
  }
  return AV_PIX_FMT_NONE;
}

size_t BytesPerPixel(RawPixels p) {
  switch (p) {
    case RawPixels::kRgb24:
      return 3;
    case RawPixels::kRgba:
      return 4;
    case RawPixels::kGray8:
      return 1;
    case RawPixels::kGrayAlpha8:
      return 2;
    case RawPixels::kRgb48:
      return 6;
    case RawPixels::kRgba64:
      return 8;
    case RawPixels::kGray16:
      return 2;
    case RawPixels::kPal8:
      return 1;
  }
  return 0;
}

// Encoder pixel formats that hold `p` without loss, best first (the last ones of kRgb24/kRgba
// are for lossy WebP, whose encoder converts to YUV itself).
std::vector<AVPixelFormat> Candidates(RawPixels p) {
  switch (p) {
    case RawPixels::kRgb24:
      return {AV_PIX_FMT_RGB24, AV_PIX_FMT_BGR24, AV_PIX_FMT_RGBA, AV_PIX_FMT_BGRA};
    case RawPixels::kRgba:
      return {AV_PIX_FMT_RGBA, AV_PIX_FMT_BGRA};
    case RawPixels::kGray8:
      return {AV_PIX_FMT_GRAY8, AV_PIX_FMT_RGB24, AV_PIX_FMT_BGR24, AV_PIX_FMT_BGRA};
    case RawPixels::kGrayAlpha8:
      return {AV_PIX_FMT_YA8, AV_PIX_FMT_RGBA, AV_PIX_FMT_BGRA};
    case RawPixels::kRgb48:
      return {AV_PIX_FMT_RGB48BE, AV_PIX_FMT_RGB48LE};
    case RawPixels::kRgba64:
      return {AV_PIX_FMT_RGBA64BE, AV_PIX_FMT_RGBA64LE};
    case RawPixels::kGray16:
      return {AV_PIX_FMT_GRAY16BE, AV_PIX_FMT_GRAY16LE};
    case RawPixels::kPal8:
      return {AV_PIX_FMT_PAL8};
  }
  return {};
}

const char* EncoderName(ImageFormat f) {
  switch (f) {
    case ImageFormat::kPng:
      return "png";
    case ImageFormat::kGif:
      return "gif";
    case ImageFormat::kBmp:
      return "bmp";
    case ImageFormat::kTiff:
      return "tiff";
    case ImageFormat::kWebp:
      return "libwebp";
    case ImageFormat::kJpeg:
    case ImageFormat::kUnknown:
      break;
  }
  return nullptr;
}

bool Supports(const AVCodec* codec, AVPixelFormat f) {
  if (codec->pix_fmts == nullptr) return false;
  for (const AVPixelFormat* p = codec->pix_fmts; *p != AV_PIX_FMT_NONE; ++p) {
    if (*p == f) return true;
  }
  return false;
}

Result<std::vector<uint8_t>> EncodeJpegImage(const RawImage& image, int quality) {
  if (image.pixels == RawPixels::kRgb24) {
    return EncodeJpeg(image.data.data(), image.width, image.height, quality);
  }
  if (image.pixels == RawPixels::kGray8) {
    std::vector<uint8_t> rgb(image.data.size() * 3);
    for (size_t i = 0; i < image.data.size(); ++i) {
      rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = image.data[i];
    }
    return EncodeJpeg(rgb.data(), image.width, image.height, quality, ChromaSubsampling::kGray);
  }
  return InvalidArgument("EncodeImage: JPEG takes RGB24 or GRAY8 pixels only");
}

}  // namespace

Result<std::vector<uint8_t>> EncodeImage(ImageFormat format, const RawImage& image, const EncodeOptions& options) {
  if (image.width <= 0 || image.height <= 0 ||
      image.data.size() != static_cast<size_t>(image.width) * image.height * BytesPerPixel(image.pixels)) {
    return InvalidArgument("EncodeImage: bad image " + std::to_string(image.width) + "x" +
                           std::to_string(image.height) + " with " + std::to_string(image.data.size()) + " bytes");
  }
  if (image.pixels == RawPixels::kPal8 && (image.palette.empty() || image.palette.size() > 256)) {
    return InvalidArgument("EncodeImage: a palette image needs 1..256 palette entries");
  }
  if (format == ImageFormat::kJpeg) return EncodeJpegImage(image, options.quality);
  const char* name = EncoderName(format);
  const AVCodec* codec = name ? avcodec_find_encoder_by_name(name) : nullptr;
  if (codec == nullptr) {
    return FailedPrecondition(std::string("this FFmpeg build has no ") + ImageFormatName(format) + " encoder" +
                              (name ? std::string(" (") + name + ")" : ""));
  }
  AVPixelFormat target = AV_PIX_FMT_NONE;
  for (AVPixelFormat f : Candidates(image.pixels)) {
    if (Supports(codec, f)) {
      target = f;
      break;
    }
  }
  if (target == AV_PIX_FMT_NONE) {
    return InvalidArgument(std::string("EncodeImage: ") + ImageFormatName(format) +
                           " cannot store these pixels without loss");
  }

  AvCodecContextPtr ctx(avcodec_alloc_context3(codec));
  AvFramePtr frame(av_frame_alloc());
  AvPacketPtr packet(av_packet_alloc());
  if (!ctx || !frame || !packet) return Internal("EncodeImage: out of memory");
  ctx->width = image.width;
  ctx->height = image.height;
  ctx->pix_fmt = target;
  ctx->time_base = AVRational{1, 25};
  ctx->thread_count = 1;
  // libwebp's advice to pass YUV (we pass RGB on purpose) and such: DEBUG, not on stderr.
  ctx->log_level_offset = AV_LOG_DEBUG - AV_LOG_WARNING;
  if (format == ImageFormat::kWebp) {
    av_opt_set_int(ctx->priv_data, "lossless", options.lossless ? 1 : 0, 0);
    av_opt_set_double(ctx->priv_data, "quality", options.quality, 0);
  }
  int rc = avcodec_open2(ctx.get(), codec, nullptr);
  if (rc < 0) return Internal(std::string("EncodeImage: opening ") + name + ": " + AvError(rc));

  frame->width = image.width;
  frame->height = image.height;
  frame->format = target;
  rc = av_frame_get_buffer(frame.get(), 0);
  if (rc < 0) {
    return Internal("EncodeImage: av_frame_get_buffer: " + AvError(rc));
  }
  const AVPixelFormat source = SourceFormat(image.pixels);
  const int src_stride = static_cast<int>(image.width * BytesPerPixel(image.pixels));
  if (source == target) {
    for (int y = 0; y < image.height; ++y) {
      std::memcpy(frame->data[0] + static_cast<ptrdiff_t>(y) * frame->linesize[0],
                  image.data.data() + static_cast<size_t>(y) * src_stride, src_stride);
    }
    if (source == AV_PIX_FMT_PAL8) {
      std::memset(frame->data[1], 0, 256 * 4);
      std::memcpy(frame->data[1], image.palette.data(), image.palette.size() * 4);
    }
  } else {
    // Same size, full range both sides: a lossless reordering of the samples.
    SwsCache cache(1);
    SwsKey key;
    key.src_width = key.dst_width = image.width;
    key.src_height = key.dst_height = image.height;
    key.src_format = source;
    key.dst_format = target;
    key.flags = SWS_POINT | SWS_ACCURATE_RND;
    SwsContext* sws = cache.Get(key);
    if (sws == nullptr) return Internal("EncodeImage: swscale refused the conversion");
    const uint8_t* src[4] = {image.data.data(), nullptr, nullptr, nullptr};
    const int strides[4] = {src_stride, 0, 0, 0};
    sws_scale(sws, src, strides, 0, image.height, frame->data, frame->linesize);
  }

  std::vector<uint8_t> out;
  rc = avcodec_send_frame(ctx.get(), frame.get());
  if (rc >= 0) rc = avcodec_send_frame(ctx.get(), nullptr);
  while (rc >= 0) {
    rc = avcodec_receive_packet(ctx.get(), packet.get());
    if (rc < 0) break;
    out.insert(out.end(), packet->data, packet->data + packet->size);
    av_packet_unref(packet.get());
  }
  if (rc != AVERROR_EOF) return Internal(std::string("EncodeImage: ") + name + ": " + AvError(rc));
  if (out.empty()) return Internal(std::string("EncodeImage: ") + name + " wrote nothing");
  return out;
}

}  // namespace spdl::media
