#include "spdl/cuda/gpu_loader.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <utility>

#if SPDL_TEST_HOOKS
#include "cuda/shm_fake_backend.h"
#endif
#include "proto/control.pb.h"
#include "spdl/cuda/client_copy.h"
#include "spdl/cuda/device_slot_view.h"

namespace spdl::client {
namespace detail {

// The device side of one GPU job, shared by the GpuLoader and its batches (which may be released
// on any thread). The GpuLoader closes it in its teardown; afterwards releases only touch the host.
class GpuCore {
 public:
  // Declared first: destroyed last, after the view / pool that use it.
  std::unique_ptr<cuda::DeviceBackend> owned_backend;
  cuda::DeviceBackend* backend = nullptr;
  int ordinal = 0;
  // The job's connection, handed over by a GpuLoader destroyed while batches of it were alive
  // (e.g. Python tensors): the mapping, the device buffers and the connection then live until the
  // last batch goes, and this destructor finishes the teardown.
  std::unique_ptr<Loader> orphan_loader;
  bool job_ended = false;     // teardown step 2 done
  bool end_confirmed = true;  // ... and the daemon confirmed it

  ~GpuCore() {
    if (orphan_loader) {
      CloseMapping(*orphan_loader);
      Close(/*leak_events=*/!end_confirmed);
      if (leak_region) orphan_loader->LeakRegion();
      orphan_loader.reset();
      return;
    }
    Close(/*leak_events=*/false);
  }

  // Teardown step 1, then (copy: daemon) the daemon is told the mapping is closed: only now may it
  // free its device memory and destroy its ready events.
  void CloseMapping(Loader& loader) {
    Detach();
    if (!loader.client_copy()) (void)loader.SendCudaMappingClosed();  // a closed connection: so is the job
  }
  // Teardown step 2, once.
  void EndJob(Loader& loader, std::chrono::milliseconds timeout) {
    if (job_ended) return;
    job_ended = true;
    if (!loader.client_copy()) end_confirmed = loader.Finish(timeout).ok();
  }

  Result<void*> Acquire(uint32_t slot, uint64_t generation, cuda::Stream stream) {
    std::lock_guard lock(mu_);
    if (view_) return view_->Acquire(slot, generation, stream);
    if (pool_) return pool_->Acquire(slot, generation, 0, stream);
    return FailedPrecondition("the GPU loader is closed");
  }
  Status Release(uint32_t slot, uint64_t generation) {
    std::lock_guard lock(mu_);
    if (view_ && !detached_) return view_->Release(slot, generation);
    if (pool_) return pool_->Release(slot, generation);
    return Status::Ok();  // closed: teardown step 1 recorded consumer-done for it already
  }
  Status WaitOn(uint32_t slot, cuda::Stream stream) {
    std::lock_guard lock(mu_);
    if (view_ && !detached_) {
      SPDL_RETURN_IF_ERROR(view_->WaitReady(slot, stream));
      return view_->SetReleaseStream(slot, stream);
    }
    if (pool_) {
      SPDL_RETURN_IF_ERROR(pool_->WaitReady(slot, stream));
      return pool_->SetReleaseStream(slot, stream);
    }
    return FailedPrecondition("the GPU loader is closed: the batch's device memory is gone");
  }
  void SetView(std::unique_ptr<DeviceSlotView> v) { view_ = std::move(v); }
  void SetPool(std::unique_ptr<ClientCopyPool> p) { pool_ = std::move(p); }

  // Teardown step 1. A copy pool that had to leak its host registration (its GPU work never
  // completed) sets leak_region: the region's mapping must then stay for ever.
  void Detach() {
    std::lock_guard lock(mu_);
    if (view_) view_->Detach();
    detached_ = true;
    if (pool_ && !pool_->Shutdown().ok()) leak_region = true;
    pool_.reset();
  }
  bool leak_region = false;  // written by Detach, read by the teardown's thread after it
  // Teardown step 3: the rest of the view; with `leak_events`, its consumer-done events are kept
  // alive for ever (a daemon that did not confirm the end might still wait on them).
  void Close(bool leak_events) {
    std::lock_guard lock(mu_);
    if (view_ && leak_events) {
      backend->ReportTeardownError(
          Unavailable("spdld did not confirm the end of the GPU job: leaking this client's consumer-done events rather "
                      "than destroying them while the daemon may still wait on them"));
      view_->Detach();
      (void)view_.release();
    }
    view_.reset();
    pool_.reset();
    detached_ = true;
  }

