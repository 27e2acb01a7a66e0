// Visiting the fields of a plain aggregate struct (no base classes, no user-declared constructors,
// every field public) one by one, in declaration order, without naming them: the number of fields
// is found by aggregate initialization, the fields are reached by a structured binding. Used so that
// the resume fingerprint (jobs/resume_token.h) covers every field of the job config, including
// fields added later, without a list of fields to keep up to date.
//
// ForEachField(s, f) calls f(field) for each field of `s`. A struct with more than kMaxFields
// fields, or one that is not an aggregate, does not compile (static_assert).
//
// Pure templates; safe from any thread.
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

namespace spdl::jobs::fields {

inline constexpr size_t kMaxFields = 48;

namespace internal {

// Converts to any type; only in unevaluated aggregate-initialization tests.
struct AnyField {
  template <typename T>
  operator T() const;  // NOLINT: implicit on purpose
};

template <typename T, size_t... I>
constexpr bool InitializableWith(std::index_sequence<I...>) {
  return requires { T{(static_cast<void>(I), AnyField{})...}; };
}

// The largest N <= kMaxFields such that T{AnyField x N} compiles: the number of fields. (An
// initializer converts to a whole field, so no brace elision splits an array or struct field.)
template <typename T, size_t N = 0>
constexpr size_t CountFields() {
  if constexpr (N > kMaxFields) {
    return N;
  } else if constexpr (InitializableWith<T>(std::make_index_sequence<N + 1>{})) {
    return CountFields<T, N + 1>();
  } else {
    return N;
  }
}

}  // namespace internal

template <typename T>
inline constexpr size_t kFieldCount = internal::CountFields<std::remove_cvref_t<T>>();

template <typename T, typename F>
void ForEachField(const T& s, F&& f) {
  static_assert(std::is_aggregate_v<T>, "ForEachField needs a plain aggregate struct");
  constexpr size_t n = kFieldCount<T>;
  static_assert(n <= kMaxFields, "more fields than ForEachField handles: raise kMaxFields");
  if constexpr (n == 0) {
  }
  else if constexpr (n == 1) {
    const auto& [a0] = s;
    f(a0);
  }
  else if constexpr (n == 2) {
    const auto& [a0, a1] = s;
    f(a0); f(a1);
  }
  else if constexpr (n == 3) {
    const auto& [a0, a1, a2] = s;
    f(a0); f(a1); f(a2);
  }
  else if constexpr (n == 4) {
    const auto& [a0, a1, a2, a3] = s;
    f(a0); f(a1); f(a2); f(a3);
  }
  else if constexpr (n == 5) {
    const auto& [a0, a1, a2, a3, a4] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4);
  }
  else if constexpr (n == 6) {
    const auto& [a0, a1, a2, a3, a4, a5] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5);
  }
  else if constexpr (n == 7) {
    const auto& [a0, a1, a2, a3, a4, a5, a6] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6);
  }
  else if constexpr (n == 8) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7);
  }
  else if constexpr (n == 9) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8);
  }
  else if constexpr (n == 10) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9);
  }
  else if constexpr (n == 11) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10);
  }
  else if constexpr (n == 12) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11);
  }
  else if constexpr (n == 13) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12);
  }
  else if constexpr (n == 14) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13);
  }
  else if constexpr (n == 15) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14);
  }
  else if constexpr (n == 16) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15);
  }
  else if constexpr (n == 17) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16);
  }
  else if constexpr (n == 18) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17);
  }
  else if constexpr (n == 19) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18);
  }
  else if constexpr (n == 20) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19);
  }
  else if constexpr (n == 21) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20);
  }
  else if constexpr (n == 22) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21);
  }
  else if constexpr (n == 23) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22);
  }
  else if constexpr (n == 24) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23);
  }
  else if constexpr (n == 25) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24);
  }
  else if constexpr (n == 26) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25);
  }
  else if constexpr (n == 27) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26);
  }
  else if constexpr (n == 28) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27);
  }
  else if constexpr (n == 29) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28);
  }
  else if constexpr (n == 30) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29);
  }
  else if constexpr (n == 31) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30);
  }
  else if constexpr (n == 32) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31);
  }
  else if constexpr (n == 33) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32);
  }
  else if constexpr (n == 34) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33);
  }
  else if constexpr (n == 35) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34);
  }
  else if constexpr (n == 36) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35);
  }
  else if constexpr (n == 37) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36);
  }
  else if constexpr (n == 38) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37);
  }
  else if constexpr (n == 39) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38);
  }
  else if constexpr (n == 40) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39);
  }
  else if constexpr (n == 41) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40);
  }
  else if constexpr (n == 42) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40); f(a41);
  }
  else if constexpr (n == 43) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40); f(a41); f(a42);
  }
  else if constexpr (n == 44) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40); f(a41); f(a42); f(a43);
  }
  else if constexpr (n == 45) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40); f(a41); f(a42); f(a43); f(a44);
  }
  else if constexpr (n == 46) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40); f(a41); f(a42); f(a43); f(a44); f(a45);
  }
  else if constexpr (n == 47) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40); f(a41); f(a42); f(a43); f(a44); f(a45); f(a46);
  }
  else if constexpr (n == 48) {
    const auto& [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35, a36, a37, a38, a39, a40, a41, a42, a43, a44, a45, a46, a47] = s;
    f(a0); f(a1); f(a2); f(a3); f(a4); f(a5); f(a6); f(a7); f(a8); f(a9); f(a10); f(a11); f(a12); f(a13); f(a14); f(a15); f(a16); f(a17); f(a18); f(a19); f(a20); f(a21); f(a22); f(a23); f(a24); f(a25); f(a26); f(a27); f(a28); f(a29); f(a30); f(a31); f(a32); f(a33); f(a34); f(a35); f(a36); f(a37); f(a38); f(a39); f(a40); f(a41); f(a42); f(a43); f(a44); f(a45); f(a46); f(a47);
  }
}

}  // namespace spdl::jobs::fields
