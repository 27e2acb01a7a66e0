// GPU JPEG decode (decode.device: cuda) on machines without a GPU:
//   - the pixel math the CUDA kernels run (gpu/cuda/image_math.h, planned by jobs/gpu_decode_plan.h)
//     gives the CPU path's output for the same decoded image, value for value (tolerance 0: same
//     weights, same fixed point, same value tables), over the geometries, filters, dtypes and
//     layouts a job can ask for;
//   - GpuJpegBatchDecoder's batching, CPU fallback and stats against FakeNvjpeg / FakeImageKernels
//     on FakeBackend (testing/cuda/fake_nvjpeg.h): what nvJPEG refuses (progressive, CMYK, a side
//     over its limit, a header it cannot read) is decoded on the CPU and uploaded, a batch that
//     fails as a whole is retried image by image, corrupt files fail alone, and the work is
//     asynchronous on the caller's stream.
// The nvJPEG decode itself (vs libjpeg-turbo) is measured on a GPU only: tests/gpu (gpu_test,
// "[gpu] nvJPEG").
#include <turbojpeg.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/fake_backend.h"
#include "cuda/fake_nvjpeg.h"
#include "cuda/image_math.h"
#include "cuda/jpeg_decode.h"
#include "jobs/gpu_decode_plan.h"
#include "media/image_decoder.h"
#include "media/image_ops.h"
#include "media/jpeg_encoder.h"
#include "media/sample_random.h"

namespace spdl {
namespace {

using media::ImageOps;

// A Result<bool>'s value, or `otherwise` when it failed.
inline bool ValueOr(const Result<bool>& r, bool otherwise) { return r.ok() ? *r : otherwise; }

std::vector<uint8_t> Pattern(int w, int h, int salt = 0) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * (3 + c) + y * (5 - c) + ((x / 7 + y / 5 + salt) % 3) * 60) & 0xFF);
  return px;
}

std::vector<uint8_t> Jpeg(int w, int h, int salt = 0) {
  auto j = media::EncodeJpeg(Pattern(w, h, salt).data(), w, h, 90);
  REQUIRE(j.ok());
  return *j;
}

// TurboJPEG directly, for what EncodeJpeg does not make (progressive, CMYK).
std::vector<uint8_t> TjEncode(const std::vector<uint8_t>& px, int w, int h, int pf, int flags) {
  tjhandle tj = tjInitCompress();
  REQUIRE(tj != nullptr);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, px.data(), w, 0, h, pf, &buf, &size, TJSAMP_444, 90, flags);
  tjDestroy(tj);
  REQUIRE(rc == 0);
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  return out;
}

// The CPU path's output for one sample.
std::vector<uint8_t> CpuOutput(const std::vector<uint8_t>& jpeg, const ImageOps& ops, int ow, int oh, uint64_t seed) {
  media::ImageDecoder dec;
  std::vector<uint8_t> out(media::OutputImageBytes(ops, ow, oh));
  const Status s = dec.DecodeInto(jpeg, ops, out.data(), ow, oh, seed);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out;
}

// libjpeg-turbo's full-size RGB decode (what nvJPEG's output stands for in the math test).
std::vector<uint8_t> FullDecode(const std::vector<uint8_t>& jpeg, int w, int h) {
  media::ImageDecoder dec(media::JpegDecodePath::kRgb);
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  REQUIRE(dec.DecodeJpegInto(jpeg, ImageOps{}, px.data(), w, h, static_cast<size_t>(w) * 3).ok());
  return px;
}

// The GPU path's math on the host: plan + tables + image_math.h.
Result<std::vector<uint8_t>> GpuMathOutput(const std::vector<uint8_t>& decoded, int w, int h, const ImageOps& ops,
                                           int ow, int oh, uint64_t seed) {
  bool flip = false;
  SPDL_ASSIGN_OR_RETURN(cuda::imgmath::ResizePlan plan, jobs::PlanGpuImage(ops, w, h, ow, oh, seed, &flip));
  jobs::GpuValueTables t = jobs::MakeGpuValueTables(ops);
  cuda::imgmath::OutputSpec o = t.spec;
  o.width = ow;
  o.height = oh;
  o.flip = flip;
  o.lut_f32 = t.f32.data();
  o.lut_u16 = t.u16.data();
  std::vector<uint8_t> out(media::OutputImageBytes(ops, ow, oh));
  std::vector<uint8_t> mid;
  cuda::imgmath::RunResizeOnHost(decoded.data(), static_cast<size_t>(w) * 3, plan, o, out.data(), mid);
  return out;
}

