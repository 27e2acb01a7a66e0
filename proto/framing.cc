#include "proto/framing.h"

namespace spdl::proto {

void AppendFrame(std::string_view payload, std::string* out) {
  const auto n = static_cast<uint32_t>(payload.size());
  const char header[kFrameHeaderBytes] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                                          static_cast<char>((n >> 16) & 0xff), static_cast<char>((n >> 24) & 0xff)};
  out->append(header, kFrameHeaderBytes);
  out->append(payload);
}

bool EncodeFrame(const google::protobuf::MessageLite& msg, std::string* out) {
  std::string payload;
  if (!msg.SerializeToString(&payload)) return false;
  AppendFrame(payload, out);
  return true;
}

void FrameParser::Feed(const void* data, size_t n) {
  // Compact once the consumed prefix dominates, so the buffer does not grow without bound.
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(static_cast<const char*>(data), n);
}

FrameParser::Result FrameParser::Next(std::string* payload) {
  if (bad_) return Result::kBad;
  if (buf_.size() - pos_ < kFrameHeaderBytes) return Result::kNeedMore;
  const auto* h = reinterpret_cast<const unsigned char*>(buf_.data() + pos_);
  const uint32_t n = uint32_t{h[0]} | (uint32_t{h[1]} << 8) | (uint32_t{h[2]} << 16) | (uint32_t{h[3]} << 24);
  if (n > max_frame_bytes_) {
    bad_ = true;
    bad_length_ = n;
    return Result::kBad;
  }
  if (buf_.size() - pos_ - kFrameHeaderBytes < n) return Result::kNeedMore;
  payload->assign(buf_, pos_ + kFrameHeaderBytes, n);
  pos_ += kFrameHeaderBytes + n;
  if (pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  return Result::kFrame;
}

bool ParseClientMessage(std::string_view payload, ClientMessage* msg) {
  return msg->ParseFromArray(payload.data(), static_cast<int>(payload.size())) &&
         msg->msg_case() != ClientMessage::MSG_NOT_SET;
}

bool ParseDaemonMessage(std::string_view payload, DaemonMessage* msg) {
  return msg->ParseFromArray(payload.data(), static_cast<int>(payload.size())) &&
         msg->msg_case() != DaemonMessage::MSG_NOT_SET;
}

}  // namespace spdl::proto
