#include "jobs/job_registry.h"

#include <spdlog/spdlog.h>

#include <cstring>
#include <optional>

#include "cuda/device_slot_pool.h"
#include "io/allowed_roots.h"
#include "io/coco_source.h"
#include "io/file_list_source.h"
#include "io/fs_identity.h"
#include "io/http_source.h"
#include "io/mixed_source.h"
#include "io/s3_source.h"
#include "io/sample_list.h"
#include "io/sample_source.h"
#include "io/sampler.h"
#include "io/shard_cache.h"
#include "io/source_index_cache.h"
#include "io/tar_shard_source.h"
#include "io/user_source.h"
#include "jobs/gpu_delivery.h"
#include "jobs/media_job.h"
#include "jobs/resume_token.h"
#include "jobs/sample_decoder.h"
#include "jobs/shared_job.h"
#include "jobs/stream_job.h"

namespace spdl::jobs {
namespace {

// Streams' retained bytes as part of the daemon's memory budget.
class BudgetStreamAccount final : public streams::MemoryAccount {
 public:
  explicit BudgetStreamAccount(std::shared_ptr<MemoryBudget> budget) : budget_(std::move(budget)) {}
  bool TryCharge(uint64_t bytes) override { return budget_->TryChargeStreams(bytes); }
  void Release(uint64_t bytes) override { budget_->ReleaseStreams(bytes); }

 private:
  const std::shared_ptr<MemoryBudget> budget_;
};

// The job's S3 transport: the config's `s3:` settings, the endpoint and region from the config or
// else the client's, the job's credentials (from its client; never logged).
Result<std::shared_ptr<const io::S3Client>> MakeS3Client(const config::S3SourceConfig& c, const proto::S3Access& access,
                                                         const config::DaemonConfig& daemon) {
  io::S3Options o;
  o.endpoint_url = !c.endpoint_url.empty() ? c.endpoint_url : access.endpoint_url();
  o.region = !c.region.empty() ? c.region : access.region();
  o.addressing = c.addressing == "path"      ? io::S3Addressing::kPath
                 : c.addressing == "virtual" ? io::S3Addressing::kVirtual
                                             : io::S3Addressing::kAuto;
  o.credentials = io::S3Credentials{access.access_key_id(), access.secret_access_key(), access.session_token()};
  o.allowed_url_prefixes = daemon.allowed_url_prefixes;
  o.timeout_ms = c.timeout_ms;
  o.connect_timeout_ms = c.connect_timeout_ms;
  o.stall_timeout_ms = c.stall_timeout_ms;
  o.max_attempts = c.max_attempts;
  o.initial_backoff_ms = c.initial_backoff_ms;
  o.max_backoff_ms = c.max_backoff_ms;
  o.max_in_flight = c.max_in_flight;
  SPDL_ASSIGN_OR_RETURN(std::unique_ptr<io::S3Client> client, io::S3Client::Create(std::move(o)));
  return std::shared_ptr<const io::S3Client>(std::move(client));
}

// True when the list file holds s3:// lines (read as the job's user, like the list itself).
bool ListHoldsS3(const std::string& list, const config::DaemonConfig& daemon) {
  std::string real;
  auto text = io::ReadListFile(list, daemon.allowed_roots, &real);
  if (!text.ok()) return false;                                // the file list source reports it
  if (text->find("s3://") == std::string::npos) return false;  // the common case, without a parse
  const io::ParsedList parsed = io::ParseSampleList(*text, "path");
  return std::any_of(parsed.entries.begin(), parsed.entries.end(),
                     [](const io::ListEntry& e) { return io::IsS3Url(e.item); });
}

// Opens the job's sample source: scans the folder, reads the list, or indexes the tar shards, with
// every local path checked against the daemon's allowed roots and every URL against its allowed
// URL prefixes. Errors say which source key is at fault.
// Tar shards also index the members the job's extra_outputs read.
// `index_cache` (may be null: every open scans) shares the scan with other opens of the same data.
Result<std::shared_ptr<const io::SampleSource>> OpenSource(
    const config::SourceConfig& c, const std::vector<config::ExtraOutputConfig>& extras, const std::string& mask_from,
    const config::DaemonConfig& daemon, io::SourceIndexCache* index_cache, const proto::S3Access& s3_access,
    const std::shared_ptr<io::ShardCache>& shard_cache) {
  // Object storage. A source holds its job's credentials and is never shared.
  // A file_list or http list of s3:// lines reads object storage too.
  const bool s3_list =
      (c.type == config::SourceType::kFileList || c.type == config::SourceType::kHttp) && ListHoldsS3(c.list, daemon);
  if (c.UsesS3() || s3_list) {
    auto client = MakeS3Client(c.s3, s3_access, daemon);
    if (!client.ok()) return client.status().WithPrefix("source.s3");
    Result<std::shared_ptr<const io::SampleSource>> src = InvalidArgument("source.type: unknown");
    if (c.type == config::SourceType::kS3Prefix) {
      auto s = io::S3ObjectSource::OpenPrefix(c.prefix, c.extensions, *client);
      if (!s.ok()) return s.status().WithPrefix("source.prefix");
      return std::shared_ptr<const io::SampleSource>(std::move(s).value());
    }
    if (s3_list) {
      auto s = io::S3ObjectSource::OpenList(c.list, daemon.allowed_roots, *client);
      if (!s.ok()) return s.status().WithPrefix("source.list");
      return std::shared_ptr<const io::SampleSource>(std::move(s).value());
    }
    for (const std::string& shard : c.shards) {
      if (!io::IsS3Url(shard)) {
        return InvalidArgument("source.shards: " + shard + " is not s3:// while others are (a job reads one store)");
      }
    }
    std::vector<std::string> sidecars;
    sidecars.reserve(extras.size());
    for (const config::ExtraOutputConfig& e : extras) sidecars.push_back(e.from);
    if (!mask_from.empty()) sidecars.push_back(mask_from);  // the mask's member, as for local shards
    // Streamed through the node's shard cache (each job probes every shard with its own credentials
    // before it is served from there).
    io::S3TarShardOptions o;
    o.shards = c.shards;
    o.image_extensions = c.extensions;
    o.label_extension = c.label_extension;
    o.sidecar_extensions = std::move(sidecars);
    o.node_cache = shard_cache;
    auto s = io::S3TarShardSource::Open(o, *client);
    if (!s.ok()) return s.status().WithPrefix("source.shards");
    return std::shared_ptr<const io::SampleSource>(std::move(s).value());
  }
  switch (c.type) {
    case config::SourceType::kImageFolder: {
      auto src = io::ImageFolderSource::Open(c.root, c.extensions, daemon.allowed_roots, io::kDefaultMaxSampleBytes,
                                             index_cache);
      if (!src.ok()) return src.status().WithPrefix("source.root");
      return std::shared_ptr<const io::SampleSource>(std::move(src).value());
    }
    case config::SourceType::kFileList: {
      io::FileListOptions o;
      o.list = c.list;
      o.root = c.root;
      o.allowed_roots = daemon.allowed_roots;
      o.index_cache = index_cache;
      auto src = io::FileListSource::Open(o);
      if (!src.ok()) return src.status().WithPrefix("source.list");
      return std::shared_ptr<const io::SampleSource>(std::move(src).value());
    }
    case config::SourceType::kTar: {
      io::TarShardOptions o;
      o.shards = c.shards;
      o.image_extensions = c.extensions;
      o.label_extension = c.label_extension;
      for (const config::ExtraOutputConfig& e : extras) o.sidecar_extensions.push_back(e.from);
      if (!mask_from.empty()) o.sidecar_extensions.push_back(mask_from);  // the mask's member
      o.allowed_roots = daemon.allowed_roots;
      o.index_cache = index_cache;
      auto src = io::TarShardSource::Open(o);
      if (!src.ok()) return src.status().WithPrefix("source.shards");
      return std::shared_ptr<const io::SampleSource>(std::move(src).value());
    }
    case config::SourceType::kHttp: {
      if (daemon.allowed_url_prefixes.empty()) {
        return PermissionDenied("source.type http: this spdld fetches no URL (its config has no allowed_url_prefixes)");
      }
      io::HttpSourceOptions o;
      o.list = c.list;
      o.base_url = c.base_url;
      o.allowed_roots = daemon.allowed_roots;
      o.allowed_url_prefixes = daemon.allowed_url_prefixes;
      o.timeout_ms = c.timeout_ms;
      o.connect_timeout_ms = c.connect_timeout_ms;
      o.max_attempts = c.max_attempts;
      o.max_in_flight = c.max_in_flight;
      o.index_cache = index_cache;
      auto src = io::HttpSource::Open(o);
      if (!src.ok()) return src.status().WithPrefix("source.list");
      return std::shared_ptr<const io::SampleSource>(std::move(src).value());
    }
    case config::SourceType::kCoco: {
      io::CocoOptions o;
      o.annotations = c.coco.annotations;
      o.root = c.root;
      o.allowed_roots = daemon.allowed_roots;
      o.include_crowd = c.coco.include_crowd;
      o.contiguous_ids = c.coco.contiguous_ids;
      o.masks = c.coco.masks;
      o.index_cache = index_cache;
      auto src = io::CocoSource::Open(o);
      if (!src.ok()) return src.status().WithPrefix("source.annotations");
      return std::shared_ptr<const io::SampleSource>(std::move(src).value());
    }
    case config::SourceType::kS3Prefix:
      break;  // opened above
    case config::SourceType::kWatch:
      return InvalidArgument("source.type: watch is a stream of files, not a dataset");  // a stream job
    case config::SourceType::kStream:
      return InvalidArgument("source.type: stream is no dataset to open (PrepareStreamJob)");
  }
  return InvalidArgument("source.type: unknown");
}

// Opens every source of a mix (config `sources:`) as OpenSource does, and the mix over them;
// *plan gets the mix's plan (the order's input). Errors name the entry: "sources.1: source.root: ...".
Result<std::shared_ptr<const io::SampleSource>> OpenMix(const config::JobConfig& config,
                                                        const config::DaemonConfig& daemon,
                                                        io::SourceIndexCache* index_cache,
                                                        const proto::S3Access& s3_access,
                                                        const std::shared_ptr<io::ShardCache>& shard_cache,
                                                        std::shared_ptr<const io::MixPlan>* plan) {
  std::vector<std::shared_ptr<const io::SampleSource>> sources;
  io::MixPlan p;
  p.epoch_samples = config.sampler.epoch_samples;
  for (size_t i = 0; i < config.sources.size(); ++i) {
    const config::WeightedSource& w = config.sources[i];
    auto src =
        OpenSource(w.source, config.extra_outputs, config.mask.from, daemon, index_cache, s3_access, shard_cache);
    const std::string where =
        "sources." + std::to_string(i) + (w.line > 0 ? " (line " + std::to_string(w.line) + ")" : "");
    if (!src.ok()) return src.status().WithPrefix(where);
    if ((*src)->size() == 0) return InvalidArgument(where + ": " + (*src)->Describe() + " has no samples");
    io::MixComponent c;
    c.size = (*src)->size();
    c.shard_sizes = (*src)->ShardSizes();
    c.shuffle_buffer = static_cast<uint64_t>(w.source.shuffle_buffer);
    c.weight = w.weight;
    p.components.push_back(std::move(c));
    sources.push_back(std::move(src).value());
  }
  // The order of an epoch is held in memory: a mix may up-sample, not outgrow its data without bound.
  uint64_t total = 0;
  for (const io::MixComponent& c : p.components) total += c.size;
  if (p.epoch_samples > 16 * total) {
    return InvalidArgument("sampler.epoch_samples " + std::to_string(p.epoch_samples) + " is more than 16 times the " +
                           std::to_string(total) + " samples of the mix's sources (at most " +
                           std::to_string(16 * total) + ")");
  }
  *plan = std::make_shared<const io::MixPlan>(p);
  return std::shared_ptr<const io::SampleSource>(
      std::make_shared<const io::MixedSource>(std::move(sources), std::move(p)));
}

// A job that adds figures of its own to another job's stats (its Stats() and the final JobEnd),
// passing everything else through. Control thread, like any JobHandle.
class StatsAddingJob : public JobHandle {
 public:
  explicit StatsAddingJob(std::shared_ptr<JobHandle> inner) : inner_(std::move(inner)) {}

