#include "cuda/shm_fake_backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace spdl::cuda {
namespace {

constexpr char kMemPrefix[] = "SHMFAKE:M:";
constexpr char kEventPrefix[] = "SHMFAKE:E:";
constexpr size_t kEventPage = 4096;

// The shared state of one event (the first bytes of its page).
struct EventPage {
  std::atomic<uint64_t> records;
};
static_assert(sizeof(EventPage) <= kEventPage);

template <typename H>
H EncodeName(const char* prefix, const std::string& name) {
  H h;
  const std::string s = std::string(prefix) + name;
  std::memcpy(h.bytes.data(), s.data(), std::min(s.size(), h.bytes.size()));
  return h;
}

template <typename H>
Result<std::string> DecodeName(const char* prefix, const H& h, const char* what) {
  const size_t plen = std::strlen(prefix);
  if (std::memcmp(h.bytes.data(), prefix, plen) != 0) {
    return InvalidArgument(std::string("shmfake: not a shmfake ") + what + " handle");
  }
  std::string name(reinterpret_cast<const char*>(h.bytes.data()) + plen, h.bytes.size() - plen);
  name.resize(std::strlen(name.c_str()));
  if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos) {
    return InvalidArgument(std::string("shmfake: a malformed ") + what + " handle");
  }
  return name;
}

// File names unique in the process, over all its backends (one per device share the directory).
uint64_t NextName() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

// Every call but the destructor's clean-up fails with the sticky error once the device is poisoned,
// as every CUDA call does in a process whose context a sticky error left unusable.
#define SHMFAKE_STICKY_CHECK() SPDL_RETURN_IF_ERROR(sticky_error())

namespace {
// The decimal number at the start of `s` (as atoi reads it), 0 when there is none.
int LeadingInt(const char* s) {
  int v = 0;
  (void)std::from_chars(s, s + std::strlen(s), v);  // no number: v stays 0
  return v;
}

// Whether process `pid` has ended as far as CUDA is concerned: it does not exist, has exited and
// waits to be reaped (a zombie), or is exiting (PF_EXITING: the kernel is tearing it down; its
// files, the socket to the daemon and the driver's device file among them, close in that teardown
// in no set order, so the daemon may see the socket close first).
bool ProcessEnded(int pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return true;  // reaped since kill() saw it
  const size_t paren = stat.rfind(')');  // "PID (COMM) STATE PPID PGRP SESSION TTY TPGID FLAGS ...": COMM may hold ')'
  if (paren == std::string::npos) return false;
  std::istringstream fields(stat.substr(paren + 1));
  char state = 0;
  long long skip = 0;
  unsigned long long flags = 0;
  fields >> state;
  for (int i = 0; i < 5; ++i) fields >> skip;
  fields >> flags;
  if (!fields) return false;
  constexpr unsigned long long kPfExiting = 0x4;  // include/linux/sched.h
  return state == 'Z' || state == 'X' || (flags & kPfExiting) != 0;
}

// kFakeGpuVisibleEnv's list, or empty when unset.
std::vector<int> VisibleList() {
  std::vector<int> out;
  const char* env = std::getenv(kFakeGpuVisibleEnv);
  if (env == nullptr) return out;
  std::string s(env);
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = std::min(s.find(',', pos), s.size());
    const std::string item = s.substr(pos, comma - pos);
    if (!item.empty()) out.push_back(LeadingInt(item.c_str()));
    pos = comma + 1;
  }
  return out;
}
}  // namespace

ShmFakeBackend::ShmFakeBackend(std::string dir, int ordinal, int physical)
    : dir_(std::move(dir)), ordinal_(ordinal), physical_(physical) {}

int ShmFakeBackend::VisibleCount() {
  const std::vector<int> list = VisibleList();
  return std::getenv(kFakeGpuVisibleEnv) != nullptr ? static_cast<int>(list.size()) : kFakeDevices;
}

Result<std::unique_ptr<ShmFakeBackend>> ShmFakeBackend::Create(std::string dir, int ordinal, int physical) {
  struct stat st {};
  if (dir.empty() || ::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgument("shmfake (test-only fake GPU): '" + dir + "' is not a directory");
  }
  if (ordinal < 0) return InvalidArgument("shmfake: negative device ordinal");
  if (physical < 0) {
    if (ordinal >= VisibleCount()) {
      return InvalidArgument("shmfake: this process sees " + std::to_string(VisibleCount()) +
                             " fake device(s), so it has no cuda:" + std::to_string(ordinal));
    }
    const std::vector<int> list = VisibleList();
    physical = list.empty() ? ordinal : list[static_cast<size_t>(ordinal)];
  }
  return std::unique_ptr<ShmFakeBackend>(new ShmFakeBackend(std::move(dir), ordinal, physical));
}

