// Conformance of media/'s audio and video decoders against real files made at test time by the
// `ffmpeg` command line (a test dependency, scripts/install-deps.sh), with FFmpeg's own command
// line as the reference where one exists.
//
// Audio: tones of known frequency and amplitude (aevalsrc, so the expected value of every sample
// is known in closed form), written as WAV, FLAC, MP3, Opus, AAC and Vorbis.
//   - WAV and FLAC at the output rate: exact (the int16 samples `ffmpeg -f s16le` gives).
//   - Resampling and channel mixing: against `ffmpeg -af pan=... -ar R -f f32le` (the same
//     libswresample, the same mix), max abs diff kMaxResampleDiff.
//   - MP3, Opus, AAC (MP4) and Vorbis (Ogg): against the analytic tone, RMS error
//     kMaxLossyRmsError (the tone's RMS is 0.354), which also fails if the timeline is off by more
//     than a few samples, with or without a seek.
//   - Crops: a crop (from the start, random, reached with or without a seek) is the
//     corresponding slice of the whole decode: exact without resampling, within
//     kMaxSeekResampleDiff with it (the resampler's filter restarts at the seek point).
// Video: a "frame counter" video whose frame n is a flat grey of luma 16 + 2n (so the index of
// any decoded frame can be read back from its pixels) and a testsrc2 pattern, as H.264 in MP4
// and VP9 in WebM, one keyframe every 25 frames.
//   - The frame chosen for each output position (start, stride, fps, seek or no seek) is the
//     expected one, exactly.
//   - Resized frames: against `ffmpeg -vf select,scale` with the same swscale flags, mean abs
//     diff kMaxVideoMeanAbsDiff levels; a BT.709-tagged stream against scale's
//     in_color_matrix=bt709.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "media/audio_decoder.h"
#include "media/sample_random.h"
#include "media/video_decoder.h"
#include "temp_dir.h"

