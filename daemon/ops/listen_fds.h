// Socket activation (systemd's LISTEN_FDS protocol, sd_listen_fds(3)): the service manager creates
// and owns the listening socket and passes it to spdld as descriptor 3 with LISTEN_PID=<our pid>
// and LISTEN_FDS=1. TakeListenFd reads that (through libsystemd's sd_listen_fds when built with
// SPDL_HAVE_SYSTEMD, else by hand: the protocol is just those two variables) and always unsets
// LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES so children do not inherit them.
// CheckListeningUnixSocket tells whether a descriptor is a listening AF_UNIX SOCK_STREAM socket.
//
// Not thread-safe (it edits the environment): call it once at start-up, before other threads run.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace spdl::ops {

// The first passed descriptor (3) when this process was socket-activated, nullopt when it was not
// (no LISTEN_FDS, or LISTEN_PID names another process). More than one descriptor, or a malformed
// LISTEN_FDS, is an error. The returned descriptor is marked close-on-exec; the caller owns it.
Result<std::optional<int>> TakeListenFd();

// The path `fd` is bound to ("" for an unnamed or abstract socket) when it is a listening
// AF_UNIX SOCK_STREAM socket; otherwise an InvalidArgument naming what it is instead.
Result<std::string> CheckListeningUnixSocket(int fd);

}  // namespace spdl::ops
