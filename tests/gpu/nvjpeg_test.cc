// [gpu] GPU JPEG decode on a real device: NvjpegBackend (libnvjpeg.so.13 loaded at run time) and
// CudaImageKernels under GpuJpegBatchDecoder on a CudaBackend, against the CPU path
// (media::ImageDecoder) on the same files. Without a CUDA device (or without nvJPEG) each case
// says SKIPPED (tests/skip.h; ctest: Skipped).
//
// Stated tolerance (uint8 outputs, levels 0..255; the kernels' arithmetic equals the CPU path's
// exactly, tests/unit/gpu_decode_test.cc, so what differs is nvJPEG's decode vs libjpeg-turbo's:
// IDCT, chroma upsampling, YCbCr -> RGB rounding): mean |GPU - CPU| <= 1.5 and the 99.9th
// percentile <= 16, per image. The measured figures are printed (and land in bench/GPU_RESULTS.md
// through tests/gpu/run.sh).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/image_kernels.h"
#include "cuda/jpeg_decode.h"
#include "cuda/nvjpeg_backend.h"
#include "jobs/gpu_decode_plan.h"
#include "media/image_decoder.h"
#include "media/image_ops.h"
#include "media/jpeg_encoder.h"
#include "skip.h"

namespace spdl::gpu_test {
namespace {

constexpr double kMaxMeanAbs = 1.5;
constexpr int kMaxP999 = 16;

struct Gpu {
  std::unique_ptr<cuda::CudaBackend> backend;
  std::unique_ptr<cuda::NvjpegBackend> nvjpeg;
};

// The device and nvJPEG, or a visible skip.
std::optional<Gpu> Open() {
  std::string why;
  if (cuda::CudaDeviceCount(&why) == 0) {
    SPDL_SKIP_PART("no CUDA device (" << why << ")");
    return std::nullopt;
  }
  Gpu g;
  auto b = cuda::CudaBackend::Create({});
  REQUIRE(b.ok());
  g.backend = std::move(*b);
  auto nv = cuda::NvjpegBackend::Create({});
  if (!nv.ok()) {
    SPDL_SKIP_PART("no nvJPEG: " << nv.status().ToString());
    return std::nullopt;
  }
  g.nvjpeg = std::move(*nv);
  return g;
}

std::vector<uint8_t> Pattern(int w, int h, int salt) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * (3 + c) + y * (5 - c) + ((x / 9 + y / 7 + salt) % 4) * 50) & 0xFF);
  return px;
}

TEST_CASE("[gpu] nvJPEG decode + kernels equal the CPU path within the stated tolerance", "[gpu]") {
  auto g = Open();
  if (!g) return;
  INFO("nvJPEG hardware decoder: " << (g->nvjpeg->hardware() ? "yes" : "no"));
  media::ImageOps ops;
  ops.resize_shorter = 256;
  ops.crop_height = ops.crop_width = 224;
  const int ow = 224, oh = 224;
  const size_t row = media::OutputImageBytes(ops, ow, oh);
  jobs::GpuValueTables tables = jobs::MakeGpuValueTables(ops);
  std::vector<std::vector<uint8_t>> files;
  for (auto [w, h, q, sub] : {std::tuple{500, 375, 90, media::ChromaSubsampling::k420},
                              {640, 480, 95, media::ChromaSubsampling::k444},
                              {333, 500, 85, media::ChromaSubsampling::k422},
                              {1024, 768, 90, media::ChromaSubsampling::k420}}) {
    auto j = media::EncodeJpeg(Pattern(w, h, w).data(), w, h, q, sub);
    REQUIRE(j.ok());
    files.push_back(*j);
  }
  cuda::CudaImageKernels kernels(0);
  int cpu_calls = 0;
  cuda::GpuJpegBatchDecoder::Options o;
  o.output_bytes = row;
  cuda::GpuJpegBatchDecoder dec(
      *g->backend, *g->nvjpeg, kernels,
      [&](std::span<const uint8_t> jpeg, void* out, size_t) {
        ++cpu_calls;
        media::ImageDecoder d;
        return d.DecodeInto(jpeg, ops, out, ow, oh, 0);
      },
      o);
  auto dev = g->backend->DeviceAlloc(row * files.size());
  REQUIRE(dev.ok());
  auto stream = g->backend->CreateStream();
  REQUIRE(stream.ok());
  std::vector<cuda::GpuDecodeSample> samples;
  for (size_t i = 0; i < files.size(); ++i) {
    cuda::GpuDecodeSample s;
    s.jpeg = files[i];
    s.dst = static_cast<uint8_t*>(*dev) + i * row;
    s.plan = [&](int w, int h, cuda::imgmath::OutputSpec* spec) -> Result<cuda::imgmath::ResizePlan> {
      bool flip = false;
      SPDL_ASSIGN_OR_RETURN(auto plan, jobs::PlanGpuImage(ops, w, h, ow, oh, 0, &flip));
      *spec = tables.spec;
      spec->width = ow;
      spec->height = oh;
      spec->flip = flip;
      return plan;
    };
    samples.push_back(std::move(s));
  }
  for (int round = 0; round < 2; ++round) {  // the second reuses the scratch
    const auto r = dec.DecodeBatch(samples, *stream);
    for (const auto& s : r) REQUIRE(s.ok());
  }
  REQUIRE(dec.Finish().ok());
  std::vector<uint8_t> host(row * files.size());
  REQUIRE(g->backend->MemcpyD2HAsync(host.data(), *dev, host.size(), *stream).ok());
  REQUIRE(g->backend->SynchronizeStream(*stream).ok());
  CHECK(cpu_calls == 0);
  CHECK(dec.stats().gpu_decoded == 2 * files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    media::ImageDecoder d;
    std::vector<uint8_t> cpu(row);
    REQUIRE(d.DecodeInto(files[i], ops, cpu.data(), ow, oh, 0).ok());
    std::vector<int> diff(row);
    double sum = 0;
    for (size_t k = 0; k < row; ++k) {
      diff[k] = std::abs(int(host[i * row + k]) - int(cpu[k]));
      sum += diff[k];
    }
    std::sort(diff.begin(), diff.end());
    const double mean = sum / row;
    const int p999 = diff[row * 999 / 1000];
    std::printf("nvjpeg-vs-cpu image %zu: mean |diff| %.3f levels, p99.9 %d, max %d\n", i, mean, p999, diff.back());
    CHECK(mean <= kMaxMeanAbs);
    CHECK(p999 <= kMaxP999);
  }
  REQUIRE(g->backend->DestroyStream(*stream).ok());
  REQUIRE(g->backend->DeviceFree(*dev).ok());
}