  const proto::JobAccepted& accepted() const override { return inner_->accepted(); }
  int region_fd() const override { return inner_->region_fd(); }
  std::optional<Delivery> TakeNext() override {
    auto d = inner_->TakeNext();
    if (d && d->job_end) Add(d->job_end->mutable_stats());
    return d;
  }
  spdl::Status Release(uint32_t slot, uint64_t generation) override { return inner_->Release(slot, generation); }
  spdl::Status failure() const override { return inner_->failure(); }
  void Cancel() override { inner_->Cancel(); }
  proto::JobStats Stats() const override {
    proto::JobStats s = inner_->Stats();
    Add(&s);
    return s;
  }
  void Abort(spdl::Status reason) override { inner_->Abort(std::move(reason)); }
  const proto::CudaHandles* cuda_handles() const override { return inner_->cuda_handles(); }
  spdl::Status ImportConsumerEvents(const proto::CudaConsumerEvents& events) override {
    return inner_->ImportConsumerEvents(events);
  }

 protected:
  // Sets this wrapper's fields in *s.
  virtual void Add(proto::JobStats* s) const = 0;

 private:
  const std::shared_ptr<JobHandle> inner_;
};

// Adds the sample cache's figures to a job's stats (in Stats() and in the JobEnd of its last
// delivery); everything else goes to the wrapped job. Control thread, like any JobHandle.
class CacheStatsJob final : public StatsAddingJob {
 public:
  CacheStatsJob(std::shared_ptr<JobHandle> inner, std::shared_ptr<const io::CachedSource> source)
      : StatsAddingJob(std::move(inner)), source_(std::move(source)) {}

