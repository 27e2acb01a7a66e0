// Notifier: tells the service manager (systemd, Type=notify) how spdld is doing: READY=1 once the
// control socket listens, RELOADING=1 / READY=1 around a config reload, STOPPING=1 on shutdown,
// STATUS=<one line> and WATCHDOG=1 pings. Everything goes through libsystemd's sd_notify to
// $NOTIFY_SOCKET; without $NOTIFY_SOCKET (not started by systemd) every call is a cheap no-op, and a
// build without libsystemd (SPDL_HAVE_SYSTEMD undefined) makes them no-ops too.
//
// Not thread-safe: the daemon calls it from its io_context thread only.
#pragma once

#include <chrono>
#include <string>

namespace spdl::ops {

class Notifier {
 public:
  // Reads $NOTIFY_SOCKET and $WATCHDOG_USEC (through sd_watchdog_enabled) once.
  Notifier();

  // Whether messages go anywhere (a notify socket is set and libsystemd was built in).
  bool enabled() const { return enabled_; }
  // The watchdog interval the manager asked for (WatchdogSec=), zero when none. Ping at half of it.
  std::chrono::microseconds watchdog_interval() const { return watchdog_; }

  void Ready();
  void Reloading();
  void Stopping();
  void Watchdog();
  // STATUS=<text>; sent only when it differs from the last one sent.
  void SetStatus(const std::string& text);

 private:
  void Send(const std::string& state);

  bool enabled_ = false;
  std::chrono::microseconds watchdog_{0};
  std::string last_status_;
};

}  // namespace spdl::ops
