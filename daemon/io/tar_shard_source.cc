#include "io/tar_shard_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/ascii.h"
#include "common/unique_fd.h"
#include "io/allowed_roots.h"
#include "io/brace_expand.h"
#include "io/read_file.h"
#include "io/tar_reader.h"

namespace spdl::io {
namespace {

constexpr uint64_t kMaxLabelBytes = 4096;

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

Status PreadAll(int fd, uint64_t offset, uint64_t n, std::vector<uint8_t>* out) {
  out->resize(n);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out->data() + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoErrnoStatus("pread", errno);
    }
    if (r == 0) return DataLoss("short read: the file ends " + std::to_string(done) + " bytes into the member");
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

// Parses a label member's text: blanks around a decimal integer >= 0.
bool ParseLabel(const std::vector<uint8_t>& bytes, int64_t* label) {
  std::string_view s(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\0'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *label);
  return ec == std::errc() && p == s.data() + s.size() && *label >= 0;
}

std::string Shown(std::vector<uint8_t> bytes) {
  if (bytes.size() > 40) bytes.resize(40);
  std::string s(bytes.begin(), bytes.end());
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  }
  return "'" + s + "'";
}

}  // namespace

struct TarShardSource::Index final : SourceIndex {
  std::vector<Shard> shards;
  std::vector<SampleRef> samples;
  std::vector<Location> locations;  // parallel to samples
  std::vector<Member> sidecars;     // sample i's sidecar j at [i * sidecar_exts_.size() + j]
  uint64_t skipped_keys = 0;
  uint64_t unlabelled = 0;
  double scan_seconds = 0;
  // Samples whose label member is bad (not an integer >= 0, too long): that sample fails its Read
  // (skipped or failing the job by on_error), not the whole shard.
  std::map<uint64_t, std::string> bad_labels;
};

Result<std::unique_ptr<TarShardSource>> TarShardSource::Open(const TarShardOptions& options) {
  if (options.shards.empty()) return InvalidArgument("tar shards: no shard given");
  if (options.image_extensions.empty()) return InvalidArgument("tar shards: no image extension given");
  std::vector<std::string> image_exts;
  image_exts.reserve(options.image_extensions.size());
  for (const std::string& e : options.image_extensions) image_exts.push_back(NormalizeExtension(e));
  const std::string label_ext = NormalizeExtension(options.label_extension);

  std::unique_ptr<TarShardSource> src(new TarShardSource());
  for (const std::string& e : options.sidecar_extensions) src->sidecar_exts_.push_back(NormalizeExtension(e));
  src->max_sample_bytes_ = options.max_sample_bytes;
  src->allowed_ = RootSet::Open(options.allowed_roots);
  std::vector<std::string> paths;
  for (const std::string& pattern : options.shards) {
    src->description_ += (src->description_.empty() ? "" : " ") + pattern;
    SPDL_ASSIGN_OR_RETURN(std::vector<std::string> expanded, ExpandBraces(pattern));
    for (std::string& p : expanded) paths.push_back(std::move(p));
  }

  // The key needs the resolved shards; when one does not resolve, the scan reports it (with every
  // other problem) and nothing is cached.
  std::vector<std::string> key;
  if (options.index_cache != nullptr) {
    auto group = [&key](const std::vector<std::string>& items) {
      key.push_back(std::to_string(items.size()));
      key.insert(key.end(), items.begin(), items.end());
    };
    std::vector<std::string> real_paths;
    real_paths.reserve(paths.size());
    for (const std::string& path : paths) {
      auto real = ResolveUnderRoots(path, options.allowed_roots);
      if (!real.ok()) {
        real_paths.clear();
        break;
      }
      real_paths.push_back(std::move(real).value());
    }
    if (!real_paths.empty()) {
      key.push_back("tar");
      group(real_paths);
      group(image_exts);
      group({label_ext});
      group(src->sidecar_exts_);
      group(options.allowed_roots);
      paths = std::move(real_paths);
    }
  }
  if (key.empty()) {
    SPDL_ASSIGN_OR_RETURN(src->index_,
                          Scan(paths, image_exts, label_ext, src->sidecar_exts_, src->description_, options));
  } else {
    SPDL_ASSIGN_OR_RETURN(src->index_,
                          options.index_cache->Get<Index>(IndexKey(key), "tar shards " + src->description_, [&] {
                            return Scan(paths, image_exts, label_ext, src->sidecar_exts_, src->description_, options);
                          }));
  }
  return src;
}

Result<std::shared_ptr<const TarShardSource::Index>> TarShardSource::Scan(
    const std::vector<std::string>& paths, const std::vector<std::string>& image_exts, const std::string& label_ext,
    const std::vector<std::string>& sidecar_exts, const std::string& description, const TarShardOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  auto index = std::make_shared<Index>();
  index->scan_start_ns = RealtimeNowNs();
  const size_t num_sidecars = sidecar_exts.size();
  const std::shared_ptr<const RootSet> allowed = RootSet::Open(options.allowed_roots);
  std::vector<Status> problems;
  std::vector<TarMember> members;
  std::vector<uint8_t> label_bytes;
  struct Pending {
    int image_rank = -1;  // index into image_exts of the chosen image member; -1 = none yet
    TarMember image;
    std::optional<TarMember> label;
    std::vector<Member> sidecars;  // per sidecar extension
  };
  for (const std::string& path : paths) {
    auto real = ResolveUnderRoots(path, options.allowed_roots);
    if (!real.ok()) {
      problems.push_back(real.status());
      continue;
    }
    auto opened = allowed->OpenBeneath(*real);
    if (!opened.ok()) {
      problems.push_back(opened.status().WithPrefix("tar shard " + *real));
      continue;
    }
    UniqueFd fd = std::move(opened).value();
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) {
      problems.push_back(ErrnoStatus("tar shard " + *real, errno));
      continue;
    }
    if (!S_ISREG(st.st_mode)) {
      problems.push_back(InvalidArgument("tar shard " + *real + ": not a regular file"));
      continue;
    }
    members.clear();
    Status s = ListTarMembers(fd.get(), static_cast<uint64_t>(st.st_size), *real, &members);
    if (!s.ok()) {
      problems.push_back(std::move(s));
      continue;
    }

    // Group by key, in order of first appearance.
    std::vector<std::string> keys;
    std::unordered_map<std::string, Pending> groups;
    for (TarMember& m : members) {
      std::optional<MemberKey> split = SplitMemberKey(m.name);
      if (!split) continue;
      const std::string& ext = split->ext;
      std::string key = std::move(split->key);
      int rank = -1;
      for (size_t i = 0; i < image_exts.size(); ++i) {
        if (ext == image_exts[i]) {
          rank = static_cast<int>(i);
          break;
        }
      }
      const bool is_label = !label_ext.empty() && ext == label_ext;
      for (size_t j = 0; j < num_sidecars; ++j) {
        if (ext != sidecar_exts[j]) continue;
        auto [it, inserted] = groups.try_emplace(key);
        if (inserted) keys.push_back(key);
        it->second.sidecars.resize(num_sidecars);
        it->second.sidecars[j] = Member{m.data_offset, m.size};
      }
      if (rank < 0 && !is_label) {
        if (!groups.count(key)) {
          keys.push_back(key);
          groups.emplace(std::move(key), Pending{});
        }
        continue;
      }
      auto [it, inserted] = groups.try_emplace(key);
      if (inserted) keys.push_back(std::move(key));
      Pending& g = it->second;
      if (is_label) {
        g.label = std::move(m);
      } else if (g.image_rank < 0 || rank <= g.image_rank) {
        g.image_rank = rank;
        g.image = std::move(m);
      }
    }

    const auto shard_index = static_cast<uint32_t>(index->shards.size());
    for (std::string& key : keys) {
      Pending& g = groups[key];
      if (g.image_rank < 0) {
        ++index->skipped_keys;
        continue;
      }
      int64_t label = kNoLabel;
      if (g.label) {
        const TarMember& l = *g.label;
        const std::string where =
            "tar shard " + *real + ": label member " + l.name + " at offset " + std::to_string(l.data_offset);
        if (l.size > kMaxLabelBytes) {
          index->bad_labels[index->samples.size()] = where + ": " + std::to_string(l.size) + " bytes, not a label";
        } else {
          Status ls = PreadAll(fd.get(), l.data_offset, l.size, &label_bytes);
          if (!ls.ok()) {
            problems.push_back(ls.WithPrefix(where));
            continue;
          }
          if (!ParseLabel(label_bytes, &label)) {
            index->bad_labels[index->samples.size()] = where + ": " + Shown(label_bytes) + " is not an integer >= 0";
            label = kNoLabel;
          }
        }
      } else {
        ++index->unlabelled;
      }
      index->samples.push_back(SampleRef{std::move(key), label});
      index->locations.push_back(Location{shard_index, g.image.data_offset, g.image.size});
      g.sidecars.resize(num_sidecars);
      index->sidecars.insert(index->sidecars.end(), g.sidecars.begin(), g.sidecars.end());
    }
    index->shards.push_back(Shard{*real, st.st_dev, st.st_ino, static_cast<uint64_t>(st.st_size), MtimeNs(st)});
    index->inputs.push_back(MakeStamp(*real, st));
  }