 private:
  void Add(proto::JobStats* s) const override {
    const io::SampleCache::Counters c = source_->cache().counters();
    s->set_cache_hits(source_->hits());
    s->set_cache_misses(source_->misses());
    s->set_cache_evictions(c.evictions);
    s->set_cache_bytes(c.bytes);
    s->set_cache_budget_bytes(c.budget);
  }

  const std::shared_ptr<const io::CachedSource> source_;
};

// Adds an object storage source's figures (requests, errors, the node's shard cache) to a job's
// stats, as CacheStatsJob does for the sample cache. Control thread, like any JobHandle.
class RemoteStatsJob final : public StatsAddingJob {
 public:
  RemoteStatsJob(std::shared_ptr<JobHandle> inner, std::shared_ptr<const io::SampleSource> source,
                 std::shared_ptr<io::ShardCache> shard_cache)
      : StatsAddingJob(std::move(inner)), source_(std::move(source)), shard_cache_(std::move(shard_cache)) {}

 private:
  void Add(proto::JobStats* s) const override {
    const io::SourceCounters c = source_->Counters();
    s->set_s3_requests(c.requests);
    s->set_s3_retries(c.retries);
    s->set_s3_errors_4xx(c.errors_4xx);
    s->set_s3_errors_5xx(c.errors_5xx);
    s->set_s3_errors_network(c.errors_network);
    s->set_s3_fetched_bytes(c.fetched_bytes);
    s->set_shard_cache_hits(c.shard_cache_hits);
    s->set_shard_cache_misses(c.shard_cache_misses);
    if (shard_cache_ && shard_cache_->enabled()) {
      const io::ShardCache::Counters n = shard_cache_->counters();
      s->set_shard_cache_bytes(n.bytes);
      s->set_shard_cache_budget_bytes(n.budget);
      s->set_shard_cache_evictions(n.evictions);
      s->set_shard_cache_corrupt(n.corrupt);
      s->set_shard_cache_fetched_bytes(n.fetched_bytes);
    }
  }

  const std::shared_ptr<const io::SampleSource> source_;
  const std::shared_ptr<io::ShardCache> shard_cache_;
};

// Adds a job's decoded-sample cache figures (job config cache.decoded) to its stats.
class DecodedCacheStatsJob final : public StatsAddingJob {
 public:
  DecodedCacheStatsJob(std::shared_ptr<JobHandle> inner, std::shared_ptr<const DecodedCacheSource> source)
      : StatsAddingJob(std::move(inner)), source_(std::move(source)) {}

 private:
  void Add(proto::JobStats* s) const override {
    const DecodedCache::Counters c = source_->cache().counters();
    s->set_decoded_cache_samples(c.samples);
    s->set_decoded_cache_bytes(c.bytes);
    s->set_decoded_cache_hits(c.hits);
    s->set_decoded_cache_refused(c.refused);
    s->set_decoded_cache_shrinks(source_->shrink_decodes());
  }

  const std::shared_ptr<const DecodedCacheSource> source_;
};

}  // namespace

JobRegistry::JobRegistry(const config::DaemonConfig& config, pipeline::Executor* executor, int worker_threads,
                         pipeline::Executor* io_executor)
    : config_(config),
      executor_(executor),
      io_executor_(io_executor ? io_executor : executor),
      worker_threads_(worker_threads),
      cache_(config.cache_bytes > 0 ? std::make_shared<io::SampleCache>(config.cache_bytes) : nullptr),
      shard_cache_(config.cache_dir.empty() ? nullptr
                                            : io::ShardCache::OnDisk(config.cache_dir, config.cache_dir_bytes)),
      op_loader_(std::make_shared<plugins::OpLoader>(config.plugin_dirs)),
      budget_(std::make_shared<MemoryBudget>(config.memory_budget_bytes)),
      stream_account_(std::make_unique<BudgetStreamAccount>(budget_)),
      streams_(std::make_shared<streams::StreamRegistry>(stream_account_.get())),
      watches_(std::make_shared<WatchHub>(streams_.get())),
      admission_(config, budget_),
      pending_(std::make_shared<PendingStarts>()) {}

// Started copy: daemon jobs between their continuation and their answer. Thread-safe (mu).
struct JobRegistry::PendingStarts {
  std::mutex mu;
  uint64_t next = 1;                                    // guarded by mu
  std::map<uint64_t, std::shared_ptr<JobHandle>> jobs;  // guarded by mu

  uint64_t Add(std::shared_ptr<JobHandle> job) {
    std::lock_guard lock(mu);
    const uint64_t ticket = next++;
    jobs[ticket] = std::move(job);
    return ticket;
  }
  std::shared_ptr<JobHandle> Take(uint64_t ticket) {
    std::lock_guard lock(mu);
    auto it = jobs.find(ticket);
    if (it == jobs.end()) return nullptr;
    std::shared_ptr<JobHandle> job = std::move(it->second);
    jobs.erase(it);
    return job;
  }
  // Cancels and drops the job (outside mu: its teardown may take locks of its own).
  void Drop(uint64_t ticket) {
    if (std::shared_ptr<JobHandle> job = Take(ticket)) job->Cancel();
  }
  void DropAll() {
    std::map<uint64_t, std::shared_ptr<JobHandle>> all;
    {
      std::lock_guard lock(mu);
      all.swap(jobs);
    }
    for (auto& [ticket, job] : all) job->Cancel();
  }
};

JobRegistry::~JobRegistry() {
  pending_->DropAll();  // their leases return to admission_, which is still alive
  watches_->StopAll();
  streams_->CloseAll();
  if (const int live = admission_.live_jobs(); live != 0)
    spdlog::error("job registry destroyed with {} live jobs", live);
}

void JobRegistry::UpdateLimits(const config::DaemonConfig& config, int worker_threads) {
  admission_.SetLimits(config);
  config_.memory_budget_bytes = config.memory_budget_bytes;
  config_.max_pixels = config.max_pixels;
  config_.device_memory_budget_bytes = config.device_memory_budget_bytes;
  config_.gpu_context_bytes = config.gpu_context_bytes;
  config_.max_jobs_per_client = config.max_jobs_per_client;
  config_.max_slots_per_job = config.max_slots_per_job;
  config_.max_budget_share_per_uid = config.max_budget_share_per_uid;
  config_.allowed_roots = config.allowed_roots;
  config_.allowed_url_prefixes = config.allowed_url_prefixes;
  worker_threads_ = worker_threads;
}

uint64_t JobRegistry::bytes_in_use() const { return admission_.bytes_in_use(); }

int JobRegistry::live_jobs() const { return admission_.live_jobs(); }

spdl::Status JobRegistry::Fault([[maybe_unused]] StartStep step) const {
#if SPDL_TEST_HOOKS
  if (start_fault_) return start_fault_(step);
#endif
  return spdl::Status::Ok();
}

namespace {

// Registry's prepared job: the validated spec with its source open (and, with a cache, read
// through it), or the error that refused it.
struct RegistryPrepared final : PreparedJob {
  proto::SubmitJob request;
  PeerInfo peer;
  spdl::Status status;  // not OK: refused
  std::vector<config::ConfigError> config_errors;
  MediaJobSpec spec;
  // source.type: stream: the stream (defined or opened by the Prepare task) and where to resume.
  std::shared_ptr<streams::Stream> stream;
  std::optional<uint64_t> resume_after;
  uint64_t first_batch = 0;
  std::shared_ptr<const io::CachedSource> cached;
  std::shared_ptr<const io::SampleSource> remote;     // an object storage source (stats), else null
  std::shared_ptr<const DecodedCacheSource> decoded;  // with cache.decoded
  // copy: daemon: the daemon's ordinal of the trainer's GPU and its backend (made here, off the
  // control thread: creating a CUDA context takes long).
  DevicePlacement::Placement placement;
};

// What a copy: daemon job's continuation hands back to Start: its ticket in the registry's pending
// starts (the job, wrapped for GPU delivery), or why the GPU side could not be set up, and what
// Finish needs. Dropped unstarted (the session went away): the ticket's job is cancelled and dropped.
struct GpuStarted final : PreparedJob {
  template <typename Pending>
  explicit GpuStarted(const std::shared_ptr<Pending>& p)
      : drop([weak = std::weak_ptr<Pending>(p)](uint64_t ticket) {
          if (auto live = weak.lock()) live->Drop(ticket);
        }) {}
  ~GpuStarted() override {
    if (ticket != 0) drop(ticket);
  }
  GpuStarted(const GpuStarted&) = delete;
  GpuStarted& operator=(const GpuStarted&) = delete;

