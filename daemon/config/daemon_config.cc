#include "config/daemon_config.h"

#include <boost/asio/ip/address.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <utility>

#include "common/errno_text.h"
#include "config/yaml_reader.h"

namespace spdl::config {
namespace {

using internal::Diagnostics;
using internal::Field;
using internal::MapReader;
using internal::Present;

// A number written as an integer or a decimal (shared-node limits); nullopt (with an error) else.
std::optional<double> ReadFraction(Diagnostics& diag, const Field& f) {
  if (!Present(f)) return std::nullopt;
  if (f.node.IsScalar()) {
    const std::string& s = f.node.Scalar();
    double value = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty() && std::isfinite(value)) return value;
  }
  diag.Error(f, "expected a number, got " + internal::Describe(f.node));
  return std::nullopt;
}

constexpr size_t kMaxSocketPath = 107;  // sizeof(sockaddr_un::sun_path) - 1 for the NUL
constexpr uint64_t kKiB = 1024, kMiB = kKiB << 10;

// "4GiB" when `bytes` is a whole number of a binary unit, else "12345 bytes".
std::string FormatBytes(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 40, "TiB"}, {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  for (const auto& [size, name] : kUnits) {
    if (bytes != 0 && bytes % size == 0) return std::to_string(bytes / size) + name;
  }
  return std::to_string(bytes) + " bytes";
}

std::optional<uint64_t> ReadByteSize(Diagnostics& diag, const Field& f, uint64_t min, uint64_t max) {
  if (!Present(f)) return std::nullopt;
  if (!f.node.IsScalar()) {
    diag.Error(f, "expected a byte size like 4GiB, got " + internal::Describe(f.node));
    return std::nullopt;
  }
  Result<uint64_t> bytes = ParseByteSize(f.node.Scalar());
  if (!bytes.ok()) {
    diag.Error(f, bytes.status().message());
    return std::nullopt;
  }
  if (*bytes < min) {
    diag.Error(f, "must be at least " + FormatBytes(min) + " (got " + FormatBytes(*bytes) + ")");
    return std::nullopt;
  }
  if (*bytes > max) {
    diag.Error(f, "must be at most " + FormatBytes(max) + " (got " + FormatBytes(*bytes) + ")");
    return std::nullopt;
  }
  return *bytes;
}

// Permission bits: "0660" / "0o660" (octal, leading 0) or a decimal integer; 0..0777.
std::optional<int> ReadMode(Diagnostics& diag, const Field& f) {
  if (!Present(f)) return std::nullopt;
  if (f.node.IsScalar()) {
    std::string_view s = f.node.Scalar();
    int base = 10;
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'O')) {
      s.remove_prefix(2);
      base = 8;
    } else if (s.size() > 1 && s[0] == '0') {
      base = 8;
    }
    int mode = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), mode, base);
    if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty() && s[0] != '-') {
      if (mode <= 0777) return mode;
      diag.Error(f, "permission bits must be at most 0777 (got " + internal::Describe(f.node) + ")");
      return std::nullopt;
    }
  }
  diag.Error(f, "expected permission bits like \"0660\" (octal), got " + internal::Describe(f.node));
  return std::nullopt;
}

// An absolute path with no ".." component.
bool IsCleanAbsolutePath(const std::string& p) {
  if (p.empty() || p.front() != '/') return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t slash = p.find('/', start);
    if (slash == std::string::npos) slash = p.size();
    if (p.compare(start, slash - start, "..") == 0 && slash - start == 2) return false;
    start = slash + 1;
  }
  return true;
}

