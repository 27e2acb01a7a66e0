// GPU delivery's host-side logic, on every machine: the DeviceSlotPool (daemon), DeviceSlotView and
// ClientCopyPool (client), the CUDA IPC messages, RAII handles and DLPack helpers, all run against
// FakeBackend. Two FakeBackends on one FakeDevice stand for the daemon and the trainer processes,
// and the device's call log shows the order of every call across both, which is what the reuse
// rule is about. The same code runs against the real CUDA runtime in tests/gpu/.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_handles.h"
#include "cuda/device_scope.h"
#include "cuda/device_slot_pool.h"
#include "cuda/fake_backend.h"
#include "cuda/ipc_messages.h"
#include "cuda/shm_fake_backend.h"
#include "proto/control.pb.h"
#include "proto/shm_layout.h"
#include "spdl/cuda/client_copy.h"
#include "spdl/cuda/device_slot_view.h"
#include "spdl/cuda/dlpack_tensor.h"
#include "temp_dir.h"

namespace spdl::cuda {
namespace {

using client::ClientCopyOptions;
using client::ClientCopyPool;
using client::DeviceSlotView;

// A job's host region laid out as the daemon lays it out (header page, then the slots).
struct HostRegion {
  proto::SlotLayout layout;
  uint8_t* data = nullptr;

