#include "io/s3_client.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#if SPDL_HAVE_CURL
#include <curl/curl.h>

#include "common/ascii.h"
#include "io/curl_pool.h"
#endif
#if SPDL_HAVE_OPENSSL
#include <openssl/evp.h>
#endif

namespace spdl::io {

namespace {

// Percent-encodes everything but unreserved characters (and '/' when keep_slash), as SigV4 wants.
std::string UriEncode(const std::string& s, bool keep_slash) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                       c == '.' || c == '_' || c == '~' || (keep_slash && c == '/');
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Bucket names S3 accepts (3..63 of a-z 0-9 . -, starting and ending alphanumeric), also keeping
// the name safe to put in a host name or a path.
bool ValidBucket(const std::string& b) {
  if (b.size() < 3 || b.size() > 63) return false;
  for (char c : b) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  }
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  return alnum(b.front()) && alnum(b.back()) && b.find("..") == std::string::npos;
}

// The text between <tag> and </tag> from `from`; npos when absent.
std::string XmlField(const std::string& xml, const std::string& tag, size_t from, size_t to, size_t* end = nullptr) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t a = xml.find(open, from);
  if (a == std::string::npos || a >= to) return "";
  const size_t b = xml.find(close, a);
  if (b == std::string::npos || b > to) return "";
  if (end != nullptr) *end = b + close.size();
  return xml.substr(a + open.size(), b - a - open.size());
}

std::string XmlUnescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out += s[i];
      continue;
    }
    const size_t semi = s.find(';', i);
    if (semi == std::string::npos) {
      out += s[i];
      continue;
    }
    const std::string ent = s.substr(i + 1, semi - i - 1);
    if (ent == "amp") {
      out += '&';
    } else if (ent == "lt") {
      out += '<';
    } else if (ent == "gt") {
      out += '>';
    } else if (ent == "quot") {
      out += '"';
    } else if (ent == "apos") {
      out += '\'';
    } else if (!ent.empty() && ent[0] == '#') {
      const long v = ent.size() > 1 && (ent[1] == 'x' || ent[1] == 'X') ? std::strtol(ent.c_str() + 2, nullptr, 16)
                                                                        : std::strtol(ent.c_str() + 1, nullptr, 10);
      if (v > 0 && v < 128) out += static_cast<char>(v);
    } else {
      out += s.substr(i, semi - i + 1);
    }
    i = semi;
  }
  return out;
}

}  // namespace

bool IsS3Url(const std::string& text) { return text.rfind("s3://", 0) == 0; }

Result<S3Location> ParseS3Url(const std::string& text) {
  if (!IsS3Url(text)) return InvalidArgument("'" + text + "' is not an s3:// URL");
  const std::string rest = text.substr(5);
  const size_t slash = rest.find('/');
  S3Location loc;
  loc.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) loc.key = rest.substr(slash + 1);
  if (!ValidBucket(loc.bucket)) {
    return InvalidArgument("'" + text + "': '" + loc.bucket +
                           "' is not a valid bucket name (3 to 63 of a-z 0-9 . -, starting and ending with a letter "
                           "or digit)");
  }
  for (const char c : loc.key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return InvalidArgument("'" + text + "': control characters are not allowed in keys");
    }
  }
  return loc;
}

