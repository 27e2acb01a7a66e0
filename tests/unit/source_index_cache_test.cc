// Tests of io::SourceIndexCache (io/source_index_cache.h): one scan for concurrent opens of one
// key, errors not cached, entries freed with their last holder, changes detected; then the same
// through the real sources' Open functions on real folders, list files and tar shards (written by
// the tar CLI), each with its own cache instance so that the counts are this test's.
#include "io/source_index_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "io/file_list_source.h"
#include "io/http_source.h"
#include "io/sample_source.h"
#include "io/tar_shard_source.h"
#include "temp_dir.h"

namespace spdl::io {
namespace {

namespace fs = std::filesystem;
using Catch::Contains;

using spdl::testing::TempDir;    // temp_dir.h
using spdl::testing::WriteFile;  // temp_dir.h

// Sets the mtime of `path` and of everything below it to a minute ago, so that an index scanned
// now is not "racy" and may be reused (see kRacyWindowNs).
void Backdate(const std::string& path) {
  const auto old = fs::file_time_type::clock::now() - std::chrono::minutes(1);
  fs::last_write_time(path, old);
  if (fs::is_directory(path)) {
    for (const auto& e : fs::recursive_directory_iterator(path)) fs::last_write_time(e.path(), old);
  }
}

// A fake index for the cache's own tests; counts its destructions.
struct FakeIndex final : SourceIndex {
  explicit FakeIndex(std::atomic<int>* destroyed, int id) : destroyed(destroyed), id(id) {}
  ~FakeIndex() override { ++*destroyed; }
  std::atomic<int>* destroyed;
  int id;
};

// Waits (up to 10 s) until `n` opens are waiting for the running scan.
void WaitForJoined(const SourceIndexCache& cache, uint64_t n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (cache.stats().joined < n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(cache.stats().joined == n);
}

TEST_CASE("SourceIndexCache: concurrent opens of one key wait for one scan") {
  SourceIndexCache cache;
  std::atomic<int> destroyed{0}, scans{0};
  std::atomic<bool> release{false};
  constexpr int kOpens = 8;
  auto scan = [&]() -> Result<std::shared_ptr<const FakeIndex>> {
    const int id = ++scans;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto index = std::make_shared<FakeIndex>(&destroyed, id);
    index->scan_start_ns = RealtimeNowNs();
    return std::shared_ptr<const FakeIndex>(std::move(index));
  };
  std::vector<std::shared_ptr<const FakeIndex>> got(kOpens);
  std::vector<std::thread> threads;
  for (int i = 0; i < kOpens; ++i) {
    threads.emplace_back([&, i] {
      auto r = cache.Get<FakeIndex>("k", "fake", scan);
      if (r.ok()) got[i] = *r;
    });
  }
  WaitForJoined(cache, kOpens - 1);  // all but the scanning one wait for it
  release = true;
  for (auto& t : threads) t.join();
  CHECK(scans == 1);
  for (const auto& g : got) {
    REQUIRE(g != nullptr);
    CHECK(g.get() == got[0].get());
  }
  const auto st = cache.stats();
  CHECK(st.scans == 1);
  CHECK(st.joined == kOpens - 1);
  CHECK(st.failed == 0);
  // Another key is another scan.
  auto other = cache.Get<FakeIndex>("k2", "fake", scan);
  REQUIRE(other.ok());
  CHECK((*other)->id == 2);
}

TEST_CASE("SourceIndexCache: a failed scan is not cached and every waiter gets its error") {
  SourceIndexCache cache;
  std::atomic<int> destroyed{0}, scans{0};
  std::atomic<bool> release{false}, fail{true};
  auto scan = [&]() -> Result<std::shared_ptr<const FakeIndex>> {
    const int id = ++scans;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (fail) return NotFound("no such dataset (scan " + std::to_string(id) + ")");
    auto index = std::make_shared<FakeIndex>(&destroyed, id);
    index->scan_start_ns = RealtimeNowNs();
    return std::shared_ptr<const FakeIndex>(std::move(index));
  };
  std::vector<Status> errors(4, Status::Ok());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto r = cache.Get<FakeIndex>("k", "fake", scan);
      errors[i] = r.ok() ? Status::Ok() : r.status();
    });
  }
  WaitForJoined(cache, 3);
  release = true;
  for (auto& t : threads) t.join();
  for (const Status& s : errors) {
    CHECK(s.code() == StatusCode::kNotFound);
    CHECK_THAT(s.message(), Contains("scan 1"));
  }
  CHECK(cache.stats().failed == 1);
  CHECK(cache.live_entries() == 0);
  // The next open scans again, and now succeeds.
  fail = false;
  auto r = cache.Get<FakeIndex>("k", "fake", scan);
  REQUIRE(r.ok());
  CHECK((*r)->id == 2);
  CHECK(cache.stats().scans == 2);
}

