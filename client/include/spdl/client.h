// The spdld client library: what a training process links to receive batches from the node's
// spdld daemon.
//
// A Loader opens one job on the daemon (one control connection, one job), maps the job's shared
// slot ring, and hands out events in order: a Batch per filled slot, an EpochEnd after each epoch
// and, last, the job's JobStats. A Batch is a zero-copy view of one slot: its tensors point into the
// shared mapping. Dropping the Batch (or calling Release()) gives the slot back to the daemon; until
// then the daemon cannot refill it, so hold on to batches only as long as you need their memory.
//
//   spdl::client::Options opt;
//   opt.socket_path = "/run/spdld/spdld.sock";
//   opt.config_yaml = <text of job.yaml>;
//   auto loader = spdl::client::Loader::Open(opt);          // Result<std::unique_ptr<Loader>>
//   if (!loader.ok()) { print loader.status(); ... }
//   for (;;) {
//     auto ev = (*loader)->Next();                           // blocks
//     if (!ev.ok()) { error ... }
//     if (auto* b = std::get_if<spdl::client::Batch>(&*ev)) { use b->tensor("image")->data; }
//     else if (std::holds_alternative<spdl::client::JobStats>(*ev)) break;   // job done
//   }
//
// Thread safety: a Loader is used from one thread at a time (it is not internally locked), except
// that Batches may be released or destroyed from any thread, concurrently with Next(). A Batch may
// outlive its Loader: its memory stays mapped until the last Batch is gone (reading it never
// faults), and its release becomes a no-op (the connection is closed, so the daemon takes every
// slot back and stops the job). The bytes of such a Batch are no longer protected: copy what you
// need before destroying the Loader.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"

namespace spdl::proto {
class BatchReady;  // proto/control.proto; the public header needs no protobuf headers
class CudaHandles;
class CudaConsumerEvents;
}  // namespace spdl::proto

