#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "proto/shm_layout.h"
#include "shm/shared_region.h"
#include "shm/slot_ring.h"
#include "skip.h"

namespace spdl::shm {
namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

std::set<std::string> ListDir(const char* dir) {
  std::set<std::string> names;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d)) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

std::string FdTarget(int fd) {
  char buf[512] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

long MinorFaultsOfThisThread() {
  rusage ru{};
  ::getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

// ---------------------------------------------------------------- SharedRegion

TEST_CASE("SharedRegion: create, map a dup'd fd, see the same bytes") {
  const auto layout = proto::ComputeSlotLayout({224 * 224 * 3 * 4, 4 * 8}, 3);
  auto created = SharedRegion::Create("roundtrip", layout.region_bytes);
  REQUIRE(created.ok());
  SharedRegion& a = *created;
  REQUIRE(a.data() != nullptr);
  CHECK(a.size() == layout.region_bytes);
  CHECK(FdTarget(a.fd()).find("memfd:spdl:roundtrip") != std::string::npos);

  auto* header = reinterpret_cast<proto::RegionHeader*>(a.data());
  header->magic = proto::kRegionMagic;
  header->num_slots = layout.num_slots;
  uint8_t* slot2 = a.data() + layout.SlotOffset(2) + layout.tensor_offsets[1];
  std::memset(slot2, 0xAB, 32);

  auto mapped = SharedRegion::Map(UniqueFd(::dup(a.fd())), layout.region_bytes);
  REQUIRE(mapped.ok());
  SharedRegion& b = *mapped;
  CHECK(b.data() != a.data());
  const auto* h2 = reinterpret_cast<const proto::RegionHeader*>(b.data());
  CHECK(h2->magic == proto::kRegionMagic);
  CHECK(h2->num_slots == 3);
  CHECK(b.data()[layout.SlotOffset(2) + layout.tensor_offsets[1] + 31] == 0xAB);

  // And back the other way.
  b.data()[layout.region_bytes - 1] = 7;
  CHECK(a.data()[layout.region_bytes - 1] == 7);

  // Moving keeps the mapping; the moved-from handle is empty.
  SharedRegion moved = std::move(b);
  CHECK(moved.data()[layout.region_bytes - 1] == 7);
  CHECK(b.data() == nullptr);  // NOLINT(bugprone-use-after-move)
  CHECK(b.fd() == -1);
}

TEST_CASE("SharedRegion: Map checks the size") {
  auto created = SharedRegion::Create("small", 8192);
  REQUIRE(created.ok());
  auto too_big = SharedRegion::Map(UniqueFd(::dup(created->fd())), 8193);
  REQUIRE_FALSE(too_big.ok());
  CHECK(too_big.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(too_big.status().message(), Catch::Contains("8192") && Catch::Contains("8193"));

  auto prefix = SharedRegion::Map(UniqueFd(::dup(created->fd())), 4096);
  CHECK(prefix.ok());
  CHECK(SharedRegion::Map(UniqueFd(), 4096).status().code() == StatusCode::kInvalidArgument);
  CHECK(SharedRegion::Create("zero", 0).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("SharedRegion: seals refuse shrink, grow and new seals") {
  auto created = SharedRegion::Create("sealed", 3 * 4096);
  REQUIRE(created.ok());
  const int fd = created->fd();
  const int seals = ::fcntl(fd, F_GET_SEALS);
  CHECK((seals & F_SEAL_SHRINK) != 0);
  CHECK((seals & F_SEAL_GROW) != 0);
  CHECK((seals & F_SEAL_SEAL) != 0);
  CHECK((seals & F_SEAL_WRITE) == 0);  // the daemon writes batches

  errno = 0;
  CHECK(::ftruncate(fd, 4096) == -1);
  CHECK(errno == EPERM);
  errno = 0;
  CHECK(::ftruncate(fd, 0) == -1);
  CHECK(errno == EPERM);
  errno = 0;
  CHECK(::ftruncate(fd, 16 * 4096) == -1);
  CHECK(errno == EPERM);
  errno = 0;
  CHECK(::fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == -1);
  CHECK(errno == EPERM);
  // A client's dup of the descriptor is bound by the same seals.
  UniqueFd dup(::dup(fd));
  errno = 0;
  CHECK(::ftruncate(dup.get(), 0) == -1);
  CHECK(errno == EPERM);
  created->data()[3 * 4096 - 1] = 1;  // still mapped and writable
}

TEST_CASE("SharedRegion: nothing appears in /dev/shm, even while it is alive") {
  const std::string label = "devshm-probe-" + std::to_string(::getpid());
  const auto before = ListDir("/dev/shm");
  {
    auto r = SharedRegion::Create(label, 1 << 20);
    REQUIRE(r.ok());
    for (const std::string& name : ListDir("/dev/shm")) {
      if (before.count(name) == 0) CHECK(name.find(label) == std::string::npos);
      CHECK(name.find("spdl") == std::string::npos);
    }
    // The descriptor points at an unlinked memfd.
    CHECK_THAT(FdTarget(r->fd()), Catch::StartsWith("/memfd:spdl:" + label) && Catch::EndsWith("(deleted)"));
  }
  for (const std::string& name : ListDir("/dev/shm")) CHECK(name.find(label) == std::string::npos);
}

TEST_CASE("SharedRegion: the pages are pre-faulted") {
  if (kSanitized) {
    SPDL_SKIP("a sanitizer's shadow memory page-faults on every new page it watches");
  }
  constexpr size_t kBytes = 16 << 20;  // 4096 pages
  auto r = SharedRegion::Create("prefault", kBytes);
  REQUIRE(r.ok());
  const long before = MinorFaultsOfThisThread();
  for (size_t off = 0; off < kBytes; off += 4096) r->data()[off] = 1;
  const long faults = MinorFaultsOfThisThread() - before;
  INFO("minor faults while writing 4096 fresh pages: " << faults);
  CHECK(faults < 64);
}

TEST_CASE("SharedRegion: only the reserved part holds memory until Reserve") {
  constexpr size_t kBytes = 8 << 20;
  auto r = SharedRegion::Create("partial", kBytes, 1 << 20);
  REQUIRE(r.ok());
  auto allocated = [&] {
    struct stat st {};
    REQUIRE(::fstat(r->fd(), &st) == 0);
    return static_cast<size_t>(st.st_blocks) * 512;
  };
  INFO("allocated after Create: " << allocated());
  CHECK(allocated() >= (1u << 20));
  CHECK(allocated() < (2u << 20));
  REQUIRE(r->Reserve(4 << 20, 2 << 20).ok());
  CHECK(allocated() >= (3u << 20));
  CHECK(allocated() < (4u << 20));
  REQUIRE(r->Reserve(7 << 20, 100 << 20).ok());  // clamped to the region
  CHECK(allocated() >= (4u << 20));
  CHECK(r->Reserve(kBytes, 10).ok());  // past the end: nothing to do
  r->data()[(4 << 20) + 5] = 7;        // a reserved page is writable
  CHECK(r->data()[(4 << 20) + 5] == 7);
}

TEST_CASE("SharedRegion: Discard gives whole pages back, reads them as zero, and leaves partial pages alone") {
  constexpr size_t kBytes = 1 << 20;
  auto r = SharedRegion::Create("discard", kBytes);
  REQUIRE(r.ok());
  auto allocated = [&] {
    struct stat st {};
    REQUIRE(::fstat(r->fd(), &st) == 0);
    return static_cast<size_t>(st.st_blocks) * 512;
  };
  std::memset(r->data(), 0xab, kBytes);
  const size_t before = allocated();
  CHECK(before >= kBytes);
  // 3 pages + a bit, starting 100 bytes into a page: pages 1..3 go, pages 0 and 4 keep their bytes.
  REQUIRE(r->Discard(4096 + 100, 4 * 4096).ok());
  INFO("allocated before " << before << ", after " << allocated());
  CHECK(allocated() == before - 3 * 4096);
  CHECK(r->data()[4096 + 99] == 0xab);  // the partial page in front is untouched
  CHECK(r->data()[4096 + 100] == 0xab);
  for (size_t off = 2 * 4096; off < 5 * 4096; off += 512) CHECK(r->data()[off] == 0);
  CHECK(r->data()[5 * 4096 + 100] == 0xab);  // the partial page behind too
  CHECK(r->data()[5 * 4096 + 99] == 0xab);
  // A client's mapping sees the same: the pages are gone for every process.
  auto client = SharedRegion::Map(UniqueFd(::dup(r->fd())), kBytes);
  REQUIRE(client.ok());
  CHECK(client->data()[3 * 4096] == 0);
  // Written again, a page comes back (the kernel may bring back more than the one page).
  r->data()[3 * 4096] = 5;
  CHECK(client->data()[3 * 4096] == 5);
  const size_t rewritten = allocated();
  CHECK(rewritten > before - 3 * 4096);
  CHECK(rewritten <= before);
  CHECK(r->Discard(kBytes, 10).ok());  // past the end: nothing to do
  CHECK(r->Discard(10, 100).ok());     // inside one page: nothing to do
  CHECK(allocated() == rewritten);
}

// ---------------------------------------------------------------- SlotRing

void CheckCounts(const SlotRing& ring, uint32_t free, uint32_t filling, uint32_t ready, uint32_t leased) {
  const auto c = ring.counts();
  CHECK(c.free == free);
  CHECK(c.filling == filling);
  CHECK(c.ready == ready);
  CHECK(c.leased == leased);
}

TEST_CASE("SlotRing: one slot through its whole life") {
  SlotRing ring(2);
  CHECK(ring.num_slots() == 2);
  CheckCounts(ring, 2, 0, 0, 0);
  CHECK_FALSE(ring.TakeNextReady().has_value());

  auto a = ring.TryAcquire();
  REQUIRE(a.has_value());
  CHECK(a->seq == 0);
  CHECK(ring.state(a->slot) == SlotState::kFilling);
  CheckCounts(ring, 1, 1, 0, 0);
  CHECK_FALSE(ring.TakeNextReady().has_value());  // not ready yet

  REQUIRE(ring.MarkReady(a->slot).ok());
  CHECK(ring.MarkReady(a->slot).code() == StatusCode::kFailedPrecondition);
  CheckCounts(ring, 1, 0, 1, 0);

  auto lease = ring.TakeNextReady();
  REQUIRE(lease.has_value());
  CHECK(lease->slot == a->slot);
  CHECK(lease->seq == 0);
  CHECK(ring.state(a->slot) == SlotState::kLeased);
  CheckCounts(ring, 1, 0, 0, 1);
  CHECK_FALSE(ring.TakeNextReady().has_value());

  REQUIRE(ring.Release(lease->slot, lease->generation).ok());
  CheckCounts(ring, 2, 0, 0, 0);

  // Sequence numbers keep counting; each lease has a new generation.
  auto b = ring.TryAcquire();
  REQUIRE(b.has_value());
  CHECK(b->seq == 1);
  REQUIRE(ring.MarkReady(b->slot).ok());
  auto lease2 = ring.TakeNextReady();
  REQUIRE(lease2.has_value());
  CHECK(lease2->seq == 1);
  CHECK(lease2->generation != lease->generation);
  CHECK(ring.Release(lease2->slot, lease2->generation).ok());
}

TEST_CASE("SlotRing: no free slot is backpressure") {
  SlotRing ring(3);
  std::vector<SlotRing::Acquired> got;
  for (int i = 0; i < 3; ++i) {
    auto a = ring.TryAcquire();
    REQUIRE(a.has_value());
    got.push_back(*a);
  }
  CHECK_FALSE(ring.TryAcquire().has_value());
  CHECK_FALSE(ring.WaitForFree(std::chrono::milliseconds(5)));
  CheckCounts(ring, 0, 3, 0, 0);

  // A slot freed on another thread wakes a blocked producer.
  Status abandoned;  // Catch2 assertions belong on the test's own thread
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    abandoned = ring.Abandon(got[1].slot);
  });
  CHECK(ring.WaitForFree(std::chrono::seconds(5)));
  t.join();
  REQUIRE(abandoned.ok());
  auto again = ring.TryAcquire();
  REQUIRE(again.has_value());
  CHECK(again->slot == got[1].slot);
  CHECK(again->seq == 3);
}

TEST_CASE("SlotRing: Close wakes waiters and ends WaitForFree") {
  SlotRing ring(1);
  REQUIRE(ring.TryAcquire().has_value());
  std::atomic<bool> result{true};
  std::thread t([&] { result = ring.WaitForFree(std::chrono::seconds(10)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto start = std::chrono::steady_clock::now();
  ring.Close();
  t.join();
  CHECK_FALSE(result.load());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  REQUIRE(ring.Abandon(0).ok());
  CHECK_FALSE(ring.WaitForFree(std::chrono::milliseconds(0)));  // closed, even with a free slot
}

TEST_CASE("SlotRing: delivery is in sequence order when slots finish out of order") {
  SlotRing ring(4);
  std::vector<SlotRing::Acquired> a;
  for (int i = 0; i < 4; ++i) a.push_back(*ring.TryAcquire());
  for (int i = 0; i < 4; ++i) CHECK(a[i].seq == static_cast<uint64_t>(i));

  REQUIRE(ring.MarkReady(a[2].slot).ok());
  REQUIRE(ring.MarkReady(a[1].slot).ok());
  CHECK_FALSE(ring.TakeNextReady().has_value());  // seq 0 still filling
  REQUIRE(ring.MarkReady(a[3].slot).ok());
  CHECK_FALSE(ring.TakeNextReady().has_value());
  REQUIRE(ring.MarkReady(a[0].slot).ok());

  for (uint64_t want = 0; want < 4; ++want) {
    auto l = ring.TakeNextReady();
    REQUIRE(l.has_value());
    CHECK(l->seq == want);
    CHECK(l->slot == a[want].slot);
  }
  CHECK_FALSE(ring.TakeNextReady().has_value());
  CheckCounts(ring, 0, 0, 0, 4);
}

TEST_CASE("SlotRing: an abandoned batch is skipped, not waited for") {
  SlotRing ring(4);
  std::vector<SlotRing::Acquired> a;
  for (int i = 0; i < 4; ++i) a.push_back(*ring.TryAcquire());

  CHECK(ring.Abandon(a[3].slot).ok());  // the last one: nothing to skip yet
  REQUIRE(ring.MarkReady(a[1].slot).ok());
  REQUIRE(ring.MarkReady(a[2].slot).ok());
  CHECK_FALSE(ring.TakeNextReady().has_value());
  REQUIRE(ring.Abandon(a[0].slot).ok());  // the head: 1 and 2 may go now
  CHECK(ring.Abandon(a[0].slot).code() == StatusCode::kFailedPrecondition);
  CHECK(ring.Abandon(99).code() == StatusCode::kInvalidArgument);
  CheckCounts(ring, 2, 0, 2, 0);

  auto l1 = ring.TakeNextReady();
  auto l2 = ring.TakeNextReady();
  REQUIRE(l1.has_value());
  REQUIRE(l2.has_value());
  CHECK(l1->seq == 1);
  CHECK(l2->seq == 2);
  CHECK_FALSE(ring.TakeNextReady().has_value());

  // Seq 3 was abandoned too, so the next batch (seq 4) is delivered without waiting for it.
  auto b = ring.TryAcquire();
  REQUIRE(b.has_value());
  CHECK(b->seq == 4);
  REQUIRE(ring.MarkReady(b->slot).ok());
  auto l4 = ring.TakeNextReady();
  REQUIRE(l4.has_value());
  CHECK(l4->seq == 4);
}

TEST_CASE("SlotRing: stale, duplicate and out-of-range releases are refused") {
  SlotRing ring(2);
  auto a0 = *ring.TryAcquire();
  auto a1 = *ring.TryAcquire();
  REQUIRE(ring.MarkReady(a0.slot).ok());
  REQUIRE(ring.MarkReady(a1.slot).ok());
  auto l0 = *ring.TakeNextReady();
  auto l1 = *ring.TakeNextReady();

  // Out of range.
  Status s = ring.Release(2, l0.generation);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("out of range"));
  CheckCounts(ring, 0, 0, 0, 2);

  // The right generation on the wrong slot (generations are unique across the ring).
  s = ring.Release(l1.slot, l0.generation);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("generation"));
  CheckCounts(ring, 0, 0, 0, 2);

  // Release, then a duplicate.
  REQUIRE(ring.Release(l0.slot, l0.generation).ok());
  s = ring.Release(l0.slot, l0.generation);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("free, not leased"));
  CheckCounts(ring, 1, 0, 0, 1);

  // The slot is reused and leased again: the old generation is now stale.
  auto a2 = *ring.TryAcquire();
  CHECK(a2.slot == l0.slot);
  s = ring.Release(a2.slot, l0.generation);  // filling, not leased
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("filling"));
  REQUIRE(ring.MarkReady(a2.slot).ok());
  auto l2 = *ring.TakeNextReady();
  s = ring.Release(l2.slot, l0.generation);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("stale"));
  CHECK(ring.state(l2.slot) == SlotState::kLeased);
  CheckCounts(ring, 0, 0, 0, 2);

  CHECK(ring.Release(l2.slot, l2.generation).ok());
  CHECK(ring.Release(l1.slot, l1.generation).ok());
  CheckCounts(ring, 2, 0, 0, 0);
}

TEST_CASE("SlotRing: a released slot is discarded only while another slot is free, else filled next in place") {
  std::vector<uint32_t> discarded;
  SlotRing ring(3, 2, nullptr, [&](uint32_t slot) { discarded.push_back(slot); });
  auto a0 = *ring.TryAcquire();
  auto a1 = *ring.TryAcquire();
  REQUIRE(ring.MarkReady(a0.slot).ok());
  REQUIRE(ring.MarkReady(a1.slot).ok());
  auto l0 = *ring.TakeNextReady();
  CHECK_FALSE(ring.Release(l0.slot, l0.generation + 100).ok());  // stale: refused, nothing discarded
  CHECK(discarded.empty());
  // No other slot is free: l0's slot is the next one filled, its pages kept (warm reuse).
  REQUIRE(ring.Release(l0.slot, l0.generation).ok());
  CHECK(discarded.empty());
  CHECK_FALSE(ring.Release(l0.slot, l0.generation).ok());  // duplicate
  CHECK(discarded.empty());
  auto a2 = *ring.TryAcquire();
  CHECK(a2.slot == l0.slot);
  REQUIRE(ring.Abandon(a2.slot).ok());  // an abandoned batch was never handed out: nothing to discard
  CHECK(discarded.empty());
  // a2's slot is free now: a slot released meanwhile waits behind it, so its pages go back.
  auto l1 = *ring.TakeNextReady();
  REQUIRE(l1.slot == a1.slot);
  REQUIRE(ring.Release(l1.slot, l1.generation).ok());
  CHECK(discarded == std::vector<uint32_t>{l1.slot});
  auto a3 = *ring.TryAcquire();
  CHECK(a3.slot == a2.slot);  // the one free longest is filled first
  auto a4 = *ring.TryAcquire();
  CHECK(a4.slot == l1.slot);
  REQUIRE(ring.MarkReady(a3.slot).ok());
  auto l3 = *ring.TakeNextReady();
  CHECK(ring.ReleaseAll() == 1);  // the client went away: its slots are discarded whatever is free
  CHECK(discarded == std::vector<uint32_t>{l1.slot, l3.slot});
}

TEST_CASE("SlotRing: ReleaseAll frees only leased slots") {
  SlotRing ring(4);
  std::vector<SlotRing::Acquired> a;
  for (int i = 0; i < 4; ++i) a.push_back(*ring.TryAcquire());
  for (int i = 0; i < 3; ++i) REQUIRE(ring.MarkReady(a[i].slot).ok());
  auto l0 = *ring.TakeNextReady();
  REQUIRE(ring.TakeNextReady().has_value());
  CheckCounts(ring, 0, 1, 1, 2);

  CHECK(ring.ReleaseAll() == 2);
  CheckCounts(ring, 2, 1, 1, 0);
  CHECK(ring.Release(l0.slot, l0.generation).code() == StatusCode::kInvalidArgument);
  CHECK(ring.ReleaseAll() == 0);
  // Delivery order carries on where it was.
  auto l2 = ring.TakeNextReady();
  REQUIRE(l2.has_value());
  CHECK(l2->seq == 2);
}

TEST_CASE("SlotRing: many producers, one consumer, every batch once and in order") {
  constexpr uint64_t kBatches = 20000;
  constexpr int kProducers = 4;
  SlotRing ring(8);
  std::atomic<uint64_t> acquired{0};
  std::atomic<uint64_t> abandoned{0};
  std::atomic<bool> failed{false};

  auto producer = [&](unsigned seed) {
    std::minstd_rand rng(seed);
    for (;;) {
      if (acquired.load() >= kBatches) return;
      auto a = ring.TryAcquire();
      if (!a) {
        ring.WaitForFree(std::chrono::milliseconds(10));
        continue;
      }
      if (a->seq >= kBatches) {  // over the quota: give it back
        abandoned.fetch_add(1);
        if (!ring.Abandon(a->slot).ok()) failed = true;
        return;
      }
      acquired.fetch_add(1);
      const auto us = rng() % 51;
      if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
      if (!ring.MarkReady(a->slot).ok()) failed = true;
    }
  };

  std::vector<uint64_t> delivered;
  delivered.reserve(kBatches);
  std::thread consumer([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (delivered.size() < kBatches && std::chrono::steady_clock::now() < deadline) {
      auto l = ring.TakeNextReady();
      if (!l) {
        std::this_thread::yield();
        continue;
      }
      delivered.push_back(l->seq);
      if (!ring.Release(l->slot, l->generation).ok()) failed = true;
    }
  });
  std::vector<std::thread> producers;
  for (int i = 0; i < kProducers; ++i) producers.emplace_back(producer, 1234u + i);
  for (auto& t : producers) t.join();
  consumer.join();

  CHECK_FALSE(failed.load());
  REQUIRE(delivered.size() == kBatches);
  for (uint64_t i = 0; i < kBatches; ++i) {
    if (delivered[i] != i) FAIL("delivery " << i << " was seq " << delivered[i]);
  }
  CHECK_FALSE(ring.TakeNextReady().has_value());
  CheckCounts(ring, 8, 0, 0, 0);
}

}  // namespace
}  // namespace spdl::shm

