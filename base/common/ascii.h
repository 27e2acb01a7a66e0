// ASCII text helpers for protocol and file-name text (URL schemes and hosts, HTTP header names, file
// extensions, config words): locale-independent, bytes >= 0x80 unchanged. Pure functions.
#pragma once

#include <string>
#include <string_view>

namespace spdl {

// `s` with A-Z turned to a-z.
inline std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace spdl
