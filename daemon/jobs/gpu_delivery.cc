#include "jobs/gpu_delivery.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/device_slot_pool.h"
#include "cuda/ipc_messages.h"

namespace spdl::jobs {
namespace {

class GpuJob final : public JobHandle {
 public:
  GpuJob(std::shared_ptr<JobHandle> inner, GpuDeliveryOptions options)
      : inner_(std::move(inner)), options_(std::move(options)), accepted_(inner_->accepted()) {
    accepted_.set_device(options_.output.device);
    accepted_.set_client_copy(options_.output.copy == config::OutputConfig::Copy::kClient);
  }

  ~GpuJob() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (waiter_.joinable()) waiter_.join();
    if (pool_) pool_->Stop();
    // Every free and unregister (which wait for the GPU: cudaFree synchronizes) runs on the
    // teardown thread, never here (the control thread). The work owns the only reference to the
    // pool, so its destructor cannot run here by accident.
    auto work = [pool = std::shared_ptr<cuda::DeviceSlotPool>(std::move(pool_)), mapped = mapped_,
                 bytes = mapped_bytes_, on_close = options_.on_close, decode = options_.gpu_decode]() mutable {
      // The GPU decode first: it waits for a running batch and frees its own device memory, before
      // the slots it writes go.
      if (decode) decode->Detach();
      uint64_t leaked = 0;
      if (pool) {
        (void)pool->Shutdown();  // reported through the backend when it leaks
        leaked = pool->leaked_bytes();
        pool.reset();
      }
      // Leaked: a copy may still read the host pages (registered for ever): keep them mapped.
      if (mapped && leaked == 0) munmap(mapped, bytes);
      if (on_close) on_close(leaked);
    };
    if (options_.teardown && (work_has_pool_ || mapped_)) {
      options_.teardown->Post(std::move(work));
    } else {
      work();
    }
    inner_.reset();
  }

  Status Init(cuda::DeviceBackend* backend) {
    if (accepted_.client_copy()) return Status::Ok();
    if (!backend) return FailedPrecondition("no CUDA device backend for " + options_.output.device);
    backend_ = backend;
    void* base = options_.host_base;
    if (!base) {
      base = mmap(nullptr, accepted_.region_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, inner_->region_fd(), 0);
      if (base == MAP_FAILED) return Internal("mapping the job's shared region for the GPU copies failed");
      mapped_ = base;
      mapped_bytes_ = accepted_.region_bytes();
    }
    cuda::DeviceSlotPoolOptions po;
    po.host_base = base;
    po.host_bytes = accepted_.region_bytes();
    po.slots_offset = accepted_.slots_offset();
    po.slot_stride = accepted_.slot_stride();
    po.num_slots = accepted_.num_slots();
    po.register_host = options_.register_host;
    po.drain_timeout = options_.drain_timeout;
    if (options_.gpu_decode) {
      // The image tensor (the first) is decoded on the device: the copies skip it.
      if (accepted_.tensors_size() < 2 || accepted_.tensors(0).offset() != 0) {
        return Internal("GPU decode: the job's slot layout does not start with its image tensor");
      }
      po.copy_offset = accepted_.tensors(1).offset();
    }
    auto pool = cuda::DeviceSlotPool::Create(*backend, po);
    if (!pool.ok()) return pool.status();
    pool_ = std::move(pool).value();
    work_has_pool_ = true;
    if (options_.gpu_decode) {
      GpuBatchDecode::Target t;
      t.device = backend->device();
      t.backend = backend;
      cuda::DeviceSlotPool* pool_ptr = pool_.get();  // Detach runs before the pool goes
      t.images = [pool_ptr](uint32_t slot) { return pool_ptr->device_slot(slot); };
      t.stream = pool_->copy_stream();
      t.slot_free = [pool_ptr](uint32_t slot) { return pool_ptr->ConsumerDone(slot); };
      t.consumer_timeout = options_.consumer_timeout;
      SPDL_RETURN_IF_ERROR(options_.gpu_decode->Attach(std::move(t)).WithPrefix("decode.device: cuda"));
    }
    cuda::BuildCudaHandles(pool_->handles(), &handles_);
    waiter_ = std::thread([this] { WaitLoopCaught(); });
    return Status::Ok();
  }

  const proto::JobAccepted& accepted() const override { return accepted_; }
  int region_fd() const override { return inner_->region_fd(); }
  const proto::CudaHandles* cuda_handles() const override { return pool_ ? &handles_ : nullptr; }

