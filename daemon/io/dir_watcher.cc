#include "io/dir_watcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <utility>

#include "common/ascii.h"
#include "io/allowed_roots.h"

namespace spdl::io {
namespace {

// Events of the root: class folders coming and going (files directly in the root are ignored).
constexpr uint32_t kRootMask =
    IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_DELETE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK;
// Events of a directory below a class folder: files completed, moved in or out, deleted; directories.
constexpr uint32_t kDirMask =
    IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ONLYDIR | IN_EXCL_UNLINK;
// Poll reads at most this many buffers of events per call, so that a flood cannot hold it for ever.
constexpr int kMaxReadsPerPoll = 64;

std::string Join(const std::string& dir, const std::string& name) { return dir == "." ? name : dir + "/" + name; }

bool Below(const std::string& path, const std::string& dir) {
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 && path[dir.size()] == '/';
}

// Whether a process holds the open file `fd` open for writing: a read lease is refused (EAGAIN)
// exactly then. The lease is released at once. Lease breaks are signalled to the holder; SIGWINCH
// (ignored by default, handled by nothing in the daemon) replaces the default SIGIO, which would
// end the process, for the microseconds the lease is held.
enum class Writers { kNone, kSome, kUnknown };
Writers OpenForWriting(int fd) {
  if (::fcntl(fd, F_SETSIG, SIGWINCH) != 0) return Writers::kUnknown;
  if (::fcntl(fd, F_SETLEASE, F_RDLCK) == 0) {
    (void)::fcntl(fd, F_SETLEASE, F_UNLCK);
    return Writers::kNone;
  }
  return errno == EAGAIN ? Writers::kSome : Writers::kUnknown;
}

}  // namespace

Result<std::unique_ptr<DirWatcher>> DirWatcher::Open(const std::string& root,
                                                     const std::vector<std::string>& allowed_roots,
                                                     DirWatchOptions options,
                                                     std::shared_ptr<const FsIdentity> identity) {
  const std::string what = "watched folder " + root;
  if (options.extensions.empty()) return InvalidArgument(what + ": no file extensions given");
  std::vector<std::string> lower_exts;
  for (const std::string& e : options.extensions) {
    if (e.empty() || e == ".") return InvalidArgument(what + ": empty file extension");
    lower_exts.push_back(AsciiLower(e[0] == '.' ? e : "." + e));
  }
  {
    std::set<std::string> names;
    for (const std::string& c : options.classes) {
      if (c.empty() || c[0] == '.' || c.find('/') != std::string::npos) {
        return InvalidArgument(what + ": classes: \"" + c + "\" is not a folder name (no '/', not empty, not hidden)");
      }
      if (!names.insert(c).second) return InvalidArgument(what + ": classes: \"" + c + "\" is named twice");
    }
  }
  ScopedFsIdentity as(identity.get());
  if (!as.ok()) return Internal("spdld could not act as the job's user: " + as.status().message());
  SPDL_ASSIGN_OR_RETURN(std::string real_root, ResolveUnderRoots(root, allowed_roots));
  struct stat st {};
  if (::stat(real_root.c_str(), &st) != 0) return ErrnoStatus(what, errno);
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(what + ": the root is not a directory");
  SPDL_ASSIGN_OR_RETURN(std::shared_ptr<const RootDir> dir, RootDir::Open(real_root));

  UniqueFd inotify(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!inotify) return ErrnoStatus(what + ": inotify_init1 (fs.inotify.max_user_instances?)", errno);
  UniqueFd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake) return ErrnoStatus(what + ": eventfd", errno);
  SPDL_ASSIGN_OR_RETURN(UniqueFd root_fd, dir->OpenBeneathWith(".", O_PATH | O_DIRECTORY));
  const bool include = options.include_existing;
  std::unique_ptr<DirWatcher> w(new DirWatcher(std::move(dir), std::move(options), std::move(lower_exts),
                                               std::move(identity), std::move(inotify), std::move(wake),
                                               std::move(root_fd)));
  SPDL_RETURN_IF_ERROR(w->WatchAndScan(".", -1, include));
  SPDL_RETURN_IF_ERROR(w->ScanRootForClasses(include));
  w->PublishStats();
  return w;
}

