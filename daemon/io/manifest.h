// Manifest: the list of samples of a dataset (relative paths and labels), and the sources that
// build one. Plain values and pure functions over the file system: safe to call from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/source_index_cache.h"

namespace spdl::io {

// One sample: a file and its class label.
struct SampleRef {
  std::string path;   // relative to Manifest::root, '/'-separated
  int64_t label = 0;  // index into Manifest::classes
};

struct Manifest {
  std::string root;                  // as given to the source (not resolved)
  std::vector<std::string> classes;  // label -> class name
  std::vector<SampleRef> samples;    // in a fixed order; the sampler indexes into it
};

// Scans an image folder laid out as root/<class>/<file> (torchvision's ImageFolder).
// - classes: the sorted (bytewise) names of root's sub-directories; a class's label is its index.
//   A class directory with no matching file keeps its label (so labels depend only on the names).
// - samples: class by class in label order, each class's files sorted (bytewise) by path. Files in
//   nested sub-directories belong to their top-level class. Files directly in root are ignored.
// - a file matches when its name ends in one of `extensions` (given like ".jpg"; a missing leading
//   dot is added), compared case-insensitively.
// - hidden files and directories (a name starting with '.') are ignored. Everything is opened
//   beneath the root (RootDir: openat2 RESOLVE_BENEATH): symbolic links that stay below the root
//   are followed, a link that leads out of it is never followed: a class folder that does -> the
//   scan fails (kPermissionDenied naming the link, never its target); a deeper one is kept as a
//   sample when its name matches (its Read then fails, "escapes its root") and ignored otherwise.
//   An absolute link whose target is below the root is not followed either (reads beneath the
//   root refuse absolute links): as a class folder it fails the scan saying so; deeper, a file is
//   kept (its Read fails), a directory ignored.
//   A directory reached twice (a link loop or two links to one place) is scanned once; anything
//   that is not a regular file or directory after following links (a dangling link, a fifo, a
//   device) is ignored.
// Errors: root missing -> kNotFound; not a directory -> kInvalidArgument; root or a directory below
// it unreadable -> kPermissionDenied naming it; no extensions -> kInvalidArgument; no sample found
// -> kNotFound naming the root and the extensions, and, when the class sub-directories hold files
// that `extensions` left out, how many and their endings ("found 48 files in its 2 class
// sub-directories, none with the endings [.jpg, .jpeg] (48 .png); set source.extensions"). Everything is read with the
// calling thread's rights (the job's user: fs_identity.h). listed_dirs (optional): receives the stamp of every
// directory listed (root first), each taken before it was listed, so a change made after shows as a newer mtime
// (SourceIndexCache).
Result<Manifest> ScanImageFolder(const std::string& root, const std::vector<std::string>& extensions,
                                 std::vector<FileStamp>* listed_dirs = nullptr);

}  // namespace spdl::io
