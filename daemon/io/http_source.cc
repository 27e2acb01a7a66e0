#include "io/http_source.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "common/ascii.h"
#include "io/allowed_roots.h"

#if SPDL_HAVE_CURL
#include <curl/curl.h>

#include "io/curl_pool.h"
#endif

namespace spdl::io {

struct HttpSource::Attempt {
  Status status;
  bool retryable = false;
  int64_t retry_after_ms = 0;  // from a Retry-After header; 0 = none
};

#if SPDL_HAVE_CURL
namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct UrlDeleter {
  void operator()(CURLU* u) const { curl_url_cleanup(u); }
};
using UniqueUrl = std::unique_ptr<CURLU, UrlDeleter>;

// One part of a parsed URL, or "" when it has none.
std::string Part(CURLU* u, CURLUPart part, unsigned flags = 0) {
  char* p = nullptr;
  if (curl_url_get(u, part, &p, flags) != CURLUE_OK || p == nullptr) return "";
  std::string s(p);
  curl_free(p);
  return s;
}

struct Url {
  std::string full;  // normalized by curl
  std::string scheme, host, port, path;
};

// True when a segment of the (still percent-encoded) URL path is "." or ".." once decoded, or
// holds an encoded '/' or '\\': curl normalizes plain dot segments, but a server that decodes
// "%2e%2e" would walk out of the allowed prefix.
bool HasEncodedTraversal(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string decoded;
    bool encoded = false;
    for (size_t i = start; i < end; ++i) {
      if (path[i] == '%' && i + 2 < end) {
        const std::string hex = path.substr(i + 1, 2);
        const char c = static_cast<char>(std::strtol(hex.c_str(), nullptr, 16));
        if (std::isxdigit(static_cast<unsigned char>(hex[0])) && std::isxdigit(static_cast<unsigned char>(hex[1]))) {
          if (c == '/' || c == '\\') return true;
          decoded += c;
          encoded = true;
          i += 2;
          continue;
        }
      }
      decoded += path[i];
    }
    if (encoded && (decoded == "." || decoded == "..")) return true;
    start = end + 1;
  }
  return false;
}

// Parses and normalizes an absolute http(s) URL; returns an error message, or "".
std::string ParseUrl(UniqueUrl u, Url* out) {
  out->scheme = AsciiLower(Part(u.get(), CURLUPART_SCHEME));
  if (out->scheme != "http" && out->scheme != "https") {
    return "scheme '" + out->scheme + "' is not http or https";
  }
  if (!Part(u.get(), CURLUPART_USER).empty() || !Part(u.get(), CURLUPART_PASSWORD).empty()) {
    return "credentials in URLs are not accepted (they would be logged with the key)";
  }
  out->host = AsciiLower(Part(u.get(), CURLUPART_HOST));
  if (out->host.empty()) return "no host";
  out->port = Part(u.get(), CURLUPART_PORT, CURLU_DEFAULT_PORT);
  out->path = Part(u.get(), CURLUPART_PATH);
  if (out->path.empty()) out->path = "/";
  if (HasEncodedTraversal(out->path)) {
    return "the path " + out->path +
           " has an encoded '.' or '..' segment or an encoded slash (a server could "
           "resolve it outside the allowed prefix)";
  }
  out->full = Part(u.get(), CURLUPART_URL);
  return "";
}

std::string ParseUrl(const std::string& text, Url* out) {
  UniqueUrl u(curl_url());
  if (!u) return "out of memory";
  const CURLUcode rc = curl_url_set(u.get(), CURLUPART_URL, text.c_str(), 0);
  if (rc != CURLUE_OK) return std::string("not a URL: ") + curl_url_strerror(rc);
  return ParseUrl(std::move(u), out);
}

