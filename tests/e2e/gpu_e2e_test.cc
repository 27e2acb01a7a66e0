// GPU delivery end to end on a machine without a GPU: the real spdld process (started with the
// test-only flag --test-only-fake-gpu DIR) and real client processes (forked, each a GpuLoader on
// the same fake device, cuda/shm_fake_backend.h), so every message of the GPU protocol —
// SubmitJob.device_uuid, JobAccepted.device / client_copy, CudaHandles, CudaConsumerEvents,
// BatchReady and Release on device slots — crosses a real socket between real processes, and the
// device memory the daemon copies into is read by another process through its IPC handle.
//
// Checked: a cuda:0 job, copy: daemon and copy: client, delivers device batches byte-for-byte equal
// to the same job on the CPU path, over 2 epochs, in 2 client processes at once; a client killed
// while it holds every device slot of its job does not hurt the daemon or another client, and the
// daemon frees the dead job's device memory.
//
// The same source, built with SPDL_REAL_GPU=1, is the [gpu] end-to-end case of tests/gpu
// (gpu_daemon_test): the daemon's real CudaBackend, the clients' CudaBackend (CUDA IPC between real
// processes), 3 epochs; without a device each case says "SKIPPED: no CUDA device" (ctest: Skipped).
// The test process itself never initializes CUDA (a forked child could not use it then): a child
// checks for a device.
#include <signal.h>
#include <sys/wait.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_backend.h"
#include "cuda/fake_backend.h"
#include "cuda/shm_fake_backend.h"
#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "media/image_encoder.h"
#include "proto/control.pb.h"
#include "skip.h"
#include "spdl/client.h"
#include "spdl/control.h"
#include "spdl/cuda/gpu_loader.h"
#if SPDL_REAL_GPU
#include "cuda/cuda_backend.h"
#include "spdl/cuda/cuda_device.h"
#define GPU_TAGS "[gpu]"
#define NAME(s) "GPU: " s
constexpr uint32_t kEpochs = 3;
#else
#define GPU_TAGS "[fakegpu]"
#define NAME(s) "gpu e2e: " s
constexpr uint32_t kEpochs = 2;
#endif