struct OpsCase {
  const char* name;
  ImageOps ops;
  int ow, oh;
};

std::vector<OpsCase> Cases() {
  std::vector<OpsCase> v;
  {
    ImageOps o;  // ImageNet eval: Resize(256) + CenterCrop(224), bilinear, uint8 NHWC
    o.resize_shorter = 64;
    o.crop_height = o.crop_width = 56;
    v.push_back({"resize shorter + center crop, bilinear, uint8 NHWC", o, 56, 56});
  }
  {
    ImageOps o;
    o.resize_height = 40;
    o.resize_width = 70;
    o.interpolation = media::Interpolation::kBicubic;
    o.dtype = media::OutputDType::kFloat32;
    o.layout = media::OutputLayout::kNCHW;
    o.normalize = true;
    o.mean = {0.485, 0.456, 0.406};
    o.stddev = {0.229, 0.224, 0.225};
    v.push_back({"exact size, bicubic, float32 NCHW normalised", o, 70, 40});
  }
  {
    ImageOps o;  // training: RandomResizedCrop + flip
    o.random_crop_height = o.random_crop_width = 48;
    o.flip_probability = 0.5;
    o.dtype = media::OutputDType::kFloat16;
    v.push_back({"random resized crop + flip, bilinear, float16", o, 48, 48});
  }
  for (auto [interp, name] : {std::pair{media::Interpolation::kNearest, "nearest, upscale, bfloat16 NCHW"},
                              {media::Interpolation::kArea, "area (box), upscale, bfloat16 NCHW"},
                              {media::Interpolation::kLanczos, "lanczos, upscale, bfloat16 NCHW"},
                              {media::Interpolation::kHamming, "hamming, upscale, bfloat16 NCHW"}}) {
    ImageOps o;
    o.resize_shorter = 150;
    o.crop_height = 140;
    o.crop_width = 150;
    o.interpolation = interp;
    o.dtype = media::OutputDType::kBFloat16;
    o.layout = media::OutputLayout::kNCHW;
    v.push_back({name, o, 150, 140});
  }
  {
    ImageOps o;  // one axis unchanged: PIL copies it
    o.resize_height = 90;
    o.resize_width = 60;
    v.push_back({"one axis unchanged (copied), uint8", o, 60, 90});
  }
  return v;
}

TEST_CASE("GPU decode math: the kernels' arithmetic gives the CPU path's values exactly", "[gpu_decode]") {
  for (auto [w, h] : {std::pair{120, 90}, {97, 131}}) {
    const std::vector<uint8_t> jpeg = Jpeg(w, h);
    const std::vector<uint8_t> decoded = FullDecode(jpeg, w, h);
    for (const OpsCase& c : Cases()) {
      REQUIRE(media::ValidateImageOps(c.ops).ok());
      REQUIRE(jobs::CheckGpuDecodeOps(c.ops).ok());
      for (uint64_t seed : {1ull, 77ull, 12345ull}) {
        if (c.ops.resize_height == 90 && h != 90) continue;  // the copied axis needs h == 90
        INFO(c.name << " image " << w << "x" << h << " seed " << seed);
        auto gpu = GpuMathOutput(decoded, w, h, c.ops, c.ow, c.oh, seed);
        INFO(gpu.status().ToString());
        REQUIRE(gpu.ok());
        const std::vector<uint8_t> cpu = CpuOutput(jpeg, c.ops, c.ow, c.oh, seed);
        REQUIRE(gpu->size() == cpu.size());
        size_t differ = 0;
        for (size_t i = 0; i < cpu.size(); ++i) differ += (*gpu)[i] != cpu[i];
        CHECK(differ == 0);
      }
    }
  }
}

