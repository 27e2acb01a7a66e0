#include "pipeline/thread_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

namespace spdl::pipeline {
namespace {
int Resolve(int threads) {
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}
}  // namespace

class ThreadPool::QueueExecutor final : public Executor {
 public:
  QueueExecutor(ThreadPool* pool, std::shared_ptr<Queue> q) : pool_(pool), q_(std::move(q)) {}
  void Post(std::function<void()> task) override { pool_->PostTo(q_, std::move(task)); }
  int Parallelism() const override { return pool_->size(); }

 private:
  ThreadPool* const pool_;
  const std::shared_ptr<Queue> q_;
};

class ThreadPool::GroupExecutor final : public Executor {
 public:
  GroupExecutor(ThreadPool* pool, std::shared_ptr<Group> group)
      : pool_(pool), group_(std::move(group)), default_queue_(NewQueueIn(1)) {}
  void Post(std::function<void()> task) override { pool_->PostTo(default_queue_, std::move(task)); }
  std::unique_ptr<Executor> NewQueue(int weight) override {
    return std::make_unique<QueueExecutor>(pool_, NewQueueIn(weight));
  }
  int Parallelism() const override { return pool_->size(); }

 private:
  std::shared_ptr<Queue> NewQueueIn(int weight) const {
    auto q = std::make_shared<Queue>();
    q->weight = std::clamp(weight, 1, 1000);
    q->group = group_;
    return q;
  }
  ThreadPool* const pool_;
  const std::shared_ptr<Group> group_;
  const std::shared_ptr<Queue> default_queue_;  // for Post on the group itself
};

ThreadPool::ThreadPool(int threads)
    : default_group_(std::make_shared<Group>()), default_queue_(std::make_shared<Queue>()) {
  default_queue_->group = default_group_;
  SetThreads(threads);
}

Executor* ThreadPool::ForGroup(uint64_t group) {
  std::lock_guard lock(mu_);
  auto& g = groups_[group];
  if (!g) g = std::make_unique<GroupExecutor>(this, std::make_shared<Group>());
  return g.get();
}

ThreadPool::~ThreadPool() { Join(); }

void ThreadPool::Post(std::function<void()> task) { PostTo(default_queue_, std::move(task)); }

std::unique_ptr<Executor> ThreadPool::NewQueue(int weight) {
  auto q = std::make_shared<Queue>();
  q->weight = std::clamp(weight, 1, 1000);
  q->group = default_group_;
  return std::make_unique<QueueExecutor>(this, std::move(q));
}

void ThreadPool::PostTo(const std::shared_ptr<Queue>& q, std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (joining_ && workers_.empty()) return;  // joined: dropped (destroyed after the lock, below)
    q->tasks.push_back(std::move(task));
    ++queued_;
    if (!q->active) {
      q->active = true;
      q->credit = q->weight;
      q->group->active.push_back(q);
      if (!q->group->active_in_pool) {
        q->group->active_in_pool = true;
        active_.push_back(q->group);
      }
    }
  }
  cv_.notify_one();
}

std::function<void()> ThreadPool::PopLocked() {
  std::shared_ptr<Group> g = active_.front();
  std::shared_ptr<Queue> q = g->active.front();
  std::function<void()> task = std::move(q->tasks.front());
  q->tasks.pop_front();
  --queued_;
  if (q->tasks.empty()) {
    q->active = false;
    g->active.pop_front();
  } else if (--q->credit <= 0) {
    q->credit = q->weight;
    g->active.splice(g->active.end(), g->active, g->active.begin());  // its turn is over
  }
  // One task per group turn: the next group with work goes next.
  if (g->active.empty()) {
    g->active_in_pool = false;
    active_.pop_front();
  } else {
    active_.splice(active_.end(), active_, active_.begin());
  }
  return task;
}

void ThreadPool::Run(Worker* self) {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return self->stop || !active_.empty() || joining_; });
    if (self->stop) return;
    if (active_.empty()) return;  // joining and drained
    std::function<void()> task = PopLocked();
    lock.unlock();
    RunCaught(task);
    task = nullptr;  // destroy what it holds before taking the lock again
    lock.lock();
  }
}

void ThreadPool::RunCaught(const std::function<void()>& task) {
  // The last line of defence: a task that throws must not terminate the daemon and every job.
  try {
    task();
  } catch (const std::exception& e) {
    task_exceptions_.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("worker pool: a task threw ({}); it was dropped and the pool goes on (a bug: tasks must not throw)",
                  e.what());
  } catch (...) {
    task_exceptions_.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("worker pool: a task threw an exception of unknown type; it was dropped and the pool goes on");
  }
}

size_t ThreadPool::queued() const {
  std::lock_guard lock(mu_);
  return queued_;
}

void ThreadPool::SetThreads(int threads) {
  const int n = Resolve(threads);
  std::lock_guard resize(resize_mu_);
  std::list<Worker> removed;
  {
    std::lock_guard lock(mu_);
    if (joining_) return;
    while (static_cast<int>(workers_.size()) > n) {
      workers_.back().stop = true;
      removed.splice(removed.begin(), workers_, std::prev(workers_.end()));
    }
    while (static_cast<int>(workers_.size()) < n) {
      Worker& w = workers_.emplace_back();
      w.thread = std::thread([this, &w] { Run(&w); });
    }
    target_.store(n);
  }
  cv_.notify_all();
  for (Worker& w : removed) w.thread.join();
}

void ThreadPool::Join() {
  std::lock_guard resize(resize_mu_);
  {
    std::lock_guard lock(mu_);
    joining_ = true;
  }
  cv_.notify_all();
  for (Worker& w : workers_) {
    if (w.thread.joinable()) w.thread.join();
  }
  std::list<std::shared_ptr<Group>> left;
  {
    std::lock_guard lock(mu_);
    workers_.clear();
    left.swap(active_);  // nothing can be left (the last worker drained them); kept for safety
  }
}

}  // namespace spdl::pipeline