 private:
  std::mutex mu_;
  // Guarded by mu_.
  std::unique_ptr<DeviceSlotView> view_;  // copy: daemon
  std::unique_ptr<ClientCopyPool> pool_;  // copy: client
  bool detached_ = false;
};

}  // namespace detail

namespace {

// "cuda:3" -> 3, "cuda" -> 0, else -1.
int CudaOrdinal(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0) return -1;
  try {
    return std::stoi(device.substr(5));
  } catch (...) {
    return -1;
  }
}

#if SPDL_TEST_HOOKS
// TEST ONLY (builds with SPDL_TEST_HOOKS, never shipped): the environment variable named by
// cuda::kFakeGpuDirEnv runs GPU jobs on the cross-process fake device in that directory (the
// header included above), as the daemon does with its hidden fake-GPU flag. It is not
// part of the public API (GpuOptions), so the shipped header's layout never depends on test hooks.
std::string FakeGpuDir(const GpuOptions&) {
  const char* env = std::getenv(cuda::kFakeGpuDirEnv);
  return env ? env : "";
}

Result<std::unique_ptr<cuda::DeviceBackend>> MakeFake(const std::string& dir, int ordinal) {
  std::fprintf(stderr, "spdl client: TEST ONLY: GPU batches go to a FAKE device in %s (%s), not a GPU\n", dir.c_str(),
               cuda::kFakeGpuDirEnv);
  SPDL_ASSIGN_OR_RETURN(auto b, cuda::ShmFakeBackend::Create(dir, ordinal));
  return std::unique_ptr<cuda::DeviceBackend>(std::move(b));
}
#else
// Built without SPDL_TEST_HOOKS (what ships): there is no fake device.
std::string FakeGpuDir(const GpuOptions&) { return ""; }
Result<std::unique_ptr<cuda::DeviceBackend>> MakeFake(const std::string&, int) {
  return Unavailable("this client was built without test hooks: no fake GPU");
}
#endif  // SPDL_TEST_HOOKS

}  // namespace

// ---- GpuBatch ----

GpuBatch::~GpuBatch() { Release(); }

GpuBatch::GpuBatch(GpuBatch&& o) noexcept
    : core_(std::move(o.core_)),
      host_(std::move(o.host_)),
      tensors_(std::move(o.tensors_)),
      device_(o.device_),
      released_(o.released_.exchange(true)) {}

GpuBatch& GpuBatch::operator=(GpuBatch&& o) noexcept {
  if (this != &o) {
    Release();
    core_ = std::move(o.core_);
    host_ = std::move(o.host_);
    tensors_ = std::move(o.tensors_);
    device_ = o.device_;
    released_.store(o.released_.exchange(true));
  }
  return *this;
}

