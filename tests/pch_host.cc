// Builds the test executables' precompiled header (tests_pch.h) with their flags: spdl_test_pch in
// tests/CMakeLists.txt. No test cases: it is not registered with ctest.
