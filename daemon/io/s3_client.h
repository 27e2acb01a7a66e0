// S3Client: the S3 transport of one job — GET (whole objects and byte ranges, resumed when a
// transfer is cut), HEAD and ListObjectsV2 against an S3-compatible endpoint (AWS, MinIO, Ceph,
// moto), over libcurl, signed with AWS Signature V4 by libcurl (CURLOPT_AWS_SIGV4).
// Thread safety: safe to share between threads; the connection pool is internally locked and the
// counters are atomics; everything else is constant after Create.
//
// Addressing: path-style (endpoint/bucket/key) or virtual-hosted (bucket.endpoint-host/key). With
// kAuto, the default AWS endpoint is addressed virtual-hosted and any explicit endpoint path-style
// (what MinIO, Ceph and moto expect). Every request URL must lie below one of the daemon's
// allowed_url_prefixes (same rule as the http source: scheme, host, port, path by whole segments),
// so an admin allows "http://minio:9000/bucket" (path-style) or "https://bucket.s3.eu-west-1.amazonaws.com"
// (virtual-hosted).
//
// Credentials are the job's (sent by its client, proto S3Credentials): held in memory in this
// object only, passed to libcurl for signing, never put in a message, a URL, Describe or a log.
// No credentials = unsigned (anonymous) requests.
//
// Retries: a connection failure, a transfer cut short, a timeout (connect or whole attempt), HTTP
// 5xx or 429 is retried up to max_attempts in all with jittered exponential backoff (bounded by
// max_backoff_ms); a GET that was cut after some bytes resumes with a Range request from the first
// missing byte. Every body is checked against its Content-Length (a short body is a cut transfer).
// So the longest a call can block is about max_attempts * (timeout_ms + max_backoff_ms).
// Errors name the operation, the s3:// URL, the HTTP status and S3's error code
// ("GET s3://b/k: HTTP 403 Forbidden (InvalidAccessKeyId)"): 404 -> kNotFound, 401/403 ->
// kPermissionDenied, other 4xx -> kInvalidArgument, 5xx/429/network -> kUnavailable, a body
// larger than max_object_bytes -> kResourceExhausted.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::io {

// A job's credentials. Never printed: there is deliberately no operator<< or Describe.
struct S3Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // "" = long-term keys
  bool empty() const { return access_key_id.empty() && secret_access_key.empty(); }
};

enum class S3Addressing { kAuto, kPath, kVirtual };

struct S3Options {
  std::string endpoint_url;  // "" = https://s3.<region>.amazonaws.com
  std::string region = "us-east-1";
  S3Addressing addressing = S3Addressing::kAuto;
  S3Credentials credentials;
  std::vector<std::string> allowed_url_prefixes;  // the daemon's; empty refuses every request
  int64_t connect_timeout_ms = 5'000;
  int64_t timeout_ms = 30'000;  // one whole attempt
  // No body byte for this long (the wait for the answer included) is a stall: the transfer is cut
  // and retried, resumed where it stopped; 0 = off.
  int64_t stall_timeout_ms = 10'000;
  int max_attempts = 4;
  int64_t initial_backoff_ms = 100;
  int64_t max_backoff_ms = 5'000;
  int max_in_flight = 16;
  uint64_t max_object_bytes = uint64_t{4} << 30;  // a larger GET body fails
  std::string user_agent = "spdld";
};

// "s3://bucket/key" split. Key may be empty ("s3://bucket" or "s3://bucket/").
struct S3Location {
  std::string bucket;
  std::string key;
  std::string ToString() const { return "s3://" + bucket + "/" + key; }
};
bool IsS3Url(const std::string& text);
// Errors (kInvalidArgument): not s3://, no bucket, a bucket name S3 does not allow.
Result<S3Location> ParseS3Url(const std::string& text);

struct S3Object {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};

