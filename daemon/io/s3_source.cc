#include "io/s3_source.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
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

// The object-storage figures every S3 source reports.
SourceCounters S3Counters(const S3Stats& st) {
  SourceCounters c;
  c.fetched_bytes = st.bytes;
  c.requests = st.requests;
  c.retries = st.retries;
  c.errors_4xx = st.errors_4xx;
  c.errors_5xx = st.errors_5xx;
  c.errors_network = st.errors_network;
  return c;
}

bool EndsWithAny(const std::string& name, const std::vector<std::string>& exts) {
  const std::string lower = AsciiLower(name);
  for (const std::string& e : exts) {
    const std::string dotted = "." + NormalizeExtension(e);
    if (lower.size() >= dotted.size() && lower.compare(lower.size() - dotted.size(), dotted.size(), dotted) == 0) {
      return true;
    }
  }
  return false;
}

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

SourceCounters S3ObjectSource::Counters() const { return S3Counters(client_->stats()); }

// ---- S3TarShardSource ----

namespace {

constexpr uint64_t kAll = ~uint64_t{0};
constexpr uint64_t kUnknown = ~uint64_t{0};
constexpr size_t kOpenShards = 8;                   // shards a source keeps pinned between reads
constexpr uint64_t kParseStep = uint64_t{1} << 20;  // parse again after this many new bytes (or a quarter more)
constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;

uint64_t Fnv(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

std::string BaseName(const std::string& key) {
  const size_t slash = key.rfind('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

// "dir/NAME-000012.tar" -> "dir/NAME.manifest.json" (spdl-shard's names); "" when not of that form.
std::string ManifestKeyFor(const std::string& shard_key) {
  if (shard_key.size() < 5 || shard_key.compare(shard_key.size() - 4, 4, ".tar") != 0) return "";
  size_t i = shard_key.size() - 4;
  size_t digits = 0;
  while (i > 0 && shard_key[i - 1] >= '0' && shard_key[i - 1] <= '9') {
    --i;
    ++digits;
  }
  if (digits == 0 || i == 0 || shard_key[i - 1] != '-') return "";
  return shard_key.substr(0, i - 1) + ".manifest.json";
}

}  // namespace

struct S3TarShardSource::Shard {
  S3Location loc;
  std::string name;  // loc.ToString()
  uint64_t manifest_samples = kUnknown;
  uint64_t manifest_bytes = kUnknown;
  SampleRef unavailable;  // sample() of a sample whose shard cannot be read
  std::mutex mu;
  std::condition_variable cv;
  // Guarded by mu. Elements once appended never change (references to them stay valid).
  std::string etag;   // "" until probed
  bool busy = false;  // a thread is advancing the parse
  bool complete = false;
  Status broken;  // a fault of the data itself (corrupt tar, counts that differ): sticky
  uint64_t parsed_bytes = 0;
  size_t keys_done = 0;  // keys processed (published, or skipped without an image)
  uint64_t skipped_keys = 0;
  std::deque<SampleRef> samples;
  std::deque<Location> images;
  std::deque<Location> sidecars;  // sample i's sidecar j at [i * sidecar_exts_.size() + j]
  std::deque<std::string> bad_labels;
};

S3TarShardSource::~S3TarShardSource() {
  std::lock_guard lock(open_mu_);
  open_.clear();
}

Result<std::unique_ptr<S3TarShardSource>> S3TarShardSource::Open(const S3TarShardOptions& o,
                                                                 const std::shared_ptr<const S3Client>& client) {
  if (o.shards.empty()) return InvalidArgument("s3 tar shards: no shard given");
  std::unique_ptr<S3TarShardSource> src(new S3TarShardSource());
  src->client_ = client;
  for (const std::string& p : o.shards) {
    src->description_ += (src->description_.empty() ? "" : " ") + p;
    SPDL_ASSIGN_OR_RETURN(std::vector<std::string> expanded, ExpandBraces(p));
    for (const std::string& e : expanded) {
      SPDL_ASSIGN_OR_RETURN(S3Location loc, ParseS3Url(e));
      SPDL_RETURN_IF_ERROR(client->ObjectUrl(loc).status());
      auto shard = std::make_unique<Shard>();
      shard->name = loc.ToString();
      shard->loc = std::move(loc);
      shard->unavailable = SampleRef{shard->name + " (not readable)", kNoLabel};
      src->shards_.push_back(std::move(shard));
    }
  }
  if (src->shards_.size() > std::numeric_limits<uint32_t>::max()) return InvalidArgument("s3 tar: too many shards");
  for (const std::string& e : o.image_extensions) src->image_exts_.push_back(NormalizeExtension(e));
  src->label_ext_ = NormalizeExtension(o.label_extension);
  for (const std::string& e : o.sidecar_extensions) src->sidecar_exts_.push_back(NormalizeExtension(e));
  src->max_sample_bytes_ = o.max_sample_bytes;
  src->node_cache_ = o.node_cache;
  src->stream_ = ShardCache::InMemory(o.stream_buffer_bytes);

  // The manifest: per shard file name, its sample count and bytes.
  std::string manifest_url;
  bool explicit_manifest = false;
  if (o.manifest == "auto") {
    const std::string key = ManifestKeyFor(src->shards_[0]->loc.key);
    if (!key.empty()) manifest_url = S3Location{src->shards_[0]->loc.bucket, key}.ToString();
  } else if (o.manifest != "none" && !o.manifest.empty()) {
    manifest_url = o.manifest;
    explicit_manifest = true;
  }
  if (!manifest_url.empty()) {
    SPDL_ASSIGN_OR_RETURN(S3Location mloc, ParseS3Url(manifest_url));
    std::vector<uint8_t> bytes;
    Status got = client->GetBytes(mloc, 0, S3Client::kToEnd, &bytes);
    if (got.ok() && bytes.size() > kMaxManifestBytes) {
      got = ResourceExhausted("manifest " + manifest_url + ": too large");
    }
    std::string why_not;  // set: no usable manifest (auto: scan instead)
    if (!got.ok()) {
      // Missing (a store answers 403 for a missing object to whom may not list the bucket): scan.
      const bool missing = got.code() == StatusCode::kNotFound || got.code() == StatusCode::kPermissionDenied;
      if (!missing || explicit_manifest) return got.WithPrefix("tar shards " + src->description_ + ": the manifest");
      why_not = "no manifest " + manifest_url + " (" + (got.code() == StatusCode::kNotFound ? "404" : "403") + ")";
    } else {
      const std::string text(bytes.begin(), bytes.end());
      std::unordered_map<std::string, std::pair<uint64_t, uint64_t>> counts;  // file -> (samples, bytes)
      try {
        const nlohmann::json j = nlohmann::json::parse(text);
        for (const nlohmann::json& sh : j.at("shards")) {
          counts[sh.at("file").get<std::string>()] = {sh.at("samples").get<uint64_t>(), sh.at("bytes").get<uint64_t>()};
        }
      } catch (const std::exception& e) {
        return InvalidArgument("manifest " + manifest_url + ": not a spdl-shard manifest (" + e.what() + ")");
      }
      const std::string dir = mloc.key.substr(0, mloc.key.size() - BaseName(mloc.key).size());
      for (auto& shard : src->shards_) {
        const std::string base = BaseName(shard->loc.key);
        auto it = counts.find(base);
        if (it == counts.end() || shard->loc.bucket != mloc.bucket || shard->loc.key != dir + base) {
          why_not = "manifest " + manifest_url + " does not list " + shard->name;
          break;
        }
        shard->manifest_samples = it->second.first;
        shard->manifest_bytes = it->second.second;
      }
      if (why_not.empty()) {
        src->manifest_digest_ = "manifest " + manifest_url + " " + std::to_string(Fnv(text));
      } else if (explicit_manifest) {
        return InvalidArgument(why_not);
      } else {
        for (auto& shard : src->shards_) shard->manifest_samples = shard->manifest_bytes = kUnknown;
      }
    }
    if (!why_not.empty()) {
      spdlog::info("s3 tar {}: {}: every shard is streamed once at start to count its samples", src->description_,
                   why_not);
    }
  }

  src->starts_.reserve(src->shards_.size() + 1);
  if (src->has_manifest()) {
    for (const auto& shard : src->shards_) {
      src->starts_.push_back(src->total_);
      src->total_ += shard->manifest_samples;
    }
  } else {
    // No manifest: every shard through the header parse now, a few at once.
    constexpr size_t kScanThreads = 4;
    std::vector<Status> results(src->shards_.size());
    std::atomic<size_t> next{0};
    const S3TarShardSource* self = src.get();
    auto worker = [&] {
      for (size_t s = next.fetch_add(1); s < results.size(); s = next.fetch_add(1)) results[s] = self->Ensure(s, kAll);
    };
    std::vector<std::thread> threads;
    for (size_t t = 1; t < std::min(kScanThreads, results.size()); ++t) threads.emplace_back(worker);
    worker();
    for (std::thread& t : threads) t.join();
    std::vector<Status> problems;
    for (Status& r : results) {
      if (!r.ok()) problems.push_back(std::move(r));
    }
    if (!problems.empty()) {
      std::string m = std::to_string(problems.size()) + " of " + std::to_string(src->shards_.size()) +
                      " s3 tar shards cannot be read:";
      for (size_t i = 0; i < problems.size() && i < 20; ++i) m += "\n  " + problems[i].message();
      return Status(problems[0].code(), m);
    }
    for (const auto& shard : src->shards_) {
      std::lock_guard lock(shard->mu);
      src->starts_.push_back(src->total_);
      src->total_ += shard->samples.size();
    }
  }
  src->starts_.push_back(src->total_);
  if (src->total_ == 0) return NotFound("s3 tar shards " + src->description_ + ": no sample in any shard");
  return src;
}

std::pair<size_t, uint64_t> S3TarShardSource::Locate(uint64_t index) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), index);
  const auto s = static_cast<size_t>(it - starts_.begin()) - 1;
  return {s, index - starts_[s]};
}