// base + "/" + rel, rel percent-encoded (its slashes kept). Returns an error message, or "".
std::string JoinUrl(const std::string& base, const std::string& rel, Url* out) {
  UniqueUrl u(curl_url());
  if (!u) return "out of memory";
  CURLUcode rc = curl_url_set(u.get(), CURLUPART_URL, base.c_str(), 0);
  if (rc != CURLUE_OK) return std::string("base_url is not a URL: ") + curl_url_strerror(rc);
  std::string path = Part(u.get(), CURLUPART_PATH);
  if (path.empty() || path.back() != '/') path += '/';
  // The base path is already encoded; encode only the relative part, then set the path as is.
  std::string encoded;
  for (unsigned char c : rel) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                       c == '.' || c == '_' || c == '~' || c == '/';
    if (plain) {
      encoded += static_cast<char>(c);
    } else {
      static const char* kHex = "0123456789ABCDEF";
      encoded += '%';
      encoded += kHex[c >> 4];
      encoded += kHex[c & 15];
    }
  }
  rc = curl_url_set(u.get(), CURLUPART_PATH, (path + encoded).c_str(), 0);
  if (rc != CURLUE_OK) return std::string("bad path: ") + curl_url_strerror(rc);
  return ParseUrl(std::move(u), out);
}

bool PathBelow(const std::string& path, const std::string& prefix) {
  if (prefix.empty() || prefix == "/") return true;
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  return prefix.back() == '/' || path.size() == prefix.size() || path[prefix.size()] == '/';
}

bool HasDotDot(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end - start == 2 && path.compare(start, 2, "..") == 0) return true;
    start = end + 1;
  }
  return false;
}

const char* ReasonPhrase(long code) {
  switch (code) {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 408:
      return "Request Timeout";
    case 410:
      return "Gone";
    case 429:
      return "Too Many Requests";
    case 500:
      return "Internal Server Error";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "";
  }
}

// Where one transfer writes: the body into *out (up to max bytes), the last status line.
struct Sink {
  std::vector<uint8_t>* out = nullptr;
  uint64_t max = 0;
  bool too_big = false;
  bool reserved = false;
  CURL* handle = nullptr;
  std::string status_line;
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<Sink*>(user);
  const size_t bytes = size * n;
  if (!s->reserved) {
    s->reserved = true;
    curl_off_t length = -1;
    if (curl_easy_getinfo(s->handle, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length) == CURLE_OK && length > 0 &&
        static_cast<uint64_t>(length) <= s->max) {
      s->out->reserve(static_cast<size_t>(length));
    }
  }
  if (s->out->size() + bytes > s->max) {
    s->too_big = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  s->out->insert(s->out->end(), data, data + bytes);
  return bytes;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<Sink*>(user);
  const size_t bytes = size * n;
  if (bytes >= 5 && std::string_view(data, 5) == "HTTP/") {
    s->status_line.assign(data, bytes);
    while (!s->status_line.empty() && (s->status_line.back() == '\r' || s->status_line.back() == '\n')) {
      s->status_line.pop_back();
    }
  }
  return bytes;
}

// The reason phrase of "HTTP/1.1 404 Not Found", or the standard one for `code`.
std::string Reason(const std::string& status_line, long code) {
  const size_t sp1 = status_line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : status_line.find(' ', sp1 + 1);
  if (sp2 != std::string::npos && sp2 + 1 < status_line.size()) return status_line.substr(sp2 + 1);
  return ReasonPhrase(code);
}

bool RetryableCurlError(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

int64_t JitteredBackoff(const HttpSourceOptions& o, int attempt_done) {
  int64_t d = o.initial_backoff_ms;
  for (int i = 1; i < attempt_done && d < o.max_backoff_ms; ++i) d *= 2;
  d = std::min(d, o.max_backoff_ms);
  thread_local std::minstd_rand rng(static_cast<uint32_t>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  return d - static_cast<int64_t>(rng() % static_cast<uint64_t>(d / 2 + 1));
}

}  // namespace

// The pool of curl easy handles: at most options.max_in_flight exist; Acquire blocks while all are
// in use. Each handle keeps its own connection cache, so a handle reused is a connection reused.
struct HttpSource::Pool : CurlPool {
  explicit Pool(const HttpSourceOptions& options)
      : CurlPool(options.max_in_flight, [&options](Handle& h) {
          CURL* c = h.curl;
          curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // required with threads
          curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
          curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
          curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout_ms));
          curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options.timeout_ms));
          curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(options.max_sample_bytes));
          curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
          curl_easy_setopt(c, CURLOPT_USERAGENT, options.user_agent.c_str());
          curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnBody);
          curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnHeader);
          curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h.error);
        }) {}
};