TEST_CASE("SourceIndexCache: an entry lives while a holder does, then is freed") {
  SourceIndexCache cache;
  std::atomic<int> destroyed{0}, scans{0};
  TempDir t;
  WriteFile(t / "input", "x");
  Backdate(t / "input");
  auto scan = [&]() -> Result<std::shared_ptr<const FakeIndex>> {
    auto index = std::make_shared<FakeIndex>(&destroyed, ++scans);
    index->scan_start_ns = RealtimeNowNs();
    struct stat st {};
    REQUIRE(::stat((t / "input").c_str(), &st) == 0);
    index->inputs.push_back(MakeStamp(t / "input", st));
    return std::shared_ptr<const FakeIndex>(std::move(index));
  };
  auto a = cache.Get<FakeIndex>("k", "fake", scan);
  auto b = cache.Get<FakeIndex>("k", "fake", scan);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->get() == b->get());
  CHECK(cache.stats().hits == 1);
  CHECK(cache.live_entries() == 1);
  std::shared_ptr<const FakeIndex> keep = *a;
  a = NotFound("dropped");
  CHECK(destroyed == 0);
  keep.reset();
  CHECK(destroyed == 0);  // b still holds it
  b = NotFound("dropped");
  CHECK(destroyed == 1);  // the cache kept no reference
  CHECK(cache.live_entries() == 0);
  auto c = cache.Get<FakeIndex>("k", "fake", scan);
  REQUIRE(c.ok());
  CHECK((*c)->id == 2);
  CHECK(cache.stats().scans == 2);
}

TEST_CASE("SourceIndexCache: a changed input is scanned again, a racy one is never reused") {
  SourceIndexCache cache;
  std::atomic<int> destroyed{0}, scans{0};
  TempDir t;
  WriteFile(t / "input", "x");
  auto scan = [&]() -> Result<std::shared_ptr<const FakeIndex>> {
    auto index = std::make_shared<FakeIndex>(&destroyed, ++scans);
    index->scan_start_ns = RealtimeNowNs();
    struct stat st {};
    if (::stat((t / "input").c_str(), &st) != 0) return NotFound("input gone");
    index->inputs.push_back(MakeStamp(t / "input", st));
    return std::shared_ptr<const FakeIndex>(std::move(index));
  };
  // Just written: racy, so the live entry is not reused.
  auto a = cache.Get<FakeIndex>("k", "fake", scan);
  REQUIRE(a.ok());
  std::string why;
  CHECK_FALSE((*a)->StillValid(&why));
  CHECK_THAT(why, Contains("too close to the scan"));
  auto b = cache.Get<FakeIndex>("k", "fake", scan);
  REQUIRE(b.ok());
  CHECK((*b)->id == 2);
  CHECK(cache.stats().stale == 1);

  Backdate(t / "input");
  auto c = cache.Get<FakeIndex>("k", "fake", scan);  // b is stale now (its stamp is the old mtime)
  REQUIRE(c.ok());
  CHECK((*c)->id == 3);
  auto d = cache.Get<FakeIndex>("k", "fake", scan);  // c is valid: shared
  REQUIRE(d.ok());
  CHECK((*d)->id == 3);
  CHECK(cache.stats().hits == 1);

  // A new size (same mtime) is a change too.
  const auto mtime = fs::last_write_time(t / "input");
  WriteFile(t / "input", "longer");
  fs::last_write_time(t / "input", mtime);
  CHECK_FALSE((*d)->StillValid(&why));
  CHECK_THAT(why, Contains("changed"));
  auto e = cache.Get<FakeIndex>("k", "fake", scan);
  REQUIRE(e.ok());
  CHECK((*e)->id == 4);
  // The input removed: stale, and the rescan's error reaches the caller.
  fs::remove(t / "input");
  auto f = cache.Get<FakeIndex>("k", "fake", scan);
  CHECK(f.status().code() == StatusCode::kNotFound);
  CHECK((*d)->id == 3);  // holders keep their index
}

// ---------------------------------------------------------------- through the sources' Open

// root/<class>/<file>: 3 classes x 4 files, and a nested directory in class b.
void MakeFolder(const std::string& root) {
  for (const char* cls : {"a", "b", "c"}) {
    for (int i = 0; i < 4; ++i) WriteFile(root + "/" + cls + "/" + std::to_string(i) + ".jpg", "not a jpeg");
  }
  WriteFile(root + "/b/nested/n0.jpg", "x");
  Backdate(root);
}