TEST_CASE("[gpu] nvJPEG refusals go to the CPU path, a corrupt file fails alone", "[gpu]") {
  auto g = Open();
  if (!g) return;
  media::ImageOps ops;
  ops.resize_height = 64;
  ops.resize_width = 64;
  const size_t row = media::OutputImageBytes(ops, 64, 64);
  jobs::GpuValueTables tables = jobs::MakeGpuValueTables(ops);
  auto good = media::EncodeJpeg(Pattern(200, 150, 1).data(), 200, 150);
  REQUIRE(good.ok());
  std::vector<uint8_t> truncated = *good;
  truncated.resize(truncated.size() / 3);
  std::vector<uint8_t> garbage(500, 0x5a);
  std::vector<std::vector<uint8_t>> files{*good, truncated, garbage, *good};
  cuda::CudaImageKernels kernels(0);
  cuda::GpuJpegBatchDecoder::Options o;
  o.output_bytes = row;
  cuda::GpuJpegBatchDecoder dec(
      *g->backend, *g->nvjpeg, kernels,
      [&](std::span<const uint8_t> jpeg, void* out, size_t) {
        media::ImageDecoder d;
        return d.DecodeInto(jpeg, ops, out, 64, 64, 0);
      },
      o);
  auto dev = g->backend->DeviceAlloc(row * files.size());
  REQUIRE(dev.ok());
  auto stream = g->backend->CreateStream();
  REQUIRE(stream.ok());
  std::vector<cuda::GpuDecodeSample> samples;
  for (size_t i = 0; i < files.size(); ++i) {
    cuda::GpuDecodeSample s;
    s.jpeg = files[i];
    s.dst = static_cast<uint8_t*>(*dev) + i * row;
    s.plan = [&](int w, int h, cuda::imgmath::OutputSpec* spec) -> Result<cuda::imgmath::ResizePlan> {
      bool flip = false;
      SPDL_ASSIGN_OR_RETURN(auto plan, jobs::PlanGpuImage(ops, w, h, 64, 64, 0, &flip));
      *spec = tables.spec;
      spec->width = spec->height = 64;
      return plan;
    };
    samples.push_back(std::move(s));
  }
  const auto r = dec.DecodeBatch(samples, *stream);
  REQUIRE(dec.Finish().ok());
  CHECK(r[0].ok());
  CHECK(r[1].code() == StatusCode::kDataLoss);
  CHECK(r[2].code() == StatusCode::kDataLoss);
  CHECK(r[3].ok());
  const auto& st = dec.stats();
  std::printf("nvjpeg refusals: gpu %llu, cpu fallback %llu (header %llu, decode %llu), retries %llu, failed %llu\n",
              (unsigned long long)st.gpu_decoded, (unsigned long long)st.cpu_fallback,
              (unsigned long long)st.fallback_header, (unsigned long long)st.fallback_decode,
              (unsigned long long)st.batch_retries, (unsigned long long)st.failed);
  CHECK(st.gpu_decoded == 2);
  CHECK(st.failed == 2);
  REQUIRE(g->backend->DestroyStream(*stream).ok());
  REQUIRE(g->backend->DeviceFree(*dev).ok());
}

}  // namespace
}  // namespace spdl::gpu_test