  uint64_t ticket = 0;  // 0: none (failed, or taken by Start)
  spdl::Status status;  // not OK: the GPU side failed (the job is already cancelled)
  std::function<void(uint64_t)> drop;
  proto::SubmitJob request;
  PeerInfo peer;
  std::string description;
  uint64_t region_bytes = 0;
  std::shared_ptr<const io::CachedSource> cached;
  std::shared_ptr<const io::SampleSource> remote;     // an object storage source (stats), else null
  std::shared_ptr<const DecodedCacheSource> decoded;  // with cache.decoded
};

// A started copy: daemon job waiting for its continuation: the job (cancelled if the continuation
// is dropped unrun) and its GPU delivery options (holding the device lease).
struct GpuPending {
  std::shared_ptr<JobHandle> job;
  cuda::DeviceBackend* backend = nullptr;
  GpuDeliveryOptions options;
  ~GpuPending() {
    if (job) job->Cancel();
  }
};

// Undoes a step of Start when the start fails after it: runs `undo` on destruction unless committed.
class Rollback {
 public:
  explicit Rollback(std::function<void()> undo) : undo_(std::move(undo)) {}
  ~Rollback() {
    if (undo_) undo_();
  }
  Rollback(const Rollback&) = delete;
  Rollback& operator=(const Rollback&) = delete;
  void Commit() { undo_ = nullptr; }

