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
#include <optional>
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
  const jobs::PeerInfo& peer() const { return peer_; }

  // Why the session must be closed now (a limit of ServerOptions it is past), or "".
  std::string Overdue(std::chrono::steady_clock::time_point now) const {
    const ServerOptions& o = server_->options_;
    if (closed_) return "";
    if (logic_ && !logic_->hello_done() && now - connected_at_ > o.hello_timeout) return "no Hello in time";
    if (partial_since_ && now - *partial_since_ > o.frame_timeout) return "a message not completed in time";
    if (backlog_since_ && now - *backlog_since_ > o.backlog_timeout) {
      return "it does not read its replies (" + std::to_string(queued_bytes_) + " bytes queued)";
    }
    return "";
  }
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
    reading_ = true;
    socket_.async_read_some(asio::buffer(read_buf_), [self = shared_from_this()](error_code ec, size_t n) {
      self->reading_ = false;
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
          self->Apply(
              self->logic_->OnOversizedFrame(self->parser_.bad_length(), self->server_->options_.max_frame_bytes));
          return;
        }
        self->Apply(self->logic_->OnFrame(payload));
        if (self->closing_ || self->closed_) return;
      }
      // A frame begun must be completed within frame_timeout (Overdue).
      if (self->parser_.buffered() == 0) {
        self->partial_since_.reset();
      } else if (!self->partial_since_) {
        self->partial_since_ = std::chrono::steady_clock::now();
      }
      self->MaybeRead();
    });
  }

  // Reads on unless the replies queued for the client are over the bound: then its requests wait
  // in the socket (the client's sends block) until it reads; Flush resumes.
  void MaybeRead() {
    if (closed_ || closing_ || reading_) return;
    if (queued_bytes_ > server_->options_.max_reply_backlog_bytes) {
      if (!backlog_since_) backlog_since_ = std::chrono::steady_clock::now();
      return;
    }
    Read();
  }

  void Apply(Output out) {
    if (closed_) return;
    for (auto& m : out.messages) {
      Pending p;
      if (!proto::EncodeFrame(m.message, &p.bytes)) continue;
      p.fd = m.pass_fd;
      queued_bytes_ += p.bytes.size();
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
    ControlServer* server = server_;
    const uid_t uid = peer_.uid;
    server_->PostPrepare(uid, [weak, io, server, uid, seq = p.seq, task = std::move(p.task)] {
      // A task that throws (it must not) fails this Submit only: null goes back as an internal error.
      std::shared_ptr<jobs::PreparedJob> prepared;
      try {
        prepared = task();
      } catch (const std::exception& e) {
        spdlog::error("opening a submitted job threw: {}", e.what());
      } catch (...) {
        spdlog::error("opening a submitted job threw an exception of unknown type");
      }
      asio::post(*io, [weak, server, uid, seq, prepared = std::move(prepared)]() mutable {
        server->PrepareDone(uid);
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
      if (p.sent == p.bytes.size()) {
        queued_bytes_ -= p.bytes.size();
        queue_.pop_front();
      }
    }
    if (queue_.empty() && closing_) return Finish();
    if (backlog_since_ && queued_bytes_ <= server_->options_.max_reply_backlog_bytes / 2) {
      backlog_since_.reset();
      MaybeRead();
    }
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
  size_t queued_bytes_ = 0;  // of queue_'s frames
  const std::chrono::steady_clock::time_point connected_at_ = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> partial_since_;  // a frame partly received since
  std::optional<std::chrono::steady_clock::time_point> backlog_since_;  // reading paused since
  bool reading_ = false;                                                // an async read is outstanding
  std::shared_ptr<std::atomic<bool>> event_pending_ = std::make_shared<std::atomic<bool>>(false);
  bool waiting_write_ = false;
  bool closing_ = false;
  bool closed_ = false;
};

ControlServer::ControlServer(asio::io_context* io, jobs::JobService* jobs, ServerOptions options,
                             pipeline::Executor* prepare)
    : io_(io),
      jobs_(jobs),
      options_(std::move(options)),
      prepare_(prepare),
      acceptor_(*io),
      accept_retry_(*io),
      sweep_(*io) {
  control_.log_limiter = &log_limiter_;
  control_.async_submit = prepare_ != nullptr;
}

ControlServer::~ControlServer() {
  try {
    Stop();
  } catch (const std::exception& e) {  // a timer that cannot be cancelled: the server goes anyway
    spdlog::error("control server: stopping: {}", e.what());
  }
}

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
    Sweep();
    return Status::Ok();
  }
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("socket path is longer than " + std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                           " bytes: " + path);
  }
  struct stat st {};
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
  Sweep();
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
    if (sessions_.size() >= options_.max_connections) {
      Refuse(std::move(socket), "spdld serves at most " + std::to_string(options_.max_connections) +
                                    " connections at once (max_connections); try again later");
    } else if (sessions_per_uid_[peer.uid] >= options_.max_connections_per_uid) {
      Refuse(std::move(socket), "uid " + std::to_string(peer.uid) + " already has " +
                                    std::to_string(options_.max_connections_per_uid) +
                                    " connections open to spdld (max_connections_per_uid); close some first");
    } else {
      auto s = std::make_shared<Session>(this, std::move(socket), peer);
      sessions_.insert(s);
      ++sessions_per_uid_[peer.uid];
      s->Start();
    }
    if (sessions_per_uid_[peer.uid] == 0) sessions_per_uid_.erase(peer.uid);
    Accept();
  });
}

