// Tests of the SampleSource implementations (io/sample_source.h and friends), each on real files:
// real image folders, list files, tar shards (written byte by byte here, and by the tar CLI), and a
// real HTTP server on 127.0.0.1 (a scripted one inside the test, and Python's http.server).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/brace_expand.h"
#include "io/file_list_source.h"
#include "io/http_source.h"
#include "io/sample_list.h"
#include "io/sample_source.h"
#include "io/tar_reader.h"
#include "io/tar_shard_source.h"
#include "skip.h"
#include "temp_dir.h"

extern char** environ;

namespace spdl::io {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;
using Clock = std::chrono::steady_clock;

using spdl::testing::TempDir;  // temp_dir.h

std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// Distinct, reproducible bytes for a sample.
std::string Bytes(const std::string& seed, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>()(seed)));
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

int Run(const std::string& cmd) { return std::system(cmd.c_str()); }

// ---------------------------------------------------------------- tar, written by hand

// Builds a tar archive in memory, header by header.
class TarWriter {
 public:
  // A plain member; `prefix` goes in the POSIX ustar prefix field.
  TarWriter& File(const std::string& name, const std::string& data, const std::string& prefix = "", char type = '0') {
    out_ += Header(name, data.size(), type, prefix);
    Data(data);
    return *this;
  }
  // A member whose name is given by a GNU 'L' header (the ustar name field holds a truncated one).
  TarWriter& GnuLong(const std::string& name, const std::string& data) {
    out_ += Header("././@LongLink", name.size() + 1, 'L', "", /*gnu=*/true);
    Data(name + '\0');
    out_ += Header(name.substr(0, 99), data.size(), '0', "", /*gnu=*/true);
    Data(data);
    return *this;
  }
  // A member whose name is given by a pax 'x' header; extra pax records may be added.
  TarWriter& Pax(const std::string& name, const std::string& data, const std::string& extra_records = "") {
    const std::string records = Record("path", name) + extra_records;
    out_ += Header("PaxHeaders/x", records.size(), 'x');
    Data(records);
    out_ += Header("truncated-name-that-must-be-ignored", data.size(), '0');
    Data(data);
    return *this;
  }
  TarWriter& Dir(const std::string& name) {
    out_ += Header(name, 0, '5');
    return *this;
  }
  TarWriter& End() {
    out_ += std::string(1024, '\0');
    return *this;
  }
  std::string& bytes() { return out_; }

  // One pax record "LEN key=value\n", LEN counting itself.
  static std::string Record(const std::string& key, const std::string& value) {
    const size_t body = key.size() + value.size() + 3;  // ' ', '=', '\n'
    size_t len = body + 1;
    while (std::to_string(len).size() + body != len) ++len;
    return std::to_string(len) + " " + key + "=" + value + "\n";
  }

 private:
  static std::string Header(const std::string& name, uint64_t size, char type, const std::string& prefix = "",
                            bool gnu = false) {
    std::string h(512, '\0');
    REQUIRE(name.size() <= 100);
    REQUIRE(prefix.size() <= 155);
    h.replace(0, name.size(), name);
    h.replace(100, 8, "0000644", 8);
    h.replace(108, 8, "0001750", 8);
    h.replace(116, 8, "0001750", 8);
    char num[16];
    std::snprintf(num, sizeof num, "%011llo", static_cast<unsigned long long>(size));
    h.replace(124, 12, num, 12);
    std::snprintf(num, sizeof num, "%011o", 1700000000u);
    h.replace(136, 12, num, 12);
    h.replace(148, 8, "        ");
    h[156] = type;
    if (gnu) {
      h.replace(257, 8, "ustar  \0", 8);
    } else {
      h.replace(257, 6, "ustar\0", 6);
      h.replace(263, 2, "00");
      h.replace(345, prefix.size(), prefix);
    }
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(num, sizeof num, "%06o", sum);
    h.replace(148, 7, num, 7);  // six digits and a NUL; the eighth byte stays a space
    return h;
  }
  void Data(const std::string& d) {
    out_ += d;
    out_.append((512 - d.size() % 512) % 512, '\0');
  }

  std::string out_;
};

Result<std::vector<TarMember>> List(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Internal("open " + path);
  struct stat st {};
  ::fstat(fd, &st);
  std::vector<TarMember> members;
  Status s = ListTarMembers(fd, static_cast<uint64_t>(st.st_size), path, &members);
  ::close(fd);
  if (!s.ok()) return s;
  return members;
}

// ---------------------------------------------------------------- HTTP servers

// A scripted HTTP/1.1 server on 127.0.0.1 (an ephemeral port), keep-alive, one thread per
// connection. The handler answers each request from its path and how many times the path was
// requested before (1 on the first).
class TestHttpServer {
 public:
  struct Reply {
    int status = 200;
    std::string reason = "OK";
    std::string body;
    std::string headers;  // extra header lines, each ending in "\r\n"
    int delay_ms = 0;     // wait before answering
    bool hang = false;    // read the request, never answer
  };
  using Handler = std::function<Reply(const std::string& path, int nth)>;

  explicit TestHttpServer(Handler handler) : handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listen_fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listen_fd_, 64) == 0);
    socklen_t len = sizeof addr;
    REQUIRE(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~TestHttpServer() {
    stop_ = true;
    acceptor_.join();
    std::vector<int> fds;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fds = conn_fds_;
    }
    for (int fd : fds) ::shutdown(fd, SHUT_RDWR);
    for (std::thread& t : conn_threads_) t.join();
    for (int fd : fds) ::close(fd);
    ::close(listen_fd_);
  }

  int port() const { return port_; }
  std::string Url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }
  int connections() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(conn_fds_.size());
  }
  int requests(const std::string& path) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = counts_.find(path);
    return it == counts_.end() ? 0 : it->second;
  }
  int max_active() const { return max_active_; }

 private:
  void Accept() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::lock_guard<std::mutex> lock(mu_);
      conn_fds_.push_back(fd);
      conn_threads_.emplace_back([this, fd] { Serve(fd); });
    }
  }

  // Waits for input on fd; false when stopping, or the peer closed or failed.
  bool Recv(int fd, std::string* buf) {
    for (;;) {
      if (stop_) return false;
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, 50);
      if (r == 0) continue;
      if (r < 0) return false;
      char tmp[4096];
      const ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf->append(tmp, static_cast<size_t>(n));
      return true;
    }
  }

  void Serve(int fd) {
    std::string buf;
    for (;;) {
      size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        if (!Recv(fd, &buf)) return;
      }
      const std::string request = buf.substr(0, end);
      buf.erase(0, end + 4);
      const size_t sp1 = request.find(' '), sp2 = request.find(' ', sp1 + 1);
      const std::string path = request.substr(sp1 + 1, sp2 - sp1 - 1);
      int nth;
      {
        std::lock_guard<std::mutex> lock(mu_);
        nth = ++counts_[path];
      }
      const Reply r = handler_(path, nth);
      if (r.hang) {
        std::string ignored;
        while (Recv(fd, &ignored)) {
        }
        return;
      }
      const int now = ++active_;
      int seen = max_active_;
      while (now > seen && !max_active_.compare_exchange_weak(seen, now)) {
      }
      if (r.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(r.delay_ms));
      const std::string response = "HTTP/1.1 " + std::to_string(r.status) + " " + r.reason +
                                   "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\n" + r.headers +
                                   "\r\n" + r.body;
      --active_;
      size_t sent = 0;
      while (sent < response.size()) {
        const ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
        if (n <= 0) return;
        sent += static_cast<size_t>(n);
      }
    }
  }

  Handler handler_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> active_{0};
  std::atomic<int> max_active_{0};
  std::thread acceptor_;
  mutable std::mutex mu_;
  std::vector<int> conn_fds_;              // guarded by mu_
  std::vector<std::thread> conn_threads_;  // guarded by mu_ (joined after acceptor_)
  std::map<std::string, int> counts_;      // guarded by mu_
};

