#include "io/tar_reader.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <utility>

#include "common/ascii.h"

namespace spdl::io {
namespace {

constexpr uint64_t kBlock = 512;
constexpr uint64_t kMaxMetaBytes = 1 << 20;  // the largest GNU long name or pax header we read
constexpr uint64_t kNone = ~uint64_t{0};     // an unset offset or size

// Header fields (offset, length) of the ustar format.
constexpr size_t kNameOff = 0, kNameLen = 100;
constexpr size_t kSizeOff = 124, kSizeLen = 12;
constexpr size_t kChksumOff = 148, kChksumLen = 8;
constexpr size_t kTypeOff = 156;
constexpr size_t kMagicOff = 257;
constexpr size_t kPrefixOff = 345, kPrefixLen = 155;

// Reads exactly n bytes at `offset`; *got is how many were read before the end of the file.
Status ReadAt(int fd, uint64_t offset, void* buf, size_t n, size_t* got, const std::string& name) {
  *got = 0;
  auto* p = static_cast<char*>(buf);
  while (*got < n) {
    const ssize_t r = ::pread(fd, p + *got, n - *got, static_cast<off_t>(offset + *got));
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("reading tar " + name + " at offset " + std::to_string(offset + *got), errno);
    }
    if (r == 0) break;
    *got += static_cast<size_t>(r);
  }
  return Status::Ok();
}

// A NUL-terminated (or full-width) string field.
std::string Field(const char* h, size_t off, size_t len) {
  const char* p = h + off;
  return std::string(p, strnlen(p, len));
}

// A numeric field: octal digits (leading spaces/NULs allowed, ended by a space or NUL), or GNU
// base-256 (first byte 0x80). nullopt when malformed or negative.
std::optional<uint64_t> Number(const char* h, size_t off, size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(h + off);
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return std::nullopt;  // 0xff: negative
    uint64_t v = 0;
    for (size_t i = 1; i < len; ++i) {
      if (v >> 56) return std::nullopt;
      v = (v << 8) | p[i];
    }
    return v;
  }
  size_t i = 0;
  while (i < len && (p[i] == ' ' || p[i] == '\0')) ++i;
  if (i == len) return 0;  // all blank: zero (seen for size in some old writers)
  uint64_t v = 0;
  bool any = false;
  for (; i < len && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) return std::nullopt;
    v = v * 8 + (p[i] - '0');
    any = true;
  }
  for (; i < len; ++i) {
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  }
  if (!any) return std::nullopt;
  return v;
}

bool ChecksumOk(const char* h) {
  const std::optional<uint64_t> stored = Number(h, kChksumOff, kChksumLen);
  if (!stored) return false;
  uint64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= kChksumOff && i < kChksumOff + kChksumLen;
    const char c = in_field ? ' ' : h[i];
    unsigned_sum += static_cast<unsigned char>(c);
    signed_sum += static_cast<signed char>(c);  // some historic writers summed signed chars
  }
  return *stored == unsigned_sum || static_cast<int64_t>(*stored) == signed_sum;
}

bool AllZero(const char* h) {
  for (size_t i = 0; i < kBlock; ++i) {
    if (h[i] != 0) return false;
  }
  return true;
}

uint64_t RoundUp(uint64_t n) { return (n + kBlock - 1) / kBlock * kBlock; }

std::string CleanName(std::string n) {
  while (n.size() >= 2 && n[0] == '.' && n[1] == '/') {
    size_t i = 2;
    while (i < n.size() && n[i] == '/') ++i;
    n.erase(0, i);
  }
  return n;
}

// Parses pax records "LEN KEY=VALUE\n" (LEN counts the whole record). Sets *path / *size when
// present (*size stays kNone otherwise), *sparse when a GNU.sparse key is present. Returns an error message, or "".
std::string ParsePax(std::string_view data, std::optional<std::string>* path, uint64_t* size, bool* sparse) {
  while (!data.empty()) {
    if (data.front() == '\0') break;  // padding
    const size_t space = data.find(' ');
    if (space == std::string_view::npos || space == 0 || space > 20) return "malformed pax record length";
    uint64_t len = 0;
    for (size_t i = 0; i < space; ++i) {
      if (data[i] < '0' || data[i] > '9') return "malformed pax record length";
      len = len * 10 + static_cast<uint64_t>(data[i] - '0');
    }
    if (len <= space + 1 || len > data.size() || data[len - 1] != '\n') return "malformed pax record";
    const std::string_view kv = data.substr(space + 1, len - space - 2);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) return "pax record without '='";
    const std::string_view key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (key == "path") {
      *path = std::string(value);
    } else if (key == "size") {
      uint64_t v = 0;
      if (value.empty() || value.size() > 19) return "bad pax size";
      for (char c : value) {
        if (c < '0' || c > '9') return "bad pax size";
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      *size = v;
    } else if (key.substr(0, 11) == "GNU.sparse.") {
      *sparse = true;
    }
    data.remove_prefix(len);
  }
  return "";
}

}  // namespace