void ControlServer::PostPrepare(uid_t uid, std::function<void()> task) {
  PrepareQueue& q = prepares_[uid];
  if (q.running < options_.max_prepares_per_uid) {
    ++q.running;
    prepare_->Post(std::move(task));
    return;
  }
  q.waiting.push_back(std::move(task));
}

void ControlServer::PrepareDone(uid_t uid) {
  auto it = prepares_.find(uid);
  if (it == prepares_.end()) return;
  PrepareQueue& q = it->second;
  if (!q.waiting.empty() && !stopped_) {
    prepare_->Post(std::move(q.waiting.front()));  // the slot passes to the uid's next Submit
    q.waiting.pop_front();
    return;
  }
  if (--q.running == 0 && q.waiting.empty()) prepares_.erase(it);
}

void ControlServer::Refuse(Socket socket, const std::string& why) {
  uint64_t dropped = 0;
  if (log_limiter_.Allow("refuse-connection", &dropped)) {
    spdlog::warn("control socket: connection refused: {}{}", why, LogLimiter::Note(dropped));
  }
  proto::DaemonMessage m;
  m.mutable_error()->set_code(proto::Error::RESOURCE_EXHAUSTED);
  m.mutable_error()->set_message(why);
  std::string bytes;
  if (proto::EncodeFrame(m, &bytes)) {
    (void)::send(socket.native_handle(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  error_code ec;
  socket.close(ec);
}

void ControlServer::Sweep() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<std::shared_ptr<Session>, std::string>> overdue;
  for (const auto& s : sessions_) {
    if (std::string why = s->Overdue(now); !why.empty()) overdue.emplace_back(s, std::move(why));
  }
  for (auto& [s, why] : overdue) {
    uint64_t dropped = 0;
    if (log_limiter_.Allow("overdue", &dropped)) {
      spdlog::warn("session pid {} uid {}: closed: {}{}", s->peer().pid, s->peer().uid, why, LogLimiter::Note(dropped));
    }
    s->Close();
    Remove(s.get());
  }
  if (stopped_) return;
  sweep_.expires_after(options_.sweep_interval);
  sweep_.async_wait([this](error_code ec) {
    if (!ec && !stopped_) Sweep();
  });
}

void ControlServer::Remove(Session* s) {
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->get() == s) {
      auto n = sessions_per_uid_.find(s->peer().uid);
      if (n != sessions_per_uid_.end() && --n->second == 0) sessions_per_uid_.erase(n);
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
  sweep_.cancel();
  auto sessions = std::move(sessions_);
  for (auto& s : sessions) s->Close();
  sessions.clear();
  if (bound_) ::unlink(options_.socket_path.c_str());
}

}  // namespace spdl::server
