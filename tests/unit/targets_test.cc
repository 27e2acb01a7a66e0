// Targets that follow the image (media/targets.h, io/coco_source.h, jobs/targets.h): the Affine2D
// maps of the geometric steps, boxes moved by them (checked against transforms computed by hand),
// masks moved by nearest sampling (pixel-exact for flips and crops), polygon rasterisation, the
// COCO source on real files, and the whole chain on real JPEGs through the real image decoder;
// the augmentations' maps (vertical_flip, random_crop with padding, rotate, affine) reaching boxes
// and masks, step-wise box clipping.
#include "jobs/targets.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "io/coco_source.h"
#include "jobs/sample_decoder.h"
#include "media/augment.h"
#include "media/geometry.h"
#include "media/image_encoder.h"
#include "media/jpeg_encoder.h"
#include "media/mix.h"
#include "media/sample_random.h"
#include "media/targets.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using spdl::media::Affine2D;
using spdl::media::Box;
using spdl::media::BoxFilter;
using spdl::media::MoveBox;

namespace {

void CheckPoint(const Affine2D& m, double x, double y, double ex, double ey) {
  const auto p = m.Apply(x, y);
  CHECK(p[0] == Approx(ex).margin(1e-9));
  CHECK(p[1] == Approx(ey).margin(1e-9));
}

Box Moved(const Box& in, const Affine2D& m, int w, int h, BoxFilter f = {}) {
  Box out;
  REQUIRE(MoveBox(in, m, w, h, f, &out));
  return out;
}

void CheckBox(const Box& b, double x1, double y1, double x2, double y2) {
  CHECK(b.x1 == Approx(x1).margin(1e-4));
  CHECK(b.y1 == Approx(y1).margin(1e-4));
  CHECK(b.x2 == Approx(x2).margin(1e-4));
  CHECK(b.y2 == Approx(y2).margin(1e-4));
}

using spdl::testing::TempDir;    // temp_dir.h
using spdl::testing::WriteFile;  // temp_dir.h

// A real JPEG, width x height, of a smooth gradient.
std::vector<uint8_t> Jpeg(int width, int height) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) rgb[(y * width + x) * 3 + c] = static_cast<uint8_t>((x * 3 + y * 2 + c * 40) % 256);
  auto jpeg = spdl::media::EncodeJpeg(rgb.data(), width, height, 90);
  REQUIRE(jpeg.ok());
  return *jpeg;
}

}  // namespace

TEST_CASE("Affine2D: a 90 degree rotation, its inverse and composition with a scale and a translation") {
  // Rotate a W x H image 90 degrees clockwise: (x, y) -> (H - y, x); the output is H x W.
  const int w = 40, h = 30;
  const Affine2D rot{{0, -1, double(h), 1, 0, 0}};
  CheckPoint(rot, 0, 0, h, 0);  // top-left -> top-right
  CheckPoint(rot, w, 0, h, w);  // top-right -> bottom-right
  CheckPoint(rot, 0, h, 0, 0);  // bottom-left -> top-left
  CheckPoint(rot, 10, 5, 25, 10);
  // EXIF orientation 6 ("rotate 90 clockwise" to upright) is the same map.
  CHECK(spdl::media::OrientationMap(spdl::media::OrientationFromExif(6), w, h) == rot);
  const Affine2D back = rot.Inverse();
  CheckPoint(back, 25, 10, 10, 5);
  CheckPoint(rot.Then(back), 7, 3, 7, 3);
  // Scale by 2, rotate, translate by (5, -1), hand-composed: (x, y) -> (2H - 2y + 5, 2x - 1).
  const Affine2D chain =
      Affine2D::Scale(2, 2).Then(Affine2D{{0, -1, 2.0 * h, 1, 0, 0}}).Then(Affine2D::Translate(5, -1));
  CheckPoint(chain, 10, 5, 2 * h - 10 + 5, 20 - 1);
  CheckPoint(chain.Inverse(), 2 * h - 10 + 5, 20 - 1, 10, 5);
}