std::string S3EndpointFromEnv() {
  for (const char* name : {"AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return "";
}

std::string S3RegionFromEnv() {
  for (const char* name : {"AWS_REGION", "AWS_DEFAULT_REGION"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return v;
  }
  return "";
}

struct S3Client::Attempt {
  Status status;
  bool retryable = false;
};

#if SPDL_HAVE_CURL

namespace {

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct ParsedUrl {
  std::string scheme, host, port, path;
};

// Returns "" on success, else why the URL does not parse.
std::string Parse(const std::string& text, ParsedUrl* out) {
  CURLU* u = curl_url();
  if (u == nullptr) return "out of memory";
  std::string bad;
  if (curl_url_set(u, CURLUPART_URL, text.c_str(), 0) != CURLUE_OK) {
    bad = "not a URL";
  } else {
    auto part = [&](CURLUPart p, unsigned flags = 0) {
      char* s = nullptr;
      std::string v;
      if (curl_url_get(u, p, &s, flags) == CURLUE_OK && s != nullptr) v = s;
      curl_free(s);
      return v;
    };
    out->scheme = AsciiLower(part(CURLUPART_SCHEME));
    out->host = AsciiLower(part(CURLUPART_HOST));
    out->port = part(CURLUPART_PORT, CURLU_DEFAULT_PORT);
    out->path = part(CURLUPART_PATH);
    if (out->path.empty()) out->path = "/";
    if (out->scheme != "http" && out->scheme != "https") bad = "scheme '" + out->scheme + "' is not http or https";
    if (!part(CURLUPART_USER).empty()) bad = "credentials in URLs are not accepted";
  }
  curl_url_cleanup(u);
  return bad;
}

bool PathBelow(const std::string& path, const std::string& prefix) {
  if (prefix.empty() || prefix == "/") return true;
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  return prefix.back() == '/' || path.size() == prefix.size() || path[prefix.size()] == '/';
}

bool RetryableCurl(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// Per-transfer state for the callbacks.
struct Transfer {
  const S3Client::Sink* sink = nullptr;
  CURL* curl = nullptr;
  // Stall detection: the time the byte count last moved; a transfer idle for stall_ms is aborted.
  int64_t stall_ms = 0;  // 0 = off
  curl_off_t last_bytes = -1;
  std::chrono::steady_clock::time_point last_progress;
  bool stalled = false;
  long code = 0;  // known once the body starts
  uint64_t got = 0;
  uint64_t max = 0;
  bool too_big = false;
  bool stopped = false;
  bool ranged = false;  // a Range was asked for: the answer must be 206
  bool ignored_range = false;
  std::string error_body;  // of a non-2xx answer (S3's XML error), bounded
  std::string status_line;
  std::string etag;  // the last ETag header seen
};

size_t OnBody(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (t->code == 0) curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &t->code);
  if (t->code < 200 || t->code >= 300) {
    if (t->error_body.size() < 8192) t->error_body.append(data, std::min<size_t>(bytes, 8192));
    return bytes;
  }
  if (t->ranged && t->code == 200) {
    t->ignored_range = true;
    return 0;
  }
  if (t->got + bytes > t->max) {
    t->too_big = true;
    return 0;
  }
  if (!(*t->sink)(reinterpret_cast<const uint8_t*>(data), bytes)) {
    t->stopped = true;
    return 0;
  }
  t->got += bytes;
  return bytes;
}

// CURLOPT_XFERINFOFUNCTION: aborts a transfer whose received body byte count has not moved for
// stall_ms, the wait for the answer included.
int OnProgress(void* user, curl_off_t /*dltotal*/, curl_off_t dlnow, curl_off_t /*ultotal*/, curl_off_t /*ulnow*/) {
  auto* t = static_cast<Transfer*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (dlnow != t->last_bytes) {
    t->last_bytes = dlnow;
    t->last_progress = now;
    return 0;
  }
  if (t->stall_ms > 0 && now - t->last_progress > std::chrono::milliseconds(t->stall_ms)) {
    t->stalled = true;
    return 1;  // CURLE_ABORTED_BY_CALLBACK
  }
  return 0;
}

size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  if (bytes >= 5 && std::string_view(data, 5) == "HTTP/") {
    t->status_line.assign(data, bytes);
    while (!t->status_line.empty() && (t->status_line.back() == '\r' || t->status_line.back() == '\n')) {
      t->status_line.pop_back();
    }
  } else if (bytes > 5 && AsciiLower(std::string(data, 5)) == "etag:") {
    std::string v(data + 5, bytes - 5);
    const size_t a = v.find_first_not_of(" \t");
    const size_t b = v.find_last_not_of(" \t\r\n");
    t->etag = a == std::string::npos ? "" : v.substr(a, b - a + 1);
  }
  return bytes;
}

}  // namespace

// The curl handles of one client: at most max_in_flight (S3Client::Create); options are set per request.
struct S3Client::Pool : CurlPool {
  using CurlPool::CurlPool;
};

S3Client::S3Client(S3Options options) : options_(std::move(options)) {}
S3Client::~S3Client() = default;

Result<std::unique_ptr<S3Client>> S3Client::Create(S3Options o) {
  GlobalInit();
  std::string bad;
  if (o.connect_timeout_ms <= 0) bad += " connect_timeout_ms must be > 0;";
  if (o.timeout_ms <= 0) bad += " timeout_ms must be > 0;";
  if (o.stall_timeout_ms < 0) bad += " stall_timeout_ms must be >= 0;";
  if (o.max_attempts < 1) bad += " max_attempts must be >= 1;";
  if (o.initial_backoff_ms < 0 || o.max_backoff_ms < o.initial_backoff_ms) bad += " bad backoff bounds;";
  if (o.max_in_flight < 1) bad += " max_in_flight must be >= 1;";
  if (o.region.empty()) o.region = "us-east-1";
  for (char c : o.region) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
      bad += " region '" + o.region + "' is not a region name;";
      break;
    }
  }
  if (!bad.empty()) {
    bad.pop_back();
    return InvalidArgument("s3:" + bad);
  }
  if (o.allowed_url_prefixes.empty()) {
    return PermissionDenied("s3: this spdld fetches no URL (its config has no allowed_url_prefixes)");
  }
  std::unique_ptr<S3Client> c(new S3Client(std::move(o)));
  const S3Options& opt = c->options_;
  c->endpoint_ = opt.endpoint_url.empty() ? "https://s3." + opt.region + ".amazonaws.com" : opt.endpoint_url;
  while (!c->endpoint_.empty() && c->endpoint_.back() == '/') c->endpoint_.pop_back();
  ParsedUrl e;
  if (const std::string why = Parse(c->endpoint_, &e); !why.empty()) {
    return InvalidArgument("s3 endpoint_url '" + c->endpoint_ + "': " + why);
  }
  c->sigv4_ = "aws:amz:" + opt.region + ":s3";
  c->pool_ = std::make_unique<Pool>(opt.max_in_flight);
  return c;
}

