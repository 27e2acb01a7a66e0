// Tests of io::ShardCache (io/shard_cache.h) without a network: the fetches are local functions
// that count their calls and can be held back, so the tests see followers, pinning, LRU eviction,
// the checks on reuse, restarts and a disabled directory exactly.
#include "io/shard_cache.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.h"

namespace spdl::io {
namespace {

namespace fs = std::filesystem;

using spdl::testing::TempDir;  // temp_dir.h

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

// A fetch of `bytes` in chunks of 10 that counts its calls.
ShardCache::Fetch Counted(std::vector<uint8_t> bytes, std::shared_ptr<std::atomic<int>> calls) {
  return [bytes = std::move(bytes), calls = std::move(calls)](const ShardCache::Sink& sink) -> Status {
    calls->fetch_add(1);
    for (size_t i = 0; i < bytes.size(); i += 10) {
      if (!sink(bytes.data() + i, std::min<size_t>(10, bytes.size() - i))) return Cancelled("refused");
    }
    return Status::Ok();
  };
}

std::vector<uint8_t> ReadAll(const ShardCache::Handle& h) {
  auto size = h.WaitComplete();
  REQUIRE(size.ok());
  std::vector<uint8_t> out;
  REQUIRE(h.Read(0, *size, &out).ok());
  return out;
}

TEST_CASE("shard cache: a second reader follows the first download (one fetch)", "[shard_cache]") {
  auto cache = ShardCache::InMemory(1 << 20);
  // A fetch held back after its first 100 bytes until the test opens the gate.
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  auto calls = std::make_shared<std::atomic<int>>(0);
  const std::vector<uint8_t> bytes = Bytes(300, 1);
  ShardCache::Fetch gated = [&, calls](const ShardCache::Sink& sink) -> Status {
    calls->fetch_add(1);
    if (!sink(bytes.data(), 100)) return Cancelled("refused");
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return open; });
    }
    if (!sink(bytes.data() + 100, 200)) return Cancelled("refused");
    return Status::Ok();
  };
  auto first = cache->Acquire("k", gated);
  REQUIRE(first.ok());
  CHECK_FALSE((*first)->hit());
  auto second = cache->Acquire("k", gated);
  REQUIRE(second.ok());
  CHECK((*second)->hit());
  // The first 100 bytes are readable while the rest is held back.
  std::vector<uint8_t> head;
  REQUIRE((*second)->Read(0, 100, &head).ok());
  CHECK(head == std::vector<uint8_t>(bytes.begin(), bytes.begin() + 100));
  std::vector<uint8_t> tail;
  std::thread reader([&] { REQUIRE((*second)->Read(200, 100, &tail).ok()); });
  {
    std::lock_guard lock(mu);
    open = true;
  }
  cv.notify_all();
  reader.join();
  CHECK(tail == std::vector<uint8_t>(bytes.begin() + 200, bytes.end()));
  CHECK(ReadAll(**first) == bytes);
  CHECK(calls->load() == 1);
  const ShardCache::Counters c = cache->counters();
  CHECK(c.misses == 1);
  CHECK(c.hits == 1);
  CHECK(c.fetched_bytes == 300);
  // A read past the end of a complete object is an error, not a hang.
  std::vector<uint8_t> past;
  CHECK((*first)->Read(250, 100, &past).code() == StatusCode::kDataLoss);
}