void ReadDaemon(Diagnostics& diag, const Field& root, DaemonConfig* out) {
  MapReader m(diag, root);
  if (!m.ok()) return;

  const Field socket_path = m.Get("socket_path");
  if (auto v = internal::ReadString(diag, socket_path)) {
    if (v->empty() || v->front() != '/') {
      diag.Error(socket_path, "must be an absolute path (got '" + *v + "')");
    } else if (v->size() > kMaxSocketPath) {
      diag.Error(socket_path, "must be at most " + std::to_string(kMaxSocketPath) +
                                  " bytes long, the limit of a Unix socket address (got " + std::to_string(v->size()) +
                                  ")");
    } else {
      out->socket_path = *v;
    }
  }
  if (auto v = ReadMode(diag, m.Get("socket_mode"))) out->socket_mode = *v;
  if (auto v = internal::ReadString(diag, m.Get("socket_group"))) out->socket_group = *v;
  if (auto v = internal::ReadInt(diag, m.Get("worker_threads"), 0, 1024)) {
    out->worker_threads = static_cast<int>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("io_threads"), 1, 1024)) out->io_threads = static_cast<int>(*v);
  if (auto v = ReadByteSize(diag, m.Get("memory_budget_bytes"), kMiB, std::numeric_limits<uint64_t>::max())) {
    out->memory_budget_bytes = *v;
  }
  if (auto v = ReadByteSize(diag, m.Get("device_memory_budget_bytes"), kMiB, std::numeric_limits<uint64_t>::max())) {
    out->device_memory_budget_bytes = *v;
  }
  if (auto v = ReadByteSize(diag, m.Get("gpu_context_bytes"), 0, std::numeric_limits<uint64_t>::max())) {
    out->gpu_context_bytes = *v;
  }
  if (auto v = internal::ReadBool(diag, m.Get("exit_on_gpu_poison"))) out->exit_on_gpu_poison = *v;
  const Field roots = m.Get("allowed_roots");
  if (auto items = internal::ReadList(diag, roots)) {
    std::vector<std::string> list;
    for (const Field& item : *items) {
      std::optional<std::string> r = internal::ReadString(diag, item);
      if (!r) continue;
      if (!IsCleanAbsolutePath(*r)) {
        diag.Error(item, "must be an absolute directory without '..' (got '" + *r + "')");
        continue;
      }
      list.push_back(*r);
    }
    out->allowed_roots = std::move(list);
  }
  const Field prefixes = m.Get("allowed_url_prefixes");
  if (auto items = internal::ReadList(diag, prefixes)) {
    std::vector<std::string> list;
    for (const Field& item : *items) {
      std::optional<std::string> r = internal::ReadString(diag, item);
      if (!r) continue;
      const size_t scheme = r->rfind("https://", 0) == 0 ? 8 : r->rfind("http://", 0) == 0 ? 7 : 0;
      if (scheme == 0 || r->size() == scheme || (*r)[scheme] == '/') {
        diag.Error(item, "must be an http:// or https:// URL with a host, e.g. http://data.local:8000/imagenet (got '" +
                             *r + "')");
        continue;
      }
      list.push_back(*r);
    }
    out->allowed_url_prefixes = std::move(list);
  }
  if (auto v = internal::ReadChoice<std::string>(diag, m.Get("log_level"),
                                                 {{"trace", "trace"},
                                                  {"debug", "debug"},
                                                  {"info", "info"},
                                                  {"warn", "warn"},
                                                  {"error", "error"},
                                                  {"critical", "critical"},
                                                  {"off", "off"}})) {
    out->log_level = *v;
  }
  if (auto v = ReadByteSize(diag, m.Get("max_frame_bytes"), kKiB, 64 * kMiB)) {
    out->max_frame_bytes = static_cast<uint32_t>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("max_jobs_per_client"), 1, 1024)) {
    out->max_jobs_per_client = static_cast<int>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("max_slots_per_job"), 1, 1024)) {
    out->max_slots_per_job = static_cast<int>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("stats_log_seconds"), 0, 86400)) {
    out->stats_log_seconds = static_cast<int>(*v);
  }
  // Operations keys.
  if (auto v = internal::ReadInt(diag, m.Get("metrics_port"), 0, 65535)) out->metrics_port = static_cast<int>(*v);
  if (const internal::Field f = m.Get("metrics_bind"); auto v = internal::ReadString(diag, f)) {
    boost::system::error_code ec;
    (void)boost::asio::ip::make_address(*v, ec);
    if (ec) {
      diag.Error(f, "must be an IPv4 or IPv6 address like 127.0.0.1 or 0.0.0.0 (got '" + *v + "')");
    } else {
      out->metrics_bind = *v;
    }
  }
  if (auto v = internal::ReadInt(diag, m.Get("drain_seconds"), 0, 86400)) {
    out->drain_seconds = static_cast<int>(*v);
  }
  if (auto v = ReadByteSize(diag, m.Get("cache_bytes"), 0, std::numeric_limits<uint64_t>::max())) {
    out->cache_bytes = *v;
  }
  if (const internal::Field f = m.Get("cache_dir"); auto v = internal::ReadString(diag, f)) {
    if (!v->empty() && ((*v)[0] != '/' || v->find("/../") != std::string::npos || v->ends_with("/.."))) {
      diag.Error(f, "must be an absolute path without '..' (got '" + *v + "')");
    } else {
      out->cache_dir = *v;
    }
  }
  if (auto v = ReadByteSize(diag, m.Get("cache_dir_bytes"), 0, std::numeric_limits<uint64_t>::max())) {
    out->cache_dir_bytes = *v;
  }
  // User ops (issue 14).
  const Field plugin_dirs = m.Get("plugin_dirs");
  if (auto items = internal::ReadList(diag, plugin_dirs)) {
    std::vector<std::string> list;
    for (const Field& item : *items) {
      std::optional<std::string> d = internal::ReadString(diag, item);
      if (!d) continue;
      if (!IsCleanAbsolutePath(*d)) {
        diag.Error(item, "must be an absolute directory without '..' (got '" + *d + "')");
        continue;
      }
      list.push_back(*d);
    }
    out->plugin_dirs = std::move(list);
  }
  // Shared-node limits.
  if (auto v = internal::ReadInt(diag, m.Get("max_connections"), 16, 65536))
    out->max_connections = static_cast<int>(*v);
  if (auto v = internal::ReadInt(diag, m.Get("max_connections_per_uid"), 1, 65536)) {
    out->max_connections_per_uid = static_cast<int>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("hello_timeout_seconds"), 1, 3600)) {
    out->hello_timeout_seconds = static_cast<int>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("frame_timeout_seconds"), 1, 3600)) {
    out->frame_timeout_seconds = static_cast<int>(*v);
  }
  if (auto v = ReadByteSize(diag, m.Get("max_reply_backlog_bytes"), 64 * kKiB, 1024 * kMiB)) {
    out->max_reply_backlog_bytes = *v;
  }
  if (auto v = internal::ReadInt(diag, m.Get("backlog_timeout_seconds"), 1, 3600)) {
    out->backlog_timeout_seconds = static_cast<int>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("max_pixels"), 1, int64_t{1} << 40)) out->max_pixels = *v;
  const Field share = m.Get("max_budget_share_per_uid");
  if (auto v = ReadFraction(diag, share)) {
    if (*v < 0.05 || *v > 1.0) {
      diag.Error(share, "must be a fraction between 0.05 and 1 (got " + std::to_string(*v) + ")");
    } else {
      out->max_budget_share_per_uid = *v;
    }
  }
  m.ReportUnknownKeys();
}

}  // namespace