namespace spdl::media {
namespace {

// ---- tolerances ----
constexpr double kMaxResampleDiff = 2e-4;      // float samples, full scale 1
constexpr double kMaxSeekResampleDiff = 1e-3;  // float samples
constexpr double kMaxLossyRmsError = 0.03;     // float samples (tone RMS 0.354)
constexpr double kMaxVideoMeanAbsDiff = 1.0;   // 8-bit levels
constexpr double kPi = std::numbers::pi;

constexpr double kToneAmplitude = 0.5;

using spdl::testing::TempDir;  // temp_dir.h

// Runs the ffmpeg command line with `args`; the test fails if it does.
void Ffmpeg(const std::string& args) {
  const std::string cmd = "ffmpeg -nostdin -hide_banner -loglevel error -y " + args;
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

template <typename T>
std::vector<T> ReadRaw(const std::string& path) {
  std::vector<uint8_t> b = ReadBytes(path);
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

// ---- audio helpers ----

// A tone file: `seconds` of kToneAmplitude * sin(2 pi f t) per channel (left f, right f2 when
// stereo), at `rate`, encoded by `codec_args` into `path`.
void MakeTone(const std::string& path, int rate, double seconds, double f, const std::string& codec_args,
              double f2 = 0) {
  char expr[256];
  if (f2 > 0) {
    std::snprintf(expr, sizeof(expr), "%g*sin(2*PI*%g*t)|%g*sin(2*PI*%g*t)", kToneAmplitude, f, kToneAmplitude, f2);
  } else {
    std::snprintf(expr, sizeof(expr), "%g*sin(2*PI*%g*t)", kToneAmplitude, f);
  }
  Ffmpeg("-f lavfi -i \"aevalsrc=" + std::string(expr) + ":s=" + std::to_string(rate) +
         ":d=" + std::to_string(seconds) + "\" " + codec_args + " " + path);
}

AudioOps Ops(int rate, int channels, int64_t n) {
  AudioOps ops;
  ops.sample_rate = rate;
  ops.channels = channels;
  ops.num_samples = n;
  return ops;
}

struct Clip {
  std::vector<float> samples;  // channels-first
  int64_t valid = 0;
  AudioInfo info;
};

Clip DecodeFloat(AudioDecoder& d, const std::vector<uint8_t>& data, const AudioOps& ops, uint64_t seed = 0) {
  REQUIRE(ops.dtype == AudioDType::kFloat32);
  Clip c;
  c.samples.assign(AudioOutputBytes(ops) / sizeof(float), -7.0f);  // garbage the decoder must overwrite
  Result<int64_t> r = d.DecodeInto(data, ops, c.samples.data(), seed, &c.info);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  c.valid = *r;
  REQUIRE(c.valid == c.info.valid_samples);
  return c;
}

double MaxAbsDiff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// RMS of (x[i] - A sin(2 pi f (start + i) / rate)) over [from, to).
double ToneRmsError(const float* x, int64_t from, int64_t to, int64_t start, int rate, double f) {
  double s = 0;
  for (int64_t i = from; i < to; ++i) {
    const double want = kToneAmplitude * std::sin(2 * kPi * f * static_cast<double>(start + i) / rate);
    s += (x[i] - want) * (x[i] - want);
  }
  return std::sqrt(s / static_cast<double>(to - from));
}

// ---- video helpers ----

constexpr int kVideoFrames = 100;
constexpr int kVideoFps = 25;

// The frame-counter video: frame n is flat grey with luma 16 + 2n (limited range), 64x48.
void MakeCounterVideo(const std::string& path, const std::string& codec_args) {
  Ffmpeg("-f lavfi -i \"color=c=black:s=64x48:r=" + std::to_string(kVideoFps) +
         ":d=" + std::to_string(kVideoFrames / kVideoFps) + ",format=yuv420p,geq=lum='16+2*N':cb=128:cr=128\" " +
         codec_args + " " + path);
}

const std::string kH264 =
    "-c:v libx264 -preset ultrafast -crf 4 -g 25 -keyint_min 25 -sc_threshold 0 -bf 2 -pix_fmt yuv420p";
const std::string kVp9 = "-c:v libvpx-vp9 -deadline realtime -cpu-used 8 -crf 4 -b:v 0 -g 25 -pix_fmt yuv420p";

// The frame index shown by one decoded counter frame (RGB of luma 16 + 2n, limited range).
int CounterIndex(const uint8_t* rgb, int pixels) {
  double sum = 0;
  for (int i = 0; i < pixels * 3; ++i) sum += rgb[i];
  const double grey = sum / (pixels * 3.0);         // full-range level
  const double luma = grey * 219.0 / 255.0 + 16.0;  // back to limited range
  return static_cast<int>(std::lround((luma - 16.0) / 2.0));
}

std::vector<int> CounterIndices(const std::vector<uint8_t>& clip, const VideoOps& ops) {
  std::vector<int> idx;
  idx.reserve(static_cast<size_t>(ops.num_frames));
  const size_t fb = static_cast<size_t>(ops.height) * ops.width * 3;
  for (int k = 0; k < ops.num_frames; ++k) idx.push_back(CounterIndex(clip.data() + k * fb, ops.height * ops.width));
  return idx;
}

struct VideoClip {
  std::vector<uint8_t> rgb;
  int valid = 0;
  VideoInfo info;
};

VideoClip DecodeVideo(VideoDecoder& d, const std::vector<uint8_t>& data, const VideoOps& ops, uint64_t seed = 0) {
  VideoClip c;
  c.rgb.assign(VideoOutputBytes(ops), 0xAB);
  Result<int> r = d.DecodeInto(data, ops, c.rgb.data(), seed, &c.info);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  c.valid = *r;
  REQUIRE(c.valid == c.info.valid_frames);
  return c;
}

VideoOps CounterOps(int frames, int stride) {
  VideoOps ops;
  ops.num_frames = frames;
  ops.frame_stride = stride;
  ops.height = 24;
  ops.width = 32;
  return ops;
}

}  // namespace

// ============================== audio ==============================

TEST_CASE("Audio: WAV and FLAC at the output rate decode exactly, in every dtype and layout") {
  TempDir dir;
  MakeTone(dir / "t.wav", 16000, 2.0, 440, "-c:a pcm_s16le", 660);
  MakeTone(dir / "t.flac", 16000, 2.0, 440, "-c:a flac -sample_fmt s16", 660);
  Ffmpeg("-i " + dir / "t.wav" + " -f s16le " + dir / "ref.s16");
  const std::vector<int16_t> ref = ReadRaw<int16_t>(dir / "ref.s16");  // interleaved L R
  REQUIRE(ref.size() == 2 * 32000);
  AudioDecoder d;
  for (const char* name : {"t.wav", "t.flac"}) {
    CAPTURE(name);
    const std::vector<uint8_t> data = ReadBytes(dir / name);
    AudioOps ops = Ops(16000, 2, 32000);
    ops.dtype = AudioDType::kInt16;
    ops.layout = AudioLayout::kChannelsLast;
    std::vector<int16_t> out(2 * 32000, 99);
    AudioInfo info;
    Result<int64_t> r = d.DecodeInto(data, ops, out.data(), 0, &info);
    REQUIRE(r.ok());
    CHECK(*r == 32000);
    CHECK(info.source_rate == 16000);
    CHECK(info.source_channels == 2);
    CHECK(info.duration_seconds == Approx(2.0));
    CHECK(out == ref);

    ops.layout = AudioLayout::kChannelsFirst;
    REQUIRE(d.DecodeInto(data, ops, out.data()).ok());
    for (int64_t i = 0; i < 32000; ++i) {
      if (out[i] != ref[2 * i] || out[32000 + i] != ref[2 * i + 1]) FAIL("channels-first sample " << i);
    }
    ops.dtype = AudioDType::kFloat32;
    Clip f = DecodeFloat(d, data, ops);
    for (int64_t i = 0; i < 32000; ++i) {
      if (f.samples[i] != ref[2 * i] / 32768.0f || f.samples[32000 + i] != ref[2 * i + 1] / 32768.0f) {
        FAIL("float sample " << i);
      }
    }
    // Mono is the mean of the two channels (swresample's default matrix).
    Clip mono = DecodeFloat(d, data, Ops(16000, 1, 32000));
    for (int64_t i = 0; i < 32000; ++i) {
      if (std::abs(mono.samples[i] - (ref[2 * i] + ref[2 * i + 1]) / 65536.0f) > 1e-7f)
        FAIL("mono sample " << i << ": " << mono.samples[i] << " L " << ref[2 * i] / 32768.0 << " R "
                            << ref[2 * i + 1] / 32768.0);
    }
    // And the tone is the one asked for (int16 quantisation only).
    CHECK(ToneRmsError(f.samples.data(), 0, 32000, 0, 16000, 440) < 1e-4);
    CHECK(ToneRmsError(f.samples.data() + 32000, 0, 32000, 0, 16000, 660) < 1e-4);
  }
}

TEST_CASE("Audio: resampling and channel mixing match ffmpeg -af pan -ar") {
  TempDir dir;
  MakeTone(dir / "s.wav", 44100, 1.0, 440, "-c:a pcm_s16le", 1000);  // stereo 44.1 kHz
  MakeTone(dir / "m.flac", 22050, 1.0, 300, "-c:a flac");            // mono 22.05 kHz
  AudioDecoder d;
  struct Case {
    const char* file;
    int rate;
    int channels;
  };
  for (const Case& c : {Case{"s.wav", 16000, 1}, Case{"s.wav", 16000, 2}, Case{"s.wav", 48000, 2},
                        Case{"m.flac", 16000, 2}, Case{"m.flac", 8000, 1}}) {
    CAPTURE(c.file, c.rate, c.channels);
    // The mix spdld uses (mean to mono, copy to stereo), written as a pan filter; same-count
    // layouts pass through.
    const bool stereo_in = std::string(c.file) == "s.wav";
    std::string pan;
    if (stereo_in && c.channels == 1) pan = "-af \"pan=mono|c0=0.5*c0+0.5*c1\" ";
    if (!stereo_in && c.channels == 2) pan = "-af \"pan=stereo|c0=c0|c1=c0\" ";
    Ffmpeg("-i " + dir / c.file + " " + pan + "-ar " + std::to_string(c.rate) + " -f f32le " + dir / "ref.f32");
    const std::vector<float> ref = ReadRaw<float>(dir / "ref.f32");  // interleaved
    const int64_t n = static_cast<int64_t>(ref.size()) / c.channels;
    REQUIRE(n == c.rate);  // 1 s
    AudioOps ops = Ops(c.rate, c.channels, n);
    ops.layout = AudioLayout::kChannelsLast;
    Clip clip = DecodeFloat(d, ReadBytes(dir / c.file), ops);
    CHECK(clip.valid == n);
    const double diff = MaxAbsDiff(clip.samples.data(), ref.data(), ref.size());
    CAPTURE(diff);
    CHECK(diff < kMaxResampleDiff);
  }
}

TEST_CASE("Audio: MP3, Opus, AAC and Vorbis match the tone") {
  TempDir dir;
  MakeTone(dir / "t.mp3", 44100, 4.0, 440, "-c:a libmp3lame -b:a 128k");
  MakeTone(dir / "t.opus", 48000, 4.0, 440, "-c:a libopus -b:a 96k");
  MakeTone(dir / "t.m4a", 44100, 4.0, 440, "-c:a aac -b:a 128k");
  MakeTone(dir / "t.ogg", 44100, 4.0, 440, "-c:a libvorbis");
  AudioDecoder d;
  for (const char* name : {"t.mp3", "t.opus", "t.m4a", "t.ogg"}) {
    CAPTURE(name);
    const std::vector<uint8_t> data = ReadBytes(dir / name);
    Clip clip = DecodeFloat(d, data, Ops(16000, 1, 16000));
    CHECK(clip.valid == 16000);
    // Skip the first 20 ms (the codecs' start-up) when comparing.
    const double err = ToneRmsError(clip.samples.data(), 320, 16000, 0, 16000, 440);
    CAPTURE(err, clip.info.codec);
    CHECK(err < kMaxLossyRmsError);
    // A random crop late in the file (reached by a seek) is still the tone at the right phase.
    AudioOps ops = Ops(16000, 1, 8000);
    ops.crop = AudioCrop::kRandom;
    int seeks = 0;
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      Clip c = DecodeFloat(d, data, ops, SampleSeed(7, 0, seed));
      seeks += c.info.seeked;
      CAPTURE(seed, c.info.start_sample, c.info.seeked);
      CHECK(c.valid == 8000);
      const double e = ToneRmsError(c.samples.data(), 0, 8000, c.info.start_sample, 16000, 440);
      CAPTURE(e);
      CHECK(e < kMaxLossyRmsError);
    }
    CHECK(seeks > 0);
  }
}

TEST_CASE("Audio: crops from the start and at random, with and without a seek, are slices of the whole") {
  TempDir dir;
  MakeTone(dir / "t.wav", 16000, 5.0, 440, "-c:a pcm_s16le", 523);
  MakeTone(dir / "t.flac", 16000, 5.0, 440, "-c:a flac -sample_fmt s16", 523);
  MakeTone(dir / "r.wav", 44100, 5.0, 440, "-c:a pcm_s16le", 523);  // needs resampling
  AudioDecoder d;
  for (const char* name : {"t.wav", "t.flac", "r.wav"}) {
    CAPTURE(name);
    const bool resampled = std::string(name) == "r.wav";
    const std::vector<uint8_t> data = ReadBytes(dir / name);
    const int64_t total = 5 * 16000;
    Clip whole = DecodeFloat(d, data, Ops(16000, 2, total));
    REQUIRE(whole.valid == total);
    const int64_t n = 12000;
    // From the start.
    Clip head = DecodeFloat(d, data, Ops(16000, 2, n));
    CHECK(head.valid == n);
    CHECK(head.info.start_sample == 0);
    for (int c = 0; c < 2; ++c) {
      CHECK(MaxAbsDiff(head.samples.data() + c * n, whole.samples.data() + c * total, n) <=
            (resampled ? kMaxSeekResampleDiff : 0.0));
    }
    // At random: the same seed gives the same clip; with and without a seek alike.
    std::set<int64_t> starts;
    int seeks = 0;
    for (uint64_t i = 0; i < 8; ++i) {
      AudioOps ops = Ops(16000, 2, n);
      ops.crop = AudioCrop::kRandom;
      const uint64_t seed = SampleSeed(42, 1, i);
      Clip a = DecodeFloat(d, data, ops, seed);
      ops.allow_seek = false;
      Clip b = DecodeFloat(d, data, ops, seed);
      const int64_t s = a.info.start_sample;
      CAPTURE(i, s, a.info.seeked);
      REQUIRE(s == b.info.start_sample);
      CHECK(s >= 0);
      CHECK(s <= total - n);
      CHECK(a.valid == n);
      CHECK(!b.info.seeked);
      CHECK(a.info.seeked == (s > kSeekMinSeconds * 16000));
      seeks += a.info.seeked;
      starts.insert(s);
      for (int c = 0; c < 2; ++c) {
        const double tol = resampled ? kMaxSeekResampleDiff : 0.0;
        CHECK(MaxAbsDiff(a.samples.data() + c * n, whole.samples.data() + c * total + s, n) <= tol);
        CHECK(MaxAbsDiff(b.samples.data() + c * n, whole.samples.data() + c * total + s, n) <= tol);
      }
      Clip again = DecodeFloat(d, data, Ops(16000, 2, n), 0);  // a kStart decode between: no state leaks
      ops.allow_seek = true;
      Clip a2 = DecodeFloat(d, data, ops, seed);
      CHECK(a2.samples == a.samples);
    }
    CHECK(starts.size() >= 6);
    CHECK(seeks >= 3);
  }
}

TEST_CASE("Audio: without a stated duration a random crop decodes the whole and crops it") {
  TempDir dir;
  // FLAC written to a pipe has no sample count in its header: FFmpeg cannot say how long it is.
  Ffmpeg("-f lavfi -i \"aevalsrc=0.5*sin(2*PI*440*t):s=16000:d=3\" -c:a flac -sample_fmt s16 -f flac pipe:1 > " +
         dir / "p.flac");
  const std::vector<uint8_t> data = ReadBytes(dir / "p.flac");
  AudioDecoder d;
  Clip whole = DecodeFloat(d, data, Ops(16000, 1, 48000));
  CHECK(whole.info.duration_seconds == -1);
  REQUIRE(whole.valid == 48000);
  for (AudioLayout layout : {AudioLayout::kChannelsFirst, AudioLayout::kChannelsLast}) {
    for (int channels : {1, 2}) {
      AudioOps ops = Ops(16000, channels, 10000);
      ops.crop = AudioCrop::kRandom;
      ops.layout = layout;
      std::set<int64_t> starts;
      for (uint64_t i = 0; i < 4; ++i) {
        Clip c = DecodeFloat(d, data, ops, SampleSeed(1, 0, i));
        const int64_t s = c.info.start_sample;
        CAPTURE(i, s, channels);
        CHECK(c.valid == 10000);
        CHECK(s <= 48000 - 10000);
        starts.insert(s);
        for (int ch = 0; ch < channels; ++ch) {
          for (int64_t k = 0; k < 10000; ++k) {
            const float v =
                layout == AudioLayout::kChannelsFirst ? c.samples[ch * 10000 + k] : c.samples[k * channels + ch];
            const float want = whole.samples[s + k];
            if (std::abs(v - want) > 1e-6) FAIL("sample " << k << " of channel " << ch << ": " << v << " vs " << want);
          }
        }
      }
      CHECK(starts.size() >= 3);
    }
  }
  // Shorter than the clip: padded.
  AudioOps ops = Ops(16000, 1, 50000);
  ops.crop = AudioCrop::kRandom;
  Clip c = DecodeFloat(d, data, ops, 9);
  CHECK(c.valid == 48000);
  CHECK(c.info.start_sample == 0);
  CHECK(std::all_of(c.samples.begin() + 48000, c.samples.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("Audio: a short source is zero-padded and its valid length reported") {
  TempDir dir;
  MakeTone(dir / "t.flac", 16000, 1.0, 440, "-c:a flac", 660);
  MakeTone(dir / "t.opus", 48000, 1.0, 440, "-c:a libopus");
  AudioDecoder d;
  for (AudioLayout layout : {AudioLayout::kChannelsFirst, AudioLayout::kChannelsLast}) {
    AudioOps ops = Ops(16000, 2, 24000);
    ops.layout = layout;
    for (AudioCrop crop : {AudioCrop::kStart, AudioCrop::kRandom}) {
      ops.crop = crop;
      Clip c = DecodeFloat(d, ReadBytes(dir / "t.flac"), ops, 5);
      CHECK(c.valid == 16000);
      CHECK(c.info.start_sample == 0);
      for (int ch = 0; ch < 2; ++ch) {
        for (int64_t i = 0; i < 24000; ++i) {
          const float v = layout == AudioLayout::kChannelsFirst ? c.samples[ch * 24000 + i] : c.samples[i * 2 + ch];
          if (i >= 16000 && v != 0.0f) FAIL("padding not zero at " << i);
          if (i < 16000 && i % 1000 == 7 && v == 0.0f) FAIL("signal missing at " << i);
        }
      }
    }
  }
  {  // int16, Opus
    AudioOps ops = Ops(16000, 1, 20000);
    ops.dtype = AudioDType::kInt16;
    std::vector<int16_t> out(20000, 77);
    Result<int64_t> r = d.DecodeInto(ReadBytes(dir / "t.opus"), ops, out.data());
    REQUIRE(r.ok());
    CHECK(std::abs(*r - 16000) <= 16);  // Opus pads to whole 20 ms frames, trimmed by its end granule
    CHECK(std::all_of(out.begin() + *r, out.end(), [](int16_t v) { return v == 0; }));
    CHECK(*std::max_element(out.begin(), out.begin() + *r) > 0.45 * 32767);
  }
}

TEST_CASE("Audio: bad input and limits are clear errors") {
  TempDir dir;
  MakeTone(dir / "t.wav", 16000, 3.0, 440, "-c:a pcm_s16le");
  MakeTone(dir / "t.mp3", 44100, 3.0, 440, "-c:a libmp3lame");
  Ffmpeg("-f lavfi -i \"color=c=red:s=32x32:r=5:d=1\" -c:v libx264 -pix_fmt yuv420p " + dir / "v.mp4");
  AudioDecoder d;
  std::vector<float> out(16000);
  const AudioOps ops = Ops(16000, 1, 16000);

  Result<int64_t> r = d.DecodeInto({}, ops, out.data());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  const std::vector<uint8_t> junk(5000, 0x5A);
  r = d.DecodeInto(junk, ops, out.data());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  r = d.DecodeInto(ReadBytes(dir / "v.mp4"), ops, out.data());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("no audio stream"));

  // Truncated or damaged files: an error or a shorter clip, never a crash, and the decoder still
  // works afterwards.
  for (const char* name : {"t.wav", "t.mp3"}) {
    std::vector<uint8_t> data = ReadBytes(dir / name);
    for (size_t cut : {size_t{10}, size_t{60}, data.size() / 3}) {
      std::vector<uint8_t> part(data.begin(), data.begin() + cut);
      r = d.DecodeInto(part, ops, out.data());
      CAPTURE(name, cut, r.status().ToString());
      if (r.ok()) {
        CHECK(*r < 16000 * 3);
      } else {
        CHECK(r.status().code() == StatusCode::kDataLoss);
      }
    }
    std::vector<uint8_t> damaged = data;
    for (size_t i = damaged.size() / 4; i < damaged.size(); i += 97) damaged[i] ^= 0xFF;
    r = d.DecodeInto(damaged, ops, out.data());
    CAPTURE(name, r.status().ToString());
    CHECK((r.ok() || r.status().code() == StatusCode::kDataLoss));
    r = d.DecodeInto(data, ops, out.data());
    CHECK(r.ok());
  }

  AudioOps limited = ops;
  limited.max_duration_seconds = 2.0;
  r = d.DecodeInto(ReadBytes(dir / "t.wav"), limited, out.data());
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(r.status().message(), Catch::Contains("3.0 s") && Catch::Contains("2.0 s"));

  AudioOps bad = ops;
  bad.channels = 3;
  bad.sample_rate = 0;
  bad.num_samples = 0;
  Status s = ValidateAudioOps(bad);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(),
             Catch::Contains("channels") && Catch::Contains("sample_rate") && Catch::Contains("num_samples"));
  CHECK(d.DecodeInto(ReadBytes(dir / "t.wav"), bad, out.data()).status().code() == StatusCode::kInvalidArgument);
  CHECK(d.DecodeInto(ReadBytes(dir / "t.wav"), ops, nullptr).status().code() == StatusCode::kInvalidArgument);
}

// A canonical PCM s16le WAV (44-byte header) that states `rate` Hz, with `frames` samples of a ramp.
std::vector<uint8_t> WavBytes(uint32_t rate, uint16_t channels, uint32_t frames) {
  const uint32_t data_bytes = frames * channels * 2;
  std::vector<uint8_t> w;
  auto put = [&](uint32_t v, int n) {
    for (int i = 0; i < n; ++i) w.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  auto tag = [&](const char* t) {
    for (int i = 0; i < 4; ++i) w.push_back(static_cast<uint8_t>(t[i]));
  };
  tag("RIFF");
  put(36 + data_bytes, 4);
  tag("WAVE");
  tag("fmt ");
  put(16, 4);
  put(1, 2);  // PCM
  put(channels, 2);
  put(rate, 4);
  put(rate * channels * 2, 4);  // byte rate (wraps for absurd rates, as in the file found)
  put(channels * 2, 2);
  put(16, 2);
  tag("data");
  put(data_bytes, 4);
  for (uint32_t i = 0; i < frames * channels; ++i) put(static_cast<uint16_t>(i * 64), 2);
  return w;
}

// Found by tests/fuzz/audio_fuzz (corpus/audio/regress_wav_84mhz_rate): a WAV header stating an
// 84 MHz sample rate made libswresample fail with ENOMEM after trying to allocate gigabytes of
// filter, reported as kInternal ("cannot set up the resampler"). A rate over 768000 Hz is now
// refused from the header, before anything is decoded or allocated, as corrupt data.
TEST_CASE("Audio: a header's absurd sample rate is refused before decoding, as corrupt data") {
  AudioDecoder d;
  const AudioOps ops = Ops(16000, 1, 1600);
  std::vector<float> out(1600);
  for (uint32_t rate : {83959616u, 768001u, 0x7fffffffu}) {
    CAPTURE(rate);
    Result<int64_t> r = d.DecodeInto(WavBytes(rate, 1, 4000), ops, out.data());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains(std::to_string(rate) + " Hz") && Catch::Contains("768000"));
  }
  // The highest rate itself is resampled as any other, and the decoder is unharmed.
  Result<int64_t> r = d.DecodeInto(WavBytes(768000, 1, 76800), ops, out.data());
  REQUIRE(r.ok());
  CHECK(*r >= 1590);
  r = d.DecodeInto(WavBytes(8000, 2, 800), ops, out.data());
  REQUIRE(r.ok());
  CHECK(*r >= 1590);
}

// Found by tests/fuzz/audio_fuzz (corpus/audio/regress_wav_9ch_no_layout): a WAV of 9 channels
// without a channel mask has no channel positions, swresample has no default matrix for it and
// swr_init failed (reported as kInternal). Each output channel is now the mean of all channels.
TEST_CASE("Audio: channels without positions are mixed as their mean") {
  constexpr int kChannels = 9, kFrames = 40;
  const std::vector<uint8_t> wav = WavBytes(8000, kChannels, kFrames);
  AudioDecoder d;
  for (int out_channels : {1, 2}) {
    CAPTURE(out_channels);
    const AudioOps ops = Ops(8000, out_channels, kFrames);
    std::vector<float> out(static_cast<size_t>(kFrames) * out_channels);
    Result<int64_t> r = d.DecodeInto(wav, ops, out.data());
    REQUIRE(r.ok());
    REQUIRE(*r == kFrames);
    for (int c = 0; c < out_channels; ++c) {
      for (int t = 0; t < kFrames; ++t) {
        double mean = 0;  // WavBytes' sample i (interleaved) is i * 64
        for (int k = 0; k < kChannels; ++k) mean += (t * kChannels + k) * 64 / 32768.0 / kChannels;
        CHECK(out[static_cast<size_t>(c) * kFrames + t] == Approx(mean).margin(1e-4));
      }
    }
  }
}

// Found by tests/fuzz/audio_fuzz (corpus/audio/regress_wav_list_4gb): a 483-byte WAV whose LIST
// chunk states ~4 GB made libavformat allocate 926 MB for one INFO entry before reading it (any
// such file could take a worker's memory, or the node's). A RIFF chunk other than the media data
// that runs past the end of the file is now refused before libavformat sees the file; a file cut
// short in its data still decodes.
TEST_CASE("Audio: a RIFF chunk stating more bytes than the file holds is refused before parsing") {
  auto le32 = [](uint32_t v) {
    return std::vector<uint8_t>{static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8), static_cast<uint8_t>(v >> 16),
                                static_cast<uint8_t>(v >> 24)};
  };
  auto with_chunk = [&](const char* id, uint32_t size, std::vector<uint8_t> body) {
    std::vector<uint8_t> wav = WavBytes(8000, 1, 800);
    std::vector<uint8_t> chunk(id, id + 4);
    const std::vector<uint8_t> sz = le32(size);
    chunk.insert(chunk.end(), sz.begin(), sz.end());
    chunk.insert(chunk.end(), body.begin(), body.end());
    wav.insert(wav.begin() + 36, chunk.begin(), chunk.end());  // after 'fmt ', before 'data'
    return wav;
  };
  std::vector<uint8_t> info = {'I', 'N', 'F', 'O', 'I', 'S', 'F', 'T', 0x3b, 0x6f, 0x32, 0x37, 'L', 'a', 'v', 'f'};
  AudioDecoder d;
  const AudioOps ops = Ops(8000, 1, 800);
  std::vector<float> out(800);
  for (const auto& [name, wav] : {std::pair{"LIST", with_chunk("LIST", 0xfdffffe6u, info)},
                                  std::pair{"bext", with_chunk("bext", 0x40000000u, std::vector<uint8_t>(700, 'x'))},
                                  std::pair{"LIST", with_chunk("LIST", 16, info)}}) {
    CAPTURE(name);
    Result<int64_t> r = d.DecodeInto(wav, ops, out.data());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains("RIFF chunk '") && Catch::Contains("past the end of the file"));
  }
  // The same chunks, inside the file, are read as before; a file cut in its data decodes what is there.
  info[8] = 4;  // ISFT of 4 bytes
  info[9] = info[10] = info[11] = 0;
  Result<int64_t> r = d.DecodeInto(with_chunk("LIST", static_cast<uint32_t>(info.size()), info), ops, out.data());
  REQUIRE(r.ok());
  CHECK(*r == 800);
  std::vector<uint8_t> cut = WavBytes(8000, 1, 800);
  cut.resize(44 + 600);
  r = d.DecodeInto(cut, ops, out.data());
  REQUIRE(r.ok());
  CHECK(*r == 300);
}

// ============================== video ==============================

TEST_CASE("Video: an MP4 sample table stating more entries than its box holds is refused before parsing") {
  // Found by video_fuzz (corpus/video/regress_mp4_stss_134m_entries): a 24-byte 'stss' stating
  // 134 million keyframes made libavformat allocate 539 MB for them before reading one.
  TempDir dir;
  Ffmpeg("-f lavfi -i \"color=c=red:s=32x24:r=5:d=2\" -c:v libx264 -g 3 -pix_fmt yuv420p " + dir / "v.mp4");
  const std::vector<uint8_t> good = ReadBytes(dir / "v.mp4");
  VideoDecoder d;
  VideoOps ops = CounterOps(4, 1);
  CHECK(DecodeVideo(d, good, ops).valid == 4);
  // Each sample table in turn: its entry count (after the box's size, type and version/flags;
  // stsz has a sample size first) set to 0x08080808.
  for (const auto& [box, count_at] : {std::pair{"stss", 12}, std::pair{"stco", 12}, std::pair{"stts", 12},
                                      std::pair{"stsc", 12}, std::pair{"stsz", 16}}) {
    CAPTURE(box);
    const auto it = std::search(good.begin(), good.end(), box, box + 4);
    REQUIRE(it != good.end());
    std::vector<uint8_t> bad = good;
    const size_t at = static_cast<size_t>(it - good.begin()) - 4 + count_at;  // `it` is at the type
    for (int i = 0; i < 4; ++i) bad[at + i] = 0x08;
    std::vector<uint8_t> out(VideoOutputBytes(ops));
    Result<int> r = d.DecodeInto(bad, ops, out.data());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(), Catch::Contains(std::string("MP4/MOV box '") + box + "'") &&
                                         Catch::Contains("states 134744072 entries"));
  }
  // The decoder is still fine, and the good file still decodes.
  CHECK(DecodeVideo(d, good, ops).valid == 4);

