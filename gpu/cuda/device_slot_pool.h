// DeviceSlotPool: the GPU side of one job's slot ring (daemon side), for a job whose output.device
// is cuda:N and whose copies the daemon makes (copy: daemon).
//
// Made once per job, it page-locks the job's shared host region, allocates one device slot per host
// slot (a single allocation of num_slots * slot_stride bytes, so the client opens one IPC memory
// handle; counted against the device's budget: DeviceBytes()), one non-blocking copy stream, and one
// interprocess "ready" event per slot. It exports their IPC handles once (handles()); the client
// answers with one interprocess "consumer done" event per slot (ImportConsumerEvents).
//
// Device slot states, next to the host ring's (shm/slot_ring.h), same slot index:
//
//   free     -> copying   Submit: H2D copy of the host slot + record the slot's ready event, both
//   released -> copying            enqueued on the copy stream; nothing blocks. The host slot must be
//                                  ready (filled); a released slot only once ConsumerDone says so.
//   copying  -> ready     HostSlotReusable / WaitHostSlotReusable / Poll saw the ready event done:
//                         the copy has finished reading the host slot.
//   copying  -> leased    Lease(slot, generation): the client is told (BatchReady). It need not
//   ready    -> leased    wait for the copy on the host: its stream waits on the ready event.
//   leased   -> released  Release(slot, generation): the client has recorded its consumer-done
//                         event after its last use of the slot. The generation is the host ring's
//                         lease generation; a stale or duplicate one is refused and changes nothing.
//   released -> free      ConsumerDone / Poll saw the consumer-done event complete (a host query).
//
// THE REUSE RULE: the daemon copies into a device slot again only after the client released it
// AND the consumer-done event the client recorded at release has completed, as seen by a host query
// (cudaEventQuery) — so no copy overwrites a slot that a kernel of the client may still read. The
// daemon's copy stream NEVER waits on the client's event (no cudaStreamWaitEvent on a foreign
// event): a dead or stalled trainer would block that stream forever, the next cudaFree on the GPU
// (which waits for every stream) would hang the daemon, and every job of the node with it. The
// caller polls ConsumerDone (GpuDelivery: its waiter thread, with a deadline that fails only that
// job). The host slot, in turn,
// may be refilled by the pipeline only once the slot's copy has finished reading it
// (WaitHostSlotReusable, called from a pipeline thread before refilling; it returns at once in the
// normal case, where the client's release came long after the copy ran).
//
// Ordering the client relies on: the daemon records a slot's ready event before it sends BatchReady
// for it, and records it again only after the client's Release; the client waits on the ready event
// before it sends Release. So every wait sees the record meant for its batch.
//
// Teardown (Shutdown, or the destructor): no more Submits; wait (bounded by drain_timeout) until
// every copy has run (they wait on nothing foreign, so only a hung GPU keeps them);
// destroy the consumer-done events (opened), then the ready events, then the stream; free the
// device memory; unregister the host region. If the copies do not drain in time (a client event
// that never completes), the device memory and the host registration are leaked on purpose and the
// leak is reported: freeing them under a queued copy would corrupt memory. REQUIRES for a clean
// teardown: the client has closed its IPC mapping (it closes it before closing its connection, and a
// dead client's mappings die with it) and the daemon issues no more waits on its events (Stop()).
//
// Thread safety: safe to share between threads (one mutex; the backend calls made under it only
// enqueue work). WaitHostSlotReusable blocks without holding the mutex. Neither copyable nor movable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "cuda/device_backend.h"
#include "cuda/device_handles.h"
#include "cuda/ipc_messages.h"

namespace spdl::cuda {

enum class DeviceSlotState { kFree, kCopying, kReady, kLeased, kReleased };
// "free", "copying", "ready", "leased", "released".
const char* DeviceSlotStateName(DeviceSlotState state);

struct DeviceSlotPoolOptions {
  // The job's shared host region (borrowed: must stay mapped while the pool lives) and its layout
  // (proto/shm_layout.h: SlotLayout).
  void* host_base = nullptr;
  uint64_t host_bytes = 0;    // the whole region; registered as one range
  uint64_t slots_offset = 0;  // of slot 0 in the region
  uint64_t slot_stride = 0;   // bytes per slot; a multiple of 256 (the layout makes it of 4096)
  uint32_t num_slots = 0;
  // Bytes at the start of every slot that Submit never copies: the job writes them on the device
  // itself (decode.device: cuda decodes the image tensor straight into the device slot). 0: all.
  // A multiple of 256, below slot_stride.
  uint64_t copy_offset = 0;
  // Page-lock the host region (cudaHostRegister). Turn off only when it is registered already.
  bool register_host = true;
  // How long teardown waits for queued copies before it leaks the device memory instead of
  // freeing it under them.
  std::chrono::milliseconds drain_timeout{10000};
};

class DeviceSlotPool {
 public:
  // Device bytes a job with this layout takes (for admission against the device's budget, before
  // Create): num_slots * slot_stride rounded up to 256.
  static uint64_t DeviceBytes(uint64_t slot_stride, uint32_t num_slots);

  // Registers the host region, allocates the device slots, the stream and the ready events, and
  // exports their IPC handles. Any failure undoes what was done and returns the backend's Status
  // (kResourceExhausted for out of device memory), prefixed with what was being done.
  // `backend` is borrowed: it must outlive the pool.
  static Result<std::unique_ptr<DeviceSlotPool>> Create(DeviceBackend& backend, const DeviceSlotPoolOptions& options);
  ~DeviceSlotPool();
  DeviceSlotPool(const DeviceSlotPool&) = delete;
  DeviceSlotPool& operator=(const DeviceSlotPool&) = delete;

