#include "io/read_file.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/errno_text.h"

namespace spdl::io {
namespace {

constexpr int kReadFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;

std::string Join(const std::string& root, std::string_view relative) {
  std::string p = root;
  if (p.empty() || p.back() != '/') p += '/';
  p.append(relative.data(), relative.size());
  return p;
}

Status Escapes(const std::string& root, std::string_view relative) {
  return PermissionDenied("reading " + Join(root, relative) + ": the path escapes its root " + root +
                          " (through '..', an absolute path or a symbolic link leading out of it)");
}

bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  if (path.size() < root.size() || path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

}  // namespace

bool IsResourceErrno(int err) {
  return err == EMFILE || err == ENFILE || err == ENOMEM || err == ENOBUFS || err == EIO;
}

Status IoErrnoStatus(const std::string& what, int err) {
  if (!IsResourceErrno(err)) return ErrnoStatus(what, err);
  return Unavailable(what + ": " + ErrnoText(err) +
                     " (a resource of spdld or of the node, not the sample's own bytes)");
}

Status RetryOnResourceError(const std::function<Status()>& attempt) {
  auto pause = std::chrono::milliseconds(5);
  Status s;
  for (int i = 1;; ++i) {
    s = attempt();
    if (s.code() != StatusCode::kUnavailable || i == kResourceAttempts) break;
    std::this_thread::sleep_for(pause);
    pause *= 4;
  }
  if (s.code() == StatusCode::kUnavailable) {
    return Unavailable(s.message() + "; still failing after " + std::to_string(kResourceAttempts) + " attempts");
  }
  return s;
}

Status ReadOpenFile(int fd, const std::string& name, std::vector<uint8_t>* out, size_t max_bytes) {
  out->clear();
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoErrnoStatus("reading " + name, errno);
  if (S_ISDIR(st.st_mode)) return InvalidArgument("reading " + name + ": it is a directory");
  if (!S_ISREG(st.st_mode)) return InvalidArgument("reading " + name + ": it is not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return ResourceExhausted("reading " + name + ": it is " + std::to_string(size) + " bytes, more than the limit of " +
                             std::to_string(max_bytes));
  }
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out->data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      out->clear();
      return IoErrnoStatus("reading " + name, err);
    }
    if (n == 0) break;  // shrank since fstat
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return Status::Ok();
}

Status ReadFile(const std::string& path, std::vector<uint8_t>* out, size_t max_bytes) {
  return RetryOnResourceError([&]() -> Status {
    out->clear();
    // O_NONBLOCK so that opening a fifo does not wait for a writer; it changes nothing for a
    // regular file.
    UniqueFd fd(::open(path.c_str(), kReadFlags));
    if (!fd) return IoErrnoStatus("reading " + path, errno);
    return ReadOpenFile(fd.get(), path, out, max_bytes);
  });
}

RootDir::RootDir(std::string path, std::string real_path, UniqueFd fd)
    : path_(std::move(path)), real_path_(std::move(real_path)), fd_(std::move(fd)) {}

Result<std::shared_ptr<const RootDir>> RootDir::Open(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd) {
    const int err = errno;
    if (err == ENOTDIR) return InvalidArgument(path + ": not a directory");
    return IoErrnoStatus("opening the directory " + path, err);
  }
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(path.c_str(), nullptr), &std::free);
  if (!real) return IoErrnoStatus("resolving " + path, errno);
  return std::make_shared<const RootDir>(path, std::string(real.get()), std::move(fd));
}

Result<UniqueFd> RootDir::OpenBeneath(std::string_view relative) const { return OpenBeneathWith(relative, kReadFlags); }

Result<UniqueFd> RootDir::OpenBeneathWith(std::string_view relative, int flags) const {
  const std::string rel(relative);
  struct open_how how {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long r;
  do {
    r = ::syscall(SYS_openat2, fd_.get(), rel.c_str(), &how, sizeof(how));
  } while (r < 0 && (errno == EINTR || errno == EAGAIN));
  if (r >= 0) return UniqueFd(static_cast<int>(r));
  const int err = errno;
  switch (err) {
    case ENOSYS:
    case EPERM:  // a seccomp filter that does not know openat2
      return OpenBeneathFallbackWith(relative, flags);
    case EXDEV:
      return Escapes(path_, relative);
    case ELOOP:
      return InvalidArgument("reading " + Join(path_, relative) +
                             ": a symbolic link loop (too many levels of links), or a link through /proc");
    default:
      return IoErrnoStatus("reading " + Join(path_, relative), err);
  }
}

Result<UniqueFd> RootDir::OpenBeneathFallback(std::string_view relative) const {
  return OpenBeneathFallbackWith(relative, kReadFlags);
}

Result<UniqueFd> RootDir::OpenBeneathFallbackWith(std::string_view relative, int flags) const {
  if (!relative.empty() && relative.front() == '/') return Escapes(path_, relative);
  const std::string joined = Join(real_path_, relative);
  std::unique_ptr<char, decltype(&std::free)> real(::realpath(joined.c_str(), nullptr), &std::free);
  if (!real) {
    const int err = errno;
    if (err == ELOOP) {
      return InvalidArgument("reading " + Join(path_, relative) + ": a symbolic link loop (too many levels of links)");
    }
    return IoErrnoStatus("reading " + Join(path_, relative), err);
  }
  if (!IsUnder(real.get(), real_path_)) return Escapes(path_, relative);
  UniqueFd fd(::open(real.get(), flags | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) return IoErrnoStatus("reading " + Join(path_, relative), errno);
  return fd;
}

Status RootDir::ReadFile(std::string_view relative, std::vector<uint8_t>* out, size_t max_bytes) const {
  return RetryOnResourceError([&]() -> Status {
    out->clear();
    SPDL_ASSIGN_OR_RETURN(UniqueFd fd, OpenBeneath(relative));
    return ReadOpenFile(fd.get(), Join(path_, relative), out, max_bytes);
  });
}

std::shared_ptr<const RootSet> RootSet::Open(const std::vector<std::string>& allowed_roots) {
  auto set = std::make_shared<RootSet>();
  for (const std::string& r : allowed_roots) {
    auto dir = RootDir::Open(r);
    if (dir.ok()) set->roots_.push_back(std::move(dir).value());
  }
  return set;
}

Result<UniqueFd> RootSet::OpenBeneath(const std::string& absolute) const {
  // The deepest root that holds the path, so that a root nested in another is used as given.
  const RootDir* best = nullptr;
  for (const auto& r : roots_) {
    if (IsUnder(absolute, r->real_path()) && (!best || r->real_path().size() > best->real_path().size())) {
      best = r.get();
    }
  }
  if (!best) return PermissionDenied("reading " + absolute + ": it is not below any allowed root");
  std::string_view rel(absolute);
  rel.remove_prefix(best->real_path() == "/" ? 1 : best->real_path().size());
  while (!rel.empty() && rel.front() == '/') rel.remove_prefix(1);
  if (rel.empty()) rel = ".";
  return best->OpenBeneath(rel);
}

Status RootSet::ReadFile(const std::string& absolute, std::vector<uint8_t>* out, size_t max_bytes) const {
  return RetryOnResourceError([&]() -> Status {
    out->clear();
    SPDL_ASSIGN_OR_RETURN(UniqueFd fd, OpenBeneath(absolute));
    return ReadOpenFile(fd.get(), absolute, out, max_bytes);
  });
}

}  // namespace spdl::io
