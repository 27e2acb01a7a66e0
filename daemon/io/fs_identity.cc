#include "io/fs_identity.h"

#include <grp.h>
#include <pwd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/errno_text.h"

namespace spdl::io {
namespace {

thread_local const FsIdentity* t_current = nullptr;

void SortUnique(std::vector<gid_t>* g) {
  std::sort(g->begin(), g->end());
  g->erase(std::unique(g->begin(), g->end()), g->end());
}

// Raw syscalls: per thread (glibc's setgroups() would change every thread of the process).
long SetGroups(const std::vector<gid_t>& groups) {
  return ::syscall(SYS_setgroups, groups.size(), groups.empty() ? nullptr : groups.data());
}
uid_t SetFsUid(uid_t uid) { return static_cast<uid_t>(::syscall(SYS_setfsuid, uid)); }
gid_t SetFsGid(gid_t gid) { return static_cast<gid_t>(::syscall(SYS_setfsgid, gid)); }
// setfsuid/setfsgid never fail visibly: they return the previous value. An invalid id (-1) changes
// nothing, so a second call reads the value in force.
uid_t FsUidNow() { return SetFsUid(static_cast<uid_t>(-1)); }
gid_t FsGidNow() { return SetFsGid(static_cast<gid_t>(-1)); }

// Whether the calling thread's fsuid, fsgid and groups are those of `id`.
bool ThreadIs(const FsIdentity& id) {
  if (FsUidNow() != id.uid || FsGidNow() != id.gid) return false;
  const int n = ::getgroups(0, nullptr);  // the raw syscall: this thread's groups
  std::vector<gid_t> groups(static_cast<size_t>(std::max(n, 0)));
  if (n > 0 && ::getgroups(n, groups.data()) != n) return false;
  SortUnique(&groups);
  return groups == id.groups;
}

// Puts `id` on the calling thread. On failure the thread may be half-switched: the caller restores.
Status Apply(const FsIdentity& id) {
  if (SetGroups(id.groups) != 0) {
    return PermissionDenied("cannot take the supplementary groups of uid " + std::to_string(id.uid) +
                            " (setgroups: " + ErrnoText(errno) + "; spdld needs CAP_SETGID)");
  }
  SetFsGid(id.gid);
  if (FsGidNow() != id.gid) {
    return PermissionDenied("cannot take the filesystem gid " + std::to_string(id.gid) + " (spdld needs CAP_SETGID)");
  }
  SetFsUid(id.uid);
  if (FsUidNow() != id.uid) {
    return PermissionDenied("cannot take the filesystem uid " + std::to_string(id.uid) + " (spdld needs CAP_SETUID)");
  }
  return Status::Ok();
}

}  // namespace

std::string FsIdentity::Key() const {
  std::string k = std::to_string(uid) + ":" + std::to_string(gid) + ":";
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) k += ',';
    k += std::to_string(groups[i]);
  }
  return k;
}

FsIdentity LookupFsIdentity(uid_t uid, gid_t gid) {
  FsIdentity id;
  id.uid = uid;
  id.gid = gid;
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(size > 0 ? static_cast<size_t>(size) : 16384);
  passwd pw{};
  passwd* found = nullptr;
  while (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) == ERANGE && buf.size() < (1u << 20)) {
    buf.resize(buf.size() * 2);
  }
  if (found != nullptr) {
    int n = 64;
    std::vector<gid_t> groups(static_cast<size_t>(n));
    while (::getgrouplist(found->pw_name, gid, groups.data(), &n) < 0 && n < 65536) {
      groups.resize(static_cast<size_t>(n) * 2 + 1);
      n = static_cast<int>(groups.size());
    }
    groups.resize(static_cast<size_t>(std::max(n, 0)));
    id.groups = std::move(groups);
  }
  id.groups.push_back(gid);
  SortUnique(&id.groups);
  return id;
}

const FsIdentity& DaemonFsIdentity() {
  static const FsIdentity* self = [] {
    auto* id = new FsIdentity();
    id->uid = ::geteuid();
    id->gid = ::getegid();
    const int n = ::getgroups(0, nullptr);
    if (n > 0) {
      id->groups.resize(static_cast<size_t>(n));
      const int got = ::getgroups(n, id->groups.data());
      id->groups.resize(static_cast<size_t>(std::max(got, 0)));
    }
    SortUnique(&id->groups);
    return id;
  }();
  return *self;
}

const SwitchSupport& ProbeSwitchSupport() {
  static const SwitchSupport* support = [] {
    auto* s = new SwitchSupport();
    const FsIdentity& self = DaemonFsIdentity();
    FsIdentity probe;
    probe.uid = self.uid == 65534 ? 65533 : 65534;
    probe.gid = self.gid == 65534 ? 65533 : 65534;
    probe.groups = {probe.gid};
    {
      ScopedFsIdentity as(&probe);
      if (as.ok()) {
        s->can_switch = true;
      } else {
        s->why_not = "spdld runs as uid " + std::to_string(self.uid) + " without CAP_SETUID and CAP_SETGID (" +
                     as.status().message() + ")";
      }
    }
    return s;
  }();
  return *support;
}

Status CheckServable(uid_t uid) {
  const SwitchSupport& s = ProbeSwitchSupport();
  if (s.can_switch || uid == 0 || uid == DaemonFsIdentity().uid) return Status::Ok();
  return PermissionDenied("spdld cannot read files with the rights of uid " + std::to_string(uid) + ": " + s.why_not +
                          ", so it serves only uid " + std::to_string(DaemonFsIdentity().uid) +
                          " and root; an administrator must grant it CAP_SETUID and CAP_SETGID "
                          "(AmbientCapabilities=CAP_SETUID CAP_SETGID in its systemd unit) or run it as root");
}

const FsIdentity* CurrentFsIdentity() { return t_current; }

std::string CurrentFsIdentityKey() { return t_current ? t_current->Key() : std::string("daemon"); }

ScopedFsIdentity::ScopedFsIdentity(const FsIdentity* id) : previous_(t_current) {
  if (id == nullptr) return;
  const FsIdentity& in_force = previous_ ? *previous_ : DaemonFsIdentity();
  if (*id == in_force) {
    t_current = id;
    switched_ = true;
    return;
  }
  status_ = Apply(*id);
  if (!status_.ok()) {
    if (ThreadIs(in_force)) return;  // the first step was refused: nothing changed
    Status restored = Apply(in_force);
    if (!restored.ok()) {
      // The thread could neither switch nor come back: nothing it does from now on is safe.
      std::abort();
    }
    return;
  }
  t_current = id;
  switched_ = true;
}

ScopedFsIdentity::~ScopedFsIdentity() {
  if (!switched_) return;
  const FsIdentity& back = previous_ ? *previous_ : DaemonFsIdentity();
  if (!(*t_current == back) && !Apply(back).ok()) std::abort();  // never run on as the user
  t_current = previous_;
}

}  // namespace spdl::io
