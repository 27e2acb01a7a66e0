// FUZZ_CHECK: an invariant of a fuzz target. Unlike assert() it is never compiled out; a failure
// prints the condition and aborts, so libFuzzer reports a crash and saves the input.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                                \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)

// FUZZ_TRACE: with FUZZ_TRACE=1 in the environment, a target prints what each input came to (for
// reproducing a finding and for checking that the seeds get past the parsers).
#define FUZZ_TRACE(...)                                                     \
  do {                                                                      \
    static const bool fuzz_trace_on = std::getenv("FUZZ_TRACE") != nullptr; \
    if (fuzz_trace_on) std::fprintf(stderr, __VA_ARGS__);                   \
  } while (0)
