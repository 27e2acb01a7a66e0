// spdl-gpu-decode-bench: JPEG decode + resize + crop + normalise on the CPU path (media::ImageDecoder,
// one thread) and on the GPU path (nvJPEG batches + the resize kernels, GpuJpegBatchDecoder) over
// the same files: samples/s and host CPU time per sample (the process's CPU clock) for each.
//
//   spdl-gpu-decode-bench [images, default 512] [batch, default 64]
//
// The images: generated JPEGs (4:2:0, quality 90) of sizes around ImageNet's (375..640 x 333..500);
// the ops: ImageNet eval (resize 256, center crop 224, float32 NCHW normalised). One line per path,
// "decode-bench <path>: ...", which tests/gpu/run.sh copies into bench/GPU_RESULTS.md. Without a
// CUDA device or nvJPEG it says so (the CPU line still comes) and exits 0.
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/image_kernels.h"
#include "cuda/jpeg_decode.h"
#include "cuda/nvjpeg_backend.h"
#include "gpu_util.h"
#include "jobs/gpu_decode_plan.h"
#include "media/image_decoder.h"
#include "media/image_ops.h"
#include "media/jpeg_encoder.h"

namespace spdl::gpu_test {
namespace {

double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<uint8_t> Pattern(int w, int h, int salt) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  uint32_t x32 = 2463534242u + salt;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        x32 ^= x32 << 13;
        x32 ^= x32 >> 17;
        x32 ^= x32 << 5;
        // smooth gradients plus a little noise: compresses like a photo, not like noise
        px[(static_cast<size_t>(y) * w + x) * 3 + c] = static_cast<uint8_t>(
            ((x * (2 + c) + y * (3 - c)) / 3 + ((x / 16 + y / 16 + salt) % 5) * 30 + (x32 & 7)) & 0xFF);
      }
  return px;
}