namespace {

Status CheckOptions(const HttpSourceOptions& o) {
  std::string bad;
  if (o.connect_timeout_ms <= 0) bad += " connect_timeout_ms must be > 0;";
  if (o.timeout_ms <= 0) bad += " timeout_ms must be > 0;";
  if (o.max_attempts < 1) bad += " max_attempts must be >= 1;";
  if (o.initial_backoff_ms < 0) bad += " initial_backoff_ms must be >= 0;";
  if (o.max_backoff_ms < o.initial_backoff_ms) bad += " max_backoff_ms must be >= initial_backoff_ms;";
  if (o.max_in_flight < 1) bad += " max_in_flight must be >= 1;";
  if (o.max_sample_bytes == 0) bad += " max_sample_bytes must be > 0;";
  if (!bad.empty()) {
    bad.pop_back();
    return InvalidArgument("http source:" + bad);
  }
  return Status::Ok();
}

// Turns entries into samples keyed by their full URL, appending a problem for each bad one.
// REQUIRES: base (when !o.base_url.empty()) and prefixes are valid.
std::vector<SampleRef> CheckEntries(std::vector<ListEntry> entries, const HttpSourceOptions& o,
                                    const std::vector<Url>& prefixes, std::vector<ListProblem>* problems) {
  std::vector<SampleRef> samples;
  samples.reserve(entries.size());
  Url url;
  for (ListEntry& e : entries) {
    std::string bad;
    if (e.item.empty()) {
      bad = o.base_url.empty() ? "empty URL" : "empty path";
    } else if (o.base_url.empty()) {
      bad = ParseUrl(e.item, &url);
    } else if (e.item.front() == '/' || e.item.find("://") != std::string::npos || HasDotDot(e.item)) {
      bad = "path " + e.item + " must be relative to base_url, without '..'";
    } else {
      bad = JoinUrl(o.base_url, e.item, &url);
    }
    if (bad.empty()) {
      const bool allowed = std::any_of(prefixes.begin(), prefixes.end(), [&](const Url& p) {
        return p.scheme == url.scheme && p.host == url.host && p.port == url.port && PathBelow(url.path, p.path);
      });
      if (!allowed) bad = url.full + " is not below any allowed URL prefix";
    }
    if (!bad.empty()) {
      problems->push_back({e.line, std::move(bad)});
      continue;
    }
    samples.push_back(SampleRef{std::move(url.full), e.label});
  }
  return samples;
}

// Validates the options, the base URL and the prefixes, then the entries.
Result<std::vector<SampleRef>> Check(std::vector<ListEntry> entries, std::vector<ListProblem> problems,
                                     const std::string& origin, const HttpSourceOptions& o) {
  SPDL_RETURN_IF_ERROR(CheckOptions(o));
  if (o.allowed_url_prefixes.empty()) {
    return PermissionDenied(origin + ": no allowed URL prefixes are configured, so no URL is allowed");
  }
  std::vector<Url> prefixes;
  for (const std::string& text : o.allowed_url_prefixes) {
    Url p;
    const std::string bad = ParseUrl(text, &p);
    if (!bad.empty()) return InvalidArgument("allowed URL prefix '" + text + "': " + bad);
    prefixes.push_back(std::move(p));
  }
  if (!o.base_url.empty()) {
    Url base;
    const std::string bad = ParseUrl(o.base_url, &base);
    if (!bad.empty()) return InvalidArgument("base_url '" + o.base_url + "': " + bad);
  }
  std::vector<SampleRef> samples = CheckEntries(std::move(entries), o, prefixes, &problems);
  if (!problems.empty()) return ListProblemsStatus(origin, std::move(problems), o.max_reported_errors);
  if (samples.empty()) return NotFound(origin + ": the list names no sample");
  return samples;
}

}  // namespace

