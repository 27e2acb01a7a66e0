// Honest skips for Catch2 2.13 (Debian's), which has no SKIP macro:
//   SPDL_SKIP(reason)       the case cannot run here (no CUDA device, not root, a tool missing):
//                           records the reason and returns from the TEST_CASE body.
//   SPDL_SKIP_PART(reason)  a part of the case cannot run here (one format without an encoder, the
//                           unreadable-file check as root): records the reason and goes on.
// tests/test_main.cc prints every reason at exit and exits with kSkipExitCode unless something
// failed; ctest (SKIP_RETURN_CODE, set by spdl_add_test) then shows the case as "Skipped", not
// "Passed". A failed check in the same run still fails the run: a skip never hides a failure.
//
// Thread-safe (the record is locked), though a skip belongs on the test's own thread.
#pragma once

#include <catch2/catch.hpp>
#include <sstream>
#include <string>

namespace spdl::testing {

// The exit status of a test process whose cases skipped and none failed (ctest SKIP_RETURN_CODE).
inline constexpr int kSkipExitCode = 77;

// Records that the current test case skipped, and why (tests/test_main.cc).
void RecordSkip(const std::string& reason);

}  // namespace spdl::testing

#define SPDL_SKIP_PART(reason)                                                    \
  do {                                                                            \
    std::ostringstream spdl_skip_os_;                                             \
    spdl_skip_os_ << reason; /* NOLINT(bugprone-macro-parentheses): a << chain */ \
    WARN("SKIPPED: " << spdl_skip_os_.str());                                     \
    ::spdl::testing::RecordSkip(spdl_skip_os_.str());                             \
  } while (0)

#define SPDL_SKIP(reason)   \
  do {                      \
    SPDL_SKIP_PART(reason); \
    return;                 \
  } while (0)