TEST_CASE("Boxes: flip, crop, resize, rotate-90 and an affine chain, against hand-computed boxes") {
  const Box b{10, 5, 30, 25};
  SECTION("horizontal flip in a 100 wide image: x -> 100 - x") {
    CheckBox(Moved(b, Affine2D::FlipX(100), 100, 50), 70, 5, 90, 25);
  }
  SECTION("vertical flip in a 50 high image") { CheckBox(Moved(b, Affine2D::FlipY(50), 100, 50), 10, 25, 30, 45); }
  SECTION("crop at (8, 10) of size 16 x 12: shifted and clipped") {
    CheckBox(Moved(b, Affine2D::Translate(-8, -10), 16, 12), 2, 0, 16, 12);
  }
  SECTION("resize 100 x 50 -> 50 x 100") { CheckBox(Moved(b, Affine2D::Scale(0.5, 2), 50, 100), 5, 10, 15, 50); }
  SECTION("rotate 90 clockwise (EXIF 6) of a 100 x 50 image: (x, y) -> (50 - y, x)") {
    const Affine2D m = spdl::media::OrientationMap(spdl::media::OrientationFromExif(6), 100, 50);
    CheckBox(Moved(b, m, 50, 100), 25, 10, 45, 30);
  }
  SECTION("rotate 90 counter-clockwise (EXIF 8): (x, y) -> (y, 100 - x)") {
    const Affine2D m = spdl::media::OrientationMap(spdl::media::OrientationFromExif(8), 100, 50);
    CheckBox(Moved(b, m, 50, 100), 5, 70, 25, 90);
  }
  SECTION("a 45 degree rotation about the origin: the enclosing box of the four corners") {
    const double c = std::sqrt(0.5);
    const Affine2D m{{c, -c, 50, c, c, 0}};
    // corners (10,5) (30,5) (10,25) (30,25) -> x = 50 + c(x - y), y = c(x + y)
    CheckBox(Moved(b, m, 200, 200), 50 + c * (10 - 25), c * 15, 50 + c * (30 - 5), c * 55);
  }
  SECTION("an affine chain: resize x2, crop at (4, 4), flip in the 48 wide output") {
    const Affine2D m = Affine2D::Scale(2, 2).Then(Affine2D::Translate(-4, -4)).Then(Affine2D::FlipX(48));
    // x: 2x - 4 then 48 - x: [16, 56] -> [-8, 32] clipped to [0, 32]; y: 2y - 4: [6, 46] -> clipped to 40
    CheckBox(Moved(b, m, 48, 40), 0, 6, 32, 40);
  }
  SECTION("dropped: outside, too small, too little visible") {
    Box out;
    CHECK_FALSE(MoveBox(b, Affine2D::Translate(-50, 0), 40, 40, {}, &out));         // wholly left of the image
    CHECK_FALSE(MoveBox({10, 10, 10.5f, 20}, Affine2D{}, 40, 40, {1.0, 0}, &out));  // 0.5 wide < min_size 1
    CHECK(MoveBox({10, 10, 10.5f, 20}, Affine2D{}, 40, 40, {0.25, 0}, &out));       // kept with min_size 0.25
    CHECK_FALSE(MoveBox({30, 0, 50, 10}, Affine2D{}, 40, 40, {1.0, 0.6}, &out));    // half visible < 0.6
    CHECK(MoveBox({30, 0, 50, 10}, Affine2D{}, 40, 40, {1.0, 0.5}, &out));          // half visible >= 0.5
    CheckBox(out, 30, 0, 40, 10);
  }
}

TEST_CASE(
    "ImageGeometry: the decoder's steps as one map (resize + center crop, padding, random resized crop, flip, EXIF)") {
  spdl::media::ImageOps ops;
  spdl::media::ImageInfo info;
  info.width = 200;
  info.height = 100;
  SECTION("resize shorter 50 then center crop 40: scale 0.25 then offset (-30, -5)") {
    ops.resize_shorter = 50;
    ops.crop_height = ops.crop_width = 40;
    const auto chain = spdl::media::ImageGeometry(ops, info);
    CHECK(chain.width() == 40);
    CHECK(chain.height() == 40);
    // 200x100 -> 100x50; crop 40: x offset round(60 / 2) = 30, y offset round(10 / 2) = 5
    CheckPoint(chain.map(), 120, 20, 120 * 0.5 - 30, 20 * 0.5 - 5);
  }
  SECTION("a center crop larger than the image pads: the image moves by the padding") {
    ops.crop_height = 120;
    ops.crop_width = 210;
    const auto chain = spdl::media::ImageGeometry(ops, info);
    CheckPoint(chain.map(), 0, 0, 5, 10);
  }
  SECTION("random resized crop with a flip") {
    ops.random_crop_height = ops.random_crop_width = 32;
    info.crop = {20, 10, 64, 32};
    info.flipped = true;
    const auto chain = spdl::media::ImageGeometry(ops, info);
    // (x, y) -> ((x - 20) / 2, (y - 10)) then x -> 32 - x
    CheckPoint(chain.map(), 52, 26, 32 - 16, 16);
    CheckBox(Moved({20, 10, 36, 26}, chain.map(), 32, 32), 24, 0, 32, 16);
  }
  SECTION("EXIF orientation 6 then a resize to 25 x 50") {
    info.orientation = 6;
    ops.resize_height = 50;
    ops.resize_width = 25;
    const auto chain = spdl::media::ImageGeometry(ops, info);
    CHECK(chain.width() == 25);
    CHECK(chain.height() == 50);
    // upright: (x, y) -> (100 - y, x), 100 x 200; then scale 0.25
    CheckPoint(chain.map(), 40, 20, (100 - 20) * 0.25, 40 * 0.25);
  }
}