  // Wherever libavformat would read the table (it finds a box's reader by its type alone): inside
  // 'dinf' (found by video_fuzz: corpus/video/regress_mp4_stss_in_dinf), inside a 'meta' found by
  // its 'hdlr'; and a compressed movie header, which libavformat would inflate to a size it states.
  auto box = [](const char* type, std::vector<uint8_t> body) {
    const uint32_t size = static_cast<uint32_t>(body.size() + 8);
    // Sized once, then filled (growing it by insert trips a GCC 12 -Warray-bounds false positive).
    std::vector<uint8_t> b(size);
    for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(size >> (24 - 8 * i));
    for (int i = 0; i < 4; ++i) b[4 + i] = static_cast<uint8_t>(type[i]);
    std::copy(body.begin(), body.end(), b.begin() + 8);
    return b;
  };
  const std::vector<uint8_t> ftyp = box("ftyp", {'i', 's', 'o', 'm', 0, 0, 2, 0, 'i', 's', 'o', 'm'});
  const std::vector<uint8_t> stss = box("stss", {0, 0, 0, 0, 0x08, 0x08, 0x08, 0x08, 0, 0, 0, 1});
  const std::vector<uint8_t> hdlr = box("hdlr", std::vector<uint8_t>(25, 0));
  std::vector<uint8_t> meta_body = {0, 0, 0, 0};  // an ISO 'meta': version and flags first
  meta_body.insert(meta_body.end(), hdlr.begin(), hdlr.end());
  meta_body.insert(meta_body.end(), stss.begin(), stss.end());
  struct Case {
    std::string where;
    std::vector<uint8_t> moov;
  };
  const std::vector<Case> cases = {
      {"dinf", box("moov", box("trak", box("mdia", box("minf", box("dinf", box("stbl", stss))))))},
      {"meta", box("moov", box("udta", box("meta", meta_body)))},
      {"cmov", box("moov", box("cmov", box("cmvd", {0x40, 0, 0, 0, 0x78, 0x9c})))},
  };
  for (const auto& [where, moov] : cases) {
    CAPTURE(where);
    std::vector<uint8_t> file = ftyp;
    file.insert(file.end(), moov.begin(), moov.end());
    std::vector<uint8_t> out(VideoOutputBytes(ops));
    Result<int> r = d.DecodeInto(file, ops, out.data());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(r.status().message(),
               Catch::Contains(std::string("MP4/MOV box '") + (where == "cmov" ? "cmov" : "stss") + "'"));
  }

