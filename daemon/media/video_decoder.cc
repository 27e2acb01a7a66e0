#include "media/video_decoder.h"

extern "C" {
#include <libavutil/pixdesc.h>
}

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "media/av_input.h"
#include "media/sample_random.h"
#include "media/sws_cache.h"

namespace spdl::media {
namespace {

// The random start's own stream of the sample's seed (apart from the image transforms').
constexpr RandomStream kVideoStartStream = static_cast<RandomStream>(0x76696465);  // "vide"

int SwsFlags(Interpolation i) {
  int f = SWS_BILINEAR;
  if (i == Interpolation::kBicubic) f = SWS_BICUBIC;
  if (i == Interpolation::kArea) f = SWS_AREA;
  if (i == Interpolation::kNearest) f = SWS_POINT;
  if (i == Interpolation::kLanczos) f = SWS_LANCZOS;
  return f | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_FULL_CHR_H_INP;
}

// FFmpeg's deprecated full-range "J" formats, as the plain format + full range.
AVPixelFormat PlainFormat(AVPixelFormat f, bool* full_range) {
  switch (f) {
    case AV_PIX_FMT_YUVJ420P:
      *full_range = true;
      return AV_PIX_FMT_YUV420P;
    case AV_PIX_FMT_YUVJ422P:
      *full_range = true;
      return AV_PIX_FMT_YUV422P;
    case AV_PIX_FMT_YUVJ444P:
      *full_range = true;
      return AV_PIX_FMT_YUV444P;
    case AV_PIX_FMT_YUVJ440P:
      *full_range = true;
      return AV_PIX_FMT_YUV440P;
    case AV_PIX_FMT_YUVJ411P:
      *full_range = true;
      return AV_PIX_FMT_YUV411P;
    default:
      return f;
  }
}

// The YCbCr matrix a frame's tag asks for (swscale takes AVColorSpace numbers); untagged and
// BT.601 frames keep swscale's default (BT.601), as FFmpeg's own scale filter does.
int ColorMatrix(AVColorSpace cs) {
  switch (cs) {
    case AVCOL_SPC_BT709:
    case AVCOL_SPC_FCC:
    case AVCOL_SPC_SMPTE240M:
    case AVCOL_SPC_BT2020_NCL:
    case AVCOL_SPC_BT2020_CL:
      return cs;
    default:
      return SwsKey::kDefaultColorspace;
  }
}

std::string Pixels(int64_t w, int64_t h) {
  return std::to_string(w) + "x" + std::to_string(h) + " (" + std::to_string(w * h) + " pixels)";
}

}  // namespace

Status ValidateVideoOps(const VideoOps& ops) {
  std::string bad;
  auto add = [&](const std::string& m) { bad += (bad.empty() ? "" : "; ") + m; };
  if (ops.num_frames < 1) add("num_frames must be >= 1 (got " + std::to_string(ops.num_frames) + ")");
  if (ops.frame_stride < 1) add("frame_stride must be >= 1 (got " + std::to_string(ops.frame_stride) + ")");
  if (!(ops.fps >= 0) || !std::isfinite(ops.fps)) add("fps must be >= 0");
  if (!(ops.start_seconds >= 0) || !std::isfinite(ops.start_seconds)) add("start_seconds must be >= 0");
  if (ops.height < 1 || ops.width < 1 || ops.height > 16384 || ops.width > 16384) {
    add("height and width must be in [1, 16384] (got " + std::to_string(ops.height) + "x" + std::to_string(ops.width) +
        ")");
  }
  if (ops.max_pixels < 1) add("max_pixels must be >= 1");
  if (ops.max_decoded_frames < 1) add("max_decoded_frames must be >= 1");
  if (!bad.empty()) return InvalidArgument("bad video ops: " + bad);
  return Status::Ok();
}

size_t VideoOutputBytes(const VideoOps& ops) {
  return static_cast<size_t>(ops.num_frames) * static_cast<size_t>(ops.height) * static_cast<size_t>(ops.width) * 3;
}

struct VideoDecoder::Impl {
  SwsCache sws{8};
  AvPacketPtr packet;
  AvFramePtr frame;
  AvFramePtr prev;  // the last frame decoded before the current one

  struct Pass {
    const VideoOps* ops = nullptr;
    std::vector<int64_t> targets;  // source frame index of each output frame
    double rate = 0;
    bool seek = false;
    uint8_t* dst = nullptr;
    // Results.
    int emitted = 0;
    bool overshoot = false;
  };

