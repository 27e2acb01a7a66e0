// End to end, for the media side: a real spdld serving a folder of mixed image formats (JPEG,
// PNG, WebP, BMP, TIFF, GIF, written here by libjpeg-turbo and FFmpeg's encoders) as normalized
// float32 NCHW batches, checked against decodes done in the test; and random transforms that give
// the same bytes on every run (and after a resume) and different ones every epoch.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "media/image_decoder.h"
#include "media/image_encoder.h"
#include "media/pixel_convert.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;

// Mean absolute difference (8-bit levels) allowed between the daemon's output and the test's
// reference decode (full-size decode, whole-image resize, then crop). The images carry fine
// noise, and the daemon's source window is rounded to whole pixels (and JPEGs are DCT-scaled),
// so single pixels differ; as in e2e_test.
constexpr double kMeanAbsTolerance = 6.0;

using testing::TempDir;    // e2e/e2e_support.h
using testing::WriteFile;  // e2e/e2e_support.h

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// One kind of file in the folder: a format, how its pixels are stored, and its file name ending.
struct Kind {
  const char* name;
  media::ImageFormat format;
  media::RawPixels pixels;
  bool lossless_webp;
  const char* extension;
};

const Kind kKinds[] = {
    {"jpeg", media::ImageFormat::kJpeg, media::RawPixels::kRgb24, false, ".jpg"},
    {"png", media::ImageFormat::kPng, media::RawPixels::kRgb24, false, ".png"},
    {"png-rgba", media::ImageFormat::kPng, media::RawPixels::kRgba, false, ".png"},
    {"png-16bit", media::ImageFormat::kPng, media::RawPixels::kRgb48, false, ".png"},
    {"webp-lossless", media::ImageFormat::kWebp, media::RawPixels::kRgb24, true, ".webp"},
    {"webp-lossy", media::ImageFormat::kWebp, media::RawPixels::kRgb24, false, ".webp"},
    {"bmp", media::ImageFormat::kBmp, media::RawPixels::kRgb24, false, ".bmp"},
    {"tiff", media::ImageFormat::kTiff, media::RawPixels::kRgb24, false, ".tif"},
    {"gif-gray", media::ImageFormat::kGif, media::RawPixels::kGray8, false, ".gif"},
    // PNG bytes under a .jpg name: the decoder goes by the magic bytes.
    {"png-named-jpg", media::ImageFormat::kPng, media::RawPixels::kRgb24, false, ".jpg"},
};

media::RawImage ToRaw(const std::vector<uint8_t>& rgb, int w, int h, media::RawPixels pixels) {
  media::RawImage raw;
  raw.pixels = pixels;
  raw.width = w;
  raw.height = h;
  const size_t n = static_cast<size_t>(w) * h;
  switch (pixels) {
    case media::RawPixels::kRgb24:
      raw.data = rgb;
      break;
    case media::RawPixels::kRgba:
      for (size_t i = 0; i < n; ++i) {
        raw.data.insert(raw.data.end(),
                        {rgb[3 * i], rgb[3 * i + 1], rgb[3 * i + 2], static_cast<uint8_t>(i * 7 % 256)});
      }
      break;
    case media::RawPixels::kGray8:
      for (size_t i = 0; i < n; ++i) {
        raw.data.push_back(static_cast<uint8_t>((rgb[3 * i] * 77 + rgb[3 * i + 1] * 150 + rgb[3 * i + 2] * 29) >> 8));
      }
      break;
    case media::RawPixels::kRgb48: {
      raw.data.resize(n * 6);
      auto* p = reinterpret_cast<uint16_t*>(raw.data.data());
      for (size_t i = 0; i < n * 3; ++i) p[i] = static_cast<uint16_t>(rgb[i] * 257 + (i % 97));
      break;
    }
    default:
      FAIL("not used here");
  }
  return raw;
}

// An image folder: `classes` sub-folders, `per_class` files each, cycling through kKinds.
struct MixedFolder {
  MixedFolder(int classes, int per_class) {
    int index = 0;
    for (int c = 0; c < classes; ++c) {
      const std::string dir = root() + "/class_" + std::to_string(c);
      fs::create_directories(dir);
      for (int i = 0; i < per_class; ++i, ++index) {
        const Kind& kind = kKinds[index % std::size(kKinds)];
        const int w = 90 + (index * 37) % 130, h = 70 + (index * 53) % 120;
        const std::vector<uint8_t> rgb = testdata::SynthesizeImage(5, index, w, h, 6);
        media::EncodeOptions eo;
        eo.lossless = kind.lossless_webp;
        Result<std::vector<uint8_t>> bytes = media::EncodeImage(kind.format, ToRaw(rgb, w, h, kind.pixels), eo);
        if (!bytes.ok() && bytes.status().code() == StatusCode::kFailedPrecondition) {
          missing.insert(kind.name);  // e.g. an FFmpeg without libwebp
          continue;
        }
        REQUIRE(bytes.ok());
        const std::string rel = "class_" + std::to_string(c) + "/img_" + std::to_string(i) + kind.extension;
        WriteFile(root() + "/" + rel, *bytes);
        kind_of[rel] = kind.name;
        label_of[rel] = c;
      }
    }
    for (const std::string& m : missing) WARN("no encoder for " << m << ": those files are left out");
  }
  std::string root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }

  TempDir dir;
  std::map<std::string, std::string> kind_of;
  std::map<std::string, int64_t> label_of;
  std::set<std::string> missing;
};

