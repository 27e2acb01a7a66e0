#include "jobs/job_registry.h"

#include <spdlog/spdlog.h>

#include "io/manifest.h"
#include "io/allowed_roots.h"
#include "io/sampler.h"
#include "jobs/image_job.h"

namespace spdl::jobs {
namespace {

proto::Error MakeError(proto::Error::Code code, std::string message) {
  proto::Error e;
  e.set_code(code);
  e.set_message(std::move(message));
  return e;
}

proto::Error::Code CodeFor(const Status& s) {
  switch (s.code()) {
    case StatusCode::kPermissionDenied: return proto::Error::PERMISSION_DENIED;
    case StatusCode::kNotFound: return proto::Error::NOT_FOUND;
    case StatusCode::kResourceExhausted: return proto::Error::RESOURCE_EXHAUSTED;
    case StatusCode::kInvalidArgument: return proto::Error::INVALID_CONFIG;
    default: return proto::Error::INTERNAL;
  }
}

std::string MiB(uint64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

// Maps the job's transform chain onto the image decoder's fused resize + crop.
Result<media::ImageOps> OpsFor(const config::JobConfig& c) {
  media::ImageOps ops;
  bool seen_crop = false;
  for (const auto& t : c.transforms) {
    if (const auto* r = std::get_if<config::ResizeOp>(&t)) {
      if (seen_crop || ops.resize_shorter || ops.resize_height)
        return InvalidArgument("transforms: only one resize, before center_crop, is supported in this version");
      ops.resize_shorter = r->shorter;
      ops.resize_height = r->height;
      ops.resize_width = r->width;
      switch (r->interpolation) {
        case config::Interpolation::kBilinear: ops.interpolation = media::Interpolation::kBilinear; break;
        case config::Interpolation::kBicubic: ops.interpolation = media::Interpolation::kBicubic; break;
        case config::Interpolation::kArea: ops.interpolation = media::Interpolation::kArea; break;
      }
    } else if (const auto* cc = std::get_if<config::CenterCropOp>(&t)) {
      if (seen_crop) return InvalidArgument("transforms: only one center_crop is supported in this version");
      seen_crop = true;
      ops.crop_height = cc->height;
      ops.crop_width = cc->width;
    }
  }
  return ops;
}

}  // namespace

class JobRegistry::Lease final : public BudgetLease {
 public:
  Lease(JobRegistry* r, uid_t uid, uint64_t bytes) : r_(r), uid_(uid), bytes_(bytes) {}
  ~Lease() override { r_->Return(uid_, bytes_); }