int Main(int argc, char** argv) {
  const int n = argc > 1 ? ArgInt(argv[1]) : 512;
  const int batch = argc > 2 ? ArgInt(argv[2]) : 64;
  if (n < 1 || batch < 1) {
    std::fprintf(stderr, "usage: spdl-gpu-decode-bench [images] [batch]\n");
    return 2;
  }
  std::vector<std::vector<uint8_t>> files;
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    const int w = 375 + (i * 37) % 266, h = 333 + (i * 53) % 168;
    auto j = media::EncodeJpeg(Pattern(w, h, i).data(), w, h, 90);
    if (!j.ok()) {
      std::fprintf(stderr, "encode: %s\n", j.status().ToString().c_str());
      return 1;
    }
    bytes += j->size();
    files.push_back(std::move(*j));
  }
  media::ImageOps ops;
  ops.resize_shorter = 256;
  ops.crop_height = ops.crop_width = 224;
  ops.dtype = media::OutputDType::kFloat32;
  ops.layout = media::OutputLayout::kNCHW;
  ops.normalize = true;
  ops.mean = {0.485, 0.456, 0.406};
  ops.stddev = {0.229, 0.224, 0.225};
  const int ow = 224, oh = 224;
  const size_t row = media::OutputImageBytes(ops, ow, oh);
  std::printf("decode-bench files: %d JPEGs, %.1f KiB mean, ImageNet eval ops (resize 256, crop 224, float32 NCHW)\n",
              n, bytes / 1024.0 / n);

  // CPU path, one thread.
  {
    media::ImageDecoder dec;
    std::vector<uint8_t> out(row);
    const double c0 = CpuSeconds(), w0 = WallSeconds();
    for (const auto& f : files) {
      if (Status s = dec.DecodeInto(f, ops, out.data(), ow, oh, 0); !s.ok()) {
        std::fprintf(stderr, "cpu decode: %s\n", s.ToString().c_str());
        return 1;
      }
    }
    const double cpu = CpuSeconds() - c0, wall = WallSeconds() - w0;
    std::printf(
        "decode-bench cpu (libjpeg-turbo + PIL resampling, 1 thread): %.0f samples/s, %.3f ms host CPU/sample\n",
        n / wall, cpu * 1e3 / n);
  }

  std::string why;
  if (cuda::CudaDeviceCount(&why) == 0) {
    std::printf("decode-bench gpu: no CUDA device (%s): not measured\n", why.c_str());
    return 0;
  }
  auto backend = cuda::CudaBackend::Create({});
  if (!backend.ok()) {
    std::printf("decode-bench gpu: %s\n", backend.status().ToString().c_str());
    return 1;
  }
  auto nv = cuda::NvjpegBackend::Create({});
  if (!nv.ok()) {
    std::printf("decode-bench gpu: no nvJPEG (%s): not measured\n", nv.status().ToString().c_str());
    return 0;
  }
  cuda::CudaImageKernels kernels(0);
  jobs::GpuValueTables tables = jobs::MakeGpuValueTables(ops);
  cuda::GpuJpegBatchDecoder::Options o;
  o.output_bytes = row;
  cuda::GpuJpegBatchDecoder dec(
      **backend, **nv, kernels,
      [&](std::span<const uint8_t> jpeg, void* out, size_t) {
        media::ImageDecoder d;
        return d.DecodeInto(jpeg, ops, out, ow, oh, 0);
      },
      o);
  auto dev = (*backend)->DeviceAlloc(row * batch);
  auto stream = (*backend)->CreateStream();
  if (!dev.ok() || !stream.ok()) {
    std::printf("decode-bench gpu: device memory or stream: %s\n",
                dev.ok() ? stream.status().ToString().c_str() : dev.status().ToString().c_str());
    return 1;
  }
  auto run = [&](int count) -> Status {
    for (int start = 0; start < count; start += batch) {
      std::vector<cuda::GpuDecodeSample> samples;
      for (int i = start; i < std::min(count, start + batch); ++i) {
        cuda::GpuDecodeSample s;
        s.jpeg = files[i];
        s.dst = static_cast<uint8_t*>(*dev) + (i - start) * row;
        s.plan = [&](int w, int h, cuda::imgmath::OutputSpec* spec) -> Result<cuda::imgmath::ResizePlan> {
          bool flip = false;
          SPDL_ASSIGN_OR_RETURN(auto plan, jobs::PlanGpuImage(ops, w, h, ow, oh, 0, &flip));
          *spec = tables.spec;
          spec->width = ow;
          spec->height = oh;
          spec->lut_f32 = tables.f32.data();
          return plan;
        };
        samples.push_back(std::move(s));
      }
      for (const Status& s : dec.DecodeBatch(samples, *stream)) SPDL_RETURN_IF_ERROR(s);
    }
    return dec.Finish();
  };
  if (Status s = run(std::min(n, batch)); !s.ok()) {  // warm-up: nvJPEG's buffers, the kernels' module
    std::printf("decode-bench gpu: %s\n", s.ToString().c_str());
    return 1;
  }
  const double c0 = CpuSeconds(), w0 = WallSeconds();
  if (Status s = run(n); !s.ok()) {
    std::printf("decode-bench gpu: %s\n", s.ToString().c_str());
    return 1;
  }
  const double cpu = CpuSeconds() - c0, wall = WallSeconds() - w0;
  const auto& st = dec.stats();
  std::printf(
      "decode-bench gpu (nvJPEG %s, batches of %d, 1 host thread): %.0f samples/s, %.3f ms host CPU/sample; "
      "cpu fallbacks %llu\n",
      (*nv)->hardware() ? "hardware decoder" : "GPU (no hardware decoder)", batch, n / wall, cpu * 1e3 / n,
      (unsigned long long)st.cpu_fallback);
  (void)(*backend)->DestroyStream(*stream);
  (void)(*backend)->DeviceFree(*dev);
  return 0;
}

}  // namespace
}  // namespace spdl::gpu_test

int main(int argc, char** argv) { return spdl::gpu_test::Main(argc, argv); }
