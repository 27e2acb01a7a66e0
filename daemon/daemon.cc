#include "daemon.h"

#include <grp.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/errno_text.h"
#if SPDL_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif
#if SPDL_HAVE_NVJPEG
#include "cuda/image_kernels.h"
#include "cuda/nvjpeg_backend.h"
#endif
#if SPDL_TEST_HOOKS
#include "cuda/fake_nvjpeg.h"
#include "cuda/shm_fake_backend.h"
#endif
#include "io/fs_identity.h"
#include "io/source_index_cache.h"
#include "jobs/job_registry.h"
#include "media/ffmpeg_log.h"
#include "ops/listen_fds.h"
#include "ops/startup_checks.h"
#include "pipeline/thread_pool.h"
#include "plugins/op_loader.h"
#include "server/control_server.h"

namespace spdl {
namespace {

using Clock = std::chrono::steady_clock;

// Threads that open submitted jobs' sources. They mostly wait on the disk (folder scans, tar
// headers), so there are several: a few huge datasets being opened at once do not hold up the
// Submits of everyone else (a ninth waits until one of eight is done).
constexpr int kPrepareThreads = 8;

#if SPDL_TEST_HOOKS
// Tests only: while the file this names does not exist (at most 60 s), opening the source of a job
// whose config_name starts with "gated" waits, so an end-to-end test can check that the daemon serves others meanwhile.
constexpr const char* kOpenGateEnv = "SPDLD_TEST_OPEN_GATE";
// Tests only: N > 0 makes the decode stage of jobs whose config_name starts with "throwing" throw
// std::runtime_error for every sample whose index is a multiple of N (tests/e2e/task_exception_test.cc).
constexpr const char* kThrowInDecodeEnv = "SPDLD_TEST_THROW_IN_DECODE";
#endif

// Runs one start-up step and logs how long it took.
template <typename F>
Status Step(const char* name, F&& f) {
  auto t0 = Clock::now();
  Status s = f();
  auto ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  if (s.ok()) {
    spdlog::debug("start-up: {} ({:.1f} ms)", name, ms);
  } else {
    spdlog::error("start-up: {} failed: {}", name, s.message());
  }
  return s.WithPrefix(name);
}

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return "[" + out + "]";
}

}  // namespace

Daemon::Daemon(config::DaemonConfig config, ConfigLoader loader, std::string config_name)
    : config_(std::move(config)),
      loader_(std::move(loader)),
      config_name_(std::move(config_name)),
      signals_(io_),
      stats_timer_(io_),
      notify_timer_(io_),
      drain_timer_(io_),
      poison_timer_(io_) {}

Daemon::~Daemon() { Shutdown(); }