namespace spdl::client {

enum class DType { kUInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32 };

// Bytes per element: 1, 2, 4, 8, 2, 2, 4.
size_t DTypeSize(DType dtype);
// "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32".
const char* DTypeName(DType dtype);

// One tensor of a batch, C-contiguous (row-major), batch dimension first.
struct TensorView {
  std::string name;  // "image", "label", ...
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;  // shape[0] = rows of THIS batch (fewer than batch_size only for a
                               // last, partial batch); in JobInfo::layout, the full batch size
  void* data = nullptr;        // into the shared mapping (zero copy); nullptr in JobInfo::layout.
                               // Lives as long as the Batch it came from (or any moved-to Batch).
  size_t bytes = 0;            // bytes of valid data at `data`: rows * bytes per row
};

// What the daemon said about the job when it accepted it. Constant for the job's life.
struct JobInfo {
  uint64_t job_id = 0;
  uint32_t batch_size = 0;
  uint64_t batches_per_epoch = 0;    // for this rank
  uint64_t samples_per_epoch = 0;    // for this rank
  uint64_t dataset_size = 0;         // samples in the whole source
  uint32_t num_slots = 0;            // prefetch depth: batches the daemon can have ready at once
  std::vector<std::string> classes;  // class names by label (an image folder); empty otherwise
  std::vector<TensorView> layout;    // full-batch shapes and bytes; data == nullptr
};

// Sent by the daemon after the last batch of each epoch (figures for this rank).
struct EpochEnd {
  uint32_t epoch = 0;
  uint64_t samples = 0;
  uint64_t batches = 0;
  uint64_t skipped = 0;  // bad samples skipped (by the job's error policy)
  double seconds = 0;    // the epoch's wall time on the daemon
};

// One figure of the daemon's stats by name, as described for clients (proto/job_stats_fields.h).
struct NamedStatValue {
  std::string name;
  double value = 0;
  bool integer = false;  // a count (print without a fraction)
};

// One pipeline stage's totals. `values` holds every stage figure the daemon describes for clients
// (proto/job_stats_fields.h, kClient rows of StageStatFields), by name, in the daemon's order; the
// typed fields are views of some of them (filled from the same values).
struct StageStats {
  std::string name;
  uint64_t tasks = 0;
  uint64_t failures = 0;
  double busy_seconds = 0;
  std::string kind;   // "io" or "cpu"
  double avg_ms = 0;  // task time
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double put_wait_seconds = 0;  // rows done here waited for room in the next stage's queue
  double get_wait_seconds = 0;  // rows waited in this stage's queue
  double items_per_s = 0;       // tasks per second of the job's life
  std::vector<NamedStatValue> values;
};

// The job's totals, sent once when the job is done. As an Event it means "no more events".
struct JobStats {
  uint64_t samples = 0;
  uint64_t batches = 0;
  uint64_t skipped = 0;
  double seconds = 0;              // since the daemon accepted the job
  double first_batch_seconds = 0;  // from acceptance to the first batch being ready (daemon side)
  std::vector<StageStats> stages;
  double client_wait_seconds = 0;  // the client's wait for data, as it last reported it
  // The node-wide sample cache (daemon config cache_bytes; all 0 when it is off).
  uint64_t cache_hits = 0;          // this job's sample reads served from the cache
  uint64_t cache_misses = 0;        // this job's sample reads that went to the file or URL
  uint64_t cache_evictions = 0;     // node-wide: entries evicted so far
  uint64_t cache_bytes = 0;         // node-wide: bytes held now
  uint64_t cache_budget_bytes = 0;  // node-wide: the budget
  // A mix (job config `sources:`): samples delivered per source, in `sources:` order; empty for
  // one source. In `values` as source_samples.0, source_samples.1, ...
  std::vector<uint64_t> source_samples;
  // Every job figure the daemon describes for clients (proto/job_stats_fields.h, kClient rows),
  // by name, in the daemon's order: the fields above (views of these values) and those without a
  // field of their own (samples_tried, samples_failed, samples_per_s, weight, share_members, ...).
  // Python's stats() and spdl-client --json show these.
  using NamedValue = NamedStatValue;
  std::vector<NamedValue> values;
};

namespace detail {
class Connection;  // the socket + the mapping, shared by a Loader and its Batches
}

// One ready batch: a lease on one slot of the job's ring. Move-only. Releasing it (Release(), or
// destroying it) tells the daemon the slot is free again, exactly once. Accessors are safe from any
// thread as long as nobody moves or destroys the Batch meanwhile; Release() may race with other
// Release() calls on the same Batch (exactly one sends).
class Batch {
 public:
  Batch() = default;  // empty: released() == true, no tensors
  ~Batch();           // Release()
  Batch(Batch&& other) noexcept;
  Batch& operator=(Batch&& other) noexcept;  // releases what *this held first
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  uint64_t seq() const { return seq_; }  // batch number since the job started
  uint32_t epoch() const { return epoch_; }
  uint64_t batch_in_epoch() const { return batch_in_epoch_; }
  uint32_t rows() const { return rows_; }  // valid rows
  uint32_t slot() const { return slot_; }  // the ring slot it occupies
  uint64_t generation() const { return generation_; }
  // Per row: the sample's path relative to the source root, and its label (as the daemon sent
  // them: each either empty or `rows()` long).
  const std::vector<std::string>& paths() const { return paths_; }
  const std::vector<int64_t>& labels() const { return labels_; }
  // source.type: stream: per row, the metadata its producer put and the sample's stream offset
  // (empty for other sources).
  const std::vector<std::string>& metadata() const { return metadata_; }
  const std::vector<uint64_t>& offsets() const { return offsets_; }
  // Opaque bytes naming the job's position right after this batch: pass them as
  // Options::resume_token to continue with exactly the samples that follow, in the same order.
  const std::string& resume_token() const { return resume_token_; }
  // The batch's tensors, in the job's layout order. The data stays valid after Release() only as
  // long as this object lives AND the daemon does not refill the slot, i.e. do not read it after
  // Release(); the pointers are never dangling while the Batch exists, though.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const TensorView* tensor(std::string_view name) const;

  // Gives the slot back to the daemon (sends Release{slot, generation}) unless already done.
  // A no-op once the Loader is gone or its connection is broken. Never blocks for long: it takes
  // the connection's write lock and sends a few bytes.
  void Release();
  bool released() const;

 private:
  friend class Loader;

  // Holds the connection (and so the mapping) for as long as the batch lives.
  std::shared_ptr<detail::Connection> conn_;
  uint32_t slot_ = 0;
  uint64_t generation_ = 0;
  uint64_t seq_ = 0;
  uint32_t epoch_ = 0;
  uint64_t batch_in_epoch_ = 0;
  uint32_t rows_ = 0;
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
  std::vector<std::string> metadata_;
  std::vector<uint64_t> offsets_;
  std::string resume_token_;
  std::vector<TensorView> tensors_;
  std::atomic<bool> released_{true};  // exchanged by Release(), so exactly one caller sends
};

struct Options {
  std::string socket_path;               // required: the daemon's control socket
  std::string config_yaml;               // the job config's TEXT
  std::string config_name = "<config>";  // where the text came from, for error messages
  // `--set key.path=value` overrides, applied by the daemon before validation.
  std::vector<std::pair<std::string, std::string>> overrides;
  uint32_t rank = 0;         // 0 <= rank < world_size
  uint32_t world_size = 1;   // 0 is taken as 1
  uint32_t epochs = 1;       // 0 = until End(); a resumed job counts the epochs before the token too
  std::string resume_token;  // from Batch::resume_token() / Loader::state(): continue after that batch
  // Without a resume_token: start at the beginning of this epoch (its samples in the same order as
  // in any other run's epoch `start_epoch`); must be below `epochs` unless that is 0.
  uint32_t start_epoch = 0;
  std::string client_name;  // free text for the daemon's logs; empty = "spdl-client pid=N"