Result<std::shared_ptr<const ShardCache::Handle>> S3TarShardSource::OpenShard(size_t s) const {
  {
    std::lock_guard lock(open_mu_);
    for (size_t i = 0; i < open_.size(); ++i) {
      if (open_[i].first != s) continue;
      auto entry = std::move(open_[i]);
      open_.erase(open_.begin() + static_cast<ptrdiff_t>(i));
      open_.push_back(entry);
      return entry.second;
    }
  }
  Shard& shard = *shards_[s];
  std::string etag;
  {
    std::lock_guard lock(shard.mu);
    etag = shard.etag;
  }
  if (etag.empty()) {
    // The probe: this job's credentials may read the object (and its ETag names the version the
    // cache may serve). A 1-byte range: cheap whatever the shard's size.
    Status probe = client_->Get(
        shard.loc, 0, 1, [](const uint8_t*, size_t) { return true; }, "", &etag);
    if (!probe.ok()) return probe.WithPrefix("tar shard " + shard.name);
    if (etag.empty()) etag = "-";  // a store without ETags: the cache key still names the object
    std::lock_guard lock(shard.mu);
    if (shard.etag.empty()) shard.etag = etag;
    etag = shard.etag;
  }
  const std::string key = client_->endpoint() + "\n" + shard.loc.bucket + "\n" + shard.loc.key + "\n" + etag;
  ShardCache::Fetch fetch = [client = client_, loc = shard.loc, etag](const ShardCache::Sink& sink) {
    return client->Get(loc, 0, S3Client::kToEnd, sink, etag == "-" ? "" : etag);
  };
  Result<std::shared_ptr<const ShardCache::Handle>> h = FailedPrecondition("no node cache");
  if (node_cache_ && node_cache_->enabled()) h = node_cache_->Acquire(key, fetch);
  if (!h.ok() && h.status().code() == StatusCode::kFailedPrecondition) h = stream_->Acquire(key, std::move(fetch));
  if (!h.ok()) return h.status().WithPrefix("tar shard " + shard.name);
  std::lock_guard lock(open_mu_);
  ++((*h)->hit() ? hits_ : misses_);
  open_.emplace_back(s, *h);
  if (open_.size() > kOpenShards) open_.erase(open_.begin());
  return h;
}

