#include "proto/job_stats_fields.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <cctype>
#include <cstdio>

namespace spdl::proto {
namespace {

constexpr unsigned kAll = kMetrics | kSpdlctl | kClient;

// In proto order. Rates (samples_per_s) are not exported to Prometheus: it derives them from the
// counters. Live-only figures (batches_ready, batches_filling) are 0 once the job has ended, so the
// final stats the client gets leave them out.
constexpr JobStatField kFields[] = {
    {"samples", "spdld_job_samples_total", "counter", "samples", "Samples delivered into batches.", kAll | kText,
     nullptr, "SAMPLES"},
    {"batches", "spdld_job_batches_total", "counter", "batches", "Batches filled.", kAll},
    {"skipped", "spdld_job_skipped_total", "counter", "samples", "Bad samples skipped and replaced (on_error: skip).",
     kAll},
    {"seconds", "spdld_job_age_seconds", "gauge", "seconds", "Seconds since the job was accepted.", kAll},
    {"first_batch_seconds", "spdld_job_first_batch_seconds", "gauge", "seconds",
     "Seconds from acceptance to the first batch.", kAll},
    // Exported as the client-wait histogram's sum.
    {"client_wait_seconds", "spdld_client_wait_seconds_sum", "histogram", "seconds",
     "The client's total wait for data, as it last reported it.", kAll | kText, nullptr, "WAIT_S"},
    {"batches_ready", "spdld_job_batches_ready", "gauge", "batches", "Batches filled and waiting for the client.",
     kMetrics | kSpdlctl | kText, nullptr, "READY"},
    {"batches_filling", "spdld_job_batches_filling", "gauge", "batches", "Batches being filled by the pipeline.",
     kMetrics | kSpdlctl},
    {"samples_per_s", "", "gauge", "1/s", "Delivered samples per second over the job's life.",
     kSpdlctl | kClient | kText, nullptr, "SAMPLES/S"},
    {"window_samples_per_s", "", "gauge", "1/s", "Samples written per second over the recent window (about 10 s).",
     kSpdlctl | kClient},
    {"samples_failed", "spdld_job_samples_failed_total", "counter", "samples",
     "Samples that failed in some stage (skipped or fatal).", kAll},
    {"samples_tried", "spdld_job_samples_tried_total", "counter", "samples",
     "Samples that went through the stages, good or bad.", kAll},
    {"weight", "spdld_job_weight", "gauge", "1", "The job's share of the node's pools.", kAll},
    {"cache_hits", "spdld_job_cache_hits_total", "counter", "reads",
     "The job's sample reads served from the node's sample cache.", kAll},
    {"cache_misses", "spdld_job_cache_misses_total", "counter", "reads",
     "The job's sample reads that went to the file or URL.", kAll},
    // Node-wide figures, the same in every job's stats: exported once, without job labels.
    {"cache_evictions", "spdld_cache_evictions_total", "counter", "entries", "Entries evicted from the sample cache.",
     kAll},
    {"cache_bytes", "spdld_cache_bytes", "gauge", "bytes", "Bytes held by the node's sample cache.", kAll},
    {"cache_budget_bytes", "spdld_cache_budget_bytes", "gauge", "bytes", "The sample cache's budget (cache_bytes).",
     kAll},
    {"share_members", "spdld_job_share_members", "gauge", "jobs", "Members of the job's share group (0: not shared).",
     kAll},
    {"share_group_job_id", "", "gauge", "1", "The job id of the share group's one pipeline.", kSpdlctl | kClient},
    {"client_wait_histogram", "spdld_client_wait_seconds", "histogram", "seconds",
     "The client's wait for data, per batch released.", kMetrics | kSpdlctl},
    {"s3_requests", "spdld_job_s3_requests_total", "counter", "requests",
     "Requests the job sent to object storage (every attempt).", kAll},
    {"s3_retries", "spdld_job_s3_retries_total", "counter", "requests",
     "Object storage attempts that repeated a failed one.", kAll},
    {"s3_errors_4xx", "spdld_job_s3_errors_4xx_total", "counter", "requests",
     "Object storage attempts answered 4xx other than 429 (denied, missing, changed).", kAll},
    {"s3_errors_5xx", "spdld_job_s3_errors_5xx_total", "counter", "requests",
     "Object storage attempts answered 5xx or 429.", kAll},
    {"s3_errors_network", "spdld_job_s3_errors_network_total", "counter", "requests",
     "Object storage attempts without an answer (connection, timeout, cut or stalled transfer).", kAll},
    {"s3_fetched_bytes", "spdld_job_s3_fetched_bytes_total", "counter", "bytes",
     "Body bytes the job received from object storage.", kAll},
    {"shard_cache_hits", "spdld_job_shard_cache_hits_total", "counter", "shards",
     "Shards the job opened that the node's shard cache held or was already fetching.", kAll},
    {"shard_cache_misses", "spdld_job_shard_cache_misses_total", "counter", "shards",
     "Shards whose download the job started.", kAll},
    // Node-wide: exported once, without job labels, while a job runs with the shard cache on.
    {"shard_cache_bytes", "spdld_shard_cache_bytes", "gauge", "bytes", "Bytes held by the node's shard cache.", kAll},
    {"shard_cache_budget_bytes", "spdld_shard_cache_budget_bytes", "gauge", "bytes",
     "The shard cache's budget (cache_dir_bytes).", kAll},
    {"shard_cache_evictions", "spdld_shard_cache_evictions_total", "counter", "shards",
     "Shards evicted from the shard cache for its budget.", kAll},
    {"shard_cache_corrupt", "spdld_shard_cache_corrupt_total", "counter", "shards",
     "Cached shards that failed their check on reuse (dropped and fetched again).", kAll},
    {"shard_cache_fetched_bytes", "spdld_shard_cache_fetched_bytes_total", "counter", "bytes",
     "Bytes the shard cache's downloads received.", kAll},
    {"source_samples", "spdld_job_source_samples_total", "counter", "samples",
     "Samples delivered per source of a mix (label source: its index in the job's sources).", kAll, "source"},
    {"decoded_cache_samples", "spdld_job_decoded_cache_samples", "gauge", "samples",
     "Samples held in the job's cache of decoded, shrunk images (cache.decoded).", kAll},
    {"decoded_cache_bytes", "spdld_job_decoded_cache_bytes", "gauge", "bytes",
     "Bytes held in the job's cache of decoded, shrunk images.", kAll},
    {"decoded_cache_hits", "spdld_job_decoded_cache_hits_total", "counter", "reads",
     "Sample reads served from the job's decoded cache: decodes avoided.", kAll},
    {"decoded_cache_refused", "spdld_job_decoded_cache_refused_total", "counter", "samples",
     "Samples decoded but not cached: over cache.decoded.max_bytes or the memory budget.", kAll},
    {"decoded_cache_shrinks", "spdld_job_decoded_cache_shrinks_total", "counter", "samples",
     "Samples decoded and shrunk on their way into the decoded cache.", kAll},
    {"gpu_decode_batches", "spdld_job_gpu_decode_batches_total", "counter", "batches",
     "Batches decoded on the GPU (decode.device: cuda).", kAll},
    {"gpu_decoded", "spdld_job_gpu_decoded_total", "counter", "samples", "Samples nvJPEG decoded on the GPU.", kAll},
    {"gpu_decode_fallbacks", "spdld_job_gpu_decode_fallbacks_total", "counter", "samples",
     "Samples of a GPU decode job decoded on the CPU instead (all reasons).", kAll},
    {"gpu_decode_fallback_header", "spdld_job_gpu_decode_fallback_header_total", "counter", "samples",
     "CPU fallbacks because nvJPEG refused the header (not a JPEG it reads, e.g. PNG).", kAll},
    {"gpu_decode_fallback_unsupported", "spdld_job_gpu_decode_fallback_unsupported_total", "counter", "samples",
     "CPU fallbacks for CMYK / YCCK JPEGs, sides over the decoder's limit, or plans the GPU lacks.", kAll},
    {"gpu_decode_fallback_decode", "spdld_job_gpu_decode_fallback_decode_total", "counter", "samples",
     "CPU fallbacks because nvJPEG failed on the image itself (progressive, corrupt).", kAll},
    {"gpu_decode_batch_retries", "spdld_job_gpu_decode_batch_retries_total", "counter", "batches",
     "GPU decode batches nvJPEG failed as a whole, retried image by image.", kAll},
    {"gpu_decode_failed", "spdld_job_gpu_decode_failed_total", "counter", "samples",
     "Samples of a GPU decode job that failed on the CPU path too (handled per on_error).", kAll},
};

// In proto order; only counters and occupancy go to Prometheus (it derives rates and quantiles).
// The client's final stats carry every figure but the live ones (queue_length, running: 0 once the
// job has ended) and the histogram (spdlctl --json and the metrics have it).
constexpr unsigned kStageAll = kMetrics | kSpdlctl | kClient;
constexpr unsigned kStageReport = kSpdlctl | kClient;
constexpr JobStatField kStageFields[] = {
    {"tasks", "spdld_stage_tasks_total", "counter", "tasks", "Tasks run by the stage.", kStageAll},
    {"failures", "spdld_stage_failures_total", "counter", "tasks", "Tasks of the stage that failed.", kStageAll},
    {"busy_seconds", "spdld_stage_busy_seconds_total", "counter", "seconds", "Worker time spent in the stage.",
     kStageAll},
    {"concurrency", "", "gauge", "tasks", "The job's limit of tasks at once in the stage (0: the pool's).",
     kStageReport},
    {"queue_capacity", "spdld_stage_queue_capacity", "gauge", "rows",
     "Bound of the queue in front of the stage (0: bounded by the slot ring).", kStageAll},
    {"queue_length", "spdld_stage_queue_length", "gauge", "rows",
     "Rows waiting in the queue in front of the stage (occupancy).", kMetrics | kSpdlctl},
    {"running", "spdld_stage_running", "gauge", "tasks", "Tasks of the stage running now.", kMetrics | kSpdlctl},
    {"avg_ms", "", "gauge", "ms", "Mean task time over the job's life.", kStageReport},
    {"p50_ms", "", "gauge", "ms", "Median task time over the job's life.", kStageReport},
    {"p90_ms", "", "gauge", "ms", "90th percentile of the task time over the job's life.", kStageReport},
    {"p99_ms", "", "gauge", "ms", "99th percentile of the task time over the job's life.", kStageReport},
    {"put_wait_seconds", "spdld_stage_put_wait_seconds_total", "counter", "seconds",
     "Time rows done here waited for room downstream.", kStageAll},
    {"get_wait_seconds", "spdld_stage_queue_wait_seconds_total", "counter", "seconds",
     "Time rows waited in the stage's queue.", kStageAll},
    {"items_per_s", "", "gauge", "1/s", "Tasks per second over the job's life.", kStageReport},
    {"window_seconds", "", "gauge", "seconds", "Length of the recent window the window_* figures cover.", kStageReport},
    {"window_tasks", "", "gauge", "tasks", "Tasks run in the recent window.", kStageReport},
    {"window_failures", "", "gauge", "tasks", "Tasks that failed in the recent window.", kStageReport},
    {"window_avg_ms", "", "gauge", "ms", "Mean task time in the recent window.", kStageReport},
    {"window_p50_ms", "", "gauge", "ms", "Median task time in the recent window.", kStageReport},
    {"window_p90_ms", "", "gauge", "ms", "90th percentile of the task time in the recent window.", kStageReport},
    {"window_p99_ms", "", "gauge", "ms", "99th percentile of the task time in the recent window.", kStageReport},
    {"window_put_wait_seconds", "", "gauge", "seconds", "Put wait in the recent window.", kStageReport},
    {"window_get_wait_seconds", "", "gauge", "seconds", "Queue wait in the recent window.", kStageReport},
    {"window_items_per_s", "", "gauge", "1/s", "Tasks per second in the recent window.", kStageReport},
    {"task_histogram", "spdld_stage_task_seconds", "histogram", "seconds", "Task times of the stage.",
     kMetrics | kSpdlctl},
};

// In proto order. daemon_version is spdld_build_info's label; the lists are not rows.
constexpr unsigned kDaemonAll = kMetrics | kSpdlctl | kText;
constexpr JobStatField kDaemonFields[] = {
    {"uptime_seconds", "spdld_uptime_seconds", "gauge", "seconds", "Seconds since spdld started.", kDaemonAll},
    {"worker_threads", "spdld_worker_threads", "gauge", "threads", "Decode/transform worker threads.", kDaemonAll},
    {"memory_budget_bytes", "spdld_memory_budget_bytes", "gauge", "bytes", "Shared-memory budget for all jobs.",
     kDaemonAll},
    {"memory_in_use_bytes", "spdld_memory_in_use_bytes", "gauge", "bytes", "Shared memory held by live jobs.",
     kDaemonAll},
    {"live_jobs", "spdld_jobs", "gauge", "jobs", "Live jobs (all users).", kDaemonAll},
    {"source_index_scans", "spdld_source_index_scans_total", "counter", "scans",
     "Dataset index scans run by the node's source index cache (folder scans, list parses, tar header scans).",
     kDaemonAll},
    {"source_index_shared", "spdld_source_index_shared_total", "counter", "opens",
     "Job opens that shared a dataset index (live or being scanned) instead of scanning again.", kDaemonAll},
    {"gpu_leaked_device_bytes", "spdld_gpu_leaked_device_bytes", "gauge", "bytes",
     "Device memory GPU jobs could not free (copies never drained); not returned to the device budget.", kDaemonAll},
};

// In proto order. `source` (text) is the last column of `spdlctl jobs`, `stats` the JobStats table.
constexpr unsigned kSummaryText = kSpdlctl | kText;
constexpr JobStatField kSummaryFields[] = {
    {"job_id", "", "gauge", "1", "The job's id (the label job_id of its series).", kSummaryText, nullptr, "JOB"},
    {"uid", "", "gauge", "uid", "The uid of the job's client (the label uid of its series).", kSummaryText, nullptr,
     "UID"},
    {"pid", "", "gauge", "pid", "The process id of the job's client.", kSummaryText, nullptr, "PID"},
    {"rank", "", "gauge", "1", "The client's rank in the job's world (the label rank of its series).", kSummaryText,
     nullptr, "RANK"},
    {"world_size", "", "gauge", "ranks", "Ranks in the job's world.", kSummaryText, nullptr, "WORLD"},
    {"epochs", "", "gauge", "epochs", "Epochs the client asked the job for.", kSummaryText, nullptr, "EPOCHS"},
    {"region_bytes", "spdld_job_memory_bytes", "gauge", "bytes", "Shared memory held by the job's slots.",
     kMetrics | kSpdlctl},
};

// In proto order. `name` is the label `stream`, `groups` the stream-group table.
constexpr unsigned kStreamAll = kMetrics | kSpdlctl | kText;
constexpr JobStatField kStreamFields[] = {
    {"owner_uid", "", "gauge", "uid", "The uid that defined the stream (it, allowed_uids and root may use it).",
     kSpdlctl | kText, nullptr, "OWNER"},
    {"max_samples", "spdld_stream_max_samples", "gauge", "samples", "A stream's bound on retained samples.", kStreamAll,
     nullptr, "MAX"},
    {"max_bytes", "spdld_stream_max_bytes", "gauge", "bytes", "A stream's bound on retained bytes.", kStreamAll,
     nullptr, "MAX_BYTES"},
    {"head_offset", "", "gauge", "offset", "The oldest offset the stream retains.", kSpdlctl},
    {"tail_offset", "spdld_stream_put_samples_total", "counter", "samples", "Samples put into a stream.", kStreamAll,
     nullptr, "PUT"},
    {"retained_samples", "spdld_stream_retained_samples", "gauge", "samples",
     "Samples a stream retains (not yet consumed by every group).", kStreamAll, nullptr, "RETAINED"},
    {"retained_bytes", "spdld_stream_retained_bytes", "gauge", "bytes", "Bytes a stream retains (data + metadata).",
     kStreamAll, nullptr, "BYTES"},
    {"put_bytes", "spdld_stream_put_bytes_total", "counter", "bytes", "Sample bytes put into a stream.",
     kMetrics | kSpdlctl},
    {"evicted", "spdld_stream_evicted_samples_total", "counter", "samples",
     "Consumed samples a stream dropped to make room.", kStreamAll, nullptr, "EVICTED"},
    {"blocked_puts", "spdld_stream_blocked_puts_total", "counter", "puts",
     "Puts that found a stream full (they waited or failed).", kStreamAll, nullptr, "BLOCKED"},
    {"producers", "spdld_stream_producers", "gauge", "producers", "Producers attached to a stream.", kStreamAll,
     nullptr, "PROD"},
    {"closed", "", "gauge", "1", "Whether the stream is closed (its consumers drain it and end).", kSpdlctl | kText,
     nullptr, "CLOSED"},
};

// In proto order. `name` is the label `group`.
constexpr JobStatField kStreamGroupFields[] = {
    {"consumers", "spdld_stream_group_consumers", "gauge", "consumers", "Consumers (stream jobs) of a group.",
     kStreamAll},
    {"lag", "spdld_stream_group_lag_samples", "gauge", "samples",
     "Samples put and not yet acknowledged by a consumer group.", kStreamAll},
    {"in_flight", "spdld_stream_group_in_flight_samples", "gauge", "samples",
     "Samples a group's consumers hold unacknowledged.", kStreamAll},
    {"redeliver", "", "gauge", "samples", "Samples waiting to be handed out again (their consumer left).",
     kSpdlctl | kText},
    {"delivered", "", "counter", "samples", "Samples handed out to the group's consumers, redeliveries included.",
     kSpdlctl | kText},
    {"redelivered", "spdld_stream_group_redelivered_samples_total", "counter", "samples",
     "Samples handed out again after their consumer left unacknowledged.", kStreamAll},
    {"next_offset", "", "gauge", "offset", "The next fresh offset the group hands out.", kSpdlctl},
};

// In proto order. `device` is the label `device`; `error` (text) the status alert of a poisoned GPU.
constexpr JobStatField kGpuDeviceFields[] = {
    {"poisoned", "spdld_gpu_device_poisoned", "gauge", "1",
     "1 when a sticky CUDA error poisoned spdld's context on the GPU (jobs there fail; spdld restarts).",
     kMetrics | kSpdlctl | kText},
    {"jobs", "", "gauge", "jobs", "Copy: daemon jobs still holding device memory on the GPU.", kSpdlctl | kText},
};

// A scalar number field of `m` by name, as a double; 0 for anything else.
double ScalarValue(const google::protobuf::Message& m, const char* name) {
  const google::protobuf::FieldDescriptor* d = m.GetDescriptor()->FindFieldByName(name);
  if (d == nullptr || d->is_repeated()) return 0;
  const google::protobuf::Reflection* r = m.GetReflection();
  switch (d->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
      return static_cast<double>(r->GetUInt64(m, d));
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT32:
      return r->GetUInt32(m, d);
    case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
      return static_cast<double>(r->GetInt64(m, d));
    case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
      return r->GetInt32(m, d);
    case google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE:
      return r->GetDouble(m, d);
    case google::protobuf::FieldDescriptor::CPPTYPE_FLOAT:
      return r->GetFloat(m, d);
    case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(m, d) ? 1 : 0;
    default:
      return 0;
  }
}

const JobStatField* Find(std::span<const JobStatField> table, std::string_view name) {
  for (const JobStatField& f : table) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

}  // namespace

double StatValue(const google::protobuf::Message& m, const JobStatField& f) { return ScalarValue(m, f.name); }

bool StatIsInteger(const google::protobuf::Message& m, const JobStatField& f) {
  const google::protobuf::FieldDescriptor* d = m.GetDescriptor()->FindFieldByName(f.name);
  if (d == nullptr) return false;
  switch (d->cpp_type()) {
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT64:
    case google::protobuf::FieldDescriptor::CPPTYPE_UINT32:
    case google::protobuf::FieldDescriptor::CPPTYPE_INT64:
    case google::protobuf::FieldDescriptor::CPPTYPE_INT32:
    case google::protobuf::FieldDescriptor::CPPTYPE_BOOL:
      return true;
    default:
      return false;
  }
}

bool StatIsBool(const google::protobuf::Message& m, const JobStatField& f) {
  const google::protobuf::FieldDescriptor* d = m.GetDescriptor()->FindFieldByName(f.name);
  return d != nullptr && !d->is_repeated() && d->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL;
}

std::string StatText(const google::protobuf::Message& m, const JobStatField& f) {
  const double v = StatValue(m, f);
  if (StatIsBool(m, f)) return v != 0 ? "yes" : "no";
  char b[48];
  if (StatIsInteger(m, f) && v < 0) {
    std::snprintf(b, sizeof(b), "%lld", static_cast<long long>(v));
  } else if (StatIsInteger(m, f)) {
    std::snprintf(b, sizeof(b), "%llu", static_cast<unsigned long long>(v));
  } else {
    std::snprintf(b, sizeof(b), std::string_view(f.unit) == "seconds" ? "%.2f" : "%.1f", v);
  }
  return b;
}

std::string StatColumn(const JobStatField& f) {
  if (f.column != nullptr) return f.column;
  std::string out = f.name;
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

std::span<const JobStatField> JobSummaryFields() { return kSummaryFields; }

const JobStatField* FindJobSummaryField(std::string_view name) { return Find(kSummaryFields, name); }

std::span<const JobStatField> StreamStatFields() { return kStreamFields; }

const JobStatField* FindStreamStatField(std::string_view name) { return Find(kStreamFields, name); }

std::span<const JobStatField> StreamGroupStatFields() { return kStreamGroupFields; }

const JobStatField* FindStreamGroupStatField(std::string_view name) { return Find(kStreamGroupFields, name); }

std::span<const JobStatField> GpuDeviceStatFields() { return kGpuDeviceFields; }

const JobStatField* FindGpuDeviceStatField(std::string_view name) { return Find(kGpuDeviceFields, name); }

std::span<const JobStatField> StageStatFields() { return kStageFields; }

const JobStatField* FindStageStatField(std::string_view name) { return Find(kStageFields, name); }

double StageStatValue(const StageStats& stats, const JobStatField& f) { return ScalarValue(stats, f.name); }

std::span<const JobStatField> DaemonStatFields() { return kDaemonFields; }

const JobStatField* FindDaemonStatField(std::string_view name) { return Find(kDaemonFields, name); }

double DaemonStatValue(const DaemonStatus& status, const JobStatField& f) { return ScalarValue(status, f.name); }

std::span<const JobStatField> JobStatFields() { return kFields; }

const JobStatField* FindJobStatField(std::string_view name) { return Find(kFields, name); }

double JobStatValue(const JobStats& stats, const JobStatField& f) { return ScalarValue(stats, f.name); }

std::vector<double> StatValues(const google::protobuf::Message& m, const JobStatField& f) {
  std::vector<double> out;
  if (f.per == nullptr) return out;
  const google::protobuf::FieldDescriptor* d = m.GetDescriptor()->FindFieldByName(f.name);
  if (d == nullptr || !d->is_repeated() || d->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_UINT64) {
    return out;
  }
  const google::protobuf::Reflection* r = m.GetReflection();
  for (int i = 0; i < r->FieldSize(m, d); ++i) out.push_back(static_cast<double>(r->GetRepeatedUInt64(m, d, i)));
  return out;
}

std::vector<double> JobStatValues(const JobStats& stats, const JobStatField& f) { return StatValues(stats, f); }

bool JobStatIsInteger(const JobStatField& f) { return StatIsInteger(JobStats::default_instance(), f); }

}  // namespace spdl::proto
