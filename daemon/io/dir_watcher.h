// DirWatcher: a folder laid out like an image folder (root/<class>/<file>, io/manifest.h) watched
// with inotify, reporting each new complete file once. What `source.type: watch` is made of.
//
// What is reported, and when:
// - A file is complete when it was closed after being written (IN_CLOSE_WRITE) or renamed into
//   place (IN_MOVED_TO), and no process still holds it open for writing. The last is checked with a
//   read lease (fcntl F_SETLEASE F_RDLCK, refused with EAGAIN while any writer has the file open,
//   released at once): a file closed by one writer while another still writes it, or renamed into
//   place while still open for writing, is reported at its last close instead. Where the kernel
//   refuses the lease for another reason (a file system without leases, a file of another owner
//   while the daemon lacks CAP_LEASE), the event is trusted (leases_refused() counts them).
// - Files already there when the watcher opens: with include_existing they are reported by the
//   first Poll (class by class in label order, each class's files sorted, as image_folder orders
//   them) unless still open for writing (then at their close); without, every file complete at the
//   start is left out and one still being written is reported when it completes. An empty file
//   found by a scan (not by an event) is not reported from the scan: a file that has just been
//   created is empty, and its close follows. Every directory is watched before it is listed, so a
//   file created during the listing is reported once (found twice, reported once).
// - Once: a file is reported once per name for as long as it keeps that name in the tree. The
//   watcher remembers the (name, inode) of every reported file still present (memory grows with
//   the files present in the folder, as an image folder's manifest does; a deleted file is
//   forgotten). Rewriting a reported file in place does not report it again; renaming a new file
//   over it, or deleting it and writing it again, does (a new inode). A file renamed within the
//   tree counts as new at its new name; so do the files of a directory renamed within the tree.
// - Which files: as ScanImageFolder: regular files whose name ends in one of the extensions
//   (case-insensitively), in a class folder (a sub-directory of the root) or any directory below
//   one, every directory watched; names starting with '.' ignored (write into ".name.tmp" and rename
//   it into place); files directly in the root ignored. Symbolic links are not followed (neither
//   watched directories nor reported files), and every open is beneath the root (RootDir).
// - Labels: the class folders present at Open, sorted bytewise, are labels 0..n-1 (as image_folder
//   numbers them); a class folder that appears later takes the next label, in the order the watcher
//   sees them (sorted by name among those found by one rescan). A label never changes while the
//   watcher lives; a class folder deleted and made again keeps its label. With `classes` given, the
//   labels are fixed (index in that list: the same across restarts), and a folder not in it is
//   ignored (ignored_folders()).
// - Overflow: when the kernel's event queue overflows (IN_Q_OVERFLOW, fs.inotify.max_queued_events)
//   the watcher rescans the whole tree: files it missed are reported, reported files are not
//   reported again, deletions it missed are forgotten.
// Every file-system access (watches, listings, opens, leases) runs with `identity`'s rights
// (io/fs_identity.h), on whichever thread calls Open or Poll.
//
// Thread safety: Poll and Read must be called by one thread at a time (the owner); Wake and stats()
// may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "io/fs_identity.h"
#include "io/read_file.h"

namespace spdl::io {

struct DirWatchOptions {
  std::vector<std::string> extensions;  // like ".jpg" (a missing dot is added); at least one
  bool include_existing = true;         // report the files complete at Open (existing: include)
  std::vector<std::string> classes;     // fixed class folders (label = index); empty: discovered
};

// One new complete file.
struct WatchedFile {
  std::string path;   // relative to the root, '/'-separated: "cat/x.jpg"
  int64_t label = 0;  // index into DirWatcher::classes()
  uint64_t size = 0;  // bytes when it was found complete
  dev_t dev = 0;      // the file's identity when found complete (Read checks it)
  ino_t ino = 0;
};

class DirWatcher {
 public:
  struct Stats {
    uint64_t files_reported = 0;   // files reported complete (Poll)
    uint64_t pending = 0;          // files seen but still being written (created, or open for writing)
    uint64_t overflows = 0;        // kernel queue overflows, each followed by a rescan
    uint64_t watched_dirs = 0;     // directories watched now (the root included)
    uint64_t leases_refused = 0;   // completeness checks the kernel refused (event trusted)
    uint64_t ignored_folders = 0;  // class folders left out because `classes` does not name them
  };

