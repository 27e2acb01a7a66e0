// Resume tokens and their fingerprint (jobs/resume_token.h): what a token is tied to, what may
// differ, the message naming what differs, version 1 tokens, and the field visitor that makes the
// fingerprint cover every config field without a list of names (jobs/struct_fields.h).
#include "jobs/resume_token.h"

#include <catch2/catch.hpp>

#include "config/job_config.h"
#include "jobs/struct_fields.h"
#include "proto/control.pb.h"

namespace spdl::jobs {
namespace {

// A seam: a fixed list of samples (the fingerprint reads only keys, labels and the identity).
class ListSource final : public io::SampleSource {
 public:
  explicit ListSource(int n) {
    for (int i = 0; i < n; ++i) samples_.push_back({"s" + std::to_string(i), i % 3});
  }
  uint64_t size() const override { return samples_.size(); }
  const io::SampleRef& sample(uint64_t i) const override { return samples_[i]; }
  Status Read(uint64_t, std::vector<uint8_t>* out) const override {
    out->clear();
    return FailedPrecondition("not read in this test");
  }
  std::string Describe() const override { return "list"; }
  std::string Identity() const override { return "test list"; }

 private:
  std::vector<io::SampleRef> samples_;
};

config::JobConfig Parse(const std::string& yaml) {
  config::JobConfigResult r = config::ParseJobConfig(yaml);
  INFO(config::FormatConfigErrors(r.errors, "job.yaml"));
  REQUIRE(r.config);
  return *r.config;
}

const char* kBase =
    "source: {type: image_folder, root: /data}\nbatch: {size: 4}\n"
    "transforms: [{resize: {shorter: 64}}, {center_crop: {size: 56}}]\n";

std::string TokenOf(const config::JobConfig& c, const io::SampleSource& src) {
  pipeline::ResumePoint p;
  p.epoch = 0;
  p.prefix = 8;
  p.next_batch = 2;
  return EncodeResumeToken(p, JobFingerprint(src, c, 0, 1));
}

TEST_CASE("fields: the field visitor counts and visits every field in order") {
  struct Three {
    int a = 1;
    std::string b = "x";
    std::array<double, 3> c = {1, 2, 3};
  };
  STATIC_REQUIRE(fields::kFieldCount<Three> == 3);
  STATIC_REQUIRE(fields::kFieldCount<config::NormalizeOp> == 2);  // two arrays, not six doubles
  STATIC_REQUIRE(fields::kFieldCount<config::DecodeConfig> == 7);
  int n = 0;
  fields::ForEachField(Three{}, [&n](const auto&) { ++n; });
  CHECK(n == 3);
}

TEST_CASE("resume: a token of a job with other transforms is refused naming them") {
  ListSource src(40);
  const config::JobConfig base = Parse(kBase);
  const std::string token = TokenOf(base, src);
  REQUIRE(DecodeResumeToken(token, JobFingerprint(src, base, 0, 1)).ok());

  const config::JobConfig other = Parse(
      "source: {type: image_folder, root: /data}\nbatch: {size: 4}\n"
      "transforms: [{resize: {shorter: 64}}, {center_crop: {size: 48}}]\n");
  auto r = DecodeResumeToken(token, JobFingerprint(src, other, 0, 1));
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(r.status().message(), Catch::Contains("its transforms differ"));
}

TEST_CASE("resume: each part of the fingerprint is named when it alone differs") {
  ListSource src(40);
  const config::JobConfig base = Parse(kBase);
  const std::string token = TokenOf(base, src);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"output: {dtype: float32}\n", "its output differ"},
      {"decode: {max_pixels: 1000}\n", "its decode differ"},
      {"sampler: {seed: 7}\n", "its sampler differ"},
      {"batch: {size: 4, drop_last: true}\n", "its batch differ"},
      {"source: {type: image_folder, root: /data, extensions: [.png]}\n", "its dataset differ"},
      {"mask: {from: .png}\n", "its other settings differ"},
      {"mix: {mixup: {alpha: 0.2}, num_classes: 10}\n", "its other settings differ"},
      {"source: {type: coco, annotations: /data/a.json, root: /data, max_boxes: 5}\n", "its dataset differ"},
  };
  for (const auto& [extra, message] : cases) {
    std::string yaml = std::string(kBase) + extra;
    // A later top-level key replaces the earlier one: drop the base's if the case sets it.
    const std::string key = extra.substr(0, extra.find(':'));
    if (key == "batch" || key == "source") {
      yaml = std::string(kBase);
      const size_t at = yaml.find(key + ":");
      yaml.erase(at, yaml.find('\n', at) - at + 1);
      yaml += extra;
    }
    INFO(yaml);
    auto r = DecodeResumeToken(token, JobFingerprint(src, Parse(yaml), 0, 1));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains(message));
  }
  auto rank = DecodeResumeToken(token, JobFingerprint(src, base, 1, 2));
  REQUIRE_FALSE(rank.ok());
  CHECK_THAT(rank.status().message(), Catch::Contains("rank, world size differ"));
  auto data = DecodeResumeToken(token, JobFingerprint(ListSource(41), base, 0, 1));
  REQUIRE_FALSE(data.ok());
  CHECK_THAT(data.status().message(), Catch::Contains("its dataset differ"));
}

