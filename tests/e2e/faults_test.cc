// Faults end to end: a real spdld and real clients, some of them hostile or broken. A client that
// stops reading stalls only its own job; a session that sends garbage, an oversized frame, a
// wrong protocol version or a message out of order is closed and nothing else is touched; a daemon
// killed with SIGKILL is restarted on its stale socket and a client resumes from its last token
// with exactly the samples that were left.
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RawConnection;
using testing::TempDir;

struct Fixture {
  Fixture(int classes, int per_class) {
    testdata::DatasetOptions o;
    o.classes = classes;
    o.images_per_class = per_class;
    o.min_side = 60;
    o.max_side = 120;
    auto r = testdata::MakeImageFolder(root(), o);
    REQUIRE(r.ok());
    for (auto& g : *r) all.insert(g.path);
  }
  std::string root() const { return dir.path + "/data"; }
  std::string socket() const { return dir.path + "/spdld.sock"; }
  client::Options Job(uint32_t epochs, int prefetch = 2, uint32_t rank = 0, uint32_t world = 1) const {
    client::Options o;
    o.socket_path = socket();
    o.config_yaml = "source: {type: image_folder, root: " + root() +
                    "}\nsampler: {shuffle: true, seed: 3}\nbatch: {size: 4}\n"
                    "transforms: [{resize: {height: 32, width: 32}}]\nprefetch: " +
                    std::to_string(prefetch) + "\n";
    o.config_name = "job.yaml";
    o.epochs = epochs;
    o.rank = rank;
    o.world_size = world;
    return o;
  }
  TempDir dir;
  std::set<std::string> all;
};

// Reads a job to its end: the paths per epoch, in order.
struct Drained {
  std::vector<std::vector<std::string>> epochs;
  std::string error;
};
Drained Drain(client::Loader& l) {
  Drained d;
  for (;;) {
    auto ev = l.Next();
    if (!ev.ok()) {
      d.error = ev.status().ToString();
      return d;
    }
    if (auto* b = std::get_if<client::Batch>(&*ev)) {
      if (d.epochs.size() <= b->epoch()) d.epochs.resize(b->epoch() + 1);
      d.epochs[b->epoch()].insert(d.epochs[b->epoch()].end(), b->paths().begin(), b->paths().end());
    }
    if (std::holds_alternative<client::JobStats>(*ev)) return d;
  }
}

void CheckEveryEpochExact(const Drained& d, const std::set<std::string>& all, size_t epochs) {
  INFO(d.error);
  REQUIRE(d.error.empty());
  REQUIRE(d.epochs.size() == epochs);
  for (auto& e : d.epochs) {
    CHECK(e.size() == all.size());
    CHECK(std::set<std::string>(e.begin(), e.end()) == all);
  }
}