 private:
  std::function<void()> undo_;
};

// A client's config name as it may appear in messages and logs: printable characters only (others
// become '?'), at most 200 bytes.
std::string CleanConfigName(const std::string& name) {
  std::string out;
  for (const char ch : name.substr(0, 200)) {
    const auto c = static_cast<unsigned char>(ch);
    out += (c < 0x20 || c == 0x7f) ? '?' : ch;
  }
  if (name.size() > 200) out += "...";
  return out;
}

// The identity a job of `peer` reads with: the peer's uid, gid and groups (looked up once per job),
// or nullptr (the daemon's own) when the daemon cannot switch (CheckServable has admitted only its
// own uid and root then).
std::shared_ptr<const io::FsIdentity> UserIdentity(const PeerInfo& peer) {
  if (!io::ProbeSwitchSupport().can_switch) return nullptr;
  return std::make_shared<const io::FsIdentity>(io::LookupFsIdentity(peer.uid, peer.gid));
}

// source.type: stream (issue 21): checks what a stream job cannot do, defines or opens the stream
// for the peer (its access rule: the defining uid, allowed_uids, root) and reads a stream token.
// source.type: watch: the stream is the one the watch of source.root feeds (WatchHub::Attach: the
// folder resolved, watched and read with the peer's rights), named from the folder and settings
// unless source.name is given.
void PrepareStreamJob(RegistryPrepared* p, streams::StreamRegistry* streams, WatchHub* watches,
                      const config::DaemonConfig& daemon) {
  const proto::SubmitJob& req = p->request;
  MediaJobSpec& spec = p->spec;
  const config::StreamSourceConfig& sc = spec.config.source.stream;
  auto fail = [p](spdl::Status why) { p->status = std::move(why); };
  std::string problems;
  auto refuse = [&](const std::string& what) { problems += "\n  " + what; };
  if (spec.config.media != config::Media::kImage) refuse("media: a stream job decodes images only");
  if (!spec.config.extra_outputs.empty()) refuse("extra_outputs: a stream sample has no sidecar files");
  if (!spec.config.mask.from.empty()) refuse("mask: a stream sample has no sidecar files");
  if (spec.config.mix.enabled()) refuse("mix: not available for stream jobs");
  if (spec.config.share) refuse("share: stream jobs share a stream through consumer groups (source.group)");
  if (spec.config.output.cuda_device >= 0) refuse("output.device: stream jobs deliver to the CPU");
  if (req.world_size() > 1) refuse("world_size: ranks of a stream job share a consumer group (source.group)");
  if (req.start_epoch() > 0) refuse("start_epoch: a stream has no epochs");
  if (!problems.empty()) return fail(InvalidArgument("invalid stream job:" + problems));
  if (streams == nullptr) return fail(Internal("this daemon has no streams"));
  streams::StreamConfig def;
  def.name = sc.name;
  def.max_samples = sc.retain_samples;
  def.max_bytes = sc.retain_bytes;
  def.allowed_uids = sc.allowed_uids;
  const bool watch = spec.config.source.type == config::SourceType::kWatch;
  if (watch) {
    if (spdl::Status servable = io::CheckServable(p->peer.uid); !servable.ok()) {
      return fail(PermissionDenied(servable.message()));
    }
    if (watches == nullptr) return fail(Internal("this daemon has no watches"));
    WatchSpec w;
    w.root = spec.config.source.root;
    w.options.extensions = spec.config.source.extensions;
    w.options.include_existing = spec.config.source.watch.include_existing;
    w.options.classes = spec.config.source.watch.classes;
    w.allowed_roots = daemon.allowed_roots;
    w.stream = std::move(def);
    w.uid = p->peer.uid;
    w.identity = UserIdentity(p->peer);
    w.max_sample_bytes = std::min<uint64_t>(io::kDefaultMaxSampleBytes, sc.retain_bytes);
    auto stream = watches->Attach(w);
    if (!stream.ok()) return fail(stream.status().WithPrefix("source.root"));
    p->stream = std::move(stream).value();
  } else {
    auto stream = streams->Define(def, p->peer.uid);
    if (!stream.ok()) return fail(stream.status().WithPrefix("source.name"));
    p->stream = std::move(stream).value();
  }
  const std::string& stream_name = p->stream->name();
  if (!req.resume_token().empty()) {
    auto token = DecodeStreamToken(req.resume_token());
    if (!token.ok()) return fail(FailedPrecondition(token.status().message()));
    if (token->stream != stream_name || token->group != sc.group) {
      return fail(FailedPrecondition("the resume token is of stream '" + token->stream + "' group '" + token->group +
                                     "', this job reads stream '" + stream_name + "' group '" + sc.group + "'"));
    }
    p->resume_after = token->offset;
    p->first_batch = token->next_batch;
  }
}

// The slow part of Submit: parse and validate the config, open the source (the folder scan, list
// or tar index), fingerprint it and check a resume token. Uses only its arguments (the daemon
// config as it was at Submit), so it runs on any thread.
void PrepareJob(RegistryPrepared* p, const config::DaemonConfig& daemon, const std::shared_ptr<io::SampleCache>& cache,
                plugins::OpLoader* op_loader, const std::shared_ptr<MemoryBudget>& budget,
                io::SourceIndexCache* index_cache, const std::shared_ptr<io::ShardCache>& shard_cache,
                streams::StreamRegistry* streams, WatchHub* watches) {
  const proto::SubmitJob& req = p->request;
  const PeerInfo& peer = p->peer;
  const std::string name = req.config_name().empty() ? "<config>" : CleanConfigName(req.config_name());
  auto fail = [p](spdl::Status why) { p->status = std::move(why); };

  std::vector<config::Override> overrides;
  for (const auto& o : req.overrides()) overrides.push_back({o.path(), o.value()});
  config::JobConfigResult parsed = config::ParseJobConfig(req.config_yaml(), overrides);
  if (!parsed.config) {
    fail(InvalidArgument("invalid job config " + name + ":\n" + config::FormatConfigErrors(parsed.errors, name)));
    p->config_errors = std::move(parsed.errors);
    return;
  }

  MediaJobSpec& spec = p->spec;
  spec.config = std::move(*parsed.config);
  spec.owner = peer;
  spec.world_size = req.world_size() == 0 ? 1 : req.world_size();
  spec.rank = req.rank();
  spec.epochs = req.epochs();
  if (spec.rank >= spec.world_size) {
    return fail(FailedPrecondition("rank " + std::to_string(spec.rank) + " is not below world_size " +
                                   std::to_string(spec.world_size)));
  }
  // decode.max_pixels may only lower the daemon's max_pixels, never raise it.
  config::JobConfig decode_config = spec.config;
  decode_config.decode.max_pixels = std::min<int64_t>(decode_config.decode.max_pixels, daemon.max_pixels);
  auto decoder = MakeSampleDecoder(decode_config, op_loader, budget);  // user ops: libraries loaded, `create` run
  if (!decoder.ok()) {
    return fail(InvalidArgument("invalid job config " + name + ": " + decoder.status().message()));
  }
  spec.decoder = std::move(decoder).value();

  if (spec.config.source.type == config::SourceType::kStream || spec.config.source.type == config::SourceType::kWatch) {
    return PrepareStreamJob(p, streams, watches, daemon);
  }

  // Every file of the job is opened with its user's rights: the scan, list or index now, each
  // sample and sidecar later (io::UserSource), whichever thread reads.
  if (spdl::Status servable = io::CheckServable(peer.uid); !servable.ok()) {
    return fail(PermissionDenied(servable.message()));
  }
  std::shared_ptr<const io::FsIdentity> identity = UserIdentity(peer);
  Result<std::shared_ptr<const io::SampleSource>> source = Internal("not opened");
  {
    io::ScopedFsIdentity as_user(identity.get());
    if (!as_user.ok())
      return fail(
          Internal("spdld could not act as uid " + std::to_string(peer.uid) + ": " + as_user.status().message()));
    if (spec.config.sources.empty()) {
      source = OpenSource(spec.config.source, spec.config.extra_outputs, spec.config.mask.from, daemon, index_cache,
                          req.s3(), shard_cache);
    } else {
      source = OpenMix(spec.config, daemon, index_cache, req.s3(), shard_cache, &spec.mix);
    }
  }
  // The credentials now live only in the job's S3 transport (if it has one), not in the request.
  p->request.clear_s3();
  if (!source.ok()) return fail(source.status());
  if (dynamic_cast<const io::S3TarShardSource*>(source->get()) != nullptr ||
      dynamic_cast<const io::S3ObjectSource*>(source->get()) != nullptr ||
      dynamic_cast<const io::MixedSource*>(source->get()) != nullptr) {  // a mix sums its sources' counters
    p->remote = *source;  // its request and shard cache counters go into the job's stats
  }
  spec.source = std::make_shared<const io::UserSource>(std::move(source).value(), identity);
  if (cache) {
    p->cached = std::make_shared<const io::CachedSource>(std::move(spec.source), cache,
                                                         identity ? identity->Key() : std::string("daemon"));
    spec.source = p->cached;
  }
  if (spec.config.cache.decoded.max_side > 0) {
    // Over the node's cache of encoded bytes: a later epoch's hit here reads nothing at all.
    p->decoded = std::make_shared<const DecodedCacheSource>(
        std::move(spec.source),
        std::make_shared<DecodedCache>(static_cast<uint64_t>(spec.config.cache.decoded.max_bytes), budget),
        spec.config.cache.decoded, decode_config.decode, budget);
    spec.source = p->decoded;
    spec.decoded = p->decoded;
  }
  spec.fingerprint = JobFingerprint(*spec.source, spec.config, spec.rank, spec.world_size);
  if (!req.resume_token().empty() && req.start_epoch() > 0) {
    return fail(FailedPrecondition("give either a resume token or start_epoch, not both"));
  }
  if (!req.resume_token().empty() && spec.config.order == config::Order::kCompletion) {
    return fail(
        FailedPrecondition("a job in order: completion cannot be resumed (it delivers batches out of order and "
                           "hands out no state token); use order: sampler"));
  }
  if (!req.resume_token().empty()) {
    auto point = DecodeResumeToken(req.resume_token(), spec.fingerprint);
    if (!point.ok()) return fail(FailedPrecondition(point.status().message()));
    if (spec.epochs != 0 && point->epoch >= spec.epochs) {
      return fail(FailedPrecondition("the resume token is at epoch " + std::to_string(point->epoch) +
                                     ", past the last of the " + std::to_string(spec.epochs) + " epochs requested"));
    }
    spec.resume = std::move(*point);
  }
  if (req.start_epoch() > 0) {
    if (spec.epochs != 0 && req.start_epoch() >= spec.epochs) {
      return fail(FailedPrecondition("start_epoch " + std::to_string(req.start_epoch()) + " is past the last of the " +
                                     std::to_string(spec.epochs) + " epochs requested"));
    }
    pipeline::ResumePoint start;  // the start of that epoch: what the token after the epoch before says
    start.epoch = req.start_epoch();
    spec.resume = std::move(start);
  }

  io::SamplerOptions so;
  so.rank = spec.rank;
  so.world_size = spec.world_size;
  so.uneven = spec.config.sampler.uneven == config::Uneven::kDrop ? io::Uneven::kDrop : io::Uneven::kPad;
  const uint64_t per_rank =
      spec.mix ? io::MixSamplesPerRank(*spec.mix, so) : io::SamplesPerRank(spec.source->size(), so);
  if (io::BatchesPerEpoch(per_rank, static_cast<uint32_t>(spec.config.batch.size), spec.config.batch.drop_last) == 0) {
    return fail(InvalidArgument("the dataset has " + std::to_string(spec.source->size()) + " samples, " +
                                std::to_string(per_rank) + " for this rank: not one batch of " +
                                std::to_string(spec.config.batch.size) + " with drop_last"));
  }
  if (spec.resume) {
    // A point with nothing left to deliver, or outside the epoch, would start a job that never ends.
    spdl::Status valid = pipeline::CheckResumePoint(
        *spec.resume, per_rank, static_cast<uint32_t>(spec.config.batch.size), spec.config.batch.drop_last);
    if (!valid.ok()) return fail(FailedPrecondition(valid.message()));
  }
}

}  // namespace

SubmitResult JobRegistry::Submit(const proto::SubmitJob& req, const PeerInfo& peer, std::function<void()> notify) {
  SubmitResult r = Start(Prepare(req, peer)(), notify);
  while (r.continuation) r = Start(r.continuation(), notify);  // inline: the caller asked to wait
  return r;
}

PrepareTask JobRegistry::Prepare(const proto::SubmitJob& request, const PeerInfo& peer) {
  auto p = std::make_shared<RegistryPrepared>();
  p->request = request;
  p->peer = peer;
  // A copy: a SIGHUP reload may change config_ while the task runs.
#if SPDL_TEST_HOOKS
  if (stage_hooks_) p->spec.stage_hook = stage_hooks_(request);
#endif
#if SPDL_TEST_HOOKS
  PrepareHook hook = prepare_hook_;
#endif
  return [p, daemon = config_, cache = cache_, ops = op_loader_, budget = budget_, index = index_cache_,
          shards = shard_cache_,
#if SPDL_TEST_HOOKS
          hook = std::move(hook),
#endif
          placement = placement_, streams = streams_, watches = watches_]() -> std::shared_ptr<PreparedJob> {
#if SPDL_TEST_HOOKS
    if (hook) hook(p->request);
#endif
    PrepareJob(p.get(), daemon, cache, ops.get(), budget, index.get(), shards, streams.get(), watches.get());
    if (p->status.ok()) {
      auto placed = placement->Resolve(p->spec.config.output, p->request.device_uuid());
      if (placed.ok()) {
        p->placement = *placed;
      } else {
        p->status = placed.status();
      }
    }
    return p;
  };
}

// The steps, each after the reservations it needs are held: (1) limits and device placement
// (nothing held yet), (2) a share group to join (returns a member; nothing held) or to start,
// (3) admission (Admission::Reservation holds the budgets), (4) the job (holds the shared-memory
// lease; cancelled by a Rollback unless the start commits), (5) the GPU wrapper (holds the device
// lease), (6) the share group recorded, the job recorded. A failure anywhere drops what is held.
SubmitResult JobRegistry::Start(std::shared_ptr<PreparedJob> prepared, std::function<void()> notify) {
  if (dynamic_cast<GpuStarted*>(prepared.get()) != nullptr) return FinishGpuStart(prepared.get(), notify);
  auto* p = dynamic_cast<RegistryPrepared*>(prepared.get());
  if (p == nullptr) return SubmitResult::Refused(Internal("a prepared job of another job service"));
  if (!p->status.ok()) {
    SubmitResult out = SubmitResult::Refused(std::move(p->status));
    out.config_errors = std::move(p->config_errors);
    return out;
  }
  const proto::SubmitJob& req = p->request;
  const PeerInfo& peer = p->peer;
  MediaJobSpec spec = std::move(p->spec);
  std::shared_ptr<const io::CachedSource> cached = std::move(p->cached);
  std::shared_ptr<const io::SampleSource> remote = std::move(p->remote);
  std::shared_ptr<streams::Stream> stream = std::move(p->stream);
  std::shared_ptr<const DecodedCacheSource> decoded = std::move(p->decoded);

  // (1) Limits of the job itself, and its device.
  if (spec.config.prefetch > config_.max_slots_per_job) {
    return SubmitResult::Refused(ResourceExhausted("prefetch " + std::to_string(spec.config.prefetch) +
                                                   " exceeds the daemon's max_slots_per_job " +
                                                   std::to_string(config_.max_slots_per_job)));
  }
  const config::OutputConfig output = spec.config.output;
  const bool daemon_copy = DevicePlacement::DaemonCopies(output);
  DevicePlacement::Placement placed;
  uint64_t device_bytes = 0;
  if (daemon_copy) {
    auto checked = placement_->Check(output, p->placement);
    if (!checked.ok()) return SubmitResult::Refused(checked.status());
    placed = *checked;
    const proto::SlotLayout layout = MediaJob::LayoutFor(spec);
    device_bytes = cuda::DeviceSlotPool::DeviceBytes(layout.slot_stride, layout.num_slots);
  }
  // decode.device: cuda: the batch decode on the job's device (its parts are made with the device
  // slots, in the continuation).
  std::shared_ptr<GpuBatchDecode> gpu_decode;
  if (spec.config.media == config::Media::kImage && spec.config.decode.device == config::DecodeDevice::kCuda) {
    if (!daemon_copy) {
      return SubmitResult::Refused(
          FailedPrecondition("decode.device: cuda needs output.device: cuda:N with copy: daemon"));
    }
    if (!gpu_decode_parts_) {
      return SubmitResult::Refused(FailedPrecondition(
          "decode.device: cuda: this spdld has no GPU JPEG decode (built without CUDA or nvJPEG); use "
          "decode.device: cpu (the default) with output.device: " +
          output.device));
    }
    if (decoded) {
      return SubmitResult::Refused(FailedPrecondition(
          "decode.device: cuda decodes the files themselves: it cannot read from cache.decoded (turn one off)"));
    }
    if (spdl::Status s = GpuBatchDecode::Check(*spec.decoder); !s.ok()) return SubmitResult::Refused(std::move(s));
    gpu_decode = std::make_shared<GpuBatchDecode>(spec.config, spec.decoder, gpu_decode_parts_);
    spec.gpu_decode = gpu_decode;
  }
  if (spdl::Status s = Fault(StartStep::kPlaced); !s.ok()) return SubmitResult::Refused(std::move(s));

  // (2) Identical jobs decode once: join a group that has not started yet, or start one below.
  std::shared_ptr<ShareGroup> group;
  std::string share_key;
  std::chrono::steady_clock::duration share_wait{};
  uint32_t share_members = 1;
  if (spec.config.share && !spec.resume && output.cuda_device < 0) {  // a GPU job is never shared
    share_key = ShareGroups::Key(req, peer, spec.fingerprint.whole, spec.epochs);
    if (std::optional<ShareGroups::Entry> joinable = groups_.FindJoinable(share_key)) {
      const uint64_t member_id = next_job_id_.fetch_add(1);
      std::shared_ptr<JobHandle> member = joinable->group->Join(member_id, std::move(notify));
      spdlog::info("job {}: joins the share group of job {} ({} members)", member_id, joinable->group->job_id(),
                   joinable->group->members());
      const uint64_t region_bytes = member->accepted().region_bytes();
      return Finish(req, peer, spec.source->Describe(), region_bytes, std::move(member), joinable->cached,
                    joinable->decoded);
    }
    share_wait = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(spec.config.share_wait_seconds));
    share_members = static_cast<uint32_t>(spec.config.share_members);
    group = std::make_shared<ShareGroup>(share_members, share_wait);
  }

