#include "plugins/op_loader.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "common/errno_text.h"
#include "common/unique_fd.h"
#include "spdl/op.h"

namespace spdl::plugins {

// A loaded library: its path, its dlopen handle (never closed) and its op table.
class OpLibrary {
 public:
  std::string path;
  void* handle = nullptr;
  const spdl_op* ops = nullptr;
  int32_t count = 0;
};

namespace {

constexpr int32_t kMaxOpsPerLibrary = 4096;
constexpr size_t kErrLen = 1024;

std::string Octal(uint32_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", mode & 07777);
  return buf;
}

// The message an op wrote into err, bounded and NUL-terminated whatever the op did.
std::string OpMessage(const char* err, size_t len, const char* fallback) {
  size_t n = 0;
  while (n < len && err[n] != '\0') ++n;
  return n == 0 ? std::string(fallback) : std::string(err, n);
}

}  // namespace

Status CheckTrusted(const std::string& path, uint32_t mode, uint32_t owner_uid, uint32_t self_uid, bool want_dir) {
  const char* what = want_dir ? "plugin directory" : "op library";
  if (want_dir && !S_ISDIR(mode)) return FailedPrecondition(std::string(what) + " " + path + " is not a directory");
  if (!want_dir && !S_ISREG(mode)) {
    return FailedPrecondition(std::string(what) + " " + path + " is not a regular file");
  }
  if (owner_uid != 0 && owner_uid != self_uid) {
    return FailedPrecondition(std::string(what) + " " + path + " is owned by uid " + std::to_string(owner_uid) +
                              ", neither root nor spdld's user (uid " + std::to_string(self_uid) +
                              "): spdld runs ops only from files an administrator installed (chown root it)");
  }
  if (mode & (S_IWGRP | S_IWOTH)) {
    const char* who = (mode & S_IWOTH) ? "world-writable" : "group-writable";
    return FailedPrecondition(std::string(what) + " " + path + " is " + who + " (mode " + Octal(mode) +
                              "): anyone who can write there could make spdld run their code; refused (chmod go-w " +
                              path + ")");
  }
  return Status::Ok();
}

Op::~Op() {
  const auto* op = static_cast<const spdl_op*>(op_);
  if (op == nullptr || op->destroy == nullptr) return;
  try {
    op->destroy(state_);
  } catch (...) {  // NOLINT(bugprone-empty-catch): an op that throws across the C ABI: the daemon goes on
  }
}

Status Op::Apply(uint8_t* data, int height, int width, int channels, int64_t stride, uint64_t seed) const {
  const auto* op = static_cast<const spdl_op*>(op_);
  spdl_image image{data, height, width, channels, stride};
  char err[kErrLen];
  err[0] = '\0';
  int rc = 0;
  try {
    rc = op->apply(state_, &image, seed, err, sizeof(err));
  } catch (const std::exception& e) {
    return Internal("op " + name_ + " threw a C++ exception across the C ABI: " + e.what());
  } catch (...) {
    return Internal("op " + name_ + " threw an exception across the C ABI");
  }
  if (image.data != data || image.height != height || image.width != width || image.channels != channels) {
    return Internal("op " + name_ + " changed the image's pointer or size (ops work in place, same size)");
  }
  if (rc != 0) {
    return DataLoss("op " + name_ + " failed (" + std::to_string(rc) +
                    "): " + OpMessage(err, sizeof(err), "no message"));
  }
  return Status::Ok();
}

OpLoader::OpLoader(std::vector<std::string> plugin_dirs) : dirs_(std::move(plugin_dirs)) {}

OpLoader::~OpLoader() = default;  // libraries stay loaded: ops' code may still be referenced

std::vector<std::string> OpLoader::CheckDirs() const {
  std::vector<std::string> problems;
  for (const std::string& dir : dirs_) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) {
      problems.push_back("plugin directory " + dir + ": " + ErrnoText(errno));
      continue;
    }
    Status s = CheckTrusted(dir, st.st_mode, st.st_uid, ::geteuid(), /*want_dir=*/true);
    if (!s.ok()) problems.push_back(s.message());
  }
  return problems;
}