namespace {

// An HTTP list's cached index: the checked samples (full URLs), and the list file's stamp.
struct HttpListIndex final : SourceIndex {
  std::vector<SampleRef> samples;
};

Result<std::shared_ptr<const HttpListIndex>> ScanHttpList(const std::string& list, const HttpSourceOptions& options,
                                                          std::string* real_list) {
  auto index = std::make_shared<HttpListIndex>();
  index->scan_start_ns = RealtimeNowNs();
  FileStamp stamp;
  SPDL_ASSIGN_OR_RETURN(std::string text, ReadListFile(list, options.allowed_roots, real_list, &stamp));
  index->inputs.push_back(std::move(stamp));
  ParsedList parsed = ParseSampleList(text, options.base_url.empty() ? "url" : "path");
  SPDL_ASSIGN_OR_RETURN(index->samples,
                        Check(std::move(parsed.entries), std::move(parsed.problems), *real_list, options));
  return std::shared_ptr<const HttpListIndex>(std::move(index));
}

}  // namespace

Result<std::unique_ptr<HttpSource>> HttpSource::Open(const HttpSourceOptions& options) {
  GlobalInit();
  SPDL_RETURN_IF_ERROR(CheckOptions(options));
  std::string real_list;
  std::shared_ptr<const HttpListIndex> index;
  if (options.index_cache == nullptr) {
    SPDL_ASSIGN_OR_RETURN(index, ScanHttpList(options.list, options, &real_list));
  } else {
    SPDL_ASSIGN_OR_RETURN(real_list, ResolveUnderRoots(options.list, options.allowed_roots));
    // The samples depend on the list, the base URL, the allowed prefixes (each URL is checked) and
    // the allowed roots (the list's own check).
    std::vector<std::string> key = {"http", real_list, options.base_url,
                                    std::to_string(options.allowed_url_prefixes.size())};
    key.insert(key.end(), options.allowed_url_prefixes.begin(), options.allowed_url_prefixes.end());
    key.insert(key.end(), options.allowed_roots.begin(), options.allowed_roots.end());
    SPDL_ASSIGN_OR_RETURN(index, options.index_cache->Get<HttpListIndex>(IndexKey(key), "url list " + real_list, [&] {
      std::string resolved;
      return ScanHttpList(real_list, options, &resolved);
    }));
  }
  std::shared_ptr<const std::vector<SampleRef>> samples(index, &index->samples);  // keeps the index alive
  return std::unique_ptr<HttpSource>(new HttpSource(real_list, std::move(samples), options));
}

Result<std::unique_ptr<HttpSource>> HttpSource::FromEntries(std::vector<ListEntry> entries, const std::string& origin,
                                                            const HttpSourceOptions& options) {
  GlobalInit();
  SPDL_ASSIGN_OR_RETURN(std::vector<SampleRef> samples, Check(std::move(entries), {}, origin, options));
  return std::unique_ptr<HttpSource>(
      new HttpSource(origin, std::make_shared<const std::vector<SampleRef>>(std::move(samples)), options));
}

HttpSource::HttpSource(std::string origin, std::shared_ptr<const std::vector<SampleRef>> samples,
                       const HttpSourceOptions& options)
    : origin_(std::move(origin)),
      samples_(std::move(samples)),
      options_(options),
      pool_(std::make_unique<Pool>(options_)) {}

HttpSource::~HttpSource() = default;

