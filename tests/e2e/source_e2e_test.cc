// End to end for the sample sources: a real spdld reading a file list, real tar shards (written
// by the tar command) and a real HTTP server on loopback (Python's http.server), driven by the
// real spdl-client. For each source: two ranks cover an epoch exactly once with the right labels,
// and a run stopped with --stop-after and resumed with --resume records exactly the batches of an
// uninterrupted run. HTTP failures (404, a server that hangs up, one that never answers) fail the
// job with the HTTP status or the reason in the client's error.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "temp_dir.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;

using spdl::testing::TempDir;    // temp_dir.h
using spdl::testing::WriteFile;  // temp_dir.h

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Runs `argv`; its stdout into *out, its stderr into *err. Returns the exit code.
int Run(const std::vector<std::string>& argv, std::string* out, std::string* err) {
  char tmpl[] = "/tmp/spdl-src-e2e-stderr-XXXXXX";
  const int err_fd = ::mkstemp(tmpl);
  REQUIRE(err_fd >= 0);
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(err_fd, 2);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    _exit(127);
  }
  ::close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof(buf))) > 0) out->append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(err_fd);
  std::ifstream e(tmpl);
  *err = std::string(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
  ::unlink(tmpl);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool Connectable(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// A listening socket on 127.0.0.1. With `hang_up`, a thread accepts each connection and closes it
// at once (an empty reply); without, nobody ever accepts, so a request is sent and never answered.
class BadServer {
 public:
  explicit BadServer(bool hang_up) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(fd_, 64) == 0);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    if (hang_up) {
      thread_ = std::thread([this] {
        while (!stop_.load()) {
          const int c = ::accept(fd_, nullptr, nullptr);
          if (c >= 0) ::close(c);
        }
      });
    }
  }
  ~BadServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // wakes the accept
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Python's http.server serving `dir` on 127.0.0.1.
class PythonHttpServer {
 public:
  explicit PythonHttpServer(const std::string& dir) : port_(FreePort()) {
    pid_ = ::fork();
    if (pid_ == 0) {
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, 1);
      ::dup2(null, 2);
      const std::string port = std::to_string(port_);
      ::execl("/usr/bin/python3", "python3", "-m", "http.server", "--bind", "127.0.0.1", port.c_str(), "--directory",
              dir.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (std::chrono::steady_clock::now() < deadline && !Connectable(port_)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~PythonHttpServer() {
    ::kill(pid_, SIGTERM);
    ::waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int port_;
  pid_t pid_ = -1;
};

// A small generated image folder under dir/data and the daemon on dir/spdld.sock.
struct Fixture {
  Fixture() {
    testdata::DatasetOptions o;
    o.classes = 3;
    o.images_per_class = 8;  // 24 images: 12 per rank, batches of 5 leave a partial one
    o.min_side = 48;
    o.max_side = 120;
    auto r = testdata::MakeImageFolder(data(), o);
    REQUIRE(r.ok());
    images = *r;
  }
  std::string data() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  std::string Job(const std::string& source_yaml, const std::string& extra = "") const {
    const std::string path = dir.path + "/job-" + std::to_string(++jobs) + ".yaml";
    WriteFile(path, source_yaml +
                        "sampler: {shuffle: true, seed: 11}\n"
                        "batch: {size: 5}\n"
                        "transforms: [{resize: {shorter: 40}}, {center_crop: {size: 32}}]\n"
                        "prefetch: 2\n" +
                        extra);
    return path;
  }

  TempDir dir;
  std::vector<testdata::GeneratedImage> images;
  mutable int jobs = 0;
};

const std::string kClient = std::string(SPDL_BIN_DIR) + "/spdl-client";

struct ClientRun {
  int rc = 0;
  nlohmann::json json;
  std::string err;
};

ClientRun RunClient(const Fixture& f, const std::string& job, std::vector<std::string> extra) {
  std::vector<std::string> argv = {kClient, "--socket", f.socket(), "--config", job, "--json", "--no-checksum"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  ClientRun r;
  std::string out;
  r.rc = Run(argv, &out, &r.err);
  if (r.rc == 0) r.json = nlohmann::json::parse(out);
  return r;
}

// Two ranks of one epoch record every key of `expected` exactly once, each with its label.
void CheckTwoRanksCoverAnEpoch(const Fixture& f, const std::string& job,
                               const std::map<std::string, int64_t>& expected) {
  std::map<std::string, int> seen;
  for (int rank : {0, 1}) {
    const std::string record = f.dir.path + "/rank" + std::to_string(rank) + ".csv";
    ClientRun r =
        RunClient(f, job, {"--rank", std::to_string(rank), "--world-size", "2", "--epochs", "1", "--record", record});
    INFO(r.err);
    REQUIRE(r.rc == 0);
    CHECK(r.json.at("samples") == expected.size() / 2);
    CHECK(r.json.at("skipped") == 0);
    for (const std::string& line : Lines(record)) {
      std::vector<std::string> cols;
      std::stringstream ss(line);
      for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
      REQUIRE(cols.size() == 4);
      CHECK(cols[0] == "0");
      CHECK(cols[1] == std::to_string(rank));
      INFO(cols[2]);
      REQUIRE(expected.count(cols[2]) == 1);
      CHECK(std::stoll(cols[3]) == expected.at(cols[2]));
      ++seen[cols[2]];
    }
  }
  CHECK(seen.size() == expected.size());
  for (const auto& [key, count] : seen) CHECK(count == 1);
}

// Rank 1 of 2, two epochs: stopped after `stop` batches and resumed, it records the same lines as
// an uninterrupted run.
void CheckStopAndResume(const Fixture& f, const std::string& job) {
  const std::vector<std::string> common = {"--rank", "1", "--world-size", "2", "--epochs", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = common;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  const std::string full_csv = f.dir.path + "/full.csv";
  ClientRun full = RunClient(f, job, with({"--record", full_csv}));
  INFO(full.err);
  REQUIRE(full.rc == 0);
  const auto full_lines = Lines(full_csv);
  REQUIRE(full_lines.size() == 24);  // 12 per epoch
  CHECK(full.json.at("batches") == 6);
  for (int stop : {1, 3, 4}) {  // inside the first epoch, on its last batch, inside the second
    INFO("stop after " << stop);
    ClientRun a = RunClient(f, job, with({"--stop-after", std::to_string(stop), "--record", f.dir.path + "/a.csv"}));
    INFO(a.err);
    REQUIRE(a.rc == 0);
    REQUIRE(a.json.at("state").is_string());
    CHECK(a.json.at("batches") == stop);
    ClientRun b =
        RunClient(f, job, with({"--resume", a.json.at("state").get<std::string>(), "--record", f.dir.path + "/b.csv"}));
    INFO(b.err);
    REQUIRE(b.rc == 0);
    auto joined = Lines(f.dir.path + "/a.csv");
    for (auto& l : Lines(f.dir.path + "/b.csv")) joined.push_back(l);
    CHECK(joined == full_lines);
  }
}

TEST_CASE("file_list source: two ranks cover an epoch, and a stopped run resumes exactly") {
  Fixture f;
  std::string list = "path,label\n";
  std::map<std::string, int64_t> expected;
  for (size_t i = 0; i < f.images.size(); ++i) {
    // Labels of our own, to see that they come from the list and not from the folder names.
    const int64_t label = static_cast<int64_t>(100 + i % 7);
    list += f.images[i].path + "," + std::to_string(label) + "\n";
    expected[f.images[i].path] = label;
  }
  WriteFile(f.dir.path + "/lists/train.csv", list);
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path, "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string job =
      f.Job("source: {type: file_list, list: " + f.dir.path + "/lists/train.csv, root: " + f.data() + "}\n");
  CheckTwoRanksCoverAnEpoch(f, job, expected);
  CheckStopAndResume(f, job);

  {  // a token of another dataset is refused
    ClientRun a = RunClient(f, job, {"--stop-after", "1"});
    REQUIRE(a.rc == 0);
    WriteFile(f.dir.path + "/lists/other.csv", list + f.images[0].path + ",1\n");  // one sample more
    const std::string other =
        f.Job("source: {type: file_list, list: " + f.dir.path + "/lists/other.csv, root: " + f.data() + "}\n");
    ClientRun b = RunClient(f, other, {"--resume", a.json.at("state").get<std::string>()});
    CHECK(b.rc == 1);
    CHECK_THAT(b.err, Catch::Contains("belongs to another job"));
  }
  {  // a list outside the allowed roots is refused
    ClientRun r = RunClient(f, f.Job("source: {type: file_list, list: /etc/hostname}\n"), {});
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains("source.list") && Catch::Contains("not below any allowed root"));
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("tar source: shards written by tar, two ranks cover an epoch, a stopped run resumes exactly") {
  Fixture f;
  // WebDataset layout: KEY.jpg + KEY.cls, 24 samples over 4 shards of 6.
  const std::string staging = f.dir.path + "/staging";
  std::map<std::string, int64_t> expected;
  std::vector<std::vector<std::string>> members(4);
  for (size_t i = 0; i < f.images.size(); ++i) {
    const std::string key = "s/sample" + std::to_string(1000 + i);
    fs::create_directories(staging + "/s");
    fs::copy_file(f.data() + "/" + f.images[i].path, staging + "/" + key + ".jpg");
    WriteFile(staging + "/" + key + ".cls", std::to_string(f.images[i].label) + "\n");
    members[i % 4].push_back(key + ".jpg");
    members[i % 4].push_back(key + ".cls");
    expected[key] = f.images[i].label;
  }
  fs::create_directories(f.dir.path + "/shards");
  for (int s = 0; s < 4; ++s) {
    std::vector<std::string> argv = {"/usr/bin/tar", "-cf",
                                     f.dir.path + "/shards/train-00" + std::to_string(s) + ".tar", "-C", staging};
    argv.insert(argv.end(), members[s].begin(), members[s].end());
    REQUIRE(testing::RunCommand(argv) == 0);
  }
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path + "/shards", "--threads", "2"});
  REQUIRE(d.Connectable());
  const std::string job =
      f.Job("source: {type: tar, shards: '" + f.dir.path + "/shards/train-{000..003}.tar', shuffle_buffer: 4}\n");
  CheckTwoRanksCoverAnEpoch(f, job, expected);
  CheckStopAndResume(f, job);

  {  // the shuffle buffer changes the order, and so the resume fingerprint
    ClientRun a = RunClient(f, job, {"--stop-after", "1"});
    REQUIRE(a.rc == 0);
    const std::string other =
        f.Job("source: {type: tar, shards: '" + f.dir.path + "/shards/train-{000..003}.tar', shuffle_buffer: 5}\n");
    ClientRun b = RunClient(f, other, {"--resume", a.json.at("state").get<std::string>()});
    CHECK(b.rc == 1);
    CHECK_THAT(b.err, Catch::Contains("belongs to another job"));
  }
  {  // a missing shard is named
    ClientRun r =
        RunClient(f, f.Job("source: {type: tar, shards: '" + f.dir.path + "/shards/train-{000..004}.tar'}\n"), {});
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains("source.shards") && Catch::Contains("train-004.tar"));
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("http source: a loopback http.server, two ranks, exact resume, and HTTP failures named") {
  Fixture f;
  PythonHttpServer server(f.data());
  REQUIRE(Connectable(server.port()));
  BadServer hangs_up(true);
  BadServer silent(false);
  std::string urls;
  std::map<std::string, int64_t> expected;
  for (const auto& img : f.images) {
    const std::string url = server.url() + "/" + img.path;
    urls += url + "," + std::to_string(img.label) + "\n";
    expected[url] = img.label;
  }
  WriteFile(f.dir.path + "/lists/urls.csv", urls);
  const std::string config = f.dir.path + "/spdld.yaml";
  WriteFile(config, "allowed_roots: [" + f.dir.path + "/lists]\nallowed_url_prefixes: [" + server.url() +
                        ", http://127.0.0.1:" + std::to_string(hangs_up.port()) +
                        ", http://127.0.0.1:" + std::to_string(silent.port()) + "]\nworker_threads: 2\n");
  DaemonProcess d(f.socket(), {"--config", config});
  REQUIRE(d.Connectable());
  const std::string job = f.Job("source: {type: http, list: " + f.dir.path + "/lists/urls.csv, max_in_flight: 4}\n");
  CheckTwoRanksCoverAnEpoch(f, job, expected);
  CheckStopAndResume(f, job);

  {  // base_url + relative paths; a 404 fails the job with the status and the URL
    WriteFile(f.dir.path + "/lists/rel.txt", f.images[0].path + "\nclass_000/missing.jpg\n" + f.images[1].path + "\n");
    const std::string rel =
        f.Job("source: {type: http, list: " + f.dir.path + "/lists/rel.txt, base_url: '" + server.url() + "'}\n",
              "on_error: fail\n");
    ClientRun r = RunClient(f, rel, {});
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains("HTTP 404") && Catch::Contains(server.url() + "/class_000/missing.jpg"));
    // With on_error: skip the same job delivers the two good samples and counts the bad one.
    const std::string skip =
        f.Job("source: {type: http, list: " + f.dir.path + "/lists/rel.txt, base_url: '" + server.url() + "'}\n");
    ClientRun s = RunClient(f, skip, {});
    INFO(s.err);
    REQUIRE(s.rc == 0);
    CHECK(s.json.at("samples") == 2);
    CHECK(s.json.at("skipped") == 1);
  }
  {  // a server that hangs up is retried, then named
    WriteFile(f.dir.path + "/lists/hangup.txt", "http://127.0.0.1:" + std::to_string(hangs_up.port()) + "/x.jpg\n");
    ClientRun r = RunClient(
        f,
        f.Job("source: {type: http, list: " + f.dir.path + "/lists/hangup.txt, max_attempts: 2}\n", "on_error: fail\n"),
        {});
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains("/x.jpg") && Catch::Contains("gave up after 2 attempts"));
  }
  {  // a server that never answers times out
    WriteFile(f.dir.path + "/lists/silent.txt", "http://127.0.0.1:" + std::to_string(silent.port()) + "/y.jpg\n");
    ClientRun r = RunClient(f,
                            f.Job("source: {type: http, list: " + f.dir.path +
                                      "/lists/silent.txt, timeout_ms: 300, connect_timeout_ms: 300}\n",
                                  "on_error: fail\n"),
                            {});
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains("/y.jpg") && Catch::Contains("no complete response within 300 ms"));
  }
  {  // a URL outside allowed_url_prefixes is refused
    WriteFile(f.dir.path + "/lists/elsewhere.txt", "http://127.0.0.2:1/z.jpg\n");
    ClientRun r = RunClient(f, f.Job("source: {type: http, list: " + f.dir.path + "/lists/elsewhere.txt}\n"), {});
    CHECK(r.rc == 1);
    CHECK_THAT(r.err, Catch::Contains("source.list") && Catch::Contains("127.0.0.2"));
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("http source: a daemon without allowed_url_prefixes refuses http jobs") {
  Fixture f;
  WriteFile(f.dir.path + "/lists/urls.txt", "http://127.0.0.1:1/a.jpg\n");
  DaemonProcess d(f.socket(), {"--allow-root", f.dir.path});
  REQUIRE(d.Connectable());
  ClientRun r = RunClient(f, f.Job("source: {type: http, list: " + f.dir.path + "/lists/urls.txt}\n"), {});
  CHECK(r.rc == 1);
  CHECK_THAT(r.err, Catch::Contains("allowed_url_prefixes"));
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
