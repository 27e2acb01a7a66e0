#include "config/config_error.h"

namespace spdl::config {

std::string FormatConfigErrors(const std::vector<ConfigError>& errors, const std::string& source_name) {
  std::string out;
  for (const ConfigError& e : errors) {
    if (!out.empty()) out += '\n';
    out += source_name;
    if (e.line > 0) {
      out += ':' + std::to_string(e.line);
      if (e.column > 0) out += ':' + std::to_string(e.column);
    }
    out += ": ";
    if (!e.path.empty()) out += e.path + ": ";
    out += e.message;
  }
  return out;
}

}  // namespace spdl::config