TEST_CASE("Masks: nearest sampling is pixel-exact for flips and crops, padding is 0, polygons fill pixel centres") {
  const int w = 7, h = 5;
  std::vector<uint8_t> src(w * h);
  for (int i = 0; i < w * h; ++i) src[i] = static_cast<uint8_t>(i + 1);
  SECTION("horizontal flip") {
    std::vector<uint8_t> dst(w * h);
    spdl::media::WarpMaskNearest(src.data(), w, h, Affine2D::FlipX(w), dst.data(), w, h);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) CHECK(dst[y * w + x] == src[y * w + (w - 1 - x)]);
  }
  SECTION("vertical flip") {
    std::vector<uint8_t> dst(w * h);
    spdl::media::WarpMaskNearest(src.data(), w, h, Affine2D::FlipY(h), dst.data(), w, h);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) CHECK(dst[y * w + x] == src[(h - 1 - y) * w + x]);
  }
  SECTION("crop (2, 1) 4 x 3, and padding around it") {
    std::vector<uint8_t> dst(4 * 3);
    spdl::media::WarpMaskNearest(src.data(), w, h, Affine2D::Translate(-2, -1), dst.data(), 4, 3);
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x) CHECK(dst[y * 4 + x] == src[(y + 1) * w + x + 2]);
    std::vector<uint8_t> pad(9 * 7);
    spdl::media::WarpMaskNearest(src.data(), w, h, Affine2D::Translate(1, 1), pad.data(), 9, 7);
    for (int y = 0; y < 7; ++y)
      for (int x = 0; x < 9; ++x) {
        const bool inside = x >= 1 && x < 8 && y >= 1 && y < 6;
        CHECK(pad[y * 9 + x] == (inside ? src[(y - 1) * w + x - 1] : 0));
      }
  }
  SECTION("an integer downscale by 2 takes each block's top-left pixel... of the centre: floor((x + 0.5) * 2)") {
    std::vector<uint8_t> big(4 * 4);
    for (int i = 0; i < 16; ++i) big[i] = static_cast<uint8_t>(i);
    std::vector<uint8_t> small(2 * 2);
    spdl::media::WarpMaskNearest(big.data(), 4, 4, Affine2D::Scale(0.5, 0.5), small.data(), 2, 2);
    CHECK(small == std::vector<uint8_t>{5, 7, 13, 15});  // source pixels (1,1) (3,1) (1,3) (3,3)
  }
  SECTION("a rectangle polygon fills exactly the pixels whose centres it holds") {
    std::vector<uint8_t> m(10 * 8, 0);
    const std::vector<float> rect = {2, 1, 6, 1, 6, 4, 2, 4};
    spdl::media::FillPolygon(rect, 9, m.data(), 10, 8);
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 10; ++x) CHECK(m[y * 10 + x] == ((x >= 2 && x < 6 && y >= 1 && y < 4) ? 9 : 0));
  }
}

TEST_CASE("Boxes follow the augmentations' maps: vertical_flip, random_crop with padding, rotate, affine") {
  namespace m = spdl::media;
  const Box b{10, 5, 30, 25};
  SECTION("vertical_flip of a 40 high image: y -> 40 - y") {
    CheckBox(Moved(b, m::VerticalFlipMap(40), 40, 40), 10, 15, 30, 35);
  }
  SECTION("random_crop 24 x 20 at (0, 10) of the image padded by 4: x + 4, y - 6, clipped") {
    m::CropDraw d;
    d.pad_left = 4;
    d.pad_top = 4;
    d.x = 0;
    d.y = 10;
    d.width = 24;
    d.height = 20;
    // x: [10, 30] + 4 = [14, 34] -> [14, 24]; y: [5, 25] - 6 = [-1, 19] -> [0, 19]
    CheckBox(Moved(b, m::RandomCropMap(d), 24, 20), 14, 0, 24, 19);
  }
  SECTION("rotate 90 (counter-clockwise) of a 40 x 40 image: (x, y) -> (y, 40 - x)") {
    int w = 0, h = 0;
    const Affine2D r = m::RotateMap(90, false, 40, 40, &w, &h);
    CHECK(w == 40);
    CHECK(h == 40);
    CheckBox(Moved(b, r, w, h), 5, 10, 25, 30);
  }
  SECTION("rotate 30 without expand of a 60 x 40 image: the enclosing box of the turned corners, clipped") {
    int w = 0, h = 0;
    const Affine2D r = m::RotateMap(30, false, 60, 40, &w, &h);
    CHECK(w == 60);
    CHECK(h == 40);
    const Box near_edge{40, 2, 58, 20};
    // By hand: about the centre (30, 20), counter-clockwise on screen (y down):
    // x' = 30 + c (x - 30) + s (y - 20), y' = 20 - s (x - 30) + c (y - 20).
    const double c = std::cos(30 * M_PI / 180), s = std::sin(30 * M_PI / 180);
    double x1 = 1e9, y1 = 1e9, x2 = -1e9, y2 = -1e9;
    for (double x : {40.0, 58.0})
      for (double y : {2.0, 20.0}) {
        const double px = 30 + c * (x - 30) + s * (y - 20), py = 20 - s * (x - 30) + c * (y - 20);
        x1 = std::min(x1, px), x2 = std::max(x2, px), y1 = std::min(y1, py), y2 = std::max(y2, py);
      }
    CHECK(y1 < 0);  // the box leaves the image at the top: clipped
    CheckBox(Moved(near_edge, r, w, h), std::clamp(x1, 0.0, 60.0), 0, std::clamp(x2, 0.0, 60.0),
             std::clamp(y2, 0.0, 40.0));
  }
  SECTION("affine translate (5, -3) and scale 2 of a 40 x 40 image, about its centre") {
    m::AffineParams p;
    p.translate_x = 5;
    p.translate_y = -3;
    p.scale = 2;
    // x' = 2 (x - 20) + 20 + 5: [10, 30] -> [5, 45] -> [5, 40]; y' = 2 (y - 20) + 20 - 3: [5, 25] -> [-13, 27]
    CheckBox(Moved(b, m::AffineMap(p, 40, 40), 40, 40), 5, 0, 40, 27);
  }
  SECTION("ImageGeometry appends the steps reported after the decoder's own, in order") {
    spdl::media::ImageOps ops;
    ops.crop_width = ops.crop_height = 40;
    m::ImageInfo info;
    info.width = 40;
    info.height = 40;
    info.after.push_back({m::VerticalFlipMap(40), 40, 40});
    info.after.push_back({Affine2D::Translate(4, -6), 24, 20});
    const m::GeometryChain chain = m::ImageGeometry(ops, info);
    CHECK(chain.width() == 24);
    CHECK(chain.height() == 20);
    // y: 40 - [5, 25] = [15, 35], - 6 = [9, 29] -> [9, 20]; x: [14, 34] -> [14, 24]
    CheckBox(Moved(b, chain.map(), chain.width(), chain.height()), 14, 9, 24, 20);
  }
}