TEST_CASE("SourceIndexCache: image folder opens share one scan and see changes") {
  TempDir t;
  MakeFolder(t / "data");
  SourceIndexCache cache;
  const std::vector<std::string> roots = {t / "data"};
  auto open = [&](const std::string& root) { return ImageFolderSource::Open(root, {".jpg"}, roots, 1 << 20, &cache); };

  // Eight opens at once: one scan; the others wait for it or reuse it.
  std::vector<std::unique_ptr<ImageFolderSource>> srcs(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < srcs.size(); ++i) {
    threads.emplace_back([&, i] {
      auto s = open(i % 2 ? t / "data" : t / "data/./b/..");  // two spellings of one root
      if (s.ok()) srcs[i] = std::move(s).value();
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& s : srcs) {
    REQUIRE(s != nullptr);
    CHECK(s->size() == 13);
    CHECK(&s->sample(0) == &srcs[0]->sample(0));  // one manifest in memory
    CHECK(s->Identity() == "image_folder " + t / "data");
  }
  auto st = cache.stats();
  CHECK(st.scans == 1);
  CHECK(st.hits + st.joined == 7);
  std::vector<uint8_t> bytes;
  REQUIRE(srcs[3]->Read(12, &bytes).ok());

  // Other extensions: another key.
  auto png = ImageFolderSource::Open(t / "data", {".png", ".jpg"}, roots, 1 << 20, &cache);
  REQUIRE(png.ok());
  CHECK(cache.stats().scans == 2);

  SECTION("a file added to a class directory") {
    WriteFile(t / "data/a/9.jpg", "x");
    auto s = open(t / "data");
    REQUIRE(s.ok());
    CHECK((*s)->size() == 14);
    CHECK(srcs[0]->size() == 13);  // a running job keeps its index
  }
  SECTION("a file added to a nested directory") {
    WriteFile(t / "data/b/nested/n1.jpg", "x");
    auto s = open(t / "data");
    REQUIRE(s.ok());
    CHECK((*s)->size() == 14);
  }
  SECTION("a new class") {
    WriteFile(t / "data/d/0.jpg", "x");
    auto s = open(t / "data");
    REQUIRE(s.ok());
    CHECK((*s)->size() == 14);
    CHECK((*s)->manifest().classes.size() == 4);
  }
  SECTION("a directory touched") {
    fs::last_write_time(t / "data/c", fs::file_time_type::clock::now());
    auto s = open(t / "data");
    REQUIRE(s.ok());
    CHECK((*s)->size() == 13);
  }
  SECTION("a file removed") {
    fs::remove(t / "data/c/3.jpg");
    auto s = open(t / "data");
    REQUIRE(s.ok());
    CHECK((*s)->size() == 12);
  }
  const auto after = cache.stats();
  CHECK(after.scans == 3);
  CHECK(after.stale == 1);
  srcs.clear();
  png = NotFound("dropped");
  CHECK(cache.live_entries() == 0);  // no index kept for finished jobs
}

TEST_CASE("SourceIndexCache: an image folder error is not cached") {
  TempDir t;
  SourceIndexCache cache;
  const std::vector<std::string> roots = {t.path};
  fs::create_directories(t / "data/a");
  auto empty = ImageFolderSource::Open(t / "data", {".jpg"}, roots, 1 << 20, &cache);
  CHECK(empty.status().code() == StatusCode::kNotFound);
  WriteFile(t / "data/a/0.jpg", "x");
  auto ok = ImageFolderSource::Open(t / "data", {".jpg"}, roots, 1 << 20, &cache);
  REQUIRE(ok.ok());
  CHECK((*ok)->size() == 1);
  CHECK(cache.stats().failed == 1);
  CHECK(cache.stats().scans == 2);
}

TEST_CASE("SourceIndexCache: file list opens share the parsed list until the list changes") {
  TempDir t;
  MakeFolder(t / "data");
  WriteFile(t / "data/list.csv", "path,label\na/0.jpg,0\nb/1.jpg,1\n");
  Backdate(t / "data/list.csv");
  SourceIndexCache cache;
  FileListOptions o;
  o.list = t / "data/list.csv";
  o.allowed_roots = {t / "data"};
  o.index_cache = &cache;
  auto a = FileListSource::Open(o);
  auto b = FileListSource::Open(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(&(*a)->sample(1) == &(*b)->sample(1));
  CHECK(cache.stats().scans == 1);
  CHECK(cache.stats().hits == 1);
  // Another root: another key (the relative paths mean other files).
  o.root = t / "data/b";
  auto other = FileListSource::Open(o);
  REQUIRE(other.ok());
  CHECK((*other)->root() == t / "data/b");
  CHECK(cache.stats().scans == 2);
  o.root.clear();

  // A bad line: an error, not cached; each open reports it.
  WriteFile(t / "data/list.csv", "path,label\na/0.jpg,zero\n");
  CHECK(FileListSource::Open(o).status().code() == StatusCode::kInvalidArgument);
  CHECK(FileListSource::Open(o).status().code() == StatusCode::kInvalidArgument);
  CHECK(cache.stats().failed == 2);
  WriteFile(t / "data/list.csv", "a/0.jpg\na/1.jpg\na/2.jpg\n");
  auto c = FileListSource::Open(o);
  REQUIRE(c.ok());
  CHECK((*c)->size() == 3);
  CHECK((*a)->size() == 2);
}

TEST_CASE("SourceIndexCache: tar shard opens share one header scan until a shard changes") {
  TempDir t;
  for (int i = 0; i < 3; ++i) {
    WriteFile(t / ("src/s" + std::to_string(i) + ".jpg"), "jpeg bytes");
    WriteFile(t / ("src/s" + std::to_string(i) + ".cls"), std::to_string(i));
  }
  fs::create_directories(t / "data");
  auto make_shard = [&](const std::string& name, const std::string& members) {
    const std::string cmd = "tar -cf " + t / ("data/" + name) + " -C " + t / "src" + " " + members;
    REQUIRE(std::system(cmd.c_str()) == 0);
  };
  make_shard("shard-0.tar", "s0.jpg s0.cls s1.jpg s1.cls");
  make_shard("shard-1.tar", "s2.jpg s2.cls");
  Backdate(t / "data");
  SourceIndexCache cache;
  TarShardOptions o;
  o.shards = {t / "data/shard-{0..1}.tar"};
  o.allowed_roots = {t / "data"};
  o.index_cache = &cache;
  auto a = TarShardSource::Open(o);
  o.shards = {t / "data/shard-0.tar", t / "data/./shard-1.tar"};  // the same shards, spelled otherwise
  auto b = TarShardSource::Open(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((*a)->size() == 3);
  CHECK(&(*a)->sample(2) == &(*b)->sample(2));
  CHECK(cache.stats().scans == 1);
  std::vector<uint8_t> bytes;
  REQUIRE((*b)->Read(2, &bytes).ok());
  CHECK(std::string(bytes.begin(), bytes.end()) == "jpeg bytes");
  CHECK((*b)->Describe().find(t / "data/./shard-1.tar") != std::string::npos);  // its own patterns

  // Sidecars indexed: another key.
  o.sidecar_extensions = {"cls"};
  auto side = TarShardSource::Open(o);
  REQUIRE(side.ok());
  CHECK(cache.stats().scans == 2);
  o.sidecar_extensions.clear();

  // A shard rewritten: rescanned.
  make_shard("shard-1.tar", "s2.jpg s2.cls s0.jpg");
  auto c = TarShardSource::Open(o);
  REQUIRE(c.ok());
  CHECK((*c)->size() == 4);
  CHECK(cache.stats().stale == 1);
  // A missing shard: the error of a full scan, not cached.
  o.shards.push_back(t / "data/shard-2.tar");
  CHECK(TarShardSource::Open(o).status().code() == StatusCode::kNotFound);
}

#if SPDL_IO_HAVE_CURL
TEST_CASE("SourceIndexCache: URL list opens share the checked list until the list changes") {
  TempDir t;
  WriteFile(t / "urls.txt", "http://127.0.0.1:9/data/a.jpg\nhttp://127.0.0.1:9/data/b.jpg,1\n");
  Backdate(t / "urls.txt");
  SourceIndexCache cache;
  HttpSourceOptions o;
  o.list = t / "urls.txt";
  o.allowed_roots = {t.path};
  o.allowed_url_prefixes = {"http://127.0.0.1:9/data"};
  o.index_cache = &cache;
  auto a = HttpSource::Open(o);
  auto b = HttpSource::Open(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(&(*a)->sample(1) == &(*b)->sample(1));
  CHECK(cache.stats().scans == 1);
  // Other prefixes: another key, and checked again (here: refused).
  o.allowed_url_prefixes = {"http://127.0.0.1:9/other"};
  CHECK(HttpSource::Open(o).status().code() == StatusCode::kInvalidArgument);
  o.allowed_url_prefixes = {"http://127.0.0.1:9/data"};
  WriteFile(t / "urls.txt", "http://127.0.0.1:9/data/c.jpg\n");
  auto c = HttpSource::Open(o);
  REQUIRE(c.ok());
  CHECK((*c)->size() == 1);
  CHECK((*a)->size() == 2);
  CHECK(cache.stats().scans == 3);
}
#endif

}  // namespace
}  // namespace spdl::io