struct S3Stats {
  uint64_t requests = 0;
  uint64_t retries = 0;
  uint64_t resumed = 0;  // range requests that continued a cut transfer
  uint64_t bytes = 0;    // body bytes received
  // Failed attempts, by kind (each attempt counted; a retried one too).
  uint64_t errors_4xx = 0;      // HTTP 4xx other than 429 (denied, missing, precondition failed)
  uint64_t errors_5xx = 0;      // HTTP 5xx and 429
  uint64_t errors_network = 0;  // no HTTP answer: connection failures, timeouts, cut or stalled transfers
};

class S3Client {
 public:
  // Checks the options (timeouts > 0, attempts >= 1, a parsable endpoint; no allowed prefix ->
  // kPermissionDenied). Built without libcurl: kFailedPrecondition.
  static Result<std::unique_ptr<S3Client>> Create(S3Options options);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  // The HTTP(S) URL of an object (key percent-encoded, its slashes kept), by the addressing rule;
  // kPermissionDenied when it is not below an allowed URL prefix. Pure: no request.
  Result<std::string> ObjectUrl(const S3Location& loc) const;

  // Receives body bytes in order; returns false to stop (the call then fails with kCancelled).
  using Sink = std::function<bool(const uint8_t* data, size_t size)>;
  // Streams bytes [offset, offset + length) of the object to `sink` (length = kToEnd: to its end),
  // resuming with a Range request after a cut. Every byte is delivered exactly once, in order.
  static constexpr uint64_t kToEnd = ~uint64_t{0};
  // Integrity: a resumed Range request carries If-Match with the ETag of the first answer (an
  // object replaced mid-transfer fails with kFailedPrecondition instead of mixing two versions);
  // a whole-object GET whose ETag is an MD5 (single-part uploads: 32 hex digits) has its body's MD5
  // checked (mismatch: kDataLoss). `if_match` != "": every request carries If-Match with it (the
  // ETag the caller indexed). `etag` != nullptr: receives the object's ETag (quotes kept).
  Status Get(const S3Location& loc, uint64_t offset, uint64_t length, const Sink& sink,
             const std::string& if_match = "", std::string* etag = nullptr) const;
  // The same into *out (cleared first).
  Status GetBytes(const S3Location& loc, uint64_t offset, uint64_t length, std::vector<uint8_t>* out,
                  const std::string& if_match = "") const;

  // Every object below `prefix` in `bucket`, in key order (ListObjectsV2, all pages).
  Result<std::vector<S3Object>> List(const std::string& bucket, const std::string& prefix) const;

  S3Stats stats() const;
  std::string endpoint() const { return endpoint_; }  // for Describe: no secret in it
  // The access key id ("" = unsigned): not a secret, but never shown either; for index-cache keys.
  const std::string& access_key_id() const { return options_.credentials.access_key_id; }

 private:
  struct Pool;
  struct Attempt;
  explicit S3Client(S3Options options);
  // One request: GET/HEAD of `url`, the body from `offset` (Range when offset > 0 or bounded).
  Attempt Try(const std::string& url, const std::string& what, uint64_t offset, uint64_t end, const Sink& sink,
              const std::string& if_match, uint64_t* delivered, std::string* etag) const;
  // Try until done or out of attempts. restart = nullptr: a cut transfer resumes at the first
  // missing byte; else each attempt starts over from `offset` after calling restart().
  Status WithRetries(const std::string& url, const std::string& what, uint64_t offset, uint64_t length,
                     const Sink& sink, const std::function<void()>& restart = nullptr, const std::string& if_match = "",
                     std::string* etag = nullptr) const;

  const S3Options options_;
  std::string endpoint_;  // normalized, no trailing '/'
  std::string sigv4_;     // "aws:amz:<region>:s3"
  std::unique_ptr<Pool> pool_;
  mutable std::atomic<uint64_t> requests_{0}, retries_{0}, resumed_{0}, bytes_{0};
  mutable std::atomic<uint64_t> errors_4xx_{0}, errors_5xx_{0}, errors_network_{0};
};

// The standard S3 settings from the environment, for clients and tests: AWS_ENDPOINT_URL_S3, then
// AWS_ENDPOINT_URL; AWS_REGION, then AWS_DEFAULT_REGION. Empty when unset.
std::string S3EndpointFromEnv();
std::string S3RegionFromEnv();

}  // namespace spdl::io
