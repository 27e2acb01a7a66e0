// OpLoader: finds, checks and loads op libraries (the C ABI of include/spdl/op.h) from the
// daemon's plugin_dirs, and makes Op instances of the ops they export.
//
// Rules (the trust model: an op runs inside spdld, so only an administrator may install one):
//   - A library is named by its file name only (no '/'); it is looked up in plugin_dirs in order.
//     With no plugin_dirs, ops are disabled and every lookup is refused, saying so.
//   - A plugin directory and a library file must be owned by root or by spdld's own user and be
//     writable by nobody else (no group or other write bit); a library must be a regular file.
//     A refusal names the path and what to change.
//   - The checked file is the one loaded: it is opened, checked with fstat, and dlopen'ed through
//     /proc/self/fd (RTLD_NOW | RTLD_LOCAL), so a file swapped after the check is not what runs.
//     The descriptor of a kept library stays open (one per library), so its /proc/self/fd name
//     is never reused for another library.
//   - A library is loaded once, on its first use, and kept until the process exits (never
//     dlclose'd). A library without `spdl_ops`, with an op of another SPDL_OP_ABI_VERSION, or with
//     a malformed op table is refused (and not kept), naming the file. A refused library is
//     checked again on its next use (the administrator may have fixed it).
//   - Every call into an op is wrapped: a C++ exception thrown across the C ABI is caught and
//     becomes an error (the daemon keeps running).
//
// Thread safety: OpLoader is safe to share between threads (Create takes a mutex). An Op is
// immutable after Create; Apply may run on many threads at once (the ABI tells ops to treat their
// state as read-only).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::plugins {

class OpLibrary;  // one loaded library (internal)

// One op of a loaded library with its state, made by `create` from a job's args. Destroying it
// calls the op's `destroy`.
class Op {
 public:
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // Runs the op in place on a uint8 HWC image (height rows of `stride` bytes, width * channels
  // samples each). kDataLoss with the op's message (prefixed by "op NAME: ") when it returns
  // non-zero; kInternal when it throws. REQUIRES: data valid for height * stride bytes.
  Status Apply(uint8_t* data, int height, int width, int channels, int64_t stride, uint64_t seed) const;

  const std::string& name() const { return name_; }
  const std::string& library_path() const { return library_path_; }

 private:
  friend class OpLoader;
  Op() = default;
  std::shared_ptr<const OpLibrary> library_;  // keeps the op table's library referenced
  const void* op_ = nullptr;                  // const spdl_op* inside the library
  void* state_ = nullptr;
  std::string name_;
  std::string library_path_;
};

class OpLoader {
 public:
  // `plugin_dirs`: absolute directories, searched in order; empty = ops disabled.
  explicit OpLoader(std::vector<std::string> plugin_dirs);
  ~OpLoader();
  OpLoader(const OpLoader&) = delete;
  OpLoader& operator=(const OpLoader&) = delete;

  // Loads `library` (first use only) and makes op `name` of it with `args_json`. Errors:
  // kFailedPrecondition when ops are disabled or a directory / file fails the ownership and
  // permission checks; kNotFound when no plugin dir holds the library or the library has no such
  // op (the message lists its ops); kInvalidArgument for a bad library name, a library that is not
  // an op library or speaks another ABI version, or `create` refusing the args (its message).
  Result<std::unique_ptr<Op>> Create(const std::string& library, const std::string& name, const std::string& args_json);

  // Checks every plugin dir as a job would (for the start-up log): one message per problem.
  std::vector<std::string> CheckDirs() const;

  const std::vector<std::string>& plugin_dirs() const { return dirs_; }

 private:
  Result<std::shared_ptr<const OpLibrary>> Load(const std::string& library);

  const std::vector<std::string> dirs_;  // constant after construction
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const OpLibrary>> loaded_;  // guarded by mu_: by file name
};

// The check a plugin directory or library file gets, on its stat: owner root or `self_uid`, no
// group or other write bit (and a regular file or a directory, as `want_dir` says). OK or
// kFailedPrecondition naming `path` and what to change. Pure; for tests.
Status CheckTrusted(const std::string& path, uint32_t mode, uint32_t owner_uid, uint32_t self_uid, bool want_dir);

}  // namespace spdl::plugins
