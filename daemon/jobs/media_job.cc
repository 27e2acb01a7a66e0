#include "jobs/media_job.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "io/sampler.h"
#include "jobs/decoded_cache.h"
#include "jobs/job_region.h"
#include "jobs/resume_token.h"
#include "media/mix.h"
#include "media/sample_random.h"
#include "proto/framing.h"

namespace spdl::jobs {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

io::SamplerOptions SamplerFor(const MediaJobSpec& spec) {
  io::SamplerOptions o;
  o.seed = spec.config.sampler.seed;
  o.shuffle = spec.config.sampler.shuffle;
  o.rank = spec.rank;
  o.world_size = spec.world_size;
  o.uneven = spec.config.sampler.uneven == config::Uneven::kDrop ? io::Uneven::kDrop : io::Uneven::kPad;
  return o;
}

// The decoder's tensors, then the label, then per extra output its bytes and its length.
std::vector<RowTensor> TensorsOf(const MediaJobSpec& spec) {
  std::vector<RowTensor> t = spec.decoder->tensors();
  if (spec.config.mix.enabled()) {  // ---- mix: soft targets ----
    const int k = spec.config.mix.num_classes;
    t.push_back({"label", proto::FLOAT32, {k}, static_cast<uint64_t>(k) * sizeof(float)});
  } else {
    t.push_back({"label", proto::INT64, {}, sizeof(int64_t)});
  }
  for (const config::ExtraOutputConfig& e : spec.config.extra_outputs) {
    t.push_back({e.name, proto::UINT8, {e.max_bytes}, static_cast<uint64_t>(e.max_bytes)});
    t.push_back({e.name + "_length", proto::INT32, {}, sizeof(int32_t)});
  }
  // ---- targets that follow the image (boxes, mask) ----
  const TargetWriter targets(spec.config);
  for (const RowTensor& r : targets.tensors()) t.push_back(r);
  return t;
}

}  // namespace

proto::SlotLayout MediaJob::LayoutFor(const MediaJobSpec& spec) {
  const uint64_t b = static_cast<uint64_t>(spec.config.batch.size);
  std::vector<uint64_t> bytes;
  for (const RowTensor& t : TensorsOf(spec)) bytes.push_back(b * t.row_bytes);
  return proto::ComputeSlotLayout(bytes, static_cast<uint32_t>(spec.config.prefetch));
}

MediaJob::MediaJob(MediaJobSpec spec, shm::SharedRegion region, proto::SlotLayout layout,
                   std::unique_ptr<BudgetLease> budget)
    : budget_(std::move(budget)),
      spec_(std::move(spec)),
      region_(std::move(region)),
      layout_(std::move(layout)),
      tensors_(TensorsOf(spec_)),
      label_tensor_(spec_.decoder->tensors().size()),
      targets_(spec_.config),
      targets_tensor_(tensors_.size() - targets_.tensors().size()),
      started_(Clock::now()),
      ring_(
          layout_.num_slots, std::min(layout_.num_slots, kInitialSlots),
          [this](uint32_t slot) {
            // A slot the ring grows into is reserved first (the first slots' pages come as their
            // first batch is written, and go back when it is released): a shortage keeps the ring
            // as it is.
            Status s = region_.Reserve(layout_.SlotOffset(slot), layout_.slot_stride);
            if (!s.ok()) {
              spdlog::warn("job {}: the slot ring stays at {} slots: {}", spec_.job_id, slot, s.message());
              return false;
            }
            spdlog::info("job {}: slot ring grows to {} of {} slots (the client waited for data)", spec_.job_id,
                         slot + 1, layout_.num_slots);
            return true;
          },
          [this](uint32_t slot) {
            // A released slot that waits behind another free one (the ring calls this only then,
            // or when the client left): its pages go back now and return row by row as its next
            // batch is written (README "Slot ring").
            if (discard_failed_ || filling_done_.load(std::memory_order_acquire)) return;
            if (Status s = region_.Discard(layout_.SlotOffset(slot), layout_.slot_stride); !s.ok()) {
              discard_failed_ = true;
              spdlog::warn("job {}: released slots keep their memory: {}", spec_.job_id, s.message());
            }
          }),
      epoch_started_(started_) {}

