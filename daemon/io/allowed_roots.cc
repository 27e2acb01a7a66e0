#include "io/allowed_roots.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
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

// True when `path` equals `root` or lies below it, by whole components. Both are normalized.
bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  if (path.size() < root.size() || path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

}  // namespace

std::string LexicallyNormal(const std::string& path) {
  std::string abs = path;
  if (abs.empty() || abs.front() != '/') {
    char cwd[PATH_MAX];
    abs = std::string(::getcwd(cwd, sizeof(cwd)) ? cwd : "/") + "/" + abs;
  }
  std::vector<std::string_view> parts;
  std::string_view rest(abs);
  while (!rest.empty()) {
    const size_t slash = rest.find('/');
    std::string_view part = rest.substr(0, slash);
    rest.remove_prefix(slash == std::string_view::npos ? rest.size() : slash + 1);
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (std::string_view p : parts) {
    out += '/';
    out.append(p.data(), p.size());
  }
  return out.empty() ? "/" : out;
}

Status OutsideRoots(const std::string& path, const std::vector<std::string>& allowed_roots) {
  std::string list;
  for (const std::string& root : allowed_roots) list += (list.empty() ? "" : ", ") + root;
  return PermissionDenied(path + " is not below any allowed root (" + list + ")");
}

Result<std::string> ResolveUnderRoots(const std::string& path, const std::vector<std::string>& allowed_roots) {
  if (allowed_roots.empty()) {
    return PermissionDenied(path + ": no allowed data roots are configured, so no path is allowed");
  }
  // First by the name alone, touching nothing: a path outside every root gets the same answer
  // whether or not it exists.
  const std::string lexical = LexicallyNormal(path);
  std::vector<std::string> real_roots;
  bool named_inside = false;
  for (const std::string& root : allowed_roots) {
    std::string real_root;
    if (!RealPath(root, &real_root)) continue;  // a missing root allows nothing
    real_roots.push_back(real_root);
    if (IsUnder(lexical, LexicallyNormal(root)) || IsUnder(lexical, real_root)) named_inside = true;
  }
  if (!named_inside) return OutsideRoots(path, allowed_roots);
  // Then resolved with the rights of the thread's identity (the job's user): what the kernel says
  // about it is what the user could learn with ls.
  std::string real;
  if (!RealPath(lexical, &real)) {
    const int err = errno;
    if (err == ELOOP) return InvalidArgument(path + ": a symbolic link loop (too many levels of links)");
    return ErrnoStatus("resolving " + path, err);
  }
  for (const std::string& real_root : real_roots) {
    if (IsUnder(real, real_root)) return real;
  }
  // Never say where the link leads.
  return PermissionDenied(path + " leads out of the allowed roots through a symbolic link (not followed)");
}

}  // namespace spdl::io
