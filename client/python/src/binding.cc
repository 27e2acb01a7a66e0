// spdl_client._spdl_client: the pybind11 layer over the C++ client library
// (client/include/spdl/client.h). The Python-facing API (Loader, Batch, SpdlError) is in
// spdl_client/_loader.py; this module gives it three things:
//
//  - Core: one client::Loader. Open() and Next() run with the GIL released, so other Python threads
//    run while a trainer waits for data. A mutex serializes Next()/End() from several threads (the
//    C++ Loader is not thread-safe); Close() never waits for a Next() in progress (it refuses).
//  - Lease: one leased slot (owns the client::Batch). Shared by every Tensor of the batch and by
//    every DLPack export of them; the last reference gone gives the slot back to the daemon. It holds
//    no Python object, so that last reference may drop on any thread, with or without the GIL (torch
//    and numpy call DLPack deleters wherever their tensors die).
//  - GPU jobs (output.device: cuda:N, when built with SPDL_PY_GPU): the Loader is handed to a
//    client::GpuLoader (client/cuda/include/spdl/cuda/gpu_loader.h); its batches' tensors are
//    device memory: __dlpack_device__ is (kDLCUDA, ordinal) and __dlpack__(stream=S) makes the
//    consumer's stream S wait (on the GPU) for the batch's copy, and records the consumer-done event
//    on S when the batch is released.
//  - Tensor: a zero-copy view of one tensor of a batch: __dlpack__ / __dlpack_device__ (kDLCPU),
//    shape, dtype, and __array__ (through DLPack, so numpy's array holds the lease too).
//    Tensor.release_() drops the Tensor's own reference: afterwards it can export nothing, while
//    views exported before keep the slot (and so their memory) until they die.
//
// Errors become spdl_client.SpdlError(message, code) with the client library's StatusCode name.
#include <Python.h>
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "proto/job_stats_fields.h"
#include "spdl/client.h"
#if SPDL_PY_GPU
#include "spdl/cuda/gpu_loader.h"
#if SPDL_HAVE_CUDA
#include "spdl/cuda/cuda_device.h"
#endif
#endif

namespace py = pybind11;

namespace spdl::python {
namespace {

// ---- errors ----

// Raises spdl_client.SpdlError(message, code). The class lives in spdl_client/_errors.py so that
// Python code can subclass and document it; it is looked up on first use (the import is cached).
[[noreturn]] void ThrowError(const std::string& message, const char* code) {
  const bool timeout = std::string(code) == "DEADLINE_EXCEEDED";
  py::object cls = py::module_::import("spdl_client._errors").attr(timeout ? "SpdlTimeoutError" : "SpdlError");
  py::object exc = cls(message, code);
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

[[noreturn]] void ThrowStatus(const Status& s) { ThrowError(s.message(), StatusCodeName(s.code())); }

[[noreturn]] void ThrowBufferError(const std::string& message) {
  PyErr_SetString(PyExc_BufferError, message.c_str());
  throw py::error_already_set();
}

// ---- leases ----

// Live leases of one Loader: shared with its leases so that it may outlive the Loader.
using HeldCounter = std::shared_ptr<std::atomic<int64_t>>;

// One leased slot. Destroying it releases the slot (client::Batch's destructor sends Release;
// a no-op once the connection is closed). Safe to destroy on any thread, without the GIL.
class Lease {
 public:
  Lease(client::Batch batch, HeldCounter held) : batch_(std::move(batch)), held_(std::move(held)) {
    held_->fetch_add(1);
  }
#if SPDL_PY_GPU
  // A GPU batch: its tensors are device memory.
  Lease(client::GpuBatch gpu, HeldCounter held) : gpu_(std::move(gpu)), is_gpu_(true), held_(std::move(held)) {
    held_->fetch_add(1);
  }
#endif
  ~Lease() {
#if SPDL_PY_GPU
    gpu_.Release();  // consumer-done first, then the host slot
#endif
    batch_.Release();
    held_->fetch_sub(1);
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  // The host batch (metadata; for a CPU job also the data).
  const client::Batch& batch() const {
#if SPDL_PY_GPU
    if (is_gpu_) return gpu_.host();
#endif
    return batch_;
  }
  const std::vector<client::TensorView>& tensors() const {
#if SPDL_PY_GPU
    if (is_gpu_) return gpu_.tensors();
#endif
    return batch_.tensors();
  }
  bool gpu() const { return is_gpu_; }
  int device() const {
#if SPDL_PY_GPU
    if (is_gpu_) return gpu_.device();
#endif
    return 0;
  }
  // GPU batches: makes `stream` wait for the data (and records consumer-done there at release).
  Status WaitOn(void* stream) {
#if SPDL_PY_GPU
    if (is_gpu_) return gpu_.WaitOn(cuda::Stream{stream});
#endif
    (void)stream;
    return Status::Ok();
  }

 private:
  client::Batch batch_;
#if SPDL_PY_GPU
  client::GpuBatch gpu_;
#endif
  bool is_gpu_ = false;
  HeldCounter held_;
};

// ---- DLPack ----

DLDataType ToDLDataType(client::DType d) {
  switch (d) {
    case client::DType::kUInt8:
      return {kDLUInt, 8, 1};
    case client::DType::kInt16:
      return {kDLInt, 16, 1};
    case client::DType::kInt32:
      return {kDLInt, 32, 1};
    case client::DType::kInt64:
      return {kDLInt, 64, 1};
    case client::DType::kFloat16:
      return {kDLFloat, 16, 1};
    case client::DType::kBFloat16:
      return {kDLBfloat, 16, 1};
    case client::DType::kFloat32:
      return {kDLFloat, 32, 1};
  }
  return {kDLUInt, 8, 1};
}

// What one exported DLManagedTensor owns: its shape and strides, and a reference to the lease.
struct Export {
  DLManagedTensor managed{.dl_tensor = {.device = {kDLCPU, 0}}};  // filled in by the export
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  std::shared_ptr<Lease> lease;
};

// The consumer's (or the capsule's) way to say it is done. Any thread; no GIL needed.
void DeleteExport(DLManagedTensor* self) { delete static_cast<Export*>(self->manager_ctx); }

// Runs when the capsule dies. A consumer that took the tensor renamed the capsule "used_dltensor"
// and now owns it; an unconsumed capsule still owns its tensor and deletes it here.
void CapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "used_dltensor")) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (managed == nullptr) {
    PyErr_WriteUnraisable(capsule);
  } else if (managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
}

// ---- Tensor ----

class Tensor {
 public:
  Tensor(std::shared_ptr<Lease> lease, size_t index)
      : lease_(std::move(lease)), view_(lease_->tensors().at(index)), gpu_(lease_->gpu()), device_(lease_->device()) {}
  Tensor(Tensor&& other) noexcept
      : lease_(other.lease()), view_(std::move(other.view_)), gpu_(other.gpu_), device_(other.device_) {}