  // Whatever the first box is (found by video_fuzz: corpus/video/regress_mp4_junk_first_box): the
  // demuxer's probe reads a file as MP4 by any known top-level box, so a junk box before 'moov'
  // must not turn the checks off.
  std::vector<uint8_t> junk_first = box(std::string("\0\0a\xd0", 4).c_str(), std::vector<uint8_t>(20, 0));
  const std::vector<uint8_t> moov = box("moov", box("trak", box("mdia", box("minf", box("stbl", stss)))));
  junk_first.insert(junk_first.end(), moov.begin(), moov.end());
  std::vector<uint8_t> out(VideoOutputBytes(ops));
  Result<int> r = d.DecodeInto(junk_first, ops, out.data());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("MP4/MOV box 'stss'"));
}

TEST_CASE("Video: the frames chosen by start, stride and fps are the expected ones, H.264 and VP9") {
  TempDir dir;
  MakeCounterVideo(dir / "c.mp4", kH264);
  MakeCounterVideo(dir / "c.webm", kVp9);
  VideoDecoder d;
  for (const char* name : {"c.mp4", "c.webm"}) {
    CAPTURE(name);
    const std::vector<uint8_t> data = ReadBytes(dir / name);
    // From the beginning: frames 0, 3, 6, ...
    VideoOps ops = CounterOps(8, 3);
    VideoClip c = DecodeVideo(d, data, ops);
    CHECK(c.valid == 8);
    CHECK(c.info.frame_rate == Approx(25));
    CHECK(c.info.frame_count == kVideoFrames);
    CHECK(c.info.width == 64);
    CHECK(c.info.height == 48);
    CHECK(!c.info.seeked);
    CHECK(CounterIndices(c.rgb, ops) == std::vector<int>{0, 3, 6, 9, 12, 15, 18, 21});
    CHECK(c.info.decoded_frames <= 21 + 3);  // decoding stops at the clip's end (plus codec delay)

    // From 2.4 s (frame 60): a seek to the keyframe at 50, then forward.
    ops.start_seconds = 2.4;
    c = DecodeVideo(d, data, ops);
    CHECK(c.info.seeked);
    CHECK(c.info.first_index == 60);
    CHECK(CounterIndices(c.rgb, ops) == std::vector<int>{60, 63, 66, 69, 72, 75, 78, 81});
    CHECK(c.info.decoded_frames < 40);  // not the 82 from the beginning
    VideoOps no_seek = ops;
    no_seek.allow_seek = false;
    VideoClip c2 = DecodeVideo(d, data, no_seek);
    CHECK(!c2.info.seeked);
    CHECK(c2.info.decoded_frames >= 82);
    CHECK(c2.rgb == c.rgb);

    // At 5 fps from 1 s: every 5th frame from 25.
    ops = CounterOps(6, 1);
    ops.fps = 5;
    ops.start_seconds = 1.0;
    c = DecodeVideo(d, data, ops);
    CHECK(CounterIndices(c.rgb, ops) == std::vector<int>{25, 30, 35, 40, 45, 50});
    // At 50 fps: each frame twice.
    ops.fps = 50;
    ops.start_seconds = 0.2;
    c = DecodeVideo(d, data, ops);
    CHECK(CounterIndices(c.rgb, ops) == std::vector<int>{5, 6, 6, 7, 7, 8});
  }
}