Result<std::string> S3Client::ObjectUrl(const S3Location& loc) const {
  ParsedUrl e;
  Parse(endpoint_, &e);  // checked at Create
  const bool virtual_hosted = options_.addressing == S3Addressing::kVirtual ||
                              (options_.addressing == S3Addressing::kAuto && options_.endpoint_url.empty());
  std::string base_path = e.path == "/" ? "" : e.path;
  while (!base_path.empty() && base_path.back() == '/') base_path.pop_back();
  std::string url;
  const std::string port =
      (e.scheme == "http" && e.port == "80") || (e.scheme == "https" && e.port == "443") ? "" : ":" + e.port;
  if (virtual_hosted) {
    if (loc.bucket.find('.') != std::string::npos && e.scheme == "https") {
      return InvalidArgument(loc.ToString() +
                             ": a bucket name with dots cannot be addressed virtual-hosted over https (set "
                             "source.s3.addressing: path)");
    }
    url = e.scheme + "://" + loc.bucket + "." + e.host + port + base_path + "/" + UriEncode(loc.key, true);
  } else {
    url = e.scheme + "://" + e.host + port + base_path + "/" + loc.bucket + "/" + UriEncode(loc.key, true);
  }
  ParsedUrl u;
  Parse(url, &u);
  for (const std::string& text : options_.allowed_url_prefixes) {
    ParsedUrl p;
    if (!Parse(text, &p).empty()) continue;
    if (p.scheme == u.scheme && p.host == u.host && p.port == u.port && PathBelow(u.path, p.path)) return url;
  }
  return PermissionDenied(loc.ToString() + ": " + url + " is not below any of the daemon's allowed_url_prefixes");
}

