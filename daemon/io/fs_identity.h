// FsIdentity: whose rights a file access uses. spdld is shared by every user of the node, so it
// opens a job's files (folder scans, lists, shards, samples, sidecars) with the filesystem identity
// of the user who submitted the job — fsuid, fsgid and supplementary groups — and the kernel
// decides, ACLs included, exactly as for the user's own open(2). A user never reads through spdld
// what they could not read themselves (no confused deputy).
//
// How: per thread. setfsuid(2), setfsgid(2) and setgroups(2) are per-thread at the syscall level
// (glibc's setgroups() wrapper broadcasts to every thread of the process, so it is never used
// here: raw syscall()). ScopedFsIdentity switches the calling thread for its scope and restores the
// daemon's identity after; nothing else of the thread changes (the real, effective and saved ids
// stay the daemon's). Switching needs CAP_SETUID and CAP_SETGID (root has them; the systemd unit
// grants them to the spdld user through AmbientCapabilities=). A daemon without them can act only
// as itself: it serves jobs of its own uid and of root only (SwitchSupport).
//
// Thread safety: FsIdentity is a value. ScopedFsIdentity acts on the calling thread only; it must
// be destroyed on the thread that made it. CurrentFsIdentity() reads a thread-local.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::io {

struct FsIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, sorted, without duplicates

  // A short text naming the identity, for cache keys: "uid:gid:g1,g2".
  std::string Key() const;
  bool operator==(const FsIdentity&) const = default;
};

// The identity of user `uid` whose primary group (from the peer's credentials) is `gid`: the
// supplementary groups are the user's groups in the group database (getgrouplist of the uid's
// name), or only `gid` when the uid has no name. Never fails.
FsIdentity LookupFsIdentity(uid_t uid, gid_t gid);

// The daemon's own identity (fsuid = euid, fsgid = egid, getgroups()), as at the first call.
const FsIdentity& DaemonFsIdentity();

// Whether this process may switch threads to another user's identity, probed once (a switch to
// nobody and back on the calling thread) and remembered.
struct SwitchSupport {
  bool can_switch = false;
  std::string why_not;  // when !can_switch: what is missing, for logs and refusals
};
const SwitchSupport& ProbeSwitchSupport();

// Ok when a job of `uid` may be served: the daemon can switch, or uid is the daemon's own or root
// (which the daemon serves with its own rights). Otherwise kPermissionDenied saying why and what the
// administrator must grant.
Status CheckServable(uid_t uid);

// The identity ScopedFsIdentity has put on this thread, or nullptr (the daemon's own).
const FsIdentity* CurrentFsIdentity();

// The key of CurrentFsIdentity() (Key()), or "daemon" when none: the scope of a cache entry made
// by this thread.
std::string CurrentFsIdentityKey();

// Switches the calling thread's fsuid, fsgid and groups to `id` for the guard's scope; restores the
// daemon's on destruction. Nestable (the inner guard restores the outer identity). A switch that
// the kernel refuses leaves the thread as it was and status() says why: callers must then not
// open anything (ok() is false). Switching to the daemon's own identity does no syscall.
class ScopedFsIdentity {
 public:
  // `id` must outlive the guard. nullptr = no switch (status() ok).
  explicit ScopedFsIdentity(const FsIdentity* id);
  ~ScopedFsIdentity();
  ScopedFsIdentity(const ScopedFsIdentity&) = delete;
  ScopedFsIdentity& operator=(const ScopedFsIdentity&) = delete;

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

 private:
  const FsIdentity* previous_ = nullptr;  // the identity before (nullptr: the daemon's)
  bool switched_ = false;
  Status status_;
};

}  // namespace spdl::io
