// DaemonConfig: the settings of spdld itself (socket, threads, memory budget, which directories
// jobs may read, limits). Parsed from /etc/spdld/spdld.yaml or the file given on the command line
// (see config/spdld.yaml for every key, commented).
//
// Plain values with defaults; safe to copy and hand between threads. ParseDaemonConfig and
// ParseByteSize are pure functions; LoadDaemonConfig reads one file. None of them throws.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "config/config_error.h"
#include "config/override.h"

namespace spdl::config {

struct DaemonConfig {
  std::string socket_path = "/run/spdld/spdld.sock";  // control socket; absolute, < 108 bytes
  int socket_mode = 0660;                             // permission bits of the socket file, 0..0777 (YAML:
                                                      // "0660" — a leading 0 means octal — or decimal 432)
  std::string socket_group;                           // group of the socket file, a name or a number;
                                                      // empty = the daemon's own group
  int worker_threads = 0;                             // decode/transform threads; 0 = one per core; 0..1024
  int io_threads = 16;                                // threads of the I/O pool (file reads), shared by all
                                                      // jobs, so I/O waits never hold a worker; 1..1024
  uint64_t memory_budget_bytes = 4ull << 30;          // all jobs' shared slots together, >= 1MiB (YAML:
                                                      // 4GiB, 512MiB, 1G or plain bytes)
  uint64_t device_memory_budget_bytes = 8ull << 30;   // per GPU: the device slots of its cuda jobs
                                                      // (output.device: cuda:N, copy: daemon); a byte size
  uint64_t gpu_context_bytes = 500ull << 20;          // per GPU spdld uses: its CUDA context's memory (an
                                                      // estimate), counted in device_memory_budget_bytes
  bool exit_on_gpu_poison = true;                     // a sticky CUDA error poisoned a GPU: exit (code 3, for
                                                      // the service manager to restart spdld) once no job
                                                      // holds it; false: stay up, refusing that GPU's jobs
  std::vector<std::string> allowed_roots;             // absolute directories jobs may read below
                                                      // (empty = refuse every job)
  // URLs http sources may fetch: at or below one of these ("http://host:port/path"; same scheme,
  // host and port, path by whole segments). Empty = refuse every http source (a daemon fetching
  // whatever a client names could be made to reach internal services).
  std::vector<std::string> allowed_url_prefixes;
  std::string log_level = "info";       // trace|debug|info|warn|error|critical|off
  uint32_t max_frame_bytes = 1u << 20;  // largest control message accepted, 1KiB..64MiB
                                        // (YAML: a byte size like memory_budget_bytes)
  int max_jobs_per_client = 8;          // jobs one client uid may hold at once, 1..1024
  int max_slots_per_job = 64;           // most ring slots (prefetch) one job may have, 1..1024
  int stats_log_seconds = 60;           // log a one-line summary per live job this often; 0 = never
  // Operations (see systemd/spdld.service.in).
  int metrics_port = 0;                    // Prometheus /metrics on metrics_bind:PORT; 0 = off
  std::string metrics_bind = "127.0.0.1";  // the address metrics listen on: an IPv4 or IPv6 literal
                                           // (0.0.0.0 = every address, e.g. a pod's IP in Kubernetes)
  int drain_seconds = 20;                  // SIGTERM / spdlctl drain: longest wait for running jobs
                                           // to end before exiting anyway, 0..86400 (0 = at once)
  // Node-wide cache of encoded sample bytes (io/sample_cache.h: LRU, shared by every job, keyed by
  // dataset identity + sample); 0 = off. A byte size like memory_budget_bytes. It assumes datasets
  // do not change on disk while the daemon runs.
  uint64_t cache_bytes = 0;
  // Node-wide cache of remote tar shards on disk (io/shard_cache.h): s3 tar shards are written
  // there once as they stream and served to every job and rank that asks for them (each job first
  // proves with its own credentials that it may read the object). An absolute directory, created
  // with mode 0700 (an existing one must belong to spdld's user); "" = off. cache_dir_bytes: its
  // budget (a byte size; LRU eviction, never a shard being read; default 10GiB). An unusable
  // directory or a full disk leaves the jobs streaming without it (one warning in the log).
  std::string cache_dir;
  uint64_t cache_dir_bytes = uint64_t{10} << 30;
  // User ops (include/spdl/op.h; job config `op:` transforms): the directories op libraries are
  // loaded from, by file name, searched in order. Empty (the default) = ops disabled. Each
  // directory and library must be owned by root or spdld's user and writable by nobody else (checked
  // when a job asks for a library; refused with the reason). Absolute paths without '..'. Read at
  // start-up: a change takes a restart (libraries, once loaded, stay loaded).
  std::vector<std::string> plugin_dirs;

  // ---- Shared-node limits: one user cannot starve or crash the others (README "Security model").
  int max_connections = 1024;                     // control connections at once, all users, 16..65536; also
                                                  // at most a quarter of the descriptor limit, so data reads
                                                  // always find descriptors. More are closed at accept.
  int max_connections_per_uid = 128;              // control connections one uid may hold at once, 1..65536
  int hello_timeout_seconds = 10;                 // a new connection must say Hello within this, 1..3600
  int frame_timeout_seconds = 10;                 // a control message begun must arrive whole within this, 1..3600
  uint64_t max_reply_backlog_bytes = 4ull << 20;  // replies queued for a client that does not read
                                                  // them; over it the daemon stops reading that connection
                                                  // (64KiB..1GiB, a byte size)
  int backlog_timeout_seconds = 10;               // over max_reply_backlog_bytes this long: the connection is
                                                  // closed, 1..3600
  int64_t max_pixels = 178956970;                 // the most pixels an image may have (from its header); a job's
                                                  // decode.max_pixels can only lower it, 1..2^40
  double max_budget_share_per_uid = 0.5;          // while another uid has jobs or waits for memory (refused
                                                  // in the last 60 s), one uid's jobs may hold at most this
                                                  // fraction of memory_budget_bytes, 0.05..1 (1 = no cap)

  bool operator==(const DaemonConfig&) const = default;
};

// The outcome of parsing a daemon config: `config` is set iff `errors` is empty.
struct DaemonConfigResult {
  std::optional<DaemonConfig> config;  // the validated config
  std::vector<ConfigError> errors;     // every problem found, sorted by line (no-line ones last)
};

// Parses and validates a daemon config; `overrides` as for ParseJobConfig.
DaemonConfigResult ParseDaemonConfig(std::string_view yaml_text, const std::vector<Override>& overrides = {});

// Reads the file at `path` and parses it; a file that cannot be read gives one error (line 0,
// empty path, a message naming the file and the reason).
DaemonConfigResult LoadDaemonConfig(const std::string& path, const std::vector<Override>& overrides = {});

// Parses a byte size: plain bytes ("1048576", "1048576B"), or an integer with a binary unit
// K/Ki/KiB, M/Mi/MiB, G/Gi/GiB, T/Ti/TiB (all powers of 1024; "1G" == "1GiB"), optionally with
// spaces between. KB/MB/GB/TB are refused as ambiguous. kInvalidArgument on bad text or overflow.
Result<uint64_t> ParseByteSize(std::string_view text);

}  // namespace spdl::config
