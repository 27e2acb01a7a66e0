#include "media/ffmpeg_log.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/log_limiter.h"

extern "C" {
#include <libavutil/log.h>
}

namespace spdl::media {
namespace {

std::atomic<bool> routed{false};

spdlog::level::level_enum LevelFor(int av_level) {
  if (av_level <= AV_LOG_FATAL) return spdlog::level::err;
  if (av_level <= AV_LOG_ERROR) return spdlog::level::warn;
  if (av_level <= AV_LOG_WARNING) return spdlog::level::info;
  if (av_level <= AV_LOG_VERBOSE) return spdlog::level::debug;
  return spdlog::level::trace;
}

// The process's one limiter for FFmpeg lines (FFmpeg's callback is process-wide too); never
// destroyed, so a decoder thread still running at exit cannot use it after destruction.
LogLimiter& Limiter() {
  static LogLimiter* limiter = new LogLimiter(5, std::chrono::seconds(10));
  return *limiter;
}

void Callback(void* avcl, int av_level, const char* format, va_list vl) {
  if (av_level > av_log_get_level()) return;
  const spdlog::level::level_enum level = LevelFor(av_level);
  if (!spdlog::should_log(level)) return;
  // A line may come in pieces: keep this thread's piece until its newline.
  thread_local std::string pending;
  thread_local int print_prefix = 1;
  thread_local const char* first_fmt = nullptr;  // the template of the pending line's first piece
  char buf[1024];
  av_log_format_line2(avcl, av_level, format, vl, buf, sizeof(buf), &print_prefix);
  if (pending.empty()) first_fmt = format;
  pending += buf;
  if (pending.empty() || pending.back() != '\n') {
    if (pending.size() < 4096) return;  // a runaway piece is logged as it is
  }
  while (!pending.empty() && (pending.back() == '\n' || pending.back() == '\r')) pending.pop_back();
  std::string line = std::move(pending);
  pending.clear();
  if (line.empty()) return;
  uint64_t dropped = 0;
  if (!Limiter().Allow(first_fmt ? std::string_view(first_fmt) : std::string_view(line), &dropped)) return;
  spdlog::log(level, "ffmpeg: {}{}", line, LogLimiter::Note(dropped));
}

}  // namespace

void RouteFfmpegLogToSpdlog() {
  static std::once_flag once;
  std::call_once(once, [] {
    av_log_set_callback(Callback);
    routed = true;
  });
}

bool FfmpegLogRouted() { return routed.load(); }

}  // namespace spdl::media