TEST_CASE("shard cache: LRU eviction within the budget, never a pinned entry", "[shard_cache]") {
  auto cache = ShardCache::InMemory(250);
  auto calls = std::make_shared<std::atomic<int>>(0);
  {
    auto a = cache->Acquire("a", Counted(Bytes(100, 1), calls));
    REQUIRE(a.ok());
    ReadAll(**a);
  }
  {
    auto b = cache->Acquire("b", Counted(Bytes(100, 2), calls));
    REQUIRE(b.ok());
    ReadAll(**b);
  }
  {
    auto a = cache->Acquire("a", Counted(Bytes(100, 1), calls));  // a is now the most recent
    REQUIRE(a.ok());
    CHECK((*a)->hit());
  }
  {
    auto c = cache->Acquire("c", Counted(Bytes(100, 3), calls));
    REQUIRE(c.ok());
    ReadAll(**c);
  }
  ShardCache::Counters n = cache->counters();
  CHECK(n.bytes <= 250);
  CHECK(n.evictions == 1);
  CHECK(calls->load() == 3);
  {
    auto a = cache->Acquire("a", Counted(Bytes(100, 1), calls));
    CHECK((*a)->hit());  // b, the least recently used, went
  }
  {
    auto b = cache->Acquire("b", Counted(Bytes(100, 2), calls));
    CHECK_FALSE((*b)->hit());
    CHECK(ReadAll(**b) == Bytes(100, 2));
  }
  CHECK(calls->load() == 4);

  // Pinned entries stay even over the budget; released, they are trimmed to it.
  auto small = ShardCache::InMemory(150);
  std::vector<std::shared_ptr<const ShardCache::Handle>> held;
  for (int i = 0; i < 3; ++i) {
    auto h = small->Acquire("p" + std::to_string(i), Counted(Bytes(100, static_cast<uint8_t>(i)), calls));
    REQUIRE(h.ok());
    CHECK(ReadAll(**h) == Bytes(100, static_cast<uint8_t>(i)));
    held.push_back(*h);
  }
  CHECK(small->counters().bytes == 300);
  CHECK(small->counters().entries == 3);
  for (int i = 0; i < 3; ++i) CHECK(ReadAll(*held[static_cast<size_t>(i)]) == Bytes(100, static_cast<uint8_t>(i)));
  held.clear();
  CHECK(small->counters().bytes <= 150);
}

TEST_CASE("shard cache: a failed fetch is reported to every reader and not kept", "[shard_cache]") {
  auto cache = ShardCache::InMemory(1 << 20);
  auto failing = [](const ShardCache::Sink& sink) -> Status {
    const uint8_t b[5] = {1, 2, 3, 4, 5};
    sink(b, 5);
    return Unavailable("GET s3://b/k: HTTP 503");
  };
  auto h = cache->Acquire("k", failing);
  REQUIRE(h.ok());
  std::vector<uint8_t> out;
  const Status s = (*h)->Read(0, 10, &out);
  CHECK(s.code() == StatusCode::kUnavailable);
  CHECK(s.message().find("503") != std::string::npos);
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto again = cache->Acquire("k", Counted(Bytes(10, 9), calls));
  REQUIRE(again.ok());
  CHECK_FALSE((*again)->hit());
  CHECK(ReadAll(**again) == Bytes(10, 9));
}

