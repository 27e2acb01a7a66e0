// Allowed data roots: the daemon reads only files below the directories its config allows, even
// though a client names the dataset. A pure function over the file system: safe from any thread.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::io {

// Resolves `path` with realpath (following every symbolic link and "..") and returns the resolved
// path when it is equal to or below one of `allowed_roots` (each also realpath'd). Below means
// whole path components: /data2/x is not below /data. A root that does not exist allows nothing.
// Errors: no allowed roots configured, or the resolved path is outside them -> kPermissionDenied
// ("PATH resolves to REAL, which is not below any allowed root (A, B)"); `path` missing ->
// kNotFound; a symbolic link loop -> kInvalidArgument; each naming the path.
// Note: the answer holds for the moment of the call; open the returned path, not `path`.
Result<std::string> ResolveUnderRoots(const std::string& path, const std::vector<std::string>& allowed_roots);

}  // namespace spdl::io