namespace spdl {
namespace {

using testing::DaemonProcess;
using testing::TempDir;

// (epoch, batch in epoch) -> the batch's tensors' valid bytes, concatenated in layout order.
using Batches = std::map<std::pair<uint32_t, uint64_t>, std::string>;

struct Fixture {
  // `daemon_yaml`: a daemon config (--config) to start spdld with, if not empty.
  explicit Fixture(const std::string& daemon_yaml = "") {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 5;  // 10 images, batches of 4: the last one of each epoch is partial
    o.min_side = 40;
    o.max_side = 90;
    REQUIRE(testdata::MakeImageFolder(root(), o).ok());
    std::filesystem::create_directory(fake_gpu());
    std::vector<std::string> args{"--allow-root", dir.path, "--threads", "2"};
#if !SPDL_REAL_GPU
    args.insert(args.end(), {"--test-only-fake-gpu", fake_gpu()});
#endif
    if (!daemon_yaml.empty()) {
      const std::string path = dir.path + "/spdld.yaml";
      std::FILE* f = std::fopen(path.c_str(), "w");
      REQUIRE(f != nullptr);
      std::fputs(daemon_yaml.c_str(), f);
      std::fclose(f);
      args.insert(args.end(), {"--config", path});
    }
    daemon.emplace(socket(), args);
    REQUIRE(daemon->Connectable());
  }
#if !SPDL_REAL_GPU
  // What CUDA leaves undefined (freeing memory a live importer maps, destroying an exported event it
  // has open) or would hang on, any process did on the fake device: never allowed.
  ~Fixture() {
    const std::vector<std::string> violations = cuda::ShmFakeBackend::Violations(fake_gpu());
    for (const auto& v : violations) UNSCOPED_INFO(v);
    CHECK(violations.empty());
  }
#endif
  std::string root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  std::string fake_gpu() const { return dir.path + "/fake-gpu"; }
  client::Options Job(const std::string& output, uint32_t epochs = kEpochs) const {
    client::Options o;
    o.socket_path = socket();
    o.config_yaml = "source: {type: image_folder, root: " + root() +
                    "}\nsampler: {shuffle: true, seed: 11}\nbatch: {size: 4}\n"
                    "transforms: [{resize: {height: 24, width: 32}}]\nprefetch: 2\n" +
                    (output.empty() ? "" : "output: " + output + "\n");
    o.config_name = "job.yaml";
    o.epochs = epochs;
    return o;
  }
  proto::DaemonStatus Status() const {
    proto::ClientMessage req;
    req.mutable_status();
    auto r = client::ControlCall(socket(), req);
    REQUIRE(r.ok());
    return r->status();
  }
  uint32_t LiveJobs() const {
    proto::ClientMessage req;
    req.mutable_status();
    auto r = client::ControlCall(socket(), req);
    REQUIRE(r.ok());
    return r->status().live_jobs();
  }
  // Device allocations of the daemon still alive on the fake device (real GPU: -1, unknown).
  int DeviceAllocations() const {
#if SPDL_REAL_GPU
    return -1;
#endif
    int n = 0;
    const std::string prefix = "mem-" + std::to_string(daemon->pid()) + "-";
    for (const auto& e : std::filesystem::directory_iterator(fake_gpu())) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
    }
    return n;
  }
  TempDir dir;
  std::optional<DaemonProcess> daemon;
};

// The reference: the same job on the CPU path.
Batches CpuBatches(const Fixture& f) {
  auto l = client::Loader::Open(f.Job(""));
  REQUIRE(l.ok());
  Batches out;
  for (;;) {
    auto ev = (*l)->Next();
    REQUIRE(ev.ok());
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::Batch>(&*ev);
    if (!b) continue;
    std::string bytes;
    for (const auto& t : b->tensors()) bytes.append(static_cast<const char*>(t.data), t.bytes);
    out[{b->epoch(), b->batch_in_epoch()}] = bytes;
  }
  return out;
}

client::GpuOptions ClientGpu(const Fixture& f) {
  client::GpuOptions g;
#if SPDL_REAL_GPU
  (void)f;
  g.open_backend = client::CudaBackendFactory();
#else
  ::setenv(cuda::kFakeGpuDirEnv, f.fake_gpu().c_str(), 1);  // test-only: this process on the fake device
#endif
  return g;
}

// True when a CUDA device is there (asked in a child: this process must not initialize CUDA);
// otherwise says so visibly. Always true on the fake device.
bool HaveGpu() {
#if SPDL_REAL_GPU
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::string why;
    const int n = cuda::CudaDeviceCount(&why);
    if (n <= 0) std::printf("skipped: no CUDA device (%s)\n", why.c_str());
    std::fflush(stdout);
    ::_exit(n > 0 ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  SPDL_SKIP_PART("no CUDA device");
  return false;
#else
  return true;
#endif
}

// In a client process: runs the GPU job and writes each batch's device bytes (read back with a
// device-to-host copy) to DIR/E-B.bin. Returns the exit code for the parent: 0 = ran to the end.
int RunGpuClient(const Fixture& f, const std::string& output, const std::string& out_dir) {
  auto l = client::GpuLoader::Open(f.Job(output), ClientGpu(f));
  if (!l.ok()) {
    std::fprintf(stderr, "GpuLoader::Open: %s\n", l.status().ToString().c_str());
    return 2;
  }
  for (;;) {
    auto ev = (*l)->Next();
    if (!ev.ok()) {
      std::fprintf(stderr, "Next: %s\n", ev.status().ToString().c_str());
      return 3;
    }
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::GpuBatch>(&*ev);
    if (!b) continue;
    std::string bytes;
    for (const auto& t : b->tensors()) {
      std::string host(t.bytes, '\0');
      cuda::DeviceBackend& dev = (*l)->backend();
      if (!dev.MemcpyD2HAsync(host.data(), t.data, t.bytes, (*l)->consumer_stream()).ok() ||
          !dev.SynchronizeStream((*l)->consumer_stream()).ok()) {
        return 4;
      }
      bytes += host;
    }
    std::ofstream(
        out_dir + "/" + std::to_string(b->host().epoch()) + "-" + std::to_string(b->host().batch_in_epoch()) + ".bin",
        std::ios::binary)
        << bytes;
  }
  return 0;
}

pid_t Fork(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 1;
    try {
      code = child();
    } catch (...) {
      code = 1;  // the child threw: it fails
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

Batches ReadBatches(const std::string& dir) {
  Batches out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().stem().string();
    const auto dash = name.find('-');
    const auto bytes = testing::ReadBytes(e.path().string());
    out[{static_cast<uint32_t>(std::stoul(name.substr(0, dash))), std::stoull(name.substr(dash + 1))}] =
        std::string(bytes.begin(), bytes.end());
  }
  return out;
}

bool SettlesTo(const std::function<bool()>& ok) {
  for (int i = 0; i < 250; ++i) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST_CASE(NAME("cuda:0 batches equal the CPU path byte for byte, several epochs, 2 client processes"), GPU_TAGS) {
  if (!HaveGpu()) return;
  Fixture f;
  const Batches cpu = CpuBatches(f);
  REQUIRE(cpu.size() == 3 * kEpochs);
  CHECK(cpu.at({0, 0}) != cpu.at({1, 0}));  // reshuffled per epoch: a real comparison
  for (const std::string output : {"{device: cuda:0, copy: daemon}", "{device: cuda:0, copy: client}"}) {
    INFO(output);
    TempDir a, b;
    const pid_t pa = Fork([&] { return RunGpuClient(f, output, a.path); });
    const pid_t pb = Fork([&] { return RunGpuClient(f, output, b.path); });
    CHECK(Wait(pa) == 0);
    CHECK(Wait(pb) == 0);
    CHECK(ReadBatches(a.path) == cpu);
    CHECK(ReadBatches(b.path) == cpu);
  }
  CHECK(SettlesTo([&] { return f.LiveJobs() == 0 && f.DeviceAllocations() <= 0; }));
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

TEST_CASE(NAME("a client killed while holding its device slots hurts neither the daemon nor another client"),
          GPU_TAGS) {
  if (!HaveGpu()) return;
  Fixture f;
  const Batches cpu = CpuBatches(f);
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t doomed = Fork([&] {
    auto l = client::GpuLoader::Open(f.Job("{device: cuda:0}", 0), ClientGpu(f));
    if (!l.ok()) return 2;
    std::vector<client::GpuBatch> held;  // both slots of the job's ring, never released
    while (held.size() < 2) {
      auto ev = (*l)->Next();
      if (!ev.ok()) return 3;
      if (auto* b = std::get_if<client::GpuBatch>(&*ev)) held.push_back(std::move(*b));
    }
    (void)!::write(ready[1], "x", 1);
    ::pause();  // killed here, holding both
    return 0;
  });
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  CHECK(f.DeviceAllocations() != 0);
  // Meanwhile another client runs its job to the end, pixel-exact.
  TempDir out;
  const pid_t other = Fork([&] { return RunGpuClient(f, "{device: cuda:0}", out.path); });
  ::kill(doomed, SIGKILL);
  CHECK(Wait(doomed) == -SIGKILL);
  CHECK(Wait(other) == 0);
  CHECK(ReadBatches(out.path) == cpu);
  // The dead client's job is gone, its device memory freed, and the daemon serves on.
  CHECK(SettlesTo([&] { return f.LiveJobs() == 0 && f.DeviceAllocations() <= 0; }));
  CHECK(f.daemon->Running());
  TempDir again;
  const pid_t after = Fork([&] { return RunGpuClient(f, "{device: cuda:0, copy: client}", again.path); });
  CHECK(Wait(after) == 0);
  CHECK(ReadBatches(again.path) == cpu);
  ::close(ready[0]);
  ::close(ready[1]);
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

TEST_CASE(NAME("the plain Loader still refuses a cuda job, pointing at the GPU layer"), GPU_TAGS) {
  if (!HaveGpu()) return;
  Fixture f;
  auto l = client::Loader::Open(f.Job("{device: cuda:0}"));
  REQUIRE_FALSE(l.ok());
  CHECK(l.status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(l.status().message(), Catch::Contains("GpuLoader"));
  // And a GpuLoader refuses a cpu job.
  auto gl = client::GpuLoader::Open(f.Job(""), ClientGpu(f));
  REQUIRE_FALSE(gl.ok());
  CHECK_THAT(gl.status().message(), Catch::Contains("delivers only cuda jobs"));
#if !SPDL_REAL_GPU
  // cuda:N is the trainer's ordinal: its GPU's UUID goes with the job and the daemon finds its own
  // ordinal for it. Here the trainer numbers the fake devices otherwise (its cuda:0 is the daemon's
  // cuda:1, as with CUDA_VISIBLE_DEVICES=1,0 in the trainer): the batches come on the trainer's cuda:0.
  {
    auto swapped = cuda::ShmFakeBackend::Create(f.fake_gpu(), 0, /*physical=*/1);
    REQUIRE(swapped.ok());
    client::GpuOptions other = ClientGpu(f);
    other.backend = swapped->get();
    auto moved = client::GpuLoader::Open(f.Job("{device: cuda:0}"), other);
    INFO((moved.ok() ? std::string("ok") : moved.status().ToString()));
    REQUIRE(moved.ok());
    CHECK((*moved)->device() == 0);
    REQUIRE((*moved)->loader().cuda_handles() != nullptr);
    CHECK((*moved)->loader().cuda_handles()->device_index() == 1);  // the daemon's ordinal
    {
      auto ev = (*moved)->Next();
      REQUIRE(ev.ok());
      CHECK(std::holds_alternative<client::GpuBatch>(*ev));
    }
    moved->reset();
    // A GPU the daemon does not see (its CUDA_VISIBLE_DEVICES leaves it out): refused, naming it.
    auto unseen = cuda::ShmFakeBackend::Create(f.fake_gpu(), 0, /*physical=*/cuda::kFakeDevices + 3);
    REQUIRE(unseen.ok());
    client::GpuOptions third = ClientGpu(f);
    third.backend = unseen->get();
    auto refused = client::GpuLoader::Open(f.Job("{device: cuda:0}"), third);
    REQUIRE_FALSE(refused.ok());
    CHECK_THAT(refused.status().message(), Catch::Contains(cuda::FormatUuid(*(*unseen)->Uuid())));
    CHECK_THAT(refused.status().message(), Catch::Contains("is not one spdld sees"));
    CHECK_THAT(refused.status().message(), Catch::Contains("CUDA_VISIBLE_DEVICES"));
  }
  client::GpuOptions same = ClientGpu(f);
  same.device = 0;
  auto right = client::GpuLoader::Open(f.Job("{device: cuda:0}"), same);
  REQUIRE(right.ok());
  CHECK((*right)->device() == 0);
  {
    auto ev = (*right)->Next();
    REQUIRE(ev.ok());
    CHECK(std::holds_alternative<client::GpuBatch>(*ev));
  }  // the batch goes before its loader
  right->reset();
#endif
  CHECK(SettlesTo([&] { return f.LiveJobs() == 0; }));
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// decode.device: cuda through the real daemon: the read stage reads the files, the batch stage
// decodes each batch with GpuJpegBatchDecoder (on the fake device: the fake nvJPEG, libjpeg-turbo on
// the host, and the fake kernels running gpu/cuda/image_math.h) straight into the job's device
// slots, the CPU path taking what nvJPEG cannot (a CMYK JPEG, a PNG), and the trainer gets the
// batches through the same IPC path. Stated tolerance: on the fake device the pixels equal the CPU
// path's exactly (the same decoder); on a GPU (gpu_daemon_test) nvJPEG's IDCT differs, and the image
// tensor must stay within tests/gpu/nvjpeg_test.cc's bound (mean |GPU - CPU| <= 1.5 levels and the
// 99.9th percentile <= 16), the labels exact.

// One batch as the client saw it: its tensors' bytes (device ones read back), by tensor.
using TensorBatches = std::map<std::pair<uint32_t, uint64_t>, std::vector<std::string>>;

struct GpuRun {
  TensorBatches batches;
  std::map<std::string, double> stats;  // the job's final stats by name
  std::string error;                    // the first error the client saw (empty: none)
};

// In this process: runs `o` on a GpuLoader to the end or the first error. On a real GPU
// (gpu_daemon_test) this initializes CUDA in the test process, so the cases that use it are
// declared after every case that forks a GPU client (Catch runs them in declaration order).
// TODO: run it in a forked child there too, as RunGpuClient does.
GpuRun RunGpuJob(const Fixture& f, const client::Options& o) {
  GpuRun run;
  auto l = client::GpuLoader::Open(o, ClientGpu(f));
  if (!l.ok()) {
    run.error = l.status().ToString();
    return run;
  }
  for (;;) {
    auto ev = (*l)->Next();
    if (!ev.ok()) {
      run.error = ev.status().ToString();
      break;
    }
    if (auto* st = std::get_if<client::JobStats>(&*ev)) {
      for (const auto& v : st->values) run.stats[v.name] = v.value;
      break;
    }
    auto* b = std::get_if<client::GpuBatch>(&*ev);
    if (!b) continue;
    std::vector<std::string> tensors;
    for (const auto& t : b->tensors()) {
      std::string host(t.bytes, '\0');
      cuda::DeviceBackend& dev = (*l)->backend();
      if (!dev.MemcpyD2HAsync(host.data(), t.data, t.bytes, (*l)->consumer_stream()).ok() ||
          !dev.SynchronizeStream((*l)->consumer_stream()).ok()) {
        run.error = "reading a batch back failed";
        return run;
      }
      tensors.push_back(std::move(host));
    }
    run.batches[{b->host().epoch(), b->host().batch_in_epoch()}] = std::move(tensors);
  }
  return run;
}

TensorBatches CpuTensorBatches(const client::Options& o) {
  auto l = client::Loader::Open(o);
  REQUIRE(l.ok());
  TensorBatches out;
  for (;;) {
    auto ev = (*l)->Next();
    REQUIRE(ev.ok());
    if (std::holds_alternative<client::JobStats>(*ev)) break;
    auto* b = std::get_if<client::Batch>(&*ev);
    if (!b) continue;
    std::vector<std::string> tensors;
    for (const auto& t : b->tensors()) tensors.emplace_back(static_cast<const char*>(t.data), t.bytes);
    out[{b->epoch(), b->batch_in_epoch()}] = std::move(tensors);
  }
  return out;
}

// The image tensors of two runs against the stated tolerance, the other tensors exactly.
void CheckWithinTolerance(const TensorBatches& gpu, const TensorBatches& cpu) {
  REQUIRE(gpu.size() == cpu.size());
  double worst_mean = 0;
  int worst_p999 = 0;
  for (const auto& [key, want] : cpu) {
    INFO("epoch " << key.first << " batch " << key.second);
    REQUIRE(gpu.count(key) == 1);
    const std::vector<std::string>& got = gpu.at(key);
    REQUIRE(got.size() == want.size());
    for (size_t t = 1; t < want.size(); ++t) CHECK(got[t] == want[t]);
    REQUIRE(got[0].size() == want[0].size());
#if SPDL_REAL_GPU
    std::vector<int> diff(want[0].size());
    double sum = 0;
    for (size_t i = 0; i < diff.size(); ++i) {
      diff[i] = std::abs(int{static_cast<uint8_t>(got[0][i])} - int{static_cast<uint8_t>(want[0][i])});
      sum += diff[i];
    }
    std::sort(diff.begin(), diff.end());
    worst_mean = std::max(worst_mean, sum / static_cast<double>(diff.size()));
    worst_p999 = std::max(worst_p999, diff[static_cast<size_t>(0.999 * static_cast<double>(diff.size() - 1))]);
#else
    CHECK(got[0] == want[0]);  // the fake nvJPEG is libjpeg-turbo: exact
#endif
  }
  std::printf("gpu decode vs cpu: worst batch mean |diff| %.3f, p99.9 %d levels\n", worst_mean, worst_p999);
  CHECK(worst_mean <= 1.5);
  CHECK(worst_p999 <= 16);
}

std::vector<uint8_t> PatternRgb(int w, int h, int salt) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * (3 + c) + y * (5 - c) + salt * 40) & 0xFF);
  return px;
}

// A CMYK JPEG (nvJPEG does not decode it: the CPU path does), written with TurboJPEG.
void WriteCmykJpeg(const std::string& path, int w, int h) {
  const std::vector<uint8_t> rgb = PatternRgb(w, h, 3);
  std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < static_cast<size_t>(w) * h; ++i) {
    for (int c = 0; c < 3; ++c) cmyk[4 * i + c] = static_cast<uint8_t>(255 - rgb[3 * i + c]);
    cmyk[4 * i + 3] = 255;
  }
  tjhandle tj = tjInitCompress();
  REQUIRE(tj != nullptr);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, cmyk.data(), w, 0, h, TJPF_CMYK, &buf, &size, TJSAMP_444, 90, 0);
  tjDestroy(tj);
  REQUIRE(rc == 0);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(buf), static_cast<std::streamsize>(size));
  tjFree(buf);
}

void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Every file of class 0 of the fixture's dataset, sorted.
std::vector<std::string> ClassFiles(const Fixture& f) {
  std::vector<std::string> files;
  for (const auto& dir : std::filesystem::directory_iterator(f.root())) {
    if (!dir.is_directory()) continue;
    for (const auto& e : std::filesystem::directory_iterator(dir.path())) files.push_back(e.path().string());
    break;
  }
  std::sort(files.begin(), files.end());
  return files;
}

client::Options DecodeJob(const Fixture& f, const std::string& output, const std::string& decode_device,
                          const std::string& extra = "") {
  client::Options o = f.Job(output);
  o.config_yaml = "source: {type: image_folder, root: " + f.root() +
                  ", extensions: [.jpg, .jpeg, .png]}\nsampler: {shuffle: true, seed: 11}\nbatch: {size: 4}\n"
                  "transforms: [{resize: {height: 24, width: 32}}]\nprefetch: 2\ndecode: {device: " +
                  decode_device + "}\n" + (output.empty() ? "" : "output: " + output + "\n") + extra;
  return o;
}

TEST_CASE(NAME("decode.device: cuda delivers the CPU path's pixels, CMYK and PNG on the CPU, counted"), GPU_TAGS) {
  if (!HaveGpu()) return;
  Fixture f;
  {
    // One sample of class 0 becomes a CMYK JPEG, another a PNG (same names' stems: the dataset keeps its size).
    const std::vector<std::string> files = ClassFiles(f);
    REQUIRE(files.size() >= 2);
    std::filesystem::remove(files[0]);
    WriteCmykJpeg(files[0], 70, 50);
    std::filesystem::remove(files[1]);
    media::RawImage png{media::RawPixels::kRgb24, 60, 45, PatternRgb(60, 45, 7), {}};
    auto encoded = media::EncodeImage(media::ImageFormat::kPng, png);
    REQUIRE(encoded.ok());
    WriteFile(files[1].substr(0, files[1].rfind('.')) + ".png", *encoded);
  }
  const TensorBatches cpu = CpuTensorBatches(DecodeJob(f, "", "cpu"));
  REQUIRE(cpu.size() == 3 * kEpochs);
  const GpuRun gpu = RunGpuJob(f, DecodeJob(f, "{device: cuda:0, copy: daemon}", "cuda"));
  REQUIRE(gpu.error.empty());
  CheckWithinTolerance(gpu.batches, cpu);
  // Per epoch: 10 samples, 3 batches; the CMYK one (unsupported) and the PNG (its header is not a
  // JPEG's) on the CPU path, the other 8 by nvJPEG.
  CHECK(gpu.stats.at("gpu_decode_batches") == 3 * kEpochs);
  CHECK(gpu.stats.at("gpu_decoded") == 8 * kEpochs);
  CHECK(gpu.stats.at("gpu_decode_fallbacks") == 2 * kEpochs);
  CHECK(gpu.stats.at("gpu_decode_fallback_unsupported") == kEpochs);
  CHECK(gpu.stats.at("gpu_decode_fallback_header") == kEpochs);
  CHECK(gpu.stats.at("gpu_decode_failed") == 0);
  CHECK(gpu.stats.at("samples_failed") == 0);
  // The job's device memory (slots, the decoder's scratch) is freed once it ends.
  CHECK(SettlesTo([&] { return f.LiveJobs() == 0 && f.DeviceAllocations() <= 0; }));
  CHECK(f.daemon->Running());
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

TEST_CASE(NAME("decode.device: cuda: a file no decoder reads fails per on_error, the daemon serves on"), GPU_TAGS) {
  if (!HaveGpu()) return;
  Fixture f;
  std::string bad;
  {
    // A JPEG cut in half: its header is whole, so nvJPEG takes it into the batch, which fails; the
    // file alone fails on the GPU and then on the CPU path.
    const std::vector<std::string> files = ClassFiles(f);
    REQUIRE_FALSE(files.empty());
    bad = files[0];
    const std::vector<uint8_t> whole = testing::ReadBytes(bad);
    WriteFile(bad, std::vector<uint8_t>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(whole.size() / 2)));
  }
  const std::string bad_name = std::filesystem::path(bad).filename().string();
  {
    INFO("on_error: skip");
    const GpuRun gpu = RunGpuJob(f, DecodeJob(f, "{device: cuda:0}", "cuda", "on_error: skip\n"));
    REQUIRE(gpu.error.empty());
    // The bad sample is dropped from its batch each epoch (no spare replaces it after the batch
    // stage): 9 of 10 samples delivered per epoch.
    CHECK(gpu.stats.at("samples") == 9 * kEpochs);
    CHECK(gpu.stats.at("samples_failed") == kEpochs);
    CHECK(gpu.stats.at("gpu_decode_failed") == kEpochs);
    CHECK(gpu.stats.at("gpu_decode_fallback_decode") == kEpochs);
    CHECK(gpu.stats.at("gpu_decode_batch_retries") == kEpochs);
  }
  {
    INFO("on_error: fail");
    const GpuRun gpu = RunGpuJob(f, DecodeJob(f, "{device: cuda:0}", "cuda", "on_error: fail\n"));
    CHECK_THAT(gpu.error, Catch::Contains(bad_name) && Catch::Contains("on_error: fail"));
  }
  // Not supported: refused at once, saying what (copy: client has no device slots of spdld's).
  {
    const GpuRun client_copy = RunGpuJob(f, DecodeJob(f, "{device: cuda:0, copy: client}", "cuda"));
    CHECK_THAT(client_copy.error, Catch::Contains("decode.device") && Catch::Contains("copy: daemon"));
  }
  CHECK(SettlesTo([&] { return f.LiveJobs() == 0 && f.DeviceAllocations() <= 0; }));
  CHECK(f.daemon->Running());
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

#if !SPDL_REAL_GPU
// Python tensors kept after loader.close() are GpuBatches that outlive their GpuLoader: they share
// the device side, so the daemon keeps the device memory they read until the last of them goes
// (the client then closes its mapping and says so: CudaMappingClosed). Freeing it at EndJob, as
// before, left them pointing at freed memory.
TEST_CASE(NAME("a batch that outlives its GpuLoader keeps its device memory until it goes"), GPU_TAGS) {
  Fixture f;
  const Batches cpu = CpuBatches(f);
  std::optional<client::GpuBatch> kept;
  {
    auto l = client::GpuLoader::Open(f.Job("{device: cuda:0}"), ClientGpu(f));
    REQUIRE(l.ok());
    while (!kept) {
      auto ev = (*l)->Next();
      REQUIRE(ev.ok());
      if (auto* b = std::get_if<client::GpuBatch>(&*ev)) kept.emplace(std::move(*b));
    }
  }  // the loader goes: the job ends, the batch stays
  // The daemon still holds the device memory the batch reads, and the batch reads its bytes.
  CHECK(f.DeviceAllocations() == 1);
  std::string bytes;
  for (const auto& t : kept->tensors()) bytes.append(static_cast<const char*>(t.data), t.bytes);
  CHECK(bytes == cpu.at({kept->host().epoch(), kept->host().batch_in_epoch()}));
  kept.reset();  // the last batch: mapping closed, the daemon told, the connection closed
  CHECK(SettlesTo([&] { return f.DeviceAllocations() == 0; }));
  CHECK(SettlesTo([&] { return f.LiveJobs() == 0; }));
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

// A sticky CUDA error poisons spdld's context on a GPU (here: the fake device's poison file, which
// the daemon's backend reports as its sticky error): spdlctl status shows it, new GPU jobs are
// refused, and once no job holds the GPU spdld exits with status 3 for systemd to restart it
// (exit_on_gpu_poison, on by default); with the option off it stays up.
TEST_CASE(NAME("a poisoned GPU shows in status, and spdld exits for a restart once no job holds it"), GPU_TAGS) {
  for (const bool exit_on_poison : {true, false}) {
    INFO("exit_on_gpu_poison: " << exit_on_poison);
    Fixture f(exit_on_poison ? "" : "exit_on_gpu_poison: false\n");
    client::GpuOptions g = ClientGpu(f);
    g.device = 0;
    auto l = client::GpuLoader::Open(f.Job("{device: cuda:0}"), g);
    REQUIRE(l.ok());
    // The trainer holds both device slots of its job, so spdld has no GPU work left for it: after
    // a sticky error every CUDA call fails (the fake's poison file, as CUDA), and a job that calls
    // one fails at once; this one holds the GPU until it ends.
    std::vector<client::GpuBatch> held;
    while (held.size() < 2) {
      auto ev = (*l)->Next();
      REQUIRE(ev.ok());
      if (auto* b = std::get_if<client::GpuBatch>(&*ev)) held.push_back(std::move(*b));
    }
    {
      // spdld's context only (CUDA's contexts are per process): the trainer's goes on.
      std::FILE* poison = std::fopen(
          (f.fake_gpu() + "/" + cuda::kStickyErrorFile + "0-" + std::to_string(f.daemon->pid())).c_str(), "w");
      REQUIRE(poison != nullptr);
      std::fputs("cudaErrorIllegalAddress: an illegal memory access was encountered (test)", poison);
      std::fclose(poison);
    }
    proto::DaemonStatus st;
    CHECK(SettlesTo([&] {
      st = f.Status();
      return st.gpu_devices_size() == 1 && st.gpu_devices(0).poisoned();
    }));
    REQUIRE(st.gpu_devices_size() == 1);
    CHECK(st.gpu_devices(0).device() == "cuda:0");
    CHECK_THAT(st.gpu_devices(0).error(), Catch::Contains("cudaErrorIllegalAddress"));
    CHECK(st.gpu_devices(0).jobs() == 1);
    // While the job holds the GPU the daemon stays up (well past its 500 ms check), and refuses new
    // jobs there.
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    CHECK(f.daemon->Running());
    auto again = client::GpuLoader::Open(f.Job("{device: cuda:0}"), g);
    REQUIRE_FALSE(again.ok());
    CHECK_THAT(again.status().message(),
               Catch::Contains("cudaErrorIllegalAddress") && Catch::Contains("restart spdld"));
    held.clear();
    l->reset();  // the last job on the GPU ends
    if (exit_on_poison) {
      CHECK(SettlesTo([&] { return !f.daemon->Running(); }));
      CHECK(f.daemon->exit_code() == std::optional<int>(3));
    } else {
      CHECK(SettlesTo([&] { return f.Status().gpu_devices(0).jobs() == 0; }));
      std::this_thread::sleep_for(std::chrono::milliseconds(1200));
      CHECK(f.daemon->Running());
      CHECK(f.Status().gpu_devices(0).poisoned());
      CHECK(f.daemon->Stop() == std::optional<int>(0));
    }
  }
}

// exit_on_gpu_poison never pulls device memory from under a trainer: when the poisoned GPU fails
// the trainer's job while the trainer still holds a batch (its IPC mapping open), spdld waits until
// the trainer has closed its mapping (the batch gone: CudaMappingClosed), and only then exits.
TEST_CASE(NAME("a poisoned GPU's exit waits until the trainer whose job failed has closed its mapping"), GPU_TAGS) {
  Fixture f;
  client::GpuOptions g = ClientGpu(f);
  g.device = 0;
  auto l = client::GpuLoader::Open(f.Job("{device: cuda:0}", 0), g);
  REQUIRE(l.ok());
  std::vector<client::GpuBatch> held;
  while (held.size() < 2) {
    auto ev = (*l)->Next();
    REQUIRE(ev.ok());
    if (auto* b = std::get_if<client::GpuBatch>(&*ev)) held.push_back(std::move(*b));
  }
  {
    // Written whole, then renamed into place: the daemon never reads it half written.
    const std::string path = f.fake_gpu() + "/" + cuda::kStickyErrorFile + "0-" + std::to_string(f.daemon->pid());
    std::FILE* poison = std::fopen((path + ".tmp").c_str(), "w");
    REQUIRE(poison != nullptr);
    std::fputs("cudaErrorIllegalAddress: an illegal memory access was encountered (test)", poison);
    std::fclose(poison);
    REQUIRE(std::rename((path + ".tmp").c_str(), path.c_str()) == 0);
  }
  CHECK(SettlesTo([&] {
    const proto::DaemonStatus st = f.Status();
    return st.gpu_devices_size() == 1 && st.gpu_devices(0).poisoned();
  }));
  // One batch goes back: the daemon's next CUDA call for the job fails, and so does the job.
  held.pop_back();
  bool failed = false;
  for (int i = 0; i < 50 && !failed; ++i) {
    auto ev = (*l)->Next();
    failed = !ev.ok();
    if (failed) CHECK_THAT(ev.status().message(), Catch::Contains("GPU delivery to cuda:0"));
  }
  CHECK(failed);
  l->reset();  // the loader goes; the batch it delivered is still held, and so is its mapping
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(f.daemon->Running());
  CHECK(f.Status().gpu_devices(0).jobs() == 1);
  held.clear();  // the last batch goes: the mapping is closed, and the daemon told
  CHECK(SettlesTo([&] { return !f.daemon->Running(); }));
  CHECK(f.daemon->exit_code() == std::optional<int>(3));
}

// The GpuLoader's own logic against the in-process FakeBackend (its call log shows the order of
// the device calls), with the real daemon: copy: client needs nothing of the daemon's GPU.
TEST_CASE(NAME("GpuLoader copy: client on the in-process fake: copy, consumer wait, consumer-done, teardown"),
          GPU_TAGS) {
  Fixture f;
  const Batches cpu = CpuBatches(f);
  cuda::FakeDevice dev;
  cuda::FakeBackend fake(dev, "trainer");
  const cuda::Stream consumer = *fake.CreateStream();
  const cuda::Stream other = *fake.CreateStream();
  {
    client::GpuOptions g;
    g.backend = &fake;
    g.consumer_stream = consumer;
    auto l = client::GpuLoader::Open(f.Job("{device: cuda:0, copy: client}"), g);
    REQUIRE(l.ok());
    CHECK((*l)->client_copy());
    CHECK((*l)->device() == 0);
    Batches got;
    int n = 0;
    dev.ClearCalls();
    for (;;) {
      auto ev = (*l)->Next();
      REQUIRE(ev.ok());
      if (std::holds_alternative<client::JobStats>(*ev)) break;
      auto* b = std::get_if<client::GpuBatch>(&*ev);
      if (!b) continue;
      // Acquire: the copy from the pinned host slot, its event, and the consumer stream waits on it.
      const auto calls = dev.calls();
      REQUIRE(calls.size() >= 3);
      const auto& copy = calls[calls.size() - 3];
      const auto& rec = calls[calls.size() - 2];
      const auto& wait = calls[calls.size() - 1];
      CHECK((copy.op == cuda::FakeOp::kCopyH2D && copy.pinned));
      CHECK(rec.op == cuda::FakeOp::kRecord);
      CHECK((wait.op == cuda::FakeOp::kWait && wait.stream == fake.StreamId(consumer) && wait.event == rec.event));
      std::string bytes;
      for (const auto& t : b->tensors()) bytes.append(static_cast<const char*>(t.data), t.bytes);
      got[{b->host().epoch(), b->host().batch_in_epoch()}] = bytes;
      const bool moved = n++ % 2 == 1;
      if (moved) REQUIRE(b->WaitOn(other).ok());
      dev.ClearCalls();
      b->Release();
      CHECK(b->released());
      std::vector<cuda::FakeCall> rel;
      for (const auto& c : dev.calls()) {
        if (c.op != cuda::FakeOp::kQuery) rel.push_back(c);
      }
      // Consumer-done, on the stream the batch was last used on; when it was used on two, the first
      // is joined into it first (a temporary event: create, record, wait, destroy).
      REQUIRE(rel.size() == (moved ? 5u : 1u));
      CHECK((rel.back().op == cuda::FakeOp::kRecord && rel.back().stream == fake.StreamId(moved ? other : consumer)));
      if (moved) CHECK((rel[2].op == cuda::FakeOp::kWait && rel[2].stream == fake.StreamId(other)));
      dev.ClearCalls();
    }
    CHECK(got == cpu);
  }
  // The loader's teardown freed its device slots and unregistered the host mapping.
  CHECK(fake.DestroyStream(other).ok());
  CHECK(fake.DestroyStream(consumer).ok());
  CHECK(dev.live().empty());
  CHECK(fake.teardown_errors().empty());
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}
#endif

}  // namespace
}  // namespace spdl
