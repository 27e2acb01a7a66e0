// Allowed data roots: the daemon reads only files below the directories its config allows, even
// though a client names the dataset. A pure function over the file system: safe from any thread.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::io {

// Resolves `path` and returns the resolved path when it is equal to or below one of
// `allowed_roots` (each realpath'd). Below means whole path components: /data2/x is not below /data.
// A root that does not exist allows nothing. Two steps, so that no answer tells whether a path
// outside the roots exists:
//   1. by name only (LexicallyNormal, touching nothing): a path named outside every root (as
//      configured or resolved) -> kPermissionDenied "PATH is not below any allowed root (A, B)",
//      the same text whether or not it exists;
//   2. realpath with the calling thread's rights (run it under the job's user, fs_identity.h): a
//      symbolic link leading out -> kPermissionDenied "PATH leads out of the allowed roots through a
//      symbolic link" (never naming where); missing -> kNotFound; unreadable -> kPermissionDenied;
//      a loop -> kInvalidArgument; each naming `path`.
// No allowed roots configured -> kPermissionDenied.
// Note: the answer holds for the moment of the call; open the returned path, not `path`.
Result<std::string> ResolveUnderRoots(const std::string& path, const std::vector<std::string>& allowed_roots);

// `path` made absolute (against the working directory) with ".", ".." and repeated slashes removed
// by name alone (no file system access, links not resolved): "/a/./b/../c//" -> "/a/c".
std::string LexicallyNormal(const std::string& path);

// The refusal for a path outside every allowed root: the same text for any such path.
Status OutsideRoots(const std::string& path, const std::vector<std::string>& allowed_roots);

}  // namespace spdl::io
