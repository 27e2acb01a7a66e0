#include "io/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/unique_fd.h"

namespace spdl::io {

Status ReadFile(const std::string& path, std::vector<uint8_t>* out, size_t max_bytes) {
  out->clear();
  // O_NONBLOCK so that opening a fifo does not wait for a writer; it changes nothing for a
  // regular file.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd) return ErrnoStatus("reading " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("reading " + path, errno);
  if (S_ISDIR(st.st_mode)) return InvalidArgument("reading " + path + ": it is a directory");
  if (!S_ISREG(st.st_mode)) return InvalidArgument("reading " + path + ": it is not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size > max_bytes) {
    return ResourceExhausted("reading " + path + ": it is " + std::to_string(size) +
                             " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd.get(), out->data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      out->clear();
      return ErrnoStatus("reading " + path, err);
    }
    if (n == 0) break;  // shrank since fstat
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return Status::Ok();
}

}  // namespace spdl::io
