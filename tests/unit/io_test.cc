#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "io/allowed_roots.h"
#include "io/fs_identity.h"
#include "io/manifest.h"
#include "io/read_file.h"
#include "io/sampler.h"
#include "skip.h"
#include "temp_dir.h"

namespace spdl::io {
namespace {

namespace fs = std::filesystem;

using spdl::testing::TempDir;  // temp_dir.h

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
  t.Write("ant-b/q.jpg");   // '-' sorts before '/' and before letters
  t.Write(".trash/t.jpg");  // hidden class
  t.Write("loose.jpg");     // not in any class
  t.MkDir("empty");         // a class with no files keeps its label
  std::filesystem::create_directory_symlink(t / "dog", t / "dog/puppies/loop");  // a loop
  TempDir elsewhere;
  elsewhere.Write("real.jpg");
  std::filesystem::create_symlink(elsewhere / "real.jpg", t / "cat/linked.jpg");  // followed
  std::filesystem::create_symlink(t / "gone.jpg", t / "cat/dangling.jpg");        // ignored

  auto m = ScanImageFolder(t.path, {".jpg", "JPEG", ".png"});
  REQUIRE(m.ok());
  CHECK(m->root == t.path);
  CHECK(m->classes == std::vector<std::string>{"ant-b", "cat", "dog", "empty"});
  std::vector<std::pair<std::string, int64_t>> got;
  for (const SampleRef& s : m->samples) got.emplace_back(s.path, s.label);
  const std::vector<std::pair<std::string, int64_t>> want = {
      {"ant-b/q.jpg", 0}, {"cat/linked.jpg", 1},           {"cat/y.Jpeg", 1}, {"cat/z.png", 1}, {"dog/a.JPG", 2},
      {"dog/b.jpg", 2},   {"dog/puppies/young/p.jpeg", 2},
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
    auto m = ScanImageFolder(t.path, {".jpg"});
    CHECK(m.status().code() == StatusCode::kNotFound);
    CHECK_THAT(m.status().message(), Catch::Contains(t.path) && Catch::Contains(".jpg"));
  }
  SECTION("classes but no matching files: how many were left out by the endings, and which endings") {
    t.Write("a/readme.txt");
    auto m = ScanImageFolder(t.path, {".jpg", ".png"});
    CHECK(m.status().code() == StatusCode::kNotFound);
    CHECK(m.status().message() == "image folder " + t.path +
                                      ": found 1 files in its 1 class sub-directories, none with the endings [.jpg, "
                                      ".png] (1 .txt); set source.extensions");
  }
  SECTION("a folder of PNG files scanned for JPEG endings: the refusal counts them and names the key to set") {
    for (int i = 0; i < 24; ++i) {
      t.Write("cat/" + std::to_string(i) + ".PNG");
      t.Write("dog/deep/" + std::to_string(i) + ".png");
    }
    t.Write("dog/NOTES");
    auto m = ScanImageFolder(t.path, {"jpg", ".JPEG"});
    CHECK(m.status().code() == StatusCode::kNotFound);
    CHECK_THAT(m.status().message(),
               Catch::Contains("found 49 files in its 2 class sub-directories, none with the endings [.jpg, .jpeg] "
                               "(48 .png, 1 (none)); set source.extensions"));
  }
  SECTION("class sub-directories without any file") {
    std::filesystem::create_directories(t / "a");
    auto m = ScanImageFolder(t.path, {".jpg"});
    CHECK(m.status().code() == StatusCode::kNotFound);
    CHECK_THAT(m.status().message(), Catch::Contains("no files with extension .jpg") && Catch::Contains("1 classes"));
  }
  SECTION("no extensions") {
    t.Write("a/x.jpg");
    CHECK(ScanImageFolder(t.path, {}).status().code() == StatusCode::kInvalidArgument);
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
    CHECK(r.status().message() ==
          t / "data/../outside/secret.jpg" + " is not below any allowed root (" + data + ", " + t / "other-root" + ")");
  }
  SECTION("absolute path outside") {
    CHECK(ResolveUnderRoots("/etc/passwd", roots).status().code() == StatusCode::kPermissionDenied);
  }
  SECTION("outside the roots: the same answer whether or not the path exists") {
    auto exists = ResolveUnderRoots(t / "outside/secret.jpg", roots);
    auto missing = ResolveUnderRoots(t / "outside/secreX.jpg", roots);
    CHECK(exists.status().code() == StatusCode::kPermissionDenied);
    CHECK(missing.status().code() == StatusCode::kPermissionDenied);
    std::string a = exists.status().message(), b = missing.status().message();
    a.replace(a.find("secret.jpg"), 10, "X");
    b.replace(b.find("secreX.jpg"), 10, "X");
    CHECK(a == b);
  }
  SECTION("a symlink inside that points outside: refused, its target never named") {
    std::filesystem::create_symlink(t / "outside/secret.jpg", t / "data/train/link.jpg");
    std::filesystem::create_directory_symlink(t / "outside", t / "data/train/linkdir");
    auto r = ResolveUnderRoots(t / "data/train/link.jpg", roots);
    CHECK(r.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(r.status().message(), Catch::Contains("leads out of the allowed roots"));
    CHECK_THAT(r.status().message(), !Catch::Contains("outside"));
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
    Status s = ReadFile(t.path, &buf);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(t.path) && Catch::Contains("directory"));
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
      REQUIRE(::chmod(t.path.c_str(), 0755) == 0);
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
        SPDL_SKIP_PART("running as root and cannot switch to uid 65534 to make a file unreadable");
      } else {
        CHECK(WEXITSTATUS(wstatus) == 0);
      }
    }
  }
}

