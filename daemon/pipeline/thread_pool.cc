#include "pipeline/thread_pool.h"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <thread>

namespace spdl::pipeline {

ThreadPool::ThreadPool(int threads)
    : threads_(threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      pool_(std::make_unique<boost::asio::thread_pool>(static_cast<size_t>(threads_))) {}

ThreadPool::~ThreadPool() { Join(); }

void ThreadPool::Post(std::function<void()> task) { boost::asio::post(*pool_, std::move(task)); }

void ThreadPool::Join() { pool_->join(); }

}  // namespace spdl::pipeline
