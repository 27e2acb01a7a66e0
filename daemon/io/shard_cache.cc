#include "io/shard_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/errno_text.h"

namespace spdl::io {
namespace {

constexpr char kMagic[] = "spdld-shard-cache 1";
constexpr uint64_t kPrime = 0x100000001b3ULL;

uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// A 64-bit checksum of a byte stream, the same whatever the chunking: four FNV-style lanes over
// 32-byte blocks, the tail byte by byte, the length mixed in. Not cryptographic: it detects a
// damaged or truncated file, not a forged one (the cache directory is the daemon user's, 0700).
class Checksum {
 public:
  void Update(const uint8_t* d, size_t n) {
    total_ += n;
    if (pending_ > 0) {
      const size_t take = std::min(n, sizeof(buf_) - pending_);
      std::memcpy(buf_ + pending_, d, take);
      pending_ += take;
      d += take;
      n -= take;
      if (pending_ < sizeof(buf_)) return;
      Block(buf_);
      pending_ = 0;
    }
    while (n >= sizeof(buf_)) {
      Block(d);
      d += sizeof(buf_);
      n -= sizeof(buf_);
    }
    std::memcpy(buf_, d, n);
    pending_ = n;
  }
  uint64_t Final() const {
    uint64_t h = lanes_[0] ^ Rotl(lanes_[1], 17) ^ Rotl(lanes_[2], 31) ^ Rotl(lanes_[3], 47);
    for (size_t i = 0; i < pending_; ++i) h = (h ^ buf_[i]) * kPrime;
    h = (h ^ total_) * kPrime;
    return h ^ (h >> 29);
  }

 private:
  void Block(const uint8_t* p) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + 8 * l, 8);
      lanes_[l] = Rotl((lanes_[l] ^ w) * kPrime, 23);
    }
  }
  uint64_t lanes_[4] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL, 0x9ce484222325cbf2ULL, 0x2325cbf29ce48422ULL};
  uint8_t buf_[32];
  size_t pending_ = 0;
  uint64_t total_ = 0;
};

uint64_t Fnv64(const std::string& s, uint64_t h) {
  for (unsigned char c : s) h = (h ^ c) * kPrime;
  return h;
}

std::string Hex(uint64_t v) {
  static const char* kHex = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<size_t>(i)] = kHex[v & 15];
  return s;
}

struct Stamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  ino_t ino = 0;
  bool operator==(const Stamp&) const = default;
};

Stamp StampOf(const struct stat& st) {
  return Stamp{static_cast<uint64_t>(st.st_size),
               static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
               static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec, st.st_ino};
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status WriteAll(int fd, const void* data, size_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return ErrnoStatus("write", w < 0 ? errno : EIO);
    done += static_cast<size_t>(w);
  }
  return Status::Ok();
}

// The checksum and size of the file `fd` (read through, 1 MiB at a time).
Status HashFile(int fd, uint64_t* size, uint64_t* sum) {
  Checksum c;
  std::vector<uint8_t> buf(size_t{1} << 20);
  uint64_t off = 0;
  for (;;) {
    const ssize_t r = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoStatus("read", errno);
    if (r == 0) break;
    c.Update(buf.data(), static_cast<size_t>(r));
    off += static_cast<uint64_t>(r);
  }
  *size = off;
  *sum = c.Final();
  return Status::Ok();
}

}  // namespace

struct ShardCache::Handle::Entry {
  std::string key;
  std::string name;  // the files' base name in the directory
  int fd = -1;       // constant after creation
  // Guarded by Impl::mu.
  uint64_t have = 0;
  bool done = false;  // the fetch ended (error says how)
  Status error;
  uint64_t checksum = 0;
  bool checked = false;   // on disk: matched its checksum at `stamp`
  bool checking = false;  // an Acquire is hashing it: others wait
  Stamp stamp;
  int pins = 0;
  uint64_t last_use = 0;
  bool in_table = true;
  ~Entry() {
    if (fd >= 0) ::close(fd);
  }
};

