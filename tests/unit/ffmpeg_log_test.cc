// FFmpeg's av_log routed into spdlog (media/ffmpeg_log.h): levels mapped, the context prefix kept,
// pieces of a line joined, a flood rate-limited, nothing written to stderr.
#include "media/ffmpeg_log.h"

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <sstream>
#include <string>

extern "C" {
#include <libavutil/log.h>
}

namespace spdl::media {
namespace {

// Captures the default logger's lines ("LEVEL message") and this process's stderr while alive.
struct Capture {
  Capture() {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(lines);
    sink->set_pattern("%l %v");
    auto logger = std::make_shared<spdlog::logger>("capture", sink);
    logger->set_level(spdlog::level::trace);
    previous = spdlog::default_logger();
    spdlog::set_default_logger(logger);
    std::fflush(stderr);
    saved_stderr = ::dup(2);
    err_file = std::tmpfile();
    ::dup2(::fileno(err_file), 2);
  }
  ~Capture() {
    spdlog::set_default_logger(previous);
    std::fflush(stderr);
    ::dup2(saved_stderr, 2);
    ::close(saved_stderr);
    std::fclose(err_file);
  }
  std::string Stderr() {
    std::fflush(stderr);
    std::string out;
    if (std::fseek(err_file, 0, SEEK_SET) != 0) return "(cannot read the captured stderr)";
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), err_file)) > 0;) out.append(buf, n);
    return out;
  }
  std::ostringstream lines;
  std::shared_ptr<spdlog::logger> previous;
  int saved_stderr = -1;
  std::FILE* err_file = nullptr;
};

TEST_CASE("ffmpeg log: lines go to spdlog with mapped levels, not to stderr") {
  RouteFfmpegLogToSpdlog();
  RouteFfmpegLogToSpdlog();  // once per process: a second call changes nothing
  CHECK(FfmpegLogRouted());
  Capture cap;
  av_log(nullptr, AV_LOG_ERROR, "bad thing %d\n", 42);
  av_log(nullptr, AV_LOG_WARNING, "odd thing\n");
  av_log(nullptr, AV_LOG_FATAL, "fatal thing\n");
  av_log(nullptr, AV_LOG_INFO, "in two ");
  av_log(nullptr, AV_LOG_INFO, "pieces\n");
  const std::string got = cap.lines.str();
  INFO(got);
  CHECK_THAT(got, Catch::Contains("warning ffmpeg: bad thing 42"));
  CHECK_THAT(got, Catch::Contains("info ffmpeg: odd thing"));
  CHECK_THAT(got, Catch::Contains("error ffmpeg: fatal thing"));
  CHECK_THAT(got, Catch::Contains("debug ffmpeg: in two pieces"));
  CHECK(cap.Stderr().empty());
}

TEST_CASE("ffmpeg log: a flood of one message is rate-limited") {
  RouteFfmpegLogToSpdlog();
  Capture cap;
  for (int i = 0; i < 200; ++i) av_log(nullptr, AV_LOG_ERROR, "flood %d\n", i);
  const std::string got = cap.lines.str();
  size_t lines = 0;
  for (size_t at = 0; (at = got.find("ffmpeg: flood", at)) != std::string::npos; ++at) ++lines;
  INFO(got);
  CHECK(lines >= 1);
  CHECK(lines <= 5);
  CHECK(cap.Stderr().empty());
}

}  // namespace
}  // namespace spdl::media
