// VideoDecoder: video bytes (any container and codec FFmpeg reads: MP4/H.264, WebM/VP9, MKV,
// AVI, ...) -> a clip of T frames, each resized to H x W RGB, written straight into the caller's
// buffer as [T, H, W, 3] uint8 (a row of a shared-memory batch slot).
//
// Not thread-safe: use one VideoDecoder per worker thread. It keeps swscale contexts (SwsCache),
// a packet and two frames between calls. Move-only.
//
// Which frames (DecodeInto). Source frames are numbered by their presentation time:
// index = round((pts - stream start) x r), r = the stream's average frame rate. The clip is the
// frames with indices i0 + k x frame_stride (k = 0 .. T-1), or with ops.fps > 0 the frames
// nearest the times t0 + k / fps, i.e. indices i0 + round(k x r / fps) (frames repeat when fps > r).
// A target index with no frame of its own (a variable-rate stream) takes the last frame before it.
//   - i0: round(start_seconds x r) (VideoStart::kFixed), or uniform in [0, F - span]
//     (VideoStart::kRandom), F = the stream's frame count (from the container, else duration x r),
//     span = the clip's extent in source frames; drawn from the sample's seed, so the same
//     (seed, epoch, index) gives the same clip. A video shorter than the span starts at 0.
//   - Seek: when i0 > 0 the demuxer seeks to the keyframe at or before frame i0 and the decoder
//     runs forward from there (frames before i0 are decoded but not converted), instead of
//     decoding from the beginning. If the seek lands after i0 it decodes from the beginning.
//     Decoding stops at the clip's last frame.
//   - Short clip: when the video ends before all T frames, the remaining frames repeat the last
//     frame delivered (or, when the start lies past the end, the video's last frame); the
//     returned count says how many frames are real.
// Each frame is converted and resized in one swscale pass (YUV -> RGB with the frame's range and
// its tagged matrix: BT.709, BT.2020, SMPTE 240M, FCC; untagged frames get BT.601, as in FFmpeg's
// scale filter) into its place in dst; a frame used twice is copied, not converted again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"
#include "media/image_ops.h"  // Interpolation

namespace spdl::media {

enum class VideoStart { kFixed, kRandom };

struct VideoOps {
  int num_frames = 8;    // T
  int frame_stride = 1;  // take every frame_stride-th source frame (when fps is 0)
  double fps = 0;        // > 0: sample at this rate instead of by stride
  VideoStart start = VideoStart::kFixed;
  double start_seconds = 0;  // kFixed only
  int height = 112;          // output frame size: each frame is resized to exactly height x width
  int width = 112;
  // swscale's filter: bilinear, bicubic, area, nearest or lanczos (hamming is read as bilinear; the
  // job config refuses it for video).
  Interpolation interpolation = Interpolation::kBilinear;
  // Guards: refuse a stream whose frames have more pixels than this (from the header, before
  // decoding), and a clip that needs more than max_decoded_frames decoded frames (a long run
  // from a distant keyframe, or a huge stride).
  int64_t max_pixels = 8192 * 8192;
  int64_t max_decoded_frames = 20000;
  // Allow the seek (tests turn it off to compare both ways).
  bool allow_seek = true;
};

// kInvalidArgument naming every bad field (num_frames or sizes < 1, stride < 1, fps < 0,
// start_seconds < 0, guards < 1).
Status ValidateVideoOps(const VideoOps& ops);

// Bytes of one output clip: num_frames * height * width * 3.
size_t VideoOutputBytes(const VideoOps& ops);

// What the decoder found and did for one clip.
struct VideoInfo {
  std::string codec;  // e.g. "h264", "vp9"
  int width = 0;      // source frame size
  int height = 0;
  double frame_rate = 0;       // r, frames per second
  int64_t frame_count = -1;    // F, -1 when unknown
  int64_t first_index = 0;     // i0
  int valid_frames = 0;        // real frames in the clip (the rest repeat the last one)
  int64_t decoded_frames = 0;  // frames the decoder produced for this clip
  bool seeked = false;
};

class VideoDecoder {
 public:
  VideoDecoder();
  ~VideoDecoder();
  VideoDecoder(VideoDecoder&&) noexcept;
  VideoDecoder& operator=(VideoDecoder&&) noexcept;
  VideoDecoder(const VideoDecoder&) = delete;
  VideoDecoder& operator=(const VideoDecoder&) = delete;

  // Decodes one clip from `data` (a whole file) into dst, which must hold VideoOutputBytes(ops)
  // bytes, as [T, H, W, 3] uint8 RGB; returns the number of real frames (0..T; the rest repeat
  // the last; 0 only when the start lies past the end). `sample_seed` draws the random start; unused with
  // VideoStart::kFixed. Errors: kInvalidArgument for bad ops or a null dst; kDataLoss (with FFmpeg's message) for data
  // that is not a video FFmpeg reads, has no video stream, no frame rate, no decodable frame, or is corrupt;
  // kResourceExhausted naming the size (or frame count) and the limit; kFailedPrecondition when this FFmpeg has no
  // decoder for the codec. On error dst may hold partial output. info, when given, is filled as far as decoding got.
  Result<int> DecodeInto(std::span<const uint8_t> data, const VideoOps& ops, uint8_t* dst, uint64_t sample_seed = 0,
                         VideoInfo* info = nullptr);

  // swscale contexts built so far (cache misses), for tests and stats.
  uint64_t sws_contexts_built() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spdl::media
