// User ops, below the daemon: the trust check (plugins/op_loader.h), loading the example op library
// built by CMake (examples/ops) and running its ops, the `op:` transform entry and plugin_dirs in
// the configs, the decoder with ops (jobs/sample_decoder.h) against the decoder without, and the
// resume fingerprint over an op's library, name and args.
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>

#include "config/daemon_config.h"
#include "config/job_config.h"
#include "jobs/resume_token.h"
#include "jobs/sample_decoder.h"
#include "media/image_decoder.h"
#include "media/jpeg_encoder.h"
#include "media/sample_random.h"
#include "plugins/op_loader.h"
#include "temp_dir.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;

using spdl::testing::TempDir;  // temp_dir.h

// A plugin dir holding the example op library (mode 0755).
struct ExampleOps {
  ExampleOps() {
    fs::copy_file(SPDL_EXAMPLE_OPS, dir.path + "/libspdl_example_ops.so");
    ::chmod((dir.path + "/libspdl_example_ops.so").c_str(), 0755);
  }
  TempDir dir{0755};
};

config::JobConfigResult ParseJob(const std::string& transforms, const std::string& extra = "") {
  return config::ParseJobConfig("source: {type: image_folder, root: /data}\nbatch: {size: 4}\ntransforms:\n" +
                                transforms + extra);
}

std::string Errors(const config::JobConfigResult& r) { return config::FormatConfigErrors(r.errors, "job.yaml"); }

TEST_CASE("plugins: the trust check refuses writable-by-others and foreign-owned dirs and files") {
  const uint32_t me = 1234;
  CHECK(plugins::CheckTrusted("/d", S_IFDIR | 0755, 0, me, true).ok());
  CHECK(plugins::CheckTrusted("/d", S_IFDIR | 0755, me, me, true).ok());
  CHECK(plugins::CheckTrusted("/d/l.so", S_IFREG | 0644, 0, me, false).ok());
  const Status world = plugins::CheckTrusted("/d", S_IFDIR | 0777, 0, me, true);
  CHECK(world.code() == StatusCode::kFailedPrecondition);
  CHECK_THAT(world.message(), Catch::Contains("plugin directory /d is world-writable (mode 0777)"));
  CHECK_THAT(plugins::CheckTrusted("/d/l.so", S_IFREG | 0664, 0, me, false).message(),
             Catch::Contains("op library /d/l.so is group-writable"));
  CHECK_THAT(plugins::CheckTrusted("/d/l.so", S_IFREG | 0644, 999, me, false).message(),
             Catch::Contains("owned by uid 999, neither root nor spdld's user (uid 1234)"));
  CHECK_THAT(plugins::CheckTrusted("/d", S_IFREG | 0755, 0, me, true).message(), Catch::Contains("not a directory"));
  CHECK_THAT(plugins::CheckTrusted("/d/x", S_IFDIR | 0755, 0, me, false).message(),
             Catch::Contains("not a regular file"));
}

