#include "ops/listen_fds.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#ifdef SPDL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace spdl::ops {

namespace {
constexpr int kFirstListenFd = 3;  // SD_LISTEN_FDS_START

#ifndef SPDL_HAVE_SYSTEMD
// A whole decimal number, or nullopt.
std::optional<long> ParseNumber(const char* s) {
  if (s == nullptr || *s == '\0') return std::nullopt;
  long n = 0;
  const char* end = s + std::strlen(s);
  auto [ptr, ec] = std::from_chars(s, end, n);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return n;
}
#endif

// How many descriptors were passed to this process (0 when none, or they are for another pid).
Result<int> CountListenFds() {
#ifdef SPDL_HAVE_SYSTEMD
  const int n = ::sd_listen_fds(/*unset_environment=*/1);
  ::unsetenv("LISTEN_FDNAMES");  // NOLINT(concurrency-mt-unsafe): start-up, before any job
  if (n < 0) return ErrnoStatus("socket activation: sd_listen_fds", -n);
  return n;
#else
  const char* pid_env = std::getenv("LISTEN_PID");
  const char* fds_env = std::getenv("LISTEN_FDS");
  const std::optional<long> pid = ParseNumber(pid_env);
  const std::optional<long> fds = ParseNumber(fds_env);
  const bool present = fds_env != nullptr;
  const std::string fds_text = present ? fds_env : "";
  ::unsetenv("LISTEN_PID");      // NOLINT(concurrency-mt-unsafe): start-up, before any job
  ::unsetenv("LISTEN_FDS");      // NOLINT(concurrency-mt-unsafe): start-up, before any job
  ::unsetenv("LISTEN_FDNAMES");  // NOLINT(concurrency-mt-unsafe): start-up, before any job
  if (!present || !pid || *pid != static_cast<long>(::getpid())) return 0;
  if (!fds || *fds < 0) return InvalidArgument("socket activation: LISTEN_FDS='" + fds_text + "' is not a count");
  for (long i = 0; i < *fds; ++i) {
    const int fd = kFirstListenFd + static_cast<int>(i);
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags < 0) return ErrnoStatus("socket activation: descriptor " + std::to_string(fd), errno);
  }
  return static_cast<int>(*fds);
#endif
}
}  // namespace

Result<std::optional<int>> TakeListenFd() {
  SPDL_ASSIGN_OR_RETURN(const int n, CountListenFds());
  if (n == 0) return std::optional<int>();
  if (n > 1) {
    return InvalidArgument("socket activation: " + std::to_string(n) +
                           " descriptors passed (LISTEN_FDS); spdld takes exactly one, its control socket");
  }
  const int fd = kFirstListenFd;
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags < 0 || ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0) {
    return ErrnoStatus("socket activation: descriptor 3", errno);
  }
  return std::optional<int>(fd);
}

Result<std::string> CheckListeningUnixSocket(int fd) {
  const std::string what = "descriptor " + std::to_string(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoStatus(what, errno);
  if (!S_ISSOCK(st.st_mode)) return InvalidArgument(what + " is not a socket");
  int type = 0;
  socklen_t len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) return ErrnoStatus(what + ": SO_TYPE", errno);
  sockaddr_storage addr{};
  socklen_t alen = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0)
    return ErrnoStatus(what + ": getsockname", errno);
  if (addr.ss_family != AF_UNIX) {
    return InvalidArgument(what + " is not a Unix socket (address family " + std::to_string(addr.ss_family) +
                           "); spdld's control socket must be AF_UNIX (ListenStream=/path)");
  }
  if (type != SOCK_STREAM) {
    return InvalidArgument(what + " is a Unix socket but not SOCK_STREAM (type " + std::to_string(type) +
                           "); use ListenStream=, not ListenDatagram=/ListenSequentialPacket=");
  }
  int listening = 0;
  len = sizeof(listening);
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0) {
    return ErrnoStatus(what + ": SO_ACCEPTCONN", errno);
  }
  if (!listening) return InvalidArgument(what + " is a Unix stream socket that is not listening");
  const auto* un = reinterpret_cast<const sockaddr_un*>(&addr);
  const size_t path_len = alen > offsetof(sockaddr_un, sun_path) ? alen - offsetof(sockaddr_un, sun_path) : 0;
  if (path_len == 0 || un->sun_path[0] == '\0') return std::string();  // unnamed or abstract
  return std::string(un->sun_path, strnlen(un->sun_path, path_len));
}

}  // namespace spdl::ops
