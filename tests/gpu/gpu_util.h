// Shared by the [gpu] tests and their helper processes: the byte pattern of batch `seq`, hex
// encoding of protobuf messages for the line protocol on the helper's stdin/stdout, and the skip
// rule for machines without a CUDA device.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>

namespace spdl::gpu_test {

// Byte j of a slot holding batch `seq`: differs between batches, and within a slot across pages.
inline uint8_t Pattern(uint64_t seq, uint64_t j) { return static_cast<uint8_t>(seq * 131 + j * 7 + (j >> 12)); }

// The decimal number at the start of a command-line argument, 0 when there is none (as atoi).
inline int ArgInt(const char* s) {
  int v = 0;
  (void)std::from_chars(s, s + std::strlen(s), v);  // no number: v stays 0
  return v;
}

inline std::string ToHex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

// False on a malformed string.
inline bool FromHex(const std::string& hex, std::string* out) {
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (hex.size() % 2 != 0) return false;
  out->clear();
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = val(hex[i]), lo = val(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

}  // namespace spdl::gpu_test
