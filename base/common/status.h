// Status and Result<T>: how every spdld module reports failure across a boundary.
//
// A Status is either OK or carries a code and a human-readable message. Result<T> holds either a
// value or a non-OK Status. Both are plain values: copyable, movable, safe to hand between threads
// (no sharing). Libraries that throw (yaml-cpp, CLI11, Boost, protobuf) are caught at the edge of
// the module that calls them and turned into a Status there.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace spdl {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller's input is wrong (bad config, bad request)
  kNotFound,           // a file, job or key does not exist
  kPermissionDenied,   // outside the allowed roots, wrong owner
  kResourceExhausted,  // a limit or budget would be exceeded
  kDataLoss,           // a corrupt or truncated sample
  kUnavailable,        // the peer went away (socket closed, daemon gone)
  kCancelled,          // stopped on purpose
  kFailedPrecondition,
  kInternal,  // a bug or an OS call failing unexpectedly
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "INVALID_ARGUMENT: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is "prefix: message" (OK stays OK).
  Status WithPrefix(const std::string& prefix) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// Status from errno: "what: strerror(errno)", code chosen from errno (ENOENT -> kNotFound, ...).
Status ErrnoStatus(const std::string& what, int err);

// Holds a T or an error Status. REQUIRES: the Status given to the error constructor is not OK.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}                                  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT(google-explicit-constructor)

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // REQUIRES: ok().
  T& value() & {
    assert(ok());
    return *value_;  // NOLINT(bugprone-unchecked-optional-access): REQUIRES ok(), asserted
  }
  const T& value() const& {
    assert(ok());
    return *value_;  // NOLINT(bugprone-unchecked-optional-access): REQUIRES ok(), asserted
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);  // NOLINT(bugprone-unchecked-optional-access): REQUIRES ok(), asserted
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace spdl

// Returns early from the enclosing function when `expr` (a Status) is not OK.
#define SPDL_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::spdl::Status spdl_status_ = (expr);        \
    if (!spdl_status_.ok()) return spdl_status_; \
  } while (0)

#define SPDL_CONCAT_INNER_(a, b) a##b
#define SPDL_CONCAT_(a, b) SPDL_CONCAT_INNER_(a, b)

// `SPDL_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a Result, or returns its Status.
#define SPDL_ASSIGN_OR_RETURN(lhs, rexpr) SPDL_ASSIGN_OR_RETURN_IMPL_(SPDL_CONCAT_(spdl_result_, __LINE__), lhs, rexpr)
#define SPDL_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) /* tmp is a name, lhs a declaration: no parentheses */ \
  auto tmp = (rexpr);                                /* NOLINT(bugprone-macro-parentheses) */               \
  if (!tmp.ok()) return tmp.status();                /* NOLINT(bugprone-macro-parentheses) */               \
  lhs = std::move(tmp).value()                       /* NOLINT(bugprone-macro-parentheses) */