TEST_CASE("Boxes move step by step: a part cut off by a crop does not come back with padding or a rotation") {
  namespace m = spdl::media;
  m::GeometryChain chain(64, 32);
  chain.Then(Affine2D::Translate(-8, 0), 16, 32);  // a crop of x [8, 24)
  m::CropDraw d;                                   // random_crop 16 x 32 of the crop padded by 4, at x 0
  d.pad_left = 4;
  d.width = 16;
  d.height = 32;
  chain.Then(m::RandomCropMap(d), 16, 32);
  // x [2, 12] -> [-6, 4] -> clipped by the crop [0, 4] -> padded + 4: [4, 8] (composed and clipped once: [0, 8])
  Box out;
  REQUIRE(m::MoveBoxSteps({2, 5, 12, 25}, chain, {}, &out));
  CheckBox(out, 4, 5, 8, 25);
  CheckBox(Moved({2, 5, 12, 25}, chain.map(), 16, 32), 0, 5, 8, 25);
  // a box wholly cut off by the crop is dropped even where the padding would hold it
  CHECK_FALSE(m::MoveBoxSteps({2, 5, 7, 25}, chain, {}, &out));
  // min_visibility: against the box moved by the whole map unclipped ([−6, 4] x [5, 25]: 4 of 10 wide)
  CHECK_FALSE(m::MoveBoxSteps({2, 5, 12, 25}, chain, {1.0, 0.5}, &out));
  CHECK(m::MoveBoxSteps({2, 5, 12, 25}, chain, {1.0, 0.4}, &out));
  // a rotation turns the clipped box: 90 degrees of the 16 x 16 crop [0, 16) of a 32 x 16 image
  m::GeometryChain turned(32, 16);
  turned.Then(Affine2D::Translate(-8, 0), 16, 16);
  int w = 0, h = 0;
  const Affine2D r = m::RotateMap(90, false, 16, 16, &w, &h);
  turned.Then(r, w, h);
  // x [4, 12] -> [-4, 4] -> [0, 4]; y [2, 6]; rotate (x, y) -> (y, 16 - x): x [2, 6], y [12, 16]
  REQUIRE(m::MoveBoxSteps({4, 2, 12, 6}, turned, {}, &out));
  CheckBox(out, 2, 12, 6, 16);
}

// One object [8, 4, 24, 20] of category 9 on image 1 (x.jpg), its polygon the same rectangle.
constexpr const char* kOneObject = R"({"images": [{"id": 1, "file_name": "x.jpg"}],
    "categories": [{"id": 9, "name": "b"}],
    "annotations": [{"image_id": 1, "category_id": 9, "bbox": [8, 4, 16, 16], "segmentation": [[8, 4, 24, 4, 24, 20, 8, 20]]}]})";

// A real 64 x 32 JPEG (img/x.jpg) annotated by `annotations` (COCO JSON), and a job reading it: a
// coco source with `source_options` after its annotations and root, then `rest` (the transforms);
// its config, its sample decoder, the COCO source opened with the config's options and the image
// file's bytes. Fails the test case if any of them cannot be made.
struct CocoImage {
  CocoImage(const std::string& annotations, const std::string& source_options, const std::string& rest) {
    WriteFile(dir / "img/x.jpg", Jpeg(64, 32));
    WriteFile(dir / "ann.json", annotations);
    auto parsed = spdl::config::ParseJobConfig("source: {type: coco, annotations: " + (dir / "ann.json") +
                                               ", root: " + (dir / "img") + ", " + source_options + "}\n" + rest);
    std::string errors;
    for (const auto& e : parsed.errors) errors += std::to_string(e.line) + " " + e.path + ": " + e.message + "\n";
    INFO(errors);
    REQUIRE(parsed.errors.empty());
    config = *parsed.config;
    auto made = spdl::jobs::MakeSampleDecoder(config);
    REQUIRE(made.ok());
    decoder = *made;
    spdl::io::CocoOptions o;
    o.annotations = config.source.coco.annotations;
    o.root = config.source.root;
    o.allowed_roots = {dir.path};
    o.masks = config.source.coco.masks;
    o.contiguous_ids = config.source.coco.contiguous_ids;
    auto opened = spdl::io::CocoSource::Open(o);
    REQUIRE(opened.ok());
    src = std::move(opened).value();
    REQUIRE(src->Read(0, &bytes).ok());
  }

