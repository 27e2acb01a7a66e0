#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "io/allowed_roots.h"
#include "io/manifest.h"
#include "io/read_file.h"
#include "io/sampler.h"

namespace spdl::io {
namespace {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/spdl-io-test-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    REQUIRE(p != nullptr);
    path_ = fs::canonical(p).string();
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }

  // Writes `contents` to path()/rel, creating parent directories.
  void Write(const std::string& rel, const std::string& contents = "x") const {
    const fs::path p = fs::path(path_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << contents;
  }
  void MkDir(const std::string& rel) const { fs::create_directories(fs::path(path_) / rel); }

 private:
  std::string path_;
};

// ---------------------------------------------------------------- ScanImageFolder

TEST_CASE("ScanImageFolder: sorted classes, labels, nested files, extension case, hidden files") {
  TempDir t;
  t.Write("dog/b.jpg");
  t.Write("dog/a.JPG");
  t.Write("dog/notes.txt");
  t.Write("dog/.hidden.jpg");
  t.Write("dog/.cache/c.jpg");          // hidden directory
  t.Write("dog/puppies/young/p.jpeg");  // nested: still "dog"
  t.Write("cat/z.png");
  t.Write("cat/y.Jpeg");
  t.Write("ant-b/q.jpg");               // '-' sorts before '/' and before letters
  t.Write(".trash/t.jpg");              // hidden class
  t.Write("loose.jpg");                 // not in any class
  t.MkDir("empty");                     // a class with no files keeps its label
  std::filesystem::create_directory_symlink(t / "dog", t / "dog/puppies/loop");  // a loop
  TempDir elsewhere;
  elsewhere.Write("real.jpg");
  std::filesystem::create_symlink(elsewhere / "real.jpg", t / "cat/linked.jpg");  // followed
  std::filesystem::create_symlink(t / "gone.jpg", t / "cat/dangling.jpg");        // ignored

  auto m = ScanImageFolder(t.path(), {".jpg", "JPEG", ".png"});
  REQUIRE(m.ok());
  CHECK(m->root == t.path());
  CHECK(m->classes == std::vector<std::string>{"ant-b", "cat", "dog", "empty"});
  std::vector<std::pair<std::string, int64_t>> got;
  for (const SampleRef& s : m->samples) got.emplace_back(s.path, s.label);
  const std::vector<std::pair<std::string, int64_t>> want = {
      {"ant-b/q.jpg", 0},
      {"cat/linked.jpg", 1},
      {"cat/y.Jpeg", 1},
      {"cat/z.png", 1},
      {"dog/a.JPG", 2},
      {"dog/b.jpg", 2},
      {"dog/puppies/young/p.jpeg", 2},
  };
  CHECK(got == want);
}

TEST_CASE("ScanImageFolder: errors name the root") {
  TempDir t;
  SECTION("missing root") {
    auto m = ScanImageFolder(t / "nope", {".jpg"});
    CHECK(m.status().code() == StatusCode::kNotFound);
    CHECK_THAT(m.status().message(), Catch::Contains(t / "nope"));
  }
  SECTION("root is a file") {
    t.Write("file.jpg");
    auto m = ScanImageFolder(t / "file.jpg", {".jpg"});
    CHECK(m.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(m.status().message(), Catch::Contains("not a directory"));
  }
  SECTION("empty root") {
    auto m = ScanImageFolder(t.path(), {".jpg"});
    CHECK(m.status().code() == StatusCode::kNotFound);
    CHECK_THAT(m.status().message(), Catch::Contains(t.path()) && Catch::Contains(".jpg"));
  }
  SECTION("classes but no matching files") {
    t.Write("a/readme.txt");
    auto m = ScanImageFolder(t.path(), {".jpg", ".png"});
    CHECK(m.status().code() == StatusCode::kNotFound);
    CHECK_THAT(m.status().message(), Catch::Contains(".jpg, .png"));
  }
  SECTION("no extensions") {
    t.Write("a/x.jpg");
    CHECK(ScanImageFolder(t.path(), {}).status().code() == StatusCode::kInvalidArgument);
  }
}

// ---------------------------------------------------------------- ResolveUnderRoots

TEST_CASE("ResolveUnderRoots: inside is allowed, every escape is refused") {
  TempDir t;
  t.Write("data/train/a.jpg");
  t.Write("data2/secret.jpg");
  t.Write("outside/secret.jpg");
  const std::string data = t / "data";
  const std::vector<std::string> roots = {data, t / "other-root"};

  SECTION("inside, and the root itself") {
    auto r = ResolveUnderRoots(t / "data/train/../train/a.jpg", roots);
    REQUIRE(r.ok());
    CHECK(*r == data + "/train/a.jpg");
    CHECK(ResolveUnderRoots(data, roots).ok());
    CHECK(ResolveUnderRoots(data + "/", roots).ok());
    CHECK(ResolveUnderRoots(data + "/train", {data + "/"}).ok());  // a root with a trailing slash
  }
  SECTION("'..' escape") {
    auto r = ResolveUnderRoots(t / "data/../outside/secret.jpg", roots);
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
    CHECK(r.status().message() == t / "data/../outside/secret.jpg" + " resolves to " +
                                      t / "outside/secret.jpg" +
                                      ", which is not below any allowed root (" + data + ", " +
                                      t / "other-root" + ")");
  }
  SECTION("absolute path outside") {
    CHECK(ResolveUnderRoots("/etc/passwd", roots).status().code() == StatusCode::kPermissionDenied);
  }
  SECTION("a symlink inside that points outside") {
    std::filesystem::create_symlink(t / "outside/secret.jpg", t / "data/train/link.jpg");
    std::filesystem::create_directory_symlink(t / "outside", t / "data/train/linkdir");
    auto r = ResolveUnderRoots(t / "data/train/link.jpg", roots);
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(r.status().message(), Catch::Contains("resolves to " + t / "outside/secret.jpg"));
    CHECK(ResolveUnderRoots(t / "data/train/linkdir/secret.jpg", roots).status().code() ==
          StatusCode::kPermissionDenied);
  }
  SECTION("a symlinked root is resolved too") {
    std::filesystem::create_directory_symlink(data, t / "data-link");
    auto r = ResolveUnderRoots(t / "data/train/a.jpg", {t / "data-link"});
    REQUIRE(r.ok());
    CHECK(*r == data + "/train/a.jpg");
  }
  SECTION("/data2 is not below /data") {
    auto r = ResolveUnderRoots(t / "data2/secret.jpg", roots);
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
  }
  SECTION("no roots configured") {
    auto r = ResolveUnderRoots(t / "data/train/a.jpg", {});
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(r.status().message(), Catch::Contains("no allowed data roots"));
  }
  SECTION("missing path") {
    auto r = ResolveUnderRoots(t / "data/nope.jpg", roots);
    CHECK(r.status().code() == StatusCode::kNotFound);
    CHECK_THAT(r.status().message(), Catch::Contains(t / "data/nope.jpg"));
  }
  SECTION("a symlink loop") {
    std::filesystem::create_symlink(t / "data/loop-b", t / "data/loop-a");
    std::filesystem::create_symlink(t / "data/loop-a", t / "data/loop-b");
    auto r = ResolveUnderRoots(t / "data/loop-a", roots);
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("loop") && Catch::Contains(t / "data/loop-a"));
  }
}

// ---------------------------------------------------------------- ReadFile

TEST_CASE("ReadFile: contents, empty files, and every kind of refusal") {
  TempDir t;
  std::vector<uint8_t> buf;
  SECTION("a normal file, reusing the buffer") {
    std::string big(100000, '\0');
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31);
    t.Write("big.bin", big);
    t.Write("small.bin", "hello");
    REQUIRE(ReadFile(t / "big.bin", &buf).ok());
    CHECK(std::string(buf.begin(), buf.end()) == big);
    const auto* before = buf.data();
    REQUIRE(ReadFile(t / "small.bin", &buf).ok());
    CHECK(std::string(buf.begin(), buf.end()) == "hello");
    CHECK(buf.data() == before);  // capacity reused
  }
  SECTION("an empty file is 0 bytes, not an error") {
    t.Write("empty.bin", "");
    buf.assign(10, 1);
    REQUIRE(ReadFile(t / "empty.bin", &buf).ok());
    CHECK(buf.empty());
  }
  SECTION("a directory") {
    Status s = ReadFile(t.path(), &buf);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(t.path()) && Catch::Contains("directory"));
  }
  SECTION("a fifo is refused without blocking, and so is a device") {
    REQUIRE(::mkfifo((t / "fifo").c_str(), 0600) == 0);
    Status s = ReadFile(t / "fifo", &buf);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("not a regular file"));
    CHECK(ReadFile("/dev/null", &buf).code() == StatusCode::kInvalidArgument);
  }
  SECTION("missing") {
    Status s = ReadFile(t / "nope.jpg", &buf);
    CHECK(s.code() == StatusCode::kNotFound);
    CHECK_THAT(s.message(), Catch::Contains(t / "nope.jpg"));
  }
  SECTION("max_bytes") {
    t.Write("ten.bin", "0123456789");
    Status s = ReadFile(t / "ten.bin", &buf, 9);
    CHECK(s.code() == StatusCode::kResourceExhausted);
    CHECK_THAT(s.message(), Catch::Contains(t / "ten.bin") && Catch::Contains("10 bytes"));
    CHECK(buf.empty());
    CHECK(ReadFile(t / "ten.bin", &buf, 10).ok());
  }
  SECTION("unreadable") {
    t.Write("locked.bin", "secret");
    REQUIRE(::chmod((t / "locked.bin").c_str(), 0) == 0);
    if (::geteuid() != 0) {
      Status s = ReadFile(t / "locked.bin", &buf);
      CHECK(s.code() == StatusCode::kPermissionDenied);
      CHECK_THAT(s.message(), Catch::Contains(t / "locked.bin"));
    } else {
      // Root reads any file, so check in a child that has given up root for "nobody".
      REQUIRE(::chmod(t.path().c_str(), 0755) == 0);
      const pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(2);
        std::vector<uint8_t> b;
        Status s = ReadFile(t / "locked.bin", &b);
        const bool named = s.message().find(t / "locked.bin") != std::string::npos;
        _exit(s.code() == StatusCode::kPermissionDenied && named ? 0 : 1);
      }
      int wstatus = 0;
      REQUIRE(::waitpid(pid, &wstatus, 0) == pid);
      REQUIRE(WIFEXITED(wstatus));
      if (WEXITSTATUS(wstatus) == 2) {
        WARN("skipped: running as root and cannot switch to uid 65534 to make a file unreadable");
      } else {
        CHECK(WEXITSTATUS(wstatus) == 0);
      }
    }
  }
}

