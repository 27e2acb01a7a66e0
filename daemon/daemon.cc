#include "daemon.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <csignal>
#include <filesystem>

#include "jobs/job_registry.h"
#include "pipeline/thread_pool.h"
#include "server/control_server.h"

namespace spdl {
namespace {

// Runs one start-up step and logs how long it took.
template <typename F>
Status Step(const char* name, F&& f) {
  auto t0 = std::chrono::steady_clock::now();
  Status s = f();
  auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (s.ok()) {
    spdlog::debug("start-up: {} ({:.1f} ms)", name, ms);
  } else {
    spdlog::error("start-up: {} failed: {}", name, s.message());
  }
  return s.WithPrefix(name);
}

}  // namespace

Daemon::Daemon(config::DaemonConfig config) : config_(std::move(config)), signals_(io_), stats_timer_(io_) {}

Daemon::~Daemon() { Shutdown(); }

Status Daemon::Start() {
  SPDL_RETURN_IF_ERROR(Step("check allowed data roots", [&] {
    if (config_.allowed_roots.empty()) {
      spdlog::warn("no allowed_roots configured: every job will be refused (set allowed_roots or --allow-root)");
    }
    for (const auto& root : config_.allowed_roots) {
      std::error_code ec;
      if (!std::filesystem::is_directory(root, ec)) spdlog::warn("allowed root {} is not a directory", root);
    }
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("start the worker pool", [&] {
    pool_ = std::make_unique<pipeline::ThreadPool>(config_.worker_threads);
    io_pool_ = std::make_unique<pipeline::ThreadPool>(config_.io_threads);
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("create the job registry", [&] {
    registry_ = std::make_unique<jobs::JobRegistry>(config_, pool_.get(), pool_->size(), io_pool_.get());
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("handle SIGTERM and SIGINT", [&] {
    std::signal(SIGPIPE, SIG_IGN);
    signals_.add(SIGTERM);
    signals_.add(SIGINT);
    signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      spdlog::info("signal {}: shutting down", sig);
      Stop();
    });
    return Status::Ok();
  }));
  SPDL_RETURN_IF_ERROR(Step("open the control socket", [&] {
    server::ServerOptions so;
    so.socket_path = config_.socket_path;
    so.socket_mode = config_.socket_mode;
    so.socket_group = config_.socket_group;
    so.max_frame_bytes = config_.max_frame_bytes;
    server_ = std::make_unique<server::ControlServer>(&io_, registry_.get(), so);
    return server_->Start();
  }));
  ScheduleStatsLog();
  spdlog::info("spdld ready on {} with {} worker threads, memory budget {} MiB", config_.socket_path, pool_->size(),
               config_.memory_budget_bytes >> 20);
  return Status::Ok();
}

void Daemon::ScheduleStatsLog() {
  if (config_.stats_log_seconds <= 0) return;
  stats_timer_.expires_after(std::chrono::seconds(config_.stats_log_seconds));
  stats_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;  // operation_aborted: shutting down
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

void Daemon::Run() { io_.run(); }

void Daemon::Stop() {
  boost::asio::post(io_, [this] {
    if (server_) server_->Stop();
    boost::system::error_code ec;
    signals_.cancel(ec);
    stats_timer_.cancel();
    io_.stop();
  });
}

void Daemon::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (server_) server_->Stop();  // sessions closed, jobs cancelled, socket file removed
  server_.reset();
  if (io_pool_) io_pool_->Join();  // in-flight rows end (the jobs are cancelled: no new tasks)
  if (pool_) pool_->Join();        // ...the last ones destroy their jobs
  if (registry_ && registry_->live_jobs() != 0) spdlog::error("{} jobs still alive at exit", registry_->live_jobs());
  registry_.reset();
  pool_.reset();
  io_pool_.reset();
  spdlog::info("spdld stopped");
}

}  // namespace spdl