  // Decodes the image as the job does with `seed`; returns what the decode did.
  spdl::media::ImageInfo Decode(uint64_t seed) const {
    std::vector<uint8_t> image(decoder->tensors()[0].row_bytes);
    uint8_t* image_row = image.data();
    spdl::media::ImageInfo info;
    REQUIRE(decoder->DecodeImage(bytes, seed, std::span<uint8_t* const>(&image_row, 1), &info).ok());
    return info;
  }

  TempDir dir;
  spdl::config::JobConfig config;
  std::shared_ptr<const spdl::jobs::SampleDecoder> decoder;
  std::unique_ptr<spdl::io::CocoSource> src;
  std::vector<uint8_t> bytes;
};

// The target rows TargetWriter fills for one sample: up to `max_boxes` boxes (x1 y1 x2 y2) and their
// labels, the count, and a side x side mask.
struct TargetRows {
  TargetRows(int max_boxes, int side) : boxes(4 * max_boxes), labels(max_boxes), mask(side * side) {}
  std::vector<uint8_t*> rows() {
    return {reinterpret_cast<uint8_t*>(boxes.data()), reinterpret_cast<uint8_t*>(labels.data()),
            reinterpret_cast<uint8_t*>(&count), mask.data()};
  }
  std::vector<float> boxes;
  std::vector<int64_t> labels;
  int32_t count = -1;
  std::vector<uint8_t> mask;
};

TEST_CASE("TargetWriter: boxes and masks follow random_crop with padding through a real decode") {
  const CocoImage c(kOneObject, "max_boxes: 2, masks: true",
                    "transforms:\n  - resize: {shorter: 16}\n  - center_crop: {size: 16}\n"
                    "  - random_crop: {size: 12, padding: 3}\n");
  spdl::jobs::TargetWriter writer(c.config);
  std::set<std::pair<int, int>> seen;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    const spdl::media::ImageInfo info = c.Decode(seed);
    // The crop drawn, drawn again from the same stream of the same seed.
    spdl::media::SampleRng rng(seed, spdl::media::RandomStream::kRandomCrop);
    std::string error;
    const spdl::media::CropDraw d =
        spdl::media::DrawRandomCrop(spdl::media::RandomCropSpec{12, 12, {3, 3, 3, 3}}, 16, 16, rng, &error);
    REQUIRE(error.empty());
    seen.insert({d.x, d.y});
    const int dx = d.pad_left - d.x, dy = d.pad_top - d.y;  // the crop's shift
    TargetRows t(2, 12);
    REQUIRE(writer.Write(*c.src, 0, *c.decoder->image_ops(), info, t.rows()).ok());
    const std::vector<float>& boxes = t.boxes;
    const int32_t count = t.count;
    const std::vector<uint8_t>& mask = t.mask;
    // 64 x 32 -> 32 x 16, center crop at x 8: x [8, 24] -> [-4, 4] -> [0, 4], y [4, 20] -> [2, 10];
    // then shifted by (dx, dy) and clipped to 12 x 12.
    INFO("seed " << seed << " dx " << dx << " dy " << dy);
    const double x1 = std::clamp(0.0 + dx, 0.0, 12.0), x2 = std::clamp(4.0 + dx, 0.0, 12.0);
    const double y1 = std::clamp(2.0 + dy, 0.0, 12.0), y2 = std::clamp(10.0 + dy, 0.0, 12.0);
    if (x2 - x1 >= 1 && y2 - y1 >= 1) {
      REQUIRE(count == 1);
      CheckBox(Box{boxes[0], boxes[1], boxes[2], boxes[3]}, x1, y1, x2, y2);
    } else {
      CHECK(count == 0);
    }
    // The mask, pixel-exact: output (x, y) is crop pixel (x - dx, y - dy) (0 outside the crop), crop
    // pixel (u, v) is stored pixel ((u + 8) * 2 + 1, v * 2 + 1) (resize by 2: PIL NEAREST takes the odd one).
    for (int y = 0; y < 12; ++y) {
      for (int x = 0; x < 12; ++x) {
        const int u = x - dx, v = y - dy;
        uint8_t want = 0;
        if (u >= 0 && u < 16 && v >= 0 && v < 16) {
          const int sx = (u + 8) * 2 + 1, sy = v * 2 + 1;
          want = (sx >= 8 && sx < 24 && sy >= 4 && sy < 20) ? 9 : 0;
        }
        INFO("x " << x << " y " << y);
        CHECK(mask[y * 12 + x] == want);
      }
    }
  }
  CHECK(seen.size() > 3);  // the seeds drew several crops
}

