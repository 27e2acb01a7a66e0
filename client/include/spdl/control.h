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
// spdlctl (proto/job_stats_fields.h, by name: name, value, unit), the caller's job count, and a
// line per poisoned GPU. Lines fit 100 columns (but a GPU's error text).
std::string OperatorStatusText(const proto::DaemonStatus& status);

// The client's view of a job's stats (what Loader::Next returns at the job's end): the typed
// fields, and `values` (the job's, and each stage's) filled from proto/job_stats_fields.h by name.
JobStats JobStatsFromProto(const proto::JobStats& s);

}  // namespace spdl::client