  const std::string& name() const { return view_.name; }
  std::string dtype() const { return client::DTypeName(view_.dtype); }
  py::tuple shape() const { return py::tuple(py::cast(view_.shape)); }
  size_t nbytes() const { return view_.bytes; }
  size_t itemsize() const { return client::DTypeSize(view_.dtype); }
  size_t ndim() const { return view_.shape.size(); }
  uintptr_t data_ptr() const { return reinterpret_cast<uintptr_t>(view_.data); }
  bool released() const { return lease() == nullptr; }

  // Drops this Tensor's reference to the slot; views exported before keep theirs.
  void Release() {
    std::shared_ptr<Lease> dropped;  // destroyed (maybe releasing the slot) outside the lock
    std::lock_guard<std::mutex> lock(*mu_);
    dropped.swap(lease_);
  }

  py::tuple DLPackDevice() const {
    if (gpu_) return py::make_tuple(static_cast<int>(kDLCUDA), device_);
    return py::make_tuple(static_cast<int>(kDLCPU), 0);
  }

  // The DLPack protocol (array API standard). `stream` must be None (or -1) for CPU data.
  // `max_version`: only unversioned ("dltensor") capsules are made, which the standard allows a
  // producer to return whatever the consumer's maximum. `dl_device` must be CPU or None; `copy=True`
  // is refused (these tensors are views; copy the consumer's tensor instead).
  py::object DLPack(const py::object& stream, const py::object& max_version, const py::object& dl_device,
                    const py::object& copy) const {
    (void)max_version;
    if (gpu_) {
      if (!dl_device.is_none()) {
        auto dev = dl_device.cast<std::pair<int, int>>();
        if (dev.first != kDLCUDA || dev.second != device_) {
          ThrowBufferError("spdl_client GPU tensors are on cuda:" + std::to_string(device_) +
                           "; cannot export to another device");
        }
      }
    } else {
      if (!stream.is_none() && !(py::isinstance<py::int_>(stream) && stream.cast<int64_t>() == -1)) {
        ThrowBufferError("spdl_client tensors are CPU memory: __dlpack__(stream=...) must be None");
      }
      if (!dl_device.is_none()) {
        auto dev = dl_device.cast<std::pair<int, int>>();
        if (dev.first != kDLCPU)
          ThrowBufferError("spdl_client tensors are CPU memory; cannot export to another device");
      }
    }
    if (!copy.is_none() && copy.cast<bool>()) {
      ThrowBufferError("spdl_client tensors are zero-copy views; __dlpack__(copy=True) is not supported");
    }
    const std::shared_ptr<Lease> lease = this->lease();
    if (!lease) {
      ThrowError("tensor '" + view_.name + "' belongs to a released batch: export it before release()",
                 "FAILED_PRECONDITION");
    }
    if (gpu_) {
      // The DLPack stream protocol: None = the legacy default stream, -1 = the consumer syncs itself,
      // else the consumer's cudaStream_t (1 = legacy default, 2 = per-thread default). The stream
      // waits on the GPU for the batch's copy; consumer-done is recorded at release on the last
      // stream exported to, after the work of every earlier one (joined: client::GpuBatch::WaitOn).
      int64_t s = 1;
      if (!stream.is_none()) s = stream.cast<int64_t>();
      if (s == 0) ThrowBufferError("__dlpack__(stream=0) is ambiguous for CUDA: pass 1 for the legacy default stream");
      if (s == 2) {
        // cudaStreamPerThread names the calling thread's stream: consumer-done would be recorded on
        // whichever thread runs the last deleter, not where the consumer's work runs.
        ThrowBufferError(
            "__dlpack__(stream=2) (the per-thread default stream) is not supported: pass the stream's own "
            "handle (e.g. torch.cuda.current_stream().cuda_stream) or 1 for the legacy default stream");
      }
      if (s != -1) {
        void* cu = reinterpret_cast<void*>(static_cast<intptr_t>(s));  // NOLINT(performance-no-int-to-ptr): a stream
        Status st = lease->WaitOn(s == 1 ? nullptr : cu);
        if (!st.ok()) ThrowStatus(st);
      }
    }
    auto ex = std::make_unique<Export>();
    ex->shape = view_.shape;
    ex->strides.assign(view_.shape.size(), 1);
    for (size_t i = view_.shape.size(); i-- > 1;) ex->strides[i - 1] = ex->strides[i] * view_.shape[i];
    ex->lease = lease;
    DLTensor& t = ex->managed.dl_tensor;
    t.data = view_.data;
    t.device = gpu_ ? DLDevice{kDLCUDA, device_} : DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int32_t>(ex->shape.size());
    t.dtype = ToDLDataType(view_.dtype);
    t.shape = ex->shape.data();
    t.strides = ex->strides.data();
    t.byte_offset = 0;
    ex->managed.manager_ctx = ex.get();
    ex->managed.deleter = DeleteExport;
    PyObject* capsule = PyCapsule_New(&ex->managed, "dltensor", CapsuleDestructor);
    if (capsule == nullptr) throw py::error_already_set();
    (void)ex.release();  // owned by the capsule now
    return py::reinterpret_steal<py::object>(capsule);
  }

