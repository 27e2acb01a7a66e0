// spdl-ops-bench: single-thread cost of spdld's media functions, one operation at a time, on
// files held in memory (no I/O in the timed loop). Driven by bench/ops/run_ops.py, which runs
// the same operations with PIL / torchvision and writes the comparison; not run by the tests.
//
//   spdl-ops-bench image [--repeats N] [--resample exact|fast|both] [--full-decode] FILE...   # decode and each
//                                                                                # transform
//     (--full-decode: each crop op also with the JPEG window decode off, as "OP (full decode)")
//   spdl-ops-bench audio [--repeats N] [--rate R] [--seconds S] FILE...
//   spdl-ops-bench video [--repeats N] [--frames T] [--stride S] [--size P] FILE...
//   spdl-ops-bench resample [--repeats N] FILE...   # the exact path's resampler alone (media/resample.h)
//                                                  # on images decoded to RGB beforehand
//
// Prints one JSON object per line and operation: {"kind", "op", "items", "cpu_s": [...],
// "wall_s": [...], "units": ...} with one figure per repeat (images also carry "resample"). CPU time is the process's
// (CLOCK_PROCESS_CPUTIME_ID; the decoders use one thread), so a busy machine does not inflate it.
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "media/audio_decoder.h"
#include "media/image_decoder.h"
#include "media/image_ops.h"
#include "media/resample.h"
#include "media/sample_random.h"
#include "media/video_decoder.h"

