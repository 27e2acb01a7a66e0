// Executor: where a component runs its work. Components are handed an Executor and never create
// threads themselves, so unit tests can run every task inline on the calling thread.
//
// Implementations must be safe to Post() to from any thread.
#pragma once

#include <functional>

namespace spdl::pipeline {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs `task` some time later (or now, for InlineExecutor). `task` must not throw.
  virtual void Post(std::function<void()> task) = 0;
};

// Runs each task at once on the caller's thread. For tests.
class InlineExecutor final : public Executor {
 public:
  void Post(std::function<void()> task) override { task(); }
};

}  // namespace spdl::pipeline
