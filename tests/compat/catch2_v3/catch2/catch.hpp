// Catch2 v3 under the v2 header name. The tests are written against Catch2 2.13 (Debian 12's) and
// include <catch2/catch.hpp>; when the build finds Catch2 3 instead (tests/CMakeLists.txt), this
// folder comes first on the tests' include path and maps the few v2 spellings they use onto v3:
//   Approx (unqualified)              -> Catch::Approx
//   Catch::Contains(str)              -> Catch::Matchers::ContainsSubstring(str)
//   Catch::StartsWith / EndsWith      -> Catch::Matchers::StartsWith / EndsWith
// Everything else the tests use (TEST_CASE, SECTION, REQUIRE*, CHECK*, INFO, WARN, FAIL,
// REQUIRE_THAT, GENERATE, Catch::Session, Catch::getResultCapture) has the same name in both.
// A test that needs another v2-only name adds its mapping here, not a version check in the test.
#pragma once

#include <catch2/catch_all.hpp>
#include <string>

namespace Catch {
using Matchers::EndsWith;
using Matchers::StartsWith;
inline Matchers::StringContainsMatcher Contains(const std::string& str, CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(str, cs);
}
}  // namespace Catch

using Catch::Approx;
