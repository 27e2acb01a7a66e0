// Helpers shared by the reliability and security end-to-end tests (bad_data_test, security_test,
// limits_test, faults_test, soak_test): temporary directories, test users, a raw control-socket
// client, and a daemon's fd count and resident memory read from /proc. Not thread-safe unless said.
#pragma once

#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "e2e/daemon_process.h"
#include "proto/framing.h"

namespace spdl::testing {

// A fresh directory under /tmp, removed with everything in it on destruction. `mode` lets other
// users (a daemon or client started as a test user) enter it.
struct TempDir {
  explicit TempDir(mode_t mode = 0700) {
    char tmpl[] = "/tmp/spdl-e2e-XXXXXX";
    path = ::mkdtemp(tmpl);
    ::chmod(path.c_str(), mode);
  }
  ~TempDir() {
    std::error_code ec;
    // Undo a test's chmod 000 so that remove_all can descend everywhere.
    for (auto it = std::filesystem::recursive_directory_iterator(
             path, std::filesystem::directory_options::skip_permission_denied, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_symlink(ec)) ::chmod(it->path().c_str(), 0755);
    }
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

inline void WriteFile(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}
inline void WriteFile(const std::string& path, const std::string& text) { WriteFile(path, text.data(), text.size()); }

inline std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A local user for tests, created with useradd if missing (no home, no login). nullopt when the
// test is not root or useradd fails: the caller skips visibly.
inline std::optional<RunAs> TestUser(const std::string& name) {
  if (::geteuid() != 0) return std::nullopt;
  if (::getpwnam(name.c_str()) == nullptr) {
    RunCommand({"/usr/sbin/useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name});
  }
  const passwd* pw = ::getpwnam(name.c_str());
  if (pw == nullptr) return std::nullopt;
  return RunAs{static_cast<int>(pw->pw_uid), static_cast<int>(pw->pw_gid)};
}

// Open descriptors of process `pid` (-1 if /proc cannot be read).
inline int FdCount(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (std::filesystem::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    ++n;
  }
  return ec ? -1 : n;
}

// Resident set size of process `pid` in KiB (VmRSS; -1 if unknown).
inline long RssKiB(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// A bare control-socket connection that speaks the framing by hand, for tests that send what the
// real client never would (garbage, oversized frames, a wrong protocol version).
class RawConnection {
 public:
  explicit RawConnection(const std::string& socket_path) {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
    timeval tv{5, 0};  // a read that would hang fails the test instead
    if (fd_ >= 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  ~RawConnection() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;

  bool connected() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool SendBytes(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  }
  bool Send(const proto::ClientMessage& m) {
    std::string frame;
    return proto::EncodeFrame(m, &frame) && SendBytes(frame);
  }
  bool SendHello(uint32_t version = proto::kProtocolVersion) {
    proto::ClientMessage m;
    m.mutable_hello()->set_protocol_version(version);
    m.mutable_hello()->set_client_name("raw-test");
    return Send(m);
  }
  // The next message from the daemon; nullopt on EOF, error or a 5 s timeout.
  std::optional<proto::DaemonMessage> Receive() {
    std::string payload;
    for (;;) {
      if (parser_.Next(&payload) == proto::FrameParser::Result::kFrame) {
        proto::DaemonMessage m;
        if (!proto::ParseDaemonMessage(payload, &m)) return std::nullopt;
        return m;
      }
      char buf[65536];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return std::nullopt;
      parser_.Feed(buf, static_cast<size_t>(n));
    }
  }
  // Reads until the daemon closes the connection; true if it did within 5 s. Messages received on
  // the way are appended to *seen.
  bool WaitClosed(std::vector<proto::DaemonMessage>* seen = nullptr) {
    for (int i = 0; i < 1000; ++i) {
      std::string payload;
      if (parser_.Next(&payload) == proto::FrameParser::Result::kFrame) {
        proto::DaemonMessage m;
        if (seen && proto::ParseDaemonMessage(payload, &m)) seen->push_back(m);
        continue;
      }
      char buf[65536];
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      parser_.Feed(buf, static_cast<size_t>(n));
    }
    return false;
  }

 private:
  int fd_ = -1;
  proto::FrameParser parser_{64u << 20};
};

}  // namespace spdl::testing
