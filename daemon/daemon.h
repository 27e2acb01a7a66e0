// Daemon: the composition root. Owns every long-lived component of spdld and wires them together;
// nothing else creates threads or holds global state. Start() reads as the ordered list of
// start-up steps (each timed in the log); Run() serves until SIGTERM/SIGINT or Stop().
//
// Threading: construct, Start() and Run() on the main thread; Stop() may be called from any thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>

#include "common/status.h"
#include "config/daemon_config.h"

namespace spdl {
namespace pipeline { class ThreadPool; }
namespace jobs { class JobRegistry; }
namespace server { class ControlServer; }

class Daemon {
 public:
  explicit Daemon(config::DaemonConfig config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  Status Start();
  // Serves until a signal or Stop(); then closes every session, lets in-flight work finish and
  // removes the socket file.
  void Run();
  void Stop();

 private:
  void Shutdown();
  // Logs one line per live job every stats_log_seconds.
  void ScheduleStatsLog();

  // Declared in teardown order (destroyed bottom-up): the server (sessions, and so their jobs)
  // goes first, then the io_context; the worker pool is joined explicitly in Shutdown() before the
  // registry, which must outlive every job, is destroyed.
  const config::DaemonConfig config_;
  std::unique_ptr<pipeline::ThreadPool> pool_;
  std::unique_ptr<pipeline::ThreadPool> io_pool_;  // io stages (reads); joined before pool_
  std::unique_ptr<jobs::JobRegistry> registry_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer stats_timer_;
  std::unique_ptr<server::ControlServer> server_;
  bool shut_down_ = false;
};

}  // namespace spdl
