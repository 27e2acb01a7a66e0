// The one Catch2 main shared by every test executable, with honest skips: Debian's Catch2 (2.13)
// has no SKIP, so a test case that cannot run here calls SPDL_SKIP(reason) (tests/skip.h), which
// records the reason and returns. When the run had skips and no failure, main prints the reasons
// and exits with kSkipExitCode, which ctest reports as "Skipped" (SKIP_RETURN_CODE, set for every
// test by spdl_add_test in tests/CMakeLists.txt; catch_discover_tests makes one ctest entry per
// case, so the skip is that case's). A failure anywhere wins over a skip.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

#include "skip.h"

namespace spdl::testing {
namespace {
std::mutex skips_mu;
std::vector<std::string>& Skips() {
  static std::vector<std::string> skips;  // this test process's skips (main reads them at exit)
  return skips;
}
}  // namespace

void RecordSkip(const std::string& reason) {
  std::lock_guard lock(skips_mu);
  Skips().push_back(Catch::getResultCapture().getCurrentTestName() + ": " + reason);
}
}  // namespace spdl::testing

int main(int argc, char* argv[]) try {
  int failed = Catch::Session().run(argc, argv);
  std::lock_guard lock(spdl::testing::skips_mu);
  const auto& skips = spdl::testing::Skips();
  if (failed != 0) return failed == spdl::testing::kSkipExitCode ? failed + 1 : failed;
  if (skips.empty()) return 0;
  for (const std::string& s : skips) std::printf("SKIPPED: %s\n", s.c_str());
  return spdl::testing::kSkipExitCode;
} catch (const std::exception& e) {  // outside a test case (Catch2 catches inside): a failure, not abort()
  std::fprintf(stderr, "test main: %s\n", e.what());
  return 1;
}