TEST_CASE("GPU decode plan: what it cannot express goes to the CPU path, bad settings are named", "[gpu_decode]") {
  ImageOps pad;
  pad.resize_shorter = 20;
  pad.crop_height = pad.crop_width = 32;  // crop larger than the image: padding
  bool flip = false;
  auto p = jobs::PlanGpuImage(pad, 40, 30, 32, 32, 1, &flip);
  CHECK(p.status().code() == StatusCode::kFailedPrecondition);
  auto wrong = jobs::PlanGpuImage(pad, 40, 30, 31, 32, 1, &flip);
  CHECK(wrong.status().code() == StatusCode::kInvalidArgument);
  ImageOps gray;
  gray.channels = 1;
  CHECK_THAT(jobs::CheckGpuDecodeOps(gray).message(), Catch::Contains("decode.color: gray"));
  ImageOps exif;
  exif.exif_orientation = true;
  CHECK_THAT(jobs::CheckGpuDecodeOps(exif).message(), Catch::Contains("exif_orientation"));
}

// The decoder on the fake device: FakeBackend ("daemon" process), FakeNvjpeg, FakeImageKernels.
struct Rig {
  cuda::FakeDevice device;
  cuda::FakeBackend backend{device, "daemon"};
  cuda::FakeNvjpeg nvjpeg;
  cuda::FakeImageKernels kernels{backend};
  ImageOps ops;
  int ow = 56, oh = 56;
  size_t row_bytes = 0;
  jobs::GpuValueTables tables;
  std::unique_ptr<cuda::GpuJpegBatchDecoder> decoder;
  int cpu_calls = 0;

  explicit Rig(int max_side = 16384) : nvjpeg(backend, max_side) {
    ops.resize_shorter = 64;
    ops.crop_height = ops.crop_width = 56;
    ops.dtype = media::OutputDType::kFloat32;
    ops.normalize = true;
    ops.mean = {0.5, 0.5, 0.5};
    ops.stddev = {0.25, 0.25, 0.25};
    row_bytes = media::OutputImageBytes(ops, ow, oh);
    tables = jobs::MakeGpuValueTables(ops);
    cuda::GpuJpegBatchDecoder::Options o;
    o.output_bytes = row_bytes;
    o.max_pixels = 1 << 20;
    decoder = std::make_unique<cuda::GpuJpegBatchDecoder>(
        backend, nvjpeg, kernels,
        [this](std::span<const uint8_t> jpeg, void* out, size_t bytes) {
          ++cpu_calls;
          media::ImageDecoder dec;
          if (bytes != row_bytes) return InvalidArgument("row size");
          return dec.DecodeInto(jpeg, ops, out, ow, oh, 0);
        },
        o);
  }
  cuda::GpuDecodeSample Sample(const std::vector<uint8_t>& jpeg, void* dst) {
    cuda::GpuDecodeSample s;
    s.jpeg = jpeg;
    s.dst = dst;
    s.plan = [this](int w, int h, cuda::imgmath::OutputSpec* o) -> Result<cuda::imgmath::ResizePlan> {
      bool flip = false;
      SPDL_ASSIGN_OR_RETURN(auto plan, jobs::PlanGpuImage(ops, w, h, ow, oh, 0, &flip));
      *o = tables.spec;
      o->width = ow;
      o->height = oh;
      o->flip = flip;
      o->lut_f32 = tables.f32.data();
      o->lut_u16 = tables.u16.data();
      return plan;
    };
    return s;
  }
};

