// The precompiled header of the test executables (tests/CMakeLists.txt, SPDL_TEST_PCH): Catch2's
// single header and the standard headers that most tests include, parsed once per build instead of
// once per test source. Only third-party and standard headers: a project header here would make every
// test recompile when it changes. Each test still includes what it uses (the build is the same
// without this header: -DSPDL_TEST_PCH=OFF).
#pragma once

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
