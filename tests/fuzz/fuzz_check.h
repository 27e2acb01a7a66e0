// FUZZ_CHECK: an invariant of a fuzz target. Unlike assert() it is never compiled out; a failure
// prints the condition and aborts, so libFuzzer reports a crash and saves the input.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);    \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)
