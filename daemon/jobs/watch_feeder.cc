#include "jobs/watch_feeder.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <utility>

#include "io/allowed_roots.h"

namespace spdl::jobs {
namespace {

constexpr int kPollMs = 200;                        // how often the feeder looks at stop and idleness
constexpr std::chrono::milliseconds kPutWait{200};  // a blocked Put re-checks stop this often

uint64_t Fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string WatchStreamName(const std::string& real_root, const io::DirWatchOptions& options, uint32_t uid) {
  std::string text = real_root + '\0' + (options.include_existing ? "include" : "skip") + '\0';
  for (const std::string& e : options.extensions) text += e + '\n';
  text += '\0';
  for (const std::string& c : options.classes) text += c + '\n';
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(Fnv1a(text)));
  return "watch-" + std::to_string(uid) + "-" + hex;
}

WatchFeeder::WatchFeeder(std::unique_ptr<io::DirWatcher> watcher, std::shared_ptr<streams::Stream> stream,
                         uint64_t max_sample_bytes)
    : watcher_(std::move(watcher)),
      stream_(std::move(stream)),
      max_sample_bytes_(max_sample_bytes),
      real_root_(watcher_->root()) {
  stream_->AddProducer();
  thread_ = std::thread([this] { Run(); });
}

WatchFeeder::~WatchFeeder() { Stop(); }

void WatchFeeder::Stop() {
  stop_.store(true);
  watcher_->Wake();
  if (thread_.joinable()) thread_.join();
}

bool WatchFeeder::PutOne(const io::WatchedFile& file, std::vector<uint8_t>* buf) {
  Status read = watcher_->Read(file, buf, max_sample_bytes_);
  if (!read.ok()) {
    // Gone or replaced since it was complete (a replacement is reported on its own), unreadable, too
    // large: not a sample; said once here.
    failed_.fetch_add(1);
    spdlog::warn("watch {}: {} is not taken: {}", real_root_, file.path, read.ToString());
    return true;
  }
  streams::PutOptions options;
  options.max_wait = kPutWait;
  options.key = file.path;
  while (!stop_.load()) {
    auto offset = stream_->Put(*buf, file.label, file.path, options);
    if (offset.ok()) {
      put_.fetch_add(1);
      return true;
    }
    switch (offset.status().code()) {
      case StatusCode::kResourceExhausted:  // full: wait on (the consumers make room)
        continue;
      case StatusCode::kFailedPrecondition:  // closed
        return false;
      default:  // a sample larger than the stream's max_bytes: it never fits
        failed_.fetch_add(1);
        spdlog::warn("watch {}: {} is not taken: {}", real_root_, file.path, offset.status().ToString());
        return true;
    }
  }
  return true;
}

void WatchFeeder::Run() {
  std::vector<io::WatchedFile> files;
  std::vector<uint8_t> buf;
  auto idle_since = std::chrono::steady_clock::now();
  const auto retention = stream_->config().group_retention;
  while (!stop_.load()) {
    files.clear();
    Status s = watcher_->Poll(kPollMs, &files);
    bool open = true;
    for (const io::WatchedFile& f : files) {
      if (stop_.load()) break;
      open = PutOne(f, &buf);
      if (!open) break;
    }
    if (!open || stream_->closed()) {
      spdlog::info("watch {}: stream {} closed, the watch ends", real_root_, stream_->name());
      break;
    }
    if (!s.ok()) {
      if (s.code() == StatusCode::kNotFound) {  // the folder was deleted: nothing more will come
        spdlog::warn("watch {}: {}; stream {} closed", real_root_, s.ToString(), stream_->name());
        stream_->Close();
        break;
      }
      spdlog::warn("watch {}: {}", real_root_, s.ToString());
    }
    const auto now = std::chrono::steady_clock::now();
    if (!stream_->Stats().groups.empty()) {
      idle_since = now;
    } else if (now - idle_since > retention) {
      spdlog::info("watch {}: no consumer of stream {} for {} ms, the watch ends and closes it", real_root_,
                   stream_->name(), retention.count());
      stream_->Close();
      break;
    }
  }
  stream_->RemoveProducer();
  done_.store(true);
}

WatchFeeder::Stats WatchFeeder::stats() const {
  Stats s;
  s.stream = stream_->name();
  s.root = real_root_;
  s.watcher = watcher_->stats();
  s.files_put = put_.load();
  s.files_failed = failed_.load();
  s.running = !done_.load();
  return s;
}

Result<std::shared_ptr<streams::Stream>> WatchHub::Attach(const WatchSpec& spec) {
  if (io::CurrentFsIdentity() != nullptr) return Internal("WatchHub::Attach called under a user identity");
  std::string real_root;
  {
    io::ScopedFsIdentity as(spec.identity.get());
    if (!as.ok()) return Internal("spdld could not act as the job's user: " + as.status().message());
    SPDL_ASSIGN_OR_RETURN(real_root, io::ResolveUnderRoots(spec.root, spec.allowed_roots));
  }
  streams::StreamConfig config = spec.stream;
  if (config.name.empty()) config.name = WatchStreamName(real_root, spec.options, spec.uid);
  std::lock_guard<std::mutex> lock(mu_);
  // Feeders that ended by themselves give their stream back (a closed, unused stream is defined anew).
  for (auto it = feeders_.begin(); it != feeders_.end();) it = it->second->done() ? feeders_.erase(it) : std::next(it);
  if (auto it = feeders_.find(config.name); it != feeders_.end()) {
    if (it->second->real_root() != real_root) {
      return InvalidArgument("stream '" + config.name + "' is fed by a watch of " + it->second->real_root() +
                             ", not of " + real_root);
    }
    SPDL_RETURN_IF_ERROR(it->second->stream()->CheckAccess(spec.uid));
    return it->second->stream();
  }
  SPDL_ASSIGN_OR_RETURN(std::unique_ptr<io::DirWatcher> watcher,
                        io::DirWatcher::Open(real_root, spec.allowed_roots, spec.options, spec.identity));
  SPDL_ASSIGN_OR_RETURN(std::shared_ptr<streams::Stream> stream, streams_->Define(config, spec.uid));
  auto feeder = std::make_unique<WatchFeeder>(std::move(watcher), stream, spec.max_sample_bytes);
  feeders_[config.name] = std::move(feeder);
  spdlog::info("watch {}: feeding stream {} (uid {})", real_root, config.name, spec.uid);
  return stream;
}

std::vector<WatchFeeder::Stats> WatchHub::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WatchFeeder::Stats> out;
  out.reserve(feeders_.size());
  for (const auto& [name, f] : feeders_) out.push_back(f->stats());
  return out;
}

void WatchHub::StopAll() {
  std::map<std::string, std::unique_ptr<WatchFeeder>> feeders;
  {
    std::lock_guard<std::mutex> lock(mu_);
    feeders.swap(feeders_);
  }
  feeders.clear();  // each joins its thread, outside mu_
}

}  // namespace spdl::jobs
