// A C++ op that breaks the C ABI: its apply throws. spdld must catch it at the call, fail the
// sample, and keep running. Compiled by tests/e2e/plugin_ops_test.cc with `c++ -shared -fPIC`.
#include <stdexcept>

#include "spdl/op.h"

namespace {
void* Create(const char*, char*, size_t) { return new int(0); }
int Apply(void*, spdl_image*, uint64_t, char*, size_t) { throw std::runtime_error("boom from a C++ op"); }
void Destroy(void* s) { delete static_cast<int*>(s); }
const spdl_op kOps[] = {{SPDL_OP_ABI_VERSION, "throws", Create, Apply, Destroy}};
}  // namespace

extern "C" const spdl_op* spdl_ops(int32_t* count) {
  *count = 1;
  return kOps;
}
