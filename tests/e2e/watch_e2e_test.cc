// End to end for source.type: watch (issue 21): a real spdld watching a real folder, a real Loader
// consuming the job, real JPEGs written while it runs: in place, renamed into place, into a class
// folder made during the run, and one held open half written for longer than a batch waits. Each
// file arrives exactly once with its class label, and the half-written one only complete
// (on_error: fail: a truncated JPEG would fail the job). A second job in another group sees every
// file too.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::DaemonProcess;
using testing::TempDir;

std::string WatchYaml(const std::string& root, const std::string& group, const std::string& existing) {
  std::ostringstream y;
  y << "source: {type: watch, root: " << root << ", existing: " << existing << ", group: " << group << "}\n"
    << "batch: {size: 4}\n"
    << "max_batch_delay_ms: 150\n"
    << "transforms:\n"
    << "  - resize: {shorter: 40}\n"
    << "  - center_crop: {size: 32}\n"
    << "on_error: fail\n";
  return y.str();
}

struct Received {
  std::map<std::string, int> count;  // path -> times received
  std::map<std::string, int64_t> label;
  uint64_t batches = 0;
  std::string error;
};

// Reads batches of `loader` until `want` distinct paths arrived and then `quiet` passed with nothing
// new (a duplicate would show), or `deadline`.
void Consume(client::Loader& loader, size_t want, std::chrono::steady_clock::time_point deadline,
             std::chrono::milliseconds quiet, std::atomic<std::chrono::steady_clock::time_point>* stop_at,
             Received* out) {
  for (;;) {
    auto ev = loader.Next();
    if (!ev.ok()) {
      if (ev.status().message() != "test: enough received") out->error = ev.status().ToString();
      return;
    }
    if (auto* b = std::get_if<client::Batch>(&*ev)) {
      ++out->batches;
      for (uint32_t r = 0; r < b->rows(); ++r) {
        ++out->count[b->paths()[r]];
        out->label[b->paths()[r]] = b->labels()[r];
      }
      if (out->count.size() >= want && stop_at->load() == std::chrono::steady_clock::time_point::max()) {
        stop_at->store(std::min(deadline, std::chrono::steady_clock::now() + quiet));
      }
    } else if (std::holds_alternative<client::JobStats>(*ev)) {
      return;
    }
  }
}

TEST_CASE("watch e2e: files written during the job arrive once, renamed ones too, partial writes only complete") {
  TempDir dir;
  const std::string stage = dir.path + "/stage";  // JPEG bytes to write into the watched folder
  auto images = testdata::MakeImageFolder(stage, testing::SmallImages(1, 10, 60, 90));
  REQUIRE(images.ok());
  std::vector<std::vector<uint8_t>> jpeg;
  for (const auto& g : *images) jpeg.push_back(testing::ReadBytes(stage + "/" + g.path));
  const std::string root = dir.path + "/watched";
  fs::create_directories(root + "/a");
  fs::create_directories(root + "/b");
  testing::WriteFile(root + "/a/existing.jpg", jpeg[0].data(), jpeg[0].size());

  DaemonProcess d(dir.path + "/spdld.sock", {"--allow-root", dir.path, "--threads", "2"});
  REQUIRE(d.Running());
  const auto deadline = std::chrono::steady_clock::now() + 12s;
  std::atomic<std::chrono::steady_clock::time_point> stop_at{std::chrono::steady_clock::time_point::max()};
  auto open = [&](const std::string& group, const std::string& existing) {
    client::Options o;
    o.socket_path = dir.path + "/spdld.sock";
    o.config_yaml = WatchYaml(root, group, existing);
    o.config_name = "watch.yaml";
    o.epochs = 0;
    o.on_wait = [&]() -> Status {
      const auto now = std::chrono::steady_clock::now();
      if (now >= stop_at.load() || now >= deadline) return Cancelled("test: enough received");
      return Status::Ok();
    };
    auto l = client::Loader::Open(o);
    INFO(l.status().ToString());
    REQUIRE(l.ok());
    return std::move(*l);
  };
  auto first = open("g1", "include");
  auto second = open("g2", "include");  // the same folder and settings: the same watch, another group

  // The writer: in place, renamed into place, a new class folder, and one written in two halves
  // with a pause longer than the batch delay.
  std::thread writer([&] {
    testing::WriteFile(root + "/a/in_place.jpg", jpeg[1].data(), jpeg[1].size());
    testing::WriteFile(root + "/b/.renamed.tmp", jpeg[2].data(), jpeg[2].size());
    fs::rename(root + "/b/.renamed.tmp", root + "/b/renamed.jpg");
    const int fd = ::open((root + "/b/slow.jpg").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const size_t half = jpeg[3].size() / 2;
    (void)!::write(fd, jpeg[3].data(), half);
    std::this_thread::sleep_for(600ms);
    (void)!::write(fd, jpeg[3].data() + half, jpeg[3].size() - half);
    ::close(fd);
    fs::create_directories(root + "/c");
    testing::WriteFile(root + "/c/new_class.jpg", jpeg[4].data(), jpeg[4].size());
    for (int i = 5; i < 10; ++i) {
      testing::WriteFile(root + "/a/.n" + std::to_string(i), jpeg[i].data(), jpeg[i].size());
      fs::rename(root + "/a/.n" + std::to_string(i), root + "/a/n" + std::to_string(i) + ".jpg");
    }
  });
  const std::set<std::string> expected = {"a/existing.jpg",  "a/in_place.jpg", "b/renamed.jpg", "b/slow.jpg",
                                          "c/new_class.jpg", "a/n5.jpg",       "a/n6.jpg",      "a/n7.jpg",
                                          "a/n8.jpg",        "a/n9.jpg"};
  Received r1, r2;
  std::thread other([&] { Consume(*second, expected.size(), deadline, 800ms, &stop_at, &r2); });
  Consume(*first, expected.size(), deadline, 800ms, &stop_at, &r1);
  other.join();
  writer.join();
  for (const Received* r : {&r1, &r2}) {
    INFO(r->error);
    CHECK(r->error.empty());
    std::set<std::string> got;
    int dup = 0;
    for (const auto& [p, n] : r->count) {
      got.insert(p);
      dup += n > 1;
    }
    CHECK(got == expected);
    CHECK(dup == 0);
    CHECK(r->label.at("a/existing.jpg") == 0);
    CHECK(r->label.at("b/slow.jpg") == 1);
    CHECK(r->label.at("c/new_class.jpg") == 2);
  }
}

}  // namespace
}  // namespace spdl