TEST_CASE("a client that holds all its slots and stops reading stalls only its own job") {
  Fixture f(2, 20);
  DaemonProcess d(f.socket(), {"--allow-root", f.root(), "--threads", "2"});
  REQUIRE(d.Connectable());
  auto stuck = client::Loader::Open(f.Job(0, 2));
  REQUIRE(stuck.ok());
  std::vector<client::Batch> held;
  for (int i = 0; i < 2; ++i) {  // every slot of its ring, never released
    auto ev = (*stuck)->Next();
    REQUIRE(ev.ok());
    REQUIRE(std::holds_alternative<client::Batch>(*ev));
    held.push_back(std::move(std::get<client::Batch>(*ev)));
  }
  // Meanwhile two other jobs run to their end, every sample exactly once per epoch.
  Drained a, b;
  std::thread ta([&] {
    auto l = client::Loader::Open(f.Job(3, 2));
    if (l.ok())
      a = Drain(**l);
    else
      a.error = l.status().ToString();
  });
  std::thread tb([&] {
    auto l = client::Loader::Open(f.Job(2, 3));
    if (l.ok())
      b = Drain(**l);
    else
      b.error = l.status().ToString();
  });
  ta.join();
  tb.join();
  CheckEveryEpochExact(a, f.all, 3);
  CheckEveryEpochExact(b, f.all, 2);
  // The stalled job was only waiting: released, it goes on.
  held.clear();
  auto ev = (*stuck)->Next();
  REQUIRE(ev.ok());
  CHECK(std::holds_alternative<client::Batch>(*ev));
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a session that sends garbage, oversized frames, a wrong version or messages out of order is closed alone") {
  Fixture f(2, 20);
  DaemonProcess d(f.socket(), {"--allow-root", f.root(), "--threads", "2"});
  REQUIRE(d.Connectable());
  // A real job runs across all of it.
  Drained steady;
  auto l = client::Loader::Open(f.Job(4, 2));
  REQUIRE(l.ok());
  auto first = (*l)->Next();
  REQUIRE(first.ok());
  const int fds_before = testing::FdCount(d.pid());

  auto expect_closed_with = [&](RawConnection& c, proto::Error::Code code, const std::string& words) {
    std::vector<proto::DaemonMessage> seen;
    CHECK(c.WaitClosed(&seen));
    REQUIRE_FALSE(seen.empty());
    REQUIRE(seen.back().has_error());
    CHECK(seen.back().error().code() == code);
    CHECK_THAT(seen.back().error().message(), Catch::Contains(words));
  };
  {
    INFO("a frame of garbage instead of Hello");
    RawConnection c(f.socket());
    std::string junk = "\xde\xad\xbe\xef\xff\xff\x01\x02garbage";
    std::string frame;
    proto::AppendFrame(junk, &frame);
    REQUIRE(c.SendBytes(frame));
    expect_closed_with(c, proto::Error::BAD_REQUEST, "not a valid spdld control message");
  }
  {
    INFO("garbage after a good Hello");
    RawConnection c(f.socket());
    REQUIRE(c.SendHello());
    REQUIRE(c.Receive());
    std::string frame;
    proto::AppendFrame(std::string(100, '\xff'), &frame);
    REQUIRE(c.SendBytes(frame));
    expect_closed_with(c, proto::Error::BAD_REQUEST, "not a valid");
  }
  {
    INFO("unframed bytes: the first four read as a huge length");
    RawConnection c(f.socket());
    REQUIRE(c.SendBytes("GET / HTTP/1.1\r\nHost: spdld\r\n\r\n"));
    expect_closed_with(c, proto::Error::BAD_REQUEST, "max_frame_bytes");
  }
  {
    INFO("a wrong protocol version");
    RawConnection c(f.socket());
    REQUIRE(c.SendHello(proto::kProtocolVersion + 41));
    expect_closed_with(c, proto::Error::VERSION_MISMATCH, "version");
  }
  {
    INFO("a job submitted before Hello");
    RawConnection c(f.socket());
    proto::ClientMessage m;
    m.mutable_submit()->set_config_yaml("source: {root: " + f.root() + "}\n");
    REQUIRE(c.Send(m));
    expect_closed_with(c, proto::Error::BAD_REQUEST, "Hello");
  }
  {
    INFO("a release of a slot it never had (no job)");
    RawConnection c(f.socket());
    REQUIRE(c.SendHello());
    REQUIRE(c.Receive());
    proto::ClientMessage m;
    m.mutable_release()->set_slot(3);
    m.mutable_release()->set_generation(99);
    REQUIRE(c.Send(m));  // refused or ignored; either way the daemon carries on (checked below)
  }
  {
    INFO("a client that connects and goes away without a word");
    RawConnection c(f.socket());
    REQUIRE(c.connected());
  }
  // The real job never noticed: it runs to its end with every sample once per epoch.
  steady = Drain(**l);
  auto& e0 = steady.epochs.size() > 0 ? steady.epochs[0] : steady.epochs.emplace_back();
  if (auto* b = std::get_if<client::Batch>(&*first)) e0.insert(e0.begin(), b->paths().begin(), b->paths().end());
  CheckEveryEpochExact(steady, f.all, 4);
  l->reset();
  int fds_after = -1;
  for (int i = 0; i < 100 && (fds_after = testing::FdCount(d.pid())) > fds_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(fds_after <= fds_before);  // every hostile session's socket was closed (and the job's)
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a job config that yaml-cpp would never finish parsing is refused at once and the daemon carries on") {
  // A ',' at the top level made yaml-cpp 0.7's LoadAll loop forever, allocating (config_fuzz).
  Fixture f(1, 8);
  DaemonProcess d(f.socket(), {"--allow-root", f.root()});
  REQUIRE(d.Connectable());
  for (const char* text : {",", ",28KiYB", "source: {root: x}\n---\n,\n"}) {
    auto o = f.Job(1);
    o.config_yaml = text;
    auto l = client::Loader::Open(o);
    REQUIRE_FALSE(l.ok());
    CHECK(l.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(l.status().message(), Catch::Contains("unexpected ','"));
  }
  auto l = client::Loader::Open(f.Job(1));
  REQUIRE(l.ok());
  CHECK(Drain(**l).epochs.size() == 1);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("a daemon killed with SIGKILL restarts on its stale socket and a client resumes from its last token") {
  Fixture f(3, 11);  // 33 samples: batches of 4 leave a short last batch
  const uint32_t kEpochs = 2;
  std::vector<std::vector<std::string>> full;
  {
    DaemonProcess d(f.socket(), {"--allow-root", f.root(), "--threads", "2"});
    REQUIRE(d.Connectable());
    auto l = client::Loader::Open(f.Job(kEpochs));
    REQUIRE(l.ok());
    full = Drain(**l).epochs;
    REQUIRE(full.size() == kEpochs);
    CHECK(d.Stop() == std::optional<int>(0));
  }
  for (int stop_after : {3, 9, 12}) {  // in epoch 0, at its end, in epoch 1
    INFO("killed after batch " << stop_after);
    std::vector<std::vector<std::string>> got(kEpochs);
    std::string token;
    {
      DaemonProcess d(f.socket(), {"--allow-root", f.root(), "--threads", "2"});
      REQUIRE(d.Connectable());
      auto l = client::Loader::Open(f.Job(kEpochs));
      REQUIRE(l.ok());
      for (int n = 0; n < stop_after;) {
        auto ev = (*l)->Next();
        REQUIRE(ev.ok());
        if (auto* b = std::get_if<client::Batch>(&*ev)) {
          got[b->epoch()].insert(got[b->epoch()].end(), b->paths().begin(), b->paths().end());
          ++n;
        }
      }
      token = (*l)->state();
      REQUIRE(d.Stop(SIGKILL) == std::optional<int>(-SIGKILL));
      CHECK(fs::exists(f.socket()));  // left behind: the restart must cope with it
      Status s;                       // events already buffered (an EpochEnd) come first, then the error
      for (int i = 0; i < 100 && s.ok(); ++i) s = (*l)->Next().status();
      CHECK(s.code() == StatusCode::kUnavailable);
    }
    DaemonProcess d(f.socket(), {"--allow-root", f.root(), "--threads", "2"});
    REQUIRE(d.Connectable());
    auto o = f.Job(kEpochs);
    o.resume_token = token;
    auto l = client::Loader::Open(o);
    REQUIRE(l.ok());
    Drained rest = Drain(**l);
    REQUIRE(rest.error.empty());
    for (size_t e = 0; e < rest.epochs.size(); ++e) {
      got[e].insert(got[e].end(), rest.epochs[e].begin(), rest.epochs[e].end());
    }
    CHECK(got == full);
    CHECK(d.Stop() == std::optional<int>(0));
  }
}

}  // namespace
}  // namespace spdl