MediaJob::~MediaJob() {
  spdlog::info("job {}: closed after {} batches, {} samples", spec_.job_id, delivered_batches_, delivered_samples_);
}

Result<std::shared_ptr<MediaJob>> MediaJob::Start(MediaJobSpec spec, pipeline::Executor* executor,
                                                  std::unique_ptr<BudgetLease> budget, std::function<void()> notify,
                                                  pipeline::Executor* io_executor) {
  const bool gpu_decode =
      spec.config.media == config::Media::kImage && spec.config.decode.device == config::DecodeDevice::kCuda;
  if (gpu_decode && !spec.gpu_decode) {
    // Never decode on the CPU while the config says cuda.
    return FailedPrecondition("decode.device: cuda: this job has no GPU decode set up (output.device " +
                              spec.config.output.device + ", copy: daemon is required)");
  }
  if (!gpu_decode) spec.gpu_decode = nullptr;
  proto::SlotLayout layout = LayoutFor(spec);
  // No slot is reserved up front: the ring reserves each slot's memory on its first use.
  SPDL_ASSIGN_OR_RETURN(shm::SharedRegion region, CreateJobRegion(spec.job_id, layout, layout.slots_offset));

  auto job = std::make_shared<MediaJob>(std::move(spec), std::move(region), layout, std::move(budget));
  const auto& s = job->spec_;
  const io::SamplerOptions sampler = SamplerFor(s);
  const uint64_t n = s.source->size();
  const uint64_t per_rank = s.mix ? io::MixSamplesPerRank(*s.mix, sampler) : io::SamplesPerRank(n, sampler);
  if (s.mix) job->source_samples_.assign(s.mix->components.size(), 0);
  const uint32_t b = static_cast<uint32_t>(s.config.batch.size);
  if (s.gpu_decode) job->gpu_rows_.assign(layout.num_slots, std::vector<GpuRow>(b));

  proto::JobAccepted& a = job->accepted_;
  a.set_job_id(s.job_id);
  a.set_batches_per_epoch(io::BatchesPerEpoch(per_rank, b, s.config.batch.drop_last));
  a.set_samples_per_epoch(per_rank);
  a.set_dataset_size(n);
  for (std::string& c : s.source->ClassNames()) a.add_classes(std::move(c));
  DescribeSlots(layout, job->tensors_, b, &a);
  pipeline::PipelineOptions popts;
  popts.batch_size = b;
  popts.drop_last = s.config.batch.drop_last;
  popts.epochs = s.epochs;
  popts.fail_on_error = s.config.on_error == config::OnError::kFail;
  popts.resume = s.resume;
  popts.max_failures_count = s.config.max_failures.count;
  popts.max_failures_fraction = s.config.max_failures.fraction;
  popts.max_failures_warmup = static_cast<uint64_t>(s.config.max_failures_warmup);
  popts.weight = s.config.weight;
  // The config has checked the ranges (concurrency 0..1024, queue 0..65536): both fit uint32_t.
  auto stage = [](const config::StageConfig& c) {
    return pipeline::StageOptions{static_cast<uint32_t>(c.concurrency), static_cast<uint32_t>(c.queue)};
  };
  popts.stages = {stage(s.config.stages.read), stage(s.config.stages.decode)};
  // An HTTP (or S3) read holds its I/O thread while the server answers: one job's HTTP reads take at most
  // half the I/O pool (whatever stages.read.concurrency asks), so a slow server never stalls the
  // reads of every other job.
  bool remote = s.config.source.type == config::SourceType::kHttp || s.config.source.UsesS3();
  for (const config::WeightedSource& w : s.config.sources) {
    remote = remote || w.source.type == config::SourceType::kHttp || w.source.UsesS3();
  }
  if (remote) {
    const int io_threads = (io_executor ? io_executor : executor)->Parallelism();
    const auto cap = static_cast<uint32_t>(std::max(1, io_threads / 2));
    uint32_t& c = popts.stages[0].concurrency;
    c = c == 0 ? cap : std::min(c, cap);
  }
  popts.log_name = "job " + std::to_string(s.job_id);
  popts.completion_order = s.config.order == config::Order::kCompletion;
  // Random-access sources: a seeded global permutation. Tar shards: shuffled shards through a
  // bounded shuffle buffer, a contiguous run per rank. Either is a pure function of the epoch, so
  // a resume point (positions in this order) is exact.
  // A mix: the seeded weighted draw over the sources' own orders (io/mixed_source.h).
  pipeline::EpochOrderFn order;
  if (s.mix) {
    order = [plan = s.mix, sampler](uint64_t epoch) { return io::MixedEpochOrder(*plan, sampler, epoch); };
  } else if (std::vector<uint64_t> shards = s.source->ShardSizes(); !shards.empty()) {
    const auto buffer = static_cast<uint64_t>(s.config.source.shuffle_buffer);
    order = [shards = std::move(shards), buffer, sampler](uint64_t epoch) {
      return io::ShardedEpochOrder(shards, buffer, sampler, epoch);
    };
  } else {
    order = [n, sampler](uint64_t epoch) { return io::EpochOrder(n, sampler, epoch); };
  }
  job->pipeline_ =
      std::make_unique<pipeline::BatchPipeline>(executor, io_executor ? io_executor : executor, &job->ring_, job.get(),
                                                std::move(order), popts, std::move(notify), std::weak_ptr<void>(job));
  spdlog::info("job {}: started for uid {} pid {}: {}, rank {}/{}, {} batches/epoch of {}, {} slots ({} MiB)", s.job_id,
               s.owner.uid, s.owner.pid, s.source->Describe(), s.rank, s.world_size, a.batches_per_epoch(), b,
               layout.num_slots, layout.region_bytes >> 20);
  job->pipeline_->Pump();
  return job;
}