  // (3) Admission: reserve every budget before allocating anything.
  Admission::Request ask;
  ask.uid = peer.uid;
  ask.shm_bytes = MediaJob::LayoutFor(spec).region_bytes;
  ask.slots = spec.config.prefetch;
  if (daemon_copy) {
    ask.device = placed.device;
    ask.device_name = output.device;
    ask.device_bytes = device_bytes;
  }
  auto reserved = admission_.Reserve(ask);
  if (!reserved.ok()) return SubmitResult::Refused(reserved.status());
  Admission::Reservation reservation = std::move(reserved).value();
  if (daemon_copy) placement_->NoteUsed(placed.device, placed.backend);
  if (spdl::Status s = Fault(StartStep::kAdmitted); !s.ok()) return SubmitResult::Refused(std::move(s));

  // (4) The job, holding the shared-memory lease.
  const std::string description =
      stream ? "stream " + stream->name() + " group " + spec.config.source.stream.group : spec.source->Describe();
  spec.job_id = next_job_id_.fetch_add(1);
  if (stream) {  // source.type: stream or watch: no share group, no GPU (PrepareStreamJob refused both)
    // Decodes on the shared worker pool, in the user's turn, like a file job's (pipeline/thread_pool.h).
    auto sj = StreamJob::Start(std::move(spec), stream, p->resume_after, p->first_batch, reservation.TakeShmLease(),
                               std::move(notify), executor_->ForGroup(peer.uid));
    if (!sj.ok()) return SubmitResult::Refused(sj.status().WithPrefix("starting the job"));
    std::shared_ptr<JobHandle> handle = std::move(sj).value();
    Rollback cancel_job([inner = std::weak_ptr<JobHandle>(handle)] {
      if (auto j = inner.lock()) j->Cancel();
    });
    if (spdl::Status s = Fault(StartStep::kJobStarted); !s.ok()) return SubmitResult::Refused(std::move(s));
    cancel_job.Commit();
    return Finish(req, peer, description, ask.shm_bytes, std::move(handle), nullptr, nullptr);
  }
  std::function<void()> gpu_notify = output.cuda_device >= 0 ? notify : nullptr;
  std::function<void()> member_notify;
  if (group) {
    member_notify = std::move(notify);
    notify = [weak = std::weak_ptr<ShareGroup>(group)] {
      if (auto g = weak.lock()) g->Notify();
    };
  }
  // The pools serve users in turn, then each user's jobs by weight (pipeline/thread_pool.h).
  auto job = MediaJob::Start(std::move(spec), executor_->ForGroup(peer.uid), reservation.TakeShmLease(),
                             std::move(notify), io_executor_->ForGroup(peer.uid));
  if (!job.ok()) return SubmitResult::Refused(job.status().WithPrefix("starting the job"));
  std::shared_ptr<JobHandle> handle = std::move(job).value();
  Rollback cancel_job([inner = std::weak_ptr<JobHandle>(handle)] {
    if (auto j = inner.lock()) j->Cancel();
  });
  if (spdl::Status s = Fault(StartStep::kJobStarted); !s.ok()) return SubmitResult::Refused(std::move(s));

