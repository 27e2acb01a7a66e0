// The job statistics, described once: one row per field of proto::JobStats (control.proto) with its
// Prometheus name, type, unit and help, and the surfaces that show it. The surfaces are filled from
// this table by field name (protobuf reflection: JobStatValue), not copied field by field:
//   kMetrics   the daemon's /metrics endpoint (daemon/ops/metrics.cc: one series per job)
//   kSpdlctl   `spdlctl --json status|jobs|stats` (the proto as JSON: every field, always)
//   kClient    the job's final stats in the client library (client::JobStats::values), and from
//              there Python's Loader.stats() (key `values`) and `spdl-client --json` (`daemon`)
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

struct JobStatField {
  const char* name;    // the proto::JobStats field
  const char* metric;  // the Prometheus name ("" when kMetrics is not among the surfaces): spdld_job_* a
                       // series per job, spdld_cache_* one node-wide series; a histogram's family
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
// every field except `name` and `kind` (the series' labels), in proto order; `task_histogram` is
// the stage's histogram (its sum: busy_seconds). Surfaces: kMetrics (spdld_stage_*, one series per
// job and stage) and kSpdlctl (the proto as JSON). The client's StageStats and Python's stage dicts
// are still typed by hand (CODING.md). REQUIRES for StageStatValue: f comes from StageStatFields().
std::span<const JobStatField> StageStatFields();
const JobStatField* FindStageStatField(std::string_view name);
double StageStatValue(const StageStats& stats, const JobStatField& f);

}  // namespace spdl::proto