ShmFakeBackend::~ShmFakeBackend() {
  // Whatever the owners leaked: unmap, and unlink what this process made (tests check for leaks
  // with live() before this runs).
  for (auto& [base, r] : regions_) {
    ::munmap(reinterpret_cast<void*>(base), r.bytes);
    ::unlink(r.owned ? (dir_ + "/" + r.name).c_str() : OpenMark(r.name).c_str());
  }
  for (auto& [h, e] : events_) {
    ::munmap(e->page, kEventPage);
    ::unlink(e->owned ? (dir_ + "/" + e->name).c_str() : OpenMark(e->name).c_str());
  }
}

ShmFakeBackend::Live ShmFakeBackend::live() const {
  std::lock_guard lock(mu_);
  Live l;
  for (const auto& [base, r] : regions_) (r.owned ? l.allocations : l.mappings)++;
  l.events = events_.size();
  l.streams = streams_.size();
  l.registrations = registrations_.size();
  return l;
}

Result<DeviceUuid> ShmFakeBackend::Uuid() {
  DeviceUuid u{};
  std::memcpy(u.data(), "SHMFAKE", 7);
  u[7] = static_cast<uint8_t>(physical_);
  const uint64_t h = Fnv1a(dir_);
  std::memcpy(u.data() + 8, &h, sizeof(h));
  return u;
}

Status ShmFakeBackend::sticky_error() const {
  const std::string device_wide = dir_ + "/" + kStickyErrorFile + std::to_string(physical_);
  int fd = ::open(device_wide.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fd = ::open((device_wide + "-" + std::to_string(::getpid())).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Ok();
  char buf[256];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  return Status(StatusCode::kInternal, n > 0 ? std::string(buf, static_cast<size_t>(n)) : "a sticky CUDA error");
}

Status ShmFakeBackend::HostRegister(void* ptr, size_t bytes) {
  SHMFAKE_STICKY_CHECK();
  if (ptr == nullptr || bytes == 0) return InvalidArgument("shmfake HostRegister: empty range");
  std::lock_guard lock(mu_);
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  for (const auto& [base, n] : registrations_) {
    if (p < base + n && base < p + bytes)
      return FailedPrecondition("shmfake HostRegister: overlaps a registered range");
  }
  registrations_[p] = bytes;
  return Status::Ok();
}

Status ShmFakeBackend::HostUnregister(void* ptr) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  if (registrations_.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
    return InvalidArgument("shmfake HostUnregister: not registered");
  }
  return Status::Ok();
}

Result<void*> ShmFakeBackend::MapFile(const std::string& name, size_t bytes, bool create) {
  const std::string path = dir_ + "/" + name;
  const int fd = ::open(path.c_str(), create ? (O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC) : (O_RDWR | O_CLOEXEC), 0600);
  if (fd < 0) return ErrnoStatus("shmfake: opening " + path, errno);
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return ErrnoStatus("shmfake: sizing " + path, err);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    if (create) ::unlink(path.c_str());
    return ErrnoStatus("shmfake: mapping " + path, err);
  }
  return p;
}

Result<void*> ShmFakeBackend::DeviceAlloc(size_t bytes) {
  SHMFAKE_STICKY_CHECK();
  if (bytes == 0) return InvalidArgument("shmfake DeviceAlloc: 0 bytes");
  std::lock_guard lock(mu_);
  const std::string name = "mem-" + std::to_string(::getpid()) + "-" + std::to_string(NextName());
  SPDL_ASSIGN_OR_RETURN(void* p, MapFile(name, bytes, /*create=*/true));
  regions_[reinterpret_cast<uintptr_t>(p)] = Region{name, bytes, true};
  return p;
}

Status ShmFakeBackend::DeviceFree(void* ptr) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == regions_.end() || !it->second.owned) return InvalidArgument("shmfake DeviceFree: not an allocation's base");
  for (int pid : LiveImporters(it->second.name)) {
    RecordViolation("DeviceFree of " + it->second.name + " while process " + std::to_string(pid) +
                    " still maps it (undefined in CUDA)");
  }
  ::munmap(ptr, it->second.bytes);
  ::unlink((dir_ + "/" + it->second.name).c_str());
  regions_.erase(it);
  return Status::Ok();
}

Result<Stream> ShmFakeBackend::CreateStream() {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  void* h = reinterpret_cast<void*>((uintptr_t{3} << 40) + next_id_++ * 16);
  streams_.insert(h);
  return Stream{h};
}

Status ShmFakeBackend::DestroyStream(Stream stream) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  if (streams_.erase(stream.handle) == 0) return InvalidArgument("shmfake DestroyStream: unknown stream");
  blocked_streams_.erase(stream.handle);
  return Status::Ok();
}

