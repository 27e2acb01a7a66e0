// The statistics, described once: one row per field of proto::JobStats, proto::StageStats and
// proto::DaemonStatus (control.proto) with its Prometheus name, type, unit and help, and the surfaces
// that show it. Three tables, one row type (JobStatField): JobStatFields(), StageStatFields(),
// DaemonStatFields(). The surfaces are filled from these tables by field name (protobuf
// reflection: StatValue), not copied field by field:
//   kMetrics   the daemon's /metrics endpoint (daemon/ops/metrics.cc: job rows a series per job,
//              stage rows a series per job and stage, daemon rows one series)
//   kSpdlctl   `spdlctl --json status|jobs|stats` (the proto as JSON: every field, always); for
//              DaemonStatus rows also the `spdlctl status` text (client::OperatorStatusText)
//   kClient    the client library: a job row in the job's final stats (client::JobStats::values),
//              and from there Python's Loader.stats() (key `values`) and `spdl-client --json`
//              (`daemon`); a stage row in each stage of them (client::StageStats::values, Python's
//              stats()["stages"][i] by name). No DaemonStatus row has it (clients do not ask
//              for the daemon's status).
// tests/unit/stats_fields_test.cc checks that every proto field has a row, and that every surface
// a row names shows it. A new stats field: the proto field, then its row here (CODING.md).
//
// Plain constant data and pure functions: safe from any thread.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "proto/control.pb.h"

namespace spdl::proto {

enum StatSurface : unsigned {
  kMetrics = 1u << 0,
  kSpdlctl = 1u << 1,
  kClient = 1u << 2,
};

// One row of a table (the job, stage and daemon tables share this type).
struct JobStatField {
  const char* name;    // the field of the table's message (proto::JobStats, StageStats, DaemonStatus)
  const char* metric;  // the Prometheus name ("" when kMetrics is not among the surfaces): spdld_job_* a
                       // series per job, spdld_cache_* one node-wide series; a histogram's family;
                       // spdld_stage_* (stage rows); any other spdld_* (daemon rows) one series
  const char* type;    // "counter", "gauge" or "histogram" (the client-wait histogram and its sum)
  const char* unit;    // "samples", "batches", "seconds", "bytes", "1/s", "entries", "jobs", ...
  const char* help;
  unsigned surfaces;  // StatSurface bits
  // A repeated count (one value per entry: JobStatValues): the label naming the entry's index in
  // the metrics ("source": source="0", "1", ...) and in the client's values (NAME.0, NAME.1, ...);
  // nullptr for a scalar field or the histogram.
  const char* per = nullptr;
};

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
// spdld_build_info) and the lists (`jobs`, `gpu_devices`, `streams`: their entries are described
// or rendered on their own), in proto order. Surfaces: kMetrics (one series, no labels) and kSpdlctl
// (the proto as JSON, and the `spdlctl status` text). REQUIRES for DaemonStatValue: f comes from
// DaemonStatFields().
std::span<const JobStatField> DaemonStatFields();
const JobStatField* FindDaemonStatField(std::string_view name);
double DaemonStatValue(const DaemonStatus& status, const JobStatField& f);

// Any table's row on its message, by name: the value of scalar number field `f.name` of `m` as a
// double (0 when `m` has no such scalar number field), and whether it is an integer field (printed
// without a fraction). REQUIRES: `f` is a row of the table describing `m`'s type.
double StatValue(const google::protobuf::Message& m, const JobStatField& f);
bool StatIsInteger(const google::protobuf::Message& m, const JobStatField& f);
// The values of a repeated count row `f` (f.per set) of `m`, one per entry; empty for any other row.
std::vector<double> StatValues(const google::protobuf::Message& m, const JobStatField& f);

}  // namespace spdl::proto