// ---------------------------------------------------------------- the sampler

SamplerOptions Opts(uint64_t seed, uint32_t rank, uint32_t world, Uneven uneven = Uneven::kPad,
                    bool shuffle = true) {
  SamplerOptions o;
  o.seed = seed;
  o.shuffle = shuffle;
  o.rank = rank;
  o.world_size = world;
  o.uneven = uneven;
  return o;
}

TEST_CASE("EpochOrder: deterministic, and pinned so a change of generator is caught") {
  CHECK(EpochOrder(1000, Opts(42, 1, 4), 3) == EpochOrder(1000, Opts(42, 1, 4), 3));
  // These values are the contract: a saved job resumed by a newer daemon must see the same order.
  CHECK(EpochOrder(10, Opts(0, 0, 1), 0) == std::vector<uint64_t>{5, 4, 7, 1, 2, 0, 6, 9, 8, 3});
  CHECK(EpochOrder(10, Opts(42, 0, 1), 1) == std::vector<uint64_t>{4, 0, 9, 2, 7, 8, 1, 3, 6, 5});
  CHECK(EpochOrder(12, Opts(7, 2, 3), 5) == std::vector<uint64_t>{10, 3, 4, 11});
  const auto big = EpochOrder(1000000, Opts(123456789, 0, 1), 2);
  CHECK(std::vector<uint64_t>(big.begin(), big.begin() + 5) == std::vector<uint64_t>{243719, 943824, 613467, 915536, 231184});
}