Status MediaJob::RunStage(uint32_t stage, pipeline::RowTask& t) {
#if SPDL_TEST_HOOKS
  if (spec_.stage_hook) spec_.stage_hook(stage, t.index);
#endif
  const io::SampleRef& sample = spec_.source->sample(t.index);
  if (stage == 0) {
    // read: the sample's bytes into the row's buffer, its sidecars straight into their rows.
    if (spec_.decoded) {
      // A decoded-cache hit, or the encoded file of a miss (shrunk and cached by the decode stage).
      bool hit = false;
      SPDL_RETURN_IF_ERROR(spec_.decoded->ReadCachedOrEncoded(t.index, &t.bytes, &hit));
      t.mark = hit ? 0 : kMarkShrink;
    } else {
      SPDL_RETURN_IF_ERROR(spec_.source->Read(t.index, &t.bytes));
    }
    return ReadExtraOutputs(t);
  }
  if (t.mark == kMarkShrink) spec_.decoded->ShrinkAndCache(t.index, &t.bytes);
  // decode: straight into the row of each of the decoder's tensors.
  uint8_t* base = region_.data() + layout_.SlotOffset(t.slot);
  const size_t n = label_tensor_;  // the decoder's tensors come first
  std::vector<uint8_t*> rows(n);
  for (size_t i = 0; i < n; ++i) rows[i] = base + layout_.tensor_offsets[i] + t.row * tensors_[i].row_bytes;
  // Random crops and starts draw from (job seed, epoch, sample index): never from thread timing,
  // so a rerun or a resumed job delivers the same values.
  const uint64_t seed = spec_.decoder->random() ? media::SampleSeed(spec_.config.sampler.seed, t.epoch, t.index) : 0;
  const std::span<const uint8_t> bytes(t.bytes.data(), t.bytes.size());
  if (spec_.gpu_decode) {
    // ---- decode.device: cuda: the batch stage decodes the whole batch on the GPU ----
    GpuRow& g = gpu_rows_[t.slot][t.row];
    g.bytes = std::move(t.bytes);
    g.index = t.index;
    g.seed = seed;
  } else if (!targets_.empty() && spec_.decoder->image_ops() != nullptr) {
    // ---- targets: the decoder reports its geometry, the boxes / mask follow it ----
    media::ImageInfo info;
    Status s = spec_.decoder->DecodeImage(bytes, seed, rows, &info);
    if (!s.ok()) return s.WithPrefix(sample.path);
    const size_t k = targets_.tensors().size();
    std::vector<uint8_t*> target_rows(k);
    for (size_t i = 0; i < k; ++i) {
      const size_t ti = targets_tensor_ + i;
      target_rows[i] = base + layout_.tensor_offsets[ti] + t.row * tensors_[ti].row_bytes;
    }
    s = targets_.Write(*spec_.source, t.index, *spec_.decoder->image_ops(), info, target_rows);
    if (!s.ok()) return s.WithPrefix(sample.path);
  } else {
    Status s = spec_.decoder->Decode(bytes, seed, rows);
    if (!s.ok()) return s.WithPrefix(sample.path);
  }
  if (spec_.config.mix.enabled()) {  // ---- mix: the smoothed one-hot, mixed when the batch is whole ----
    const config::MixConfig& mix = spec_.config.mix;
    if (sample.label < 0 || sample.label >= mix.num_classes) {
      return InvalidArgument(sample.path + ": label " + std::to_string(sample.label) + " is outside mix.num_classes " +
                             std::to_string(mix.num_classes) + " (mix needs a class label per sample)");
    }
    auto* row = reinterpret_cast<float*>(base + layout_.tensor_offsets[n] + t.row * tensors_[n].row_bytes);
    media::SmoothedOneHot(sample.label, mix.num_classes, mix.label_smoothing, row);
    return Status::Ok();
  }
  reinterpret_cast<int64_t*>(base + layout_.tensor_offsets[n])[t.row] = sample.label;
  return Status::Ok();
}