  std::string Repr() const {
    std::string s = "<spdl_client.Tensor '" + view_.name + "' " + dtype() + " [";
    for (size_t i = 0; i < view_.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(view_.shape[i]);
    return s + "]" + (released() ? " released" : "") + ">";
  }

 private:
  std::shared_ptr<Lease> lease() const {
    std::lock_guard<std::mutex> lock(*mu_);
    return lease_;
  }

  // Guards lease_: Release() and exports may race on a free-threaded Python (no GIL).
  std::unique_ptr<std::mutex> mu_ = std::make_unique<std::mutex>();
  std::shared_ptr<Lease> lease_;  // null once released
  client::TensorView view_;       // a copy: the metadata outlives release
  bool gpu_ = false;              // device memory (a cuda job)
  int device_ = 0;                // its CUDA ordinal in this process
};

// ---- conversions ----

py::dict EpochEndDict(const client::EpochEnd& e) {
  py::dict d;
  d["epoch"] = e.epoch;
  d["samples"] = e.samples;
  d["batches"] = e.batches;
  d["skipped"] = e.skipped;
  d["seconds"] = e.seconds;
  return d;
}

// `values` into `d` by name: counts as int, the rest as float.
void AddNamedValues(const std::vector<client::NamedStatValue>& values, py::dict* d) {
  for (const auto& v : values) {
    if (v.integer) {
      (*d)[py::str(v.name)] = static_cast<uint64_t>(v.value);
    } else {
      (*d)[py::str(v.name)] = v.value;
    }
  }
}

py::dict JobStatsDict(const client::JobStats& s) {
  py::dict d;
  d["samples"] = s.samples;
  d["batches"] = s.batches;
  d["skipped"] = s.skipped;
  d["seconds"] = s.seconds;
  d["first_batch_seconds"] = s.first_batch_seconds;
  py::list stages;
  for (const auto& st : s.stages) {
    py::dict sd;  // name, kind, then every stage figure described for clients, by name
    sd["name"] = st.name;
    sd["kind"] = st.kind;
    AddNamedValues(st.values, &sd);
    stages.append(sd);
  }
  d["stages"] = stages;
  d["client_wait_seconds"] = s.client_wait_seconds;
  py::dict cache;
  cache["hits"] = s.cache_hits;
  cache["misses"] = s.cache_misses;
  cache["evictions"] = s.cache_evictions;
  cache["bytes"] = s.cache_bytes;
  cache["budget_bytes"] = s.cache_budget_bytes;
  d["cache"] = cache;
  // Every figure the daemon describes for clients, by name (proto/job_stats_fields.h).
  py::dict values;
  AddNamedValues(s.values, &values);
  d["values"] = values;
  return d;
}

py::dict JobInfoDict(const client::JobInfo& info) {
  py::dict d;
  d["job_id"] = info.job_id;
  d["batch_size"] = info.batch_size;
  d["batches_per_epoch"] = info.batches_per_epoch;
  d["samples_per_epoch"] = info.samples_per_epoch;
  d["dataset_size"] = info.dataset_size;
  d["num_slots"] = info.num_slots;
  d["classes"] = py::cast(info.classes);
  py::list layout;
  for (const auto& t : info.layout) {
    py::dict td;
    td["name"] = t.name;
    td["dtype"] = client::DTypeName(t.dtype);
    td["shape"] = py::tuple(py::cast(t.shape));
    td["bytes"] = t.bytes;
    layout.append(td);
  }
  d["layout"] = layout;
  return d;
}

// ---- waits: Ctrl-C and timeouts ----

// What the client library's wait hook (Options::on_wait) checks while a call waits for the daemon
// without the GIL: Python's pending signals (Ctrl-C runs the SIGINT handler, which raises
// KeyboardInterrupt) and the call's deadline. Used by one waiting thread at a time (Core::mu_).
struct WaitState {
  using Clock = std::chrono::steady_clock;
  Clock::time_point deadline = Clock::time_point::max();
  bool timed_out = false;
  bool signalled = false;  // the Python error is set (in this thread's state) for the caller to raise

