#include "ops/notifier.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

#include "common/errno_text.h"

#ifdef SPDL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace spdl::ops {

Notifier::Notifier() {
#ifdef SPDL_HAVE_SYSTEMD
  const char* sock = std::getenv("NOTIFY_SOCKET");
  enabled_ = sock != nullptr && sock[0] != '\0';
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) > 0) watchdog_ = std::chrono::microseconds(usec);
#else
  if (std::getenv("NOTIFY_SOCKET") != nullptr) {
    spdlog::warn(
        "NOTIFY_SOCKET is set but this spdld was built without libsystemd: no READY/STATUS/WATCHDOG "
        "(use Type=simple, or rebuild with libsystemd-dev installed)");
  }
#endif
}

void Notifier::Send(const std::string& state) {
  if (!enabled_) return;
#ifdef SPDL_HAVE_SYSTEMD
  int r = sd_notify(/*unset_environment=*/0, state.c_str());
  if (r < 0) spdlog::warn("sd_notify({}) failed: {}", state.substr(0, state.find('\n')), ErrnoText(-r));
#endif
}

void Notifier::Ready() { Send("READY=1"); }
void Notifier::Reloading() { Send("RELOADING=1"); }
void Notifier::Stopping() { Send("STOPPING=1"); }
void Notifier::Watchdog() { Send("WATCHDOG=1"); }

void Notifier::SetStatus(const std::string& text) {
  if (text == last_status_) return;
  last_status_ = text;
  Send("STATUS=" + text);
}

}  // namespace spdl::ops