DirWatcher::DirWatcher(std::shared_ptr<const RootDir> root, DirWatchOptions options,
                       std::vector<std::string> lower_exts, std::shared_ptr<const FsIdentity> identity,
                       UniqueFd inotify, UniqueFd wake, UniqueFd root_fd)
    : root_(std::move(root)),
      options_(std::move(options)),
      lower_exts_(std::move(lower_exts)),
      identity_(std::move(identity)),
      inotify_(std::move(inotify)),
      wake_(std::move(wake)),
      root_fd_(std::move(root_fd)) {
  for (const std::string& c : options_.classes) {
    label_of_[c] = static_cast<int64_t>(classes_.size());
    classes_.push_back(c);
  }
}

DirWatcher::~DirWatcher() = default;

bool DirWatcher::Matches(const std::string& name) const {
  if (name.empty() || name[0] == '.') return false;
  const std::string lower = AsciiLower(name);
  for (const std::string& ext : lower_exts_) {
    if (lower.size() > ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0) return true;
  }
  return false;
}

// Watches directory `rel` (the root when "."), then lists it: below a class folder (label >= 0)
// its matching files are considered and its sub-directories watched and listed in turn. The root's
// entries are left to ScanRootForClasses. The watch comes first, so that nothing created during
// the listing is missed (found twice at most: Consider reports once).
Status DirWatcher::WatchAndScan(const std::string& rel, int64_t label, bool report) {
  const std::string shown = Join(root_->path(), rel == "." ? "" : rel);
  auto fd = root_->OpenBeneathWith(rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK);
  if (!fd.ok()) {
    // Gone or replaced by a link since it was seen: nothing to watch (a link is not followed).
    if (rel != "." &&
        (fd.status().code() == StatusCode::kNotFound || fd.status().code() == StatusCode::kInvalidArgument)) {
      return Status::Ok();
    }
    return fd.status();
  }
  const std::string proc = "/proc/self/fd/" + std::to_string(fd->get());
  const int wd = ::inotify_add_watch(inotify_.get(), proc.c_str(), rel == "." ? kRootMask : kDirMask);
  if (wd < 0) {
    const int err = errno;
    if (err == ENOSPC) {
      return ResourceExhausted("cannot watch " + shown +
                               ": the kernel's limit of inotify watches is reached (raise the sysctl "
                               "fs.inotify.max_user_watches)");
    }
    return ErrnoStatus("cannot watch " + shown, err);
  }
  if (auto old = wd_of_.find(rel); old != wd_of_.end() && old->second != wd) dirs_.erase(old->second);
  wd_of_[rel] = wd;
  dirs_[wd] = Dir{rel, label};
  if (rescan_dirs_ != nullptr) rescan_dirs_->insert(rel);
  if (rel == ".") return Status::Ok();

  DIR* d = ::fdopendir(fd->get());
  if (d == nullptr) return ErrnoStatus("cannot read directory " + shown, errno);
  (void)fd->release();  // owned by d now
  struct Entry {
    std::string name;
    unsigned char type;
  };
  std::vector<Entry> entries;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (e->d_name[0] != '.') entries.push_back(Entry{e->d_name, e->d_type});
  }
  const int err = errno;
  const int dfd = ::dirfd(d);
  // Types the listing did not give: asked without following links.
  for (Entry& e : entries) {
    if (e.type != DT_UNKNOWN) continue;
    struct stat st {};
    if (::fstatat(dfd, e.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    e.type = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_LNK;
  }
  ::closedir(d);
  if (err != 0) return ErrnoStatus("cannot read directory " + shown, err);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  Status first;
  for (const Entry& e : entries) {
    const std::string child = Join(rel, e.name);
    if (e.type == DT_DIR) {
      Status s = WatchAndScan(child, label, report);
      if (!s.ok() && first.ok()) first = s;
    } else if (e.type == DT_REG && Matches(e.name)) {
      Consider(child, label, /*from_scan=*/true, report);
    }
  }
  return first;
}

Status DirWatcher::AddClassFolder(const std::string& name, bool report) {
  int64_t label;
  if (auto it = label_of_.find(name); it != label_of_.end()) {
    label = it->second;
  } else if (!options_.classes.empty()) {
    ignored_.insert(name);
    return Status::Ok();
  } else {
    label = static_cast<int64_t>(classes_.size());
    classes_.push_back(name);
    label_of_[name] = label;
  }
  const size_t start = ready_.size();
  Status s = WatchAndScan(name, label, report);
  // A class's files in path order, as image_folder orders them.
  std::sort(ready_.begin() + static_cast<std::ptrdiff_t>(start), ready_.end(),
            [](const WatchedFile& a, const WatchedFile& b) { return a.path < b.path; });
  return s;
}

// Lists the root: every class folder (a sub-directory, not a link, not hidden) is watched and
// listed, new ones taking the next labels in name order.
Status DirWatcher::ScanRootForClasses(bool report) {
  auto fd = root_->OpenBeneathWith(".", O_RDONLY | O_DIRECTORY | O_NONBLOCK);
  if (!fd.ok()) return fd.status();
  DIR* d = ::fdopendir(fd->get());
  if (d == nullptr) return ErrnoStatus("cannot read directory " + root_->path(), errno);
  (void)fd->release();
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (e->d_name[0] == '.') continue;
    bool dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st {};
      dir = ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    if (dir) names.emplace_back(e->d_name);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoStatus("cannot read directory " + root_->path(), err);
  std::sort(names.begin(), names.end());
  // Known classes in label order first, then the new ones in name order: the first Poll's order.
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    auto la = label_of_.find(a), lb = label_of_.find(b);
    const int64_t ka = la == label_of_.end() ? INT64_MAX : la->second;
    const int64_t kb = lb == label_of_.end() ? INT64_MAX : lb->second;
    return ka < kb;
  });
  Status first;
  for (const std::string& n : names) {
    Status s = AddClassFolder(n, report);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

// A file `rel` seen by an event or a listing: reported when it is a regular file (not a link),
// complete, and not reported already under this name with this inode; otherwise remembered as
// pending (being written) or left alone.
void DirWatcher::Consider(const std::string& rel, int64_t label, bool from_scan, bool report) {
  if (rescan_files_ != nullptr) rescan_files_->insert(rel);
  auto fd = root_->OpenBeneathWith(rel, O_RDONLY | O_NONBLOCK | O_NOFOLLOW);
  if (!fd.ok()) return;  // gone again, a link, unreadable: not a file of the folder's
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0 || !S_ISREG(st.st_mode)) return;
  const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
  if (auto it = reported_.find(rel); it != reported_.end() && it->second == id) {
    pending_.erase(rel);
    return;
  }
  // Just created (by open(2) with O_CREAT, before the writer holds it for writing) or still empty:
  // its close will say when it is complete.
  if (from_scan && st.st_size == 0) {
    pending_.insert(rel);
    return;
  }
  switch (OpenForWriting(fd->get())) {
    case Writers::kSome:
      pending_.insert(rel);
      return;
    case Writers::kUnknown:
      ++leases_refused_;
      break;
    case Writers::kNone:
      break;
  }
  reported_[rel] = id;
  pending_.erase(rel);
  if (!report) return;
  ready_.push_back(WatchedFile{rel, label, static_cast<uint64_t>(st.st_size), st.st_dev, st.st_ino});
  ++files_reported_;
}

