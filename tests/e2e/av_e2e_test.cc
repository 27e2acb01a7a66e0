// End to end, for audio and video jobs: a real spdld serving class folders of WAV, FLAC and MP3
// files (sines of a known amplitude and frequency per class) and of MP4/H.264 and WebM/VP9 clips
// (one solid colour per class), all written here by the `ffmpeg` command line. Checks: spdl-client
// --record sees every sample once per epoch with its label; the C++ client gets the tensors
// JobAccepted declares (audio [B, C, L] + length, video [B, T, H, W, 3] + frames, + label) with
// the right valid lengths and frame counts and values close to the signal (a sine's RMS and
// frequency, a frame's mean colour); a random-crop audio job resumed from a token delivers the same
// bytes as an uninterrupted run.
#include <stdlib.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "e2e/daemon_process.h"
#include "e2e/e2e_support.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunCommand;

const std::string kClient = std::string(SPDL_BIN_DIR) + "/spdl-client";

using testing::TempDir;  // e2e/e2e_support.h

// Runs the ffmpeg command line; the test fails if it does.
void Ffmpeg(const std::string& args) {
  const std::string cmd = "ffmpeg -nostdin -hide_banner -loglevel error -y " + args;
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
}

// One generated file: its label and what it holds.
struct Item {
  int64_t label = 0;
  double seconds = 0;      // audio: duration
  double frequency = 0;    // audio: the sine's frequency (Hz)
  bool lossy = false;      // MP3: the decoded length and waveform are approximate
  int frames = 0;          // video: source frames
  int rgb[3] = {0, 0, 0};  // video: the solid colour
};

constexpr double kAmplitude = 0.5;  // every sine: 0.5 * sin(2 pi f t), RMS 0.5 / sqrt(2)

// class_0: 440 Hz, class_1: 880 Hz; WAV (22.05 kHz stereo), FLAC (16 kHz mono), MP3 (22.05 kHz
// mono), 0.5 s and 1.5 s long, so that a 1 s clip is padded for some and cropped for others.
struct AudioFolder {
  AudioFolder() {
    const double freqs[2] = {440, 880};
    for (int c = 0; c < 2; ++c) {
      const std::string dir = root() + "/class_" + std::to_string(c);
      fs::create_directories(dir);
      for (double secs : {0.5, 1.5}) {
        const std::string expr = "aevalsrc=" + std::to_string(kAmplitude) + "*sin(2*PI*" +
                                 std::to_string(static_cast<int>(freqs[c])) + "*t)";
        const std::string stem = "sine_" + std::to_string(static_cast<int>(secs * 10));
        const std::string tail = ":s=22050:d=" + std::to_string(secs) + "\" ";
        const std::string src = "-f lavfi -i \"" + expr + tail;
        // Stereo with the sine in both channels (aevalsrc: one expression per channel; `-ac 2`
        // would scale each by 1/sqrt(2)), so the mono mix (L + R) / 2 is the sine again.
        Ffmpeg("-f lavfi -i \"" + expr + "|" + expr.substr(std::string("aevalsrc=").size()) + tail + "-c:a pcm_s16le " +
               dir + "/" + stem + ".wav");
        Ffmpeg(src + "-ar 16000 -c:a flac " + dir + "/" + stem + ".flac");
        Ffmpeg(src + "-c:a libmp3lame -b:a 128k " + dir + "/" + stem + ".mp3");
        for (const char* ext : {".wav", ".flac", ".mp3"}) {
          Item it;
          it.label = c;
          it.seconds = secs;
          it.frequency = freqs[c];
          it.lossy = std::string(ext) == ".mp3";
          items["class_" + std::to_string(c) + "/" + stem + ext] = it;
        }
      }
    }
  }
  std::string root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }

  TempDir dir;
  std::map<std::string, Item> items;  // by path relative to root
};

// class_0: red MP4/H.264, class_1: blue WebM/VP9; 64x48 at 10 fps, 2 s (20 frames) and 1 s (10).
struct VideoFolder {
  VideoFolder() {
    const char* colours[2] = {"red", "blue"};
    const int rgbs[2][3] = {{255, 0, 0}, {0, 0, 255}};
    const char* codecs[2] = {"-c:v libx264 -pix_fmt yuv420p -preset ultrafast", "-c:v libvpx-vp9 -deadline realtime"};
    const char* exts[2] = {".mp4", ".webm"};
    for (int c = 0; c < 2; ++c) {
      const std::string dir = root() + "/class_" + std::to_string(c);
      fs::create_directories(dir);
      for (int secs : {1, 2}) {
        for (int k = 0; k < 2; ++k) {
          const std::string name = "clip" + std::to_string(secs) + exts[k];
          Ffmpeg(std::string("-f lavfi -i color=c=") + colours[c] + ":s=64x48:r=10:d=" + std::to_string(secs) + " " +
                 codecs[k] + " " + dir + "/" + name);
          Item it;
          it.label = c;
          it.frames = secs * 10;
          std::copy(rgbs[c], rgbs[c] + 3, it.rgb);
          items["class_" + std::to_string(c) + "/" + name] = it;
        }
      }
    }
  }
  std::string root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }

  TempDir dir;
  std::map<std::string, Item> items;
};

