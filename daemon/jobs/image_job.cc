#include "jobs/image_job.h"

#include <spdlog/spdlog.h>

#include <cstring>

#include "io/sampler.h"
#include "jobs/resume_token.h"
#include "proto/framing.h"

namespace spdl::jobs {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

io::SamplerOptions SamplerFor(const ImageJobSpec& spec) {
  io::SamplerOptions o;
  o.seed = spec.config.sampler.seed;
  o.shuffle = spec.config.sampler.shuffle;
  o.rank = spec.rank;
  o.world_size = spec.world_size;
  o.uneven = spec.config.sampler.uneven == config::Uneven::kDrop ? io::Uneven::kDrop : io::Uneven::kPad;
  return o;
}

uint64_t ImageRowBytes(const ImageJobSpec& spec) {
  return media::OutputImageBytes(spec.ops, spec.config.out_width, spec.config.out_height);
}

proto::DType ImageDType(const media::ImageOps& ops) {
  switch (ops.dtype) {
    case media::OutputDType::kUInt8: return proto::UINT8;
    case media::OutputDType::kFloat32: return proto::FLOAT32;
    case media::OutputDType::kFloat16: return proto::FLOAT16;
    case media::OutputDType::kBFloat16: return proto::BFLOAT16;
  }
  return proto::UINT8;
}

// The random transforms need the sample's epoch.
bool HasRandomOps(const media::ImageOps& ops) { return ops.random_crop() || ops.flip_probability > 0; }

}  // namespace

proto::SlotLayout ImageJob::LayoutFor(const ImageJobSpec& spec) {
  const uint64_t b = static_cast<uint64_t>(spec.config.batch.size);
  return proto::ComputeSlotLayout({b * ImageRowBytes(spec), b * sizeof(int64_t)},
                                  static_cast<uint32_t>(spec.config.prefetch));
}

ImageJob::ImageJob(ImageJobSpec spec, shm::SharedRegion region, proto::SlotLayout layout,
                   std::unique_ptr<BudgetLease> budget)
    : budget_(std::move(budget)),
      spec_(std::move(spec)),
      region_(std::move(region)),
      layout_(std::move(layout)),
      image_row_bytes_(ImageRowBytes(spec_)),
      started_(Clock::now()),
      ring_(layout_.num_slots),
      epoch_started_(started_) {}

ImageJob::~ImageJob() {
  spdlog::info("job {}: closed after {} batches, {} samples", spec_.job_id, delivered_batches_, delivered_samples_);
}

Result<std::shared_ptr<ImageJob>> ImageJob::Start(ImageJobSpec spec, pipeline::Executor* executor,
                                                  std::unique_ptr<BudgetLease> budget,
                                                  std::function<void()> notify) {
  proto::SlotLayout layout = LayoutFor(spec);
  SPDL_ASSIGN_OR_RETURN(shm::SharedRegion region,
                        shm::SharedRegion::Create("spdld-job-" + std::to_string(spec.job_id), layout.region_bytes));
  auto* header = reinterpret_cast<proto::RegionHeader*>(region.data());
  header->magic = proto::kRegionMagic;
  header->protocol_version = proto::kProtocolVersion;
  header->num_slots = layout.num_slots;
  header->slots_offset = layout.slots_offset;
  header->slot_stride = layout.slot_stride;
  header->region_bytes = layout.region_bytes;

  auto job = std::make_shared<ImageJob>(std::move(spec), std::move(region), layout, std::move(budget));
  const auto& s = job->spec_;
  const io::SamplerOptions sampler = SamplerFor(s);
  const uint64_t n = s.source->size();
  const uint64_t per_rank = io::SamplesPerRank(n, sampler);
  const uint32_t b = static_cast<uint32_t>(s.config.batch.size);

  proto::JobAccepted& a = job->accepted_;
  a.set_job_id(s.job_id);
  a.set_num_slots(layout.num_slots);
  a.set_slots_offset(layout.slots_offset);
  a.set_slot_stride(layout.slot_stride);
  a.set_region_bytes(layout.region_bytes);
  a.set_batch_size(b);
  a.set_batches_per_epoch(io::BatchesPerEpoch(per_rank, b, s.config.batch.drop_last));
  a.set_samples_per_epoch(per_rank);
  a.set_dataset_size(n);
  auto* image = a.add_tensors();
  image->set_name("image");
  image->set_dtype(ImageDType(s.ops));
  const int64_t h = s.config.out_height, w = s.config.out_width;
  const std::vector<int64_t> shape = s.ops.layout == media::OutputLayout::kNCHW
                                         ? std::vector<int64_t>{int64_t{b}, 3, h, w}
                                         : std::vector<int64_t>{int64_t{b}, h, w, 3};
  for (int64_t d : shape) image->add_shape(d);
  image->set_offset(layout.tensor_offsets[0]);
  image->set_bytes(uint64_t{b} * job->image_row_bytes_);
  auto* label = a.add_tensors();
  label->set_name("label");
  label->set_dtype(proto::INT64);
  label->add_shape(b);
  label->set_offset(layout.tensor_offsets[1]);
  label->set_bytes(uint64_t{b} * sizeof(int64_t));

  pipeline::PipelineOptions popts;
  popts.batch_size = b;
  popts.drop_last = s.config.batch.drop_last;
  popts.epochs = s.epochs;
  popts.fail_on_error = s.config.on_error == config::OnError::kFail;
  popts.resume = s.resume;
  // Random-access sources: a seeded global permutation. Tar shards: shuffled shards through a
  // bounded shuffle buffer, a contiguous run per rank. Either is a pure function of the epoch, so
  // a resume point (positions in this order) is exact.
  pipeline::EpochOrderFn order;
  if (std::vector<uint64_t> shards = s.source->ShardSizes(); !shards.empty()) {
    const auto buffer = static_cast<uint64_t>(s.config.source.shuffle_buffer);
    order = [shards = std::move(shards), buffer, sampler](uint64_t epoch) {
      return io::ShardedEpochOrder(shards, buffer, sampler, epoch);
    };
  } else {
    order = [n, sampler](uint64_t epoch) { return io::EpochOrder(n, sampler, epoch); };
  }
  job->pipeline_ = std::make_unique<pipeline::BatchPipeline>(executor, &job->ring_, job.get(), std::move(order), popts,
                                                             std::move(notify), std::weak_ptr<void>(job));
  spdlog::info("job {}: started for uid {} pid {}: {}, rank {}/{}, {} batches/epoch of {}, {} slots ({} MiB)",
               s.job_id, s.owner.uid, s.owner.pid, s.source->Describe(), s.rank, s.world_size,
               a.batches_per_epoch(), b, layout.num_slots, layout.region_bytes >> 20);
  job->pipeline_->Pump();
  return job;
}