// Forgets directory `rel` and everything below it (moved out of the tree or deleted): its watches
// are removed, its files forgotten.
void DirWatcher::ForgetBelow(const std::string& rel) {
  for (auto it = wd_of_.lower_bound(rel); it != wd_of_.end() && (it->first == rel || Below(it->first, rel));) {
    (void)::inotify_rm_watch(inotify_.get(), it->second);  // the directory may be gone already
    dirs_.erase(it->second);
    it = wd_of_.erase(it);
  }
  for (auto it = reported_.lower_bound(rel); it != reported_.end() && Below(it->first, rel);) it = reported_.erase(it);
  for (auto it = pending_.lower_bound(rel); it != pending_.end() && Below(*it, rel);) it = pending_.erase(it);
}

void DirWatcher::ForgetDir(int wd) {
  auto it = dirs_.find(wd);
  if (it == dirs_.end()) return;
  if (auto w = wd_of_.find(it->second.rel); w != wd_of_.end() && w->second == wd) wd_of_.erase(w);
  dirs_.erase(it);
}

Status DirWatcher::HandleEvents(const char* buf, size_t len, bool* overflow) {
  Status first;
  for (size_t off = 0; off + sizeof(inotify_event) <= len;) {
    const auto* ev = reinterpret_cast<const inotify_event*>(buf + off);
    off += sizeof(inotify_event) + ev->len;
    if (ev->mask & IN_Q_OVERFLOW) {
      *overflow = true;
      continue;
    }
    auto dit = dirs_.find(ev->wd);
    if (dit == dirs_.end()) continue;  // a watch already forgotten
    const Dir dir = dit->second;       // a copy: the handlers below may change dirs_
    if (ev->mask & (IN_IGNORED | IN_DELETE_SELF)) {
      if (dir.rel == ".") {
        failed_ = NotFound("the watched folder " + root_->path() + " was deleted");
        return failed_;
      }
      if (ev->mask & IN_IGNORED) ForgetDir(ev->wd);
      continue;
    }
    if (ev->len == 0) continue;
    const std::string name(ev->name);  // NUL-padded
    if (name.empty() || name[0] == '.') continue;
    const std::string child = Join(dir.rel, name);
    Status s;
    if (ev->mask & IN_ISDIR) {
      if (ev->mask & (IN_CREATE | IN_MOVED_TO)) {
        s = dir.rel == "." ? AddClassFolder(name, true) : WatchAndScan(child, dir.label, true);
      } else if (ev->mask & (IN_DELETE | IN_MOVED_FROM)) {
        ForgetBelow(child);
      }
    } else if (dir.rel != ".") {  // files directly in the root are not samples
      if (ev->mask & (IN_DELETE | IN_MOVED_FROM)) {
        reported_.erase(child);
        pending_.erase(child);
      } else if (Matches(name)) {
        // IN_CREATE: a new name (open(2) with O_CREAT, a hard link): complete only when not empty
        // and not open for writing, as for a listing. IN_CLOSE_WRITE, IN_MOVED_TO: complete unless
        // another writer still holds it.
        Consider(child, dir.label, /*from_scan=*/(ev->mask & IN_CREATE) != 0, true);
      }
    }
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

// After an overflow: lists the whole tree again. Files missed are reported, files reported are
// not reported again (Consider), directories and files that vanished unseen are forgotten.
Status DirWatcher::Rescan() {
  std::set<std::string> files, dirs;
  rescan_files_ = &files;
  rescan_dirs_ = &dirs;
  Status s = WatchAndScan(".", -1, true);
  if (s.ok()) s = ScanRootForClasses(true);
  rescan_files_ = nullptr;
  rescan_dirs_ = nullptr;
  if (!s.ok()) return s;  // a partial listing: forget nothing
  for (auto it = wd_of_.begin(); it != wd_of_.end();) {
    if (dirs.count(it->first) != 0) {
      ++it;
      continue;
    }
    (void)::inotify_rm_watch(inotify_.get(), it->second);
    dirs_.erase(it->second);
    it = wd_of_.erase(it);
  }
  for (auto it = reported_.begin(); it != reported_.end();)
    it = files.count(it->first) ? std::next(it) : reported_.erase(it);
  for (auto it = pending_.begin(); it != pending_.end();) it = files.count(*it) ? std::next(it) : pending_.erase(it);
  return Status::Ok();
}

Status DirWatcher::Poll(int timeout_ms, std::vector<WatchedFile>* out) {
  if (!failed_.ok()) return failed_;
  ScopedFsIdentity as(identity_.get());
  if (!as.ok()) return Internal("spdld could not act as the job's user: " + as.status().message());
  // A deleted root sends IN_DELETE_SELF only once its last reference is gone (the watcher holds
  // one): its link count says so at once.
  if (struct stat st{}; ::fstat(root_fd_.get(), &st) == 0 && st.st_nlink == 0) {
    failed_ = NotFound("the watched folder " + root_->path() + " was deleted");
    return failed_;
  }
  pollfd fds[2] = {{inotify_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
  const int n = ::poll(fds, 2, ready_.empty() ? timeout_ms : 0);
  if (n < 0 && errno != EINTR) return ErrnoStatus("poll of the watched folder " + root_->path(), errno);
  if (n > 0 && (fds[1].revents & POLLIN)) {
    uint64_t v;
    (void)!::read(wake_.get(), &v, sizeof v);
  }
  Status first;
  bool overflow = false;
  if (n > 0 && (fds[0].revents & POLLIN)) {
    alignas(inotify_event) char buf[64 * 1024];
    for (int i = 0; i < kMaxReadsPerPoll; ++i) {
      const ssize_t got = ::read(inotify_.get(), buf, sizeof buf);
      if (got <= 0) break;  // EAGAIN: drained
      Status s = HandleEvents(buf, static_cast<size_t>(got), &overflow);
      if (!failed_.ok()) break;
      if (!s.ok() && first.ok()) first = s;
    }
  }
  if (overflow && failed_.ok()) {
    ++overflows_;
    Status s = Rescan();
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  out->insert(out->end(), std::make_move_iterator(ready_.begin()), std::make_move_iterator(ready_.end()));
  ready_.clear();
  PublishStats();
  if (!failed_.ok()) return failed_;
  return first;
}

void DirWatcher::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

Status DirWatcher::Read(const WatchedFile& file, std::vector<uint8_t>* out, size_t max_bytes) const {
  out->clear();
  ScopedFsIdentity as(identity_.get());
  if (!as.ok()) return Internal("spdld could not read as the job's user: " + as.status().message());
  const std::string shown = root_->path() + "/" + file.path;
  SPDL_ASSIGN_OR_RETURN(UniqueFd fd, root_->OpenBeneathWith(file.path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(shown, errno);
  if (st.st_dev != file.dev || st.st_ino != file.ino) {
    return NotFound(shown + " was replaced since it was found complete (the new file is taken on its own)");
  }
  return ReadOpenFile(fd.get(), shown, out, max_bytes);
}

void DirWatcher::PublishStats() {
  stat_reported_.store(files_reported_, std::memory_order_relaxed);
  stat_pending_.store(pending_.size(), std::memory_order_relaxed);
  stat_overflows_.store(overflows_, std::memory_order_relaxed);
  stat_dirs_.store(dirs_.size(), std::memory_order_relaxed);
  stat_leases_.store(leases_refused_, std::memory_order_relaxed);
  stat_ignored_.store(ignored_.size(), std::memory_order_relaxed);
}

DirWatcher::Stats DirWatcher::stats() const {
  Stats s;
  s.files_reported = stat_reported_.load(std::memory_order_relaxed);
  s.pending = stat_pending_.load(std::memory_order_relaxed);
  s.overflows = stat_overflows_.load(std::memory_order_relaxed);
  s.watched_dirs = stat_dirs_.load(std::memory_order_relaxed);
  s.leases_refused = stat_leases_.load(std::memory_order_relaxed);
  s.ignored_folders = stat_ignored_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace spdl::io