TEST_CASE("EpochOrder: epochs and seeds give different orders") {
  const auto e0 = EpochOrder(1000, Opts(1, 0, 1), 0);
  const auto e1 = EpochOrder(1000, Opts(1, 0, 1), 1);
  const auto s2 = EpochOrder(1000, Opts(2, 0, 1), 0);
  CHECK(e0 != e1);
  CHECK(e0 != s2);
  CHECK(std::set<uint64_t>(e0.begin(), e0.end()).size() == 1000);  // a permutation
  std::vector<uint64_t> sorted = e1;
  std::sort(sorted.begin(), sorted.end());
  for (uint64_t i = 0; i < 1000; ++i) REQUIRE(sorted[i] == i);
}

TEST_CASE("EpochOrder: the ranks together cover every index exactly once") {
  for (uint32_t world : {1u, 2u, 3u, 8u}) {
    const uint64_t n = 24 * 10;  // a multiple of every world size here
    for (Uneven uneven : {Uneven::kPad, Uneven::kDrop}) {
      std::vector<int> seen(n, 0);
      for (uint32_t r = 0; r < world; ++r) {
        const auto o = EpochOrder(n, Opts(99, r, world, uneven), 4);
        CHECK(o.size() == n / world);
        for (uint64_t i : o) ++seen[i];
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
    }
  }
}

TEST_CASE("EpochOrder: pad and drop give every rank the same length") {
  struct Case { uint64_t n; uint32_t world; Uneven uneven; uint64_t per_rank; };
  const Case cases[] = {
      {10, 4, Uneven::kPad, 3}, {10, 4, Uneven::kDrop, 2}, {3, 4, Uneven::kPad, 1},
      {3, 4, Uneven::kDrop, 0}, {1, 8, Uneven::kPad, 1},   {0, 4, Uneven::kPad, 0},
      {12, 4, Uneven::kPad, 3}, {12, 4, Uneven::kDrop, 3},
  };
  for (const Case& c : cases) {
    INFO("n=" << c.n << " world=" << c.world << " pad=" << (c.uneven == Uneven::kPad));
    CHECK(SamplesPerRank(c.n, Opts(5, 0, c.world, c.uneven)) == c.per_rank);
    std::map<uint64_t, int> counts;
    for (uint32_t r = 0; r < c.world; ++r) {
      const auto o = EpochOrder(c.n, Opts(5, r, c.world, c.uneven), 0);
      CHECK(o.size() == c.per_rank);
      for (uint64_t i : o) {
        CHECK(i < c.n);
        ++counts[i];
      }
    }
    if (c.uneven == Uneven::kDrop) {
      CHECK(counts.size() == c.per_rank * c.world);  // no repeats, the tail dropped
    } else {
      CHECK(counts.size() == c.n);  // every sample is read; padding repeats some
    }
  }
  // Padding repeats the global order's own beginning, like torch's DistributedSampler.
  const auto o = [](uint32_t r) { return EpochOrder(10, Opts(0, r, 4, Uneven::kPad, false), 0); };
  CHECK(o(0) == std::vector<uint64_t>{0, 4, 8});
  CHECK(o(1) == std::vector<uint64_t>{1, 5, 9});
  CHECK(o(2) == std::vector<uint64_t>{2, 6, 0});
  CHECK(o(3) == std::vector<uint64_t>{3, 7, 1});
  CHECK(EpochOrder(10, Opts(0, 3, 4, Uneven::kDrop, false), 0) == std::vector<uint64_t>{3, 7});
  // Options that break their REQUIRES give nothing rather than garbage.
  CHECK(EpochOrder(10, Opts(0, 4, 4), 0).empty());
  CHECK(EpochOrder(10, Opts(0, 0, 0), 0).empty());
  CHECK(SamplesPerRank(10, Opts(0, 0, 0)) == 0);
}

TEST_CASE("EpochOrder: without shuffle the order is the identity in every epoch") {
  std::vector<uint64_t> identity(50);
  for (uint64_t i = 0; i < 50; ++i) identity[i] = i;
  CHECK(EpochOrder(50, Opts(3, 0, 1, Uneven::kPad, false), 0) == identity);
  CHECK(EpochOrder(50, Opts(3, 0, 1, Uneven::kPad, false), 7) == identity);
  CHECK(EpochOrder(6, Opts(3, 1, 2, Uneven::kPad, false), 7) == std::vector<uint64_t>{1, 3, 5});
}

TEST_CASE("BatchesPerEpoch") {
  CHECK(BatchesPerEpoch(10, 3, false) == 4);
  CHECK(BatchesPerEpoch(10, 3, true) == 3);
  CHECK(BatchesPerEpoch(9, 3, false) == 3);
  CHECK(BatchesPerEpoch(9, 3, true) == 3);
  CHECK(BatchesPerEpoch(2, 3, false) == 1);
  CHECK(BatchesPerEpoch(2, 3, true) == 0);
  CHECK(BatchesPerEpoch(0, 3, false) == 0);
  CHECK(BatchesPerEpoch(10, 0, false) == 0);
  CHECK(BatchesPerEpoch(1281167, 256, true) == 5004);
}

}  // namespace
}  // namespace spdl::io
