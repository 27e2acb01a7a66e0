#include "io/s3_source.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <iterator>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "common/ascii.h"
#include "io/brace_expand.h"
#include "io/sample_list.h"
#include "io/tar_reader.h"

namespace spdl::io {

namespace {

std::string Normalize(const std::string& ext) {
  return AsciiLower(!ext.empty() && ext[0] == '.' ? ext.substr(1) : ext);
}

bool EndsWithAny(const std::string& name, const std::vector<std::string>& exts) {
  const std::string lower = AsciiLower(name);
  for (const std::string& e : exts) {
    const std::string dotted = "." + Normalize(e);
    if (lower.size() >= dotted.size() && lower.compare(lower.size() - dotted.size(), dotted.size(), dotted) == 0) {
      return true;
    }
  }
  return false;
}

// A closed-on-destruction descriptor.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

Status PreadAll(int fd, uint64_t offset, uint64_t n, std::string* out) {
  out->resize(n);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out->data() + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return ErrnoStatus("pread", r < 0 ? errno : EIO);
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

}  // namespace

// ---- S3ObjectSource ----

Result<std::unique_ptr<S3ObjectSource>> S3ObjectSource::OpenList(const std::string& list,
                                                                 const std::vector<std::string>& allowed_roots,
                                                                 std::shared_ptr<const S3Client> client) {
  std::string real;
  SPDL_ASSIGN_OR_RETURN(std::string text, ReadListFile(list, allowed_roots, &real));
  ParsedList parsed = ParseSampleList(text, "path");
  std::unique_ptr<S3ObjectSource> src(new S3ObjectSource());
  src->origin_ = real;
  for (ListEntry& e : parsed.entries) {
    auto loc = ParseS3Url(e.item);
    if (!loc.ok()) {
      parsed.problems.push_back({e.line, loc.status().message()});
      continue;
    }
    if (loc->key.empty() || loc->key.back() == '/') {
      parsed.problems.push_back({e.line, e.item + " names no object"});
      continue;
    }
    auto url = client->ObjectUrl(*loc);
    if (!url.ok()) {
      parsed.problems.push_back({e.line, url.status().message()});
      continue;
    }
    src->samples_.push_back(SampleRef{loc->ToString(), e.label});
  }
  if (!parsed.problems.empty()) return ListProblemsStatus(real, std::move(parsed.problems), 100);
  if (src->samples_.empty()) return NotFound(real + ": the list names no sample");
  src->client_ = std::move(client);
  return src;
}

Result<std::unique_ptr<S3ObjectSource>> S3ObjectSource::OpenPrefix(const std::string& prefix,
                                                                   const std::vector<std::string>& extensions,
                                                                   std::shared_ptr<const S3Client> client) {
  SPDL_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(prefix));
  if (!loc.key.empty() && loc.key.back() != '/') loc.key += '/';
  SPDL_ASSIGN_OR_RETURN(std::vector<S3Object> objects, client->List(loc.bucket, loc.key));
  std::unique_ptr<S3ObjectSource> src(new S3ObjectSource());
  src->origin_ = loc.ToString();
  std::map<std::string, std::vector<std::string>> by_class;  // sorted classes, keys in listing order
  for (const S3Object& o : objects) {
    const std::string rest = o.key.substr(loc.key.size());
    const size_t slash = rest.find('/');
    if (slash == std::string::npos || slash == 0 || rest.back() == '/' || !EndsWithAny(rest, extensions)) {
      ++src->skipped_;
      continue;
    }
    by_class[rest.substr(0, slash)].push_back(o.key);
  }
  for (auto& [name, keys] : by_class) {
    const auto label = static_cast<int64_t>(src->classes_.size());
    src->classes_.push_back(name);
    for (const std::string& k : keys) src->samples_.push_back(SampleRef{S3Location{loc.bucket, k}.ToString(), label});
  }
  if (src->samples_.empty()) {
    return NotFound(src->origin_ + ": no object in a class folder (" + std::to_string(objects.size()) +
                    " objects listed, none of them <prefix>/<class>/<name> with one of the extensions)");
  }
  src->client_ = std::move(client);
  return src;
}

Status S3ObjectSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= samples_.size()) {
    out->clear();
    return InvalidArgument("s3 source " + origin_ + ": sample " + std::to_string(index) + " is out of range");
  }
  SPDL_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(samples_[index].path));
  return client_->GetBytes(loc, 0, S3Client::kToEnd, out);
}

