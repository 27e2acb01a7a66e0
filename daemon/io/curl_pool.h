// CurlPool: a bounded pool of libcurl easy handles for one source's transfers (HttpSource,
// S3Client). Each handle keeps its own connection cache, so a handle reused is a connection reused.
// At most `max_handles` exist; Acquire blocks while all are in use.
//
// Thread-safe. Private to spdl_io: include it only where SPDL_HAVE_CURL is set.
#pragma once

#include <curl/curl.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace spdl::io {

class CurlPool {
 public:
  struct Handle {
    Handle() : curl(curl_easy_init()) {}
    ~Handle() {
      if (curl != nullptr) curl_easy_cleanup(curl);
    }
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;

    CURL* const curl;                  // nullptr when curl could not make one
    char error[CURL_ERROR_SIZE] = {};  // the handle's CURLOPT_ERRORBUFFER, if `setup` sets it
  };

  // `setup` runs once on each new handle, outside the lock: the options every transfer shares.
  // REQUIRES: max_handles >= 1.
  explicit CurlPool(int max_handles, std::function<void(Handle&)> setup = nullptr)
      : max_handles_(max_handles), setup_(std::move(setup)) {}

  // A free handle (the most recently used: its connection is the warmest), or a new one while
  // fewer than max_handles exist; nullptr when curl cannot make one. Release it when done.
  Handle* Acquire() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !free_.empty() || created_ < max_handles_; });
    if (!free_.empty()) {
      Handle* h = free_.back();
      free_.pop_back();
      return h;
    }
    ++created_;
    lock.unlock();
    auto h = std::make_unique<Handle>();
    if (h->curl == nullptr) {
      {
        std::lock_guard<std::mutex> l(mu_);
        --created_;
      }
      cv_.notify_one();
      return nullptr;
    }
    if (setup_) setup_(*h);
    Handle* raw = h.get();
    std::lock_guard<std::mutex> l(mu_);
    handles_.push_back(std::move(h));
    return raw;
  }

  // Gives back a handle. REQUIRES: h came from this pool's Acquire and is not released yet.
  void Release(Handle* h) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(h);
    }
    cv_.notify_one();
  }

 private:
  const int max_handles_;
  const std::function<void(Handle&)> setup_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_.
  std::vector<std::unique_ptr<Handle>> handles_;  // every handle made
  std::vector<Handle*> free_;                     // those not in use
  int created_ = 0;                               // handles made or being made
};

}  // namespace spdl::io
