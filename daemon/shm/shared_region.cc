#include "shm/shared_region.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

namespace spdl::shm {
namespace {

// memfd names are limited to 249 bytes; the label is for humans only.
constexpr size_t kMaxLabel = 200;

Result<uint8_t*> MapShared(int fd, size_t bytes, const std::string& what) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoStatus("mmap of " + std::to_string(bytes) + " bytes for " + what, errno);
  return static_cast<uint8_t*>(p);
}

}  // namespace

SharedRegion::SharedRegion(UniqueFd fd, uint8_t* data, size_t size) : fd_(std::move(fd)), data_(data), size_(size) {}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : fd_(std::move(other.fd_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    fd_ = std::move(other.fd_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SharedRegion::~SharedRegion() { Reset(); }

void SharedRegion::Reset() {
  if (data_ != nullptr) ::munmap(data_, size_);  // cannot fail for a mapping we made
  data_ = nullptr;
  size_ = 0;
  fd_.reset();
}

Status SharedRegion::Reserve(size_t offset, size_t length) {
  if (offset >= size_ || length == 0) return Status::Ok();
  length = std::min(length, size_ - offset);
  const std::string what =
      "reserving bytes " + std::to_string(offset) + ".." + std::to_string(offset + length) + " of a shared region";
  if (int err = ::posix_fallocate(fd_.get(), static_cast<off_t>(offset), static_cast<off_t>(length)); err != 0) {
    Status s = ErrnoStatus(what, err);
    if (err == ENOSPC || err == ENOMEM) return ResourceExhausted(s.message());
    return s;
  }
#ifdef MADV_POPULATE_WRITE
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size_, (offset + length + page - 1) / page * page);
  // EINVAL: a kernel before 5.14; the pages then fault in on first touch (already reserved above).
  if (::madvise(data_ + begin, end - begin, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    return ErrnoStatus("pre-faulting " + what, errno);
  }
#endif
  return Status::Ok();
}

Status SharedRegion::Discard(size_t offset, size_t length) {
  if (offset >= size_ || length == 0) return Status::Ok();
  length = std::min(length, size_ - offset);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = (offset + page - 1) / page * page;
  const size_t end = (offset + length) / page * page;
  if (end <= begin) return Status::Ok();
  if (::fallocate(fd_.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(begin),
                  static_cast<off_t>(end - begin)) != 0) {
    return ErrnoStatus(
        "giving back bytes " + std::to_string(begin) + ".." + std::to_string(end) + " of a shared region", errno);
  }
  return Status::Ok();
}

Result<SharedRegion> SharedRegion::Create(const std::string& name, size_t bytes, size_t reserve_bytes) {
  const std::string label = "spdl:" + name.substr(0, kMaxLabel);
  const std::string what = "shared region '" + label + "'";
  if (bytes == 0) return InvalidArgument(what + ": size must be > 0");

  UniqueFd fd(::memfd_create(label.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return ErrnoStatus("memfd_create for " + what, errno);
  const auto len = static_cast<off_t>(bytes);
  if (::ftruncate(fd.get(), len) != 0) {
    return ErrnoStatus("sizing " + what + " to " + std::to_string(bytes) + " bytes", errno);
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return ErrnoStatus("sealing " + what, errno);
  }
  SPDL_ASSIGN_OR_RETURN(uint8_t * data, MapShared(fd.get(), bytes, what));
  SharedRegion region(std::move(fd), data, bytes);
  // Reserve the pages now: on a shortage this fails here, with a message, instead of SIGBUS on
  // first touch.
  if (Status s = region.Reserve(0, reserve_bytes); !s.ok()) {
    return Status(s.code(), s.message() + " for " + what);
  }
  return region;
}

Result<SharedRegion> SharedRegion::Map(UniqueFd fd, size_t bytes) {
  const std::string what = "shared region fd " + std::to_string(fd.get());
  if (!fd) return InvalidArgument("mapping a shared region: invalid descriptor");
  if (bytes == 0) return InvalidArgument("mapping " + what + ": size must be > 0");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of " + what, errno);
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
    return InvalidArgument("mapping " + what + ": the region is " + std::to_string(st.st_size) +
                           " bytes, smaller than the " + std::to_string(bytes) + " bytes expected");
  }
  SPDL_ASSIGN_OR_RETURN(uint8_t * data, MapShared(fd.get(), bytes, what));
  return SharedRegion(std::move(fd), data, bytes);
}

}  // namespace spdl::shm
