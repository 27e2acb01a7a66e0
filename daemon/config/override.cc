#include "config/override.h"

namespace spdl::config {

Result<Override> ParseOverride(std::string_view arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string_view::npos) {
    return InvalidArgument("--set expects KEY=VALUE (e.g. source.root=/data), got '" + std::string(arg) + "'");
  }
  std::string_view key = arg.substr(0, eq);
  while (!key.empty() && (key.front() == ' ' || key.front() == '\t')) key.remove_prefix(1);
  while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.remove_suffix(1);
  if (key.empty()) return InvalidArgument("--set '" + std::string(arg) + "': the key is empty");
  if (key.front() == '.' || key.back() == '.' || key.find("..") != std::string_view::npos) {
    return InvalidArgument("--set '" + std::string(arg) + "': the key '" + std::string(key) +
                           "' has an empty component");
  }
  return Override{std::string(key), std::string(arg.substr(eq + 1))};
}

}  // namespace spdl::config
