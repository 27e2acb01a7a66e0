#include "io/allowed_roots.h"

#include <climits>
#include <cerrno>
#include <cstdlib>
#include <memory>

namespace spdl::io {
namespace {

// realpath(3) into a std::string; on failure returns false with errno set.
bool RealPath(const std::string& path, std::string* out) {
  std::unique_ptr<char, decltype(&std::free)> p(::realpath(path.c_str(), nullptr), &std::free);
  if (!p) return false;
  *out = p.get();
  return true;
}

// True when `path` equals `root` or lies below it, by whole components. Both are realpath'd.
bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  if (path.size() < root.size() || path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

}  // namespace

Result<std::string> ResolveUnderRoots(const std::string& path, const std::vector<std::string>& allowed_roots) {
  if (allowed_roots.empty()) {
    return PermissionDenied(path + ": no allowed data roots are configured, so no path is allowed");
  }
  std::string real;
  if (!RealPath(path, &real)) {
    const int err = errno;
    if (err == ELOOP) return InvalidArgument(path + ": a symbolic link loop (too many levels of links)");
    return ErrnoStatus("resolving " + path, err);
  }
  std::string list;
  for (const std::string& root : allowed_roots) {
    list += (list.empty() ? "" : ", ") + root;
    std::string real_root;
    if (RealPath(root, &real_root) && IsUnder(real, real_root)) return real;
  }
  return PermissionDenied(path + " resolves to " + real + ", which is not below any allowed root (" +
                          list + ")");
}

}  // namespace spdl::io
