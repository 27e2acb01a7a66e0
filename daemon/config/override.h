// Override: one `--set a.b.c=value` from a command line, applied to a config's YAML tree before
// validation. Plain value; safe to copy and hand between threads.
//
// Path syntax: dot-separated components; a component of digits indexes a sequence
// ("transforms.0.resize.shorter"), any other component names a map key (missing maps are created).
// The value is parsed as YAML, so "128" is a scalar, "[1, 2]" a list and "{shorter: 256}" a map.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace spdl::config {

struct Override {
  std::string path;   // dotted key path, e.g. "source.root"
  std::string value;  // YAML text of the new value, e.g. "/data/imagenet" or "[.jpg, .png]"

  bool operator==(const Override&) const = default;
};

// Parses "a.b.c=value" (split at the first '='); kInvalidArgument if there is no '=', the key is
// empty or a path component is empty ("a..b"). The value may be empty (YAML null).
Result<Override> ParseOverride(std::string_view arg);

}  // namespace spdl::config