Status MediaJob::ReadExtraOutputs(const pipeline::RowTask& t) const {
  const auto& extras = spec_.config.extra_outputs;
  if (extras.empty()) return Status::Ok();
  thread_local std::vector<uint8_t> bytes;  // reused between samples on this I/O thread
  uint8_t* base = region_.data() + layout_.SlotOffset(t.slot);
  for (size_t j = 0; j < extras.size(); ++j) {
    const config::ExtraOutputConfig& e = extras[j];
    const size_t data_tensor = label_tensor_ + 1 + 2 * j;
    const auto max = static_cast<size_t>(e.max_bytes);
    uint8_t* row = base + layout_.tensor_offsets[data_tensor] + t.row * max;
    Status s = spec_.source->ReadSidecar(t.index, e.from, &bytes);
    if (!s.ok()) {
      if (s.code() != StatusCode::kNotFound || e.on_missing != config::ExtraOutputConfig::OnMissing::kEmpty) {
        return Status(s.code(),
                      "extra output '" + e.name + "' (" + e.from + "): " + s.message() +
                          (s.code() == StatusCode::kNotFound ? " (on_missing: empty gives an empty row)" : ""));
      }
      bytes.clear();
    }
    if (bytes.size() > max) {
      if (e.on_overflow != config::ExtraOutputConfig::OnOverflow::kTruncate) {
        return ResourceExhausted("sample " + spec_.source->sample(t.index).path + ": extra output '" + e.name +
                                 "': its " + e.from + " sidecar has " + std::to_string(bytes.size()) +
                                 " bytes, more than max_bytes " + std::to_string(max) +
                                 " (on_overflow: truncate keeps the first " + std::to_string(max) + ")");
      }
      bytes.resize(max);
    }
    if (!bytes.empty()) std::memcpy(row, bytes.data(), bytes.size());
    std::memset(row + bytes.size(), 0, max - bytes.size());
    const auto length = static_cast<int32_t>(bytes.size());
    std::memcpy(base + layout_.tensor_offsets[data_tensor + 1] + t.row * sizeof(int32_t), &length, sizeof(length));
  }
  return Status::Ok();
}

void MediaJob::MoveRow(uint32_t slot, uint32_t from, uint32_t to) {
  uint8_t* base = region_.data() + layout_.SlotOffset(slot);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    uint8_t* t = base + layout_.tensor_offsets[i];
    const uint64_t row = tensors_[i].row_bytes;
    std::memcpy(t + to * row, t + from * row, row);
  }
  if (spec_.gpu_decode) gpu_rows_[slot][to] = std::move(gpu_rows_[slot][from]);
}

