#include "spdl/client.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>

#include "common/errno_text.h"
#include "common/unique_fd.h"
#include "proto/control.pb.h"
#include "proto/framing.h"
#include "proto/job_stats_fields.h"
#include "proto/shm_layout.h"
#include "s3_access.h"
#include "spdl/control.h"

namespace spdl::client {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return 1;
    case DType::kInt16:
      return 2;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
      return 2;
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
  }
  return "unknown";
}

namespace {

// The daemon is trusted more than a client is: accept frames well above the daemon's own limit
// (a BatchReady carries one path per row).
constexpr uint32_t kMaxDaemonFrameBytes = 64u << 20;
// Descriptors one recvmsg can take; more are discarded by the kernel (MSG_CTRUNC).
constexpr int kMaxFdsPerRead = 8;
constexpr size_t kReadChunk = 64 * 1024;
// A live daemon answers Hello at once; one that accepted but says nothing is hung.
constexpr int kHelloTimeoutMs = 30'000;

Result<DType> FromProtoDType(int d) {
  switch (d) {
    case proto::UINT8:
      return DType::kUInt8;
    case proto::INT16:
      return DType::kInt16;
    case proto::INT32:
      return DType::kInt32;
    case proto::INT64:
      return DType::kInt64;
    case proto::FLOAT16:
      return DType::kFloat16;
    case proto::BFLOAT16:
      return DType::kBFloat16;
    case proto::FLOAT32:
      return DType::kFloat32;
    default:
      return Internal("protocol error: unknown dtype " + std::to_string(d));
  }
}

std::string FormatConfigError(const proto::ConfigError& e, const std::string& name) {
  std::string s = name;
  if (e.line() > 0) {
    s += ":" + std::to_string(e.line());
    if (e.column() > 0) s += ":" + std::to_string(e.column());
  }
  s += ": ";
  if (!e.path().empty()) s += e.path() + ": ";
  s += e.message();
  return s;
}

// Turns the daemon's Error into a Status carrying its message.
Status FromDaemonError(const proto::Error& e, const std::string& config_name) {
  std::string msg = e.message();
  if (e.config_errors_size() > 0) {
    // The summary line, then one line per problem. Only the message's first line is kept, in case
    // the daemon listed the problems in it too.
    msg = msg.substr(0, msg.find('\n'));
    if (msg.empty()) {
      msg = "invalid job config " + config_name + " (" + std::to_string(e.config_errors_size()) +
            (e.config_errors_size() == 1 ? " error)" : " errors)");
    }
    for (const auto& ce : e.config_errors()) msg += "\n" + FormatConfigError(ce, config_name);
  }
  if (msg.empty()) msg = "spdld refused the request (" + proto::Error::Code_Name(e.code()) + ")";
  switch (e.code()) {
    case proto::Error::VERSION_MISMATCH:
      return FailedPrecondition(msg);
    case proto::Error::BAD_REQUEST:
      return InvalidArgument(msg);
    case proto::Error::INVALID_CONFIG:
      return InvalidArgument(msg);
    case proto::Error::PERMISSION_DENIED:
      return PermissionDenied(msg);
    case proto::Error::RESOURCE_EXHAUSTED:
      return ResourceExhausted(msg);
    case proto::Error::NOT_FOUND:
      return NotFound(msg);
    case proto::Error::JOB_FAILED:
      return DataLoss(msg);
    case proto::Error::SHUTTING_DOWN:
      return Unavailable(msg);
    default:
      return Internal(msg);
  }
}

Status ProtocolError(const std::string& what) { return Internal("protocol error from spdld: " + what); }

Result<UniqueFd> Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty()) return InvalidArgument("no spdld socket path given");
  if (path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("spdld socket path is too long (" + std::to_string(path.size()) + " bytes, at most " +
                           std::to_string(sizeof(addr.sun_path) - 1) + "): " + path);
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoStatus("socket(AF_UNIX)", errno);
  for (;;) {
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) break;
    const int err = errno;
    if (err == EINTR) continue;  // the connect did not happen (AF_UNIX connects synchronously)
    if (err == EISCONN) break;
    const std::string what = "cannot connect to spdld at " + path + ": " + ErrnoText(err);
    switch (err) {
      case ENOENT:
      case ECONNREFUSED:
      case ENOTSOCK:
      case ENOTDIR:
      case EAGAIN:
        return Unavailable(what + " (is the daemon running?)");
      case EACCES:
      case EPERM:
        return PermissionDenied(what + " (is this user allowed to use the socket?)");
      default:
        return Status(ErrnoStatus("", err).code(), what);
    }
  }
  return fd;
}

}  // namespace