Status Daemon::Start() {
  // Each check logs every problem it finds (with what to do) and fails on the fatal ones.
  auto report = [](const ops::CheckReport& r) -> Status {
    for (const auto& n : r.notes) spdlog::info("start-up: {}", n);
    for (const auto& w : r.warnings) spdlog::warn("start-up: {}", w);
    for (const auto& e : r.errors) spdlog::error("start-up: {}", e);
    if (r.ok()) return Status::Ok();
    return FailedPrecondition(r.errors.size() == 1 ? r.errors[0]
                                                   : std::to_string(r.errors.size()) + " problems (above)");
  };
  SPDL_RETURN_IF_ERROR(Step("check the memory for the shared-memory budget", [&] {
    return report(ops::CheckMemoryBudget(config_.memory_budget_bytes, ops::ReadMemoryFacts()));
  }));
  SPDL_RETURN_IF_ERROR(
      Step("check the allowed data roots", [&] { return report(ops::CheckAllowedRoots(config_.allowed_roots)); }));
  SPDL_RETURN_IF_ERROR(Step("check the plugin directories", [&] {
    // Not fatal: a job asking for an op there is refused with the same reason.
    if (config_.plugin_dirs.empty()) spdlog::info("start-up: no plugin_dirs: op transforms are disabled");
    for (const std::string& p : plugins::OpLoader(config_.plugin_dirs).CheckDirs()) {
      spdlog::warn("start-up: {} (jobs asking for ops from it are refused)", p);
    }
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("check whose rights reads use", [&] {
    // Every job's files are opened with its user's rights (io/fs_identity.h).
    const io::SwitchSupport& s = io::ProbeSwitchSupport();
    if (s.can_switch) {
      spdlog::info("start-up: jobs read their files with their user's rights (fsuid, fsgid and groups per thread)");
    } else {
      spdlog::warn(
          "start-up: {}: it cannot read files with another user's rights, so it serves jobs of uid {} and "
          "root only (grant AmbientCapabilities=CAP_SETUID CAP_SETGID in the unit, or run it as root)",
          s.why_not, io::DaemonFsIdentity().uid);
    }
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("raise the descriptor limit", [&] {
    // Data reads must always find a descriptor: the soft limit goes up to the hard one, and the
    // control server caps its connections well below it (server/control_server.h).
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      const rlim_t was = lim.rlim_cur;
      lim.rlim_cur = lim.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &lim) == 0) {
        spdlog::info("start-up: descriptor limit raised from {} to {}", was, lim.rlim_cur);
      } else {
        spdlog::warn("start-up: cannot raise the descriptor limit from {}: {}", was, ErrnoText(errno));
      }
    }
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("route FFmpeg's log into spdlog", [&] {
    media::RouteFfmpegLogToSpdlog();  // before any decoding thread starts
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("start the worker pool", [&] {
    pool_ = std::make_unique<pipeline::ThreadPool>(config_.worker_threads);
    io_pool_ = std::make_unique<pipeline::ThreadPool>(config_.io_threads);
    prepare_pool_ = std::make_unique<pipeline::ThreadPool>(kPrepareThreads);
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("create the job registry", [&] {
    registry_ = std::make_unique<jobs::JobRegistry>(config_, pool_.get(), pool_->size(), io_pool_.get());
    index_cache_ = std::make_shared<io::SourceIndexCache>();
    registry_->SetSourceIndexCache(index_cache_);
    registry_->SetScheduler([this](Clock::duration delay, std::function<void()> fn) {
      auto timer = std::make_shared<boost::asio::steady_timer>(io_, delay);
      timer->async_wait([timer, fn = std::move(fn)](const boost::system::error_code& ec) {
        if (!ec) fn();
      });
    });
#if SPDL_TEST_HOOKS
    uint64_t n = 0;  // every nth sample throws
    if (const char* every = std::getenv(kThrowInDecodeEnv);
        every != nullptr && std::from_chars(every, every + std::strlen(every), n).ec == std::errc() && n > 0) {
      spdlog::warn("{} is set: the decode stage of jobs named throwing* throws for every {}th sample (a test seam)",
                   kThrowInDecodeEnv, n);
      registry_->SetStageHookForTests([n](const proto::SubmitJob& req) -> std::function<void(uint32_t, uint64_t)> {
        if (req.config_name().rfind("throwing", 0) != 0) return {};
        return [n](uint32_t stage, uint64_t index) {
          if (stage == 1 && index % n == 0) {
            throw std::runtime_error("test seam: decode threw for sample " + std::to_string(index));
          }
        };
      });
    }
    if (const char* gate = std::getenv(kOpenGateEnv); gate != nullptr && *gate != '\0') {
      spdlog::warn("{} is set: sources of jobs named gated* open only once {} exists (a test seam)", kOpenGateEnv,
                   gate);
      registry_->SetPrepareHookForTests([path = std::string(gate)](const proto::SubmitJob& req) {
        if (req.config_name().rfind("gated", 0) != 0) return;
        const auto deadline = Clock::now() + std::chrono::seconds(60);
        while (::access(path.c_str(), F_OK) != 0 && Clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      });
    }
    if (!fake_gpu_dir_.empty()) {
      spdlog::warn(
          "TEST ONLY: --test-only-fake-gpu {}: GPU jobs run on a FAKE device made of files in that "
          "directory; no GPU is used. Never run a production spdld like this.",
          fake_gpu_dir_);
      registry_->SetDeviceBackends([this](int device) -> Result<cuda::DeviceBackend*> {
        std::lock_guard lock(device_backends_mu_);  // Prepare tasks (several threads) and Start
        if (auto it = device_backends_.find(device); it != device_backends_.end()) return it->second.get();
        SPDL_ASSIGN_OR_RETURN(auto backend, cuda::ShmFakeBackend::Create(fake_gpu_dir_, device));
        spdlog::warn("TEST ONLY: cuda:{} is a fake device in {} (--test-only-fake-gpu)", device, fake_gpu_dir_);
        return (device_backends_[device] = std::move(backend)).get();
      });
      registry_->SetGpuDecodeParts([this](int device, cuda::DeviceBackend* backend) -> Result<jobs::GpuDecodeParts> {
        std::lock_guard lock(device_backends_mu_);
        DecodeParts& parts = decode_parts_[device];
        if (!parts.jpeg) {
          parts.jpeg = std::make_unique<cuda::FakeNvjpeg>(*backend);
          parts.kernels = std::make_unique<cuda::FakeImageKernels>(*backend);
          spdlog::warn("TEST ONLY: GPU decode on cuda:{} is a fake nvJPEG (libjpeg-turbo on the host)", device);
        }
        return jobs::GpuDecodeParts{backend, parts.jpeg.get(), parts.kernels.get()};
      });
      registry_->SetDeviceFinder([this](const cuda::DeviceUuid& uuid) -> Result<int> {
        const int n = cuda::ShmFakeBackend::VisibleCount();
        for (int i = 0; i < n; ++i) {
          SPDL_ASSIGN_OR_RETURN(auto backend, cuda::ShmFakeBackend::Create(fake_gpu_dir_, i));
          SPDL_ASSIGN_OR_RETURN(cuda::DeviceUuid u, backend->Uuid());
          if (u == uuid) return i;
        }
        return NotFound("spdld sees " + std::to_string(n) + " fake device(s), none with UUID " +
                        cuda::FormatUuid(uuid));
      });
      return Status::Ok();
    }
#endif  // SPDL_TEST_HOOKS
#if SPDL_HAVE_CUDA
    registry_->SetDeviceBackends([this](int device) -> Result<cuda::DeviceBackend*> {
      // Called by Prepare tasks (the prepare pool's threads: a context is made off the control
      // thread) and by Start.
      std::lock_guard lock(device_backends_mu_);
      if (auto it = device_backends_.find(device); it != device_backends_.end()) return it->second.get();
      std::string why;
      const int count = cuda::CudaDeviceCount(&why);
      if (device >= count) {
        return Status(StatusCode::kUnavailable, "spdld sees " + std::to_string(count) + " CUDA device(s)" +
                                                    (why.empty() ? "" : " (" + why + ")") +
                                                    ", so it has no cuda:" + std::to_string(device));
      }
      cuda::CudaBackend::Options o;
      o.device = device;
      o.require_ipc = true;  // copy: daemon only: CUDA IPC with the trainer
      o.report_teardown_error = [](const Status& s) { spdlog::error("GPU teardown: {}", s.message()); };
      SPDL_ASSIGN_OR_RETURN(auto backend, cuda::CudaBackend::Create(std::move(o)));
      spdlog::info("GPU delivery on cuda:{} ready", device);
      return (device_backends_[device] = std::move(backend)).get();
    });
    registry_->SetDeviceFinder([](const cuda::DeviceUuid& uuid) { return cuda::FindCudaDevice(uuid); });
#if SPDL_HAVE_NVJPEG
    registry_->SetGpuDecodeParts([this](int device, cuda::DeviceBackend* backend) -> Result<jobs::GpuDecodeParts> {
      // Called from a job's GPU setup (off the control thread): loading nvJPEG takes a while.
      std::lock_guard lock(device_backends_mu_);
      DecodeParts& parts = decode_parts_[device];
      if (!parts.jpeg) {
        cuda::NvjpegBackend::Options o;
        o.device = device;
        SPDL_ASSIGN_OR_RETURN(parts.jpeg, cuda::NvjpegBackend::Create(std::move(o)));
        parts.kernels = std::make_unique<cuda::CudaImageKernels>(device);
        spdlog::info("GPU JPEG decode on cuda:{} ready ({})", device,
                     parts.jpeg->hardware() ? "hardware decoder" : "CUDA decoder");
      }
      return jobs::GpuDecodeParts{backend, parts.jpeg.get(), parts.kernels.get()};
    });
#endif
#endif
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("handle SIGTERM, SIGINT and SIGHUP", [&] {
    std::signal(SIGPIPE, SIG_IGN);
    signals_.add(SIGTERM);
    signals_.add(SIGINT);
    signals_.add(SIGHUP);
    WaitForSignal();
    return Status::Ok();
  }));
  bool inherited_socket = false;  // socket activation: the service manager owns the socket file
  SPDL_RETURN_IF_ERROR(Step("open the control socket", [&]() -> Status {
    server::ServerOptions so;
    so.socket_path = config_.socket_path;
    so.socket_mode = config_.socket_mode;
    so.socket_group = config_.socket_group;
    so.max_frame_bytes = config_.max_frame_bytes;
    // Shared-node limits; the connection cap stays well below the descriptor limit.
    rlimit nofile{};
    size_t cap = static_cast<size_t>(config_.max_connections);
    if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY) {
      const size_t quarter = std::max<size_t>(16, static_cast<size_t>(nofile.rlim_cur / 4));
      if (quarter < cap) {
        spdlog::warn(
            "start-up: max_connections {} lowered to {}: a quarter of the descriptor limit {} (raise "
            "LimitNOFILE= in the unit)",
            cap, quarter, static_cast<uint64_t>(nofile.rlim_cur));
        cap = quarter;
      }
    }
    so.max_connections = cap;
    so.max_connections_per_uid = static_cast<size_t>(config_.max_connections_per_uid);
    so.hello_timeout = std::chrono::seconds(config_.hello_timeout_seconds);
    so.frame_timeout = std::chrono::seconds(config_.frame_timeout_seconds);
    so.max_reply_backlog_bytes = config_.max_reply_backlog_bytes;
    so.backlog_timeout = std::chrono::seconds(config_.backlog_timeout_seconds);
    // Socket activation: systemd (spdld.socket) or systemd-socket-activate made the socket.
    SPDL_ASSIGN_OR_RETURN(std::optional<int> passed, ops::TakeListenFd());
    if (passed) {
      Result<std::string> bound = ops::CheckListeningUnixSocket(*passed);
      if (!bound.ok()) {
        ::close(*passed);
        return Status(bound.status().code(), "socket activation: " + bound.status().message());
      }
      if (*bound != config_.socket_path) {
        spdlog::warn(
            "socket activation: the passed socket is bound to '{}', not to socket_path '{}'; "
            "using the passed one",
            *bound, config_.socket_path);
      }
      spdlog::info("control socket inherited from the service manager (socket activation): {}", *bound);
      so.inherited_fd = *passed;
      inherited_socket = true;
    } else {
      spdlog::info("creating the control socket {} (no socket passed by a service manager)", config_.socket_path);
    }
    server_ = std::make_unique<server::ControlServer>(&io_, registry_.get(), so, prepare_pool_.get());
    server_->control().admin_uid = ::geteuid();
    server_->control().request_drain = [this](const jobs::PeerInfo& by, uint32_t seconds) {
      return BeginDrain("spdlctl drain by uid " + std::to_string(by.uid), seconds);
    };
    return server_->Start();
  }));
  if (!config_.socket_group.empty() && !inherited_socket) {  // an inherited one: SocketGroup=
    SPDL_RETURN_IF_ERROR(Step("give the socket to its group", [&]() -> Status {
      std::vector<char> buf(16384);
      group gr{};
      group* found = nullptr;
      if (::getgrnam_r(config_.socket_group.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || !found) {
        return NotFound("socket_group '" + config_.socket_group + "' is not a group on this machine (getent group)");
      }
      if (::chown(config_.socket_path.c_str(), static_cast<uid_t>(-1), found->gr_gid) != 0) {
        return ErrnoStatus("chown " + config_.socket_path + " to group " + config_.socket_group, errno);
      }
      return Status::Ok();
    }));
  }
  if (config_.metrics_port != 0) {
    SPDL_RETURN_IF_ERROR(Step("serve metrics", [&] {
      metrics_ = std::make_unique<ops::MetricsServer>(&io_, [this](std::optional<uid_t> uid) {
        // Each user sees their own jobs (root all of them); a scrape whose owner is unknown, only
        // the daemon-wide figures.
        jobs::PeerInfo asker;
        asker.uid = uid.value_or(0);
        proto::DaemonStatus status = registry_->Status(asker);
        if (!uid) status.clear_jobs();
        return ops::RenderPrometheus(status, ops::DaemonFacts{draining_});
      });
      SPDL_RETURN_IF_ERROR(metrics_->Start(config_.metrics_bind, static_cast<uint16_t>(config_.metrics_port)));
      spdlog::info("metrics on http://{}/metrics", metrics_->endpoint());
      return Status::Ok();
    }));
  }
  ScheduleStatsLog();
  notifier_.Ready();
  last_tick_ = Clock::now();
  ScheduleNotifyTick();
  ScheduleGpuPoisonCheck();
  spdlog::info("spdld ready on {} with {} worker threads, memory budget {} MiB", config_.socket_path, pool_->size(),
               config_.memory_budget_bytes >> 20);
  return Status::Ok();
}

void Daemon::WaitForSignal() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;  // operation_aborted: shutting down
    if (sig == SIGHUP) {
      Reload();
    } else if (!draining_) {
      BeginDrain(sig == SIGTERM ? "SIGTERM" : "SIGINT", 0);
    } else {
      spdlog::warn("signal {} while draining: stopping now, cancelling {} running jobs", sig,
                   server_ ? server_->running_jobs() : 0);
      Stop();
      return;
    }
    WaitForSignal();
  });
}

void Daemon::Reload() {
  if (!loader_) {
    spdlog::info("SIGHUP: started without --config, nothing to reload");
    return;
  }
  notifier_.Reloading();
  config::DaemonConfigResult r = loader_();
  if (!r.config) {
    for (const auto& e : r.errors) {
      spdlog::error("reload: {}", config::FormatConfigErrors({e}, config_name_));
    }
    spdlog::error("reload: {} errors in {}; keeping the running config", r.errors.size(), config_name_);
    notifier_.Ready();
    return;
  }
  config::DaemonConfig next = *r.config;
  int changes = 0;
  auto note = [&](const char* key, const auto& from, const auto& to) {
    if (from == to) return;
    ++changes;
    spdlog::info("reload: {} {} -> {}", key, from, to);
  };
  auto restart_only = [&](const char* key, const auto& from, const auto& to) {
    if (from == to) return;
    spdlog::warn("reload: {} changed ({} -> {}) but takes effect only when spdld restarts", key, from, to);
  };
  note("log_level", config_.log_level, next.log_level);
  note("memory_budget_bytes", config_.memory_budget_bytes, next.memory_budget_bytes);
  note("gpu_context_bytes", config_.gpu_context_bytes, next.gpu_context_bytes);
  note("exit_on_gpu_poison", config_.exit_on_gpu_poison, next.exit_on_gpu_poison);
  note("max_jobs_per_client", config_.max_jobs_per_client, next.max_jobs_per_client);
  note("max_slots_per_job", config_.max_slots_per_job, next.max_slots_per_job);
  note("allowed_roots", Join(config_.allowed_roots), Join(next.allowed_roots));
  note("allowed_url_prefixes", Join(config_.allowed_url_prefixes), Join(next.allowed_url_prefixes));
  note("worker_threads", config_.worker_threads, next.worker_threads);
  note("io_threads", config_.io_threads, next.io_threads);
  note("stats_log_seconds", config_.stats_log_seconds, next.stats_log_seconds);
  note("drain_seconds", config_.drain_seconds, next.drain_seconds);
  restart_only("socket_path", config_.socket_path, next.socket_path);
  restart_only("socket_mode", config_.socket_mode, next.socket_mode);
  restart_only("socket_group", config_.socket_group, next.socket_group);
  restart_only("max_frame_bytes", config_.max_frame_bytes, next.max_frame_bytes);
  restart_only("metrics_port", config_.metrics_port, next.metrics_port);
  restart_only("plugin_dirs", Join(config_.plugin_dirs), Join(next.plugin_dirs));
  restart_only("metrics_bind", config_.metrics_bind, next.metrics_bind);
  // Keep what only a restart changes, so status and later reloads report what really runs.
  next.socket_path = config_.socket_path;
  next.socket_mode = config_.socket_mode;
  next.socket_group = config_.socket_group;
  next.max_frame_bytes = config_.max_frame_bytes;
  next.metrics_port = config_.metrics_port;
  next.plugin_dirs = config_.plugin_dirs;
  next.metrics_bind = config_.metrics_bind;

  spdlog::set_level(spdlog::level::from_str(next.log_level));
  // Resizing waits for removed threads to finish the task they run (milliseconds); jobs go on.
  if (next.worker_threads != config_.worker_threads) pool_->SetThreads(next.worker_threads);
  if (next.io_threads != config_.io_threads) io_pool_->SetThreads(next.io_threads);
  registry_->UpdateLimits(next, pool_->size());
  const bool restart_stats_log = next.stats_log_seconds != config_.stats_log_seconds;
  config_ = std::move(next);
  if (restart_stats_log) {
    stats_timer_.cancel();
    ScheduleStatsLog();
  }
  spdlog::info("reload: {} applied ({} changes); running jobs untouched", config_name_, changes);
  notifier_.Ready();
}

proto::Draining Daemon::BeginDrain(const std::string& reason, uint32_t seconds) {
  const auto now = Clock::now();
  if (!draining_) {
    draining_ = true;
    drain_reason_ = reason;
    drain_deadline_ = now + std::chrono::seconds(seconds != 0 ? seconds : static_cast<uint32_t>(config_.drain_seconds));
  }
  proto::Draining notice;
  notice.set_deadline_seconds(std::max(0.0, std::chrono::duration<double>(drain_deadline_ - now).count()));
  notice.set_live_jobs(static_cast<uint32_t>(registry_->live_jobs()));
  notice.set_reason(drain_reason_);
  if (server_ && !server_->control().draining) {
    spdlog::info("draining ({}): no new jobs; {} jobs running are told; exiting when they end or in {:.0f} s",
                 drain_reason_, notice.live_jobs(), notice.deadline_seconds());
    notifier_.Stopping();
    notifier_.SetStatus(fmt::format("draining ({}): {} jobs left", drain_reason_, notice.live_jobs()));
    server_->Drain(notice);
    ScheduleDrainCheck();
  }
  return notice;
}

void Daemon::ScheduleDrainCheck() {
  // Checked right away, then every 50 ms: an idle daemon exits at once.
  const int jobs = registry_->live_jobs();
  if (jobs == 0) {
    spdlog::info("drained: no job left; exiting");
    Stop();
    return;
  }
  if (Clock::now() >= drain_deadline_) {
    spdlog::warn("drain deadline passed with {} jobs still running; cancelling them and exiting", jobs);
    Stop();
    return;
  }
  drain_timer_.expires_after(std::chrono::milliseconds(50));
  drain_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) ScheduleDrainCheck();
  });
}

void Daemon::ScheduleStatsLog() {
  if (config_.stats_log_seconds <= 0) return;
  stats_timer_.expires_after(std::chrono::seconds(config_.stats_log_seconds));
  stats_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;       // operation_aborted: shutting down or the interval changed
    jobs::PeerInfo root;  // uid 0: every job
    const proto::DaemonStatus status = registry_->Status(root);
    for (const auto& j : status.jobs()) {
      const auto& s = j.stats();
      std::string stages;
      for (const auto& st : s.stages()) {
        stages += fmt::format(" {} {:.2f}ms", st.name(), st.tasks() ? 1e3 * st.busy_seconds() / st.tasks() : 0.0);
      }
      spdlog::info("job {}: {} samples, {:.1f}/s, {} skipped, {} ready, client waited {:.1f}s;{}", j.job_id(),
                   s.samples(), s.seconds() > 0 ? s.samples() / s.seconds() : 0.0, s.skipped(), s.batches_ready(),
                   s.client_wait_seconds(), stages);
    }
    ScheduleStatsLog();
  });
}

void Daemon::ScheduleNotifyTick() {
  if (!notifier_.enabled()) return;
  // STATUS every 2 s; with a watchdog, at half its interval when that is shorter.
  std::chrono::microseconds period = std::chrono::seconds(2);
  if (notifier_.watchdog_interval().count() > 0) period = std::min(period, notifier_.watchdog_interval() / 2);
  notify_timer_.expires_after(period);
  notify_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // operation_aborted: shutting down
    if (notifier_.watchdog_interval().count() > 0) notifier_.Watchdog();
    jobs::PeerInfo root;  // uid 0: every job
    const proto::DaemonStatus status = registry_->Status(root);
    uint64_t samples = 0;
    for (const auto& j : status.jobs()) samples += j.stats().samples();
    const auto now = Clock::now();
    const double dt = std::chrono::duration<double>(now - last_tick_).count();
    // Jobs that ended take their samples with them: count only growth.
    const double rate = dt > 0 && samples > last_samples_ ? (samples - last_samples_) / dt : 0.0;
    last_samples_ = samples;
    last_tick_ = now;
    if (draining_) {
      notifier_.SetStatus(
          fmt::format("draining ({}): {} jobs left, {:.0f} samples/s", drain_reason_, status.live_jobs(), rate));
    } else {
      notifier_.SetStatus(fmt::format("{} jobs, {:.0f} samples/s, {} MiB of {} MiB shared memory in use",
                                      status.live_jobs(), rate, status.memory_in_use_bytes() >> 20,
                                      status.memory_budget_bytes() >> 20));
    }
    ScheduleNotifyTick();
  });
}