struct ShardCache::Handle::Impl {
  std::string dir;  // "" = in memory
  uint64_t budget = 0;
  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu.
  std::unordered_map<std::string, std::shared_ptr<Entry>> table;
  bool enabled = true;
  bool warned = false;
  int downloads = 0;
  uint64_t tick = 0;
  uint64_t bytes = 0;
  Counters counters;

  std::string PathOf(const std::string& name, const char* ext) const { return dir + "/" + name + ext; }

  // REQUIRES: mu held.
  void Disable(const std::string& why) {
    enabled = false;
    if (!warned) {
      warned = true;
      spdlog::warn("shard cache {}: {}; remote shards are streamed without the cache", dir, why);
    }
  }

  // Takes `e` out of the table and deletes its files. REQUIRES: mu held.
  void Drop(const std::shared_ptr<Entry>& e) {
    if (!e->in_table) return;
    e->in_table = false;
    bytes -= e->have;
    table.erase(e->key);
    if (!dir.empty()) {
      ::unlink(PathOf(e->name, ".meta").c_str());
      ::unlink(PathOf(e->name, ".tar").c_str());
      ::unlink(PathOf(e->name, ".part").c_str());
    }
  }

  // Evicts least recently acquired, complete, unpinned entries while over the budget. REQUIRES: mu held.
  void Trim() {
    while (bytes > budget) {
      std::shared_ptr<Entry> victim;
      for (const auto& [key, e] : table) {
        if (e->pins > 0 || !e->done || e->checking) continue;
        if (!victim || e->last_use < victim->last_use) victim = e;
      }
      if (!victim) return;
      Drop(victim);
      ++counters.evictions;
    }
  }

  // The download thread of `e`.
  void Run(const std::shared_ptr<Entry>& e, const Fetch& fetch) {
    Checksum sum;
    uint64_t pos = 0;
    Status write_error;
    const Sink sink = [&](const uint8_t* d, size_t n) {
      if (stopping.load(std::memory_order_relaxed)) return false;
      if (Status w = WriteAll(e->fd, d, n, pos); !w.ok()) {
        write_error = std::move(w);
        return false;
      }
      sum.Update(d, n);
      pos += n;
      {
        std::lock_guard lock(mu);
        e->have = pos;
        if (e->in_table) bytes += n;
        counters.fetched_bytes += n;
      }
      cv.notify_all();
      return true;
    };
    Status s = fetch(sink);
    if (!write_error.ok()) {
      s = Unavailable("shard cache " + dir + ": " + write_error.message());
    } else if (s.ok() && !dir.empty()) {
      // The entry is complete: its metadata, then its final name (a file without metadata is a
      // partial one, deleted at the next start).
      const std::string meta =
          std::string(kMagic) + "\n" + std::to_string(pos) + "\n" + Hex(sum.Final()) + "\n" + e->key;
      const std::string tmp = PathOf(e->name, ".meta.tmp");
      const int mfd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      Status w = mfd < 0 ? ErrnoStatus("create " + tmp, errno) : WriteAll(mfd, meta.data(), meta.size(), 0);
      if (mfd >= 0) ::close(mfd);
      if (w.ok() && ::rename(PathOf(e->name, ".part").c_str(), PathOf(e->name, ".tar").c_str()) != 0) {
        w = ErrnoStatus("rename " + PathOf(e->name, ".part"), errno);
      }
      if (w.ok() && ::rename(tmp.c_str(), PathOf(e->name, ".meta").c_str()) != 0) {
        w = ErrnoStatus("rename " + tmp, errno);
      }
      if (!w.ok()) {
        ::unlink(tmp.c_str());
        write_error = w;
        s = Unavailable("shard cache " + dir + ": " + w.message());
      }
    }
    struct stat st {};
    const bool have_stat = ::fstat(e->fd, &st) == 0;
    {
      std::lock_guard lock(mu);
      e->done = true;
      if (s.ok()) {
        e->checksum = sum.Final();
        e->checked = have_stat;
        if (have_stat) e->stamp = StampOf(st);
      } else {
        e->error = std::move(s);
        Drop(e);
        if (!write_error.ok() && !dir.empty()) Disable(write_error.message());
      }
      --downloads;
      Trim();
    }
    cv.notify_all();
  }

