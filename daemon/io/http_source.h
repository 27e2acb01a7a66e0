// HttpSource: samples fetched over HTTP(S) with libcurl, one GET per Read. Safe to share between
// threads: Read is called concurrently from many workers; the only shared mutable state is the
// connection pool (guarded by its mutex) and the counters (atomics).
//
// The samples are either a list of URLs ("url[,label]" lines, format in sample_list.h), or a base
// URL plus a list of relative paths ("path[,label]"), fetched from base_url + "/" + path (the path
// percent-encoded, its slashes kept). Keys (sample(i).path) are the full URLs.
//
// Each Read:
//   - waits for one of max_in_flight pooled curl handles: the pool is the counting semaphore that
//     bounds the requests in flight across all workers, and each handle keeps its connection alive
//     for the next request (connection reuse without a handle per worker thread);
//   - GETs the URL with a connect timeout and a whole-request timeout;
//   - on a connection failure (refused, reset, DNS, connect timeout, TLS handshake), HTTP 5xx or
//     HTTP 429, retries up to max_attempts in all, sleeping initial_backoff_ms, then twice that, ...
//     (capped at max_backoff_ms, jittered down by up to half, at least an honoured Retry-After,
//     itself capped at max_backoff_ms), without holding a pooled handle while it sleeps;
//   - never retries another 4xx, a 3xx (redirects are not followed: a redirect could leave the
//     allowed URL prefixes), a timeout after the connection was made (the timeout bounds how long a
//     stalled server holds a worker), or a too-large body.
// Errors name the method, the URL and the HTTP status: "GET http://h/a.jpg: HTTP 404 Not Found";
// "... (gave up after 4 attempts)" when it retried. Codes: 404/410 -> kNotFound; 401/403 ->
// kPermissionDenied; other 3xx/4xx -> kInvalidArgument; 5xx, 429, connection failures, timeouts ->
// kUnavailable; larger than max_sample_bytes -> kResourceExhausted.
//
// HTTPS works when libcurl was built with TLS (Debian's libcurl4-openssl-dev is), verifying the
// peer against the system CA store. Only the http and https schemes are accepted. A worker blocked
// in a Read is not interrupted by a job's stop: the wait is bounded by
// max_attempts * (timeout_ms + max_backoff_ms).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/sample_list.h"
#include "io/sample_source.h"

namespace spdl::io {

struct HttpSourceOptions {
  std::string list;                        // the list file; must resolve below allowed_roots
  std::string base_url;                    // "" = the list holds URLs; else it holds paths relative to this URL
  std::vector<std::string> allowed_roots;  // the daemon's allowed data roots, for the list file
  // Every URL must lie at or below one of these: same scheme, host and port, and a path equal to
  // or below the prefix's path by whole segments ("http://h:8000/data" allows /data and /data/x,
  // not /database). Empty refuses every URL, as allowed_roots does for files: a daemon that fetches
  // whatever a client names could be made to reach internal services.
  std::vector<std::string> allowed_url_prefixes;
  int64_t connect_timeout_ms = 5'000;               // to establish a connection (TCP and TLS)
  int64_t timeout_ms = 30'000;                      // one whole attempt, connection included
  int max_attempts = 4;                             // attempts per Read, the first included; 1 = never retry
  int64_t initial_backoff_ms = 100;                 // the wait before the second attempt; doubles after
  int64_t max_backoff_ms = 5'000;                   // the longest wait between attempts
  int max_in_flight = 16;                           // requests at once across all workers (= pooled connections)
  uint64_t max_sample_bytes = uint64_t{256} << 20;  // a larger body fails its Read
  size_t max_reported_errors = 100;                 // bad lines listed in Open's error; the rest are counted
  std::string user_agent = "spdld";
  // Open shares the checked list with other opens of the same list, base URL, URL prefixes and
  // allowed roots while one of them lives (source_index_cache.h; reused while the list file is
  // unchanged). nullptr = always read it. FromEntries does not use it.
  SourceIndexCache* index_cache = nullptr;
};

// Counters since Open; read with relaxed loads (for stats, not for synchronisation).
struct HttpStats {
  uint64_t requests = 0;  // attempts made (a retried Read counts each)
  uint64_t retries = 0;   // attempts after the first
  uint64_t failures = 0;  // Reads that returned an error
};

class HttpSource final : public SampleSource {
 public:
  // Reads and checks the whole list (every bad line at once, each with its line number: a bad
  // label, a URL that does not parse, a scheme other than http/https, credentials in the URL, a URL
  // outside allowed_url_prefixes, an absolute path or ".." with base_url). Also refuses bad options
  // (non-positive timeouts, attempts or in-flight bound; a bad base_url). No entry -> kNotFound.
  // Built without libcurl: kFailedPrecondition.
  static Result<std::unique_ptr<HttpSource>> Open(const HttpSourceOptions& options);

  // The same over entries already parsed; `origin` names them in errors and Describe.
  // options.list is not read.
  static Result<std::unique_ptr<HttpSource>> FromEntries(std::vector<ListEntry> entries, const std::string& origin,
                                                         const HttpSourceOptions& options);

  ~HttpSource() override;  // REQUIRES: no Read in progress
  HttpSource(const HttpSource&) = delete;
  HttpSource& operator=(const HttpSource&) = delete;

  uint64_t size() const override { return samples_->size(); }
  const SampleRef& sample(uint64_t index) const override { return (*samples_)[index]; }
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  std::string Identity() const override { return "http " + origin_ + " base " + options_.base_url; }

  HttpStats stats() const;

 private:
  struct Pool;  // the curl handles (http_source.cc)
  struct Attempt;

  HttpSource(std::string origin, std::shared_ptr<const std::vector<SampleRef>> samples,
             const HttpSourceOptions& options);
  Attempt Try(const std::string& url, std::vector<uint8_t>* out) const;

  // Constant after construction.
  const std::string origin_;                                     // the list file or the caller's name for the entries
  const std::shared_ptr<const std::vector<SampleRef>> samples_;  // possibly shared with other sources
  const HttpSourceOptions options_;
  const std::unique_ptr<Pool> pool_;  // internally locked

  mutable std::atomic<uint64_t> requests_{0};
  mutable std::atomic<uint64_t> retries_{0};
  mutable std::atomic<uint64_t> failures_{0};
};

}  // namespace spdl::io
