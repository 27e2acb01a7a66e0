// Operator requests to spdld (what spdlctl uses): one request, one answer, on a connection of its
// own. Unlike client.h this header exposes the protobuf messages, since tools print them whole.
// Each call is independent: safe from any thread.
#pragma once

#include <string>

#include "common/status.h"
#include "proto/control.pb.h"
#include "spdl/client.h"

namespace spdl::client {

// Connects, says Hello, sends `request` (e.g. StatusRequest, CancelJob) and returns the answer.
// A daemon Error comes back as a non-OK Status with its message.
Result<proto::DaemonMessage> ControlCall(const std::string& socket_path, const proto::ClientMessage& request,
                                         const std::string& client_name = "spdlctl");

// `m` as spdlctl --json prints it: JSON with the proto's field names, every field present (zeros
// too), indented.
std::string OperatorJson(const google::protobuf::Message& m);

// `spdlctl status` as text: the version, then one line per DaemonStatus figure described for
// spdlctl's text (proto/job_stats_fields.h, kText rows, by name: name, value, unit), the caller's job
// count, a line per GPU (its kText figures by name) and an alert per poisoned GPU. Lines fit 100
// columns (but a GPU's error text).
std::string OperatorStatusText(const proto::DaemonStatus& status);

// `spdlctl jobs` as text: a table with a column per kText row of JobSummaryFields() and of
// JobStatFields() (headers StatColumn, values StatText), then the source: on the row when it fits
// 100 columns, else on a line of its own below it (cut in the middle, "...", past 100 columns).
// "no jobs" when there are none.
std::string OperatorJobsText(const proto::DaemonStatus& status);

// `spdlctl streams` as text: a table with the stream's name and a column per kText row of
// StreamStatFields(), and under each stream a line per consumer group with its kText figures of
// StreamGroupStatFields() by name. "no streams" when there are none.
std::string OperatorStreamsText(const proto::DaemonStatus& status);

// The client's view of a job's stats (what Loader::Next returns at the job's end): the typed
// fields, and `values` (the job's, and each stage's) filled from proto/job_stats_fields.h by name.
JobStats JobStatsFromProto(const proto::JobStats& s);

}  // namespace spdl::client
