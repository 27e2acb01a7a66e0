// DeviceSlotView: the client's view of a GPU job's device slots, filled by the daemon (copy: daemon).
//
// Opened once per job from the daemon's CudaHandles (cuda/ipc_messages.h): it maps the daemon's
// device slots into this process (cudaIpcOpenMemHandle), opens the per-slot ready events
// (cudaIpcOpenEventHandle), and creates one interprocess consumer-done event per slot, whose handles
// the client sends back once (CudaConsumerEvents, before its first Release).
//
// Per batch (BatchReady for slot s, generation g):
//   Acquire(s, g)  the consumer stream waits on the GPU for slot s's ready event (the daemon's copy);
//                  no host sync. Returns the slot's device address: tensor t lies at
//                  address + TensorLayout.offset (see dlpack_tensor.h to hand it to a framework).
//   ... the trainer enqueues its work reading the slot on the consumer stream ...
//   Release(s, g)  records slot s's consumer-done event on the consumer stream (after that work);
//                  then the client sends Release{s, g}. The daemon copies into slot s again only once
//                  that event has completed (a host query of its own), so it never overwrites
//                  data a queued kernel still reads. Used on several streams (SetReleaseStream),
//                  their work is joined into the last one first.
// The consumer stream is the stream on which the trainer uses the tensors (e.g. PyTorch's current
// stream); work on other streams must be joined to it before Release (like torch's record_stream).
//
// Teardown, in two steps (GpuLoader does them around ending the job, see gpu_loader.h):
//   Detach()     records consumer-done for slots still held, waits on the host (polling, at most
//                detach_timeout) until every consumer-done event has completed (the trainer's
//                queued work on the slots is done), destroys the opened ready events and closes the
//                IPC mapping. When the wait times out (e.g. the daemon died with a copy queued: the
//                trainer's work waits behind its ready event, which then never completes) the
//                mapping and the ready events are leaked rather than closed under queued work, and
//                that is reported: the trainer's teardown never hangs. Do it BEFORE the
//                daemon may free the device memory (before EndJob / closing the connection).
//   destructor   Detach() if not done, then destroys the consumer-done events. Do it only after the
//                daemon stopped copying (EndJob answered, JobEnd, or the connection closed): the
//                daemon must not wait on a consumer-done event that no longer exists.
//
// Thread safety: safe to share between threads (one mutex): Batches may be released from any
// thread. Neither copyable nor movable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "cuda/device_backend.h"
#include "cuda/device_handles.h"
#include "cuda/ipc_messages.h"

namespace spdl::client {

class DeviceSlotView {
 public:
  // `backend` (borrowed: must outlive the view) must be bound to the daemon's device: its UUID must
  // be handles.device_uuid (else kFailedPrecondition). `consumer_stream` (borrowed) is where the
  // trainer uses the tensors; Stream{} is the legacy default stream.
  static Result<std::unique_ptr<DeviceSlotView>> Open(cuda::DeviceBackend& backend, const cuda::CudaJobHandles& handles,
                                                      cuda::Stream consumer_stream);
  ~DeviceSlotView();
  DeviceSlotView(const DeviceSlotView&) = delete;
  DeviceSlotView& operator=(const DeviceSlotView&) = delete;

  // Teardown step 1 (see above). Idempotent; afterwards Acquire fails and Release is a no-op check.
  void Detach();
  // Detach's bound on waiting for the trainer's queued work (default 10 s). Before Detach.
  void set_detach_timeout(std::chrono::milliseconds t) { detach_timeout_ = t; }

  // Per slot, this process's consumer-done events, to send once as CudaConsumerEvents.
  const std::vector<cuda::IpcEventHandle>& consumer_done_handles() const { return done_handles_; }

  // Makes `stream` (default: the consumer stream given to Open) wait on the GPU for slot `slot`'s
  // copy, and returns the slot's device address in this process. The slot is then held under
  // `generation` until Release. Out of range -> kInvalidArgument; already held ->
  // kFailedPrecondition; a backend failure -> its Status (the slot is not held).
  Result<void*> Acquire(uint32_t slot, uint64_t generation, std::optional<cuda::Stream> stream = std::nullopt);

  // Records the slot's consumer-done event on `stream` (default: the stream given to Acquire), after
  // the trainer's work on it; the caller then sends Release{slot, generation} to the daemon. Not
  // held, or held under another generation -> kInvalidArgument and nothing changes.
  Status Release(uint32_t slot, uint64_t generation, std::optional<cuda::Stream> stream = std::nullopt);

  // Makes `stream` wait on the GPU for slot `slot`'s copy too (a consumer that uses the batch on
  // another stream than it was acquired on, e.g. DLPack's __dlpack__(stream=...)). The slot must be
  // held. Out of range / not held -> kInvalidArgument.
  Status WaitReady(uint32_t slot, cuda::Stream stream);
  // Changes the stream Release records consumer-done on by default (the slot must be held).
  Status SetReleaseStream(uint32_t slot, cuda::Stream stream);

  // The device address of a slot in this process (whether held or not).
  void* slot_data(uint32_t slot) const;
  uint32_t num_slots() const { return static_cast<uint32_t>(slot_data_.size()); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  // The backend's CUDA ordinal (this process's numbering): DLDevice{kDLCUDA, device()}.
  int device() const { return backend_.device(); }
  // Whether `slot` is held (acquired, not yet released).
  bool held(uint32_t slot) const;

 private:
  struct Slot {
    bool held = false;
    uint64_t generation = 0;
    cuda::Stream stream;             // where it was acquired, or the last SetReleaseStream
    std::vector<cuda::Stream> also;  // earlier release streams: joined into `stream` at release
    bool done_recorded = false;      // the consumer-done event was ever recorded
  };

  DeviceSlotView(cuda::DeviceBackend& backend, cuda::Stream consumer_stream);

  // Constant after Open. Owned objects are declared in the reverse of their teardown order.
  cuda::DeviceBackend& backend_;
  const cuda::Stream consumer_stream_;
  uint64_t slot_bytes_ = 0;
  std::chrono::milliseconds detach_timeout_{10000};
  std::vector<cuda::EventHandle> done_events_;  // per slot, created here (interprocess)
  std::vector<cuda::IpcEventHandle> done_handles_;
  std::vector<cuda::IpcMemMapping> mappings_;    // one per daemon allocation
  std::vector<cuda::EventHandle> ready_events_;  // per slot, opened from the daemon
  std::vector<void*> slot_data_;                 // per slot

  mutable std::mutex mu_;
  std::vector<Slot> slots_;  // guarded by mu_
  bool detached_ = false;    // guarded by mu_
};

}  // namespace spdl::client