  // A Python timeout (None, or seconds >= 0). REQUIRES: the GIL.
  static std::optional<double> Seconds(const py::object& timeout_s) {
    if (timeout_s.is_none()) return std::nullopt;
    const double t = timeout_s.cast<double>();
    if (!(t >= 0)) throw py::value_error("timeout must be None or a number of seconds >= 0");
    return std::min(t, 1e9);
  }

  // Starts a wait of `seconds` (nullopt: no limit).
  void Start(std::optional<double> seconds) {
    timed_out = signalled = false;
    deadline = Clock::time_point::max();
    if (seconds)
      deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*seconds));
  }

  // Options::on_wait: runs without the GIL on the waiting thread.
  Status Check() {
    if (!IsFinalizing()) {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {  // only the main thread runs handlers; elsewhere always 0
        signalled = true;
        return Cancelled("interrupted by a signal");
      }
    }
    if (Clock::now() >= deadline) {
      timed_out = true;
      return Cancelled("timed out");
    }
    return Status::Ok();
  }

  static bool IsFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing() != 0;
#else
    return _Py_IsFinalizing() != 0;
#endif
  }
};

// ---- Core ----

class Core {
 public:
  static std::unique_ptr<Core> Open(std::string socket, std::string config_yaml, std::string config_name,
                                    std::vector<std::pair<std::string, std::string>> overrides, uint32_t rank,
                                    uint32_t world_size, uint32_t epochs, std::string client_name,
                                    const py::bytes& resume_token, uint32_t start_epoch, const py::object& timeout,
                                    const py::bytes& device_uuid) {
    auto wait = std::make_shared<WaitState>();
    wait->Start(WaitState::Seconds(timeout));
    client::Options o;
    o.on_wait = [wait] { return wait->Check(); };
    o.start_epoch = start_epoch;
    o.resume_token = std::string(resume_token);
    o.device_uuid = std::string(device_uuid);  // the trainer's GPU (copy: daemon), or empty
    o.socket_path = std::move(socket);
    o.config_yaml = std::move(config_yaml);
    o.config_name = std::move(config_name);
    o.overrides = std::move(overrides);
    o.rank = rank;
    o.world_size = world_size;
    o.epochs = epochs;
    o.client_name = std::move(client_name);
#if SPDL_PY_GPU
    o.accept_device_job = true;  // a cuda job goes to the GPU layer below
#endif
    std::optional<Result<std::unique_ptr<client::Loader>>> r;
    {
      py::gil_scoped_release nogil;
      r.emplace(client::Loader::Open(o));
    }
    if (wait->signalled) throw py::error_already_set();  // KeyboardInterrupt (the job was dropped)
    if (wait->timed_out) {
      ThrowError("spdld did not accept the job within " + py::str(timeout).cast<std::string>() + " s",
                 "DEADLINE_EXCEEDED");
    }
    if (!r->ok()) ThrowStatus(r->status());
    std::unique_ptr<client::Loader> loader = std::move(**r);
    const std::string device = loader->device();
#if SPDL_PY_GPU
    if (device.rfind("cuda", 0) == 0) {
      client::GpuOptions g;  // the legacy default stream; the daemon's GPU (copy: daemon) or cuda:N
#if SPDL_HAVE_CUDA
      g.open_backend = client::CudaBackendFactory();
#endif
      const client::JobInfo info = loader->info();
      const uintptr_t addr = reinterpret_cast<uintptr_t>(loader->region_data());
      const size_t size = loader->region_size();
      const int fd = loader->region_fd();
      std::optional<Result<std::unique_ptr<client::GpuLoader>>> gr;
      {
        py::gil_scoped_release nogil;
        gr.emplace(client::GpuLoader::Attach(std::move(loader), g));
      }
      if (!gr->ok()) ThrowStatus(gr->status());
      std::unique_ptr<Core> core(new Core(std::move(**gr), info, addr, size, device, wait));
      core->region_fd_ = fd;
      return core;
    }
#endif
    const client::JobInfo info = loader->info();
    const uintptr_t addr = reinterpret_cast<uintptr_t>(loader->region_data());
    const size_t size = loader->region_size();
    const int fd = loader->region_fd();
    std::unique_ptr<Core> core(new Core(std::move(loader), info, addr, size, device.empty() ? "cpu" : device, wait));
    core->region_fd_ = fd;
    return core;
  }