TEST_CASE("plugins: the example library loads once, posterize and gaussian_blur run, bad args are refused") {
  ExampleOps ex;
  plugins::OpLoader loader({ex.dir.path});
  CHECK(loader.CheckDirs().empty());
  auto posterize = loader.Create("libspdl_example_ops.so", "posterize", R"({"bits":3})");
  REQUIRE(posterize.ok());
  std::vector<uint8_t> img(5 * 7 * 3);
  for (size_t i = 0; i < img.size(); ++i) img[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<uint8_t> orig = img;
  REQUIRE((*posterize)->Apply(img.data(), 5, 7, 3, 7 * 3, 42).ok());
  for (size_t i = 0; i < img.size(); ++i) CHECK(img[i] == (orig[i] & 0xE0));

  auto blur = loader.Create("libspdl_example_ops.so", "gaussian_blur", R"({"sigma_max":1.5,"sigma_min":0.5})");
  REQUIRE(blur.ok());
  std::vector<uint8_t> a = orig, b = orig, c = orig;
  REQUIRE((*blur)->Apply(a.data(), 5, 7, 3, 21, 1).ok());
  REQUIRE((*blur)->Apply(b.data(), 5, 7, 3, 21, 1).ok());
  REQUIRE((*blur)->Apply(c.data(), 5, 7, 3, 21, 2).ok());
  CHECK(a == b);  // the seed decides the sigma
  CHECK(a != orig);
  CHECK(a != c);
  std::vector<uint8_t> flat(4 * 4 * 3, 90);
  REQUIRE((*blur)->Apply(flat.data(), 4, 4, 3, 12, 3).ok());
  CHECK(flat == std::vector<uint8_t>(4 * 4 * 3, 90));

  auto bad = loader.Create("libspdl_example_ops.so", "posterize", R"({"bits":9})");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("posterize: bits must be an integer 1..8"));
  auto unknown = loader.Create("libspdl_example_ops.so", "sharpen", "{}");
  REQUIRE_FALSE(unknown.ok());
  CHECK_THAT(unknown.status().message(), Catch::Contains("its ops: posterize, gaussian_blur"));
  CHECK(loader.Create("../libspdl_example_ops.so", "posterize", "{}").status().code() == StatusCode::kInvalidArgument);
  CHECK(loader.Create("libnope.so", "posterize", "{}").status().code() == StatusCode::kNotFound);

  plugins::OpLoader disabled({});
  CHECK_THAT(disabled.Create("libspdl_example_ops.so", "posterize", "{}").status().message(),
             Catch::Contains("ops are disabled"));

  // A library turned group-writable after it was loaded stays loaded (loaded once and kept); a
  // fresh loader refuses it.
  ::chmod((ex.dir.path + "/libspdl_example_ops.so").c_str(), 0775);
  CHECK(loader.Create("libspdl_example_ops.so", "posterize", "{}").ok());
  plugins::OpLoader fresh({ex.dir.path});
  CHECK_THAT(fresh.Create("libspdl_example_ops.so", "posterize", "{}").status().message(),
             Catch::Contains("group-writable"));
}

TEST_CASE("config: op entries parse with canonical JSON args, and are refused out of place or malformed") {
  auto r = ParseJob(
      "  - resize: {shorter: 64}\n"
      "  - center_crop: {size: 56}\n"
      "  - op: {library: libx.so, name: blur, args: {z: [1, 2.5, true, null], a: 'yes', n: {k: \"7\"}, i: 3}}\n"
      "  - horizontal_flip: {}\n"
      "  - op: {library: libx.so, name: posterize}\n"
      "  - normalize: {mean: [0, 0, 0], std: [1, 1, 1]}\n",
      "output: {dtype: float32}\n");
  INFO(Errors(r));
  REQUIRE(r.config);
  const auto& op = std::get<config::UserOp>(r.config->transforms[2]);
  CHECK(op.library == "libx.so");
  CHECK(op.name == "blur");
  CHECK(op.args_json == R"({"a":"yes","i":3,"n":{"k":"7"},"z":[1,2.5,true,null]})");
  CHECK(op.path == "transforms.2.op");
  CHECK(op.line == 6);
  CHECK(std::get<config::UserOp>(r.config->transforms[4]).args_json == "{}");
  CHECK(r.config->out_height == 56);

  auto before = ParseJob("  - op: {library: libx.so, name: blur}\n  - resize: {height: 8, width: 8}\n");
  INFO(Errors(before));
  CHECK(before.config);  // before every geometric transform: on the whole decoded image
  auto between =
      ParseJob("  - resize: {shorter: 10}\n  - op: {library: libx.so, name: blur}\n  - center_crop: {size: 8}\n");
  CHECK_FALSE(between.config);
  CHECK_THAT(Errors(between), Catch::Contains("center_crop comes after the op at transforms.1, which follows a "
                                              "geometric transform"));
  auto after = ParseJob(
      "  - resize: {height: 8, width: 8}\n  - normalize: {mean: [0, 0, 0], std: [1, 1, 1]}\n"
      "  - op: {library: libx.so, name: blur}\n",
      "output: {dtype: float32}\n");
  CHECK_THAT(Errors(after), Catch::Contains("op comes after normalize"));
  auto slash = ParseJob("  - resize: {height: 8, width: 8}\n  - op: {library: /tmp/evil.so, name: blur, bogus: 1}\n");
  CHECK_THAT(Errors(slash), Catch::Contains("a library is a file name in the daemon's plugin_dirs, without '/'"));
  CHECK_THAT(Errors(slash), Catch::Contains("bogus: unknown key"));
  auto no_name = ParseJob("  - resize: {height: 8, width: 8}\n  - op: {library: libx.so, args: [1]}\n");
  CHECK_THAT(Errors(no_name), Catch::Contains("args is a map of the op's settings"));
  CHECK_THAT(Errors(no_name), Catch::Contains("name"));

  auto d = config::ParseDaemonConfig("plugin_dirs: [/usr/lib/spdld/ops, relative/dir]\n");
  CHECK_FALSE(d.config);
  CHECK_THAT(config::FormatConfigErrors(d.errors, "spdld.yaml"),
             Catch::Contains("plugin_dirs.1: must be an absolute directory"));
  auto d2 = config::ParseDaemonConfig("plugin_dirs: [/usr/lib/spdld/ops]\n");
  REQUIRE(d2.config);
  CHECK(d2.config->plugin_dirs == std::vector<std::string>{"/usr/lib/spdld/ops"});
  CHECK(config::DaemonConfig{}.plugin_dirs.empty());  // ops are off unless an administrator lists a dir
}

