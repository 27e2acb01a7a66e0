// ThreadPool: a node-wide pool of threads shared by every job (one pool, one set of cores — not a
// pool per job). The daemon has two: the worker pool (cpu stages: decode, transforms) and the I/O
// pool (io stages: reads), so that threads waiting on a disk never hold a core's worth of decode.
//
// Fairness: each job posts through its own queue (NewQueue(weight)). The pool serves the queues
// that have tasks in weighted round-robin: the queue at the front runs up to `weight` tasks, then
// goes to the back. A job with a deep backlog therefore cannot starve another: with every queue
// busy, each job gets the share of the threads its weight says. Within one queue tasks run FIFO.
// Post() on the pool itself uses a built-in queue of weight 1.
// Groups (ForGroup: the daemon makes one per uid): the queues of one group share that group's
// turns. The pool serves the groups that have tasks in round-robin, one task per turn, and within
// a group its queues by weight as above: a user with ten jobs gets the threads one user with one
// job gets, not ten times as many. Post() on the pool and NewQueue() on it use a default group.
//
// Tasks must not throw. One that does anyway is caught by the worker (never std::terminate): the
// pool logs it, counts it (task_exceptions()) and goes on with the next task. Callers that can say
// what failed (a sample, a job) catch in their own tasks first (see BatchPipeline).
//
// Thread-safe: every method may be called from any thread, except that Join(), SetThreads() and
// the destructor must not be called from a task of this pool (they wait for its threads).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "pipeline/executor.h"

namespace spdl::pipeline {

class ThreadPool final : public Executor {
 public:
  // threads <= 0: one per core.
  explicit ThreadPool(int threads);
  // Join()s.
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> task) override;
  // A queue served with `weight` (clamped to 1..1000). It may be destroyed with tasks still queued
  // (they still run). REQUIRES: the queue does not outlive the pool.
  std::unique_ptr<Executor> NewQueue(int weight) override;
  // The executor of group `group` (created on first use, lives as long as the pool).
  Executor* ForGroup(uint64_t group) override;

  // Grows or shrinks the pool to `threads` (<= 0: one per core) at run time. Shrinking lets the
  // removed threads finish the task they are running and waits for them; queued tasks stay queued
  // for the remaining threads. Ignored after Join().
  void SetThreads(int threads);
  int size() const { return target_.load(); }
  int Parallelism() const override { return size(); }
  // Tasks queued and not yet started, over all queues (for stats).
  size_t queued() const;
  // Tasks that threw out of the pool's threads (each caught, logged and dropped) so far.
  uint64_t task_exceptions() const { return task_exceptions_.load(std::memory_order_relaxed); }

  // Runs every task posted so far (and every task those post while the pool drains), then stops the
  // threads; later Post()s are dropped without running. Idempotent.
  void Join();

 private:
  struct Group;
  struct Queue {
    std::deque<std::function<void()>> tasks;
    int weight = 1;
    int credit = 0;       // tasks it may still run in its current turn
    bool active = false;  // in group->active (has tasks)
    std::shared_ptr<Group> group;
  };
  struct Group {
    std::list<std::shared_ptr<Queue>> active;  // its queues with tasks; front = whose turn it is
    bool active_in_pool = false;               // in active_ (has tasks)
  };
  class GroupExecutor;
  struct Worker {
    std::thread thread;
    bool stop = false;  // guarded by mu_
  };
  class QueueExecutor;

  void PostTo(const std::shared_ptr<Queue>& q, std::function<void()> task);
  void Run(Worker* self);
  // Runs one task; an exception is caught, logged and counted.
  void RunCaught(const std::function<void()>& task);
  // Under mu_: the next task in weighted round-robin order. REQUIRES: !active_.empty().
  std::function<void()> PopLocked();

  std::atomic<int> target_{0};
  std::atomic<uint64_t> task_exceptions_{0};
  std::mutex resize_mu_;  // serializes SetThreads / Join (held while joining threads)

  mutable std::mutex mu_;
  std::condition_variable cv_;  // a task was queued, a worker was told to stop, or joining_ was set
  // Guarded by mu_.
  std::list<std::shared_ptr<Group>> active_;  // groups with tasks; front = the one whose turn it is
  std::list<Worker> workers_;                 // list: a Worker never moves while its thread runs
  std::shared_ptr<Group> default_group_;
  std::shared_ptr<Queue> default_queue_;
  std::map<uint64_t, std::unique_ptr<GroupExecutor>> groups_;  // ForGroup's, never removed
  size_t queued_ = 0;
  bool joining_ = false;
};

}  // namespace spdl::pipeline
