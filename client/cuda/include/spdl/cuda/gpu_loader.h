// GpuLoader: one job whose output.device is cuda:N, with its batches on the trainer's GPU.
//
// A layer above the host-memory Loader (spdl/client.h), which knows nothing of CUDA: the Loader
// submits the job (Options::accept_device_job), reads the CudaHandles the daemon sends once, and
// hands out host Batches; this layer opens the device side and turns each Batch into a GpuBatch.
//
//   copy: daemon   the daemon copies each batch to its own device slots; this layer opens their
//                  CUDA IPC handles once (DeviceSlotView), answers with its consumer-done events
//                  (CudaConsumerEvents), and per batch makes the consumer stream wait on the slot's
//                  ready event (cudaStreamWaitEvent: no host sync).
//   copy: client   this layer page-locks its own mapping of the shared slots and copies each batch
//                  to device slots of its own (ClientCopyPool), on its own stream; the consumer
//                  stream waits on the copy's event.
// Either way a GpuBatch's tensors are device addresses (DLPack kDLCUDA: dlpack_tensor.h).
//
// Release (GpuBatch::Release or its destructor, any thread): first the slot's consumer-done event
// is recorded on the release stream (default: the consumer stream), after the trainer's queued work
// on the batch; then the host slot is released to the daemon. The daemon copies into that device
// slot again only once the event has completed (its host query), so it never overwrites data a
// queued kernel still reads (copy: client: the client's own next copy waits on the GPU, and the
// release waits until the copy has finished reading the host slot before the daemon may refill it).
// WaitOn(stream) makes another stream wait for the data and moves the release there; the work of
// every stream the batch was given to is joined into the release stream before consumer-done is
// recorded. Work on streams the batch was never given to must be joined by the trainer (like
// torch's record_stream).
//
// Teardown (destructor), in order:
//   1. copy: daemon: DeviceSlotView::Detach: consumer-done recorded for batches still held, the host
//      waits until every consumer-done event completed (the trainer's queued work is done), the
//      daemon's ready events are destroyed and the IPC mapping closed; then CudaMappingClosed tells
//      the daemon, which keeps its device memory and ready events until then (or until the
//      connection closes). copy: client: the ClientCopyPool is destroyed (waits likewise, frees its
//      device slots, unregisters the host mapping).
//   2. copy: daemon: Loader::Finish: EndJob, then wait (GpuOptions::finish_timeout) until the daemon
//      confirms: it makes no more copies and no more waits on this client's events.
//   3. the consumer-done events are destroyed (if step 2 timed out they are leaked instead, and
//      that is reported: a hung daemon might still wait on them).
//   4. the Loader is destroyed: the connection closes.
//   5. the backend, if this layer made it, goes with the last GpuBatch.
// GpuBatches that outlive their GpuLoader (Python tensors kept after loader.close()) share the
// device side: the destructor then does step 2 at once (the job ends: no more batches) and leaves
// steps 1, 3, 4 (mapping, buffers, events, connection) to the last of those batches, so their
// device memory stays valid as long as they live. Destructors never throw.
//
// Thread safety: as Loader: Next/End from one thread at a time; GpuBatches may be released or
// destroyed from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/status.h"
#include "cuda/device_backend.h"
#include "cuda/ipc_messages.h"
#include "spdl/client.h"

namespace spdl::client {

namespace detail {
class GpuCore;  // the device side, shared by a GpuLoader and its GpuBatches
}

// Makes the backend the layer runs on: `handles` are the daemon's (copy: daemon; find its GPU by
// UUID) or null (copy: client: use `ordinal`). cuda_device.h's CudaBackendFactory() makes CUDA ones.
using BackendFactory =
    std::function<Result<std::unique_ptr<cuda::DeviceBackend>>(const cuda::CudaJobHandles* handles, int ordinal)>;

struct GpuOptions {
  // The trainer's CUDA ordinal in this process. -1 (default): the N of the job's cuda:N, which is
  // the trainer's ordinal in both copy modes (the daemon finds its own by the UUID sent with the job).
  int device = -1;
  // The stream the trainer uses the tensors on (borrowed; e.g. PyTorch's current stream).
  // Stream{} is the legacy default stream.
  cuda::Stream consumer_stream;
  // The backend to use (borrowed: must outlive the loader and every batch), e.g. a FakeBackend in
  // unit tests. Its UUID goes with the job (SubmitJob.device_uuid), as does the UUID of `device`
  // when an ordinal is given: a daemon whose cuda:N is another GPU then refuses the job.
  cuda::DeviceBackend* backend = nullptr;
  // Otherwise a factory (CudaBackendFactory() with CUDA).
  BackendFactory open_backend;
  // Teardown step 2's bound.
  std::chrono::milliseconds finish_timeout{10000};
};

// One batch on the GPU: a lease on one device slot (and its host slot). Move-only; released exactly
// once (Release() or the destructor).
class GpuBatch {
 public:
  GpuBatch() = default;
  ~GpuBatch();
  GpuBatch(GpuBatch&& other) noexcept;
  GpuBatch& operator=(GpuBatch&& other) noexcept;
  GpuBatch(const GpuBatch&) = delete;
  GpuBatch& operator=(const GpuBatch&) = delete;