  Status ImportConsumerEvents(const proto::CudaConsumerEvents& events) override {
    if (!pool_) return JobHandle::ImportConsumerEvents(events);
    SPDL_ASSIGN_OR_RETURN(auto done, cuda::ParseCudaConsumerEvents(events, pool_->num_slots()));
    Status s = pool_->ImportConsumerEvents(done);
    if (!s.ok() && backend_ != nullptr && !backend_->sticky_error().ok()) {
      // Not the client's handles: the device is poisoned (every CUDA call fails). The job fails with
      // the device's error; the session goes on (a bad message would close it).
      inner_->Abort(Status(s.code(), "GPU delivery to " + options_.output.device + ": " + s.message()));
      return Status::Ok();
    }
    return s;
  }

  std::optional<Delivery> TakeNext() override {
    ForwardReleases();
    if (!pool_) return inner_->TakeNext();
    std::optional<Delivery> d;
    {
      std::lock_guard lock(mu_);
      d.swap(held_);
    }
    if (!d) d = inner_->TakeNext();
    if (!d) return d;
    const uint32_t slot = d->batch.slot();
    // The reuse rule without a GPU wait on the client's event: the copy goes in only once the
    // client's consumer-done event has completed (a host query); until then the batch is held and
    // the waiter thread polls, with a deadline that fails this job only.
    Result<bool> free = pool_->ConsumerDone(slot);
    if (free.ok() && !*free) {
      std::lock_guard lock(mu_);
      if (held_since_ == std::chrono::steady_clock::time_point{}) held_since_ = std::chrono::steady_clock::now();
      held_ = std::move(d);
      held_signalled_ = false;
      cv_.notify_all();
      return std::nullopt;
    }
    {
      std::lock_guard lock(mu_);
      held_since_ = {};
    }
    Status s = free.ok() ? pool_->Submit(slot) : free.status();
    if (s.ok()) s = pool_->Lease(slot, d->batch.generation());
    if (!s.ok()) {
      inner_->Abort(Status(s.code(), "GPU delivery to " + options_.output.device + ": " + s.message()));
      return std::nullopt;
    }
    return d;
  }

  Status Release(uint32_t slot, uint64_t generation) override {
    if (!pool_) return inner_->Release(slot, generation);
    SPDL_RETURN_IF_ERROR(pool_->Release(slot, generation));  // a stale or unknown slot: the client's mistake
    ForwardReleases();
    auto reusable = pool_->HostSlotReusable(slot);
    if (!reusable.ok()) {
      // The device failed (after a sticky error every CUDA call does), not the client: the job
      // fails with the device's error, and the session goes on (a protocol error would close it).
      inner_->Abort(Status(reusable.status().code(),
                           "GPU delivery to " + options_.output.device + ": " + reusable.status().message()));
      return Status::Ok();
    }
    if (*reusable) return inner_->Release(slot, generation);
    {
      std::lock_guard lock(mu_);
      waiting_.emplace_back(slot, generation);
    }
    cv_.notify_all();
    return Status::Ok();
  }

  Status failure() const override {
    if (Status f = inner_->failure(); !f.ok()) return f;
    std::lock_guard lock(mu_);
    return failure_;
  }

  void Cancel() override {
    if (pool_) {
      pool_->Stop();
      pool_->ReleaseAll();
    }
    inner_->Cancel();
  }
  void Abort(Status reason) override { inner_->Abort(std::move(reason)); }
  proto::JobStats Stats() const override { return inner_->Stats(); }

 private:
  // Control thread: hands the ring the releases whose copies have finished.
  void ForwardReleases() {
    std::vector<std::pair<uint32_t, uint64_t>> ready;
    {
      std::lock_guard lock(mu_);
      ready.swap(reusable_);
    }
    for (auto [slot, generation] : ready) {
      if (Status s = inner_->Release(slot, generation); !s.ok()) {
        std::lock_guard lock(mu_);
        if (failure_.ok()) failure_ = s;
      }
    }
  }

  // The waiter thread: polls (QueryEvent, never blocking the GPU or holding the pool) until the
  // deferred slots' copies have run, so a stuck copy never keeps the destructor from joining.
  // WaitLoop, with an exception (it must not throw) failing this job's delivery, not the daemon.
  void WaitLoopCaught() {
    std::string what;
    try {
      WaitLoop();
      return;
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "an exception of unknown type";
    }
    spdlog::error("GPU delivery to {}: the slot waiter threw ({}); the job fails", options_.output.device, what);
    {
      std::lock_guard lock(mu_);
      if (failure_.ok()) failure_ = Internal("GPU delivery to " + options_.output.device + ": " + what);
    }
    if (options_.notify) options_.notify();
  }

