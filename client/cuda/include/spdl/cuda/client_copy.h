// ClientCopyPool: the `copy: client` fallback for GPU jobs — the client copies each batch from the
// shared host slot to its own device memory, in its own process (no CUDA IPC, so it works where IPC
// does not: another container's GPU namespace, MPS setups, a daemon without CUDA).
//
// Made once per job: page-locks the client's mapping of the shared region (cudaHostRegister on this
// process's mapping; the daemon's registration, if any, is its own), allocates one device slot per
// host slot, one non-blocking copy stream, and two events per slot (copied, consumer-done; not
// interprocess).
//
// Per batch (BatchReady for slot s, generation g):
//   Acquire(s, g)  enqueues on the copy stream: [wait for slot s's previous consumer-done event] +
//                  H2D copy of host slot s into device slot s + record "copied"; then makes the
//                  consumer stream wait on "copied". No host sync. Returns the device slot.
//   Release(s, g)  records slot s's consumer-done event on the consumer stream, then makes sure the
//                  copy has finished reading the host slot (an event query; it blocks only if the
//                  copy has not run yet) — after that the caller may send Release{s, g}, and the
//                  daemon may refill the host slot.
// The same reuse rule as on the daemon side: a device slot is overwritten only after the GPU ran the
// consumer's work recorded before its release.
//
// Teardown (Shutdown, or the destructor): waits for the copy stream and every consumer-done event,
// destroys the events and the stream, frees the device memory, unregisters the host mapping.
// REQUIRES: the region stays mapped until then. The waits are polled, bounded by teardown_timeout.
// When they fail (the trainer's work never completes, a sticky error), the device memory AND the host registration are
// leaked rather than freed or unregistered under queued work (cudaFree / cudaHostUnregister would block for ever), and
// Shutdown says so: the caller must then leak the region's mapping too (Loader::LeakRegion), since
// unmapping a range still registered with the driver is undefined.
//
// Thread safety: safe to share between threads (one mutex). Neither copyable nor movable.
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

namespace spdl::client {

struct ClientCopyOptions {
  // This process's mapping of the job's shared region (borrowed) and its layout (JobAccepted).
  void* region_base = nullptr;
  uint64_t region_bytes = 0;
  uint64_t slots_offset = 0;
  uint64_t slot_stride = 0;  // a multiple of 256
  uint32_t num_slots = 0;
  // Where the trainer uses the tensors (borrowed); Stream{} = the legacy default stream.
  cuda::Stream consumer_stream;
  // Page-lock the mapping. Without it copies are synchronous staging copies (slower).
  bool register_host = true;
  // Teardown's bound on waiting for the queued GPU work (polled): past it the memory is leaked.
  std::chrono::milliseconds teardown_timeout{10000};
};

class ClientCopyPool {
 public:
  // `backend` (borrowed: must outlive the pool) is bound to the trainer's device.
  static Result<std::unique_ptr<ClientCopyPool>> Create(cuda::DeviceBackend& backend, const ClientCopyOptions& options);
  ~ClientCopyPool();  // Shutdown, its result reported
  ClientCopyPool(const ClientCopyPool&) = delete;

  // The teardown above, now. Ok, or kUnavailable when the device memory and the host registration
  // were leaked (keep the region mapped for ever). Idempotent.
  Status Shutdown();
  ClientCopyPool& operator=(const ClientCopyPool&) = delete;

  // Enqueues the copy of host slot `slot` (its first `bytes` bytes; 0 = all) into its device slot
  // and makes `stream` (default: the consumer stream) wait for it; returns the device slot. The
  // slot is held under `generation` until Release. Out of range / too many bytes ->
  // kInvalidArgument; already held -> kFailedPrecondition; a backend failure -> its Status.
  Result<void*> Acquire(uint32_t slot, uint64_t generation, uint64_t bytes = 0,
                        std::optional<cuda::Stream> stream = std::nullopt);

  // Records consumer-done on `stream` (default: the Acquire stream) and waits until the copy has
  // finished reading the host slot. Not held or another generation -> kInvalidArgument.
  Status Release(uint32_t slot, uint64_t generation, std::optional<cuda::Stream> stream = std::nullopt);

  // Makes `stream` wait on the GPU for slot `slot`'s copy too (the slot must be held).
  Status WaitReady(uint32_t slot, cuda::Stream stream);
  // Changes the stream Release records consumer-done on by default (the slot must be held).
  Status SetReleaseStream(uint32_t slot, cuda::Stream stream);

  void* slot_data(uint32_t slot) const;
  uint64_t device_bytes() const { return device_.get().bytes; }
  int device() const { return backend_.device(); }
  bool held(uint32_t slot) const;
  // For tests.
  cuda::Stream copy_stream() const { return stream_.get(); }

 private:
  struct Slot {
    bool held = false;
    uint64_t generation = 0;
    cuda::Stream stream;
    std::vector<cuda::Stream> also;  // earlier release streams: joined into `stream` at release
    bool used = false;               // consumer-done was recorded at least once
  };

  ClientCopyPool(cuda::DeviceBackend& backend, const ClientCopyOptions& options);

  // Constant after Create; owned objects declared in the reverse of their teardown order.
  cuda::DeviceBackend& backend_;
  const ClientCopyOptions options_;
  cuda::HostRegistration host_registration_;
  cuda::DeviceBuffer device_;
  cuda::StreamHandle stream_;
  std::vector<cuda::EventHandle> copied_;         // per slot
  std::vector<cuda::EventHandle> consumer_done_;  // per slot

  mutable std::mutex mu_;
  std::vector<Slot> slots_;  // guarded by mu_
  bool shut_down_ = false;   // guarded by mu_
  bool leaked_ = false;      // guarded by mu_
};

}  // namespace spdl::client