std::string S3ObjectSource::Describe() const {
  return "s3 " + std::to_string(samples_.size()) + " objects from " + origin_ + " via " + client_->endpoint() +
         (classes_.empty() ? "" : " (" + std::to_string(classes_.size()) + " classes)");
}

// ---- S3TarShardSource ----

struct S3TarShardSource::Index final : SourceIndex {
  std::vector<S3Location> shards;
  std::vector<std::string> etags;     // per shard, as scanned: member reads carry If-Match with it
  std::vector<uint64_t> shard_sizes;  // samples per shard
  std::vector<SampleRef> samples;
  std::vector<Location> images;         // parallel to samples
  std::vector<Location> sidecars;       // sample i's sidecar j at [i * sidecar_exts.size() + j]
  std::vector<std::string> bad_labels;  // parallel to samples: "" or why its label is bad
};

Result<std::unique_ptr<S3TarShardSource>> S3TarShardSource::Open(
    const std::vector<std::string>& shards, const std::vector<std::string>& image_extensions,
    const std::string& label_extension, const std::vector<std::string>& sidecar_extensions,
    std::shared_ptr<const S3Client> client, SourceIndexCache* index_cache, const std::string& scope) {
  if (shards.empty()) return InvalidArgument("s3 tar shards: no shard given");
  std::unique_ptr<S3TarShardSource> src(new S3TarShardSource());
  src->client_ = client;
  std::vector<S3Location> locations;
  for (const std::string& p : shards) {
    src->description_ += (src->description_.empty() ? "" : " ") + p;
    SPDL_ASSIGN_OR_RETURN(std::vector<std::string> expanded, ExpandBraces(p));
    for (const std::string& e : expanded) {
      SPDL_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(e));
      SPDL_RETURN_IF_ERROR(client->ObjectUrl(loc).status());
      locations.push_back(std::move(loc));
    }
  }
  std::vector<std::string> image_exts;
  for (const std::string& e : image_extensions) image_exts.push_back(Normalize(e));
  const std::string label_ext = Normalize(label_extension);
  for (const std::string& e : sidecar_extensions) src->sidecar_exts_.push_back(Normalize(e));
  if (index_cache == nullptr || scope.empty()) {
    SPDL_ASSIGN_OR_RETURN(
        src->index_, Scan(std::move(locations), image_exts, label_ext, src->sidecar_exts_, *client, src->description_));
    return src;
  }
  // Shared by the same user, access key id and endpoint only (see the header); no secret in it.
  std::vector<std::string> key = {
      "s3tar", scope, client->access_key_id(), client->endpoint(), label_ext, std::to_string(image_exts.size())};
  key.insert(key.end(), image_exts.begin(), image_exts.end());
  key.push_back(std::to_string(src->sidecar_exts_.size()));
  key.insert(key.end(), src->sidecar_exts_.begin(), src->sidecar_exts_.end());
  for (const S3Location& l : locations) key.push_back(l.ToString());
  SPDL_ASSIGN_OR_RETURN(src->index_, index_cache->Get<Index>(IndexKey(key), "s3 tar " + src->description_, [&] {
    return Scan(locations, image_exts, label_ext, src->sidecar_exts_, *client, src->description_);
  }));
  return src;
}

