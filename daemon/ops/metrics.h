// Prometheus metrics: the registry's status (proto DaemonStatus / JobSummary / JobStats /
// StageStats) as Prometheus text exposition (format 0.0.4), served over HTTP (daemon config
// metrics_bind:metrics_port; port 0 = off; bind 127.0.0.1 by default, 0.0.0.0 for a pod's IP) with
// Boost.Beast on the daemon's io_context. Names follow Prometheus conventions: base units (seconds,
// bytes), counters end in _total, latencies are histograms (aggregatable across jobs and nodes),
// and the per-job label is job_id (a `job` label would clash with the scrape job's).
//
// Exported families (labels: job_id, uid, rank on job series; job_id, stage on stage series):
//   spdld_build_info{version} (gauge, 1), spdld_uptime_seconds, spdld_worker_threads,
//   spdld_memory_budget_bytes, spdld_memory_in_use_bytes, spdld_jobs, spdld_draining,
//   spdld_gpu_leaked_device_bytes (device memory a hung GPU kept; not returned to the budget)   (gauges)
//   spdld_source_index_{scans,shared}_total (the node's source index cache)            (counters)
//   spdld_gpu_device_poisoned{device} (1: a sticky CUDA error poisoned that GPU for spdld)     (gauge)
//   spdld_cache_bytes, spdld_cache_budget_bytes (gauges), spdld_cache_evictions_total   (node-wide
//     sample cache; present while a job runs, the figures are node-wide)
//   spdld_shard_cache_{bytes,budget_bytes} (gauges), spdld_shard_cache_{evictions,corrupt,
//     fetched_bytes}_total (the node's shard cache, cache_dir; present while a job runs with it on)
//   spdld_job_s3_{requests,retries,errors_4xx,errors_5xx,errors_network,fetched_bytes}_total,
//   spdld_job_shard_cache_{hits,misses}_total                                         (counters)
//   spdld_job_{samples,batches,skipped,samples_tried,samples_failed}_total,
//   spdld_job_cache_{hits,misses}_total                                                 (counters)
//   spdld_job_{age,first_batch}_seconds, spdld_job_batches_{ready,filling},
//   spdld_job_weight, spdld_job_share_members, spdld_job_memory_bytes                   (gauges)
//   spdld_client_wait_seconds{job_id,uid,rank} (histogram: the client's wait per Release)
//   spdld_stage_{tasks,failures}_total, spdld_stage_busy_seconds_total,
//   spdld_stage_{queue,put}_wait_seconds_total                                          (counters)
//   spdld_stage_queue_length, spdld_stage_queue_capacity, spdld_stage_running          (gauges)
//   spdld_stage_task_seconds{job_id,stage} (histogram: task times)
//   spdld_stream_{retained_samples,retained_bytes,max_samples,max_bytes,producers}{stream} (gauges),
//   spdld_stream_{put_samples,put_bytes,evicted_samples,blocked_puts}_total{stream}   (counters)
//   spdld_stream_group_{lag_samples,consumers,in_flight_samples}{stream,group} (gauges),
//   spdld_stream_group_redelivered_samples_total{stream,group}                          (counter)
// Every series but spdld_build_info and spdld_draining comes from the statistics' one description,
// proto/job_stats_fields.h (DaemonStatus, JobSummary, JobStats, StageStats, GpuDeviceStatus,
// StreamStatus, StreamGroupStatus rows, by field name): a new field is a row there, no line here.
//
// RenderPrometheus is a pure function. MetricsServer is not thread-safe: it runs on the one
// io_context thread it is given; handlers never throw.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/log_limiter.h"
#include "common/status.h"
#include "proto/control.pb.h"

namespace spdl::ops {

// Daemon-wide facts that are not in DaemonStatus.
struct DaemonFacts {
  bool draining = false;
};

// The text exposition of `status` (every job in it; pass the root view for all users').
std::string RenderPrometheus(const proto::DaemonStatus& status, const DaemonFacts& facts = {});

// The uid that owns the local TCP connection whose end is `peer` and whose other end is `local`
// (both on this host), from the kernel's socket table (/proc/net/tcp, tcp6; `proc_root` for tests):
// how a loopback scrape learns who asks. nullopt when no such socket is listed.
std::optional<uid_t> LoopbackPeerUid(const boost::asio::ip::tcp::endpoint& local,
                                     const boost::asio::ip::tcp::endpoint& peer,
                                     const std::string& proc_root = "/proc");

class MetricsServer {
 public:
  // `render` produces the body of each scrape for the uid that asks (the owner of the scraping
  // socket: root sees every job, another uid its own jobs only, an unknown one none; a scraper on
  // another host, let in by metrics_bind, is given uid 0: every job), on the io
  // thread. *io must outlive this object.
  MetricsServer(boost::asio::io_context* io, std::function<std::string(std::optional<uid_t>)> render);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds `address`:`port` (an IPv4 or IPv6 literal; port 0 = any free one) and starts serving
  // GET /metrics (anything else: 404; not GET: 405). kUnavailable when the port is taken or the
  // address is not this machine's; kInvalidArgument when `address` is not an address.
  Status Start(const std::string& address, uint16_t port);
  // Stops accepting; connections in flight finish on their own.
  void Stop();
  uint16_t port() const { return port_; }
  // "127.0.0.1:9464" or "[::1]:9464" once started.
  std::string endpoint() const { return endpoint_; }

 private:
  void Accept();

  const std::function<std::string(std::optional<uid_t>)> render_;
  boost::asio::ip::tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::string endpoint_;
  bool stopped_ = false;
  LogLimiter log_limiter_;
};

}  // namespace spdl::ops
