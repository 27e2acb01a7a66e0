// DaemonProcess: a real spdld process for end-to-end tests: started with fork/exec on a private
// socket, stopped with a signal, its exit status checked. RunCommand / RunCommandAs: run a tool
// and collect its stdout. A RunAs starts either as another user (root only). Not thread-safe.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace spdl::testing {

// Who a child process runs as: uid < 0 = as the test itself. Setting another uid needs root.
struct RunAs {
  int uid = -1;
  int gid = -1;
};

// In a forked child: drops to `as` (supplementary groups cleared); exits 126 if that fails.
inline void BecomeInChild(const RunAs& as) {
  if (as.uid < 0) return;
  if (::setgroups(0, nullptr) != 0 || ::setgid(static_cast<gid_t>(as.gid)) != 0 ||
      ::setuid(static_cast<uid_t>(as.uid)) != 0) {
    _exit(126);
  }
}

// Runs `argv` as `as` and returns its exit code (-signal when killed); its stdout goes to *out
// (and, with `merge_stderr`, its stderr too).
inline int RunCommandAs(const RunAs& as, const std::vector<std::string>& argv, std::string* out,
                        bool merge_stderr = false) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return -1000;
  pid_t pid = ::fork();
  if (pid == 0) {
    BecomeInChild(as);
    if (merge_stderr) ::dup2(pipefd[1], 2);
    ::dup2(pipefd[1], 1);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    _exit(127);
  }
  ::close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) {
    if (out) out->append(buf, static_cast<size_t>(n));
  }
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// Runs `argv` and returns its exit code (-signal when killed) and its stdout.
inline int RunCommand(const std::vector<std::string>& argv, std::string* out = nullptr) {
  return RunCommandAs(RunAs{}, argv, out);
}

// Starts `argv` in the background with its stdout written to `stdout_path` and its stderr thrown
// away; returns the child's pid (reap it with waitpid).
inline pid_t SpawnToFile(const std::vector<std::string>& argv, const std::string& stdout_path) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 2);
    std::vector<char*> a;
    a.reserve(argv.size() + 1);
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    _exit(127);
  }
  return pid;
}

class DaemonProcess {
 public:
  // Starts build/bin/spdld with `args` (as `as`) and waits until its socket accepts connections.
  DaemonProcess(std::string socket_path, std::vector<std::string> args, RunAs as = {})
      : socket_(std::move(socket_path)) {
    std::vector<std::string> argv = {std::string(SPDL_BIN_DIR) + "/spdld", "--socket", socket_, "--log-level", "warn"};
    argv.insert(argv.end(), args.begin(), args.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      BecomeInChild(as);
      std::vector<char*> a;
      a.reserve(argv.size() + 1);
      for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline && !Connectable() && Running()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~DaemonProcess() {
    if (pid_ > 0 && !exit_code_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  bool Connectable() const {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    return ok;
  }

  // Sends `sig` and waits (up to `timeout`) for the exit; returns the exit code (-signal when killed
  // by one), or nullopt on timeout.
  // SIGTERM starts a drain that waits for running jobs (drain_seconds); when the daemon has not
  // exited a second after it, a second SIGTERM stops it at once, cancelling what still runs.
  std::optional<int> Stop(int sig = SIGTERM, std::chrono::seconds timeout = std::chrono::seconds(10)) {
    if (exit_code_) return exit_code_;
    ::kill(pid_, sig);
    const auto start = std::chrono::steady_clock::now();
    auto deadline = start + timeout;
    bool repeated = sig != SIGTERM;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!repeated && std::chrono::steady_clock::now() - start > std::chrono::seconds(1)) {
        ::kill(pid_, SIGTERM);
        repeated = true;
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }

  // True while the process has not exited (reaps it, and keeps its exit code, if it has).
  bool Running() {
    if (exit_code_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      return false;
    }
    return true;
  }
  // The exit code once Running() or Stop() has seen the exit.
  std::optional<int> exit_code() const { return exit_code_; }

  pid_t pid() const { return pid_; }
  const std::string& socket() const { return socket_; }

 private:
  std::string socket_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

}  // namespace spdl::testing
