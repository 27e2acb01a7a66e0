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
#include <unistd.h>

#include <catch2/catch.hpp>
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

#if !SPDL_REAL_GPU
// decode.device: cuda parses (its config rules: config_test) but the job pipeline does not run the
// GPU decode yet: spdld refuses the job, saying so, instead of decoding on the CPU behind the
// config's back; the session serves on.
TEST_CASE(NAME("decode.device: cuda is refused clearly until the pipeline runs it"), GPU_TAGS) {
  Fixture f;
  client::Options o = f.Job("{device: cuda:0}");
  o.config_yaml += "decode: {device: cuda}\n";
  auto l = client::GpuLoader::Open(o, ClientGpu(f));
  REQUIRE_FALSE(l.ok());
  CHECK_THAT(l.status().message(), Catch::Contains("decode.device: cuda") && Catch::Contains("not wired"));
  auto ok = client::GpuLoader::Open(f.Job("{device: cuda:0}"), ClientGpu(f));
  REQUIRE(ok.ok());
  ok->reset();
  CHECK(SettlesTo([&] { return f.LiveJobs() == 0; }));
  CHECK(f.daemon->Stop() == std::optional<int>(0));
}

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
    CHECK_THAT(again.status().message(), Catch::Contains("cudaErrorIllegalAddress") && Catch::Contains("restart spdld"));
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