  HostRegion(const std::vector<uint64_t>& tensor_bytes, uint32_t slots) {
    layout = proto::ComputeSlotLayout(tensor_bytes, slots);
    data = static_cast<uint8_t*>(std::aligned_alloc(proto::kPageBytes, layout.region_bytes));
    REQUIRE(data != nullptr);
    std::memset(data, 0, layout.region_bytes);
  }
  ~HostRegion() { std::free(data); }
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  uint8_t* slot(uint32_t s) const { return data + layout.SlotOffset(s); }
  // Writes the bytes of batch `seq` into slot `s` (what the pipeline does).
  void Fill(uint32_t s, uint64_t seq) const {
    for (uint64_t j = 0; j < layout.slot_stride; ++j) slot(s)[j] = Pattern(seq, j);
  }
  static uint8_t Pattern(uint64_t seq, uint64_t j) { return static_cast<uint8_t>(seq * 131 + j * 7 + (j >> 12)); }
  bool Holds(const void* device, uint64_t seq) const {
    const auto* p = static_cast<const uint8_t*>(device);
    for (uint64_t j = 0; j < layout.slot_stride; ++j) {
      if (p[j] != Pattern(seq, j)) return false;
    }
    return true;
  }
  DeviceSlotPoolOptions PoolOptions() const {
    DeviceSlotPoolOptions o;
    o.host_base = data;
    o.host_bytes = layout.region_bytes;
    o.slots_offset = layout.slots_offset;
    o.slot_stride = layout.slot_stride;
    o.num_slots = layout.num_slots;
    o.drain_timeout = std::chrono::milliseconds(50);
    return o;
  }
};

std::vector<FakeCall> CallsOf(const FakeDevice& d, const std::string& process,
                              const std::function<bool(const FakeCall&)>& pred = nullptr) {
  std::vector<FakeCall> out;
  for (const FakeCall& c : d.calls()) {
    if (c.process == process && (!pred || pred(c))) out.push_back(c);
  }
  return out;
}

std::string Dump(const std::vector<FakeCall>& calls) {
  std::string s;
  for (const FakeCall& c : calls) s += ToString(c) + "\n";
  return s;
}

std::string Ops(const std::vector<FakeCall>& calls) {
  std::string s;
  for (const FakeCall& c : calls) s += std::string(s.empty() ? "" : " ") + FakeOpName(c.op);
  return s;
}

// ==================================================================================== FakeBackend

TEST_CASE("FakeBackend: IPC memory and events open in another process only, and are shared", "[cuda]") {
  FakeDevice dev;
  FakeBackend daemon(dev, "daemon");
  FakeBackend trainer(dev, "trainer");

  auto mem = daemon.DeviceAlloc(8192);
  REQUIRE(mem.ok());
  auto handle = daemon.ExportMemory(*mem);
  REQUIRE(handle.ok());
  auto same = daemon.OpenMemory(*handle);
  REQUIRE_FALSE(same.ok());
  CHECK_THAT(same.status().message(), Catch::Contains("exported by this process"));

  auto mapped = trainer.OpenMemory(*handle);
  REQUIRE(mapped.ok());
  auto stream = daemon.CreateStream();
  REQUIRE(stream.ok());
  std::vector<uint8_t> src(8192, 0xab);
  REQUIRE(daemon.MemcpyH2DAsync(*mem, src.data(), src.size(), *stream).ok());
  std::vector<uint8_t> back(8192, 0);
  REQUIRE(trainer.MemcpyD2HAsync(back.data(), *mapped, back.size(), Stream{}).ok());
  CHECK(back == src);

  auto ev = daemon.CreateEvent(/*interprocess=*/true);
  REQUIRE(ev.ok());
  auto eh = daemon.ExportEvent(*ev);
  REQUIRE(eh.ok());
  auto opened = trainer.OpenEvent(*eh);
  REQUIRE(opened.ok());
  CHECK(trainer.EventId(*opened) == daemon.EventId(*ev));
  daemon.SetEventPending(*ev, true);
  CHECK_FALSE(*trainer.QueryEvent(*opened));
  daemon.SetEventPending(*ev, false);
  CHECK(*trainer.QueryEvent(*opened));

  REQUIRE(trainer.CloseMemory(*mapped).ok());
  REQUIRE(daemon.DeviceFree(*mem).ok());
  REQUIRE(trainer.DestroyEvent(*opened).ok());
  REQUIRE(daemon.DestroyEvent(*ev).ok());
  REQUIRE(daemon.DestroyStream(*stream).ok());
  CHECK(dev.live().empty());
  CHECK(dev.violations().empty());
}

TEST_CASE("FakeBackend: what CUDA leaves undefined happens, and is recorded as a violation", "[cuda]") {
  FakeDevice dev;
  FakeBackend daemon(dev, "daemon");
  FakeBackend trainer(dev, "trainer");
  auto mem = daemon.DeviceAlloc(8192);
  REQUIRE(mem.ok());
  auto mapped = trainer.OpenMemory(*daemon.ExportMemory(*mem));
  REQUIRE(mapped.ok());
  auto ev = daemon.CreateEvent(/*interprocess=*/true);
  REQUIRE(ev.ok());
  auto opened = trainer.OpenEvent(*daemon.ExportEvent(*ev));
  REQUIRE(opened.ok());

  // Freeing while another process has it mapped: not refused (CUDA would not), recorded; the
  // bytes stay readable in the importer until it closes them (a test reading them does not crash).
  REQUIRE(daemon.DeviceFree(*mem).ok());
  // Destroying an exported event an importer still has open: recorded too.
  REQUIRE(daemon.DestroyEvent(*ev).ok());
  // Using the imported event afterwards: recorded, and the call fails.
  auto q = trainer.QueryEvent(*opened);
  REQUIRE_FALSE(q.ok());
  CHECK_THAT(q.status().message(), Catch::Contains("destroyed by its exporting process daemon"));
  const auto v = dev.violations();
  REQUIRE(v.size() == 3);
  CHECK_THAT(v[0], Catch::Contains("daemon freed allocation") && Catch::Contains("still have it open"));
  CHECK_THAT(v[1], Catch::Contains("daemon destroyed exported event") && Catch::Contains("still have it open"));
  CHECK_THAT(v[2], Catch::Contains("trainer used event"));
  std::vector<uint8_t> back(16);
  REQUIRE(trainer.MemcpyD2HAsync(back.data(), *mapped, back.size(), Stream{}).ok());
  REQUIRE(trainer.CloseMemory(*mapped).ok());
  REQUIRE(trainer.DestroyEvent(*opened).ok());
  CHECK(dev.live().empty());
}

TEST_CASE("FakeBackend: free and unregister wait for the process's queued work, and would hang on work that never runs",
          "[cuda]") {
  FakeDevice dev(uint64_t{1} << 32, FakeDevice::DefaultUuid(), std::chrono::milliseconds(200));
  FakeBackend b(dev, "daemon");
  std::vector<uint8_t> host(8192);
  REQUIRE(b.HostRegister(host.data(), host.size()).ok());
  auto mem = b.DeviceAlloc(4096);
  REQUIRE(mem.ok());
  auto stream = b.CreateStream();
  REQUIRE(stream.ok());
  auto ev = b.CreateEvent(false);
  REQUIRE(ev.ok());
  REQUIRE(b.MemcpyH2DAsync(*mem, host.data(), 4096, *stream).ok());
  REQUIRE(b.RecordEvent(*ev, *stream).ok());
  b.SetEventPending(*ev, true);  // the copy is still running on the GPU

  SECTION("free blocks until the work has run") {
    std::atomic<bool> let_go{false};
    std::thread gpu([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      let_go = true;
      b.SetEventPending(*ev, false);
    });
    REQUIRE(b.DeviceFree(*mem).ok());
    CHECK(let_go.load());  // returned only after the work completed
    gpu.join();
    REQUIRE(b.HostUnregister(host.data()).ok());
    CHECK(dev.violations().empty());
  }
  SECTION("work that never runs: free and unregister would hang (recorded, and they fail)") {
    CHECK(b.DeviceFree(*mem).code() == StatusCode::kUnavailable);
    CHECK(b.HostUnregister(host.data()).code() == StatusCode::kUnavailable);
    CHECK(b.SynchronizeStream(*stream).code() == StatusCode::kUnavailable);
    const auto v = dev.violations();
    REQUIRE(v.size() == 3);
    CHECK_THAT(v[0], Catch::Contains("DeviceFree") && Catch::Contains("would hang"));
    CHECK_THAT(v[1], Catch::Contains("HostUnregister") && Catch::Contains("would hang"));
    b.SetEventPending(*ev, false);
    REQUIRE(b.DeviceFree(*mem).ok());
    REQUIRE(b.HostUnregister(host.data()).ok());
  }
  REQUIRE(b.DestroyEvent(*ev).ok());
  REQUIRE(b.DestroyStream(*stream).ok());
  CHECK(dev.live().empty());
}

TEST_CASE("FakeBackend: a wait on another process's event holds everything queued behind it", "[cuda]") {
  FakeDevice dev(uint64_t{1} << 32, FakeDevice::DefaultUuid(), std::chrono::milliseconds(100));
  FakeBackend daemon(dev, "daemon");
  auto trainer = std::make_unique<FakeBackend>(dev, "trainer");
  auto done = trainer->CreateEvent(true);
  REQUIRE(done.ok());
  auto done_in_daemon = daemon.OpenEvent(*trainer->ExportEvent(*done));
  REQUIRE(done_in_daemon.ok());
  auto stream = daemon.CreateStream();
  REQUIRE(stream.ok());
  auto ready = daemon.CreateEvent(true);
  REQUIRE(ready.ok());

  // The trainer recorded its work; it has not run yet. The daemon's stream waits on it (the GPU
  // wait spdld must never make): what the daemon records after it is not complete either.
  REQUIRE(trainer->RecordEvent(*done, Stream{}).ok());
  trainer->SetEventPending(*done, true);
  REQUIRE(daemon.StreamWaitEvent(*stream, *done_in_daemon).ok());
  REQUIRE(daemon.RecordEvent(*ready, *stream).ok());
  CHECK_FALSE(*daemon.QueryEvent(*ready));
  trainer->SetEventPending(*done, false);  // the trainer's work ran: so does what waited for it
  CHECK(*daemon.QueryEvent(*ready));

  SECTION("the trainer dies with its work queued: the imported event never completes") {
    REQUIRE(trainer->RecordEvent(*done, Stream{}).ok());
    trainer->SetEventPending(*done, true);
    REQUIRE(daemon.StreamWaitEvent(*stream, *done_in_daemon).ok());
    REQUIRE(daemon.RecordEvent(*ready, *stream).ok());
    trainer.reset();  // the process exits
    CHECK_FALSE(*daemon.QueryEvent(*done_in_daemon));
    CHECK_FALSE(*daemon.QueryEvent(*ready));
    CHECK(daemon.SynchronizeEvent(*ready).code() == StatusCode::kUnavailable);
    // A wait made after the death never ends either.
    auto ready2 = daemon.CreateEvent(false);
    REQUIRE(daemon.StreamWaitEvent(*stream, *done_in_daemon).ok());
    REQUIRE(daemon.RecordEvent(*ready2, *stream).ok());
    CHECK_FALSE(*daemon.QueryEvent(*ready2));
    REQUIRE(daemon.DestroyEvent(*ready2).ok());
    dev.ClearViolations();
  }
  SECTION("a completed record is seen complete, even on another stream of the waiter") {
    auto other = daemon.CreateStream();
    REQUIRE(daemon.StreamWaitEvent(*other, *done_in_daemon).ok());
    REQUIRE(daemon.SynchronizeStream(*other).ok());
    REQUIRE(daemon.DestroyStream(*other).ok());
  }
  REQUIRE(daemon.DestroyEvent(*done_in_daemon).ok());
  REQUIRE(daemon.DestroyEvent(*ready).ok());
  REQUIRE(daemon.DestroyStream(*stream).ok());
  if (trainer) REQUIRE(trainer->DestroyEvent(*done).ok());
  CHECK(dev.violations().empty());
}

TEST_CASE("FakeBackend: a sticky error poisons every later call of the process", "[cuda]") {
  FakeDevice dev;
  FakeBackend b(dev, "trainer");
  FakeBackend other(dev, "daemon");
  auto mem = b.DeviceAlloc(4096);
  REQUIRE(mem.ok());
  b.InjectStickyError(Internal("cudaErrorIllegalAddress: an illegal memory access was encountered"));
  CHECK_THAT(b.CreateStream().status().message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_THAT(b.QueryEvent(Event{}).status().message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_THAT(b.DeviceFree(*mem).message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_THAT(b.DeviceAlloc(16).status().message(), Catch::Contains("cudaErrorIllegalAddress"));
  // Another process is not affected.
  auto mine = other.DeviceAlloc(16);
  REQUIRE(mine.ok());
  REQUIRE(other.DeviceFree(*mine).ok());
}

// The cross-process fake (the daemon's --test-only-fake-gpu) follows the same rules: a forked child
// stands for the trainer. (Fork before any thread: this test's process has none yet.)
// A Result<bool>'s value, or `otherwise` when it failed.
inline bool ValueOr(const Result<bool>& r, bool otherwise) { return r.ok() ? *r : otherwise; }
namespace shmfake {
using Dir = spdl::testing::TempDir;  // temp_dir.h
// Runs fn in a child process; returns its exit status (fn's return value).
int InChild(const std::function<int()>& fn) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn());
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}
}  // namespace shmfake

TEST_CASE(
    "ShmFakeBackend: undefined frees are recorded, a dead exporter's event never completes, sticky errors fail every "
    "call",
    "[cuda]") {
  shmfake::Dir dir;
  auto daemon = ShmFakeBackend::Create(dir.path, 0);
  REQUIRE(daemon.ok());
  ShmFakeBackend& d = **daemon;
  auto mem = d.DeviceAlloc(4096);
  REQUIRE(mem.ok());
  auto ev = d.CreateEvent(/*interprocess=*/true);
  REQUIRE(ev.ok());
  auto mh = d.ExportMemory(*mem);
  auto eh = d.ExportEvent(*ev);
  REQUIRE(mh.ok());
  REQUIRE(eh.ok());
  int to_child[2], to_parent[2];
  REQUIRE(::pipe(to_child) == 0);
  REQUIRE(::pipe(to_parent) == 0);
  // 1. The trainer maps the memory and opens the event, and keeps them open while the daemon frees
  // and destroys them: undefined in CUDA, so it happens (the trainer's bytes stay valid) and is
  // recorded as a violation, once each.
  const pid_t trainer = ::fork();
  if (trainer == 0) {
    auto t = ShmFakeBackend::Create(dir.path, 0);
    if (!t.ok()) ::_exit(2);
    auto m = (*t)->OpenMemory(*mh);
    auto e = (*t)->OpenEvent(*eh);
    if (!m.ok() || !e.ok()) ::_exit(3);
    (void)!::write(to_parent[1], "o", 1);
    char c;
    (void)!::read(to_child[0], &c, 1);  // the daemon has freed both
    static_cast<uint8_t*>(*m)[0] = 7;   // still mapped pages
    const bool ok = (*t)->CloseMemory(*m).ok() && (*t)->DestroyEvent(*e).ok();
    ::_exit(ok ? 0 : 4);
  }
  char c = 0;
  REQUIRE(::read(to_parent[0], &c, 1) == 1);
  CHECK(ShmFakeBackend::Violations(dir.path).empty());
  CHECK(d.DeviceFree(*mem).ok());
  CHECK(d.DestroyEvent(*ev).ok());
  REQUIRE(::write(to_child[1], "f", 1) == 1);
  int st = 0;
  ::waitpid(trainer, &st, 0);
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  auto v = ShmFakeBackend::Violations(dir.path);
  REQUIRE(v.size() == 2);
  CHECK_THAT(v[0], Catch::Contains("DeviceFree") && Catch::Contains("still maps it"));
  CHECK_THAT(v[1], Catch::Contains("DestroyEvent") && Catch::Contains("still has it open"));
  ::unlink((dir.path + "/violations").c_str());

  // 2. Closed before the free, in the right order: no violation. A dead importer's marks do not
  // count either (the driver closes a dead process's mappings).
  auto mem2 = d.DeviceAlloc(4096);
  REQUIRE(mem2.ok());
  auto mh2 = d.ExportMemory(*mem2);
  REQUIRE(mh2.ok());
  CHECK(shmfake::InChild([&] {
          auto t = ShmFakeBackend::Create(dir.path, 0);
          if (!t.ok() || !(*t)->OpenMemory(*mh2).ok()) return 2;
          ::_exit(0);  // dies holding the mapping
        }) == 0);
  CHECK(d.DeviceFree(*mem2).ok());
  CHECK(ShmFakeBackend::Violations(dir.path).empty());
  // Nor an exited importer its parent has not reaped yet (a zombie): the driver tore its context
  // down when it exited, so a daemon that notices the death first (its socket closed) may free.
  auto ev2 = d.CreateEvent(/*interprocess=*/true);
  REQUIRE(ev2.ok());
  auto eh2 = d.ExportEvent(*ev2);
  REQUIRE(eh2.ok());
  const pid_t zombie = ::fork();
  if (zombie == 0) {
    auto t = ShmFakeBackend::Create(dir.path, 0);
    if (!t.ok() || !(*t)->OpenEvent(*eh2).ok()) ::_exit(2);
    ::_exit(0);  // dies holding the event
  }
  siginfo_t info{};
  REQUIRE(::waitid(P_PID, static_cast<id_t>(zombie), &info, WEXITED | WNOWAIT) == 0);  // exited, not reaped
  CHECK(info.si_status == 0);
  CHECK(d.DestroyEvent(*ev2).ok());
  CHECK(ShmFakeBackend::Violations(dir.path).empty());
  ::waitpid(zombie, nullptr, 0);

  // 3. An event exported by a process that died never completes in its importers: QueryEvent stays
  // false, SynchronizeEvent would hang (a violation, and an error instead of hanging the test), and
  // a stream that waited on it is blocked for ever: a copy queued behind it never runs.
  ::close(to_parent[0]);
  ::close(to_parent[1]);
  REQUIRE(::pipe(to_parent) == 0);
  const pid_t exporter = ::fork();
  if (exporter == 0) {
    auto x = ShmFakeBackend::Create(dir.path, 0);
    if (!x.ok()) ::_exit(2);
    auto e = (*x)->CreateEvent(true);
    if (!e.ok() || !(*x)->RecordEvent(*e, Stream{}).ok()) ::_exit(3);
    auto h = (*x)->ExportEvent(*e);
    if (!h.ok()) ::_exit(4);
    (void)!::write(to_parent[1], h->bytes.data(), h->bytes.size());
    (void)!::read(to_child[0], &c, 1);
    ::_exit(0);  // dies without destroying it (the daemon killed with a copy queued)
  }
  IpcEventHandle dead_h;
  REQUIRE(::read(to_parent[0], dead_h.bytes.data(), dead_h.bytes.size()) == static_cast<ssize_t>(dead_h.bytes.size()));
  auto opened = d.OpenEvent(dead_h);
  REQUIRE(opened.ok());
  CHECK(ValueOr(d.QueryEvent(*opened), false));  // alive: its recorded work has run
  REQUIRE(::write(to_child[1], "x", 1) == 1);
  ::waitpid(exporter, nullptr, 0);
  CHECK_FALSE(ValueOr(d.QueryEvent(*opened), true));
  CHECK(ShmFakeBackend::Violations(dir.path).empty());
  CHECK_FALSE(d.SynchronizeEvent(*opened).ok());
  CHECK(ShmFakeBackend::Violations(dir.path).size() == 1);
  auto stream = d.CreateStream();
  auto dst = d.DeviceAlloc(64);
  REQUIRE(stream.ok());
  REQUIRE(dst.ok());
  std::vector<uint8_t> src(64, 9);
  std::memset(*dst, 0, 64);
  REQUIRE(d.StreamWaitEvent(*stream, *opened).ok());
  REQUIRE(d.MemcpyH2DAsync(*dst, src.data(), 64, *stream).ok());
  CHECK(static_cast<uint8_t*>(*dst)[0] == 0);  // never ran
  CHECK(ShmFakeBackend::Violations(dir.path).size() == 2);
  CHECK_FALSE(d.SynchronizeStream(*stream).ok());
  REQUIRE(d.DestroyEvent(*opened).ok());
  REQUIRE(d.DestroyStream(*stream).ok());
  ::unlink((dir.path + "/violations").c_str());

  // 4. A sticky error of this process (its PID's poison file) fails every later call with it;
  // another process on the same device goes on (CUDA contexts are per process).
  {
    std::FILE* f = std::fopen((dir.path + "/" + kStickyErrorFile + "0-" + std::to_string(::getpid())).c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("cudaErrorIllegalAddress: test", f);
    std::fclose(f);
  }
  CHECK_THAT(d.sticky_error().message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_THAT(d.DeviceAlloc(16).status().message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_THAT(d.DeviceFree(*dst).message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_THAT(d.CreateStream().status().message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK_THAT(d.MemcpyH2DAsync(*dst, src.data(), 64, Stream{}).message(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK(d.Uuid().ok());
  CHECK(shmfake::InChild([&] {
          auto t = ShmFakeBackend::Create(dir.path, 0);
          if (!t.ok() || !(*t)->sticky_error().ok()) return 2;
          auto m = (*t)->DeviceAlloc(16);
          return m.ok() && (*t)->DeviceFree(*m).ok() ? 0 : 3;
        }) == 0);
  for (int fd : {to_child[0], to_child[1], to_parent[0], to_parent[1]}) ::close(fd);
}

TEST_CASE("FakeBackend: misuse CUDA refuses is refused, fault injection, pinned copies", "[cuda]") {
  FakeDevice dev(/*capacity_bytes=*/1 << 20);
  FakeBackend b(dev, "daemon");
  std::vector<uint8_t> host(64 * 1024);

  REQUIRE(b.HostRegister(host.data(), 32 * 1024).ok());
  CHECK(b.HostRegister(host.data() + 4096, 4096).code() == StatusCode::kFailedPrecondition);
  CHECK(b.HostUnregister(host.data() + 4096).code() == StatusCode::kFailedPrecondition);

  auto big = b.DeviceAlloc(2 << 20);
  REQUIRE_FALSE(big.ok());
  CHECK(big.status().code() == StatusCode::kResourceExhausted);

  auto mem = b.DeviceAlloc(4096);
  REQUIRE(mem.ok());
  CHECK_FALSE(b.ExportMemory(static_cast<uint8_t*>(*mem) + 256).ok());  // not a base
  CHECK(b.MemcpyH2DAsync(*mem, host.data(), 8192, Stream{}).code() == StatusCode::kInvalidArgument);

  auto plain = b.CreateEvent(/*interprocess=*/false);
  REQUIRE(plain.ok());
  CHECK(b.ExportEvent(*plain).status().code() == StatusCode::kInvalidArgument);
  CHECK(b.RecordEvent(*plain, Stream{reinterpret_cast<void*>(0x1234)}).code() == StatusCode::kInvalidArgument);

  // Pinned or not is recorded per copy.
  REQUIRE(b.MemcpyH2DAsync(*mem, host.data(), 4096, Stream{}).ok());
  REQUIRE(b.MemcpyH2DAsync(*mem, host.data() + 40 * 1024, 4096, Stream{}).ok());
  auto copies = CallsOf(dev, "daemon", [](const FakeCall& c) { return c.op == FakeOp::kCopyH2D && c.ok; });
  REQUIRE(copies.size() == 2);
  CHECK(copies[0].pinned);
  CHECK_FALSE(copies[1].pinned);

  // Fault injection: the next call of a kind fails once, doing nothing.
  b.FailNext(FakeOp::kAlloc, Internal("injected"));
  CHECK(b.DeviceAlloc(16).status().message() == "injected");
  auto again = b.DeviceAlloc(16);
  REQUIRE(again.ok());

  REQUIRE(b.DeviceFree(*again).ok());
  REQUIRE(b.DeviceFree(*mem).ok());
  REQUIRE(b.DestroyEvent(*plain).ok());
  REQUIRE(b.HostUnregister(host.data()).ok());
  CHECK(dev.live().empty());
}

// ================================================================================ ScopedDevice

// cudaGetDevice / cudaSetDevice as the runtime has them: per-thread state.
struct PerThreadRuntime {
  static int& Current() {
    thread_local int device = 0;
    return device;
  }
  int sets = 0;
  bool fail_set = false;
  Status GetDevice(int* d) {
    *d = Current();
    return Status::Ok();
  }
  Status SetDevice(int d) {
    if (fail_set) return Unavailable("cudaSetDevice: cudaErrorInvalidDevice");
    ++sets;
    Current() = d;
    return Status::Ok();
  }
};

TEST_CASE("ScopedDevice: a backend call gives the calling thread its own device back", "[cuda]") {
  PerThreadRuntime rt;
  PerThreadRuntime::Current() = 1;  // the trainer's thread works on cuda:1
  {
    ScopedDevice<PerThreadRuntime> scope(rt, 0);  // a call of the backend of cuda:0
    REQUIRE(scope.status().ok());
    CHECK(PerThreadRuntime::Current() == 0);
  }
  CHECK(PerThreadRuntime::Current() == 1);  // restored: the trainer's next kernel runs where it chose
  CHECK(rt.sets == 2);
  {
    ScopedDevice<PerThreadRuntime> scope(rt, 1);  // already current: no switch at all
    CHECK(scope.status().ok());
  }
  CHECK(rt.sets == 2);
  // Another thread's device is its own.
  std::thread other([&] {
    ScopedDevice<PerThreadRuntime> scope(rt, 3);
    CHECK(PerThreadRuntime::Current() == 3);
  });
  other.join();
  CHECK(PerThreadRuntime::Current() == 1);
  rt.fail_set = true;
  {
    ScopedDevice<PerThreadRuntime> scope(rt, 2);
    CHECK(scope.status().code() == StatusCode::kUnavailable);
  }
  CHECK(PerThreadRuntime::Current() == 1);
}

// ==================================================================================== handles

TEST_CASE("Device handles: move-only owners undo exactly once and report teardown failures", "[cuda]") {
  FakeDevice dev;
  FakeBackend b(dev, "daemon");
  {
    auto buf = AllocDevice(b, 4096);
    REQUIRE(buf.ok());
    DeviceBuffer moved = std::move(buf).value();
    DeviceBuffer target;
    CHECK_FALSE(target.valid());
    target = std::move(moved);
    CHECK_FALSE(moved.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
    CHECK(target.get().bytes == 4096);
    CHECK(dev.live().allocations == 1);
  }
  CHECK(dev.live().allocations == 0);
  CHECK(CallsOf(dev, "daemon", [](const FakeCall& c) { return c.op == FakeOp::kFree; }).size() == 1);

  // A failing destroy is reported through the backend, never thrown.
  {
    auto ev = MakeEvent(b, true);
    REQUIRE(ev.ok());
    b.FailNext(FakeOp::kDestroyEvent, Internal("driver shutting down"));
  }
  auto errors = b.teardown_errors();
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].message(), Catch::Contains("destroying an event") && Catch::Contains("driver shutting down"));

  // release() leaks on purpose; Close() returns the Status.
  auto stream = MakeStream(b);
  REQUIRE(stream.ok());
  Stream raw = stream->release();
  CHECK_FALSE(stream->valid());
  REQUIRE(b.DestroyStream(raw).ok());
  auto reg_mem = std::vector<uint8_t>(4096);
  auto reg = RegisterHost(b, reg_mem.data(), reg_mem.size());
  REQUIRE(reg.ok());
  CHECK(reg->Close().ok());
  CHECK(reg->Close().ok());  // idempotent
}

// ==================================================================================== messages

CudaJobHandles SampleHandles(uint32_t slots, uint64_t slot_bytes) {
  CudaJobHandles h;
  h.device_index = 3;
  h.device_uuid = FakeDevice::DefaultUuid();
  IpcMemHandle m;
  m.bytes[0] = 7;
  h.memory.push_back({m, slot_bytes * slots});
  h.slot_bytes = slot_bytes;
  for (uint32_t i = 0; i < slots; ++i) {
    h.slots.push_back({0, i * slot_bytes});
    IpcEventHandle e;
    e.bytes[1] = static_cast<uint8_t>(i + 1);
    h.ready_events.push_back(e);
  }
  return h;
}

TEST_CASE("CudaHandles: round trip, and every inconsistency is refused", "[cuda]") {
  const CudaJobHandles h = SampleHandles(3, 8192);
  proto::CudaHandles msg;
  BuildCudaHandles(h, &msg);
  std::string wire;
  REQUIRE(msg.SerializeToString(&wire));
  proto::CudaHandles parsed_msg;
  REQUIRE(parsed_msg.ParseFromString(wire));
  auto parsed = ParseCudaHandles(parsed_msg, 3, 8192);
  REQUIRE(parsed.ok());
  CHECK(parsed->device_index == 3);
  CHECK(parsed->device_uuid == h.device_uuid);
  REQUIRE(parsed->memory.size() == 1);
  CHECK(parsed->memory[0].handle == h.memory[0].handle);
  CHECK(parsed->memory[0].bytes == 3 * 8192);
  REQUIRE(parsed->slots.size() == 3);
  CHECK(parsed->slots[2].offset == 2 * 8192);
  CHECK(parsed->ready_events == h.ready_events);

  auto refuse = [&](const std::function<void(proto::CudaHandles&)>& spoil, const char* says, uint32_t slots = 3,
                    uint64_t slot_bytes = 8192) {
    proto::CudaHandles m = msg;
    spoil(m);
    auto r = ParseCudaHandles(m, slots, slot_bytes);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains(says));
  };
  refuse([](auto&) {}, "slot_memory: 3 entries for a job of 4 slots", 4);
  refuse([](auto&) {}, "expected the job's slot stride 4096", 3, 4096);
  refuse([](auto& m) { m.set_device_uuid("short"); }, "device_uuid is 5 bytes");
  refuse([](auto& m) { m.set_memory_handles(0, "x"); }, "memory handle 0 is 1 bytes, expected 64");
  refuse(
      [](auto& m) {
        m.clear_memory_handles();
        m.clear_memory_bytes();
      },
      "no memory handles");
  refuse([](auto& m) { m.add_memory_handles(std::string(64, 'a')); }, "2 memory handles but 1 sizes");
  refuse([](auto& m) { m.set_slot_memory(1, 5); }, "slot 1 names memory handle 5 of 1");
  refuse([](auto& m) { m.set_slot_offsets(1, 8192 + 16); }, "not 256-byte aligned");
  refuse([](auto& m) { m.set_slot_offsets(2, 3 * 8192); }, "lies outside its allocation");
  refuse([](auto& m) { m.set_ready_events(0, std::string(63, 'e')); }, "slot 0: ready event is 63 bytes");
  refuse([](auto& m) { m.mutable_ready_events()->RemoveLast(); }, "ready_events: 2 entries");
}

TEST_CASE("CudaConsumerEvents: round trip and count check", "[cuda]") {
  std::vector<IpcEventHandle> done(4);
  for (size_t i = 0; i < done.size(); ++i) done[i].bytes[5] = static_cast<uint8_t>(10 + i);
  proto::CudaConsumerEvents msg;
  BuildCudaConsumerEvents(done, &msg);
  auto parsed = ParseCudaConsumerEvents(msg, 4);
  REQUIRE(parsed.ok());
  CHECK(*parsed == done);
  auto wrong = ParseCudaConsumerEvents(msg, 5);
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(wrong.status().message(), Catch::Contains("4 entries for a job of 5 slots"));
  msg.set_done_events(2, "abc");
  CHECK_THAT(ParseCudaConsumerEvents(msg, 4).status().message(), Catch::Contains("slot 2 event is 3 bytes"));
}

// ==================================================================================== DeviceSlotPool

TEST_CASE("DeviceSlotPool: Create pins the region, allocates the slots, exports once", "[cuda]") {
  HostRegion region({10000, 64}, 3);  // image 10000 B -> 12 KiB, label -> 4 KiB: stride 16 KiB
  FakeDevice dev;
  FakeBackend daemon(dev, "daemon", /*ordinal=*/2);
  auto pool = DeviceSlotPool::Create(daemon, region.PoolOptions());
  REQUIRE(pool.ok());
  const uint64_t want = DeviceSlotPool::DeviceBytes(region.layout.slot_stride, 3);
  CHECK(want == 3 * 16384);
  CHECK((*pool)->device_bytes() == want);
  CHECK(dev.live().device_bytes == want);
  CHECK(dev.live().registrations == 1);
  CHECK(dev.live().streams == 1);
  CHECK(dev.live().events == 3);

  const CudaJobHandles& h = (*pool)->handles();
  CHECK(h.device_index == 2);
  CHECK(h.device_uuid == FakeDevice::DefaultUuid());
  REQUIRE(h.memory.size() == 1);
  CHECK(h.memory[0].bytes == want);
  CHECK(h.slot_bytes == region.layout.slot_stride);
  REQUIRE(h.slots.size() == 3);
  CHECK(h.slots[1].offset == region.layout.slot_stride);
  CHECK(h.ready_events.size() == 3);
  // The exported form passes the client's checks.
  proto::CudaHandles msg;
  BuildCudaHandles(h, &msg);
  CHECK(ParseCudaHandles(msg, 3, region.layout.slot_stride).ok());

  CHECK(Ops(CallsOf(dev, "daemon")) ==
        "host_register alloc create_stream create_event create_event create_event export_memory "
        "export_event export_event export_event");
  const auto reg = CallsOf(dev, "daemon", [](const FakeCall& c) { return c.op == FakeOp::kHostRegister; });
  CHECK(reg.at(0).bytes == region.layout.region_bytes);
  pool->reset();
  CHECK(dev.live().empty());
}

TEST_CASE("DeviceSlotPool: Create refuses bad layouts and cleans up after any failure", "[cuda]") {
  HostRegion region({4096}, 4);
  FakeDevice dev;
  FakeBackend daemon(dev, "daemon");

  auto o = region.PoolOptions();
  o.num_slots = 0;
  CHECK(DeviceSlotPool::Create(daemon, o).status().code() == StatusCode::kInvalidArgument);
  o = region.PoolOptions();
  o.num_slots = 5;  // more slots than the region holds
  CHECK_THAT(DeviceSlotPool::Create(daemon, o).status().message(), Catch::Contains("do not fit"));
  o = region.PoolOptions();
  o.slot_stride = 4096 + 100;
  CHECK_THAT(DeviceSlotPool::Create(daemon, o).status().message(), Catch::Contains("multiple of 256"));

  SECTION("out of device memory") {
    FakeDevice small(/*capacity_bytes=*/8192);
    FakeBackend b(small, "daemon");
    auto r = DeviceSlotPool::Create(b, region.PoolOptions());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kResourceExhausted);
    CHECK_THAT(r.status().message(), Catch::Contains("allocating 16384 bytes for 4 device slots"));
    CHECK(small.live().empty());  // the host registration was undone
  }
  for (FakeOp op : {FakeOp::kHostRegister, FakeOp::kAlloc, FakeOp::kCreateStream, FakeOp::kCreateEvent,
                    FakeOp::kExportMemory, FakeOp::kExportEvent}) {
    DYNAMIC_SECTION("failure of " << FakeOpName(op)) {
      daemon.FailNext(op, Internal("injected failure"));
      auto r = DeviceSlotPool::Create(daemon, region.PoolOptions());
      REQUIRE_FALSE(r.ok());
      CHECK_THAT(r.status().message(), Catch::Contains("injected failure"));
      CHECK(dev.live().empty());
      CHECK(daemon.teardown_errors().empty());
    }
  }
}

// One daemon pool and one trainer view on a fake device: the whole per-job handshake.
struct Job {
  HostRegion region;
  FakeDevice dev;
  FakeBackend daemon{dev, "daemon"};
  FakeBackend trainer{dev, "trainer"};
  std::unique_ptr<DeviceSlotPool> pool;
  Stream trainer_stream;
  std::unique_ptr<DeviceSlotView> view;

  explicit Job(uint32_t slots) : region({20000, 8 * 32}, slots) {
    auto p = DeviceSlotPool::Create(daemon, region.PoolOptions());
    REQUIRE(p.ok());
    pool = std::move(p).value();
    // Over the wire and back, as it will travel.
    proto::CudaHandles msg;
    BuildCudaHandles(pool->handles(), &msg);
    auto handles = ParseCudaHandles(msg, slots, region.layout.slot_stride);
    REQUIRE(handles.ok());
    trainer_stream = *trainer.CreateStream();
    auto v = DeviceSlotView::Open(trainer, *handles, trainer_stream);
    REQUIRE(v.ok());
    view = std::move(v).value();
    proto::CudaConsumerEvents reply;
    BuildCudaConsumerEvents(view->consumer_done_handles(), &reply);
    auto done = ParseCudaConsumerEvents(reply, slots);
    REQUIRE(done.ok());
    REQUIRE(pool->ImportConsumerEvents(*done).ok());
  }
  ~Job() {
    // The teardown order of the protocol: the daemon stops, the client closes its view, the
    // daemon frees.
    if (pool) pool->Stop();
    view.reset();
    pool.reset();
    if (trainer_stream.handle) (void)trainer.DestroyStream(trainer_stream);
  }
};

TEST_CASE("DeviceSlotPool + DeviceSlotView: the reuse rule, over several epochs", "[cuda]") {
  constexpr uint32_t kSlots = 3;
  constexpr uint64_t kBatches = 4 * kSlots;  // four "epochs" of slot reuse
  Job job(kSlots);
  uint64_t generation = 100;
  std::vector<uint64_t> seq_of_slot(kSlots);

  for (uint64_t seq = 0; seq < kBatches; ++seq) {
    const uint32_t slot = static_cast<uint32_t>(seq % kSlots);
    // Pipeline: the host slot may be refilled only when its previous copy has read it.
    auto reusable = job.pool->HostSlotReusable(slot);
    REQUIRE(reusable.ok());
    CHECK(*reusable);
    job.region.Fill(slot, seq);
    REQUIRE(job.pool->Submit(slot).ok());
    CHECK(job.pool->state(slot) == DeviceSlotState::kCopying);
    // Control thread: lease under the host ring's generation, send BatchReady.
    ++generation;
    REQUIRE(job.pool->Lease(slot, generation).ok());
    // Trainer: wait on the ready event, use the bytes, release.
    auto data = job.view->Acquire(slot, generation);
    REQUIRE(data.ok());
    CHECK(*data == job.view->slot_data(slot));
    CHECK(job.region.Holds(*data, seq));  // the device bytes are the host slot's, exactly
    REQUIRE(job.view->Release(slot, generation).ok());
    REQUIRE(job.pool->Release(slot, generation).ok());
    CHECK(job.pool->state(slot) == DeviceSlotState::kReleased);
    seq_of_slot[slot] = seq;
  }

  // Per slot, in device-wide order: daemon copy C, daemon record-ready R, trainer wait-on-ready W,
  // trainer record-done D, daemon host query of done q. The rule: every copy but the first is
  // preceded by the daemon's host query that found complete the done event the trainer recorded
  // at the release before it; the daemon's stream never waits on the trainer's event (w).
  for (uint32_t s = 0; s < kSlots; ++s) {
    const uint64_t ready = job.daemon.EventId(job.pool->ready_event(s));
    const uint64_t done = job.daemon.EventId(job.pool->consumer_event(s));
    const uint64_t offset = uint64_t{s} * job.region.layout.slot_stride;
    std::string trace;
    for (const FakeCall& c : job.dev.calls()) {
      const bool daemon = c.process == "daemon";
      if (daemon && c.op == FakeOp::kCopyH2D && c.offset == offset)
        trace += 'C';
      else if (daemon && c.op == FakeOp::kRecord && c.event == ready)
        trace += 'R';
      else if (!daemon && c.op == FakeOp::kWait && c.event == ready)
        trace += 'W';
      else if (!daemon && c.op == FakeOp::kRecord && c.event == done)
        trace += 'D';
      else if (daemon && c.op == FakeOp::kQuery && c.event == done)
        trace += 'q';
      else if (daemon && c.op == FakeOp::kWait)
        trace += 'w';  // never: no GPU wait on a foreign event
    }
    INFO("slot " << s << "\n" << Dump(job.dev.calls()));
    CHECK(trace ==
          "CRWD"
          "qCRWD"
          "qCRWD"
          "qCRWD");
  }
  // Every copy came from page-locked memory, on the pool's stream, never on the default stream.
  const uint64_t copy_stream = job.daemon.StreamId(job.pool->copy_stream());
  for (const FakeCall& c : CallsOf(job.dev, "daemon", [](const FakeCall& c) { return c.op == FakeOp::kCopyH2D; })) {
    CHECK(c.pinned);
    CHECK(c.stream == copy_stream);
    CHECK(c.bytes == job.region.layout.slot_stride);
  }
  // No host synchronization on the hot path, on either side.
  for (const FakeCall& c : job.dev.calls()) {
    CHECK(c.op != FakeOp::kSyncEvent);
    CHECK(c.op != FakeOp::kSyncStream);
  }
}

TEST_CASE("DeviceSlotPool: a stalled trainer holds only its slot, never the copy stream", "[cuda]") {
  Job job(2);
  job.region.Fill(0, 1);
  REQUIRE(job.pool->Submit(0).ok());
  REQUIRE(job.pool->Lease(0, 1).ok());
  REQUIRE(job.view->Acquire(0, 1).ok());
  REQUIRE(job.view->Release(0, 1).ok());
  REQUIRE(job.pool->Release(0, 1).ok());
  // The trainer's kernels on slot 0 have not run (a stalled or dead trainer).
  const Event done = job.pool->consumer_event(0);
  job.daemon.SetEventPending(done, true);

  // Slot 0 may not be copied into: the daemon says so at once instead of queueing a GPU wait.
  auto free0 = job.pool->ConsumerDone(0);
  REQUIRE(free0.ok());
  CHECK_FALSE(*free0);
  Status s = job.pool->Submit(0);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(s.message(), Catch::Contains("consumer-done event for it has not completed"));
  CHECK(job.pool->state(0) == DeviceSlotState::kReleased);
  // Other slots go on: the copy stream is not blocked behind the trainer.
  job.region.Fill(1, 2);
  REQUIRE(job.pool->Submit(1).ok());
  CHECK(*job.pool->HostSlotReusable(1));
  for (const FakeCall& c : job.dev.calls()) CHECK_FALSE((c.process == "daemon" && c.op == FakeOp::kWait));

  // The trainer catches up and closes its view; the daemon's copy stream never waited on anything
  // of the trainer's, so its teardown frees at once (no hang, nothing leaked).
  job.daemon.SetEventPending(done, false);
  job.pool->Stop();
  job.view.reset();
  REQUIRE(job.pool->Shutdown().ok());
  CHECK(job.pool->leaked_bytes() == 0);
  CHECK(job.dev.violations().empty());
  CHECK(job.daemon.teardown_errors().empty());
}

TEST_CASE("DeviceSlotView::Detach: a daemon that died with a copy queued cannot hang the trainer's teardown",
          "[cuda]") {
  Job job(2);
  REQUIRE(job.pool->Submit(0).ok());
  REQUIRE(job.pool->Lease(0, 1).ok());
  job.daemon.SetEventPending(job.pool->ready_event(0), true);  // the copy has not run yet
  REQUIRE(job.view->Acquire(0, 1).ok());                       // the trainer's stream waits for it on the GPU
  job.daemon.Die();  // ... and the daemon dies: its ready event never completes
  job.view->set_detach_timeout(std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  job.view->Detach();  // records consumer-done behind the dead wait, then gives up waiting
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  auto errors = job.trainer.teardown_errors();
  REQUIRE(errors.size() == 1);
  CHECK_THAT(errors[0].message(), Catch::Contains("did not complete within 100 ms") && Catch::Contains("leaking"));
  for (const FakeCall& c : job.dev.calls()) CHECK_FALSE((c.process == "trainer" && c.op == FakeOp::kCloseMemory));
  CHECK(job.dev.violations().empty());
  // (The Job's teardown then finds every call of the dead daemon failing, at once: nothing hangs.)
}

TEST_CASE("DeviceSlotPool: stale, duplicate and out-of-order operations are refused", "[cuda]") {
  HostRegion region({4096}, 2);
  FakeDevice dev;
  FakeBackend daemon(dev, "daemon");
  auto created = DeviceSlotPool::Create(daemon, region.PoolOptions());
  REQUIRE(created.ok());
  DeviceSlotPool& pool = **created;

  CHECK(pool.Submit(2).code() == StatusCode::kInvalidArgument);
  CHECK(pool.Submit(0, 4097).code() == StatusCode::kInvalidArgument);
  CHECK(pool.Lease(0, 1).code() == StatusCode::kInvalidArgument);  // free, not copying
  REQUIRE(pool.Submit(0).ok());
  CHECK(pool.Submit(0).code() == StatusCode::kFailedPrecondition);  // copying
  REQUIRE(pool.Lease(0, 7).ok());
  REQUIRE(pool.Submit(1, 100).ok());                               // a partial batch copies only its bytes
  CHECK(pool.Lease(1, 7).code() == StatusCode::kInvalidArgument);  // generation not new
  CHECK(pool.Lease(1, 6).code() == StatusCode::kInvalidArgument);
  REQUIRE(pool.Lease(1, 8).ok());

  Status stale = pool.Release(0, 8);
  CHECK(stale.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(stale.message(), Catch::Contains("stale generation 8 (the lease is generation 7)"));
  CHECK(pool.state(0) == DeviceSlotState::kLeased);  // nothing changed
  REQUIRE(pool.Release(0, 7).ok());
  Status dup = pool.Release(0, 7);
  CHECK_THAT(dup.message(), Catch::Contains("is released, not leased"));

  // A released slot cannot be reused before the client's consumer-done events are known.
  Status early = pool.Submit(0);
  CHECK(early.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(early.message(), Catch::Contains("consumer-done events are not imported"));

  // Import: wrong count, then right, then a second time.
  FakeBackend trainer(dev, "trainer");
  std::vector<EventHandle> done;
  std::vector<IpcEventHandle> handles;
  for (int i = 0; i < 2; ++i) {
    done.push_back(MakeEvent(trainer, true).value());
    handles.push_back(*trainer.ExportEvent(done.back().get()));
  }
  CHECK(pool.ImportConsumerEvents({handles[0]}).code() == StatusCode::kInvalidArgument);
  REQUIRE(pool.ImportConsumerEvents(handles).ok());
  CHECK(pool.ImportConsumerEvents(handles).code() == StatusCode::kFailedPrecondition);
  REQUIRE(pool.Submit(0).ok());

  // The client went away: every lease comes back, and no more copies are accepted.
  CHECK(pool.ReleaseAll() == 1);  // slot 1
  CHECK(pool.state(1) == DeviceSlotState::kReleased);
  pool.Stop();
  CHECK_THAT(pool.Submit(1).message(), Catch::Contains("stopped"));
  auto counts = pool.counts();
  CHECK(counts.copying == 1);
  CHECK(counts.released == 1);

  const auto copies = CallsOf(dev, "daemon", [](const FakeCall& c) { return c.op == FakeOp::kCopyH2D; });
  REQUIRE(copies.size() == 3);
  CHECK(copies[1].bytes == 100);
  created->reset();
  done.clear();
  CHECK(dev.live().empty());
}

TEST_CASE("DeviceSlotPool: the host slot is refilled only after its copy has read it", "[cuda]") {
  Job job(2);
  job.region.Fill(0, 1);
  REQUIRE(job.pool->Submit(0).ok());
  const Event ready = job.pool->ready_event(0);

  // The copy has not run yet (the GPU is busy): the pipeline must not refill the host slot.
  job.daemon.SetEventPending(ready, true);
  auto reusable = job.pool->HostSlotReusable(0);
  REQUIRE(reusable.ok());
  CHECK_FALSE(*reusable);
  CHECK(job.pool->state(0) == DeviceSlotState::kCopying);
  // Blocking wait: on the fake a held event blocks until block_limit, then "would hang" (recorded).
  CHECK(job.pool->WaitHostSlotReusable(0).code() == StatusCode::kUnavailable);

  job.daemon.SetEventPending(ready, false);
  REQUIRE(job.pool->WaitHostSlotReusable(0).ok());
  CHECK(job.pool->state(0) == DeviceSlotState::kReady);  // seen done: copying -> ready
  CHECK(*job.pool->HostSlotReusable(0));
  CHECK(job.pool->HostSlotReusable(5).status().code() == StatusCode::kInvalidArgument);

  // Poll: released -> free once the consumer's event is done; a free slot needs no wait.
  REQUIRE(job.pool->Lease(0, 1).ok());
  REQUIRE(job.view->Acquire(0, 1).ok());
  REQUIRE(job.view->Release(0, 1).ok());
  REQUIRE(job.pool->Release(0, 1).ok());
  const Event done = job.pool->consumer_event(0);
  job.daemon.SetEventPending(done, true);
  REQUIRE(job.pool->Poll().ok());
  CHECK(job.pool->state(0) == DeviceSlotState::kReleased);
  job.daemon.SetEventPending(done, false);
  REQUIRE(job.pool->Poll().ok());
  CHECK(job.pool->state(0) == DeviceSlotState::kFree);
  job.dev.ClearCalls();
  REQUIRE(job.pool->Submit(0).ok());
  CHECK(Ops(CallsOf(job.dev, "daemon")) == "copy_h2d record");
}

TEST_CASE("DeviceSlotPool + DeviceSlotView: teardown order", "[cuda]") {
  SECTION("the protocol's order: client view first, then the daemon pool") {
    Job job(2);
    REQUIRE(job.pool->Submit(0).ok());
    REQUIRE(job.pool->Lease(0, 1).ok());
    REQUIRE(job.view->Acquire(0, 1).ok());
    REQUIRE(job.view->Release(0, 1).ok());
    REQUIRE(job.pool->Release(0, 1).ok());
    REQUIRE(job.pool->Submit(1).ok());
    REQUIRE(job.pool->Lease(1, 2).ok());
    REQUIRE(job.view->Acquire(1, 2).ok());  // still held when the trainer tears down
    job.pool->Stop();
    job.dev.ClearCalls();

    job.view.reset();
    // Held slot: record done; wait for the trainer's work on both used slots; then the opened
    // ready events, the mapping, the trainer's own events.
    CHECK(Ops(CallsOf(job.dev, "trainer")) ==
          "record query query destroy_event destroy_event close_memory destroy_event destroy_event");
    job.pool.reset();
    // Drain (queries), ready events, stream, device memory, host region (the opened consumer
    // events were closed by Stop, before the trainer destroyed them).
    auto daemon_ops = CallsOf(job.dev, "daemon", [](const FakeCall& c) { return c.op != FakeOp::kQuery; });
    CHECK(Ops(daemon_ops) == "destroy_event destroy_event destroy_stream free host_unregister");
    CHECK(job.dev.violations().empty());
    CHECK(job.daemon.teardown_errors().empty());
    CHECK(job.trainer.teardown_errors().empty());
  }
  SECTION("the wrong order is caught: the daemon frees while the trainer still maps the slots") {
    Job job(2);
    job.pool.reset();
    auto v = job.dev.violations();
    REQUIRE_FALSE(v.empty());
    CHECK_THAT(v[0], Catch::Contains("still have it open"));
    job.view.reset();  // the trainer's view still closes cleanly (the fake kept the memory)
    job.dev.ClearViolations();
  }
  SECTION("copies that never drain: the device memory is leaked, not freed under them") {
    Job job(2);
    REQUIRE(job.pool->Submit(0).ok());
    job.daemon.SetEventPending(job.pool->ready_event(0), true);
    job.pool->Stop();
    job.view.reset();
    job.dev.ClearCalls();
    job.pool.reset();
    auto errors = job.daemon.teardown_errors();
    REQUIRE(errors.size() == 1);
    CHECK_THAT(errors[0].message(), Catch::Contains("copies still queued after 50 ms") && Catch::Contains("leaking"));
    for (const FakeCall& c : job.dev.calls()) {
      CHECK(c.op != FakeOp::kFree);
      CHECK(c.op != FakeOp::kHostUnregister);
    }
    CHECK(job.dev.live().allocations == 1);  // leaked on purpose (the fake frees it at the end)
    CHECK(job.dev.live().registrations == 1);
  }
  SECTION("a query that fails gives up at once and says so, not that it waited") {
    Job job(2);
    REQUIRE(job.pool->Submit(0).ok());
    job.daemon.SetEventPending(job.pool->ready_event(0), true);
    job.pool->Stop();
    job.view.reset();
    job.daemon.FailNext(FakeOp::kQuery, Internal("cudaEventQuery: cudaErrorLaunchFailure"));
    job.pool.reset();
    auto errors = job.daemon.teardown_errors();
    REQUIRE(errors.size() == 1);
    CHECK_THAT(errors[0].message(), Catch::Contains("could not tell whether the queued copies have run") &&
                                        Catch::Contains("cudaErrorLaunchFailure") && Catch::Contains("leaking"));
    CHECK_THAT(errors[0].message(), !Catch::Contains("after 50 ms"));
    CHECK(job.dev.live().allocations == 1);  // leaked on purpose, as for a timeout
  }
}

TEST_CASE("DeviceSlotPool: pipeline threads submit while the control thread leases and releases", "[cuda]") {
  constexpr uint32_t kSlots = 4;
  constexpr uint64_t kBatches = 400;
  Job job(kSlots);
  std::atomic<uint64_t> submitted{0};
  std::atomic<bool> failed{false};
  // Slot ownership is handed over through these flags, as the host ring would.
  std::vector<std::atomic<int>> phase(kSlots);  // 0 free for the pipeline, 1 submitted
  for (auto& p : phase) p = 0;

  std::thread pipeline([&] {
    uint64_t seq = 0;
    while (seq < kBatches && !failed) {
      const uint32_t slot = static_cast<uint32_t>(seq % kSlots);
      if (phase[slot].load() != 0) {
        std::this_thread::yield();
        continue;
      }
      if (!job.pool->WaitHostSlotReusable(slot).ok()) failed = true;
      job.region.Fill(slot, seq);
      if (!job.pool->Submit(slot).ok()) failed = true;
      phase[slot] = 1;
      submitted = ++seq;
    }
  });
  uint64_t generation = 0;
  uint64_t delivered = 0;
  for (uint64_t seq = 0; seq < kBatches && !failed; ++seq) {
    const uint32_t slot = static_cast<uint32_t>(seq % kSlots);
    while (phase[slot].load() != 1 && !failed) std::this_thread::yield();
    if (failed) break;
    ++generation;
    // No REQUIRE here: it would throw past the joinable thread.
    auto data = job.pool->Lease(slot, generation).ok() ? job.view->Acquire(slot, generation)
                                                       : Result<void*>(Internal("lease failed"));
    if (!data.ok() || !job.region.Holds(*data, seq) || !job.view->Release(slot, generation).ok() ||
        !job.pool->Release(slot, generation).ok()) {
      failed = true;
      break;
    }
    ++delivered;
    phase[slot] = 0;
  }
  pipeline.join();
  CHECK_FALSE(failed);
  CHECK(submitted == kBatches);
  CHECK(delivered == kBatches);
}

// ==================================================================================== DeviceSlotView

TEST_CASE("DeviceSlotView: opens only on the daemon's device, in another process", "[cuda]") {
  HostRegion region({4096}, 2);
  FakeDevice dev;
  FakeBackend daemon(dev, "daemon");
  auto pool = DeviceSlotPool::Create(daemon, region.PoolOptions());
  REQUIRE(pool.ok());

  SECTION("another device") {
    FakeDevice other(1 << 30, DeviceUuid{1, 2, 3});
    FakeBackend trainer(other, "trainer");
    auto v = DeviceSlotView::Open(trainer, (*pool)->handles(), Stream{});
    REQUIRE_FALSE(v.ok());
    CHECK(v.status().code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(v.status().message(), Catch::Contains("but the daemon delivers on"));
  }
  SECTION("the exporting process itself (CUDA refuses it too)") {
    auto v = DeviceSlotView::Open(daemon, (*pool)->handles(), Stream{});
    REQUIRE_FALSE(v.ok());
    CHECK_THAT(v.status().message(), Catch::Contains("exported by this process"));
    CHECK(dev.live().mappings == 0);
  }
  SECTION("a failure half way undoes what was opened") {
    FakeBackend trainer(dev, "trainer");
    trainer.FailNext(FakeOp::kExportEvent, Internal("injected"));
    auto v = DeviceSlotView::Open(trainer, (*pool)->handles(), Stream{});
    REQUIRE_FALSE(v.ok());
    CHECK(dev.live().mappings == 0);
    CHECK(dev.live().events == 2);  // only the daemon's ready events remain
  }
}

TEST_CASE("DeviceSlotView: holds are checked by generation", "[cuda]") {
  Job job(2);
  REQUIRE(job.pool->Submit(0).ok());
  REQUIRE(job.pool->Lease(0, 5).ok());
  CHECK(job.view->Acquire(2, 5).status().code() == StatusCode::kInvalidArgument);
  REQUIRE(job.view->Acquire(0, 5).ok());
  CHECK(job.view->held(0));
  CHECK(job.view->Acquire(0, 6).status().code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(job.view->Release(0, 4).message(), Catch::Contains("stale generation 4 (held under 5)"));
  CHECK(job.view->held(0));
  CHECK_THAT(job.view->Release(1, 5).message(), Catch::Contains("not held"));

  // The release may name another stream (the trainer moved on to a side stream); the stream the
  // batch was acquired on is joined into it, then consumer-done is recorded there.
  Stream side = *job.trainer.CreateStream();
  job.dev.ClearCalls();
  REQUIRE(job.view->Release(0, 5, side).ok());
  auto rec = CallsOf(job.dev, "trainer", [](const FakeCall& c) { return c.op == FakeOp::kRecord; });
  REQUIRE(rec.size() == 2);
  CHECK(rec[0].stream == job.trainer.StreamId(job.trainer_stream));
  CHECK(rec[1].stream == job.trainer.StreamId(side));
  CHECK(rec[1].event == job.daemon.EventId(job.pool->consumer_event(0)));
  REQUIRE(job.trainer.DestroyStream(side).ok());
}

// ==================================================================================== ClientCopyPool

TEST_CASE("ClientCopyPool (copy: client): pinned own mapping, ordered reuse, exact bytes", "[cuda]") {
  constexpr uint32_t kSlots = 2;
  HostRegion region({5000, 100}, kSlots);
  FakeDevice dev;
  FakeBackend trainer(dev, "trainer");
  Stream consumer = *trainer.CreateStream();
  ClientCopyOptions o;
  o.region_base = region.data;
  o.region_bytes = region.layout.region_bytes;
  o.slots_offset = region.layout.slots_offset;
  o.slot_stride = region.layout.slot_stride;
  o.num_slots = kSlots;
  o.consumer_stream = consumer;
  auto created = ClientCopyPool::Create(trainer, o);
  REQUIRE(created.ok());
  ClientCopyPool& pool = **created;
  CHECK(pool.device_bytes() == kSlots * region.layout.slot_stride);

  for (uint64_t seq = 0; seq < 3 * kSlots; ++seq) {
    const uint32_t slot = static_cast<uint32_t>(seq % kSlots);
    region.Fill(slot, seq);
    auto data = pool.Acquire(slot, seq + 1);
    REQUIRE(data.ok());
    CHECK(region.Holds(*data, seq));
    REQUIRE(pool.Release(slot, seq + 1).ok());
  }
  // Per use: [wait done on the copy stream] copy, record copied, consumer waits; at release:
  // record done on the consumer stream, query copied (done: no host sync).
  const auto calls = CallsOf(dev, "trainer");
  const auto first =
      std::find_if(calls.begin(), calls.end(), [](const FakeCall& c) { return c.op == FakeOp::kCopyH2D; });
  std::vector<FakeCall> hot(first, calls.end());
  CHECK(Ops(hot) ==
        "copy_h2d record wait record query "
        "copy_h2d record wait record query "
        "wait copy_h2d record wait record query "
        "wait copy_h2d record wait record query "
        "wait copy_h2d record wait record query "
        "wait copy_h2d record wait record query");
  for (const FakeCall& c : hot) {
    if (c.op == FakeOp::kCopyH2D) {
      CHECK(c.pinned);
      CHECK(c.stream == trainer.StreamId(pool.copy_stream()));
    }
  }

  CHECK(pool.Release(0, 99).code() == StatusCode::kInvalidArgument);
  REQUIRE(pool.Acquire(0, 50).ok());
  CHECK(pool.Acquire(0, 51).status().code() == StatusCode::kFailedPrecondition);
  CHECK(pool.Acquire(0 + kSlots, 51).status().code() == StatusCode::kInvalidArgument);
  created->reset();  // held slot at teardown: recorded and waited for
  REQUIRE(trainer.DestroyStream(consumer).ok());
  CHECK(dev.live().empty());
  CHECK(trainer.teardown_errors().empty());
}

// ==================================================================================== DLPack

// The leak path of copy: client: when the trainer's work never completes, the device memory and
// the host registration are leaked, never freed or unregistered under it (which would block for
// ever), and Shutdown says so, so that the caller keeps the registered range mapped too.
TEST_CASE("ClientCopyPool: work that never completes leaks the memory and the registration, never frees under it",
          "[cuda]") {
  HostRegion region({4096}, 2);
  FakeDevice dev(uint64_t{1} << 32, FakeDevice::DefaultUuid(), std::chrono::milliseconds(100));
  FakeBackend trainer(dev, "trainer");
  const Stream consumer = *trainer.CreateStream();
  ClientCopyOptions o;
  o.region_base = region.data;
  o.region_bytes = region.layout.region_bytes;
  o.slots_offset = region.layout.slots_offset;
  o.slot_stride = region.layout.slot_stride;
  o.num_slots = 2;
  o.consumer_stream = consumer;
  o.teardown_timeout = std::chrono::milliseconds(100);
  auto pool = ClientCopyPool::Create(trainer, o);
  REQUIRE(pool.ok());
  region.Fill(0, 1);
  REQUIRE((*pool)->Acquire(0, 1).ok());
  // The trainer's kernel on the batch never finishes (a hung kernel): hold the consumer stream.
  auto hang = trainer.CreateEvent(false);
  REQUIRE(trainer.RecordEvent(*hang, consumer).ok());
  trainer.SetEventPending(*hang, true);
  REQUIRE((*pool)->Release(0, 1).ok());
  dev.ClearCalls();
  dev.ClearViolations();
  Status s = (*pool)->Shutdown();
  CHECK(s.code() == StatusCode::kUnavailable);
  for (const FakeCall& c : dev.calls()) {
    CHECK(c.op != FakeOp::kFree);
    CHECK(c.op != FakeOp::kHostUnregister);
  }
  CHECK(dev.live().registrations == 1);  // leaked with the memory: the caller keeps the range mapped
  CHECK(dev.live().allocations == 1);
  CHECK(dev.violations().empty());  // and nothing blocked: the waits are bounded
  bool said = false;
  for (const Status& e : trainer.teardown_errors()) said |= e.message().find("leaking") != std::string::npos;
  CHECK(said);
  pool->reset();
  trainer.SetEventPending(*hang, false);
  REQUIRE(trainer.DestroyEvent(*hang).ok());
  REQUIRE(trainer.DestroyStream(consumer).ok());
}

TEST_CASE("DLPack: tensors on a CUDA device slot", "[cuda]") {
  using client::DType;
  CHECK(client::ToDLDataType(DType::kUInt8).code == kDLUInt);
  CHECK(client::ToDLDataType(DType::kUInt8).bits == 8);
  CHECK(client::ToDLDataType(DType::kInt64).code == kDLInt);
  CHECK(client::ToDLDataType(DType::kInt64).bits == 64);
  CHECK(client::ToDLDataType(DType::kBFloat16).code == kDLBfloat);
  CHECK(client::ToDLDataType(DType::kFloat16).code == kDLFloat);
  CHECK(client::ToDLDataType(DType::kFloat32).bits == 32);
  CHECK(client::ToDLDataType(DType::kInt16).lanes == 1);

  client::TensorView view;
  view.name = "image";
  view.dtype = DType::kUInt8;
  view.shape = {32, 224, 224, 3};
  alignas(256) static uint8_t device_stand_in[256];
  DLTensor t;
  REQUIRE(client::FillDLTensor(view, device_stand_in, client::CudaDLDevice(3), &t).ok());
  CHECK(t.data == device_stand_in);
  CHECK(t.device.device_type == kDLCUDA);
  CHECK(t.device.device_id == 3);
  CHECK(t.ndim == 4);
  CHECK(t.shape == view.shape.data());
  CHECK(t.strides == nullptr);
  CHECK(t.byte_offset == 0);

  client::TensorView label{"label", DType::kInt64, {32}, nullptr, 256};
  CHECK(client::FillDLTensor(label, device_stand_in + 4, client::CudaDLDevice(0), &t).code() ==
        StatusCode::kInvalidArgument);  // misaligned for int64
  CHECK(client::FillDLTensor(label, nullptr, client::CudaDLDevice(0), &t).code() == StatusCode::kInvalidArgument);

  auto keep = std::make_shared<int>(42);
  std::weak_ptr<int> watch = keep;
  Status s;
  DLManagedTensor* m = client::MakeDLManagedTensor(view, device_stand_in, client::CudaDLDevice(1), std::move(keep), &s);
  REQUIRE(s.ok());
  REQUIRE(m != nullptr);
  view.shape[0] = 1;  // the managed tensor owns its own shape
  CHECK(m->dl_tensor.shape[0] == 32);
  CHECK(m->dl_tensor.device.device_id == 1);
  CHECK_FALSE(watch.expired());
  m->deleter(m);
  CHECK(watch.expired());  // the Batch (or whatever was kept) is let go with the tensor
  CHECK(client::MakeDLManagedTensor(label, nullptr, client::CudaDLDevice(0), nullptr, &s) == nullptr);
  CHECK_FALSE(s.ok());
}

}  // namespace
}  // namespace spdl::cuda

namespace spdl::cuda {
namespace {

// ========================================================== the GPU layer's teardown (GpuLoader)

TEST_CASE("DeviceSlotView::Detach: the mapping closes before the daemon frees, the consumer events live on", "[cuda]") {
  Job job(2);
  REQUIRE(job.pool->Submit(0).ok());
  REQUIRE(job.pool->Lease(0, 1).ok());
  REQUIRE(job.view->Acquire(0, 1).ok());  // held by the trainer when it tears down
  job.dev.ClearCalls();

  // GpuLoader's step 1: consumer-done for the held slot, wait for it, then the daemon's ready
  // events and the mapping go; the trainer's consumer-done events stay.
  job.view->Detach();
  CHECK(Ops(CallsOf(job.dev, "trainer")) == "record query destroy_event destroy_event close_memory");
  CHECK_FALSE(job.view->held(0));
  CHECK(job.view->Acquire(1, 2).status().code() == StatusCode::kFailedPrecondition);
  job.view->Detach();  // idempotent
  // Step 2 (the daemon ends the job): it may still wait on a consumer event — it exists — and then
  // frees its memory without complaint, since no mapping is open any more.
  REQUIRE(job.pool->Release(0, 1).ok());
  REQUIRE(job.pool->Submit(0).ok());  // waits on the trainer's (still alive) consumer-done event
  job.pool->Stop();
  job.pool.reset();
  CHECK(job.daemon.teardown_errors().empty());
  // Step 3: the consumer-done events.
  job.dev.ClearCalls();
  job.view.reset();
  CHECK(Ops(CallsOf(job.dev, "trainer")) == "destroy_event destroy_event");
  CHECK(job.trainer.teardown_errors().empty());
  CHECK(job.dev.live().allocations == 0);
  CHECK(job.dev.live().mappings == 0);
  CHECK(job.dev.live().events == 0);
}

TEST_CASE("DeviceSlotView and ClientCopyPool: WaitReady on another stream moves the release there", "[cuda]") {
  SECTION("copy: daemon") {
    Job job(2);
    const Stream other = *job.trainer.CreateStream();
    REQUIRE(job.pool->Submit(1).ok());
    REQUIRE(job.pool->Lease(1, 1).ok());
    CHECK(job.view->WaitReady(1, other).code() == StatusCode::kInvalidArgument);  // not held yet
    REQUIRE(job.view->Acquire(1, 1).ok());
    job.dev.ClearCalls();
    REQUIRE(job.view->WaitReady(1, other).ok());
    REQUIRE(job.view->SetReleaseStream(1, other).ok());
    REQUIRE(job.view->Release(1, 1).ok());
    auto calls = CallsOf(job.dev, "trainer");
    INFO(Dump(calls));
    // The data wait on `other`; at release the consumer stream (used first) is joined into `other`
    // (a temporary event), then consumer-done is recorded there: it covers both streams' work.
    REQUIRE(calls.size() == 6);
    CHECK(calls[0].op == FakeOp::kWait);
    CHECK(calls[0].stream == job.trainer.StreamId(other));
    CHECK(calls[0].event == job.daemon.EventId(job.pool->ready_event(1)));
    CHECK(Ops({calls.begin() + 1, calls.begin() + 5}) == "create_event record wait destroy_event");
    CHECK(calls[2].stream == job.trainer.StreamId(job.trainer_stream));
    CHECK((calls[3].stream == job.trainer.StreamId(other) && calls[3].event == calls[2].event));
    CHECK(calls[5].op == FakeOp::kRecord);
    CHECK(calls[5].stream == job.trainer.StreamId(other));
    CHECK(calls[5].event == job.daemon.EventId(job.pool->consumer_event(1)));
    REQUIRE(job.pool->Release(1, 1).ok());
    REQUIRE(job.trainer.DestroyStream(other).ok());
  }
  SECTION("copy: client") {
    HostRegion region({4096}, 2);
    FakeDevice dev;
    FakeBackend trainer(dev, "trainer");
    const Stream consumer = *trainer.CreateStream();
    const Stream other = *trainer.CreateStream();
    ClientCopyOptions o;
    o.region_base = region.data;
    o.region_bytes = region.layout.region_bytes;
    o.slots_offset = region.layout.slots_offset;
    o.slot_stride = region.layout.slot_stride;
    o.num_slots = 2;
    o.consumer_stream = consumer;
    auto pool = ClientCopyPool::Create(trainer, o);
    REQUIRE(pool.ok());
    region.Fill(0, 5);
    REQUIRE((*pool)->Acquire(0, 1).ok());
    dev.ClearCalls();
    REQUIRE((*pool)->WaitReady(0, other).ok());
    REQUIRE((*pool)->SetReleaseStream(0, other).ok());
    REQUIRE((*pool)->Release(0, 1).ok());
    auto calls = CallsOf(dev, "trainer", [](const FakeCall& c) { return c.op != FakeOp::kQuery; });
    INFO(Dump(calls));
    REQUIRE(calls.size() == 6);
    CHECK((calls[0].op == FakeOp::kWait && calls[0].stream == trainer.StreamId(other)));
    CHECK(Ops({calls.begin() + 1, calls.begin() + 5}) == "create_event record wait destroy_event");
    CHECK(calls[2].stream == trainer.StreamId(consumer));
    CHECK((calls[3].stream == trainer.StreamId(other) && calls[3].event == calls[2].event));
    CHECK((calls[5].op == FakeOp::kRecord && calls[5].stream == trainer.StreamId(other)));
    CHECK(region.Holds((*pool)->slot_data(0), 5));
    CHECK((*pool)->WaitReady(0, other).code() == StatusCode::kInvalidArgument);  // released
    pool->reset();
    REQUIRE(trainer.DestroyStream(other).ok());
    REQUIRE(trainer.DestroyStream(consumer).ok());
    CHECK(dev.live().empty());
  }
}

}  // namespace
}  // namespace spdl::cuda
