// Dataset mixing (io/mixed_source.h, job config `sources:`): the quotas, the seeded weighted draw
// (determinism, weights over many draws), the mixed order (ranks disjoint, exactly once per epoch
// when the quotas match the sizes, no repeat before a whole pass when they do not, resume equals
// uninterrupted), the MixedSource's forwarding, and the config's `sources:` with its refusals.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "io/mixed_source.h"
#include "io/sampler.h"

namespace spdl {
namespace {

io::MixPlan Plan(std::vector<uint64_t> sizes, std::vector<double> weights, uint64_t epoch_samples = 0) {
  io::MixPlan p;
  for (size_t i = 0; i < sizes.size(); ++i) p.components.push_back({sizes[i], {}, 1, weights[i]});
  p.epoch_samples = epoch_samples;
  return p;
}

io::SamplerOptions Opts(uint32_t rank, uint32_t world, uint64_t seed = 7) {
  io::SamplerOptions o;
  o.seed = seed;
  o.rank = rank;
  o.world_size = world;
  return o;
}

TEST_CASE("mix: quotas follow the weights and add up exactly (largest remainder, ties to the earlier source)") {
  CHECK(io::MixQuotas(Plan({70, 30}, {0.7, 0.3}), Opts(0, 2)) == std::vector<uint64_t>{35, 15});
  CHECK(io::MixQuotas(Plan({10, 10, 10}, {1, 1, 1}, 10), Opts(0, 1)) == std::vector<uint64_t>{4, 3, 3});
  CHECK(io::MixQuotas(Plan({5, 500}, {3, 1}, 9), Opts(0, 1)) == std::vector<uint64_t>{7, 2});  // 6.75, 2.25
  CHECK(io::MixSamplesPerRank(Plan({70, 31}, {1, 1}), Opts(0, 2)) == 51);                      // pad: ceil
  io::SamplerOptions drop = Opts(0, 2);
  drop.uneven = io::Uneven::kDrop;
  CHECK(io::MixSamplesPerRank(Plan({70, 31}, {1, 1}), drop) == 50);
  CHECK(io::MixQuotas(Plan({1, 1}, {1, 0}), Opts(0, 1)).empty());  // a weight must be > 0
  CHECK(io::MixQuotas(io::MixPlan{}, Opts(0, 1)).empty());
}

TEST_CASE("mix: the draw is a pure function of (quotas, seed, epoch), exact in its counts") {
  const std::vector<uint64_t> q = {70, 30};
  const std::vector<uint32_t> a = io::MixDraw(q, 1, 0);
  CHECK(a == io::MixDraw(q, 1, 0));
  CHECK(a != io::MixDraw(q, 1, 1));
  CHECK(a != io::MixDraw(q, 2, 0));
  REQUIRE(a.size() == 100);
  CHECK(std::count(a.begin(), a.end(), 0u) == 70);
  CHECK(std::count(a.begin(), a.end(), 1u) == 30);
  // Pinned: the first draws of seed 1, epoch 0 (a change of generator changes every mixed job's order).
  const std::vector<uint32_t> first(a.begin(), a.begin() + 12);
  INFO("first draws: " << ::Catch::Detail::stringify(first));
  CHECK(first == std::vector<uint32_t>{1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0});
}

TEST_CASE("mix: over many draws each source's share stays within tolerance of its weight, in every stretch") {
  // 0.7 / 0.3 over 100000 draws: every window of 2000 consecutive draws within 0.7 +- 0.05.
  const std::vector<uint32_t> d = io::MixDraw({70000, 30000}, 42, 3);
  size_t worst_window = 0;
  double worst = 0;
  for (size_t start = 0; start + 2000 <= d.size(); start += 2000) {
    const auto n0 = std::count(d.begin() + start, d.begin() + start + 2000, 0u);
    const double share = n0 / 2000.0;
    if (std::abs(share - 0.7) > worst) {
      worst = std::abs(share - 0.7);
      worst_window = start;
    }
  }
  INFO("largest deviation " << worst << " at draw " << worst_window);
  CHECK(worst < 0.05);
  // Three sources 0.5 / 0.3 / 0.2: the first 10% of the epoch already follows the weights.
  const std::vector<uint32_t> e = io::MixDraw({50000, 30000, 20000}, 9, 0);
  std::map<uint32_t, double> share;
  for (size_t i = 0; i < 10000; ++i) share[e[i]] += 1.0 / 10000;
  CHECK(share[0] == Approx(0.5).margin(0.02));
  CHECK(share[1] == Approx(0.3).margin(0.02));
  CHECK(share[2] == Approx(0.2).margin(0.02));
}

TEST_CASE("mix: quotas equal to the sizes deliver every sample exactly once per epoch, ranks disjoint") {
  const io::MixPlan plan = Plan({70, 30}, {0.7, 0.3});
  for (uint64_t epoch : {0, 1, 5}) {
    std::multiset<uint64_t> all;
    for (uint32_t r = 0; r < 2; ++r) {
      const std::vector<uint64_t> order = io::MixedEpochOrder(plan, Opts(r, 2), epoch);
      REQUIRE(order.size() == 50);
      size_t from0 = 0;
      for (uint64_t i : order) from0 += io::MixSourceOf(plan, i) == 0;
      CHECK(from0 == 35);  // this rank's quota of source 0
      all.insert(order.begin(), order.end());
    }
    std::multiset<uint64_t> want;
    for (uint64_t i = 0; i < 100; ++i) want.insert(i);
    CHECK(all == want);  // each of the 100 exactly once over the ranks
  }
  // Another epoch, another order; the same epoch, the same order (a resumed job recomputes it).
  CHECK(io::MixedEpochOrder(plan, Opts(0, 2), 0) != io::MixedEpochOrder(plan, Opts(0, 2), 1));
  const io::MixPlan again = Plan({70, 30}, {0.7, 0.3});
  CHECK(io::MixedEpochOrder(again, Opts(1, 2), 3) == io::MixedEpochOrder(plan, Opts(1, 2), 3));
}

TEST_CASE("mix: resume mid-epoch equals the uninterrupted run") {
  // The pipeline's resume point is (epoch, position) in this order: a resumed job recomputes the
  // epoch's order and continues at the position, so its samples are the uninterrupted run's tail.
  const io::MixPlan plan = Plan({40, 25, 9}, {0.5, 0.3, 0.2}, 60);
  const std::vector<uint64_t> whole = io::MixedEpochOrder(plan, Opts(1, 3, 11), 2);
  REQUIRE(whole.size() == 20);
  const io::MixPlan restarted = Plan({40, 25, 9}, {0.5, 0.3, 0.2}, 60);  // a new daemon, a new plan
  const std::vector<uint64_t> resumed = io::MixedEpochOrder(restarted, Opts(1, 3, 11), 2);
  CHECK(std::vector<uint64_t>(resumed.begin() + 7, resumed.end()) ==
        std::vector<uint64_t>(whole.begin() + 7, whole.end()));
  CHECK(io::MixedEpochOrder(restarted, Opts(1, 3, 11), 3) == io::MixedEpochOrder(plan, Opts(1, 3, 11), 3));
}

TEST_CASE("mix: an up-sampled source repeats whole passes, a down-sampled one continues where it stopped") {
  // 10 and 90 samples, 0.5 / 0.5 of 100 draws: source 0 five whole passes per epoch, source 1 50
  // draws per epoch, its 90 all delivered before any repeats.
  const io::MixPlan plan = Plan({10, 90}, {0.5, 0.5});
  std::vector<uint64_t> s1;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    const std::vector<uint64_t> order = io::MixedEpochOrder(plan, Opts(0, 1), epoch);
    std::map<uint64_t, int> count0;
    for (uint64_t i : order) {
      if (io::MixSourceOf(plan, i) == 0)
        ++count0[i];
      else
        s1.push_back(i);
    }
    CHECK(count0.size() == 10);
    for (const auto& [i, n] : count0) CHECK(n == 5);
  }
  REQUIRE(s1.size() == 100);
  // The mixed order interleaves; within source 1 the stream order is its passes. The first 90
  // of source 1's draws over epochs 0 and 1 (in epoch order) are all 90 of its samples.
  std::set<uint64_t> first_pass(s1.begin(), s1.begin() + 90);
  CHECK(first_pass.size() == 90);
}

TEST_CASE("mix: tar-shard sources keep their shard-aware passes and give each rank a contiguous run") {
  io::MixPlan plan;
  plan.components.push_back({20, {5, 5, 5, 5}, 1, 1.0});  // 4 shards of 5, shuffle buffer 1
  plan.components.push_back({20, {}, 1, 1.0});
  io::SamplerOptions o = Opts(0, 2);
  const std::vector<uint64_t> r0 = io::MixedEpochOrder(plan, o, 0);
  o.rank = 1;
  const std::vector<uint64_t> r1 = io::MixedEpochOrder(plan, o, 0);
  // Source 0's samples of each rank: whole shards (shard = index / 5), 10 per rank = 2 shards.
  for (const auto* r : {&r0, &r1}) {
    std::vector<uint64_t> shard_run;
    for (uint64_t i : *r) {
      if (io::MixSourceOf(plan, i) == 0) shard_run.push_back(i / 5);
    }
    REQUIRE(shard_run.size() == 10);
    CHECK(std::set<uint64_t>(shard_run.begin(), shard_run.end()).size() == 2);
  }
  std::set<uint64_t> all(r0.begin(), r0.end());
  all.insert(r1.begin(), r1.end());
  CHECK(all.size() == 40);
}

// A seam for the forwarding test: samples with fixed keys and bytes.
class ListSource final : public io::SampleSource {
 public:
  ListSource(std::string name, size_t n, std::vector<std::string> classes)
      : name_(std::move(name)), classes_(std::move(classes)) {
    for (size_t i = 0; i < n; ++i) refs_.push_back({name_ + "/" + std::to_string(i), static_cast<int64_t>(i % 2)});
  }
  uint64_t size() const override { return refs_.size(); }
  const io::SampleRef& sample(uint64_t i) const override { return refs_[i]; }
  Status Read(uint64_t i, std::vector<uint8_t>* out) const override {
    out->assign(refs_[i].path.begin(), refs_[i].path.end());
    return Status::Ok();
  }
  std::string Describe() const override { return "list " + name_; }
  std::string Identity() const override { return "list " + name_; }
  std::vector<std::string> ClassNames() const override { return classes_; }

