#include "ops/startup_checks.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/errno_text.h"

namespace spdl::ops {
namespace {

namespace fs = std::filesystem;

std::optional<uint64_t> ReadLimitFile(const std::string& path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v)) return std::nullopt;
  if (v == "max") return std::nullopt;  // v2: no limit
  try {
    uint64_t n = std::stoull(v);
    if (n >= (1ull << 62)) return std::nullopt;  // v1: "no limit" is a huge page-rounded number
    return n;
  } catch (...) {
    return std::nullopt;
  }
}

}  // namespace

std::string HumanBytes(uint64_t bytes) {
  char b[48];
  if (bytes >= (1ull << 30)) {
    std::snprintf(b, sizeof b, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
  } else {
    std::snprintf(b, sizeof b, "%llu bytes", static_cast<unsigned long long>(bytes));
  }
  return b;
}

MemoryFacts ReadMemoryFacts(const std::string& proc_root, const std::string& cgroup_root, const std::string& dev_shm) {
  MemoryFacts f;
  {
    std::ifstream in(proc_root + "/meminfo");
    std::string key;
    uint64_t kb = 0;
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      if (!(ls >> key >> kb)) continue;
      if (key == "MemTotal:") f.mem_total = kb * 1024;
      if (key == "MemAvailable:") f.mem_available = kb * 1024;
    }
  }
  std::ifstream in(proc_root + "/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // "0::/path" (v2) or "4:memory:/path" (v1).
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    std::vector<std::string> candidates;
    if (controllers.empty() && line.compare(0, a, "0") == 0) {
      candidates = {cgroup_root + path + "/memory.max", cgroup_root + "/memory.max"};
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      candidates = {cgroup_root + "/memory" + path + "/memory.limit_in_bytes",
                    cgroup_root + "/memory/memory.limit_in_bytes"};
    } else {
      continue;
    }
    for (const auto& c : candidates) {
      std::error_code ec;
      if (!fs::exists(c, ec)) continue;
      if (auto lim = ReadLimitFile(c)) {
        if (!f.cgroup_limit || *lim < *f.cgroup_limit) {
          f.cgroup_limit = lim;
          f.cgroup_limit_file = c;
        }
      }
      break;
    }
  }
  struct statvfs sv {};
  if (::statvfs(dev_shm.c_str(), &sv) == 0) f.dev_shm_bytes = static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
  return f;
}

CheckReport CheckMemoryBudget(uint64_t budget, const MemoryFacts& f) {
  CheckReport r;
  const std::string b = "memory_budget_bytes (" + HumanBytes(budget) + ")";
  if (f.cgroup_limit) {
    if (budget > *f.cgroup_limit) {
      r.errors.push_back(b + " is more than spdld's memory limit (" + HumanBytes(*f.cgroup_limit) + ", " +
                         f.cgroup_limit_file +
                         "): jobs' shared slots are memfd pages charged to that limit, so the kernel would kill "
                         "spdld once jobs fill them. Lower memory_budget_bytes to about 3/4 of the limit, or raise "
                         "the limit (docker run --memory, Kubernetes resources.limits.memory, systemd MemoryMax=)");
    } else if (budget > *f.cgroup_limit / 5 * 4) {
      r.warnings.push_back(b + " is over 80% of spdld's memory limit (" + HumanBytes(*f.cgroup_limit) + ", " +
                           f.cgroup_limit_file + "); decoding needs memory too: lower the budget or raise the limit");
    }
  }
  if (f.mem_total != 0 && budget > f.mem_total) {
    r.errors.push_back(b + " is more than this machine's RAM (" + HumanBytes(f.mem_total) +
                       "): lower memory_budget_bytes in the daemon config");
  } else if (f.mem_available != 0 && budget > f.mem_available) {
    r.warnings.push_back(b + " is more than the memory available right now (" + HumanBytes(f.mem_available) +
                         "): jobs may be refused or the machine may swap once they fill it");
  }
  if (f.dev_shm_bytes != 0) {
    r.notes.push_back("shared slots are memfd pages, not /dev/shm files: /dev/shm's size (" +
                      HumanBytes(f.dev_shm_bytes) + ") does not limit them; the memory limit does");
  }
  return r;
}

CheckReport CheckAllowedRoots(const std::vector<std::string>& roots) {
  CheckReport r;
  if (roots.empty()) {
    r.warnings.push_back("no allowed_roots configured: every job will be refused (set allowed_roots or --allow-root)");
    return r;
  }
  int usable = 0;
  std::string bad;
  for (const auto& root : roots) {
    std::error_code ec;
    const auto st = fs::status(root, ec);
    std::string why;
    if (ec || st.type() == fs::file_type::not_found) {
      why = ec && ec != std::errc::no_such_file_or_directory ? ec.message() : "does not exist";
    } else if (st.type() != fs::file_type::directory) {
      why = "is not a directory";
    } else if (::access(root.c_str(), R_OK | X_OK) != 0) {
      why = std::string("cannot be read by uid ") + std::to_string(::geteuid()) + " (" + ErrnoText(errno) + ")";
    }
    if (why.empty()) {
      ++usable;
      continue;
    }
    r.warnings.push_back("allowed root " + root + " " + why + ": jobs reading below it will be refused");
    bad += (bad.empty() ? "" : ", ") + root;
  }
  if (usable == 0) {
    r.errors.push_back("none of the allowed_roots is a readable directory (" + bad +
                       "): create them, fix their permissions, or correct allowed_roots in the daemon config");
  }
  return r;
}

}  // namespace spdl::ops
