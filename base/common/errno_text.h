// ErrnoText: the text of an errno value, for messages; a free function, thread-safe.
#pragma once

#include <string>

namespace spdl {

// The text of `err` as strerror(3) gives it ("No such file or directory"). Thread-safe, unlike
// strerror, whose buffer another thread's call may overwrite (strerror_r).
std::string ErrnoText(int err);

}  // namespace spdl