 private:
  std::string name_;
  std::vector<std::string> classes_;
  std::vector<io::SampleRef> refs_;
};

TEST_CASE("MixedSource: indices map to the sources in order, reads and keys are theirs") {
  auto a = std::make_shared<const ListSource>("a", 3, std::vector<std::string>{"x", "y"});
  auto b = std::make_shared<const ListSource>("b", 2, std::vector<std::string>{"x", "y"});
  io::MixedSource mix({a, b}, Plan({3, 2}, {0.6, 0.4}));
  CHECK(mix.size() == 5);
  CHECK(mix.sample(0).path == "a/0");
  CHECK(mix.sample(3).path == "b/0");
  CHECK(mix.sample(4).label == 1);
  std::vector<uint8_t> bytes;
  REQUIRE(mix.Read(4, &bytes).ok());
  CHECK(std::string(bytes.begin(), bytes.end()) == "b/1");
  CHECK(!mix.Read(5, &bytes).ok());
  CHECK(mix.ReadSidecar(1, ".txt", &bytes).code() == StatusCode::kFailedPrecondition);
  CHECK(mix.ClassNames() == std::vector<std::string>{"x", "y"});
  CHECK(mix.ShardSizes().empty());
  CHECK_THAT(mix.Describe(), Catch::Contains("0.6 x list a") && Catch::Contains("0.4 x list b"));
  // The identity (resume fingerprints) changes with a weight or the epoch length.
  io::MixedSource other({a, b}, Plan({3, 2}, {0.5, 0.5}));
  io::MixedSource longer({a, b}, Plan({3, 2}, {0.6, 0.4}, 50));
  CHECK(mix.Identity() != other.Identity());
  CHECK(mix.Identity() != longer.Identity());
  auto c = std::make_shared<const ListSource>("c", 2, std::vector<std::string>{"z"});
  CHECK(io::MixedSource({a, c}, Plan({3, 2}, {1, 1})).ClassNames().empty());  // different classes: none
}

std::string Errors(const config::JobConfigResult& r) {
  std::string out;
  for (const auto& e : r.errors) out += std::to_string(e.line) + ":" + e.path + ": " + e.message + "\n";
  return out;
}

constexpr const char* kTail = R"(transforms:
  - center_crop: {size: 8}
)";