  // ---- waiting ----
  // Called on the waiting thread about every `wait_poll` while Open() or Next() waits for the
  // daemon. A non-OK Status ends the wait and is returned as it is: by Open() (the job is dropped),
  // or by Next() without losing anything (not sticky: the Loader stays usable and the next Next()
  // carries on). For interrupts and deadlines (the Python binding checks Ctrl-C and its read
  // timeout here). Empty: waits are not interrupted.
  std::function<Status()> on_wait;
  std::chrono::milliseconds wait_poll{50};

  // ---- GPU delivery (output.device: cuda:N) ----
  // A Loader delivers host memory only: it refuses a cuda job unless `accept_device_job` is set,
  // which only a GPU layer on top of it does (spdl::client::GpuLoader in client/cuda, the Python
  // binding): that layer then opens the device side through the seam below.
  bool accept_device_job = false;
  // SubmitJob.device_uuid: the 16-byte UUID of the trainer's GPU, its cuda:N (copy: daemon: the
  // daemon delivers on its device with that UUID, or refuses a GPU it does not see). Empty: the
  // daemon's cuda:N.
  std::string device_uuid;
};

// JobStats means the job is done: it is the last event.
using Event = std::variant<Batch, EpochEnd, JobStats>;

// One job on the daemon. Not thread-safe (use from one thread at a time), except that Batches it
// handed out may be released from any thread. Destroying the Loader closes the connection, which
// ends the job on the daemon; Batches still alive stay readable.
class Loader {
 public:
  // Connects, says Hello (a protocol version mismatch returns the daemon's message), submits the
  // job, receives JobAccepted with the region's descriptor, maps it and checks its header (magic,
  // version, sizes) against JobAccepted.
  // Errors:
  //  - no daemon at socket_path -> kUnavailable "cannot connect to spdld at PATH: REASON (is the
  //    daemon running?)"; not allowed to connect -> kPermissionDenied.
  //  - version mismatch -> kFailedPrecondition with the daemon's message.
  //  - a bad config -> kInvalidArgument: the daemon's summary line, then every config error, one
  //    per line, "NAME:LINE:COL: PATH: MESSAGE" (NAME = options.config_name; "NAME: PATH: MESSAGE"
  //    for an error with no YAML position, e.g. from an override).
  //  - other daemon refusals map their code (PERMISSION_DENIED, RESOURCE_EXHAUSTED, NOT_FOUND,
  //    SHUTTING_DOWN -> kUnavailable, ...) and carry the daemon's message.
  //  - a daemon that accepts the connection but does not answer Hello within 30 s -> kUnavailable.
  //  - Options::on_wait returned an error while waiting -> that Status (the connection is closed).
  //  - start_epoch with a resume_token, or at/after `epochs` -> kInvalidArgument (from the daemon).
  static Result<std::unique_ptr<Loader>> Open(const Options& options);

  ~Loader();  // closes the connection (the daemon ends the job and takes every slot back)
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  const JobInfo& info() const { return info_; }

  // Blocks until the next event: a Batch, an EpochEnd, or the final JobStats.
  //  - the daemon went away (EOF, ECONNRESET) -> kUnavailable "spdld closed the connection ...",
  //    as soon as the socket says so (never a hang on a dead daemon).
  //  - the job failed on the daemon (Error JOB_FAILED) -> kDataLoss with the daemon's message;
  //    other Errors map their code as in Open().
  //  - a protocol violation by the daemon -> kInternal.
  //  - Options::on_wait returned an error -> that Status, NOT sticky (nothing was consumed).
  // Other errors are sticky: once Next() has failed, every later call returns the same Status.
  // After the JobStats event every later call returns kFailedPrecondition "the job has finished".
  // After End(): batches still in flight are released at once without being returned, EpochEnds
  // are skipped, and Next() returns the JobStats if the daemon sends them, or kCancelled "the job
  // was ended by End()" if the daemon just closes the connection.
  Result<Event> Next();

