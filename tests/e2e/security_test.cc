// Security end to end: a real spdld (as root, like the systemd service), real clients started as
// two users created by the test (useradd; needs root — without it the two-user cases are skipped,
// visibly). Jobs belong to the uid that submitted them; the socket's mode and group come from the
// daemon config; a job reads only below the allowed roots.
#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "skip.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunAs;
using testing::RunCommandAs;
using testing::TempDir;
using testing::WriteFile;

const std::string kCtl = testing::CtlPath();
const std::string kClient = testing::ClientPath();

// A daemon config file for `socket` with `extra` lines, allowing `root`.
std::string DaemonConfig(const TempDir& dir, const std::string& socket, const std::string& root,
                         const std::string& extra) {
  const std::string path = dir.path + "/spdld.yaml";
  WriteFile(path, "socket_path: " + socket + "\nallowed_roots: [" + root + "]\nworker_threads: 2\n" + extra);
  return path;
}

std::string JobYaml(const std::string& root) {
  return "source: {type: image_folder, root: " + root +
         "}\nbatch: {size: 4}\ntransforms: [{resize: {height: 32, width: 32}}]\nprefetch: 2\n";
}

// `spdlctl --json status` as `as`; the parsed answer (null on failure).
nlohmann::json CtlStatus(const RunAs& as, const std::string& socket) {
  std::string out;
  if (RunCommandAs(as, {kCtl, "--socket", socket, "--json", "status"}, &out) != 0) return nullptr;
  return nlohmann::json::parse(out, nullptr, false);
}