namespace spdl::shm {
namespace {

// One batch through an adaptive ring the way the daemon moves it: acquire, fill, deliver.
SlotRing::Lease FillAndDeliver(SlotRing& ring) {
  auto a = ring.TryAcquire();
  REQUIRE(a.has_value());
  REQUIRE(ring.MarkReady(a->slot).ok());
  auto lease = ring.TakeNextReady();
  REQUIRE(lease.has_value());
  return *lease;
}

TEST_CASE("SlotRing: an adaptive ring stays small for a fast consumer and a busy pipeline") {
  std::vector<uint32_t> prepared;
  SlotRing ring(4, 2, [&](uint32_t slot) {
    prepared.push_back(slot);
    return true;
  });
  CHECK(ring.num_slots() == 4);
  CHECK(ring.active_slots() == 2);
  CheckCounts(ring, 2, 0, 0, 0);  // inactive slots are not counted

  // A consumer that gives each batch back before the next is ready.
  for (int i = 0; i < 10; ++i) {
    auto l = FillAndDeliver(ring);
    REQUIRE(ring.Release(l.slot, l.generation).ok());
  }
  // A CPU-bound loader: the consumer gives its batch back and waits, but the pipeline is busy
  // filling the other slot (never short of a slot with nothing to fill).
  for (int i = 0; i < 10; ++i) {
    auto a = FillAndDeliver(ring);
    auto b = ring.TryAcquire();
    REQUIRE(b.has_value());
    CHECK_FALSE(ring.TryAcquire().has_value());  // no free slot, but one is filling: not starved
    REQUIRE(ring.Release(a.slot, a.generation).ok());
    REQUIRE(ring.MarkReady(b->slot).ok());
    auto bl = ring.TakeNextReady();
    REQUIRE(bl.has_value());
    REQUIRE(ring.Release(bl->slot, bl->generation).ok());
  }
  CHECK(ring.active_slots() == 2);
  CHECK(prepared.empty());
}

TEST_CASE("SlotRing: an adaptive ring grows when the consumer waits after the pipeline starved") {
  std::vector<uint32_t> prepared;
  SlotRing ring(4, 2, [&](uint32_t slot) {
    prepared.push_back(slot);
    return true;
  });
  auto a = FillAndDeliver(ring);
  auto b = ring.TryAcquire();
  REQUIRE(b.has_value());
  REQUIRE(ring.MarkReady(b->slot).ok());       // b ready before the consumer is done with a
  CHECK_FALSE(ring.TryAcquire().has_value());  // the pipeline idles: no slot, nothing to fill
  REQUIRE(ring.Release(a.slot, a.generation).ok());
  CHECK(ring.active_slots() == 2);  // b is ready: the consumer does not wait
  auto bl = ring.TakeNextReady();
  REQUIRE(bl.has_value());
  auto c = ring.TryAcquire();
  REQUIRE(c.has_value());
  REQUIRE(ring.Release(bl->slot, bl->generation).ok());  // now it waits for c: one more slot
  CHECK(ring.active_slots() == 3);
  CHECK(prepared == std::vector<uint32_t>{2});
  CheckCounts(ring, 2, 1, 0, 0);
}

TEST_CASE("SlotRing: an adaptive ring grows when the consumer holds every slot, up to num_slots") {
  std::vector<uint32_t> prepared;
  SlotRing ring(4, 2, [&](uint32_t slot) {
    prepared.push_back(slot);
    return true;
  });
  // A consumer that keeps batches (a fixed ring of 4 lets it hold 3 and still get a 4th).
  std::vector<SlotRing::Lease> held;
  held.push_back(FillAndDeliver(ring));
  CHECK(ring.active_slots() == 2);
  held.push_back(FillAndDeliver(ring));  // every active slot leased: one more
  CHECK(ring.active_slots() == 3);
  held.push_back(FillAndDeliver(ring));
  CHECK(ring.active_slots() == 4);
  held.push_back(FillAndDeliver(ring));
  CHECK(ring.active_slots() == 4);  // never beyond num_slots
  CHECK_FALSE(ring.TryAcquire().has_value());
  CHECK(prepared == std::vector<uint32_t>{2, 3});
  CheckCounts(ring, 0, 0, 0, 4);
  for (const auto& l : held) REQUIRE(ring.Release(l.slot, l.generation).ok());
  CheckCounts(ring, 4, 0, 0, 0);
  CHECK(ring.active_slots() == 4);  // slots are never taken back
}

TEST_CASE("SlotRing: an adaptive ring stays put when preparing a slot fails") {
  int calls = 0;
  SlotRing ring(3, 1, [&](uint32_t) {
    ++calls;
    return false;
  });
  for (int round = 0; round < 4; ++round) {
    auto l = FillAndDeliver(ring);
    CHECK_FALSE(ring.TryAcquire().has_value());
    REQUIRE(ring.Release(l.slot, l.generation).ok());
  }
  CHECK(ring.active_slots() == 1);
  CHECK(calls == 1);  // refused once: not retried on every lease
}

TEST_CASE("SlotRing: sequence numbers and delivery order do not depend on the ring's size") {
  SlotRing fixed(3);
  CHECK(fixed.active_slots() == 3);
  SlotRing ring(3, 1, nullptr);
  uint64_t expect = 0;
  for (int round = 0; round < 5; ++round) {
    std::vector<SlotRing::Lease> held;
    while (auto a = ring.TryAcquire()) {
      REQUIRE(ring.MarkReady(a->slot).ok());
      auto l = ring.TakeNextReady();
      REQUIRE(l.has_value());
      CHECK(l->seq == expect++);
      held.push_back(*l);
    }
    for (const auto& l : held) REQUIRE(ring.Release(l.slot, l.generation).ok());
  }
  CHECK(ring.active_slots() == 3);
}

}  // namespace
}  // namespace spdl::shm
