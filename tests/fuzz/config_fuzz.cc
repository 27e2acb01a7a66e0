// config_fuzz: the job and daemon config parsers under arbitrary text. A job config arrives from
// any client over the control socket (SubmitJob.config_yaml, with --set overrides), so
// ParseJobConfig must refuse anything with errors, never crash, throw or hang.
//
// Input: the YAML text, then optionally NUL-separated `key.path=value` overrides:
//   "batch: {size: 8}\n" "\0" "batch.size=0" "\0" "source.root=/d"
// Each override goes through ParseOverride (the --set parser); those it accepts are applied.
// The same input goes to ParseJobConfig and ParseDaemonConfig, and its first line to ParseByteSize.
//
// Invariants (FUZZ_CHECK aborts; libFuzzer saves the input):
//   - a config or at least one error, never both; parsing twice gives the same result;
//   - every error has a message, and none is an "internal error" (a caught exception: a bug);
//   - an error with a line points inside the text (line <= lines, 1 <= column <= line length + 1);
//     an error without a line has no column; errors are sorted by line, line-less ones last;
//   - a returned config keeps every range its header documents (job_config.h, daemon_config.h);
//   - ParseByteSize(decimal of v) == v for any v it returns.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/daemon_config.h"
#include "config/job_config.h"
#include "fuzz_check.h"

namespace {

using namespace spdl::config;

// Length of each line of `text` (lines split at '\n'; a trailing line may be empty).
std::vector<size_t> LineLengths(std::string_view text) {
  std::vector<size_t> lengths;
  size_t start = 0;
  for (;;) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) {
      lengths.push_back(text.size() - start);
      return lengths;
    }
    lengths.push_back(nl - start);
    start = nl + 1;
  }
}

void CheckErrors(const std::vector<ConfigError>& errors, std::string_view text) {
  const std::vector<size_t> lines = LineLengths(text);
  bool seen_lineless = false;
  int last_line = 0;
  for (const ConfigError& e : errors) {
    FUZZ_CHECK(!e.message.empty());
    FUZZ_CHECK(e.message.rfind("internal error", 0) != 0);
    FUZZ_CHECK(e.line >= 0 && e.column >= 0);
    if (e.line == 0) {
      FUZZ_CHECK(e.column == 0);
      seen_lineless = true;
      continue;
    }
    FUZZ_CHECK(!seen_lineless);  // line-less errors come last
    FUZZ_CHECK(e.line >= last_line);
    last_line = e.line;
    FUZZ_CHECK(static_cast<size_t>(e.line) <= lines.size());
    FUZZ_CHECK(e.column >= 1);
    FUZZ_CHECK(static_cast<size_t>(e.column) <= lines[e.line - 1] + 1);
  }
  // The formatter takes anything the parser produces.
  (void)FormatConfigErrors(errors, "fuzz.yaml");
}

bool InRange(double v, double lo, double hi) { return v >= lo && v <= hi; }