S3Client::Attempt S3Client::Try(const std::string& url, const std::string& what, uint64_t offset, uint64_t end,
                                const Sink& sink, const std::string& if_match, uint64_t* delivered,
                                std::string* etag) const {
  Pool::Handle* h = pool_->Acquire();
  if (h == nullptr) return {Internal(what + ": cannot create a curl handle"), false};
  CURL* c = h->curl;
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options_.connect_timeout_ms));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout_ms));
  curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(c, CURLOPT_USERAGENT, options_.user_agent.c_str());
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h->error);
  h->error[0] = '\0';
  curl_slist* headers = nullptr;
  if (!options_.credentials.empty()) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, options_.credentials.access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, options_.credentials.secret_access_key.c_str());
    if (!options_.credentials.session_token.empty()) {
      headers = curl_slist_append(headers, ("x-amz-security-token: " + options_.credentials.session_token).c_str());
    }
    // S3 requires the payload hash header on signed requests; an empty body's hash.
    headers = curl_slist_append(
        headers, "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  }
  if (!if_match.empty()) headers = curl_slist_append(headers, ("If-Match: " + if_match).c_str());
  if (headers != nullptr) curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  std::string range;
  if (offset > 0 || end != kToEnd) {
    range = std::to_string(offset) + "-" + (end == kToEnd ? "" : std::to_string(end - 1));
    curl_easy_setopt(c, CURLOPT_RANGE, range.c_str());
  }
  Transfer t;
  t.ranged = !range.empty();
  t.stall_ms = options_.stall_timeout_ms;
  t.last_progress = std::chrono::steady_clock::now();
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &OnProgress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &t);
  t.sink = &sink;
  t.curl = c;
  t.max = options_.max_object_bytes;
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  requests_.fetch_add(1, std::memory_order_relaxed);
  const CURLcode rc = curl_easy_perform(c);
  long code = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_off_t length = -1;
  curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
  const std::string detail = h->error[0] != '\0' ? h->error : curl_easy_strerror(rc);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, nullptr);
  // The credentials do not stay in an idle handle.
  curl_easy_reset(c);
  pool_->Release(h);
  curl_slist_free_all(headers);
  *delivered = t.got;
  if (code >= 200 && code < 300 && etag != nullptr && etag->empty()) *etag = t.etag;
  bytes_.fetch_add(t.got, std::memory_order_relaxed);
  if (code >= 400) {
    (code < 500 && code != 429 ? errors_4xx_ : errors_5xx_).fetch_add(1, std::memory_order_relaxed);
  } else if (rc != CURLE_OK || t.stalled) {
    if (!t.stopped) errors_network_.fetch_add(1, std::memory_order_relaxed);
  }

  if (t.ignored_range) return {DataLoss(what + ": the store ignored a Range request (answered 200)"), false};
  if (t.stalled) {
    return {Unavailable(what + ": no byte for " + std::to_string(options_.stall_timeout_ms) + " ms after " +
                        std::to_string(t.got) + " bytes (a stalled transfer)"),
            true};
  }
  if (t.stopped) return {Cancelled(what + ": stopped by the reader"), false};
  if (t.too_big || rc == CURLE_FILESIZE_EXCEEDED) {
    return {
        ResourceExhausted(what + ": larger than the limit of " + std::to_string(options_.max_object_bytes) + " bytes"),
        false};
  }
  if (rc == CURLE_OPERATION_TIMEDOUT) {
    return {Unavailable(what + ": no complete response within " + std::to_string(options_.timeout_ms) + " ms (" +
                        detail + ")"),
            true};
  }
  if (rc != CURLE_OK) return {Unavailable(what + ": " + detail), RetryableCurl(rc)};
  if (code >= 200 && code < 300) {
    if (length >= 0 && t.got != static_cast<uint64_t>(length)) {
      return {Unavailable(what + ": the body ended after " + std::to_string(t.got) + " of " + std::to_string(length) +
                          " bytes"),
              true};
    }
    return {Status::Ok(), false};
  }
  std::string m = what + ": HTTP " + std::to_string(code);
  const size_t sp = t.status_line.find(' ', t.status_line.find(' ') + 1);
  if (t.status_line.find(' ') != std::string::npos && sp != std::string::npos) m += t.status_line.substr(sp);
  // S3's error code (never its message: some stores echo request details there).
  const std::string s3_code = XmlUnescape(XmlField(t.error_body, "Code", 0, t.error_body.size()));
  if (!s3_code.empty() && s3_code.size() < 64) m += " (" + s3_code + ")";
  if (code == 429 || code >= 500) return {Unavailable(std::move(m)), true};
  if (code == 404) return {NotFound(std::move(m)), false};
  if (code == 401 || code == 403) return {PermissionDenied(std::move(m)), false};
  if (code == 412) {
    return {FailedPrecondition(m + ": the object changed since it was first read or indexed"), false};
  }
  if (code == 416) return {InvalidArgument(std::move(m) + " (the range is past the end of the object)"), false};
  return {InvalidArgument(std::move(m)), false};
}