  // (5) GPU delivery, holding the device lease (returned once the device memory is freed).
  if (output.cuda_device >= 0) {
    GpuDeliveryOptions g;
    g.output = output;
    g.notify = std::move(gpu_notify);
    if (std::shared_ptr<Admission::DeviceLease> lease = reservation.TakeDeviceLease()) {
      g.on_close = [lease = std::move(lease)](uint64_t leaked) { lease->Close(leaked); };
    }
    g.teardown = &gpu_teardown_;
    g.consumer_timeout = gpu_consumer_timeout_;
    g.drain_timeout = gpu_drain_timeout_;
    g.gpu_decode = std::move(gpu_decode);
    if (daemon_copy) {
      // Mapping, pinning (cudaHostRegister), device memory and IPC export wait on CUDA: they run
      // in the continuation, off the control thread, which answers the job when they are done.
      auto pending = std::make_shared<GpuPending>();
      pending->job = std::move(handle);
      pending->backend = placed.backend;
      pending->options = std::move(g);
      auto started = std::make_shared<GpuStarted>(pending_);
      started->request = req;
      started->peer = peer;
      started->description = description;
      started->region_bytes = ask.shm_bytes;
      started->cached = std::move(cached);
      started->remote = std::move(remote);
      started->decoded = std::move(decoded);
      cancel_job.Commit();  // `pending` cancels the job if the continuation never runs
      SubmitResult later;
      later.continuation = [pending, started, tickets = pending_]() -> std::shared_ptr<PreparedJob> {
        if (!pending->job) {
          started->status = Internal("a GPU job's continuation ran twice");
          return started;
        }
        auto wrapped = WrapGpuJob(std::move(pending->job), pending->backend, std::move(pending->options));
        if (!wrapped.ok()) {
          started->status = wrapped.status();  // the job is cancelled, its device lease returned
          return started;
        }
        started->ticket = tickets->Add(std::move(wrapped).value());
        return started;
      };
      return later;
    }
    auto wrapped = WrapGpuJob(handle, placed.backend, std::move(g));  // copy: client: no CUDA call here
    if (!wrapped.ok()) return SubmitResult::Refused(wrapped.status());
    handle = std::move(wrapped).value();
    if (spdl::Status s = Fault(StartStep::kGpuWrapped); !s.ok()) return SubmitResult::Refused(std::move(s));
  }

  // (6) Committed: nothing below fails.
  cancel_job.Commit();
  if (group) {
    group->SetJob(std::move(handle));
    groups_.Add(share_key, group, cached, decoded);
    if (schedule_ && share_members > 1) {
      schedule_(share_wait + std::chrono::milliseconds(1), [weak = std::weak_ptr<ShareGroup>(group)] {
        if (auto g = weak.lock()) g->Notify();  // the members look again: the wait is over
      });
    }
    handle = group->Join(next_job_id_.fetch_add(1), std::move(member_notify));
    spdlog::info("job {}: starts the share group of job {}", handle->accepted().job_id(), group->job_id());
  }
  if (remote) handle = std::make_shared<RemoteStatsJob>(std::move(handle), std::move(remote), shard_cache_);
  return Finish(req, peer, description, ask.shm_bytes, std::move(handle), cached, decoded);
}

