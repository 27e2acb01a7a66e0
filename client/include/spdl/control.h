// Operator requests to spdld (what spdlctl uses): one request, one answer, on a connection of its
// own. Unlike client.h this header exposes the protobuf messages, since tools print them whole.
// Each call is independent: safe from any thread.
#pragma once

#include <string>

#include "common/status.h"
#include "proto/control.pb.h"

namespace spdl::client {

// Connects, says Hello, sends `request` (e.g. StatusRequest, CancelJob) and returns the answer.
// A daemon Error comes back as a non-OK Status with its message.
Result<proto::DaemonMessage> ControlCall(const std::string& socket_path, const proto::ClientMessage& request,
                                         const std::string& client_name = "spdlctl");

}  // namespace spdl::client