  // The host batch: seq, epoch, rows, slot, generation, paths, labels, resume token. Its tensors()
  // point at the shared host slot (read-only; valid while this object is not released).
  const Batch& host() const { return host_; }
  // The batch's tensors on the device: `data` is a device address in this process.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* tensor(std::string_view name) const;
  // This process's CUDA ordinal of the tensors: DLDevice{kDLCUDA, device()}.
  int device() const { return device_; }

  // Makes `stream` wait (on the GPU) for the batch's data, and records consumer-done on it at
  // release (for a trainer that uses the batch on a stream other than the consumer stream).
  // Released -> kFailedPrecondition.
  Status WaitOn(cuda::Stream stream);

  // Records the consumer-done event, then gives the slot back to the daemon. Idempotent.
  void Release();
  bool released() const { return released_.load(); }

 private:
  friend class GpuLoader;

  std::shared_ptr<detail::GpuCore> core_;
  Batch host_;
  std::vector<TensorView> tensors_;
  int device_ = 0;
  std::atomic<bool> released_{true};
};

using GpuEvent = std::variant<GpuBatch, EpochEnd, JobStats>;

class GpuLoader {
 public:
  // Opens the job (Loader::Open with accept_device_job, and the trainer GPU's UUID when known) and
  // then Attach. Errors: Loader::Open's (a GPU the daemon does not see: kResourceExhausted, naming its UUID);
  // a cpu job -> kFailedPrecondition; the device side's (no backend, no such GPU, bad handles).
  static Result<std::unique_ptr<GpuLoader>> Open(Options options, const GpuOptions& gpu);
  // The UUID of this process's CUDA device `ordinal` as GpuOptions `gpu` would open it (its backend,
  // the factory), for SubmitJob.device_uuid (Options::device_uuid) before Attach.
  static Result<cuda::DeviceUuid> DeviceUuid(const GpuOptions& gpu, int ordinal);
  // Takes over a Loader just opened with accept_device_job whose job is a cuda job (no Next yet).
  static Result<std::unique_ptr<GpuLoader>> Attach(std::unique_ptr<Loader> loader, const GpuOptions& gpu);

  ~GpuLoader();  // the teardown above
  GpuLoader(const GpuLoader&) = delete;
  GpuLoader& operator=(const GpuLoader&) = delete;

  // Blocks until the next event, as Loader::Next; a Batch comes as a GpuBatch whose data the
  // consumer stream already waits for. A device error -> its Status (sticky, as Loader's).
  Result<GpuEvent> Next();
  // As Loader::End.
  Status End() { return loader_->End(); }

  Loader& loader() { return *loader_; }
  const JobInfo& info() const { return loader_->info(); }
  bool client_copy() const { return loader_->client_copy(); }
  // This process's CUDA ordinal of the batches.
  int device() const { return device_; }
  cuda::DeviceBackend& backend() const;
  cuda::Stream consumer_stream() const { return consumer_stream_; }

 private:
  GpuLoader(std::unique_ptr<Loader> loader, std::shared_ptr<detail::GpuCore> core, const GpuOptions& gpu);
  // Attach, with the backend Open made before the job (to send its UUID), if any.
  static Result<std::unique_ptr<GpuLoader>> AttachWith(std::unique_ptr<Loader> loader, const GpuOptions& gpu,
                                                       std::unique_ptr<cuda::DeviceBackend> early);

  std::unique_ptr<Loader> loader_;
  std::shared_ptr<detail::GpuCore> core_;
  const cuda::Stream consumer_stream_;
  const std::chrono::milliseconds finish_timeout_;
  int device_ = 0;
  Status sticky_;
};

}  // namespace spdl::client
