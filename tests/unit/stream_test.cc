// The stream core (daemon/streams): offsets, the bounded log and backpressure, consumer groups
// (exactly once within a group, everything to every group), redelivery when a consumer leaves,
// resume tokens and eviction, access, the memory account. No sockets, real threads where a Put blocks.
#include "streams/stream.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <future>
#include <set>
#include <thread>

namespace spdl::streams {
namespace {

using std::chrono::milliseconds;

StreamConfig Config(uint64_t max_samples, uint64_t max_bytes = uint64_t{1} << 20) {
  StreamConfig c;
  c.name = "s";
  c.max_samples = max_samples;
  c.max_bytes = max_bytes;
  c.group_retention = milliseconds(60000);
  return c;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t v = 7) { return std::vector<uint8_t>(n, v); }

PutOptions NoBlock() {
  PutOptions o;
  o.block = false;
  return o;
}

std::vector<uint64_t> Offsets(const Stream::Taken& t) {
  std::vector<uint64_t> v;
  for (const auto& s : t.samples) v.push_back(s->offset);
  return v;
}

class Counter : public MemoryAccount {
 public:
  explicit Counter(uint64_t limit) : limit_(limit) {}
  bool TryCharge(uint64_t b) override {
    if (used + b > limit_) return false;
    used += b;
    return true;
  }
  void Release(uint64_t b) override { used -= b; }
  std::atomic<uint64_t> used{0};

