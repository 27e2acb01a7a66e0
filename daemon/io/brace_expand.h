// Brace expansion for shard patterns, as WebDataset (Python's braceexpand) and bash write them:
//   "shard-{000000..000009}.tar"  -> shard-000000.tar ... shard-000009.tar
//   "{train,val}-{0..2}.tar"      -> train-0.tar train-1.tar train-2.tar val-0.tar val-1.tar val-2.tar
// A pure function: safe from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace spdl::io {

// Expands every brace group of `pattern`, leftmost group varying slowest (as bash does):
//   - {A..B}: decimal integers A and B (>= 0), counting up or down, both ends included. When either
//     end is written with a leading zero ("000", "007"), every number is zero-padded to the width of
//     the wider end.
//   - {x,y,z}: each comma-separated alternative in order (an alternative may be empty).
// A pattern without braces expands to itself.
// Errors (kInvalidArgument, naming the pattern and the byte offset): an unmatched '{' or '}', a
// nested group, a group that is neither a list nor a numeric range ("{abc}", "{a..z}"), a number
// that does not fit in 64 bits, or more than `max_results` results.
Result<std::vector<std::string>> ExpandBraces(std::string_view pattern, size_t max_results = 1'000'000);

}  // namespace spdl::io