TEST_CASE("Video: a random start is drawn from the seed, within the video, and seeks") {
  TempDir dir;
  MakeCounterVideo(dir / "c.mp4", kH264);
  const std::vector<uint8_t> data = ReadBytes(dir / "c.mp4");
  VideoDecoder d;
  VideoOps ops = CounterOps(4, 5);  // span 16 frames
  ops.start = VideoStart::kRandom;
  std::set<int64_t> starts;
  for (uint64_t i = 0; i < 10; ++i) {
    const uint64_t seed = SampleSeed(3, 2, i);
    VideoClip a = DecodeVideo(d, data, ops, seed);
    const int64_t s = a.info.first_index;
    CAPTURE(i, s);
    CHECK(s >= 0);
    CHECK(s <= kVideoFrames - 16);
    CHECK(a.valid == 4);
    CHECK(a.info.seeked == (s > 0));
    const int f = static_cast<int>(s);
    CHECK(CounterIndices(a.rgb, ops) == std::vector<int>{f, f + 5, f + 10, f + 15});
    VideoClip b = DecodeVideo(d, data, ops, seed);
    CHECK(b.rgb == a.rgb);
    starts.insert(s);
  }
  CHECK(starts.size() >= 7);
}

TEST_CASE("Video: a clip past the end repeats the last frame and reports the valid count") {
  TempDir dir;
  MakeCounterVideo(dir / "c.webm", kVp9);
  const std::vector<uint8_t> data = ReadBytes(dir / "c.webm");
  VideoDecoder d;
  VideoOps ops = CounterOps(6, 4);
  ops.start_seconds = 3.6;  // frame 90: 90, 94, 98, then past the end (99 is the last)
  VideoClip c = DecodeVideo(d, data, ops);
  CHECK(c.valid == 3);
  CHECK(CounterIndices(c.rgb, ops) == std::vector<int>{90, 94, 98, 98, 98, 98});
  const size_t fb = static_cast<size_t>(ops.height) * ops.width * 3;
  CHECK(std::equal(c.rgb.begin() + 2 * fb, c.rgb.begin() + 3 * fb, c.rgb.begin() + 5 * fb));
  // A start past the end: no real frame; every frame is the video's last.
  ops.start_seconds = 10;
  c = DecodeVideo(d, data, ops);
  CHECK(c.valid == 0);
  CHECK(CounterIndices(c.rgb, ops) == std::vector<int>(6, 99));
}

