// http_fuzz: whatever an HTTP server answers, through HttpSource::Read — libcurl's parsing of the
// status line, headers and body framing (Content-Length, chunked, none), then spdld's own
// handling: the body sink and its size limit (OnBody: the reserve from Content-Length, the
// abort past max_sample_bytes), the status-line capture (OnHeader), the mapping of the HTTP
// status and curl's result to a Status, Retry-After and the retry loop.
//
// Why a server: that handling is spread over libcurl callbacks and curl_easy_getinfo results, so
// there is no pure function to call without rewriting HttpSource for the fuzzer; a loopback server
// in this process that answers every request with the input's bytes tests the code as it ships,
// at a few thousand requests a second.
//
// The server (a thread on 127.0.0.1, an ephemeral port) reads each request up to its blank line,
// writes the response in pieces of the input's chosen size, and closes the connection.
//
// Input (FuzzedDataProvider): the raw response first ("HTTP/1.1 200 OK\r\n...\r\n\r\nbody"), then,
// from the end: max_sample_bytes (16, 1024 or 65536), max_attempts (1 or 2; backoff 0..1 ms, so a
// Retry-After of a day is capped), the write piece size (1..255 bytes, or all at once).
// The seeds (corpus/http/) are hand-written responses: 200 with and without Content-Length,
// chunked, a body over the limit, 404, 403, 503 with Retry-After, 301, 100 Continue, HTTP/2-style
// and malformed status lines.
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - the status is OK, kNotFound, kPermissionDenied, kInvalidArgument, kUnavailable or
//     kResourceExhausted (never kInternal), and an error's message starts "GET <the URL>";
//   - on error the output is empty; on OK it holds at most max_sample_bytes bytes, and when the
//     response has no chunked framing, the body is a run of the response's bytes;
//   - each Read makes 1..max_attempts requests and counts one failure exactly when it fails.
#include <arpa/inet.h>
#include <fuzzer/FuzzedDataProvider.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fuzz_check.h"
#include "io/http_source.h"

namespace {

using namespace spdl;

// The loopback server: answers every connection with the current response, then closes it.
class Server {
 public:
  Server() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(listen_fd_ >= 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    FUZZ_CHECK(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    FUZZ_CHECK(::listen(listen_fd_, 64) == 0);
    socklen_t len = sizeof(addr);
    FUZZ_CHECK(::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
    port_ = ntohs(addr.sin_port);
    std::thread([this] { Loop(); }).detach();  // lives as long as the process
  }

  int port() const { return port_; }

  void Set(std::vector<uint8_t> response, size_t piece) {
    std::lock_guard<std::mutex> lock(mu_);
    response_ = std::move(response);
    piece_ = piece;
  }

 private:
  void Loop() {
    for (;;) {
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      Serve(fd);
      ::close(fd);
    }
  }

  void Serve(int fd) {
    // The request, up to its blank line (curl sends no body with a GET); 2 s at most.
    std::string request;
    char buf[4096];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < 65536) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 2000) <= 0) return;
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) return;
      request.append(buf, static_cast<size_t>(n));
    }
    std::vector<uint8_t> response;
    size_t piece;
    {
      std::lock_guard<std::mutex> lock(mu_);
      response = response_;
      piece = piece_;
    }
    for (size_t off = 0; off < response.size();) {
      const size_t n = std::min(piece, response.size() - off);
      const ssize_t w = ::send(fd, response.data() + off, n, MSG_NOSIGNAL);
      if (w <= 0) return;  // the client gave up (a body over the limit)
      off += static_cast<size_t>(w);
    }
    ::shutdown(fd, SHUT_WR);
    // Let the client read everything before the close (a close with unread input sends a reset).
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 2000) > 0 && ::recv(fd, buf, sizeof(buf), 0) > 0) {
    }
  }

  int listen_fd_ = -1;
  int port_ = 0;
  std::mutex mu_;
  std::vector<uint8_t> response_;
  size_t piece_ = 1;
};

bool HasChunked(const std::vector<uint8_t>& r) {
  std::string lower(r.begin(), r.end());
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("chunked") != std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server* server = new Server;
  static const std::string url = "http://127.0.0.1:" + std::to_string(server->port()) + "/data/x.jpg";

  FuzzedDataProvider in(data, size);
  static constexpr uint64_t kMaxBytes[] = {16, 1024, 65536};
  io::HttpSourceOptions o;
  o.allowed_url_prefixes = {"http://127.0.0.1:" + std::to_string(server->port()) + "/data"};
  o.max_sample_bytes = kMaxBytes[in.ConsumeIntegralInRange(0, 2)];
  o.max_attempts = in.ConsumeIntegralInRange(1, 2);
  o.initial_backoff_ms = 0;
  o.max_backoff_ms = 1;
  o.connect_timeout_ms = 2000;
  o.timeout_ms = 3000;
  o.max_in_flight = 1;
  o.index_cache = nullptr;
  const uint8_t piece_choice = in.ConsumeIntegral<uint8_t>();
  const size_t piece = piece_choice == 0 ? SIZE_MAX : piece_choice;
  std::vector<uint8_t> response = in.ConsumeRemainingBytes<uint8_t>();
  const bool chunked = HasChunked(response);
  server->Set(response, piece);

  // A fresh source per input: no connection is reused across inputs (the server closes each).
  auto src = io::HttpSource::FromEntries({io::ListEntry{url, 7, 1}}, "fuzz", o);
  FUZZ_CHECK(src.ok());
  std::vector<uint8_t> out = {1, 2, 3};
  const Status s = (*src)->Read(0, &out);
  const io::HttpStats stats = (*src)->stats();
  const StatusCode c = s.code();
  FUZZ_TRACE("http_fuzz: %llu requests: %s (%zu bytes)\n", static_cast<unsigned long long>(stats.requests),
             s.ok() ? "OK" : s.message().c_str(), out.size());
  FUZZ_CHECK(c == StatusCode::kOk || c == StatusCode::kNotFound || c == StatusCode::kPermissionDenied ||
             c == StatusCode::kInvalidArgument || c == StatusCode::kUnavailable || c == StatusCode::kResourceExhausted);
  FUZZ_CHECK(stats.requests >= 1 && stats.requests <= static_cast<uint64_t>(o.max_attempts));
  FUZZ_CHECK(stats.retries == stats.requests - 1);
  FUZZ_CHECK(stats.failures == (s.ok() ? 0u : 1u));
  if (s.ok()) {
    FUZZ_CHECK(out.size() <= o.max_sample_bytes);
    if (!chunked && !out.empty()) {
      FUZZ_CHECK(std::search(response.begin(), response.end(), out.begin(), out.end()) != response.end());
    }
  } else {
    FUZZ_CHECK(out.empty());
    FUZZ_CHECK(s.message().rfind("GET " + url, 0) == 0);
  }
  return 0;
}