  // The next event as (kind, a, b): ("batch", [Tensor, ...], metadata dict), ("epoch_end", dict,
  // None) or ("stats", dict, None); None when `timeout` seconds (None: no limit) pass first, with
  // nothing lost (call again to keep waiting). Waits with the GIL released; a signal whose handler
  // raises (Ctrl-C: KeyboardInterrupt) ends the wait with that exception within ~50 ms, and the
  // Core stays usable.
  py::object Next(const py::object& timeout) {
    std::optional<Result<client::Event>> ev;
#if SPDL_PY_GPU
    std::optional<Result<client::GpuEvent>> gev;
#endif
    const std::optional<double> seconds = WaitState::Seconds(timeout);
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      wait_->Start(seconds);
#if SPDL_PY_GPU
      if (gpu_ != nullptr) {
        gev.emplace(gpu_->Next());
      } else
#endif
          if (loader_ == nullptr) {
        ev.emplace(FailedPrecondition("the loader is closed"));
      } else {
        ev.emplace(loader_->Next());
      }
    }
    if (wait_->signalled) throw py::error_already_set();
    if (wait_->timed_out) return py::none();
#if SPDL_PY_GPU
    if (gev) {
      if (!gev->ok()) ThrowStatus(gev->status());
      client::GpuEvent& e = **gev;
      if (auto* b = std::get_if<client::GpuBatch>(&e)) {
        return BatchTuple(std::make_shared<Lease>(std::move(*b), held_));
      }
      if (auto* end = std::get_if<client::EpochEnd>(&e))
        return py::make_tuple("epoch_end", EpochEndDict(*end), py::none());
      return py::make_tuple("stats", JobStatsDict(std::get<client::JobStats>(e)), py::none());
    }
#endif
    if (!ev->ok()) ThrowStatus(ev->status());
    client::Event& e = **ev;
    if (auto* b = std::get_if<client::Batch>(&e)) return BatchTuple(std::make_shared<Lease>(std::move(*b), held_));
    if (auto* end = std::get_if<client::EpochEnd>(&e))
      return py::make_tuple("epoch_end", EpochEndDict(*end), py::none());
    return py::make_tuple("stats", JobStatsDict(std::get<client::JobStats>(e)), py::none());
  }

  // The resume token of the last batch returned (empty bytes before the first).
  py::bytes state() {
    std::string token;
    {
      py::gil_scoped_release nogil;  // a thread inside Next() holds mu_ and may want the GIL
      std::lock_guard<std::mutex> lock(mu_);
      const client::Loader* l = loader();
      if (l != nullptr) token = l->state();
    }
    return py::bytes(token);
  }

  // Asks the daemon to end the job early (the next Next() returns the stats or CANCELLED).
  void End() {
    Status s;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
#if SPDL_PY_GPU
      if (gpu_ != nullptr) s = gpu_->End();
#endif
      if (loader_ != nullptr) s = loader_->End();
    }
    if (!s.ok()) ThrowStatus(s);
  }

  // Closes the connection: the daemon ends the job. Batches still alive stay readable (their
  // memory stays mapped) but are no longer protected. A GPU job's tensors still alive share its
  // device side (client::GpuLoader): the job ends now, and the IPC mapping, the device buffers and
  // the connection stay until the last of them dies, so they never point at freed memory.
  // Idempotent.
  void Close() {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      ThrowError("close() while another thread is inside next(): stop iterating first", "FAILED_PRECONDITION");
    }
#if SPDL_PY_GPU
    // A GPU job's teardown waits for the GPU and the daemon: without the GIL, and without mu_ (a
    // thread holding the GIL may be waiting for it).
    std::unique_ptr<client::GpuLoader> gpu = std::move(gpu_);
    lock.unlock();
    if (gpu != nullptr) {
      py::gil_scoped_release nogil;
      gpu.reset();
    }
    lock.lock();
#endif
    loader_.reset();
  }

  bool closed() {
    py::gil_scoped_release nogil;  // as in state()
    std::lock_guard<std::mutex> lock(mu_);
    return loader() == nullptr;
  }

  py::dict info() const { return JobInfoDict(info_); }
  uintptr_t region_address() const { return region_address_; }
  size_t region_size() const { return region_size_; }
  // The region's descriptor (owned by the client library): valid only until close(); dup it at once.
  int region_fd() const { return region_fd_; }
  int64_t held() const { return held_->load(); }
  // "cpu" or "cuda:N" (the job's output.device).
  const std::string& device() const { return device_; }

 private:
  Core(std::unique_ptr<client::Loader> loader, client::JobInfo info, uintptr_t addr, size_t size, std::string device,
       std::shared_ptr<WaitState> wait)
      : loader_(std::move(loader)),
        info_(std::move(info)),
        region_address_(addr),
        region_size_(size),
        device_(std::move(device)),
        wait_(std::move(wait)) {}