  // Hashes e's file and compares it with what was recorded. Called with mu released, e pinned
  // and marked checking.
  bool Verify(const Entry& e, uint64_t want_size, uint64_t want_sum, std::string* why) const {
    uint64_t size = 0;
    uint64_t sum = 0;
    if (Status s = HashFile(e.fd, &size, &sum); !s.ok()) {
      *why = s.message();
      return false;
    }
    if (size != want_size) {
      *why = std::to_string(size) + " bytes, " + std::to_string(want_size) + " recorded";
      return false;
    }
    if (sum != want_sum) {
      *why = "checksum " + Hex(sum) + ", " + Hex(want_sum) + " recorded";
      return false;
    }
    return true;
  }

  // Loads the complete entries a previous run left in dir; deletes partial and stray files.
  void Load() {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return;
    std::vector<std::string> names;
    while (const dirent* ent = ::readdir(d)) names.emplace_back(ent->d_name);
    ::closedir(d);
    struct Loaded {
      std::shared_ptr<Entry> e;
      int64_t mtime_ns;
    };
    std::vector<Loaded> loaded;
    std::unordered_map<std::string, bool> kept;  // base names with a good entry
    for (const std::string& n : names) {
      if (!EndsWith(n, ".meta")) continue;
      const std::string base = n.substr(0, n.size() - 5);
      std::string text;
      {
        const int fd = ::open((dir + "/" + n).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        char buf[4096];
        for (;;) {
          const ssize_t r = ::read(fd, buf, sizeof(buf));
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0 || text.size() > 65536) break;
          text.append(buf, static_cast<size_t>(r));
        }
        ::close(fd);
      }
      // magic \n size \n checksum \n key
      const size_t a = text.find('\n');
      const size_t b = a == std::string::npos ? a : text.find('\n', a + 1);
      const size_t c = b == std::string::npos ? b : text.find('\n', b + 1);
      if (c == std::string::npos || text.substr(0, a) != kMagic) continue;
      auto e = std::make_shared<Entry>();
      e->key = text.substr(c + 1);
      e->name = base;
      if (e->key.empty() || FileName(e->key) != base) continue;
      const uint64_t size = std::strtoull(text.substr(a + 1, b - a - 1).c_str(), nullptr, 10);
      e->checksum = std::strtoull(text.substr(b + 1, c - b - 1).c_str(), nullptr, 16);
      e->fd = ::open(PathOf(base, ".tar").c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      if (e->fd < 0 || ::fstat(e->fd, &st) != 0 || static_cast<uint64_t>(st.st_size) != size) continue;
      struct stat mst {};
      const int64_t mtime = ::stat((dir + "/" + n).c_str(), &mst) == 0
                                ? static_cast<int64_t>(mst.st_mtim.tv_sec) * 1'000'000'000 + mst.st_mtim.tv_nsec
                                : 0;
      e->have = size;
      e->done = true;
      e->checked = false;  // hashed again at its first use
      e->stamp = StampOf(st);
      kept[base] = true;
      loaded.push_back(Loaded{std::move(e), mtime});
    }
    for (const std::string& n : names) {
      if (n == "." || n == "..") continue;
      const size_t dot = n.find('.');
      const std::string base = dot == std::string::npos ? n : n.substr(0, dot);
      if (kept.count(base) > 0 && (EndsWith(n, ".meta") || EndsWith(n, ".tar"))) continue;
      ::unlink((dir + "/" + n).c_str());  // partial downloads, entries that failed to load
    }
    std::sort(loaded.begin(), loaded.end(), [](const Loaded& x, const Loaded& y) { return x.mtime_ns < y.mtime_ns; });
    std::lock_guard lock(mu);
    for (Loaded& l : loaded) {
      l.e->last_use = ++tick;
      bytes += l.e->have;
      table.emplace(l.e->key, std::move(l.e));
    }
    Trim();
    spdlog::info("shard cache {}: {} shards, {} bytes kept from before (budget {} bytes)", dir, table.size(), bytes,
                 budget);
  }
};

ShardCache::Handle::Handle(std::shared_ptr<Impl> impl, std::shared_ptr<Entry> entry, bool hit)
    : impl_(std::move(impl)), entry_(std::move(entry)), hit_(hit) {}

ShardCache::Handle::~Handle() {
  std::lock_guard lock(impl_->mu);
  --entry_->pins;
  impl_->Trim();
}

Result<uint64_t> ShardCache::Handle::WaitFor(uint64_t end) const {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return entry_->have >= end || entry_->done; });
  if (entry_->have >= end) return entry_->have;
  if (!entry_->error.ok()) return entry_->error;
  return entry_->have;
}