  Status Convert(const AVFrame* f, const VideoOps& ops, uint8_t* out);
  Status Run(AvInput& in, AVStream* st, Pass& p, VideoInfo& info);
  Result<int> Decode(std::span<const uint8_t> data, const VideoOps& ops, uint8_t* dst, uint64_t seed, VideoInfo& info);
};

Status VideoDecoder::Impl::Convert(const AVFrame* f, const VideoOps& ops, uint8_t* out) {
  bool full = f->color_range == AVCOL_RANGE_JPEG;
  SwsKey key;
  key.src_format = PlainFormat(static_cast<AVPixelFormat>(f->format), &full);
  key.src_full_range = full;
  key.src_width = f->width;
  key.src_height = f->height;
  key.dst_width = ops.width;
  key.dst_height = ops.height;
  key.dst_format = AV_PIX_FMT_RGB24;
  key.flags = SwsFlags(ops.interpolation);
  key.src_colorspace = ColorMatrix(f->colorspace);
  SwsContext* ctx = sws.Get(key);
  if (ctx == nullptr) {
    const char* name = av_get_pix_fmt_name(static_cast<AVPixelFormat>(f->format));
    return FailedPrecondition(std::string("swscale cannot convert ") + (name ? name : "?") + " " +
                              Pixels(f->width, f->height) + " frames to RGB");
  }
  uint8_t* planes[4] = {out, nullptr, nullptr, nullptr};
  int strides[4] = {ops.width * 3, 0, 0, 0};
  const int rows = sws_scale(ctx, f->data, f->linesize, 0, f->height, planes, strides);
  if (rows != ops.height) return Internal("sws_scale wrote " + std::to_string(rows) + " rows");
  return Status::Ok();
}

Status VideoDecoder::Impl::Run(AvInput& in, AVStream* st, Pass& p, VideoInfo& info) {
  const VideoOps& ops = *p.ops;
  SPDL_ASSIGN_OR_RETURN(AvCodecContextPtr ctx, AvInput::OpenDecoder(st, "video"));
  ctx->max_pixels = ops.max_pixels;
  if (!packet) packet.reset(av_packet_alloc());
  if (!frame) frame.reset(av_frame_alloc());
  if (!prev) prev.reset(av_frame_alloc());
  if (!packet || !frame || !prev) return ResourceExhausted("av_packet_alloc/av_frame_alloc: out of memory");
  av_frame_unref(prev.get());
  const int64_t first = p.targets.front();
  if (p.seek) {
    // Frame i is shown from (i - 0.5) / r on (by the rounding above): aim just before that.
    const double target = (static_cast<double>(first) - 0.5) / p.rate;
    const int64_t origin = st->start_time == AV_NOPTS_VALUE ? 0 : st->start_time;
    const int64_t ts = origin + static_cast<int64_t>(std::floor(target / av_q2d(st->time_base)));
    if (av_seek_frame(in.format(), st->index, ts, AVSEEK_FLAG_BACKWARD) < 0) {
      p.overshoot = true;
      return Status::Ok();
    }
    info.seeked = true;
  }

  const size_t frame_bytes = static_cast<size_t>(ops.height) * ops.width * 3;
  const int total = static_cast<int>(p.targets.size());
  p.emitted = 0;
  info.decoded_frames = 0;
  int64_t last_converted_pts = AV_NOPTS_VALUE;
  bool have_prev = false;
  int64_t prev_index = -1;
  int64_t counter = -1;  // index for frames without a timestamp

  auto emit = [&](const AVFrame* f) -> Status {
    uint8_t* out = p.dst + p.emitted * frame_bytes;
    const int64_t pts = f->best_effort_timestamp;
    if (p.emitted > 0 && pts != AV_NOPTS_VALUE && pts == last_converted_pts) {
      std::memcpy(out, out - frame_bytes, frame_bytes);
    } else {
      SPDL_RETURN_IF_ERROR(Convert(f, ops, out));
      last_converted_pts = pts;
    }
    ++p.emitted;
    return Status::Ok();
  };

  auto consume = [&](AVFrame* f) -> Status {
    if (int64_t{f->width} * f->height > ops.max_pixels) {
      return ResourceExhausted("video frame of " + Pixels(f->width, f->height) + " is over the limit of " +
                               std::to_string(ops.max_pixels) + " pixels");
    }
    if (++info.decoded_frames > ops.max_decoded_frames) {
      return ResourceExhausted("the clip needs more than " + std::to_string(ops.max_decoded_frames) +
                               " decoded frames (the limit)");
    }
    const int64_t pts = f->best_effort_timestamp;
    int64_t index = pts == AV_NOPTS_VALUE ? counter + 1 : std::llround(StreamSeconds(st, pts) * p.rate);
    if (have_prev && index <= prev_index) index = prev_index;  // keep the order monotonic
    counter = index;
    if (!have_prev && p.seek && index > first) {  // the seek landed after the start
      p.overshoot = true;
      return Status::Ok();
    }
    // Targets before this frame show the previous one; targets at it show it.
    while (p.emitted < total && p.targets[p.emitted] < index) {
      SPDL_RETURN_IF_ERROR(emit(have_prev ? prev.get() : f));
    }
    while (p.emitted < total && p.targets[p.emitted] == index) SPDL_RETURN_IF_ERROR(emit(f));
    av_frame_unref(prev.get());
    av_frame_move_ref(prev.get(), f);
    have_prev = true;
    prev_index = index;
    return Status::Ok();
  };

  auto done = [&] { return p.overshoot || p.emitted >= total; };
  Status status =
      DecodeStream(in, ctx.get(), st->index, info.codec + " video", packet.get(), frame.get(), done, consume).status;
  av_packet_unref(packet.get());
  av_frame_unref(frame.get());
  SPDL_RETURN_IF_ERROR(status);
  if (p.overshoot || p.emitted >= total) return Status::Ok();
  // The video ended first.
  info.valid_frames = p.emitted;
  if (p.emitted == 0) {
    if (!have_prev) return DataLoss("no " + info.codec + " video frame could be decoded");
    SPDL_RETURN_IF_ERROR(Convert(prev.get(), ops, p.dst));  // the start lies past the end
    p.emitted = 1;
  }
  for (int k = p.emitted; k < total; ++k)
    std::memcpy(p.dst + k * frame_bytes, p.dst + (k - 1) * frame_bytes, frame_bytes);
  p.emitted = total;
  return Status::Ok();
}

Result<int> VideoDecoder::Impl::Decode(std::span<const uint8_t> data, const VideoOps& ops, uint8_t* dst, uint64_t seed,
                                       VideoInfo& info) {
  SPDL_ASSIGN_OR_RETURN(AvInput in, AvInput::Open(data, AVMEDIA_TYPE_VIDEO, "video"));
  SPDL_ASSIGN_OR_RETURN(AVStream * st, in.BestStream(AVMEDIA_TYPE_VIDEO, "video"));
  const AVCodecParameters* par = st->codecpar;
  info.codec = avcodec_get_name(par->codec_id);
  info.width = par->width;
  info.height = par->height;
  if (int64_t{par->width} * par->height > ops.max_pixels) {
    return ResourceExhausted("video frames of " + Pixels(par->width, par->height) + " are over the limit of " +
                             std::to_string(ops.max_pixels) + " pixels");
  }
  AVRational r = st->avg_frame_rate;
  if (r.num <= 0 || r.den <= 0) r = av_guess_frame_rate(in.format(), st, nullptr);
  if (r.num <= 0 || r.den <= 0) return DataLoss("the " + info.codec + " video has no frame rate");
  const double rate = av_q2d(r);
  info.frame_rate = rate;
  if (st->nb_frames > 0) {
    info.frame_count = st->nb_frames;
  } else if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
    info.frame_count = std::llround(static_cast<double>(st->duration) * av_q2d(st->time_base) * rate);
  } else if (in.format()->duration != AV_NOPTS_VALUE && in.format()->duration > 0) {
    info.frame_count = std::llround(static_cast<double>(in.format()->duration) / AV_TIME_BASE * rate);
  }

