// ReadFile: reads one whole sample file into a reusable buffer. Safe to call from many threads at
// once (each with its own buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::io {

// Replaces *out with the contents of the regular file `path`, reusing out's capacity. The size is
// taken when the file is opened; a file that shrinks meanwhile yields what was there.
// Errors, each naming the path: missing -> kNotFound; unreadable -> kPermissionDenied; a directory,
// fifo, socket or device -> kInvalidArgument (never blocks on a fifo); larger than `max_bytes` ->
// kResourceExhausted; an I/O error -> its errno's code. On error *out is left empty.
// REQUIRES: out != nullptr.
Status ReadFile(const std::string& path, std::vector<uint8_t>* out, size_t max_bytes = 1ull << 30);

}  // namespace spdl::io
