// TempDir: a fresh directory for one test, removed with everything in it on destruction, and
// WriteFile: a file written with its parent directories; what the unit and end-to-end tests share
// instead of each defining its own.
// Always under /tmp (not $TMPDIR): the end-to-end tests' test users must be able to enter it (with
// mode 0755), and the Unix socket paths some tests make in it must stay short.
// TempDir: not to be destroyed while another thread uses it; its const members may be called from any
// thread. WriteFile: thread-compatible (two threads must not write one file).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace spdl::testing {

// Writes `bytes` to `path` (replacing it), creating its parent directories. A failure shows in the
// checks that read the file.
inline void WriteFile(const std::string& path, std::string_view bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}
inline void WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  WriteFile(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}
inline void WriteFile(const std::string& path, const void* data, size_t n) {
  WriteFile(path, std::string_view(static_cast<const char*>(data), n));
}

class TempDir {
 public:
  // Makes /tmp/spdl-test-XXXXXX with permissions `mode` (0755 lets other users enter it); fails
  // the test case if it cannot.
  explicit TempDir(mode_t mode = 0700) : path(Make(mode)) {}

  // Removes the directory, first giving back the owner's permissions a test may have taken away
  // (chmod 000) so that the removal can descend everywhere.
  ~TempDir() {
    namespace fs = std::filesystem;
    std::error_code ec;
    ::chmod(path.c_str(), 0755);
    for (auto it = fs::recursive_directory_iterator(path, fs::directory_options::skip_permission_denied, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code link_ec;
      if (!it->is_symlink(link_ec)) ::chmod(it->path().c_str(), 0755);
    }
    fs::remove_all(path, ec);
  }

  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // path + "/" + rel.
  std::string operator/(const std::string& rel) const { return path + "/" + rel; }

  // Writes `contents` to path/rel (replacing it), creating parent directories; returns the full path.
  std::string Write(const std::string& rel, std::string_view contents = "x") const {
    const std::string p = *this / rel;
    WriteFile(p, contents);
    return p;
  }

  // Creates path/rel and its parents.
  void MkDir(const std::string& rel) const { std::filesystem::create_directories(std::filesystem::path(path) / rel); }

  // The directory (canonical: no symlink in it).
  const std::string path;

 private:
  static std::string Make(mode_t mode) {
    char tmpl[] = "/tmp/spdl-test-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    REQUIRE(made != nullptr);
    REQUIRE(::chmod(made, mode) == 0);
    return std::filesystem::canonical(made).string();
  }
};

}  // namespace spdl::testing
