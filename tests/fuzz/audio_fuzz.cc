// audio_fuzz: an audio sample's bytes through AudioDecoder::DecodeInto — the call every audio job
// makes per sample (jobs/sample_decoder.cc) — into a buffer of exactly one slot row
// (AudioOutputBytes), so that ASan sees any write past the row: libavformat's probe and demuxer
// over the in-memory reader (av_input.cc), the decoder, the seek, libswresample, the crop and the
// padding.
//
// Input (FuzzedDataProvider): the file first, then, from the end, the ops: output rate (one of
// 8000, 16000, 22050, 44100, 48000, 7919), channels (1 or 2), samples per channel (1..4096), crop
// (start or random), dtype, layout, seeking allowed, max_duration_seconds (0.5, 5 or 60: the
// decoders' own bound on work, kept small so one input cannot run for minutes), the sample seed.
// The seeds (corpus/audio/, written by make_media_corpus.sh) are real WAV, FLAC, MP3, Ogg
// (Vorbis, Opus) and AAC/M4A files with such a trailer.
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - the result is a sample count in [0, num_samples], or kDataLoss, kResourceExhausted or
//     kFailedPrecondition with a message (never kInvalidArgument for valid ops, never kInternal);
//   - on OK, every sample after the valid ones is zero, in every channel;
//   - decoding twice (the decoder is reused, as a worker's is) into rows prefilled with different
//     bytes gives the same result and, on OK, the same bytes: the whole row is written and nothing
//     depends on uninitialised memory or on the last file;
//   - nothing is written outside the row (GuardedRow: poisoned guards with a pattern checked after
//     each call, for writes by the uninstrumented libraries).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "fuzz_check.h"
#include "guarded_row.h"
#include "media/audio_decoder.h"

namespace {

using namespace spdl;
using namespace spdl::media;

bool ZeroAfter(const uint8_t* row, const AudioOps& ops, int64_t valid) {
  const size_t bytes = ops.dtype == AudioDType::kFloat32 ? 4 : 2;
  for (int c = 0; c < ops.channels; ++c) {
    for (int64_t t = valid; t < ops.num_samples; ++t) {
      const size_t i = ops.layout == AudioLayout::kChannelsFirst ? static_cast<size_t>(c * ops.num_samples + t)
                                                                 : static_cast<size_t>(t * ops.channels + c);
      for (size_t k = 0; k < bytes; ++k) {
        if (row[i * bytes + k] != 0) return false;
      }
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static AudioDecoder* decoder = new AudioDecoder;

  FuzzedDataProvider in(data, size);
  AudioOps ops;
  static constexpr int kRates[] = {8000, 16000, 22050, 44100, 48000, 7919};
  ops.sample_rate = kRates[in.ConsumeIntegralInRange(0, 5)];
  ops.channels = in.ConsumeBool() ? 2 : 1;
  ops.num_samples = in.ConsumeIntegralInRange(1, 4096);
  ops.crop = in.ConsumeBool() ? AudioCrop::kRandom : AudioCrop::kStart;
  ops.dtype = in.ConsumeBool() ? AudioDType::kInt16 : AudioDType::kFloat32;
  ops.layout = in.ConsumeBool() ? AudioLayout::kChannelsLast : AudioLayout::kChannelsFirst;
  ops.allow_seek = in.ConsumeBool();
  static constexpr double kMaxSeconds[] = {0.5, 5, 60};
  ops.max_duration_seconds = kMaxSeconds[in.ConsumeIntegralInRange(0, 2)];
  const uint64_t seed = in.ConsumeIntegral<uint8_t>() * 0x9e3779b97f4a7c15ull;
  const std::vector<uint8_t> file = in.ConsumeRemainingBytes<uint8_t>();
  FUZZ_CHECK(ValidateAudioOps(ops).ok());

  const size_t row = AudioOutputBytes(ops);
  GuardedRow a(row, 0x55), b(row, 0xaa);

  AudioInfo info;
  const Result<int64_t> r = decoder->DecodeInto(file, ops, a.data(), seed, &info);
  const StatusCode code = r.status().code();
  FUZZ_TRACE("audio_fuzz: %s %d Hz x%d, %.2f s, start %lld%s: %s (%lld valid)\n", info.codec.c_str(), info.source_rate,
             info.source_channels, info.duration_seconds, static_cast<long long>(info.start_sample),
             info.seeked ? " (seeked)" : "", r.ok() ? "OK" : r.status().message().c_str(),
             static_cast<long long>(r.ok() ? *r : -1));
  a.CheckGuards();
  FUZZ_CHECK(code == StatusCode::kOk || code == StatusCode::kDataLoss || code == StatusCode::kResourceExhausted ||
             code == StatusCode::kFailedPrecondition);
  FUZZ_CHECK(r.ok() || !r.status().message().empty());
  if (r.ok()) {
    FUZZ_CHECK(*r >= 0 && *r <= ops.num_samples);
    FUZZ_CHECK(ZeroAfter(a.data(), ops, *r));
  }

  const Result<int64_t> r2 = decoder->DecodeInto(file, ops, b.data(), seed);
  b.CheckGuards();
  FUZZ_CHECK(r2.status().code() == code);
  if (r.ok()) {
    FUZZ_CHECK(*r2 == *r);
    FUZZ_CHECK(std::memcmp(a.data(), b.data(), row) == 0);
  }
  return 0;
}
