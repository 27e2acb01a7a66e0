// Tests for daemon/config: job and daemon configs, overrides, byte sizes, error reporting, and the
// example files shipped under config/.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/config_error.h"
#include "config/daemon_config.h"
#include "config/job_config.h"
#include "config/override.h"

namespace spdl::config {
namespace {

// A minimal valid job, used as the base of many tests.
constexpr const char* kMinimalJob = R"(source:
  root: /data/x
transforms:
  - center_crop: {size: 224}
)";

// Every error, formatted, for failure messages.
std::string Dump(const std::vector<ConfigError>& errors) { return FormatConfigErrors(errors, "test.yaml"); }

// The one error whose path is `path`; fails the test when there is not exactly one.
ConfigError ErrorAt(const std::vector<ConfigError>& errors, const std::string& path) {
  std::vector<ConfigError> found;
  for (const ConfigError& e : errors) {
    if (e.path == path) found.push_back(e);
  }
  INFO(Dump(errors));
  REQUIRE(found.size() == 1);
  return found.front();
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

JobConfig ParseGoodJob(const std::string& yaml, const std::vector<Override>& overrides = {}) {
  JobConfigResult r = ParseJobConfig(yaml, overrides);
  INFO(Dump(r.errors));
  REQUIRE(r.errors.empty());
  REQUIRE(r.config.has_value());
  return *r.config;
}

std::vector<ConfigError> ParseBadJob(const std::string& yaml, const std::vector<Override>& overrides = {}) {
  JobConfigResult r = ParseJobConfig(yaml, overrides);
  REQUIRE_FALSE(r.errors.empty());
  REQUIRE_FALSE(r.config.has_value());
  return r.errors;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------- job config: good ----------------

TEST_CASE("job config: a minimal config takes every default") {
  JobConfig c = ParseGoodJob(kMinimalJob);
  JobConfig expected;
  expected.source.root = "/data/x";
  expected.transforms = {CenterCropOp{224, 224}};
  expected.out_height = 224;
  expected.out_width = 224;
  CHECK(c == expected);
  CHECK(c.source.type == SourceType::kImageFolder);
  CHECK(c.source.extensions == std::vector<std::string>{".jpg", ".jpeg"});
  CHECK(c.sampler.shuffle);
  CHECK(c.sampler.seed == 0);
  CHECK(c.sampler.uneven == Uneven::kPad);
  CHECK(c.batch.size == 32);
  CHECK_FALSE(c.batch.drop_last);
  CHECK(c.output.dtype == DType::kUInt8);
  CHECK(c.output.layout == Layout::kNHWC);
  CHECK(c.decode == DecodeConfig{});
  CHECK_FALSE(c.decode.exif_orientation);
  CHECK(c.decode.alpha == AlphaMode::kDrop);
  CHECK(c.decode.max_pixels == 178956970);
  CHECK(c.output.device == "cpu");
  CHECK(c.prefetch == 4);
  CHECK(c.on_error == OnError::kSkip);
}

TEST_CASE("job config: every field set") {
  JobConfig c = ParseGoodJob(R"(
source:
  type: image_folder
  root: /data/imagenet/train
  extensions: [.JPG, .png]
sampler:
  shuffle: false
  seed: 18446744073709551615
  uneven: drop
batch:
  size: 256
  drop_last: true
transforms:
  - resize: {height: 300, width: 400, interpolation: area}
  - center_crop: {size: [200, 100]}
  - resize: {shorter: 64, interpolation: bicubic}
  - center_crop: {size: 64}
output:
  dtype: uint8
  layout: NHWC
  device: cpu
prefetch: 64
on_error: fail
)");
  CHECK(c.source.root == "/data/imagenet/train");
  CHECK(c.source.extensions == std::vector<std::string>{".jpg", ".png"});  // stored lower-case
  CHECK_FALSE(c.sampler.shuffle);
  CHECK(c.sampler.seed == 18446744073709551615ull);
  CHECK(c.sampler.uneven == Uneven::kDrop);
  CHECK(c.batch.size == 256);
  CHECK(c.batch.drop_last);
  REQUIRE(c.transforms.size() == 4);
  CHECK(std::get<ResizeOp>(c.transforms[0]) == ResizeOp{0, 300, 400, Interpolation::kArea});
  CHECK(std::get<CenterCropOp>(c.transforms[1]) == CenterCropOp{200, 100});
  CHECK(std::get<ResizeOp>(c.transforms[2]) == ResizeOp{64, 0, 0, Interpolation::kBicubic});
  CHECK(std::get<CenterCropOp>(c.transforms[3]) == CenterCropOp{64, 64});
  CHECK(c.out_height == 64);
  CHECK(c.out_width == 64);
  CHECK(c.prefetch == 64);
  CHECK(c.on_error == OnError::kFail);
}

TEST_CASE("job config: output size of transform chains") {
  SECTION("resize to a fixed size alone") {
    JobConfig c = ParseGoodJob("source: {root: /d}\ntransforms:\n  - resize: {height: 120, width: 160}\n");
    CHECK(c.out_height == 120);
    CHECK(c.out_width == 160);
    CHECK(std::get<ResizeOp>(c.transforms[0]).interpolation == Interpolation::kBilinear);
  }
  SECTION("a crop first fixes the size") {
    JobConfig c = ParseGoodJob("source: {root: /d}\ntransforms: [{center_crop: {size: [10, 20]}}]\n");
    CHECK(c.out_height == 10);
    CHECK(c.out_width == 20);
  }
  SECTION("a crop as large as the shorter side is fine") {
    JobConfig c =
        ParseGoodJob("source: {root: /d}\ntransforms: [{resize: {shorter: 224}}, {center_crop: {size: 224}}]\n");
    CHECK(c.out_height == 224);
  }
  SECTION("a null section takes its defaults") {
    JobConfig c = ParseGoodJob(std::string(kMinimalJob) + "batch:\noutput:\n");
    CHECK(c.batch.size == 32);
    CHECK(c.output.device == "cpu");
  }
}

// ---------------- job config: bad ----------------

TEST_CASE("job config: an unknown key is reported at its line, with a suggestion") {
  std::vector<ConfigError> errors = ParseBadJob(R"(source:
  root: /data
batch:
  sise: 4
transforms:
  - center_crop: {size: 224}
colour: red
)");
  REQUIRE(errors.size() == 2);
  ConfigError e = ErrorAt(errors, "batch.sise");
  CHECK(e.line == 4);
  CHECK(e.column == 3);
  CHECK(e.message == "unknown key 'sise' (did you mean 'size'?)");
  ConfigError top = ErrorAt(errors, "colour");
  CHECK(top.line == 7);
  CHECK(top.message == "unknown key 'colour'");
}

TEST_CASE("job config: wrong types") {
  std::vector<ConfigError> errors = ParseBadJob(R"(source:
  root: [a, b]
  extensions: .jpg
sampler:
  shuffle: maybe
  seed: -3
batch:
  size: 3.5
transforms:
  - center_crop: {size: 224}
prefetch: {a: 1}
output: cpu
)");
  INFO(Dump(errors));
  CHECK(errors.size() == 7);
  CHECK(ErrorAt(errors, "source.root").line == 2);
  CHECK(ErrorAt(errors, "source.root").message == "expected a string, got a list");
  CHECK(ErrorAt(errors, "source.extensions").message == "expected a list, got '.jpg'");
  CHECK(ErrorAt(errors, "sampler.shuffle").message == "expected true or false, got 'maybe'");
  CHECK(ErrorAt(errors, "sampler.seed").line == 6);
  CHECK(ErrorAt(errors, "batch.size").message == "expected an integer, got '3.5'");
  CHECK(ErrorAt(errors, "batch.size").line == 8);
  CHECK(ErrorAt(errors, "prefetch").line == 11);
  CHECK(ErrorAt(errors, "output").message == "expected a map of settings, got 'cpu'");
}

TEST_CASE("job config: values out of range") {
  std::vector<ConfigError> errors = ParseBadJob(R"(source:
  root: /data
batch:
  size: 0
transforms:
  - resize: {shorter: 20000}
  - center_crop: {size: 224}
prefetch: 65
)");
  INFO(Dump(errors));
  REQUIRE(errors.size() == 3);
  ConfigError size = ErrorAt(errors, "batch.size");
  CHECK(size.line == 4);
  CHECK(size.column == 9);
  CHECK(size.message == "must be at least 1 (got 0)");
  CHECK(ErrorAt(errors, "transforms.0.resize.shorter").message == "must be at most 16384 (got 20000)");
  CHECK(ErrorAt(errors, "transforms.0.resize.shorter").line == 6);
  CHECK(ErrorAt(errors, "prefetch").message == "must be at most 64 (got 65)");
}

TEST_CASE("job config: missing or empty root") {
  SECTION("no source at all: reported at the top of the document") {
    std::vector<ConfigError> errors = ParseBadJob("# a job\ntransforms: [{center_crop: {size: 8}}]\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "source.root");
    CHECK(errors[0].line == 2);
    CHECK(errors[0].message == "required key is missing");
  }
  SECTION("a source without root: reported at the source key") {
    std::vector<ConfigError> errors =
        ParseBadJob("batch: {size: 2}\nsource:\n  type: image_folder\ntransforms: [{center_crop: {size: 8}}]\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "source.root");
    CHECK(errors[0].line == 2);
  }
  SECTION("an empty root") {
    std::vector<ConfigError> errors = ParseBadJob("source:\n  root: ''\ntransforms: [{center_crop: {size: 8}}]\n");
    CHECK(ErrorAt(errors, "source.root").message == "must not be empty");
  }
  SECTION("an unknown source type") {
    std::vector<ConfigError> errors =
        ParseBadJob("source:\n  root: /d\n  type: lmdb\ntransforms: [{center_crop: {size: 8}}]\n");
    REQUIRE(errors.size() == 1);
    CHECK(ErrorAt(errors, "source.type").line == 3);
    CHECK(ErrorAt(errors, "source.type").message ==
          "must be one of image_folder | file_list | tar | http | coco | s3_prefix | stream | watch (got 'lmdb')");
  }
}

TEST_CASE("job config: file_list, tar and http sources") {
  const std::string t = "transforms: [{center_crop: {size: 8}}]\n";
  SECTION("file_list") {
    JobConfig c = ParseGoodJob("source: {type: file_list, list: /data/train.csv, root: /data/img}\n" + t);
    CHECK(c.source.type == SourceType::kFileList);
    CHECK(c.source.list == "/data/train.csv");
    CHECK(c.source.root == "/data/img");
    c = ParseGoodJob("source: {type: file_list, list: /data/train.txt}\n" + t);
    CHECK(c.source.root.empty());  // the list's directory
  }
  SECTION("tar: a pattern or a list, and its defaults") {
    JobConfig c = ParseGoodJob("source: {type: tar, shards: '/data/train-{000..127}.tar'}\n" + t);
    CHECK(c.source.type == SourceType::kTar);
    CHECK(c.source.shards == std::vector<std::string>{"/data/train-{000..127}.tar"});
    CHECK(c.source.extensions == std::vector<std::string>{".jpg", ".jpeg", ".png", ".webp"});
    CHECK(c.source.label_extension == ".cls");
    CHECK(c.source.shuffle_buffer == 1000);
    c = ParseGoodJob(
        "source:\n  type: tar\n  shards: [/d/a.tar, /d/b.tar]\n  extensions: [.PNG]\n  label_extension: ''\n"
        "  shuffle_buffer: 64\n" +
        t);
    CHECK(c.source.shards == std::vector<std::string>{"/d/a.tar", "/d/b.tar"});
    CHECK(c.source.extensions == std::vector<std::string>{".png"});
    CHECK(c.source.label_extension.empty());
    CHECK(c.source.shuffle_buffer == 64);
  }
  SECTION("http") {
    JobConfig c = ParseGoodJob(
        "source:\n  type: http\n  list: /data/urls.txt\n  base_url: http://127.0.0.1:8000/img\n"
        "  timeout_ms: 2000\n  connect_timeout_ms: 300\n  max_attempts: 2\n  max_in_flight: 8\n" +
        t);
    CHECK(c.source.type == SourceType::kHttp);
    CHECK(c.source.list == "/data/urls.txt");
    CHECK(c.source.base_url == "http://127.0.0.1:8000/img");
    CHECK(c.source.timeout_ms == 2000);
    CHECK(c.source.connect_timeout_ms == 300);
    CHECK(c.source.max_attempts == 2);
    CHECK(c.source.max_in_flight == 8);
  }
  SECTION("overrides switch the type") {
    JobConfig c = ParseGoodJob("source: {type: tar, shards: /d/x.tar}\n" + t,
                               {{"source.shards", "[/e/y.tar]"}, {"source.shuffle_buffer", "5"}});
    CHECK(c.source.shards == std::vector<std::string>{"/e/y.tar"});
    CHECK(c.source.shuffle_buffer == 5);
  }
}

TEST_CASE("job config: source errors, each with its line") {
  SECTION("keys of another type, missing required keys") {
    std::vector<ConfigError> errors = ParseBadJob(R"(source:
  type: tar
  root: /data
  list: /data/l.txt
  max_attempts: 3
transforms: [{center_crop: {size: 8}}]
)");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 4);
    CHECK(ErrorAt(errors, "source.shards").message == "required key is missing");
    CHECK(ErrorAt(errors, "source.shards").line == 1);
    CHECK(ErrorAt(errors, "source.root").line == 3);
    CHECK(ErrorAt(errors, "source.root").message ==
          "'root' is not a key of source type tar (it belongs to image_folder and file_list and coco and watch)");
    CHECK(ErrorAt(errors, "source.list").line == 4);
    CHECK(ErrorAt(errors, "source.max_attempts").line == 5);
    CHECK(Contains(ErrorAt(errors, "source.max_attempts").message, "belongs to http"));
  }
  SECTION("bad values") {
    std::vector<ConfigError> errors = ParseBadJob(R"(source:
  type: http
  list: ''
  base_url: ftp://x/
  timeout_ms: 0
  max_attempts: 1000
  max_in_flight: many
  shuffle: 3
transforms: [{center_crop: {size: 8}}]
)");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 6);
    CHECK(ErrorAt(errors, "source.list").line == 3);
    CHECK(ErrorAt(errors, "source.list").message == "must not be empty");
    CHECK(ErrorAt(errors, "source.base_url").line == 4);
    CHECK(ErrorAt(errors, "source.timeout_ms").line == 5);
    CHECK(ErrorAt(errors, "source.max_attempts").message == "must be at most 100 (got 1000)");
    CHECK(ErrorAt(errors, "source.max_in_flight").line == 7);
    CHECK(ErrorAt(errors, "source.shuffle").line == 8);
    CHECK(Contains(ErrorAt(errors, "source.shuffle").message, "unknown key 'shuffle'"));
  }
  SECTION("tar: bad shards, extension and buffer") {
    std::vector<ConfigError> errors = ParseBadJob(R"(source:
  type: tar
  shards: []
  label_extension: cls
  shuffle_buffer: 0
transforms: [{center_crop: {size: 8}}]
)");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 3);
    CHECK(ErrorAt(errors, "source.shards").line == 3);
    CHECK(ErrorAt(errors, "source.label_extension").line == 4);
    CHECK(ErrorAt(errors, "source.shuffle_buffer").line == 5);
  }
  SECTION("file_list without a list") {
    std::vector<ConfigError> errors =
        ParseBadJob("source:\n  type: file_list\n  root: /d\ntransforms: [{center_crop: {size: 8}}]\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "source.list");
    CHECK(errors[0].line == 1);
  }
}

TEST_CASE("job config: bad transforms") {
  auto bad = [](const std::string& transforms) {
    return ParseBadJob("source: {root: /d}\ntransforms:\n" + transforms);
  };
  SECTION("no transforms") {
    std::vector<ConfigError> errors = ParseBadJob("source: {root: /d}\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "transforms");
    CHECK(errors[0].message ==
          "transforms must produce a fixed image size (end with center_crop or resize {height, width})");
    errors = ParseBadJob("source: {root: /d}\ntransforms: []\n");
    CHECK(ErrorAt(errors, "transforms").line == 2);
  }
  SECTION("resize shorter alone does not fix the size") {
    std::vector<ConfigError> errors = bad("  - resize: {shorter: 256}\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "transforms");
    CHECK(errors[0].line == 2);
    CHECK(Contains(errors[0].message, "fixed image size"));
  }
  SECTION("a crop larger than the shorter side after resize") {
    std::vector<ConfigError> errors = bad("  - resize: {shorter: 200}\n  - center_crop: {size: [224, 100]}\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "transforms.1.center_crop.size");
    CHECK(errors[0].line == 4);
    CHECK(errors[0].message == "center_crop 224x100 is larger than the shorter side (200) after the resize before it");
  }
  SECTION("a crop larger than a fixed resize") {
    std::vector<ConfigError> errors = bad("  - resize: {height: 100, width: 300}\n  - center_crop: {size: 200}\n");
    REQUIRE(errors.size() == 1);
    CHECK(Contains(errors[0].message, "larger than the image (100x300)"));
  }
  SECTION("resize with both forms, with neither, with half a size") {
    std::vector<ConfigError> errors =
        bad("  - resize: {shorter: 256, height: 10, width: 10}\n"
            "  - resize: {interpolation: area}\n"
            "  - resize: {height: 10}\n"
            "  - center_crop: {size: 8}\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 3);
    CHECK(errors[0].path == "transforms.0.resize");
    CHECK(errors[0].line == 3);
    CHECK(Contains(errors[0].message, "not both"));
    CHECK(errors[1].line == 4);
    CHECK(Contains(errors[1].message, "needs 'shorter' or both"));
    CHECK(errors[2].line == 5);
    CHECK(Contains(errors[2].message, "both 'height' and 'width'"));
  }
  SECTION("an unknown transform, a bad entry, two keys in one entry") {
    std::vector<ConfigError> errors =
        bad("  - rezise: {shorter: 10}\n"
            "  - flip\n"
            "  - {resize: {shorter: 10}, center_crop: {size: 8}}\n"
            "  - center_crop: {size: [1, 2, 3]}\n"
            "  - resize: {shorter: 10, interpolaton: area}\n"
            "  - center_crop: {}\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 6);
    CHECK(ErrorAt(errors, "transforms.0.rezise").message ==
          "unknown transform 'rezise' (did you mean 'resize'?); expected resize, center_crop, "
          "random_resized_crop, horizontal_flip, normalize, op, or an augmentation (color_jitter, grayscale, "
          "gaussian_blur, posterize, solarize, equalize, autocontrast, sharpness, invert, rand_augment, "
          "trivial_augment_wide, auto_augment, vertical_flip, rotate, affine, random_crop, random_erasing)");
    CHECK(ErrorAt(errors, "transforms.1").line == 4);
    CHECK(Contains(ErrorAt(errors, "transforms.1").message, "got 'flip'"));
    CHECK(Contains(ErrorAt(errors, "transforms.2").message, "exactly one key"));
    CHECK(Contains(ErrorAt(errors, "transforms.3.center_crop.size").message, "list of 3 item(s)"));
    CHECK(ErrorAt(errors, "transforms.4.resize.interpolaton").message ==
          "unknown key 'interpolaton' (did you mean 'interpolation'?)");
    CHECK(ErrorAt(errors, "transforms.5.center_crop.size").message == "required key is missing");
  }
  SECTION("a bad interpolation and an out-of-range crop") {
    std::vector<ConfigError> errors =
        bad("  - resize: {shorter: 10, interpolation: cubic}\n  - center_crop: {size: [0, 8]}\n");
    REQUIRE(errors.size() == 2);
    CHECK(errors[0].message ==
          "must be one of bilinear | bicubic | area | box | nearest | hamming | lanczos (got 'cubic'); did you mean "
          "'bicubic'?");
    CHECK(errors[1].path == "transforms.1.center_crop.size.0");
    CHECK(errors[1].message == "must be at least 1 (got 0)");
  }
}

TEST_CASE("job config: output options") {
  SECTION("every dtype and layout") {
    const std::pair<const char*, DType> dtypes[] = {{"uint8", DType::kUInt8},
                                                    {"float32", DType::kFloat32},
                                                    {"float16", DType::kFloat16},
                                                    {"bfloat16", DType::kBFloat16}};
    for (const auto& [name, dtype] : dtypes) {
      for (const char* layout : {"NHWC", "NCHW"}) {
        JobConfig c =
            ParseGoodJob(std::string(kMinimalJob) + "output: {dtype: " + name + ", layout: " + layout + "}\n");
        CHECK(c.output.dtype == dtype);
        CHECK(c.output.layout == (std::string(layout) == "NCHW" ? Layout::kNCHW : Layout::kNHWC));
      }
    }
  }
  SECTION("bad values") {
    std::vector<ConfigError> errors = ParseBadJob(std::string(kMinimalJob) +
                                                  "output:\n  dtype: float64\n  layout: NCWH\n  device: cuda:x\n"
                                                  "  copy: host\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 4);
    CHECK(ErrorAt(errors, "output.dtype").message ==
          "must be one of uint8 | float32 | float16 | bfloat16 (got 'float64')");
    CHECK(ErrorAt(errors, "output.dtype").line == 6);
    CHECK(Contains(ErrorAt(errors, "output.layout").message, "must be one of NHWC | NCHW (got 'NCWH')"));
    CHECK(ErrorAt(errors, "output.device").message == "device must be cpu or cuda:N (got 'cuda:x')");
    CHECK(ErrorAt(errors, "output.device").line == 8);
    CHECK(Contains(ErrorAt(errors, "output.copy").message, "must be one of daemon | client (got 'host')"));
    CHECK(ErrorAt(errors, "output.copy").line == 9);
    errors = ParseBadJob(std::string(kMinimalJob) + "output: {device: gpu}\n");
    CHECK(ErrorAt(errors, "output.device").message == "device must be cpu or cuda:N (got 'gpu')");
    errors = ParseBadJob(std::string(kMinimalJob) + "output:\n  copy: client\n");
    REQUIRE(errors.size() == 1);
    CHECK(ErrorAt(errors, "output.copy").message ==
          "copy: client needs a cuda device (output.device: cuda:N), not cpu");
    CHECK(ErrorAt(errors, "output.copy").line == 6);
  }
  SECTION("cuda devices and who copies") {
    JobConfig c = ParseGoodJob(std::string(kMinimalJob) + "output: {device: cuda:1}\n");
    CHECK(c.output.device == "cuda:1");
    CHECK(c.output.cuda_device == 1);
    CHECK(c.output.copy == OutputConfig::Copy::kDaemon);
    c = ParseGoodJob(std::string(kMinimalJob) + "output: {device: cuda, copy: client}\n");
    CHECK(c.output.device == "cuda:0");
    CHECK(c.output.cuda_device == 0);
    CHECK(c.output.copy == OutputConfig::Copy::kClient);
    c = ParseGoodJob(kMinimalJob);
    CHECK(c.output.cuda_device == -1);
  }
  SECTION("decode.device: cuda needs a cuda delivery by the daemon and the GPU path's transforms") {
    JobConfig c = ParseGoodJob(std::string(kMinimalJob) + "decode: {device: cuda}\noutput: {device: cuda:0}\n");
    CHECK(c.decode.device == DecodeDevice::kCuda);
    CHECK(ParseGoodJob(kMinimalJob).decode.device == DecodeDevice::kCpu);
    auto errors = ParseBadJob(std::string(kMinimalJob) + "decode: {device: cuda}\n");
    REQUIRE(errors.size() == 1);
    CHECK(Contains(ErrorAt(errors, "decode.device").message, "needs output.device: cuda:N (this job delivers to cpu)"));
    CHECK(ErrorAt(errors, "decode.device").line == 5);
    errors = ParseBadJob(std::string(kMinimalJob) + "decode: {device: cuda}\noutput: {device: cuda:0, copy: client}\n");
    REQUIRE(errors.size() == 1);
    CHECK(Contains(ErrorAt(errors, "decode.device").message, "needs output.copy: daemon"));
    errors = ParseBadJob(std::string(kMinimalJob) +
                         "decode: {device: cuda, resample: fast, color: gray, exif_orientation: true}\n"
                         "output: {device: cuda:0}\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 3);
    errors = ParseBadJob(R"(source: {root: /data/x, extensions: [.png]}
transforms: [{resize: {height: 32, width: 32}}, {trivial_augment_wide: {}}]
decode: {device: cuda}
output: {device: cuda:0}
)");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 2);
    CHECK(Contains(errors[0].message + errors[1].message, "resize, center_crop, random_resized_crop"));
    CHECK(Contains(errors[0].message + errors[1].message, "source.extensions lists no .jpg"));
    errors = ParseBadJob(std::string(kMinimalJob) + "decode: {device: gpu}\n");
    CHECK(Contains(ErrorAt(errors, "decode.device").message, "must be one of cpu | cuda (got 'gpu')"));
  }
}

TEST_CASE("job config: random transforms, normalize and the decode section") {
  JobConfig c = ParseGoodJob(R"(
source: {root: /d, extensions: [.jpg, .png, .webp]}
decode:
  exif_orientation: true
  alpha: composite
  background: [0, 128, 255]
  max_pixels: 1000000
transforms:
  - random_resized_crop: {size: [160, 192], scale: [0.25, 1], ratio: [0.5, 2.0], interpolation: bicubic}
  - horizontal_flip: {p: 0.25}
  - normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
output: {dtype: bfloat16, layout: NCHW}
)");
  CHECK(c.decode.exif_orientation);
  CHECK(c.decode.alpha == AlphaMode::kComposite);
  CHECK(c.decode.background == std::array<int, 3>{0, 128, 255});
  CHECK(c.decode.max_pixels == 1000000);
  REQUIRE(c.transforms.size() == 3);
  const auto& rc = std::get<RandomResizedCropOp>(c.transforms[0]);
  CHECK(rc == RandomResizedCropOp{160, 192, 0.25, 1.0, 0.5, 2.0, Interpolation::kBicubic});
  CHECK(std::get<HorizontalFlipOp>(c.transforms[1]).p == 0.25);
  const auto& n = std::get<NormalizeOp>(c.transforms[2]);
  CHECK(n.mean == std::array<double, 3>{0.485, 0.456, 0.406});
  CHECK(n.stddev == std::array<double, 3>{0.229, 0.224, 0.225});
  CHECK(c.out_height == 160);
  CHECK(c.out_width == 192);

  SECTION("defaults: torchvision's") {
    JobConfig d =
        ParseGoodJob("source: {root: /d}\ntransforms:\n  - random_resized_crop: {size: 224}\n  - horizontal_flip:\n");
    CHECK(std::get<RandomResizedCropOp>(d.transforms[0]) ==
          RandomResizedCropOp{224, 224, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, Interpolation::kBilinear});
    CHECK(std::get<HorizontalFlipOp>(d.transforms[1]).p == 0.5);
    CHECK(d.out_height == 224);
  }
  SECTION("flip and normalize may come in either order, after a resize and crop") {
    JobConfig d = ParseGoodJob(
        "source: {root: /d}\ntransforms:\n  - resize: {shorter: 256}\n  - center_crop: {size: 224}\n"
        "  - normalize: {mean: [0, 0, 0], std: [1, 1, 1]}\n  - horizontal_flip: {p: 1}\n"
        "output: {dtype: float16}\n");
    CHECK(d.transforms.size() == 4);
  }
}

TEST_CASE("job config: bad random transforms, normalize and decode settings") {
  auto bad = [](const std::string& rest) { return ParseBadJob("source: {root: /d}\n" + rest); };
  SECTION("ranges and values") {
    std::vector<ConfigError> errors =
        bad("transforms:\n"
            "  - random_resized_crop: {size: 224, scale: [0.5, 0.1], ratio: [0, 1], bogus: 1}\n"
            "  - horizontal_flip: {p: 1.5}\n"
            "  - normalize: {mean: [0.5, 0.5], std: [0.2, 0, 0.2]}\n"
            "output: {dtype: float32}\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 6);
    CHECK(ErrorAt(errors, "transforms.0.random_resized_crop.scale").message ==
          "scale must be [min, max] with 0 < min <= max <= 1 (got [0.5, 0.1])");
    CHECK(ErrorAt(errors, "transforms.0.random_resized_crop.ratio").message ==
          "ratio must be [min, max] with 0 < min <= max (got [0, 1])");
    CHECK(Contains(ErrorAt(errors, "transforms.0.random_resized_crop.bogus").message, "unknown key"));
    CHECK(ErrorAt(errors, "transforms.1.horizontal_flip.p").message == "must be a probability in [0, 1] (got 1.5)");
    CHECK(ErrorAt(errors, "transforms.2.normalize.mean").message ==
          "expected a list of 3 numbers, got a list of 2 item(s)");
    CHECK(ErrorAt(errors, "transforms.2.normalize.std").message == "every std must be > 0");
  }
  SECTION("missing keys, wrong types") {
    std::vector<ConfigError> errors =
        bad("transforms:\n"
            "  - random_resized_crop: {scale: [a, 1]}\n"
            "  - normalize: {mean: [0, 0, 0]}\n"
            "  - center_crop: {size: 8}\n");
    INFO(Dump(errors));
    CHECK(ErrorAt(errors, "transforms.0.random_resized_crop.size").message == "required key is missing");
    CHECK(ErrorAt(errors, "transforms.0.random_resized_crop.scale.0").message == "expected a number, got 'a'");
    CHECK(ErrorAt(errors, "transforms.1.normalize.std").message == "required key is missing");
  }
  SECTION("normalize needs a floating-point dtype") {
    std::vector<ConfigError> errors =
        bad("transforms:\n  - center_crop: {size: 8}\n  - normalize: {mean: [0, 0, 0], std: [1, 1, 1]}\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "transforms.1");
    CHECK(errors[0].line == 4);
    CHECK(errors[0].message ==
          "normalize needs a floating-point output.dtype (float32, float16 or bfloat16), not uint8");
  }
  SECTION("order: geometry first, random_resized_crop alone, each at most once") {
    std::vector<ConfigError> errors =
        bad("transforms:\n"
            "  - horizontal_flip: {}\n"
            "  - center_crop: {size: 8}\n"
            "  - random_resized_crop: {size: 8}\n"
            "  - horizontal_flip: {}\n"
            "output: {dtype: float32}\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 4);
    CHECK(ErrorAt(errors, "transforms.1").message ==
          "center_crop comes after horizontal_flip: resize, center_crop and random_resized_crop "
          "must come before horizontal_flip and normalize");
    CHECK(errors[1].path == "transforms.2");
    CHECK(Contains(errors[1].message, "random_resized_crop comes after horizontal_flip"));
    CHECK(errors[2].path == "transforms.2");
    CHECK(errors[2].message == "random_resized_crop replaces resize and center_crop: it cannot be combined with them");
    CHECK(ErrorAt(errors, "transforms.3").message == "only one horizontal_flip (the first is transforms.0)");
  }
  SECTION("decode") {
    std::vector<ConfigError> errors =
        bad("decode: {exif_orientation: 2, alpha: blend, background: [0, 256, 0], max_pixels: 0, x: 1}\n"
            "transforms: [{center_crop: {size: 8}}]\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 5);
    CHECK(Contains(ErrorAt(errors, "decode.exif_orientation").message, "expected true or false"));
    CHECK(Contains(ErrorAt(errors, "decode.alpha").message, "must be one of drop | composite"));
    CHECK(ErrorAt(errors, "decode.background.1").message == "must be at most 255 (got 256)");
    CHECK(ErrorAt(errors, "decode.max_pixels").message == "must be at least 1 (got 0)");
    CHECK(Contains(ErrorAt(errors, "decode.x").message, "unknown key"));
  }
  SECTION("decode.resample: exact | fast; hamming has no fast path") {
    std::vector<ConfigError> errors = bad("decode: {resample: quick}\ntransforms: [{center_crop: {size: 8}}]\n");
    REQUIRE(errors.size() == 1);
    CHECK(Contains(ErrorAt(errors, "decode.resample").message, "must be one of exact | fast"));
    errors = bad("decode: {resample: fast}\ntransforms: [{resize: {height: 8, width: 8, interpolation: hamming}}]\n");
    REQUIRE(errors.size() == 1);
    CHECK(ErrorAt(errors, "decode.resample").message == "hamming interpolation has no fast path: use resample: exact");
    errors = bad("decode: {resample: fast}\ntransforms: [{random_resized_crop: {size: 8, interpolation: hamming}}]\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "decode.resample");
  }
}

TEST_CASE("job config: decode.resample and every interpolation are read") {
  auto parse = [](const std::string& text) { return ParseGoodJob("source: {type: image_folder, root: /d}\n" + text); };
  CHECK(parse("transforms: [{center_crop: {size: 8}}]\n").decode.resample == Resample::kExact);
  CHECK(parse("decode: {resample: fast}\ntransforms: [{center_crop: {size: 8}}]\n").decode.resample == Resample::kFast);
  const std::vector<std::pair<std::string, Interpolation>> names = {
      {"bilinear", Interpolation::kBilinear}, {"bicubic", Interpolation::kBicubic},
      {"area", Interpolation::kArea},         {"box", Interpolation::kArea},
      {"nearest", Interpolation::kNearest},   {"hamming", Interpolation::kHamming},
      {"lanczos", Interpolation::kLanczos}};
  for (const auto& [name, value] : names) {
    const JobConfig c = parse("transforms: [{resize: {height: 8, width: 8, interpolation: " + name + "}}]\n");
    CHECK(std::get<ResizeOp>(c.transforms[0]).interpolation == value);
  }
  // Video frames go through swscale, which has no hamming.
  const std::vector<ConfigError> v =
      ParseBadJob("media: video\nsource: {root: /d}\nvideo: {height: 8, width: 8, interpolation: hamming}\n");
  REQUIRE(v.size() == 1);
  CHECK(Contains(v[0].message, "must be one of bilinear | bicubic | area | nearest | lanczos"));
}

TEST_CASE("job config: several errors at once, all with lines, sorted") {
  std::vector<ConfigError> errors = ParseBadJob(R"(source:
  type: image_folder
sampler:
  uneven: sometimes
batch:
  size: 100000
  drop_last: 3
transforms:
  - resize: {shorter: 256}
  - center_crop: {size: 300}
prefetch: 0
on_error: ignore
extra: 1
)");
  INFO(Dump(errors));
  REQUIRE(errors.size() == 8);
  const std::vector<std::pair<std::string, int>> expected = {{"source.root", 1},
                                                             {"sampler.uneven", 4},
                                                             {"batch.size", 6},
                                                             {"batch.drop_last", 7},
                                                             {"transforms.1.center_crop.size", 10},
                                                             {"prefetch", 11},
                                                             {"on_error", 12},
                                                             {"extra", 13}};
  for (size_t i = 0; i < expected.size(); ++i) {
    CHECK(errors[i].path == expected[i].first);
    CHECK(errors[i].line == expected[i].second);
    CHECK(errors[i].column > 0);
  }
}

TEST_CASE("job config: documents that are not a config") {
  SECTION("a YAML syntax error is one error with its line") {
    std::vector<ConfigError> errors = ParseBadJob("source:\n  root: [/d\nbatch: {size: 2}\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path.empty());
    CHECK(errors[0].line == 3);
    CHECK_FALSE(errors[0].message.empty());
    CHECK(FormatConfigErrors(errors, "job.yaml").rfind("job.yaml:3:", 0) == 0);
  }
  SECTION("a list instead of a map") {
    std::vector<ConfigError> errors = ParseBadJob("- a\n- b\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].message == "expected a map of settings, got a list");
    CHECK(errors[0].line == 1);
  }
  SECTION("an empty document: the required keys are missing") {
    std::vector<ConfigError> errors = ParseBadJob("");
    REQUIRE(errors.size() == 2);
    CHECK(errors[0].path == "source.root");
    CHECK(errors[0].line == 1);
    CHECK(errors[1].path == "transforms");
  }
  SECTION("two documents") {
    std::vector<ConfigError> errors = ParseBadJob(std::string(kMinimalJob) + "---\na: 1\n");
    REQUIRE(errors.size() == 1);
    CHECK(Contains(errors[0].message, "expected one YAML document"));
  }
  SECTION("a ',' at the top level (yaml-cpp's LoadAll never returns on it: found by config_fuzz)") {
    for (const char* text : {",", ",28KiYB", "a: 1\n---\n,\n"}) {
      std::vector<ConfigError> errors = ParseBadJob(text);
      REQUIRE(errors.size() >= 1);
      CHECK(Contains(errors[0].message, "unexpected ','"));
    }
  }
  SECTION("a duplicate key") {
    std::vector<ConfigError> errors = ParseBadJob(std::string(kMinimalJob) + "prefetch: 2\nprefetch: 3\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "prefetch");
    CHECK(errors[0].line == 6);
    CHECK(errors[0].message == "duplicate key (first at line 5)");
  }
}

// ---------------- job config: the engine (stages, order, max_failures, weight) ----------------

TEST_CASE("job config: engine keys take their defaults and their values") {
  JobConfig d = ParseGoodJob(kMinimalJob);
  CHECK(d.stages == StagesConfig{});
  CHECK(d.order == Order::kSampler);
  CHECK(d.max_failures == MaxFailures{-1, 0.5});  // a mostly failing job fails
  CHECK(d.max_failures_warmup == 100);
  CHECK(d.weight == 1);

  JobConfig c = ParseGoodJob(std::string(kMinimalJob) + R"(stages:
  read: {concurrency: 8}
  decode: {concurrency: 2, queue: 100}
order: completion
max_failures: 25
max_failures_warmup: 0
weight: 3
)");
  CHECK(c.stages.read == StageConfig{8, 0});
  CHECK(c.stages.decode == StageConfig{2, 100});
  CHECK(c.order == Order::kCompletion);
  CHECK(c.max_failures.count == 25);
  CHECK(c.max_failures.fraction < 0);
  CHECK(c.max_failures_warmup == 0);
  CHECK(c.weight == 3);

  JobConfig f = ParseGoodJob(std::string(kMinimalJob) + "max_failures: 0.01\n");
  CHECK(f.max_failures.count < 0);
  CHECK(f.max_failures.fraction == 0.01);
}

TEST_CASE("job config: every bad engine key is reported with its line") {
  auto errors = ParseBadJob(std::string(kMinimalJob) + R"(stages:
  read: {concurrency: 0, queue: 5}
  decode: {queue: big}
  resize: {concurrency: 2}
order: whenever
max_failures: 1.5
max_failures_warmup: -1
weight: 0
)");
  INFO(Dump(errors));
  CHECK(ErrorAt(errors, "stages.read.concurrency").line == 6);
  CHECK(Contains(ErrorAt(errors, "stages.read.queue").message, "set prefetch"));
  CHECK(ErrorAt(errors, "stages.decode.queue").line == 7);
  CHECK(ErrorAt(errors, "stages.resize").line == 8);
  CHECK(ErrorAt(errors, "order").line == 9);
  CHECK(Contains(ErrorAt(errors, "order").message, "sampler | completion"));
  CHECK(ErrorAt(errors, "max_failures").line == 10);
  CHECK(Contains(ErrorAt(errors, "max_failures").message, "a count"));
  CHECK(ErrorAt(errors, "max_failures_warmup").line == 11);
  CHECK(ErrorAt(errors, "weight").line == 12);
  CHECK(errors.size() == 8);

  errors = ParseBadJob(std::string(kMinimalJob) + "order: random\nmax_failures: -3\n");
  CHECK(ErrorAt(errors, "order").line == 5);
  CHECK(ErrorAt(errors, "max_failures").line == 6);
}

// ---------------- overrides ----------------

TEST_CASE("overrides: scalars, lists, maps and sequence indexes") {
  SECTION("a scalar replaces a value, and fills a required key") {
    JobConfig c = ParseGoodJob("transforms: [{center_crop: {size: 8}}]\nbatch: {size: 2}\n",
                               {{"source.root", "/mnt/data"}, {"batch.size", "128"}});
    CHECK(c.source.root == "/mnt/data");
    CHECK(c.batch.size == 128);
  }
  SECTION("a list value") {
    JobConfig c = ParseGoodJob(kMinimalJob, {{"source.extensions", "[.png, .WebP]"}});
    CHECK(c.source.extensions == std::vector<std::string>{".png", ".webp"});
  }
  SECTION("a sequence index reaches into the transforms") {
    JobConfig c =
        ParseGoodJob("source: {root: /d}\ntransforms:\n  - resize: {shorter: 256}\n  - center_crop: {size: 224}\n",
                     {{"transforms.0.resize.shorter", "300"}, {"transforms.1.center_crop.size", "[256, 128]"}});
    CHECK(std::get<ResizeOp>(c.transforms[0]).shorter == 300);
    CHECK(c.out_height == 256);
    CHECK(c.out_width == 128);
  }
  SECTION("a whole map, and a key inside an empty document") {
    JobConfig c = ParseGoodJob("", {{"source", "{root: /x}"}, {"transforms", "[{resize: {height: 2, width: 3}}]"}});
    CHECK(c.source.root == "/x");
    CHECK(c.out_width == 3);
  }
  SECTION("later overrides win") {
    JobConfig c = ParseGoodJob(kMinimalJob, {{"prefetch", "2"}, {"prefetch", "9"}});
    CHECK(c.prefetch == 9);
  }
}

TEST_CASE("overrides: errors") {
  SECTION("a bad value is reported as --set with no line") {
    std::vector<ConfigError> errors = ParseBadJob(kMinimalJob, {{"batch.size", "0"}});
    REQUIRE(errors.size() == 1);
    CHECK(errors[0] == ConfigError{0, 0, "--set batch.size", "must be at least 1 (got 0)"});
    CHECK(FormatConfigErrors(errors, "imagenet.yaml") == "imagenet.yaml: --set batch.size: must be at least 1 (got 0)");
  }
  SECTION("an unknown key set by an override") {
    std::vector<ConfigError> errors = ParseBadJob(kMinimalJob, {{"batch.sise", "3"}});
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "--set batch.sise");
    CHECK(errors[0].line == 0);
    CHECK(Contains(errors[0].message, "did you mean 'size'?"));
  }
  SECTION("errors inside a map set by an override") {
    std::vector<ConfigError> errors = ParseBadJob(kMinimalJob, {{"batch", "{size: -1}"}});
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "--set batch.size");
  }
  SECTION("indexing a scalar") {
    std::vector<ConfigError> errors = ParseBadJob(kMinimalJob, {{"source.root.x", "1"}});
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "--set source.root.x");
    CHECK(errors[0].line == 0);
    CHECK(Contains(errors[0].message, "'source.root' is a single value"));
  }
  SECTION("an index out of range, and a key into a list") {
    std::vector<ConfigError> errors =
        ParseBadJob(kMinimalJob, {{"transforms.5.resize", "{shorter: 1}"}, {"transforms.first", "1"}});
    REQUIRE(errors.size() == 2);
    CHECK(errors[0].path == "--set transforms.5.resize");
    CHECK(Contains(errors[0].message, "index 5 is out of range: 'transforms' has 1 item(s)"));
    CHECK(errors[1].path == "--set transforms.first");
    CHECK(Contains(errors[1].message, "is a list"));
  }
  SECTION("a value that is not YAML") {
    std::vector<ConfigError> errors = ParseBadJob(kMinimalJob, {{"source.extensions", "[.jpg"}});
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].path == "--set source.extensions");
    CHECK(Contains(errors[0].message, "is not valid YAML"));
  }
  SECTION("file errors keep their lines beside override errors") {
    std::vector<ConfigError> errors = ParseBadJob(std::string(kMinimalJob) + "prefetch: 100\n", {{"batch.size", "x"}});
    REQUIRE(errors.size() == 2);
    CHECK(errors[0] == ConfigError{5, 11, "prefetch", "must be at most 64 (got 100)"});
    CHECK(errors[1].path == "--set batch.size");
  }
}

TEST_CASE("ParseOverride") {
  Result<Override> o = ParseOverride("source.root=/data/x=y");
  REQUIRE(o.ok());
  CHECK(o->path == "source.root");
  CHECK(o->value == "/data/x=y");
  o = ParseOverride("transforms.0.resize.shorter=256");
  REQUIRE(o.ok());
  CHECK(*o == Override{"transforms.0.resize.shorter", "256"});
  o = ParseOverride("source.root=");
  REQUIRE(o.ok());
  CHECK(o->value.empty());
  for (const char* bad : {"source.root", "=3", " =3", "a..b=1", ".a=1", "a.=1", ""}) {
    INFO(bad);
    Result<Override> r = ParseOverride(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
}

// ---------------- byte sizes ----------------

TEST_CASE("ParseByteSize") {
  struct Case {
    const char* text;
    uint64_t bytes;
  };
  for (const Case& c : {Case{"1048576", 1048576}, Case{"0", 0}, Case{"12B", 12}, Case{"4GiB", 4ull << 30},
                        Case{"512MiB", 512ull << 20}, Case{"1G", 1ull << 30}, Case{"8Ki", 8192}, Case{"3 KiB", 3072},
                        Case{"2T", 2ull << 40}, Case{"16777215TiB", 16777215ull << 40}}) {
    INFO(c.text);
    Result<uint64_t> r = ParseByteSize(c.text);
    REQUIRE(r.ok());
    CHECK(*r == c.bytes);
  }
  for (const char* bad : {"", "GiB", "-1", "1.5GiB", "4GB", "4 gigs", "4gib", "16777216TiB", "99999999999999999999"}) {
    INFO(bad);
    Result<uint64_t> r = ParseByteSize(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kInvalidArgument);
  }
  CHECK(Contains(ParseByteSize("4GB").status().message(), "ambiguous"));
}

// ---------------- daemon config ----------------

TEST_CASE("daemon config: defaults and every field") {
  DaemonConfigResult r = ParseDaemonConfig("");
  REQUIRE(r.errors.empty());
  CHECK(*r.config == DaemonConfig{});
  CHECK(r.config->socket_mode == 0660);
  CHECK(r.config->memory_budget_bytes == (4ull << 30));

  r = ParseDaemonConfig(R"(
socket_path: /tmp/s.sock
socket_mode: "0600"
worker_threads: 12
io_threads: 4
memory_budget_bytes: 512MiB
device_memory_budget_bytes: 2GiB
gpu_context_bytes: 300MiB
exit_on_gpu_poison: false
allowed_roots: [/data, /mnt/x/]
log_level: debug
max_frame_bytes: 65536
max_jobs_per_client: 2
max_slots_per_job: 16
allowed_url_prefixes: [http://127.0.0.1:8000/data, https://cdn.example.com]
)");
  INFO(Dump(r.errors));
  REQUIRE(r.errors.empty());
  const DaemonConfig& c = *r.config;
  CHECK(c.socket_path == "/tmp/s.sock");
  CHECK(c.socket_mode == 0600);
  CHECK(c.worker_threads == 12);
  CHECK(c.io_threads == 4);
  CHECK(c.memory_budget_bytes == (512ull << 20));
  CHECK(c.device_memory_budget_bytes == (2ull << 30));
  CHECK(c.gpu_context_bytes == (300ull << 20));
  CHECK_FALSE(c.exit_on_gpu_poison);
  CHECK(DaemonConfig{}.gpu_context_bytes == (500ull << 20));
  CHECK(DaemonConfig{}.exit_on_gpu_poison);
  CHECK(c.allowed_roots == std::vector<std::string>{"/data", "/mnt/x/"});
  CHECK(c.log_level == "debug");
  CHECK(c.max_frame_bytes == 65536);
  CHECK(c.max_jobs_per_client == 2);
  CHECK(c.max_slots_per_job == 16);
  CHECK(c.allowed_url_prefixes == std::vector<std::string>{"http://127.0.0.1:8000/data", "https://cdn.example.com"});
}

TEST_CASE("daemon config: the shared-node limits take their defaults, values and ranges") {
  DaemonConfig d = *ParseDaemonConfig("").config;
  CHECK(d.max_connections == 1024);
  CHECK(d.max_connections_per_uid == 128);
  CHECK(d.hello_timeout_seconds == 10);
  CHECK(d.frame_timeout_seconds == 10);
  CHECK(d.max_reply_backlog_bytes == (4u << 20));
  CHECK(d.backlog_timeout_seconds == 10);
  CHECK(d.max_budget_share_per_uid == 0.5);
  DaemonConfigResult r = ParseDaemonConfig(
      "max_connections: 64\nmax_connections_per_uid: 4\nhello_timeout_seconds: 2\nframe_timeout_seconds: 3\n"
      "max_reply_backlog_bytes: 1MiB\nbacklog_timeout_seconds: 5\nmax_budget_share_per_uid: 0.25\n");
  REQUIRE(r.config);
  CHECK(r.config->max_connections == 64);
  CHECK(r.config->max_connections_per_uid == 4);
  CHECK(r.config->hello_timeout_seconds == 2);
  CHECK(r.config->frame_timeout_seconds == 3);
  CHECK(r.config->max_reply_backlog_bytes == (1u << 20));
  CHECK(r.config->backlog_timeout_seconds == 5);
  CHECK(r.config->max_budget_share_per_uid == 0.25);
  DaemonConfigResult bad = ParseDaemonConfig(
      "max_connections: 2\nmax_connections_per_uid: 0\nhello_timeout_seconds: 0\nmax_reply_backlog_bytes: 1KiB\n"
      "max_budget_share_per_uid: 1.5\n");
  CHECK_FALSE(bad.config);
  CHECK(bad.errors.size() == 5);
}

TEST_CASE("job config: size and nesting are limited before any YAML is parsed") {
  CHECK(CheckJobConfigShape(kMinimalJob, {}).empty());
  std::string big = std::string(kMinimalJob) + "# " + std::string(kMaxJobConfigBytes, 'x') + "\n";
  JobConfigResult r = ParseJobConfig(big);
  REQUIRE_FALSE(r.config);
  CHECK_THAT(r.errors[0].message, Catch::Contains("bytes, more than the 65536"));
  std::string deep_flow = "source: " + std::string(100, '[') + std::string(100, ']') + "\n";
  r = ParseJobConfig(deep_flow);
  REQUIRE_FALSE(r.config);
  CHECK_THAT(r.errors[0].message, Catch::Contains("nests 101 levels deep"));
  std::string deep_block;
  for (int i = 0; i < 40; ++i) deep_block += std::string(static_cast<size_t>(i), ' ') + "k" + std::to_string(i) + ":\n";
  r = ParseJobConfig(deep_block);
  REQUIRE_FALSE(r.config);
  CHECK_THAT(r.errors[0].message, Catch::Contains("levels deep"));
  // An override counts too.
  r = ParseJobConfig(kMinimalJob, {{"transforms", std::string(64, '[') + std::string(64, ']')}});
  REQUIRE_FALSE(r.config);
  CHECK_THAT(r.errors[0].message, Catch::Contains("levels deep"));
  // Brackets inside quotes or comments do not count.
  CHECK(CheckJobConfigShape(std::string(kMinimalJob) + "# " + std::string(100, '[') + "\n", {}).empty());
}

TEST_CASE("daemon config: allowed_url_prefixes") {
  CHECK(ParseDaemonConfig("socket_mode: 0660\n").config->allowed_url_prefixes.empty());  // default: no URL
  DaemonConfigResult r = ParseDaemonConfig("allowed_url_prefixes:\n  - http://ok/\n  - ftp://x/\n  - http:///nohost\n");
  INFO(Dump(r.errors));
  REQUIRE(r.errors.size() == 2);
  CHECK(r.errors[0].path == "allowed_url_prefixes.1");
  CHECK(r.errors[0].line == 3);
  CHECK(r.errors[1].path == "allowed_url_prefixes.2");
}

TEST_CASE("daemon config: the shard cache's cache_dir and cache_dir_bytes") {
  const DaemonConfig d = *ParseDaemonConfig("").config;
  CHECK(d.cache_dir.empty());
  CHECK(d.cache_dir_bytes == uint64_t{10} << 30);
  DaemonConfigResult r = ParseDaemonConfig("cache_dir: /var/cache/spdld\ncache_dir_bytes: 2GiB\n");
  INFO(Dump(r.errors));
  REQUIRE(r.config.has_value());
  CHECK(r.config->cache_dir == "/var/cache/spdld");
  CHECK(r.config->cache_dir_bytes == uint64_t{2} << 30);
  for (const char* bad : {"cache_dir: relative/dir\n", "cache_dir: /a/../b\n", "cache_dir_bytes: lots\n"}) {
    CAPTURE(bad);
    DaemonConfigResult e = ParseDaemonConfig(bad);
    REQUIRE(e.errors.size() == 1);
    CHECK(e.errors[0].path.rfind("cache_dir", 0) == 0);
  }
}

TEST_CASE("daemon config: socket_mode forms") {
  auto mode = [](const std::string& v) {
    DaemonConfigResult r = ParseDaemonConfig("socket_mode: " + v + "\n");
    INFO(Dump(r.errors));
    REQUIRE(r.config.has_value());
    return r.config->socket_mode;
  };
  CHECK(mode("0660") == 0660);  // plain, leading zero: octal
  CHECK(mode("\"0640\"") == 0640);
  CHECK(mode("0o600") == 0600);
  CHECK(mode("432") == 0660);  // decimal
  CHECK(mode("0") == 0);
  for (const char* bad : {"0888", "01000", "rw-rw----", "-1", "[1]"}) {
    INFO(bad);
    DaemonConfigResult r = ParseDaemonConfig(std::string("socket_mode: ") + bad + "\n");
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].path == "socket_mode");
  }
}

TEST_CASE("daemon config: every error at once, with lines") {
  DaemonConfigResult r = ParseDaemonConfig(R"(socket_path: relative.sock
worker_threads: -1
memory_budget_bytes: 4GB
allowed_roots:
  - /data
  - data
  - /data/../etc
log_level: verbose
max_frame_bytes: 1GiB
max_jobs_per_client: 0
max_slots: 3
)");
  INFO(Dump(r.errors));
  REQUIRE_FALSE(r.config.has_value());
  REQUIRE(r.errors.size() == 9);
  CHECK(r.errors[0] == ConfigError{1, 14, "socket_path", "must be an absolute path (got 'relative.sock')"});
  CHECK(r.errors[1].path == "worker_threads");
  CHECK(r.errors[2].path == "memory_budget_bytes");
  CHECK(Contains(r.errors[2].message, "ambiguous"));
  CHECK(r.errors[3].path == "allowed_roots.1");
  CHECK(r.errors[3].line == 6);
  CHECK(r.errors[4].path == "allowed_roots.2");
  CHECK(r.errors[5].path == "log_level");
  CHECK(r.errors[5].message == "must be one of trace | debug | info | warn | error | critical | off (got 'verbose')");
  CHECK(r.errors[6].message == "must be at most 64MiB (got 1GiB)");
  CHECK(r.errors[7].path == "max_jobs_per_client");
  CHECK(r.errors[8].message == "unknown key 'max_slots' (did you mean 'max_slots_per_job'?)");
}

TEST_CASE("daemon config: long socket path, small budget, overrides") {
  DaemonConfigResult r = ParseDaemonConfig("socket_path: /" + std::string(120, 's') + "\nmemory_budget_bytes: 1024\n");
  REQUIRE(r.errors.size() == 2);
  CHECK(Contains(r.errors[0].message, "limit of a Unix socket address"));
  CHECK(r.errors[1].message == "must be at least 1MiB (got 1KiB)");

  r = ParseDaemonConfig("log_level: info\n", {{"log_level", "trace"}, {"allowed_roots", "[/a]"}});
  REQUIRE(r.errors.empty());
  CHECK(r.config->log_level == "trace");
  CHECK(r.config->allowed_roots == std::vector<std::string>{"/a"});
}

TEST_CASE("daemon config: loading a file") {
  DaemonConfigResult r = LoadDaemonConfig("/nonexistent/spdld.yaml");
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].line == 0);
  CHECK(Contains(r.errors[0].message, "cannot read config file '/nonexistent/spdld.yaml'"));
  CHECK(Contains(r.errors[0].message, "No such file"));

  r = LoadDaemonConfig(std::string(SPDL_SOURCE_DIR) + "/config");  // a directory
  CHECK(r.errors.size() == 1);
}

// ---------------- formatting ----------------

TEST_CASE("FormatConfigErrors") {
  std::vector<ConfigError> errors = {
      {12, 5, "batch.size", "must be at least 1"},      {3, 0, "prefetch", "no column"},
      {0, 0, "--set batch.size", "must be at least 1"}, {7, 2, "", "mapping values are not allowed here"},
      {0, 0, "", "cannot read config file 'x'"},
  };
  CHECK(FormatConfigErrors(errors, "imagenet.yaml") ==
        "imagenet.yaml:12:5: batch.size: must be at least 1\n"
        "imagenet.yaml:3: prefetch: no column\n"
        "imagenet.yaml: --set batch.size: must be at least 1\n"
        "imagenet.yaml:7:2: mapping values are not allowed here\n"
        "imagenet.yaml: cannot read config file 'x'");
  CHECK(FormatConfigErrors({}, "x.yaml").empty());
}

// ---------------- job config: media kinds ----------------

TEST_CASE("job config: media audio and video take their blocks and defaults") {
  SECTION("audio") {
    JobConfig c = ParseGoodJob(R"(media: audio
source: {root: /data/speech}
audio: {length: 8000}
)");
    CHECK(c.media == Media::kAudio);
    CHECK(c.audio.sample_rate == 16000);
    CHECK(c.audio.channels == 1);
    CHECK(c.audio.length == 8000);
    CHECK(c.audio.crop == AudioCrop::kStart);
    CHECK(c.audio.dtype == AudioDType::kFloat32);
    CHECK(c.transforms.empty());
    CHECK(c.out_height == 0);
    CHECK(c.source.extensions == std::vector<std::string>{".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a"});
    JobConfig s = ParseGoodJob(R"(media: audio
source: {type: tar, shards: /data/a.tar}
audio: {sample_rate: 22050, channels: 2, seconds: 0.5, crop: random, dtype: int16, max_seconds: 60}
)");
    CHECK(s.audio.length == 11025);
    CHECK(s.audio.channels == 2);
    CHECK(s.audio.crop == AudioCrop::kRandom);
    CHECK(s.audio.dtype == AudioDType::kInt16);
    CHECK(s.audio.max_seconds == 60);
    CHECK(s.source.extensions.front() == ".wav");
  }
  SECTION("video") {
    JobConfig c = ParseGoodJob(R"(media: video
source: {root: /data/clips}
video: {height: 64, width: 48}
)");
    CHECK(c.media == Media::kVideo);
    CHECK(c.video.frames == 8);
    CHECK(c.video.stride == 1);
    CHECK(c.video.fps == 0);
    CHECK_FALSE(c.video.random_start);
    CHECK(c.video.height == 64);
    CHECK(c.video.width == 48);
    CHECK(c.source.extensions == std::vector<std::string>{".mp4", ".webm", ".mkv", ".mov", ".avi"});
    JobConfig f = ParseGoodJob(R"(media: video
source: {root: /data/clips, extensions: [.MP4]}
video: {frames: 16, fps: 12.5, start: random, height: 32, width: 32, interpolation: area}
)");
    CHECK(f.video.frames == 16);
    CHECK(f.video.fps == 12.5);
    CHECK(f.video.random_start);
    CHECK(f.video.interpolation == Interpolation::kArea);
    CHECK(f.source.extensions == std::vector<std::string>{".mp4"});
    CHECK(ParseGoodJob("media: video\nsource: {root: /d}\nvideo: {start: 1.5, stride: 3, height: 8, width: 8}\n")
              .video.start_seconds == 1.5);
  }
  SECTION("image stays the default, and media: image is the same job") {
    CHECK(ParseGoodJob(kMinimalJob).media == Media::kImage);
    CHECK(ParseGoodJob(std::string("media: image\n") + kMinimalJob) == ParseGoodJob(kMinimalJob));
  }
}

TEST_CASE("job config: every media error with its line") {
  SECTION("bad audio values") {
    std::vector<ConfigError> errors = ParseBadJob(R"(media: audio
source: {root: /d}
audio:
  sample_rate: 0
  channels: 3
  length: 100
  seconds: 1
  crop: middle
  dtype: float64
  max_seconds: -1
  hop: 3
)");
    INFO(Dump(errors));
    CHECK(errors.size() == 7);
    CHECK(ErrorAt(errors, "audio.sample_rate").line == 4);
    CHECK(ErrorAt(errors, "audio.channels").line == 5);
    CHECK(ErrorAt(errors, "audio.seconds").line == 7);
    CHECK(Contains(ErrorAt(errors, "audio.seconds").message, "either 'length' (samples) or 'seconds'"));
    CHECK(ErrorAt(errors, "audio.crop").line == 8);
    CHECK(ErrorAt(errors, "audio.dtype").line == 9);
    CHECK(ErrorAt(errors, "audio.max_seconds").line == 10);
    CHECK(ErrorAt(errors, "audio.hop").line == 11);
  }
  SECTION("audio without a length, or without a block") {
    std::vector<ConfigError> errors = ParseBadJob("media: audio\nsource: {root: /d}\naudio: {channels: 2}\n");
    INFO(Dump(errors));
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 3);
    CHECK(Contains(errors[0].message, "audio needs 'length'"));
    errors = ParseBadJob("source: {root: /d}\nmedia: audio\n");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].line == 2);
    CHECK(Contains(errors[0].message, "needs an audio block"));
    errors = ParseBadJob("media: audio\nsource: {root: /d}\naudio: {seconds: 0}\n");
    CHECK(ErrorAt(errors, "audio.seconds").line == 3);
  }
  SECTION("bad video values") {
    std::vector<ConfigError> errors = ParseBadJob(R"(media: video
source: {root: /d}
video:
  frames: 0
  stride: 2
  fps: 10
  start: later
  height: 0
)");
    INFO(Dump(errors));
    CHECK(errors.size() == 5);
    CHECK(ErrorAt(errors, "video.frames").line == 4);
    CHECK(ErrorAt(errors, "video.fps").line == 6);
    CHECK(ErrorAt(errors, "video.start").line == 7);
    CHECK(Contains(ErrorAt(errors, "video.start").message, "or 'random'"));
    CHECK(ErrorAt(errors, "video.height").line == 8);
    CHECK(ErrorAt(errors, "video.width").message == "required key is missing");
    errors = ParseBadJob("media: video\nsource: {root: /d}\nvideo: {fps: 0, start: -1, height: 8, width: 8}\n");
    CHECK(ErrorAt(errors, "video.fps").line == 3);
    CHECK(ErrorAt(errors, "video.start").line == 3);
  }
  SECTION("image keys in an audio or video job, and blocks of another media") {
    std::vector<ConfigError> errors = ParseBadJob(R"(media: video
source: {root: /d}
video: {height: 8, width: 8}
audio: {length: 10}
transforms: [{center_crop: {size: 8}}]
decode: {exif_orientation: true}
output: {dtype: float32, layout: NCHW}
)");
    INFO(Dump(errors));
    CHECK(errors.size() == 5);
    CHECK(ErrorAt(errors, "audio").line == 4);
    CHECK(Contains(ErrorAt(errors, "audio").message, "this job's media is video"));
    CHECK(ErrorAt(errors, "transforms").line == 5);
    CHECK(ErrorAt(errors, "decode").line == 6);
    CHECK(ErrorAt(errors, "output.dtype").line == 7);
    CHECK(ErrorAt(errors, "output.layout").line == 7);
    errors = ParseBadJob(std::string(kMinimalJob) + "video: {height: 8, width: 8}\nmedia: film\n");
    CHECK(ErrorAt(errors, "video").line == 5);
    CHECK(ErrorAt(errors, "media").line == 6);
  }
}

// ---------------- the shipped configs ----------------

TEST_CASE("every config shipped under config/ parses with no error") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(SPDL_SOURCE_DIR) / "config";
  auto yaml_files = [](const fs::path& d) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(d)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".yaml" || ext == ".yml")) files.push_back(e.path());
    }
    return files;
  };

  const std::vector<fs::path> daemon_files = yaml_files(dir);
  CHECK(std::find(daemon_files.begin(), daemon_files.end(), dir / "spdld.yaml") != daemon_files.end());
  for (const fs::path& p : daemon_files) {
    DaemonConfigResult r = LoadDaemonConfig(p.string());
    INFO(FormatConfigErrors(r.errors, p.string()));
    CHECK(r.errors.empty());
  }

  const std::vector<fs::path> job_files = yaml_files(dir / "examples");
  CHECK_FALSE(job_files.empty());
  for (const fs::path& p : job_files) {
    JobConfigResult r = ParseJobConfig(ReadFile(p));
    INFO(FormatConfigErrors(r.errors, p.string()));
    CHECK(r.errors.empty());
  }
}

TEST_CASE("metrics_bind: loopback by default, an address literal, anything else refused with its line") {
  DaemonConfigResult d = ParseDaemonConfig("metrics_port: 9464\n");
  REQUIRE(d.config.has_value());
  CHECK(d.config->metrics_bind == "127.0.0.1");
  d = ParseDaemonConfig("metrics_bind: 0.0.0.0\n");
  REQUIRE(d.config.has_value());
  CHECK(d.config->metrics_bind == "0.0.0.0");
  d = ParseDaemonConfig("metrics_bind: \"::1\"\n");
  REQUIRE(d.config.has_value());
  CHECK(d.config->metrics_bind == "::1");
  d = ParseDaemonConfig("metrics_port: 9464\nmetrics_bind: my-host\n");
  CHECK_FALSE(d.config.has_value());
  REQUIRE(d.errors.size() == 1);
  CHECK(d.errors[0].line == 2);
  CHECK(Contains(d.errors[0].message, "must be an IPv4 or IPv6 address"));
}

TEST_CASE("the Kubernetes ConfigMap's daemon config loads and serves metrics on the pod IP") {
  DaemonConfigResult d = LoadDaemonConfig(std::string(SPDL_SOURCE_DIR) + "/deploy/kubernetes/base/spdld.yaml");
  INFO(FormatConfigErrors(d.errors, "deploy/kubernetes/base/spdld.yaml"));
  REQUIRE(d.config.has_value());
  CHECK(d.config->metrics_bind == "0.0.0.0");
  CHECK(d.config->metrics_port == 9464);
  CHECK(d.config->socket_path == "/run/spdld/spdld.sock");
}

TEST_CASE("the shipped configs say what the docs say") {
  const std::string dir = std::string(SPDL_SOURCE_DIR) + "/config";
  DaemonConfigResult d = LoadDaemonConfig(dir + "/spdld.yaml");
  REQUIRE(d.config.has_value());
  CHECK(d.config->socket_path == "/run/spdld/spdld.sock");
  CHECK(d.config->allowed_roots == std::vector<std::string>{"/var/lib/spdld", "/data"});
  CHECK(d.config->memory_budget_bytes == (4ull << 30));
  CHECK(d.config->max_connections_per_uid == 128);
  CHECK(d.config->max_budget_share_per_uid == 0.5);
  CHECK(d.config->cache_dir == "/var/cache/spdld/shards");  // systemd/spdld.service.in: CacheDirectory=spdld

  JobConfig j = ParseGoodJob(ReadFile(dir + "/examples/imagenet.yaml"));
  CHECK(j.source.root == "/var/lib/spdld/sample");
  CHECK(j.sampler.seed == 42);
  CHECK(j.out_height == 224);
  CHECK(j.out_width == 224);
  CHECK(j.transforms.size() == 2);
  JobConfig train = ParseGoodJob(ReadFile(dir + "/examples/imagenet_train.yaml"));
  REQUIRE(train.transforms.size() == 3);
  CHECK(std::get<RandomResizedCropOp>(train.transforms[0]).height == 224);
  CHECK(std::get<HorizontalFlipOp>(train.transforms[1]).p == 0.5);
  CHECK(std::get<NormalizeOp>(train.transforms[2]).mean == std::array<double, 3>{0.485, 0.456, 0.406});
  CHECK(train.output.dtype == DType::kBFloat16);
  CHECK(train.output.layout == Layout::kNCHW);
  CHECK(train.decode.exif_orientation);
  JobConfig mixed = ParseGoodJob(ReadFile(dir + "/examples/mixed_formats_eval.yaml"));
  CHECK(mixed.source.extensions.size() == 8);
  CHECK(mixed.output.dtype == DType::kFloat32);
  CHECK(mixed.decode.alpha == AlphaMode::kComposite);
  JobConfig moved = ParseGoodJob(ReadFile(dir + "/examples/imagenet.yaml"), {{"source.root", "/data/imagenet"}});
  CHECK(moved.source.root == "/data/imagenet");
  CHECK(d.config->allowed_url_prefixes.empty());
  JobConfig list = ParseGoodJob(ReadFile(dir + "/examples/file_list.yaml"));
  CHECK(list.source.type == SourceType::kFileList);
  JobConfig tar = ParseGoodJob(ReadFile(dir + "/examples/tar_shards.yaml"));
  CHECK(tar.source.type == SourceType::kTar);
  CHECK(tar.source.shards == std::vector<std::string>{"/data/imagenet/train-{000000..000127}.tar"});
  CHECK(tar.source.shuffle_buffer == 1000);
  JobConfig http = ParseGoodJob(ReadFile(dir + "/examples/http.yaml"));
  CHECK(http.source.type == SourceType::kHttp);
  CHECK(http.source.base_url == "http://data.local:8000/train");
  JobConfig audio = ParseGoodJob(ReadFile(dir + "/examples/audio.yaml"), {{"source.root", "/data/a"}});
  CHECK(audio.media == Media::kAudio);
  CHECK(audio.source.root == "/data/a");
  CHECK(audio.audio.length == 16000);
  CHECK(audio.audio.crop == AudioCrop::kRandom);
  JobConfig video = ParseGoodJob(ReadFile(dir + "/examples/video.yaml"));
  CHECK(video.media == Media::kVideo);
  CHECK(video.video.frames == 8);
  CHECK(video.video.stride == 2);
  CHECK(video.video.random_start);
  CHECK(video.video.height == 112);
}

TEST_CASE("job config: decode.color gray, one normalize value, and their errors") {
  JobConfig rgb = ParseGoodJob(kMinimalJob);
  CHECK(rgb.decode.color == ColorMode::kRgb);
  JobConfig gray = ParseGoodJob(
      "source: {root: /d}\ndecode: {color: gray}\noutput: {dtype: float32}\n"
      "transforms:\n  - center_crop: {size: 8}\n  - normalize: {mean: [0.5], std: 0.25}\n");
  CHECK(gray.decode.color == ColorMode::kGray);
  const auto& n = std::get<NormalizeOp>(gray.transforms[1]);
  CHECK(n.mean == std::array<double, 3>{0.5, 0.5, 0.5});
  CHECK(n.stddev == std::array<double, 3>{0.25, 0.25, 0.25});

  std::vector<ConfigError> errors = ParseBadJob(
      "source: {root: /d}\n"
      "decode: {color: grey}\n"
      "output: {dtype: float32}\n"
      "transforms:\n  - center_crop: {size: 8}\n  - normalize: {mean: 0.5, std: [1, 1, 1]}\n");
  INFO(Dump(errors));
  REQUIRE(errors.size() == 2);  // the bad color leaves rgb: three values are then expected for mean
  CHECK(errors[0].line == 2);
  CHECK(Contains(errors[0].message, "rgb | gray"));
  CHECK(errors[1].line == 6);
  CHECK(ErrorAt(errors, "transforms.1.normalize.mean").message == "expected a list of 3 numbers, got '0.5'");

  errors = ParseBadJob(
      "source: {root: /d}\n"
      "decode: {color: gray}\n"
      "output: {dtype: float32}\n"
      "transforms:\n  - center_crop: {size: 8}\n  - normalize: {mean: [0.1, 0.2, 0.3], std: [-1]}\n");
  INFO(Dump(errors));
  REQUIRE(errors.size() == 2);
  CHECK(ErrorAt(errors, "transforms.1.normalize.mean").message ==
        "decode.color: gray gives one channel: expected one number (or a list of one), got a list of 3 item(s)");
  CHECK(ErrorAt(errors, "transforms.1.normalize.std").message == "every std must be > 0");
  CHECK(errors[0].line == 6);
}

TEST_CASE("job config: extra_outputs take their keys and defaults") {
  JobConfig c = ParseGoodJob(
      "media: audio\n"
      "audio: {length: 100}\n"
      "source: {type: tar, shards: /d/a.tar}\n"
      "extra_outputs:\n"
      "  - {name: transcript, from: .txt, max_bytes: 256}\n"
      "  - {name: meta, from: .JSON, max_bytes: 16777216, on_missing: empty, on_overflow: truncate}\n");
  REQUIRE(c.extra_outputs.size() == 2);
  const ExtraOutputConfig& t = c.extra_outputs[0];
  CHECK(t.name == "transcript");
  CHECK(t.from == ".txt");
  CHECK(t.max_bytes == 256);
  CHECK(t.on_missing == ExtraOutputConfig::OnMissing::kError);
  CHECK(t.on_overflow == ExtraOutputConfig::OnOverflow::kError);
  CHECK(c.extra_outputs[1].from == ".JSON");
  CHECK(c.extra_outputs[1].on_missing == ExtraOutputConfig::OnMissing::kEmpty);
  CHECK(c.extra_outputs[1].on_overflow == ExtraOutputConfig::OnOverflow::kTruncate);
  CHECK(ParseGoodJob(kMinimalJob).extra_outputs.empty());
  // Part of the config's equality (and so of anything that compares or fingerprints configs).
  JobConfig d = c;
  d.extra_outputs[0].max_bytes = 255;
  CHECK_FALSE(c == d);
}

TEST_CASE("job config: every extra_outputs error with its line") {
  std::vector<ConfigError> errors = ParseBadJob(
      "source: {root: /d}\n"                                                     // 1
      "transforms: [{center_crop: {size: 8}}]\n"                                 // 2
      "extra_outputs:\n"                                                         // 3
      "  - {name: image, from: .txt, max_bytes: 8}\n"                            // 4
      "  - {name: a-b, from: txt, max_bytes: 0}\n"                               // 5
      "  - {name: cap, from: .txt}\n"                                            // 6
      "  - {name: cap, from: .x/y, max_bytes: 9, on_missing: skip, bogus: 1}\n"  // 7
      "  - {name: cap_length, from: .txt, max_bytes: 8, on_overflow: cut}\n"     // 8
      "  - just a string\n");                                                    // 9
  INFO(Dump(errors));
  std::vector<int> lines;
  lines.reserve(errors.size());
  for (const ConfigError& e : errors) lines.push_back(e.line);
  CHECK(lines == std::vector<int>{4, 5, 5, 5, 6, 7, 7, 7, 7, 8, 8, 9});
  CHECK(Contains(ErrorAt(errors, "extra_outputs.0.name").message, "already has a tensor 'image'"));
  CHECK(Contains(ErrorAt(errors, "extra_outputs.1.name").message, "letters, digits or '_'"));
  CHECK(Contains(ErrorAt(errors, "extra_outputs.1.from").message, "starts with '.'"));
  CHECK(Contains(ErrorAt(errors, "extra_outputs.2.max_bytes").message, "required"));
  CHECK(Contains(ErrorAt(errors, "extra_outputs.3.name").message, "already has a tensor 'cap'"));
  CHECK(Contains(ErrorAt(errors, "extra_outputs.4.name").message, "already has a tensor 'cap_length'"));

  errors = ParseBadJob(
      "source: {type: http, list: /d/urls.txt}\n"
      "transforms: [{center_crop: {size: 8}}]\n"
      "extra_outputs: [{name: t, from: .txt, max_bytes: 8}]\n");
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].line == 3);
  CHECK(Contains(errors[0].message, "source type http"));
}

TEST_CASE("job config: coco source, mask and mix, with their errors at their lines") {
  JobConfig c = ParseGoodJob(
      "source: {type: coco, annotations: /d/ann.json, root: /d/img, max_boxes: 7, on_overflow: truncate,\n"
      "         contiguous_ids: true, include_crowd: true, masks: true, min_box_size: 0.5, min_visibility: 0.3}\n"
      "transforms:\n  - resize: {height: 8, width: 8}\n");
  CHECK(c.source.type == SourceType::kCoco);
  CHECK(c.source.root == "/d/img");
  CHECK(c.source.coco.annotations == "/d/ann.json");
  CHECK(c.source.coco.max_boxes == 7);
  CHECK(c.source.coco.on_overflow == CocoConfig::OnOverflow::kTruncate);
  CHECK(c.source.coco.contiguous_ids);
  CHECK(c.source.coco.include_crowd);
  CHECK(c.source.coco.masks);
  CHECK(c.source.coco.min_box_size == 0.5);
  CHECK(c.source.coco.min_visibility == 0.3);
  const CocoConfig defaults;
  CHECK(defaults.max_boxes == 100);
  CHECK_FALSE(defaults.include_crowd);

  JobConfig m = ParseGoodJob(
      "source: {type: image_folder, root: /d}\ntransforms:\n  - resize: {height: 8, width: 8}\n"
      "mask: {from: .png, on_missing: empty}\n"
      "mix: {mixup: {alpha: 0.2}, cutmix: {alpha: 1.0}, switch_prob: 0.25, num_classes: 10, label_smoothing: 0.1}\n");
  CHECK(m.mask.from == ".png");
  CHECK(m.mask.empty_on_missing);
  CHECK(m.mix.enabled());
  CHECK(m.mix.mixup_alpha == 0.2);
  CHECK(m.mix.cutmix_alpha == 1.0);
  CHECK(m.mix.switch_prob == 0.25);
  CHECK(m.mix.num_classes == 10);
  CHECK(m.mix.label_smoothing == 0.1);

  auto errors = ParseBadJob(
      "source: {type: coco, root: /d, max_boxes: 0, min_visibility: 1.5, on_overflow: drop}\n"  // 1
      "transforms:\n  - resize: {height: 8, width: 8}\n"                                        // 2-3
      "mask: {from: .png}\n"                                                                    // 4
      "mix: {mixup: {alpha: 0}, num_classes: 0}\n");                                            // 5
  CHECK(ErrorAt(errors, "source.annotations").message == "required key is missing");
  CHECK(ErrorAt(errors, "source.max_boxes").line == 1);
  CHECK(Contains(ErrorAt(errors, "source.min_visibility").message, "between 0 and 1"));
  CHECK(Contains(ErrorAt(errors, "source.on_overflow").message, "error | truncate"));
  CHECK(Contains(ErrorAt(errors, "mask").message, "masks: true"));
  CHECK(ErrorAt(errors, "mask").line == 4);
  CHECK(Contains(ErrorAt(errors, "mix").message, "not a class label"));

  auto mix_errors = ParseBadJob(
      "source: {type: image_folder, root: /d}\ntransforms:\n  - resize: {height: 8, width: 8}\n"
      "mix: {mixup: {alpha: 0}, num_classes: 0, label_smoothing: 1}\n");
  CHECK(Contains(ErrorAt(mix_errors, "mix.mixup.alpha").message, "> 0"));
  CHECK(ErrorAt(mix_errors, "mix.num_classes").line == 4);
  CHECK(Contains(ErrorAt(mix_errors, "mix.label_smoothing").message, "below 1"));
  auto audio = ParseBadJob("media: audio\naudio: {seconds: 1}\nsource: {type: coco, annotations: /a, root: /r}\n");
  CHECK(Contains(ErrorAt(audio, "source.type").message, "media: image"));
}

}  // namespace
}  // namespace spdl::config

namespace spdl::config {
namespace {

TEST_CASE("source.type stream: its keys, defaults and errors (issue 21)") {
  JobConfig j = ParseGoodJob(
      "source: {type: stream, name: clicks.v1, group: trainers, max_samples: 500, retain_samples: 64,\n"
      "         retain_bytes: 8MiB, allowed_uids: [1001, 1002]}\n"
      "max_batch_delay_ms: 250\n"
      "transforms: [{center_crop: {size: 8}}]\n");
  CHECK(j.source.type == SourceType::kStream);
  CHECK(j.source.stream.name == "clicks.v1");
  CHECK(j.source.stream.group == "trainers");
  CHECK(j.source.stream.max_samples == 500);
  CHECK(j.source.stream.retain_samples == 64);
  CHECK(j.source.stream.retain_bytes == (uint64_t{8} << 20));
  CHECK(j.source.stream.allowed_uids == std::vector<uint32_t>{1001, 1002});
  CHECK(j.max_batch_delay_ms == 250);
  JobConfig d = ParseGoodJob("source: {type: stream, name: s}\ntransforms: [{center_crop: {size: 8}}]\n");
  CHECK(d.source.stream.group == "default");
  CHECK(d.max_batch_delay_ms == 0);

  std::vector<ConfigError> errors = ParseBadJob(
      "source: {type: stream, name: 'a/b', root: /x, retain_bytes: lots}\n"
      "transforms: [{center_crop: {size: 8}}]\n");
  CHECK(ErrorAt(errors, "source.name").message.find("a stream name is 1..128 letters") != std::string::npos);
  CHECK(ErrorAt(errors, "source.root").message.find("not a key of source type stream") != std::string::npos);
  CHECK(ErrorAt(errors, "source.retain_bytes").message.find("byte size") != std::string::npos);
  errors = ParseBadJob("source: {type: stream}\ntransforms: [{center_crop: {size: 8}}]\n");
  CHECK_FALSE(errors.empty());
  errors = ParseBadJob("source: {root: /d}\nmax_batch_delay_ms: 10\ntransforms: [{center_crop: {size: 8}}]\n");
  CHECK(ErrorAt(errors, "max_batch_delay_ms").message ==
        "max_batch_delay_ms applies to source.type: stream and watch only");
}

}  // namespace
}  // namespace spdl::config