  if (!problems.empty()) {
    std::string m = "tar shards " + description + ": " + std::to_string(problems.size()) +
                    (problems.size() == 1 ? " problem:" : " problems:");
    const size_t shown = std::min(problems.size(), options.max_reported_errors);
    for (size_t i = 0; i < shown; ++i) m += "\n  " + problems[i].message();
    if (shown < problems.size()) m += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
    return Status(problems.front().code(), std::move(m));
  }
  if (index->samples.empty()) {
    std::string exts;
    for (const std::string& e : image_exts) exts += (exts.empty() ? "" : ", ") + e;
    return NotFound("tar shards " + description + ": no sample with an image member (" + exts + ") in " +
                    std::to_string(index->shards.size()) + " shards");
  }
  index->scan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::shared_ptr<const Index>(std::move(index));
}

uint64_t TarShardSource::size() const { return index_->samples.size(); }
const SampleRef& TarShardSource::sample(uint64_t index) const { return index_->samples[index]; }
size_t TarShardSource::num_shards() const { return index_->shards.size(); }
uint64_t TarShardSource::skipped_keys() const { return index_->skipped_keys; }
uint64_t TarShardSource::unlabelled() const { return index_->unlabelled; }
double TarShardSource::scan_seconds() const { return index_->scan_seconds; }