Result<uint64_t> ShardCache::Handle::WaitComplete() const {
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return entry_->done; });
  if (!entry_->error.ok()) return entry_->error;
  return entry_->have;
}

int ShardCache::Handle::fd() const { return entry_->fd; }

Status ShardCache::Handle::Read(uint64_t offset, uint64_t n, std::vector<uint8_t>* out) const {
  out->clear();
  SPDL_ASSIGN_OR_RETURN(const uint64_t have, WaitFor(offset + n));
  if (have < offset + n) {
    return DataLoss("the object has " + std::to_string(have) + " bytes, not the " + std::to_string(offset + n) +
                    " a read needs");
  }
  out->resize(n);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(entry_->fd, out->data() + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      out->clear();
      return ErrnoStatus("shard cache read", r < 0 ? errno : EIO);
    }
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

ShardCache::ShardCache(std::shared_ptr<Impl> impl, std::string dir) : impl_(std::move(impl)), dir_(std::move(dir)) {}

ShardCache::~ShardCache() {
  impl_->stopping.store(true);
  // A job's private stream does not wait: its downloads own what they use and end at their next
  // bytes (or their transfer's timeout), so a stalled one never holds up the thread dropping the job.
  if (dir_.empty()) return;
  std::unique_lock lock(impl_->mu);
  impl_->cv.wait(lock, [&] { return impl_->downloads == 0; });
}

std::shared_ptr<ShardCache> ShardCache::InMemory(uint64_t budget_bytes) {
  auto impl = std::make_shared<Impl>();
  impl->budget = budget_bytes;
  return std::shared_ptr<ShardCache>(new ShardCache(std::move(impl), ""));
}

std::shared_ptr<ShardCache> ShardCache::OnDisk(const std::string& dir_in, uint64_t budget_bytes) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  auto impl = std::make_shared<Impl>();
  impl->dir = dir;
  impl->budget = budget_bytes;
  std::string problem;
  if (dir.empty() || dir[0] != '/') {
    problem = "not an absolute path";
  } else if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    problem = std::string("cannot create it: ") + ErrnoText(errno);
  } else {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0) {
      problem = std::string("cannot stat it: ") + ErrnoText(errno);
    } else if (!S_ISDIR(st.st_mode)) {
      problem = "not a directory";
    } else if (st.st_uid != ::geteuid()) {
      problem = "owned by uid " + std::to_string(st.st_uid) + ", not by the daemon's user (" +
                std::to_string(::geteuid()) + ")";
    } else if ((st.st_mode & 07777) != 0700 && ::chmod(dir.c_str(), 0700) != 0) {
      problem = std::string("cannot set its mode to 0700: ") + ErrnoText(errno);
    } else {
      const std::string probe = dir + "/.probe";
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd < 0) {
        problem = std::string("not writable: ") + ErrnoText(errno);
      } else {
        ::close(fd);
        ::unlink(probe.c_str());
      }
    }
  }
  if (!problem.empty()) {
    std::lock_guard lock(impl->mu);
    impl->Disable(problem);
  } else {
    impl->Load();
  }
  return std::shared_ptr<ShardCache>(new ShardCache(std::move(impl), dir));
}

