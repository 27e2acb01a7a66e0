// JobConfig: what a training job asks spdld for — where the samples are, in what order, how they
// are transformed and batched, and what the batches look like. Parsed from the job's YAML
// (see config/examples/imagenet.yaml for every key, commented).
//
// Plain values with defaults; safe to copy and hand between threads. ParseJobConfig is a pure
// function (no I/O, no global state) and may be called from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/config_error.h"
#include "config/override.h"

namespace spdl::config {

enum class Interpolation { kBilinear, kBicubic, kArea };

// Resize, either keeping the aspect ratio (shorter side -> `shorter`) or to a fixed height x width.
// Exactly one of: shorter > 0, or height > 0 && width > 0 (the parser guarantees it).
struct ResizeOp {
  int shorter = 0;  // target length of the shorter side (aspect ratio kept); 0 = not used
  int height = 0;   // fixed output height; 0 = not used
  int width = 0;    // fixed output width; 0 = not used
  Interpolation interpolation = Interpolation::kBilinear;  // YAML: bilinear | bicubic | area

  bool operator==(const ResizeOp&) const = default;
};

// Crop a height x width window from the center of the image.
struct CenterCropOp {
  int height = 0;  // window height, 1..16384
  int width = 0;   // window width, 1..16384

  bool operator==(const CenterCropOp&) const = default;
};

using TransformOp = std::variant<ResizeOp, CenterCropOp>;

// What a job does with a sample that cannot be read or decoded.
enum class OnError {
  kSkip,  // count it, skip it, go on
  kFail,  // fail the job with a message naming the file
};

// How every rank gets the same number of samples when the dataset does not divide evenly.
enum class Uneven {
  kPad,   // repeat samples from the start of the order to fill the last rank
  kDrop,  // drop the tail so that every rank has floor(N / world_size)
};

struct SourceConfig {
  std::string type = "image_folder";                      // only image_folder: sub-folder = class,
                                                          // label = index of the sorted folder name
  std::string root;                                       // the data directory; required, non-empty
  std::vector<std::string> extensions = {".jpg", ".jpeg"};  // file name endings to take; matched
                                                          // case-insensitively, stored lower-case

  bool operator==(const SourceConfig&) const = default;
};

struct SamplerConfig {
  bool shuffle = true;        // shuffle the order each epoch (a pure function of seed and epoch)
  uint64_t seed = 0;          // shuffle seed; the same on every rank of a job
  Uneven uneven = Uneven::kPad;  // YAML: pad | drop

  bool operator==(const SamplerConfig&) const = default;
};

struct BatchConfig {
  int size = 32;           // samples per batch, 1..65536
  bool drop_last = false;  // drop a last, partial batch of an epoch (else it is sent short)

  bool operator==(const BatchConfig&) const = default;
};

struct OutputConfig {
  std::string dtype = "uint8";  // element type of the image tensor; only "uint8" for now
  std::string layout = "NHWC";  // dimension order of the image tensor; only "NHWC" for now
  std::string device = "cpu";   // where batches are delivered; only "cpu" for now ("cuda:N" later)

  bool operator==(const OutputConfig&) const = default;
};

struct JobConfig {
  SourceConfig source;                  // where the samples come from
  SamplerConfig sampler;                // the order of the samples
  BatchConfig batch;                    // how samples are grouped
  std::vector<TransformOp> transforms;  // applied to each decoded image, in order; never empty
  OutputConfig output;                  // what a delivered batch looks like
  int prefetch = 4;                     // slots in the job's shared ring, 1..64
  OnError on_error = OnError::kSkip;    // YAML: skip | fail

  // Output image size after the transforms, computed by the parser (the YAML cannot set these).
  // Both 0 when the chain does not produce a fixed size (never in a config the parser returns).
  int out_height = 0;
  int out_width = 0;

  bool operator==(const JobConfig&) const = default;
};

// The outcome of parsing a job config: `config` is set iff `errors` is empty.
struct JobConfigResult {
  std::optional<JobConfig> config;  // the validated config (overrides applied)
  std::vector<ConfigError> errors;  // every problem found, sorted by line (no-line ones last)
};

// Parses and validates a job config. `overrides` are applied to the YAML tree, in order, before
// validation; errors about values they set have line 0 and a path "--set <path>". Never throws.
JobConfigResult ParseJobConfig(std::string_view yaml_text, const std::vector<Override>& overrides = {});

}  // namespace spdl::config
