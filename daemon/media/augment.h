// Augmentations: the image ops of torchvision's training recipes (photometric ops, the
// RandAugment / TrivialAugmentWide / AutoAugment policies, geometric warps, vertical flip, random
// erasing), run on one decoded uint8 HWC image (1 or 3 channels) after the geometry of image_ops.h.
//
// Each op is split in two:
//   - a pure function with explicit parameters (AdjustBrightness(img, 1.3), WarpAffine(...)):
//     what the parity tests compare with torchvision's functional ops on PIL images;
//   - RunAugment(spec, img, rng): draws the op's random parameters from the sample's rng as
//     torchvision's transform classes do (ColorJitter's random order, RandAugment's op choice and
//     sign...), then calls the pure functions.
//
// Pixels follow torchvision 0.14 on PIL images (PIL 9.4): ImageEnhance's blends (truncating float
// arithmetic), PIL's HSV round trip for hue, ImageOps' LUTs (posterize, solarize, equalize,
// autocontrast, invert), PIL's affine transform (16.16 fixed point for nearest, its bilinear and
// bicubic filters; fill outside). gaussian_blur follows torchvision's tensor kernel (PIL images are
// blurred as tensors there too: float32 separable kernel, reflect padding, round). Measured parity:
// README "Augmentations".
//
// Every geometric op states its point map (Affine2D, geometry.h: input pixel coordinates to output
// ones) through a pure *Map function, so that boxes and masks can follow the pixels.
//
// All functions are pure except for writing the image they are given; scratch memory is
// thread_local. Safe to call from any number of threads on different images.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "config/augment_spec.h"
#include "media/geometry.h"
#include "media/sample_random.h"

