// ControlServer: the Unix-socket control channel. Accepts connections with Boost.Asio, runs one
// session per connection (framing + SessionLogic + writes that can carry a descriptor), and tears
// every session down on Stop().
//
// Threading: everything runs on the one io_context thread given at construction, so sessions need
// no locks; jobs reach their session by posting to that io_context. The slow part of a SubmitJob
// (validating the config and opening the source: a folder scan, a list, a tar index) runs on the
// `prepare` executor, and its result is posted back to that thread, so a large dataset never holds
// up the other sessions. Handlers never throw; an `operation_aborted` error is a normal shutdown.
#pragma once

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/status.h"
#include "jobs/job_service.h"
#include "pipeline/executor.h"
#include "proto/control.pb.h"
#include "server/session_logic.h"

namespace spdl::server {

struct ServerOptions {
  std::string socket_path;
  int socket_mode = 0660;
  std::string socket_group;  // group to give the socket file (name or number); empty = leave it
  uint32_t max_frame_bytes = 1u << 20;
  // A listening Unix stream socket the service manager passed in (socket activation, see
  // ops/listen_fds.h), or -1. When set, Start() adopts it (the server owns the descriptor from
  // then on) instead of binding socket_path, and neither creates, chmods nor unlinks any file:
  // the manager owns the socket file, its mode and group.
  int inherited_fd = -1;

  // ---- Limits per connection and per user: one user cannot starve or crash the others.
  size_t max_connections = 1024;                   // sessions at once, all users; more are closed at accept
  size_t max_connections_per_uid = 128;            // sessions at once of one uid; more are told why and closed
  std::chrono::milliseconds hello_timeout{10000};  // connect -> Hello; later: the session is closed
  std::chrono::milliseconds frame_timeout{10000};  // a frame begun must be whole within this
  // Replies queued for a client that does not read them: over this the session's requests are no
  // longer read (so it cannot queue more); back under half of it, reading resumes; over it for
  // backlog_timeout, the session is closed.
  size_t max_reply_backlog_bytes = 4u << 20;
  std::chrono::milliseconds backlog_timeout{10000};
  std::chrono::milliseconds sweep_interval{250};  // how often the timeouts above are checked
  // Submits of one uid whose source is being opened on the prepare executor at once (half its 8
  // threads); more wait in that uid's queue, so one user's slow scans cannot take every thread.
  size_t max_prepares_per_uid = 4;
};

class Session;

class ControlServer {
 public:
  // *io and *jobs must outlive this object. `prepare` runs the slow part of each SubmitJob (it must
  // outlive this object, and may drop tasks after it stops); nullptr: run it on the io thread.
  ControlServer(boost::asio::io_context* io, jobs::JobService* jobs, ServerOptions options,
                pipeline::Executor* prepare = nullptr);
  ~ControlServer();

  // Binds the socket (replacing a stale socket file, refusing when another daemon answers on it),
  // sets its mode, and starts accepting; or, with options.inherited_fd, accepts on that socket.
  Status Start();
  // Stops accepting, closes every session (their jobs are cancelled) and removes the socket file
  // (never an inherited one's).
  void Stop();
  size_t session_count() const { return sessions_.size(); }
  // Sessions with a job running right now.
  size_t running_jobs() const;

  // Daemon-wide state and actions the sessions see (draining, the drain request hook).
  DaemonControl& control() { return control_; }
  // Marks the server as draining (Submit refused from now on) and sends `notice` to every
  // session that runs a job. New connections are still accepted (spdlctl keeps working).
  void Drain(const proto::Draining& notice);

 private:
  friend class Session;
  void Accept();
  void Remove(Session* s);
  // Runs `task` on the prepare executor now, or when one of uid's max_prepares_per_uid slots frees.
  void PostPrepare(uid_t uid, std::function<void()> task);
  // A prepare task of `uid` has finished (io thread): its slot goes to the uid's next waiting one.
  void PrepareDone(uid_t uid);
  // Closes the sessions past a timeout (hello, frame, backlog); runs every sweep_interval.
  void Sweep();
  // Tells a connection over a limit why (one frame, best effort) and closes it.
  void Refuse(boost::asio::local::stream_protocol::socket socket, const std::string& why);

  boost::asio::io_context* const io_;
  jobs::JobService* const jobs_;
  const ServerOptions options_;
  pipeline::Executor* const prepare_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  // Out of descriptors (EMFILE/ENFILE) or memory: accept() fails at once again while the
  // connection waits, so the acceptor retries after a pause that doubles up to 1 s.
  boost::asio::steady_timer accept_retry_;
  std::chrono::milliseconds accept_backoff_{10};
  std::set<std::shared_ptr<Session>> sessions_;
  std::map<uid_t, size_t> sessions_per_uid_;  // of sessions_
  boost::asio::steady_timer sweep_;
  struct PrepareQueue {
    size_t running = 0;
    std::deque<std::function<void()>> waiting;
  };
  std::map<uid_t, PrepareQueue> prepares_;  // io thread only
  DaemonControl control_;
  LogLimiter log_limiter_;  // the sessions' and the acceptor's warnings (control_.log_limiter)
  bool stopped_ = false;
  bool bound_ = false;
};

}  // namespace spdl::server
