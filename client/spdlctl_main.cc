// spdlctl: what an operator or a user asks the node's spdld — the daemon's state, the jobs it runs
// and their per-stage figures — cancelling a job, and draining the daemon. Each uid sees and cancels only its own jobs
// (root: all). `--json` prints the daemon's answer as JSON instead of tables.
#include <google/protobuf/util/json_util.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <exception>
#include <iostream>

#include "spdl/control.h"

namespace {

using spdl::proto::ClientMessage;
using spdl::proto::DaemonStatus;
using spdl::proto::JobSummary;

int Fail(const std::string& message) {
  std::fprintf(stderr, "spdlctl: %s\n", message.c_str());
  return 1;
}

void PrintJson(const google::protobuf::Message& m) { std::cout << spdl::client::OperatorJson(m); }

double Rate(const JobSummary& j) { return j.stats().seconds() > 0 ? j.stats().samples() / j.stats().seconds() : 0; }

void PrintStatus(const DaemonStatus& s) { std::cout << spdl::client::OperatorStatusText(s); }

// The tables come from the statistics' one description (proto/job_stats_fields.h, kText rows).
void PrintJobs(const DaemonStatus& s) { std::cout << spdl::client::OperatorJobsText(s); }

void PrintStats(const JobSummary& j) {
  const auto& st = j.stats();
  std::printf("job %" PRIu64 " (uid %u, rank %u/%u, %s): %" PRIu64 " samples in %" PRIu64 " batches, %" PRIu64
              " skipped, %.1f samples/s (%.1f over the last %.0f s), first batch %.3f s, weight %u\n",
              j.job_id(), j.uid(), j.rank(), j.world_size(), j.source().c_str(), st.samples(), st.batches(),
              st.skipped(), Rate(j), st.window_samples_per_s(), st.stages_size() ? st.stages(0).window_seconds() : 0.0,
              st.first_batch_seconds(), st.weight());
  std::printf("  client waited %.2f s for data; %u batches ready and waiting, %u filling; %" PRIu64 " of %" PRIu64
              " samples tried failed\n",
              st.client_wait_seconds(), st.batches_ready(), st.batches_filling(), st.samples_failed(),
              st.samples_tried());
  if (st.cache_budget_bytes() > 0) {
    const uint64_t reads = st.cache_hits() + st.cache_misses();
    const double hit_rate = reads ? 100.0 * static_cast<double>(st.cache_hits()) / static_cast<double>(reads) : 0.0;
    std::printf("  sample cache: %" PRIu64 " hits, %" PRIu64
                " misses (%.1f%% hit rate); node-wide %.1f of %.1f MiB held, %" PRIu64 " evictions\n",
                st.cache_hits(), st.cache_misses(), hit_rate, static_cast<double>(st.cache_bytes()) / (1 << 20),
                static_cast<double>(st.cache_budget_bytes()) / (1 << 20), st.cache_evictions());
  }
  if (st.source_samples_size() > 0) {  // a mix: samples per source, in the job's `sources:` order
    std::printf("  mix: samples by source");
    for (int i = 0; i < st.source_samples_size(); ++i) {
      std::printf("%s %d: %" PRIu64, i ? "," : "", i, st.source_samples(i));
    }
    std::printf("\n");
  }
  if (st.s3_requests() > 0) {
    std::printf("  object storage: %" PRIu64 " requests, %" PRIu64 " retries, failed attempts %" PRIu64
                " 4xx / %" PRIu64 " 5xx / %" PRIu64 " network, %.1f MiB received; shards %" PRIu64
                " found in the node cache, %" PRIu64 " downloaded\n",
                st.s3_requests(), st.s3_retries(), st.s3_errors_4xx(), st.s3_errors_5xx(), st.s3_errors_network(),
                static_cast<double>(st.s3_fetched_bytes()) / (1 << 20), st.shard_cache_hits(), st.shard_cache_misses());
  }
  if (st.shard_cache_budget_bytes() > 0) {
    std::printf("  shard cache (node-wide): %.1f of %.1f MiB held, %.1f MiB fetched, %" PRIu64 " evictions, %" PRIu64
                " corrupt files refetched\n",
                static_cast<double>(st.shard_cache_bytes()) / (1 << 20),
                static_cast<double>(st.shard_cache_budget_bytes()) / (1 << 20),
                static_cast<double>(st.shard_cache_fetched_bytes()) / (1 << 20), st.shard_cache_evictions(),
                st.shard_cache_corrupt());
  }
  if (st.share_members() > 0) {
    std::printf("  shared: one pipeline (job %" PRIu64 ") for %u members; the figures above are the group's\n",
                st.share_group_job_id(), st.share_members());
  }
  // One row per stage: totals, then the recent window. CONC and QCAP 0 = unlimited (the pool / the ring).
  // User ops have rows of their own ("op:NAME", their time a share of decode's): the name column fits them.
  int name_width = 8;
  for (const auto& s : st.stages()) name_width = std::max(name_width, static_cast<int>(s.name().size()));
  std::printf("  %-*s %4s %4s %4s %5s %5s %10s %7s %8s %8s %8s %8s %8s %8s %9s | %8s %8s %8s %9s\n", name_width,
              "STAGE", "KIND", "CONC", "RUN", "QUEUE", "QCAP", "TASKS", "FAILED", "AVG_MS", "P50_MS", "P90_MS",
              "P99_MS", "PUTW_S", "GETW_S", "ITEMS/S", "W_AVG_MS", "W_P50_MS", "W_P99_MS", "W_ITEMS/S");
  for (const auto& s : st.stages()) {
    std::printf("  %-*s %4s %4u %4" PRIu64 " %5" PRIu64 " %5u %10" PRIu64 " %7" PRIu64
                " %8.3f %8.3f %8.3f %8.3f %8.2f %8.2f %9.1f | %8.3f %8.3f %8.3f %9.1f\n",
                name_width, s.name().c_str(), s.kind().c_str(), s.concurrency(), s.running(), s.queue_length(),
                s.queue_capacity(), s.tasks(), s.failures(), s.avg_ms(), s.p50_ms(), s.p90_ms(), s.p99_ms(),
                s.put_wait_seconds(), s.get_wait_seconds(), s.items_per_s(), s.window_avg_ms(), s.window_p50_ms(),
                s.window_p99_ms(), s.window_items_per_s());
  }
}

// spdlctl streams: one row per stream (retained samples / bytes against its bounds, producers), then
// one line per consumer group (consumers, lag: put and not yet acknowledged by the group, in flight).
void PrintStreams(const DaemonStatus& s) { std::cout << spdl::client::OperatorStreamsText(s); }

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"spdlctl: ask the node's spdld what it is doing"};
  app.set_version_flag("--version", std::string("spdlctl ") + SPDLD_VERSION);
  std::string socket = "/run/spdld/spdld.sock";
  bool json = false;
  app.add_option("--socket", socket, "spdld's control socket")->envname("SPDLD_SOCKET")->capture_default_str();
  app.add_flag("--json", json, "print the answer as JSON");
  app.require_subcommand(1);
  // Global options are accepted on either side of the subcommand (`spdlctl stats --json`): each
  // subcommand passes the options it does not know up to the app.
  app.fallthrough();
  auto* status = app.add_subcommand("status", "the daemon: uptime, threads, shared memory, job count");
  auto* jobs = app.add_subcommand("jobs", "your jobs (root: all) with their throughput");
  auto* stats = app.add_subcommand("stats", "per-stage figures of your jobs, or of one job");
  uint64_t stats_job = 0;
  stats->add_option("job", stats_job, "job id (default: all of yours)");
  auto* streams = app.add_subcommand("streams", "streams you may use (root: all): retained, producers, lag per group");
  auto* cancel = app.add_subcommand("cancel", "stop a job of yours; its trainer gets an error");
  uint64_t cancel_job = 0;
  cancel->add_option("job", cancel_job, "job id")->required();
  auto* drain = app.add_subcommand(
      "drain", "stop taking jobs, tell running ones, exit when they end or at the deadline (root or spdld's user)");
  uint32_t drain_seconds = 0;
  drain->add_option("--seconds", drain_seconds, "deadline from now (default: the daemon's drain_seconds)");
  CLI11_PARSE(app, argc, argv);

  ClientMessage req;
  if (*cancel) {
    req.mutable_cancel()->set_job_id(cancel_job);
  } else if (*drain) {
    req.mutable_drain()->set_seconds(drain_seconds);
  } else {
    req.mutable_status();
  }
  auto reply = spdl::client::ControlCall(socket, req);
  if (!reply.ok()) return Fail(reply.status().message());

  if (*cancel) {
    if (json) {
      PrintJson(reply->cancelled());
    } else {
      std::printf("cancelled job %" PRIu64 "\n", reply->cancelled().job_id());
    }
    return 0;
  }
  if (*drain) {
    const auto& d = reply->draining();
    if (json) {
      PrintJson(d);
    } else {
      std::printf("spdld is draining (%s): %u jobs running; it exits when they end or in %.0f s\n", d.reason().c_str(),
                  d.live_jobs(), d.deadline_seconds());
    }
    return 0;
  }
  const DaemonStatus& s = reply->status();
  if (*streams) {
    if (json) {
      PrintJson(s);  // the whole status: its "streams" list
    } else {
      PrintStreams(s);
    }
    return 0;
  }
  if (*status || *jobs) {
    if (json) {
      PrintJson(s);
    } else if (*status) {
      PrintStatus(s);
    } else {
      PrintJobs(s);
    }
    return 0;
  }
  // stats
  bool found = false;
  for (const auto& j : s.jobs()) {
    if (stats_job != 0 && j.job_id() != stats_job) continue;
    found = true;
    if (json) {
      PrintJson(j);
    } else {
      PrintStats(j);
    }
  }
  if (stats_job != 0 && !found) return Fail("no job " + std::to_string(stats_job) + " of yours");
  if (!found && !json) std::printf("no jobs\n");
  return 0;
} catch (const std::exception& e) {  // out of memory, a library's error: a message and status 1, not abort()
  return Fail(e.what());
}