bool ShardCache::enabled() const {
  std::lock_guard lock(impl_->mu);
  return impl_->enabled;
}

std::string ShardCache::FileName(const std::string& key) {
  return Hex(Fnv64(key, 0xcbf29ce484222325ULL)) + Hex(Fnv64(key, 0x6c62272e07bb0142ULL));
}

ShardCache::Counters ShardCache::counters() const {
  std::lock_guard lock(impl_->mu);
  Counters c = impl_->counters;
  c.bytes = impl_->bytes;
  c.budget = impl_->budget;
  c.entries = impl_->table.size();
  return c;
}

Result<std::shared_ptr<const ShardCache::Handle>> ShardCache::Acquire(const std::string& key, Fetch fetch) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  if (!m.enabled) return FailedPrecondition("shard cache " + m.dir + ": disabled (see the daemon's log)");
  for (;;) {
    auto it = m.table.find(key);
    if (it == m.table.end()) break;
    std::shared_ptr<Entry> e = it->second;
    if (e->checking) {
      m.cv.wait(lock);
      continue;
    }
    if (!m.dir.empty() && e->done && e->pins == 0) {
      struct stat st {};
      const bool same = ::fstat(e->fd, &st) == 0 && StampOf(st) == e->stamp;
      if (!same || !e->checked) {
        e->checking = true;
        ++e->pins;
        const uint64_t size = e->have;
        const uint64_t sum = e->checksum;
        lock.unlock();
        std::string why;
        const bool ok = m.Verify(*e, size, sum, &why);
        struct stat after {};
        const bool have_stat = ::fstat(e->fd, &after) == 0;
        lock.lock();
        e->checking = false;
        --e->pins;
        m.cv.notify_all();
        if (!ok || !have_stat) {
          ++m.counters.corrupt;
          spdlog::warn("shard cache {}: entry {} failed its check ({}): dropped, fetching it again", m.dir, e->name,
                       why);
          m.Drop(e);
          continue;
        }
        e->checked = true;
        e->stamp = StampOf(after);
      }
    }
    ++e->pins;
    e->last_use = ++m.tick;
    ++m.counters.hits;
    return std::shared_ptr<const Handle>(new Handle(impl_, std::move(e), true));
  }
  auto e = std::make_shared<Entry>();
  e->key = key;
  e->name = FileName(key);
  if (m.dir.empty()) {
    e->fd = ::memfd_create("spdld-shard", MFD_CLOEXEC);
    if (e->fd < 0) return ErrnoStatus("shard stream: memfd_create", errno);
  } else {
    const std::string part = m.PathOf(e->name, ".part");
    e->fd = ::open(part.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (e->fd < 0) {
      const int err = errno;
      m.Disable("cannot create " + part + ": " + ErrnoText(err));
      return FailedPrecondition("shard cache " + m.dir + ": disabled (cannot create a file)");
    }
  }
  e->pins = 1;
  e->last_use = ++m.tick;
  ++m.counters.misses;
  ++m.downloads;
  m.table.emplace(key, e);
  m.Trim();
  std::thread([impl = impl_, e, fetch = std::move(fetch)] { impl->Run(e, fetch); }).detach();
  return std::shared_ptr<const Handle>(new Handle(impl_, std::move(e), false));
}

}  // namespace spdl::io
