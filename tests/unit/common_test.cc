#include <catch2/catch.hpp>
#include <cerrno>

#include "common/status.h"
#include "common/unique_fd.h"

namespace spdl {
namespace {

Result<int> Half(int n) {
  if (n % 2) return InvalidArgument("odd: " + std::to_string(n));
  return n / 2;
}

Status Quarter(int n, int* out) {
  SPDL_ASSIGN_OR_RETURN(int h, Half(n));
  SPDL_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::Ok();
}

TEST_CASE("Status and Result carry values and errors") {
  int q = 0;
  REQUIRE(Quarter(8, &q).ok());
  CHECK(q == 2);
  Status s = Quarter(6, &q);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.ToString() == "INVALID_ARGUMENT: odd: 3");
  CHECK(s.WithPrefix("quarter").message() == "quarter: odd: 3");
  CHECK(Status::Ok().WithPrefix("x").ok());
  CHECK(ErrnoStatus("open a", ENOENT).code() == StatusCode::kNotFound);
  CHECK(ErrnoStatus("open a", EACCES).code() == StatusCode::kPermissionDenied);
}

TEST_CASE("UniqueFd closes what it owns") {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  {
    UniqueFd r(p[0]);
    UniqueFd w(p[1]);
    UniqueFd moved = std::move(w);
    CHECK_FALSE(w.valid());  // NOLINT(bugprone-use-after-move): the moved-from state is the test
    CHECK(moved.get() == p[1]);
  }
  errno = 0;
  CHECK(::close(p[0]) == -1);
  CHECK(errno == EBADF);
}

}  // namespace
}  // namespace spdl