std::vector<std::vector<std::string>> ReadCsv(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    rows.push_back(cols);
  }
  return rows;
}

// Runs spdl-client --json --record on `config` (a file under config/examples) with `sets`; checks
// that every one of `items` came once per epoch with its label.
void CheckRecordedEpochs(const std::string& socket, const std::string& config, const std::vector<std::string>& sets,
                         const std::map<std::string, Item>& items, const std::string& record, int epochs) {
  std::vector<std::string> argv = {
      kClient,  "--socket", socket,     "--config", config, "--epochs", std::to_string(epochs),
      "--json", "--quiet",  "--record", record};
  for (const std::string& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  std::string out;
  const int rc = RunCommand(argv, &out);
  INFO(out);
  REQUIRE(rc == 0);
  const auto j = nlohmann::json::parse(out);
  CHECK(j.at("samples") == epochs * items.size());
  CHECK(j.at("skipped") == 0);
  std::map<int, std::multiset<std::string>> per_epoch;
  for (const auto& cols : ReadCsv(record)) {
    REQUIRE(cols.size() == 4);
    REQUIRE(items.count(cols[2]) == 1);
    CHECK(std::stoll(cols[3]) == items.at(cols[2]).label);
    per_epoch[std::stoi(cols[0])].insert(cols[2]);
  }
  REQUIRE(per_epoch.size() == static_cast<size_t>(epochs));
  for (const auto& [e, paths] : per_epoch) {
    CHECK(paths.size() == items.size());
    CHECK(std::set<std::string>(paths.begin(), paths.end()).size() == items.size());
  }
}

client::Options Opts(const std::string& socket, const std::string& yaml, uint32_t epochs) {
  client::Options o;
  o.socket_path = socket;
  o.config_yaml = yaml;
  o.epochs = epochs;
  return o;
}

const client::TensorView& Tensor(const client::Batch& b, const char* name) {
  const client::TensorView* t = b.tensor(name);
  INFO(name);
  REQUIRE(t != nullptr);
  return *t;
}

TEST_CASE("an audio job delivers audio, length and label for WAV, FLAC and MP3") {
  AudioFolder f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string example = std::string(SPDL_SOURCE_DIR) + "/config/examples/audio.yaml";
  CheckRecordedEpochs(f.socket(), example, {"source.root=" + f.root(), "batch.size=5"}, f.items,
                      f.dir.path + "/record.csv", 2);

  // 1 s at 16 kHz from the start: 0.5 s files are half padding, 1.5 s files are cut.
  constexpr int64_t L = 16000;
  const std::string yaml = "media: audio\nsource: {root: " + f.root() +
                           "}\nsampler: {seed: 5}\naudio: {sample_rate: 16000, channels: 1, length: 16000}\n"
                           "batch: {size: 4}\n";
  auto loader = client::Loader::Open(Opts(f.socket(), yaml, 1));
  REQUIRE(loader.ok());
  const client::JobInfo& info = (*loader)->info();
  REQUIRE(info.layout.size() == 3);
  CHECK(info.layout[0].name == "audio");
  CHECK(info.layout[0].dtype == client::DType::kFloat32);
  CHECK(info.layout[0].shape == std::vector<int64_t>{4, 1, L});
  CHECK(info.layout[1].name == "length");
  CHECK(info.layout[1].dtype == client::DType::kInt64);
  CHECK(info.layout[1].shape == std::vector<int64_t>{4});
  CHECK(info.layout[2].name == "label");

  size_t rows = 0;
  for (;;) {
    auto ev = (*loader)->Next();
    REQUIRE(ev.ok());
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::Batch>(&*ev);
    if (b == nullptr) continue;
    const client::TensorView& audio = Tensor(*b, "audio");
    REQUIRE(audio.shape == std::vector<int64_t>{b->rows(), 1, L});
    const auto* lengths = static_cast<const int64_t*>(Tensor(*b, "length").data);
    const auto* labels = static_cast<const int64_t*>(Tensor(*b, "label").data);
    for (uint32_t r = 0; r < b->rows(); ++r) {
      const std::string& path = b->paths()[r];
      INFO(path);
      REQUIRE(f.items.count(path) == 1);
      const Item& it = f.items.at(path);
      ++rows;
      CHECK(labels[r] == it.label);
      const int64_t want = std::min<int64_t>(L, std::llround(it.seconds * 16000));
      // MP3 may keep the encoder's delay and padding (up to two frames of 1152 source samples;
      // LAME's 0.5 s file states 0.575 s).
      CHECK(std::abs(lengths[r] - want) <= (it.lossy ? 1700 : 2));
      const float* x = static_cast<const float*>(audio.data) + r * L;
      const int64_t valid = std::clamp<int64_t>(lengths[r], 0, L);
      for (int64_t i = valid; i < L; ++i) REQUIRE(x[i] == 0.0f);  // padding
      // RMS and zero crossings over the valid part, away from the edges.
      const int64_t lo = 800, hi = std::min<int64_t>(valid, want) - 800;
      REQUIRE(hi > lo + 1000);
      double sq = 0;
      int crossings = 0;
      for (int64_t i = lo; i < hi; ++i) {
        sq += double{x[i]} * x[i];
        crossings += (x[i] < 0) != (x[i + 1] < 0);
      }
      const double rms = std::sqrt(sq / static_cast<double>(hi - lo));
      CHECK(std::abs(rms - kAmplitude / std::sqrt(2.0)) < 0.02);
      const double freq = crossings / 2.0 / (static_cast<double>(hi - lo) / 16000);
      CHECK(std::abs(freq - it.frequency) < 0.03 * it.frequency);
    }
  }
  CHECK(rows == f.items.size());
  CHECK(d.Stop() == std::optional<int>(0));
}

// Every delivered row of `tensor`, by (epoch, path): its bytes.
using Rows = std::map<std::pair<uint32_t, std::string>, std::vector<uint8_t>>;

// Runs a job to the end (or, with stop_after > 0, for that many batches), collecting the rows of
// `tensor`; returns the resume token of the last batch taken.
std::string Collect(const client::Options& opts, const char* tensor, Rows* rows, int stop_after = 0) {
  auto loader = client::Loader::Open(opts);
  REQUIRE(loader.ok());
  int batches = 0;
  for (;;) {
    auto ev = (*loader)->Next();
    REQUIRE(ev.ok());
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::Batch>(&*ev);
    if (b == nullptr) continue;
    const client::TensorView& t = Tensor(*b, tensor);
    const size_t row_bytes = t.bytes / b->rows();
    for (uint32_t r = 0; r < b->rows(); ++r) {
      const auto* p = static_cast<const uint8_t*>(t.data) + r * row_bytes;
      (*rows)[{b->epoch(), b->paths()[r]}] = std::vector<uint8_t>(p, p + row_bytes);
    }
    if (stop_after > 0 && ++batches == stop_after) return (*loader)->state();
  }
  return (*loader)->state();
}

TEST_CASE("random audio crops are the same on every run and after a resume, and differ by epoch") {
  AudioFolder f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  // 0.25 s int16 clips from random starts: a 1.5 s file has many possible starts.
  const std::string yaml = "media: audio\nsource: {root: " + f.root() +
                           "}\nsampler: {seed: 9}\naudio: {sample_rate: 8000, channels: 2, seconds: 0.25, "
                           "crop: random, dtype: int16}\nbatch: {size: 3}\n";
  const client::Options opts = Opts(f.socket(), yaml, 2);
  {
    auto loader = client::Loader::Open(opts);
    REQUIRE(loader.ok());
    REQUIRE((*loader)->info().layout.size() == 3);
    CHECK((*loader)->info().layout[0].dtype == client::DType::kInt16);
    CHECK((*loader)->info().layout[0].shape == std::vector<int64_t>{3, 2, 2000});
  }
  Rows first, second;
  Collect(opts, "audio", &first);
  Collect(opts, "audio", &second);
  REQUIRE(first.size() == 2 * f.items.size());
  // Thread timing plays no part (a decoder writing past its row would show here: the neighbour's
  // first sample then depends on which row was decoded last).
  for (const auto& [key, bytes] : first) {
    const std::vector<uint8_t>& other = second.at(key);
    size_t n_diff = 0, first_diff = 0;
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] != other[i] && n_diff++ == 0) first_diff = i;
    }
    if (n_diff > 0) {
      FAIL_CHECK("epoch " << key.first << " " << key.second << ": " << n_diff << " bytes differ, the first at byte "
                          << first_diff);
    }
  }
  int same_across_epochs = 0;
  for (const auto& [path, it] : f.items) {
    if (it.seconds > 1) same_across_epochs += first.at({0, path}) == first.at({1, path});
  }
  CHECK(same_across_epochs <= 1);

  Rows head, tail;
  const std::string token = Collect(opts, "audio", &head, 3);
  REQUIRE_FALSE(token.empty());
  client::Options resumed = opts;
  resumed.resume_token = token;
  Collect(resumed, "audio", &tail);
  CHECK(head.size() + tail.size() == first.size());
  for (const auto& [key, bytes] : tail) {
    INFO("epoch " << key.first << " " << key.second);
    CHECK(first.at(key) == bytes);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a video job delivers video, frames and label for MP4 and WebM") {
  VideoFolder f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string example = std::string(SPDL_SOURCE_DIR) + "/config/examples/video.yaml";
  CheckRecordedEpochs(f.socket(), example,
                      {"source.root=" + f.root(), "batch.size=3", "video.height=24", "video.width=32"}, f.items,
                      f.dir.path + "/record.csv", 2);

  // 8 frames, every 2nd, from the start: 2 s clips (20 frames) fill them, 1 s clips give 5.
  constexpr int T = 8, H = 24, W = 32;
  const std::string yaml = "media: video\nsource: {root: " + f.root() +
                           "}\nvideo: {frames: 8, stride: 2, start: 0, height: 24, width: 32}\nbatch: {size: 3}\n";
  auto loader = client::Loader::Open(Opts(f.socket(), yaml, 1));
  REQUIRE(loader.ok());
  const client::JobInfo& info = (*loader)->info();
  REQUIRE(info.layout.size() == 3);
  CHECK(info.layout[0].name == "video");
  CHECK(info.layout[0].dtype == client::DType::kUInt8);
  CHECK(info.layout[0].shape == std::vector<int64_t>{3, T, H, W, 3});
  CHECK(info.layout[1].name == "frames");
  CHECK(info.layout[1].shape == std::vector<int64_t>{3});
  CHECK(info.layout[2].name == "label");
  size_t rows = 0;
  for (;;) {
    auto ev = (*loader)->Next();
    REQUIRE(ev.ok());
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::Batch>(&*ev);
    if (b == nullptr) continue;
    const client::TensorView& video = Tensor(*b, "video");
    REQUIRE(video.shape == std::vector<int64_t>{b->rows(), T, H, W, 3});
    const auto* frames = static_cast<const int64_t*>(Tensor(*b, "frames").data);
    const auto* labels = static_cast<const int64_t*>(Tensor(*b, "label").data);
    for (uint32_t r = 0; r < b->rows(); ++r) {
      const std::string& path = b->paths()[r];
      INFO(path);
      REQUIRE(f.items.count(path) == 1);
      const Item& it = f.items.at(path);
      ++rows;
      CHECK(labels[r] == it.label);
      CHECK(frames[r] == std::min(T, (it.frames + 1) / 2));
      // Every frame (the repeated ones too) is the clip's colour.
      const uint8_t* px = static_cast<const uint8_t*>(video.data) + size_t{r} * T * H * W * 3;
      for (int t = 0; t < T; ++t) {
        double sum[3] = {0, 0, 0};
        for (int i = 0; i < H * W; ++i) {
          for (int c = 0; c < 3; ++c) sum[c] += px[(size_t{static_cast<size_t>(t)} * H * W + i) * 3 + c];
        }
        for (int c = 0; c < 3; ++c) {
          INFO("frame " << t << " channel " << c);
          CHECK(std::abs(sum[c] / (H * W) - it.rgb[c]) < 12);
        }
      }
    }
  }
  CHECK(rows == f.items.size());
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a bad media config is refused with its line, and an undecodable file is skipped") {
  AudioFolder f;
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  auto bad = client::Loader::Open(
      Opts(f.socket(), "media: audio\nsource: {root: " + f.root() + "}\naudio: {channels: 5, length: 10}\n", 1));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("<config>:3:") != std::string::npos);
  CHECK(bad.status().message().find("audio.channels") != std::string::npos);
  // A text file named .wav: skipped and counted; the others arrive.
  std::ofstream(f.root() + "/class_0/not_audio.wav") << "this is not a wave file";
  auto loader = client::Loader::Open(
      Opts(f.socket(), "media: audio\nsource: {root: " + f.root() + "}\naudio: {length: 100}\nbatch: {size: 4}\n", 1));
  REQUIRE(loader.ok());
  for (;;) {
    auto ev = (*loader)->Next();
    REQUIRE(ev.ok());
    if (auto* st = std::get_if<client::JobStats>(&*ev)) {
      CHECK(st->skipped == 1);
      CHECK(st->samples == f.items.size());
      break;
    }
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