// True if `as` can open none of /proc/PID/fd/* (where the shared region's memfd lives).
bool CannotOpenFdsOf(const RunAs& as, pid_t pid) {
  pid_t c = ::fork();
  if (c == 0) {
    testing::BecomeInChild(as);
    const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    for (int fd = 0; fd < 256; ++fd) {
      int f = ::open((dir + "/" + std::to_string(fd)).c_str(), O_RDONLY);
      if (f >= 0) _exit(1);
    }
    _exit(0);
  }
  int status = 0;
  ::waitpid(c, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

TEST_CASE("a job belongs to the uid that submitted it: another uid cannot see, read or cancel it") {
  testing::TestUsers users;
  SPDL_REQUIRE_TEST_USERS(users.ok, "spdl-e2e-alice and spdl-e2e-bob");
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 40, 60, 120);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--config", DaemonConfig(dir, sock, dir.path + "/data", "socket_mode: \"0666\"\n")});
  REQUIRE(d.Connectable());
  WriteFile(dir.path + "/job.yaml", JobYaml(dir.path + "/data"));

  // Alice runs an endless job.
  testing::ChildProcess alice(
      users.alice, {kClient, "--socket", sock, "--config", dir.path + "/job.yaml", "--epochs", "0", "--no-checksum"},
      dir.path + "/alice.log");
  std::string job_id;
  for (int i = 0; i < 500 && job_id.empty(); ++i) {
    auto s = CtlStatus(users.alice, sock);
    if (s.is_object() && s.contains("jobs") && !s["jobs"].empty()) job_id = s["jobs"][0]["job_id"].get<std::string>();
    if (job_id.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE_FALSE(job_id.empty());
  auto as_root = CtlStatus(RunAs{}, sock);
  REQUIRE(as_root["jobs"].size() == 1);
  CHECK(as_root["jobs"][0]["uid"] == users.alice.uid);

  // Bob sees that a job exists, nothing of it.
  auto as_bob = CtlStatus(users.bob, sock);
  REQUIRE(as_bob.is_object());
  CHECK(as_bob["live_jobs"] == 1);
  CHECK(as_bob["jobs"].empty());
  std::string out;
  CHECK(RunCommandAs(users.bob, {kCtl, "--socket", sock, "stats", job_id}, &out, true) != 0);
  CHECK_THAT(out, Catch::Contains("no job " + job_id));
  out.clear();
  CHECK(RunCommandAs(users.bob, {kCtl, "--socket", sock, "cancel", job_id}, &out, true) == 1);
  CHECK_THAT(out, Catch::Contains("no job " + job_id));
  // Bob cannot reach the job's shared memory: it is an unnamed memfd, held only by the daemon and
  // Alice's client, and neither process's descriptors can be opened by another uid.
  CHECK(CannotOpenFdsOf(users.bob, alice.pid()));
  CHECK(CannotOpenFdsOf(users.bob, d.pid()));
  CHECK_FALSE(alice.Wait(std::chrono::seconds(0)));  // still running: Bob's cancel did nothing

  // Alice can cancel her own job; her client gets the reason.
  out.clear();
  CHECK(RunCommandAs(users.alice, {kCtl, "--socket", sock, "cancel", job_id}, &out, true) == 0);
  auto rc = alice.Wait(std::chrono::seconds(10));
  REQUIRE(rc);
  CHECK(*rc != 0);
  {
    auto log = testing::ReadBytes(dir.path + "/alice.log");
    CHECK_THAT(std::string(log.begin(), log.end()),
               Catch::Contains("cancelled by uid " + std::to_string(users.alice.uid)));
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("the socket's mode and group come from the daemon config") {
  testing::TestUsers users;
  SPDL_REQUIRE_TEST_USERS(users.ok, "spdl-e2e-alice and spdl-e2e-bob");
  TempDir dir(0755);
  fs::create_directories(dir.path + "/data");
  const std::string sock = dir.path + "/spdld.sock";
  const group* g = ::getgrgid(static_cast<gid_t>(users.bob.gid));
  REQUIRE(g != nullptr);
  const std::string group_name = g->gr_name;
  {
    DaemonProcess d(sock, {"--config", DaemonConfig(dir, sock, dir.path + "/data",
                                                    "socket_mode: \"0660\"\nsocket_group: " + group_name + "\n")});
    REQUIRE(d.Connectable());
    struct stat st {};
    REQUIRE(::stat(sock.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0660);
    CHECK(st.st_gid == static_cast<gid_t>(users.bob.gid));
    // Bob is in the group: he may talk to the daemon; Alice may not.
    std::string out;
    CHECK(RunCommandAs(users.bob, {kCtl, "--socket", sock, "status"}, &out, true) == 0);
    out.clear();
    CHECK(RunCommandAs(users.alice, {kCtl, "--socket", sock, "status"}, &out, true) != 0);
    CHECK_THAT(out, Catch::Contains("ermission denied"));
    CHECK(d.Stop() == std::optional<int>(0));
  }
  // An unknown group is a start-up error that names it.
  std::string out;
  int rc = RunCommandAs(RunAs{},
                        {std::string(SPDL_BIN_DIR) + "/spdld", "--config",
                         DaemonConfig(dir, sock, dir.path + "/data", "socket_group: no-such-group-spdl\n")},
                        &out, true);
  CHECK(rc != 0);
  CHECK_THAT(out, Catch::Contains("no-such-group-spdl"));
}

client::Options Opts(const std::string& socket, const std::string& yaml) {
  client::Options o;
  o.socket_path = socket;
  o.config_yaml = yaml;
  o.config_name = "job.yaml";
  o.epochs = 1;
  return o;
}

TEST_CASE("a job may read only below the allowed roots: '..' and absolute paths outside are refused") {
  TempDir dir;
  const testdata::DatasetOptions o = testing::SmallImages(1, 4, 60, 100);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/allowed/data", o).ok());
  REQUIRE(testdata::MakeImageFolder(dir.path + "/secret", o).ok());
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--allow-root", dir.path + "/allowed"});
  REQUIRE(d.Connectable());
  for (const std::string& root :
       std::vector<std::string>{dir.path + "/allowed/../secret", dir.path + "/allowed/data/../../secret",
                                dir.path + "/secret", std::string("/etc")}) {
    INFO(root);
    auto l = client::Loader::Open(Opts(sock, JobYaml(root)));
    REQUIRE_FALSE(l.ok());
    CHECK(l.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(l.status().message(), Catch::Contains("not below any allowed root"));
  }
  // A root that is a symbolic link to a directory outside is refused too (resolved first).
  fs::create_directory_symlink(dir.path + "/secret", dir.path + "/allowed/link");
  auto l = client::Loader::Open(Opts(sock, JobYaml(dir.path + "/allowed/link")));
  REQUIRE_FALSE(l.ok());
  CHECK(l.status().code() == StatusCode::kPermissionDenied);
  // And the daemon carries on.
  auto ok = client::Loader::Open(Opts(sock, JobYaml(dir.path + "/allowed/data")));
  CHECK(ok.ok());
  CHECK(d.Stop() == std::optional<int>(0));
}

// A symbolic link inside an allowed root that points at a file outside it must not be read: reads
// stay beneath the root (io/read_file.h: openat2 RESOLVE_BENEATH, or a realpath check without it).
TEST_CASE("a symbolic link inside an allowed root that escapes it is never read") {
  TempDir dir;
  const testdata::DatasetOptions o = testing::SmallImages(1, 4, 60, 100);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/allowed/data", o).ok());
  REQUIRE(testdata::MakeImageFolder(dir.path + "/secret", o).ok());
  fs::create_symlink(dir.path + "/secret/class_000/img_00000.jpg", dir.path + "/allowed/data/class_000/escape.jpg");
  fs::create_symlink("../../../secret/class_000/img_00001.jpg", dir.path + "/allowed/data/class_000/escape2.jpg");
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--allow-root", dir.path + "/allowed"});
  REQUIRE(d.Connectable());
  for (const char* policy : {"skip", "fail"}) {
    INFO(policy);
    auto l = client::Loader::Open(Opts(sock, JobYaml(dir.path + "/allowed/data") + "on_error: " + policy + "\n"));
    if (!l.ok()) {  // refusing the whole job is fine too
      CHECK_THAT(l.status().message(), Catch::Contains("escape"));
      continue;
    }
    std::vector<std::string> seen;
    Status error;
    for (;;) {
      auto ev = (*l)->Next();
      if (!ev.ok()) {
        error = ev.status();
        break;
      }
      if (auto* b = std::get_if<client::Batch>(&*ev)) seen.insert(seen.end(), b->paths().begin(), b->paths().end());
      if (std::holds_alternative<client::JobStats>(*ev)) break;
    }
    for (auto& p : seen) CHECK(p.find("escape") == std::string::npos);
    if (std::string(policy) == "fail") CHECK_THAT(error.message(), Catch::Contains("escape"));
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
