// Admission: the job registry's budgets. A job is admitted against the node's shared-memory budget
// (memory_budget_bytes, shared through MemoryBudget with decode scratch, the jobs' decoded caches
// and what streams retain with their producers' put buffers), the per-uid limits
// (max_jobs_per_client, max_budget_share_per_uid while other uids have or wait for jobs) and, for a
// copy: daemon GPU job, the device's budget (device_memory_budget_bytes, of which spdld's own CUDA
// context takes gpu_context_bytes, a fixed estimate per device). What it grants is held by RAII
// leases: dropping a Reservation (or a lease taken from it) returns exactly what it held, so a
// start that fails at any step gives everything back without hand-written rollback.
//
// Thread-safe: every method may be called from any thread (guarded by mu_); leases are returned
// from whichever thread destroys a job. The Admission must outlive every lease it granted.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"
#include "config/daemon_config.h"
#include "jobs/media_job.h"
#include "jobs/memory_budget.h"

namespace spdl::jobs {

class Admission {
 public:
  // What a job asks for.
  struct Request {
    uid_t uid = 0;
    uint64_t shm_bytes = 0;     // the job's shared region (MediaJob::LayoutFor(spec).region_bytes)
    int slots = 0;              // its slots (prefetch), for the messages
    int device = -1;            // the daemon's CUDA ordinal of a copy: daemon job; -1: no device memory
    std::string device_name;    // the job's output.device (cuda:N, the trainer's), for the messages
    uint64_t device_bytes = 0;  // device memory the job's slots take on `device`
  };

  // Device bytes held by one admitted job on one device: returned when Close is called (with the
  // bytes that could not be freed, which stay counted as used and leaked) or, at the latest, when
  // the lease is destroyed (nothing leaked). Thread-safe; Close is idempotent (the first wins).
  class DeviceLease {
   public:
    DeviceLease(Admission* a, int device, uint64_t bytes) : a_(a), device_(device), bytes_(bytes) {}
    ~DeviceLease() { Close(0); }
    DeviceLease(const DeviceLease&) = delete;
    DeviceLease& operator=(const DeviceLease&) = delete;
    void Close(uint64_t leaked_bytes);

   private:
    Admission* const a_;
    const int device_;
    const uint64_t bytes_;
    std::once_flag closed_;
  };

  // What Reserve granted: the shared-memory part (a BudgetLease for MediaJob::Start, which holds it
  // for the job's life) and the device part (for the GPU wrapper's on_close). Move-only; whatever
  // is still in it when it is destroyed is returned (the rollback of a failed start).
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&&) = default;
    Reservation& operator=(Reservation&&) = default;
    // The shared-memory part; null once taken. The job slot (max_jobs_per_client) goes with it.
    std::unique_ptr<BudgetLease> TakeShmLease() { return std::move(shm_); }
    // The device part; null when the job asked for no device memory, or once taken.
    std::shared_ptr<DeviceLease> TakeDeviceLease() { return std::move(device_); }
    bool holds_shm() const { return shm_ != nullptr; }
    bool holds_device() const { return device_ != nullptr; }

   private:
    friend class Admission;
    std::unique_ptr<BudgetLease> shm_;
    std::shared_ptr<DeviceLease> device_;
  };

  // `budget` is the node's memory account (shared with the decoders' scratch); limits from `config`.
  Admission(const config::DaemonConfig& config, std::shared_ptr<MemoryBudget> budget);
  ~Admission();
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // New limits (a config reload) for the jobs admitted from now on; granted leases keep what they hold.
  void SetLimits(const config::DaemonConfig& config);

  // Admits `r` against every budget at once, or refuses with kResourceExhausted naming the limit,
  // what the job needs and what is free; a refusal holds nothing.
  Result<Reservation> Reserve(const Request& r);

  // Shared-memory bytes held by admitted jobs.
  uint64_t bytes_in_use() const;
  // Admitted jobs whose shared-memory lease is alive.
  int live_jobs() const;
  // Jobs of `uid` whose shared-memory lease is alive.
  int jobs_of(uid_t uid) const;
  // Device bytes held on CUDA device N (leaked ones included), and the leaked part.
  uint64_t device_bytes_in_use(int device) const;
  uint64_t leaked_device_bytes(int device) const;
  uint64_t leaked_device_bytes_total() const;
  // Jobs whose device lease on `device` is not yet closed.
  uint32_t device_jobs(int device) const;

 private:
  class ShmLease;
  void ReturnShm(uid_t uid, uint64_t bytes);
  void ReturnDevice(int device, uint64_t bytes, uint64_t leaked);

  const std::shared_ptr<MemoryBudget> budget_;
  mutable std::mutex mu_;
  // Guarded by mu_.
  uint64_t memory_budget_bytes_;
  int max_jobs_per_client_;
  double max_budget_share_per_uid_;
  uint64_t device_memory_budget_bytes_;
  uint64_t gpu_context_bytes_;
  uint64_t bytes_in_use_ = 0;
  int live_jobs_ = 0;
  std::map<uid_t, int> jobs_per_uid_;
  std::map<uid_t, uint64_t> bytes_per_uid_;  // shared-memory bytes of each uid's live jobs
  // Uids refused for lack of memory budget, and when: they count as waiting for kBudgetWaitMemory
  // (max_budget_share_per_uid applies to the others meanwhile).
  std::map<uid_t, std::chrono::steady_clock::time_point> refused_for_budget_;
  static constexpr std::chrono::seconds kBudgetWaitMemory{60};
  std::map<int, uint64_t> device_bytes_in_use_;  // per CUDA device
  std::map<int, uint64_t> leaked_device_bytes_;  // per CUDA device, part of device_bytes_in_use_
  std::map<int, uint32_t> device_jobs_;          // per CUDA device: open device leases
};

}  // namespace spdl::jobs