Result<std::shared_ptr<const OpLibrary>> OpLoader::Load(const std::string& library) {
  if (dirs_.empty()) {
    return FailedPrecondition("op library '" + library +
                              "': ops are disabled on this spdld (its daemon config has no plugin_dirs; an "
                              "administrator installs op libraries and lists their directory there)");
  }
  if (library.empty() || library.find('/') != std::string::npos || library == "." || library == "..") {
    return InvalidArgument("op library '" + library + "': a library is a file name in the daemon's plugin_dirs (" +
                           "no '/'), e.g. libmyops.so");
  }
  if (auto it = loaded_.find(library); it != loaded_.end()) return it->second;

  const uid_t self = ::geteuid();
  std::string searched;
  for (const std::string& dir : dirs_) {
    searched += (searched.empty() ? "" : ", ") + dir;
    const std::string path = dir + "/" + library;
    struct stat dst {};
    if (::stat(dir.c_str(), &dst) != 0) continue;  // a missing dir holds nothing
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      if (errno == ENOENT) continue;
      return ErrnoStatus("op library " + path, errno);
    }
    SPDL_RETURN_IF_ERROR(CheckTrusted(dir, dst.st_mode, dst.st_uid, self, /*want_dir=*/true));
    struct stat fst {};
    if (::fstat(fd.get(), &fst) != 0) return ErrnoStatus("op library " + path, errno);
    SPDL_RETURN_IF_ERROR(CheckTrusted(path, fst.st_mode, fst.st_uid, self, /*want_dir=*/false));

    // Load exactly the file that was checked.
    const std::string by_fd = "/proc/self/fd/" + std::to_string(fd.get());
    ::dlerror();
    void* handle = ::dlopen(by_fd.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      return InvalidArgument("op library " + path + " cannot be loaded: " + (e ? e : "dlopen failed"));
    }
    auto lib = std::make_shared<OpLibrary>();
    lib->path = path;
    lib->handle = handle;
    // A refused library is closed again; one that is kept never is.
    auto refuse = [handle](Status s) -> Status {
      ::dlclose(handle);
      return s;
    };
    using ListFn = const spdl_op* (*)(int32_t*);
    auto list = reinterpret_cast<ListFn>(::dlsym(handle, "spdl_ops"));
    if (list == nullptr) {
      return refuse(InvalidArgument("op library " + path +
                                    " exports no spdl_ops function: not a spdld op library (build it against "
                                    "spdl/op.h and export `const spdl_op* spdl_ops(int32_t* count)`)"));
    }
    int32_t count = -1;
    const spdl_op* ops = nullptr;
    try {
      ops = list(&count);
    } catch (...) {
      return refuse(InvalidArgument("op library " + path + ": spdl_ops threw an exception across the C ABI"));
    }
    if (ops == nullptr || count <= 0 || count > kMaxOpsPerLibrary) {
      return refuse(
          InvalidArgument("op library " + path + ": spdl_ops returned no ops (count " + std::to_string(count) + ")"));
    }
    for (int32_t i = 0; i < count; ++i) {
      const spdl_op& op = ops[i];  // abi_version is the first field in every ABI version
      if (op.abi_version != SPDL_OP_ABI_VERSION) {
        return refuse(InvalidArgument("op library " + path + " is built for op ABI version " +
                                      std::to_string(op.abi_version) + " (op " + std::to_string(i) +
                                      "), but this spdld speaks version " + std::to_string(SPDL_OP_ABI_VERSION) +
                                      ": rebuild it against this spdld's spdl/op.h"));
      }
      if (op.name == nullptr || op.name[0] == '\0' || op.create == nullptr || op.apply == nullptr) {
        return refuse(
            InvalidArgument("op library " + path + ": op " + std::to_string(i) + " has no name, create or apply"));
      }
    }
    lib->ops = ops;
    lib->count = count;
    // The descriptor stays open as long as the library is loaded, i.e. until the process exits:
    // the dynamic loader knows the library by its name "/proc/self/fd/N", and a closed N reused
    // for another library would make dlopen hand back this one.
    (void)fd.release();
    loaded_[library] = lib;
    return std::shared_ptr<const OpLibrary>(lib);
  }
  return NotFound("op library '" + library + "' is in none of the daemon's plugin_dirs (" + searched + ")");
}

Result<std::unique_ptr<Op>> OpLoader::Create(const std::string& library, const std::string& name,
                                             const std::string& args_json) {
  std::shared_ptr<const OpLibrary> lib;
  {
    std::lock_guard lock(mu_);
    SPDL_ASSIGN_OR_RETURN(lib, Load(library));
  }
  const spdl_op* op = nullptr;
  std::string names;
  for (int32_t i = 0; i < lib->count; ++i) {
    if (name == lib->ops[i].name) op = &lib->ops[i];
    names += std::string(names.empty() ? "" : ", ") + lib->ops[i].name;
  }
  if (op == nullptr) {
    return NotFound("op library " + lib->path + " has no op '" + name + "' (its ops: " + names + ")");
  }
  char err[kErrLen];
  err[0] = '\0';
  void* state = nullptr;
  try {
    state = op->create(args_json.c_str(), err, sizeof(err));
  } catch (...) {
    return InvalidArgument("op " + name + " (" + lib->path + "): create threw an exception across the C ABI");
  }
  if (state == nullptr) {
    return InvalidArgument("op " + name + " (" + lib->path + ") refused its args " + args_json + ": " +
                           OpMessage(err, sizeof(err), "create returned NULL without a message"));
  }
  std::unique_ptr<Op> out(new Op());
  out->library_ = std::move(lib);
  out->op_ = op;
  out->state_ = state;
  out->name_ = name;
  out->library_path_ = out->library_->path;
  return out;
}

}  // namespace spdl::plugins