SubmitResult JobRegistry::FinishGpuStart(PreparedJob* prepared, const std::function<void()>& notify) {
  auto* started = static_cast<GpuStarted*>(prepared);
  if (!started->status.ok()) return SubmitResult::Refused(started->status);
  std::shared_ptr<JobHandle> handle = pending_->Take(started->ticket);
  started->ticket = 0;
  if (!handle) return SubmitResult::Refused(Internal("a started GPU job was answered twice"));
  Rollback cancel_job([&handle] { handle->Cancel(); });
  if (spdl::Status s = Fault(StartStep::kGpuWrapped); !s.ok()) return SubmitResult::Refused(std::move(s));
  cancel_job.Commit();
  if (started->remote) {
    handle = std::make_shared<RemoteStatsJob>(std::move(handle), std::move(started->remote), shard_cache_);
  }
  SubmitResult out = Finish(started->request, started->peer, started->description, started->region_bytes,
                            std::move(handle), std::move(started->cached), std::move(started->decoded));
  // The job ran while its GPU side was set up: what it signalled meanwhile found no session to take
  // it. One more signal (it schedules the session's look on the control thread, after this answer).
  if (notify) notify();
  return out;
}

SubmitResult JobRegistry::Finish(const proto::SubmitJob& req, const PeerInfo& peer, const std::string& description,
                                 uint64_t region_bytes, std::shared_ptr<JobHandle> job,
                                 std::shared_ptr<const io::CachedSource> cached,
                                 std::shared_ptr<const DecodedCacheSource> decoded) {
  groups_.DropExpired();  // now and then (the map is only read by Start)
  SubmitResult out;
  if (cached) job = std::make_shared<CacheStatsJob>(std::move(job), std::move(cached));
  if (decoded) job = std::make_shared<DecodedCacheStatsJob>(std::move(job), std::move(decoded));
  out.job = std::move(job);
  auto record = std::make_shared<JobRecord>();
  record->job_id = out.job->accepted().job_id();
  record->owner = peer;
  record->source = description;
  record->rank = req.rank();
  record->world_size = req.world_size() == 0 ? 1 : req.world_size();
  record->epochs = req.epochs();
  record->region_bytes = region_bytes;
  record->job = out.job;
  records_[record->job_id] = record;
  out.record = std::move(record);
  return out;
}

std::vector<JobRegistry::GpuDeviceState> JobRegistry::GpuDevices() const {
  std::vector<GpuDeviceState> out;
  for (const auto& [device, backend] : placement_->Used()) {
    GpuDeviceState d;
    d.device = device;
    if (spdl::Status sticky = backend->sticky_error(); !sticky.ok()) {
      d.poisoned = sticky.message().empty() ? std::string("a sticky CUDA error") : sticky.message();
    }
    d.jobs = admission_.device_jobs(device);
    out.push_back(std::move(d));
  }
  return out;
}

proto::StreamStatus StreamStatusOf(const streams::StreamStats& s) {
  proto::StreamStatus o;
  o.set_name(s.name);
  o.set_owner_uid(s.owner_uid);
  o.set_max_samples(s.max_samples);
  o.set_max_bytes(s.max_bytes);
  o.set_head_offset(s.head_offset);
  o.set_tail_offset(s.tail_offset);
  o.set_retained_samples(s.retained_samples);
  o.set_retained_bytes(s.retained_bytes);
  o.set_put_bytes(s.put_bytes);
  o.set_evicted(s.evicted);
  o.set_blocked_puts(s.blocked_puts);
  o.set_producers(s.producers);
  o.set_closed(s.closed);
  for (const streams::GroupStats& g : s.groups) {
    proto::StreamGroupStatus* og = o.add_groups();
    og->set_name(g.name);
    og->set_consumers(g.consumers);
    og->set_lag(g.lag);
    og->set_in_flight(g.in_flight);
    og->set_redeliver(g.redeliver);
    og->set_delivered(g.delivered);
    og->set_redelivered(g.redelivered);
    og->set_next_offset(g.next_offset);
  }
  return o;
}

proto::DaemonStatus JobRegistry::Status(const PeerInfo& peer) {
  proto::DaemonStatus st;
  st.set_daemon_version(SPDLD_VERSION);
  st.set_uptime_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count());
  st.set_worker_threads(static_cast<uint32_t>(worker_threads_));
  st.set_memory_budget_bytes(config_.memory_budget_bytes);
  st.set_memory_in_use_bytes(bytes_in_use());
  st.set_live_jobs(static_cast<uint32_t>(live_jobs()));
  const io::SourceIndexCache::Stats index_stats = index_cache_ ? index_cache_->stats() : io::SourceIndexCache::Stats{};
  st.set_source_index_scans(index_stats.scans);
  st.set_source_index_shared(index_stats.hits + index_stats.joined);
  st.set_memory_in_use_bytes(st.memory_in_use_bytes() + budget_->stream_bytes());
  for (const std::shared_ptr<streams::Stream>& stream : streams_->List()) {
    if (!stream->CheckAccess(peer.uid).ok()) continue;  // another user's stream is not even shown
    *st.add_streams() = StreamStatusOf(stream->Stats());
  }
  st.set_gpu_leaked_device_bytes(admission_.leaked_device_bytes_total());
  for (const GpuDeviceState& d : GpuDevices()) {
    auto* g = st.add_gpu_devices();
    g->set_device("cuda:" + std::to_string(d.device));
    g->set_poisoned(!d.poisoned.empty());
    g->set_error(d.poisoned);
    g->set_jobs(d.jobs);
  }
  for (auto it = records_.begin(); it != records_.end();) {
    auto job = it->second->job.lock();
    if (!job) {
      it = records_.erase(it);
      continue;
    }
    const JobRecord& r = *it->second;
    ++it;
    if (peer.uid != 0 && peer.uid != r.owner.uid) continue;
    auto* s = st.add_jobs();
    s->set_job_id(r.job_id);
    s->set_uid(r.owner.uid);
    s->set_pid(static_cast<uint32_t>(r.owner.pid));
    s->set_source(r.source);
    s->set_rank(r.rank);
    s->set_world_size(r.world_size);
    s->set_epochs(r.epochs);
    s->set_region_bytes(r.region_bytes);
    *s->mutable_stats() = job->Stats();
    s->mutable_stats()->set_client_wait_seconds(r.client_wait_seconds.load());
    for (const auto& n : r.client_wait_histogram) s->mutable_stats()->add_client_wait_histogram(n.load());
  }
  return st;
}

spdl::Status JobRegistry::Cancel(uint64_t job_id, const PeerInfo& peer) {
  auto it = records_.find(job_id);
  std::shared_ptr<JobHandle> job = it == records_.end() ? nullptr : it->second->job.lock();
  if (!job || (peer.uid != 0 && peer.uid != it->second->owner.uid)) {
    return NotFound("no job " + std::to_string(job_id) + " of uid " + std::to_string(peer.uid));
  }
  spdlog::info("job {}: cancelled by uid {} pid {}", job_id, peer.uid, peer.pid);
  job->Abort(Cancelled("cancelled by uid " + std::to_string(peer.uid) + " (spdlctl cancel)"));
  return spdl::Status::Ok();
}

}  // namespace spdl::jobs
