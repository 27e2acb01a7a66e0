#include "server/control_server.h"

#include <grp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <vector>

#include "proto/framing.h"
#include "server/session_logic.h"

namespace spdl::server {

namespace asio = boost::asio;

namespace {
// A group name or number -> its gid; kNotFound for an unknown group.
Result<gid_t> GroupId(const std::string& name) {
  unsigned long n = 0;
  auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), n);
  if (ec == std::errc() && ptr == name.data() + name.size()) return static_cast<gid_t>(n);
  std::vector<char> buf(16384);
  struct group g {};
  struct group* found = nullptr;
  if (::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return NotFound("socket_group: no group named '" + name + "'");
  }
  return found->gr_gid;
}
}  // namespace
using boost::system::error_code;
using Socket = asio::local::stream_protocol::socket;

// One connection: reads frames, feeds SessionLogic, writes its output. Owned by the server's set;
// handlers hold a shared_ptr so a closed session lives until its last handler ran.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(ControlServer* server, Socket socket, jobs::PeerInfo peer)
      : server_(server), socket_(std::move(socket)), peer_(peer), parser_(server->options_.max_frame_bytes) {}

  void Start() {
    std::weak_ptr<Session> weak = shared_from_this();
    asio::io_context* io = server_->io_;
    // Called from worker threads, possibly after this session is gone (a job's last tasks keep
    // the job alive): touch only what the lambda owns, coalesce wake-ups, continue on the io thread.
    auto pending = event_pending_;
    logic_ = std::make_unique<SessionLogic>(
        server_->jobs_, peer_,
        [weak, io, pending] {
          if (pending->exchange(true)) return;
          asio::post(*io, [weak, pending] {
            pending->store(false);
            if (auto s = weak.lock()) s->Apply(s->logic_->OnJobEvent());
          });
        },
        &server_->control_);
    spdlog::debug("session pid {} uid {}: connected", peer_.pid, peer_.uid);
    Read();
  }

  bool has_job() const { return !closed_ && logic_ && logic_->has_job(); }
  void OnDrain(const proto::Draining& notice) {
    if (!closed_ && logic_) Apply(logic_->OnDrain(notice));
  }

  // Closes the socket and cancels the job. Idempotent.
  void Close() {
    if (closed_) return;
    closed_ = true;
    if (logic_) logic_->OnDisconnect();
    error_code ec;
    socket_.shutdown(Socket::shutdown_both, ec);
    socket_.close(ec);
    spdlog::debug("session pid {} uid {}: closed", peer_.pid, peer_.uid);
  }

 private:
  struct Pending {
    std::string bytes;
    size_t sent = 0;
    int fd = -1;  // passed with the first byte
  };

  void Read() {
    socket_.async_read_some(asio::buffer(read_buf_), [self = shared_from_this()](error_code ec, size_t n) {
      if (ec) {
        self->Finish();
        return;
      }
      self->parser_.Feed(self->read_buf_, n);
      std::string payload;
      for (;;) {
        auto r = self->parser_.Next(&payload);
        if (r == proto::FrameParser::Result::kNeedMore) break;
        if (r == proto::FrameParser::Result::kBad) {
          self->Apply(self->logic_->OnOversizedFrame(self->parser_.bad_length(), self->server_->options_.max_frame_bytes));
          return;
        }
        self->Apply(self->logic_->OnFrame(payload));
        if (self->closing_ || self->closed_) return;
      }
      self->Read();
    });
  }

  void Apply(Output out) {
    if (closed_) return;
    for (auto& m : out.messages) {
      Pending p;
      if (!proto::EncodeFrame(m.message, &p.bytes)) continue;
      p.fd = m.pass_fd;
      queue_.push_back(std::move(p));
    }
    if (out.close) closing_ = true;
    if (out.prepare) Prepare(std::move(*out.prepare));
    Flush();
  }

  // Runs a Submit's slow part on the server's prepare executor; its result comes back to this
  // session on the io thread (dropped by the logic if the session ended or moved on meanwhile).
  void Prepare(PendingSubmit p) {
    std::weak_ptr<Session> weak = shared_from_this();
    asio::io_context* io = server_->io_;
    server_->prepare_->Post([weak, io, seq = p.seq, task = std::move(p.task)] {
      // A task that throws (it must not) fails this Submit only: null goes back as an internal error.
      std::shared_ptr<jobs::PreparedJob> prepared;
      try {
        prepared = task();
      } catch (const std::exception& e) {
        spdlog::error("opening a submitted job threw: {}", e.what());
      } catch (...) {
        spdlog::error("opening a submitted job threw an exception of unknown type");
      }
      asio::post(*io, [weak, seq, prepared = std::move(prepared)]() mutable {
        if (auto s = weak.lock(); s && !s->closed_) s->Apply(s->logic_->OnSubmitPrepared(seq, std::move(prepared)));
      });
    });
  }

  // Writes queued frames with sendmsg (so a descriptor can ride along), waiting for writability
  // when the socket buffer is full.
  void Flush() {
    while (!queue_.empty() && !closed_) {
      Pending& p = queue_.front();
      msghdr msg{};
      iovec iov{p.bytes.data() + p.sent, p.bytes.size() - p.sent};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
      if (p.fd >= 0 && p.sent == 0) {
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &p.fd, sizeof(int));
      }
      ssize_t n = ::sendmsg(socket_.native_handle(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          if (!waiting_write_) {
            waiting_write_ = true;
            socket_.async_wait(Socket::wait_write, [self = shared_from_this()](error_code ec) {
              self->waiting_write_ = false;
              if (ec) return self->Finish();
              self->Flush();
            });
          }
          return;
        }
        Finish();  // the client went away
        return;
      }
      p.sent += static_cast<size_t>(n);
      if (p.sent == p.bytes.size()) queue_.pop_front();
    }
    if (queue_.empty() && closing_) Finish();
  }

  void Finish() {
    Close();
    server_->Remove(this);
  }

  ControlServer* const server_;
  Socket socket_;
  const jobs::PeerInfo peer_;
  proto::FrameParser parser_;
  std::unique_ptr<SessionLogic> logic_;
  char read_buf_[16384];
  std::deque<Pending> queue_;
  std::shared_ptr<std::atomic<bool>> event_pending_ = std::make_shared<std::atomic<bool>>(false);
  bool waiting_write_ = false;
  bool closing_ = false;
  bool closed_ = false;
};

