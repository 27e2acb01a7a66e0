// Reading sample files.
//   - ReadFile: one whole file by path into a reusable buffer.
//   - RootDir: a directory held open; files are opened *beneath* it, so that a key naming "..",
//     an absolute path, or a symbolic link that leads out of the directory is refused instead of
//     followed (a dataset cannot be used to read /etc/shadow through a link planted in it).
// All of it is safe to call from many threads at once (each with its own buffer); a RootDir is
// immutable after Open.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace spdl::io {

// Resource errors are not bad samples. An open or read failing with EMFILE, ENFILE, ENOMEM,
// ENOBUFS or EIO says the daemon or the node is short of something (descriptors, memory) or a
// device failed: the read is retried with backoff (kResourceAttempts in ~1.7 s), and if it persists
// the error is kUnavailable, which fails the job loudly whatever its on_error
// (pipeline/batch_pipeline.h), instead of counting a good sample as corrupt.
inline constexpr int kResourceAttempts = 6;
bool IsResourceErrno(int err);
// ErrnoStatus, except that a resource errno gives kUnavailable (saying it is not the sample's fault).
Status IoErrnoStatus(const std::string& what, int err);
// Runs `attempt` until it returns something other than kUnavailable, at most kResourceAttempts
// times (sleeping 5, 20, 80, 320, 1280 ms between); a last kUnavailable says how many attempts.
Status RetryOnResourceError(const std::function<Status()>& attempt);

// Replaces *out with the contents of the regular file `path`, reusing out's capacity. The size is
// taken when the file is opened; a file that shrinks meanwhile yields what was there.
// Resource errors are retried (RetryOnResourceError). Errors, each naming the path: missing ->
// kNotFound; unreadable -> kPermissionDenied; a directory,
// fifo, socket or device -> kInvalidArgument (never blocks on a fifo); larger than `max_bytes` ->
// kResourceExhausted; an I/O error -> its errno's code. On error *out is left empty.
// REQUIRES: out != nullptr.
Status ReadFile(const std::string& path, std::vector<uint8_t>* out, size_t max_bytes = 1ull << 30);

// Reads the whole of the open file `fd` (named `name` in errors) as ReadFile does.
Status ReadOpenFile(int fd, const std::string& name, std::vector<uint8_t>* out, size_t max_bytes = 1ull << 30);

// A directory that files are opened beneath. Opening uses openat2(RESOLVE_BENEATH |
// RESOLVE_NO_MAGICLINKS) relative to the directory's descriptor, so the kernel refuses any path
// whose resolution leaves the directory, at the moment of the open (no check-then-use race). On a
// kernel without openat2 (ENOSYS; or EPERM from a container's seccomp filter) it falls back to
// realpath(root/relative), a whole-component prefix check against the root's real path, and an
// open of the checked path with O_NOFOLLOW (racy against a concurrent rename, but never follows a
// link that was outside at the check).
// Symbolic links that stay beneath the root are followed, as are mount points below it.
class RootDir {
 public:
  // Opens the directory `path` (which should already be resolved, e.g. by ResolveUnderRoots).
  // Errors: missing -> kNotFound; not a directory -> kInvalidArgument; each naming the path.
  static Result<std::shared_ptr<const RootDir>> Open(const std::string& path);

  // Opens `relative` beneath the root for reading (O_RDONLY | O_NONBLOCK: a fifo never blocks).
  // Errors, each naming root/relative: an absolute path, "..", or a symbolic link leading out of
  // the root -> kPermissionDenied ("... escapes its root ..."); a symbolic link loop ->
  // kInvalidArgument; missing -> kNotFound; others by errno.
  Result<UniqueFd> OpenBeneath(std::string_view relative) const;

  // OpenBeneath with open(2) `flags` of the caller's (O_PATH to look at a file without reading it,
  // O_RDONLY | O_DIRECTORY to list a directory); same rules and errors. O_CLOEXEC is added.
  Result<UniqueFd> OpenBeneathWith(std::string_view relative, int flags) const;

  // OpenBeneath, then reads the whole regular file as ReadFile does (same errors).
  Status ReadFile(std::string_view relative, std::vector<uint8_t>* out, size_t max_bytes = 1ull << 30) const;

  const std::string& path() const { return path_; }
  const std::string& real_path() const { return real_path_; }

  // The fallback OpenBeneath uses where openat2 is missing (realpath + prefix check + O_NOFOLLOW);
  // same errors. Public so that tests can run it on kernels that have openat2.
  Result<UniqueFd> OpenBeneathFallback(std::string_view relative) const;
  Result<UniqueFd> OpenBeneathFallbackWith(std::string_view relative, int flags) const;

  RootDir(std::string path, std::string real_path, UniqueFd fd);

 private:
  // Constant after construction.
  const std::string path_;       // as given to Open
  const std::string real_path_;  // realpath of it, for the fallback check
  const UniqueFd fd_;            // O_PATH | O_DIRECTORY
};

// The daemon's allowed roots, opened: opens an absolute path (already resolved, e.g. by
// ResolveUnderRoots) beneath the root that holds it, with RootDir's rules. For samples named by
// absolute path (file-list entries, tar shards). Immutable after Open.
class RootSet {
 public:
  // Opens every root that exists (a missing root allows nothing, as in ResolveUnderRoots).
  static std::shared_ptr<const RootSet> Open(const std::vector<std::string>& allowed_roots);

  // Errors: `absolute` below no root -> kPermissionDenied naming it; then RootDir::OpenBeneath's.
  Result<UniqueFd> OpenBeneath(const std::string& absolute) const;
  Status ReadFile(const std::string& absolute, std::vector<uint8_t>* out, size_t max_bytes = 1ull << 30) const;

 private:
  // Constant after Open.
  std::vector<std::shared_ptr<const RootDir>> roots_;
};

}  // namespace spdl::io