class ListSource final : public io::SampleSource {
 public:
  uint64_t size() const override { return 16; }
  const io::SampleRef& sample(uint64_t i) const override { return samples_[i]; }
  Status Read(uint64_t, std::vector<uint8_t>* out) const override {
    out->clear();
    return FailedPrecondition("not read");
  }
  std::string Describe() const override { return "list"; }
  std::string Identity() const override { return "test list"; }

 private:
  std::vector<io::SampleRef> samples_ = std::vector<io::SampleRef>(16, io::SampleRef{"s", 0});
};

TEST_CASE("resume: an op's library, name and args are in the fingerprint, its line is not") {
  const std::string geo = "  - resize: {height: 8, width: 8}\n";
  auto base = ParseJob(geo + "  - op: {library: libx.so, name: blur, args: {sigma: 1}}\n");
  auto moved = ParseJob("\n\n" + geo + "  - op: {library: libx.so, name: blur, args: {sigma: 1}}\n");
  auto other_args = ParseJob(geo + "  - op: {library: libx.so, name: blur, args: {sigma: 2}}\n");
  auto other_lib = ParseJob(geo + "  - op: {library: liby.so, name: blur, args: {sigma: 1}}\n");
  auto other_name = ParseJob(geo + "  - op: {library: libx.so, name: sharpen, args: {sigma: 1}}\n");
  REQUIRE((base.config && moved.config && other_args.config && other_lib.config && other_name.config));
  ListSource src;
  pipeline::ResumePoint p;
  p.prefix = 4;
  p.next_batch = 1;
  const std::string token = jobs::EncodeResumeToken(p, jobs::JobFingerprint(src, *base.config, 0, 1));
  CHECK(jobs::DecodeResumeToken(token, jobs::JobFingerprint(src, *moved.config, 0, 1)).ok());
  for (const auto* c : {&other_args, &other_lib, &other_name}) {
    auto r = jobs::DecodeResumeToken(token, jobs::JobFingerprint(src, *c->config, 0, 1));
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("its transforms differ"));
  }
}

