// Executor: where a component runs its work. Components are handed an Executor and never create
// threads themselves, so unit tests can run every task inline on the calling thread.
//
// An executor may be shared by many jobs; a job asks it for its own queue (NewQueue) so that a
// fair executor (ThreadPool) can serve the jobs' queues in turn, by weight, instead of in one FIFO.
//
// Implementations must be safe to Post() to from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace spdl::pipeline {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs `task` some time later (or now, for InlineExecutor). `task` must not throw.
  virtual void Post(std::function<void()> task) = 0;
  // A queue of this executor for one job, served with `weight` (>= 1) relative to the other
  // queues: with every queue busy, a queue of weight 3 runs three tasks for each one of a queue of
  // weight 1. The default forwards every task to this executor (no fairness), for executors that
  // run everything at once anyway. The returned queue must not outlive this executor.
  virtual std::unique_ptr<Executor> NewQueue(int weight);
  // The executor for the work of one group (the daemon's groups are uids): its NewQueue queues
  // share the group's turn, and a fair executor serves the groups with work in round-robin before
  // the queues within each, so one user's many jobs get one user's share, not one share per job.
  // The result is owned by this executor and lives as long as it. Default: this (no groups).
  virtual Executor* ForGroup(uint64_t /*group*/) { return this; }
  // How many tasks it runs at once right now (a pool's thread count; it may change at run time),
  // or 0 when that is unknown or unbounded. A queue from NewQueue answers for its executor.
  virtual int Parallelism() const { return 0; }
};

// Runs each task at once on the caller's thread. For tests.
class InlineExecutor final : public Executor {
 public:
  void Post(std::function<void()> task) override { task(); }
};

namespace internal {
// NewQueue's default: forwards to another executor.
class ForwardingExecutor final : public Executor {
 public:
  explicit ForwardingExecutor(Executor* to) : to_(to) {}
  void Post(std::function<void()> task) override { to_->Post(std::move(task)); }
  int Parallelism() const override { return to_->Parallelism(); }

 private:
  Executor* const to_;
};
}  // namespace internal

inline std::unique_ptr<Executor> Executor::NewQueue(int /*weight*/) {
  return std::make_unique<internal::ForwardingExecutor>(this);
}

}  // namespace spdl::pipeline
