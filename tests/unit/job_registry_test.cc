// The job registry's roles, each alone: Admission (the budgets, as RAII leases), ShareGroups (live
// groups by key, with the decoded cache of the group's job held weakly), DevicePlacement (the daemon's GPU and backend
// of a copy: daemon job, on the fake CUDA backend); then the registry's transactional Start: a failure injected after
// each step (and real failures of the fake device's allocation and pinning) leaves no budget, device memory, pinned
// host memory, job slot or share group behind.
#include "jobs/job_registry.h"

#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config/daemon_config.h"
#include "cuda/device_slot_pool.h"
#include "cuda/fake_backend.h"
#include "e2e/dataset.h"
#include "jobs/admission.h"
#include "jobs/decoded_cache.h"
#include "jobs/device_placement.h"
#include "jobs/share_groups.h"
#include "jobs/shared_job.h"
#include "pipeline/thread_pool.h"
#include "temp_dir.h"
#include "wait_for.h"

namespace spdl::jobs {
namespace {

constexpr uint64_t kMiB = 1 << 20;

using testing::WaitFor;  // wait_for.h

config::DaemonConfig Limits(uint64_t budget, int jobs_per_client, double share = 1.0) {
  config::DaemonConfig c;
  c.memory_budget_bytes = budget;
  c.max_jobs_per_client = jobs_per_client;
  c.max_budget_share_per_uid = share;
  c.device_memory_budget_bytes = 100 * kMiB;
  c.gpu_context_bytes = 10 * kMiB;
  return c;
}

Admission::Request Ask(uid_t uid, uint64_t bytes, int device = -1, uint64_t device_bytes = 0) {
  Admission::Request r;
  r.uid = uid;
  r.shm_bytes = bytes;
  r.slots = 2;
  r.device = device;
  r.device_name = device >= 0 ? "cuda:" + std::to_string(device) : "";
  r.device_bytes = device_bytes;
  return r;
}

TEST_CASE("admission: a reservation holds every part until dropped, and a refusal holds nothing") {
  auto budget = std::make_shared<MemoryBudget>(0);
  Admission a(Limits(100 * kMiB, 2), budget);
  {
    auto r = a.Reserve(Ask(1000, 40 * kMiB, 0, 30 * kMiB));
    REQUIRE(r.ok());
    CHECK(a.bytes_in_use() == 40 * kMiB);
    CHECK(a.live_jobs() == 1);
    CHECK(a.jobs_of(1000) == 1);
    CHECK(a.device_bytes_in_use(0) == 30 * kMiB);
    CHECK(a.device_jobs(0) == 1);
    CHECK(budget->limit() == 100 * kMiB);
  }  // dropped untaken: the rollback of a failed start
  CHECK(a.bytes_in_use() == 0);
  CHECK(a.live_jobs() == 0);
  CHECK(a.jobs_of(1000) == 0);
  CHECK(a.device_bytes_in_use(0) == 0);
  CHECK(a.device_jobs(0) == 0);

  // Taken parts live on with their owners, each returned when its owner lets go.
  auto r = a.Reserve(Ask(1000, 40 * kMiB, 0, 30 * kMiB));
  REQUIRE(r.ok());
  std::unique_ptr<BudgetLease> shm = r->TakeShmLease();
  std::shared_ptr<Admission::DeviceLease> dev = r->TakeDeviceLease();
  CHECK_FALSE(r->holds_shm());
  CHECK_FALSE(r->holds_device());
  *r = Admission::Reservation{};
  CHECK(a.bytes_in_use() == 40 * kMiB);
  CHECK(a.device_bytes_in_use(0) == 30 * kMiB);
  dev->Close(5 * kMiB);  // 5 MiB could not be freed: still used, and shown as leaked
  dev->Close(0);         // idempotent: the first close wins
  CHECK(a.device_bytes_in_use(0) == 5 * kMiB);
  CHECK(a.leaked_device_bytes(0) == 5 * kMiB);
  CHECK(a.leaked_device_bytes_total() == 5 * kMiB);
  CHECK(a.device_jobs(0) == 0);
  dev.reset();
  CHECK(a.device_bytes_in_use(0) == 5 * kMiB);
  shm.reset();
  CHECK(a.bytes_in_use() == 0);
  CHECK(a.live_jobs() == 0);
}

TEST_CASE("admission: each limit refuses with its name and leaves the others' accounts untouched") {
  auto budget = std::make_shared<MemoryBudget>(0);
  Admission a(Limits(100 * kMiB, 1, 0.5), budget);
  auto first = a.Reserve(Ask(1000, 30 * kMiB));
  REQUIRE(first.ok());

  auto second = a.Reserve(Ask(1000, kMiB));
  REQUIRE_FALSE(second.ok());
  CHECK(second.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(second.status().message(), Catch::Contains("max_jobs_per_client"));

  // Another uid alone may take what fits in the budget, but uid 1000 has jobs: at most half.
  auto big = a.Reserve(Ask(2000, 60 * kMiB));
  REQUIRE_FALSE(big.ok());
  CHECK_THAT(big.status().message(), Catch::Contains("max_budget_share_per_uid"));
  auto fits = a.Reserve(Ask(2000, 50 * kMiB));
  REQUIRE(fits.ok());

  a.SetLimits(Limits(100 * kMiB, 5, 1.0));
  auto over = a.Reserve(Ask(3000, 21 * kMiB));
  REQUIRE_FALSE(over.ok());
  CHECK_THAT(over.status().message(), Catch::Contains("memory_budget") && Catch::Contains("20 MiB"));

  // The device budget counts spdld's own CUDA context (gpu_context_bytes).
  auto dev = a.Reserve(Ask(3000, kMiB, 1, 95 * kMiB));
  REQUIRE_FALSE(dev.ok());
  CHECK_THAT(dev.status().message(), Catch::Contains("device_memory_budget_bytes") && Catch::Contains("cuda:1") &&
                                         Catch::Contains("gpu_context_bytes"));
  CHECK(a.device_bytes_in_use(1) == 0);
  CHECK(a.Reserve(Ask(3000, kMiB, 1, 90 * kMiB)).ok());  // 90 + 10 fits exactly (then dropped)

  CHECK(a.bytes_in_use() == 80 * kMiB);
  CHECK(a.live_jobs() == 2);
  // A lowered budget: granted leases keep what they hold.
  a.SetLimits(Limits(10 * kMiB, 5));
  CHECK(a.bytes_in_use() == 80 * kMiB);
  *first = Admission::Reservation{};
  *fits = Admission::Reservation{};
  CHECK(a.bytes_in_use() == 0);
  CHECK(a.live_jobs() == 0);
}

TEST_CASE("admission: what streams retain counts against the shared-memory budget") {
  auto budget = std::make_shared<MemoryBudget>(0);
  Admission a(Limits(100 * kMiB, 5), budget);
  // Streams' retained samples and producers' put buffers (BudgetStreamAccount) share the budget.
  REQUIRE(budget->TryChargeStreams(70 * kMiB));
  auto over = a.Reserve(Ask(1000, 40 * kMiB));
  REQUIRE_FALSE(over.ok());
  CHECK(over.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(over.status().message(), Catch::Contains("memory_budget"));
  CHECK(a.bytes_in_use() == 0);
  CHECK(a.live_jobs() == 0);
  auto fits = a.Reserve(Ask(1000, 30 * kMiB));  // 70 + 30 fits exactly
  REQUIRE(fits.ok());
  // And the other way round: a stream may not take what the admitted job holds.
  CHECK_FALSE(budget->TryChargeStreams(1));
  budget->ReleaseStreams(70 * kMiB);
  CHECK(a.Reserve(Ask(2000, 40 * kMiB)).ok());  // room again (then dropped)
  *fits = Admission::Reservation{};
  CHECK(a.bytes_in_use() == 0);
}

// A started job that hands out nothing (the share group's underlying job).
class IdleJob final : public JobHandle {
 public:
  IdleJob() { accepted_.set_job_id(9); }
  const proto::JobAccepted& accepted() const override { return accepted_; }
  int region_fd() const override { return -1; }
  std::optional<Delivery> TakeNext() override { return std::nullopt; }
  spdl::Status Release(uint32_t, uint64_t) override { return spdl::Status::Ok(); }
  spdl::Status failure() const override { return spdl::Status::Ok(); }
  void Cancel() override {}
  proto::JobStats Stats() const override { return {}; }
  void Abort(spdl::Status) override {}

 private:
  proto::JobAccepted accepted_;
};

TEST_CASE("share groups: found by key while joinable, gone with their group") {
  proto::SubmitJob req;
  req.set_config_yaml("x: 1\n");
  const std::string key = ShareGroups::Key(req, PeerInfo{1, 1000, 1000}, 42, 2);
  CHECK(key != ShareGroups::Key(req, PeerInfo{1, 1001, 1000}, 42, 2));  // another uid
  CHECK(key != ShareGroups::Key(req, PeerInfo{1, 1000, 1000}, 43, 2));  // another dataset
  CHECK(key != ShareGroups::Key(req, PeerInfo{1, 1000, 1000}, 42, 3));  // other epochs
  proto::SubmitJob with_override = req;
  auto* o = with_override.add_overrides();
  o->set_path("batch.size");
  o->set_value("8");
  CHECK(key != ShareGroups::Key(with_override, PeerInfo{1, 1000, 1000}, 42, 2));

  ShareGroups groups;
  CHECK_FALSE(groups.FindJoinable(key));
  auto group = std::make_shared<ShareGroup>(1);
  group->SetJob(std::make_shared<IdleJob>());
  groups.Add(key, group, nullptr);
  auto found = groups.FindJoinable(key);
  REQUIRE(found);
  CHECK(found->group == group);
  CHECK_FALSE(groups.FindJoinable(key + "x"));
  found.reset();
  group.reset();
  CHECK_FALSE(groups.FindJoinable(key));
  CHECK(groups.size() == 1);
  groups.DropExpired();
  CHECK(groups.size() == 0);
}

// A source of nothing: what a DecodedCacheSource wraps here (never read).
class EmptySource final : public io::SampleSource {
 public:
  uint64_t size() const override { return 0; }
  const io::SampleRef& sample(uint64_t) const override { return ref_; }
  spdl::Status Read(uint64_t, std::vector<uint8_t>*) const override { return InvalidArgument("empty"); }
  std::string Describe() const override { return "empty"; }
  std::string Identity() const override { return "empty"; }

 private:
  io::SampleRef ref_;
};

TEST_CASE("share groups: a member gets the group job's decoded cache while the job holds it") {
  ShareGroups groups;
  auto group = std::make_shared<ShareGroup>(1);
  group->SetJob(std::make_shared<IdleJob>());
  config::DecodedCacheConfig dc;
  dc.max_side = 64;
  auto decoded = std::make_shared<const DecodedCacheSource>(std::make_shared<EmptySource>(),
                                                            std::make_shared<DecodedCache>(kMiB, nullptr), dc,
                                                            config::DecodeConfig{}, nullptr);
  groups.Add("k", group, nullptr, decoded);
  auto found = groups.FindJoinable("k");
  REQUIRE(found);
  CHECK(found->decoded == decoded);
  found.reset();
  // Held weakly: the cache is the job's memory, freed with its pipeline; the group stays joinable.
  decoded.reset();
  found = groups.FindJoinable("k");
  REQUIRE(found);
  CHECK(found->decoded == nullptr);
  CHECK(found->group == group);
}

config::OutputConfig CudaOut(int n, bool daemon_copy = true) {
  config::OutputConfig o;
  o.device = "cuda:" + std::to_string(n);
  o.cuda_device = n;
  o.copy = daemon_copy ? config::OutputConfig::Copy::kDaemon : config::OutputConfig::Copy::kClient;
  return o;
}

TEST_CASE("device placement: the trainer's GPU by UUID, the backend made in Prepare, checked at Start") {
  cuda::FakeDevice dev;
  cuda::FakeBackend backend(dev, "daemon");
  DevicePlacement none;  // a daemon built without CUDA
  auto p = none.Resolve(CudaOut(0), "");
  REQUIRE(p.ok());
  CHECK(p->device == -1);
  auto c = none.Check(CudaOut(0), *p);
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(), Catch::Contains("built without CUDA") && Catch::Contains("output.copy: client"));

  DevicePlacement placement;
  int made = 0;
  placement.SetBackends([&](int device) -> Result<cuda::DeviceBackend*> {
    ++made;
    if (device != 3) return Unavailable("no cuda:" + std::to_string(device));
    return &backend;
  });
  const cuda::DeviceUuid uuid = cuda::FakeDevice::DefaultUuid();
  placement.SetFinder([&](const cuda::DeviceUuid& u) -> Result<int> {
    if (u != uuid) return NotFound("no such UUID");
    return 3;
  });
  CHECK(placement.Resolve(CudaOut(0, false), "").value().device == -1);  // copy: client: no device side

  // The trainer's cuda:0 is the daemon's 3.
  const std::string uuid_bytes(reinterpret_cast<const char*>(uuid.data()), uuid.size());
  p = placement.Resolve(CudaOut(0), uuid_bytes);
  REQUIRE(p.ok());
  CHECK(p->device == 3);
  CHECK(p->backend == &backend);
  CHECK(made == 1);
  c = placement.Check(CudaOut(0), *p);
  REQUIRE(c.ok());
  CHECK(made == 1);  // made in Prepare, not again

  auto bad = placement.Resolve(CudaOut(0), "short");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kFailedPrecondition);
  std::string other = uuid_bytes;
  other[0] = static_cast<char>(other[0] ^ 1);
  auto unseen = placement.Resolve(CudaOut(0), other);
  REQUIRE_FALSE(unseen.ok());
  CHECK_THAT(unseen.status().message(), Catch::Contains("is not one spdld sees") && Catch::Contains("copy: client"));

  // A backend that cannot be made is reported by Check, naming the way out.
  p = placement.Resolve(CudaOut(1), "");
  REQUIRE(p.ok());
  CHECK(p->backend == nullptr);
  c = placement.Check(CudaOut(1), *p);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message() == "output.device cuda:1: no cuda:1; use output.copy: client or output.device: cpu");

