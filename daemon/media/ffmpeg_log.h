// FFmpeg's own log (av_log: "[mjpeg @ 0x...] overread 8", "deprecated pixel format used", ...) sent
// into spdlog instead of straight to stderr, so it carries spdld's timestamps and levels, obeys its
// log level, and a corrupt file decoded in a loop cannot flood the journal.
//
// Levels: AV_LOG_PANIC/FATAL -> error, ERROR -> warn (the sample's own failure is reported by the
// job: skipped or failing), WARNING -> info, INFO/VERBOSE -> debug, DEBUG/TRACE -> trace. Each line
// is prefixed "ffmpeg: [context @ address]". Lines are rate-limited per message template (5 per
// 10 s each; the next one allowed says how many were suppressed). Partial lines (FFmpeg writes
// some lines in pieces) are joined per thread until their newline.
//
// RouteFfmpegLogToSpdlog: once per process (later calls do nothing), before the threads that
// decode start; the daemon calls it at start-up. Thread-safe afterwards: FFmpeg calls the callback
// from any decoding thread.
#pragma once

namespace spdl::media {

void RouteFfmpegLogToSpdlog();

// Whether RouteFfmpegLogToSpdlog has run in this process.
bool FfmpegLogRouted();

}  // namespace spdl::media
