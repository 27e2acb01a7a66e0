#include "jobs/shared_job.h"

#include <spdlog/spdlog.h>

#include <utility>
#include <vector>

namespace spdl::jobs {

namespace {
ShareGroup::Clock::time_point DeadlineAfter(ShareGroup::Clock::duration wait) {
  const auto now = ShareGroup::Clock::now();
  return wait >= ShareGroup::Clock::time_point::max() - now ? ShareGroup::Clock::time_point::max() : now + wait;
}
}  // namespace

ShareGroup::ShareGroup(uint32_t min_members, Clock::duration wait)
    : min_members_(min_members == 0 ? 1 : min_members), deadline_(DeadlineAfter(wait)) {}

bool ShareGroup::MayStart() {
  if (started_ || members_.size() >= min_members_) return true;
  if (Clock::now() < deadline_) return false;
  spdlog::warn(
      "share group of job {}: starts with {} of the {} members of share_members (share_wait_seconds "
      "passed); a member that comes later gets a group of its own",
      job_id(), members_.size(), min_members_);
  return true;
}

ShareGroup::~ShareGroup() {
  if (job_ && !closed_) job_->Cancel();
}

void ShareGroup::SetJob(std::shared_ptr<JobHandle> job) { job_ = std::move(job); }

void ShareGroup::Notify() {
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard lock(notify_mu_);
    for (auto& [id, fn] : notifies_) fns.push_back(fn);
  }
  for (auto& fn : fns) fn();
}

void ShareGroup::NotifyExcept(uint64_t member) {
  std::vector<std::function<void()>> fns;
  {
    std::lock_guard lock(notify_mu_);
    for (auto& [id, fn] : notifies_) {
      if (id != member) fns.push_back(fn);
    }
  }
  for (auto& fn : fns) fn();
}

bool ShareGroup::joinable() const { return job_ && !started_ && !closed_ && job_->failure().ok(); }

std::shared_ptr<SharedMember> ShareGroup::Join(uint64_t member_job_id, std::function<void()> notify) {
  members_[member_job_id] = Member{next_seq_};
  {
    std::lock_guard lock(notify_mu_);
    notifies_[member_job_id] = std::move(notify);
  }
  auto member = std::make_shared<SharedMember>(shared_from_this(), member_job_id);
  // Enough members now: let everyone take the first batch (it may be ready already).
  if (members_.size() >= min_members_) Notify();
  return member;
}

std::optional<Delivery> ShareGroup::TakeNext(uint64_t member) {
  auto m = members_.find(member);
  if (m == members_.end()) return std::nullopt;
  if (!MayStart()) return std::nullopt;
  if (m->second.next_seq == next_seq_) {
    std::optional<Delivery> d = job_->TakeNext();
    if (!d) return std::nullopt;
    started_ = true;
    Entry e;
    e.seq = next_seq_++;
    e.delivery = std::move(*d);
    for (const auto& [id, unused] : members_) e.holders.insert(id);
    entries_.push_back(std::move(e));
    NotifyExcept(member);  // the others have a batch to take now
  }
  const uint64_t front = entries_.front().seq;
  Entry& e = entries_[m->second.next_seq - front];
  ++m->second.next_seq;
  return e.delivery;
}

void ShareGroup::DropHold(Entry& e, uint64_t member) {
  if (e.holders.erase(member) == 0 || !e.holders.empty()) return;
  Status s = job_->Release(e.delivery.batch.slot(), e.delivery.batch.generation());
  if (!s.ok())
    spdlog::warn("share group of job {}: releasing slot {}: {}", job_id(), e.delivery.batch.slot(), s.message());
}

void ShareGroup::PopReleased() {
  while (!entries_.empty() && entries_.front().holders.empty()) entries_.pop_front();
}

Status ShareGroup::Release(uint64_t member, uint32_t slot, uint64_t generation) {
  auto m = members_.find(member);
  if (m == members_.end()) return Status::Ok();  // a late release after leaving is harmless
  for (Entry& e : entries_) {
    if (e.seq >= m->second.next_seq) break;  // not taken by this member yet
    if (e.delivery.batch.slot() == slot && e.delivery.batch.generation() == generation && e.holders.count(member)) {
      DropHold(e, member);
      PopReleased();
      return Status::Ok();
    }
  }
  return InvalidArgument("slot " + std::to_string(slot) + " generation " + std::to_string(generation) +
                         " is not leased to this client");
}

void ShareGroup::Leave(uint64_t member) {
  if (members_.erase(member) == 0) return;
  {
    std::lock_guard lock(notify_mu_);
    notifies_.erase(member);
  }
  for (Entry& e : entries_) DropHold(e, member);
  PopReleased();
  if (members_.empty()) {
    closed_ = true;
    job_->Cancel();
    return;
  }
  // Fewer members may be enough to start; freed slots are announced by the job itself.
  if (!started_ && members_.size() >= min_members_) Notify();
}

SharedMember::SharedMember(std::shared_ptr<ShareGroup> group, uint64_t job_id)
    : group_(std::move(group)), id_(job_id), accepted_(group_->job_->accepted()) {
  accepted_.set_job_id(job_id);
}

SharedMember::~SharedMember() { Cancel(); }

std::optional<Delivery> SharedMember::TakeNext() {
  if (left_) return std::nullopt;
  return group_->TakeNext(id_);
}

Status SharedMember::Release(uint32_t slot, uint64_t generation) {
  if (left_) return Status::Ok();
  return group_->Release(id_, slot, generation);
}

Status SharedMember::failure() const {
  if (!aborted_.ok()) return aborted_;
  return group_->job_->failure();
}

void SharedMember::Cancel() {
  if (left_) return;
  left_ = true;
  group_->Leave(id_);
}

void SharedMember::Abort(Status reason) {
  if (left_) return;
  if (reason.ok()) reason = Cancelled("aborted");
  aborted_ = std::move(reason);
  std::function<void()> notify;
  {
    std::lock_guard lock(group_->notify_mu_);
    auto it = group_->notifies_.find(id_);
    if (it != group_->notifies_.end()) notify = it->second;
  }
  Cancel();
  if (notify) notify();  // so the session reports the failure
}

proto::JobStats SharedMember::Stats() const {
  proto::JobStats s = group_->job_->Stats();
  s.set_share_members(group_->members());
  s.set_share_group_job_id(group_->job_id());
  return s;
}

}  // namespace spdl::jobs
