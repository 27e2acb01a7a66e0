// spdl-client: runs one job on the local spdld from the command line and reports what a trainer
// would see: samples/s, time to first batch, totals; optionally every delivered sample (--record)
// and a checksum of every tensor (for end-to-end integrity checks). Each batch is released as soon as
// it has been looked at, so this measures the daemon, not a training step. On a terminal a progress
// line (epoch, bar, samples/s, ETA) is redrawn on stderr; not on a terminal, or with --json or
// --quiet, there is none.
//
// Exit status: 0 done, 1 an error (message on stderr; config errors one per line), 2 bad usage.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "common/errno_text.h"
#include "progress.h"
#include "spdl/client.h"

namespace {

using Clock = std::chrono::steady_clock;
using spdl::client::Batch;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The checksum of one row: four FNV-1a-64 lanes over the row's 8-byte little-endian words
// (word j goes to lane j % 4; lane k starts from the offset basis ^ k), the tail bytes (n % 32)
// into lane 0 one by one, then FNV-1a-64 over the four lane values. The lanes let the multiplies
// overlap: ~30 us per 224x224x3 image on these machines, 2x faster than one lane.
// --json's checksums.NAME is the sum (mod 2^64) of HashRow over every delivered row of tensor NAME
// (every tensor of the batch: image, label, audio, length, ...), as a decimal string: independent of
// order, so the checksums of the ranks add up to the whole dataset's. pixel_checksum is
// checksums.image (kept for older scripts).
uint64_t HashRow(const uint8_t* p, size_t n) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  constexpr uint64_t kBasis = 0xcbf29ce484222325ull;
  uint64_t h[4] = {kBasis, kBasis ^ 1, kBasis ^ 2, kBasis ^ 3};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      h[k] = (h[k] ^ w) * kPrime;
    }
  }
  for (; i < n; ++i) h[0] = (h[0] ^ p[i]) * kPrime;
  uint64_t r = kBasis;
  for (uint64_t x : h) r = (r ^ x) * kPrime;
  return r;
}

// A CSV field: quoted (with doubled quotes) only when it has to be.
void AppendCsvField(const std::string& s, std::string* out) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) {
    out->append(s);
    return;
  }
  out->push_back('"');
  for (char c : s) {
    if (c == '"') out->push_back('"');
    out->push_back(c);
  }
  out->push_back('"');
}

int Fail(const std::string& message) {
  std::cerr << "spdl-client: " << message << "\n";
  return 1;
}

int Usage(const std::string& message) {
  std::cerr << "spdl-client: " << message << "\nRun with --help for more information.\n";
  return 2;
}

}  // namespace

namespace {

// The resume token travels on the command line as hexadecimal.
std::string ToHex(const std::string& bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) {
    out += kDigits[b >> 4];
    out += kDigits[b & 15];
  }
  return out;
}