TEST_CASE("config: sources with weights, epoch_samples, and the source fields of a mix") {
  const std::string yaml = std::string(R"(sources:
  - {type: image_folder, root: /data/a, weight: 0.7}
  - type: tar
    shards: /data/b-{0..3}.tar
    shuffle_buffer: 10
    weight: 0.3
sampler: {seed: 3, epoch_samples: 1000}
)") + kTail;
  const auto r = config::ParseJobConfig(yaml);
  INFO(Errors(r));
  REQUIRE(r.config);
  const config::JobConfig& c = *r.config;
  REQUIRE(c.sources.size() == 2);
  CHECK(c.sources[0].weight == 0.7);
  CHECK(c.sources[0].line == 2);
  CHECK(c.sources[1].source.type == config::SourceType::kTar);
  CHECK(c.sources[1].source.shuffle_buffer == 10);
  CHECK(c.sources[1].line == 3);
  CHECK(c.source == c.sources[0].source);
  CHECK(c.sampler.epoch_samples == 1000);
  // --set reaches an entry.
  const auto o = config::ParseJobConfig(yaml, {{"sources.1.weight", "2"}});
  REQUIRE(o.config);
  CHECK(o.config->sources[1].weight == 2);
  // A single source has no mix.
  const auto one = config::ParseJobConfig(std::string("source: {type: image_folder, root: /d}\n") + kTail);
  REQUIRE(one.config);
  CHECK(one.config->sources.empty());
}

