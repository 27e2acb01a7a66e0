// GPU delivery through the real job registry and a real job (image folder, worker pool, shared
// region) on the fake device: admission against device_memory_budget_bytes, the device side of a
// running job, and the budget returned when the job goes.
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda/device_slot_pool.h"
#include "cuda/fake_backend.h"
#include "cuda/ipc_messages.h"
#include "e2e/dataset.h"
#include "jobs/job_registry.h"
#include "ops/metrics.h"
#include "pipeline/thread_pool.h"
#include "temp_dir.h"
#include "wait_for.h"

namespace spdl::jobs {
namespace {

using spdl::testing::TempDir;  // temp_dir.h
using spdl::testing::WaitFor;  // wait_for.h

proto::SubmitJob Job(const std::string& root, const std::string& output) {
  proto::SubmitJob r;
  r.set_config_yaml(
      "source: {type: image_folder, root: " + root +
      "}\nbatch: {size: 4}\ntransforms: [{resize: {height: 64, width: 64}}]\nprefetch: 2\noutput: " + output + "\n");
  r.set_config_name("job.yaml");
  return r;
}

// A tiny image folder at dir/data (2 classes x 4 images) and a daemon config that may read it.
config::DaemonConfig SmallDataset(const TempDir& dir) {
  testdata::DatasetOptions o;
  o.classes = 2;
  o.images_per_class = 4;
  o.min_side = 40;
  o.max_side = 80;
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  config::DaemonConfig cfg;
  cfg.allowed_roots = {dir.path};
  return cfg;
}

// What most cases share: the dataset, a worker pool, the fake device with the daemon's and a
// client's backends, and a registry whose every device is the daemon's backend. The pool is joined
// before the registry goes (as the daemon does): a cancelled job's last tasks still return its
// budget lease to the registry.
struct GpuRig {
  GpuRig() {
    reg.SetDeviceBackends([this](int) -> Result<cuda::DeviceBackend*> { return &backend; });
  }
  ~GpuRig() { pool.reset(); }
  GpuRig(const GpuRig&) = delete;
  GpuRig& operator=(const GpuRig&) = delete;