constexpr const char* kExtensions = "[.jpg, .jpeg, .png, .webp, .bmp, .tif, .tiff, .gif]";

client::Options Opts(const MixedFolder& f, const std::string& yaml, uint32_t epochs) {
  client::Options o;
  o.socket_path = f.socket();
  o.config_yaml = yaml;
  o.config_name = "job.yaml";
  o.epochs = epochs;
  return o;
}

TEST_CASE("a folder of mixed formats becomes normalized float32 NCHW batches") {
  MixedFolder f(3, 10);  // every kind three times
  // A truncated file of each FFmpeg-decoded format family is skipped and counted.
  {
    const std::vector<uint8_t> good = ReadAll(f.root() + "/class_0/img_1.png");
    WriteFile(f.root() + "/class_2/cut.png", std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2));
  }
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  const int H = 64, W = 56;  // not square: a swapped height and width would show
  std::ostringstream yaml;
  yaml << "source: {type: image_folder, root: " << f.root() << ", extensions: " << kExtensions << "}\n"
       << "sampler: {shuffle: true, seed: 3}\n"
       << "batch: {size: 4}\n"
       << "transforms:\n"
       << "  - resize: {shorter: 72}\n"
       << "  - center_crop: {size: [" << H << ", " << W << "]}\n"
       << "  - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}\n"
       << "output: {dtype: float32, layout: NCHW}\n"
       << "prefetch: 3\n";
  auto loader = client::Loader::Open(Opts(f, yaml.str(), 1));
  REQUIRE(loader.ok());
  const client::JobInfo& info = (*loader)->info();
  REQUIRE(info.layout.size() == 2);
  CHECK(info.layout[0].name == "image");
  CHECK(info.layout[0].dtype == client::DType::kFloat32);
  CHECK(info.layout[0].shape == std::vector<int64_t>{4, 3, H, W});
  CHECK(info.layout[0].bytes == size_t{4} * 3 * H * W * 4);

  // The test's own references: the same geometry in uint8 from the decoder's fast path (the
  // daemon must hold exactly these values, normalized) and from its reference path.
  media::ImageOps u8;
  u8.resize_shorter = 72;
  u8.crop_height = H;
  u8.crop_width = W;
  const double mean[3] = {0.485, 0.456, 0.406}, stddev[3] = {0.229, 0.224, 0.225};
  media::ImageDecoder decoder;
  std::vector<uint8_t> fast(static_cast<size_t>(H) * W * 3), ref(fast.size());
  // 16-bit sources keep their 16 bits in float output: for those the daemon must hold exactly what
  // the decoder gives for the job's own ops (and stay within tolerance of the 8-bit reference).
  media::ImageOps f32 = u8;
  f32.dtype = media::OutputDType::kFloat32;
  f32.layout = media::OutputLayout::kNCHW;
  f32.normalize = true;
  f32.mean = {mean[0], mean[1], mean[2]};
  f32.stddev = {stddev[0], stddev[1], stddev[2]};
  std::vector<float> wide(static_cast<size_t>(H) * W * 3);

  std::map<std::string, int> seen_kinds;
  uint64_t rows = 0, inexact = 0;
  double worst_mean_abs = 0;
  for (;;) {
    auto ev = (*loader)->Next();
    REQUIRE(ev.ok());
    if (auto* st = std::get_if<client::JobStats>(&*ev)) {
      CHECK(st->skipped == 1);
      CHECK(st->samples == f.kind_of.size());
      break;
    }
    auto* b = std::get_if<client::Batch>(&*ev);
    if (b == nullptr) continue;
    const client::TensorView* image = b->tensor("image");
    REQUIRE(image != nullptr);
    REQUIRE(image->dtype == client::DType::kFloat32);
    REQUIRE(image->shape == std::vector<int64_t>{b->rows(), 3, H, W});
    REQUIRE(image->bytes == size_t{b->rows()} * 3 * H * W * 4);
    const auto* px = static_cast<const float*>(image->data);
    for (uint32_t r = 0; r < b->rows(); ++r) {
      const std::string& path = b->paths()[r];
      REQUIRE(f.kind_of.count(path));
      CHECK(static_cast<const int64_t*>(b->tensor("label")->data)[r] == f.label_of.at(path));
      ++seen_kinds[f.kind_of.at(path)];
      ++rows;
      const std::vector<uint8_t> bytes = ReadAll(f.root() + "/" + path);
      REQUIRE(decoder.DecodeRgbInto(bytes, u8, fast.data(), W, H, size_t{W} * 3).ok());
      REQUIRE(decoder.ReferenceDecodeInto(bytes, u8, ref.data(), W, H, size_t{W} * 3).ok());
      media::ImageInfo decoded;
      REQUIRE(decoder.DecodeInto(bytes, f32, wide.data(), W, H, 0, &decoded).ok());
      CHECK(decoded.sample_bits == (f.kind_of.at(path) == "png-16bit" ? 16 : 8));
      const float* row = px + static_cast<size_t>(r) * 3 * H * W;
      double sum = 0;
      for (int c = 0; c < 3; ++c) {
        for (int y = 0; y < H; ++y) {
          for (int x = 0; x < W; ++x) {
            const float got = row[(static_cast<size_t>(c) * H + y) * W + x];
            const size_t hwc = (static_cast<size_t>(y) * W + x) * 3 + c;
            const float want = decoded.sample_bits == 16
                                   ? wide[(static_cast<size_t>(c) * H + y) * W + x]
                                   : static_cast<float>((fast[hwc] / 255.0 - mean[c]) / stddev[c]);
            inexact += got != want;
            sum += std::abs((got * stddev[c] + mean[c]) * 255.0 - ref[hwc]);
          }
        }
      }
      const double mean_abs = sum / (3.0 * H * W);
      INFO(path << " (" << f.kind_of.at(path) << "): mean abs vs reference " << mean_abs);
      CHECK(mean_abs <= kMeanAbsTolerance);
      worst_mean_abs = std::max(worst_mean_abs, mean_abs);
    }
  }
  CHECK(rows == f.kind_of.size());
  CHECK(inexact == 0);
  for (const Kind& k : kKinds) {
    if (f.missing.count(k.name)) continue;
    INFO(k.name);
    CHECK(seen_kinds[k.name] == 3);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

// Every delivered row, by (epoch, path): its bytes.
using Rows = std::map<std::pair<uint32_t, std::string>, std::vector<uint8_t>>;

// Runs a job to the end (or, with stop_after > 0, for that many batches), collecting its rows;
// returns the resume token of the last batch taken.
std::string Collect(const client::Options& opts, Rows* rows, int stop_after = 0) {
  auto loader = client::Loader::Open(opts);
  REQUIRE(loader.ok());
  int batches = 0;
  for (;;) {
    auto ev = (*loader)->Next();
    REQUIRE(ev.ok());
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::Batch>(&*ev);
    if (b == nullptr) continue;
    const client::TensorView* image = b->tensor("image");
    const size_t row_bytes = image->bytes / b->rows();
    for (uint32_t r = 0; r < b->rows(); ++r) {
      const auto* p = static_cast<const uint8_t*>(image->data) + r * row_bytes;
      (*rows)[{b->epoch(), b->paths()[r]}] = std::vector<uint8_t>(p, p + row_bytes);
    }
    if (stop_after > 0 && ++batches == stop_after) return (*loader)->state();
  }
  return (*loader)->state();
}

TEST_CASE("random transforms give the same bytes on every run and resume, and differ by epoch") {
  MixedFolder f(2, 10);
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  std::ostringstream yaml;
  yaml << "source: {type: image_folder, root: " << f.root() << ", extensions: " << kExtensions << "}\n"
       << "sampler: {shuffle: true, seed: 11}\n"
       << "batch: {size: 3}\n"
       << "transforms:\n"
       << "  - random_resized_crop: {size: 40, scale: [0.08, 1.0]}\n"
       << "  - horizontal_flip: {p: 0.5}\n"
       << "output: {dtype: bfloat16, layout: NCHW}\n"
       << "prefetch: 4\n";
  const client::Options opts = Opts(f, yaml.str(), 3);
  Rows first, second;
  Collect(opts, &first);
  Collect(opts, &second);
  const size_t n = f.kind_of.size();
  REQUIRE(first.size() == 3 * n);
  CHECK(first == second);  // thread timing plays no part

  // Each epoch draws new crops and flips for every sample.
  int same_across_epochs = 0;
  for (const auto& [path, kind] : f.kind_of) {
    same_across_epochs += first.at({0, path}) == first.at({1, path});
    same_across_epochs += first.at({1, path}) == first.at({2, path});
  }
  CHECK(same_across_epochs <= 1);

  // A job resumed after a few batches delivers the rest with the same bytes.
  Rows head, tail;
  const std::string token = Collect(opts, &head, 4);
  REQUIRE_FALSE(token.empty());
  client::Options resumed = opts;
  resumed.resume_token = token;
  Collect(resumed, &tail);
  CHECK(head.size() + tail.size() == first.size());
  for (const auto& [key, bytes] : tail) {
    INFO("epoch " << key.first << " " << key.second);
    CHECK(first.at(key) == bytes);
  }

  // Another seed: other crops.
  client::Options reseeded = opts;
  reseeded.overrides = {{"sampler.seed", "12"}};
  Rows other;
  Collect(reseeded, &other);
  int same = 0;
  for (const auto& [key, bytes] : other) same += first.at(key) == bytes;
  CHECK(same <= 1);
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