 private:
  JobRegistry* r_;
  uid_t uid_;
  uint64_t bytes_;
};

JobRegistry::JobRegistry(const config::DaemonConfig& config, pipeline::Executor* executor)
    : config_(config), executor_(executor) {}

JobRegistry::~JobRegistry() {
  std::lock_guard lock(mu_);
  if (live_jobs_ != 0) spdlog::error("job registry destroyed with {} live jobs", live_jobs_);
}

void JobRegistry::Return(uid_t uid, uint64_t bytes) {
  std::lock_guard lock(mu_);
  bytes_in_use_ -= bytes;
  if (--jobs_per_uid_[uid] == 0) jobs_per_uid_.erase(uid);
  --live_jobs_;
}

uint64_t JobRegistry::bytes_in_use() const {
  std::lock_guard lock(mu_);
  return bytes_in_use_;
}

int JobRegistry::live_jobs() const {
  std::lock_guard lock(mu_);
  return live_jobs_;
}

SubmitResult JobRegistry::Submit(const proto::SubmitJob& req, const PeerInfo& peer, std::function<void()> notify) {
  SubmitResult out;
  const std::string name = req.config_name().empty() ? "<config>" : req.config_name();

  std::vector<config::Override> overrides;
  for (const auto& o : req.overrides()) overrides.push_back({o.path(), o.value()});
  config::JobConfigResult parsed = config::ParseJobConfig(req.config_yaml(), overrides);
  if (!parsed.config) {
    out.error = MakeError(proto::Error::INVALID_CONFIG,
                          "invalid job config " + name + ":\n" + config::FormatConfigErrors(parsed.errors, name));
    for (const auto& e : parsed.errors) {
      auto* ce = out.error.add_config_errors();
      ce->set_line(static_cast<uint32_t>(e.line));
      ce->set_column(static_cast<uint32_t>(e.column));
      ce->set_path(e.path);
      ce->set_message(e.message);
    }
    return out;
  }

  ImageJobSpec spec;
  spec.config = std::move(*parsed.config);
  spec.owner = peer;
  spec.world_size = req.world_size() == 0 ? 1 : req.world_size();
  spec.rank = req.rank();
  spec.epochs = req.epochs();
  if (spec.rank >= spec.world_size) {
    out.error = MakeError(proto::Error::BAD_REQUEST, "rank " + std::to_string(spec.rank) +
                                                         " is not below world_size " + std::to_string(spec.world_size));
    return out;
  }
  auto ops = OpsFor(spec.config);
  if (!ops.ok()) {
    out.error = MakeError(proto::Error::INVALID_CONFIG, ops.status().message());
    return out;
  }
  spec.ops = *ops;

  auto root = io::ResolveUnderRoots(spec.config.source.root, config_.allowed_roots);
  if (!root.ok()) {
    out.error = MakeError(CodeFor(root.status()), "source.root: " + root.status().message());
    return out;
  }
  auto manifest = io::ScanImageFolder(*root, spec.config.source.extensions);
  if (!manifest.ok()) {
    out.error = MakeError(CodeFor(manifest.status()), "source: " + manifest.status().message());
    return out;
  }
  spec.manifest = std::move(*manifest);

  io::SamplerOptions so;
  so.rank = spec.rank;
  so.world_size = spec.world_size;
  so.uneven = spec.config.sampler.uneven == config::Uneven::kDrop ? io::Uneven::kDrop : io::Uneven::kPad;
  const uint64_t per_rank = io::SamplesPerRank(spec.manifest.samples.size(), so);
  if (io::BatchesPerEpoch(per_rank, static_cast<uint32_t>(spec.config.batch.size), spec.config.batch.drop_last) == 0) {
    out.error = MakeError(proto::Error::INVALID_CONFIG,
                          "the dataset has " + std::to_string(spec.manifest.samples.size()) + " samples, " +
                              std::to_string(per_rank) + " for this rank: not one batch of " +
                              std::to_string(spec.config.batch.size) + " with drop_last");
    return out;
  }
  if (spec.config.prefetch > config_.max_slots_per_job) {
    out.error = MakeError(proto::Error::RESOURCE_EXHAUSTED,
                          "prefetch " + std::to_string(spec.config.prefetch) + " exceeds the daemon's max_slots_per_job " +
                              std::to_string(config_.max_slots_per_job));
    return out;
  }

  // Admission: reserve the budget before allocating anything, so a refused job is never half-started.
  const uint64_t bytes = ImageJob::LayoutFor(spec).region_bytes;
  {
    std::lock_guard lock(mu_);
    if (jobs_per_uid_[peer.uid] >= config_.max_jobs_per_client) {
      if (jobs_per_uid_[peer.uid] == 0) jobs_per_uid_.erase(peer.uid);
      out.error = MakeError(proto::Error::RESOURCE_EXHAUSTED,
                            "uid " + std::to_string(peer.uid) + " already has " + std::to_string(config_.max_jobs_per_client) +
                                " jobs (max_jobs_per_client)");
      return out;
    }
    if (bytes_in_use_ + bytes > config_.memory_budget_bytes) {
      if (jobs_per_uid_[peer.uid] == 0) jobs_per_uid_.erase(peer.uid);
      out.error = MakeError(proto::Error::RESOURCE_EXHAUSTED,
                            "the job needs " + MiB(bytes) + " of shared memory (" + std::to_string(spec.config.prefetch) +
                                " slots) but only " + MiB(config_.memory_budget_bytes - bytes_in_use_) + " of the daemon's memory_budget of " +
                                MiB(config_.memory_budget_bytes) + " is free");
      return out;
    }
    bytes_in_use_ += bytes;
    ++jobs_per_uid_[peer.uid];
    ++live_jobs_;
  }
  auto lease = std::make_unique<Lease>(this, peer.uid, bytes);
  spec.job_id = next_job_id_.fetch_add(1);
  auto job = ImageJob::Start(std::move(spec), executor_, std::move(lease), std::move(notify));
  if (!job.ok()) {
    out.error = MakeError(CodeFor(job.status()), "starting the job: " + job.status().message());
    return out;
  }
  out.job = std::move(job).value();
  return out;
}

}  // namespace spdl::jobs