DaemonConfigResult ParseDaemonConfig(std::string_view yaml_text, const std::vector<Override>& overrides) {
  std::vector<std::string> override_paths;
  override_paths.reserve(overrides.size());
  for (const Override& o : overrides) override_paths.push_back(o.path);
  Diagnostics diag(std::move(override_paths));
  DaemonConfig config;
  try {  // yaml-cpp throws; nothing may escape this module
    std::optional<YAML::Node> root = internal::LoadDocument(yaml_text, overrides, &diag);
    if (root) ReadDaemon(diag, internal::RootField(*root), &config);
  } catch (const std::exception& e) {
    diag.ErrorNoLine("", std::string("internal error while reading the daemon config: ") + e.what());
  }
  DaemonConfigResult result;
  result.errors = diag.Take();
  if (result.errors.empty()) result.config = std::move(config);
  return result;
}

DaemonConfigResult LoadDaemonConfig(const std::string& path, const std::vector<Override>& overrides) {
  std::unique_ptr<FILE, int (*)(FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  std::string text;
  int err = file ? 0 : errno;
  if (file) {
    char buf[64 * 1024];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, file.get())) > 0) text.append(buf, n);
    if (std::ferror(file.get())) err = errno != 0 ? errno : EIO;
  }
  if (err != 0) {
    DaemonConfigResult result;
    result.errors.push_back(ConfigError{0, 0, "", "cannot read config file '" + path + "': " + ErrnoText(err)});
    return result;
  }
  return ParseDaemonConfig(text, overrides);
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  const std::string quoted = "'" + std::string(text) + "'";
  std::string_view s = text;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  size_t digits = 0;
  while (digits < s.size() && s[digits] >= '0' && s[digits] <= '9') ++digits;
  if (digits == 0) {
    return InvalidArgument("expected a byte size like 4GiB, 512MiB or 1048576, got " + quoted);
  }
  uint64_t number = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + digits, number);
  if (ec != std::errc()) return InvalidArgument("byte size " + quoted + " is too large");
  std::string_view unit = s.substr(digits);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);

  static constexpr std::pair<std::string_view, int> kUnits[] = {
      {"", 0},     {"B", 0},  {"K", 10},  {"Ki", 10},  {"KiB", 10}, {"M", 20},  {"Mi", 20},
      {"MiB", 20}, {"G", 30}, {"Gi", 30}, {"GiB", 30}, {"T", 40},   {"Ti", 40}, {"TiB", 40}};
  for (const auto& [name, shift] : kUnits) {
    if (unit != name) continue;
    if (shift > 0 && number > (std::numeric_limits<uint64_t>::max() >> shift)) {
      return InvalidArgument("byte size " + quoted + " is too large");
    }
    return number << shift;
  }
  if (unit == "KB" || unit == "MB" || unit == "GB" || unit == "TB") {
    return InvalidArgument("byte size " + quoted + ": '" + std::string(unit) + "' is ambiguous; write " +
                           std::string(unit.substr(0, 1)) + "iB (powers of 1024) or a plain number of bytes");
  }
  return InvalidArgument("byte size " + quoted + " has an unknown unit '" + std::string(unit) +
                         "' (use B, KiB, MiB, GiB or TiB)");
}

}  // namespace spdl::config