namespace {

// The MD5 of a whole body, fed in order; "" when OpenSSL is not built in.
class Md5 {
 public:
  Md5() {
#if SPDL_HAVE_OPENSSL
    ctx_ = EVP_MD_CTX_new();
    if (ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_md5(), nullptr) != 1) {
      EVP_MD_CTX_free(ctx_);
      ctx_ = nullptr;
    }
#endif
  }
  ~Md5() {
#if SPDL_HAVE_OPENSSL
    if (ctx_ != nullptr) EVP_MD_CTX_free(ctx_);
#endif
  }
  Md5(const Md5&) = delete;
  Md5& operator=(const Md5&) = delete;
  void Update([[maybe_unused]] const uint8_t* d, [[maybe_unused]] size_t n) {
#if SPDL_HAVE_OPENSSL
    if (ctx_ != nullptr) EVP_DigestUpdate(ctx_, d, n);
#endif
  }
  std::string HexDigest() {
#if SPDL_HAVE_OPENSSL
    if (ctx_ == nullptr) return "";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_, md, &len) != 1) return "";
    static const char* kHex = "0123456789abcdef";
    std::string out;
    for (unsigned int i = 0; i < len; ++i) {
      out += kHex[md[i] >> 4];
      out += kHex[md[i] & 15];
    }
    return out;
#else
    return "";
#endif
  }

 private:
#if SPDL_HAVE_OPENSSL
  EVP_MD_CTX* ctx_ = nullptr;
#endif
};

// The MD5 in an ETag ("\"9e107d9d372bb6826bd81d3542a419d6\""), or "" when it is not one (a
// multipart upload's "...-12", a store's own format).
std::string EtagMd5(const std::string& etag) {
  std::string e = etag;
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  if (e.size() != 32) return "";
  for (char& ch : e) {
    if (ch >= 'A' && ch <= 'F') ch = static_cast<char>(ch - 'A' + 'a');
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return "";
  }
  return e;
}

}  // namespace