void S3TarShardSource::ForgetShard(size_t s) const {
  std::lock_guard lock(open_mu_);
  for (size_t i = 0; i < open_.size(); ++i) {
    if (open_[i].first == s) {
      open_.erase(open_.begin() + static_cast<ptrdiff_t>(i));
      return;
    }
  }
}

Status S3TarShardSource::Ensure(size_t s, uint64_t pos) const {
  Shard& shard = *shards_[s];
  {
    std::unique_lock lock(shard.mu);
    for (;;) {
      if (!shard.broken.ok()) return shard.broken;
      if (pos != kAll && shard.samples.size() > pos) return Status::Ok();
      if (shard.complete) {
        if (pos == kAll) return Status::Ok();
        return DataLoss("tar shard " + shard.name + ": " + std::to_string(shard.samples.size()) +
                        " samples, no sample " + std::to_string(pos));
      }
      if (!shard.busy) break;
      shard.cv.wait(lock);
    }
    shard.busy = true;
  }
  // This thread advances the parse; the others wait for it.
  auto done = [&](Status st, bool data_fault) {
    std::lock_guard lock(shard.mu);
    shard.busy = false;
    if (!st.ok() && data_fault) shard.broken = st;
    shard.cv.notify_all();
    return st;
  };
  const size_t num_sidecars = sidecar_exts_.size();
  std::vector<TarMember> members;
  std::string label_bytes;
  for (int attempt = 0;; ++attempt) {
    auto opened = OpenShard(s);
    if (!opened.ok()) return done(opened.status(), false);
    const std::shared_ptr<const ShardCache::Handle> h = std::move(opened).value();
    uint64_t target;
    {
      std::lock_guard lock(shard.mu);
      target = shard.parsed_bytes + std::max(kParseStep, shard.parsed_bytes / 4);
    }
    for (;;) {
      auto waited = h->WaitFor(target);
      if (!waited.ok()) {
        ForgetShard(s);
        // The node cache gave up (a full disk): once more through the private stream.
        if (attempt == 0 && node_cache_ && !node_cache_->enabled()) break;
        return done(waited.status().WithPrefix("tar shard " + shard.name), false);
      }
      const uint64_t have = *waited;
      const bool complete = have < target;
      members.clear();
      Status listed = ListTarMembers(h->fd(), have, shard.name, &members);
      if (complete && !listed.ok()) return done(listed, true);
      // Keys in order of first appearance; a key's members must be adjacent (WebDataset order).
      struct Group {
        std::string key;
        int image_rank = -1;
        TarMember image;
        std::optional<TarMember> label;
        std::vector<Location> sidecars;
      };
      std::vector<Group> groups;
      std::unordered_map<std::string, size_t> where;
      for (TarMember& m : members) {
        std::optional<MemberKey> split = SplitMemberKey(m.name);
        if (!split) continue;
        const std::string& ext = split->ext;
        std::string key = std::move(split->key);
        auto [it, inserted] = where.try_emplace(key, groups.size());
        if (inserted) {
          // Filled in place: a Group{...} temporary moved in made gcc 12 at -O3 see its image's
          // name as maybe uninitialized.
          Group& added = groups.emplace_back();
          added.key = key;
          added.sidecars.assign(num_sidecars, Location{0, kNoMember});
        } else if (it->second + 1 != groups.size()) {
          return done(DataLoss("tar shard " + shard.name + ": the members of key " + key +
                               " are not adjacent (member " + m.name + " at offset " + std::to_string(m.header_offset) +
                               "); a streamed shard needs each key's members "
                               "together, as WebDataset writers and spdl-shard write them"),
                      true);
        }
        Group& g = groups[it->second];
        for (size_t j = 0; j < num_sidecars; ++j) {
          if (ext == sidecar_exts_[j]) g.sidecars[j] = Location{m.data_offset, m.size};
        }
        if (!label_ext_.empty() && ext == label_ext_) {
          g.label = m;
          continue;
        }
        for (size_t i = 0; i < image_exts_.size(); ++i) {
          if (ext != image_exts_[i]) continue;
          if (g.image_rank < 0 || static_cast<int>(i) <= g.image_rank) {
            g.image_rank = static_cast<int>(i);
            g.image = m;
          }
          break;
        }
      }
      // Complete keys: all when the shard is complete, else all but the last (it may go on).
      const size_t ready_keys = complete ? groups.size() : (groups.empty() ? 0 : groups.size() - 1);
      size_t first;
      {
        std::lock_guard lock(shard.mu);
        first = shard.keys_done;
      }
      std::vector<SampleRef> new_samples;
      std::vector<Location> new_images, new_sidecars;
      std::vector<std::string> new_bad;
      uint64_t skipped = 0;
      for (size_t k = first; k < ready_keys; ++k) {
        Group& g = groups[k];
        if (g.image_rank < 0) {
          ++skipped;
          continue;
        }
        int64_t label = kNoLabel;
        std::string bad;
        if (g.label) {
          const std::string at = "tar shard " + shard.name + ": label member " + g.label->name;
          if (g.label->size > 64) {
            bad = at + ": " + std::to_string(g.label->size) + " bytes, not a label";
          } else if (Status ls = PreadAll(h->fd(), g.label->data_offset, g.label->size, &label_bytes); !ls.ok()) {
            return done(ls.WithPrefix(at), false);
          } else {
            const size_t a = label_bytes.find_first_not_of(" \t\r\n");
            const size_t b = label_bytes.find_last_not_of(" \t\r\n");
            const std::string digits = a == std::string::npos ? "" : label_bytes.substr(a, b - a + 1);
            if (digits.empty() || digits.size() > 18 || digits.find_first_not_of("0123456789") != std::string::npos) {
              bad = at + ": '" + digits.substr(0, 32) + "' is not an integer >= 0";
            } else {
              label = std::stoll(digits);
            }
          }
        }
        new_samples.push_back(SampleRef{g.key, label});
        new_images.push_back(Location{g.image.data_offset, g.image.size});
        new_sidecars.insert(new_sidecars.end(), g.sidecars.begin(), g.sidecars.end());
        new_bad.push_back(std::move(bad));
      }
      bool enough;
      {
        std::lock_guard lock(shard.mu);
        std::move(new_samples.begin(), new_samples.end(), std::back_inserter(shard.samples));
        shard.images.insert(shard.images.end(), new_images.begin(), new_images.end());
        shard.sidecars.insert(shard.sidecars.end(), new_sidecars.begin(), new_sidecars.end());
        std::move(new_bad.begin(), new_bad.end(), std::back_inserter(shard.bad_labels));
        shard.keys_done = std::max(shard.keys_done, ready_keys);
        shard.skipped_keys += skipped;
        shard.parsed_bytes = have;
        shard.complete = complete;
        enough = pos != kAll && shard.samples.size() > pos;
      }
      if (complete) {
        std::string mismatch;
        if (shard.manifest_bytes != kUnknown && have != shard.manifest_bytes) {
          mismatch = std::to_string(have) + " bytes, the manifest says " + std::to_string(shard.manifest_bytes);
        } else if (shard.manifest_samples != kUnknown) {
          std::lock_guard lock(shard.mu);
          if (shard.samples.size() != shard.manifest_samples) {
            mismatch = std::to_string(shard.samples.size()) + " samples, the manifest says " +
                       std::to_string(shard.manifest_samples);
          }
        }
        if (!mismatch.empty()) {
          return done(DataLoss("tar shard " + shard.name + ": " + mismatch + " (written again since?)"), true);
        }
        return done(Status::Ok(), false);
      }
      if (enough) return done(Status::Ok(), false);
      target = have + std::max(kParseStep, have / 4);
    }
  }
}