  const int t = ops.num_frames;
  std::vector<int64_t> offsets(t);
  for (int k = 0; k < t; ++k) {
    offsets[k] = ops.fps > 0 ? std::llround(k * rate / ops.fps) : int64_t{k} * ops.frame_stride;
  }
  const int64_t span = offsets.back() + 1;
  int64_t first = 0;
  if (ops.start == VideoStart::kFixed) {
    first = std::llround(ops.start_seconds * rate);
  } else if (info.frame_count > span) {
    SampleRng rng(seed, kVideoStartStream);
    first = rng.UniformInt(0, info.frame_count - span);
  }
  info.first_index = first;
  Pass p;
  p.ops = &ops;
  p.rate = rate;
  p.dst = dst;
  p.targets.resize(t);
  for (int k = 0; k < t; ++k) p.targets[k] = first + offsets[k];
  p.seek = ops.allow_seek && first > 0;
  info.valid_frames = t;
  SPDL_RETURN_IF_ERROR(Run(in, st, p, info));
  if (p.overshoot) {
    p.seek = false;
    p.overshoot = false;
    info.seeked = false;
    info.valid_frames = t;
    SPDL_ASSIGN_OR_RETURN(AvInput again, AvInput::Open(data, AVMEDIA_TYPE_VIDEO, "video"));
    SPDL_ASSIGN_OR_RETURN(AVStream * st2, again.BestStream(AVMEDIA_TYPE_VIDEO, "video"));
    SPDL_RETURN_IF_ERROR(Run(again, st2, p, info));
  }
  av_frame_unref(prev.get());
  return info.valid_frames;
}

VideoDecoder::VideoDecoder() : impl_(std::make_unique<Impl>()) {}
VideoDecoder::~VideoDecoder() = default;
VideoDecoder::VideoDecoder(VideoDecoder&&) noexcept = default;
VideoDecoder& VideoDecoder::operator=(VideoDecoder&&) noexcept = default;

uint64_t VideoDecoder::sws_contexts_built() const { return impl_->sws.builds(); }

Result<int> VideoDecoder::DecodeInto(std::span<const uint8_t> data, const VideoOps& ops, uint8_t* dst,
                                     uint64_t sample_seed, VideoInfo* info) {
  SPDL_RETURN_IF_ERROR(ValidateVideoOps(ops));
  if (dst == nullptr) return InvalidArgument("video decode: null destination");
  VideoInfo local;
  VideoInfo& out = info != nullptr ? *info : local;
  out = VideoInfo{};
  return impl_->Decode(data, ops, dst, sample_seed, out);
}

}  // namespace spdl::media