  // A poisoned backend refuses new jobs.
  backend.InjectStickyError(Internal("cudaErrorIllegalAddress"));
  c = placement.Check(CudaOut(0), DevicePlacement::Placement{3, &backend});
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(), Catch::Contains("cudaErrorIllegalAddress") && Catch::Contains("restart spdld"));

  CHECK(placement.Used().empty());
  placement.NoteUsed(3, &backend);
  REQUIRE(placement.Used().size() == 1);
  CHECK(placement.Used()[0].first == 3);
}

// A temporary directory with a small image folder (2 classes x 4 images) at path/data.
struct Dir : testing::TempDir {
  Dir() {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 4;
    o.min_side = 40;
    o.max_side = 80;
    REQUIRE(testdata::MakeImageFolder(path + "/data", o).ok());
  }
};

proto::SubmitJob Job(const std::string& root, const std::string& extra) {
  proto::SubmitJob r;
  r.set_config_yaml("source: {type: image_folder, root: " + root +
                    "}\nbatch: {size: 4}\ntransforms: [{resize: {height: 32, width: 32}}]\nprefetch: 2\n" + extra);
  r.set_config_name("job.yaml");
  return r;
}

TEST_CASE("registry start: a real device failure while wrapping for the GPU returns every reservation") {
  Dir dir;
  config::DaemonConfig cfg;
  cfg.allowed_roots = {dir.path};
  cfg.max_jobs_per_client = 1;
  auto pool = std::make_unique<pipeline::ThreadPool>(2);
  cuda::FakeDevice dev;
  cuda::FakeBackend backend(dev, "daemon");
  const PeerInfo me{::getpid(), ::getuid(), ::getgid()};
  {
    JobRegistry reg(cfg, pool.get(), 2);
    reg.SetDeviceBackends([&](int) -> Result<cuda::DeviceBackend*> { return &backend; });
    for (cuda::FakeOp op : {cuda::FakeOp::kHostRegister, cuda::FakeOp::kAlloc, cuda::FakeOp::kCreateEvent}) {
      INFO("failing op " << static_cast<int>(op));
      backend.FailNext(op, ResourceExhausted("fake device: out of memory"));
      SubmitResult r = reg.Submit(Job(dir.path + "/data", "output: {device: cuda:0}\n"), me, [] {});
      REQUIRE_FALSE(r.ok());
      CHECK_THAT(r.status.message(), Catch::Contains("setting up GPU delivery") && Catch::Contains("out of memory"));
      CHECK(WaitFor([&] { return reg.live_jobs() == 0 && reg.device_bytes_in_use(0) == 0; }));
      CHECK(reg.bytes_in_use() == 0);
      CHECK(WaitFor([&] { return dev.live().empty(); }));
    }
    // max_jobs_per_client is 1: the job slot came back too.
    SubmitResult ok = reg.Submit(Job(dir.path + "/data", "output: {device: cuda:0}\n"), me, [] {});
    REQUIRE(ok.ok());
    CHECK(reg.device_bytes_in_use(0) > 0);
    ok.job->Cancel();
    ok = SubmitResult{};
    CHECK(WaitFor([&] { return reg.live_jobs() == 0 && reg.device_bytes_in_use(0) == 0; }));
    pool.reset();  // the daemon's order: the pool joins before the registry goes
  }
  CHECK(dev.violations().empty());
}