ControlServer::ControlServer(asio::io_context* io, jobs::JobService* jobs, ServerOptions options,
                             pipeline::Executor* prepare)
    : io_(io), jobs_(jobs), options_(std::move(options)), prepare_(prepare), acceptor_(*io), accept_retry_(*io) {
  control_.log_limiter = &log_limiter_;
  control_.async_submit = prepare_ != nullptr;
}

ControlServer::~ControlServer() { Stop(); }

Status ControlServer::Start() {
  const std::string& path = options_.socket_path;
  if (options_.inherited_fd >= 0) {
    error_code ec;
    acceptor_.assign(asio::local::stream_protocol(), options_.inherited_fd, ec);
    if (ec) {
      ::close(options_.inherited_fd);
      return Internal("cannot use the inherited control socket: " + ec.message());
    }
    Accept();
    return Status::Ok();
  }
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("socket path is longer than " + std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes: " + path);
  }
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return FailedPrecondition(path + " exists and is not a socket; refusing to replace it");
    // A socket file: is a daemon answering on it?
    Socket probe(*io_);
    error_code ec;
    probe.connect(asio::local::stream_protocol::endpoint(path), ec);
    if (!ec) return FailedPrecondition("another spdld is already serving " + path);
    spdlog::info("removing stale socket {}", path);
    ::unlink(path.c_str());
  }
  error_code ec;
  acceptor_.open(asio::local::stream_protocol(), ec);
  if (!ec) acceptor_.bind(asio::local::stream_protocol::endpoint(path), ec);
  if (ec) return Internal("cannot bind control socket " + path + ": " + ec.message());
  bound_ = true;
  if (::chmod(path.c_str(), static_cast<mode_t>(options_.socket_mode)) != 0) {
    return ErrnoStatus("chmod " + path, errno);
  }
  if (!options_.socket_group.empty()) {
    SPDL_ASSIGN_OR_RETURN(gid_t gid, GroupId(options_.socket_group));
    if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
      return ErrnoStatus("socket_group: chown " + path + " to group " + options_.socket_group, errno);
    }
  }
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Internal("cannot listen on " + path + ": " + ec.message());
  Accept();
  return Status::Ok();
}

void ControlServer::Accept() {
  acceptor_.async_accept([this](error_code ec, Socket socket) {
    if (ec) {
      if (ec == asio::error::operation_aborted || stopped_) return;
      const bool exhausted = ec == asio::error::no_descriptors ||
                             ec == boost::system::errc::too_many_files_open_in_system ||
                             ec == asio::error::no_buffer_space || ec == asio::error::no_memory;
      uint64_t dropped = 0;
      if (log_limiter_.Allow("accept", &dropped)) {
        spdlog::error("control socket: accept: {}{}{}", ec.message(),
                      exhausted ? fmt::format("; retrying in {} ms (raise LimitNOFILE / ulimit -n if it lasts)",
                                              accept_backoff_.count())
                                : std::string(),
                      LogLimiter::Note(dropped));
      }
      if (!exhausted) {
        Accept();
        return;
      }
      accept_retry_.expires_after(accept_backoff_);
      accept_backoff_ = std::min(accept_backoff_ * 2, std::chrono::milliseconds(1000));
      accept_retry_.async_wait([this](error_code wait_ec) {
        if (!wait_ec && !stopped_) Accept();
      });
      return;
    }
    accept_backoff_ = std::chrono::milliseconds(10);
    jobs::PeerInfo peer;
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      peer.pid = cred.pid;
      peer.uid = cred.uid;
      peer.gid = cred.gid;
    }
    auto s = std::make_shared<Session>(this, std::move(socket), peer);
    sessions_.insert(s);
    s->Start();
    Accept();
  });
}

void ControlServer::Remove(Session* s) {
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->get() == s) {
      sessions_.erase(it);
      return;
    }
  }
}

size_t ControlServer::running_jobs() const {
  size_t n = 0;
  for (const auto& s : sessions_) n += s->has_job() ? 1 : 0;
  return n;
}

void ControlServer::Drain(const proto::Draining& notice) {
  control_.draining = true;
  control_.drain_reason = notice.reason();
  auto sessions = sessions_;  // Apply may remove a session whose write fails
  for (auto& s : sessions) s->OnDrain(notice);
}

void ControlServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  error_code ec;
  acceptor_.close(ec);
  accept_retry_.cancel();
  auto sessions = std::move(sessions_);
  for (auto& s : sessions) s->Close();
  sessions.clear();
  if (bound_) ::unlink(options_.socket_path.c_str());
}

}  // namespace spdl::server
