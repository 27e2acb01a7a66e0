// video_fuzz: a video sample's bytes through VideoDecoder::DecodeInto — the call every video job
// makes per sample (jobs/sample_decoder.cc) — into a buffer of exactly one slot row
// (VideoOutputBytes), so that ASan sees any write past the row: libavformat's probe and demuxer
// over the in-memory reader (av_input.cc), the seek, the decoder, frame selection, swscale and the
// repeat of the last frame.
//
// Input (FuzzedDataProvider): the file first, then, from the end, the ops: frames (1..4), stride
// (1..3), fps (0 = by stride, 1, 7.5 or 30), start (fixed or random), start_seconds (0..2 in
// quarters), output height and width (1..24), interpolation, seeking allowed, max_pixels (4096 or
// 2^20), the sample seed. max_decoded_frames is 300: the decoder's own bound on work, kept small so
// one input cannot run for minutes. The seeds (corpus/video/, written by make_media_corpus.sh) are
// real MP4 (H.264, MPEG-4), WebM (VP8, VP9), MKV, AVI (MJPEG) and GIF clips with such a trailer.
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - the result is a frame count in [0, num_frames], or kDataLoss, kResourceExhausted or
//     kFailedPrecondition with a message (never kInvalidArgument for valid ops, never kInternal);
//   - on OK the source frame size is within max_pixels and at most max_decoded_frames were decoded;
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
#include "media/video_decoder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace spdl;
  using namespace spdl::media;
  static VideoDecoder* decoder = new VideoDecoder;

  FuzzedDataProvider in(data, size);
  VideoOps ops;
  ops.num_frames = in.ConsumeIntegralInRange(1, 4);
  ops.frame_stride = in.ConsumeIntegralInRange(1, 3);
  static constexpr double kFps[] = {0, 1, 7.5, 30};
  ops.fps = kFps[in.ConsumeIntegralInRange(0, 3)];
  ops.start = in.ConsumeBool() ? VideoStart::kRandom : VideoStart::kFixed;
  ops.start_seconds = in.ConsumeIntegralInRange(0, 8) * 0.25;
  ops.height = in.ConsumeIntegralInRange(1, 24);
  ops.width = in.ConsumeIntegralInRange(1, 24);
  ops.interpolation = static_cast<Interpolation>(in.ConsumeIntegralInRange(0, 2));
  ops.allow_seek = in.ConsumeBool();
  ops.max_pixels = in.ConsumeBool() ? 4096 : int64_t{1} << 20;
  ops.max_decoded_frames = 300;
  const uint64_t seed = in.ConsumeIntegral<uint8_t>() * 0x9e3779b97f4a7c15ull;
  const std::vector<uint8_t> file = in.ConsumeRemainingBytes<uint8_t>();
  FUZZ_CHECK(ValidateVideoOps(ops).ok());

  const size_t row = VideoOutputBytes(ops);
  GuardedRow a(row, 0x55), b(row, 0xaa);

  VideoInfo info;
  const Result<int> r = decoder->DecodeInto(file, ops, a.data(), seed, &info);
  const StatusCode code = r.status().code();
  FUZZ_TRACE("video_fuzz: %s %dx%d %.2f fps, %lld frames, from %lld%s, %lld decoded: %s (%d real)\n",
             info.codec.c_str(), info.width, info.height, info.frame_rate, static_cast<long long>(info.frame_count),
             static_cast<long long>(info.first_index), info.seeked ? " (seeked)" : "",
             static_cast<long long>(info.decoded_frames), r.ok() ? "OK" : r.status().message().c_str(),
             r.ok() ? *r : -1);
  a.CheckGuards();
  FUZZ_CHECK(code == StatusCode::kOk || code == StatusCode::kDataLoss || code == StatusCode::kResourceExhausted ||
             code == StatusCode::kFailedPrecondition);
  FUZZ_CHECK(r.ok() || !r.status().message().empty());
  if (r.ok()) {
    FUZZ_CHECK(*r >= 0 && *r <= ops.num_frames);
    FUZZ_CHECK(int64_t{info.width} * info.height <= ops.max_pixels);
    FUZZ_CHECK(info.decoded_frames <= ops.max_decoded_frames);
  }

  const Result<int> r2 = decoder->DecodeInto(file, ops, b.data(), seed);
  b.CheckGuards();
  FUZZ_CHECK(r2.status().code() == code);
  if (r.ok()) {
    FUZZ_CHECK(*r2 == *r);
    FUZZ_CHECK(std::memcmp(a.data(), b.data(), row) == 0);
  }
  return 0;
}
