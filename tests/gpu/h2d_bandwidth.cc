// spdl-h2d-bandwidth: host-to-device copy bandwidth from pageable memory and from a page-locked
// memfd region (what the daemon's slot ring is), in GB/s, through CudaBackend.
//
//   spdl-h2d-bandwidth [MiB per copy, default 256] [repetitions, default 8]
//
// Without a CUDA device it says so and exits 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/device_handles.h"
#include "gpu_util.h"
#include "shm/shared_region.h"

namespace spdl::gpu_test {
namespace {

// Best and median GB/s of `reps` copies of `bytes` from `src`.
bool Measure(cuda::DeviceBackend& b, const void* src, size_t bytes, int reps, void* dst, cuda::Stream stream,
             double* best, double* median) {
  std::vector<double> rates;
  for (int i = 0; i < reps + 1; ++i) {  // the first is a warm-up
    const auto t0 = std::chrono::steady_clock::now();
    Status s = b.MemcpyH2DAsync(dst, src, bytes, stream);
    if (s.ok()) s = b.SynchronizeStream(stream);
    if (!s.ok()) {
      std::fprintf(stderr, "copy failed: %s\n", s.ToString().c_str());
      return false;
    }
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) rates.push_back(static_cast<double>(bytes) / sec / 1e9);
  }
  std::sort(rates.begin(), rates.end());
  *best = rates.back();
  *median = rates[rates.size() / 2];
  return true;
}

int Main(int argc, char** argv) {
  const size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  const int reps = argc > 2 ? ArgInt(argv[2]) : 8;
  const size_t bytes = mib << 20;
  std::string why;
  if (cuda::CudaDeviceCount(&why) == 0) {
    std::printf("H2D bandwidth: skipped: no CUDA device (%s)\n", why.c_str());
    return 0;
  }
  auto backend = cuda::CudaBackend::Create({0, nullptr});
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  cuda::DeviceBackend& b = **backend;
  auto dst = cuda::AllocDevice(b, bytes);
  auto stream = cuda::MakeStream(b);
  if (!dst.ok() || !stream.ok()) {
    std::fprintf(stderr, "setup failed\n");
    return 1;
  }

  std::vector<uint8_t> pageable(bytes);
  std::memset(pageable.data(), 1, bytes);  // fault it in
  double pg_best = 0, pg_med = 0;
  if (!Measure(b, pageable.data(), bytes, reps, dst->get().ptr, stream->get(), &pg_best, &pg_med)) return 1;

  auto region = shm::SharedRegion::Create("h2d_bandwidth", bytes);
  if (!region.ok()) {
    std::fprintf(stderr, "%s\n", region.status().ToString().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto reg = cuda::RegisterHost(b, region->data(), bytes);
  const double reg_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (!reg.ok()) {
    std::fprintf(stderr, "%s\n", reg.status().ToString().c_str());
    return 1;
  }
  double pin_best = 0, pin_med = 0;
  if (!Measure(b, region->data(), bytes, reps, dst->get().ptr, stream->get(), &pin_best, &pin_med)) return 1;

  std::printf("H2D bandwidth, %zu MiB per copy, %d copies, device %d:\n", mib, reps, b.device());
  std::printf("  pageable (malloc)                  : %6.2f GB/s median, %6.2f best\n", pg_med, pg_best);
  std::printf("  pinned (memfd + cudaHostRegister)  : %6.2f GB/s median, %6.2f best\n", pin_med, pin_best);
  std::printf("  pinned / pageable                  : %6.2fx\n", pin_med / pg_med);
  std::printf("  cudaHostRegister of %zu MiB took %.1f ms (once per job)\n", mib, reg_ms);
  return 0;
}

}  // namespace
}  // namespace spdl::gpu_test

int main(int argc, char** argv) { return spdl::gpu_test::Main(argc, argv); }
