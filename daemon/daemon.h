// Daemon: the composition root. Owns every long-lived component of spdld and wires them together;
// nothing else creates threads or holds global state. Start() reads as the ordered list of
// start-up steps (each timed in the log); Run() serves until it is stopped.
//
// Signals (handled on the io_context thread):
//   SIGHUP          re-reads the config through the loader: log level, limits (memory budget,
//                   max jobs per client, max slots per job, allowed roots and URL prefixes, stats
//                   interval, drain time) and the worker / I/O thread counts (pools resized) apply
//                   at once, running jobs untouched; a config with errors is refused, every error
//                   logged, the old one kept. socket_*, max_frame_bytes and metrics_port take
//                   effect only at restart (logged).
//   SIGTERM/SIGINT  drain: no new jobs (Submit refused), running jobs told (Draining), then exit
//                   when they end or after drain_seconds. A second one exits at once.
//
// Threading: construct, Start() and Run() on the main thread; Stop() may be called from any thread.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "common/status.h"
#include "config/daemon_config.h"
#include "cuda/device_backend.h"
#include "cuda/jpeg_decode.h"
#include "ops/metrics.h"
#include "ops/notifier.h"
#include "proto/control.pb.h"

namespace spdl {
namespace io {
class SourceIndexCache;
}  // namespace io
namespace pipeline {
class ThreadPool;
}
namespace jobs {
class JobRegistry;
struct PeerInfo;
}  // namespace jobs
namespace server {
class ControlServer;
}

class Daemon {
 public:
  // Re-reads the daemon config for SIGHUP (file + command-line overrides). `config_name` names it
  // in error messages.
  using ConfigLoader = std::function<config::DaemonConfigResult()>;

  // An empty `loader` makes SIGHUP a logged no-op.
  explicit Daemon(config::DaemonConfig config, ConfigLoader loader = {}, std::string config_name = "");
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

#if SPDL_TEST_HOOKS
  // TEST ONLY (the hidden flag --test-only-fake-gpu DIR): GPU jobs get a cross-process fake device
  // in DIR (cuda/shm_fake_backend.h) instead of CUDA; logged loudly. Before Start().
  void UseFakeGpuForTests(std::string dir) { fake_gpu_dir_ = std::move(dir); }
#endif

  Status Start();
  // Serves until drained or Stop(); then closes every session, lets in-flight work finish and
  // removes the socket file.
  void Run();
  void Stop();
  // After Run(): the process's exit status: 0, or kExitGpuPoisoned when it stopped because a sticky
  // CUDA error poisoned a GPU and no job held it any more (exit_on_gpu_poison).
  int exit_code() const { return exit_code_; }
  static constexpr int kExitGpuPoisoned = 3;
  // exit_on_gpu_poison waits at most this long for the trainers holding a poisoned GPU's job memory
  // (their IPC mappings) to let go before it exits anyway.
  static constexpr std::chrono::seconds kGpuPoisonExitWait{600};

 private:
  void Shutdown();
  void WaitForSignal();
  // SIGHUP: re-read and apply the config (see the header comment).
  void Reload();
  // Starts draining (or returns the drain under way); `seconds` 0 = config drain_seconds.
  proto::Draining BeginDrain(const std::string& reason, uint32_t seconds);
  void ScheduleDrainCheck();
  // Logs one line per live job every stats_log_seconds.
  void ScheduleStatsLog();
  // Every tick: STATUS= (jobs, samples/s) to the service manager, and WATCHDOG=1 when it asked.
  void ScheduleNotifyTick();
  // Every 500 ms: logs a GPU a sticky error poisoned, and stops the daemon (exit_on_gpu_poison) once
  // no job holds it.
  void ScheduleGpuPoisonCheck();

  // Declared in teardown order (destroyed bottom-up): the server (sessions, and so their jobs)
  // goes first, then the io_context; the worker pool is joined explicitly in Shutdown() before the
  // registry, which must outlive every job, is destroyed.
  config::DaemonConfig config_;  // io thread only after Start() (Reload replaces it)
  const ConfigLoader loader_;
  const std::string config_name_;
#if SPDL_TEST_HOOKS
  std::string fake_gpu_dir_;  // test-only fake GPU (empty: the real CUDA backend, when built with CUDA)
#endif
  // GPU delivery: one backend per CUDA device, made on the first job that asks for it (control
  // thread); declared first so it outlives every job (its device slot pools borrow it).
  std::map<int, std::unique_ptr<cuda::DeviceBackend>> device_backends_;
  std::mutex device_backends_mu_;  // guards device_backends_ and decode_parts_ (made on the prepare pool's threads)
  // GPU JPEG decode (decode.device: cuda): per device, its nvJPEG and resize kernels, made on the
  // first job that asks (off the control thread); they borrow the device's backend, so they are
  // declared after it (destroyed before it) and before every job.
  struct DecodeParts {
    std::unique_ptr<cuda::JpegDecodeBackend> jpeg;
    std::unique_ptr<cuda::ImageKernels> kernels;
  };
  std::map<int, DecodeParts> decode_parts_;
  std::unique_ptr<pipeline::ThreadPool> pool_;
  std::unique_ptr<pipeline::ThreadPool> io_pool_;  // io stages (reads); joined before pool_
  // Opens submitted jobs' sources (folder scans, lists, tar indexes) off the control thread;
  // joined with the others. Its tasks hold no reference to the registry.
  std::unique_ptr<pipeline::ThreadPool> prepare_pool_;
  // The node-wide cache of source indexes (one scan per dataset for all its jobs), given to the
  // registry; its Prepare tasks share ownership, so it outlives every one of them.
  std::shared_ptr<io::SourceIndexCache> index_cache_;
  std::unique_ptr<jobs::JobRegistry> registry_;
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::steady_timer stats_timer_;
  ops::Notifier notifier_;
  boost::asio::steady_timer notify_timer_;
  boost::asio::steady_timer drain_timer_;
  boost::asio::steady_timer poison_timer_;
  std::unique_ptr<server::ControlServer> server_;
  std::unique_ptr<ops::MetricsServer> metrics_;  // null when metrics_port is 0
  // io thread only.
  uint64_t last_samples_ = 0;  // samples total and time of the previous notify tick (samples/s)
  std::chrono::steady_clock::time_point last_tick_{};
  bool draining_ = false;
  std::set<int> poisoned_logged_;  // GPUs whose poisoning was logged
  // exit_on_gpu_poison: when each poisoned GPU was first seen so (the exit waits, bounded, for the
  // trainers still holding its device memory: kGpuPoisonExitWait).
  std::map<int, std::chrono::steady_clock::time_point> poisoned_since_;
  int exit_code_ = 0;
  std::string drain_reason_;
  std::chrono::steady_clock::time_point drain_deadline_{};
  bool shut_down_ = false;
};

}  // namespace spdl