Status MediaJob::BatchStage(uint32_t slot, uint32_t rows, std::vector<BatchRowFailure>* failed) {
  if (!spec_.gpu_decode) return Status::Ok();
  std::vector<GpuRow>& g = gpu_rows_[slot];
  // alive[k]: the batch row (as given) now at row k. A pass that fails some rows packs the rest to
  // the front and decodes them again into their new rows (rare: a file the CPU cannot decode either).
  std::vector<uint32_t> alive(rows);
  for (uint32_t r = 0; r < rows; ++r) alive[r] = r;
  Status result;
  while (!alive.empty()) {
    std::vector<std::span<const uint8_t>> jpegs;
    std::vector<uint64_t> seeds;
    for (size_t k = 0; k < alive.size(); ++k) {
      jpegs.emplace_back(g[k].bytes.data(), g[k].bytes.size());
      seeds.push_back(g[k].seed);
    }
    auto st = spec_.gpu_decode->DecodeBatch(slot, jpegs, seeds);
    if (!st.ok()) {
      result = st.status().WithPrefix("GPU decode");
      break;
    }
    std::vector<uint32_t> kept;
    uint32_t write = 0;
    for (uint32_t k = 0; k < alive.size(); ++k) {
      if (!(*st)[k].ok()) {
        failed->push_back({alive[k], (*st)[k].WithPrefix(spec_.source->sample(g[k].index).path)});
        continue;
      }
      if (k != write) MoveRow(slot, k, write);
      kept.push_back(alive[k]);
      ++write;
    }
    if (kept.size() == alive.size()) break;
    alive = std::move(kept);
  }
  for (GpuRow& r : g) r.bytes = {};  // the device has run the batch: the files' bytes may go
  return result;
}

void MediaJob::BatchWritten(uint32_t slot, uint32_t epoch, uint64_t batch_in_epoch, uint32_t rows) {
  const config::JobConfig& c = spec_.config;
  if (!c.mix.enabled() || rows == 0) return;
  media::MixOptions o;
  o.mixup_alpha = c.mix.mixup_alpha;
  o.cutmix_alpha = c.mix.cutmix_alpha;
  o.switch_prob = c.mix.switch_prob;
  o.prob = c.mix.prob;
  // Its own stream of (seed, epoch, batch index): never a sample's (a batch index is not a sample's).
  media::SampleRng rng(media::SampleSeed(c.sampler.seed ^ 0x6d69782d62617463ull, epoch, batch_in_epoch),
                       media::RandomStream::kResizedCrop);
  const media::MixDraw draw = media::DrawMix(o, c.out_width, c.out_height, rng);
  if (!draw.mixed) return;
  media::ImageOps ops;  // only the layout of the image rows matters here
  switch (c.output.dtype) {
    case config::DType::kUInt8:
      ops.dtype = media::OutputDType::kUInt8;
      break;
    case config::DType::kFloat32:
      ops.dtype = media::OutputDType::kFloat32;
      break;
    case config::DType::kFloat16:
      ops.dtype = media::OutputDType::kFloat16;
      break;
    case config::DType::kBFloat16:
      ops.dtype = media::OutputDType::kBFloat16;
      break;
  }
  ops.layout = c.output.layout == config::Layout::kNCHW ? media::OutputLayout::kNCHW : media::OutputLayout::kNHWC;
  ops.channels = c.decode.color == config::ColorMode::kGray ? 1 : 3;
  uint8_t* base = region_.data() + layout_.SlotOffset(slot);
  media::MixImages(draw, ops, c.out_width, c.out_height, base + layout_.tensor_offsets[0], rows);
  media::MixLabels(draw.lam, c.mix.num_classes, reinterpret_cast<float*>(base + layout_.tensor_offsets[label_tensor_]),
                   rows);
}

