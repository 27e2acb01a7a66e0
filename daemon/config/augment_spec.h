// AugmentSpec: one built-in augmentation of a job's transform chain (color_jitter, rand_augment,
// rotate, ...) as plain values: which op, its probability and its parameter ranges. Parsed from the
// job YAML (job_config.h, AugmentOp); run by media/augment.h (RunAugment), which documents each op.
//
// Plain values; safe to copy and share between threads.
#pragma once

#include <array>
#include <cstdint>

namespace spdl::config {

// Interpolation of a warp (rotate, affine, the policies' shear / translate / rotate), as PIL's
// transform filters. YAML: nearest | bilinear | bicubic.
enum class WarpFilter { kNearest, kBilinear, kBicubic };

enum class AugmentKind {
  kColorJitter,
  kGrayscale,
  kGaussianBlur,
  kPosterize,
  kSolarize,
  kEqualize,
  kAutocontrast,
  kSharpness,
  kInvert,
  kRandAugment,
  kTrivialAugmentWide,
  kAutoAugment,
  kVerticalFlip,
  kRotate,
  kAffine,
};

// One op's settings (which fields apply depends on kind; the others keep their defaults).
struct AugmentSpec {
  AugmentKind kind = AugmentKind::kInvert;
  double p = 1;  // probability the op applies (one Bernoulli draw; p >= 1 draws nothing)
  // color_jitter: factor ranges [lo, hi] (brightness/contrast/saturation: 1 +- b clipped at 0;
  // hue: -h..h); a range {1, 1} ({0, 0} for hue) is off and draws nothing.
  std::array<double, 2> brightness = {1, 1};
  std::array<double, 2> contrast = {1, 1};
  std::array<double, 2> saturation = {1, 1};
  std::array<double, 2> hue = {0, 0};
  // gaussian_blur
  int kernel_x = 3;
  int kernel_y = 3;
  std::array<double, 2> sigma = {0.1, 2.0};
  // posterize: bits; solarize: threshold; sharpness: factor
  double value = 0;
  // rand_augment / trivial_augment_wide / auto_augment
  int num_ops = 2;
  int magnitude = 9;
  int num_magnitude_bins = 31;
  // rotate: angle drawn uniformly in [degrees[0], degrees[1]]; affine: the same, plus
  // translate fractions (max dx = translate[0] * width), scale range, shear ranges (x, then y).
  std::array<double, 2> degrees = {0, 0};
  bool expand = false;
  std::array<double, 2> translate = {0, 0};
  std::array<double, 2> scale = {1, 1};
  std::array<double, 4> shear = {0, 0, 0, 0};
  WarpFilter filter = WarpFilter::kNearest;
  std::array<uint8_t, 3> fill = {0, 0, 0};

  bool operator==(const AugmentSpec&) const = default;
};

// How random_crop pads (torchvision's padding_mode): constant (fill), edge (repeat the border pixel),
// reflect (mirror without repeating the border: numpy's 'reflect'), symmetric (mirror repeating it).
enum class PadMode { kConstant, kEdge, kReflect, kSymmetric };

// torchvision RandomCrop(size, padding, pad_if_needed, fill, padding_mode): pad, then a uniformly
// placed height x width window.
struct RandomCropSpec {
  int height = 0;
  int width = 0;
  std::array<int, 4> padding = {0, 0, 0, 0};  // left, top, right, bottom
  bool pad_if_needed = false;                 // then pad both sides by what the size lacks
  PadMode mode = PadMode::kConstant;
  std::array<uint8_t, 3> fill = {0, 0, 0};

  bool operator==(const RandomCropSpec&) const = default;
};

}  // namespace spdl::config
