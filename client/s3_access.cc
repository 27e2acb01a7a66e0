#include "s3_access.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace spdl::client {

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string Trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

}  // namespace

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
      if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_dir != nullptr) home = pw->pw_dir;
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