TEST_CASE("Masks follow the augmentations: pixel-exact vertical_flip, random_crop with padding, rotate 90") {
  namespace m = spdl::media;
  const int w = 7, h = 5;
  std::vector<uint8_t> src(w * h);
  for (int i = 0; i < w * h; ++i) src[i] = static_cast<uint8_t>(i + 1);
  SECTION("vertical_flip, through the chain") {
    m::GeometryChain chain(w, h);
    chain.Then(m::VerticalFlipMap(h), w, h);
    std::vector<uint8_t> dst(w * h);
    m::WarpMaskSteps(src.data(), chain, dst.data());
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) CHECK(dst[y * w + x] == src[(h - 1 - y) * w + x]);
  }
  SECTION("random_crop 6 x 6 at (1, 0) of the image padded by 2: shifted, padding 0") {
    m::CropDraw d;
    d.pad_left = d.pad_top = 2;
    d.x = 1;
    d.y = 0;
    d.width = d.height = 6;
    m::GeometryChain chain(w, h);
    chain.Then(m::RandomCropMap(d), 6, 6);
    std::vector<uint8_t> dst(36);
    m::WarpMaskSteps(src.data(), chain, dst.data());
    for (int y = 0; y < 6; ++y)
      for (int x = 0; x < 6; ++x) {
        const int sx = x + 1 - 2, sy = y - 2;  // padded (x + d.x, y + d.y) minus the padding
        const bool inside = sx >= 0 && sx < w && sy >= 0 && sy < h;
        CHECK(dst[y * 6 + x] == (inside ? src[sy * w + sx] : 0));
      }
  }
  SECTION("rotate 90 of a square mask turns it exactly; rotate 30 keeps the centre and fills 0 in the corners") {
    const int n = 6;
    std::vector<uint8_t> sq(n * n);
    for (int i = 0; i < n * n; ++i) sq[i] = static_cast<uint8_t>(i + 1);
    int ow = 0, oh = 0;
    m::GeometryChain chain(n, n);
    const Affine2D r90 = m::RotateMap(90, false, n, n, &ow, &oh);
    chain.Then(r90, ow, oh);
    std::vector<uint8_t> dst(n * n);
    m::WarpMaskSteps(sq.data(), chain, dst.data());
    // output (x, y) comes from input (n - 1 - y, x)
    for (int y = 0; y < n; ++y)
      for (int x = 0; x < n; ++x) CHECK(dst[y * n + x] == sq[x * n + (n - 1 - y)]);
    m::GeometryChain turned(n, n);
    const Affine2D r30 = m::RotateMap(30, false, n, n, &ow, &oh);
    turned.Then(r30, ow, oh);
    m::WarpMaskSteps(sq.data(), turned, dst.data());
    CHECK(dst[0] == 0);  // the corners come from outside the source
    CHECK(dst[n * n - 1] == 0);
    // the centre pixels come from the centre: (2.5, 2.5) -> (2.5 + ...) sampled within the middle 2 x 2
    const std::vector<uint8_t> middle = {sq[2 * n + 2], sq[2 * n + 3], sq[3 * n + 2], sq[3 * n + 3]};
    CHECK(std::find(middle.begin(), middle.end(), dst[2 * n + 2]) != middle.end());
  }
}

TEST_CASE("CocoSource: images in id order, boxes as x1 y1 x2 y2, crowd excluded, contiguous ids, errors") {
  TempDir dir;
  WriteFile(dir / "img/b.jpg", Jpeg(16, 8));
  WriteFile(dir / "img/a.jpg", Jpeg(8, 8));
  WriteFile(dir / "ann.json", std::string(R"({
    "images": [{"id": 7, "file_name": "b.jpg", "width": 16, "height": 8}, {"id": 3, "file_name": "a.jpg"}],
    "categories": [{"id": 18, "name": "dog"}, {"id": 1, "name": "person"}],
    "annotations": [
      {"id": 1, "image_id": 7, "category_id": 18, "bbox": [1, 2, 3, 4], "iscrowd": 0,
       "segmentation": [[1, 2, 4, 2, 4, 6, 1, 6]]},
      {"id": 2, "image_id": 7, "category_id": 1, "bbox": [0, 0, 16, 8], "iscrowd": 1,
       "segmentation": {"counts": [0, 128], "size": [8, 16]}},
      {"id": 3, "image_id": 3, "category_id": 1, "bbox": [2.5, 0.5, 1, 1]}]})"));
  spdl::io::CocoOptions o;
  o.annotations = dir / "ann.json";
  o.root = dir / "img";
  o.allowed_roots = {dir.path};
  auto src = spdl::io::CocoSource::Open(o);
  REQUIRE(src.ok());
  const auto& s = **src;
  REQUIRE(s.size() == 2);
  CHECK(s.sample(0).path == "a.jpg");  // id 3 first
  CHECK(s.sample(1).path == "b.jpg");
  CHECK(s.sample(0).label == spdl::io::kNoLabel);
  REQUIRE(s.Objects(1)->size() == 1);  // the crowd region is left out
  const auto& o1 = (*s.Objects(1))[0];
  CHECK(o1.x1 == 1);
  CHECK(o1.y1 == 2);
  CHECK(o1.x2 == 4);
  CHECK(o1.y2 == 6);
  CHECK(o1.category == 18);
  REQUIRE(s.Objects(0)->size() == 1);
  CHECK((*s.Objects(0))[0].x2 == 3.5f);
  std::vector<uint8_t> bytes;
  REQUIRE(s.Read(0, &bytes).ok());
  CHECK(bytes == Jpeg(8, 8));

  o.contiguous_ids = true;
  o.include_crowd = true;
  auto contiguous = spdl::io::CocoSource::Open(o);
  REQUIRE(contiguous.ok());
  CHECK((*contiguous)->Objects(1)->size() == 2);
  CHECK((*(*contiguous)->Objects(1))[0].category == 1);  // id 18 is the second category by id
  CHECK((*contiguous)->ClassNames() == std::vector<std::string>{"person", "dog"});
  CHECK((*contiguous)->Identity() == (*src)->Identity());  // same files

  // The ranks of a run share one parse through the daemon's index cache.
  // (The JSON is dated an hour back: one written within the racy window is never reused.)
  fs::last_write_time(dir / "ann.json", fs::file_time_type::clock::now() - std::chrono::hours(1));
  spdl::io::SourceIndexCache cache;
  o.index_cache = &cache;
  auto first = spdl::io::CocoSource::Open(o);
  auto second = spdl::io::CocoSource::Open(o);
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(cache.stats().scans == 1);
  CHECK(cache.stats().hits + cache.stats().joined == 1);
  CHECK((*second)->Objects(1) == (*first)->Objects(1));  // the very same parsed objects
  o.index_cache = nullptr;

  o.masks = true;  // a crowd RLE cannot be rasterised: refused with the entry named
  auto rle = spdl::io::CocoSource::Open(o);
  REQUIRE_FALSE(rle.ok());
  CHECK_THAT(rle.status().message(), Catch::Contains("annotations[1]") && Catch::Contains("RLE"));

  WriteFile(dir / "bad.json", std::string(R"({"images": [{"id": 1, "file_name": "a.jpg"}], "categories": [],
    "annotations": [{"image_id": 2, "category_id": 5, "bbox": [0, 0, 1, 1]}, {"image_id": 1, "category_id": 5}]})"));
  o.annotations = dir / "bad.json";
  o.masks = false;
  auto bad = spdl::io::CocoSource::Open(o);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("annotations[0]: image_id 2 is not in 'images'") &&
                                         Catch::Contains("annotations[1]: category_id 5 is not in 'categories'"));
  WriteFile(dir / "broken.json", std::string("{\"images\": ["));
  o.annotations = dir / "broken.json";
  auto broken = spdl::io::CocoSource::Open(o);
  REQUIRE_FALSE(broken.ok());
  CHECK_THAT(broken.status().message(), Catch::Contains("not valid JSON"));
  o.annotations = "/etc/passwd";
  CHECK_FALSE(spdl::io::CocoSource::Open(o).ok());
}