uint64_t S3TarShardSource::size() const { return total_; }

const SampleRef& S3TarShardSource::sample(uint64_t index) const {
  const auto [s, pos] = Locate(index);
  Shard& shard = *shards_[s];
  if (!Ensure(s, pos).ok()) return shard.unavailable;
  std::lock_guard lock(shard.mu);
  return shard.samples[pos];
}

std::vector<uint64_t> S3TarShardSource::ShardSizes() const {
  std::vector<uint64_t> sizes;
  for (size_t s = 0; s + 1 < starts_.size(); ++s) sizes.push_back(starts_[s + 1] - starts_[s]);
  return sizes;
}

std::optional<std::string> S3TarShardSource::DatasetDigest() const {
  if (manifest_digest_.empty()) return std::nullopt;
  return manifest_digest_;
}

SourceCounters S3TarShardSource::Counters() const {
  SourceCounters c = S3Counters(client_->stats());
  std::lock_guard lock(open_mu_);
  c.shard_cache_hits = hits_;
  c.shard_cache_misses = misses_;
  return c;
}

Status S3TarShardSource::ReadMember(uint64_t index, size_t s, uint64_t pos, int sidecar,
                                    std::vector<uint8_t>* out) const {
  out->clear();
  Shard& shard = *shards_[s];
  if (Status e = Ensure(s, pos); !e.ok()) {
    return e.WithPrefix("sample " + std::to_string(pos) + " of tar shard " + shard.name);
  }
  Location at;
  std::string key;
  std::string bad;
  {
    std::lock_guard lock(shard.mu);
    key = shard.samples[pos].path;
    at = sidecar < 0 ? shard.images[pos] : shard.sidecars[pos * sidecar_exts_.size() + static_cast<size_t>(sidecar)];
    if (sidecar < 0) bad = shard.bad_labels[pos];
  }
  const std::string what = sidecar < 0 ? "" : "." + sidecar_exts_[static_cast<size_t>(sidecar)];
  if (!bad.empty()) return InvalidArgument(bad);
  if (at.size == kNoMember) return NotFound(key + ": no " + what + " member in tar shard " + shard.name);
  const std::string where = key + what + " (tar shard " + shard.name + " at offset " + std::to_string(at.offset) + ")";
  if (at.size > max_sample_bytes_) {
    return ResourceExhausted(where + ": " + std::to_string(at.size) + " bytes, more than the limit");
  }
  (void)index;
  for (int attempt = 0;; ++attempt) {
    auto h = OpenShard(s);
    if (!h.ok()) return h.status().WithPrefix(where);
    Status r = (*h)->Read(at.offset, at.size, out);
    if (r.ok()) return r;
    ForgetShard(s);
    if (attempt == 0 && node_cache_ && !node_cache_->enabled()) continue;  // a full disk: stream instead
    return r.WithPrefix(where);
  }
}

Status S3TarShardSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return InvalidArgument("s3 tar: sample " + std::to_string(index) + " is out of range");
  const auto [s, pos] = Locate(index);
  return ReadMember(index, s, pos, -1, out);
}

Status S3TarShardSource::ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return InvalidArgument("s3 tar: sample " + std::to_string(index) + " is out of range");
  const std::string ext = NormalizeExtension(extension);
  const auto [s, pos] = Locate(index);
  for (size_t j = 0; j < sidecar_exts_.size(); ++j) {
    if (sidecar_exts_[j] == ext) return ReadMember(index, s, pos, static_cast<int>(j), out);
  }
  return NotFound(sample(index).path + ": the ." + ext + " members were not indexed");
}

std::string S3TarShardSource::Describe() const {
  return "s3 tar " + std::to_string(size()) + " samples in " + std::to_string(shards_.size()) + " shards " +
         description_ + " via " + client_->endpoint() +
         (has_manifest() ? " (streamed, with a manifest)" : " (streamed)") +
         (node_cache_ && node_cache_->enabled() ? ", node shard cache " + node_cache_->dir() : "");
}

std::string S3TarShardSource::Identity() const { return "s3 tar " + description_ + " endpoint " + client_->endpoint(); }

}  // namespace spdl::io