  // Two duties, both host polls (never a GPU wait): forward the deferred ring releases whose copy
  // has finished reading the host slot, and watch the held batch's consumer-done event (deadline:
  // consumer_timeout from when the batch was first held; past it only this job fails).
  void WaitLoop() {
    std::unique_lock lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || !waiting_.empty() || (held_ && !held_signalled_); });
      if (stop_) return;
      bool signal = false;
      if (!waiting_.empty()) {
        auto [slot, generation] = waiting_.front();
        Result<bool> r = pool_->HostSlotReusable(slot);
        if (!r.ok() || *r) {
          waiting_.pop_front();
          if (r.ok()) {
            reusable_.emplace_back(slot, generation);
          } else if (failure_.ok()) {
            failure_ =
                Status(r.status().code(), "GPU delivery to " + options_.output.device + ": " + r.status().message());
          }
          signal = true;
        }
      }
      if (held_ && !held_signalled_) {
        const uint32_t slot = held_->batch.slot();
        Result<bool> r = pool_->ConsumerDone(slot);
        if (!r.ok() || *r) {
          held_signalled_ = true;
          if (!r.ok() && failure_.ok()) {
            failure_ =
                Status(r.status().code(), "GPU delivery to " + options_.output.device + ": " + r.status().message());
          }
          signal = true;
        } else if (std::chrono::steady_clock::now() - held_since_ > options_.consumer_timeout) {
          held_signalled_ = true;
          if (failure_.ok()) {
            failure_ = Unavailable(
                "GPU delivery to " + options_.output.device + ": the trainer's GPU work on device slot " +
                std::to_string(slot) + " did not finish within " + std::to_string(options_.consumer_timeout.count()) +
                " ms of its release (its consumer-done event never completed: is the trainer stalled or dead?)");
          }
          signal = true;
        }
      }
      if (signal) {
        if (options_.notify) {
          lock.unlock();
          options_.notify();
          lock.lock();
        }
        continue;
      }
      if (cv_.wait_for(lock, std::chrono::milliseconds(1), [this] { return stop_; })) return;
    }
  }

  std::shared_ptr<JobHandle> inner_;
  const GpuDeliveryOptions options_;
  proto::JobAccepted accepted_;
  void* mapped_ = nullptr;
  size_t mapped_bytes_ = 0;
  std::unique_ptr<cuda::DeviceSlotPool> pool_;  // null for copy: client
  cuda::DeviceBackend* backend_ = nullptr;      // the device's backend (copy: daemon), outlives the job
  bool work_has_pool_ = false;                  // Init made a pool (teardown goes to the queue)
  proto::CudaHandles handles_;
  std::thread waiter_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  std::deque<std::pair<uint32_t, uint64_t>> waiting_;    // released, copy maybe still reading
  std::vector<std::pair<uint32_t, uint64_t>> reusable_;  // copy done, ring release pending
  Status failure_;
  bool stop_ = false;
  std::optional<Delivery> held_;  // taken from the job; its device slot's consumer is not done yet
  bool held_signalled_ = false;   // the waiter saw held_'s consumer done (or its deadline pass)
  std::chrono::steady_clock::time_point held_since_{};  // when the batch in held_ was first held
};

}  // namespace

GpuTeardownQueue::~GpuTeardownQueue() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GpuTeardownQueue::Post(std::function<void()> work) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(work));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_all();
}

size_t GpuTeardownQueue::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + running_;
}

void GpuTeardownQueue::Loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and nothing left to run
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    try {  // teardown work must not throw; if it does, the next job's teardown still runs
      work();
    } catch (const std::exception& e) {
      spdlog::error("GPU teardown: a step threw ({}); going on with the next", e.what());
    } catch (...) {
      spdlog::error("GPU teardown: a step threw an exception of unknown type; going on with the next");
    }
    work = nullptr;
    lock.lock();
    --running_;
  }
}

uint64_t GpuDeviceBytes(const proto::JobAccepted& accepted) {
  return cuda::DeviceSlotPool::DeviceBytes(accepted.slot_stride(), accepted.num_slots());
}

Result<std::shared_ptr<JobHandle>> WrapGpuJob(std::shared_ptr<JobHandle> job, cuda::DeviceBackend* backend,
                                              GpuDeliveryOptions options) {
  std::shared_ptr<JobHandle> inner = job;
  auto wrapped = std::make_shared<GpuJob>(std::move(job), std::move(options));
  if (Status s = wrapped->Init(backend); !s.ok()) {
    inner->Cancel();
    return Status(s.code(), "setting up GPU delivery: " + s.message());
  }
  return std::shared_ptr<JobHandle>(std::move(wrapped));
}

}  // namespace spdl::jobs
