#include "media/audio_decoder.h"

extern "C" {
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
#include <libavutil/samplefmt.h>
#include <libswresample/swresample.h>
}

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "media/av_input.h"
#include "media/sample_random.h"

namespace spdl::media {
namespace {

struct SwrDeleter {
  void operator()(SwrContext* s) const noexcept { swr_free(&s); }
};
using SwrPtr = std::unique_ptr<SwrContext, SwrDeleter>;

// The random start's own stream of the sample's seed (apart from the image transforms').
constexpr RandomStream kAudioStartStream = static_cast<RandomStream>(0x61756469);  // "audi"

constexpr int64_t kMaxOutputSamples = int64_t{1} << 31;
// The highest sample rate, of the output or of a source: a header can state any int, and
// libswresample fails (ENOMEM, after trying to allocate gigabytes of filter) on absurd ratios
// (tests/fuzz/audio_fuzz found an 84 MHz WAV).
constexpr int kMaxSampleRate = 768000;
constexpr int kScratchSamples = 4096;  // per channel, for output that is dropped
constexpr int kTailSamples = 64;       // the clip's last samples per channel go through scratch

size_t SampleBytes(AudioDType d) { return d == AudioDType::kFloat32 ? 4 : 2; }

AVSampleFormat OutFormat(const AudioOps& ops) {
  const bool planar = ops.layout == AudioLayout::kChannelsFirst;
  if (ops.dtype == AudioDType::kFloat32) return planar ? AV_SAMPLE_FMT_FLTP : AV_SAMPLE_FMT_FLT;
  return planar ? AV_SAMPLE_FMT_S16P : AV_SAMPLE_FMT_S16;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

// The channel mix, set before swr_init: mono from stereo is the mean of the two, stereo from
// mono is the same signal in both, a layout without channel positions gives the mean of all its
// channels; anything else is swresample's default matrix, scaled down where needed so that no
// output can exceed full scale (rematrix_maxval = 1).
int SetMixing(SwrContext* s, const AVChannelLayout& in, const AVChannelLayout& out) {
  if (in.nb_channels == 2 && out.nb_channels == 1) {
    const double m[2] = {0.5, 0.5};
    return swr_set_matrix(s, m, 2);
  }
  if (in.nb_channels == 1 && out.nb_channels == 2) {
    const double m[2] = {1.0, 1.0};
    return swr_set_matrix(s, m, 1);
  }
  if (in.order == AV_CHANNEL_ORDER_UNSPEC) {
    // No channel positions to mix by (say 9 channels and no channel mask: swresample has no
    // default matrix and swr_init fails): every output channel is the mean of all of them.
    const std::vector<double> m(static_cast<size_t>(out.nb_channels) * in.nb_channels, 1.0 / in.nb_channels);
    return swr_set_matrix(s, m.data(), in.nb_channels);
  }
  return av_opt_set_double(s, "rematrix_maxval", 1.0, 0);
}

}  // namespace

Status ValidateAudioOps(const AudioOps& ops) {
  std::string bad;
  auto add = [&](const std::string& m) { bad += (bad.empty() ? "" : "; ") + m; };
  if (ops.sample_rate < 1 || ops.sample_rate > kMaxSampleRate) {
    add("sample_rate must be in [1, 768000] (got " + std::to_string(ops.sample_rate) + ")");
  }
  if (ops.channels != 1 && ops.channels != 2) add("channels must be 1 or 2 (got " + std::to_string(ops.channels) + ")");
  if (ops.num_samples < 1 || ops.num_samples > kMaxOutputSamples) {
    add("num_samples must be in [1, 2^31] (got " + std::to_string(ops.num_samples) + ")");
  }
  if (!(ops.max_duration_seconds > 0)) add("max_duration_seconds must be > 0");
  if (ops.max_channels < 1 || ops.max_channels > 64) add("max_channels must be in [1, 64] (libswresample's limit)");
  if (!bad.empty()) return InvalidArgument("bad audio ops: " + bad);
  return Status::Ok();
}

size_t AudioOutputBytes(const AudioOps& ops) {
  return static_cast<size_t>(ops.num_samples) * static_cast<size_t>(ops.channels) * SampleBytes(ops.dtype);
}

struct AudioDecoder::Impl {
  // Reused between calls (per thread).
  SwrPtr swr;
  std::string swr_key;  // the conversion swr is set up for
  AvPacketPtr packet;
  AvFramePtr frame;
  std::vector<uint8_t> scratch;           // output that is dropped (before the start)
  std::vector<uint8_t> whole;             // the whole source, when the start can only be chosen afterwards
  std::vector<const uint8_t*> in_planes;  // a frame's data from an offset

