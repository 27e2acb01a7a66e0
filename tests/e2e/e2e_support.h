// Helpers shared by the end-to-end tests (e2e_test, plugin_ops_test, bad_data_test, security_test,
// tenancy_test, limits_test, faults_test, soak_test): temporary directories, small image datasets,
// test users (and the honest skip when they cannot be made), child processes run as a user, a
// raw control-socket client, and a daemon's fd count and resident memory read from /proc.
// Not thread-safe unless said.
#pragma once

#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "proto/framing.h"
#include "skip.h"
#include "temp_dir.h"

namespace spdl::testing {

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

// The test users spdl-e2e-alice and spdl-e2e-bob (TestUser); `ok` when both could be made.
struct TestUsers {
  TestUsers() {
    auto a = TestUser("spdl-e2e-alice");
    auto b = TestUser("spdl-e2e-bob");
    if (a && b) {
      alice = *a;
      bob = *b;
      ok = true;
    }
  }
  RunAs alice, bob;
  bool ok = false;
};

// In a TEST_CASE body: skips the case (SPDL_SKIP, reported as Skipped) unless `present` (a
// TestUser result, or TestUsers::ok) holds; `names` says which users were wanted.
#define SPDL_REQUIRE_TEST_USERS(present, names)                                             \
  do {                                                                                      \
    if (!(present)) SPDL_SKIP("needs root to create the test user(s) " names " (useradd)"); \
  } while (0)

// The options of a small image-folder dataset (testdata::MakeImageFolder): `classes` folders of
// `per_class` JPEGs whose sides lie in [min_side, max_side].
inline testdata::DatasetOptions SmallImages(int classes, int per_class, int min_side, int max_side) {
  testdata::DatasetOptions o;
  o.classes = classes;
  o.images_per_class = per_class;
  o.min_side = min_side;
  o.max_side = max_side;
  return o;
}

// The built programs.
inline std::string ClientPath() { return std::string(SPDL_BIN_DIR) + "/spdl-client"; }
inline std::string CtlPath() { return std::string(SPDL_BIN_DIR) + "/spdlctl"; }

// A child process running `argv` as `as` (RunAs{}: this process's user), its stdout and stderr to
// `log` (opened before the user is dropped); killed on destruction if still running.
class ChildProcess {
 public:
  ChildProcess(const RunAs& as, const std::vector<std::string>& argv, const std::string& log = "/dev/null") {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      BecomeInChild(as);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> a;
      a.reserve(argv.size() + 1);
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      _exit(127);
    }
  }
  ~ChildProcess() { Kill(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `timeout` for the exit; its code (-signal), or nullopt while it still runs.
  std::optional<int> Wait(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!exit_code_ && pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      } else if (std::chrono::steady_clock::now() >= deadline) {
        break;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    return exit_code_;
  }
  // SIGKILL and reap, unless it has already been reaped.
  void Kill() {
    if (pid_ <= 0 || exit_code_) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// spdl-client as `as` running the job config file `yaml` for ever (--epochs 0, --quiet), in the
// background: what a trainer's endless job looks like to the daemon.
inline std::unique_ptr<ChildProcess> EndlessClient(const RunAs& as, const std::string& socket,
                                                   const std::string& yaml) {
  return std::make_unique<ChildProcess>(
      as, std::vector<std::string>{ClientPath(), "--socket", socket, "--config", yaml, "--epochs", "0", "--quiet"});
}

// Polls `spdlctl --json jobs` (as this process's user) every 50 ms, up to 10 s, until a job of
// `uid` is listed; true if one was.
inline bool WaitForJobOf(const std::string& socket, int uid) {
  for (int i = 0; i < 200; ++i) {
    std::string jobs;
    RunCommand({CtlPath(), "--socket", socket, "--json", "jobs"}, &jobs);
    if (jobs.find("\"uid\": " + std::to_string(uid)) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
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
