// SharedRegion: an anonymous shared-memory region made with memfd_create, mapped read-write.
//
// The region has no name, so nothing can ever be left behind in /dev/shm after a crash of either
// side (and it does not count against /dev/shm's size limit); its descriptor is passed to the client
// over the control socket (SCM_RIGHTS), and the client maps it with Map().
//
// Thread safety: the handle is a move-only value (do not move it while others use it). The mapped
// bytes may be read and written from many threads at once; the region itself has no lock, so who
// writes which bytes when is the slot ring's business (shm/slot_ring.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace spdl::shm {

class SharedRegion {
 public:
  // Creates a region of `bytes` bytes (daemon side): memfd_create, ftruncate, reserves the memory
  // (fallocate, so a shortage is a clear kResourceExhausted now instead of a SIGBUS later), seals
  // it against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL, so a client cannot
  // truncate it and make the daemon fault) and maps it shared read-write. Only the first
  // `reserve_bytes` (all by default) are reserved and pre-faulted (Reserve), so the hot path never
  // page-faults there; the rest costs no memory until Reserve()d (an adaptive slot ring reserves a
  // slot when it starts using it). `name` is only a debug label: it shows in /proc/PID/fd as
  // "/memfd:spdl:NAME (deleted)". REQUIRES: bytes > 0 (else kInvalidArgument).
  static Result<SharedRegion> Create(const std::string& name, size_t bytes, size_t reserve_bytes = SIZE_MAX);

  // Maps the first `bytes` bytes of an existing region's descriptor shared read-write (client
  // side). Not pre-faulted: a page of a range the daemon has not reserved yet must not be
  // allocated by the client's mapping. Takes ownership of `fd` (closed on failure too). The file
  // must be at least `bytes` long, else kInvalidArgument naming both sizes. REQUIRES: bytes > 0, fd valid.
  static Result<SharedRegion> Map(UniqueFd fd, size_t bytes);

  // Reserves the memory of [offset, offset + length) (fallocate: a shortage is kResourceExhausted
  // here, never a SIGBUS on first touch) and pre-faults it in this mapping (MADV_POPULATE_WRITE
  // where the kernel has it, Linux >= 5.14; else the pages fault in on first touch). Idempotent;
  // the range is clamped to the region. REQUIRES: a non-empty region.
  Status Reserve(size_t offset, size_t length);

  // Gives back the memory of the whole pages inside [offset, offset + length) (fallocate
  // PUNCH_HOLE: in every process mapping the region); a partial page at either end is left alone.
  // Their bytes read as zero afterwards, and a page comes back (zeroed) on the next write to it:
  // such a page is not reserved, so a shortage then is the kernel's to handle (OOM), not
  // kResourceExhausted. The range is clamped to the region. REQUIRES: no one reads or writes the
  // range meanwhile (the slot ring's business).
  Status Discard(size_t offset, size_t length);

  SharedRegion() = default;  // empty: data() == nullptr, size() == 0, fd() == -1
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();  // munmap + close; never throws

  // The start of the mapping; valid until this object is destroyed or moved from.
  uint8_t* data() const { return data_; }
  // The mapped length in bytes.
  size_t size() const { return size_; }
  // The descriptor, still owned by this object (dup it, or pass it with SCM_RIGHTS, which dups).
  int fd() const { return fd_.get(); }

 private:
  SharedRegion(UniqueFd fd, uint8_t* data, size_t size);
  void Reset();  // unmaps and closes; leaves the object empty

  // Constant after construction (changed only by move assignment).
  UniqueFd fd_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace spdl::shm