namespace {

using spdl::media::ImageOps;

double Now(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// The file's bytes, or nullopt (and a message) when it cannot be read.
std::optional<std::vector<uint8_t>> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    std::cerr << "cannot read " << path << "\n";
    return std::nullopt;
  }
  return std::vector<uint8_t>{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Runs `pass` (one pass over every item, returning false on an error) `repeats` times after one
// warm-up pass and prints the timings. Throws std::runtime_error when a pass fails (main: status 1).
void Measure(const std::string& kind, const std::string& op, size_t items, double units_per_pass,
             const std::string& unit, int repeats, const std::function<bool()>& pass,
             const std::string& resample = "") {
  if (!pass()) throw std::runtime_error(op + ": the warm-up pass failed");  // caches, page faults, first use
  nlohmann::json cpu = nlohmann::json::array(), wall = nlohmann::json::array();
  for (int r = 0; r < repeats; ++r) {
    const double c0 = Now(CLOCK_PROCESS_CPUTIME_ID), w0 = Now(CLOCK_MONOTONIC);
    if (!pass()) throw std::runtime_error(op + ": a timed pass failed");
    cpu.push_back(Now(CLOCK_PROCESS_CPUTIME_ID) - c0);
    wall.push_back(Now(CLOCK_MONOTONIC) - w0);
  }
  nlohmann::json j = {{"kind", kind}, {"op", op},     {"items", items}, {"units", units_per_pass},
                      {"unit", unit}, {"cpu_s", cpu}, {"wall_s", wall}};
  if (!resample.empty()) j["resample"] = resample;
  std::cout << j.dump() << '\n' << std::flush;  // a line per measurement as it is made
}

int Images(const std::vector<std::vector<uint8_t>>& files, int repeats, const std::string& resample, bool full_decode) {
  struct Op {
    std::string name;
    ImageOps ops;
    bool window = true;  // the JPEG window decode (ImageDecoder::set_jpeg_window_decode)
  };
  std::vector<Op> ops;
  ImageOps o;
  ops.push_back({"decode", o});
  o.resize_shorter = 256;
  ops.push_back({"decode+resize256", o});
  o.crop_height = o.crop_width = 224;
  ops.push_back({"decode+resize256+crop224", o});
  ImageOps r;
  r.random_crop_height = r.random_crop_width = 224;
  ops.push_back({"decode+random_resized_crop224", r});
  r.flip_probability = 0.5;
  ops.push_back({"decode+random_resized_crop224+flip", r});
  r.dtype = spdl::media::OutputDType::kFloat32;
  r.layout = spdl::media::OutputLayout::kNCHW;
  r.normalize = true;
  r.mean = {0.485, 0.456, 0.406};
  r.stddev = {0.229, 0.224, 0.225};
  ops.push_back({"decode+random_resized_crop224+flip+normalize_f32", r});

  std::vector<Op> all;
  for (const char* mode : {"exact", "fast"}) {
    if (resample != "both" && resample != mode) continue;
    for (Op op : ops) {
      op.ops.resample = std::string(mode) == "fast" ? spdl::media::Resample::kFast : spdl::media::Resample::kExact;
      all.push_back(op);
      if (full_decode && op.name.find("crop") != std::string::npos) {
        Op full = op;
        full.name += " (full decode)";
        full.window = false;
        all.push_back(full);
      }
    }
  }
  spdl::media::ImageDecoder window_decoder, full_decoder;
  full_decoder.set_jpeg_window_decode(false);
  std::vector<uint8_t> out;
  for (const Op& op : all) {
    spdl::media::ImageDecoder& decoder = op.window ? window_decoder : full_decoder;
    uint64_t epoch = 0;
    const std::string mode = op.ops.resample == spdl::media::Resample::kFast ? "fast" : "exact";
    Measure(
        "image", op.name, files.size(), static_cast<double>(files.size()), "images", repeats,
        [&] {
          ++epoch;
          for (size_t i = 0; i < files.size(); ++i) {
            spdl::media::ImageInfo info;
            if (!decoder.ReadJpegHeader(files[i], &info).ok()) {
              std::cerr << "file " << i << ": not a JPEG\n";
              return false;
            }
            int w = 0, h = 0;
            spdl::media::OutputSize(op.ops, info.width, info.height, &w, &h);
            const size_t bytes = spdl::media::OutputImageBytes(op.ops, w, h);
            if (out.size() < bytes) out.resize(bytes);
            spdl::Status s =
                decoder.DecodeInto(files[i], op.ops, out.data(), w, h, spdl::media::SampleSeed(1, epoch, i));
            if (!s.ok()) {
              std::cerr << "file " << i << ": " << s.ToString() << "\n";
              return false;
            }
          }
          return true;
        },
        mode);
  }
  return 0;
}

// The resampler alone (what the exact path runs after the decode): each file decoded once to RGB
// (full size) before timing; then per pass each image is copied into one work buffer (untimed: as
// a decoder would have just written it, so it is in the caches) and resized, shorter side to 256
// (torchvision Resize(256)'s size), or (eval transform) only its center 224 x 224 window computed;
// bilinear (the default filter) and bicubic. cpu_s / wall_s sum the Resample calls alone (thread
// CPU time).
int Resamples(const std::vector<std::vector<uint8_t>>& files, int repeats) {
  struct Decoded {
    std::vector<uint8_t> rgb;
    int width = 0, height = 0;
  };
  std::vector<Decoded> images;
  spdl::media::ImageDecoder decoder;
  for (size_t i = 0; i < files.size(); ++i) {
    spdl::media::ImageInfo info;
    if (!decoder.ReadJpegHeader(files[i], &info).ok())
      throw std::runtime_error("not a JPEG: file " + std::to_string(i));
    Decoded d;
    d.width = info.width;
    d.height = info.height;
    d.rgb.resize(static_cast<size_t>(d.width) * d.height * 3);
    const spdl::Status s = decoder.DecodeInto(files[i], ImageOps{}, d.rgb.data(), d.width, d.height);
    if (!s.ok()) throw std::runtime_error("file " + std::to_string(i) + ": " + s.ToString());
    images.push_back(std::move(d));
  }
  struct Op {
    std::string name;
    spdl::media::ResampleFilter filter;
    bool crop;
  };
  const Op ops[] = {{"resample:resize256(bilinear)", spdl::media::ResampleFilter::kBilinear, false},
                    {"resample:resize256+crop224(bilinear)", spdl::media::ResampleFilter::kBilinear, true},
                    {"resample:resize256+crop224(bicubic)", spdl::media::ResampleFilter::kBicubic, true}};
  spdl::media::Resampler resampler;
  std::vector<uint8_t> work, out;
  for (const Op& op : ops) {
    nlohmann::json cpu = nlohmann::json::array(), wall = nlohmann::json::array();
    for (int pass = 0; pass <= repeats; ++pass) {  // pass 0: the warm-up
      double cpu_s = 0, wall_s = 0;
      for (const Decoded& d : images) {
        spdl::media::ResampleRequest r;
        const bool tall = d.height > d.width;
        r.out_width = tall ? 256 : static_cast<int>(256LL * d.width / d.height);
        r.out_height = tall ? static_cast<int>(256LL * d.height / d.width) : 256;
        r.window_width = op.crop ? std::min(224, r.out_width) : r.out_width;
        r.window_height = op.crop ? std::min(224, r.out_height) : r.out_height;
        r.window_x = (r.out_width - r.window_width) / 2;
        r.window_y = (r.out_height - r.window_height) / 2;
        r.filter = op.filter;
        const size_t stride = static_cast<size_t>(r.window_width) * 3;
        if (out.size() < stride * r.window_height) out.resize(stride * r.window_height);
        work.assign(d.rgb.begin(), d.rgb.end());
        spdl::media::PackedImage src{work.data(), static_cast<size_t>(d.width) * 3, d.width, d.height, 3, false};
        const double c0 = Now(CLOCK_THREAD_CPUTIME_ID), w0 = Now(CLOCK_MONOTONIC);
        const spdl::Status s = resampler.Resample(src, r, out.data(), stride);
        cpu_s += Now(CLOCK_THREAD_CPUTIME_ID) - c0;
        wall_s += Now(CLOCK_MONOTONIC) - w0;
        if (!s.ok()) throw std::runtime_error(op.name + ": " + s.ToString());
      }
      if (pass > 0) {
        cpu.push_back(cpu_s);
        wall.push_back(wall_s);
      }
    }
    const nlohmann::json j = {{"kind", "image"},  {"op", op.name}, {"items", images.size()}, {"units", images.size()},
                              {"unit", "images"}, {"cpu_s", cpu},  {"wall_s", wall}};
    std::cout << j.dump() << '\n' << std::flush;
  }
  return 0;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%gs", s);
  return buf;
}

int Audio(const std::vector<std::vector<uint8_t>>& files, int repeats, int rate, double seconds) {
  spdl::media::AudioDecoder decoder;
  // The sources' total duration, for the "whole file" figure.
  double total_seconds = 0;
  {
    spdl::media::AudioOps probe;
    probe.num_samples = 1;
    std::vector<float> one(1);
    for (const auto& f : files) {
      spdl::media::AudioInfo info;
      if (!decoder.DecodeInto(f, probe, one.data(), 0, &info).ok()) return 1;
      total_seconds += info.duration_seconds;
    }
  }
  struct Op {
    std::string name;
    spdl::media::AudioOps ops;
    double units;
  };
  spdl::media::AudioOps whole;
  whole.sample_rate = rate;
  whole.channels = 1;
  whole.num_samples = static_cast<int64_t>(total_seconds / files.size() * rate * 1.1) + rate;
  spdl::media::AudioOps crop = whole;
  crop.num_samples = static_cast<int64_t>(seconds * rate);
  crop.crop = spdl::media::AudioCrop::kRandom;
  std::vector<Op> ops = {
      {"decode+resample_mono" + std::to_string(rate) + "(whole file)", whole, total_seconds},
      {"decode+resample_mono" + std::to_string(rate) + "+random_crop" + Seconds(seconds), crop, seconds * files.size()},
  };
  std::vector<float> out;
  for (const Op& op : ops) {
    out.resize(spdl::media::AudioOutputBytes(op.ops) / sizeof(float));
    uint64_t epoch = 0;
    Measure("audio", op.name, files.size(), op.units, "seconds of audio", repeats, [&] {
      ++epoch;
      for (size_t i = 0; i < files.size(); ++i) {
        auto r = decoder.DecodeInto(files[i], op.ops, out.data(), spdl::media::SampleSeed(1, epoch, i));
        if (!r.ok()) {
          std::cerr << "file " << i << ": " << r.status().ToString() << "\n";
          return false;
        }
      }
      return true;
    });
  }
  return 0;
}

int Video(const std::vector<std::vector<uint8_t>>& files, int repeats, int frames, int stride, int size) {
  spdl::media::VideoDecoder decoder;
  spdl::media::VideoOps ops;
  ops.num_frames = frames;
  ops.frame_stride = stride;
  ops.height = ops.width = size;
  ops.start = spdl::media::VideoStart::kRandom;
  std::vector<uint8_t> out(spdl::media::VideoOutputBytes(ops));
  for (bool seek : {true, false}) {
    ops.allow_seek = seek;
    uint64_t epoch = 0;
    const std::string name = "clip" + std::to_string(frames) + "x" + std::to_string(size) + "px_stride" +
                             std::to_string(stride) + "_random_start" + (seek ? "" : "(no seek)");
    Measure("video", name, files.size(), static_cast<double>(files.size()), "clips", repeats, [&] {
      ++epoch;
      for (size_t i = 0; i < files.size(); ++i) {
        auto r = decoder.DecodeInto(files[i], ops, out.data(), spdl::media::SampleSeed(1, epoch, i));
        if (!r.ok()) {
          std::cerr << "file " << i << ": " << r.status().ToString() << "\n";
          return false;
        }
      }
      return true;
    });
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"single-thread cost of spdld's media operations"};
  std::string kind;
  std::vector<std::string> paths;
  int repeats = 5, rate = 16000, frames = 16, stride = 2, size = 112;
  double seconds = 1.0;
  std::string resample = "both";
  app.add_option("kind", kind, "image | audio | video | resample")
      ->required()
      ->check(CLI::IsMember({"image", "audio", "video", "resample"}));
  app.add_option("files", paths, "input files")->required();
  app.add_option("--repeats", repeats, "timed passes over all files (after one warm-up)");
  app.add_option("--rate", rate, "audio: output sample rate");
  app.add_option("--seconds", seconds, "audio: crop length");
  app.add_option("--frames", frames, "video: frames per clip");
  app.add_option("--stride", stride, "video: frame stride");
  app.add_option("--size", size, "video: output height and width");
  app.add_option("--resample", resample, "image: exact, fast or both (each op once per path)")
      ->check(CLI::IsMember({"exact", "fast", "both"}));
  bool full_decode = false;
  app.add_flag("--full-decode", full_decode, "image: each crop op also with the JPEG window decode off");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::vector<uint8_t>> files;
  files.reserve(paths.size());
  for (const auto& p : paths) {
    auto bytes = ReadFile(p);
    if (!bytes) return 2;
    files.push_back(std::move(*bytes));
  }
  if (kind == "image") return Images(files, repeats, resample, full_decode);
  if (kind == "resample") return Resamples(files, repeats);
  if (kind == "audio") return Audio(files, repeats, rate, seconds);
  return Video(files, repeats, frames, stride, size);
} catch (const std::exception& e) {  // a failed pass, out of memory: a message and status 1, not abort()
  std::cerr << "ops_bench: " << e.what() << "\n";
  return 1;
}