  TempDir dir{0755};  // the jobs belong to uid 1000: the registry opens their files with its rights
  const config::DaemonConfig cfg = SmallDataset(dir);
  std::unique_ptr<pipeline::ThreadPool> pool = std::make_unique<pipeline::ThreadPool>(2);
  cuda::FakeDevice dev;
  cuda::FakeBackend backend{dev, "daemon"};
  cuda::FakeBackend client{dev, "client"};
  const PeerInfo peer{1, 1000, 1000};
  JobRegistry reg{cfg, pool.get(), 2};
};

// The client's per-slot consumer-done events, imported into the job (this process stands for the
// client: the fake allows it).
std::vector<cuda::EventHandle> ImportClientEvents(cuda::FakeBackend& client, JobHandle& job) {
  const uint32_t slots = job.accepted().num_slots();
  std::vector<cuda::EventHandle> done;
  std::vector<cuda::IpcEventHandle> exported;
  for (uint32_t i = 0; i < slots; ++i) {
    auto e = cuda::MakeEvent(client, /*interprocess=*/true);
    REQUIRE(e.ok());
    exported.push_back(*client.ExportEvent(e->get()));
    done.push_back(std::move(e).value());
  }
  proto::CudaConsumerEvents msg;
  cuda::BuildCudaConsumerEvents(exported, &msg);
  REQUIRE(job.ImportConsumerEvents(msg).ok());
  return done;
}

// The job's next batch, waiting up to 10 s for it (none: it did not come).
std::optional<Delivery> NextBatch(JobHandle& job) {
  std::optional<Delivery> d;
  WaitFor([&] { return (d = job.TakeNext()).has_value(); });
  return d;
}

// Drops a job as a session does: cancels it and lets go of it (its teardown may go on elsewhere).
void Drop(SubmitResult& r) {
  r.job->Cancel();
  r.job.reset();
  r.record.reset();
}

TEST_CASE("gpu delivery through the registry: device budget and backend on the fake device") {
  TempDir dir{0755};  // the jobs belong to uid 1000: the registry opens their files with its rights
  const config::DaemonConfig cfg = SmallDataset(dir);
  // Joined before the registry goes (as the daemon does): a cancelled job's last tasks still
  // return its budget lease to the registry.
  auto pool = std::make_unique<pipeline::ThreadPool>(2);
  cuda::FakeDevice dev;
  cuda::FakeBackend backend(dev, "daemon");
  const PeerInfo peer{1, 1000, 1000};
  const std::string root = dir.path + "/data";

  SECTION("a daemon without CUDA refuses copy: daemon and takes copy: client") {
    JobRegistry reg(cfg, pool.get(), 2);
    SubmitResult r = reg.Submit(Job(root, "{device: cuda:0}"), peer, [] {});
    REQUIRE_FALSE(r.ok());
    CHECK(r.status.message() ==
          "output.device cuda:0: this spdld was built without CUDA, so it cannot copy batches to a GPU; use "
          "output.copy: client (the client copies) or output.device: cpu");
    r = reg.Submit(Job(root, "{device: cuda:0, copy: client}"), peer, [] {});
    REQUIRE(r.ok());
    CHECK(r.job->accepted().device() == "cuda:0");
    CHECK(r.job->accepted().client_copy());
    CHECK(r.job->cuda_handles() == nullptr);
    r.job->Cancel();
    r = SubmitResult{};
    pool.reset();
  }
  SECTION("copy: daemon on a device: handles, device bytes counted and returned, budget refusal names it") {
    JobRegistry reg(cfg, pool.get(), 2);
    reg.SetDeviceBackends([&](int device) -> Result<cuda::DeviceBackend*> {
      if (device != 0) return Status(StatusCode::kUnavailable, "no cuda:" + std::to_string(device));
      return &backend;
    });
    SubmitResult r = reg.Submit(Job(root, "{device: cuda:0}"), peer, [] {});
    REQUIRE(r.ok());
    const proto::JobAccepted& a = r.job->accepted();
    CHECK(a.device() == "cuda:0");
    CHECK_FALSE(a.client_copy());
    REQUIRE(r.job->cuda_handles() != nullptr);
    CHECK(r.job->cuda_handles()->ready_events_size() == 2);
    const uint64_t bytes = cuda::DeviceSlotPool::DeviceBytes(a.slot_stride(), a.num_slots());
    CHECK(reg.device_bytes_in_use(0) == bytes);
    CHECK(dev.live().device_bytes == bytes);
    CHECK(dev.live().registrations == 1);
    {
      const proto::DaemonStatus st = reg.Status(PeerInfo{0, 0, 0});
      REQUIRE(st.gpu_devices_size() == 1);
      CHECK_FALSE(st.gpu_devices(0).poisoned());
      CHECK(st.gpu_devices(0).jobs() == 1);
      CHECK_THAT(ops::RenderPrometheus(st, ops::DaemonFacts{}),
                 Catch::Contains("spdld_gpu_device_poisoned{device=\"cuda:0\"} 0"));
    }

    SubmitResult other = reg.Submit(Job(root, "{device: cuda:1}"), peer, [] {});
    REQUIRE_FALSE(other.ok());
    CHECK(other.status.message() == "output.device cuda:1: no cuda:1; use output.copy: client or output.device: cpu");

    reg.UpdateLimits(
        [&] {
          config::DaemonConfig c = cfg;
          // Room for a second job's slots, but not for them and spdld's CUDA context together.
          c.device_memory_budget_bytes = 2 * bytes + bytes / 2;
          c.gpu_context_bytes = bytes;
          return c;
        }(),
        2);
    SubmitResult refused = reg.Submit(Job(root, "{device: cuda:0}"), peer, [] {});
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.status.code() == StatusCode::kResourceExhausted);
    CHECK_THAT(refused.status.message(), Catch::Contains("device_memory_budget_bytes") && Catch::Contains("cuda:0") &&
                                             Catch::Contains("gpu_context_bytes"));
    CHECK(reg.device_bytes_in_use(0) == bytes);

    Drop(r);
    // The frees run on the registry's GPU teardown thread.
    WaitFor([&] { return reg.device_bytes_in_use(0) == 0; });
    CHECK(reg.device_bytes_in_use(0) == 0);
    CHECK(dev.live().device_bytes == 0);
    CHECK(dev.live().registrations == 0);
    CHECK(backend.teardown_errors().empty());
    pool.reset();
  }
}

}  // namespace
}  // namespace spdl::jobs