TEST_CASE("Video: resized frames match ffmpeg's select + scale, H.264 and VP9") {
  TempDir dir;
  const std::string src = "-f lavfi -i \"testsrc2=s=128x96:r=25:d=2\" ";
  Ffmpeg(src + kH264 + " " + dir / "t.mp4");
  Ffmpeg(src + kVp9 + " " + dir / "t.webm");
  VideoDecoder d;
  struct Case {
    int w, h;
    Interpolation interp;
    const char* flags;
  };
  for (const char* name : {"t.mp4", "t.webm"}) {
    for (const Case& k :
         {Case{80, 60, Interpolation::kBilinear, "bilinear"}, Case{160, 100, Interpolation::kBicubic, "bicubic"},
          Case{48, 48, Interpolation::kArea, "area"}}) {
      CAPTURE(name, k.w, k.h, k.flags);
      VideoOps ops;
      ops.num_frames = 4;
      ops.frame_stride = 7;
      ops.start_seconds = 1.08;  // frame 27: 27, 34, 41, 48
      ops.width = k.w;
      ops.height = k.h;
      ops.interpolation = k.interp;
      VideoClip c = DecodeVideo(d, ReadBytes(dir / name), ops);
      REQUIRE(c.valid == 4);
      Ffmpeg("-i " + dir / name + " -vf \"select='eq(n\\,27)+eq(n\\,34)+eq(n\\,41)+eq(n\\,48)',scale=" +
             std::to_string(k.w) + ":" + std::to_string(k.h) + ":flags=" + k.flags +
             "+accurate_rnd+full_chroma_int+full_chroma_inp\" -vsync 0 -pix_fmt rgb24 -f rawvideo " + dir / "ref.rgb");
      const std::vector<uint8_t> ref = ReadBytes(dir / "ref.rgb");
      REQUIRE(ref.size() == c.rgb.size());
      const size_t fb = ref.size() / 4;
      for (int f = 0; f < 4; ++f) {
        double sum = 0;
        for (size_t i = f * fb; i < (f + 1) * fb; ++i) sum += std::abs(int{c.rgb[i]} - int{ref[i]});
        const double mad = sum / fb;
        CAPTURE(f, mad);
        CHECK(mad < kMaxVideoMeanAbsDiff);
      }
    }
  }
  CHECK(d.sws_contexts_built() <= 6);  // one per output size and filter, reused across frames
}