void Daemon::ScheduleGpuPoisonCheck() {
  poison_timer_.expires_after(std::chrono::milliseconds(500));
  poison_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // operation_aborted: shutting down
    for (const jobs::JobRegistry::GpuDeviceState& d : registry_->GpuDevices()) {
      if (d.poisoned.empty()) continue;
      if (poisoned_logged_.insert(d.device).second) {
        spdlog::error("cuda:{} is poisoned ({}): its jobs fail and new ones are refused until spdld restarts; {}",
                      d.device, d.poisoned,
                      config_.exit_on_gpu_poison ? "spdld exits once no job holds it (exit_on_gpu_poison)"
                                                 : "exit_on_gpu_poison is off: restart spdld to use it again");
      }
      // A job holds the GPU until its trainer has closed its IPC mapping of the job's device memory
      // (or its connection ended): exiting earlier would pull the memory from under the trainer's
      // tensors. A trainer that never lets go delays the restart only so long.
      const auto since = poisoned_since_.try_emplace(d.device, std::chrono::steady_clock::now()).first->second;
      const bool waited_out = std::chrono::steady_clock::now() - since >= kGpuPoisonExitWait;
      if (config_.exit_on_gpu_poison && (d.jobs == 0 || waited_out)) {
        if (d.jobs > 0) {
          spdlog::critical(
              "cuda:{} is poisoned and {} job(s) still hold it after {} s: exiting anyway (their "
              "trainers' device memory goes with spdld)",
              d.device, d.jobs, std::chrono::duration_cast<std::chrono::seconds>(kGpuPoisonExitWait).count());
        }
        spdlog::critical(
            "cuda:{} is poisoned{}: exiting with status {} for the service manager to "
            "restart spdld (exit_on_gpu_poison)",
            d.device, d.jobs == 0 ? " and no job holds it" : "", kExitGpuPoisoned);
        exit_code_ = kExitGpuPoisoned;
        notifier_.Stopping();
        Stop();
        return;
      }
    }
    ScheduleGpuPoisonCheck();
  });
}

void Daemon::Run() { io_.run(); }

void Daemon::Stop() {
  boost::asio::post(io_, [this] {
    if (server_) server_->Stop();
    if (metrics_) metrics_->Stop();
    boost::system::error_code ec;
    (void)signals_.cancel(ec);  // shutting down: nothing to do about a failure
    stats_timer_.cancel();
    notify_timer_.cancel();
    drain_timer_.cancel();
    poison_timer_.cancel();
    io_.stop();
  });
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  notifier_.Stopping();
  metrics_.reset();
  if (server_) server_->Stop();  // sessions closed, jobs cancelled, socket file removed
  server_.reset();
  if (prepare_pool_) prepare_pool_->Join();  // sources being opened: their results are dropped
  if (io_pool_) io_pool_->Join();            // in-flight rows end (the jobs are cancelled: no new tasks)
  if (pool_) pool_->Join();                  // ...the last ones destroy their jobs
  if (registry_ && registry_->live_jobs() != 0) spdlog::error("{} jobs still alive at exit", registry_->live_jobs());
  registry_.reset();
  pool_.reset();
  io_pool_.reset();
  prepare_pool_.reset();
  spdlog::info("spdld stopped");
}

}  // namespace spdl
