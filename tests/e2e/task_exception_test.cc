// An exception thrown in a decode task, end to end: the real spdld (a test build, SPDL_TEST_HOOKS)
// started with SPDLD_TEST_THROW_IN_DECODE=5 throws std::runtime_error from the decode stage of
// every 5th sample of jobs named throwing*. Each exception is that sample's failure (on_error:
// skip replaces it, on_error: fail fails the job with it); the daemon and a job running beside it
// are unharmed, and the daemon still exits cleanly.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <future>
#include <string>
#include <variant>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "spdl/client.h"
#include "spdl/control.h"

namespace spdl {
namespace {

using testing::DaemonProcess;
using testing::TempDir;
using testing::WriteFile;

struct Run {
  Status status;
  uint64_t batches = 0;
  uint64_t samples = 0;
  client::JobStats stats;
};

Run RunToEnd(const client::Options& o) {
  Run run;
  auto loader = client::Loader::Open(o);
  if (!loader.ok()) {
    run.status = loader.status();
    return run;
  }
  for (;;) {
    auto ev = (*loader)->Next();
    if (!ev.ok()) {
      run.status = ev.status();
      return run;
    }
    if (auto* b = std::get_if<client::Batch>(&*ev)) {
      ++run.batches;
      run.samples += b->rows();
    }
    if (auto* s = std::get_if<client::JobStats>(&*ev)) {
      run.stats = *s;
      return run;
    }
  }
}

TEST_CASE("a decode task that throws fails its sample, not the daemon or another job") {
  TempDir dir;
  const std::string root = dir.path + "/data";
  testdata::DatasetOptions d;
  d.classes = 2;
  d.images_per_class = 20;  // 40 samples: 0, 5, ..., 35 throw
  d.min_side = 40;
  d.max_side = 80;
  REQUIRE(testdata::MakeImageFolder(root, d).ok());
  const std::string socket = dir.path + "/spdld.sock";
  WriteFile(dir.path + "/spdld.yaml",
            "socket_path: " + socket + "\nallowed_roots: [" + root + "]\nworker_threads: 2\n");
  ::setenv("SPDLD_TEST_THROW_IN_DECODE", "5", 1);
  DaemonProcess daemon(socket, {"--config", dir.path + "/spdld.yaml"});
  ::unsetenv("SPDLD_TEST_THROW_IN_DECODE");
  REQUIRE(daemon.Connectable());

  auto job = [&](const std::string& name, const std::string& extra) {
    client::Options o;
    o.socket_path = socket;
    o.config_yaml = "source: {type: image_folder, root: " + root +
                    "}\nbatch: {size: 4}\nprefetch: 2\ntransforms: [{resize: {height: 16, width: 16}}]\n" + extra;
    o.config_name = name;
    o.epochs = 2;
    return o;
  };
  // The throwing job and a plain one, at the same time on the same pools.
  auto throwing = std::async(std::launch::async, [&] { return RunToEnd(job("throwing.yaml", "on_error: skip\n")); });
  auto plain = std::async(std::launch::async, [&] { return RunToEnd(job("plain.yaml", "on_error: skip\n")); });
  Run t = throwing.get();
  Run p = plain.get();

  REQUIRE(t.status.ok());
  CHECK(t.stats.skipped == 2 * 8);   // 8 samples of 40 threw, in each of 2 epochs
  CHECK(t.samples == 2 * (40 - 8));  // each epoch delivers the 32 others
  REQUIRE(p.status.ok());
  CHECK(p.stats.skipped == 0);
  CHECK(p.samples == 2 * 40);
  CHECK(daemon.Running());

  // on_error: fail: the first exception fails the job, naming the sample and what was thrown.
  Run f = RunToEnd(job("throwing-fail.yaml", "on_error: fail\n"));
  CHECK_FALSE(f.status.ok());
  CHECK(f.status.message().find("an exception in stage 'decode'") != std::string::npos);
  CHECK(f.status.message().find("test seam: decode threw for sample") != std::string::npos);

  // The daemon still serves: status, and another whole job.
  proto::ClientMessage req;
  req.mutable_status();
  auto st = client::ControlCall(socket, req);
  REQUIRE(st.ok());
  CHECK_FALSE(st->status().daemon_version().empty());
  Run again = RunToEnd(job("plain-again.yaml", ""));
  REQUIRE(again.status.ok());
  CHECK(again.samples == 2 * 40);
  CHECK(daemon.Stop() == std::optional<int>(0));  // a clean exit, not std::terminate's abort
}

}  // namespace
}  // namespace spdl
