#include "jobs/admission.h"

#include <algorithm>

namespace spdl::jobs {
namespace {

std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

}  // namespace

class Admission::ShmLease final : public BudgetLease {
 public:
  ShmLease(Admission* a, uid_t uid, uint64_t bytes) : a_(a), uid_(uid), bytes_(bytes) {}
  ~ShmLease() override { a_->ReturnShm(uid_, bytes_); }
  ShmLease(const ShmLease&) = delete;
  ShmLease& operator=(const ShmLease&) = delete;

 private:
  Admission* const a_;
  const uid_t uid_;
  const uint64_t bytes_;
};

void Admission::DeviceLease::Close(uint64_t leaked_bytes) {
  std::call_once(closed_, [&] { a_->ReturnDevice(device_, bytes_, std::min(leaked_bytes, bytes_)); });
}

Admission::Admission(const config::DaemonConfig& config, std::shared_ptr<MemoryBudget> budget)
    : budget_(std::move(budget)) {
  SetLimits(config);
}

Admission::~Admission() = default;

void Admission::SetLimits(const config::DaemonConfig& config) {
  std::lock_guard lock(mu_);
  memory_budget_bytes_ = config.memory_budget_bytes;
  budget_->SetLimit(config.memory_budget_bytes);
  max_jobs_per_client_ = config.max_jobs_per_client;
  max_budget_share_per_uid_ = config.max_budget_share_per_uid;
  device_memory_budget_bytes_ = config.device_memory_budget_bytes;
  gpu_context_bytes_ = config.gpu_context_bytes;
}

Result<Admission::Reservation> Admission::Reserve(const Request& r) {
  std::lock_guard lock(mu_);
  const auto held_jobs = jobs_per_uid_.find(r.uid);
  const int jobs = held_jobs == jobs_per_uid_.end() ? 0 : held_jobs->second;
  if (jobs >= max_jobs_per_client_) {
    return ResourceExhausted("uid " + std::to_string(r.uid) + " already has " + std::to_string(max_jobs_per_client_) +
                             " jobs (max_jobs_per_client)");
  }
  // A fair share of the budget: while another uid has jobs, or was refused for memory lately
  // (it waits), one uid may hold at most max_budget_share_per_uid of the budget.
  const auto now = std::chrono::steady_clock::now();
  std::erase_if(refused_for_budget_, [&](const auto& e) { return now - e.second > kBudgetWaitMemory; });
  bool others = false;
  for (const auto& [uid, n] : jobs_per_uid_) others = others || (uid != r.uid && n > 0);
  for (const auto& e : refused_for_budget_) others = others || e.first != r.uid;
  const auto share = static_cast<uint64_t>(max_budget_share_per_uid_ * static_cast<double>(memory_budget_bytes_));
  const auto held_it = bytes_per_uid_.find(r.uid);
  const uint64_t held = held_it == bytes_per_uid_.end() ? 0 : held_it->second;
  if (others && max_budget_share_per_uid_ < 1.0 && held + r.shm_bytes > share) {
    if (held == 0) refused_for_budget_[r.uid] = now;  // a uid with no job yet waits for memory too
    return ResourceExhausted("the job needs " + MiB(r.shm_bytes) + " of shared memory and uid " +
                             std::to_string(r.uid) + " already holds " + MiB(held) +
                             ": while other users have or wait for jobs, one uid may hold at most " + MiB(share) +
                             " (max_budget_share_per_uid " + std::to_string(max_budget_share_per_uid_).substr(0, 4) +
                             " of the " + MiB(memory_budget_bytes_) + " memory_budget)");
  }
  // Scratch of large decodes running now, and what streams retain (and their producers' put
  // buffers), are part of the same budget (memory_budget.h).
  const uint64_t scratch = budget_->scratch_bytes();
  const uint64_t streams = budget_->stream_bytes();
  if (bytes_in_use_ + scratch + streams + r.shm_bytes > memory_budget_bytes_) {
    refused_for_budget_[r.uid] = now;
    return ResourceExhausted("the job needs " + MiB(r.shm_bytes) + " of shared memory (" + std::to_string(r.slots) +
                             " slots) but only " +
                             MiB(memory_budget_bytes_ > bytes_in_use_ ? memory_budget_bytes_ - bytes_in_use_ : 0) +
                             " of the daemon's memory_budget of " + MiB(memory_budget_bytes_) + " is free");
  }
  if (r.device >= 0) {
    // spdld's own CUDA context on the device (gpu_context_bytes, an estimate) counts too.
    const uint64_t used = device_bytes_in_use_[r.device] + gpu_context_bytes_;
    if (used + r.device_bytes > device_memory_budget_bytes_) {
      return ResourceExhausted(
          "the job needs " + MiB(r.device_bytes) + " of GPU memory on " + r.device_name + " but only " +
          MiB(device_memory_budget_bytes_ > used ? device_memory_budget_bytes_ - used : 0) +
          " of the daemon's device_memory_budget_bytes of " + MiB(device_memory_budget_bytes_) +
          " is free (spdld's CUDA context counts " + MiB(gpu_context_bytes_) + ", gpu_context_bytes)");
    }
  }
  // Admitted: every part at once, each held by its lease from here on.
  Reservation out;
  if (r.device >= 0) {
    device_bytes_in_use_[r.device] += r.device_bytes;
    ++device_jobs_[r.device];
    out.device_ = std::make_shared<DeviceLease>(this, r.device, r.device_bytes);
  }
  bytes_in_use_ += r.shm_bytes;
  budget_->SetSlotBytes(bytes_in_use_);
  bytes_per_uid_[r.uid] += r.shm_bytes;
  refused_for_budget_.erase(r.uid);  // admitted: no longer waiting
  ++jobs_per_uid_[r.uid];
  ++live_jobs_;
  out.shm_ = std::make_unique<ShmLease>(this, r.uid, r.shm_bytes);
  return out;
}

void Admission::ReturnShm(uid_t uid, uint64_t bytes) {
  std::lock_guard lock(mu_);
  bytes_in_use_ -= bytes;
  budget_->SetSlotBytes(bytes_in_use_);
  uint64_t& uid_bytes = bytes_per_uid_[uid];
  uid_bytes -= bytes;
  if (uid_bytes == 0) bytes_per_uid_.erase(uid);
  if (--jobs_per_uid_[uid] == 0) jobs_per_uid_.erase(uid);
  --live_jobs_;
}

// Leaked device memory (a copy that never drained) is not returned: it stays used, and shows.
void Admission::ReturnDevice(int device, uint64_t bytes, uint64_t leaked) {
  std::lock_guard lock(mu_);
  device_bytes_in_use_[device] -= bytes - leaked;
  leaked_device_bytes_[device] += leaked;
  if (device_jobs_[device] > 0) --device_jobs_[device];
}

uint64_t Admission::bytes_in_use() const {
  std::lock_guard lock(mu_);
  return bytes_in_use_;
}

int Admission::live_jobs() const {
  std::lock_guard lock(mu_);
  return live_jobs_;
}

int Admission::jobs_of(uid_t uid) const {
  std::lock_guard lock(mu_);
  auto it = jobs_per_uid_.find(uid);
  return it == jobs_per_uid_.end() ? 0 : it->second;
}

uint64_t Admission::device_bytes_in_use(int device) const {
  std::lock_guard lock(mu_);
  auto it = device_bytes_in_use_.find(device);
  return it == device_bytes_in_use_.end() ? 0 : it->second;
}

uint64_t Admission::leaked_device_bytes(int device) const {
  std::lock_guard lock(mu_);
  auto it = leaked_device_bytes_.find(device);
  return it == leaked_device_bytes_.end() ? 0 : it->second;
}

uint64_t Admission::leaked_device_bytes_total() const {
  std::lock_guard lock(mu_);
  uint64_t total = 0;
  for (const auto& [device, bytes] : leaked_device_bytes_) total += bytes;
  return total;
}

uint32_t Admission::device_jobs(int device) const {
  std::lock_guard lock(mu_);
  auto it = device_jobs_.find(device);
  return it == device_jobs_.end() ? 0 : it->second;
}

}  // namespace spdl::jobs