TEST_CASE(
    "decoder: posterize in place on uint8 rows and through float32 NCHW equals the decoder without it, "
    "masked, its stats row counts it, a job without plugin dirs is refused with the entry's line") {
  ExampleOps ex;
  plugins::OpLoader loader({ex.dir.path});
  std::vector<uint8_t> rgb(64 * 48 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 7) ^ (i / 191));
  auto jpeg = media::EncodeJpeg(rgb.data(), 64, 48, 90);
  REQUIRE(jpeg.ok());
  const std::string geo = "  - resize: {shorter: 32}\n  - center_crop: {size: 24}\n";
  const std::string op = "  - op: {library: libspdl_example_ops.so, name: posterize, args: {bits: 2}}\n";
  auto plain = ParseJob(geo);
  auto with_op = ParseJob(geo + op);
  auto as_float = ParseJob(geo + op, "output: {dtype: float32, layout: NCHW}\n");
  REQUIRE((plain.config && with_op.config && as_float.config));
  auto d0 = jobs::MakeSampleDecoder(*plain.config, &loader);
  auto d1 = jobs::MakeSampleDecoder(*with_op.config, &loader);
  auto d2 = jobs::MakeSampleDecoder(*as_float.config, &loader);
  REQUIRE((d0.ok() && d1.ok() && d2.ok()));
  CHECK((*d0)->SubStageStats().empty());
  REQUIRE((*d1)->SubStageStats().size() == 1);
  std::vector<uint8_t> r0(24 * 24 * 3), r1(24 * 24 * 3), r2(24 * 24 * 3 * 4);
  uint8_t* p0[] = {r0.data()};
  uint8_t* p1[] = {r1.data()};
  uint8_t* p2[] = {r2.data()};
  REQUIRE((*d0)->Decode(*jpeg, 5, p0).ok());
  REQUIRE((*d1)->Decode(*jpeg, 5, p1).ok());
  REQUIRE((*d2)->Decode(*jpeg, 5, p2).ok());
  int bad = 0, bad_float = 0;
  for (size_t i = 0; i < r0.size(); ++i) {
    bad += r1[i] != (r0[i] & 0xC0);
    const size_t c = i % 3, px = i / 3;
    float f = 0;
    std::memcpy(&f, r2.data() + (c * 24 * 24 + px) * 4, 4);
    bad_float += f != static_cast<float>((r0[i] & 0xC0) / 255.0);
  }
  CHECK(bad == 0);
  CHECK(bad_float == 0);
  const pipeline::StageSnapshot snap = (*d1)->SubStageStats()[0]->Snapshot();
  CHECK(snap.name == "op:posterize");
  CHECK(snap.tasks == 1);
  CHECK(snap.failures == 0);

  auto refused = jobs::MakeSampleDecoder(*with_op.config, nullptr);
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("transforms.2.op (line 6): ops are disabled"));

  // Targets cannot follow an op (its geometry is unknown): a mask job with one is refused; with a
  // built-in augmentation instead it is accepted and reports its geometry (image_ops()).
  auto masked_op = ParseJob(geo + op, "mask: {from: .png}\n");
  auto masked_aug = ParseJob(geo + "  - vertical_flip: {p: 1}\n", "mask: {from: .png}\n");
  REQUIRE((masked_op.config && masked_aug.config));
  auto no_targets = jobs::MakeSampleDecoder(*masked_op.config, &loader);
  REQUIRE_FALSE(no_targets.ok());
  CHECK_THAT(no_targets.status().message(), Catch::Contains("boxes and masks cannot follow op: transforms"));
  auto with_aug = jobs::MakeSampleDecoder(*masked_aug.config, &loader);
  REQUIRE(with_aug.ok());
  CHECK((*with_aug)->image_ops() != nullptr);
  CHECK((*d1)->image_ops() == nullptr);  // with an op: no geometry to follow
}

TEST_CASE("media: DecodeWithHookInto runs its hook on the whole upright image, before the geometry") {
  std::vector<uint8_t> rgb(90 * 60 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 13) ^ (i / 97));
  auto jpeg = media::EncodeJpeg(rgb.data(), 90, 60, 90);
  REQUIRE(jpeg.ok());
  media::ImageOps ops;
  ops.resize_shorter = 32;
  ops.crop_height = ops.crop_width = 24;
  media::ImageDecoder decoder;
  std::vector<uint8_t> ref(24 * 24 * 3), got(24 * 24 * 3);
  REQUIRE(decoder.ReferenceDecodeInto(*jpeg, ops, ref.data(), 24, 24, 24 * 3).ok());
  int seen_w = 0, seen_h = 0;
  auto identity = [&](uint8_t*, int w, int h, size_t) {
    seen_w = w;
    seen_h = h;
    return Status::Ok();
  };
  REQUIRE(decoder.DecodeWithHookInto(*jpeg, ops, got.data(), 24, 24, 24 * 3, 0, identity).ok());
  CHECK((seen_w == 90 && seen_h == 60));
  CHECK(got == ref);
  auto fill = [](uint8_t* px, int w, int h, size_t stride) {
    for (int y = 0; y < h; ++y) std::memset(px + y * stride, 200, static_cast<size_t>(w) * 3);
    return Status::Ok();
  };
  REQUIRE(decoder.DecodeWithHookInto(*jpeg, ops, got.data(), 24, 24, 24 * 3, 0, fill).ok());
  CHECK(got == std::vector<uint8_t>(24 * 24 * 3, 200));
  auto fail = [](uint8_t*, int, int, size_t) { return DataLoss("op refused"); };
  CHECK(decoder.DecodeWithHookInto(*jpeg, ops, got.data(), 24, 24, 24 * 3, 0, fail).message() == "op refused");
}

}  // namespace
}  // namespace spdl
