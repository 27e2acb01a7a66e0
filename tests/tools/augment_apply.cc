// augment_apply: runs one augmentation of media/augment.h with explicit parameters on a raw uint8
// HWC image, for the parity test against torchvision (tests/python/test_augment_parity.py).
//
//   augment_apply IN.raw WIDTH HEIGHT CHANNELS OUT.raw OP [ARGS...]
//
// OP: brightness F | contrast F | saturation F | hue F | sharpness F | posterize BITS |
//     solarize T | equalize | autocontrast | invert | grayscale | blur KX KY SX SY | vflip |
//     affine ANGLE TX TY SCALE SHX SHY FILTER [CX CY] | rotate ANGLE FILTER |
//     padcrop PAD_LEFT PAD_TOP X Y W H MODE FILL (MODE: 0 constant, 1 edge, 2 reflect, 3 symmetric;
//     OUT.raw is then W x H)
// FILTER: 0 nearest, 1 bilinear, 2 bicubic. Fill is 0. Exit 0 on success, 2 on bad usage.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "media/augment.h"

namespace m = spdl::media;

namespace {

// Bad usage: main prints it and returns 2.
struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The number `s` spells (all of it).
double Number(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0') throw Usage(std::string("not a number: '") + s + "'");
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 7) {
    std::cerr << "usage: augment_apply IN.raw W H C OUT.raw OP [ARGS...]\n";
    return 2;
  }
  const int w = static_cast<int>(Number(argv[2])), h = static_cast<int>(Number(argv[3])),
            c = static_cast<int>(Number(argv[4]));
  if (w < 1 || h < 1 || (c != 1 && c != 3)) {
    std::cerr << "bad size\n";
    return 2;
  }
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * c);
  {
    std::ifstream in(argv[1], std::ios::binary);
    if (!in.read(reinterpret_cast<char*>(px.data()), static_cast<std::streamsize>(px.size()))) {
      std::cerr << "cannot read " << argv[1] << "\n";
      return 2;
    }
  }
  const std::string op = argv[6];
  auto arg = [&](int i) {
    if (7 + i >= argc) throw Usage(op + ": missing argument " + std::to_string(i));
    return Number(argv[7 + i]);
  };
  m::ImageView img{px.data(), w, h, c, static_cast<size_t>(w) * c};
  if (op == "brightness")
    m::AdjustBrightness(img, arg(0));
  else if (op == "contrast")
    m::AdjustContrast(img, arg(0));
  else if (op == "saturation")
    m::AdjustSaturation(img, arg(0));
  else if (op == "hue")
    m::AdjustHue(img, arg(0));
  else if (op == "sharpness")
    m::AdjustSharpness(img, arg(0));
  else if (op == "posterize")
    m::Posterize(img, static_cast<int>(arg(0)));
  else if (op == "solarize")
    m::Solarize(img, arg(0));
  else if (op == "equalize")
    m::Equalize(img);
  else if (op == "autocontrast")
    m::Autocontrast(img);
  else if (op == "invert")
    m::Invert(img);
  else if (op == "grayscale")
    m::Grayscale(img);
  else if (op == "blur")
    m::GaussianBlur(img, static_cast<int>(arg(0)), static_cast<int>(arg(1)), arg(2), arg(3));
  else if (op == "vflip")
    m::VerticalFlip(img);
  else if (op == "affine" || op == "rotate") {
    std::vector<uint8_t> out(px.size());
    m::ImageView dst{out.data(), w, h, c, static_cast<size_t>(w) * c};
    spdl::media::Affine2D map;
    int filter = 0;
    if (op == "affine") {
      m::AffineParams p;
      p.angle = arg(0);
      p.translate_x = arg(1);
      p.translate_y = arg(2);
      p.scale = arg(3);
      p.shear_x = arg(4);
      p.shear_y = arg(5);
      filter = static_cast<int>(arg(6));
      if (argc > 7 + 8) {
        p.has_center = true;
        p.center_x = arg(7);
        p.center_y = arg(8);
      }
      map = m::AffineMap(p, w, h);
    } else {
      int ow = 0, oh = 0;
      map = m::RotateMap(arg(0), false, w, h, &ow, &oh);
      filter = static_cast<int>(arg(1));
    }
    m::WarpAffine(img, dst, map, static_cast<m::WarpFilter>(filter), {0, 0, 0});
    px.swap(out);
  } else if (op == "padcrop") {
    m::CropDraw d;
    d.pad_left = static_cast<int>(arg(0));
    d.pad_top = static_cast<int>(arg(1));
    d.x = static_cast<int>(arg(2));
    d.y = static_cast<int>(arg(3));
    d.width = static_cast<int>(arg(4));
    d.height = static_cast<int>(arg(5));
    const auto fill = static_cast<uint8_t>(arg(7));
    std::vector<uint8_t> out(static_cast<size_t>(d.width) * d.height * c);
    m::PadCrop(img, m::ImageView{out.data(), d.width, d.height, c, static_cast<size_t>(d.width) * c}, d,
               static_cast<m::PadMode>(static_cast<int>(arg(6))), {fill, fill, fill});
    px.swap(out);
  } else {
    std::cerr << "unknown op " << op << "\n";
    return 2;
  }
  std::ofstream out(argv[5], std::ios::binary);
  out.write(reinterpret_cast<const char*>(px.data()), static_cast<std::streamsize>(px.size()));
  return out ? 0 : 1;
} catch (const Usage& e) {
  std::cerr << e.what() << "\n";
  return 2;
} catch (const std::exception& e) {  // out of memory: a message and status 1, not abort()
  std::cerr << "augment_apply: " << e.what() << "\n";
  return 1;
}
