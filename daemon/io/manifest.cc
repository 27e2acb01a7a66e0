#include "io/manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "common/ascii.h"
#include "io/read_file.h"

namespace spdl::io {
namespace {

using DirId = std::pair<dev_t, ino_t>;

bool HasExtension(const std::string& name, const std::vector<std::string>& lower_exts) {
  const std::string lower = AsciiLower(name);
  for (const std::string& ext : lower_exts) {
    if (lower.size() > ext.size() && lower.compare(lower.size() - ext.size(), ext.size(), ext) == 0) {
      return true;
    }
  }
  return false;
}

struct Entry {
  std::string name;
  unsigned char type;  // dirent's d_type: DT_REG, DT_DIR, DT_LNK, DT_UNKNOWN, ...
  bool operator<(const Entry& o) const { return name < o.name; }
};

// The entries of directory `rel` beneath `root` ("." for the root) whose names do not start with
// '.' (so neither "." nor ".."), sorted by name.
Status ListVisible(const RootDir& root, const std::string& rel, std::vector<Entry>* entries) {
  entries->clear();
  const std::string shown = rel == "." ? root.path() : root.path() + "/" + rel;
  SPDL_ASSIGN_OR_RETURN(UniqueFd fd, root.OpenBeneathWith(rel, O_RDONLY | O_DIRECTORY | O_NONBLOCK));
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return ErrnoStatus("cannot read directory " + shown, errno);
  (void)fd.release();  // owned by d now
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d);
    if (e == nullptr) break;
    if (e->d_name[0] != '.') entries->push_back(Entry{e->d_name, e->d_type});
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return ErrnoStatus("cannot read directory " + shown, err);
  std::sort(entries->begin(), entries->end());
  return Status::Ok();
}

// The ending of a file name that did not match, for the refusal: ".png", or "(none)" without a '.'.
std::string EndingOf(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == name.size()) return "(none)";
  return AsciiLower(name.substr(dot));
}

// What `rel` beneath the root is, following links that stay below it: kOk with *st filled;
// kEscapes (a link leading out: not followed, nothing outside is looked at); kAbsolute (an
// absolute link whose target is below the root, *st filled: openat2 RESOLVE_BENEATH refuses
// absolute links, so reads through it would fail); kGone (a dangling link, raced away,
// unreadable: ignored like before).
enum class Look { kOk, kEscapes, kAbsolute, kGone };
Look LookBeneath(const RootDir& root, const std::string& rel, struct stat* st) {
  auto fd = root.OpenBeneathWith(rel, O_PATH);
  if (fd.ok()) return ::fstat(fd->get(), st) == 0 ? Look::kOk : Look::kGone;
  // OpenBeneath words an escape "... escapes its root ..." as kPermissionDenied.
  if (fd.status().code() != StatusCode::kPermissionDenied ||
      fd.status().message().find("escapes its root") == std::string::npos) {
    return Look::kGone;
  }
  // RESOLVE_BENEATH also refuses absolute links that point inside: tell them apart with the
  // thread's own rights (the job's user), never naming the target.
  std::unique_ptr<char, decltype(&std::free)> real(::realpath((root.real_path() + "/" + rel).c_str(), nullptr),
                                                   &std::free);
  if (!real) return Look::kGone;  // dangling
  const std::string r(real.get());
  const std::string& base = root.real_path();
  const bool inside =
      base == "/" || (r.compare(0, base.size(), base) == 0 && (r.size() == base.size() || r[base.size()] == '/'));
  if (!inside) return Look::kEscapes;
  return ::stat(real.get(), st) == 0 ? Look::kAbsolute : Look::kGone;
}

// Appends to *files the matching regular files below root/rel (rel non-empty), as paths relative
// to root, and counts the regular files that did not match in *others, by ending. Skips
// directories already in *seen.
Status CollectFiles(const RootDir& root, const std::string& rel, const std::vector<std::string>& lower_exts,
                    std::set<DirId>* seen, std::vector<std::string>* files, std::map<std::string, uint64_t>* others,
                    std::vector<FileStamp>* listed) {
  std::vector<Entry> entries;
  SPDL_RETURN_IF_ERROR(ListVisible(root, rel, &entries));
  for (const Entry& e : entries) {
    const std::string child = rel + "/" + e.name;
    // A plain file needs no stat (ImageNet has 1.3M of them); links and unknown types do.
    if (e.type == DT_REG) {
      if (HasExtension(e.name, lower_exts)) {
        files->push_back(child);
      } else {
        ++(*others)[EndingOf(e.name)];
      }
      continue;
    }
    if (e.type != DT_DIR && e.type != DT_LNK && e.type != DT_UNKNOWN) continue;
    struct stat st {};
    const Look look = LookBeneath(root, child, &st);
    if (look == Look::kEscapes || (look == Look::kAbsolute && !S_ISDIR(st.st_mode))) {
      // Not followed. Kept when it is named like a sample, so that its Read says why it fails.
      if (HasExtension(e.name, lower_exts)) files->push_back(child);
      continue;
    }
    if (look == Look::kGone || look == Look::kAbsolute) continue;  // dangling, raced away; an absolute dir link
    if (S_ISDIR(st.st_mode)) {
      if (!seen->insert({st.st_dev, st.st_ino}).second) continue;
      if (listed) listed->push_back(MakeStamp(root.path() + "/" + child, st));
      SPDL_RETURN_IF_ERROR(CollectFiles(root, child, lower_exts, seen, files, others, listed));
    } else if (S_ISREG(st.st_mode)) {
      if (HasExtension(e.name, lower_exts)) {
        files->push_back(child);
      } else {
        ++(*others)[EndingOf(e.name)];
      }
    }
  }
  return Status::Ok();
}