namespace detail {

// The control connection and the job's mapping, shared by the Loader and every Batch it handed
// out; it dies with the last of them.
//
// Threads: the read side (Read(), the parser, the fd queue) is used only by the Loader's thread.
// Writes come from any thread (Batch releases) and go through mu_. The socket descriptor is closed
// only by Close(), which the Loader's thread calls under mu_; writers check closed_ under mu_.
class Connection {
 public:
  explicit Connection(UniqueFd sock) : sock_(std::move(sock)), read_fd_(sock_.get()) {}
  ~Connection() {
    if (map_data_ != nullptr && !leak_mapping_) ::munmap(map_data_, map_size_);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Sends one message. kUnavailable once the connection is closed or broken.
  Status Send(const proto::ClientMessage& msg) {
    std::string frame;
    if (!proto::EncodeFrame(msg, &frame)) return Internal("cannot serialize a control message");
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return Unavailable("the connection to spdld is closed");
    if (!write_error_.ok()) return write_error_;
    size_t done = 0;
    while (done < frame.size()) {
      const ssize_t n = ::send(sock_.get(), frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        write_error_ = (err == EPIPE || err == ECONNRESET)
                           ? Unavailable(std::string("spdld closed the connection: ") + ErrnoText(err))
                           : ErrnoStatus("sending to spdld", err);
        return write_error_;
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  // Best effort: a failure is seen by the reader as EOF soon after.
  void SendRelease(uint32_t slot, uint64_t generation) {
    proto::ClientMessage m;
    m.mutable_release()->set_slot(slot);
    m.mutable_release()->set_generation(generation);
    m.mutable_release()->set_client_wait_seconds(wait_seconds.load());
    (void)Send(m);
  }

  // Total time Loader::Next() spent waiting for batches; reported to the daemon with each Release.
  std::atomic<double> wait_seconds{0};

  // Closes the socket: the daemon sees EOF and ends the job. Later sends are no-ops.
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    sock_.reset();
    read_fd_ = -1;
  }

  // The Options::on_wait hook and how often it runs while a Read() waits. REQUIRES: before any Read().
  void SetWaitHook(std::function<Status()> hook, std::chrono::milliseconds poll) {
    on_wait_ = std::move(hook);
    wait_poll_ms_ = static_cast<int>(std::clamp<int64_t>(poll.count(), 1, 60'000));
  }

  // Reads the next whole message. `context` ends the "spdld closed the connection" message.
  // timeout_ms < 0 waits for ever (the daemon's death still ends the wait: EOF). With `interrupted`
  // given, the wait hook runs while waiting; when it returns an error, Read returns it and sets
  // *interrupted (nothing is lost: bytes already read stay in the parser for the next Read).
  Status Read(proto::DaemonMessage* msg, int timeout_ms, const char* context, bool* interrupted = nullptr) {
    using Clock = std::chrono::steady_clock;
    const auto deadline =
        timeout_ms >= 0 ? Clock::now() + std::chrono::milliseconds(timeout_ms) : Clock::time_point::max();
    bool* hook = on_wait_ ? interrupted : nullptr;
    std::string payload;
    for (;;) {
      switch (parser_.Next(&payload)) {
        case proto::FrameParser::Result::kFrame:
          if (!proto::ParseDaemonMessage(payload, msg)) return ProtocolError("a malformed message");
          return Status::Ok();
        case proto::FrameParser::Result::kBad:
          return ProtocolError("a frame of " + std::to_string(parser_.bad_length()) + " bytes, over the limit of " +
                               std::to_string(kMaxDaemonFrameBytes));
        case proto::FrameParser::Result::kNeedMore:
          break;
      }
      if (read_fd_ < 0) return Unavailable("the connection to spdld is closed");
      if (timeout_ms >= 0 || hook != nullptr) SPDL_RETURN_IF_ERROR(WaitReadable(deadline, hook));
      SPDL_RETURN_IF_ERROR(ReadSome(context));
    }
  }

  // Descriptors received before the job was accepted, oldest first. After TakeFd() stops being
  // wanted (StopTakingFds()), any further descriptor is closed on arrival.
  UniqueFd TakeFd() {
    if (fds_.empty()) return UniqueFd();
    UniqueFd fd = std::move(fds_.front());
    fds_.pop_front();
    return fd;
  }
  void StopTakingFds() {
    take_fds_ = false;
    fds_.clear();
  }

  // Maps the job's region. REQUIRES: called once, before any Batch exists.
  Status MapRegion(UniqueFd fd, size_t bytes) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of the job's shared region", errno);
    if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < bytes) {
      return ProtocolError("the shared region is " + std::to_string(st.st_size) + " bytes, smaller than the " +
                           std::to_string(bytes) + " bytes announced");
    }
    // Read-write so a trainer may modify its leased batch in place (the slot is its own until
    // released); read-only when the descriptor does not allow writing. Not pre-faulted: the daemon
    // reserves a slot's pages only when its ring starts using the slot (adaptive prefetch), and
    // pre-faulting here would allocate them all; a slot's pages fault in once, on first read.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED && errno == EACCES) {
      p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.get(), 0);
    }
    if (p == MAP_FAILED) {
      return ErrnoStatus("mapping the job's shared region (" + std::to_string(bytes) + " bytes)", errno);
    }
    map_data_ = p;
    map_size_ = bytes;
    region_fd_ = std::move(fd);  // kept for region_fd(): helper processes of the trainer map it too
    return Status::Ok();
  }

  uint8_t* map_data() const { return static_cast<uint8_t*>(map_data_); }
  // The mapping is never unmapped (it stays registered with the GPU driver: see Loader::LeakRegion).
  // Loader's thread only.
  void LeakMapping() { leak_mapping_ = true; }
  size_t map_size() const { return map_size_; }
  int region_fd() const { return region_fd_.get(); }

 private:
  // Waits until the socket is readable or `deadline` (max(): no deadline) passes. With `hook`, the
  // wait hook runs every wait_poll_ms_ (and after a signal); its error ends the wait (*hook = true).
  Status WaitReadable(std::chrono::steady_clock::time_point deadline, bool* hook) {
    const bool forever = deadline == std::chrono::steady_clock::time_point::max();
    for (;;) {
      int wait_ms = -1;
      if (!forever) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) {
          return Unavailable("spdld accepted the connection but did not answer within " +
                             std::to_string(kHelloTimeoutMs / 1000) + " s (is the daemon hung?)");
        }
        wait_ms = static_cast<int>(std::min<int64_t>(left.count(), std::numeric_limits<int>::max()));
      }
      if (hook != nullptr) wait_ms = wait_ms < 0 ? wait_poll_ms_ : std::min(wait_ms, wait_poll_ms_);
      pollfd pfd{read_fd_, POLLIN, 0};
      const int n = ::poll(&pfd, 1, wait_ms);
      if (n > 0) return Status::Ok();  // readable, hung up or in error: recvmsg tells which
      if (n < 0 && errno != EINTR) return ErrnoStatus("poll on the spdld connection", errno);
      if (hook != nullptr) {  // a slice passed, or a signal came: ask whether to go on
        Status s = on_wait_();
        if (!s.ok()) {
          *hook = true;
          return s;
        }
      }
    }
  }

  Status ReadSome(const char* context) {
    if (buf_.empty()) buf_.resize(kReadChunk);
    alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * kMaxFdsPerRead)];
    iovec iov{buf_.data(), buf_.size()};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    ssize_t n;
    for (;;) {
      mh.msg_control = cbuf;
      mh.msg_controllen = sizeof(cbuf);
      n = ::recvmsg(read_fd_, &mh, MSG_CMSG_CLOEXEC);
      if (n >= 0 || errno != EINTR) break;
    }
    if (n < 0) {
      const int err = errno;
      if (err == ECONNRESET || err == EPIPE) {
        return Unavailable(std::string("spdld closed the connection ") + context + " (" + ErrnoText(err) + ")");
      }
      return ErrnoStatus("reading from spdld", err);
    }
    // Take every descriptor that came along, even on EOF, so none leaks.
    for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c != nullptr; c = CMSG_NXTHDR(&mh, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int raw;
        std::memcpy(&raw, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        UniqueFd fd(raw);
        if (take_fds_) fds_.push_back(std::move(fd));  // else closed here: nobody asked for it
      }
    }
    if (n == 0) return Unavailable(std::string("spdld closed the connection ") + context);
    parser_.Feed(buf_.data(), static_cast<size_t>(n));
    return Status::Ok();
  }

  // Guarded by mu_ (writes; the Loader's thread also reads sock_ through read_fd_ without it: only
  // that thread ever changes it).
  std::mutex mu_;
  UniqueFd sock_;
  bool closed_ = false;
  Status write_error_;

  // Reader side: the Loader's thread only.
  int read_fd_;
  proto::FrameParser parser_{kMaxDaemonFrameBytes};
  std::string buf_;
  std::deque<UniqueFd> fds_;
  bool take_fds_ = true;
  std::function<Status()> on_wait_;  // Options::on_wait
  int wait_poll_ms_ = 50;

  // Constant after MapRegion(); unmapped when the last owner is gone.
  void* map_data_ = nullptr;
  bool leak_mapping_ = false;
  size_t map_size_ = 0;
  UniqueFd region_fd_;  // the region's descriptor (close-on-exec), -1 before MapRegion
};

}  // namespace detail