Status ImageJob::Process(uint64_t index, uint32_t epoch, uint32_t slot, uint32_t row,
                         std::vector<pipeline::StageStats>& stages) {
  // One reusable read buffer and decoder per worker thread (decoders are not thread-safe).
  thread_local std::vector<uint8_t> buffer;
  thread_local media::ImageDecoder decoder;
  const io::SampleRef& sample = spec_.source->sample(index);

  auto t0 = Clock::now();
  Status s = spec_.source->Read(index, &buffer);
  auto t1 = Clock::now();
  stages[0].Record(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count(), s.ok());
  if (!s.ok()) return s;

  uint8_t* base = region_.data() + layout_.SlotOffset(slot);
  uint8_t* dst = base + layout_.tensor_offsets[0] + row * image_row_bytes_;
  // The random transforms draw from (job seed, epoch, sample index): never from thread timing, so
  // a rerun or a resumed job delivers the same pixels.
  const uint64_t seed = HasRandomOps(spec_.ops)
                            ? media::SampleSeed(spec_.config.sampler.seed, epoch, index)
                            : 0;
  s = decoder.DecodeInto(std::span<const uint8_t>(buffer.data(), buffer.size()), spec_.ops, dst,
                         spec_.config.out_width, spec_.config.out_height, seed);
  auto t2 = Clock::now();
  stages[1].Record(std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t1).count(), s.ok());
  if (!s.ok()) return s.WithPrefix(sample.path);
  reinterpret_cast<int64_t*>(base + layout_.tensor_offsets[1])[row] = sample.label;
  return Status::Ok();
}

void ImageJob::MoveRow(uint32_t slot, uint32_t from, uint32_t to) {
  uint8_t* base = region_.data() + layout_.SlotOffset(slot);
  uint8_t* img = base + layout_.tensor_offsets[0];
  std::memcpy(img + to * image_row_bytes_, img + from * image_row_bytes_, image_row_bytes_);
  auto* labels = reinterpret_cast<int64_t*>(base + layout_.tensor_offsets[1]);
  labels[to] = labels[from];
}

std::optional<Delivery> ImageJob::TakeNext() {
  auto lease = ring_.TakeNextReady();
  if (!lease) return std::nullopt;
  pipeline::SlotMeta m = pipeline_->TakeMeta(lease->slot);
  Delivery d;
  proto::BatchReady& b = d.batch;
  b.set_slot(lease->slot);
  b.set_generation(lease->generation);
  b.set_seq(m.seq);
  b.set_epoch(m.epoch);
  b.set_batch_in_epoch(m.batch_in_epoch);
  b.set_rows(m.rows);
  b.set_resume_token(EncodeResumeToken(m.resume, spec_.fingerprint));
  for (uint64_t idx : m.indices) {
    const io::SampleRef& s = spec_.source->sample(idx);
    b.add_paths(s.path);
    b.add_labels(s.label);
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
    proto::JobEnd end;
    *end.mutable_stats() = Stats();
    d.job_end = end;
    spdlog::info("job {}: all {} epochs delivered: {} batches, {} samples, {} skipped, {:.2f} s", spec_.job_id,
                 spec_.epochs, delivered_batches_, delivered_samples_, pipeline_->TotalSkipped(), SecondsSince(started_));
  }
  return d;
}

Status ImageJob::Release(uint32_t slot, uint64_t generation) {
  SPDL_RETURN_IF_ERROR(ring_.Release(slot, generation));
  pipeline_->Pump();
  return Status::Ok();
}

void ImageJob::Cancel() { pipeline_->Cancel(); }

proto::JobStats ImageJob::Stats() const {
  proto::JobStats st;
  st.set_samples(delivered_samples_);
  st.set_batches(delivered_batches_);
  st.set_skipped(pipeline_->TotalSkipped());
  st.set_seconds(SecondsSince(started_));
  st.set_first_batch_seconds(first_batch_seconds_ < 0 ? 0 : first_batch_seconds_);
  st.set_batches_ready(ring_.counts().ready);
  for (const auto& snap : pipeline_->StageSnapshots()) {
    auto* sp = st.add_stages();
    sp->set_name(snap.name);
    sp->set_tasks(snap.tasks);
    sp->set_failures(snap.failures);
    sp->set_busy_seconds(snap.busy_seconds);
  }
  return st;
}

}  // namespace spdl::jobs