Status TarShardSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) {
    return InvalidArgument("tar shards " + description_ + ": sample " + std::to_string(index) + " is out of range (" +
                           std::to_string(size()) + " samples)");
  }
  if (auto bad = index_->bad_labels.find(index); bad != index_->bad_labels.end()) {
    out->clear();  // as every failed Read: nothing of the sample
    return DataLoss("sample " + index_->samples[index].path + ": " + bad->second);
  }
  return ReadMember(index, index_->locations[index].offset, index_->locations[index].size, "", out);
}

Status TarShardSource::ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return Read(index, out);  // its out-of-range error
  const std::string ext = NormalizeExtension(extension);
  const auto it = std::find(sidecar_exts_.begin(), sidecar_exts_.end(), ext);
  const Member* m =
      it == sidecar_exts_.end()
          ? nullptr
          : &index_->sidecars[index * sidecar_exts_.size() + static_cast<size_t>(it - sidecar_exts_.begin())];
  if (m == nullptr || m->size == kNoMember) {
    return NotFound("sample " + index_->samples[index].path + " (tar shard " +
                    index_->shards[index_->locations[index].shard].path + "): no ." + ext + " member");
  }
  return ReadMember(index, m->offset, m->size, "." + ext + " member", out);
}

Status TarShardSource::ReadMember(uint64_t index, uint64_t offset, uint64_t size, const std::string& what,
                                  std::vector<uint8_t>* out) const {
  const Shard& shard = index_->shards[index_->locations[index].shard];
  auto where = [&] {
    return "sample " + index_->samples[index].path + (what.empty() ? "" : " " + what) + " (tar shard " + shard.path +
           ", offset " + std::to_string(offset) + ", " + std::to_string(size) + " bytes)";
  };
  if (size > max_sample_bytes_) {
    return ResourceExhausted(where() + ": more than the limit of " + std::to_string(max_sample_bytes_) + " bytes");
  }
  return RetryOnResourceError([&]() -> Status {
    auto opened = allowed_->OpenBeneath(shard.path);
    if (!opened.ok()) return opened.status().WithPrefix(where());
    const UniqueFd fd = std::move(opened).value();
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return IoErrnoStatus(where(), errno);
    if (st.st_dev != shard.dev || st.st_ino != shard.ino || static_cast<uint64_t>(st.st_size) != shard.size ||
        MtimeNs(st) != shard.mtime_ns) {
      return FailedPrecondition(where() + ": the shard changed since it was indexed");
    }
    Status s = PreadAll(fd.get(), offset, size, out);
    if (!s.ok()) {
      out->clear();
      return s.WithPrefix(where());
    }
    return Status::Ok();
  });
}

std::string TarShardSource::Identity() const {
  std::string id = "tar";
  for (const Shard& s : index_->shards) id += " " + s.path;
  return id;
}

std::vector<uint64_t> TarShardSource::ShardSizes() const {
  std::vector<uint64_t> sizes(index_->shards.size(), 0);
  for (const Location& l : index_->locations) ++sizes[l.shard];
  return sizes;
}

std::string TarShardSource::Describe() const {
  std::string d = "tar shards " + description_ + " (" + std::to_string(index_->shards.size()) + " shards, " +
                  std::to_string(size()) + " samples, " + std::to_string(index_->unlabelled) + " without a label";
  if (index_->skipped_keys > 0) d += ", " + std::to_string(index_->skipped_keys) + " keys without an image skipped";
  return d + ")";
}

}  // namespace spdl::io