// The fake device with a slow cudaHostRegister: a call waits until the test opens the gate (like a
// pin of a large region on a busy machine).
class SlowPinBackend final : public cuda::DeviceBackend {
 public:
  explicit SlowPinBackend(cuda::DeviceBackend& inner) : in_(inner) {}
  void WaitEntered() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return entered_ > 0; });
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  std::thread::id pinned_on() const {
    std::lock_guard lock(mu_);
    return pinned_on_;
  }

  const char* name() const override { return in_.name(); }
  int device() const override { return in_.device(); }
  Result<cuda::DeviceUuid> Uuid() override { return in_.Uuid(); }
  Status HostRegister(void* ptr, size_t bytes) override {
    std::unique_lock lock(mu_);
    ++entered_;
    pinned_on_ = std::this_thread::get_id();
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    lock.unlock();
    return in_.HostRegister(ptr, bytes);
  }
  Status HostUnregister(void* ptr) override { return in_.HostUnregister(ptr); }
  Result<void*> DeviceAlloc(size_t bytes) override { return in_.DeviceAlloc(bytes); }
  Status DeviceFree(void* ptr) override { return in_.DeviceFree(ptr); }
  Result<cuda::Stream> CreateStream() override { return in_.CreateStream(); }
  Status DestroyStream(cuda::Stream stream) override { return in_.DestroyStream(stream); }
  Result<cuda::Event> CreateEvent(bool interprocess) override { return in_.CreateEvent(interprocess); }
  Status DestroyEvent(cuda::Event event) override { return in_.DestroyEvent(event); }
  Status MemcpyH2DAsync(void* dst, const void* src, size_t bytes, cuda::Stream stream) override {
    return in_.MemcpyH2DAsync(dst, src, bytes, stream);
  }
  Status MemcpyD2HAsync(void* dst, const void* src, size_t bytes, cuda::Stream stream) override {
    return in_.MemcpyD2HAsync(dst, src, bytes, stream);
  }
  Status RecordEvent(cuda::Event event, cuda::Stream stream) override { return in_.RecordEvent(event, stream); }
  Status StreamWaitEvent(cuda::Stream stream, cuda::Event event) override { return in_.StreamWaitEvent(stream, event); }
  Result<bool> QueryEvent(cuda::Event event) override { return in_.QueryEvent(event); }
  Status SynchronizeEvent(cuda::Event event) override { return in_.SynchronizeEvent(event); }
  Status SynchronizeStream(cuda::Stream stream) override { return in_.SynchronizeStream(stream); }
  Result<cuda::IpcMemHandle> ExportMemory(void* base) override { return in_.ExportMemory(base); }
  Result<cuda::IpcEventHandle> ExportEvent(cuda::Event event) override { return in_.ExportEvent(event); }
  Result<void*> OpenMemory(const cuda::IpcMemHandle& handle) override { return in_.OpenMemory(handle); }
  Status CloseMemory(void* base) override { return in_.CloseMemory(base); }
  Result<cuda::Event> OpenEvent(const cuda::IpcEventHandle& handle) override { return in_.OpenEvent(handle); }
  void ReportTeardownError(const Status& status) override { in_.ReportTeardownError(status); }
  Status sticky_error() const override { return in_.sticky_error(); }

 private:
  cuda::DeviceBackend& in_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int entered_ = 0;            // guarded by mu_
  bool open_ = false;          // guarded by mu_
  std::thread::id pinned_on_;  // guarded by mu_
};

