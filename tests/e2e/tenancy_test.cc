// Tenancy end to end: one real spdld (as root, like a shared node's service) serving a second user
// created by the test (useradd; needs root — without it every case is skipped, visibly). The user
// reads only what their own rights allow: a root-only 0600 file below an allowed root is refused
// whatever names it (an image, a sidecar, a list, a folder scan, a tar shard), a class folder
// that is a symbolic link leading out of the root is refused without naming what is behind it, and
// a refusal about a path outside the roots reads the same whether or not it exists.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunAs;
using testing::RunCommandAs;
using testing::TempDir;
using testing::WriteFile;

const std::string kClient = testing::ClientPath();

// Runs spdl-client as `as` on the job config `yaml` (written to a file all may read); its exit code
// and everything it printed.
struct ClientRun {
  int rc = -1;
  std::string out;
};
ClientRun RunJob(const TempDir& dir, const RunAs& as, const std::string& sock, const std::string& yaml) {
  static int n = 0;
  const std::string path = dir.path + "/job" + std::to_string(n++) + ".yaml";
  WriteFile(path, yaml);
  ::chmod(path.c_str(), 0644);
  ClientRun r;
  r.rc = RunCommandAs(as, {kClient, "--socket", sock, "--config", path, "--epochs", "1", "--json"}, &r.out, true);
  return r;
}

std::string FolderJob(const std::string& root, const std::string& extra = "") {
  return "source: {type: image_folder, root: " + root +
         "}\nbatch: {size: 2}\ntransforms: [{resize: {height: 16, width: 16}}]\nprefetch: 2\n" + extra;
}

void Chmod(const std::string& path, mode_t mode) { REQUIRE(::chmod(path.c_str(), mode) == 0); }

struct Node {
  Node() : bob(testing::TestUser("spdl-e2e-bob")) {
    const testdata::DatasetOptions o = testing::SmallImages(2, 4, 40, 60);
    REQUIRE(testdata::MakeImageFolder(dir.path + "/allowed/data", o).ok());
    REQUIRE(testdata::MakeImageFolder(dir.path + "/secret-target", o).ok());
    sock = dir.path + "/spdld.sock";
  }
  TempDir dir{0755};
  std::optional<RunAs> bob;
  std::string sock;
};