#if SPDL_PY_GPU
  Core(std::unique_ptr<client::GpuLoader> gpu, client::JobInfo info, uintptr_t addr, size_t size, std::string device,
       std::shared_ptr<WaitState> wait)
      : gpu_(std::move(gpu)),
        info_(std::move(info)),
        region_address_(addr),
        region_size_(size),
        device_(std::move(device)),
        wait_(std::move(wait)) {}
#endif

  // REQUIRES: mu_ held. The host Loader (of the GPU loader for a cuda job), or null once closed.
  client::Loader* loader() const {
#if SPDL_PY_GPU
    if (gpu_ != nullptr) return &gpu_->loader();
#endif
    return loader_.get();
  }

  py::tuple BatchTuple(const std::shared_ptr<Lease>& lease) {
    const client::Batch& batch = lease->batch();
    py::list tensors;
    for (size_t i = 0; i < lease->tensors().size(); ++i) tensors.append(py::cast(Tensor(lease, i)));
    py::dict meta;
    meta["seq"] = batch.seq();
    meta["epoch"] = batch.epoch();
    meta["batch_in_epoch"] = batch.batch_in_epoch();
    meta["rows"] = batch.rows();
    meta["slot"] = batch.slot();
    meta["paths"] = py::cast(batch.paths());
    meta["labels"] = py::cast(batch.labels());
    if (!batch.offsets().empty()) {  // a stream job's rows
      py::list md;
      for (const std::string& m : batch.metadata()) md.append(py::bytes(m));
      meta["metadata"] = md;
      meta["offsets"] = py::cast(batch.offsets());
    }
    meta["resume_token"] = py::bytes(batch.resume_token());  // the position after this batch
    return py::make_tuple("batch", tensors, meta);
  }

  std::mutex mu_;  // guards loader_ and gpu_ (Next/End/Close may come from different Python threads)
#if SPDL_PY_GPU
  std::unique_ptr<client::GpuLoader> gpu_;  // a cuda job (then loader_ is null)
#endif
  std::unique_ptr<client::Loader> loader_;
  // Constant after construction.
  const client::JobInfo info_;
  const uintptr_t region_address_;
  const size_t region_size_;
  int region_fd_ = -1;  // set once by Open, before the Core is shared
  const std::string device_;
  const std::shared_ptr<WaitState> wait_;  // the client library's wait hook; used under mu_
  const HeldCounter held_ = std::make_shared<std::atomic<int64_t>>(0);
};

// A stream's producer (issue 21; spdl_client.Producer is the Python API). put() releases the GIL
// while it waits for the daemon (a full stream blocks it); a mutex serializes calls from threads.
class ProducerCore {
 public:
  static std::unique_ptr<ProducerCore> Open(const std::string& socket, const std::string& stream, uint64_t max_samples,
                                            uint64_t max_bytes, const std::vector<uint32_t>& allowed_uids,
                                            uint64_t buffer_bytes, const std::string& client_name) {
    client::ProducerOptions o;
    o.socket_path = socket;
    o.stream = stream;
    o.max_samples = max_samples;
    o.max_bytes = max_bytes;
    o.allowed_uids = allowed_uids;
    o.buffer_bytes = buffer_bytes;
    o.client_name = client_name;
    Result<std::unique_ptr<client::Producer>> p = [&] {
      py::gil_scoped_release nogil;
      return client::Producer::Open(o);
    }();
    if (!p.ok()) ThrowStatus(p.status());
    auto core = std::make_unique<ProducerCore>();
    core->producer_ = std::move(p).value();
    return core;
  }

  uint64_t Put(const py::buffer& data, int64_t label, const py::bytes& metadata, bool block, const std::string& key) {
    py::buffer_info b = data.request();
    if (!IsContiguous(b))
      ThrowError("put: the data must be a C-contiguous buffer (bytes, bytearray, numpy)", "INVALID_ARGUMENT");
    const auto size = static_cast<size_t>(b.size * b.itemsize);
    std::string meta = metadata;
    Result<uint64_t> r = [&] {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      if (!producer_) return Result<uint64_t>(FailedPrecondition("the producer is closed"));
      return producer_->Put(b.ptr, size, label, meta, block, key);
    }();
    if (!r.ok()) ThrowStatus(r.status());
    return *r;
  }

  // put_many: every buffer is held (its buffer_info) while the GIL is released.
  std::vector<uint64_t> PutMany(const std::vector<py::buffer>& data, const std::vector<int64_t>& labels,
                                const std::vector<py::bytes>& metadata, const std::vector<std::string>& keys,
                                bool block) {
    std::vector<py::buffer_info> held;
    held.reserve(data.size());
    std::vector<client::Producer::Item> items(data.size());
    for (size_t i = 0; i < data.size(); ++i) {
      held.push_back(data[i].request());
      const py::buffer_info& b = held.back();
      if (!IsContiguous(b)) {
        ThrowError("put_many: item " + std::to_string(i) + ": the data must be a C-contiguous buffer",
                   "INVALID_ARGUMENT");
      }
      items[i].data = b.ptr;
      items[i].size = static_cast<size_t>(b.size * b.itemsize);
      if (i < labels.size()) items[i].label = labels[i];
      if (i < metadata.size()) items[i].metadata = metadata[i];
      if (i < keys.size()) items[i].key = keys[i];
    }
    Result<std::vector<uint64_t>> r = [&] {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      if (!producer_) return Result<std::vector<uint64_t>>(FailedPrecondition("the producer is closed"));
      return producer_->PutMany(items, block);
    }();
    if (!r.ok()) ThrowStatus(r.status());
    return std::move(r).value();
  }