Status S3Client::WithRetries(const std::string& url, const std::string& what, uint64_t offset, uint64_t length,
                             const Sink& sink, const std::function<void()>& restart, const std::string& if_match,
                             std::string* etag_out) const {
  const uint64_t end = length == kToEnd ? kToEnd : offset + length;
  uint64_t pos = offset;
  std::string etag;  // of the first answer: later attempts must read the same object
  // A whole object read without restarts: its MD5 is checked against an MD5 ETag.
  const bool whole = offset == 0 && length == kToEnd && !restart;
  Md5 md5;
  const Sink checked = [&](const uint8_t* d, size_t n) {
    md5.Update(d, n);
    return sink(d, n);
  };
  thread_local std::minstd_rand rng(static_cast<uint32_t>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  for (int attempt = 1;; ++attempt) {
    uint64_t delivered = 0;
    if (restart) {
      restart();
      pos = offset;
    }
    if (pos > offset) resumed_.fetch_add(1, std::memory_order_relaxed);
    const std::string& match = !if_match.empty() ? if_match : (pos > offset ? etag : std::string());
    Attempt a = Try(url, what, pos, end, whole ? checked : sink, match, &delivered, &etag);
    pos += delivered;
    if (a.status.ok()) {
      if (end != kToEnd && pos != end) {
        return DataLoss(what + ": got " + std::to_string(pos - offset) + " bytes of the " + std::to_string(length) +
                        " asked for (the object is shorter)");
      }
      if (whole) {
        const std::string want = EtagMd5(etag);
        const std::string got = want.empty() ? "" : md5.HexDigest();
        if (!got.empty() && got != want) {
          return DataLoss(what + ": the body's MD5 " + got + " differs from the object's ETag " + want);
        }
      }
      if (etag_out != nullptr) *etag_out = etag;
      return Status::Ok();
    }
    if (!a.retryable || attempt >= options_.max_attempts) {
      if (attempt == 1) return a.status;
      return Status(a.status.code(), a.status.message() + " (gave up after " + std::to_string(attempt) + " attempts)");
    }
    int64_t d = options_.initial_backoff_ms;
    for (int i = 1; i < attempt && d < options_.max_backoff_ms; ++i) d *= 2;
    d = std::min(d, options_.max_backoff_ms);
    d -= static_cast<int64_t>(rng() % static_cast<uint64_t>(d / 2 + 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(d));
    retries_.fetch_add(1, std::memory_order_relaxed);
  }
}

Status S3Client::Get(const S3Location& loc, uint64_t offset, uint64_t length, const Sink& sink,
                     const std::string& if_match, std::string* etag) const {
  SPDL_ASSIGN_OR_RETURN(const std::string url, ObjectUrl(loc));
  if (length == 0) return Status::Ok();
  return WithRetries(url, "GET " + loc.ToString(), offset, length, sink, nullptr, if_match, etag);
}

Status S3Client::GetBytes(const S3Location& loc, uint64_t offset, uint64_t length, std::vector<uint8_t>* out,
                          const std::string& if_match) const {
  out->clear();
  if (length != kToEnd && length <= options_.max_object_bytes) out->reserve(length);
  Status s = Get(
      loc, offset, length,
      [out](const uint8_t* d, size_t n) {
        out->insert(out->end(), d, d + n);
        return true;
      },
      if_match);
  if (!s.ok()) out->clear();
  return s;
}

Result<std::vector<S3Object>> S3Client::List(const std::string& bucket, const std::string& prefix) const {
  SPDL_ASSIGN_OR_RETURN(std::string base, ObjectUrl(S3Location{bucket, ""}));
  std::vector<S3Object> objects;
  std::string token;
  const std::string what = "LIST s3://" + bucket + "/" + prefix;
  for (int page = 0; page < 1'000'000; ++page) {
    // Query parameters in sorted order, each encoded: the canonical form SigV4 signs.
    std::string query;
    if (!token.empty()) query += "continuation-token=" + UriEncode(token, false) + "&";
    query += "list-type=2&prefix=" + UriEncode(prefix, false);
    std::string xml;
    SPDL_RETURN_IF_ERROR(WithRetries(
        base + "?" + query, what, 0, kToEnd,
        [&](const uint8_t* d, size_t n) {
          xml.append(reinterpret_cast<const char*>(d), n);
          return xml.size() < (size_t{256} << 20);
        },
        [&] { xml.clear(); }));
    size_t pos = 0;
    for (;;) {
      size_t end = 0;
      const size_t at = xml.find("<Contents>", pos);
      if (at == std::string::npos) break;
      const size_t close = xml.find("</Contents>", at);
      if (close == std::string::npos) return DataLoss(what + ": a malformed ListObjectsV2 answer");
      S3Object o;
      o.key = XmlUnescape(XmlField(xml, "Key", at, close, &end));
      o.size = std::strtoull(XmlField(xml, "Size", at, close).c_str(), nullptr, 10);
      o.etag = XmlUnescape(XmlField(xml, "ETag", at, close));
      if (!o.key.empty()) objects.push_back(std::move(o));
      pos = close;
    }
    const bool truncated = XmlField(xml, "IsTruncated", 0, xml.size()) == "true";
    token = XmlUnescape(XmlField(xml, "NextContinuationToken", 0, xml.size()));
    if (!truncated) break;
    if (token.empty()) return DataLoss(what + ": a truncated listing without a continuation token");
  }
  std::sort(objects.begin(), objects.end(), [](const S3Object& a, const S3Object& b) { return a.key < b.key; });
  return objects;
}

#else  // !SPDL_HAVE_CURL

struct S3Client::Pool {};
S3Client::S3Client(S3Options options) : options_(std::move(options)) {}
S3Client::~S3Client() = default;
Result<std::unique_ptr<S3Client>> S3Client::Create(S3Options) {
  return FailedPrecondition("s3: spdld was built without libcurl (install libcurl4-openssl-dev)");
}
Result<std::string> S3Client::ObjectUrl(const S3Location&) const { return FailedPrecondition("s3: no libcurl"); }
Status S3Client::Get(const S3Location&, uint64_t, uint64_t, const Sink&, const std::string&, std::string*) const {
  return FailedPrecondition("s3: no libcurl");
}
Status S3Client::GetBytes(const S3Location&, uint64_t, uint64_t, std::vector<uint8_t>*, const std::string&) const {
  return FailedPrecondition("s3: no libcurl");
}
Result<std::vector<S3Object>> S3Client::List(const std::string&, const std::string&) const {
  return FailedPrecondition("s3: no libcurl");
}

#endif  // SPDL_HAVE_CURL

S3Stats S3Client::stats() const {
  S3Stats s;
  s.requests = requests_.load(std::memory_order_relaxed);
  s.retries = retries_.load(std::memory_order_relaxed);
  s.resumed = resumed_.load(std::memory_order_relaxed);
  s.bytes = bytes_.load(std::memory_order_relaxed);
  s.errors_4xx = errors_4xx_.load(std::memory_order_relaxed);
  s.errors_5xx = errors_5xx_.load(std::memory_order_relaxed);
  s.errors_network = errors_network_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace spdl::io
