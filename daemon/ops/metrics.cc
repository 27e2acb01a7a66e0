#include "ops/metrics.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/address.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <sstream>
#include <string_view>
#include <vector>

#include "pipeline/stage_stats.h"
#include "proto/job_stats_fields.h"

namespace spdl::ops {
namespace {

// The internal histogram buckets exported as `le` bounds: every 4th (an octave) from 16 us to ~67 s.
constexpr int kFirstBound = 12;  // BucketUpperNanos(12) = 16 us
constexpr int kLastBound = 100;  // BucketUpperNanos(100) = 2^26 us, ~67 s
static_assert(kLastBound < pipeline::kHistogramBuckets - 1);

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Labels = std::vector<std::pair<std::string, std::string>>;

std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Collects samples per family so each family is written once with its HELP and TYPE.
class Exposition {
 public:
  // One sample of family `family` (default: `name`; a histogram's samples name their family).
  void Add(const std::string& name, const char* type, const char* help, const Labels& labels, double value,
           const std::string& family = "") {
    const std::string& fam = family.empty() ? name : family;
    Family& f = families_[fam];
    if (f.type.empty()) {
      order_.push_back(fam);
      f.type = type;
      f.help = help;
    }
    std::string line = name;
    if (!labels.empty()) {
      line += '{';
      for (size_t i = 0; i < labels.size(); ++i) {
        line += (i ? "," : "") + labels[i].first + "=\"" + Escape(labels[i].second) + "\"";
      }
      line += '}';
    }
    line += ' ' + fmt::format("{}", value) + '\n';
    f.lines += line;
  }
  // A histogram family: NAME_bucket{labels..., le} (cumulative, at the octave bounds of `counts`,
  // whose buckets are pipeline::StageStats's), NAME_sum = `sum`, NAME_count = every count.
  template <typename Counts>
  void AddHistogram(const std::string& name, const char* help, const Labels& labels, const Counts& counts, double sum) {
    uint64_t total = 0;
    int b = 0;
    for (const auto& c : counts) {
      total += c;
      // One bound per octave from 16 us to ~67 s (the last internal bucket is open: +Inf only).
      if (b >= kFirstBound && b <= kLastBound && b % 4 == 0) {
        Labels l = labels;
        l.emplace_back("le", fmt::format("{}", pipeline::StageStats::BucketUpperNanos(b) / 1e9));
        Add(name + "_bucket", "histogram", help, l, double(total), name);
      }
      ++b;
    }
    Labels inf = labels;
    inf.emplace_back("le", "+Inf");
    Add(name + "_bucket", "histogram", help, inf, double(total), name);
    Add(name + "_sum", "histogram", help, labels, sum, name);
    Add(name + "_count", "histogram", help, labels, double(total), name);
  }
  std::string Text() const {
    std::string out;
    for (const auto& name : order_) {
      const Family& f = families_.at(name);
      out += "# HELP " + name + " " + f.help + "\n# TYPE " + name + " " + f.type + "\n" + f.lines;
    }
    return out;
  }

 private:
  struct Family {
    std::string type, help, lines;
  };
  std::map<std::string, Family> families_;
  std::vector<std::string> order_;
};

// The rows of `table` described for the metrics on message `m`, each one series with `labels`.
void AddRows(Exposition* e, std::span<const proto::JobStatField> table, const google::protobuf::Message& m,
             const Labels& labels) {
  for (const auto& f : table) {
    if (f.surfaces & proto::kMetrics) e->Add(f.metric, f.type, f.help, labels, proto::StatValue(m, f));
  }
}

// One scrape: read the request, answer, close.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const std::function<std::string(std::optional<uid_t>)>* render)
      : stream_(std::move(socket)), render_(render) {}

  void Start() {
    stream_.expires_after(std::chrono::seconds(10));
    http::async_read(stream_, buffer_, request_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return;  // the scraper went away or sent garbage: nothing to answer
      self->Answer();
    });
  }

