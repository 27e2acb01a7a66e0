#include "s3_access.h"

#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace spdl::client {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// The home directory of this process's user from the passwd database (getpwuid_r: the client runs
// in a trainer's threads, where getpwuid's static result could be overwritten); "" when unknown.
std::string PasswdHome() {
  const long hint = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buf(hint > 0 ? static_cast<size_t>(hint) : 4096);
  passwd entry{};
  passwd* found = nullptr;
  int rc = 0;
  while ((rc = ::getpwuid_r(::getuid(), &entry, buf.data(), buf.size(), &found)) == ERANGE && buf.size() < (1u << 20)) {
    buf.resize(buf.size() * 2);  // the entry does not fit: a larger buffer
  }
  if (rc != 0 || found == nullptr || found->pw_dir == nullptr) return "";
  return found->pw_dir;
}

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

// Whether the list file at `path` names s3:// (or cannot be read: then the daemon may need access).
bool ListMayUseS3(std::string path) {
  path = Trim(path);
  if (path.size() >= 2 && (path.front() == '\'' || path.front() == '"') && path.back() == path.front()) {
    path = path.substr(1, path.size() - 2);
  }
  if (path.empty()) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return true;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return true;
  return text.str().find("s3://") != std::string::npos;
}

}  // namespace

bool JobMayUseS3(const std::string& config_yaml, const std::vector<std::pair<std::string, std::string>>& overrides) {
  if (config_yaml.find("s3://") != std::string::npos) return true;
  for (const auto& [path, value] : overrides) {
    if (value.find("s3://") != std::string::npos) return true;
    if (path == "list" || (path.size() > 5 && path.compare(path.size() - 5, 5, ".list") == 0)) {
      if (ListMayUseS3(value)) return true;
    }
  }
  // Every `list:` key of the text (block or flow style): its value up to the end of the scalar.
  for (size_t at = config_yaml.find("list:"); at != std::string::npos; at = config_yaml.find("list:", at + 5)) {
    const char before = at == 0 ? ' ' : config_yaml[at - 1];
    if (!(before == ' ' || before == '\t' || before == '\n' || before == '{' || before == ',')) continue;
    size_t end = at + 5;
    while (end < config_yaml.size() && config_yaml[end] != '\n' && config_yaml[end] != ',' && config_yaml[end] != '}' &&
           config_yaml[end] != '#') {
      ++end;
    }
    if (ListMayUseS3(config_yaml.substr(at + 5, end - at - 5))) return true;
  }
  return false;
}

void ParseCredentialsFile(const std::string& text, const std::string& profile, proto::S3Access* out) {
  std::istringstream in(text);
  std::string line;
  bool in_profile = false;
  while (std::getline(in, line)) {
    line = Trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      in_profile = Trim(line.substr(1, line.size() - 2)) == profile;
      continue;
    }
    if (!in_profile) continue;
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = Trim(line.substr(0, eq));
    const std::string value = Trim(line.substr(eq + 1));
    if (key == "aws_access_key_id") out->set_access_key_id(value);
    if (key == "aws_secret_access_key") out->set_secret_access_key(value);
    if (key == "aws_session_token") out->set_session_token(value);
  }
}

void LoadS3Access(proto::S3Access* out, const std::string& home_in) {
  out->Clear();
  out->set_endpoint_url(!Env("AWS_ENDPOINT_URL_S3").empty() ? Env("AWS_ENDPOINT_URL_S3") : Env("AWS_ENDPOINT_URL"));
  out->set_region(!Env("AWS_REGION").empty() ? Env("AWS_REGION") : Env("AWS_DEFAULT_REGION"));
  if (!Env("AWS_ACCESS_KEY_ID").empty() && !Env("AWS_SECRET_ACCESS_KEY").empty()) {
    out->set_access_key_id(Env("AWS_ACCESS_KEY_ID"));
    out->set_secret_access_key(Env("AWS_SECRET_ACCESS_KEY"));
    out->set_session_token(Env("AWS_SESSION_TOKEN"));
    return;
  }
  std::string path = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (path.empty()) {
    std::string home = !home_in.empty() ? home_in : Env("HOME");
    if (home.empty()) {
      home = PasswdHome();
    }
    if (home.empty()) return;
    path = home + "/.aws/credentials";
  }
  std::ifstream f(path);
  if (!f) return;
  std::stringstream text;
  text << f.rdbuf();
  const std::string profile = !Env("AWS_PROFILE").empty() ? Env("AWS_PROFILE") : "default";
  ParseCredentialsFile(text.str(), profile, out);
  if (out->access_key_id().empty() || out->secret_access_key().empty()) {
    out->clear_access_key_id();
    out->clear_secret_access_key();
    out->clear_session_token();
  }
}

}  // namespace spdl::client
