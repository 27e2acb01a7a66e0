// tar_fuzz: a tar shard, as a dataset owner (or anyone who can write below an allowed data root)
// hands it to spdld, through the header scan (ListTarMembers), the WebDataset grouping and label
// parsing of TarShardSource::Open, and every sample's Read and ReadSidecar.
//
// Input: the shard's bytes, as they are (the seeds in corpus/tar/ are real tars: ustar, GNU long
// names and base-256 sizes, pax headers, sparse members, links, labels and sidecars). The target
// writes them to one file in a private directory under /dev/shm (else $TMPDIR) — the real
// open-beneath-a-root, fstat and pread path — with labels ("cls"), one sidecar extension ("txt")
// and max_sample_bytes 4096.
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - ListTarMembers: only kDataLoss (never an I/O code on a good file), and its message names the
//     shard and a header offset; on success every member lies inside the file, its header and data
//     offsets are 512-aligned, its header comes before its data, members do not overlap and come in
//     file order, no name starts with "./";
//   - Open: a source, or kDataLoss / kNotFound / kInvalidArgument (a bad label); a source only
//     when the scan succeeded; at most one sample per member;
//   - every sample: Read gives at most max_sample_bytes bytes, exactly a member's bytes from the
//     file, or kResourceExhausted with nothing; ReadSidecar likewise, or kNotFound; labels are
//     kNoLabel or >= 0; out-of-range indexes are refused.
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "io/tar_reader.h"
#include "io/tar_shard_source.h"

namespace {

using namespace spdl;

constexpr uint64_t kMaxSampleBytes = 4096;

struct Dir {
  Dir() {
    const char* base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    std::string tmpl = std::string(base) + "/tar_fuzz.XXXXXX";
    FUZZ_CHECK(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
    shard = path + "/shard.tar";
  }
  ~Dir() {
    unlink(shard.c_str());
    rmdir(path.c_str());
  }
  std::string path, shard;
};

bool Contains(const uint8_t* data, size_t size, const std::vector<uint8_t>& part) {
  if (part.empty()) return true;
  return std::search(data, data + size, part.begin(), part.end()) != data + size;
}

// Reads of one sample: the image member and the "txt" sidecar.
void CheckReads(const io::TarShardSource& src, const uint8_t* data, size_t size) {
  std::vector<uint8_t> out;
  for (uint64_t i = 0; i < src.size(); ++i) {
    const io::SampleRef& ref = src.sample(i);
    FUZZ_CHECK(ref.label == io::kNoLabel || ref.label >= 0);
    out.assign(3, 0xee);
    Status s = src.Read(i, &out);
    if (s.ok()) {
      FUZZ_CHECK(out.size() <= kMaxSampleBytes);
      FUZZ_CHECK(Contains(data, size, out));
    } else {
      // Too large, or its label member is bad (that sample alone fails, naming it).
      FUZZ_CHECK(s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kDataLoss);
      FUZZ_CHECK(out.empty());
      FUZZ_CHECK(s.message().find(ref.path) != std::string::npos);
    }
    out.assign(3, 0xee);
    s = src.ReadSidecar(i, ".TXT", &out);
    if (s.ok()) {
      FUZZ_CHECK(out.size() <= kMaxSampleBytes);
      FUZZ_CHECK(Contains(data, size, out));
    } else {
      FUZZ_CHECK(s.code() == StatusCode::kResourceExhausted || s.code() == StatusCode::kNotFound);
      FUZZ_CHECK(out.empty());
    }
  }
  out.assign(3, 0xee);
  FUZZ_CHECK(src.Read(src.size(), &out).code() == StatusCode::kInvalidArgument && out.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Dir* dir = new Dir;  // left for the process's end: libFuzzer exits without destructors
  static const bool cleanup = [] { return atexit([] { delete dir; }) == 0; }();
  (void)cleanup;

  {
    const int fd = ::open(dir->shard.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    FUZZ_CHECK(fd >= 0);
    FUZZ_CHECK(size == 0 || ::write(fd, data, size) == static_cast<ssize_t>(size));
    ::close(fd);
  }

  // The header scan alone, on its own descriptor.
  std::vector<io::TarMember> members;
  Status listed;
  {
    const int fd = ::open(dir->shard.c_str(), O_RDONLY | O_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    listed = io::ListTarMembers(fd, size, "shard.tar", &members);
    ::close(fd);
  }
  if (listed.ok()) {
    uint64_t end = 0;
    for (const io::TarMember& m : members) {
      FUZZ_CHECK(m.header_offset % 512 == 0 && m.data_offset % 512 == 0);
      FUZZ_CHECK(m.header_offset < m.data_offset);
      FUZZ_CHECK(m.header_offset >= end);
      FUZZ_CHECK(m.data_offset <= size && m.size <= size - m.data_offset);
      FUZZ_CHECK(m.name.rfind("./", 0) != 0);
      end = m.data_offset + m.size;
    }
  } else {
    FUZZ_CHECK(listed.code() == StatusCode::kDataLoss);
    FUZZ_CHECK(listed.message().find("tar shard.tar: ") == 0);
    FUZZ_CHECK(listed.message().find("offset") != std::string::npos);
  }

  // The whole source, as a job opens it.
  io::TarShardOptions options;
  options.shards = {dir->shard};
  options.sidecar_extensions = {"txt"};
  options.allowed_roots = {dir->path};
  options.max_sample_bytes = kMaxSampleBytes;
  options.index_cache = nullptr;
  auto src = io::TarShardSource::Open(options);
  FUZZ_TRACE("tar_fuzz: %zu members (%s); source: %s\n", members.size(), listed.ok() ? "OK" : listed.message().c_str(),
             src.ok() ? ((*src)->Describe()).c_str() : src.status().message().c_str());
  if (src.ok()) {
    FUZZ_CHECK(listed.ok());
    FUZZ_CHECK((*src)->size() >= 1 && (*src)->size() <= members.size());
    FUZZ_CHECK((*src)->ShardSizes() == std::vector<uint64_t>{(*src)->size()});
    CheckReads(**src, data, size);
  } else {
    const StatusCode c = src.status().code();
    FUZZ_CHECK(c == StatusCode::kDataLoss || c == StatusCode::kNotFound);
    FUZZ_CHECK(listed.ok() ==
               (c == StatusCode::kNotFound || src.status().message().find("label") != std::string::npos));
  }
  return 0;
}
