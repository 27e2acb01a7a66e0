// Framing of control messages: a 4-byte little-endian payload length, then the payload (one
// serialized ClientMessage or DaemonMessage). Pure code, no sockets: the daemon's sessions and the
// client library both feed received bytes into a FrameParser and take whole frames out.
//
// FrameParser is not thread-safe; use one per connection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proto/control.pb.h"

namespace spdl::proto {

// Bump on any incompatible change of control.proto's meaning or of the shared-memory layout.
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 4;
// Default largest payload either side accepts (a job config is a few KiB).
inline constexpr uint32_t kDefaultMaxFrameBytes = 1u << 20;

// Appends one frame holding `payload` to *out.
void AppendFrame(std::string_view payload, std::string* out);

// Serializes `msg` as one frame. Returns false if the message cannot be serialized.
bool EncodeFrame(const google::protobuf::MessageLite& msg, std::string* out);

class FrameParser {
 public:
  enum class Result {
    kFrame,     // *payload holds one whole frame's payload
    kNeedMore,  // no whole frame buffered yet
    kBad,       // a frame longer than max_frame_bytes: the stream is unusable
  };

  explicit FrameParser(uint32_t max_frame_bytes = kDefaultMaxFrameBytes) : max_frame_bytes_(max_frame_bytes) {}

  // Buffers received bytes.
  void Feed(const void* data, size_t n);
  // Takes the next whole frame, if any. After kBad every later call returns kBad.
  Result Next(std::string* payload);
  // Bytes buffered but not yet returned as frames.
  size_t buffered() const { return buf_.size() - pos_; }
  // The length announced by the frame that made Next() return kBad (for error messages).
  uint32_t bad_length() const { return bad_length_; }

 private:
  uint32_t max_frame_bytes_;
  std::string buf_;
  size_t pos_ = 0;
  bool bad_ = false;
  uint32_t bad_length_ = 0;
};

// Parses a ClientMessage / DaemonMessage payload; false when it is not a valid message.
bool ParseClientMessage(std::string_view payload, ClientMessage* msg);
bool ParseDaemonMessage(std::string_view payload, DaemonMessage* msg);

}  // namespace spdl::proto