Result<Event> ShmFakeBackend::CreateEvent(bool interprocess) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  auto e = std::make_unique<LocalEvent>();
  e->name = "ev-" + std::to_string(::getpid()) + "-" + std::to_string(NextName());
  SPDL_ASSIGN_OR_RETURN(e->page, MapFile(e->name, kEventPage, /*create=*/true));
  e->owned = true;
  e->interprocess = interprocess;
  void* h = e.get();
  events_[h] = std::move(e);
  return Event{h};
}

Status ShmFakeBackend::DestroyEvent(Event event) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  auto it = events_.find(event.handle);
  if (it == events_.end()) return InvalidArgument("shmfake DestroyEvent: unknown event");
  if (it->second->owned && it->second->interprocess) {
    for (int pid : LiveImporters(it->second->name)) {
      RecordViolation("DestroyEvent of exported " + it->second->name + " while process " + std::to_string(pid) +
                      " still has it open (undefined in CUDA)");
    }
  }
  ::munmap(it->second->page, kEventPage);
  if (it->second->owned) {
    ::unlink((dir_ + "/" + it->second->name).c_str());
  } else {
    ::unlink(OpenMark(it->second->name).c_str());
  }
  events_.erase(it);
  return Status::Ok();
}

bool ShmFakeBackend::DeviceRangeLocked(const void* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return false;
  --it;
  return a >= it->first && n <= it->second.bytes && a - it->first <= it->second.bytes - n;
}

Status ShmFakeBackend::MemcpyH2DAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  if (!DeviceRangeLocked(dst, bytes)) return InvalidArgument("shmfake H2D copy: the destination is not device memory");
  if (blocked_streams_.count(stream.handle) != 0) {
    // CUDA would queue it behind a wait that never ends: the copy never runs.
    RecordViolation("an H2D copy queued on a stream blocked for ever (it waited on a dead exporter's event)");
    return Status::Ok();
  }
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}

Status ShmFakeBackend::MemcpyD2HAsync(void* dst, const void* src, size_t bytes, Stream stream) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  if (!DeviceRangeLocked(src, bytes)) return InvalidArgument("shmfake D2H copy: the source is not device memory");
  if (blocked_streams_.count(stream.handle) != 0) {
    RecordViolation("a D2H copy queued on a stream blocked for ever (it waited on a dead exporter's event)");
    return Status::Ok();
  }
  std::memcpy(dst, src, bytes);
  return Status::Ok();
}

Result<ShmFakeBackend::LocalEvent*> ShmFakeBackend::EventLocked(Event event, const char* op) {
  auto it = events_.find(event.handle);
  if (it == events_.end()) return InvalidArgument(std::string("shmfake ") + op + ": unknown event");
  return it->second.get();
}

Status ShmFakeBackend::RecordEvent(Event event, Stream) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  SPDL_ASSIGN_OR_RETURN(LocalEvent * e, EventLocked(event, "RecordEvent"));
  static_cast<EventPage*>(e->page)->records.fetch_add(1);
  return Status::Ok();
}

Status ShmFakeBackend::StreamWaitEvent(Stream stream, Event event) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  SPDL_ASSIGN_OR_RETURN(LocalEvent * e, EventLocked(event, "StreamWaitEvent"));
  if (!e->owned && ExporterDead(e->name)) blocked_streams_.insert(stream.handle);
  return Status::Ok();
}

Result<bool> ShmFakeBackend::QueryEvent(Event event) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  SPDL_ASSIGN_OR_RETURN(LocalEvent * e, EventLocked(event, "QueryEvent"));
  // An imported event whose exporter died never completes (its recorded work never runs).
  return e->owned || !ExporterDead(e->name);
}

Status ShmFakeBackend::SynchronizeEvent(Event event) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  SPDL_ASSIGN_OR_RETURN(LocalEvent * e, EventLocked(event, "SynchronizeEvent"));
  if (!e->owned && ExporterDead(e->name)) {
    RecordViolation("SynchronizeEvent on " + e->name + ", whose exporter died: it would hang for ever");
    return Unavailable("shmfake SynchronizeEvent: the event never completes (its exporter died)");
  }
  return Status::Ok();
}

Status ShmFakeBackend::SynchronizeStream(Stream stream) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  if (blocked_streams_.count(stream.handle) != 0) {
    RecordViolation("SynchronizeStream on a stream that waited on an event that never completes: it would hang");
    return Unavailable("shmfake SynchronizeStream: the stream waits for ever (its event's exporter died)");
  }
  return Status::Ok();
}

Result<IpcMemHandle> ShmFakeBackend::ExportMemory(void* base) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end() || !it->second.owned)
    return InvalidArgument("shmfake ExportMemory: not an allocation's base");
  return EncodeName<IpcMemHandle>(kMemPrefix, it->second.name);
}