  // What to send to the client (as CudaHandles, ipc_messages.h), exported once at Create.
  const CudaJobHandles& handles() const { return handles_; }

  // Opens the client's per-slot consumer-done events (from its CudaConsumerEvents). Once per job,
  // before any slot can be reused; a second call -> kFailedPrecondition. A wrong count ->
  // kInvalidArgument. On failure nothing is kept (it may be retried with other handles).
  Status ImportConsumerEvents(const std::vector<IpcEventHandle>& done_events);

  // free|released -> copying: enqueues the copy of bytes [copy_offset, bytes) of host slot `slot`
  // (bytes 0 = the whole slot) into its device slot, after the consumer-done wait for a released slot,
  // and records the slot's ready event. REQUIRES: the host slot is filled (ready in the ring).
  // Errors: out of range / too many bytes -> kInvalidArgument; wrong state, Stop() called, or a
  // released slot whose consumer-done event has not completed (ConsumerDone) -> kFailedPrecondition; a backend failure
  // -> its Status (the slot keeps its state; the job should fail).
  Status Submit(uint32_t slot, uint64_t bytes = 0);

  // copying|ready -> leased under the host ring's lease generation (which must be new: greater
  // than every generation leased before). Errors as Release.
  Status Lease(uint32_t slot, uint64_t generation);

  // leased -> released. Out of range, not leased, or another generation -> kInvalidArgument saying
  // which, and nothing changes.
  Status Release(uint32_t slot, uint64_t generation);

  // Every leased slot -> released (the client is gone); returns how many.
  uint32_t ReleaseAll();

  // Whether a copy may go into `slot` now: true for a free slot, and for a released one whose
  // consumer-done event has completed (host query, never blocks; the slot becomes free). False
  // while the client's work on it may still run. A released slot before ImportConsumerEvents ->
  // kFailedPrecondition.
  Result<bool> ConsumerDone(uint32_t slot);

  // Whether host slot `slot` may be refilled: its last copy has finished reading it. Never blocks.
  Result<bool> HostSlotReusable(uint32_t slot);
  // Blocks until HostSlotReusable(slot) would say true. For pipeline threads, never the control
  // thread. Returns at once when the copy is known to be done.
  Status WaitHostSlotReusable(uint32_t slot);

  // Moves copying -> ready and released -> free for the slots whose events are done. Never blocks.
  // Optional housekeeping (stats); the state machine is correct without it.
  Status Poll();

  // No Submit is accepted from now on (the client ended the job or went away), and the client's
  // consumer-done events are closed here (so the client may destroy them once the end of the job
  // is confirmed). Idempotent.
  void Stop();

  // The teardown, now (may block up to drain_timeout: call it off the control thread): Stop, wait
  // for the queued copies, destroy the events and the stream, free the device memory, unregister
  // the host region. When the copies do not drain, the device memory and the host registration
  // are leaked (freeing under a copy would corrupt memory) and kInternal says so; then
  // leaked_bytes() is the device memory lost, and the host region must stay mapped for ever.
  // Idempotent (the destructor calls it).
  Status Shutdown();
  uint64_t leaked_bytes() const { return leaked_bytes_; }

  struct Counts {
    uint32_t free = 0, copying = 0, ready = 0, leased = 0, released = 0;
  };
  Counts counts() const;
  // REQUIRES: slot < num_slots().
  DeviceSlotState state(uint32_t slot) const;

  uint32_t num_slots() const { return options_.num_slots; }
  uint64_t device_bytes() const { return device_.get().bytes; }
  int device() const { return backend_.device(); }
  // The daemon-side device address of a slot (tests; never sent: the client gets IPC handles).
  void* device_slot(uint32_t slot) const;
  // For tests: the copy stream, a slot's ready and consumer-done events (null before import).
  Stream copy_stream() const { return stream_.get(); }
  Event ready_event(uint32_t slot) const { return ready_events_[slot].get(); }
  Event consumer_event(uint32_t slot) const;

 private:
  struct Slot {
    DeviceSlotState state = DeviceSlotState::kFree;
    uint64_t generation = 0;    // meaningful while leased
    bool copy_pending = false;  // a copy was enqueued and not yet seen done
    uint64_t copies = 0;        // copies enqueued so far (to match a fence to its copy)
  };

  DeviceSlotPool(DeviceBackend& backend, const DeviceSlotPoolOptions& options);
  Status CheckRange(uint32_t slot, const char* op) const;
  // REQUIRES: mu_ held. ConsumerDone.
  Result<bool> ConsumerDoneLocked(uint32_t slot);
  // Waits (polling, up to drain_timeout) until no copy is pending. False on timeout, or at once when
  // a query fails (*query gets its Status; it stays OK on a timeout).
  bool Drain(Status* query);

  // Constant after construction.
  DeviceBackend& backend_;
  const DeviceSlotPoolOptions options_;

  // Owned device objects, declared in the reverse of their teardown order (see above). Set up by
  // Create, constant afterwards except consumer_events_ (guarded by mu_).
  HostRegistration host_registration_;
  DeviceBuffer device_;
  StreamHandle stream_;
  std::vector<EventHandle> ready_events_;  // per slot
  CudaJobHandles handles_;

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::vector<EventHandle> consumer_events_;  // per slot, once imported; empty before
  std::vector<Slot> slots_;
  uint64_t last_generation_ = 0;
  bool stopped_ = false;
  bool imported_ = false;  // ImportConsumerEvents succeeded
  bool shut_down_ = false;
  uint64_t leaked_bytes_ = 0;
};

}  // namespace spdl::cuda
