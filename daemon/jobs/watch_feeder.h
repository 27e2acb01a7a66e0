// WatchFeeder and WatchHub: what makes `source.type: watch` a stream job. A WatchFeeder watches a
// folder (io::DirWatcher) and puts every new complete file into a stream (streams/stream.h) as one
// sample (the file's bytes, its class label, its path relative to the root as the sample's key
// and metadata); the watch job is then a consumer of that stream (jobs/stream_job.h), so that
// batching, delivery to groups, resume tokens, max_batch_delay_ms and backpressure are the
// stream's. A full stream blocks the feeder (no file is dropped: files completed meanwhile wait in
// the kernel's queue, or, past its bound, are found by the watcher's rescan).
//
// WatchHub: the daemon's feeders by stream name. Jobs that watch the same folder with the same
// settings (and uid) share one feeder and one stream (by default named from them: see
// WatchStreamName), so two jobs in one group split the files and two groups each get all.
// A feeder lives while its stream is used: it stops, and closes its stream, when no group of the
// stream has been live for the stream's group_retention (so a job that stops and resumes within
// that time misses nothing), when its folder is deleted (the stream is closed: its jobs drain it
// and end), or at daemon shutdown.
//
// Thread safety: WatchFeeder runs one thread of its own; its public methods may be called from any
// thread. WatchHub is safe to share between threads (one mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "io/dir_watcher.h"
#include "io/fs_identity.h"
#include "streams/stream.h"

namespace spdl::jobs {

// What a watch job asks for.
struct WatchSpec {
  std::string root;             // as configured (resolved under allowed_roots)
  io::DirWatchOptions options;  // extensions, existing, classes
  std::vector<std::string> allowed_roots;
  streams::StreamConfig stream;                    // name ("" = WatchStreamName), bounds, allowed uids, retention
  uint32_t uid = 0;                                // the job's user: owns the stream it defines
  std::shared_ptr<const io::FsIdentity> identity;  // whose rights the folder is read with (null: the daemon's)
  uint64_t max_sample_bytes = 1ull << 30;          // a larger file is skipped (counted, logged)
};

// The default stream of a watch: "watch-<uid>-<16 hex digits>", a hash of the resolved root, the
// extensions, existing and classes. The same folder and settings give the same name (so a resumed
// job finds its stream).
std::string WatchStreamName(const std::string& real_root, const io::DirWatchOptions& options, uint32_t uid);

class WatchFeeder {
 public:
  struct Stats {
    std::string stream;
    std::string root;
    io::DirWatcher::Stats watcher;  // files reported (seen complete), pending, overflows, ...
    uint64_t files_put = 0;         // samples put into the stream
    uint64_t files_failed = 0;      // reported, then unreadable, vanished, or too large (logged)
    bool running = true;
  };

  // Starts feeding `stream` from `watcher`. REQUIRES: both non-null; called with no ScopedFsIdentity
  // active (the thread would inherit it).
  WatchFeeder(std::unique_ptr<io::DirWatcher> watcher, std::shared_ptr<streams::Stream> stream,
              uint64_t max_sample_bytes);
  ~WatchFeeder();  // Stop()
  WatchFeeder(const WatchFeeder&) = delete;
  WatchFeeder& operator=(const WatchFeeder&) = delete;

  const std::shared_ptr<streams::Stream>& stream() const { return stream_; }
  const std::string& real_root() const { return real_root_; }
  // Stops the thread (a file being put is abandoned; nothing is put after) and joins it. The stream
  // is left open. Idempotent.
  void Stop();
  // Whether the thread ended by itself (root deleted, stream closed, idle) or was stopped.
  bool done() const { return done_.load(); }
  Stats stats() const;

 private:
  void Run();
  // Puts one file, retrying while the stream is full until it fits or Stop. False when the stream
  // is closed.
  bool PutOne(const io::WatchedFile& file, std::vector<uint8_t>* buf);

  // Constant after construction.
  const std::unique_ptr<io::DirWatcher> watcher_;
  const std::shared_ptr<streams::Stream> stream_;
  const uint64_t max_sample_bytes_;
  const std::string real_root_;

  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<uint64_t> put_{0}, failed_{0};
  std::thread thread_;  // last: started when everything above is built
};

class WatchHub {
 public:
  // `streams` must outlive the hub.
  explicit WatchHub(streams::StreamRegistry* streams) : streams_(streams) {}
  ~WatchHub() { StopAll(); }

  // The stream fed by a watch of spec.root: the feeder of that stream when one runs (it must watch
  // the same folder: else kInvalidArgument), or a new one (the stream defined by spec.uid, the
  // folder opened with spec.identity). Errors: DirWatcher::Open's; StreamRegistry::Define's (a
  // stream of another uid: kPermissionDenied). REQUIRES: no ScopedFsIdentity active on the thread.
  Result<std::shared_ptr<streams::Stream>> Attach(const WatchSpec& spec);
  // Every running feeder's figures, by stream name.
  std::vector<WatchFeeder::Stats> Stats() const;
  // Stops every feeder (daemon shutdown). Idempotent.
  void StopAll();

 private:
  streams::StreamRegistry* const streams_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<WatchFeeder>> feeders_;  // guarded by mu_; by stream name
};

}  // namespace spdl::jobs