// ---- Batch ----

Batch::~Batch() { Release(); }

Batch::Batch(Batch&& other) noexcept
    : conn_(std::move(other.conn_)),
      slot_(other.slot_),
      generation_(other.generation_),
      seq_(other.seq_),
      epoch_(other.epoch_),
      batch_in_epoch_(other.batch_in_epoch_),
      rows_(other.rows_),
      paths_(std::move(other.paths_)),
      labels_(std::move(other.labels_)),
      metadata_(std::move(other.metadata_)),
      offsets_(std::move(other.offsets_)),
      resume_token_(std::move(other.resume_token_)),
      tensors_(std::move(other.tensors_)),
      released_(other.released_.exchange(true)) {}

Batch& Batch::operator=(Batch&& other) noexcept {
  if (this != &other) {
    Release();
    conn_ = std::move(other.conn_);
    slot_ = other.slot_;
    generation_ = other.generation_;
    seq_ = other.seq_;
    epoch_ = other.epoch_;
    batch_in_epoch_ = other.batch_in_epoch_;
    rows_ = other.rows_;
    paths_ = std::move(other.paths_);
    labels_ = std::move(other.labels_);
    metadata_ = std::move(other.metadata_);
    offsets_ = std::move(other.offsets_);
    resume_token_ = std::move(other.resume_token_);
    tensors_ = std::move(other.tensors_);
    released_.store(other.released_.exchange(true));
  }
  return *this;
}

