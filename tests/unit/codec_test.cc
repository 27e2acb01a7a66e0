// The control-channel framing and messages, without sockets.
#include <catch2/catch.hpp>

#include "proto/framing.h"
#include "proto/shm_layout.h"

namespace spdl::proto {
namespace {

std::string HelloFrame(uint32_t version) {
  ClientMessage m;
  m.mutable_hello()->set_protocol_version(version);
  m.mutable_hello()->set_client_name("test");
  std::string out;
  REQUIRE(EncodeFrame(m, &out));
  return out;
}

TEST_CASE("frames round-trip when fed one byte at a time") {
  std::string wire = HelloFrame(kProtocolVersion) + HelloFrame(7);
  FrameParser p;
  std::string payload;
  std::vector<uint32_t> versions;
  for (char c : wire) {
    p.Feed(&c, 1);
    while (p.Next(&payload) == FrameParser::Result::kFrame) {
      ClientMessage m;
      REQUIRE(ParseClientMessage(payload, &m));
      REQUIRE(m.has_hello());
      versions.push_back(m.hello().protocol_version());
    }
  }
  CHECK(versions == std::vector<uint32_t>{kProtocolVersion, 7});
  CHECK(p.buffered() == 0);
}

TEST_CASE("an oversized frame makes the stream bad for good") {
  FrameParser p(16);
  std::string big;
  AppendFrame(std::string(17, 'x'), &big);
  p.Feed(big.data(), big.size());
  std::string payload;
  CHECK(p.Next(&payload) == FrameParser::Result::kBad);
  CHECK(p.bad_length() == 17);
  CHECK(p.Next(&payload) == FrameParser::Result::kBad);
}

TEST_CASE("a partial header or body asks for more") {
  std::string wire = HelloFrame(1);
  FrameParser p;
  std::string payload;
  p.Feed(wire.data(), 3);
  CHECK(p.Next(&payload) == FrameParser::Result::kNeedMore);
  p.Feed(wire.data() + 3, wire.size() - 4);
  CHECK(p.Next(&payload) == FrameParser::Result::kNeedMore);
  p.Feed(wire.data() + wire.size() - 1, 1);
  CHECK(p.Next(&payload) == FrameParser::Result::kFrame);
}

TEST_CASE("garbage is not a message") {
  ClientMessage m;
  CHECK_FALSE(ParseClientMessage("\xff\xff\xff\xff garbage", &m));
  CHECK_FALSE(ParseClientMessage("", &m));  // no oneof set
  DaemonMessage d;
  CHECK_FALSE(ParseDaemonMessage("\x0a\x05", &d));  // truncated field
}

TEST_CASE("slot layout aligns every tensor and slot to a page") {
  SlotLayout l = ComputeSlotLayout({32ull * 224 * 224 * 3, 32 * 8}, 4);
  CHECK(l.tensor_offsets[0] == 0);
  CHECK(l.tensor_offsets[1] % kPageBytes == 0);
  CHECK(l.tensor_offsets[1] >= 32ull * 224 * 224 * 3);
  CHECK(l.slot_stride % kPageBytes == 0);
  CHECK(l.SlotOffset(3) == kPageBytes + 3 * l.slot_stride);
  CHECK(l.region_bytes == kPageBytes + 4 * l.slot_stride);
}

}  // namespace
}  // namespace spdl::proto