namespace spdl::media {

using config::AugmentKind;  // the ops as a job states them (config/augment_spec.h)
using config::AugmentSpec;
using config::PadMode;
using config::RandomCropSpec;
using config::WarpFilter;

// One uint8 image, HWC, `channels` of 1 (gray) or 3 (RGB), rows `stride` bytes apart.
struct ImageView {
  uint8_t* data = nullptr;
  int width = 0;
  int height = 0;
  int channels = 3;
  size_t stride = 0;
};

// ---- photometric (pure, in place). REQUIRES for all: img.data valid, width, height >= 1. ----

// ImageEnhance.Brightness: blend with black by `factor` (>= 0).
void AdjustBrightness(ImageView img, double factor);
// ImageEnhance.Contrast: blend with the mean luma (rounded) by `factor` (>= 0).
void AdjustContrast(ImageView img, double factor);
// ImageEnhance.Color: blend with the image's luma by `factor` (>= 0). Gray images are unchanged.
void AdjustSaturation(ImageView img, double factor);
// torchvision adjust_hue on PIL: the H of PIL's HSV shifted by uint8(factor * 255) (wrapping).
// REQUIRES: -0.5 <= factor <= 0.5. Gray images are unchanged.
void AdjustHue(ImageView img, double factor);
// ImageEnhance.Sharpness: blend with PIL's SMOOTH 3x3 filter (border pixels kept) by `factor`.
void AdjustSharpness(ImageView img, double factor);
// ImageOps.posterize: keep the top `bits` bits. REQUIRES: 0 <= bits <= 8.
void Posterize(ImageView img, int bits);
// ImageOps.solarize: values >= threshold become 255 - value.
void Solarize(ImageView img, double threshold);
// ImageOps.equalize: per channel histogram equalization.
void Equalize(ImageView img);
// ImageOps.autocontrast (cutoff 0): per channel, stretch [min, max] to [0, 255].
void Autocontrast(ImageView img);
// ImageOps.invert: 255 - value.
void Invert(ImageView img);
// torchvision rgb_to_grayscale keeping the channel count: PIL's convert("L") in every channel.
void Grayscale(ImageView img);
// torchvision gaussian_blur: a kx x ky kernel (odd, >= 1) with sigmas sx, sy (> 0), reflect border.
void GaussianBlur(ImageView img, int kx, int ky, double sx, double sy);
// Mirror top-bottom (torchvision vflip).
void VerticalFlip(ImageView img);

// ---- geometric ----

// torchvision affine(angle, translate, scale, shear, center) on a PIL image: rotate by `angle`
// degrees (counter-clockwise), shear by shear_x, shear_y degrees, scale, translate by whole pixels,
// about `center` (default: the image centre, width / 2, height / 2).
struct AffineParams {
  double angle = 0;
  double translate_x = 0;
  double translate_y = 0;
  double scale = 1;
  double shear_x = 0;
  double shear_y = 0;
  bool has_center = false;  // false: (width * 0.5, height * 0.5)
  double center_x = 0;
  double center_y = 0;
};

// The point map of torchvision affine on a width x height image (output = input size).
// REQUIRES: scale != 0, the shears not at +-90 degrees.
Affine2D AffineMap(const AffineParams& p, int width, int height);
// The point map of PIL's rotate(angle, expand) (torchvision rotate on PIL, about the centre):
// *out_w, *out_h get the output size (the input's unless expand).
Affine2D RotateMap(double angle, bool expand, int in_w, int in_h, int* out_w, int* out_h);
// The point map of a vertical flip of a `height` high image.
inline Affine2D VerticalFlipMap(int height) { return Affine2D::FlipY(height); }

// PIL's Image.transform(AFFINE) of `src` into `dst` by `map` (input -> output points; its inverse
// samples): nearest in 16.16 fixed point (PIL's), bilinear / bicubic as PIL's filters; output
// pixels mapping outside the source get `fill` (per channel).
// REQUIRES: src and dst do not overlap, same channels; map invertible.
void WarpAffine(const ImageView& src, ImageView dst, const Affine2D& map, WarpFilter filter,
                const std::array<uint8_t, 3>& fill);

// ---- the ops as a job states them (config/augment_spec.h), with their random parameters ----

// "" when the spec is usable; else what is wrong (names the field).
std::string ValidateAugment(const AugmentSpec& spec);

// The torchvision name of an op kind (for messages and stats), e.g. "color_jitter".
const char* AugmentName(AugmentKind kind);

// Applies `spec` to `img` in place with its random parameters drawn from `rng`; *map (if not
// null) is set to the op's point map: identity for photometric ops, the composition of the ops
// applied for the policies (their shear / translate / rotate move points).
// REQUIRES: ValidateAugment(spec) is empty; a geometric op (rotate with expand excluded) keeps the
// size.
void RunAugment(const AugmentSpec& spec, ImageView img, SampleRng& rng, Affine2D* map);

// ---- random crop (torchvision RandomCrop): changes the size ----

// One sample's crop: the padded image is pad_left + in_w + pad_right wide (likewise in height), and
// the output is its window [x, x + width) x [y, y + height).
struct CropDraw {
  int pad_left = 0, pad_top = 0;
  int x = 0, y = 0;
  int width = 0, height = 0;
};
// RandomCrop.forward's parameters for an in_w x in_h image: the padding, pad_if_needed's extra
// padding (the shortfall on both sides), then a uniform position (draws only from rng). "" in *error unless the
// window does not fit (then the draw is empty and *error says why).
CropDraw DrawRandomCrop(const RandomCropSpec& spec, int in_w, int in_h, SampleRng& rng, std::string* error);
// The point map of a crop draw: a translation by (pad_left - x, pad_top - y).
inline Affine2D RandomCropMap(const CropDraw& d) { return Affine2D::Translate(d.pad_left - d.x, d.pad_top - d.y); }
// Writes the window of the padded `src` into `dst` (d.width x d.height, same channels), padding as
// `mode` (fill for kConstant). REQUIRES: dst does not overlap src.
void PadCrop(const ImageView& src, ImageView dst, const CropDraw& d, PadMode mode, const std::array<uint8_t, 3>& fill);

// ---- random erasing (torchvision RandomErasing), on the output tensor ----

struct EraseRect {
  int x = 0, y = 0, width = 0, height = 0;  // width == 0: nothing erased
};
// RandomErasing.get_params for a width x height image: ten attempts of an area fraction uniform in
// `scale` and a log-uniform aspect ratio in `ratio`; nothing when none fits. Draws only from rng.
EraseRect PlanErase(int width, int height, std::array<double, 2> scale, std::array<double, 2> ratio, SampleRng& rng);

}  // namespace spdl::media