TEST_CASE("resume: engine settings may differ between the job that made a token and the one resuming") {
  ListSource src(40);
  const std::string token = TokenOf(Parse(kBase), src);
  // Appended, not `std::string(kBase) + "..."`: gcc 12 at -O1 (CI's test sources) reports a false
  // -Warray-bounds inside libstdc++'s inlined operator+ here.
  std::string yaml = kBase;
  yaml +=
      "prefetch: 9\nweight: 3\nshare: true\nshare_members: 2\non_error: fail\n"
      "max_failures: 5\nstages: {decode: {concurrency: 1}}\n"
      "output: {device: cuda:1, copy: client}\n";
  const config::JobConfig other = Parse(yaml);
  auto r = DecodeResumeToken(token, JobFingerprint(src, other, 0, 1));
  INFO(r.status().message());
  REQUIRE(r.ok());
  CHECK(r->prefix == 8);
  CHECK(r->next_batch == 2);
}

TEST_CASE("resume: every field of the config structs is covered without being named") {
  // The fingerprint names no field inside these structs: it hashes them field by field, so a field
  // added to any of them later is covered the same way.
  ListSource src(10);
  const config::JobConfig a = Parse(kBase);
  const std::string token = TokenOf(a, src);
  std::vector<std::pair<config::JobConfig, std::string>> cases;
  cases.emplace_back(a, "media").first.audio.max_seconds += 1;
  cases.emplace_back(a, "media").first.video.interpolation = config::Interpolation::kArea;
  cases.emplace_back(a, "decode").first.decode.background[2] = 0;
  cases.emplace_back(a, "output").first.output.layout = config::Layout::kNCHW;
  cases.emplace_back(a, "dataset").first.source.label_extension = ".txt";
  for (const auto& [c, part] : cases) {
    auto r = DecodeResumeToken(token, JobFingerprint(src, c, 0, 1));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("its " + part + " differ"));
  }
}

TEST_CASE("resume: a version 1 token is still accepted when its dataset and order match") {
  ListSource src(40);
  const config::JobConfig c = Parse(kBase);
  const Fingerprint fp = JobFingerprint(src, c, 0, 1);
  proto::ResumeState s;
  s.set_version(1);
  s.set_fingerprint(fp.v1);
  s.set_epoch(0);
  s.set_prefix(4);
  s.set_next_batch(1);
  auto r = DecodeResumeToken(s.SerializeAsString(), fp);
  REQUIRE(r.ok());
  CHECK(r->prefix == 4);
  s.set_fingerprint(fp.v1 + 1);
  CHECK_FALSE(DecodeResumeToken(s.SerializeAsString(), fp).ok());
}

}  // namespace
TEST_CASE("resume: a token is tied to the augmentations' parameters") {
  // A job whose transforms are the geometry below, then `transforms` (YAML list items).
  auto ParseAug = [](const std::string& transforms) {
    return Parse(
        "source: {type: image_folder, root: /data}\nbatch: {size: 4}\noutput: {dtype: float32}\ntransforms:\n"
        "  - resize: {shorter: 64}\n  - center_crop: {size: 56}\n" +
        transforms);
  };
  ListSource src(40);
  const std::string base =
      "  - random_crop: {size: 48, padding: 4}\n"
      "  - rand_augment: {num_ops: 2, magnitude: 9}\n"
      "  - color_jitter: {brightness: 0.4, hue: 0.1, p: 0.8}\n"
      "  - normalize: {mean: [0.5, 0.5, 0.5], std: [0.2, 0.2, 0.2]}\n"
      "  - random_erasing: {p: 0.25}\n";
  pipeline::ResumePoint p;
  p.epoch = 0;
  p.prefix = 8;
  p.next_batch = 2;
  const std::string token = EncodeResumeToken(p, JobFingerprint(src, ParseAug(base), 0, 1));
  REQUIRE(DecodeResumeToken(token, JobFingerprint(src, ParseAug(base), 0, 1)).ok());
  const std::vector<std::pair<std::string, std::string>> changes = {
      {"magnitude: 9", "magnitude: 10"},
      {"num_ops: 2", "num_ops: 3"},
      {"hue: 0.1", "hue: 0.2"},
      {"p: 0.8", "p: 0.7"},
      {"{p: 0.25}", "{p: 0.5}"},
      {"padding: 4", "padding: 3"},
      {"rand_augment: {num_ops: 2, magnitude: 9}", "trivial_augment_wide: {}"},
  };
  for (const auto& [from, to] : changes) {
    std::string other = base;
    other.replace(other.find(from), from.size(), to);
    INFO(other);
    auto r = DecodeResumeToken(token, JobFingerprint(src, ParseAug(other), 0, 1));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("its transforms differ"));
  }
}

}  // namespace spdl::jobs