  // Asks the daemon to stop the job early (sends EndJob). OK and nothing sent when the job has
  // already finished, failed, or been ended. Returns kUnavailable if the connection is broken.
  Status End();

  // Whether the JobStats event has been returned.
  bool finished() const { return finished_; }
  // The resume token of the last Batch returned by Next() (empty before the first): save it to
  // continue the job later from right after that batch.
  const std::string& state() const { return state_; }
  // Total time Next() has spent waiting for batches: the figure that says whether the trainer starves.
  double wait_seconds() const;
  // Whether the daemon said it is draining (SIGTERM, spdlctl drain): batches keep coming until the
  // job ends or the deadline passes, when the daemon exits and Next() returns kUnavailable. Save
  // state() and resume on the restarted daemon. Seen by Next() (the notice is not an event).
  bool draining() const { return draining_; }
  // Seconds from now until the draining daemon exits (0 when not draining or already past).
  double drain_seconds_left() const;
  // Why the daemon drains ("SIGTERM", "spdlctl drain by uid 0"); empty when not draining.
  const std::string& drain_reason() const { return drain_reason_; }

  // The shared mapping, so tests can check that a tensor's pointer lies inside it.
  const void* region_data() const;
  size_t region_size() const;
  // The shared region's descriptor (close-on-exec, owned by the Loader: valid until it is destroyed),
  // for handing the region to the trainer's own helper processes (send a dup of it, e.g. over
  // SCM_RIGHTS; they map region_size() bytes at offset 0). -1 before the job is accepted.
  int region_fd() const;

  // ---- the GPU seam (for the GPU layer, client/cuda/include/spdl/cuda/gpu_loader.h) ----
  // JobAccepted.device: "cpu" (or empty, an older daemon) or "cuda:N".
  const std::string& device() const { return device_; }
  // JobAccepted.client_copy: a cuda job whose host slots the client copies to its GPU itself.
  bool client_copy() const { return client_copy_; }
  // The job's layout, for the GPU layer: tensor i of a batch lies at slot start + tensor_offset(i).
  uint64_t tensor_offset(size_t i) const { return tensor_offsets_.at(i); }
  uint64_t slots_offset() const { return slots_offset_; }
  uint64_t slot_stride() const { return slot_stride_; }
  // A cuda job with copy: daemon: the CudaHandles the daemon sent once, right after JobAccepted
  // (Open read it). nullptr otherwise.
  const proto::CudaHandles* cuda_handles() const { return cuda_handles_.get(); }
  // Sends the client's per-slot consumer-done events (once, before the first Release).
  Status SendCudaConsumerEvents(const proto::CudaConsumerEvents& events);
  // Tells the daemon this process closed its IPC mapping of the job's device slots (and its handles
  // of the ready events): the daemon may free them now. Until then it keeps them.
  Status SendCudaMappingClosed();
  // The job's shared region is never unmapped, not even when the last Batch goes: for a GPU layer
  // that could not unregister it from the driver (its GPU work never completed). The address range
  // stays reserved for the life of the process.
  void LeakRegion();
  // Ends the job and waits, up to `timeout`, until the daemon confirms (JobStats) or closes the
  // connection; batches still in flight are released unseen. OK at once when the job has already
  // finished or failed. After it the daemon makes no more copies for this job and waits on none of
  // its events, so the GPU layer may destroy them. kUnavailable on timeout.
  Status Finish(std::chrono::milliseconds timeout);

 private:
  explicit Loader(std::shared_ptr<detail::Connection> conn);

  Status Handshake(const Options& options);
  Status SubmitAndMap(const Options& options);
  Result<Batch> MakeBatch(const proto::BatchReady& msg);

  // Constant after Open().
  std::shared_ptr<detail::Connection> conn_;
  std::string config_name_;  // for error messages
  JobInfo info_;
  // Per tensor of info_.layout: offset from a slot's start, and bytes per row.
  std::vector<uint64_t> tensor_offsets_;
  std::vector<uint64_t> row_bytes_;
  uint64_t slots_offset_ = 0;
  uint64_t slot_stride_ = 0;
  std::string device_;  // JobAccepted.device
  bool client_copy_ = false;
  std::unique_ptr<proto::CudaHandles> cuda_handles_;  // copy: daemon jobs only