const TensorView* GpuBatch::tensor(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Status GpuBatch::WaitOn(cuda::Stream stream) {
  if (released_.load() || !core_) return FailedPrecondition("WaitOn of a released GPU batch");
  return core_->WaitOn(host_.slot(), stream);
}

void GpuBatch::Release() {
  if (released_.exchange(true)) return;
  if (core_) {
    Status s = core_->Release(host_.slot(), host_.generation());
    // Nothing better to do than say so: keeping the slot would stall the job for ever.
    if (!s.ok()) core_->backend->ReportTeardownError(s.WithPrefix("releasing a GPU batch"));
  }
  host_.Release();
}

// ---- GpuLoader ----

GpuLoader::GpuLoader(std::unique_ptr<Loader> loader, std::shared_ptr<detail::GpuCore> core, const GpuOptions& gpu)
    : loader_(std::move(loader)),
      core_(std::move(core)),
      consumer_stream_(gpu.consumer_stream),
      finish_timeout_(gpu.finish_timeout),
      device_(core_->ordinal) {}

cuda::DeviceBackend& GpuLoader::backend() const { return *core_->backend; }

Result<std::unique_ptr<GpuLoader>> GpuLoader::Open(Options options, const GpuOptions& gpu) {
  options.accept_device_job = true;
  // The trainer's GPU, when known before the job (a given backend, or a given ordinal): its UUID
  // goes with the job, so a daemon whose cuda:N is another GPU refuses it at once.
  std::unique_ptr<cuda::DeviceBackend> early;
  if (gpu.backend == nullptr && gpu.device >= 0) {
    const std::string fake_dir = FakeGpuDir(gpu);
    if (!fake_dir.empty()) {
      SPDL_ASSIGN_OR_RETURN(early, MakeFake(fake_dir, gpu.device));
    } else if (gpu.open_backend) {
      SPDL_ASSIGN_OR_RETURN(early, gpu.open_backend(nullptr, gpu.device));
    }
  }
  if (cuda::DeviceBackend* b = gpu.backend ? gpu.backend : early.get()) {
    SPDL_ASSIGN_OR_RETURN(cuda::DeviceUuid uuid, b->Uuid());
    options.device_uuid.assign(uuid.begin(), uuid.end());
  }
  SPDL_ASSIGN_OR_RETURN(std::unique_ptr<Loader> loader, Loader::Open(options));
  return AttachWith(std::move(loader), gpu, std::move(early));
}

Result<cuda::DeviceUuid> GpuLoader::DeviceUuid(const GpuOptions& gpu, int ordinal) {
  if (gpu.backend != nullptr) return gpu.backend->Uuid();
  if (ordinal < 0) return InvalidArgument("a CUDA ordinal is >= 0, not " + std::to_string(ordinal));
  std::unique_ptr<cuda::DeviceBackend> b;
  const std::string fake_dir = FakeGpuDir(gpu);
  if (!fake_dir.empty()) {
    SPDL_ASSIGN_OR_RETURN(b, MakeFake(fake_dir, ordinal));
  } else if (gpu.open_backend) {
    SPDL_ASSIGN_OR_RETURN(b, gpu.open_backend(nullptr, ordinal));
  } else {
    return Unavailable("no CUDA device backend (built without CUDA, or no GpuOptions::open_backend given)");
  }
  return b->Uuid();
}

Result<std::unique_ptr<GpuLoader>> GpuLoader::Attach(std::unique_ptr<Loader> loader, const GpuOptions& gpu) {
  return AttachWith(std::move(loader), gpu, nullptr);
}

Result<std::unique_ptr<GpuLoader>> GpuLoader::AttachWith(std::unique_ptr<Loader> loader, const GpuOptions& gpu,
                                                         std::unique_ptr<cuda::DeviceBackend> early) {
  const std::string& device = loader->device();
  const int job_ordinal = CudaOrdinal(device);
  if (job_ordinal < 0) {
    return FailedPrecondition("the job's output.device is " + (device.empty() ? std::string("cpu") : device) +
                              ": a GpuLoader delivers only cuda jobs (use Loader for host memory)");
  }
  const bool client_copy = loader->client_copy();
  const JobInfo& info = loader->info();
  std::optional<cuda::CudaJobHandles> handles;
  if (!client_copy) {
    if (loader->cuda_handles() == nullptr) return Internal("a copy: daemon job without CudaHandles");
    SPDL_ASSIGN_OR_RETURN(auto h,
                          cuda::ParseCudaHandles(*loader->cuda_handles(), info.num_slots, loader->slot_stride()));
    handles = std::move(h);
  }

  auto core = std::make_shared<detail::GpuCore>();
  // The backend: the one given, the device FakeGpuDir names (always empty in a shipped build), or the factory.
  // cuda:N is the trainer's ordinal in both modes (the daemon found its own by the UUID sent).
  int ordinal = gpu.device >= 0 ? gpu.device : job_ordinal;
  const std::string fake_dir = FakeGpuDir(gpu);
  if (gpu.backend != nullptr) {
    core->backend = gpu.backend;
  } else if (early) {
    core->owned_backend = std::move(early);
  } else if (!fake_dir.empty()) {
    SPDL_ASSIGN_OR_RETURN(core->owned_backend, MakeFake(fake_dir, ordinal));
  } else if (gpu.open_backend) {
    SPDL_ASSIGN_OR_RETURN(core->owned_backend, gpu.open_backend(handles ? &*handles : nullptr, ordinal));
  } else {
    return Unavailable("the job's output.device is " + device +
                       " but this client has no CUDA device backend (built without CUDA, or no "
                       "GpuOptions::open_backend given)");
  }
  if (core->owned_backend) core->backend = core->owned_backend.get();
  core->ordinal = core->backend->device();
  const std::string where = "GPU delivery of " + device + " (copy: " + (client_copy ? "client" : "daemon") + ")";

  if (!client_copy) {
    auto view = DeviceSlotView::Open(*core->backend, *handles, gpu.consumer_stream);
    if (!view.ok()) {
      // Opening another process's IPC handles fails when the two processes do not share a PID
      // namespace and /dev/shm (containers), or the device cannot do IPC: say what to do instead.
      return Status(view.status().code(),
                    where + ": " + view.status().message() +
                        " (CUDA IPC needs the trainer and spdld in one PID namespace with a shared /dev/shm, "
                        "e.g. hostPID/hostIPC in Kubernetes; otherwise use output.copy: client)");
    }
    proto::CudaConsumerEvents events;
    cuda::BuildCudaConsumerEvents((*view)->consumer_done_handles(), &events);
    core->SetView(std::move(view).value());
    // The daemon frees its side when the connection closes; on failure here `core` (the view:
    // mapping first) goes before `loader` (the connection).
    SPDL_RETURN_IF_ERROR(loader->SendCudaConsumerEvents(events).WithPrefix(where));
  } else {
    ClientCopyOptions o;
    o.region_base = const_cast<void*>(loader->region_data());
    o.region_bytes = loader->region_size();
    o.slots_offset = loader->slots_offset();
    o.slot_stride = loader->slot_stride();
    o.num_slots = info.num_slots;
    o.consumer_stream = gpu.consumer_stream;
    auto pool = ClientCopyPool::Create(*core->backend, o);
    if (!pool.ok()) return pool.status().WithPrefix(where);
    core->SetPool(std::move(pool).value());
  }
  return std::unique_ptr<GpuLoader>(new GpuLoader(std::move(loader), std::move(core), gpu));
}

GpuLoader::~GpuLoader() {
  if (core_.use_count() > 1) {
    // Batches outlive the loader: the job ends now (no more batches), but the mapping, the device
    // buffers and the connection stay until the last batch goes (~GpuCore finishes the teardown).
    core_->EndJob(*loader_, finish_timeout_);  // 2
    core_->orphan_loader = std::move(loader_);
    core_.reset();  // the last owner, if every batch went meanwhile: the teardown runs here
    return;
  }
  core_->CloseMapping(*loader_);                        // 1
  core_->EndJob(*loader_, finish_timeout_);             // 2
  core_->Close(/*leak_events=*/!core_->end_confirmed);  // 3
  if (core_->leak_region) loader_->LeakRegion();        // still registered with the driver: keep it mapped
  loader_.reset();                                      // 4
}

Result<GpuEvent> GpuLoader::Next() {
  if (!sticky_.ok()) return sticky_;
  SPDL_ASSIGN_OR_RETURN(Event ev, loader_->Next());
  if (auto* e = std::get_if<EpochEnd>(&ev)) return GpuEvent(*e);
  if (auto* s = std::get_if<JobStats>(&ev)) return GpuEvent(std::move(*s));
  Batch& b = std::get<Batch>(ev);
  Result<void*> data = core_->Acquire(b.slot(), b.generation(), consumer_stream_);
  if (!data.ok()) {
    sticky_ = data.status().WithPrefix("GPU delivery of batch " + std::to_string(b.seq()));
    return sticky_;  // `b` is released unused
  }
  GpuBatch g;
  g.core_ = core_;
  g.device_ = core_->ordinal;
  g.tensors_ = b.tensors();
  for (size_t i = 0; i < g.tensors_.size(); ++i) {
    g.tensors_[i].data = static_cast<uint8_t*>(*data) + loader_->tensor_offset(i);
  }
  g.host_ = std::move(b);
  g.released_.store(false);
  return GpuEvent(std::move(g));
}

}  // namespace spdl::client
