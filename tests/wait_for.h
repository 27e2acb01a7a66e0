// WaitFor: polls a condition until it holds or a time limit passes, for tests that wait on other
// threads or processes without a notification to wait on. Thread-safe (done() is called on the
// calling thread only).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace spdl::testing {

// Whether done() comes true within `limit` (polled every 2 ms; checked once more at the limit).
inline bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

}  // namespace spdl::testing