TEST_CASE("TargetWriter: real JPEGs through the real decoder, boxes and masks follow resize, crop and flip") {
  // 64 x 32 image; one object [8, 4, 24, 20], its polygon the same rectangle; a second one at the right edge.
  const CocoImage c(
      R"({"images": [{"id": 1, "file_name": "x.jpg"}],
    "categories": [{"id": 5, "name": "a"}, {"id": 9, "name": "b"}],
    "annotations": [{"image_id": 1, "category_id": 9, "bbox": [8, 4, 16, 16], "segmentation": [[8, 4, 24, 4, 24, 20, 8, 20]]},
                    {"image_id": 1, "category_id": 5, "bbox": [60, 0, 4, 32], "segmentation": [[60, 0, 64, 0, 64, 32, 60, 32]]}]})",
      "max_boxes: 4, masks: true, contiguous_ids: true",
      "transforms:\n  - resize: {shorter: 16}\n  - center_crop: {size: 16}\n  - horizontal_flip: {p: 1.0}\n");
  const spdl::media::ImageInfo info = c.Decode(1);
  CHECK(info.flipped);

  spdl::jobs::TargetWriter writer(c.config);
  REQUIRE(writer.tensors().size() == 4);
  TargetRows t(4, 16);
  REQUIRE(writer.Write(*c.src, 0, *c.decoder->image_ops(), info, t.rows()).ok());
  const std::vector<float>& boxes = t.boxes;
  const std::vector<int64_t>& labels = t.labels;
  const int32_t count = t.count;
  const std::vector<uint8_t>& mask = t.mask;
  // 64 x 32 -> resize 16: 32 x 16 (scale 0.5), center crop 16: offset x 8, then flip: x -> 16 - x.
  // Object 1: x [8, 24] -> [4, 12] -> [-4, 4] -> flipped [12, 20] -> clipped [12, 16]; y [4, 20] -> [2, 10].
  // Object 2: x [60, 64] -> [30, 32] -> [22, 24]: outside the crop, dropped.
  REQUIRE(count == 1);
  CHECK(boxes[0] == 12);
  CHECK(boxes[1] == 2);
  CHECK(boxes[2] == 16);
  CHECK(boxes[3] == 10);
  CHECK(labels[0] == 1);  // category 9 is index 1
  CHECK(boxes[4] == 0);
  // The mask: object 1 covers stored x [8, 24) y [4, 20); output pixel (x, y) samples stored
  // ((16 - x - 0.5 + 8) * 2, (y + 0.5) * 2) floored.
  for (int y = 0; y < 16; ++y) {
    for (int x = 0; x < 16; ++x) {
      const int sx = static_cast<int>(std::floor((16 - x - 0.5 + 8) * 2));
      const int sy = static_cast<int>(std::floor((y + 0.5) * 2));
      const uint8_t want = (sx >= 8 && sx < 24 && sy >= 4 && sy < 20) ? 2 : (sx >= 60 ? 1 : 0);
      INFO("x " << x << " y " << y);
      CHECK(mask[y * 16 + x] == want);
    }
  }
}