const TensorView* Batch::tensor(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void Batch::Release() {
  if (released_.exchange(true)) return;
  if (conn_) conn_->SendRelease(slot_, generation_);
}

bool Batch::released() const { return released_.load(); }

// ---- Loader ----

Loader::Loader(std::shared_ptr<detail::Connection> conn) : conn_(std::move(conn)) {}

Loader::~Loader() { conn_->Close(); }

const void* Loader::region_data() const { return conn_->map_data(); }
double Loader::wait_seconds() const { return conn_->wait_seconds.load(); }
size_t Loader::region_size() const { return conn_->map_size(); }
int Loader::region_fd() const { return conn_->region_fd(); }

Result<std::unique_ptr<Loader>> Loader::Open(const Options& options) {
  const uint32_t world = options.world_size == 0 ? 1 : options.world_size;
  if (options.rank >= world) {
    return InvalidArgument("rank " + std::to_string(options.rank) + " is not below world size " +
                           std::to_string(world));
  }
  SPDL_ASSIGN_OR_RETURN(UniqueFd sock, Connect(options.socket_path));
  auto conn = std::make_shared<detail::Connection>(std::move(sock));
  if (options.on_wait) conn->SetWaitHook(options.on_wait, options.wait_poll);
  std::unique_ptr<Loader> loader(new Loader(std::move(conn)));
  SPDL_RETURN_IF_ERROR(loader->Handshake(options));
  SPDL_RETURN_IF_ERROR(loader->SubmitAndMap(options));
  return loader;
}

namespace {

// Hello / HelloReply with the version check, on a fresh connection.
Status SayHello(detail::Connection& conn, const std::string& client_name, const std::string& config_name) {
  proto::ClientMessage hello;
  hello.mutable_hello()->set_protocol_version(proto::kProtocolVersion);
  hello.mutable_hello()->set_client_name(client_name.empty() ? "spdl-client pid=" + std::to_string(::getpid())
                                                             : client_name);
  SPDL_RETURN_IF_ERROR(conn.Send(hello));

  proto::DaemonMessage reply;
  bool interrupted = false;
  SPDL_RETURN_IF_ERROR(conn.Read(&reply, kHelloTimeoutMs, "during the handshake", &interrupted));
  if (reply.has_error()) return FromDaemonError(reply.error(), config_name);
  if (!reply.has_hello()) return ProtocolError("expected HelloReply, got message #" + std::to_string(reply.msg_case()));
  if (reply.hello().protocol_version() != proto::kProtocolVersion) {
    return FailedPrecondition(
        "protocol version mismatch: this client speaks spdld protocol " + std::to_string(proto::kProtocolVersion) +
        ", the daemon (spdld " + reply.hello().daemon_version() + ") speaks " +
        std::to_string(reply.hello().protocol_version()) + "; use a client from the daemon's release");
  }
  return Status::Ok();
}

}  // namespace

Status Loader::Handshake(const Options& options) { return SayHello(*conn_, options.client_name, options.config_name); }

Result<proto::DaemonMessage> ControlCall(const std::string& socket_path, const proto::ClientMessage& request,
                                         const std::string& client_name) {
  SPDL_ASSIGN_OR_RETURN(UniqueFd sock, Connect(socket_path));
  detail::Connection conn(std::move(sock));
  SPDL_RETURN_IF_ERROR(SayHello(conn, client_name, "<request>"));
  SPDL_RETURN_IF_ERROR(conn.Send(request));
  proto::DaemonMessage reply;
  SPDL_RETURN_IF_ERROR(conn.Read(&reply, kHelloTimeoutMs, "waiting for the answer"));
  if (reply.has_error()) return FromDaemonError(reply.error(), "<request>");
  return reply;
}

Status Loader::SubmitAndMap(const Options& options) {
  proto::ClientMessage submit;
  auto* s = submit.mutable_submit();
  s->set_config_yaml(options.config_yaml);
  s->set_config_name(options.config_name);
  for (const auto& [path, value] : options.overrides) {
    auto* o = s->add_overrides();
    o->set_path(path);
    o->set_value(value);
  }
  s->set_rank(options.rank);
  s->set_world_size(options.world_size == 0 ? 1 : options.world_size);
  s->set_epochs(options.epochs);
  s->set_resume_token(options.resume_token);
  s->set_start_epoch(options.start_epoch);
  if (!options.device_uuid.empty()) s->set_device_uuid(options.device_uuid);
  // The trainer's object-storage access goes with a job that may read s3:// (the daemon keeps it
  // for this job only and never shows it); a job without an s3:// source sends none.
  if (client::JobMayUseS3(options.config_yaml, options.overrides)) client::LoadS3Access(s->mutable_s3());
  if (s->s3().ByteSizeLong() == 0) s->clear_s3();
  SPDL_RETURN_IF_ERROR(conn_->Send(submit));
  config_name_ = options.config_name;

  proto::DaemonMessage reply;
  bool interrupted = false;
  SPDL_RETURN_IF_ERROR(conn_->Read(&reply, -1, "before answering the job submission", &interrupted));
  if (reply.has_error()) return FromDaemonError(reply.error(), options.config_name);
  if (!reply.has_accepted())
    return ProtocolError("expected JobAccepted, got message #" + std::to_string(reply.msg_case()));
  const proto::JobAccepted& a = reply.accepted();
  UniqueFd region_fd = conn_->TakeFd();
  conn_->StopTakingFds();  // closes any extra descriptor
  if (!region_fd) return ProtocolError("JobAccepted came without the shared-memory descriptor");
  device_ = a.device();
  client_copy_ = a.client_copy();
  const bool cuda = a.device().rfind("cuda", 0) == 0;
  if (cuda && !options.accept_device_job) {
    // Closing the connection (this Loader is dropped) ends the job on the daemon, which frees its
    // device side too.
    return FailedPrecondition("the job's output.device is " + a.device() +
                              " (copy: " + (a.client_copy() ? "client" : "daemon") +
                              "), but this Loader delivers batches in host memory only: open GPU jobs with "
                              "spdl::client::GpuLoader (client/cuda) or the Python binding, or use "
                              "output.device: cpu and move the batch to the GPU in the trainer");
  }

  // Check the announced geometry before trusting any offset.
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (a.batch_size() == 0) return ProtocolError("batch_size 0");
  if (a.num_slots() == 0) return ProtocolError("num_slots 0");
  if (a.slot_stride() == 0) return ProtocolError("slot_stride 0");
  if (a.slots_offset() < sizeof(proto::RegionHeader)) return ProtocolError("slots_offset overlaps the header");
  if (a.slot_stride() > (kMax - a.slots_offset()) / a.num_slots() ||
      a.slots_offset() + a.slot_stride() * a.num_slots() > a.region_bytes()) {
    return ProtocolError("the slots do not fit in the region of " + std::to_string(a.region_bytes()) + " bytes");
  }

  info_ = JobInfo{};
  info_.job_id = a.job_id();
  info_.batch_size = a.batch_size();
  info_.batches_per_epoch = a.batches_per_epoch();
  info_.samples_per_epoch = a.samples_per_epoch();
  info_.dataset_size = a.dataset_size();
  info_.num_slots = a.num_slots();
  info_.classes.assign(a.classes().begin(), a.classes().end());
  for (const auto& t : a.tensors()) {
    SPDL_ASSIGN_OR_RETURN(DType dtype, FromProtoDType(t.dtype()));
    const std::string what = "tensor '" + t.name() + "'";
    if (t.shape_size() == 0 || t.shape(0) != static_cast<int64_t>(a.batch_size())) {
      return ProtocolError(what + ": the first dimension is not the batch size");
    }
    uint64_t elems = 1;
    for (int64_t d : t.shape()) {
      if (d < 0 || (d > 0 && elems > kMax / static_cast<uint64_t>(d))) return ProtocolError(what + ": bad shape");
      elems *= static_cast<uint64_t>(d);
    }
    if (elems > kMax / DTypeSize(dtype) || elems * DTypeSize(dtype) != t.bytes()) {
      return ProtocolError(what + ": " + std::to_string(t.bytes()) + " bytes do not match its shape");
    }
    if (t.offset() > a.slot_stride() || t.bytes() > a.slot_stride() - t.offset()) {
      return ProtocolError(what + ": does not fit in a slot");
    }
    TensorView v;
    v.name = t.name();
    v.dtype = dtype;
    v.shape.assign(t.shape().begin(), t.shape().end());
    v.bytes = t.bytes();
    info_.layout.push_back(std::move(v));
    tensor_offsets_.push_back(t.offset());
    row_bytes_.push_back(t.bytes() / a.batch_size());
  }
  slots_offset_ = a.slots_offset();
  slot_stride_ = a.slot_stride();

  SPDL_RETURN_IF_ERROR(conn_->MapRegion(std::move(region_fd), a.region_bytes()));
  proto::RegionHeader h;
  std::memcpy(&h, conn_->map_data(), sizeof(h));
  if (h.magic != proto::kRegionMagic) return ProtocolError("the shared region's header has a bad magic number");
  if (h.protocol_version != proto::kProtocolVersion) {
    return ProtocolError("the shared region's layout version is " + std::to_string(h.protocol_version) + ", expected " +
                         std::to_string(proto::kProtocolVersion));
  }
  if (h.num_slots != a.num_slots() || h.slots_offset != a.slots_offset() || h.slot_stride != a.slot_stride() ||
      h.region_bytes != a.region_bytes()) {
    return ProtocolError("the shared region's header does not match JobAccepted");
  }
  if (cuda && !a.client_copy()) {
    // copy: daemon: the daemon sends CudaHandles once, right after JobAccepted.
    proto::DaemonMessage handles;
    SPDL_RETURN_IF_ERROR(conn_->Read(&handles, kHelloTimeoutMs, "before sending the job's CUDA handles", &interrupted));
    if (handles.has_error()) return FromDaemonError(handles.error(), options.config_name);
    if (!handles.has_cuda_handles()) {
      return ProtocolError("expected CudaHandles after JobAccepted of a " + a.device() + " job, got message #" +
                           std::to_string(handles.msg_case()));
    }
    cuda_handles_ = std::make_unique<proto::CudaHandles>(std::move(*handles.mutable_cuda_handles()));
  }
  return Status::Ok();
}

Status Loader::SendCudaConsumerEvents(const proto::CudaConsumerEvents& events) {
  proto::ClientMessage m;
  *m.mutable_cuda_consumer_events() = events;
  return conn_->Send(m);
}

void Loader::LeakRegion() { conn_->LeakMapping(); }

Status Loader::SendCudaMappingClosed() {
  proto::ClientMessage m;
  m.mutable_cuda_mapping_closed()->set_job_id(info().job_id);
  return conn_->Send(m);
}

Status Loader::Finish(std::chrono::milliseconds timeout) {
  if (finished_ || !sticky_.ok()) return Status::Ok();
  if (!ended_) {
    ended_ = true;
    proto::ClientMessage m;
    m.mutable_end_job();
    if (!conn_->Send(m).ok()) return Status::Ok();  // the connection is gone: so is the job
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Unavailable("spdld did not confirm the end of the job within " + std::to_string(timeout.count()) + " ms");
    }
    proto::DaemonMessage m;
    Status s = conn_->Read(&m, static_cast<int>(left.count()), "while the job was being ended");
    if (!s.ok()) {
      // Closed (the job is over) or timed out (the deadline check above says which).
      if (s.code() == StatusCode::kUnavailable && std::chrono::steady_clock::now() < deadline) {
        sticky_ = Cancelled("the job was ended");
        conn_->Close();
        return Status::Ok();
      }
      continue;
    }
    switch (m.msg_case()) {
      case proto::DaemonMessage::kBatch:
        conn_->SendRelease(m.batch().slot(), m.batch().generation());
        continue;
      case proto::DaemonMessage::kJobEnd:
        finished_ = true;
        return Status::Ok();
      case proto::DaemonMessage::kError:
        sticky_ = FromDaemonError(m.error(), config_name_);
        conn_->Close();
        return Status::Ok();
      default:
        continue;
    }
  }
}

