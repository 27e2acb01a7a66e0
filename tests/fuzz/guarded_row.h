// GuardedRow: a destination row for a decoder, exactly `size` bytes, between two 64-byte guards.
// The guards are ASan-poisoned, so an instrumented write past either end is reported where it
// happens; FFmpeg, swscale and libjpeg-turbo are not instrumented, so the guards also hold a
// pattern that CheckGuards() verifies after the call: a write there by any code is a broken
// invariant (in the daemon the row is one of a slot's rows in shared memory, and the bytes past
// it are the next sample's row, written concurrently by another worker).
#pragma once

#include <sanitizer/asan_interface.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>

#include "fuzz_check.h"

class GuardedRow {
 public:
  static constexpr size_t kGuard = 64;
  static constexpr uint8_t kPattern = 0xa5;

  GuardedRow(size_t size, uint8_t fill) : size_(size), mem_(new uint8_t[size + 2 * kGuard]) {
    std::memset(mem_.get(), kPattern, kGuard);
    std::memset(data(), fill, size_);
    std::memset(data() + size_, kPattern, kGuard);
    ASAN_POISON_MEMORY_REGION(mem_.get(), kGuard);
    ASAN_POISON_MEMORY_REGION(data() + size_, kGuard);
  }
  ~GuardedRow() {
    ASAN_UNPOISON_MEMORY_REGION(mem_.get(), kGuard);
    ASAN_UNPOISON_MEMORY_REGION(data() + size_, kGuard);
  }
  GuardedRow(const GuardedRow&) = delete;
  GuardedRow& operator=(const GuardedRow&) = delete;

  uint8_t* data() { return mem_.get() + kGuard; }
  size_t size() const { return size_; }

  // Aborts (a finding) when a byte of either guard changed, saying which and where.
  void CheckGuards() {
    ASAN_UNPOISON_MEMORY_REGION(mem_.get(), kGuard);
    ASAN_UNPOISON_MEMORY_REGION(data() + size_, kGuard);
    for (size_t i = 0; i < kGuard; ++i) {
      if (mem_[i] != kPattern) {
        std::fprintf(stderr, "row of %zu bytes: byte %zd (before the row) was written\n", size_,
                     static_cast<ptrdiff_t>(i) - static_cast<ptrdiff_t>(kGuard));
      }
      if (data()[size_ + i] != kPattern) {
        std::fprintf(stderr, "row of %zu bytes: byte %zu (past the end) was written\n", size_, size_ + i);
      }
    }
    bool intact = true;
    for (size_t i = 0; i < kGuard; ++i) intact = intact && mem_[i] == kPattern && data()[size_ + i] == kPattern;
    FUZZ_CHECK(intact && "a decoder wrote outside its row");
    ASAN_POISON_MEMORY_REGION(mem_.get(), kGuard);
    ASAN_POISON_MEMORY_REGION(data() + size_, kGuard);
  }

 private:
  size_t size_;
  std::unique_ptr<uint8_t[]> mem_;
};
