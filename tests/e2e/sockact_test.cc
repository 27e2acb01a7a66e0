// Socket activation end to end: the real spdld started by /usr/bin/systemd-socket-activate, which
// creates and listens on the socket, waits for the first connection and then execs spdld with
// LISTEN_PID/LISTEN_FDS (the protocol systemd's spdld.socket uses). A real spdl-client connects
// before spdld runs and its job must complete; spdld must log the inherited socket and leave the
// socket file in place when it exits (the service manager owns it).
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "skip.h"
#include "temp_dir.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
constexpr const char* kActivator = "/usr/bin/systemd-socket-activate";

struct Fixture {
  Fixture() {
    testdata::DatasetOptions o;
    o.classes = 2;
    o.images_per_class = 6;
    o.min_side = 70;
    o.max_side = 120;
    REQUIRE(testdata::MakeImageFolder(dir + "/data", o).ok());
    std::ofstream(dir + "/job.yaml") << "source: {type: image_folder, root: " << dir
                                     << "/data}\nbatch: {size: 4}\ntransforms:\n  - resize: {shorter: 40}\n"
                                        "  - center_crop: {size: 32}\n";
  }
  ~Fixture() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }
  // Starts spdld under the activator listening on `listen_path`, with socket_path `config_path`.
  void Start(const std::string& listen_path, const std::string& config_path) {
    std::ofstream(dir + "/spdld.yaml") << "socket_path: " << config_path << "\nallowed_roots: [" << dir
                                       << "]\nworker_threads: 2\n";
    const std::vector<std::string> argv = {
        kActivator,          "-l",          listen_path, std::string(SPDL_BIN_DIR) + "/spdld", "--config",
        dir + "/spdld.yaml", "--log-level", "info"};
    pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(log().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> a;
      a.reserve(argv.size() + 1);
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      ::execv(a[0], a.data());
      _exit(127);
    }
    // The activator creates the socket file at once; spdld itself starts on the first connection.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!fs::exists(listen_path) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  // SIGTERM (a second one after a second, as DaemonProcess::Stop); the exit code, nullopt on timeout.
  std::optional<int> Stop() {
    ::kill(pid, SIGTERM);
    const auto start = std::chrono::steady_clock::now();
    bool repeated = false;
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      if (!repeated && std::chrono::steady_clock::now() - start > std::chrono::seconds(1)) {
        ::kill(pid, SIGTERM);
        repeated = true;
      }
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::nullopt;
  }
  std::string Log() const {
    std::ifstream in(log());
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string log() const { return dir + "/spdld.log"; }
  testing::TempDir tmp;  // declared first: removed after everything else has gone
  const std::string dir = tmp.path;
  pid_t pid = -1;
};

bool IsSocket(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode);
}

// spdl-client runs the job to its end on `socket`; returns its exit code, its output in *out.
int RunJob(const Fixture& f, const std::string& socket, std::string* out) {
  return testing::RunCommandAs(testing::RunAs{},
                               {std::string(SPDL_BIN_DIR) + "/spdl-client", "--socket", socket, "--config",
                                f.dir + "/job.yaml", "--epochs", "1"},
                               out, /*merge_stderr=*/true);
}

TEST_CASE("socket-activated spdld serves a client that connected before it started, and leaves the socket file") {
  if (::access(kActivator, X_OK) != 0) {
    SPDL_SKIP(kActivator << " missing (apt-get install systemd)");
  }
  Fixture f;
  const std::string sock = f.dir + "/spdld.sock";
  f.Start(sock, sock);
  REQUIRE(IsSocket(sock));
  std::string out;
  const int rc = RunJob(f, sock, &out);  // this connection is what makes the activator exec spdld
  INFO(out << "\n--- spdld log:\n" << f.Log());
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("samples in 3 batches over 1 epochs"));
  // A second client on the same (inherited) socket works too.
  out.clear();
  CHECK(RunJob(f, sock, &out) == 0);
  CHECK(f.Stop() == std::optional<int>(0));
  const std::string log = f.Log();
  CHECK_THAT(log, Catch::Contains("control socket inherited from the service manager (socket activation): " + sock));
  CHECK_THAT(log, !Catch::Contains("creating the control socket"));
  CHECK_THAT(log, !Catch::Contains("socket_path"));  // the paths agree: no warning
  CHECK(IsSocket(sock));                             // spdld did not remove what it did not create
}

TEST_CASE("socket-activated spdld warns when the passed socket is not its socket_path and uses the passed one") {
  if (::access(kActivator, X_OK) != 0) {
    SPDL_SKIP(kActivator << " missing (apt-get install systemd)");
  }
  Fixture f;
  const std::string sock = f.dir + "/activated.sock";
  const std::string configured = f.dir + "/configured.sock";
  f.Start(sock, configured);
  REQUIRE(IsSocket(sock));
  std::string out;
  const int rc = RunJob(f, sock, &out);
  INFO(out << "\n--- spdld log:\n" << f.Log());
  CHECK(rc == 0);
  CHECK(f.Stop() == std::optional<int>(0));
  CHECK_THAT(f.Log(), Catch::Contains("is bound to '" + sock + "', not to socket_path '" + configured + "'"));
  CHECK_FALSE(fs::exists(configured));  // nothing created at the configured path
  CHECK(IsSocket(sock));
}

TEST_CASE("spdld started without socket activation still creates its socket and removes it at exit") {
  testing::TempDir tmp;
  const std::string& dir = tmp.path;
  {
    testing::DaemonProcess d(dir + "/spdld.sock", {"--allow-root", dir});
    REQUIRE(d.Connectable());
    CHECK(d.Stop() == std::optional<int>(0));
  }
  CHECK_FALSE(fs::exists(dir + "/spdld.sock"));  // its own socket: removed
}

}  // namespace
}  // namespace spdl