Result<IpcEventHandle> ShmFakeBackend::ExportEvent(Event event) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  SPDL_ASSIGN_OR_RETURN(LocalEvent * e, EventLocked(event, "ExportEvent"));
  if (!e->interprocess || !e->owned) return InvalidArgument("shmfake ExportEvent: not an interprocess event made here");
  return EncodeName<IpcEventHandle>(kEventPrefix, e->name);
}

Result<void*> ShmFakeBackend::OpenMemory(const IpcMemHandle& handle) {
  SHMFAKE_STICKY_CHECK();
  SPDL_ASSIGN_OR_RETURN(std::string name, DecodeName(kMemPrefix, handle, "memory"));
  std::lock_guard lock(mu_);
  for (const auto& [base, r] : regions_) {
    if (r.name == name && r.owned) {
      return InvalidArgument(
          "shmfake OpenMemory: the handle was exported by this process (as with CUDA, it "
          "opens only in another one)");
    }
  }
  struct stat st {};
  if (::stat((dir_ + "/" + name).c_str(), &st) != 0) return ErrnoStatus("shmfake OpenMemory: " + name, errno);
  const auto bytes = static_cast<size_t>(st.st_size);
  SPDL_ASSIGN_OR_RETURN(void* p, MapFile(name, bytes, /*create=*/false));
  regions_[reinterpret_cast<uintptr_t>(p)] = Region{name, bytes, false};
  std::ofstream(OpenMark(name)).flush();
  return p;
}

Status ShmFakeBackend::CloseMemory(void* base) {
  SHMFAKE_STICKY_CHECK();
  std::lock_guard lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end() || it->second.owned) return InvalidArgument("shmfake CloseMemory: not an opened mapping");
  ::munmap(base, it->second.bytes);
  ::unlink(OpenMark(it->second.name).c_str());
  regions_.erase(it);
  return Status::Ok();
}

Result<Event> ShmFakeBackend::OpenEvent(const IpcEventHandle& handle) {
  SHMFAKE_STICKY_CHECK();
  SPDL_ASSIGN_OR_RETURN(std::string name, DecodeName(kEventPrefix, handle, "event"));
  std::lock_guard lock(mu_);
  for (const auto& [h, e] : events_) {
    if (e->name == name && e->owned)
      return InvalidArgument("shmfake OpenEvent: the handle was exported by this process");
  }
  auto e = std::make_unique<LocalEvent>();
  e->name = name;
  SPDL_ASSIGN_OR_RETURN(e->page, MapFile(name, kEventPage, /*create=*/false));
  std::ofstream(OpenMark(name)).flush();
  void* h = e.get();
  events_[h] = std::move(e);
  return Event{h};
}

std::string ShmFakeBackend::OpenMark(const std::string& name) const {
  return dir_ + "/open." + name + "." + std::to_string(::getpid());
}

std::vector<int> ShmFakeBackend::LiveImporters(const std::string& name) const {
  std::vector<int> pids;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return pids;
  const std::string prefix = "open." + name + ".";
  while (const dirent* ent = ::readdir(d)) {
    const std::string f = ent->d_name;
    if (f.rfind(prefix, 0) != 0) continue;
    const int pid = LeadingInt(f.c_str() + prefix.size());
    if (pid <= 0 || pid == ::getpid()) continue;
    // A poisoned importer's context can no longer touch the handle (every call fails), as a dead
    // one's: neither counts.
    const std::string poison = dir_ + "/" + kStickyErrorFile + std::to_string(physical_);
    if (::access(poison.c_str(), F_OK) == 0 || ::access((poison + "-" + std::to_string(pid)).c_str(), F_OK) == 0) {
      continue;
    }
    if (!ProcessEnded(pid)) pids.push_back(pid);
  }
  ::closedir(d);
  return pids;
}

void ShmFakeBackend::RecordViolation(const std::string& what) const {
  std::fprintf(stderr, "shmfake VIOLATION (pid %d): %s\n", static_cast<int>(::getpid()), what.c_str());
  const int fd = ::open((dir_ + "/violations").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  const std::string line = "pid " + std::to_string(::getpid()) + ": " + what + "\n";
  (void)!::write(fd, line.data(), line.size());  // one write: lines of processes never interleave
  ::close(fd);
}

bool ShmFakeBackend::ExporterDead(const std::string& name) {
  // mem-PID-N / ev-PID-N
  const size_t dash = name.find('-');
  if (dash == std::string::npos) return false;
  const int pid = LeadingInt(name.c_str() + dash + 1);
  if (pid <= 0) return false;
  return ProcessEnded(pid);
}

std::vector<std::string> ShmFakeBackend::Violations(const std::string& dir) {
  std::vector<std::string> out;
  std::ifstream in(dir + "/violations");
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

}  // namespace spdl::cuda
