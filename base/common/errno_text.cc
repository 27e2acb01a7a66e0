#include "common/errno_text.h"

#include <cstring>

namespace spdl {
namespace {

// strerror_r's result: glibc's GNU variant (the default in C++) returns the text, which may or may
// not be in the buffer; the XSI variant returns 0 and fills the buffer.
[[maybe_unused]] const char* StrerrorResult(const char* text, const char* /*buf*/) { return text; }
[[maybe_unused]] const char* StrerrorResult(int rc, const char* buf) { return rc == 0 ? buf : "Unknown error"; }

}  // namespace

std::string ErrnoText(int err) {
  char buf[256];
  return StrerrorResult(strerror_r(err, buf, sizeof(buf)), buf);
}

}  // namespace spdl