// ---------------------------------------------------------------- the sampler

SamplerOptions Opts(uint64_t seed, uint32_t rank, uint32_t world, Uneven uneven = Uneven::kPad, bool shuffle = true) {
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
  CHECK(std::vector<uint64_t>(big.begin(), big.begin() + 5) ==
        std::vector<uint64_t>{243719, 943824, 613467, 915536, 231184});
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
  struct Case {
    uint64_t n;
    uint32_t world;
    Uneven uneven;
    uint64_t per_rank;
  };
  const Case cases[] = {
      {10, 4, Uneven::kPad, 3}, {10, 4, Uneven::kDrop, 2}, {3, 4, Uneven::kPad, 1},  {3, 4, Uneven::kDrop, 0},
      {1, 8, Uneven::kPad, 1},  {0, 4, Uneven::kPad, 0},   {12, 4, Uneven::kPad, 3}, {12, 4, Uneven::kDrop, 3},
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

// ---------------------------------------------------------------- ShardedEpochOrder

// Which shard index i belongs to, for shard sizes `sizes`.
uint64_t ShardOf(const std::vector<uint64_t>& sizes, uint64_t i) {
  for (uint64_t s = 0; s < sizes.size(); ++s) {
    if (i < sizes[s]) return s;
    i -= sizes[s];
  }
  return sizes.size();
}

TEST_CASE("ShardedEpochOrder: the ranks cover every sample once, with equal lengths") {
  const std::vector<uint64_t> sizes = {7, 0, 13, 5, 9, 1, 12};  // 47 samples, an empty shard
  const uint64_t n = 47;
  for (uint32_t world : {1u, 2u, 3u, 5u}) {
    for (Uneven uneven : {Uneven::kPad, Uneven::kDrop}) {
      for (uint64_t buffer : {uint64_t{1}, uint64_t{4}, uint64_t{100}}) {
        INFO("world=" << world << " pad=" << (uneven == Uneven::kPad) << " buffer=" << buffer);
        std::map<uint64_t, int> counts;
        for (uint32_t r = 0; r < world; ++r) {
          const auto o = ShardedEpochOrder(sizes, buffer, Opts(3, r, world, uneven), 2);
          CHECK(o.size() == SamplesPerRank(n, Opts(3, r, world, uneven)));
          for (uint64_t i : o) ++counts[i];
        }
        for (const auto& [i, c] : counts) CHECK(i < n);
        if (uneven == Uneven::kDrop) {
          CHECK(counts.size() == (n / world) * world);
          CHECK(std::all_of(counts.begin(), counts.end(), [](const auto& kv) { return kv.second == 1; }));
        } else {
          CHECK(counts.size() == n);  // padding repeats some, every sample is there
        }
      }
    }
  }
}

TEST_CASE("ShardedEpochOrder: a pure function of its inputs, shuffled per epoch") {
  const std::vector<uint64_t> sizes(20, 10);
  const auto a = ShardedEpochOrder(sizes, 16, Opts(9, 1, 2), 0);
  CHECK(a == ShardedEpochOrder(sizes, 16, Opts(9, 1, 2), 0));
  CHECK(a != ShardedEpochOrder(sizes, 16, Opts(9, 1, 2), 1));   // another epoch
  CHECK(a != ShardedEpochOrder(sizes, 16, Opts(10, 1, 2), 0));  // another seed
  CHECK(a != ShardedEpochOrder(sizes, 8, Opts(9, 1, 2), 0));    // another buffer
  CHECK(a != ShardedEpochOrder(sizes, 16, Opts(9, 0, 2), 0));   // another rank
  // Pinned: a saved job resumed by a newer daemon must see the same order.
  CHECK(ShardedEpochOrder({3, 3, 3}, 2, Opts(0, 0, 1), 0) == std::vector<uint64_t>{4, 3, 0, 5, 2, 1, 6, 8, 7});
  // Without shuffle: shard order, the identity, contiguous per rank.
  CHECK(ShardedEpochOrder({3, 3, 3}, 5, Opts(0, 0, 1, Uneven::kPad, false), 4) ==
        std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(ShardedEpochOrder({3, 3, 3}, 5, Opts(0, 1, 2, Uneven::kPad, false), 4) ==
        std::vector<uint64_t>{5, 6, 7, 8, 0});  // padded from the start of the order
  CHECK(ShardedEpochOrder({3, 3, 3}, 5, Opts(0, 1, 2, Uneven::kDrop, false), 4) == std::vector<uint64_t>{4, 5, 6, 7});
  // Options that break their REQUIRES, and no samples, give nothing.
  CHECK(ShardedEpochOrder({3}, 2, Opts(0, 2, 2), 0).empty());
  CHECK(ShardedEpochOrder({0, 0}, 2, Opts(0, 0, 1), 0).empty());
  CHECK(ShardedEpochOrder({}, 2, Opts(0, 0, 1), 0).empty());
}

TEST_CASE("ShardedEpochOrder: shard by shard, the buffer bounds how far a sample moves") {
  const std::vector<uint64_t> sizes(30, 8);  // 240 samples
  SECTION("buffer 1: whole shards in a shuffled order, each shard in index order") {
    const auto o = ShardedEpochOrder(sizes, 1, Opts(5, 0, 1), 3);
    REQUIRE(o.size() == 240);
    std::vector<uint64_t> shard_order;
    for (size_t k = 0; k < o.size(); ++k) {
      if (k % 8 == 0) shard_order.push_back(ShardOf(sizes, o[k]));
      CHECK(ShardOf(sizes, o[k]) == shard_order.back());
      if (k % 8 != 0) CHECK(o[k] == o[k - 1] + 1);
    }
    std::vector<uint64_t> identity(30);
    std::iota(identity.begin(), identity.end(), 0);
    CHECK(shard_order != identity);  // shuffled
    std::sort(shard_order.begin(), shard_order.end());
    CHECK(shard_order == identity);  // each shard once
  }
  SECTION("buffer B: at any point the shards in use span at most B + 1 samples of the stream") {
    const uint64_t buffer = 12;
    const auto o = ShardedEpochOrder(sizes, buffer, Opts(5, 0, 1), 3);
    REQUIRE(o.size() == 240);
    // Output k is emitted when stream sample B + k arrives (or later, while draining), so outputs
    // 0..k come from the first B + k + 1 samples of the stream, which is whole shards of 8: at most
    // ceil((B + k + 1) / 8) distinct shards among them.
    std::set<uint64_t> seen;
    for (size_t k = 0; k < o.size(); ++k) {
      seen.insert(ShardOf(sizes, o[k]));
      REQUIRE(seen.size() <= (buffer + k + 1 + 7) / 8);
    }
    // And it is a permutation, not the plain stream.
    std::vector<uint64_t> sorted = o;
    std::sort(sorted.begin(), sorted.end());
    for (uint64_t i = 0; i < 240; ++i) REQUIRE(sorted[i] == i);
    CHECK(o != ShardedEpochOrder(sizes, 1, Opts(5, 0, 1), 3));
  }
  SECTION("ranks read contiguous stretches: with buffer 1 each rank touches about 1/world of the shards") {
    std::set<uint64_t> r0, r1;
    for (uint64_t i : ShardedEpochOrder(sizes, 1, Opts(5, 0, 2), 0)) r0.insert(ShardOf(sizes, i));
    for (uint64_t i : ShardedEpochOrder(sizes, 1, Opts(5, 1, 2), 0)) r1.insert(ShardOf(sizes, i));
    CHECK(r0.size() == 15);
    CHECK(r1.size() == 15);
    std::vector<uint64_t> both;
    std::set_intersection(r0.begin(), r0.end(), r1.begin(), r1.end(), std::back_inserter(both));
    CHECK(both.empty());
  }
}

// ---------------------------------------------------------------- RootDir

TEST_CASE("RootDir: reads beneath the root, refuses every way out") {
  TempDir t;
  t.Write("root/a/img.jpg", "inside");
  t.Write("outside/secret.txt", "secret");
  t.Write("root/b/real.jpg", "real");
  fs::create_symlink(t / "outside/secret.txt", t / "root/a/escape.jpg");        // absolute target
  fs::create_symlink("../../outside/secret.txt", t / "root/a/escape_rel.jpg");  // relative target
  fs::create_symlink(t / "outside", t / "root/outdir");                         // a directory link
  fs::create_symlink("../b/real.jpg", t / "root/a/inside_link.jpg");            // stays inside
  fs::create_symlink("loop2", t / "root/loop1");
  fs::create_symlink("loop1", t / "root/loop2");

  auto opened = RootDir::Open(t / "root");
  REQUIRE(opened.ok());
  const RootDir& root = **opened;
  std::vector<uint8_t> buf;
  auto text = [&] { return std::string(buf.begin(), buf.end()); };

  SECTION("inside, and a link that stays inside") {
    REQUIRE(root.ReadFile("a/img.jpg", &buf).ok());
    CHECK(text() == "inside");
    REQUIRE(root.ReadFile("a/inside_link.jpg", &buf).ok());
    CHECK(text() == "real");
    REQUIRE(root.ReadFile("a/../b/real.jpg", &buf).ok());  // '..' that stays inside is fine
  }
  SECTION("'..' out of the root") {
    Status s = root.ReadFile("../outside/secret.txt", &buf);
    CHECK(s.code() == StatusCode::kPermissionDenied);
    CHECK(s.message().find("escapes its root " + t / "root") != std::string::npos);
    CHECK(s.message().find("../outside/secret.txt") != std::string::npos);
    CHECK(buf.empty());
  }
  SECTION("an absolute path") {
    Status s = root.ReadFile(t / "outside/secret.txt", &buf);
    CHECK(s.code() == StatusCode::kPermissionDenied);
    CHECK(s.message().find("escapes its root") != std::string::npos);
  }
  SECTION("symbolic links leading out, to a file or through a directory") {
    for (const char* rel : {"a/escape.jpg", "a/escape_rel.jpg", "outdir/secret.txt"}) {
      INFO(rel);
      Status s = root.ReadFile(rel, &buf);
      CHECK(s.code() == StatusCode::kPermissionDenied);
      CHECK(s.message().find(rel) != std::string::npos);
      CHECK(buf.empty());
    }
  }
  SECTION("a symbolic link loop") {
    Status s = root.ReadFile("loop1", &buf);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(s.message().find("loop") != std::string::npos);
  }
  SECTION("missing files and directories keep their codes") {
    CHECK(root.ReadFile("a/nope.jpg", &buf).code() == StatusCode::kNotFound);
    CHECK(root.ReadFile("a", &buf).code() == StatusCode::kInvalidArgument);
    CHECK(root.ReadFile("a/img.jpg", &buf, 3).code() == StatusCode::kResourceExhausted);
  }
  SECTION("the realpath fallback (kernels without openat2) refuses the same escapes") {
    auto code = [&](const std::string& rel) {
      auto fd = root.OpenBeneathFallback(rel);
      return fd.ok() ? StatusCode::kOk : fd.status().code();
    };
    CHECK(code("a/img.jpg") == StatusCode::kOk);
    CHECK(code("a/inside_link.jpg") == StatusCode::kOk);
    CHECK(code("../outside/secret.txt") == StatusCode::kPermissionDenied);
    CHECK(code(t / "outside/secret.txt") == StatusCode::kPermissionDenied);
    CHECK(code("a/escape.jpg") == StatusCode::kPermissionDenied);
    CHECK(code("a/escape_rel.jpg") == StatusCode::kPermissionDenied);
    CHECK(code("outdir/secret.txt") == StatusCode::kPermissionDenied);
    CHECK(code("loop1") == StatusCode::kInvalidArgument);
    CHECK(code("a/nope.jpg") == StatusCode::kNotFound);
    auto escaped = root.OpenBeneathFallback("a/escape.jpg");
    CHECK(escaped.status().message().find("a/escape.jpg") != std::string::npos);
  }
  SECTION("Open: missing, not a directory") {
    CHECK(RootDir::Open(t / "nope").status().code() == StatusCode::kNotFound);
    CHECK(RootDir::Open(t / "root/a/img.jpg").status().code() == StatusCode::kInvalidArgument);
  }
  SECTION("RootSet: an absolute path beneath the allowed root that holds it") {
    auto set = RootSet::Open({t / "root", t / "nope"});
    REQUIRE(set->ReadFile(t / "root/a/img.jpg", &buf).ok());
    CHECK(text() == "inside");
    CHECK(set->ReadFile(t / "outside/secret.txt", &buf).code() == StatusCode::kPermissionDenied);
    CHECK(set->ReadFile(t / "root/a/escape.jpg", &buf).code() == StatusCode::kPermissionDenied);
    CHECK(set->ReadFile(t / "root/../outside/secret.txt", &buf).code() == StatusCode::kPermissionDenied);
  }
}

// ---------------------------------------------------------------- FsIdentity

TEST_CASE("ScopedFsIdentity: this thread opens with the user's rights, other threads keep the daemon's") {
  if (::geteuid() != 0) {
    WARN("skipped: switching the filesystem identity needs root (CAP_SETUID, CAP_SETGID)");
    return;
  }
  TempDir t;
  ::chmod(t.path.c_str(), 0755);
  t.Write("secret.bin", "root only");
  t.Write("group.bin", "group 4242");
  ::chmod((t / "secret.bin").c_str(), 0600);
  REQUIRE(::chown((t / "group.bin").c_str(), 0, 4242) == 0);
  ::chmod((t / "group.bin").c_str(), 0640);
  REQUIRE(ProbeSwitchSupport().can_switch);
  CHECK(CheckServable(12345).ok());

  FsIdentity nobody{65534, 65534, {65534}};
  FsIdentity member{65534, 65534, {4242, 65534}};
  std::vector<uint8_t> bytes;
  // Another thread, started as the daemon: it keeps reading with the daemon's rights meanwhile.
  std::atomic<bool> go{false};
  Status other;
  std::thread reader([&] {
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<uint8_t> mine;
    other = ReadFile(t / "secret.bin", &mine);
  });
  {
    ScopedFsIdentity as(&nobody);
    REQUIRE(as.ok());
    CHECK(CurrentFsIdentity() == &nobody);
    CHECK(CurrentFsIdentityKey() == "65534:65534:65534");
    CHECK(ReadFile(t / "secret.bin", &bytes).code() == StatusCode::kPermissionDenied);
    CHECK(ReadFile(t / "group.bin", &bytes).code() == StatusCode::kPermissionDenied);
    // Another thread meanwhile still reads as the daemon (root): the switch is per thread.
    // (A thread made now would inherit this identity, as clone() copies credentials: the daemon's
    // pools start their threads before any job runs.)
    go = true;
    reader.join();
    CHECK(other.ok());
    {
      ScopedFsIdentity inner(&member);  // nested: the supplementary group opens group.bin
      REQUIRE(inner.ok());
      CHECK(ReadFile(t / "group.bin", &bytes).ok());
      CHECK(ReadFile(t / "secret.bin", &bytes).code() == StatusCode::kPermissionDenied);
    }
    CHECK(ReadFile(t / "group.bin", &bytes).code() == StatusCode::kPermissionDenied);  // the outer one again
  }
  CHECK(CurrentFsIdentity() == nullptr);
  CHECK(ReadFile(t / "secret.bin", &bytes).ok());  // the daemon's rights are back
  // A scan as the user: a directory it cannot list fails the scan, naming only that directory.
  t.Write("data/a/1.jpg");
  t.Write("data/b/2.jpg");
  ::chmod((t / "data").c_str(), 0755);
  ::chmod((t / "data/a").c_str(), 0755);
  ::chmod((t / "data/b").c_str(), 0700);
  {
    ScopedFsIdentity as(&nobody);
    auto m = ScanImageFolder(t / "data", {".jpg"});
    CHECK(m.status().code() == StatusCode::kPermissionDenied);
    CHECK_THAT(m.status().message(), Catch::Contains(t / "data/b") && !Catch::Contains("2.jpg"));
  }
  CHECK(ScanImageFolder(t / "data", {".jpg"}).ok());
}

TEST_CASE("LookupFsIdentity: the user's groups from the group database, always with the primary one") {
  const FsIdentity root = LookupFsIdentity(0, 0);
  CHECK(root.uid == 0);
  CHECK(std::find(root.groups.begin(), root.groups.end(), gid_t{0}) != root.groups.end());
  CHECK(std::is_sorted(root.groups.begin(), root.groups.end()));
  const FsIdentity unnamed = LookupFsIdentity(987654, 987653);  // no passwd entry
  CHECK(unnamed.groups == std::vector<gid_t>{987653});
  CHECK(unnamed.Key() == "987654:987653:987653");
}

TEST_CASE("ScanImageFolder: a class folder that is a link out of the root is refused, its target unnamed") {
  TempDir t;
  t.Write("data/a/1.jpg");
  t.Write("elsewhere/hidden-target/x.jpg");
  fs::create_directory_symlink(t / "elsewhere/hidden-target", t / "data/b");
  auto m = ScanImageFolder(t / "data", {".jpg"});
  CHECK(m.status().code() == StatusCode::kPermissionDenied);
  CHECK_THAT(m.status().message(), Catch::Contains("b is a symbolic link that escapes the root"));
  CHECK_THAT(m.status().message(), !Catch::Contains("hidden-target"));
  // A deeper link out is not followed: kept only when named like a sample (its read then fails).
  fs::remove(t / "data/b");
  fs::create_directory_symlink(t / "elsewhere/hidden-target", t / "data/a/deeper");
  fs::create_symlink(t / "elsewhere/hidden-target/x.jpg", t / "data/a/out.jpg");
  auto ok = ScanImageFolder(t / "data", {".jpg"});
  REQUIRE(ok.ok());
  std::vector<std::string> paths;
  for (const auto& s : ok->samples) paths.push_back(s.path);
  CHECK(paths == std::vector<std::string>{"a/1.jpg", "a/out.jpg"});
  // A relative link that stays below the root is followed; an absolute one is refused, clearly.
  fs::create_directory_symlink(t / "data/a", t / "data/c");
  auto absolute = ScanImageFolder(t / "data", {".jpg"});
  CHECK_THAT(absolute.status().message(), Catch::Contains("c is an absolute symbolic link"));
  fs::remove(t / "data/c");
  fs::create_directory_symlink("a", t / "data/c");
  auto linked = ScanImageFolder(t / "data", {".jpg"});
  REQUIRE(linked.ok());
  CHECK(linked->classes == std::vector<std::string>{"a", "c"});
}

}  // namespace
}  // namespace spdl::io
