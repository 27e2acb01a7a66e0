#include "datagen/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "datagen/jpeg_writer.h"

namespace spdl::datagen {
namespace {

// splitmix64: a small, well-mixed generator whose output is the same everywhere.
struct Rng {
  uint64_t s;
  uint64_t Next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  int Int(int lo, int hi) { return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1)); }
};

uint8_t Clamp(double v) { return static_cast<uint8_t>(std::clamp(v, 0.0, 255.0)); }

}  // namespace

std::vector<uint8_t> SynthesizeImage(uint64_t seed, uint64_t index, int width, int height, int noise) {
  Rng rng{seed * 1000003ull + index};
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  double base[3], fx[3], fy[3], ph[3], amp[3];
  for (int c = 0; c < 3; ++c) {
    base[c] = 60 + 130 * rng.Uniform();
    fx[c] = (0.5 + 3 * rng.Uniform()) * 2 * M_PI / width;
    fy[c] = (0.5 + 3 * rng.Uniform()) * 2 * M_PI / height;
    ph[c] = 2 * M_PI * rng.Uniform();
    amp[c] = 30 + 40 * rng.Uniform();
  }
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      for (int c = 0; c < 3; ++c) p[c] = Clamp(base[c] + amp[c] * std::sin(fx[c] * x + ph[c]) * std::cos(fy[c] * y));
    }
  }
  // A few solid shapes: edges like real objects have.
  const int shapes = rng.Int(3, 8);
  for (int s = 0; s < shapes; ++s) {
    const int cx = rng.Int(0, width - 1), cy = rng.Int(0, height - 1);
    const int r = rng.Int(std::max(4, width / 20), std::max(5, width / 4));
    const uint8_t col[3] = {static_cast<uint8_t>(rng.Int(0, 255)), static_cast<uint8_t>(rng.Int(0, 255)),
                            static_cast<uint8_t>(rng.Int(0, 255))};
    const bool circle = rng.Next() & 1;
    for (int y = std::max(0, cy - r); y < std::min(height, cy + r); ++y) {
      for (int x = std::max(0, cx - r); x < std::min(width, cx + r); ++x) {
        if (circle && (x - cx) * (x - cx) + (y - cy) * (y - cy) > r * r) continue;
        uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
        for (int c = 0; c < 3; ++c) p[c] = col[c];
      }
    }
  }
  if (noise > 0) {
    for (auto& v : rgb) v = Clamp(v + (static_cast<int>(rng.Next() % (2 * noise + 1)) - noise));
  }
  return rgb;
}

Result<std::vector<GeneratedImage>> MakeImageFolder(const std::string& root, const DatasetOptions& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Internal("cannot create " + root + ": " + ec.message());
  std::vector<GeneratedImage> out;
  Rng sizes{o.seed ^ 0x5eedull};
  for (int c = 0; c < o.classes; ++c) {
    char cls[32];
    std::snprintf(cls, sizeof(cls), "class_%03d", c);
    fs::create_directories(fs::path(root) / cls, ec);
    if (ec) return Internal("cannot create a class folder below " + root + ": " + ec.message());
    for (int i = 0; i < o.images_per_class; ++i) {
      GeneratedImage g;
      g.width = sizes.Int(o.min_side, o.max_side);
      g.height = std::clamp(sizes.Int(o.min_side, o.max_side), std::max(8, g.width / 2), g.width * 2);
      char name[64];
      std::snprintf(name, sizeof(name), "%s/img_%05d.jpg", cls, i);
      g.path = name;
      g.label = c;
      const uint64_t index = static_cast<uint64_t>(c) * o.images_per_class + i;
      auto rgb = SynthesizeImage(o.seed, index, g.width, g.height, o.noise);
      auto jpeg = CompressJpeg(rgb.data(), g.width, g.height, o.quality);
      if (!jpeg.ok()) return jpeg.status();
      std::ofstream f(fs::path(root) / g.path, std::ios::binary);
      f.write(reinterpret_cast<const char*>(jpeg->data()), static_cast<std::streamsize>(jpeg->size()));
      if (!f) return Internal("cannot write " + (fs::path(root) / g.path).string());
      g.bytes = jpeg->size();
      out.push_back(g);
    }
  }
  std::sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.path < b.path; });
  return out;
}

}  // namespace spdl::datagen
