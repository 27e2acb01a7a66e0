// spdl-yuv-resample-bench: swscale against libyuv for the fused crop + resize + YUV -> RGB step of
// the fast path, one thread, on the same windows (torchvision RandomResizedCrop(224) windows drawn
// as spdld draws them) of 4:2:0 JPEGs decoded once to Y/Cb/Cr planes outside the timed loop.
// Not a test; built only when libyuv (Debian libyuv-dev) is installed: spdld does not use libyuv.
//
//   spdl-yuv-resample-bench [--repeats N] [--size S] FILE...
//
// Prints, per method, the scaling step's rate (windows per CPU-second, best of the repeats) and
// its distance to the exact path's pixels (ImageDecoder with Resample::kExact on the same window:
// PIL's bilinear with area averaging when downscaling) as mean absolute difference in levels:
//   swscale  one sws_scale from the YUV420P window to RGB24 (SWS_BILINEAR + spdld's flags)
//   libyuv   I420Scale (kFilterBox: averaging when downscaling, as PIL) to S x S, then
//            J420ToRAW (full-range BT.601, JPEG's) to RGB
#include <libyuv.h>
#include <time.h>
#include <turbojpeg.h>

extern "C" {
#include <libavutil/log.h>
#include <libswscale/swscale.h>
}

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "media/image_decoder.h"
#include "media/image_ops.h"
#include "media/sample_random.h"

namespace {

double Cpu() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

struct Item {
  int w = 0, h = 0;
  std::vector<uint8_t> y, u, v;        // planes, strides w and (w + 1) / 2
  int cx = 0, cy = 0, cw = 0, ch = 0;  // the window, even-aligned (chroma starts on a sample)
  std::vector<uint8_t> exact;          // the exact path's output for the window
};

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"swscale vs libyuv: crop + resize + YUV -> RGB"};
  int repeats = 5, size = 224;
  std::vector<std::string> paths;
  app.add_option("--repeats", repeats);
  app.add_option("--size", size);
  app.add_option("files", paths)->required();
  CLI11_PARSE(app, argc, argv);
  av_log_set_level(AV_LOG_ERROR);  // YUVJ420P (full range, as JPEG) is "deprecated" but exact

  tjhandle tj = tjInitDecompress();
  spdl::media::ImageDecoder exact;
  std::vector<Item> items;
  for (size_t i = 0; i < paths.size(); ++i) {
    std::ifstream f(paths[i], std::ios::binary);
    const std::vector<uint8_t> jpeg{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    int w, h, samp, cs;
    if (tjDecompressHeader3(tj, jpeg.data(), jpeg.size(), &w, &h, &samp, &cs) != 0 || samp != TJSAMP_420) continue;
    Item it;
    it.w = w;
    it.h = h;
    const int cw2 = (w + 1) / 2, ch2 = (h + 1) / 2;
    // Slack after each plane and output: TurboJPEG and the SIMD readers / writers of swscale and
    // libyuv may touch a few bytes past a plane's end.
    constexpr size_t kSlack = 4096;
    it.y.resize(static_cast<size_t>(w) * h + kSlack);
    it.u.resize(static_cast<size_t>(cw2) * ch2 + kSlack);
    it.v.resize(it.u.size());
    unsigned char* planes[3] = {it.y.data(), it.u.data(), it.v.data()};
    int strides[3] = {w, cw2, cw2};
    if (tjDecompressToYUVPlanes(tj, jpeg.data(), jpeg.size(), planes, w, strides, h, 0) != 0) continue;
    // The window spdld draws for this sample, and the exact path's pixels for it.
    spdl::media::ImageOps ops;
    ops.random_crop_width = ops.random_crop_height = size;
    it.exact.resize(static_cast<size_t>(size) * size * 3);  // exactly: compared with out's first bytes
    spdl::media::ImageInfo info;
    const uint64_t seed = spdl::media::SampleSeed(1, 1, i);
    if (!exact.DecodeInto(jpeg, ops, it.exact.data(), size, size, seed, &info).ok()) continue;
    it.cx = info.crop.x / 2 * 2;  // even (x, y >= 0): the chroma planes are half the size
    it.cy = info.crop.y / 2 * 2;
    it.cw = std::min(info.crop.width + (info.crop.x - it.cx), w - it.cx);
    it.ch = std::min(info.crop.height + (info.crop.y - it.cy), h - it.cy);
    items.push_back(std::move(it));
  }
  tjDestroy(tj);
  if (items.empty()) {
    std::cerr << "no 4:2:0 JPEGs\n";
    return 1;
  }

  const size_t n = static_cast<size_t>(size) * size * 3;
  std::vector<uint8_t> out(n + 4096), sy(static_cast<size_t>(size) * size + 4096),
      su(static_cast<size_t>(size / 2 + 1) * (size / 2 + 1) + 4096), sv(su.size());
  const int half = (size + 1) / 2;
  auto run = [&](const char* name, auto&& step) {
    double best = 1e9, diff = 0;
    for (int r = 0; r <= repeats; ++r) {
      const double t0 = Cpu();
      long long sum = 0;
      for (Item& it : items) {
        step(it);
        if (r == 0) {
          for (size_t k = 0; k < n; ++k) sum += std::abs(int{out[k]} - int{it.exact[k]});
        }
      }
      if (r == 0) {
        diff = static_cast<double>(sum) / (static_cast<double>(n) * items.size());
      } else {
        best = std::min(best, Cpu() - t0);
      }
    }
    std::printf("%-8s %zu windows: %8.0f windows/s (one thread, best of %d), mean abs diff to exact %.2f\n", name,
                items.size(), items.size() / best, repeats, diff);
  };
  run("swscale", [&](Item& it) {
    SwsContext* c = sws_getContext(it.cw, it.ch, AV_PIX_FMT_YUVJ420P, size, size, AV_PIX_FMT_RGB24,
                                   SWS_BILINEAR | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT | SWS_FULL_CHR_H_INP, nullptr,
                                   nullptr, nullptr);
    const int cw2 = (it.w + 1) / 2;
    const uint8_t* src[4] = {it.y.data() + static_cast<size_t>(it.cy) * it.w + it.cx,
                             it.u.data() + static_cast<size_t>(it.cy / 2) * cw2 + it.cx / 2,
                             it.v.data() + static_cast<size_t>(it.cy / 2) * cw2 + it.cx / 2, nullptr};
    const int ss[4] = {it.w, cw2, cw2, 0};
    uint8_t* dst[4] = {out.data(), nullptr, nullptr, nullptr};
    const int ds[4] = {size * 3, 0, 0, 0};
    sws_scale(c, src, ss, 0, it.ch, dst, ds);
    sws_freeContext(c);
  });
  run("libyuv", [&](Item& it) {
    const int cw2 = (it.w + 1) / 2;
    libyuv::I420Scale(it.y.data() + static_cast<size_t>(it.cy) * it.w + it.cx, it.w,
                      it.u.data() + static_cast<size_t>(it.cy / 2) * cw2 + it.cx / 2, cw2,
                      it.v.data() + static_cast<size_t>(it.cy / 2) * cw2 + it.cx / 2, cw2, it.cw, it.ch, sy.data(),
                      size, su.data(), half, sv.data(), half, size, size, libyuv::kFilterBox);
    libyuv::J420ToRAW(sy.data(), size, su.data(), half, sv.data(), half, out.data(), size * 3, size, size);
  });
  return 0;
} catch (const std::exception& e) {  // out of memory, a library's error: a message and status 1, not abort()
  std::cerr << "yuv_resample_bench: " << e.what() << "\n";
  return 1;
}
