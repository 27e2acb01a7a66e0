#include "io/brace_expand.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <utility>

namespace spdl::io {
namespace {

bool AllDigits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// The alternatives of one group's body (the text between the braces), or an error message.
std::string Alternatives(std::string_view body, std::vector<std::string>* alts, size_t max_results) {
  alts->clear();
  if (body.find(',') != std::string_view::npos) {
    size_t start = 0;
    for (;;) {
      const size_t comma = body.find(',', start);
      alts->emplace_back(body.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    return "";
  }
  const size_t dots = body.find("..");
  if (dots == std::string_view::npos) return "is neither a list {a,b} nor a range {0..9}";
  const std::string_view a = body.substr(0, dots), b = body.substr(dots + 2);
  if (!AllDigits(a) || !AllDigits(b)) return "is not a range of decimal integers >= 0";
  uint64_t from = 0, to = 0;
  if (std::from_chars(a.data(), a.data() + a.size(), from).ec != std::errc() ||
      std::from_chars(b.data(), b.data() + b.size(), to).ec != std::errc()) {
    return "has a number too large";
  }
  const bool pad = (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0');
  const size_t width = pad ? std::max(a.size(), b.size()) : 0;
  const uint64_t count = (from <= to ? to - from : from - to) + 1;
  if (count == 0 || count > max_results) return "expands to more than " + std::to_string(max_results) + " results";
  for (uint64_t i = 0; i < count; ++i) {
    std::string n = std::to_string(from <= to ? from + i : from - i);
    if (n.size() < width) n.insert(0, width - n.size(), '0');
    alts->push_back(std::move(n));
  }
  return "";
}

}  // namespace

Result<std::vector<std::string>> ExpandBraces(std::string_view pattern, size_t max_results) {
  auto error = [&](size_t at, const std::string& what) {
    return InvalidArgument("pattern '" + std::string(pattern) + "': " + what + " (at byte " + std::to_string(at) + ")");
  };
  std::vector<std::string> results{""};
  std::vector<std::string> alts, next;
  size_t i = 0;
  while (i < pattern.size()) {
    const size_t open = pattern.find_first_of("{}", i);
    const std::string_view literal =
        pattern.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    for (std::string& r : results) r += literal;
    if (open == std::string_view::npos) break;
    if (pattern[open] == '}') return error(open, "'}' without a matching '{'");
    const size_t close = pattern.find_first_of("{}", open + 1);
    if (close == std::string_view::npos) return error(open, "'{' without a matching '}'");
    if (pattern[close] == '{') return error(close, "nested braces are not supported");
    const std::string_view body = pattern.substr(open + 1, close - open - 1);
    const std::string bad = Alternatives(body, &alts, max_results);
    if (!bad.empty()) return error(open, "group {" + std::string(body) + "} " + bad);
    if (results.size() * alts.size() > max_results) {
      return error(open, "expands to more than " + std::to_string(max_results) + " results");
    }
    next.clear();
    next.reserve(results.size() * alts.size());
    for (const std::string& r : results) {
      for (const std::string& a : alts) next.push_back(r + a);
    }
    results.swap(next);
    i = close + 1;
  }
  return results;
}

}  // namespace spdl::io
