// make_control_corpus DIR: writes control_fuzz's seed inputs into DIR, one file per session:
// whole valid sessions (hello, submit, batches, releases, end) and the ways a session closes
// (wrong version, no hello, garbage, an oversized frame, a stale release). Each file is the byte
// stream a client sends, then the trailer control_fuzz reads backwards (see control_fuzz.cc):
// one step byte per chunk fed, last of all the settings byte.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "proto/framing.h"

namespace {

using spdl::proto::ClientMessage;

enum Event : uint8_t { kNone = 0, kReady = 1, kFail = 2, kOperatorCancel = 3 };

// Settings byte: max frame 16 << shift; refuse submits; jobs end after `batches` (0 = never).
uint8_t Settings(int shift, bool refuse = false, int batches = 0) {
  uint8_t s = static_cast<uint8_t>(shift & 7);
  if (refuse) s |= 0x08;
  if (batches > 0) s = static_cast<uint8_t>(s | 0x10 | ((batches - 1) & 7) << 5);
  return s;
}

class Session {
 public:
  explicit Session(uint8_t settings) : settings_(settings) {}

  // Queues a frame; it is fed with the next Step().
  Session& Send(const ClientMessage& m) {
    spdl::proto::EncodeFrame(m, &pending_);
    return *this;
  }
  Session& SendRaw(const std::string& bytes) {
    pending_ += bytes;
    return *this;
  }
  // Feeds everything queued (in chunks of at most 62 bytes, or `chunk`), then signals `e`.
  Session& Step(Event e = kNone, size_t chunk = 62) {
    size_t left = pending_.size();
    while (left > chunk) {
      steps_.push_back(static_cast<uint8_t>(chunk));
      left -= chunk;
    }
    steps_.push_back(static_cast<uint8_t>(left | (e << 6)));  // left may be 0: an event alone
    stream_ += pending_;
    pending_.clear();
    return *this;
  }
  std::string Bytes() const {
    std::string out = stream_;
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) out.push_back(static_cast<char>(*it));
    out.push_back(static_cast<char>(settings_));
    return out;
  }

 private:
  uint8_t settings_;
  std::string stream_;
  std::string pending_;
  std::vector<uint8_t> steps_;
};

ClientMessage Hello(uint32_t version = spdl::proto::kProtocolVersion) {
  ClientMessage m;
  m.mutable_hello()->set_protocol_version(version);
  m.mutable_hello()->set_client_name("spdl-client/0.1 pid=123");
  return m;
}

ClientMessage Submit() {
  ClientMessage m;
  auto* s = m.mutable_submit();
  s->set_config_yaml("source: {root: /data/train}\nbatch: {size: 8}\n");
  s->set_config_name("job.yaml");
  auto* o = s->add_overrides();
  o->set_path("sampler.seed");
  o->set_value("7");
  s->set_rank(0);
  s->set_world_size(1);
  s->set_epochs(1);
  return m;
}

ClientMessage Release(uint32_t slot, uint64_t generation) {
  ClientMessage m;
  m.mutable_release()->set_slot(slot);
  m.mutable_release()->set_generation(generation);
  m.mutable_release()->set_client_wait_seconds(0.25);
  return m;
}

ClientMessage EndJob() {
  ClientMessage m;
  m.mutable_end_job();
  return m;
}

ClientMessage StatusRequest() {
  ClientMessage m;
  m.mutable_status();
  return m;
}

ClientMessage Cancel(uint64_t job_id) {
  ClientMessage m;
  m.mutable_cancel()->set_job_id(job_id);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  std::vector<std::pair<std::string, Session>> seeds;
  auto add = [&](const std::string& name, Session s) { seeds.emplace_back(name, std::move(s)); };

  add("hello", Session(Settings(6)).Send(Hello()).Step());
  add("hello_submit_endjob", Session(Settings(6)).Send(Hello()).Send(Submit()).Send(EndJob()).Step());
  // Fake job: batches go to the lowest free slot; generations count from 1 per job.
  add("batches_release", Session(Settings(6))
                             .Send(Hello())
                             .Send(Submit())
                             .Step(kReady)
                             .Send(Release(0, 1))
                             .Send(Release(1, 2))
                             .Step(kReady)
                             .Send(Release(1, 4))
                             .Send(EndJob())
                             .Step());
  add("job_ends_resubmit", Session(Settings(6, false, 2))
                               .Send(Hello())
                               .Send(Submit())
                               .Step(kReady)
                               .Send(Release(0, 1))
                               .Send(Submit())
                               .Step(kReady)
                               .Send(StatusRequest())
                               .Step());
  add("job_fails", Session(Settings(6))
                       .Send(Hello())
                       .Send(Submit())
                       .Step(kReady)
                       .Step(kFail)
                       .Send(Release(0, 1))
                       .Send(Submit())
                       .Step());
  add("operator_cancel", Session(Settings(6))
                             .Send(Hello())
                             .Send(Submit())
                             .Step(kOperatorCancel)
                             .Send(StatusRequest())
                             .Send(Cancel(1))
                             .Step());
  add("client_cancel",
      Session(Settings(6)).Send(Hello()).Send(Submit()).Send(Cancel(1)).Step(kReady).Send(Cancel(42)).Step());
  add("refused", Session(Settings(6, true)).Send(Hello()).Send(Submit()).Send(Submit()).Step());
  add("bad_version", Session(Settings(4)).Send(Hello(2)).Step());
  add("no_hello", Session(Settings(6)).Send(Submit()).Step());
  add("hello_twice", Session(Settings(4)).Send(Hello()).Send(Hello()).Step());
  add("second_submit", Session(Settings(6)).Send(Hello()).Send(Submit()).Send(Submit()).Step());
  add("stale_release", Session(Settings(6)).Send(Hello()).Send(Submit()).Step(kReady).Send(Release(0, 99)).Step());
  add("release_no_job", Session(Settings(4)).Send(Hello()).Send(Release(3, 1)).Send(EndJob()).Step());
  add("split_bytes", Session(Settings(4)).Send(Hello()).Step(kNone, 1).Send(StatusRequest()).Step(kNone, 3));
  add("empty_frame", Session(Settings(4)).Send(Hello()).SendRaw(std::string(4, '\0')).Step());
  add("garbage", Session(Settings(4)).Send(Hello()).SendRaw(std::string("\x05\0\0\0\xff\xff\xff\xff\xff", 9)).Step());
  add("oversized", Session(Settings(1)).Send(Hello()).SendRaw(std::string("\x88\x13\0\0", 4)).Step());
  add("truncated", Session(Settings(6)).Send(Hello()).SendRaw(std::string("\x40\0\0\0\x12\x02", 6)).Step());

  for (const auto& [name, session] : seeds) {
    const std::string path = dir + "/" + name;
    std::ofstream f(path, std::ios::binary);
    const std::string bytes = session.Bytes();
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", path.c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
