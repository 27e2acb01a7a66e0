// spdl-make-dataset: writes a sample image-folder dataset of real JPEG files (reproducible from
// its seed), for the demo and the benchmarks.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "datagen/dataset.h"

namespace {

int Run(int argc, char** argv) {
  CLI::App app{"spdl-make-dataset: write a sample image-folder dataset of JPEG files"};
  app.set_version_flag("--version", std::string("spdl-make-dataset ") + SPDLD_VERSION);
  std::string root;
  spdl::datagen::DatasetOptions o;
  app.add_option("root", root, "directory to write (class sub-folders go below it)")->required();
  app.add_option("--classes", o.classes, "number of classes")->check(CLI::Range(1, 100000));
  app.add_option("--per-class", o.images_per_class, "images per class")->check(CLI::Range(1, 10000000));
  app.add_option("--seed", o.seed, "seed: the same seed gives the same files");
  app.add_option("--min-side", o.min_side, "smallest width/height")->check(CLI::Range(8, 16384));
  app.add_option("--max-side", o.max_side, "largest width/height")->check(CLI::Range(8, 16384));
  app.add_option("--quality", o.quality, "JPEG quality")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  if (o.min_side > o.max_side) {
    std::fprintf(stderr, "spdl-make-dataset: --min-side must not exceed --max-side\n");
    return 2;
  }
  auto r = spdl::datagen::MakeImageFolder(root, o);
  if (!r.ok()) {
    std::fprintf(stderr, "spdl-make-dataset: %s\n", r.status().message().c_str());
    return 1;
  }
  uint64_t bytes = 0;
  for (auto& g : *r) bytes += g.bytes;
  std::printf("wrote %zu JPEG files (%d classes, %.1f MiB, mean %.0f KiB) to %s\n", r->size(), o.classes,
              static_cast<double>(bytes) / (1 << 20),
              static_cast<double>(bytes) / 1024 / static_cast<double>(r->size()), root.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {  // e.g. out of memory, or the root cannot be made
    std::fprintf(stderr, "spdl-make-dataset: %s\n", e.what());
    return 1;
  }
}
