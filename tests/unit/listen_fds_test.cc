// ops/listen_fds: the socket-activation helper. CheckListeningUnixSocket on real descriptors of
// every kind it must refuse (a file, a TCP socket, a datagram socket, a socket that does not
// listen) and the one it takes; TakeListenFd's reading of LISTEN_PID/LISTEN_FDS.
#include "ops/listen_fds.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "temp_dir.h"

namespace spdl::ops {
namespace {

struct Fd {
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  int fd;
};

bool BindUnix(int fd, const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  return ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
}

TEST_CASE("CheckListeningUnixSocket refuses a file, a TCP socket, a datagram socket and one that does not listen") {
  {
    Fd file(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
    REQUIRE(file.fd >= 0);
    auto r = CheckListeningUnixSocket(file.fd);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("is not a socket"));
  }
  {
    Fd tcp(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(tcp.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(::listen(tcp.fd, 4) == 0);
    auto r = CheckListeningUnixSocket(tcp.fd);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("is not a Unix socket"));
  }
  const testing::TempDir dir;
  const std::string path = dir / "s.sock";
  {
    Fd dgram(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    REQUIRE(BindUnix(dgram.fd, path));
    auto r = CheckListeningUnixSocket(dgram.fd);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("not SOCK_STREAM"));
    ::unlink(path.c_str());
  }
  {
    Fd idle(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(BindUnix(idle.fd, path));
    auto r = CheckListeningUnixSocket(idle.fd);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("not listening"));
    ::unlink(path.c_str());
  }
}

TEST_CASE("CheckListeningUnixSocket takes a listening Unix stream socket and returns its path") {
  const testing::TempDir dir;
  const std::string path = dir / "s.sock";
  Fd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(BindUnix(s.fd, path));
  REQUIRE(::listen(s.fd, 4) == 0);
  auto r = CheckListeningUnixSocket(s.fd);
  REQUIRE(r.ok());
  CHECK(*r == path);
  ::unlink(path.c_str());
}

TEST_CASE(
    "TakeListenFd: nothing without LISTEN_FDS or for another pid, an error for a bad count, and the variables are "
    "unset") {
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  auto none = TakeListenFd();
  REQUIRE(none.ok());
  CHECK_FALSE(none->has_value());

  ::setenv("LISTEN_PID", std::to_string(::getpid() + 1).c_str(), 1);
  ::setenv("LISTEN_FDS", "1", 1);
  ::setenv("LISTEN_FDNAMES", "spdld.sock", 1);
  auto other = TakeListenFd();
  REQUIRE(other.ok());
  CHECK_FALSE(other->has_value());
  CHECK(std::getenv("LISTEN_PID") == nullptr);
  CHECK(std::getenv("LISTEN_FDS") == nullptr);
  CHECK(std::getenv("LISTEN_FDNAMES") == nullptr);

  ::setenv("LISTEN_PID", std::to_string(::getpid()).c_str(), 1);
  ::setenv("LISTEN_FDS", "many", 1);
  auto bad = TakeListenFd();
  CHECK_FALSE(bad.ok());
  CHECK(std::getenv("LISTEN_PID") == nullptr);
  CHECK(std::getenv("LISTEN_FDS") == nullptr);
}

}  // namespace
}  // namespace spdl::ops