  // Read state: touched only by the thread calling Open()/Next()/End().
  Status sticky_;          // the first error Next() returned
  bool finished_ = false;  // JobStats was returned
  std::string state_;      // resume token of the last Batch returned
  bool ended_ = false;     // End() sent EndJob
  bool draining_ = false;  // the daemon sent Draining
  std::string drain_reason_;
  std::chrono::steady_clock::time_point drain_deadline_{};
};

// ---- streams (issue 21): a producer of a named, node-local stream ----
//
// A Producer puts samples (encoded media bytes, a label, opaque metadata) into a stream that jobs of
// source.type: stream consume. The bytes of a sample go through a shared buffer the daemon maps (a
// memfd it passes when the producer opens), not through the socket; small samples ride inline.
// Put returns once the daemon has the sample in the stream's retained log (its offset). A full
// stream (max_samples / max_bytes of its definition, or the daemon's memory budget) blocks Put until
// the stream's consumers have acknowledged enough, or fails it with kResourceExhausted when
// block is false: backpressure, nothing dropped. The first producer or stream job naming a stream
// defines it (ProducerOptions' bounds), owned by its uid; others need to be that uid, root, or in
// its allowed_uids (else kPermissionDenied).
//
//   spdl::client::ProducerOptions o;  o.socket_path = "/run/spdld/spdld.sock";  o.stream = "clicks";
//   auto p = spdl::client::Producer::Open(o);
//   auto off = (*p)->Put(bytes.data(), bytes.size(), /*label=*/3, /*metadata=*/"", /*block=*/true);
//   (*p)->Close(/*end_stream=*/true);
//
// Thread safety: one thread at a time (not internally locked).
struct ProducerOptions {
  std::string socket_path = "/run/spdld/spdld.sock";
  std::string stream;                  // the stream's name: [A-Za-z0-9_.-]{1,128}
  uint64_t max_samples = 0;            // when this producer defines the stream: retained samples (0: 100000)
  uint64_t max_bytes = 0;              // likewise retained bytes (0: 256 MiB)
  std::vector<uint32_t> allowed_uids;  // likewise: other uids that may produce and consume
  uint64_t buffer_bytes = 0;           // the shared put buffer, the largest sample (0: 16 MiB, <= 1 GiB)
  std::string client_name;             // for the daemon's log
};

struct ProducerInfo {
  std::string stream;
  uint32_t owner_uid = 0;
  uint64_t max_samples = 0;
  uint64_t max_bytes = 0;
  uint64_t buffer_bytes = 0;
};

class Producer {
 public:
  // Connects, opens the stream (defining it when new) and maps the put buffer.
  static Result<std::unique_ptr<Producer>> Open(const ProducerOptions& options);
  ~Producer();  // closes the connection (the stream stays open; its puts so far stay in it)
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  const ProducerInfo& info() const { return info_; }
  // Puts one sample and returns its stream offset. Errors: kResourceExhausted (full, block false),
  // kInvalidArgument (larger than the buffer or the stream's max_bytes), kFailedPrecondition (the
  // stream was closed), kUnavailable (the daemon went away). `key` names it in logs and
  // BatchReady.paths ("" = none).
  Result<uint64_t> Put(const void* data, size_t size, int64_t label = -1, const std::string& metadata = "",
                       bool block = true, const std::string& key = "");
  // One sample of PutMany. `data` must stay valid until PutMany returns.
  struct Item {
    const void* data = nullptr;
    size_t size = 0;
    int64_t label = -1;
    std::string metadata;
    std::string key;
  };
  // Puts `items` in order, with up to kPutWindow puts in flight, so small samples are not bound by
  // one round trip each (samples up to 4 KiB ride in their message; larger ones go through the put
  // buffer, which holds one at a time: such a put waits for the previous one's answer); returns their
  // offsets (in order) once the daemon holds every one. On the first failed put no more are sent;
  // the error names the item and how many of the items were put (those before it, and any sent
  // after it before its answer came, keep their places in the stream). Errors as Put's.
  Result<std::vector<uint64_t>> PutMany(const std::vector<Item>& items, bool block = true);
  static constexpr size_t kPutWindow = 128;  // the daemon accepts up to 256 puts without answers
  // Every Put and PutMany has returned when it was acknowledged: nothing is buffered on this side.
  // OK unless the connection failed.
  Status Flush();
  // Stops producing; with end_stream the stream is closed too (its jobs drain it and end). Idempotent.
  Status Close(bool end_stream);
  // Samples put by this producer.
  uint64_t puts() const { return puts_; }

 private:
  Producer() = default;
  std::shared_ptr<detail::Connection> conn_;
  ProducerInfo info_;
  uint8_t* buffer_ = nullptr;
  size_t buffer_size_ = 0;
  uint64_t puts_ = 0;
  bool closed_ = false;
};

}  // namespace spdl::client