std::optional<Delivery> MediaJob::TakeNext() {
  const uint32_t active = ring_.active_slots();
  auto lease =
      spec_.config.order == config::Order::kCompletion
          ? ring_.TakeFirstReady([this](uint32_t slot, uint64_t seq) { return pipeline_->ClaimForDelivery(slot, seq); })
          : ring_.TakeNextReady();
  if (!lease) return std::nullopt;
  // The client now holds every slot in use, so the ring grew (shm/slot_ring.h): fill the new one.
  if (ring_.active_slots() != active) pipeline_->Pump();
  pipeline::SlotMeta m = pipeline_->TakeMeta(lease->slot);
  Delivery d;
  proto::BatchReady& b = d.batch;
  b.set_slot(lease->slot);
  b.set_generation(lease->generation);
  b.set_seq(m.seq);
  b.set_epoch(m.epoch);
  b.set_batch_in_epoch(m.batch_in_epoch);
  b.set_rows(m.rows);
  // In completion order there is no exact point to resume from: no token (the client's state stays empty).
  if (spec_.config.order != config::Order::kCompletion) {
    b.set_resume_token(EncodeResumeToken(m.resume, spec_.fingerprint));
  }
  for (uint64_t idx : m.indices) {
    const io::SampleRef& s = spec_.source->sample(idx);
    b.add_paths(s.path);
    b.add_labels(s.label);
    if (spec_.mix) ++source_samples_[io::MixSourceOf(*spec_.mix, idx)];
  }
  if (delivered_batches_ == 0) first_batch_seconds_ = SecondsSince(started_);
  ++delivered_batches_;
  delivered_samples_ += m.rows;
  epoch_samples_ += m.rows;
  if (m.last_in_epoch) {
    proto::EpochEnd e;
    e.set_epoch(m.epoch);
    e.set_samples(epoch_samples_);
    epoch_samples_ = 0;
    e.set_batches(m.batch_in_epoch + 1);
    e.set_skipped(pipeline_->EpochSkipped(m.epoch));
    e.set_seconds(SecondsSince(epoch_started_));
    epoch_started_ = Clock::now();
    d.epoch_end = e;
  }
  if (m.last_in_job) {
    filling_done_.store(true, std::memory_order_release);
    proto::JobEnd end;
    *end.mutable_stats() = Stats();
    d.job_end = end;
    spdlog::info("job {}: all {} epochs delivered: {} batches, {} samples, {} skipped, {:.2f} s", spec_.job_id,
                 spec_.epochs, delivered_batches_, delivered_samples_, pipeline_->TotalSkipped(),
                 SecondsSince(started_));
  }
  return d;
}

Status MediaJob::Release(uint32_t slot, uint64_t generation) {
  SPDL_RETURN_IF_ERROR(ring_.Release(slot, generation));
  pipeline_->Pump();
  return Status::Ok();
}

void MediaJob::Cancel() {
  filling_done_.store(true, std::memory_order_release);
  if (spec_.gpu_decode) spec_.gpu_decode->Cancel();  // a batch waiting for its device slot gives up
  pipeline_->Cancel();
}

proto::JobStats MediaJob::Stats() const {
  proto::JobStats st;
  const double seconds = SecondsSince(started_);
  st.set_samples(delivered_samples_);
  st.set_batches(delivered_batches_);
  st.set_skipped(pipeline_->TotalSkipped());
  st.set_seconds(seconds);
  st.set_first_batch_seconds(first_batch_seconds_ < 0 ? 0 : first_batch_seconds_);
  const shm::SlotRing::Counts counts = ring_.counts();
  st.set_batches_ready(counts.ready);
  st.set_batches_filling(counts.filling);
  st.set_weight(static_cast<uint32_t>(spec_.config.weight));
  st.set_samples_per_s(seconds > 0 ? static_cast<double>(delivered_samples_) / seconds : 0);
  const pipeline::PipelineStats ps = pipeline_->Stats();
  st.set_window_samples_per_s(ps.window_samples_per_second);
  st.set_samples_failed(ps.samples_failed);
  st.set_samples_tried(ps.samples_tried);
  for (uint64_t n : source_samples_) st.add_source_samples(n);
  if (spec_.gpu_decode) spec_.gpu_decode->FillStats(&st);
  for (size_t i = 0; i < ps.stages.size(); ++i) {
    FillStageStats(ps.stages[i], ps.window[i], seconds, ps.window_seconds, st.add_stages());
  }
  return st;
}

}  // namespace spdl::jobs
