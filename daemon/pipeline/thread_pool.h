// ThreadPool: the daemon's node-wide worker pool, shared by every job (one pool, one set of
// cores — not a pool per job). Tasks run in FIFO order. Thread-safe.
#pragma once

#include <memory>

#include "pipeline/executor.h"

namespace boost::asio {
class thread_pool;
}

namespace spdl::pipeline {

class ThreadPool final : public Executor {
 public:
  // threads <= 0: one per core.
  explicit ThreadPool(int threads);
  // Stops taking tasks, lets queued tasks run, joins the threads.
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> task) override;
  int size() const { return threads_; }
  // Waits until every posted task has run; later Post()s are not run. Idempotent.
  void Join();

 private:
  int threads_;
  std::unique_ptr<boost::asio::thread_pool> pool_;
};

}  // namespace spdl::pipeline
