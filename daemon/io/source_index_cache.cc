#include "io/source_index_cache.h"

#include <spdlog/spdlog.h>
#include <time.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "common/errno_text.h"
#include "io/fs_identity.h"

namespace spdl::io {

FileStamp MakeStamp(std::string path, const struct stat& st) {
  FileStamp s;
  s.path = std::move(path);
  s.dev = st.st_dev;
  s.ino = st.st_ino;
  s.regular = S_ISREG(st.st_mode);
  s.size = s.regular ? static_cast<uint64_t>(st.st_size) : 0;
  s.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return s;
}

int64_t RealtimeNowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool SourceIndex::StillValid(std::string* why) const {
  for (const FileStamp& s : inputs) {
    if (s.mtime_ns >= scan_start_ns - kRacyWindowNs) {
      if (why) *why = s.path + " was modified too close to the scan to trust its timestamp";
      return false;
    }
  }
  for (const FileStamp& s : inputs) {
    struct stat st {};
    if (::stat(s.path.c_str(), &st) != 0) {
      if (why) *why = s.path + ": " + ErrnoText(errno);
      return false;
    }
    const FileStamp now = MakeStamp(s.path, st);
    if (now.dev != s.dev || now.ino != s.ino || now.regular != s.regular || now.size != s.size ||
        now.mtime_ns != s.mtime_ns) {
      if (why) *why = s.path + " changed";
      return false;
    }
  }
  return true;
}

std::string IndexKey(const std::vector<std::string>& parts) {
  std::string key;
  for (const std::string& p : parts) {
    key += p;
    key += '\0';
  }
  return key;
}

void SourceIndexCache::PruneLocked() {
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (!it->second.scanning && it->second.index.expired()) {
      it = slots_.erase(it);
    } else {
      ++it;
    }
  }
}

Result<std::shared_ptr<const SourceIndex>> SourceIndexCache::GetOrScan(const std::string& plain_key,
                                                                       const std::string& what, const ScanFn& scan) {
  // An index made with one user's rights is never handed to another: it may name files the other
  // cannot list (the ranks of one run, all of one user, still share).
  const std::string key = CurrentFsIdentityKey() + "\n" + plain_key;
  // The entry this call has checked outside the lock, and what the check said.
  std::shared_ptr<const SourceIndex> checked;
  bool checked_valid = false;
  std::unique_lock lock(mu_);
  for (;;) {
    PruneLocked();
    Slot& slot = slots_[key];
    if (slot.scanning) {
      std::shared_future<ScanResult> running = slot.scan;
      ++stats_.joined;
      lock.unlock();
      spdlog::debug("source index: {}: waiting for the scan in progress", what);
      return running.get();
    }
    std::shared_ptr<const SourceIndex> live = slot.index.lock();
    if (live && live != checked) {
      // Check it without the lock (stats), then look again: the slot may have moved on meanwhile.
      checked = live;
      lock.unlock();
      std::string why;
      checked_valid = live->StillValid(&why);
      if (!checked_valid) spdlog::debug("source index: {}: not reused ({})", what, why);
      lock.lock();
      continue;
    }
    if (live && checked_valid) {
      ++stats_.hits;
      spdlog::debug("source index: {}: shared ({} hits, {} scans so far)", what, stats_.hits, stats_.scans);
      return live;
    }
    // No entry, or a stale one: this call scans.
    if (live) ++stats_.stale;
    ++stats_.scans;
    std::promise<ScanResult> promise;
    slot.scanning = true;
    slot.scan = promise.get_future().share();
    lock.unlock();

    ScanResult result = Internal("source index: " + what + ": the scan threw");
    try {
      result = scan();
    } catch (const std::exception& e) {
      result = Internal("source index: " + what + ": the scan threw: " + e.what());
    } catch (...) {  // not a std::exception: no message to add
      result = Internal("source index: " + what + ": the scan threw");
    }
    if (result.ok() && *result == nullptr) result = Internal("source index: " + what + ": the scan returned nothing");

    lock.lock();
    Slot& done = slots_[key];  // still there: PruneLocked keeps scanning slots
    done.scanning = false;
    done.scan = {};
    if (result.ok()) {
      done.index = *result;
    } else {
      done.index.reset();
      ++stats_.failed;
    }
    spdlog::debug("source index: {}: scanned ({}; {} scans, {} hits, {} joined so far)", what,
                  result.ok() ? "ok" : result.status().message(), stats_.scans, stats_.hits, stats_.joined);
    lock.unlock();
    promise.set_value(result);
    return result;
  }
}

SourceIndexCache::Stats SourceIndexCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

size_t SourceIndexCache::live_entries() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [key, slot] : slots_) n += slot.index.expired() ? 0 : 1;
  return n;
}

}  // namespace spdl::io
