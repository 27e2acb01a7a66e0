// Start-up checks: what spdld verifies before it serves, each failure said with what to do.
//
//  - Memory for the budget. Jobs' shared slots are memfd pages (daemon/shm/), charged to the
//    daemon's memory cgroup and to RAM — NOT to /dev/shm. So a container's small /dev/shm (Docker's
//    64 MiB default: the usual trap for loaders that use /dev/shm) does not limit spdld; its
//    memory limit (docker --memory, Kubernetes limits.memory, systemd MemoryMax=) does.
//  - Allowed data roots: each exists, is a directory and can be read and searched.
//
// ReadMemoryFacts reads files under the given roots (the real /proc and /sys/fs/cgroup by
// default; tests pass a directory of their own). The Check* functions are pure. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace spdl::ops {

struct MemoryFacts {
  uint64_t mem_total = 0;                // /proc/meminfo MemTotal, bytes
  uint64_t mem_available = 0;            // /proc/meminfo MemAvailable, bytes
  std::optional<uint64_t> cgroup_limit;  // memory.max (v2) or memory.limit_in_bytes (v1); unset = none
  std::string cgroup_limit_file;         // where cgroup_limit was read
  uint64_t dev_shm_bytes = 0;            // size of the /dev/shm mount (0 = unknown); informative only
};

// Reads MemTotal/MemAvailable from <proc_root>/meminfo, this process's memory cgroup from
// <proc_root>/self/cgroup and its limit under <cgroup_root> (v2 unified or v1 "memory"
// controller; a v1 path missing under the mount, as in a cgroup namespace, falls back to the
// mount's root). Anything unreadable is left at its default.
MemoryFacts ReadMemoryFacts(const std::string& proc_root = "/proc", const std::string& cgroup_root = "/sys/fs/cgroup",
                            const std::string& dev_shm = "/dev/shm");

struct CheckReport {
  std::vector<std::string> errors;    // spdld must not start: each says what is wrong and what to do
  std::vector<std::string> warnings;  // worth a log line
  std::vector<std::string> notes;     // informative (debug/info log)
  bool ok() const { return errors.empty(); }
};

// The shared-memory budget against the machine and the cgroup: over the cgroup limit or over RAM
// is an error; over 80% of the limit or over what is available now is a warning.
CheckReport CheckMemoryBudget(uint64_t budget_bytes, const MemoryFacts& facts);

// Every allowed root: missing, not a directory or not searchable is a warning (jobs under it will
// be refused); when roots are configured and none is usable, an error.
CheckReport CheckAllowedRoots(const std::vector<std::string>& roots);

// "4.0 GiB", "512.0 MiB", "1234 bytes".
std::string HumanBytes(uint64_t bytes);

}  // namespace spdl::ops
