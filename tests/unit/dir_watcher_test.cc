// DirWatcher (io/dir_watcher.h) on real files in a temporary directory: what is reported, once,
// when; partial writes; the scan/watch race; new class folders; queue overflow; reads.
#include "io/dir_watcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "skip.h"
#include "temp_dir.h"

namespace spdl::io {
namespace {

namespace fs = std::filesystem;

using spdl::testing::TempDir;  // temp_dir.h

DirWatchOptions Jpegs(bool include = true) {
  DirWatchOptions o;
  o.extensions = {".jpg", "jpeg"};
  o.include_existing = include;
  return o;
}

std::unique_ptr<DirWatcher> OpenOk(const TempDir& dir, DirWatchOptions o = Jpegs()) {
  auto w = DirWatcher::Open(dir.path, {dir.path}, std::move(o), nullptr);
  INFO(w.status().ToString());
  REQUIRE(w.ok());
  return std::move(*w);
}

// Polls until nothing new came for `quiet_ms` (events are asynchronous but prompt).
std::vector<WatchedFile> Drain(DirWatcher& w, int quiet_ms = 150) {
  std::vector<WatchedFile> all;
  for (;;) {
    const size_t before = all.size();
    Status s = w.Poll(quiet_ms, &all);
    INFO(s.ToString());
    REQUIRE(s.ok());
    if (all.size() == before) return all;
  }
}

std::vector<std::string> Paths(const std::vector<WatchedFile>& files) {
  std::vector<std::string> p;
  p.reserve(files.size());
  for (const WatchedFile& f : files) p.push_back(f.path);
  return p;
}

TEST_CASE("watch: existing files in image_folder order, then new files written or renamed into place once") {
  TempDir dir;
  dir.Write("b/2.jpg", "data");
  dir.Write("b/1.JPEG", "data");
  dir.Write("a/x.jpg", "data");
  dir.Write("a/sub/y.jpg", "data");
  dir.Write("a/notes.txt", "data");
  dir.Write("a/.hidden.jpg", "data");
  dir.Write("top.jpg", "data");  // directly in the root: not a sample
  auto w = OpenOk(dir);
  std::vector<WatchedFile> got = Drain(*w);
  CHECK(Paths(got) == std::vector<std::string>{"a/sub/y.jpg", "a/x.jpg", "b/1.JPEG", "b/2.jpg"});
  CHECK(w->classes() == std::vector<std::string>{"a", "b"});
  REQUIRE(got.size() == 4);
  CHECK(got[0].label == 0);
  CHECK(got[3].label == 1);

  dir.Write("b/3.jpg", "three");
  dir.Write(".staging/ignored", "");
  { std::ofstream(dir / "b/.4.jpg.tmp", std::ios::binary) << "four"; }
  fs::rename(dir / "b/.4.jpg.tmp", dir / "b/4.jpg");
  dir.Write("a/sub/deeper/z.jpeg", "data");
  got = Drain(*w);
  std::multiset<std::string> paths;
  for (const WatchedFile& f : got) paths.insert(f.path);
  CHECK(paths == std::multiset<std::string>{"a/sub/deeper/z.jpeg", "b/3.jpg", "b/4.jpg"});
  for (const WatchedFile& f : got) {
    if (f.path == "b/3.jpg") {
      CHECK(f.size == 5);
      std::vector<uint8_t> bytes;
      REQUIRE(w->Read(f, &bytes).ok());
      CHECK(std::string(bytes.begin(), bytes.end()) == "three");
    }
  }
  CHECK(Drain(*w).empty());
  CHECK(w->stats().files_reported == 7);
  CHECK(w->stats().pending == 0);
}

TEST_CASE("watch: existing skip leaves out the files complete at the start") {
  TempDir dir;
  dir.Write("a/old.jpg", "data");
  auto w = OpenOk(dir, Jpegs(/*include=*/false));
  CHECK(Drain(*w).empty());
  dir.Write("a/new.jpg", "data");
  CHECK(Paths(Drain(*w)) == std::vector<std::string>{"a/new.jpg"});
}

TEST_CASE("watch: a partial write is never reported, the completed file once") {
  TempDir dir;
  dir.Write("a/keep.jpg", "data");
  // Open for writing before the watcher starts: found by the listing, not complete.
  const int early = ::open((dir / "a/early.jpg").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(early >= 0);
  REQUIRE(::write(early, "half", 4) == 4);
  auto w = OpenOk(dir);
  CHECK(Paths(Drain(*w)) == std::vector<std::string>{"a/keep.jpg"});
  CHECK(w->stats().pending == 1);

  const int fd = ::open((dir / "a/slow.jpg").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, "first half ", 11) == 11);
  CHECK(Drain(*w).empty());
  // A second writer closing while the first still writes: still not complete.
  const int other = ::open((dir / "a/slow.jpg").c_str(), O_WRONLY);
  REQUIRE(other >= 0);
  ::close(other);
  CHECK(Drain(*w).empty());
  CHECK(w->stats().pending == 2);
  REQUIRE(::write(fd, "second half", 11) == 11);
  ::close(fd);
  std::vector<WatchedFile> got = Drain(*w);
  REQUIRE(Paths(got) == std::vector<std::string>{"a/slow.jpg"});
  CHECK(got[0].size == 22);

  REQUIRE(::write(early, "+rest", 5) == 5);
  ::close(early);
  got = Drain(*w);
  REQUIRE(Paths(got) == std::vector<std::string>{"a/early.jpg"});
  CHECK(got[0].size == 9);

  // Renamed into place while still open for writing: reported at its close, under its new name.
  const int moving = ::open((dir / "a/.moving").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(moving >= 0);
  REQUIRE(::write(moving, "abc", 3) == 3);
  fs::rename(dir / "a/.moving", dir / "a/moved.jpg");
  CHECK(Drain(*w).empty());
  REQUIRE(::write(moving, "def", 3) == 3);
  ::close(moving);
  got = Drain(*w);
  REQUIRE(Paths(got) == std::vector<std::string>{"a/moved.jpg"});
  CHECK(got[0].size == 6);
  CHECK(w->stats().pending == 0);
}

TEST_CASE("watch: files written during the start are reported exactly once") {
  TempDir dir;
  dir.Write("a/seed.jpg", "data");
  constexpr int kFiles = 400;
  std::atomic<bool> go{false};
  std::thread writer([&] {
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < kFiles; ++i) {
      const std::string cls = i % 2 ? "a" : "b";  // b is made during the run
      dir.Write(cls + "/f" + std::to_string(i) + ".jpg", "payload");
    }
  });
  go = true;
  auto w = OpenOk(dir);
  std::vector<WatchedFile> got;
  while (got.size() < kFiles + 1) {
    const size_t before = got.size();
    REQUIRE(w->Poll(2000, &got).ok());
    if (got.size() == before) break;
  }
  writer.join();
  for (WatchedFile& f : Drain(*w)) got.push_back(std::move(f));
  std::map<std::string, int> count;
  for (const WatchedFile& f : got) ++count[f.path];
  CHECK(count.size() == kFiles + 1);
  int dup = 0;
  for (const auto& [p, n] : count) dup += n > 1;
  CHECK(dup == 0);
  for (const WatchedFile& f : got) CHECK(f.size == (f.path == "a/seed.jpg" ? 4u : 7u));
}

TEST_CASE("watch: class folders made later take the next labels, files in them are found") {
  TempDir dir;
  dir.Write("m/1.jpg", "data");
  auto w = OpenOk(dir, Jpegs(false));
  fs::create_directories(dir / "z/inner");
  dir.Write("z/inner/q.jpg", "data");
  dir.Write("c/1.jpg", "data");
  std::vector<WatchedFile> got = Drain(*w);
  std::map<std::string, int64_t> label;
  for (const WatchedFile& f : got) label[f.path] = f.label;
  CHECK(label == std::map<std::string, int64_t>{{"z/inner/q.jpg", 1}, {"c/1.jpg", 2}});
  CHECK(w->classes() == std::vector<std::string>{"m", "z", "c"});
  // Deleted and made again: the same label.
  fs::remove_all(dir / "z");
  CHECK(Drain(*w).empty());
  dir.Write("z/again.jpg", "data");
  got = Drain(*w);
  REQUIRE(got.size() == 1);
  CHECK(got[0].label == 1);
}

TEST_CASE("watch: fixed classes give fixed labels and leave other folders out") {
  TempDir dir;
  dir.Write("dog/1.jpg", "data");
  dir.Write("cat/1.jpg", "data");
  dir.Write("bird/1.jpg", "data");
  DirWatchOptions o = Jpegs();
  o.classes = {"dog", "cat"};
  auto w = OpenOk(dir, o);
  std::vector<WatchedFile> got = Drain(*w);
  REQUIRE(Paths(got) == std::vector<std::string>{"dog/1.jpg", "cat/1.jpg"});
  CHECK(got[0].label == 0);
  CHECK(got[1].label == 1);
  CHECK(w->stats().ignored_folders == 1);
  o.classes = {"dog", "dog"};
  CHECK(DirWatcher::Open(dir.path, {dir.path}, o, nullptr).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("watch: once per name and inode - rewrites in place are not new, replacements are") {
  TempDir dir;
  dir.Write("a/x.jpg", "v1");
  auto w = OpenOk(dir);
  std::vector<WatchedFile> first = Drain(*w);
  REQUIRE(first.size() == 1);
  dir.Write("a/x.jpg", "v2 in place");  // same inode
  CHECK(Drain(*w).empty());
  dir.Write("a/.tmp", "v3 renamed over");
  fs::rename(dir / "a/.tmp", dir / "a/x.jpg");
  std::vector<WatchedFile> got = Drain(*w);
  REQUIRE(Paths(got) == std::vector<std::string>{"a/x.jpg"});
  std::vector<uint8_t> bytes;
  CHECK(w->Read(first[0], &bytes).code() == StatusCode::kNotFound);  // replaced
  REQUIRE(w->Read(got[0], &bytes).ok());
  CHECK(std::string(bytes.begin(), bytes.end()) == "v3 renamed over");
  fs::remove(dir / "a/x.jpg");
  dir.Write("a/x.jpg", "v4");
  CHECK(Paths(Drain(*w)) == std::vector<std::string>{"a/x.jpg"});
  // A link is not followed.
  fs::create_symlink(dir / "a/x.jpg", dir / "a/link.jpg");
  CHECK(Drain(*w).empty());
}

TEST_CASE("watch: a queue overflow is followed by a rescan that reports each file once") {
  int max_queued = 16384;
  if (std::ifstream f("/proc/sys/fs/inotify/max_queued_events"); f) f >> max_queued;
  if (max_queued > 1'000'000) {
    SPDL_SKIP("fs.inotify.max_queued_events is " + std::to_string(max_queued) + ": too many events to overflow it");
  }
  TempDir dir;
  dir.Write("a/before.jpg", "data");
  dir.Write("a/other.jpg", "data");
  auto w = OpenOk(dir);
  REQUIRE(Drain(*w).size() == 2);
  // Fill the queue without reading it: closes after writing, alternating between two reported files
  // (the kernel merges only identical consecutive events; these report nothing new).
  const std::string names[2] = {dir / "a/before.jpg", dir / "a/other.jpg"};
  int failed_opens = 0;
  for (int i = 0; i < max_queued + 100; ++i) {
    const int fd = ::open(names[i % 2].c_str(), O_WRONLY);
    failed_opens += fd < 0;
    if (fd >= 0) ::close(fd);
  }
  REQUIRE(failed_opens == 0);
  // Made while the queue is full: their events are lost, only the rescan finds them.
  constexpr int kFiles = 200;
  for (int i = 0; i < kFiles; ++i) dir.Write("a/n" + std::to_string(i) + ".jpg", "z");
  dir.Write("new_class/m.jpg", "z");
  std::vector<WatchedFile> got = Drain(*w, 300);
  CHECK(w->stats().overflows >= 1);
  std::set<std::string> unique;
  for (const WatchedFile& f : got) unique.insert(f.path);
  CHECK(unique.size() == got.size());
  CHECK(got.size() == static_cast<size_t>(kFiles + 1));
  CHECK(unique.count("new_class/m.jpg") == 1);
  CHECK(unique.count("a/before.jpg") == 0);
  // The watches go on after it.
  dir.Write("new_class/later.jpg", "data");
  CHECK(Paths(Drain(*w)) == std::vector<std::string>{"new_class/later.jpg"});
  CHECK(unique.count("a/before.jpg") == 0);
}

TEST_CASE("watch: refusals and a deleted root") {
  TempDir dir;
  TempDir other;
  fs::create_directories(dir / "a");
  CHECK(DirWatcher::Open(dir.path, {other.path}, Jpegs(), nullptr).status().code() == StatusCode::kPermissionDenied);
  DirWatchOptions none;
  CHECK(DirWatcher::Open(dir.path, {dir.path}, none, nullptr).status().code() == StatusCode::kInvalidArgument);
  dir.Write("file.jpg", "data");
  CHECK(DirWatcher::Open(dir / "file.jpg", {dir.path}, Jpegs(), nullptr).status().code() ==
        StatusCode::kInvalidArgument);
  auto w = OpenOk(dir);
  // Wake from another thread ends a Poll that would wait for ever.
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    w->Wake();
  });
  std::vector<WatchedFile> got;
  CHECK(w->Poll(-1, &got).ok());
  waker.join();
  CHECK(got.empty());
  fs::remove_all(dir.path);
  Status s;
  for (int i = 0; i < 20 && s.ok(); ++i) s = w->Poll(100, &got);
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(w->Poll(0, &got).code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace spdl::io
