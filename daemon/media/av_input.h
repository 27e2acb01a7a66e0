// AvInput: an FFmpeg demuxer (AVFormatContext) reading a whole file held in memory, through an
// AVIOContext over the caller's buffer (no copy, no temporary file), for the audio and video
// decoders. Also the small RAII pieces they share.
//
// Internal to media/. Not thread-safe: one AvInput per decode call, on one thread. It borrows
// the bytes: `data` must stay live and unchanged until the AvInput is destroyed. Move-only.
#pragma once

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
}

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "media/ffmpeg_image.h"  // AvCodecContextPtr, AvFramePtr, AvPacketPtr

namespace spdl::media {

// libavutil's message for an AVERROR code.
std::string AvErrorString(int rc);

class AvInput {
 public:
  // Opens the container in `data` (format probed from the bytes, never from a name) and reads
  // its stream headers. It runs avformat_find_stream_info (which may decode a few packets) only
  // when the headers leave the parameters of a stream of `needed` type incomplete.
  // kDataLoss (with libavformat's message) when the bytes are not a container FFmpeg reads or
  // are cut short in the headers, or (checked first, without libavformat) when a RIFF file (WAV,
  // AVI) has a chunk other than its media data that states more bytes than the file holds, or an
  // MP4/MOV sample table states more entries than its box holds;
  // kResourceExhausted when the buffer is too large for an int.
  // `what` names the kind of media in messages ("audio", "video").
  static Result<AvInput> Open(std::span<const uint8_t> data, AVMediaType needed, const char* what);

  AvInput(AvInput&&) noexcept;
  AvInput& operator=(AvInput&&) noexcept;
  AvInput(const AvInput&) = delete;
  AvInput& operator=(const AvInput&) = delete;
  ~AvInput();

  AVFormatContext* format() const { return format_; }

  // The best stream of `type` (av_find_best_stream), or kDataLoss "no <what> stream".
  Result<AVStream*> BestStream(AVMediaType type, const char* what) const;

  // Opens a decoder for `stream` with one thread (the worker pool gives the parallelism) and
  // libavcodec's own log messages demoted to debug (errors come back as Status).
  // kFailedPrecondition when this FFmpeg has no decoder for the codec.
  static Result<AvCodecContextPtr> OpenDecoder(const AVStream* stream, const char* what);

 private:
  AvInput() = default;
  void Close() noexcept;

  struct Reader;  // the read position over the borrowed buffer
  std::unique_ptr<Reader> reader_;
  AVIOContext* io_ = nullptr;
  AVFormatContext* format_ = nullptr;
};

// How DecodeStream ended: `status` not OK on a read or decode error; `eof` when the stream was read
// to its end (the decoder flushed) rather than stopped by `done`.
struct DecodeLoopEnd {
  Status status;
  bool eof = false;
};

// The demux/decode loop both decoders run: reads packets of `stream_index` from `in` into `decoder`
// and hands every decoded frame to `consume` (which must not keep it: the frame is unreferenced
// after), until `done()` or the end of the stream (then flushes the decoder). `what` names the
// media in messages, e.g. "FLAC audio" -> "corrupt FLAC audio: ...". `packet` and `frame` are the
// caller's reusable buffers.
DecodeLoopEnd DecodeStream(const AvInput& in, AVCodecContext* decoder, int stream_index, const std::string& what,
                           AVPacket* packet, AVFrame* frame, const std::function<bool()>& done,
                           const std::function<Status(AVFrame*)>& consume);

// A stream's timestamps in seconds: (ts - start) * time_base, where start is the stream's
// start_time (0 when unknown), so the first sample or frame of the stream is at about 0.
double StreamSeconds(const AVStream* stream, int64_t ts);

}  // namespace spdl::media