Result<std::shared_ptr<const S3TarShardSource::Index>> S3TarShardSource::Scan(
    std::vector<S3Location> shards, const std::vector<std::string>& image_exts, const std::string& label_ext,
    const std::vector<std::string>& sidecar_exts, const S3Client& client, const std::string& description) {
  auto index = std::make_shared<Index>();
  index->scan_start_ns = RealtimeNowNs();
  index->shards = std::move(shards);
  const size_t num_sidecars = sidecar_exts.size();
  // One shard's part of the index; the parts are scanned in parallel and joined in shard order.
  struct Part {
    std::string etag;
    std::vector<SampleRef> samples;
    std::vector<Location> images, sidecars;
    std::vector<std::string> bad_labels;
    std::vector<Status> problems;
  };
  std::vector<Part> parts(index->shards.size());
  auto scan_one = [&](size_t s) -> Status {
    Part& part = parts[s];
    std::vector<TarMember> members;
    std::string label_bytes;
    const S3Location& loc = index->shards[s];
    const std::string name = loc.ToString();
    // The shard streams once through a memory file, for the header scan and the labels.
    Fd mem;
    mem.fd = ::memfd_create("spdld-s3-shard", MFD_CLOEXEC);
    if (mem.fd < 0) return ErrnoStatus("memfd_create", errno);
    uint64_t total = 0;
    Status got = client.Get(
        loc, 0, S3Client::kToEnd,
        [&](const uint8_t* d, size_t n) {
          size_t done = 0;
          while (done < n) {
            const ssize_t w = ::write(mem.fd, d + done, n - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) return false;
            done += static_cast<size_t>(w);
          }
          total += n;
          return true;
        },
        "", &part.etag);
    if (!got.ok()) {
      part.problems.push_back(got.WithPrefix("tar shard " + name));
      return Status::Ok();
    }
    members.clear();
    Status scan = ListTarMembers(mem.fd, total, name, &members);
    if (!scan.ok()) {
      part.problems.push_back(std::move(scan));
      return Status::Ok();
    }
    struct Pending {
      int image_rank = -1;
      TarMember image;
      std::optional<TarMember> label;
      std::vector<Location> sidecars;
    };
    std::vector<std::string> keys;
    std::unordered_map<std::string, Pending> groups;
    for (TarMember& m : members) {
      const size_t slash = m.name.rfind('/');
      const size_t base = slash == std::string::npos ? 0 : slash + 1;
      if (base >= m.name.size() || m.name[base] == '.') continue;
      const size_t dot = m.name.find('.', base);
      if (dot == std::string::npos) continue;
      const std::string ext = AsciiLower(m.name.substr(dot + 1));
      const std::string key = m.name.substr(0, dot);
      auto [it, inserted] = groups.try_emplace(key);
      if (inserted) keys.push_back(key);
      Pending& g = it->second;
      g.sidecars.resize(num_sidecars, Location{0, 0, kNoMember});
      for (size_t j = 0; j < num_sidecars; ++j) {
        if (ext == sidecar_exts[j]) g.sidecars[j] = Location{static_cast<uint32_t>(s), m.data_offset, m.size};
      }
      if (!label_ext.empty() && ext == label_ext) {
        g.label = m;
        continue;
      }
      for (size_t i = 0; i < image_exts.size(); ++i) {
        if (ext != image_exts[i]) continue;
        if (g.image_rank < 0 || static_cast<int>(i) <= g.image_rank) {
          g.image_rank = static_cast<int>(i);
          g.image = m;
        }
        break;
      }
    }
    for (const std::string& key : keys) {
      Pending& g = groups[key];
      if (g.image_rank < 0) continue;
      int64_t label = kNoLabel;
      std::string bad;
      if (g.label) {
        const std::string where = "tar shard " + name + ": label member " + g.label->name;
        if (g.label->size > 64) {
          bad = where + ": " + std::to_string(g.label->size) + " bytes, not a label";
        } else if (Status ls = PreadAll(mem.fd, g.label->data_offset, g.label->size, &label_bytes); !ls.ok()) {
          part.problems.push_back(ls.WithPrefix(where));
          continue;
        } else {
          size_t a = label_bytes.find_first_not_of(" \t\r\n");
          size_t b = label_bytes.find_last_not_of(" \t\r\n");
          const std::string digits = a == std::string::npos ? "" : label_bytes.substr(a, b - a + 1);
          if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
            bad = where + ": '" + digits.substr(0, 32) + "' is not an integer >= 0";
          } else {
            label = std::stoll(digits);
          }
        }
      }
      part.samples.push_back(SampleRef{key, label});
      part.images.push_back(Location{static_cast<uint32_t>(s), g.image.data_offset, g.image.size});
      part.sidecars.insert(part.sidecars.end(), g.sidecars.begin(), g.sidecars.end());
      part.bad_labels.push_back(std::move(bad));
    }
    return Status::Ok();
  };
  // A few shards at once (each in memory while it is scanned): the job starts sooner, memory stays
  // bounded by kScanThreads shards.
  constexpr size_t kScanThreads = 4;
  std::atomic<size_t> next{0};
  std::vector<Status> fatal(index->shards.size());
  auto worker = [&] {
    for (size_t s = next.fetch_add(1); s < parts.size(); s = next.fetch_add(1)) fatal[s] = scan_one(s);
  };
  std::vector<std::thread> threads;
  const size_t n_threads = std::min(kScanThreads, parts.size());
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (std::thread& t : threads) t.join();
  std::vector<Status> problems;
  for (size_t s = 0; s < parts.size(); ++s) {
    SPDL_RETURN_IF_ERROR(fatal[s]);
    Part& part = parts[s];
    index->etags.push_back(std::move(part.etag));
    index->shard_sizes.push_back(part.samples.size());
    for (Status& p : part.problems) problems.push_back(std::move(p));
    std::move(part.samples.begin(), part.samples.end(), std::back_inserter(index->samples));
    index->images.insert(index->images.end(), part.images.begin(), part.images.end());
    index->sidecars.insert(index->sidecars.end(), part.sidecars.begin(), part.sidecars.end());
    std::move(part.bad_labels.begin(), part.bad_labels.end(), std::back_inserter(index->bad_labels));
    part = Part{};
  }
  if (!problems.empty()) {
    std::string m = std::to_string(problems.size()) + " of " + std::to_string(index->shards.size()) +
                    " s3 tar shards cannot be read:";
    for (size_t i = 0; i < problems.size() && i < 20; ++i) m += "\n  " + problems[i].message();
    return Status(problems[0].code(), m);
  }
  if (index->samples.empty()) return NotFound("s3 tar shards " + description + ": no sample in any shard");
  return std::shared_ptr<const Index>(std::move(index));
}

