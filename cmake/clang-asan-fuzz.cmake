# Initial cache (cmake -C) of the one clang build that CI uses for both the fuzzing and the
# ASan+UBSan unit tests (build-fuzz; scripts/fuzz.sh and scripts/sanitize.sh with
# SANITIZE_ASAN_BUILD=fuzz): every library is compiled once with
# -fsanitize=fuzzer-no-link,address,undefined at -O1 -g (libFuzzer's recommendation; asserts on),
# the fuzz targets are linked with -fsanitize=fuzzer, the test executables with Catch2's main. The
# test executables' own sources are compiled -O0: they are not fuzzed, and under the sanitizers
# -O1 costs them about three times the compile time.
set(CMAKE_C_COMPILER clang CACHE STRING "")
set(CMAKE_CXX_COMPILER clang++ CACHE STRING "")
set(CMAKE_BUILD_TYPE RelWithDebInfo CACHE STRING "")
set(CMAKE_C_FLAGS_RELWITHDEBINFO "-O1 -g" CACHE STRING "")
set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O1 -g" CACHE STRING "")
set(SPDL_SANITIZE "fuzzer-no-link,address,undefined" CACHE STRING "")
set(SPDL_FUZZ ON CACHE BOOL "")
set(SPDL_CUDA OFF CACHE STRING "")
set(SPDL_TEST_COMPILE_OPTIONS "-O0" CACHE STRING "")
