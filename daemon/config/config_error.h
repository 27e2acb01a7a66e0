// ConfigError: one problem found in a config (daemon or job), with where it is.
//
// Config parsing gathers every problem in the whole document and then fails once with all of
// them, so a user fixes a config in one round instead of one error per run. Plain values; safe to
// copy and hand between threads.
#pragma once

#include <string>
#include <vector>

namespace spdl::config {

struct ConfigError {
  int line = 0;         // 1-based line in the YAML text; 0 = no line (a --set override, a file error)
  int column = 0;       // 1-based column; 0 = unknown
  std::string path;     // dotted key path, e.g. "batch.size" or "transforms.1.center_crop.size";
                        // "--set batch.size" when the value came from a --set override; "" for the
                        // whole document (syntax error, unreadable file)
  std::string message;  // what is wrong, e.g. "must be at least 1 (got 0)"

  bool operator==(const ConfigError&) const = default;
};

// Formats errors one per line, lines joined by '\n' (no trailing newline):
//   "imagenet.yaml:12:5: batch.size: must be at least 1 (got 0)"
//   "imagenet.yaml: --set batch.size: must be at least 1 (got 0)"   (line 0)
//   "imagenet.yaml:3:1: mapping values are not allowed here"        (empty path)
std::string FormatConfigErrors(const std::vector<ConfigError>& errors, const std::string& source_name);

}  // namespace spdl::config
