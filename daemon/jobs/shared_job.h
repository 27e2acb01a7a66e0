// Identical jobs decode once. A ShareGroup runs one underlying job (one pipeline, one shared
// region, one slot ring) for several clients that submitted the same job (job config share: true;
// the registry decides who is "the same": see JobRegistry::Submit), and hands each member a
// SharedMember, a JobHandle of its own, that gives it every batch of the underlying job.
//
// Contract:
// - Every member gets every batch of the group, in the underlying job's order, with its epoch and
//   job ends. All members map the same region (the underlying job's region_fd and layout; only
//   accepted().job_id is the member's own).
// - A slot of the underlying ring is released once every member that was in the group when the
//   batch was taken from it has released it, or left. Each (slot, generation) so carries a set of
//   members that still hold it; the underlying Release happens when that set becomes empty.
// - Joining: a group takes members until it hands out its first batch; it holds that first batch
//   until `min_members` have joined (job config share_members), but at most `wait` after the group
//   was made (share_wait_seconds): then it starts with the members present (logged). Whoever made
//   the group calls Notify() once the wait is over (the registry schedules it on the control
//   thread), so the members waiting are woken. A client that submits the same job after the start
//   gets a group (a pipeline) of its own: members never start mid-epoch.
// - A slow member: the fast ones run ahead only as far as the ring is deep (prefetch slots); then
//   the underlying job has no free slot and the whole group waits for the slowest member. No
//   member is ever skipped or dropped for being slow.
// - Leaving (the session disconnects, cancels, ends its job, or is aborted by spdlctl cancel):
//   the member's holds are dropped at once (slots only it still held go back to the ring) and the
//   rest of the group goes on undisturbed. Abort on a member stops only that member. When the last
//   member leaves, the underlying job is cancelled.
// - A failure of the underlying job (on_error: fail) is every member's failure.
//
// Threading: like every JobHandle, members and the group are driven from the control thread only,
// except Notify(), which the underlying job calls from worker threads; it calls every member's
// `notify` (each of which only schedules work on the control thread), under notify_mu_.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "jobs/job_service.h"

namespace spdl::jobs {

class SharedMember;

class ShareGroup final : public std::enable_shared_from_this<ShareGroup> {
 public:
  using Clock = std::chrono::steady_clock;
  // REQUIRES: min_members >= 1. Attach the underlying job with SetJob before any Join. `wait`: the
  // longest the first batch is held for missing members, from now.
  explicit ShareGroup(uint32_t min_members, Clock::duration wait = Clock::duration::max());
  ~ShareGroup();
  ShareGroup(const ShareGroup&) = delete;
  ShareGroup& operator=(const ShareGroup&) = delete;

  // The underlying job's notify: pass it (or a function calling it through a weak_ptr) to the job.
  // Any thread.
  void Notify();

  // Attaches the underlying job. REQUIRES: job != nullptr; called once.
  void SetJob(std::shared_ptr<JobHandle> job);

  // True while a new member may join (no batch handed out yet, not closed, not failed).
  bool joinable() const;

  // Adds a member with its own job id and notify. REQUIRES: joinable().
  std::shared_ptr<SharedMember> Join(uint64_t member_job_id, std::function<void()> notify);

  // Members now.
  uint32_t members() const { return static_cast<uint32_t>(members_.size()); }
  // The underlying job's id.
  uint64_t job_id() const { return job_->accepted().job_id(); }

 private:
  friend class SharedMember;
  struct Entry {
    uint64_t seq = 0;
    Delivery delivery;
    std::set<uint64_t> holders;  // members that have not released it (taken or not)
  };
  struct Member {
    uint64_t next_seq = 0;  // the next entry this member takes
  };

  std::optional<Delivery> TakeNext(uint64_t member);
  // Whether the first batch may be handed out now: enough members, or the wait is over.
  bool MayStart();
  Status Release(uint64_t member, uint32_t slot, uint64_t generation);
  void Leave(uint64_t member);
  // Drops `member` from e's holders; releases the underlying slot when it was the last holder.
  void DropHold(Entry& e, uint64_t member);
  void PopReleased();
  void NotifyExcept(uint64_t member);

  // Constant after construction (job_ after SetJob).
  const uint32_t min_members_;
  const Clock::time_point deadline_;  // the first batch is held for members until then
  std::shared_ptr<JobHandle> job_;

  // Control thread only.
  std::map<uint64_t, Member> members_;
  std::deque<Entry> entries_;  // taken from the underlying job and not yet released by all
  uint64_t next_seq_ = 0;      // the seq of the next entry taken from the underlying job
  bool started_ = false;       // a batch was handed out: no more joins
  bool closed_ = false;        // the last member left: the underlying job is cancelled

  std::mutex notify_mu_;
  // Guarded by notify_mu_.
  std::map<uint64_t, std::function<void()>> notifies_;
};

// One client's view of a ShareGroup. See the contract above.
class SharedMember final : public JobHandle {
 public:
  SharedMember(std::shared_ptr<ShareGroup> group, uint64_t job_id);
  ~SharedMember() override;  // leaves the group

  const proto::JobAccepted& accepted() const override { return accepted_; }
  int region_fd() const override { return group_->job_->region_fd(); }
  std::optional<Delivery> TakeNext() override;
  Status Release(uint32_t slot, uint64_t generation) override;
  Status failure() const override;
  void Cancel() override;
  proto::JobStats Stats() const override;
  void Abort(Status reason) override;

  const ShareGroup& group() const { return *group_; }

 private:
  // Constant after construction.
  const std::shared_ptr<ShareGroup> group_;
  const uint64_t id_;
  proto::JobAccepted accepted_;

  // Control thread only.
  bool left_ = false;
  Status aborted_;
};

}  // namespace spdl::jobs