Result<Batch> Loader::MakeBatch(const proto::BatchReady& m) {
  if (m.slot() >= info_.num_slots) return ProtocolError("BatchReady for slot " + std::to_string(m.slot()));
  if (m.rows() > info_.batch_size) return ProtocolError("BatchReady with " + std::to_string(m.rows()) + " rows");
  if ((m.paths_size() != 0 && m.paths_size() != static_cast<int>(m.rows())) ||
      (m.labels_size() != 0 && m.labels_size() != static_cast<int>(m.rows()))) {
    return ProtocolError("BatchReady whose paths or labels do not match its rows");
  }
  Batch b;
  b.conn_ = conn_;
  b.slot_ = m.slot();
  b.generation_ = m.generation();
  b.seq_ = m.seq();
  b.epoch_ = m.epoch();
  b.batch_in_epoch_ = m.batch_in_epoch();
  b.rows_ = m.rows();
  b.paths_.assign(m.paths().begin(), m.paths().end());
  b.labels_.assign(m.labels().begin(), m.labels().end());
  if ((m.metadata_size() != 0 && m.metadata_size() != static_cast<int>(m.rows())) ||
      (m.offsets_size() != 0 && m.offsets_size() != static_cast<int>(m.rows()))) {
    return ProtocolError("BatchReady whose metadata or offsets do not match its rows");
  }
  b.metadata_.assign(m.metadata().begin(), m.metadata().end());
  b.offsets_.assign(m.offsets().begin(), m.offsets().end());
  b.resume_token_ = m.resume_token();
  uint8_t* slot_base = conn_->map_data() + slots_offset_ + uint64_t{m.slot()} * slot_stride_;
  b.tensors_.reserve(info_.layout.size());
  for (size_t i = 0; i < info_.layout.size(); ++i) {
    TensorView v = info_.layout[i];
    v.shape[0] = m.rows();
    v.data = slot_base + tensor_offsets_[i];
    v.bytes = row_bytes_[i] * m.rows();
    b.tensors_.push_back(std::move(v));
  }
  b.released_.store(false);
  return b;
}

Result<Event> Loader::Next() {
  const auto t_enter = std::chrono::steady_clock::now();
  if (!sticky_.ok()) return sticky_;
  if (finished_) return FailedPrecondition("the job has finished (Next() after its JobStats)");
  // Any error is final: close the connection so the daemon stops the job and frees its slots.
  auto fail = [this](Status s) -> Status {
    sticky_ = std::move(s);
    conn_->Close();
    return sticky_;
  };
  for (;;) {
    proto::DaemonMessage m;
    bool interrupted = false;
    Status s = conn_->Read(&m, -1, "in the middle of the job (did the daemon exit?)", &interrupted);
    if (interrupted) {  // the caller's hook: nothing consumed, not sticky
      conn_->wait_seconds.store(conn_->wait_seconds.load() +
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_enter).count());
      return s;
    }
    if (!s.ok()) {
      if (ended_ && s.code() == StatusCode::kUnavailable) {
        s = Cancelled("the job was ended by End() (spdld closed the connection without final stats)");
      }
      return fail(std::move(s));
    }
    switch (m.msg_case()) {
      case proto::DaemonMessage::kBatch: {
        if (ended_) {  // in flight when EndJob went out: nobody wants it
          conn_->SendRelease(m.batch().slot(), m.batch().generation());
          continue;
        }
        Result<Batch> b = MakeBatch(m.batch());
        if (!b.ok()) return fail(b.status());
        state_ = b->resume_token();
        conn_->wait_seconds.store(conn_->wait_seconds.load() +
                                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t_enter).count());
        return Event(std::move(b).value());
      }
      case proto::DaemonMessage::kEpochEnd: {
        if (ended_) continue;
        const auto& e = m.epoch_end();
        return Event(EpochEnd{e.epoch(), e.samples(), e.batches(), e.skipped(), e.seconds()});
      }
      case proto::DaemonMessage::kJobEnd: {
        JobStats stats = JobStatsFromProto(m.job_end().stats());
        finished_ = true;
        return Event(std::move(stats));
      }
      case proto::DaemonMessage::kDraining: {  // not an event: noted, and the job goes on
        draining_ = true;
        drain_reason_ = m.draining().reason();
        drain_deadline_ =
            std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                   std::chrono::duration<double>(m.draining().deadline_seconds()));
        continue;
      }
      case proto::DaemonMessage::kError:
        if (m.error().code() == proto::Error::JOB_FAILED && cuda_handles_ && !client_copy_) {
          // A copy: daemon GPU job failed: the daemon keeps its device memory until this process
          // says its IPC mapping is closed (CudaMappingClosed), which batches still alive (tensors)
          // may read. Closing the connection now would let the daemon free it (or, on a poisoned
          // GPU, exit) under them: the connection stays until the GPU layer's teardown.
          sticky_ = FromDaemonError(m.error(), config_name_);
          return sticky_;
        }
        return fail(FromDaemonError(m.error(), config_name_));
      default:
        return fail(ProtocolError("unexpected message #" + std::to_string(m.msg_case()) + " during the job"));
    }
  }
}