Status ListTarMembers(int fd, uint64_t file_size, const std::string& name, std::vector<TarMember>* members) {
  auto loss = [&](uint64_t at, const std::string& what) {
    return DataLoss("tar " + name + ": " + what + " (header at offset " + std::to_string(at) + ")");
  };
  char h[kBlock];
  std::string meta;
  // Set by 'L' and 'x' headers, applied to the next member.
  std::optional<std::string> long_name, pax_path;
  uint64_t pax_size = kNone;
  bool pax_sparse = false;
  uint64_t first_header = kNone;  // of the member being assembled (its pax/GNU headers)

  uint64_t off = 0;
  while (off < file_size) {
    size_t got = 0;
    SPDL_RETURN_IF_ERROR(ReadAt(fd, off, h, kBlock, &got, name));
    if (got < kBlock) {
      return loss(off, "truncated: the file ends " + std::to_string(got) + " bytes into a header block (" +
                           std::to_string(file_size) + " bytes in all)");
    }
    if (AllZero(h)) break;  // end of archive
    if (!ChecksumOk(h)) {
      return loss(off, off == 0 ? "not a tar file (bad header checksum)" : "bad header checksum");
    }
    if (first_header == kNone) first_header = off;
    const char type = h[kTypeOff];
    const std::optional<uint64_t> size_field = Number(h, kSizeOff, kSizeLen);
    if (!size_field) return loss(off, "bad size field");
    uint64_t size = *size_field;
    const uint64_t data = off + kBlock;
    if (type == 'x' || type == 'g' || type == 'L' || type == 'K') {
      if (size > kMaxMetaBytes) return loss(off, "a pax or GNU long-name header of " + std::to_string(size) + " bytes");
      if (data + size > file_size) return loss(off, "a pax or GNU long-name header runs past the end of the file");
      if (type == 'x' || type == 'L') {
        meta.resize(size);
        SPDL_RETURN_IF_ERROR(ReadAt(fd, data, meta.data(), size, &got, name));
        if (got < size) return loss(off, "the file shrank while it was read");
        if (type == 'L') {
          long_name = meta.substr(0, strnlen(meta.data(), meta.size()));
        } else {
          const std::string bad = ParsePax(meta, &pax_path, &pax_size, &pax_sparse);
          if (!bad.empty()) return loss(off, bad);
        }
      }
      off = data + RoundUp(size);
      continue;
    }

    if (pax_size != kNone) size = pax_size;
    const bool regular = type == '0' || type == '\0' || type == '7';
    // Links, directories, devices and fifos carry no data whatever their size field says; any other
    // type (GNU 'S' sparse, 'D' dumpdir, 'M' continuation, vendor types) is skipped over.
    const bool has_data = regular || !(type >= '1' && type <= '6');
    if (has_data && data + size > file_size) {
      return loss(first_header, "a member of " + std::to_string(size) + " bytes at offset " + std::to_string(data) +
                                    " runs past the end of the file (" + std::to_string(file_size) + " bytes)");
    }
    if (regular && !pax_sparse) {
      std::string n;
      if (pax_path) {
        n = *pax_path;
      } else if (long_name) {
        n = *long_name;
      } else {
        n = Field(h, kNameOff, kNameLen);
        // POSIX ustar ("ustar\0"): the prefix field continues the name. GNU ("ustar  ") uses those
        // bytes for other things.
        if (std::memcmp(h + kMagicOff, "ustar\0", 6) == 0) {
          const std::string prefix = Field(h, kPrefixOff, kPrefixLen);
          if (!prefix.empty()) n = prefix + "/" + n;
        }
      }
      members->push_back(TarMember{CleanName(std::move(n)), first_header, data, size});
    }
    long_name.reset();
    pax_path.reset();
    pax_size = kNone;
    pax_sparse = false;
    first_header = kNone;
    off = has_data ? data + RoundUp(size) : data;
  }
  return Status::Ok();
}

std::optional<MemberKey> SplitMemberKey(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  if (base >= name.size() || name[base] == '.') return std::nullopt;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos) return std::nullopt;
  return MemberKey{name.substr(0, dot), AsciiLower(name.substr(dot + 1))};
}

std::string NormalizeExtension(const std::string& ext) {
  return AsciiLower(!ext.empty() && ext[0] == '.' ? ext.substr(1) : ext);
}

}  // namespace spdl::io