TEST_CASE("a second user cannot read a root-only file below an allowed root, whatever names it") {
  Node node;
  SPDL_REQUIRE_TEST_USERS(node.bob, "spdl-e2e-bob");
  const RunAs& bob = *node.bob;
  const std::string allowed = node.dir.path + "/allowed";
  const std::string data = allowed + "/data";
  DaemonProcess d(node.sock, {"--allow-root", allowed, "--threads", "2"});
  REQUIRE(d.Connectable());
  ::chmod(node.sock.c_str(), 0666);

  SECTION("baseline: everything readable, Bob's job runs") {
    auto r = RunJob(node.dir, bob, node.sock, FolderJob(data));
    INFO(r.out);
    CHECK(r.rc == 0);
    CHECK_THAT(r.out, Catch::Contains("\"samples\":8"));
  }
  SECTION("an image") {
    Chmod(data + "/class_000/img_00000.jpg", 0600);
    auto bobs = RunJob(node.dir, bob, node.sock, FolderJob(data, "on_error: fail\n"));
    INFO(bobs.out);
    CHECK(bobs.rc != 0);
    CHECK_THAT(bobs.out, Catch::Contains("img_00000.jpg") && Catch::Contains("ermission denied"));
    // Skipped under skip: the other seven and a spare make the epoch.
    auto skipped = RunJob(node.dir, bob, node.sock, FolderJob(data, "on_error: skip\n"));
    INFO(skipped.out);
    CHECK(skipped.rc == 0);
    CHECK_THAT(skipped.out, Catch::Contains("\"skipped\":1"));
    // Root, whose rights allow it, reads it: the refusal is the user's rights, not the file.
    auto roots = RunJob(node.dir, RunAs{}, node.sock, FolderJob(data, "on_error: fail\n"));
    INFO(roots.out);
    CHECK(roots.rc == 0);
  }
  SECTION("a sidecar through extra_outputs") {
    for (const auto& e : fs::recursive_directory_iterator(data)) {
      if (e.path().extension() == ".jpg") WriteFile(fs::path(e.path()).replace_extension(".txt"), "caption");
    }
    Chmod(data + "/class_001/img_00001.txt", 0600);
    WriteFile(data + "/class_001/img_00001.txt", "ROOT-ONLY-CAPTION");
    const std::string extra = "on_error: fail\nextra_outputs: [{name: text, from: .txt, max_bytes: 64}]\n";
    auto bobs = RunJob(node.dir, bob, node.sock, FolderJob(data, extra));
    INFO(bobs.out);
    CHECK(bobs.rc != 0);
    CHECK_THAT(bobs.out, Catch::Contains("img_00001.txt") && Catch::Contains("ermission denied"));
    CHECK_THAT(bobs.out, !Catch::Contains("ROOT-ONLY-CAPTION"));
    auto roots = RunJob(node.dir, RunAs{}, node.sock, FolderJob(data, extra));
    INFO(roots.out);
    CHECK(roots.rc == 0);
  }
  SECTION("a list file") {
    const std::string list = allowed + "/list.txt";
    WriteFile(list, "ROOT-ONLY-FIRST-LINE.jpg,0\ndata/class_000/img_00000.jpg,0\n");
    Chmod(list, 0600);
    const std::string yaml = "source: {type: file_list, list: " + list + ", root: " + allowed +
                             "}\nbatch: {size: 1}\ntransforms: [{resize: {height: 16, width: 16}}]\n";
    auto bobs = RunJob(node.dir, bob, node.sock, yaml);
    INFO(bobs.out);
    CHECK(bobs.rc != 0);
    CHECK_THAT(bobs.out, Catch::Contains("list.txt") && Catch::Contains("ermission denied"));
    CHECK_THAT(bobs.out, !Catch::Contains("ROOT-ONLY-FIRST-LINE"));
  }
  SECTION("a folder scan of a directory Bob cannot list") {
    Chmod(data + "/class_001", 0700);
    auto bobs = RunJob(node.dir, bob, node.sock, FolderJob(data));
    INFO(bobs.out);
    CHECK(bobs.rc != 0);
    CHECK_THAT(bobs.out, Catch::Contains("class_001") && Catch::Contains("ermission denied"));
    auto roots = RunJob(node.dir, RunAs{}, node.sock, FolderJob(data));
    CHECK(roots.rc == 0);
  }
  SECTION("a tar shard") {
    std::string ignored;
    REQUIRE(testing::RunCommand({"/bin/tar", "-cf", allowed + "/shard.tar", "-C", data + "/class_000", "img_00000.jpg",
                                 "img_00001.jpg"},
                                &ignored) == 0);
    Chmod(allowed + "/shard.tar", 0600);
    const std::string yaml = "source: {type: tar, shards: [" + allowed +
                             "/shard.tar]}\nbatch: {size: 1}\ntransforms: [{resize: {height: 16, width: 16}}]\n";
    auto bobs = RunJob(node.dir, bob, node.sock, yaml);
    INFO(bobs.out);
    CHECK(bobs.rc != 0);
    CHECK_THAT(bobs.out, Catch::Contains("shard.tar") && Catch::Contains("ermission denied"));
    auto roots = RunJob(node.dir, RunAs{}, node.sock, yaml);
    INFO(roots.out);
    CHECK(roots.rc == 0);
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a symlinked class folder leading out of the root is refused without naming what is behind it") {
  Node node;
  SPDL_REQUIRE_TEST_USERS(node.bob, "spdl-e2e-bob");
  const std::string allowed = node.dir.path + "/allowed";
  fs::create_directory_symlink(node.dir.path + "/secret-target/class_000", allowed + "/data/class_zzz");
  DaemonProcess d(node.sock, {"--allow-root", allowed, "--threads", "2"});
  REQUIRE(d.Connectable());
  ::chmod(node.sock.c_str(), 0666);
  for (const RunAs& as : {*node.bob, RunAs{}}) {
    auto r = RunJob(node.dir, as, node.sock, FolderJob(allowed + "/data"));
    INFO(r.out);
    CHECK(r.rc != 0);
    CHECK_THAT(r.out, Catch::Contains("class_zzz") && Catch::Contains("escapes the root"));
    CHECK_THAT(r.out, !Catch::Contains("secret-target"));
  }
  // A root that is itself such a link: refused, its target not named either.
  fs::create_directory_symlink(node.dir.path + "/secret-target", allowed + "/link");
  auto r = RunJob(node.dir, *node.bob, node.sock, FolderJob(allowed + "/link"));
  INFO(r.out);
  CHECK(r.rc != 0);
  CHECK_THAT(r.out, Catch::Contains("leads out of the allowed roots"));
  CHECK_THAT(r.out, !Catch::Contains("secret-target"));
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a refusal about a path outside the roots reads the same whether or not it exists") {
  Node node;
  SPDL_REQUIRE_TEST_USERS(node.bob, "spdl-e2e-bob");
  const std::string allowed = node.dir.path + "/allowed";
  DaemonProcess d(node.sock, {"--allow-root", allowed, "--threads", "2"});
  REQUIRE(d.Connectable());
  ::chmod(node.sock.c_str(), 0666);
  // The job's own text (which names the path) is cut out; what is left must be equal.
  auto refusal = [&](const std::string& path) {
    auto r = RunJob(node.dir, *node.bob, node.sock, FolderJob(path));
    CHECK(r.rc != 0);
    std::string out = r.out;
    for (size_t at; (at = out.find(path)) != std::string::npos;) out.replace(at, path.size(), "PATH");
    return out;
  };
  const std::string exists = refusal(node.dir.path + "/secret-target");
  const std::string missing = refusal(node.dir.path + "/secret-missin");
  INFO(exists);
  CHECK_THAT(exists, Catch::Contains("not below any allowed root"));
  CHECK(exists == missing);
  // The same through '..' from inside a root.
  CHECK(refusal(allowed + "/data/../../secret-target") == refusal(allowed + "/data/../../secret-missin"));
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a daemon that cannot switch identity serves only its own uid and root, and says so") {
  testing::TestUsers users;
  SPDL_REQUIRE_TEST_USERS(users.ok, "spdl-e2e-alice and spdl-e2e-bob");
  const RunAs& alice = users.alice;
  const RunAs& bob = users.bob;
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 4, 40, 60);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  fs::create_directories(dir.path + "/run");
  REQUIRE(::chown((dir.path + "/run").c_str(), static_cast<uid_t>(alice.uid), static_cast<gid_t>(alice.gid)) == 0);
  const std::string sock = dir.path + "/run/spdld.sock";
  // spdld as Alice, without capabilities.
  DaemonProcess d(sock, {"--allow-root", dir.path + "/data", "--threads", "2"}, alice);
  REQUIRE(d.Connectable());
  ::chmod(sock.c_str(), 0666);
  auto bobs = RunJob(dir, bob, sock, FolderJob(dir.path + "/data"));
  INFO(bobs.out);
  CHECK(bobs.rc != 0);
  CHECK_THAT(bobs.out,
             Catch::Contains("serves only uid " + std::to_string(alice.uid)) && Catch::Contains("CAP_SETUID"));
  auto alices = RunJob(dir, alice, sock, FolderJob(dir.path + "/data"));
  INFO(alices.out);
  CHECK(alices.rc == 0);
  auto roots = RunJob(dir, RunAs{}, sock, FolderJob(dir.path + "/data"));
  INFO(roots.out);
  CHECK(roots.rc == 0);
  CHECK(d.Stop() == std::optional<int>(0));
}

