// Tar reader: lists the regular-file members of a tar archive (where each member's bytes lie)
// without unpacking it, by reading only the headers. A pure function over a file descriptor (it
// uses pread only, so the descriptor's offset is untouched): safe from any thread.
//
// Understood: POSIX ustar (the 155-byte name prefix), GNU ('L' long names, 'K' long link names,
// base-256 sizes), and pax ('x' headers: "path" and "size" override the next member's; 'g' global
// headers are skipped). A member in GNU sparse form (type 'S', or pax GNU.sparse.* keys) is skipped,
// as are links, directories, devices and fifos. Compressed archives (.tar.gz) are not tars.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::io {

struct TarMember {
  std::string name;            // the full name, with any leading "./" removed
  uint64_t header_offset = 0;  // where the member's first header (a pax or GNU one, if any) starts
  uint64_t data_offset = 0;    // where its bytes start
  uint64_t size = 0;           // how many bytes
};

// Appends the regular-file members of the tar `fd` (`file_size` bytes long) to *members, in archive
// order. The archive ends at the first all-zero header block, or at its end exactly at a block
// boundary (a missing end-of-archive marker is accepted).
// Errors (kDataLoss, each naming `name` and the byte offset of the header at fault):
// a header block cut short by the end of the file ("truncated"), a bad header checksum (at offset 0:
// "not a tar file"), a member, long name or pax header whose bytes run past the end of the file, an
// unparsable size or pax record. An I/O error -> its errno's code.
// REQUIRES: members != nullptr.
Status ListTarMembers(int fd, uint64_t file_size, const std::string& name, std::vector<TarMember>* members);

// A member's place in a WebDataset sample: `key` is its name up to the first '.' of its last path
// component, `ext` the lower-cased rest ("a/b.Seg.PNG" -> {"a/b", "seg.png"}).
struct MemberKey {
  std::string key;
  std::string ext;
};

// The member's key and extension, or nothing when it belongs to no sample: its last path
// component is empty, starts with '.' (a hidden file) or has no '.'.
std::optional<MemberKey> SplitMemberKey(const std::string& name);

// An extension as the sources compare them: lower-cased, without a leading '.' (".JPG" -> "jpg").
std::string NormalizeExtension(const std::string& ext);

}  // namespace spdl::io