 private:
  void Answer() {
    response_.version(request_.version());
    response_.keep_alive(false);
    response_.set(http::field::server, "spdld");
    const std::string target(request_.target());
    if (request_.method() != http::verb::get && request_.method() != http::verb::head) {
      response_.result(http::status::method_not_allowed);
      response_.set(http::field::content_type, "text/plain");
      response_.body() = "only GET /metrics\n";
    } else if (target != "/metrics" && target.rfind("/metrics?", 0) != 0) {
      response_.result(http::status::not_found);
      response_.set(http::field::content_type, "text/plain");
      response_.body() = "spdld serves /metrics\n";
    } else {
      response_.result(http::status::ok);
      response_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      boost::system::error_code ec1, ec2;
      const tcp::endpoint local = stream_.socket().local_endpoint(ec1);
      const tcp::endpoint peer = stream_.socket().remote_endpoint(ec2);
      std::optional<uid_t> who;
      if (!ec1 && !ec2) {
        who = LoopbackPeerUid(local, peer);
        // No socket of this host: a scraper on another machine, which only an operator's
        // metrics_bind lets in (e.g. Prometheus scraping the pod IP): it sees every job, as root.
        if (!who && !peer.address().is_loopback()) who = 0;
      }
      response_.body() = (*render_)(who);
    }
    response_.prepare_payload();
    if (request_.method() == http::verb::head) response_.body().clear();
    http::async_write(stream_, response_, [self = shared_from_this()](beast::error_code, size_t) {
      beast::error_code ec;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    });
  }

  beast::tcp_stream stream_;
  const std::function<std::string(std::optional<uid_t>)>* render_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  http::response<http::string_body> response_;
};

}  // namespace

std::string RenderPrometheus(const proto::DaemonStatus& st, const DaemonFacts& facts) {
  Exposition e;
  e.Add("spdld_build_info", "gauge", "The running spdld's version (value 1).", {{"version", SPDLD_VERSION}}, 1);
  // The DaemonStatus fields, from their one description (proto/job_stats_fields.h), by name.
  AddRows(&e, proto::DaemonStatFields(), st, {});
  // The GPUs, streams and their consumer groups, from their descriptions (proto/job_stats_fields.h):
  // one series per device, per stream, and per group of a stream.
  for (const auto& g : st.gpu_devices()) AddRows(&e, proto::GpuDeviceStatFields(), g, {{"device", g.device()}});
  e.Add("spdld_draining", "gauge", "1 while spdld drains (no new jobs).", {}, facts.draining ? 1 : 0);
  for (const auto& s : st.streams()) {
    AddRows(&e, proto::StreamStatFields(), s, {{"stream", s.name()}});
    for (const auto& g : s.groups()) {
      AddRows(&e, proto::StreamGroupStatFields(), g, {{"stream", s.name()}, {"group", g.name()}});
    }
  }
  // The JobStats fields, from their one description (proto/job_stats_fields.h): node-wide ones
  // (spdld_cache_*) once, without job labels, while a job runs with the cache on; per-job ones
  // (spdld_job_*) for every job; the client-wait histogram below.
  auto exported = [](const proto::JobStatField& f, const char* prefix) {
    return (f.surfaces & proto::kMetrics) && std::string_view(f.type) != "histogram" &&
           std::string_view(f.metric).rfind(prefix, 0) == 0;
  };
  if (st.jobs_size() > 0 && st.jobs(0).stats().cache_budget_bytes() > 0) {
    const auto& c = st.jobs(0).stats();  // node-wide figures, the same in every job's stats
    for (const auto& f : proto::JobStatFields()) {
      if (exported(f, "spdld_cache_")) e.Add(f.metric, f.type, f.help, {}, proto::JobStatValue(c, f));
    }
  }
  if (st.jobs_size() > 0 && st.jobs(0).stats().shard_cache_budget_bytes() > 0) {
    const auto& c = st.jobs(0).stats();  // the node's shard cache, the same in every job's stats
    for (const auto& f : proto::JobStatFields()) {
      if (exported(f, "spdld_shard_cache_")) e.Add(f.metric, f.type, f.help, {}, proto::JobStatValue(c, f));
    }
  }
  for (const auto& j : st.jobs()) {
    const Labels labels = {
        {"job_id", std::to_string(j.job_id())}, {"uid", std::to_string(j.uid())}, {"rank", std::to_string(j.rank())}};
    for (const auto& f : proto::JobStatFields()) {
      if (!exported(f, "spdld_job_")) continue;
      if (f.per == nullptr) {
        e.Add(f.metric, f.type, f.help, labels, proto::JobStatValue(j.stats(), f));
        continue;
      }
      const std::vector<double> values = proto::JobStatValues(j.stats(), f);  // one series per entry
      for (size_t i = 0; i < values.size(); ++i) {
        Labels l = labels;
        l.emplace_back(f.per, std::to_string(i));
        e.Add(f.metric, f.type, f.help, l, values[i]);
      }
    }
    AddRows(&e, proto::JobSummaryFields(), j, labels);  // the job's own figures (region_bytes)
  }
  const proto::JobStatField* wait = proto::FindJobStatField("client_wait_histogram");
  for (const auto& j : st.jobs()) {
    const Labels labels = {
        {"job_id", std::to_string(j.job_id())}, {"uid", std::to_string(j.uid())}, {"rank", std::to_string(j.rank())}};
    e.AddHistogram(wait->metric, wait->help, labels, j.stats().client_wait_histogram(),
                   j.stats().client_wait_seconds());
  }
  for (const auto& j : st.jobs()) {
    for (const auto& s : j.stats().stages()) {
      const Labels labels = {{"job_id", std::to_string(j.job_id())}, {"stage", s.name()}};
      // The StageStats fields, from their one description (proto/job_stats_fields.h), by name.
      for (const auto& f : proto::StageStatFields()) {
        if ((f.surfaces & proto::kMetrics) == 0 || std::string_view(f.type) == "histogram") continue;
        e.Add(f.metric, f.type, f.help, labels, proto::StageStatValue(s, f));
      }
    }
  }
  const proto::JobStatField* task_times = proto::FindStageStatField("task_histogram");
  for (const auto& j : st.jobs()) {
    for (const auto& s : j.stats().stages()) {
      const Labels labels = {{"job_id", std::to_string(j.job_id())}, {"stage", s.name()}};
      e.AddHistogram(task_times->metric, task_times->help, labels, s.task_histogram(), s.busy_seconds());
    }
  }
  return e.Text();
}