// ---------------------------------------------------------------- bounded per connection and per user

// A daemon config with short limits, for `sock`, allowing `root`.
std::string LimitsConfig(const TempDir& dir, const std::string& sock, const std::string& root) {
  const std::string path = dir.path + "/spdld.yaml";
  WriteFile(path, "socket_path: " + sock + "\nsocket_mode: \"0666\"\nallowed_roots: [" + root +
                      "]\nworker_threads: 2\nhello_timeout_seconds: 2\nframe_timeout_seconds: 2\n"
                      "backlog_timeout_seconds: 2\nmax_reply_backlog_bytes: 1MiB\n");
  ::chmod(path.c_str(), 0644);
  return path;
}

TEST_CASE("a Status flood that never reads its replies keeps the daemon's memory bounded and closes that session") {
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 4, 40, 60);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--config", LimitsConfig(dir, sock, dir.path + "/data")});
  REQUIRE(d.Connectable());
  const long rss_before = testing::RssKiB(d.pid());

  testing::RawConnection flood(sock);
  REQUIRE(flood.connected());
  REQUIRE(flood.SendHello());
  proto::ClientMessage status;
  status.mutable_status();
  std::string frame;
  REQUIRE(proto::EncodeFrame(status, &frame));
  // Sends without ever reading, for up to 20 s, until the daemon stops taking requests (our sends
  // block: it no longer reads this session) or closes the connection.
  const int fd = flood.fd();
  uint64_t sent = 0;
  long rss_max = rss_before;
  bool closed = false;
  const auto start = std::chrono::steady_clock::now();
  auto blocked_since = start;
  bool blocked = false;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
    const ssize_t n = ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!blocked) blocked_since = std::chrono::steady_clock::now();
      blocked = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } else if (n < 0) {
      closed = true;  // EPIPE / ECONNRESET: the daemon closed it
      break;
    } else {
      blocked = false;
      sent += static_cast<uint64_t>(n);
    }
    rss_max = std::max(rss_max, testing::RssKiB(d.pid()));
    if (blocked && std::chrono::steady_clock::now() - blocked_since > std::chrono::seconds(6)) break;
  }
  // Closed by the daemon within backlog_timeout (2 s) of blocking: reading it now ends in EOF/reset.
  if (!closed) {
    char buf[65536];
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        closed = true;
        break;
      }
    }
  }
  const long growth = rss_max - rss_before;
  std::printf(
      "status flood: %.1f MiB of requests sent, daemon RSS %ld KiB before, %ld KiB at most (+%ld KiB), "
      "session closed: %s\n",
      static_cast<double>(sent) / (1 << 20), rss_before, rss_max, growth, closed ? "yes" : "no");
  CHECK(closed);
  CHECK(growth < 64 * 1024);  // the backlog bound is 1 MiB; unbounded, this grew by ~60 MiB/s
  // The daemon serves others as before.
  testing::RawConnection other(sock);
  REQUIRE(other.SendHello());
  auto reply = other.Receive();
  REQUIRE(reply);
  CHECK(reply->has_hello());
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a connection that never says Hello, or stops mid-message, is closed after its timeout") {
  TempDir dir(0755);
  fs::create_directories(dir.path + "/data");
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--config", LimitsConfig(dir, sock, dir.path + "/data")});
  REQUIRE(d.Connectable());
  testing::RawConnection silent(sock);
  testing::RawConnection half(sock);
  REQUIRE(half.SendHello());
  REQUIRE(half.Receive());
  REQUIRE(half.SendBytes(std::string("\x00\x00\x10\x00", 4) + "partial"));  // 4096 announced, 7 sent
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(silent.WaitClosed());
  CHECK(half.WaitClosed());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(s < 5.0);  // hello_timeout_seconds / frame_timeout_seconds: 2
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("1100 idle connections of one user leave another user's job exact and new connections served") {
  auto bob = testing::TestUser("spdl-e2e-bob");
  SPDL_REQUIRE_TEST_USERS(bob, "spdl-e2e-bob");
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(2, 60, 40, 80);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--config", LimitsConfig(dir, sock, dir.path + "/data")});
  REQUIRE(d.Connectable());
  // The daemon then has 1024 descriptors (what a unit without LimitNOFILE= gets): 1100 accepted
  // connections would leave its reads none.
  rlimit low{1024, 1024};
  REQUIRE(::prlimit(d.pid(), RLIMIT_NOFILE, &low, nullptr) == 0);
  const std::string job = FolderJob(dir.path + "/data", "on_error: skip\n");
  auto baseline = RunJob(dir, RunAs{}, sock, job);
  INFO(baseline.out);
  REQUIRE(baseline.rc == 0);
  auto base_json = nlohmann::json::parse(baseline.out.substr(baseline.out.find('{')), nullptr, false);
  REQUIRE(base_json.is_object());
  CHECK(base_json["samples"] == 120);

  // Bob opens 1,100 connections, says Hello on each and keeps them open.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t hog = ::fork();
  if (hog == 0) {
    rlimit many{4096, 4096};
    ::setrlimit(RLIMIT_NOFILE, &many);
    testing::BecomeInChild(*bob);
    proto::ClientMessage hello;
    hello.mutable_hello()->set_protocol_version(proto::kProtocolVersion);
    hello.mutable_hello()->set_client_name("idle");
    std::string frame;
    proto::EncodeFrame(hello, &frame);
    int opened = 0;
    for (int i = 0; i < 1100; ++i) {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un addr{};
      addr.sun_family = AF_UNIX;
      std::strncpy(addr.sun_path, sock.c_str(), sizeof(addr.sun_path) - 1);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
        ++opened;
        (void)::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
      }
    }
    (void)::write(ready[1], &opened, sizeof(opened));
    for (;;) ::pause();
  }
  ::close(ready[1]);
  int opened = 0;
  REQUIRE(::read(ready[0], &opened, sizeof(opened)) == static_cast<ssize_t>(sizeof(opened)));
  ::close(ready[0]);
  std::printf("idle connections: %d of 1100 connected; daemon descriptors now %d\n", opened, testing::FdCount(d.pid()));
  // Root's job, meanwhile: every sample, none skipped, the same pixels.
  auto during = RunJob(dir, RunAs{}, sock, job);
  INFO(during.out);
  CHECK(during.rc == 0);
  auto json = nlohmann::json::parse(during.out.substr(during.out.find('{')), nullptr, false);
  REQUIRE(json.is_object());
  CHECK(json["samples"] == 120);
  CHECK(json["skipped"] == 0);
  CHECK(json["pixel_checksum"] == base_json["pixel_checksum"]);
  CHECK(testing::FdCount(d.pid()) < 400);  // max_connections_per_uid (128) bounds Bob's share
  // And new connections of another user are served.
  testing::RawConnection other(sock);
  REQUIRE(other.SendHello());
  auto reply = other.Receive();
  REQUIRE(reply);
  CHECK(reply->has_hello());
  ::kill(hog, SIGKILL);
  ::waitpid(hog, nullptr, 0);
  CHECK(d.Stop() == std::optional<int>(0));
}