std::optional<std::string> FromHex(const std::string& hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto digit = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"spdl-client: run a job on spdld and report throughput and time to first batch"};
  app.set_version_flag("--version", std::string("spdl-client ") + SPDLD_VERSION);
  std::string socket_path, config_path, record_path;
  std::vector<std::string> sets;
  uint32_t epochs = 1, rank = 0, world_size = 1;
  uint64_t max_batches = 0;
  std::string resume_hex;
  bool json = false, quiet = false, no_checksum = false;
  app.add_option("--socket", socket_path, "spdld's control socket")->required()->envname("SPDLD_SOCKET");
  app.add_option("--config", config_path, "the job config (YAML)")->required();
  app.add_option("--set", sets, "override a config value: key.path=value (repeatable)");
  app.add_option("--epochs", epochs, "epochs to run; 0 = until stopped")->capture_default_str();
  app.add_option("--rank", rank, "this trainer's rank")->capture_default_str();
  app.add_option("--world-size", world_size, "number of ranks")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--stop-after", max_batches,
                 "end the job early (EndJob) after this many batches; --json then carries the resume `state`")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume", resume_hex, "continue a job from a `state` token printed by --json");
  app.add_option("--record", record_path, "write one CSV line per delivered sample: epoch,rank,path,label");
  app.add_flag("--json", json, "print one JSON object with the results at the end, and nothing else");
  app.add_flag("--quiet", quiet, "print no progress or summary (--json still prints its object)");
  app.add_flag("--no-checksum", no_checksum, "do not checksum the delivered tensors");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    (void)app.exit(e);  // prints the message
    return 2;
  }

  spdl::client::Options opt;
  opt.socket_path = socket_path;
  opt.config_name = config_path;
  opt.rank = rank;
  opt.world_size = world_size;
  opt.epochs = epochs;
  opt.client_name = "spdl-client pid=" + std::to_string(::getpid());
  for (const std::string& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) return Usage("--set wants key.path=value, got '" + s + "'");
    opt.overrides.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  if (!resume_hex.empty()) {
    auto token = FromHex(resume_hex);
    if (!token) return Usage("--resume wants the hexadecimal `state` printed by --json");
    opt.resume_token = std::move(*token);
  }
  if (rank >= world_size) {
    return Usage("--rank " + std::to_string(rank) + " must be below --world-size " + std::to_string(world_size));
  }
  {
    std::ifstream in(config_path, std::ios::binary);
    if (!in) return Fail("cannot read the job config " + config_path + ": " + spdl::ErrnoText(errno));
    std::ostringstream text;
    text << in.rdbuf();
    if (in.bad()) return Fail("cannot read the job config " + config_path);
    opt.config_yaml = text.str();
  }
  std::FILE* record = nullptr;
  if (!record_path.empty()) {
    record = std::fopen(record_path.c_str(), "w");
    if (record == nullptr) return Fail("cannot write " + record_path + ": " + spdl::ErrnoText(errno));
  }

  const auto t_start = Clock::now();
  auto opened = spdl::client::Loader::Open(opt);
  if (!opened.ok()) return Fail(opened.status().message());
  spdl::client::Loader& loader = **opened;
  const spdl::client::JobInfo& info = loader.info();
  const bool progress = !json && !quiet;

  uint64_t samples = 0, batches = 0, epochs_done = 0, epoch_skipped = 0, first_batch_rows = 0;
  double first_batch_s = -1, seconds = 0;
  std::map<std::string, uint64_t> checksums;  // per tensor name; see HashRow
  bool ended_early = false;
  std::optional<spdl::client::JobStats> stats;
  std::string line;
  spdl::client::ProgressBar bar(stderr, progress);
  spdl::client::ProgressState ps;
  ps.epochs = epochs;
  ps.batches_per_epoch = info.batches_per_epoch;
  bool told_draining = false;
  for (;;) {
    auto ev = loader.Next();
    if (loader.draining() && !told_draining) {
      told_draining = true;
      bar.Clear();
      if (!json && !quiet) {
        std::fprintf(stderr,
                     "spdl-client: spdld is draining (%s): the job is cancelled in %.0f s unless it ends first\n",
                     loader.drain_reason().c_str(), loader.drain_seconds_left());
      }
    }
    if (!ev.ok()) {
      bar.Clear();
      if (ended_early && ev.status().code() == spdl::StatusCode::kCancelled) break;  // no final stats
      return Fail(ev.status().message());
    }
    if (auto* b = std::get_if<Batch>(&*ev)) {
      if (first_batch_s < 0) {
        first_batch_s = SecondsSince(t_start);
        first_batch_rows = b->rows();
      }
      samples += b->rows();
      ++batches;
      if (record != nullptr) {
        line.clear();
        const std::string prefix = std::to_string(b->epoch()) + "," + std::to_string(rank) + ",";
        for (uint32_t r = 0; r < b->rows(); ++r) {
          line += prefix;
          if (r < b->paths().size()) AppendCsvField(b->paths()[r], &line);
          line += ',';
          if (r < b->labels().size()) line += std::to_string(b->labels()[r]);
          line += '\n';
        }
        if (std::fwrite(line.data(), 1, line.size(), record) != line.size() || std::fflush(record) != 0) {
          return Fail("writing " + record_path + ": " + spdl::ErrnoText(errno));
        }
      }
      if (!no_checksum) {
        for (const auto& t : b->tensors()) {
          uint64_t& sum = checksums[t.name];
          if (b->rows() == 0 || t.data == nullptr) continue;
          const size_t row_bytes = t.bytes / b->rows();
          const auto* p = static_cast<const uint8_t*>(t.data);
          for (uint32_t r = 0; r < b->rows(); ++r) sum += HashRow(p + r * row_bytes, row_bytes);
        }
      }
      b->Release();
      ps.epoch = b->epoch();
      ps.batch_in_epoch = b->batch_in_epoch() + 1;
      ps.batches = batches;
      ps.samples = samples;
      ps.seconds = SecondsSince(t_start);
      if (loader.draining())
        ps.note = "daemon draining, " + std::to_string(int(loader.drain_seconds_left())) + " s left";
      bar.Update(ps);
      if (max_batches != 0 && batches == max_batches && !ended_early) {
        ended_early = true;
        if (auto s = loader.End(); !s.ok()) return Fail(s.message());
      }
    } else if (auto* e = std::get_if<spdl::client::EpochEnd>(&*ev)) {
      ++epochs_done;
      epoch_skipped += e->skipped;
      if (progress) {
        bar.Clear();
        std::printf("epoch %u: %" PRIu64 " samples, %" PRIu64 " batches, %" PRIu64 " skipped, %.2f s, %.1f samples/s\n",
                    e->epoch, e->samples, e->batches, e->skipped, e->seconds,
                    e->seconds > 0 ? static_cast<double>(e->samples) / e->seconds : 0.0);
        std::fflush(stdout);
      }
    } else {
      stats = std::get<spdl::client::JobStats>(std::move(*ev));
      break;
    }
  }
  seconds = SecondsSince(t_start);
  ps.seconds = seconds;
  bar.Update(ps, /*force=*/true);
  bar.Finish();
  if (record != nullptr && std::fclose(record) != 0)
    return Fail("writing " + record_path + ": " + spdl::ErrnoText(errno));

  const double rate = seconds > 0 ? static_cast<double>(samples) / seconds : 0.0;
  // After the first batch: the pipeline's steady rate, without start-up.
  const double steady_s = first_batch_s >= 0 ? seconds - first_batch_s : 0.0;
  const double steady_rate = steady_s > 0 ? static_cast<double>(samples - first_batch_rows) / steady_s : 0.0;
  const uint64_t skipped = stats ? stats->skipped : epoch_skipped;
  const auto image_sum = checksums.find("image");
  const bool show_checksum = !no_checksum && image_sum != checksums.end();

  if (json) {
    nlohmann::json j;
    j["job_id"] = info.job_id;
    j["samples"] = samples;
    j["batches"] = batches;
    j["epochs"] = epochs_done;
    j["seconds"] = seconds;
    j["samples_per_s"] = rate;
    j["steady_samples_per_s"] = steady_rate;
    j["first_batch_s"] = first_batch_s >= 0 ? nlohmann::json(first_batch_s) : nlohmann::json(nullptr);
    j["skipped"] = skipped;
    j["batch_size"] = info.batch_size;
    j["batches_per_epoch"] = info.batches_per_epoch;
    j["samples_per_epoch"] = info.samples_per_epoch;
    j["dataset_size"] = info.dataset_size;
    j["rank"] = rank;
    j["world_size"] = world_size;
    j["ended_early"] = ended_early;
    j["wait_s"] = loader.wait_seconds();  // time blocked in Next(): the trainer's wait for data
    // Resume token after the last batch consumed (null before the first): --resume continues there.
    j["state"] = loader.state().empty() ? nlohmann::json(nullptr) : nlohmann::json(ToHex(loader.state()));
    j["pixel_checksum"] = show_checksum ? nlohmann::json(std::to_string(image_sum->second)) : nlohmann::json(nullptr);
    j["checksums"] = nlohmann::json::object();  // empty with --no-checksum
    for (const auto& [name, sum] : checksums) j["checksums"][name] = std::to_string(sum);
    j["stages"] = nlohmann::json::array();
    if (stats) {
      // Every figure the daemon describes for clients, by name (proto/job_stats_fields.h).
      j["daemon"] = nlohmann::json::object();
      for (const auto& v : stats->values) {
        j["daemon"][v.name] = v.integer ? nlohmann::json(static_cast<uint64_t>(v.value)) : nlohmann::json(v.value);
      }
      j["source_samples"] = stats->source_samples;  // a mix: samples per source ([] for one source)
      j["cache"] = {{"hits", stats->cache_hits},
                    {"misses", stats->cache_misses},
                    {"evictions", stats->cache_evictions},
                    {"bytes", stats->cache_bytes},
                    {"budget_bytes", stats->cache_budget_bytes}};
      for (const auto& st : stats->stages) {  // name, kind, then every stage figure described for clients
        nlohmann::json s = {{"name", st.name}, {"kind", st.kind}};
        for (const auto& v : st.values) {
          s[v.name] = v.integer ? nlohmann::json(static_cast<uint64_t>(v.value)) : nlohmann::json(v.value);
        }
        j["stages"].push_back(std::move(s));
      }
    } else {
      j["daemon"] = nullptr;
      j["cache"] = nullptr;
    }
    std::cout << j.dump() << '\n';
  } else if (!quiet) {
    std::printf("job %" PRIu64 ": %" PRIu64 " samples in %" PRIu64 " batches over %" PRIu64 " epochs, %" PRIu64
                " skipped%s\n",
                info.job_id, samples, batches, epochs_done, skipped, ended_early ? " (ended early)" : "");
    std::printf(
        "%.3f s, %.1f samples/s (%.1f after the first batch), first batch after %.3f s, waited %.3f s for data\n",
        seconds, rate, steady_rate, first_batch_s >= 0 ? first_batch_s : 0.0, loader.wait_seconds());
    if (stats) {
      for (const auto& st : stats->stages) {
        std::printf("  stage %-12s %10" PRIu64 " tasks %6" PRIu64 " failures %9.2f s busy\n", st.name.c_str(), st.tasks,
                    st.failures, st.busy_seconds);
      }
    }
    if (stats && stats->cache_budget_bytes > 0) {
      std::printf("sample cache: %" PRIu64 " hits, %" PRIu64 " misses (node: %" PRIu64 " of %" PRIu64 " bytes, %" PRIu64
                  " evictions)\n",
                  stats->cache_hits, stats->cache_misses, stats->cache_bytes, stats->cache_budget_bytes,
                  stats->cache_evictions);
    }
    if (show_checksum) std::printf("pixel checksum %" PRIu64 "\n", image_sum->second);
    for (const auto& [name, sum] : checksums) {
      if (name != "image") std::printf("checksum %s %" PRIu64 "\n", name.c_str(), sum);
    }
  }
  if (samples == 0 && !ended_early) {
    // A job that ended without delivering anything did not do its work, whatever its end says.
    std::fprintf(stderr,
                 "spdl-client: job %" PRIu64 " ended without delivering a single sample (%" PRIu64 " skipped)\n",
                 info.job_id, skipped);
    return 1;
  }
  return 0;
} catch (const std::exception& e) {  // out of memory, a library's error: a message and status 1, not abort()
  return Fail(e.what());
}