TEST_CASE("registry start: a GPU job's pinning and device memory run off the control thread") {
  Dir dir;
  config::DaemonConfig cfg;
  cfg.allowed_roots = {dir.path};
  auto pool = std::make_unique<pipeline::ThreadPool>(2);
  cuda::FakeDevice dev;
  cuda::FakeBackend fake(dev, "daemon");
  SlowPinBackend slow(fake);
  const PeerInfo me{::getpid(), ::getuid(), ::getgid()};
  const std::string root = dir.path + "/data";
  {
    JobRegistry reg(cfg, pool.get(), 2);
    reg.SetDeviceBackends([&](int) -> Result<cuda::DeviceBackend*> { return &slow; });
    std::atomic<int> notified{0};
    auto notify = [&notified] { notified.fetch_add(1); };

    SECTION("the control thread answers other requests while a pin is slow") {
      // Start (the control thread) admits the job and hands the device work back as a continuation.
      SubmitResult r = reg.Start(reg.Prepare(Job(root, "output: {device: cuda:0}\n"), me)(), notify);
      REQUIRE_FALSE(r.ok());
      REQUIRE(r.continuation);
      CHECK(r.status.ok());
      CHECK(reg.device_bytes_in_use(0) > 0);  // admitted: the device budget is held
      CHECK(dev.live().registrations == 0);   // ... but nothing was done on the device yet
      CHECK(dev.live().device_bytes == 0);

      std::shared_ptr<PreparedJob> started;
      std::thread worker([&] { started = r.continuation(); });
      slow.WaitEntered();  // the worker is inside cudaHostRegister, held there
      // Meanwhile the control thread serves another session: status, and a whole CPU job.
      const proto::DaemonStatus st = reg.Status(PeerInfo{0, 0, 0});
      CHECK(st.live_jobs() == 1);
      SubmitResult cpu = reg.Submit(Job(root, ""), me, [] {});
      REQUIRE(cpu.ok());
      CHECK(cpu.job->accepted().device().empty());
      slow.Open();
      worker.join();
      CHECK(slow.pinned_on() != std::this_thread::get_id());

      SubmitResult done = reg.Start(started, notify);
      REQUIRE(done.ok());
      REQUIRE(done.job->cuda_handles() != nullptr);
      CHECK(dev.live().registrations == 1);
      CHECK(dev.live().device_bytes == reg.device_bytes_in_use(0));
      CHECK(notified.load() >= 1);  // the session is told to look at the job once it is answered
      CHECK(reg.Status(PeerInfo{0, 0, 0}).jobs_size() == 2);
      done.job->Cancel();
      cpu.job->Cancel();
    }
    SECTION("a continuation dropped unrun, or its result dropped unstarted, undoes the start") {
      slow.Open();
      SubmitResult r = reg.Start(reg.Prepare(Job(root, "output: {device: cuda:0}\n"), me)(), notify);
      REQUIRE(r.continuation);
      r = SubmitResult{};  // the session went away before the continuation ran
      CHECK(WaitFor([&] { return reg.live_jobs() == 0 && reg.device_bytes_in_use(0) == 0; }));

      r = reg.Start(reg.Prepare(Job(root, "output: {device: cuda:0}\n"), me)(), notify);
      REQUIRE(r.continuation);
      std::shared_ptr<PreparedJob> started = r.continuation();
      r = SubmitResult{};
      CHECK(dev.live().registrations == 1);
      started.reset();  // the session went away before the answer
      CHECK(WaitFor([&] { return reg.live_jobs() == 0 && reg.device_bytes_in_use(0) == 0; }));
      CHECK(WaitFor([&] { return dev.live().empty(); }));
    }
    CHECK(WaitFor([&] { return reg.live_jobs() == 0 && reg.device_bytes_in_use(0) == 0; }));
    pool.reset();
  }
  CHECK(dev.violations().empty());
}