void CheckJob(const JobConfig& c) {
  switch (c.source.type) {
    case SourceType::kImageFolder:
      FUZZ_CHECK(!c.source.root.empty());
      break;
    case SourceType::kFileList:
    case SourceType::kHttp:
      FUZZ_CHECK(!c.source.list.empty());
      break;
    case SourceType::kTar:
      FUZZ_CHECK(!c.source.shards.empty() && c.source.shuffle_buffer >= 1);
      break;
    case SourceType::kCoco:
      FUZZ_CHECK(!c.source.root.empty() && !c.source.coco.annotations.empty() && c.source.coco.max_boxes >= 1);
      break;
    case SourceType::kS3Prefix:
      FUZZ_CHECK(c.source.prefix.rfind("s3://", 0) == 0);
      break;
    case SourceType::kStream:
      FUZZ_CHECK(!c.source.stream.name.empty() && c.source.stream.name.size() <= 128);
      break;
    case SourceType::kWatch:
      FUZZ_CHECK(!c.source.root.empty());
      break;
  }
  for (const std::string& ext : c.source.extensions) {
    FUZZ_CHECK(std::none_of(ext.begin(), ext.end(), [](unsigned char ch) { return std::isupper(ch); }));
  }
  FUZZ_CHECK(c.batch.size >= 1 && c.batch.size <= 65536);
  FUZZ_CHECK(c.prefetch >= 1 && c.prefetch <= 64);
  if (c.media == Media::kAudio) {
    FUZZ_CHECK(c.transforms.empty() && c.audio.length >= 1 && (c.audio.channels == 1 || c.audio.channels == 2));
    FUZZ_CHECK(c.audio.sample_rate >= 1 && c.audio.sample_rate <= 768000 && c.audio.max_seconds > 0);
    return;
  }
  if (c.media == Media::kVideo) {
    FUZZ_CHECK(c.transforms.empty() && c.video.frames >= 1 && c.video.stride >= 1 && c.video.fps >= 0);
    FUZZ_CHECK(c.video.height >= 1 && c.video.width >= 1 && c.video.start_seconds >= 0);
    return;
  }
  FUZZ_CHECK(!c.transforms.empty());
  FUZZ_CHECK(c.out_height > 0 && c.out_width > 0);
  for (int b : c.decode.background) FUZZ_CHECK(b >= 0 && b <= 255);
  for (const TransformOp& op : c.transforms) {
    if (const auto* r = std::get_if<ResizeOp>(&op)) {
      FUZZ_CHECK((r->shorter > 0) != (r->height > 0 && r->width > 0));
    } else if (const auto* cc = std::get_if<CenterCropOp>(&op)) {
      FUZZ_CHECK(cc->height >= 1 && cc->height <= 16384 && cc->width >= 1 && cc->width <= 16384);
    } else if (const auto* rrc = std::get_if<RandomResizedCropOp>(&op)) {
      FUZZ_CHECK(rrc->height >= 1 && rrc->height <= 16384 && rrc->width >= 1 && rrc->width <= 16384);
      FUZZ_CHECK(rrc->scale_min > 0 && rrc->scale_min <= rrc->scale_max && rrc->scale_max <= 1);
      FUZZ_CHECK(rrc->ratio_min > 0 && rrc->ratio_min <= rrc->ratio_max);
    } else if (const auto* f = std::get_if<HorizontalFlipOp>(&op)) {
      FUZZ_CHECK(InRange(f->p, 0, 1));
    } else if (const auto* n = std::get_if<NormalizeOp>(&op)) {
      for (double s : n->stddev) FUZZ_CHECK(s > 0);
      FUZZ_CHECK(c.output.dtype != DType::kUInt8);
    } else if (const auto* u = std::get_if<UserOp>(&op)) {
      // A user op: a bare file name, a name, args as a JSON object of bounded size.
      FUZZ_CHECK(!u->library.empty() && u->library.find('/') == std::string::npos);
      FUZZ_CHECK(!u->name.empty());
      FUZZ_CHECK(u->args_json.size() >= 2 && u->args_json.front() == '{' && u->args_json.back() == '}');
      FUZZ_CHECK(u->args_json.size() <= 64 * 1024);
    }
  }
}

void CheckDaemon(const DaemonConfig& c) {
  FUZZ_CHECK(!c.socket_path.empty() && c.socket_path[0] == '/' && c.socket_path.size() < 108);
  FUZZ_CHECK(c.socket_mode >= 0 && c.socket_mode <= 0777);
  FUZZ_CHECK(c.worker_threads >= 0 && c.worker_threads <= 1024);
  FUZZ_CHECK(c.memory_budget_bytes >= (1u << 20));
  for (const std::string& r : c.allowed_roots) FUZZ_CHECK(!r.empty() && r[0] == '/');
  static const std::vector<std::string> kLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  FUZZ_CHECK(std::find(kLevels.begin(), kLevels.end(), c.log_level) != kLevels.end());
  FUZZ_CHECK(c.max_frame_bytes >= (1u << 10) && c.max_frame_bytes <= (64u << 20));
  FUZZ_CHECK(c.max_jobs_per_client >= 1 && c.max_jobs_per_client <= 1024);
  FUZZ_CHECK(c.max_slots_per_job >= 1 && c.max_slots_per_job <= 1024);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul);
  std::vector<Override> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (overrides.size() < 4) {
      const size_t end = rest.find('\0');
      if (auto o = ParseOverride(rest.substr(0, end)); o.ok()) {
        FUZZ_CHECK(!o->path.empty());
        overrides.push_back(std::move(o.value()));
      }
      if (end == std::string_view::npos) break;
      rest = rest.substr(end + 1);
    }
  }

  const JobConfigResult job = ParseJobConfig(text, overrides);
  FUZZ_CHECK(job.config.has_value() != !job.errors.empty());
  CheckErrors(job.errors, text);
  if (job.config) CheckJob(*job.config);
  const JobConfigResult job2 = ParseJobConfig(text, overrides);
  FUZZ_CHECK(job2.config == job.config && job2.errors == job.errors);

  const DaemonConfigResult daemon = ParseDaemonConfig(text, overrides);
  FUZZ_CHECK(daemon.config.has_value() != !daemon.errors.empty());
  CheckErrors(daemon.errors, text);
  if (daemon.config) CheckDaemon(*daemon.config);

  const std::string_view first_line = text.substr(0, std::min(text.find('\n'), size_t{64}));
  if (auto v = ParseByteSize(first_line); v.ok()) {
    auto again = ParseByteSize(std::to_string(*v));
    FUZZ_CHECK(again.ok() && *again == *v);
  }
  return 0;
}
