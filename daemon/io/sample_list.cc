#include "io/sample_list.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <utility>

#include "io/allowed_roots.h"
#include "io/read_file.h"

namespace spdl::io {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

std::string_view Trim(std::string_view s) {
  while (!s.empty() && IsBlank(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsBlank(s.back())) s.remove_suffix(1);
  return s;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Quotes a field for an error message, shortened when long.
std::string Show(std::string_view s) {
  constexpr size_t kMax = 60;
  if (s.size() <= kMax) return "'" + std::string(s) + "'";
  return "'" + std::string(s.substr(0, kMax)) + "...'";
}

// Splits one line (trimmed, not blank, not a comment) into item and optional label text.
// Returns an error message, or "" on success.
std::string SplitLine(std::string_view line, std::string* item, std::string_view* label, bool* has_label) {
  item->clear();
  *has_label = false;
  std::string_view rest;
  if (line.front() == '"') {
    size_t i = 1;
    bool closed = false;
    while (i < line.size()) {
      if (line[i] == '"') {
        if (i + 1 < line.size() && line[i + 1] == '"') {
          item->push_back('"');
          i += 2;
          continue;
        }
        closed = true;
        ++i;
        break;
      }
      item->push_back(line[i++]);
    }
    if (!closed) return "unterminated quoted field";
    rest = Trim(line.substr(i));
    if (!rest.empty() && rest.front() != ',') return "unexpected text after the quoted field: " + Show(rest);
  } else {
    const size_t comma = line.find(',');
    *item = std::string(Trim(line.substr(0, comma)));
    rest = comma == std::string_view::npos ? std::string_view() : line.substr(comma);
  }
  if (!rest.empty()) {  // starts with ','
    rest.remove_prefix(1);
    if (rest.find(',') != std::string_view::npos) {
      return "more than two fields (expected ITEM[,LABEL]; quote an item that holds a comma)";
    }
    *label = Trim(rest);
    *has_label = true;
  }
  return "";
}

}  // namespace

ParsedList ParseSampleList(std::string_view text, std::string_view item_name) {
  ParsedList out;
  if (text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 BOM
  bool first = true;
  uint64_t line_no = 0;
  std::string item;
  while (!text.empty()) {
    ++line_no;
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    line = Trim(line);
    if (line.empty() || line.front() == '#') continue;
    const bool was_first = std::exchange(first, false);

    std::string_view label_text;
    bool has_label = false;
    std::string error = SplitLine(line, &item, &label_text, &has_label);
    if (!error.empty()) {
      out.problems.push_back({line_no, std::move(error)});
      continue;
    }
    if (was_first && line.front() != '"' && EqualsIgnoreCase(item, item_name) &&
        (!has_label || EqualsIgnoreCase(label_text, "label"))) {
      continue;  // the header
    }
    if (item.empty()) {
      out.problems.push_back({line_no, "empty " + std::string(item_name)});
      continue;
    }
    if (item.find('\0') != std::string::npos) {
      out.problems.push_back({line_no, std::string(item_name) + " holds a NUL byte"});
      continue;
    }
    int64_t label = -1;
    if (has_label) {
      if (label_text.empty()) {
        out.problems.push_back({line_no, "empty label after ','"});
        continue;
      }
      const char* end = label_text.data() + label_text.size();
      auto [p, ec] = std::from_chars(label_text.data(), end, label);
      if (ec != std::errc() || p != end || label < 0) {
        out.problems.push_back({line_no, "label " + Show(label_text) + " is not an integer >= 0"});
        continue;
      }
    }
    out.entries.push_back(ListEntry{item, label, line_no});
  }
  return out;
}

Status ListProblemsStatus(const std::string& list_name, std::vector<ListProblem> problems, size_t max_shown) {
  std::stable_sort(problems.begin(), problems.end(),
                   [](const ListProblem& a, const ListProblem& b) { return a.line < b.line; });
  std::string m =
      list_name + ": " + std::to_string(problems.size()) + (problems.size() == 1 ? " bad line:" : " bad lines:");
  const size_t shown = std::min(problems.size(), max_shown);
  for (size_t i = 0; i < shown; ++i) {
    m += "\n  " + list_name + ":" + std::to_string(problems[i].line) + ": " + problems[i].message;
  }
  if (shown < problems.size()) m += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
  return InvalidArgument(std::move(m));
}

Result<std::string> ReadListFile(const std::string& path, const std::vector<std::string>& allowed_roots,
                                 std::string* real_path, FileStamp* stamp) {
  SPDL_ASSIGN_OR_RETURN(*real_path, ResolveUnderRoots(path, allowed_roots));
  if (stamp != nullptr) {
    struct stat st {};
    if (::stat(real_path->c_str(), &st) != 0) return ErrnoStatus(*real_path, errno);
    *stamp = MakeStamp(*real_path, st);
  }
  std::vector<uint8_t> bytes;
  SPDL_RETURN_IF_ERROR(ReadFile(*real_path, &bytes, kMaxListFileBytes));
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace spdl::io