  // One decode pass: from the beginning, or from a seek.
  struct Pass {
    const AudioOps* ops = nullptr;
    int64_t start = 0;  // output sample where the clip starts; < 0: keep everything (`whole`)
    bool seek = false;
    uint8_t* dst = nullptr;  // the clip (ignored when start < 0)
    // Results.
    int64_t written = 0;     // output samples per channel written
    bool overshoot = false;  // the seek landed after the start: redo from the beginning
  };

  // REQUIRES: `in` is freshly opened (nothing read yet) and st is its audio stream.
  Status Run(AvInput& in, AVStream* st, Pass& p, AudioInfo& info);
  Result<int64_t> Decode(std::span<const uint8_t> data, const AudioOps& ops, uint8_t* dst, uint64_t seed,
                         AudioInfo& info);
};

Status AudioDecoder::Impl::Run(AvInput& in, AVStream* st, Pass& p, AudioInfo& info) {
  const AudioOps& ops = *p.ops;
  SPDL_ASSIGN_OR_RETURN(AvCodecContextPtr ctx, AvInput::OpenDecoder(st, "audio"));
  if (!packet) packet.reset(av_packet_alloc());
  if (!frame) frame.reset(av_frame_alloc());
  if (!packet || !frame) return ResourceExhausted("av_packet_alloc/av_frame_alloc: out of memory");

  if (p.seek) {
    const double target = static_cast<double>(p.start) / ops.sample_rate - kSeekPrerollSeconds;
    const int64_t origin = st->start_time == AV_NOPTS_VALUE ? 0 : st->start_time;
    const int64_t ts = origin + static_cast<int64_t>(std::floor(target / av_q2d(st->time_base)));
    if (av_seek_frame(in.format(), st->index, ts, AVSEEK_FLAG_BACKWARD) < 0) {
      p.overshoot = true;  // cannot seek here: decode from the beginning
      return Status::Ok();
    }
    info.seeked = true;
  }

  const bool keep_all = p.start < 0;
  const int out_channels = ops.channels;
  const size_t es = SampleBytes(ops.dtype);
  const bool planar = !keep_all && ops.layout == AudioLayout::kChannelsFirst;
  const AVSampleFormat out_fmt = keep_all ? av_get_packed_sample_fmt(OutFormat(ops)) : OutFormat(ops);
  const int64_t capacity = keep_all ? INT64_MAX : ops.num_samples;
  int64_t skip = -1;     // output samples still to drop; -1 until the first frame places the stream
  int64_t src_skip = 0;  // source samples still to drop (after a seek, to reach the output grid)
  int64_t decoded = 0;   // source samples decoded, for the guard
  bool swr_ready = false;
  AVChannelLayout in_layout{};
  int in_format = -1, in_rate = 0;
  p.written = 0;

  auto out_ptrs = [&](uint8_t** ptrs) {
    if (keep_all) {
      ptrs[0] = whole.data() + p.written * out_channels * es;
    } else if (planar) {
      for (int c = 0; c < out_channels; ++c) ptrs[c] = p.dst + (c * ops.num_samples + p.written) * es;
    } else {
      ptrs[0] = p.dst + p.written * out_channels * es;
    }
  };

  // Feeds `count` source samples (in == nullptr: flush the resampler) and takes its output:
  // dropped while skip > 0, then into the clip until it is full.
  auto push = [&](const uint8_t** in, int count) -> Status {
    const uint8_t** drain = in;  // later calls: same pointers, no samples (nullptr keeps flushing)
    auto convert = [&](uint8_t** out, int room) {
      const int got = swr_convert(swr.get(), out, room, in, count);
      in = drain;
      count = 0;
      return got;
    };
    while (skip > 0) {
      const int room = static_cast<int>(std::min<int64_t>(skip, kScratchSamples));
      uint8_t* ptrs[2] = {scratch.data(), scratch.data() + kScratchSamples * es};
      const int got = convert(ptrs, room);
      if (got < 0) return Internal("swr_convert: " + AvErrorString(got));
      skip -= got;
      if (got == 0) return Status::Ok();
    }
    while (p.written < capacity) {
      const int64_t left = capacity - p.written;
      if (!keep_all && left <= kTailSamples) {
        // The clip's last samples go through scratch: libswresample's vector converters may store
        // past the `room` they were given (seen: one int16 sample past the end of the second
        // plane, 22.05 kHz stereo -> 8 kHz stereo int16), which in a batch is the next row.
        uint8_t* tail[2] = {scratch.data(), scratch.data() + kScratchSamples * es};
        const int got = convert(tail, static_cast<int>(left));
        if (got < 0) return Internal("swr_convert: " + AvErrorString(got));
        const int64_t n = std::min<int64_t>(got, left);
        uint8_t* ptrs[2];
        out_ptrs(ptrs);
        if (planar) {
          for (int c = 0; c < out_channels; ++c) std::memcpy(ptrs[c], tail[c], n * es);
        } else {
          std::memcpy(ptrs[0], tail[0], n * out_channels * es);
        }
        p.written += n;
        if (got == 0) break;
        continue;
      }
      int room;
      if (keep_all) {
        room = swr_get_out_samples(swr.get(), count) + 32;
        whole.resize((p.written + room) * out_channels * es);
      } else {
        room = static_cast<int>(std::min<int64_t>(left - kTailSamples, INT32_MAX / 8));  // the tail: above
      }
      uint8_t* ptrs[2];
      out_ptrs(ptrs);
      const int got = convert(ptrs, room);
      if (got < 0) return Internal("swr_convert: " + AvErrorString(got));
      p.written += got;
      if (got == 0) break;
    }
    return Status::Ok();
  };

  auto consume = [&](AVFrame* f) -> Status {
    AVChannelLayout layout{};
    if (f->ch_layout.order == AV_CHANNEL_ORDER_UNSPEC) {
      av_channel_layout_default(&layout, f->ch_layout.nb_channels);
    } else if (av_channel_layout_copy(&layout, &f->ch_layout) < 0) {
      return ResourceExhausted("av_channel_layout_copy: out of memory");
    }
    if (layout.nb_channels < 1 || layout.nb_channels > ops.max_channels) {
      av_channel_layout_uninit(&layout);
      return ResourceExhausted("audio with " + std::to_string(f->ch_layout.nb_channels) +
                               " channels, over the limit of " + std::to_string(ops.max_channels));
    }
    if (f->sample_rate <= 0 || f->sample_rate > kMaxSampleRate) {
      av_channel_layout_uninit(&layout);
      return DataLoss(f->sample_rate <= 0 ? std::string("audio frame without a sample rate")
                                          : "audio frame at " + std::to_string(f->sample_rate) +
                                                " Hz, over the highest sample rate (768000 Hz)");
    }
    if (!swr_ready) {
      AVChannelLayout out_layout{};
      av_channel_layout_default(&out_layout, out_channels);
      // The same conversion as the last clip: re-initialise (clears what the last clip left
      // buffered, keeps the mix); otherwise a fresh context.
      char desc[128] = {};
      av_channel_layout_describe(&layout, desc, sizeof(desc));
      const std::string key = std::string(desc) + "/" + std::to_string(f->format) + "/" +
                              std::to_string(f->sample_rate) + "->" + std::to_string(out_fmt) + "/" +
                              std::to_string(ops.sample_rate) + "/" + std::to_string(out_channels);
      int rc = 0;
      if (!swr || key != swr_key) {
        swr_key.clear();
        SwrContext* s = nullptr;
        rc = swr_alloc_set_opts2(&s, &out_layout, out_fmt, ops.sample_rate, &layout,
                                 static_cast<AVSampleFormat>(f->format), f->sample_rate, 0, nullptr);
        swr.reset(s);
        if (rc >= 0) rc = SetMixing(swr.get(), layout, out_layout);
      }
      if (rc >= 0) rc = swr_init(swr.get());
      if (rc >= 0) swr_key = key;
      if (rc < 0) {
        av_channel_layout_uninit(&layout);
        return Internal("cannot set up the resampler: " + AvErrorString(rc));
      }
      swr_ready = true;
      in_layout = layout;
      in_format = f->format;
      in_rate = f->sample_rate;
      info.source_rate = in_rate;
      info.source_channels = layout.nb_channels;
      scratch.resize(kScratchSamples * es * out_channels);
    } else {
      const bool same =
          av_channel_layout_compare(&layout, &in_layout) == 0 && f->format == in_format && f->sample_rate == in_rate;
      av_channel_layout_uninit(&layout);
      if (!same) return DataLoss("the audio format changes in the middle of the stream");
    }
    decoded += f->nb_samples;
    if (static_cast<double>(decoded) > ops.max_duration_seconds * in_rate) {
      return ResourceExhausted("audio longer than the limit of " + Seconds(ops.max_duration_seconds));
    }
    if (skip < 0) {
      if (keep_all || !p.seek) {
        skip = keep_all ? 0 : p.start;
      } else {
        const int64_t pts = f->best_effort_timestamp;
        if (pts == AV_NOPTS_VALUE) {
          p.overshoot = true;
          return Status::Ok();
        }
        // Start the resampler on a source sample that falls on the output grid (a multiple of
        // in_rate / gcd(in_rate, out_rate)), so its output samples sit where a decode from the
        // beginning puts them: a clip is then the same whether reached by a seek or not.
        const int64_t at_src = std::llround(StreamSeconds(st, pts) * in_rate);
        const int64_t g = std::gcd(int64_t{in_rate}, int64_t{ops.sample_rate});
        const int64_t period = in_rate / g;
        const int64_t aligned = at_src <= 0 ? 0 : (at_src + period - 1) / period * period;
        const int64_t at = aligned / period * (ops.sample_rate / g);
        if (at_src < 0 || at > p.start) {
          p.overshoot = true;
          return Status::Ok();
        }
        src_skip = aligned - at_src;
        skip = p.start - at;
      }
    }
    int offset = 0;
    if (src_skip > 0) {
      if (src_skip >= f->nb_samples) {
        src_skip -= f->nb_samples;
        return Status::Ok();
      }
      offset = static_cast<int>(src_skip);
      src_skip = 0;
    }
    if (offset == 0) return push(const_cast<const uint8_t**>(f->extended_data), f->nb_samples);
    const auto format = static_cast<AVSampleFormat>(f->format);
    const int bps = av_get_bytes_per_sample(format);
    const bool in_planar = av_sample_fmt_is_planar(format);
    in_planes.assign(in_planar ? f->ch_layout.nb_channels : 1, nullptr);
    for (size_t c = 0; c < in_planes.size(); ++c) {
      in_planes[c] =
          f->extended_data[c] + static_cast<size_t>(offset) * bps * (in_planar ? 1 : f->ch_layout.nb_channels);
    }
    return push(in_planes.data(), f->nb_samples - offset);
  };

  auto done = [&] { return p.overshoot || p.written >= capacity; };
  DecodeLoopEnd end =
      DecodeStream(in, ctx.get(), st->index, info.codec + " audio", packet.get(), frame.get(), done, consume);
  Status status = std::move(end.status);
  const bool eof = end.eof;
  if (status.ok() && eof && swr_ready && !done() && skip >= 0) status = push(nullptr, 0);  // the resampler's tail
  av_channel_layout_uninit(&in_layout);
  av_packet_unref(packet.get());
  av_frame_unref(frame.get());
  return status;
}

Result<int64_t> AudioDecoder::Impl::Decode(std::span<const uint8_t> data, const AudioOps& ops, uint8_t* dst,
                                           uint64_t seed, AudioInfo& info) {
  const int64_t n = ops.num_samples;
  const size_t es = SampleBytes(ops.dtype);
  const int ch = ops.channels;
  SPDL_ASSIGN_OR_RETURN(AvInput in, AvInput::Open(data, AVMEDIA_TYPE_AUDIO, "audio"));
  SPDL_ASSIGN_OR_RETURN(AVStream * st, in.BestStream(AVMEDIA_TYPE_AUDIO, "audio"));
  {
    // The header's figures, checked before any decoding.
    const AVCodecParameters* par = st->codecpar;
    info.codec = avcodec_get_name(par->codec_id);
    info.source_rate = par->sample_rate;
    info.source_channels = par->ch_layout.nb_channels;
    if (par->ch_layout.nb_channels > ops.max_channels) {
      return ResourceExhausted("audio with " + std::to_string(par->ch_layout.nb_channels) +
                               " channels, over the limit of " + std::to_string(ops.max_channels));
    }
    if (par->sample_rate > kMaxSampleRate) {
      return DataLoss(info.codec + " audio at " + std::to_string(par->sample_rate) +
                      " Hz, over the highest sample rate (768000 Hz)");
    }
    if (st->duration != AV_NOPTS_VALUE && st->duration > 0) {
      info.duration_seconds = static_cast<double>(st->duration) * av_q2d(st->time_base);
    } else if (in.format()->duration != AV_NOPTS_VALUE && in.format()->duration > 0) {
      info.duration_seconds = static_cast<double>(in.format()->duration) / AV_TIME_BASE;
    }
    if (info.duration_seconds > ops.max_duration_seconds) {
      return ResourceExhausted("audio of " + Seconds(info.duration_seconds) + " is over the limit of " +
                               Seconds(ops.max_duration_seconds));
    }
  }
  SampleRng rng(seed, kAudioStartStream);

  if (ops.crop == AudioCrop::kRandom && info.duration_seconds < 0) {
    // No stated duration: decode it all, then crop.
    Pass p;
    p.ops = &ops;
    p.start = -1;
    SPDL_RETURN_IF_ERROR(Run(in, st, p, info));
    const int64_t total = p.written;
    const int64_t start = total > n ? rng.UniformInt(0, total - n) : 0;
    const int64_t valid = std::min(n, total - start);
    info.start_sample = start;
    const uint8_t* src = whole.data() + start * ch * es;
    if (ops.layout == AudioLayout::kChannelsLast) {
      std::memcpy(dst, src, valid * ch * es);
      std::memset(dst + valid * ch * es, 0, (n - valid) * ch * es);
    } else {
      for (int c = 0; c < ch; ++c) {
        uint8_t* plane = dst + c * n * es;
        for (int64_t i = 0; i < valid; ++i) std::memcpy(plane + i * es, src + (i * ch + c) * es, es);
        std::memset(plane + valid * es, 0, (n - valid) * es);
      }
    }
    if (whole.capacity() > (size_t{64} << 20)) std::vector<uint8_t>().swap(whole);
    info.valid_samples = valid;
    return valid;
  }

  int64_t start = 0;
  if (ops.crop == AudioCrop::kRandom) {
    const auto total = static_cast<int64_t>(std::floor(info.duration_seconds * ops.sample_rate));
    if (total > n) start = rng.UniformInt(0, total - n);
  }
  info.start_sample = start;
  Pass p;
  p.ops = &ops;
  p.start = start;
  p.dst = dst;
  p.seek = ops.allow_seek && start > kSeekMinSeconds * ops.sample_rate;
  SPDL_RETURN_IF_ERROR(Run(in, st, p, info));
  if (p.overshoot) {  // the seek could not place the start: from the beginning, on a fresh demuxer
    p.seek = false;
    p.overshoot = false;
    info.seeked = false;
    SPDL_ASSIGN_OR_RETURN(AvInput again, AvInput::Open(data, AVMEDIA_TYPE_AUDIO, "audio"));
    SPDL_ASSIGN_OR_RETURN(AVStream * st2, again.BestStream(AVMEDIA_TYPE_AUDIO, "audio"));
    SPDL_RETURN_IF_ERROR(Run(again, st2, p, info));
  }
  const int64_t valid = std::min(p.written, n);
  if (ops.layout == AudioLayout::kChannelsLast) {
    std::memset(dst + valid * ch * es, 0, (n - valid) * ch * es);
  } else {
    for (int c = 0; c < ch; ++c) std::memset(dst + (c * n + valid) * es, 0, (n - valid) * es);
  }
  info.valid_samples = valid;
  return valid;
}

AudioDecoder::AudioDecoder() : impl_(std::make_unique<Impl>()) {}
AudioDecoder::~AudioDecoder() = default;
AudioDecoder::AudioDecoder(AudioDecoder&&) noexcept = default;
AudioDecoder& AudioDecoder::operator=(AudioDecoder&&) noexcept = default;

Result<int64_t> AudioDecoder::DecodeInto(std::span<const uint8_t> data, const AudioOps& ops, void* dst,
                                         uint64_t sample_seed, AudioInfo* info) {
  SPDL_RETURN_IF_ERROR(ValidateAudioOps(ops));
  if (dst == nullptr) return InvalidArgument("audio decode: null destination");
  AudioInfo local;
  AudioInfo& out = info != nullptr ? *info : local;
  out = AudioInfo{};
  return impl_->Decode(data, ops, static_cast<uint8_t*>(dst), sample_seed, out);
}

}  // namespace spdl::media