TEST_CASE("TargetWriter: boxes and masks follow the augmentations a real decode ran (vertical_flip, color_jitter)") {
  const CocoImage c(kOneObject, "max_boxes: 2, masks: true",
                    "transforms:\n  - resize: {shorter: 16}\n  - center_crop: {size: 16}\n"
                    "  - color_jitter: {brightness: 0.4}\n  - vertical_flip: {p: 1}\n"
                    "  - horizontal_flip: {p: 1.0}\n");
  REQUIRE(c.decoder->image_ops() != nullptr);
  const spdl::media::ImageInfo info = c.Decode(1);
  REQUIRE(info.after.size() == 2);  // vertical_flip, then the flip (a pixel step here); color_jitter moves nothing

  spdl::jobs::TargetWriter writer(c.config);
  TargetRows t(2, 16);
  REQUIRE(writer.Write(*c.src, 0, *c.decoder->image_ops(), info, t.rows()).ok());
  const std::vector<float>& boxes = t.boxes;
  const int32_t count = t.count;
  const std::vector<uint8_t>& mask = t.mask;
  // 64 x 32 -> 32 x 16 (scale 0.5), crop at x 8: x [8, 24] -> [-4, 4], y [4, 20] -> [2, 10];
  // vertical flip y -> 16 - y: [6, 14]; horizontal flip x -> 16 - x: [12, 20] -> clipped [12, 16].
  REQUIRE(count == 1);
  CHECK(boxes[0] == 12);
  CHECK(boxes[1] == 6);
  CHECK(boxes[2] == 16);
  CHECK(boxes[3] == 14);
  for (int y = 0; y < 16; ++y) {
    for (int x = 0; x < 16; ++x) {
      const int sx = static_cast<int>(std::floor((16 - x - 0.5 + 8) * 2));
      const int sy = static_cast<int>(std::floor((16 - y - 0.5) * 2));
      const uint8_t want = (sx >= 8 && sx < 24 && sy >= 4 && sy < 20) ? 9 : 0;
      INFO("x " << x << " y " << y);
      CHECK(mask[y * 16 + x] == want);
    }
  }
}

TEST_CASE("Mix: Beta draws, cutmix's lambda is the kept area, labels sum to 1, images blend as the label says") {
  using namespace spdl::media;
  SampleRng rng(12345, RandomStream::kResizedCrop);
  double sum = 0;
  for (int i = 0; i < 4000; ++i) {
    const double b = BetaSample(0.4, rng);
    REQUIRE(b >= 0);
    REQUIRE(b <= 1);
    sum += b;
  }
  CHECK(sum / 4000 == Approx(0.5).margin(0.03));  // Beta(a, a) has mean 1/2
  MixOptions o;
  o.cutmix_alpha = 1.0;
  for (int i = 0; i < 50; ++i) {
    const MixDraw d = DrawMix(o, 32, 24, rng);
    REQUIRE(d.mixed);
    REQUIRE(d.cutmix);
    const double area = double(d.box_x1 - d.box_x0) * (d.box_y1 - d.box_y0);
    CHECK(d.lam == Approx(1 - area / (32 * 24)));
    CHECK((d.box_x0 >= 0 && d.box_x1 <= 32 && d.box_y0 >= 0 && d.box_y1 <= 24));
  }
  o.prob = 0;
  CHECK_FALSE(DrawMix(o, 32, 24, rng).mixed);

  // Labels: smoothed one-hot rows, mixed with the reversed batch, sum to 1.
  const int k = 5;
  std::vector<float> labels(3 * k);
  for (int r = 0; r < 3; ++r) SmoothedOneHot(r, k, 0.1, labels.data() + r * k);
  CHECK(labels[0] == Approx(0.9 + 0.02));
  CHECK(labels[1] == Approx(0.02));
  MixLabels(0.7, k, labels.data(), 3);
  for (int r = 0; r < 3; ++r) {
    double s = 0;
    for (int c = 0; c < k; ++c) s += labels[r * k + c];
    CHECK(s == Approx(1.0));
  }
  CHECK(labels[0 * k + 0] == Approx(0.7 * 0.92 + 0.3 * 0.02));
  CHECK(labels[0 * k + 2] == Approx(0.7 * 0.02 + 0.3 * 0.92));
  CHECK(labels[1 * k + 1] == Approx(0.92));  // the middle row of an odd batch mixes with itself

  // Images: uint8 mixup rounds the blend; cutmix swaps the box.
  ImageOps ops;
  std::vector<uint8_t> images = {10, 20, 30, 40, 200, 100, 50, 0};  // two 2 x 2 gray images
  ops.channels = 1;
  MixDraw mixup;
  mixup.mixed = true;
  mixup.lam = 0.75;
  MixImages(mixup, ops, 2, 2, images.data(), 2);
  CHECK(images == std::vector<uint8_t>{58, 40, 35, 30, 152, 80, 45, 10});
  MixDraw cut;
  cut.mixed = cut.cutmix = true;
  cut.box_x0 = 1;
  cut.box_x1 = 2;
  cut.box_y0 = 0;
  cut.box_y1 = 1;
  MixImages(cut, ops, 2, 2, images.data(), 2);
  CHECK(images == std::vector<uint8_t>{58, 80, 35, 30, 152, 40, 45, 10});
}