  void Close(bool end_stream) {
    Status s = [&] {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      if (!producer_) return Status::Ok();
      Status st = producer_->Close(end_stream);
      producer_.reset();
      return st;
    }();
    if (!s.ok()) ThrowStatus(s);
  }

  py::dict Info() {
    std::lock_guard<std::mutex> lock(mu_);
    py::dict d;
    if (!producer_) return d;
    const client::ProducerInfo& i = producer_->info();
    d["stream"] = i.stream;
    d["owner_uid"] = i.owner_uid;
    d["max_samples"] = i.max_samples;
    d["max_bytes"] = i.max_bytes;
    d["buffer_bytes"] = i.buffer_bytes;
    return d;
  }

 private:
  static bool IsContiguous(const py::buffer_info& b) {
    py::ssize_t expect = b.itemsize;
    for (size_t i = b.ndim; i-- > 0;) {
      if (b.shape[i] != 1 && b.strides[i] != expect) return false;
      expect *= b.shape[i];
    }
    return true;
  }
  std::mutex mu_;
  std::unique_ptr<client::Producer> producer_;  // guarded by mu_; null once closed
};

}  // namespace
}  // namespace spdl::python

// Py_MOD_GIL_NOT_USED (free-threaded Python): the module keeps no global state, Core serializes its
// calls on its own mutex, leases count atomically and a Tensor guards its lease.
#if PYBIND11_VERSION_HEX >= 0x020D0000
PYBIND11_MODULE(_spdl_client, m, py::mod_gil_not_used()) {
#else
PYBIND11_MODULE(_spdl_client, m) {
#endif
  using spdl::python::Core;
  using spdl::python::Tensor;
  m.doc() = "spdl_client's native part: see spdl_client (the Python API) and client/include/spdl/client.h";
#if SPDL_TEST_HOOKS
  // Test builds only: whether this process's GPU jobs run on the cross-process device made of files
  // (the variable client/cuda/gpu_loader.cc reads); spdl_client then leaves torch's CUDA alone.
  m.def("_gpu_simulated", [] { return std::getenv("SPDL_TEST_FAKE_GPU_DIR") != nullptr; });
#endif

  py::class_<Tensor>(m, "Tensor",
                     "A zero-copy view of one tensor of a batch in the job's shared memory (CPU).\n\n"
                     "Take it with torch.from_dlpack(t) or numpy.from_dlpack(t) (or numpy.asarray(t)):\n"
                     "the result shares the memory and keeps the batch's slot leased until it dies.")
      .def_property_readonly("name", &Tensor::name)
      .def_property_readonly("dtype", &Tensor::dtype, "numpy dtype name: 'uint8', 'int64', ...")
      .def_property_readonly("shape", &Tensor::shape)
      .def_property_readonly("ndim", &Tensor::ndim)
      .def_property_readonly("nbytes", &Tensor::nbytes)
      .def_property_readonly("itemsize", &Tensor::itemsize)
      .def_property_readonly("data_ptr", &Tensor::data_ptr, "address of the first element (in the shared mapping)")
      .def_property_readonly("released", &Tensor::released)
      .def("release_", &Tensor::Release, "drop this Tensor's reference to the slot (Batch.release() calls it)")
      .def("__dlpack_device__", &Tensor::DLPackDevice)
      .def("__dlpack__", &Tensor::DLPack, py::kw_only(), py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(), py::arg("copy") = py::none())
      .def(
          "__array__",
          [](const py::object& self, const py::object& dtype, const py::object& copy) {
            // Through DLPack, so that the array (not this Tensor) holds the slot: release() on the
            // batch can then never free memory under the array.
            py::object a = py::module_::import("numpy").attr("from_dlpack")(self);
            if (!dtype.is_none()) a = a.attr("astype")(dtype, py::arg("copy") = false);
            if (!copy.is_none() && copy.cast<bool>()) a = a.attr("copy")();
            return a;
          },
          py::arg("dtype") = py::none(), py::arg("copy") = py::none(),
          "numpy.asarray(t): a zero-copy, read-only numpy view (a copy when a dtype or copy=True asks)")
      .def("__repr__", &Tensor::Repr);

  py::class_<Core>(m, "Core", "One job on spdld (use spdl_client.Loader)")
      .def_static("open", &Core::Open, py::arg("socket"), py::arg("config_yaml"), py::arg("config_name"),
                  py::arg("overrides"), py::arg("rank"), py::arg("world_size"), py::arg("epochs"),
                  py::arg("client_name"), py::arg("resume_token") = py::bytes(), py::arg("start_epoch") = 0,
                  py::arg("timeout") = py::none(), py::arg("device_uuid") = py::bytes())
      .def("next", &Core::Next, py::arg("timeout") = py::none())
      .def_property_readonly("state", &Core::state)
      .def("end", &Core::End)
      .def("close", &Core::Close)
      .def_property_readonly("closed", &Core::closed)
      .def_property_readonly("info", &Core::info)
      .def_property_readonly("region_address", &Core::region_address)
      .def_property_readonly("region_size", &Core::region_size)
      .def_property_readonly("region_fd", &Core::region_fd, "the region's descriptor, valid until close(): dup it")
      .def_property_readonly("held", &Core::held)
      .def_property_readonly("device", &Core::device, "the job's output.device: 'cpu' or 'cuda:N'");

  py::class_<spdl::python::ProducerCore>(m, "ProducerCore", "A stream's producer (use spdl_client.Producer)")
      .def_static("open", &spdl::python::ProducerCore::Open, py::arg("socket"), py::arg("stream"),
                  py::arg("max_samples") = 0, py::arg("max_bytes") = 0,
                  py::arg("allowed_uids") = std::vector<uint32_t>{}, py::arg("buffer_bytes") = 0,
                  py::arg("client_name") = "")
      .def("put", &spdl::python::ProducerCore::Put, py::arg("data"), py::arg("label") = -1,
           py::arg("metadata") = py::bytes(), py::arg("block") = true, py::arg("key") = "")
      .def("put_many", &spdl::python::ProducerCore::PutMany, py::arg("data"), py::arg("labels"), py::arg("metadata"),
           py::arg("keys"), py::arg("block") = true)
      .def("close", &spdl::python::ProducerCore::Close, py::arg("end_stream") = false)
      .def_property_readonly("info", &spdl::python::ProducerCore::Info);

  m.def(
      "stat_fields",
      [] {
        py::dict tables;
        const std::pair<const char*, std::span<const spdl::proto::JobStatField>> all[] = {
            {"job", spdl::proto::JobStatFields()},
            {"stage", spdl::proto::StageStatFields()},
            {"daemon", spdl::proto::DaemonStatFields()},
            {"job_summary", spdl::proto::JobSummaryFields()},
            {"stream", spdl::proto::StreamStatFields()},
            {"stream_group", spdl::proto::StreamGroupStatFields()},
            {"gpu_device", spdl::proto::GpuDeviceStatFields()}};
        for (const auto& [table, rows] : all) {
          py::list l;
          for (const auto& f : rows) {
            py::list surfaces;
            if (f.surfaces & spdl::proto::kMetrics) surfaces.append("metrics");
            if (f.surfaces & spdl::proto::kSpdlctl) surfaces.append("spdlctl");
            if (f.surfaces & spdl::proto::kClient) surfaces.append("client");
            if (f.surfaces & spdl::proto::kText) surfaces.append("text");
            py::dict r;
            r["name"] = f.name;
            r["metric"] = f.metric;
            r["type"] = f.type;
            r["unit"] = f.unit;
            r["help"] = f.help;
            r["surfaces"] = surfaces;
            r["per"] = f.per == nullptr ? py::object(py::none()) : py::object(py::str(f.per));
            // A row of spdlctl's text: its column header (None: not shown there).
            r["column"] = (f.surfaces & spdl::proto::kText) ? py::object(py::str(spdl::proto::StatColumn(f)))
                                                            : py::object(py::none());
            l.append(r);
          }
          tables[table] = l;
        }
        return tables;
      },
      "the daemon's statistics as described once (proto/job_stats_fields.h): {'job', 'stage', 'daemon', "
      "'job_summary', 'stream', 'stream_group', 'gpu_device'}: rows with name, metric, type, unit, help, surfaces "
      "('metrics', 'spdlctl', 'client', 'text'), per, column");

  m.def(
      "cuda_device_uuid",
      [](int ordinal) -> py::bytes {
#if SPDL_PY_GPU
        spdl::client::GpuOptions g;
#if SPDL_HAVE_CUDA
        g.open_backend = spdl::client::CudaBackendFactory();
#endif
        spdl::Result<spdl::cuda::DeviceUuid> u = [&] {
          py::gil_scoped_release nogil;
          return spdl::client::GpuLoader::DeviceUuid(g, ordinal);
        }();
        if (!u.ok()) spdl::python::ThrowStatus(u.status());
        return py::bytes(reinterpret_cast<const char*>(u->data()), u->size());
#else
        (void)ordinal;
        spdl::python::ThrowError("this spdl_client was built without GPU delivery", "UNAVAILABLE");
        return py::bytes();
#endif
      },
      py::arg("ordinal"),
      "the 16-byte UUID of this process's CUDA device `ordinal` (through the CUDA runtime), sent with a "
      "GPU job so that spdld finds the trainer's GPU whatever CUDA_VISIBLE_DEVICES says");
}