#if SPDL_TEST_HOOKS
TEST_CASE("registry start: a failure after any step rolls back everything that step and those before took") {
  Dir dir;
  config::DaemonConfig cfg;
  cfg.allowed_roots = {dir.path};
  cfg.max_jobs_per_client = 1;
  auto pool = std::make_unique<pipeline::ThreadPool>(2);
  cuda::FakeDevice dev;
  cuda::FakeBackend backend(dev, "daemon");
  const PeerInfo me{::getpid(), ::getuid(), ::getgid()};
  using Step = JobRegistry::StartStep;
  struct Case {
    Step step;
    std::string output;
    bool share;
  };
  const std::vector<Case> cases = {
      {Step::kPlaced, "output: {device: cuda:0}\n", false},
      {Step::kAdmitted, "output: {device: cuda:0}\n", false},
      {Step::kJobStarted, "output: {device: cuda:0}\n", false},
      {Step::kGpuWrapped, "output: {device: cuda:0}\n", false},
      {Step::kAdmitted, "share: true\n", true},
      {Step::kJobStarted, "share: true\n", true},
  };
  {
    JobRegistry reg(cfg, pool.get(), 2);
    reg.SetDeviceBackends([&](int) -> Result<cuda::DeviceBackend*> { return &backend; });
    Step fail_at = Step::kPlaced;
    bool armed = false;
    std::vector<Step> seen;
    reg.SetStartFaultForTests([&](Step s) {
      seen.push_back(s);
      return armed && s == fail_at ? Internal("injected at step " + std::to_string(static_cast<int>(s)))
                                   : spdl::Status::Ok();
    });
    for (const Case& c : cases) {
      INFO("step " << static_cast<int>(c.step) << " " << c.output);
      fail_at = c.step;
      armed = true;
      seen.clear();
      SubmitResult r = reg.Submit(Job(dir.path + "/data", c.output), me, [] {});
      REQUIRE_FALSE(r.ok());
      CHECK(r.status.code() == StatusCode::kInternal);
      CHECK_THAT(r.status.message(), Catch::Contains("injected at step"));
      CHECK(seen.back() == c.step);
      CHECK(WaitFor([&] { return reg.live_jobs() == 0 && reg.device_bytes_in_use(0) == 0; }));
      CHECK(reg.bytes_in_use() == 0);
      CHECK(reg.leaked_device_bytes(0) == 0);
      CHECK(WaitFor([&] { return dev.live().empty(); }));

      // Nothing is left: the same job starts (max_jobs_per_client is 1), its own pipeline (no half-made
      // share group to join), and every step ran.
      armed = false;
      seen.clear();
      SubmitResult ok = reg.Submit(Job(dir.path + "/data", c.output), me, [] {});
      REQUIRE(ok.ok());
      CHECK(seen.size() == (c.share ? 3U : 4U));
      if (c.share) CHECK(ok.job->Stats().share_members() == 1);
      CHECK(reg.live_jobs() == 1);
      ok.job->Cancel();
      ok = SubmitResult{};
      CHECK(WaitFor([&] { return reg.live_jobs() == 0 && reg.device_bytes_in_use(0) == 0; }));
    }
    pool.reset();
  }
  CHECK(dev.violations().empty());
}
#endif

}  // namespace
}  // namespace spdl::jobs