std::string JoinExtensions(const std::vector<std::string>& exts) {
  std::string s;
  for (const std::string& e : exts) s += (s.empty() ? "" : ", ") + e;
  return s;
}

// "48 .png, 2 .txt": the endings of the files that did not match, the most frequent first (at
// most 5, then "..."). REQUIRES: others is not empty.
std::string DescribeOthers(const std::map<std::string, uint64_t>& others) {
  std::vector<std::pair<uint64_t, std::string>> byCount;
  byCount.reserve(others.size());
  for (const auto& [ending, n] : others) byCount.emplace_back(n, ending);
  std::stable_sort(byCount.begin(), byCount.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string s;
  for (size_t i = 0; i < byCount.size() && i < 5; ++i) {
    s += (i ? ", " : "") + std::to_string(byCount[i].first) + " " + byCount[i].second;
  }
  if (byCount.size() > 5) s += ", ...";
  return s;
}

}  // namespace

Result<Manifest> ScanImageFolder(const std::string& root, const std::vector<std::string>& extensions,
                                 std::vector<FileStamp>* listed_dirs) {
  const std::string what = "image folder " + root;
  if (extensions.empty()) return InvalidArgument(what + ": no file extensions given");
  std::vector<std::string> lower_exts;
  for (const std::string& e : extensions) {
    if (e.empty() || e == ".") return InvalidArgument(what + ": empty file extension");
    lower_exts.push_back(AsciiLower(e[0] == '.' ? e : "." + e));
  }

  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound(what + ": the root does not exist");
    return ErrnoStatus(what, err);
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(what + ": the root is not a directory");
  SPDL_ASSIGN_OR_RETURN(std::shared_ptr<const RootDir> dir, RootDir::Open(root));

  if (listed_dirs) listed_dirs->push_back(MakeStamp(root, st));
  Manifest m;
  m.root = root;
  std::vector<Entry> entries;
  SPDL_RETURN_IF_ERROR(ListVisible(*dir, ".", &entries));
  std::set<DirId> seen{{st.st_dev, st.st_ino}};
  std::vector<std::string> files;
  std::map<std::string, uint64_t> others;  // files left out by `extensions`, by ending
  for (const Entry& e : entries) {
    const std::string& name = e.name;
    struct stat cst {};
    if (e.type == DT_REG) continue;
    const Look look = LookBeneath(*dir, name, &cst);
    if (look == Look::kEscapes) {
      return PermissionDenied(what + ": " + name +
                              " is a symbolic link that escapes the root (not followed; only links that stay "
                              "below the root are)");
    }
    if (look == Look::kAbsolute && S_ISDIR(cst.st_mode)) {
      return PermissionDenied(what + ": " + name +
                              " is an absolute symbolic link; class folders may be relative links that stay below "
                              "the root (files are opened beneath the root, which refuses absolute links)");
    }
    if (look == Look::kGone || !S_ISDIR(cst.st_mode)) continue;
    const auto label = static_cast<int64_t>(m.classes.size());
    m.classes.push_back(name);
    if (!seen.insert({cst.st_dev, cst.st_ino}).second) continue;
    if (listed_dirs) listed_dirs->push_back(MakeStamp(root + "/" + name, cst));
    files.clear();
    SPDL_RETURN_IF_ERROR(CollectFiles(*dir, name, lower_exts, &seen, &files, &others, listed_dirs));
    std::sort(files.begin(), files.end());
    for (std::string& f : files) m.samples.push_back(SampleRef{std::move(f), label});
  }
  if (m.samples.empty() && !others.empty()) {
    uint64_t total = 0;
    for (const auto& [ending, n] : others) total += n;
    return NotFound(what + ": found " + std::to_string(total) + " files in its " + std::to_string(m.classes.size()) +
                    " class sub-directories, none with the endings [" + JoinExtensions(lower_exts) + "] (" +
                    DescribeOthers(others) + "); set source.extensions");
  }
  if (m.samples.empty()) {
    return NotFound(what + ": no files with extension " + JoinExtensions(extensions) +
                    " found in its class sub-directories (" + std::to_string(m.classes.size()) + " classes)");
  }
  return m;
}

}  // namespace spdl::io
