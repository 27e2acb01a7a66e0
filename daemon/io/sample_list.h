// Sample lists: the text/CSV format shared by FileListSource ("path[,label]") and HttpSource
// ("url[,label]" or "path[,label]"). Pure functions: safe from any thread.
//
// The format, one sample per line:
//   - ITEM or ITEM,LABEL. ITEM is a path or URL; LABEL a decimal integer >= 0. A line without a label
//     gets kNoLabel (-1). Lines with and without labels may be mixed.
//   - Blank lines, and lines whose first non-blank character is '#', are ignored ('#' elsewhere is
//     part of the item).
//   - The first non-ignored line may be a header: the item name ("path" or "url", any case) alone
//     or followed by ",label".
//   - Spaces and tabs around each field are dropped; CRLF line ends and a UTF-8 BOM are accepted.
//   - An item holding a comma (or leading/trailing blanks) is written as a CSV quoted field:
//     "a,b.jpg",3 with "" standing for one quote. More than two fields is an error.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "io/source_index_cache.h"

namespace spdl::io {

struct ListEntry {
  std::string item;    // the path or URL, unquoted and trimmed
  int64_t label = -1;  // kNoLabel when the line has none
  uint64_t line = 0;   // 1-based line number in the list
};

struct ListProblem {
  uint64_t line = 0;    // 1-based line number in the list
  std::string message;  // what is wrong with it, e.g. "label 'x' is not an integer >= 0"
};

struct ParsedList {
  std::vector<ListEntry> entries;     // the good lines, in file order
  std::vector<ListProblem> problems;  // every bad line, in file order
};

// Parses `text`; `item_name` ("path" or "url") is the header's first field.
ParsedList ParseSampleList(std::string_view text, std::string_view item_name);

// One kInvalidArgument Status listing `problems` (sorted by line), at most `max_shown` of them, then
// how many more:  "LIST: 3 bad lines:\n  LIST:4: ...\n  LIST:9: ...". REQUIRES: problems non-empty.
Status ListProblemsStatus(const std::string& list_name, std::vector<ListProblem> problems, size_t max_shown);

// The largest list file read (it is read whole and parsed into one entry per line; a larger one ->
// kResourceExhausted naming it and the limit): 256 MiB, ~4M lines of ImageNet-like paths.
inline constexpr size_t kMaxListFileBytes = size_t{256} << 20;

// Reads the list file `path` after checking it resolves below `allowed_roots`; sets *real_path to
// the resolved path, and *stamp (if not null) to its stamp taken just before the read (for the
// source index cache). Errors: those of ResolveUnderRoots and ReadFile.
Result<std::string> ReadListFile(const std::string& path, const std::vector<std::string>& allowed_roots,
                                 std::string* real_path, FileStamp* stamp = nullptr);

}  // namespace spdl::io