TEST_CASE("shard cache on disk: mode 0700, survives a restart, checks files on reuse", "[shard_cache]") {
  TempDir tmp;
  const std::string dir = tmp.path + "/cache";
  auto calls = std::make_shared<std::atomic<int>>(0);
  const std::vector<uint8_t> bytes = Bytes(5000, 4);
  {
    auto cache = ShardCache::OnDisk(dir, 1 << 20);
    REQUIRE(cache->enabled());
    struct stat st {};
    REQUIRE(::stat(dir.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0700);
    auto h = cache->Acquire("endpoint b k etag", Counted(bytes, calls));
    REQUIRE(h.ok());
    CHECK(ReadAll(**h) == bytes);
  }
  const std::string file = dir + "/" + ShardCache::FileName("endpoint b k etag") + ".tar";
  REQUIRE(fs::exists(file));
  CHECK(fs::file_size(file) == bytes.size());
  // A partial download left by a crash is deleted at the next start.
  { std::ofstream(dir + "/0123.part") << "partial"; }
  {
    auto cache = ShardCache::OnDisk(dir, 1 << 20);
    CHECK_FALSE(fs::exists(dir + "/0123.part"));
    CHECK(cache->counters().bytes == bytes.size());
    auto h = cache->Acquire("endpoint b k etag", Counted(bytes, calls));
    REQUIRE(h.ok());
    CHECK((*h)->hit());
    CHECK(ReadAll(**h) == bytes);
    CHECK(calls->load() == 1);
    h = Result<std::shared_ptr<const ShardCache::Handle>>(nullptr);
    // Damaged in place while the daemon runs: detected at the next acquire, fetched again.
    {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(1234);
      f.put(static_cast<char>(bytes[1234] ^ 0xff));
    }
    auto again = cache->Acquire("endpoint b k etag", Counted(bytes, calls));
    REQUIRE(again.ok());
    CHECK_FALSE((*again)->hit());
    CHECK(ReadAll(**again) == bytes);
    CHECK(calls->load() == 2);
    CHECK(cache->counters().corrupt == 1);
  }
  // Damaged while the daemon is down (same size, same mtime): the first use after the restart hashes it.
  {
    struct stat before {};
    REQUIRE(::stat(file.c_str(), &before) == 0);
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(10);
    f.put(static_cast<char>(bytes[10] ^ 0x01));
  }
  {
    auto cache = ShardCache::OnDisk(dir, 1 << 20);
    auto h = cache->Acquire("endpoint b k etag", Counted(bytes, calls));
    REQUIRE(h.ok());
    CHECK_FALSE((*h)->hit());
    CHECK(ReadAll(**h) == bytes);
    CHECK(calls->load() == 3);
    CHECK(cache->counters().corrupt == 1);
  }
  // A restart with a smaller budget trims what was kept.
  {
    auto cache = ShardCache::OnDisk(dir, 100);
    CHECK(cache->counters().bytes == 0);
    CHECK_FALSE(fs::exists(file));
  }
}

TEST_CASE("shard cache on disk: an unusable directory disables it", "[shard_cache]") {
  TempDir tmp;
  { std::ofstream(tmp.path + "/file") << "x"; }
  auto not_dir = ShardCache::OnDisk(tmp.path + "/file", 1 << 20);
  CHECK_FALSE(not_dir->enabled());
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto h = not_dir->Acquire("k", Counted(Bytes(10, 1), calls));
  CHECK(h.status().code() == StatusCode::kFailedPrecondition);
  CHECK(calls->load() == 0);
  auto relative = ShardCache::OnDisk("relative/dir", 1 << 20);
  CHECK_FALSE(relative->enabled());
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string ro = tmp.path + "/ro";
    fs::create_directory(ro);
    fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    auto unwritable = ShardCache::OnDisk(ro + "/cache", 1 << 20);
    CHECK_FALSE(unwritable->enabled());
    fs::permissions(ro, fs::perms::owner_all);
  }
}

TEST_CASE("shard cache on disk: a write that fails mid-download (a full disk) disables it", "[shard_cache]") {
  TempDir tmp;
  auto cache = ShardCache::OnDisk(tmp.path + "/cache", 1 << 20);
  REQUIRE(cache->enabled());
  // The file size limit stands in for a full disk: writes past 2000 bytes fail (EFBIG, SIGXFSZ ignored).
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 2000;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto h = cache->Acquire("k", Counted(Bytes(5000, 3), calls));
  REQUIRE(h.ok());
  const auto done = (*h)->WaitComplete();
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  CHECK(done.status().code() == StatusCode::kUnavailable);
  CHECK(done.status().message().find(tmp.path) != std::string::npos);
  CHECK_FALSE(cache->enabled());
  CHECK(cache->Acquire("k2", Counted(Bytes(10, 1), calls)).status().code() == StatusCode::kFailedPrecondition);
  CHECK_FALSE(fs::exists(tmp.path + "/cache/" + ShardCache::FileName("k") + ".part"));  // no partial file left
  // The private in-memory stream still serves the object.
  auto mem = ShardCache::InMemory(1 << 20);
  auto m = mem->Acquire("k", Counted(Bytes(5000, 3), calls));
  REQUIRE(m.ok());
  CHECK(ReadAll(**m) == Bytes(5000, 3));
}

}  // namespace
}  // namespace spdl::io