std::string OperatorJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = true;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string OperatorStatusText(const proto::DaemonStatus& s) {
  std::string out = "spdld " + s.daemon_version() + "\n";
  char line[160];
  // Every DaemonStatus figure described for spdlctl's text (proto/job_stats_fields.h), by name.
  for (const auto& f : proto::DaemonStatFields()) {
    if (!(f.surfaces & proto::kText)) continue;
    const double v = proto::DaemonStatValue(s, f);
    char value[48];
    if (proto::StatIsInteger(s, f)) {
      std::snprintf(value, sizeof(value), "%llu", static_cast<unsigned long long>(v));
    } else {
      std::snprintf(value, sizeof(value), "%.1f", v);
    }
    std::string unit = f.unit;
    if (unit == "bytes") {
      char mib[48];
      std::snprintf(mib, sizeof(mib), " (%.1f MiB)", v / (1 << 20));
      unit += mib;
    }
    std::snprintf(line, sizeof(line), "  %-26s %16s %s\n", f.name, value, unit.c_str());
    out += line;
  }
  std::snprintf(line, sizeof(line), "  %-26s %16d jobs (spdlctl jobs)\n", "your_jobs", s.jobs_size());
  out += line;
  // A line per GPU: its figures described for spdlctl's text, by name.
  for (const auto& g : s.gpu_devices()) {
    std::snprintf(line, sizeof(line), "  %-26s", ("gpu " + g.device()).c_str());
    out += line;
    // The figures start in the column the daemon lines' values start in (one space after the name).
    const char* sep = " ";
    for (const auto& f : proto::GpuDeviceStatFields()) {
      if (!(f.surfaces & proto::kText)) continue;
      out += std::string(sep) + f.name + " " + proto::StatText(g, f);
      sep = "  ";
    }
    out += '\n';
  }
  if (s.gpu_leaked_device_bytes() > 0) {
    out += "GPU device memory leaked (copies that never drained): out of the device budget until spdld restarts\n";
  }
  for (const auto& g : s.gpu_devices()) {
    if (!g.poisoned()) continue;
    std::snprintf(line, sizeof(line), "GPU %s POISONED: ", g.device().c_str());
    out += line + g.error();
    std::snprintf(line, sizeof(line),
                  "; %u job(s) still hold it; new GPU jobs on it are refused until spdld restarts\n", g.jobs());
    out += line;
  }
  return out;
}

namespace {

// One column of a text table: its header and a cell per row.
struct TextColumn {
  std::string header;
  std::vector<std::string> cells;
  bool left = false;  // left-aligned (names); numbers are right-aligned
};

// The lines of a table (no newline): the header line, then a line per row; each column as wide as
// its widest cell, columns one space apart. REQUIRES: every column has `rows` cells.
std::vector<std::string> TextTable(const std::vector<TextColumn>& columns, size_t rows) {
  std::vector<std::string> lines(rows + 1);
  for (size_t c = 0; c < columns.size(); ++c) {
    size_t width = columns[c].header.size();
    for (const std::string& cell : columns[c].cells) width = std::max(width, cell.size());
    for (size_t r = 0; r <= rows; ++r) {
      const std::string& cell = r == 0 ? columns[c].header : columns[c].cells[r - 1];
      const std::string pad(width - cell.size(), ' ');
      if (c) lines[r] += ' ';
      lines[r] += columns[c].left ? cell + pad : pad + cell;
    }
  }
  return lines;
}

// A column per kText row of `table`, its cells the row's value on each message `of(i)`, i < rows.
template <typename Of>
void AddTextColumns(std::span<const proto::JobStatField> table, size_t rows, Of of, std::vector<TextColumn>* out) {
  for (const auto& f : table) {
    if (!(f.surfaces & proto::kText)) continue;
    TextColumn c{proto::StatColumn(f), {}, false};
    for (size_t i = 0; i < rows; ++i) c.cells.push_back(proto::StatText(of(i), f));
    out->push_back(std::move(c));
  }
}

}  // namespace

std::string OperatorJobsText(const proto::DaemonStatus& s) {
  constexpr size_t kColumns = 100, kIndent = 8;
  const size_t n = static_cast<size_t>(s.jobs_size());
  std::vector<TextColumn> columns;
  const auto job = [&](size_t i) -> const proto::JobSummary& { return s.jobs(static_cast<int>(i)); };
  AddTextColumns(proto::JobSummaryFields(), n, job, &columns);
  AddTextColumns(
      proto::JobStatFields(), n, [&](size_t i) -> const proto::JobStats& { return job(i).stats(); }, &columns);
  const std::vector<std::string> lines = TextTable(columns, n);
  std::string out = lines[0] + "  SOURCE\n";
  for (size_t i = 0; i < n; ++i) {
    std::string source = job(i).source();
    if (lines[i + 1].size() + 2 + source.size() <= kColumns) {
      out += lines[i + 1] + "  " + source + "\n";
      continue;
    }
    const size_t room = kColumns - kIndent;
    if (source.size() > room) {
      const size_t head = room / 2 - 2;
      source = source.substr(0, head) + "..." + source.substr(source.size() - (room - head - 3));
    }
    out += lines[i + 1] + "\n" + std::string(kIndent, ' ') + source + "\n";
  }
  if (n == 0) out += "no jobs\n";
  return out;
}

std::string OperatorStreamsText(const proto::DaemonStatus& s) {
  if (s.streams().empty()) return "no streams\n";
  const size_t n = static_cast<size_t>(s.streams_size());
  const auto stream = [&](size_t i) -> const proto::StreamStatus& { return s.streams(static_cast<int>(i)); };
  std::vector<TextColumn> columns(1, TextColumn{"STREAM", {}, true});
  for (size_t i = 0; i < n; ++i) columns[0].cells.push_back(stream(i).name());
  AddTextColumns(proto::StreamStatFields(), n, stream, &columns);
  const std::vector<std::string> lines = TextTable(columns, n);
  std::string out = lines[0] + "\n";
  for (size_t i = 0; i < n; ++i) {
    out += lines[i + 1] + "\n";
    for (const auto& g : stream(i).groups()) {  // a line per group: its figures by name
      char head[64];
      std::snprintf(head, sizeof(head), "  group %-16s", g.name().c_str());
      out += head;
      for (const auto& f : proto::StreamGroupStatFields()) {
        if (f.surfaces & proto::kText) out += std::string("  ") + f.name + " " + proto::StatText(g, f);
      }
      out += '\n';
    }
  }
  return out;
}