uint64_t S3TarShardSource::size() const { return index_->samples.size(); }
const SampleRef& S3TarShardSource::sample(uint64_t index) const { return index_->samples[index]; }
std::vector<uint64_t> S3TarShardSource::ShardSizes() const { return index_->shard_sizes; }

Status S3TarShardSource::ReadAt(uint64_t index, const Location& at, const std::string& what,
                                std::vector<uint8_t>* out) const {
  const S3Location& shard = index_->shards[at.shard];
  Status s = client_->GetBytes(shard, at.offset, at.size, out, index_->etags[at.shard]);
  if (!s.ok()) {
    return s.WithPrefix(index_->samples[index].path + what + " (tar shard " + shard.ToString() + " at offset " +
                        std::to_string(at.offset) + ")");
  }
  return Status::Ok();
}

Status S3TarShardSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return InvalidArgument("s3 tar: sample " + std::to_string(index) + " is out of range");
  if (!index_->bad_labels[index].empty()) return InvalidArgument(index_->bad_labels[index]);
  return ReadAt(index, index_->images[index], "", out);
}

Status S3TarShardSource::ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return InvalidArgument("s3 tar: sample " + std::to_string(index) + " is out of range");
  const std::string ext = Normalize(extension);
  for (size_t j = 0; j < sidecar_exts_.size(); ++j) {
    if (sidecar_exts_[j] != ext) continue;
    const Location& at = index_->sidecars[index * sidecar_exts_.size() + j];
    if (at.size == kNoMember) {
      return NotFound(index_->samples[index].path + ": no ." + ext + " member in tar shard " +
                      index_->shards[index_->images[index].shard].ToString());
    }
    return ReadAt(index, at, "." + ext, out);
  }
  return NotFound(index_->samples[index].path + ": the ." + ext + " members were not indexed");
}

std::string S3TarShardSource::Describe() const {
  return "s3 tar " + std::to_string(size()) + " samples in " + std::to_string(index_->shards.size()) + " shards " +
         description_ + " via " + client_->endpoint();
}

std::string S3TarShardSource::Identity() const { return "s3 tar " + description_ + " endpoint " + client_->endpoint(); }

}  // namespace spdl::io