// A port on 127.0.0.1 that nothing listens on (bound, then closed).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  REQUIRE(ok);
  return ntohs(addr.sin_port);
}

bool CanConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// Python's http.server serving `dir` on 127.0.0.1, killed (by its pid) at scope exit.
class PythonHttpServer {
 public:
  explicit PythonHttpServer(const std::string& dir) {
    for (int tries = 0; tries < 5 && pid_ <= 0; ++tries) {
      port_ = FreePort();
      const std::string port = std::to_string(port_);
      std::vector<std::string> args = {"/usr/bin/python3", "-m",        "http.server", port,
                                       "--bind",           "127.0.0.1", "--directory", dir};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t fa;
      posix_spawn_file_actions_init(&fa);
      posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
      posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
      pid_t pid = -1;
      const int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
      posix_spawn_file_actions_destroy(&fa);
      if (rc != 0) return;
      // Up to 10 s for it to listen; a port taken meanwhile makes it exit, and we try another.
      for (int i = 0; i < 200; ++i) {
        if (CanConnect(port_)) {
          pid_ = pid;
          break;
        }
        int status;
        if (::waitpid(pid, &status, WNOHANG) == pid) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      if (pid_ <= 0 && ::waitpid(pid, nullptr, WNOHANG) == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  }
  ~PythonHttpServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool running() const { return pid_ > 0; }
  std::string Url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// ================================================================ ImageFolderSource

TEST_CASE("ImageFolderSource: keys, labels, bytes, Describe, roots") {
  TempDir t;
  t.Write("data/cat/a.jpg", "cat-a");
  t.Write("data/dog/b.jpg", "dog-b");
  t.Write("data/dog/c.jpg", "dog-c");
  t.Write("outside/x/y.jpg", "no");

  auto src = ImageFolderSource::Open(t / "data", {".jpg"}, {t / "data"});
  REQUIRE(src.ok());
  const SampleSource& s = **src;
  REQUIRE(s.size() == 3);
  CHECK(s.sample(0).path == "cat/a.jpg");
  CHECK(s.sample(0).label == 0);
  CHECK(s.sample(2).path == "dog/c.jpg");
  CHECK(s.sample(2).label == 1);
  std::vector<uint8_t> buf;
  REQUIRE(s.Read(1, &buf).ok());
  CHECK(Str(buf) == "dog-b");
  CHECK(s.Describe() == "image folder " + t / "data" + " (3 samples, 2 classes)");

  Status oob = s.Read(3, &buf);
  CHECK(oob.code() == StatusCode::kInvalidArgument);
  CHECK(buf.empty());

  fs::remove(t / "data/dog/c.jpg");
  Status gone = s.Read(2, &buf);
  CHECK(gone.code() == StatusCode::kNotFound);
  CHECK_THAT(gone.message(), Contains("dog/c.jpg"));

  auto denied = ImageFolderSource::Open(t / "outside", {".jpg"}, {t / "data"});
  CHECK(denied.status().code() == StatusCode::kPermissionDenied);
  CHECK(s.Identity() == "image_folder " + t / "data");
  CHECK(s.ShardSizes().empty());
}

TEST_CASE("ImageFolderSource and FileListSource: a symbolic link leading out of the root is not followed") {
  TempDir t;
  t.Write("data/cat/a.jpg", "cat-a");
  t.Write("outside/secret.jpg", "secret");
  fs::create_symlink(t / "outside/secret.jpg", t / "data/cat/b.jpg");  // scanned, but leads out
  fs::create_symlink("a.jpg", t / "data/cat/c.jpg");                   // stays inside: fine
  auto src = ImageFolderSource::Open(t / "data", {".jpg"}, {t / "data"});
  REQUIRE(src.ok());
  const SampleSource& s = **src;
  REQUIRE(s.size() == 3);
  std::vector<uint8_t> buf;
  REQUIRE(s.sample(1).path == "cat/b.jpg");
  Status escaped = s.Read(1, &buf);
  CHECK(escaped.code() == StatusCode::kPermissionDenied);
  CHECK_THAT(escaped.message(), Contains("cat/b.jpg") && Contains("escapes its root"));
  CHECK(buf.empty());
  REQUIRE(s.Read(2, &buf).ok());
  CHECK(Str(buf) == "cat-a");

  // A file list below the same root: a relative entry through the link is refused at Read; an entry
  // with '..' or an absolute path is resolved at Open and refused there (outside the allowed roots).
  t.Write("data/list.txt", "cat/a.jpg,1\ncat/b.jpg,2\n");
  FileListOptions o;
  o.list = t / "data/list.txt";
  o.allowed_roots = {t / "data"};
  auto list = FileListSource::Open(o);
  REQUIRE(list.ok());
  REQUIRE((*list)->Read(0, &buf).ok());
  CHECK((*list)->Read(1, &buf).code() == StatusCode::kPermissionDenied);
  CHECK_THAT((*list)->Identity(), Contains("file_list " + t / "data/list.txt"));
  t.Write("data/list2.txt", "../outside/secret.jpg\n");
  o.list = t / "data/list2.txt";
  CHECK(FileListSource::Open(o).status().code() == StatusCode::kInvalidArgument);
}

// ================================================================ sample lists

TEST_CASE("ParseSampleList: comments, blanks, header, CRLF, BOM, quotes, optional labels") {
  const std::string text =
      "\xEF\xBB\xBFpath,label\r\n"
      "# a comment\n"
      "\n"
      "   \t\n"
      "a.jpg,3\r\n"
      "  b/c.jpg  ,  7 \n"
      "no-label.jpg\n"
      "\"with,comma.jpg\",2\n"
      "\"quote\"\"d.jpg\"\n"
      "x#y.jpg,0\n";
  ParsedList p = ParseSampleList(text, "path");
  CHECK(p.problems.empty());
  REQUIRE(p.entries.size() == 6);
  CHECK(p.entries[0].item == "a.jpg");
  CHECK(p.entries[0].label == 3);
  CHECK(p.entries[0].line == 5);
  CHECK(p.entries[1].item == "b/c.jpg");
  CHECK(p.entries[1].label == 7);
  CHECK(p.entries[2].item == "no-label.jpg");
  CHECK(p.entries[2].label == kNoLabel);
  CHECK(p.entries[3].item == "with,comma.jpg");
  CHECK(p.entries[3].label == 2);
  CHECK(p.entries[4].item == "quote\"d.jpg");
  CHECK(p.entries[5].item == "x#y.jpg");
  CHECK(p.entries[5].line == 10);

  SECTION("a header is only a header on the first line") {
    ParsedList q = ParseSampleList("a.jpg\npath,label\n", "path");
    CHECK(q.problems.size() == 1);  // "label" is not an integer
    ParsedList u = ParseSampleList("URL\nhttp://h/a\n", "url");
    REQUIRE(u.entries.size() == 1);
    CHECK(u.entries[0].item == "http://h/a");
  }
  SECTION("bad lines, each with its line number") {
    ParsedList b = ParseSampleList(
        "ok.jpg,1\n"
        "a.jpg,x\n"
        "b.jpg,-2\n"
        "c.jpg,\n"
        "d.jpg,1,2\n"
        "\"e.jpg,1\n"
        ",4\n"
        "\"f.jpg\" junk,1\n"
        "g.jpg,99999999999999999999\n",
        "path");
    CHECK(b.entries.size() == 1);
    REQUIRE(b.problems.size() == 8);
    CHECK(b.problems[0].line == 2);
    CHECK_THAT(b.problems[0].message, Contains("'x' is not an integer >= 0"));
    CHECK_THAT(b.problems[1].message, Contains("'-2'"));
    CHECK_THAT(b.problems[2].message, Contains("empty label"));
    CHECK_THAT(b.problems[3].message, Contains("more than two fields"));
    CHECK_THAT(b.problems[4].message, Contains("unterminated"));
    CHECK_THAT(b.problems[5].message, Contains("empty path"));
    CHECK_THAT(b.problems[6].message, Contains("after the quoted field"));
    CHECK(b.problems[7].line == 9);
  }
}

TEST_CASE("ListProblemsStatus: sorted, capped, counted") {
  std::vector<ListProblem> ps = {{9, "nine"}, {2, "two"}, {5, "five"}};
  Status s = ListProblemsStatus("l.txt", ps, 2);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "l.txt: 3 bad lines:\n  l.txt:2: two\n  l.txt:5: five\n  ... and 1 more");
}

// ================================================================ FileListSource

TEST_CASE("FileListSource: relative, absolute and '..' paths, labels, default root, reads") {
  TempDir t;
  t.Write("data/imgs/a.jpg", "A");
  t.Write("data/imgs/b.jpg", "B");
  t.Write("data/other/c.jpg", "C");
  t.Write("data2/d.jpg", "D");
  const std::string list = t.Write("data/imgs/list.csv",
                                   "path,label\n"
                                   "a.jpg,0\n"
                                   "b.jpg\n"
                                   "../other/c.jpg,2\n" +
                                       t / "data2/d.jpg" + ",1\n");
  FileListOptions o;
  o.list = list;
  o.allowed_roots = {t / "data", t / "data2"};
  auto src = FileListSource::Open(o);
  REQUIRE(src.ok());
  const SampleSource& s = **src;
  REQUIRE(s.size() == 4);
  CHECK(s.sample(0).path == "a.jpg");
  CHECK(s.sample(0).label == 0);
  CHECK(s.sample(1).label == kNoLabel);
  CHECK(s.sample(2).path == t / "data/other/c.jpg");  // resolved
  CHECK(s.sample(3).path == t / "data2/d.jpg");
  std::vector<uint8_t> buf;
  std::string all;
  for (uint64_t i = 0; i < s.size(); ++i) {
    REQUIRE(s.Read(i, &buf).ok());
    all += Str(buf);
  }
  CHECK(all == "ABCD");
  CHECK(s.Describe() == "file list " + list + " (4 samples below " + t / "data/imgs" + ", 3 labelled)");

  SECTION("an explicit root") {
    t.Write("data/list2.txt", "imgs/a.jpg\nother/c.jpg\n");
    o.list = t / "data/list2.txt";
    o.root = t / "data";
    auto s2 = FileListSource::Open(o);
    REQUIRE(s2.ok());
    REQUIRE((*s2)->Read(1, &buf).ok());
    CHECK(Str(buf) == "C");
  }
  SECTION("a missing file fails its Read, naming the key") {
    t.Write("data/list3.txt", "imgs/a.jpg\nimgs/nope.jpg\n");
    o.list = t / "data/list3.txt";
    o.root = "";
    auto s3 = FileListSource::Open(o);
    REQUIRE(s3.ok());
    Status r = (*s3)->Read(1, &buf);
    CHECK(r.code() == StatusCode::kNotFound);
    CHECK_THAT(r.message(), Contains("imgs/nope.jpg"));
    CHECK(buf.empty());
  }
  SECTION("FromEntries") {
    o.root = t / "data/imgs";
    auto s4 = FileListSource::FromEntries({{"a.jpg", 5, 1}, {"b.jpg", -1, 2}}, "my entries", o);
    REQUIRE(s4.ok());
    CHECK((*s4)->sample(0).label == 5);
    o.root = "";
    CHECK(FileListSource::FromEntries({{"a.jpg", 5, 1}}, "e", o).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("FileListSource: every bad line at once, with its line number") {
  TempDir t;
  t.Write("data/a.jpg", "A");
  t.Write("secret/s.jpg", "S");
  std::string text;
  text += "a.jpg,1\n";                    // 1 ok
  text += "a.jpg,one\n";                  // 2 bad label
  text += "../secret/s.jpg\n";            // 3 escapes the roots
  text += "# comment\n";                  // 4
  text += t / "secret/s.jpg" + "\n";      // 5 absolute, outside
  text += t / "data/missing.jpg" + "\n";  // 6 absolute, missing
  text += "x.jpg,1,2\n";                  // 7 three fields
  const std::string list = t.Write("data/list.txt", text);
  FileListOptions o;
  o.list = list;
  o.allowed_roots = {t / "data"};
  auto src = FileListSource::Open(o);
  REQUIRE(!src.ok());
  const Status& s = src.status();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  INFO(s.message());
  CHECK_THAT(s.message(), Contains(list + ": 5 bad lines:"));
  CHECK_THAT(s.message(), Contains(list + ":2: label 'one'"));
  CHECK_THAT(s.message(), Contains(list + ":3: ") && Contains("not below any allowed root"));
  CHECK_THAT(s.message(), Contains(list + ":5: "));
  CHECK_THAT(s.message(), Contains(list + ":6: ") && Contains("missing.jpg"));
  CHECK_THAT(s.message(), Contains(list + ":7: more than two fields"));
  // In line order.
  CHECK(s.message().find(":2:") < s.message().find(":3:"));
  CHECK(s.message().find(":6:") < s.message().find(":7:"));

  SECTION("capped") {
    o.max_reported_errors = 2;
    auto capped = FileListSource::Open(o);
    CHECK_THAT(capped.status().message(), Contains("... and 3 more"));
  }
  SECTION("the list itself must be below the roots") {
    o.allowed_roots = {t / "secret"};
    CHECK(FileListSource::Open(o).status().code() == StatusCode::kPermissionDenied);
  }
  SECTION("an empty list") {
    o.list = t.Write("data/empty.txt", "# nothing\n\npath,label\n");
    auto empty = FileListSource::Open(o);
    CHECK(empty.status().code() == StatusCode::kNotFound);
  }
}

// ================================================================ brace expansion

TEST_CASE("ExpandBraces: ranges, zero padding, lists, several groups") {
  using V = std::vector<std::string>;
  auto E = [](const std::string& p) {
    auto r = ExpandBraces(p);
    INFO(p << ": " << r.status().ToString());
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(E("plain.tar") == V{"plain.tar"});
  CHECK(E("") == V{""});
  CHECK(E("s-{000000..000003}.tar") == V{"s-000000.tar", "s-000001.tar", "s-000002.tar", "s-000003.tar"});
  CHECK(E("s-{8..11}") == V{"s-8", "s-9", "s-10", "s-11"});
  CHECK(E("s-{08..11}") == V{"s-08", "s-09", "s-10", "s-11"});
  CHECK(E("s-{3..1}") == V{"s-3", "s-2", "s-1"});
  CHECK(E("s-{5..5}") == V{"s-5"});
  CHECK(E("{a,b,c}.tar") == V{"a.tar", "b.tar", "c.tar"});
  CHECK(E("x{,-old}") == V{"x", "x-old"});
  CHECK(E("/d/{train,val}-{0..1}.tar") == V{"/d/train-0.tar", "/d/train-1.tar", "/d/val-0.tar", "/d/val-1.tar"});
  CHECK(E("{0..9}{0..9}{0..9}").size() == 1000);

  auto Bad = [](const std::string& p, const std::string& what) {
    auto r = ExpandBraces(p, 1000);
    REQUIRE(!r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Contains(what) && Contains(p));
  };
  Bad("s-{0..3", "without a matching '}'");
  Bad("s-0..3}", "without a matching '{'");
  Bad("s-{a,{b,c}}", "nested");
  Bad("s-{abc}", "neither a list");
  Bad("s-{a..z}", "decimal integers");
  Bad("s-{-1..3}", "decimal integers");
  Bad("s-{0..99999999999999999999999}", "too large");
  Bad("s-{0..1000}", "more than 1000");
  Bad("{0..99}{0..99}", "more than 1000");
}

// ================================================================ tar reader and TarShardSource

TEST_CASE("ListTarMembers: ustar prefix, GNU long names, pax paths, skipped types") {
  TempDir t;
  const std::string long_dir(130, 'd');
  const std::string long_name = long_dir + "/" + std::string(40, 'n') + ".jpg";
  TarWriter w;
  w.Dir("dir/")
      .File("dir/000001.jpg", "one")
      .File("000002.jpg", "two", /*prefix=*/long_dir)
      .GnuLong(long_name, "three")
      .Pax("pax/ünïcode name.jpg", "four")
      .File("link", "", "", '2')
      .File("./dot/000005.jpg", "five")
      .End();
  const std::string path = t.Write("a.tar", w.bytes());
  auto m = List(path);
  REQUIRE(m.ok());
  REQUIRE(m->size() == 4 + 1);
  CHECK((*m)[0].name == "dir/000001.jpg");
  CHECK((*m)[0].size == 3);
  CHECK((*m)[1].name == long_dir + "/000002.jpg");
  CHECK((*m)[2].name == long_name);
  CHECK((*m)[3].name == "pax/ünïcode name.jpg");
  CHECK((*m)[4].name == "dot/000005.jpg");
  const std::string bytes = w.bytes();
  CHECK(bytes.substr((*m)[2].data_offset, (*m)[2].size) == "three");
  CHECK(bytes.substr((*m)[3].data_offset, (*m)[3].size) == "four");

  SECTION("pax size overrides the header's, GNU.sparse members are skipped, a missing end is fine") {
    TarWriter p;
    p.Pax("a.jpg", "abc", TarWriter::Record("size", "3"))
        .Pax("s.jpg", "zz", TarWriter::Record("GNU.sparse.major", "1"));
    p.File("b.jpg", "b");  // no end-of-archive blocks
    auto m2 = List(t.Write("p.tar", p.bytes()));
    REQUIRE(m2.ok());
    REQUIRE(m2->size() == 2);
    CHECK((*m2)[0].name == "a.jpg");
    CHECK((*m2)[1].name == "b.jpg");
  }
}

TEST_CASE("ListTarMembers: corrupt and truncated archives name the shard and the offset") {
  TempDir t;
  TarWriter w;
  w.File("a.jpg", std::string(1000, 'a')).File("b.jpg", std::string(700, 'b')).End();
  const std::string good = w.bytes();  // headers at 0 and 1536; b's data at 2048

  auto Expect = [&](const std::string& name, const std::string& bytes, const std::string& what) {
    const std::string path = t.Write(name, bytes);
    auto m = List(path);
    INFO(m.status().ToString());
    REQUIRE(!m.ok());
    CHECK(m.status().code() == StatusCode::kDataLoss);
    CHECK_THAT(m.status().message(), Contains(path) && Contains(what));
  };
  Expect("cut-member.tar", good.substr(0, 2048 + 100), "runs past the end of the file");
  Expect("cut-member.tar", good.substr(0, 2048 + 100), "offset 1536");
  Expect("cut-header.tar", good.substr(0, 1536 + 200), "truncated");
  Expect("cut-header.tar", good.substr(0, 1536 + 200), "offset 1536");
  std::string bad = good;
  bad[1536 + 10] ^= 0x5a;  // inside b's name
  Expect("checksum.tar", bad, "bad header checksum (header at offset 1536)");
  Expect("not-a-tar.tar", std::string(2000, 'x'), "not a tar file");
  std::string bad_size = good;
  bad_size.replace(1536 + 124, 3, "9z9");
  // Fix the checksum so that only the size is wrong.
  bad_size.replace(1536 + 148, 8, "        ");
  unsigned sum = 0;
  for (size_t i = 1536; i < 1536 + 512; ++i) sum += static_cast<unsigned char>(bad_size[i]);
  char num[8];
  std::snprintf(num, sizeof num, "%06o", sum);
  bad_size.replace(1536 + 148, 7, num, 7);
  Expect("size.tar", bad_size, "bad size field");

  // Cut exactly at a header boundary (no end-of-archive marker): accepted.
  auto m = List(t.Write("boundary.tar", good.substr(0, 1536)));
  REQUIRE(m.ok());
  CHECK(m->size() == 1);
}

// Writes shard `name` holding samples key -> (ext -> bytes), in the order given.
std::string WriteShard(const TempDir& t, const std::string& name,
                       const std::vector<std::pair<std::string, std::string>>& members) {
  TarWriter w;
  for (const auto& [n, data] : members) w.File(n, data);
  w.End();
  return t.Write(name, w.bytes());
}

TEST_CASE("SplitMemberKey: WebDataset key and extension, hidden and extensionless members") {
  using spdl::io::SplitMemberKey;
  const auto k = SplitMemberKey("train/n01/abc.Seg.PNG");
  REQUIRE(k.has_value());
  CHECK(k->key == "train/n01/abc");
  CHECK(k->ext == "seg.png");  // everything after the first dot of the last component, lower-cased
  const auto dotted_dir = SplitMemberKey("a.b/c.jpg");
  REQUIRE(dotted_dir.has_value());
  CHECK(dotted_dir->key == "a.b/c");  // dots in folders do not split
  CHECK(dotted_dir->ext == "jpg");
  CHECK_FALSE(SplitMemberKey("a/.hidden.jpg").has_value());
  CHECK_FALSE(SplitMemberKey("a/noext").has_value());
  CHECK_FALSE(SplitMemberKey("a/").has_value());
  CHECK(spdl::io::NormalizeExtension(".JPG") == "jpg");
  CHECK(spdl::io::NormalizeExtension("cls") == "cls");
}

TEST_CASE("TarShardSource: WebDataset grouping, labels, brace patterns, reads") {
  TempDir t;
  WriteShard(t, "data/shard-000000.tar",
             {{"s/000001.jpg", "img1"},
              {"s/000001.cls", "3\n"},
              {"s/000002.jpg", "img2"},  // no label
              {"s/000003.json", "{}"},   // no image: skipped
              {"s/000004.cls", " 7 "},
              {"s/000004.png", "png4"},  // label before image
              {"s/000004.jpg", "jpg4"},  // jpg preferred over png
              {"s/.hidden.jpg", "h"},
              {"s/000005.seg.png", "seg"}});  // extension "seg.png": not an image
  WriteShard(t, "data/shard-000001.tar", {{"s/000006.JPEG", "img6"}, {"s/000006.cls", "0"}});
  WriteShard(t, "data/shard-000002.tar", {{"s/000007.webp", "img7"}});

  TarShardOptions o;
  o.shards = {t / "data/shard-{000000..000002}.tar"};
  o.allowed_roots = {t / "data"};
  auto src = TarShardSource::Open(o);
  INFO(src.status().ToString());
  REQUIRE(src.ok());
  const TarShardSource& s = **src;
  REQUIRE(s.size() == 5);
  std::vector<std::string> keys;
  std::vector<int64_t> labels;
  for (uint64_t i = 0; i < s.size(); ++i) {
    keys.push_back(s.sample(i).path);
    labels.push_back(s.sample(i).label);
  }
  CHECK(keys == std::vector<std::string>{"s/000001", "s/000002", "s/000004", "s/000006", "s/000007"});
  CHECK(labels == std::vector<int64_t>{3, kNoLabel, 7, 0, kNoLabel});
  std::vector<uint8_t> buf;
  std::string all;
  for (uint64_t i = 0; i < s.size(); ++i) {
    REQUIRE(s.Read(i, &buf).ok());
    all += Str(buf) + " ";
  }
  CHECK(all == "img1 img2 jpg4 img6 img7 ");
  CHECK(s.num_shards() == 3);
  CHECK(s.skipped_keys() == 2);  // s/000003 (json only), s/000005 (seg.png only)
  CHECK(s.unlabelled() == 2);
  CHECK_THAT(s.Describe(), Contains("3 shards, 5 samples, 2 without a label, 2 keys without an image skipped"));
  CHECK(s.Read(5, &buf).code() == StatusCode::kInvalidArgument);
  CHECK(s.ShardSizes() == std::vector<uint64_t>{3, 1, 1});
  CHECK(s.Identity() ==
        "tar " + t / "data/shard-000000.tar " + t / "data/shard-000001.tar " + t / "data/shard-000002.tar");

  SECTION("a list of shards, and other extensions") {
    TarShardOptions o2 = o;
    o2.shards = {t / "data/shard-000002.tar", t / "data/shard-{000000,000001}.tar"};
    o2.image_extensions = {".PNG", "webp"};
    o2.label_extension = "";
    auto s2 = TarShardSource::Open(o2);
    REQUIRE(s2.ok());
    REQUIRE((*s2)->size() == 2);
    CHECK((*s2)->sample(0).path == "s/000007");
    CHECK((*s2)->sample(1).path == "s/000004");
    CHECK((*s2)->sample(1).label == kNoLabel);
    REQUIRE((*s2)->Read(1, &buf).ok());
    CHECK(Str(buf) == "png4");
  }
  SECTION("concurrent reads") {
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int k = 0; k < 4; ++k) {
      threads.emplace_back([&] {
        std::vector<uint8_t> b;
        for (int rep = 0; rep < 200; ++rep) {
          for (uint64_t i = 0; i < s.size(); ++i) {
            if (!s.Read(i, &b).ok() || b.size() != 4) ++bad;
          }
        }
      });
    }
    for (std::thread& th : threads) th.join();
    CHECK(bad == 0);
  }
  SECTION("a shard replaced after the scan") {
    WriteShard(t, "data/shard-000002.tar.new", {{"s/000007.webp", "other bytes"}});
    fs::rename(t / "data/shard-000002.tar.new", t / "data/shard-000002.tar");
    Status r = s.Read(4, &buf);
    CHECK(r.code() == StatusCode::kFailedPrecondition);
    CHECK_THAT(r.message(), Contains("s/000007") && Contains("shard-000002.tar") && Contains("changed"));
  }
  SECTION("a member larger than the limit") {
    TarShardOptions o3 = o;
    o3.max_sample_bytes = 3;
    auto s3 = TarShardSource::Open(o3);
    REQUIRE(s3.ok());
    CHECK((*s3)->Read(0, &buf).code() == StatusCode::kResourceExhausted);
  }
}

TEST_CASE("TarShardSource: sidecar members by extension, missing ones, any case") {
  TempDir t;
  WriteShard(t, "data/a.tar",
             {{"k/000001.txt", "one"},  // sidecar before its image
              {"k/000001.jpg", "img1"},
              {"k/000001.cls", "2"},
              {"k/000002.jpg", "img2"},  // no .txt
              {"k/000002.json", "{}"},
              {"k/000003.TXT", ""},  // an empty sidecar, upper-case extension
              {"k/000003.jpg", "img3"},
              {"k/000004.txt", "orphan"}});  // no image: skipped
  TarShardOptions o;
  o.shards = {t / "data/a.tar"};
  o.allowed_roots = {t / "data"};
  o.sidecar_extensions = {".txt", "cls"};
  auto src = TarShardSource::Open(o);
  INFO(src.status().ToString());
  REQUIRE(src.ok());
  const TarShardSource& s = **src;
  REQUIRE(s.size() == 3);
  CHECK(s.skipped_keys() == 1);
  std::vector<uint8_t> buf;
  REQUIRE(s.ReadSidecar(0, ".txt", &buf).ok());
  CHECK(Str(buf) == "one");
  REQUIRE(s.ReadSidecar(0, ".CLS", &buf).ok());
  CHECK(Str(buf) == "2");
  CHECK(s.sample(0).label == 2);  // a label member may also be a sidecar
  Status missing = s.ReadSidecar(1, ".txt", &buf);
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK_THAT(missing.message(), Contains("sample k/000002"));
  CHECK_THAT(missing.message(), Contains("no .txt member"));
  CHECK(buf.empty());
  CHECK(s.ReadSidecar(1, ".json", &buf).code() == StatusCode::kNotFound);  // not indexed at Open
  buf = {1, 2, 3};
  REQUIRE(s.ReadSidecar(2, "txt", &buf).ok());
  CHECK(buf.empty());
  REQUIRE(s.Read(2, &buf).ok());
  CHECK(Str(buf) == "img3");
  CHECK(s.ReadSidecar(3, ".txt", &buf).code() == StatusCode::kInvalidArgument);

  // A shard that changed since Open: the sidecar read says so, like the image read.
  WriteShard(t, "data/a.tar", {{"k/000001.jpg", "changed"}, {"k/000001.txt", "x"}});
  CHECK(s.ReadSidecar(0, ".txt", &buf).code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("Folder and list sidecars: the same path up to the last dot, then the ending") {
  CHECK(SidecarPath("a/000123.jpg", ".txt") == "a/000123.txt");
  CHECK(SidecarPath("a.b/c.d.jpeg", ".txt") == "a.b/c.d.txt");
  CHECK(SidecarPath("a.b/noext", ".txt") == "a.b/noext.txt");
  CHECK(SidecarPath(".hidden", ".txt") == ".hidden.txt");
  CHECK(SidecarPath("/abs/x.png", ".json") == "/abs/x.json");

  TempDir t;
  t.Write("data/cat/a.jpg", "cat-a");
  t.Write("data/cat/a.txt", "a cat");
  t.Write("data/dog/b.jpg", "dog-b");
  auto folder = ImageFolderSource::Open(t / "data", {".jpg"}, {t / "data"});
  REQUIRE(folder.ok());
  std::vector<uint8_t> buf;
  REQUIRE((*folder)->ReadSidecar(0, ".txt", &buf).ok());
  CHECK(Str(buf) == "a cat");
  Status missing = (*folder)->ReadSidecar(1, ".txt", &buf);
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK_THAT(missing.message(), Contains("dog/b.txt"));
  CHECK((*folder)->ReadSidecar(2, ".txt", &buf).code() == StatusCode::kInvalidArgument);

  // A sidecar that is a link out of the root is refused, not followed.
  t.Write("outside/secret.txt", "secret");
  fs::create_symlink(t / "outside/secret.txt", t / "data/dog/b.txt");
  Status escaped = (*folder)->ReadSidecar(1, ".txt", &buf);
  CHECK_FALSE(escaped.ok());
  CHECK(buf.empty());

  t.Write("list/files.txt", "cat/a.jpg,0\n" + t / "data/cat/a.jpg" + ",1\n");
  FileListOptions lo;
  lo.list = t / "list/files.txt";
  lo.root = t / "data";
  lo.allowed_roots = {t / "data", t / "list"};
  auto list = FileListSource::Open(lo);
  INFO(list.status().ToString());
  REQUIRE(list.ok());
  REQUIRE((*list)->ReadSidecar(0, ".txt", &buf).ok());
  CHECK(Str(buf) == "a cat");
  REQUIRE((*list)->ReadSidecar(1, ".txt", &buf).ok());  // an absolute path
  CHECK(Str(buf) == "a cat");
  CHECK((*list)->ReadSidecar(0, ".json", &buf).code() == StatusCode::kNotFound);
}

TEST_CASE("TarShardSource: shards written by the tar CLI (gnu, pax, ustar formats)") {
  TempDir t;
  // 90 + 50 characters: over ustar's 100-byte name field (so ustar needs its prefix field), and
  // every directory still splits into prefix and name.
  const std::string deep = std::string(90, 'x') + "/" + std::string(50, 'y');
  t.Write("src/" + deep + "/000001.jpg", "deep-image");
  t.Write("src/" + deep + "/000001.cls", "4");
  t.Write("src/short/000002.jpeg", "short-image");
  for (const char* format : {"gnu", "pax", "ustar"}) {
    DYNAMIC_SECTION("format " << format) {
      const std::string shard = t / (std::string("data/") + format + ".tar");
      fs::create_directories(t / "data");
      REQUIRE(Run("tar --format=" + std::string(format) + " --sort=name -cf '" + shard + "' -C '" + t / "src" +
                  "' .") == 0);
      TarShardOptions o;
      o.shards = {shard};
      o.allowed_roots = {t / "data"};
      auto src = TarShardSource::Open(o);
      INFO(src.status().ToString());
      REQUIRE(src.ok());
      REQUIRE((*src)->size() == 2);
      std::map<std::string, std::pair<int64_t, std::string>> got;
      std::vector<uint8_t> buf;
      for (uint64_t i = 0; i < (*src)->size(); ++i) {
        REQUIRE((*src)->Read(i, &buf).ok());
        got[(*src)->sample(i).path] = {(*src)->sample(i).label, Str(buf)};
      }
      CHECK(got[deep + "/000001"] == std::make_pair(int64_t{4}, std::string("deep-image")));
      CHECK(got["short/000002"] == std::make_pair(kNoLabel, std::string("short-image")));
    }
  }
}

TEST_CASE("TarShardSource: every shard's problem at once") {
  TempDir t;
  WriteShard(t, "data/ok.tar", {{"a.jpg", "a"}});
  WriteShard(t, "data/badlabel.tar", {{"b.jpg", "b"}, {"b.cls", "dog"}});
  TarWriter w;
  w.File("c.jpg", std::string(5000, 'c')).End();
  t.Write("data/cut.tar", w.bytes().substr(0, 512 + 1000));
  WriteShard(t, "secret/s.tar", {{"s.jpg", "s"}});

  TarShardOptions o;
  o.shards = {t / "data/ok.tar", t / "data/badlabel.tar", t / "data/cut.tar", t / "data/missing.tar",
              t / "secret/s.tar"};
  o.allowed_roots = {t / "data"};
  auto src = TarShardSource::Open(o);
  REQUIRE(!src.ok());
  const std::string& m = src.status().message();
  INFO(m);
  CHECK_THAT(m, Contains("3 problems"));
  CHECK_THAT(m, !Contains("'dog' is not an integer"));  // a bad label fails its sample only (below)
  CHECK_THAT(m, Contains(t / "data/cut.tar") && Contains("runs past the end of the file (1512 bytes)"));
  CHECK_THAT(m, Contains(t / "data/missing.tar"));
  CHECK_THAT(m, Contains(t / "secret/s.tar") && Contains("not below any allowed root"));

  SECTION("a bad label member fails its own sample, not the shard") {
    WriteShard(t, "data/mixed.tar", {{"a.jpg", "a"}, {"a.cls", "1"}, {"b.jpg", "b"}, {"b.cls", "dog"}});
    TarShardOptions one;
    one.shards = {t / "data/mixed.tar"};
    one.allowed_roots = {t / "data"};
    auto mixed = TarShardSource::Open(one);
    REQUIRE(mixed.ok());
    REQUIRE((*mixed)->size() == 2);
    std::vector<uint8_t> bytes;
    CHECK((*mixed)->Read(0, &bytes).ok());
    CHECK((*mixed)->sample(0).label == 1);
    const Status bad = (*mixed)->Read(1, &bytes);
    CHECK(bad.code() == StatusCode::kDataLoss);
    CHECK_THAT(bad.message(), Contains("b.cls") && Contains("'dog' is not an integer"));
  }
  SECTION("no shard, a bad pattern, no sample") {
    TarShardOptions e;
    e.allowed_roots = {t / "data"};
    CHECK(TarShardSource::Open(e).status().code() == StatusCode::kInvalidArgument);
    e.shards = {t / "data/x-{0..2.tar"};
    CHECK(TarShardSource::Open(e).status().code() == StatusCode::kInvalidArgument);
    WriteShard(t, "data/json.tar", {{"a.json", "{}"}});
    e.shards = {t / "data/json.tar"};
    CHECK(TarShardSource::Open(e).status().code() == StatusCode::kNotFound);
  }
}

// ================================================================ HttpSource

#ifdef SPDL_IO_HAVE_CURL

HttpSourceOptions FastOptions(const TestHttpServer& server) {
  HttpSourceOptions o;
  o.allowed_url_prefixes = {server.Url("/")};
  o.connect_timeout_ms = 1000;
  o.timeout_ms = 2000;
  o.max_attempts = 4;
  o.initial_backoff_ms = 10;
  o.max_backoff_ms = 40;
  o.max_in_flight = 4;
  return o;
}

std::vector<ListEntry> Entries(const std::vector<std::string>& items) {
  std::vector<ListEntry> e;
  for (size_t i = 0; i < items.size(); ++i) e.push_back(ListEntry{items[i], -1, i + 1});
  return e;
}

TEST_CASE("HttpSource: 200, 404, 503 twice then 200, 429, always 5xx, no redirects") {
  TestHttpServer server([](const std::string& path, int nth) {
    TestHttpServer::Reply r;
    if (path == "/a.jpg") {
      r.body = Bytes("a", 100'000);
    } else if (path == "/flaky.jpg") {
      if (nth <= 2) {
        r.status = 503;
        r.reason = "Service Unavailable";
      } else {
        r.body = "finally";
      }
    } else if (path == "/busy.jpg") {
      if (nth == 1) {
        r.status = 429;
        r.reason = "Too Many Requests";
        r.headers = "Retry-After: 0\r\n";
      } else {
        r.body = "ok";
      }
    } else if (path == "/down.jpg") {
      r.status = 500;
      r.reason = "Internal Server Error";
    } else if (path == "/moved.jpg") {
      r.status = 301;
      r.reason = "Moved Permanently";
      r.headers = "Location: /a.jpg\r\n";
    } else if (path == "/forbidden.jpg") {
      r.status = 403;
      r.reason = "Forbidden";
    } else {
      r.status = 404;
      r.reason = "Not Found";
      r.body = "no such thing";
    }
    return r;
  });
  TempDir t;
  const std::string list =
      t.Write("data/urls.txt", "url,label\n" + server.Url("/a.jpg") + ",5\n" + server.Url("/missing.jpg") + "\n" +
                                   server.Url("/flaky.jpg") + ",1\n" + server.Url("/busy.jpg") + "\n" +
                                   server.Url("/down.jpg") + "\n" + server.Url("/moved.jpg") + "\n" +
                                   server.Url("/forbidden.jpg") + "\n");
  HttpSourceOptions o = FastOptions(server);
  o.list = list;
  o.allowed_roots = {t / "data"};
  auto src = HttpSource::Open(o);
  INFO(src.status().ToString());
  REQUIRE(src.ok());
  const HttpSource& s = **src;
  REQUIRE(s.size() == 7);
  CHECK(s.sample(0).path == server.Url("/a.jpg"));
  CHECK(s.sample(0).label == 5);
  CHECK(s.sample(1).label == kNoLabel);
  CHECK_THAT(s.Describe(), Contains("http 7 URLs from " + list));

  std::vector<uint8_t> buf;
  REQUIRE(s.Read(0, &buf).ok());
  CHECK(Str(buf) == Bytes("a", 100'000));

  Status nf = s.Read(1, &buf);
  CHECK(nf.code() == StatusCode::kNotFound);
  CHECK(nf.message() == "GET " + server.Url("/missing.jpg") + ": HTTP 404 Not Found");
  CHECK(buf.empty());
  CHECK(server.requests("/missing.jpg") == 1);  // never retried

  REQUIRE(s.Read(2, &buf).ok());
  CHECK(Str(buf) == "finally");
  CHECK(server.requests("/flaky.jpg") == 3);

  REQUIRE(s.Read(3, &buf).ok());
  CHECK(server.requests("/busy.jpg") == 2);

  Status down = s.Read(4, &buf);
  CHECK(down.code() == StatusCode::kUnavailable);
  CHECK(down.message() ==
        "GET " + server.Url("/down.jpg") + ": HTTP 500 Internal Server Error (gave up after 4 attempts)");
  CHECK(server.requests("/down.jpg") == 4);

  Status moved = s.Read(5, &buf);
  CHECK(moved.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(moved.message(), Contains("HTTP 301 Moved Permanently (redirects are not followed)"));
  CHECK(server.requests("/moved.jpg") == 1);

  CHECK(s.Read(6, &buf).code() == StatusCode::kPermissionDenied);

  const HttpStats st = s.stats();
  CHECK(st.retries == 2 + 1 + 3);
  CHECK(st.failures == 4);
  CHECK(st.requests == 1 + 1 + 3 + 2 + 4 + 1 + 1);
}

TEST_CASE("HttpSource: a server that never answers fails within the timeout, without retrying") {
  TestHttpServer server([](const std::string&, int) {
    TestHttpServer::Reply r;
    r.hang = true;
    return r;
  });
  HttpSourceOptions o = FastOptions(server);
  o.timeout_ms = 300;
  auto src = HttpSource::FromEntries(Entries({server.Url("/hang.jpg")}), "test", o);
  REQUIRE(src.ok());
  std::vector<uint8_t> buf;
  const auto t0 = Clock::now();
  Status s = (*src)->Read(0, &buf);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Contains("GET " + server.Url("/hang.jpg") + ": no complete response within 300 ms"));
  CHECK(seconds >= 0.25);
  CHECK(seconds < 1.5);
  CHECK(server.requests("/hang.jpg") == 1);
}

TEST_CASE("HttpSource: connection refused is retried, then reported") {
  const int port = FreePort();
  HttpSourceOptions o;
  o.allowed_url_prefixes = {"http://127.0.0.1:" + std::to_string(port)};
  o.max_attempts = 3;
  o.initial_backoff_ms = 5;
  o.max_backoff_ms = 10;
  const std::string url = "http://127.0.0.1:" + std::to_string(port) + "/x.jpg";
  auto src = HttpSource::FromEntries(Entries({url}), "test", o);
  REQUIRE(src.ok());
  std::vector<uint8_t> buf;
  Status s = (*src)->Read(0, &buf);
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK_THAT(s.message(), Contains("GET " + url + ": ") && Contains("(gave up after 3 attempts)"));
  CHECK((*src)->stats().requests == 3);
}

TEST_CASE("HttpSource: bounded requests in flight, connections reused") {
  TestHttpServer server([](const std::string& path, int) {
    TestHttpServer::Reply r;
    r.body = "body of " + path;
    if (path.rfind("/slow", 0) == 0) r.delay_ms = 40;
    return r;
  });
  HttpSourceOptions o = FastOptions(server);

  SECTION("one worker: one connection for every request") {
    std::vector<std::string> urls;
    for (int i = 0; i < 20; ++i) urls.push_back(server.Url("/f" + std::to_string(i)));
    auto src = HttpSource::FromEntries(Entries(urls), "test", o);
    REQUIRE(src.ok());
    std::vector<uint8_t> buf;
    for (uint64_t i = 0; i < 20; ++i) {
      REQUIRE((*src)->Read(i, &buf).ok());
      CHECK(Str(buf) == "body of /f" + std::to_string(i));
    }
    CHECK(server.connections() == 1);
  }
  SECTION("eight workers, at most two requests in flight") {
    o.max_in_flight = 2;
    std::vector<std::string> urls;
    for (int i = 0; i < 16; ++i) urls.push_back(server.Url("/slow" + std::to_string(i)));
    auto src = HttpSource::FromEntries(Entries(urls), "test", o);
    REQUIRE(src.ok());
    std::atomic<int> bad{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < 8; ++w) {
      workers.emplace_back([&, w] {
        std::vector<uint8_t> buf;
        for (uint64_t i = static_cast<uint64_t>(w); i < 16; i += 8) {
          if (!(*src)->Read(i, &buf).ok() || Str(buf) != "body of /slow" + std::to_string(i)) ++bad;
        }
      });
    }
    for (std::thread& th : workers) th.join();
    CHECK(bad == 0);
    CHECK(server.max_active() == 2);
    CHECK(server.connections() <= 2);
  }
}

TEST_CASE("HttpSource: base URL + relative paths, percent-encoded") {
  TestHttpServer server([](const std::string& path, int) {
    TestHttpServer::Reply r;
    r.body = path;
    return r;
  });
  TempDir t;
  t.Write("data/paths.csv", "path,label\nimg/a b.jpg,1\nimg/c%d#e?.jpg,2\n");
  HttpSourceOptions o = FastOptions(server);
  o.list = t / "data/paths.csv";
  o.allowed_roots = {t / "data"};
  o.base_url = server.Url("/base");
  o.allowed_url_prefixes = {server.Url("/base")};
  auto src = HttpSource::Open(o);
  INFO(src.status().ToString());
  REQUIRE(src.ok());
  CHECK((*src)->sample(0).path == server.Url("/base/img/a%20b.jpg"));
  CHECK((*src)->sample(1).label == 2);
  std::vector<uint8_t> buf;
  REQUIRE((*src)->Read(1, &buf).ok());
  std::string got = Str(buf);
  for (char& c : got) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));  // curl may lower hex
  CHECK(got == "/base/img/c%25d%23e%3f.jpg");
  CHECK_THAT((*src)->Describe(), Contains("http 2 paths below " + server.Url("/base")));
}

TEST_CASE("HttpSource: bad URLs and paths, each with its line number, and bad options") {
  TempDir t;
  HttpSourceOptions o;
  o.allowed_roots = {t / "data"};
  o.allowed_url_prefixes = {"http://127.0.0.1:9/data", "https://example.com/"};
  o.list = t.Write("data/urls.txt",
                   "http://127.0.0.1:9/data/ok.jpg\n"         // 1 ok
                   "ftp://127.0.0.1:9/data/a.jpg\n"           // 2 scheme
                   "file:///etc/passwd\n"                     // 3 scheme
                   "http://127.0.0.1:9/database/x.jpg\n"      // 4 not below /data by segments
                   "http://127.0.0.1:10/data/x.jpg\n"         // 5 other port
                   "http://user:pw@127.0.0.1:9/data/x.jpg\n"  // 6 credentials
                   "not a url\n"                              // 7
                   "https://EXAMPLE.com/x.jpg,3\n"            // 8 ok (host case)
                   "http://127.0.0.1:9/data/../etc/x.jpg\n"   // 9 normalized out of /data
                   "http://127.0.0.1:9/data/y.jpg,z\n");      // 10 label
  auto src = HttpSource::Open(o);
  REQUIRE(!src.ok());
  const std::string& m = src.status().message();
  INFO(m);
  CHECK(src.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(m, Contains("8 bad lines"));
  for (int line : {2, 3, 4, 5, 6, 7, 9, 10}) CHECK_THAT(m, Contains(o.list + ":" + std::to_string(line) + ": "));
  CHECK_THAT(m, Contains("scheme 'ftp' is not http or https"));
  CHECK_THAT(m, Contains("credentials"));
  CHECK_THAT(m, Contains("is not below any allowed URL prefix"));

  SECTION("percent-encoded dot segments and slashes are refused") {
    for (const char* url : {"http://127.0.0.1:9/data/%2e%2e/etc/x.jpg", "http://127.0.0.1:9/data/%2E%2e/x",
                            "http://127.0.0.1:9/data/.%2e/x", "http://127.0.0.1:9/data/%2e/x.jpg",
                            "http://127.0.0.1:9/data/a%2f..%2f..%2fetc", "http://127.0.0.1:9/data/a%5cb"}) {
      INFO(url);
      auto e = HttpSource::FromEntries(Entries({url}), "e", o);
      REQUIRE_FALSE(e.ok());
      CHECK_THAT(e.status().message(), Contains("encoded '.' or '..' segment or an encoded slash"));
    }
    // Plain encoded characters stay fine.
    CHECK(HttpSource::FromEntries(Entries({"http://127.0.0.1:9/data/a%20b.jpg", "http://127.0.0.1:9/data/x.%2ejpg"}),
                                  "e", o)
              .ok());
  }
  SECTION("paths with base_url") {
    o.base_url = "http://127.0.0.1:9/data";
    o.list = t.Write("data/paths.txt", "a.jpg\n/abs.jpg\n../up.jpg\nhttp://x/y.jpg\n");
    auto p = HttpSource::Open(o);
    REQUIRE(!p.ok());
    CHECK_THAT(p.status().message(),
               Contains("3 bad lines") && Contains(":2: ") && Contains(":3: ") && Contains(":4: "));
  }
  SECTION("options") {
    o.max_in_flight = 0;
    o.timeout_ms = 0;
    auto b = HttpSource::FromEntries(Entries({"http://127.0.0.1:9/data/a"}), "e", o);
    CHECK(b.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(b.status().message(), Contains("max_in_flight") && Contains("timeout_ms"));
    o = HttpSourceOptions{};
    CHECK(HttpSource::FromEntries(Entries({"http://127.0.0.1:9/data/a"}), "e", o).status().code() ==
          StatusCode::kPermissionDenied);  // no allowed prefixes
    o.allowed_url_prefixes = {"http://127.0.0.1:9/"};
    o.base_url = "gopher://x/";
    CHECK(HttpSource::FromEntries(Entries({"a"}), "e", o).status().code() == StatusCode::kInvalidArgument);
  }
}

TEST_CASE("HttpSource: a body larger than the limit") {
  TestHttpServer server([](const std::string&, int) {
    TestHttpServer::Reply r;
    r.body = std::string(5000, 'x');
    return r;
  });
  HttpSourceOptions o = FastOptions(server);
  o.max_sample_bytes = 1000;
  auto src = HttpSource::FromEntries(Entries({server.Url("/big")}), "test", o);
  REQUIRE(src.ok());
  std::vector<uint8_t> buf;
  Status s = (*src)->Read(0, &buf);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(s.message(), Contains(server.Url("/big")));
  CHECK(buf.empty());
  CHECK(server.requests("/big") == 1);
}

TEST_CASE("HttpSource: against Python's http.server on 127.0.0.1") {
  if (::access("/usr/bin/python3", X_OK) != 0) {
    SPDL_SKIP("/usr/bin/python3 missing");
  }
  TempDir t;
  const std::string a = Bytes("py-a", 50'000);
  t.Write("www/img/a.jpg", a);
  PythonHttpServer server(t / "www");
  REQUIRE(server.running());
  HttpSourceOptions o;
  o.allowed_url_prefixes = {server.Url("/img")};
  o.max_attempts = 2;
  o.initial_backoff_ms = 5;
  auto src = HttpSource::FromEntries(Entries({server.Url("/img/a.jpg"), server.Url("/img/nope.jpg")}), "test", o);
  REQUIRE(src.ok());
  std::vector<uint8_t> buf;
  REQUIRE((*src)->Read(0, &buf).ok());
  CHECK(Str(buf) == a);
  Status s = (*src)->Read(1, &buf);
  CHECK(s.message() == "GET " + server.Url("/img/nope.jpg") + ": HTTP 404 File not found");
  CHECK(s.code() == StatusCode::kNotFound);
}

#else
TEST_CASE("HttpSource: built without libcurl") {
  HttpSourceOptions o;
  CHECK(HttpSource::Open(o).status().code() == StatusCode::kFailedPrecondition);
  SPDL_SKIP_PART("libcurl was not found at build time: the HTTP tests were not built");
}
#endif  // SPDL_IO_HAVE_CURL

// ================================================================ benchmark (hidden: run with [bench])

// The header scan at job start: `shards` shards of `samples` samples (a ~110 KB .jpg and a .cls each),
// scanned warm (page cache) and cold (the shards' pages dropped with posix_fadvise).
void BenchScan(int shards, int samples) {
  TempDir t;
  const std::string img = Bytes("bench", 110'000);
  for (int s = 0; s < shards; ++s) {
    TarWriter w;
    for (int i = 0; i < samples; ++i) {
      char key[32];
      std::snprintf(key, sizeof key, "%06d", s * samples + i);
      w.File(std::string("train/") + key + ".jpg", img)
          .File(std::string("train/") + key + ".cls", std::to_string(i % 1000));
    }
    w.End();
    char name[64];
    std::snprintf(name, sizeof name, "data/shard-%06d.tar", s);
    t.Write(name, w.bytes());
  }
  TarShardOptions o;
  char pattern[64];
  std::snprintf(pattern, sizeof pattern, "data/shard-{000000..%06d}.tar", shards - 1);
  o.shards = {t / pattern};
  o.allowed_roots = {t / "data"};
  o.index_cache = nullptr;  // every Open scans (the index cache would share the first scan)
  auto drop_cache = [&] {
    for (int s = 0; s < shards; ++s) {
      char name[64];
      std::snprintf(name, sizeof name, "data/shard-%06d.tar", s);
      const int fd = ::open((t / name).c_str(), O_RDONLY);
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  };
  double warm = 1e9, cold = 1e9;
  uint64_t n = 0;
  for (int rep = 0; rep < 3; ++rep) {
    drop_cache();
    auto c = TarShardSource::Open(o);
    REQUIRE(c.ok());
    cold = std::min(cold, (*c)->scan_seconds());
    auto w = TarShardSource::Open(o);
    REQUIRE(w.ok());
    warm = std::min(warm, (*w)->scan_seconds());
    n = (*w)->size();
  }
  auto src = TarShardSource::Open(o);
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < n; ++i) REQUIRE((*src)->Read(i, &buf).ok());  // warm the page cache
  const auto t0 = Clock::now();
  for (uint64_t i = 0; i < n; ++i) REQUIRE((*src)->Read((i * 7919) % n, &buf).ok());
  const double read_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "tar scan: %d shards x %d samples (%d members): warm %.1f ms, cold %.1f ms; %llu random Reads (warm): %.2f us "
      "each\n",
      shards, samples, shards * samples * 2, warm * 1e3, cold * 1e3, static_cast<unsigned long long>(n),
      read_s / static_cast<double>(n) * 1e6);
}

TEST_CASE("bench: tar header scan", "[.][bench]") {
  BenchScan(20, 250);  // 20 shards x 500 members
  BenchScan(20, 500);  // 20 shards x 1000 members
}

}  // namespace
}  // namespace spdl::io