// "0100007F:1F90" for 127.0.0.1:8080 as /proc/net/tcp writes it (the address as the host's 32-bit
// words in hex, the port in hex); IPv6 as four such words.
static std::string ProcNetAddress(const tcp::endpoint& e) {
  char buf[64];
  std::string out;
  if (e.address().is_v4()) {
    const auto b = e.address().to_v4().to_bytes();
    uint32_t word = 0;
    std::memcpy(&word, b.data(), 4);
    std::snprintf(buf, sizeof(buf), "%08X", word);
    out = buf;
  } else {
    const auto b = e.address().to_v6().to_bytes();
    for (int i = 0; i < 4; ++i) {
      uint32_t word = 0;
      std::memcpy(&word, b.data() + 4 * i, 4);
      std::snprintf(buf, sizeof(buf), "%08X", word);
      out += buf;
    }
  }
  std::snprintf(buf, sizeof(buf), ":%04X", e.port());
  return out + buf;
}

std::optional<uid_t> LoopbackPeerUid(const tcp::endpoint& local, const tcp::endpoint& peer,
                                     const std::string& proc_root) {
  // The peer's own socket: its local address is `peer`, its remote one `local`.
  const std::string want_local = ProcNetAddress(peer), want_remote = ProcNetAddress(local);
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc_root + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, loc, rem, st, queues, timer, retr;
      long uid = -1;
      if (!(f >> sl >> loc >> rem >> st >> queues >> timer >> retr >> uid)) continue;
      if (loc == want_local && rem == want_remote) return static_cast<uid_t>(uid);
    }
  }
  return std::nullopt;
}

MetricsServer::MetricsServer(asio::io_context* io, std::function<std::string(std::optional<uid_t>)> render)
    : render_(std::move(render)), acceptor_(*io) {}

MetricsServer::~MetricsServer() { Stop(); }

Status MetricsServer::Start(const std::string& address, uint16_t port) {
  boost::system::error_code ec;
  const asio::ip::address addr = asio::ip::make_address(address, ec);
  if (ec) return InvalidArgument("metrics_bind '" + address + "' is not an IPv4 or IPv6 address");
  const tcp::endpoint ep(addr, port);
  const std::string where = (addr.is_v6() ? "[" + address + "]" : address) + ":" + std::to_string(port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return Unavailable("cannot serve metrics on " + where + ": " + ec.message() +
                       " (choose another metrics_port or metrics_bind, or metrics_port 0 to turn metrics off)");
  }
  port_ = acceptor_.local_endpoint(ec).port();
  endpoint_ = (addr.is_v6() ? "[" + address + "]" : address) + ":" + std::to_string(port_);
  Accept();
  return Status::Ok();
}

void MetricsServer::Accept() {
  acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec != asio::error::operation_aborted && !stopped_) {
        uint64_t dropped = 0;
        if (log_limiter_.Allow("accept", &dropped)) {
          spdlog::warn("metrics: accept: {}{}", ec.message(), LogLimiter::Note(dropped));
        }
        Accept();
      }
      return;
    }
    std::make_shared<Connection>(std::move(socket), &render_)->Start();
    Accept();
  });
}

void MetricsServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
}

}  // namespace spdl::ops