namespace {

// The typed fields of JobStats and StageStats: views of rows of the stats tables
// (proto/job_stats_fields.h), set by name from the values filled from those rows.
template <typename T>
struct TypedView {
  const char* name;
  uint64_t T::*count = nullptr;  // one of the two (a count: exact below 2^53, as in `values`)
  double T::*real = nullptr;
};
const TypedView<JobStats> kJobViews[] = {
    {"samples", &JobStats::samples},
    {"batches", &JobStats::batches},
    {"skipped", &JobStats::skipped},
    {"seconds", nullptr, &JobStats::seconds},
    {"first_batch_seconds", nullptr, &JobStats::first_batch_seconds},
    {"client_wait_seconds", nullptr, &JobStats::client_wait_seconds},
    {"cache_hits", &JobStats::cache_hits},
    {"cache_misses", &JobStats::cache_misses},
    {"cache_evictions", &JobStats::cache_evictions},
    {"cache_bytes", &JobStats::cache_bytes},
    {"cache_budget_bytes", &JobStats::cache_budget_bytes},
};
const TypedView<StageStats> kStageViews[] = {
    {"tasks", &StageStats::tasks},
    {"failures", &StageStats::failures},
    {"busy_seconds", nullptr, &StageStats::busy_seconds},
    {"avg_ms", nullptr, &StageStats::avg_ms},
    {"p50_ms", nullptr, &StageStats::p50_ms},
    {"p90_ms", nullptr, &StageStats::p90_ms},
    {"p99_ms", nullptr, &StageStats::p99_ms},
    {"put_wait_seconds", nullptr, &StageStats::put_wait_seconds},
    {"get_wait_seconds", nullptr, &StageStats::get_wait_seconds},
    {"items_per_s", nullptr, &StageStats::items_per_s},
};

// Appends every kClient row of `table` on `m` to `values` (a repeated count as NAME.0, NAME.1,
// ...), and sets the typed view of each scalar row `views` has.
template <typename T, size_t N>
void FillByName(const google::protobuf::Message& m, std::span<const proto::JobStatField> table,
                const TypedView<T> (&views)[N], T* out, std::vector<NamedStatValue>* values) {
  for (const auto& f : table) {
    if (!(f.surfaces & proto::kClient)) continue;
    if (f.per != nullptr) {
      const std::vector<double> each = proto::StatValues(m, f);
      for (size_t i = 0; i < each.size(); ++i)
        values->push_back({std::string(f.name) + "." + std::to_string(i), each[i], true});
      continue;
    }
    const double v = proto::StatValue(m, f);
    values->push_back({f.name, v, proto::StatIsInteger(m, f)});
    for (const auto& view : views) {
      if (std::string_view(view.name) != f.name) continue;
      if (view.count != nullptr) out->*view.count = static_cast<uint64_t>(v);
      if (view.real != nullptr) out->*view.real = v;
    }
  }
}

}  // namespace

JobStats JobStatsFromProto(const proto::JobStats& js) {
  JobStats stats;
  FillByName(js, proto::JobStatFields(), kJobViews, &stats, &stats.values);
  for (const auto& st : js.stages()) {
    StageStats s;
    s.name = st.name();
    s.kind = st.kind();
    FillByName(st, proto::StageStatFields(), kStageViews, &s, &s.values);
    stats.stages.push_back(std::move(s));
  }
  stats.source_samples.assign(js.source_samples().begin(), js.source_samples().end());
  return stats;
}

double Loader::drain_seconds_left() const {
  if (!draining_) return 0;
  return std::max(0.0, std::chrono::duration<double>(drain_deadline_ - std::chrono::steady_clock::now()).count());
}

Status Loader::End() {
  if (finished_ || ended_ || !sticky_.ok()) return Status::Ok();
  ended_ = true;
  proto::ClientMessage m;
  m.mutable_end_job();
  return conn_->Send(m);
}

}  // namespace spdl::client

// ---- streams: Producer ----

namespace spdl::client {

Result<std::unique_ptr<Producer>> Producer::Open(const ProducerOptions& options) {
  SPDL_ASSIGN_OR_RETURN(UniqueFd sock, Connect(options.socket_path));
  std::unique_ptr<Producer> p(new Producer());
  p->conn_ = std::make_shared<detail::Connection>(std::move(sock));
  const std::string what = "stream '" + options.stream + "'";
  SPDL_RETURN_IF_ERROR(SayHello(
      *p->conn_, options.client_name.empty() ? "spdl-producer pid=" + std::to_string(::getpid()) : options.client_name,
      what));
  proto::ClientMessage m;
  auto* o = m.mutable_open_producer();
  o->set_stream(options.stream);
  o->set_max_samples(options.max_samples);
  o->set_max_bytes(options.max_bytes);
  for (uint32_t uid : options.allowed_uids) o->add_allowed_uids(uid);
  o->set_buffer_bytes(options.buffer_bytes);
  SPDL_RETURN_IF_ERROR(p->conn_->Send(m));
  proto::DaemonMessage reply;
  SPDL_RETURN_IF_ERROR(p->conn_->Read(&reply, kHelloTimeoutMs, "opening the producer"));
  if (reply.has_error()) return FromDaemonError(reply.error(), what);
  if (!reply.has_producer_opened()) {
    return ProtocolError("expected ProducerOpened, got message #" + std::to_string(reply.msg_case()));
  }
  const proto::ProducerOpened& po = reply.producer_opened();
  UniqueFd fd = p->conn_->TakeFd();
  p->conn_->StopTakingFds();
  if (!fd) return ProtocolError("ProducerOpened came without the put buffer's descriptor");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus("fstat of the put buffer", errno);
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) < po.buffer_bytes() || po.buffer_bytes() == 0) {
    return ProtocolError("the put buffer is " + std::to_string(st.st_size) + " bytes, not the " +
                         std::to_string(po.buffer_bytes()) + " announced");
  }
  void* map = ::mmap(nullptr, po.buffer_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return ErrnoStatus("mapping the put buffer", errno);
  p->buffer_ = static_cast<uint8_t*>(map);
  p->buffer_size_ = po.buffer_bytes();
  p->info_.stream = po.stream();
  p->info_.owner_uid = po.owner_uid();
  p->info_.max_samples = po.max_samples();
  p->info_.max_bytes = po.max_bytes();
  p->info_.buffer_bytes = po.buffer_bytes();
  return p;
}

Producer::~Producer() {
  if (buffer_ != nullptr) ::munmap(buffer_, buffer_size_);
  if (conn_) conn_->Close();
}