  // Opens `root` (resolved under `allowed_roots`, io/allowed_roots.h), watches it and every
  // directory below it, and lists them (include_existing: their complete files are what the first
  // Poll reports). identity == nullptr: the daemon's own rights.
  // Errors: those of ResolveUnderRoots; root not a directory -> kInvalidArgument; no extensions ->
  // kInvalidArgument; a class named twice or empty in `classes` -> kInvalidArgument; the kernel's
  // watch limit reached -> kResourceExhausted naming fs.inotify.max_user_watches; unreadable ->
  // kPermissionDenied; each naming the path.
  static Result<std::unique_ptr<DirWatcher>> Open(const std::string& root,
                                                  const std::vector<std::string>& allowed_roots,
                                                  DirWatchOptions options, std::shared_ptr<const FsIdentity> identity);
  ~DirWatcher();
  DirWatcher(const DirWatcher&) = delete;
  DirWatcher& operator=(const DirWatcher&) = delete;

  // Waits up to timeout_ms (0: does not wait; < 0: until something or Wake) for new complete files
  // and appends them to *out, in the order found. Returns Ok with nothing appended after the
  // timeout or a Wake. Errors: the root was deleted -> kNotFound (the watcher is then
  // done: every later Poll fails the same); the watch limit reached for a new directory ->
  // kResourceExhausted (later Polls go on with the directories watched). REQUIRES: out != nullptr.
  Status Poll(int timeout_ms, std::vector<WatchedFile>* out);

  // Makes a Poll in progress (or the next one) return at once. Any thread.
  void Wake();

  // Reads the reported file `file` beneath the root with the watcher's identity into *out.
  // Errors: the file is gone or was replaced since it was reported (another inode at its name,
  // reported on its own) -> kNotFound; larger than max_bytes -> kResourceExhausted; others as
  // RootDir::ReadFile.
  Status Read(const WatchedFile& file, std::vector<uint8_t>* out, size_t max_bytes = 1ull << 30) const;

  // label -> class folder name, as of the last Poll (only grows). Owner thread.
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& root() const { return root_->path(); }
  // Any thread.
  Stats stats() const;

 private:
  struct Dir {
    std::string rel;     // relative to the root ("." for the root itself)
    int64_t label = -1;  // the class of the files below it (-1: the root)
  };
  DirWatcher(std::shared_ptr<const RootDir> root, DirWatchOptions options, std::vector<std::string> lower_exts,
             std::shared_ptr<const FsIdentity> identity, UniqueFd inotify, UniqueFd wake, UniqueFd root_fd);

  Status WatchAndScan(const std::string& rel, int64_t label, bool report);
  Status AddClassFolder(const std::string& name, bool report);
  Status ScanRootForClasses(bool report);
  void Consider(const std::string& rel, int64_t label, bool from_scan, bool report);
  Status HandleEvents(const char* buf, size_t len, bool* overflow);
  Status Rescan();
  void ForgetDir(int wd);
  void ForgetBelow(const std::string& rel);
  bool Matches(const std::string& name) const;
  void PublishStats();

  // Constant after construction.
  const std::shared_ptr<const RootDir> root_;
  const DirWatchOptions options_;
  const std::vector<std::string> lower_exts_;
  const std::shared_ptr<const FsIdentity> identity_;
  const UniqueFd inotify_;
  const UniqueFd wake_;     // eventfd
  const UniqueFd root_fd_;  // O_PATH: whether the root was deleted

  // Owner thread only.
  std::vector<std::string> classes_;
  std::map<std::string, int64_t> label_of_;                  // class folder name -> label
  std::unordered_map<int, Dir> dirs_;                        // watch descriptor -> directory
  std::map<std::string, int> wd_of_;                         // directory rel -> watch descriptor
  std::map<std::string, std::pair<dev_t, ino_t>> reported_;  // reported files still present
  std::set<std::string> pending_;                            // seen, not yet complete
  std::set<std::string> ignored_;                            // class folders not in options_.classes
  std::vector<WatchedFile> ready_;                           // found, not yet returned by Poll
  Status failed_;                                            // the root is gone: every Poll returns this
  uint64_t files_reported_ = 0, overflows_ = 0, leases_refused_ = 0;
  std::set<std::string>* rescan_files_ = nullptr;  // during Rescan: every file found
  std::set<std::string>* rescan_dirs_ = nullptr;   // during Rescan: every directory watched

  // Published for stats() (any thread).
  std::atomic<uint64_t> stat_reported_{0}, stat_pending_{0}, stat_overflows_{0}, stat_dirs_{0}, stat_leases_{0},
      stat_ignored_{0};
};

}  // namespace spdl::io
