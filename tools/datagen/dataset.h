// Sample datasets of real JPEG files, generated reproducibly at run time (nothing binary is kept
// in the repository): an image folder with one sub-folder per class. Library spdl_datagen (include
// root tools/): the shipped tool spdl-make-dataset (the demo, a first try after installing), the
// benchmarks and the tests (tests/e2e/dataset.h) use it. It links nothing from testing/.
//
// Pure functions of their arguments; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::datagen {

struct DatasetOptions {
  int classes = 4;
  int images_per_class = 50;
  uint64_t seed = 1;
  // Image sizes are drawn around ImageNet's (mean ~486x410): width and height uniform in
  // [min_side, max_side] with the aspect ratio kept within 1:2..2:1.
  int min_side = 200;
  int max_side = 800;
  int quality = 90;
  // Pixel content: smooth gradients and shapes plus fine noise of this amplitude (0..255), which
  // brings JPEG sizes near real photographs' (~100 KB at 500x400).
  int noise = 12;
};

struct GeneratedImage {
  std::string path;  // relative to the root: "class_002/img_00017.jpg"
  int64_t label = 0;
  int width = 0;
  int height = 0;
  uint64_t bytes = 0;
};

// RGB HWC pixels of image `index` of the dataset `seed`.
std::vector<uint8_t> SynthesizeImage(uint64_t seed, uint64_t index, int width, int height, int noise);

// Writes the dataset below `root` (created if missing). Returns what it wrote, sorted by path.
Result<std::vector<GeneratedImage>> MakeImageFolder(const std::string& root, const DatasetOptions& options);

}  // namespace spdl::datagen