 private:
  uint64_t limit_;
};

TEST_CASE("stream: offsets count up and samples keep their label and metadata", "[stream]") {
  Stream s(Config(10), 1000, nullptr);
  for (int i = 0; i < 3; ++i) {
    auto off = s.Put(Bytes(4, static_cast<uint8_t>(i)), 10 + i, "m" + std::to_string(i));
    REQUIRE(off.ok());
    CHECK(*off == static_cast<uint64_t>(i));
  }
  auto c = s.Join("g");
  REQUIRE(c.ok());
  auto t = s.Take(*c, 10, milliseconds(0));
  REQUIRE(t.ok());
  REQUIRE(t->samples.size() == 3);
  CHECK(t->samples[2]->label == 12);
  CHECK(t->samples[2]->metadata == "m2");
  CHECK(t->samples[2]->data == Bytes(4, 2));
  CHECK_FALSE(t->end);
}

TEST_CASE("stream: a full stream refuses a non-blocking put and names the bound", "[stream]") {
  Stream s(Config(2), 1000, nullptr);
  REQUIRE(s.Put(Bytes(1), 0, "").ok());
  REQUIRE(s.Put(Bytes(1), 0, "").ok());
  auto r = s.Put(Bytes(1), 0, "", NoBlock());
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  CHECK(r.status().message().find("max_samples 2") != std::string::npos);
  // Nobody has consumed: nothing was evicted to make room.
  CHECK(s.Stats().retained_samples == 2);
  CHECK(s.Stats().evicted == 0);
  CHECK(s.Stats().blocked_puts == 1);
}

TEST_CASE("stream: max_bytes bounds the log, a sample larger than it is refused at once", "[stream]") {
  Stream s(Config(100, 10), 1000, nullptr);
  REQUIRE(s.Put(Bytes(6), 0, "").ok());
  CHECK(s.Put(Bytes(6), 0, "", NoBlock()).status().code() == StatusCode::kResourceExhausted);
  auto big = s.Put(Bytes(11), 0, "");
  CHECK(big.status().code() == StatusCode::kInvalidArgument);
  CHECK(s.Stats().retained_bytes == 6);
}

TEST_CASE("stream: a blocked put continues once the group acknowledges the oldest sample", "[stream]") {
  Stream s(Config(2), 1000, nullptr);
  auto c = s.Join("g");
  REQUIRE(c.ok());
  REQUIRE(s.Put(Bytes(1), 0, "").ok());
  REQUIRE(s.Put(Bytes(1), 0, "").ok());
  auto blocked = std::async(std::launch::async, [&] { return s.Put(Bytes(1), 0, ""); });
  CHECK(blocked.wait_for(milliseconds(100)) == std::future_status::timeout);
  auto t = s.Take(*c, 1, milliseconds(0));
  REQUIRE(t.ok());
  REQUIRE(Offsets(*t) == std::vector<uint64_t>{0});
  // Taken but not acknowledged: still no room.
  CHECK(blocked.wait_for(milliseconds(100)) == std::future_status::timeout);
  s.Ack(*c, {0});
  auto r = blocked.get();
  REQUIRE(r.ok());
  CHECK(*r == 2);
  CHECK(s.Stats().evicted == 1);
  CHECK(s.Stats().head_offset == 1);
}

TEST_CASE("stream: a blocked put fails when the stream closes, and max_wait bounds the wait", "[stream]") {
  Stream s(Config(1), 1000, nullptr);
  REQUIRE(s.Put(Bytes(1), 0, "").ok());
  PutOptions o;
  o.max_wait = milliseconds(50);
  CHECK(s.Put(Bytes(1), 0, "", o).status().code() == StatusCode::kResourceExhausted);
  auto blocked = std::async(std::launch::async, [&] { return s.Put(Bytes(1), 0, ""); });
  CHECK(blocked.wait_for(milliseconds(50)) == std::future_status::timeout);
  s.Close();
  CHECK(blocked.get().status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("stream: two consumers of one group get each sample exactly once", "[stream]") {
  Stream s(Config(1000), 1000, nullptr);
  auto a = s.Join("g");
  auto b = s.Join("g");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  for (int i = 0; i < 100; ++i) REQUIRE(s.Put(Bytes(1), i, "").ok());
  s.Close();
  std::multiset<uint64_t> seen;
  std::set<uint64_t> seen_a, seen_b;
  bool end_a = false, end_b = false;
  while (!end_a || !end_b) {
    for (auto [id, set, end] : {std::tuple{*a, &seen_a, &end_a}, std::tuple{*b, &seen_b, &end_b}}) {
      if (*end) continue;
      auto t = s.Take(id, 7, milliseconds(0));
      REQUIRE(t.ok());
      *end = t->end;
      for (uint64_t off : Offsets(*t)) {
        seen.insert(off);
        set->insert(off);
      }
      s.Ack(id, Offsets(*t));
    }
  }
  CHECK(seen.size() == 100);
  CHECK(std::set<uint64_t>(seen.begin(), seen.end()).size() == 100);
  CHECK_FALSE(seen_a.empty());
  CHECK_FALSE(seen_b.empty());
}

TEST_CASE("stream: every group sees every sample", "[stream]") {
  Stream s(Config(1000), 1000, nullptr);
  auto a = s.Join("one");
  auto b = s.Join("two");
  for (int i = 0; i < 20; ++i) REQUIRE(s.Put(Bytes(1), i, "").ok());
  auto ta = s.Take(*a, 100, milliseconds(0));
  auto tb = s.Take(*b, 100, milliseconds(0));
  REQUIRE(ta.ok());
  REQUIRE(tb.ok());
  CHECK(ta->samples.size() == 20);
  CHECK(tb->samples.size() == 20);
  // Eviction waits for the slower group.
  s.Ack(*a, Offsets(*ta));
  CHECK(s.Stats().groups.size() == 2);
  CHECK(s.Stats().groups[0].lag == 0);
  CHECK(s.Stats().groups[1].lag == 20);
}

TEST_CASE("stream: a consumer that leaves hands its in-flight samples to its group", "[stream]") {
  Stream s(Config(1000), 1000, nullptr);
  auto a = s.Join("g");
  auto b = s.Join("g");
  for (int i = 0; i < 10; ++i) REQUIRE(s.Put(Bytes(1), i, "").ok());
  auto ta = s.Take(*a, 4, milliseconds(0));  // 0..3
  REQUIRE(Offsets(*ta) == std::vector<uint64_t>{0, 1, 2, 3});
  s.Ack(*a, {0, 1});
  s.Leave(*a);  // 2 and 3 were in flight
  auto tb = s.Take(*b, 3, milliseconds(0));
  REQUIRE(tb.ok());
  CHECK(Offsets(*tb) == std::vector<uint64_t>{2, 3, 4});
  CHECK(s.Stats().groups[0].redelivered == 2);
  CHECK(s.Take(*a, 1, milliseconds(0)).status().code() == StatusCode::kNotFound);
}

TEST_CASE("stream: a new consumer of a group whose consumer died continues where the group is", "[stream]") {
  Stream s(Config(1000), 1000, nullptr);
  auto a = s.Join("g");
  for (int i = 0; i < 10; ++i) REQUIRE(s.Put(Bytes(1), i, "").ok());
  auto ta = s.Take(*a, 6, milliseconds(0));
  s.Ack(*a, {0, 1, 2, 3});  // 4 and 5 in flight, then the consumer is killed
  s.Leave(*a);
  auto b = s.Join("g", uint64_t{5});  // its token: the last offset it delivered
  REQUIRE(b.ok());
  auto tb = s.Take(*b, 100, milliseconds(0));
  CHECK(Offsets(*tb) == std::vector<uint64_t>{4, 5, 6, 7, 8, 9});
}

TEST_CASE("stream: resuming a forgotten group starts after its token, or names what was evicted", "[stream]") {
  StreamConfig cfg = Config(4);
  cfg.group_retention = milliseconds(0);
  Stream s(cfg, 1000, nullptr);
  auto a = s.Join("g");
  for (int i = 0; i < 4; ++i) REQUIRE(s.Put(Bytes(1), i, "").ok());
  auto ta = s.Take(*a, 2, milliseconds(0));
  s.Ack(*a, Offsets(*ta));
  s.Leave(*a);  // the group is forgotten at once; 0 and 1 are consumed
  auto b = s.Join("g", uint64_t{1});
  REQUIRE(b.ok());
  CHECK(Offsets(*s.Take(*b, 100, milliseconds(0))) == std::vector<uint64_t>{2, 3});
  s.Ack(*b, {2, 3});
  s.Leave(*b);
  for (int i = 0; i < 4; ++i) REQUIRE(s.Put(Bytes(1), i, "", NoBlock()).ok());  // evicts 0..3
  auto late = s.Join("g", uint64_t{1});
  REQUIRE_FALSE(late.ok());
  CHECK(late.status().code() == StatusCode::kDataLoss);
  CHECK(late.status().message().find("2 samples (offsets 2..3) were evicted") != std::string::npos);
  CHECK(s.Join("g", uint64_t{99}).status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("stream: a closed stream drains, then ends", "[stream]") {
  Stream s(Config(10), 1000, nullptr);
  auto c = s.Join("g");
  REQUIRE(s.Put(Bytes(1), 0, "").ok());
  s.Close();
  CHECK(s.Put(Bytes(1), 0, "").status().code() == StatusCode::kFailedPrecondition);
  auto t = s.Take(*c, 10, milliseconds(0));
  CHECK(t->samples.size() == 1);
  CHECK_FALSE(t->end);
  CHECK(s.Take(*c, 10, milliseconds(0))->end);
}

TEST_CASE("stream: a waiting take wakes for a put, and for cancel", "[stream]") {
  Stream s(Config(10), 1000, nullptr);
  auto c = s.Join("g");
  auto waiting = std::async(std::launch::async, [&] { return s.Take(*c, 10, milliseconds(10000)); });
  CHECK(waiting.wait_for(milliseconds(50)) == std::future_status::timeout);
  REQUIRE(s.Put(Bytes(1), 0, "").ok());
  auto t = waiting.get();
  REQUIRE(t.ok());
  CHECK(t->samples.size() == 1);
  auto waiting2 = std::async(std::launch::async, [&] { return s.Take(*c, 10, milliseconds(10000)); });
  s.Cancel(*c);
  CHECK(waiting2.get().status().code() == StatusCode::kCancelled);
}

TEST_CASE("stream: retained bytes are charged to the memory account and returned", "[stream]") {
  Counter budget(10);
  {
    Stream s(Config(100, 1000), 1000, &budget);
    auto c = s.Join("g");
    REQUIRE(s.Put(Bytes(6), 0, "").ok());
    CHECK(budget.used == 6);
    // The stream's own bounds have room; the daemon's budget has not.
    CHECK(s.Put(Bytes(6), 0, "", NoBlock()).status().code() == StatusCode::kResourceExhausted);
    auto t = s.Take(*c, 1, milliseconds(0));
    s.Ack(*c, Offsets(*t));
    REQUIRE(s.Put(Bytes(6), 0, "", NoBlock()).ok());  // the acknowledged sample made room
    CHECK(budget.used == 6);
  }
  CHECK(budget.used == 0);
}

TEST_CASE("stream registry: the first user defines, others need access", "[stream]") {
  StreamRegistry reg;
  StreamConfig cfg = Config(5);
  cfg.allowed_uids = {2000};
  auto s = reg.Define(cfg, 1000);
  REQUIRE(s.ok());
  StreamConfig other = Config(99);
  auto again = reg.Define(other, 2000);
  REQUIRE(again.ok());
  CHECK(again->get() == s->get());
  CHECK((*again)->config().max_samples == 5);
  auto denied = reg.Open("s", 3000);
  CHECK(denied.status().code() == StatusCode::kPermissionDenied);
  CHECK(denied.status().message().find("uid 3000") != std::string::npos);
  CHECK(reg.Define(other, 3000).status().code() == StatusCode::kPermissionDenied);
  CHECK(reg.Open("s", 0).ok());
  CHECK(reg.Open("nope", 1000).status().code() == StatusCode::kNotFound);
  StreamConfig bad = Config(0, 0);
  bad.name = "a/b";
  auto r = reg.Define(bad, 1000);
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK(r.status().message().find("max_samples") != std::string::npos);
  CHECK(r.status().message().find("max_bytes") != std::string::npos);
  CHECK(r.status().message().find("may hold only") != std::string::npos);
}

TEST_CASE("stream registry: a drained, unused stream is defined anew with offsets continuing", "[stream]") {
  StreamRegistry reg;
  {
    auto s = reg.Define(Config(5), 1000);
    REQUIRE((*s)->Put(Bytes(1), 0, "").ok());
    (*s)->Close();
  }
  // Closed but not consumed: kept, with its sample.
  auto kept = reg.Define(Config(5), 1000);
  REQUIRE(kept.ok());
  CHECK((*kept)->closed());
  auto c = (*kept)->Join("g");
  auto t = (*kept)->Take(*c, 10, milliseconds(0));
  REQUIRE(t->samples.size() == 1);
  (*kept)->Ack(*c, {0});
  CHECK((*kept)->drained());
  kept = InvalidArgument("dropped");  // releases the reference
  auto s2 = reg.Define(Config(5), 1000);
  REQUIRE(s2.ok());
  CHECK_FALSE((*s2)->closed());
  CHECK(*(*s2)->Put(Bytes(1), 0, "") == 1);
}

}  // namespace
}  // namespace spdl::streams