TEST_CASE("Video: a BT.709-tagged stream is converted with the BT.709 matrix") {
  TempDir dir;
  Ffmpeg("-f lavfi -i \"testsrc2=s=128x96:r=25:d=1\" -vf scale=out_color_matrix=bt709:out_range=tv " + kH264 +
         " -colorspace bt709 -color_primaries bt709 -color_trc bt709 " + dir / "hd.mp4");
  VideoDecoder d;
  VideoOps ops;
  ops.num_frames = 1;
  ops.start_seconds = 0.4;  // frame 10
  ops.width = 64;
  ops.height = 48;
  VideoClip c = DecodeVideo(d, ReadBytes(dir / "hd.mp4"), ops);
  auto mad_vs = [&](const char* matrix) {
    Ffmpeg("-i " + dir / "hd.mp4" + " -vf \"select='eq(n\\,10)',scale=64:48:in_color_matrix=" + matrix +
           ":flags=bilinear+accurate_rnd+full_chroma_int+full_chroma_inp\" -vsync 0 -pix_fmt rgb24 -f rawvideo " +
           dir / "ref.rgb");
    const std::vector<uint8_t> ref = ReadBytes(dir / "ref.rgb");
    REQUIRE(ref.size() == c.rgb.size());
    double sum = 0;
    for (size_t i = 0; i < ref.size(); ++i) sum += std::abs(int{c.rgb[i]} - int{ref[i]});
    return sum / ref.size();
  };
  const double vs709 = mad_vs("bt709");
  const double vs601 = mad_vs("bt601");
  CAPTURE(vs709, vs601);
  CHECK(vs709 < kMaxVideoMeanAbsDiff);
  CHECK(vs601 > 2.0);  // the matrices differ by several levels on testsrc2's saturated colours
}

