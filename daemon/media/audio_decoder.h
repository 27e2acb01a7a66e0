// AudioDecoder: audio bytes (any container and codec FFmpeg reads: WAV, FLAC, MP3, Ogg/Opus,
// Vorbis, AAC in MP4, ...) -> a fixed-length clip at a chosen sample rate and channel count,
// written straight into the caller's buffer (a row of a shared-memory batch slot).
//
// Not thread-safe: use one AudioDecoder per worker thread. It keeps a resampler (libswresample),
// a packet, a frame and a small scratch buffer between calls. Move-only.
//
// How it decodes (DecodeInto):
//   1. Opens the container from memory (av_input.h), picks the best audio stream, refuses a
//      source whose stated duration is over ops.max_duration_seconds before decoding anything.
//   2. Chooses where the clip starts, in output samples: 0 (AudioCrop::kStart), or uniformly in
//      [0, total - num_samples] (AudioCrop::kRandom), total = the stated duration x sample_rate,
//      drawn from the sample's seed, so the same (seed, epoch, index) gives the same clip.
//   3. A start later than kSeekMinSeconds: seeks (to a packet at or before start - kSeekPreroll,
//      so lossy decoders have settled) instead of decoding from the beginning; the position is
//      then known from the first frame's timestamp. If the demuxer lands after the start, it
//      decodes from the beginning instead.
//   4. Decodes, converts with libswresample (sample format, rate and channel layout: mono from
//      stereo is (L + R) / 2, stereo from mono is the signal in both channels, a layout without
//      channel positions (9 channels and no mask, say) gives each output channel the mean of all,
//      other layouts get swresample's default matrix scaled so that no output exceeds full scale; note that
//      `ffmpeg -ac N` mixes at 1/sqrt(2) instead), drops the output before the start, and writes the rest
//      straight into dst until num_samples are there; then stops decoding. After a seek the
//      resampler starts on a source sample that lies on the output sample grid, so a clip is the
//      same (within the resampler's filter precision) whether reached by a seek or not.
//   5. A source that ends first: the resampler is flushed and the rest is zero (padding).
// Timeline: output sample 0 is the stream's first sample (its start_time; for MP3 the encoder
// delay that FFmpeg skips is not part of it).
// Without a stated duration (rare: some raw streams), a random crop decodes the whole source
// (still bounded by max_duration_seconds) to learn its length, then crops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace spdl::media {

enum class AudioDType { kFloat32, kInt16 };  // float in [-1, 1]; int16 full scale
enum class AudioLayout {
  kChannelsFirst,  // [C, T]: each channel's samples together (torchaudio's layout)
  kChannelsLast,   // [T, C]: interleaved
};
enum class AudioCrop { kStart, kRandom };

struct AudioOps {
  // Output sample rate in Hz; the source is resampled to it.
  int sample_rate = 16000;
  // Output channels: 1 (mono; multi-channel sources are downmixed) or 2 (stereo), mixed as in
  // step 4 above.
  int channels = 1;
  // Output length per channel: the clip is cropped or zero-padded to exactly this many samples.
  int64_t num_samples = 16000;
  // Where the clip starts: the beginning, or uniformly at random within the source.
  AudioCrop crop = AudioCrop::kStart;
  AudioDType dtype = AudioDType::kFloat32;
  AudioLayout layout = AudioLayout::kChannelsFirst;
  // Guard: refuse a source longer than this (from its header; or once this much has been decoded
  // when the header does not say), and any source with more than max_channels (<= 64) channels.
  double max_duration_seconds = 3 * 3600.0;
  int max_channels = 64;
  // Allow the seek of step 3 (tests turn it off to compare both ways).
  bool allow_seek = true;
};

// Starts earlier than this are reached by decoding from the beginning (cheaper than a seek).
inline constexpr double kSeekMinSeconds = 1.0;
// How far before the start a seek aims, so that MP3's bit reservoir or Opus's pre-roll has
// settled by the first kept sample.
inline constexpr double kSeekPrerollSeconds = 0.25;

// kInvalidArgument naming every bad field (rate outside [1, 768000], channels not 1 or 2,
// num_samples < 1 or over 2^31, bad guard values).
Status ValidateAudioOps(const AudioOps& ops);

// Bytes of one output clip: num_samples * channels * (4 or 2).
size_t AudioOutputBytes(const AudioOps& ops);

// What the decoder found and did for one clip.
struct AudioInfo {
  std::string codec;    // e.g. "mp3", "flac", "pcm_s16le"
  int source_rate = 0;  // Hz
  int source_channels = 0;
  double duration_seconds = -1;  // stated by the container; -1 when unknown
  int64_t start_sample = 0;      // where the clip starts, in output samples
  int64_t valid_samples = 0;     // samples of real audio in the clip (the rest is padding)
  bool seeked = false;           // reached the start by seeking
};

class AudioDecoder {
 public:
  // Cheap and never fails; everything is created on first use.
  AudioDecoder();
  ~AudioDecoder();
  AudioDecoder(AudioDecoder&&) noexcept;
  AudioDecoder& operator=(AudioDecoder&&) noexcept;
  AudioDecoder(const AudioDecoder&) = delete;
  AudioDecoder& operator=(const AudioDecoder&) = delete;

  // Decodes one clip from `data` (a whole file) into dst, which must hold AudioOutputBytes(ops)
  // bytes; returns the number of valid samples per channel (<= num_samples; the rest of each
  // channel is zero), for the batch's lengths tensor. `sample_seed` (SampleSeed of the job seed,
  // epoch and sample index) draws the random start; it is unused with AudioCrop::kStart.
  // Errors: kInvalidArgument for bad ops or a null dst; kDataLoss (with FFmpeg's message) for
  // data that is not audio FFmpeg reads, has no audio stream, is corrupt, or states a sample rate
  // over 768000 Hz (the highest the resampler is set up for); kResourceExhausted
  // naming the duration (or channel count) and the limit; kFailedPrecondition when this FFmpeg
  // has no decoder for the codec. On error dst may hold partial output. info, when given, is
  // filled as far as decoding got.
  Result<int64_t> DecodeInto(std::span<const uint8_t> data, const AudioOps& ops, void* dst, uint64_t sample_seed = 0,
                             AudioInfo* info = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace spdl::media