TEST_CASE("config: a mix that cannot work is refused, naming the entry's line") {
  auto refused = [](const std::string& yaml, const std::string& want_path, int want_line, const std::string& want) {
    const auto r = config::ParseJobConfig(yaml + kTail);
    INFO(Errors(r));
    REQUIRE(!r.config);
    bool found = false;
    for (const auto& e : r.errors) {
      if (e.path == want_path && (want_line == 0 || e.line == want_line) && e.message.find(want) != std::string::npos)
        found = true;
    }
    CHECK(found);
  };
  refused(R"(sources:
  - {type: image_folder, root: /a}
  - {type: coco, annotations: /c.json, root: /c}
)",
          "sources.1", 3, "coco");
  refused(R"(sources:
  - {type: coco, annotations: /c.json, root: /c}
  - {type: coco, annotations: /d.json, root: /d, max_boxes: 5}
)",
          "sources.1", 3, "max_boxes");
  refused(R"(sources:
  - {type: image_folder, root: /a, weight: 0}
)",
          "sources.0.weight", 2, "weight");
  refused(R"(sources:
  - {type: image_folder, root: /a}
  - {type: http, list: /urls.txt}
extra_outputs: [{name: txt, from: .txt, max_bytes: 16}]
)",
          "sources.1", 3, "extra_outputs");
  refused(R"(source: {type: image_folder, root: /a}
sources:
  - {type: image_folder, root: /b}
)",
          "source", 1, "not both");
  refused(R"(source: {type: image_folder, root: /a}
sampler: {epoch_samples: 10}
)",
          "sampler.epoch_samples", 2, "sources");
  refused("sources: []\n", "sources", 1, "1 to 64");
  refused(R"(sources:
  - {type: image_folder, root: /a, wieght: 2}
)",
          "sources.0.wieght", 2, "");
}

}  // namespace
}  // namespace spdl
