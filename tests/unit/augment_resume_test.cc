// The built-in augmentations' parameters are part of the resume token's fingerprint
// (jobs/resume_token.h): a token made with one setting is refused by a job with another, naming the
// transforms, and accepted by the same job.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "jobs/resume_token.h"

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

config::JobConfig Parse(const std::string& transforms) {
  const std::string yaml =
      "source: {type: image_folder, root: /data}\nbatch: {size: 4}\noutput: {dtype: float32}\ntransforms:\n"
      "  - resize: {shorter: 64}\n  - center_crop: {size: 56}\n" +
      transforms;
  config::JobConfigResult r = config::ParseJobConfig(yaml);
  INFO(config::FormatConfigErrors(r.errors, "job.yaml"));
  REQUIRE(r.config);
  return *r.config;
}

}  // namespace

TEST_CASE("resume: a token is tied to the augmentations' parameters") {
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
  const std::string token = EncodeResumeToken(p, JobFingerprint(src, Parse(base), 0, 1));
  REQUIRE(DecodeResumeToken(token, JobFingerprint(src, Parse(base), 0, 1)).ok());
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
    auto r = DecodeResumeToken(token, JobFingerprint(src, Parse(other), 0, 1));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("its transforms differ"));
  }
}

}  // namespace spdl::jobs