TEST_CASE("GpuJpegBatchDecoder: one nvJPEG batch, CPU fallback for what nvJPEG refuses, counted", "[gpu_decode]") {
  Rig rig(/*max_side=*/150);
  std::vector<std::vector<uint8_t>> files;
  std::vector<const char*> what;
  files.push_back(Jpeg(120, 90, 0)), what.push_back("baseline");
  files.push_back(Jpeg(90, 120, 1)), what.push_back("baseline");
  files.push_back(TjEncode(Pattern(100, 80, 2), 100, 80, TJPF_RGB, TJFLAG_PROGRESSIVE)), what.push_back("progressive");
  {
    std::vector<uint8_t> cmyk(100 * 80 * 4);
    const auto rgb = Pattern(100, 80, 3);
    for (size_t i = 0; i < 100 * 80; ++i) {
      for (int c = 0; c < 3; ++c) cmyk[4 * i + c] = static_cast<uint8_t>(255 - rgb[3 * i + c]);
      cmyk[4 * i + 3] = 255;
    }
    files.push_back(TjEncode(cmyk, 100, 80, TJPF_CMYK, 0)), what.push_back("cmyk");
  }
  files.push_back(Jpeg(200, 100, 4)), what.push_back("oversized for the decoder");
  {
    std::vector<uint8_t> truncated = Jpeg(120, 90, 5);
    truncated.resize(truncated.size() / 2);
    files.push_back(truncated), what.push_back("truncated");
  }
  files.push_back(std::vector<uint8_t>(300, 0x42)), what.push_back("not a jpeg");
  files.push_back(Jpeg(2000, 1000, 6)), what.push_back("over max_pixels");
  const size_t n = files.size();
  auto dev = rig.backend.DeviceAlloc(rig.row_bytes * n);
  REQUIRE(dev.ok());
  auto stream = rig.backend.CreateStream();
  REQUIRE(stream.ok());
  std::vector<cuda::GpuDecodeSample> samples;
  samples.reserve(n);
  for (size_t i = 0; i < n; ++i)
    samples.push_back(rig.Sample(files[i], static_cast<uint8_t*>(*dev) + i * rig.row_bytes));

  const std::vector<Status> r = rig.decoder->DecodeBatch(samples, *stream);
  REQUIRE(rig.decoder->Finish().ok());
  REQUIRE(r.size() == n);
  std::vector<uint8_t> host(rig.row_bytes * n);
  REQUIRE(rig.backend.MemcpyD2HAsync(host.data(), *dev, host.size(), *stream).ok());
  REQUIRE(rig.backend.SynchronizeStream(*stream).ok());
  for (size_t i = 0; i < n; ++i) {
    INFO(what[i] << ": " << r[i].ToString());
    const std::string w = what[i];
    if (w == "truncated" || w == "not a jpeg") {
      CHECK(r[i].code() == StatusCode::kDataLoss);  // the CPU path's verdict
    } else if (w == "over max_pixels") {
      CHECK(r[i].code() == StatusCode::kResourceExhausted);
    } else {
      REQUIRE(r[i].ok());
      // nvJPEG's stand-in decodes with libjpeg-turbo, so here the GPU path must equal the CPU path
      // exactly (on a GPU, nvJPEG's IDCT makes the difference measured by gpu_test).
      const std::vector<uint8_t> cpu = CpuOutput(files[i], rig.ops, rig.ow, rig.oh, 0);
      CHECK(std::memcmp(host.data() + i * rig.row_bytes, cpu.data(), rig.row_bytes) == 0);
    }
  }
  const cuda::GpuDecodeStats& st = rig.decoder->stats();
  CHECK(st.batches == 1);
  // The truncated file passes the header check, fails the batch as a whole; image by image it
  // fails alone, on the GPU and then on the CPU. The progressive one too.
  CHECK(rig.nvjpeg.batches() == 1);
  CHECK(st.batch_retries == 1);
  CHECK(rig.nvjpeg.ones() == 4);  // 2 baseline, progressive, truncated
  CHECK(st.gpu_decoded == 2);
  CHECK(st.fallback_header == 1);       // not a jpeg
  CHECK(st.fallback_unsupported == 2);  // cmyk, oversized
  CHECK(st.fallback_decode == 2);       // progressive, truncated
  CHECK(st.cpu_fallback == 5);
  CHECK(rig.cpu_calls == 5);
  CHECK(st.failed == 3);  // truncated, not a jpeg (CPU path), over max_pixels
  CHECK(rig.kernels.launches() == 2);
  REQUIRE(rig.backend.DestroyStream(*stream).ok());
  rig.decoder.reset();
  REQUIRE(rig.backend.DeviceFree(*dev).ok());
  CHECK(rig.device.live().empty());
  CHECK(rig.device.violations().empty());
}