TEST_CASE("Video: bad input and limits are clear errors") {
  TempDir dir;
  MakeCounterVideo(dir / "c.mp4", kH264);
  MakeTone(dir / "a.wav", 16000, 1.0, 440, "-c:a pcm_s16le");
  VideoDecoder d;
  VideoOps ops = CounterOps(4, 2);
  std::vector<uint8_t> out(VideoOutputBytes(ops));
  const std::vector<uint8_t> data = ReadBytes(dir / "c.mp4");

  Result<int> r = d.DecodeInto({}, ops, out.data());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  r = d.DecodeInto(std::vector<uint8_t>(4000, 0x11), ops, out.data());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  r = d.DecodeInto(ReadBytes(dir / "a.wav"), ops, out.data());
  CHECK(r.status().code() == StatusCode::kDataLoss);
  CHECK_THAT(r.status().message(), Catch::Contains("no video stream"));

  for (size_t cut : {size_t{16}, size_t{200}, data.size() / 2}) {
    std::vector<uint8_t> part(data.begin(), data.begin() + cut);
    r = d.DecodeInto(part, ops, out.data());
    CAPTURE(cut, r.status().ToString());
    CHECK((r.ok() || r.status().code() == StatusCode::kDataLoss));
  }
  std::vector<uint8_t> damaged = data;
  for (size_t i = damaged.size() / 3; i < damaged.size(); i += 61) damaged[i] ^= 0xFF;
  r = d.DecodeInto(damaged, ops, out.data());
  CAPTURE(r.status().ToString());
  CHECK((r.ok() || r.status().code() == StatusCode::kDataLoss));
  CHECK(d.DecodeInto(data, ops, out.data()).ok());

  VideoOps small = ops;
  small.max_pixels = 64 * 48 - 1;
  r = d.DecodeInto(data, small, out.data());
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(r.status().message(), Catch::Contains("64x48") && Catch::Contains("3071"));

  VideoOps few = ops;
  few.max_decoded_frames = 5;
  few.start_seconds = 1.6;  // frame 40, from the keyframe at 25
  r = d.DecodeInto(data, few, out.data());
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(r.status().message(), Catch::Contains("5 decoded frames"));

  VideoOps bad = ops;
  bad.num_frames = 0;
  bad.frame_stride = 0;
  bad.width = 0;
  Status s = ValidateVideoOps(bad);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("num_frames") && Catch::Contains("frame_stride") && Catch::Contains("width"));
  CHECK(d.DecodeInto(data, ops, nullptr).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace spdl::media
