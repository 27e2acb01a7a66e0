// The statistics, described once: one row per field of proto::JobStats, StageStats, DaemonStatus,
// JobSummary, StreamStatus, StreamGroupStatus and GpuDeviceStatus (control.proto) with its
// Prometheus name, type, unit and help, and the surfaces that show it. Seven tables, one row type
// (JobStatField): JobStatFields(), StageStatFields(), DaemonStatFields(), JobSummaryFields(),
// StreamStatFields(), StreamGroupStatFields(), GpuDeviceStatFields(). The surfaces are filled from
// these tables by field name (protobuf reflection: StatValue), not copied field by field:
//   kMetrics   the daemon's /metrics endpoint (daemon/ops/metrics.cc: job and job-summary rows a
//              series per job, stage rows a series per job and stage, daemon rows one series,
//              stream rows a series per stream, stream-group rows per stream and group, GPU rows
//              per device)
//   kSpdlctl   `spdlctl --json status|jobs|stats|streams` (the proto as JSON: every field, always)
//   kText      spdlctl's text for people, generated from the rows (client/control.h): daemon rows
//              the `spdlctl status` lines (OperatorStatusText), GPU rows its line per GPU; job-summary
//              rows and the job rows that have it the `spdlctl jobs` columns (OperatorJobsText);
//              stream rows the `spdlctl streams` columns, stream-group rows its line per group
//              (OperatorStreamsText). The `spdlctl stats` text is a layout chosen for people (not a
//              surface of the rows).
//   kClient    the client library: a job row in the job's final stats (client::JobStats::values),
//              and from there Python's Loader.stats() (key `values`) and `spdl-client --json`
//              (`daemon`); a stage row in each stage of them (client::StageStats::values, Python's
//              stats()["stages"][i] by name). Only job and stage rows have it (clients do not ask
//              for the daemon's status).
// Python's `spdl_client._spdl_client.stat_fields()` lists every table.
// tests/unit/stats_fields_test.cc checks that every proto field has a row (but the labels, texts and
// lists each table leaves out by design), and that every surface a row names shows it. A new stats
// field: the proto field, then its row here (CODING.md).
//
// Plain constant data and pure functions: safe from any thread.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "proto/control.pb.h"