namespace spdl::jobs {
namespace {

// The GpuJob of a client whose consumer-done event never completes: its copies cannot drain. The
// daemon's control thread (here: the test's thread, which drops the job) must not wait for them;
// the teardown queue does, and frees everything once they have run.
TEST_CASE_METHOD(GpuRig, "gpu delivery: a job whose copies are stuck is torn down off the control thread") {
  std::atomic<int> notified{0};
  SubmitResult r = reg.Submit(Job(dir.path + "/data", "{device: cuda:0}"), peer, [&] { ++notified; });
  REQUIRE(r.ok());
  auto handles =
      cuda::ParseCudaHandles(*r.job->cuda_handles(), r.job->accepted().num_slots(), r.job->accepted().slot_stride());
  REQUIRE(handles.ok());
  std::vector<cuda::EventHandle> done = ImportClientEvents(client, *r.job);

  // The first batch: its copy is enqueued; the GPU "never runs it" (the ready event is held).
  std::optional<Delivery> d = NextBatch(*r.job);
  REQUIRE(d);
  auto ready = client.OpenEvent(handles->ready_events[d->batch.slot()]);
  REQUIRE(ready.ok());
  client.SetEventPending(*ready, true);
  const uint64_t bytes = reg.device_bytes_in_use(0);
  REQUIRE(bytes > 0);

  // The session drops the job: this returns with the copy still queued, nothing freed yet.
  Drop(r);
  CHECK(dev.live().device_bytes == bytes);
  CHECK(reg.device_bytes_in_use(0) == bytes);

  // The GPU catches up: the teardown thread frees the device side and returns the budget.
  client.SetEventPending(*ready, false);
  CHECK(WaitFor([&] {
    return reg.device_bytes_in_use(0) == 0 && dev.live().device_bytes == 0 && dev.live().registrations == 0;
  }));
  for (const Status& e : backend.teardown_errors()) FAIL_CHECK(e.ToString());
  (void)client.DestroyEvent(*ready);
  done.clear();
  pool.reset();
}

// A trainer whose GPU work on a slot never completes (stalled, or dead with work queued): the daemon
// never makes its copy stream wait for it (which would block the stream, then the next cudaFree,
// then the control thread and every job of the node); the batch for that slot is held, and at the
// consumer deadline only this job fails. Its device side is then freed at once.
TEST_CASE_METHOD(
    GpuRig, "gpu delivery: a stalled trainer fails only its job at the consumer deadline, and no stream waits for it") {
  reg.SetGpuTimeouts(std::chrono::milliseconds(300), std::chrono::milliseconds(5000));
  SubmitResult r = reg.Submit(Job(dir.path + "/data", "{device: cuda:0}"), peer, [] {});
  REQUIRE(r.ok());
  std::vector<cuda::EventHandle> done = ImportClientEvents(client, *r.job);

  std::optional<Delivery> d = NextBatch(*r.job);
  REQUIRE(d);
  const uint32_t stalled = d->batch.slot();
  // The trainer releases the batch after queueing its work on it, and that work never runs.
  REQUIRE(client.RecordEvent(done[stalled].get(), cuda::Stream{}).ok());
  client.SetEventPending(done[stalled].get(), true);
  REQUIRE(r.job->Release(stalled, d->batch.generation()).ok());

  // The other slots keep going; the stalled one is never handed out again; then the job fails.
  Status failure;
  int others = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::optional<Delivery> n = r.job->TakeNext()) {
      CHECK(n->batch.slot() != stalled);
      ++others;
      REQUIRE(client.RecordEvent(done[n->batch.slot()].get(), cuda::Stream{}).ok());
      REQUIRE(r.job->Release(n->batch.slot(), n->batch.generation()).ok());
      continue;
    }
    failure = r.job->failure();
    if (!failure.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  INFO("batches on other slots: " << others);
  CHECK(failure.code() == StatusCode::kUnavailable);
  CHECK_THAT(failure.message(), Catch::Contains("device slot " + std::to_string(stalled)) &&
                                    Catch::Contains("did not finish within 300 ms"));
  for (const cuda::FakeCall& c : dev.calls()) CHECK_FALSE((c.process == "daemon" && c.op == cuda::FakeOp::kWait));

  // The session drops the failed job: its copies waited on nothing, so everything is freed now.
  Drop(r);
  CHECK(WaitFor([&] { return reg.device_bytes_in_use(0) == 0 && dev.live().device_bytes == 0; }));
  CHECK(reg.leaked_device_bytes(0) == 0);
  CHECK(dev.violations().empty());
  for (const Status& e : backend.teardown_errors()) FAIL_CHECK(e.ToString());
  client.SetEventPending(done[stalled].get(), false);
  done.clear();
  pool.reset();
}

// cudaFree and cudaHostUnregister synchronize with the GPU: the control thread (here: the test's
// thread, which drops the job) must never make them, even when every copy has already run.
TEST_CASE_METHOD(
    GpuRig,
    "gpu delivery: frees and unregistrations run on the teardown thread, never on the thread dropping the job") {
  SubmitResult r = reg.Submit(Job(dir.path + "/data", "{device: cuda:0}"), peer, [] {});
  REQUIRE(r.ok());
  std::vector<cuda::EventHandle> done = ImportClientEvents(client, *r.job);
  REQUIRE(NextBatch(*r.job));
  Drop(r);
  CHECK(WaitFor([&] { return reg.device_bytes_in_use(0) == 0 && dev.live().registrations == 0; }));
  int frees = 0, unregisters = 0;
  for (const cuda::FakeCall& c : dev.calls()) {
    if (c.process != "daemon" || (c.op != cuda::FakeOp::kFree && c.op != cuda::FakeOp::kHostUnregister)) continue;
    CHECK(c.thread != std::this_thread::get_id());
    ++(c.op == cuda::FakeOp::kFree ? frees : unregisters);
  }
  CHECK(frees == 1);
  CHECK(unregisters == 1);
  CHECK(dev.violations().empty());
  done.clear();
  pool.reset();
}

// A copy that never drains (a hung GPU): its device memory cannot be freed. It is leaked, stays
// counted against the device budget (a new job cannot take it), and shows in the daemon's status.
TEST_CASE_METHOD(GpuRig, "gpu delivery: device memory that cannot be freed is not returned to the budget, and shows") {
  reg.SetGpuTimeouts(std::chrono::milliseconds(60000), std::chrono::milliseconds(200));
  SubmitResult r = reg.Submit(Job(dir.path + "/data", "{device: cuda:0}"), peer, [] {});
  REQUIRE(r.ok());
  std::vector<cuda::EventHandle> done = ImportClientEvents(client, *r.job);
  auto handles =
      cuda::ParseCudaHandles(*r.job->cuda_handles(), r.job->accepted().num_slots(), r.job->accepted().slot_stride());
  REQUIRE(handles.ok());
  std::optional<Delivery> d = NextBatch(*r.job);
  REQUIRE(d);
  const uint64_t bytes = reg.device_bytes_in_use(0);
  REQUIRE(bytes > 0);
  // Hold the copy: the daemon's own ready event of the slot stays incomplete for ever.
  auto ready_daemon = client.OpenEvent(handles->ready_events[d->batch.slot()]);
  REQUIRE(ready_daemon.ok());
  client.SetEventPending(*ready_daemon, true);

  Drop(r);
  CHECK(WaitFor([&] { return reg.leaked_device_bytes(0) == bytes; }));
  CHECK(reg.device_bytes_in_use(0) == bytes);                  // not returned
  CHECK(reg.Status(peer).gpu_leaked_device_bytes() == bytes);  // and shown
  CHECK(dev.live().device_bytes == bytes);                     // never freed under the copy
  bool said = false;
  for (const Status& e : backend.teardown_errors()) said |= e.message().find("leaking") != std::string::npos;
  CHECK(said);
  client.SetEventPending(*ready_daemon, false);
  (void)client.DestroyEvent(*ready_daemon);
  done.clear();
  pool.reset();
}

// A sticky CUDA error (an illegal address, a launch failure, ECC) leaves the daemon's context on the
// device unusable: the device's running job fails with it, a new job for the device is refused
// naming it, and its device memory (which can no longer be freed) stays out of the budget.
TEST_CASE_METHOD(GpuRig,
                 "gpu delivery: a sticky CUDA error fails the device's job, new jobs are refused naming it, status and "
                 "metrics show it") {
  reg.SetGpuTimeouts(std::chrono::milliseconds(60000), std::chrono::milliseconds(200));
  SubmitResult r = reg.Submit(Job(dir.path + "/data", "{device: cuda:0}"), peer, [] {});
  REQUIRE(r.ok());
  std::vector<cuda::EventHandle> done = ImportClientEvents(client, *r.job);
  std::optional<Delivery> d = NextBatch(*r.job);
  REQUIRE(d);
  const uint64_t bytes = reg.device_bytes_in_use(0);
  backend.InjectStickyError(
      Status(StatusCode::kUnavailable, "cudaEventQuery: cudaErrorIllegalAddress: an illegal memory access"));
  // The release's query fails with the device's error: that is not the client's fault, so the
  // Release is accepted (an error would close the session as a bad message) and the job fails.
  CHECK(r.job->Release(d->batch.slot(), d->batch.generation()).ok());
  Status failure;
  CHECK(WaitFor([&] {
    (void)r.job->TakeNext();
    failure = r.job->failure();
    return !failure.ok();
  }));
  CHECK_THAT(failure.message(), Catch::Contains("cudaErrorIllegalAddress"));

  SubmitResult again = reg.Submit(Job(dir.path + "/data", "{device: cuda:0}"), peer, [] {});
  REQUIRE_FALSE(again.ok());
  CHECK_THAT(again.status.message(), Catch::Contains("cudaErrorIllegalAddress") && Catch::Contains("restart spdld") &&
                                         Catch::Contains("output.copy: client"));
  // Status and metrics show the poisoned GPU, and the job that still holds it (the daemon exits
  // only once none does).
  const PeerInfo root{0, 0, 0};
  proto::DaemonStatus st = reg.Status(root);
  REQUIRE(st.gpu_devices_size() == 1);
  CHECK(st.gpu_devices(0).device() == "cuda:0");
  CHECK(st.gpu_devices(0).poisoned());
  CHECK_THAT(st.gpu_devices(0).error(), Catch::Contains("cudaErrorIllegalAddress"));
  CHECK(st.gpu_devices(0).jobs() == 1);
  CHECK_THAT(ops::RenderPrometheus(st, ops::DaemonFacts{}),
             Catch::Contains("spdld_gpu_device_poisoned{device=\"cuda:0\"} 1"));
  Drop(r);
  CHECK(WaitFor([&] { return reg.leaked_device_bytes(0) == bytes; }));
  CHECK(reg.device_bytes_in_use(0) == bytes);
  REQUIRE(reg.GpuDevices().size() == 1);
  CHECK(reg.GpuDevices()[0].jobs == 0);
  CHECK_FALSE(reg.GpuDevices()[0].poisoned.empty());
  done.clear();
  pool.reset();
}

// Making a device's backend creates a CUDA context (hundreds of ms): it happens in the Prepare task
// (the daemon's prepare pool), never on the thread that starts the job (the control thread).
TEST_CASE("gpu delivery: the device backend is made in the Prepare task, off the control thread") {
  TempDir dir{0755};  // the jobs belong to uid 1000: the registry opens their files with its rights
  const config::DaemonConfig cfg = SmallDataset(dir);
  auto pool = std::make_unique<pipeline::ThreadPool>(2);
  cuda::FakeDevice dev;
  cuda::FakeBackend backend(dev, "daemon");
  const PeerInfo peer{1, 1000, 1000};
  {
    JobRegistry reg(cfg, pool.get(), 2);
    std::mutex mu;
    std::vector<std::thread::id> made_on;
    reg.SetDeviceBackends([&](int) -> Result<cuda::DeviceBackend*> {
      std::lock_guard lock(mu);
      made_on.push_back(std::this_thread::get_id());
      return &backend;
    });
    PrepareTask task = reg.Prepare(Job(dir.path + "/data", "{device: cuda:0}"), peer);
    std::shared_ptr<PreparedJob> prepared;
    std::thread preparer([&] { prepared = task(); });
    const std::thread::id preparer_id = preparer.get_id();
    preparer.join();
    SubmitResult r = reg.Start(prepared, [] {});
    REQUIRE(r.continuation);  // the device side is set up off the control thread
    r = reg.Start(r.continuation(), [] {});
    REQUIRE(r.ok());
    {
      std::lock_guard lock(mu);
      REQUIRE(made_on.size() == 1);
      CHECK(made_on[0] == preparer_id);
    }
    Drop(r);
    CHECK(WaitFor([&] { return reg.device_bytes_in_use(0) == 0; }));
    pool.reset();
  }
}

}  // namespace
}  // namespace spdl::jobs