HttpSource::Attempt HttpSource::Try(const std::string& url, std::vector<uint8_t>* out) const {
  out->clear();
  Pool::Handle* h = pool_->Acquire();
  if (h == nullptr) return {Internal("GET " + url + ": cannot create a curl handle"), false, 0};
  CURL* c = h->curl;
  Sink sink;
  sink.out = out;
  sink.max = options_.max_sample_bytes;
  sink.handle = c;
  h->error[0] = '\0';
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &sink);
  requests_.fetch_add(1, std::memory_order_relaxed);
  const CURLcode rc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_off_t retry_after_s = 0;
  curl_easy_getinfo(c, CURLINFO_RETRY_AFTER, &retry_after_s);
  curl_off_t connect_us = 0;
  curl_easy_getinfo(c, CURLINFO_CONNECT_TIME_T, &connect_us);
  const std::string detail = h->error[0] != '\0' ? h->error : curl_easy_strerror(rc);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, nullptr);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, nullptr);
  pool_->Release(h);

  const std::string what = "GET " + url;
  const std::string limit = std::to_string(options_.max_sample_bytes);
  if (sink.too_big || rc == CURLE_FILESIZE_EXCEEDED) {
    out->clear();
    return {ResourceExhausted(what + ": the body is larger than the limit of " + limit + " bytes"), false, 0};
  }
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    out->clear();
    if (connect_us == 0) {
      return {Unavailable(what + ": could not connect within " + std::to_string(options_.connect_timeout_ms) + " ms (" +
                          detail + ")"),
              true, 0};
    }
    return {Unavailable(what + ": no complete response within " + std::to_string(options_.timeout_ms) + " ms (" +
                        detail + ")"),
            false, 0};
  }
  if (rc != CURLE_OK) {
    out->clear();
    return {Unavailable(what + ": " + detail), RetryableCurlError(rc), 0};
  }
  if (code >= 200 && code < 300) return {Status::Ok(), false, 0};
  out->clear();
  std::string m = what + ": HTTP " + std::to_string(code);
  const std::string reason = Reason(sink.status_line, code);
  if (!reason.empty()) m += " " + reason;
  if (code >= 300 && code < 400) m += " (redirects are not followed)";
  const int64_t retry_after_ms = static_cast<int64_t>(std::min<curl_off_t>(retry_after_s, 86'400)) * 1000;
  if (code == 429 || code >= 500) return {Unavailable(std::move(m)), true, retry_after_ms};
  if (code == 404 || code == 410) return {NotFound(std::move(m)), false, 0};
  if (code == 401 || code == 403) return {PermissionDenied(std::move(m)), false, 0};
  return {InvalidArgument(std::move(m)), false, 0};
}

Status HttpSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= size()) {
    out->clear();
    return InvalidArgument("http source " + origin_ + ": sample " + std::to_string(index) + " is out of range (" +
                           std::to_string(size()) + " samples)");
  }
  const std::string& url = (*samples_)[index].path;
  for (int attempt = 1;; ++attempt) {
    Attempt a = Try(url, out);
    if (a.status.ok()) return Status::Ok();
    if (!a.retryable || attempt >= options_.max_attempts) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      if (attempt == 1) return a.status;
      return Status(a.status.code(), a.status.message() + " (gave up after " + std::to_string(attempt) + " attempts)");
    }
    int64_t wait_ms = JitteredBackoff(options_, attempt);
    wait_ms = std::max(wait_ms, std::min(a.retry_after_ms, options_.max_backoff_ms));
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
    retries_.fetch_add(1, std::memory_order_relaxed);
  }
}

#else  // !SPDL_HAVE_CURL

struct HttpSource::Pool {};

Result<std::unique_ptr<HttpSource>> HttpSource::Open(const HttpSourceOptions&) {
  return FailedPrecondition("http source: spdld was built without libcurl (install libcurl4-openssl-dev)");
}
Result<std::unique_ptr<HttpSource>> HttpSource::FromEntries(std::vector<ListEntry>, const std::string&,
                                                            const HttpSourceOptions& options) {
  return Open(options);
}
HttpSource::~HttpSource() = default;
Status HttpSource::Read(uint64_t, std::vector<uint8_t>* out) const {
  out->clear();
  return FailedPrecondition("http source: spdld was built without libcurl");
}

#endif  // SPDL_HAVE_CURL

std::string HttpSource::Describe() const {
  std::string d =
      "http " + std::to_string(size()) + (options_.base_url.empty() ? " URLs" : " paths below " + options_.base_url);
  return d + " from " + origin_ + " (at most " + std::to_string(options_.max_in_flight) + " requests in flight)";
}

HttpStats HttpSource::stats() const {
  return HttpStats{requests_.load(std::memory_order_relaxed), retries_.load(std::memory_order_relaxed),
                   failures_.load(std::memory_order_relaxed)};
}

}  // namespace spdl::io