namespace spdl::proto {

enum StatSurface : unsigned {
  kMetrics = 1u << 0,
  kSpdlctl = 1u << 1,
  kClient = 1u << 2,
  kText = 1u << 3,
};

// One row of a table (every table shares this type).
struct JobStatField {
  const char* name;    // the field of the table's message (proto::JobStats, StageStats, DaemonStatus, ...)
  const char* metric;  // the Prometheus name ("" when kMetrics is not among the surfaces): spdld_job_* a
                       // series per job, spdld_cache_* one node-wide series; a histogram's family;
                       // spdld_stage_* (stage rows); spdld_stream_* (stream rows, label stream),
                       // spdld_stream_group_* (labels stream, group), spdld_gpu_device_* (label
                       // device); any other spdld_* (daemon rows) one series
  const char* type;    // "counter", "gauge" or "histogram" (the client-wait histogram and its sum)
  const char* unit;    // "samples", "batches", "seconds", "bytes", "1/s", "entries", "jobs", ...
  const char* help;
  unsigned surfaces;  // StatSurface bits
  // A repeated count (one value per entry: JobStatValues): the label naming the entry's index in
  // the metrics ("source": source="0", "1", ...) and in the client's values (NAME.0, NAME.1, ...);
  // nullptr for a scalar field or the histogram.
  const char* per = nullptr;
  // kText rows shown as a table column (`spdlctl jobs`, `spdlctl streams`): the column's header;
  // nullptr: the name in capitals. Lines of names and values (`spdlctl status`) use the name.
  const char* column = nullptr;
};

// A kText row's column header: `column`, or the name in capitals.
std::string StatColumn(const JobStatField& f);

// Every field of proto::JobStats except `stages` (per-stage rows have their own table in
// daemon/ops/metrics.cc), in proto order.
std::span<const JobStatField> JobStatFields();

// The row for `name`; nullptr if none.
const JobStatField* FindJobStatField(std::string_view name);

// The value of a scalar field `f` of `stats` as a double (numbers of any width). 0 for a field
// that is not a scalar number (the histogram). REQUIRES: f comes from JobStatFields().
double JobStatValue(const JobStats& stats, const JobStatField& f);

// The values of a repeated count `f` (f.per set) of `stats`, one per entry; empty for any other field.
// REQUIRES: f comes from JobStatFields().
std::vector<double> JobStatValues(const JobStats& stats, const JobStatField& f);

// Whether `f` is an integer field (a count, an id): printed without a fraction.
bool JobStatIsInteger(const JobStatField& f);

// The per-stage statistics (proto::StageStats, one row per stage of a job) described the same way:
// every field except `name` and `kind` (the series' and the client's labels), in proto order;
// `task_histogram` is the stage's histogram (its sum: busy_seconds). Surfaces: kMetrics
// (spdld_stage_*, one series per job and stage), kSpdlctl (the proto as JSON), kClient (each of the
// client's StageStats::values, hence Python's stage dicts). REQUIRES for StageStatValue: f comes
// from StageStatFields().
std::span<const JobStatField> StageStatFields();
const JobStatField* FindStageStatField(std::string_view name);
double StageStatValue(const StageStats& stats, const JobStatField& f);

// The daemon's own figures (proto::DaemonStatus): every field except `daemon_version` (the label of
// spdld_build_info) and the lists (`jobs`, `gpu_devices`, `streams`: their entries have tables of
// their own), in proto order. Surfaces: kMetrics (one series, no labels), kSpdlctl (the proto as
// JSON) and kText (the `spdlctl status` lines). REQUIRES for DaemonStatValue: f comes from
// DaemonStatFields().
std::span<const JobStatField> DaemonStatFields();
const JobStatField* FindDaemonStatField(std::string_view name);
double DaemonStatValue(const DaemonStatus& status, const JobStatField& f);

// JobSummary's own fields (the job's identity and its shared memory): every field except `source`
// (text: the last column of `spdlctl jobs`) and `stats` (the JobStats table), in proto order.
// job_id, uid and rank also label every job series of the metrics (job_id, uid, rank), job_id the
// stage series. Surfaces: kSpdlctl (the proto as JSON), kText (`spdlctl jobs` columns), kMetrics.
// REQUIRES for the Value functions: f comes from the table they read.
std::span<const JobStatField> JobSummaryFields();
const JobStatField* FindJobSummaryField(std::string_view name);

// A stream (proto::StreamStatus): every field except `name` (the label `stream`) and `groups`
// (StreamGroupStatFields), in proto order. Surfaces: kMetrics (spdld_stream_*{stream}), kSpdlctl,
// kText (`spdlctl streams` columns).
std::span<const JobStatField> StreamStatFields();
const JobStatField* FindStreamStatField(std::string_view name);

// A consumer group of a stream (proto::StreamGroupStatus): every field except `name` (the label
// `group`), in proto order. Surfaces: kMetrics (spdld_stream_group_*{stream,group}), kSpdlctl, kText
// (its line under the stream in `spdlctl streams`).
std::span<const JobStatField> StreamGroupStatFields();
const JobStatField* FindStreamGroupStatField(std::string_view name);

// A GPU of the daemon (proto::GpuDeviceStatus): every field except `device` (the label `device`) and
// `error` (text: the `spdlctl status` alert of a poisoned GPU), in proto order. Surfaces: kMetrics
// (spdld_gpu_device_*{device}), kSpdlctl, kText (its line in `spdlctl status`).
std::span<const JobStatField> GpuDeviceStatFields();
const JobStatField* FindGpuDeviceStatField(std::string_view name);

// Any table's row on its message, by name: the value of scalar number field `f.name` of `m` as a
// double (a bool: 0 or 1; 0 when `m` has no such scalar number or bool field), and whether it is an
// integer field (printed without a fraction; a bool is one). REQUIRES: `f` is a row of the table describing `m`'s type.
double StatValue(const google::protobuf::Message& m, const JobStatField& f);
bool StatIsInteger(const google::protobuf::Message& m, const JobStatField& f);
// The values of a repeated count row `f` (f.per set) of `m`, one per entry; empty for any other row.
std::vector<double> StatValues(const google::protobuf::Message& m, const JobStatField& f);
// Whether row `f` of `m` is a bool field (text: "yes" / "no"; metrics: 1 / 0).
bool StatIsBool(const google::protobuf::Message& m, const JobStatField& f);
// Row `f` of `m` as spdlctl's tables write it: a bool "yes" / "no", an integer without a fraction,
// seconds with 2 decimals, any other number with 1.
std::string StatText(const google::protobuf::Message& m, const JobStatField& f);

}  // namespace spdl::proto