// ---------------------------------------------------------------- decode memory inside the budget

TEST_CASE("two 13000x13000 16-bit PNGs are refused within the memory budget, the daemon's RSS bounded") {
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 6, 40, 60);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  // Two huge 16-bit RGB PNGs of zeros (~1 MiB each on disk, 2.7 GB to decode), written by zlib.
  const std::string script =
      "import struct, sys, zlib\n"
      "w = h = 13000\n"
      "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
      "c = zlib.compressobj(9)\n"
      "row = bytes(1 + w * 6)\n"
      "parts = [c.compress(row) for _ in range(h)] + [c.flush()]\n"
      "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 16, 2, 0, 0, 0))\n"
      "png += chunk(b'IDAT', b''.join(parts)) + chunk(b'IEND', b'')\n"
      "for p in sys.argv[1:]: open(p, 'wb').write(png)\n";
  WriteFile(dir.path + "/huge.py", script);
  std::string out;
  REQUIRE(testing::RunCommand({"/usr/bin/python3", dir.path + "/huge.py", dir.path + "/data/class_000/huge_a.png",
                               dir.path + "/data/class_000/huge_b.png"},
                              &out) == 0);
  const std::string sock = dir.path + "/spdld.sock";
  WriteFile(dir.path + "/spdld.yaml", "socket_path: " + sock + "\nallowed_roots: [" + dir.path +
                                          "/data]\nworker_threads: 2\nmemory_budget_bytes: 1GiB\n");
  DaemonProcess d(sock, {"--config", dir.path + "/spdld.yaml"});
  REQUIRE(d.Connectable());
  const long rss_before = testing::RssKiB(d.pid());
  long rss_max = rss_before;
  std::atomic<bool> done{false};
  std::thread watch([&] {
    while (!done) {
      rss_max = std::max(rss_max, testing::RssKiB(d.pid()));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto r = RunJob(dir, RunAs{}, sock,
                  "source: {type: image_folder, root: " + dir.path +
                      "/data, extensions: [.jpg, .png]}\nbatch: {size: 4}\ntransforms: [{resize: {height: 16, width: "
                      "16}}]\nprefetch: 2\n");
  done = true;
  watch.join();
  INFO(r.out);
  std::printf("huge PNGs: daemon RSS %ld KiB before, %ld KiB at most (+%ld KiB)\n", rss_before, rss_max,
              rss_max - rss_before);
  CHECK(r.rc == 0);
  CHECK_THAT(r.out, Catch::Contains("\"skipped\":2"));
  CHECK(rss_max - rss_before < 512 * 1024);  // a decode of one would take 2.7 GB
  // The refusal names the image and the budget.
  CHECK(d.Stop() == std::optional<int>(0));
}

// ---------------------------------------------------------------- a fair share of the memory budget

TEST_CASE("one user cannot take more than max_budget_share_per_uid of the memory budget while another waits") {
  auto bob = testing::TestUser("spdl-e2e-bob");
  SPDL_REQUIRE_TEST_USERS(bob, "spdl-e2e-bob");
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 40, 40, 60);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  const std::string sock = dir.path + "/spdld.sock";
  WriteFile(dir.path + "/spdld.yaml", "socket_path: " + sock + "\nsocket_mode: \"0666\"\nallowed_roots: [" + dir.path +
                                          "/data]\nworker_threads: 2\nmemory_budget_bytes: 64MiB\n");
  DaemonProcess d(sock, {"--config", dir.path + "/spdld.yaml"});
  REQUIRE(d.Connectable());
  // 512x512x3 rows: 0.75 MiB each.
  auto job = [&](int batch, int prefetch) {
    return "source: {type: image_folder, root: " + dir.path + "/data}\nbatch: {size: " + std::to_string(batch) +
           "}\ntransforms: [{resize: {height: 512, width: 512}}]\nprefetch: " + std::to_string(prefetch) + "\n";
  };
  // Bob alone: a 30 MiB job, endless, admitted (no one else has jobs).
  const std::string bob_yaml = dir.path + "/bob.yaml";
  WriteFile(bob_yaml, job(8, 5));
  ::chmod(bob_yaml.c_str(), 0644);
  auto bobs = testing::EndlessClient(*bob, sock, bob_yaml);
  // Wait until Bob's job runs.
  REQUIRE(testing::WaitForJobOf(sock, bob->uid));
  // Root asks for 36 MiB: over the budget (30 + 36 > 64), refused: root now waits.
  auto roots = RunJob(dir, RunAs{}, sock, job(8, 6));
  INFO(roots.out);
  CHECK(roots.rc != 0);
  CHECK_THAT(roots.out, Catch::Contains("memory_budget"));
  // Bob asks for 12 MiB more: the budget has room (42 <= 64), but not his share (42 > 32) while root waits.
  auto more = RunJob(dir, *bob, sock, job(8, 2));
  INFO(more.out);
  CHECK(more.rc != 0);
  CHECK_THAT(more.out, Catch::Contains("max_budget_share_per_uid"));
  bobs->Kill();
  // Bob's job gone, root's fits.
  bool admitted = false;
  for (int i = 0; i < 100 && !admitted; ++i) {
    auto again = RunJob(dir, RunAs{}, sock, job(8, 6));
    admitted = again.rc == 0;
    if (!admitted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(admitted);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("one user's slow source opens cannot take every prepare thread from another user") {
  auto bob = testing::TestUser("spdl-e2e-bob");
  SPDL_REQUIRE_TEST_USERS(bob, "spdl-e2e-bob");
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 8, 40, 60);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  const std::string sock = dir.path + "/spdld.sock";
  const std::string gate = dir.path + "/gate-open";
  ::setenv("SPDLD_TEST_OPEN_GATE", gate.c_str(), 1);  // jobs named gated* wait for this file to open
  DaemonProcess d(sock, {"--config", LimitsConfig(dir, sock, dir.path + "/data")});
  ::unsetenv("SPDLD_TEST_OPEN_GATE");
  REQUIRE(d.Connectable());
  // Root submits eight jobs (max_jobs_per_client) whose sources take "forever" to open: as many
  // as the prepare pool has threads.
  std::vector<std::unique_ptr<testing::RawConnection>> slow;
  for (int i = 0; i < 8; ++i) {
    auto c = std::make_unique<testing::RawConnection>(sock);
    REQUIRE(c->SendHello());
    REQUIRE(c->Receive());
    proto::ClientMessage m;
    m.mutable_submit()->set_config_yaml(FolderJob(dir.path + "/data"));
    m.mutable_submit()->set_config_name("gated.yaml");
    m.mutable_submit()->set_epochs(1);
    REQUIRE(c->Send(m));
    slow.push_back(std::move(c));
  }
  // Bob's job is prepared and runs meanwhile: root holds only its 4 prepare slots.
  const auto t0 = std::chrono::steady_clock::now();
  auto bobs = RunJob(dir, *bob, sock, FolderJob(dir.path + "/data"));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(bobs.out);
  std::printf("prepare slots: Bob's job ran in %.2f s while root's 8 source opens were held\n", s);
  CHECK(bobs.rc == 0);
  CHECK(s < 30);
  // Open the gate: root's jobs are all accepted in turn.
  WriteFile(gate, "");
  for (auto& c : slow) {
    auto reply = c->Receive();
    REQUIRE(reply);
    CHECK(reply->has_accepted());
  }
  slow.clear();
  CHECK(d.Stop() == std::optional<int>(0));
}

// ---------------------------------------------------------------- a slow HTTP server and the I/O pool

// Seconds root's local job takes to run one epoch.
double TimeJob(const TempDir& dir, const std::string& sock, const std::string& yaml, int* rc) {
  const auto t0 = std::chrono::steady_clock::now();
  auto r = RunJob(dir, RunAs{}, sock, yaml);
  *rc = r.rc;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST_CASE("a slow HTTP server used by one user stalls another user's local job by a bounded factor") {
  auto bob = testing::TestUser("spdl-e2e-bob");
  SPDL_REQUIRE_TEST_USERS(bob, "spdl-e2e-bob");
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 48, 40, 60);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  // A server that answers every request after 1 s (threaded: it never refuses a connection).
  WriteFile(dir.path + "/slow.py",
            "import http.server, sys, time\n"
            "body = open(sys.argv[1], 'rb').read()\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        time.sleep(1.0)\n"
            "        self.send_response(200)\n"
            "        self.send_header('Content-Length', str(len(body)))\n"
            "        self.end_headers()\n"
            "        self.wfile.write(body)\n"
            "    def log_message(self, *a): pass\n"
            "s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)\n"
            "print(s.server_address[1], flush=True)\n"
            "s.serve_forever()\n");
  const pid_t server = testing::SpawnToFile(
      {"/usr/bin/python3", dir.path + "/slow.py", dir.path + "/data/class_000/img_00000.jpg"}, dir.path + "/port");
  int port = 0;
  for (int i = 0; i < 500 && port == 0; ++i) {
    auto bytes = testing::ReadBytes(dir.path + "/port");
    if (!bytes.empty() && bytes.back() == '\n') port = std::stoi(std::string(bytes.begin(), bytes.end()));
    if (port == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(port > 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  std::string urls;
  for (int i = 0; i < 400; ++i) urls += url + "/img_" + std::to_string(i) + ".jpg\n";
  WriteFile(dir.path + "/data/urls.txt", urls);
  const std::string sock = dir.path + "/spdld.sock";
  WriteFile(dir.path + "/spdld.yaml", "socket_path: " + sock + "\nsocket_mode: \"0666\"\nallowed_roots: [" + dir.path +
                                          "/data]\nworker_threads: 2\nio_threads: 4\nallowed_url_prefixes: [" + url +
                                          "/]\n");
  DaemonProcess d(sock, {"--config", dir.path + "/spdld.yaml"});
  REQUIRE(d.Connectable());
  const std::string local = FolderJob(dir.path + "/data");
  int rc = -1;
  const double alone = TimeJob(dir, sock, local, &rc);
  REQUIRE(rc == 0);
  // Bob's endless HTTP job against the slow server, asking for every I/O thread (4).
  const std::string bob_yaml = dir.path + "/bob-http.yaml";
  WriteFile(bob_yaml, "source: {type: http, list: " + dir.path +
                          "/data/urls.txt, max_in_flight: 64}\nstages: {read: {concurrency: 4}}\nbatch: {size: "
                          "8}\ntransforms: [{resize: {height: 16, "
                          "width: 16}}]\nprefetch: 8\n");
  ::chmod(bob_yaml.c_str(), 0644);
  auto bobs = testing::EndlessClient(*bob, sock, bob_yaml);
  // Its job runs, and its reads wait on the server.
  REQUIRE(testing::WaitForJobOf(sock, bob->uid));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const double shared = TimeJob(dir, sock, local, &rc);
  std::printf("slow HTTP: root's local job %.2f s alone, %.2f s beside Bob's HTTP job (%.1fx)\n", alone, shared,
              shared / alone);
  CHECK(rc == 0);
  // Bob's reads may hold at most half of the 4 I/O threads: root's 48 reads never wait ~1 s each.
  CHECK(shared < 5 * alone + 3.0);
  bobs->Kill();
  ::kill(server, SIGKILL);
  ::waitpid(server, nullptr, 0);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a job that delivered no sample exits non-zero in spdl-client, and no batch of 0 rows is sent") {
  TempDir dir(0755);
  fs::create_directories(dir.path + "/data/class_000");
  for (int i = 0; i < 6; ++i) WriteFile(dir.path + "/data/class_000/bad_" + std::to_string(i) + ".jpg", "\xff\xd8 no");
  const std::string sock = dir.path + "/spdld.sock";
  DaemonProcess d(sock, {"--allow-root", dir.path + "/data", "--threads", "2"});
  REQUIRE(d.Connectable());
  auto r = RunJob(dir, RunAs{}, sock, FolderJob(dir.path + "/data", "on_error: skip\n"));
  INFO(r.out);
  CHECK(r.rc == 1);
  CHECK_THAT(r.out, Catch::Contains("ended without delivering a single sample (6 skipped)"));
  CHECK_THAT(r.out, Catch::Contains("\"batches\":0"));
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("the metrics endpoint shows each user only their own jobs") {
  auto bob = testing::TestUser("spdl-e2e-bob");
  SPDL_REQUIRE_TEST_USERS(bob, "spdl-e2e-bob");
  TempDir dir(0755);
  const testdata::DatasetOptions o = testing::SmallImages(1, 8, 40, 60);
  REQUIRE(testdata::MakeImageFolder(dir.path + "/data", o).ok());
  const std::string sock = dir.path + "/spdld.sock";
  const int port = 20000 + static_cast<int>(::getpid() % 20000);
  WriteFile(dir.path + "/spdld.yaml", "socket_path: " + sock + "\nsocket_mode: \"0666\"\nallowed_roots: [" + dir.path +
                                          "/data]\nworker_threads: 2\nmetrics_port: " + std::to_string(port) + "\n");
  DaemonProcess d(sock, {"--config", dir.path + "/spdld.yaml"});
  REQUIRE(d.Connectable());
  // Root's job, endless, in the background.
  const std::string yaml = dir.path + "/root.yaml";
  WriteFile(yaml, FolderJob(dir.path + "/data"));
  auto roots = testing::EndlessClient(RunAs{}, sock, yaml);
  const std::vector<std::string> scrape = {
      "/usr/bin/python3", "-c",
      "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:" + std::to_string(port) +
          "/metrics').read().decode())"};
  std::string as_root;
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    as_root.clear();
    testing::RunCommand(scrape, &as_root);
    seen = as_root.find("spdld_job_samples_total{") != std::string::npos;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  INFO(as_root);
  CHECK(seen);
  CHECK_THAT(as_root, Catch::Contains("uid=\"0\""));
  std::string as_bob;
  REQUIRE(RunCommandAs(*bob, scrape, &as_bob) == 0);
  INFO(as_bob);
  CHECK_THAT(as_bob, Catch::Contains("spdld_jobs "));                // the daemon-wide figures
  CHECK_THAT(as_bob, !Catch::Contains("spdld_job_samples_total{"));  // none of root's jobs
  roots->Kill();
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