namespace {

constexpr size_t kInlinePut = 4096;  // smaller samples ride in the message: no buffer round trip

// A PutDone's result: the offset, or the error it carries (as Put returns it).
Result<uint64_t> PutResult(const proto::DaemonMessage& reply, const std::string& stream) {
  if (reply.has_error()) return FromDaemonError(reply.error(), "stream '" + stream + "'");
  if (!reply.has_put_done()) return ProtocolError("expected PutDone, got message #" + std::to_string(reply.msg_case()));
  const proto::PutDone& d = reply.put_done();
  if (d.has_error() && (d.error().code() != proto::Error::UNKNOWN || !d.error().message().empty())) {
    const std::string& msg = d.error().message();
    switch (d.error().code()) {
      case proto::Error::RESOURCE_EXHAUSTED:
        return ResourceExhausted(msg);
      default:
        if (msg.find("is closed") != std::string::npos) return FailedPrecondition(msg);
        return InvalidArgument(msg);
    }
  }
  return d.offset();
}

}  // namespace

Result<std::vector<uint64_t>> Producer::PutMany(const std::vector<Item>& items, bool block) {
  if (closed_) return FailedPrecondition("the producer of stream '" + info_.stream + "' is closed");
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].size > buffer_size_) {
      return InvalidArgument("item " + std::to_string(i) + ": a sample of " + std::to_string(items[i].size) +
                             " bytes is larger than the put buffer of " + std::to_string(buffer_size_) +
                             " bytes (ProducerOptions::buffer_bytes); nothing was put");
    }
  }
  struct InFlight {
    size_t item;
    bool in_buffer;  // its bytes are in the put buffer (else inline in the message)
  };
  std::deque<InFlight> flight;  // answered in order (the daemon's PutDones follow its puts)
  std::vector<uint64_t> offsets(items.size(), 0);
  size_t next = 0, put = 0;
  Status first_error;
  size_t failed_item = 0;
  // Reads the oldest put's answer.
  auto answer = [&]() -> Status {
    proto::DaemonMessage reply;
    // A blocking put waits as long as the stream stays full (the daemon's death still ends it: EOF).
    SPDL_RETURN_IF_ERROR(conn_->Read(&reply, -1, "waiting for PutDone"));
    const InFlight f = flight.front();
    flight.pop_front();
    Result<uint64_t> r = PutResult(reply, info_.stream);
    if (r.ok()) {
      offsets[f.item] = *r;
      ++put;
      ++puts_;
    } else if (first_error.ok()) {
      first_error = r.status();
      failed_item = f.item;
    }
    if (reply.has_error()) return r.status();  // the session's error: nothing more will come
    return Status::Ok();
  };
  // The put buffer holds one sample at a time: one over kInlinePut waits until the previous one's
  // answer came (the daemon copies the bytes out before it answers); inline ones do not wait.
  auto buffer_busy = [&] {
    for (const InFlight& f : flight) {
      if (f.in_buffer) return true;
    }
    return false;
  };
  while ((next < items.size() && first_error.ok()) || !flight.empty()) {
    if (next < items.size() && first_error.ok() && flight.size() < kPutWindow) {
      const Item& it = items[next];
      const bool in_buffer = it.size > kInlinePut;
      if (!in_buffer || !buffer_busy()) {
        proto::ClientMessage m;
        auto* p = m.mutable_put_sample();
        if (in_buffer) {
          std::memcpy(buffer_, it.data, it.size);  // the daemon copies it out before it answers
          p->set_buffer_length(it.size);
        } else {
          p->set_data(static_cast<const char*>(it.data), it.size);
        }
        const InFlight f{next, in_buffer};
        p->set_label(it.label);
        p->set_metadata(it.metadata);
        p->set_key(it.key);
        p->set_block(block);
        SPDL_RETURN_IF_ERROR(conn_->Send(m));
        flight.push_back(f);
        ++next;
        continue;
      }
    }
    SPDL_RETURN_IF_ERROR(answer());  // the window or the buffer is full, or all is sent: the oldest answer
  }
  if (!first_error.ok()) {
    std::string what = "put_many: item " + std::to_string(failed_item) + " of " + std::to_string(items.size()) +
                       " failed (" + std::to_string(put) + " of the items were put";
    if (next < items.size()) what += "; items " + std::to_string(next) + " on were not sent";
    return first_error.WithPrefix(what + ")");
  }
  return offsets;
}

Result<uint64_t> Producer::Put(const void* data, size_t size, int64_t label, const std::string& metadata, bool block,
                               const std::string& key) {
  if (closed_) return FailedPrecondition("the producer of stream '" + info_.stream + "' is closed");
  if (size > buffer_size_) {
    return InvalidArgument("a sample of " + std::to_string(size) + " bytes is larger than the put buffer of " +
                           std::to_string(buffer_size_) + " bytes (ProducerOptions::buffer_bytes)");
  }
  proto::ClientMessage m;
  auto* put = m.mutable_put_sample();
  if (size <= kInlinePut) {
    put->set_data(static_cast<const char*>(data), size);
  } else {
    std::memcpy(buffer_, data, size);  // the daemon copies it out before it answers
    put->set_buffer_length(size);
  }
  put->set_label(label);
  put->set_metadata(metadata);
  put->set_key(key);
  put->set_block(block);
  SPDL_RETURN_IF_ERROR(conn_->Send(m));
  proto::DaemonMessage reply;
  // A blocking put waits as long as the stream stays full (the daemon's death still ends it: EOF).
  SPDL_RETURN_IF_ERROR(conn_->Read(&reply, -1, "waiting for PutDone"));
  SPDL_ASSIGN_OR_RETURN(uint64_t offset, PutResult(reply, info_.stream));
  ++puts_;
  return offset;
}

Status Producer::Flush() { return Status::Ok(); }

Status Producer::Close(bool end_stream) {
  if (closed_) return Status::Ok();
  closed_ = true;
  proto::ClientMessage m;
  m.mutable_close_producer()->set_end_stream(end_stream);
  SPDL_RETURN_IF_ERROR(conn_->Send(m));
  proto::DaemonMessage reply;
  SPDL_RETURN_IF_ERROR(conn_->Read(&reply, kHelloTimeoutMs, "closing the producer"));
  if (reply.has_error()) return FromDaemonError(reply.error(), "stream '" + info_.stream + "'");
  if (!reply.has_producer_closed()) {
    return ProtocolError("expected ProducerClosed, got message #" + std::to_string(reply.msg_case()));
  }
  conn_->Close();
  return Status::Ok();
}

}  // namespace spdl::client