TEST_CASE("GpuJpegBatchDecoder: asynchronous on the stream, failures of nvJPEG itself fail the batch", "[gpu_decode]") {
  Rig rig;
  const std::vector<uint8_t> a = Jpeg(120, 90, 7), b = Jpeg(64, 64, 8);
  auto dev = rig.backend.DeviceAlloc(rig.row_bytes * 2);
  REQUIRE(dev.ok());
  auto stream = rig.backend.CreateStream();
  auto gate = rig.backend.CreateEvent(false);
  REQUIRE(stream.ok());
  REQUIRE(gate.ok());
  // Work already queued on the stream that has not run (a busy GPU): the decode is enqueued behind
  // it and DecodeBatch returns without waiting; its completion waits for the gate.
  REQUIRE(rig.backend.RecordEvent(*gate, *stream).ok());
  rig.backend.SetEventPending(*gate, true);
  std::vector<cuda::GpuDecodeSample> samples{rig.Sample(a, *dev),
                                             rig.Sample(b, static_cast<uint8_t*>(*dev) + rig.row_bytes)};
  auto r = rig.decoder->DecodeBatch(samples, *stream);
  CHECK((r[0].ok() && r[1].ok()));
  auto probe = rig.backend.CreateEvent(false);
  REQUIRE(probe.ok());
  REQUIRE(rig.backend.RecordEvent(*probe, *stream).ok());
  CHECK_FALSE(ValueOr(rig.backend.QueryEvent(*probe), true));
  rig.backend.SetEventPending(*gate, false);
  CHECK(rig.decoder->Finish().ok());
  CHECK(ValueOr(rig.backend.QueryEvent(*probe), false));

  // An execution failure of the batch: retried image by image (the files are fine).
  rig.nvjpeg.FailNext(static_cast<int>(cuda::NvjpegStatus::kExecutionFailed));
  r = rig.decoder->DecodeBatch(samples, *stream);
  CHECK((r[0].ok() && r[1].ok()));
  CHECK(rig.decoder->stats().batch_retries == 1);
  CHECK(rig.decoder->stats().cpu_fallback == 0);
  // An allocator failure while decoding one image: the device's trouble, not the file's: the batch
  // fails, named, and nothing runs silently on the CPU.
  rig.nvjpeg.FailNext(static_cast<int>(cuda::NvjpegStatus::kExecutionFailed));
  rig.nvjpeg.FailNext(static_cast<int>(cuda::NvjpegStatus::kAllocatorFailure));
  r = rig.decoder->DecodeBatch(samples, *stream);
  for (const Status& s : r) {
    CHECK(s.code() == StatusCode::kResourceExhausted);
    CHECK_THAT(s.message(), Catch::Contains("NVJPEG_STATUS_ALLOCATOR_FAILURE"));
  }
  CHECK(rig.decoder->stats().cpu_fallback == 0);
  CHECK(rig.decoder->Finish().ok());
  REQUIRE(rig.backend.DestroyEvent(*probe).ok());
  REQUIRE(rig.backend.DestroyEvent(*gate).ok());
  REQUIRE(rig.backend.DestroyStream(*stream).ok());
  rig.decoder.reset();
  REQUIRE(rig.backend.DeviceFree(*dev).ok());
  CHECK(rig.device.live().empty());
  CHECK(rig.device.violations().empty());
}

TEST_CASE("nvJPEG status codes map to Status codes and names", "[gpu_decode]") {
  using cuda::NvjpegStatus;
  CHECK(cuda::NvjpegError(static_cast<int>(NvjpegStatus::kBadJpeg), "nvjpegDecode").code() == StatusCode::kDataLoss);
  CHECK(cuda::NvjpegError(static_cast<int>(NvjpegStatus::kJpegNotSupported), "x").code() ==
        StatusCode::kFailedPrecondition);
  CHECK(cuda::NvjpegError(static_cast<int>(NvjpegStatus::kAllocatorFailure), "x").code() ==
        StatusCode::kResourceExhausted);
  CHECK_THAT(cuda::NvjpegError(static_cast<int>(NvjpegStatus::kExecutionFailed), "nvjpegDecodeBatched").message(),
             Catch::Contains("nvjpegDecodeBatched: NVJPEG_STATUS_EXECUTION_FAILED"));
  CHECK(cuda::NvjpegError(0, "x").ok());
}

}  // namespace
}  // namespace spdl
