// ImageOps: everything done to one decoded image — the geometry (resize + center crop, or a random
// resized crop), a random horizontal flip, and the output element type, layout and normalization —
// and the plans that say which part of the source ends up where in the output.
//
// Everything here is a plain value or a pure function: safe to use from any thread.
//
// The geometry follows torchvision exactly, so a batch made by spdld has the shape (and, within
// resampling error, the pixels) of `Compose([Resize(S), CenterCrop(C)])`:
//   - Resize(S): the shorter side becomes S, the longer becomes int(S * long / short).
//   - Resize((h, w)): exactly h x w.
//   - CenterCrop((h, w)): offset round((resized - crop) / 2) with Python's round-half-to-even;
//     when the crop is larger than the image, the image is first zero-padded by
//     (crop - size) // 2 before and the rest after.
// or of `RandomResizedCrop(size, scale, ratio)` (PlanRandomResizedCrop: ten attempts, then the
// central fallback, as torchvision's get_params), followed by `RandomHorizontalFlip(p)`, then
// `ToTensor()` + `Normalize(mean, std)` when the output is floating point.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "media/sample_random.h"

namespace spdl::media {

// The resampling filter, as torchvision's InterpolationMode on PIL images. kArea is PIL's BOX
// (InterpolationMode.BOX) on the exact path and swscale's area average on the fast one. kHamming has
// no fast path.
enum class Interpolation { kBilinear, kBicubic, kArea, kNearest, kHamming, kLanczos };

// How the image is decoded and resampled.
enum class Resample {
  // The pixels PIL + torchvision give (Image.open(f).convert(mode), then Resize / CenterCrop /
  // resized_crop on the PIL image): a full-size decode with libjpeg-turbo's defaults (as PIL's),
  // PIL's separable filters (resample.h), only the kept window computed. Bit-exact for JPEG.
  kExact,
  // Faster and close, not equal: JPEG decoded to Y/Cb/Cr planes with DCT-domain downscaling, one
  // swscale pass for colour conversion + crop + resize (README "Pixels equal to PIL's" has the
  // measured difference).
  kFast,
};

// Element type of the output image tensor.
enum class OutputDType { kUInt8, kFloat32, kFloat16, kBFloat16 };
// Dimension order of one output image: HWC (NHWC batches) or CHW (NCHW batches).
enum class OutputLayout { kNHWC, kNCHW };
// What becomes of an alpha channel (PNG, WebP, TIFF, GIF transparency).
enum class AlphaMode {
  kDrop,       // keep the colour channels as stored (PIL's convert("RGB"))
  kComposite,  // blend over `background` by alpha, at the source resolution
};

// Bytes of one element of `dtype`: 1, 4, 2, 2.
size_t DTypeSize(OutputDType dtype);

// What to do to one image, already resolved from the job config by the caller.
struct ImageOps {
  // ---- deterministic geometry (unused when random_crop_height > 0) ----
  // > 0: scale so the shorter side is this (aspect kept), like torchvision Resize(int).
  int resize_shorter = 0;
  // > 0 (with resize_shorter): torchvision Resize(int, max_size): when the longer side would exceed
  // it, the longer side becomes max_size and the shorter int(max_size * shorter / longer).
  int resize_max_size = 0;
  // Both > 0: scale to exactly this size (used instead of resize_shorter).
  int resize_height = 0;
  int resize_width = 0;
  // Both > 0: center crop after the resize, like torchvision CenterCrop (zero-pad when the
  // image is smaller than the crop).
  int crop_height = 0;
  int crop_width = 0;

  // ---- random geometry: torchvision RandomResizedCrop(size, scale, ratio) ----
  // Both > 0: the output size; the resize and crop fields above must then be 0.
  int random_crop_height = 0;
  int random_crop_width = 0;
  // Range of the crop's area as a fraction of the image's, and of its aspect ratio (w / h).
  // REQUIRES (when used): 0 < min <= max.
  std::array<double, 2> random_crop_scale = {0.08, 1.0};
  std::array<double, 2> random_crop_ratio = {3.0 / 4.0, 4.0 / 3.0};

  // Probability of mirroring the output left-right (torchvision RandomHorizontalFlip), in [0, 1].
  // Applied to the output image, after the geometry (padding included).
  double flip_probability = 0;

  Interpolation interpolation = Interpolation::kBilinear;
  Resample resample = Resample::kExact;

  // ---- output ----
  // 3: RGB. 1: gray — the luma of a colour source (ITU-R 601, full range, as PIL's convert("L")),
  // a gray source as it is; JPEGs through libjpeg-turbo's own grayscale output.
  int channels = 3;
  // Floating-point outputs of a 16-bit source (a 16-bit PNG or TIFF) keep its 16 bits: x / 65535.
  // uint8 outputs hold its high byte.
  OutputDType dtype = OutputDType::kUInt8;
  OutputLayout layout = OutputLayout::kNHWC;
  // Floating-point outputs are x / 255 (ToTensor); with normalize, (x / 255 - mean[c]) / stddev[c]
  // (x / 65535 for 16-bit sources). A gray output uses mean[0] and stddev[0].
  // REQUIRES: normalize only with a floating-point dtype; stddev[c] != 0.
  bool normalize = false;
  std::array<double, 3> mean = {0, 0, 0};
  std::array<double, 3> stddev = {1, 1, 1};

  // ---- decoding ----
  // Decompression-bomb guard on the source's width * height (PIL's default limit), checked from
  // the header before the pixels are decoded (every format).
  int64_t max_pixels = 178956970;
  // Resample::kFast only: let the JPEG decoder downscale in the DCT domain (1/2, 1/4, 1/8) when the
  // target is at most half the source; faster, and within resampling tolerance of a full decode.
  bool allow_dct_scaling = true;
  // JPEG only: apply the EXIF Orientation tag (rotate / mirror to the upright image) before the
  // geometry, as PIL's ImageOps.exif_transpose.
  bool exif_orientation = false;
  AlphaMode alpha = AlphaMode::kDrop;
  std::array<uint8_t, 3> background = {255, 255, 255};  // RGB, for AlphaMode::kComposite

  // True when the output is uint8 HWC, of any channel count (the decoder can then write straight
  // into it).
  bool raw_output() const { return dtype == OutputDType::kUInt8 && layout == OutputLayout::kNHWC; }
  bool random_crop() const { return random_crop_height > 0; }
};

// Returns kInvalidArgument naming every bad field: negative sizes, only one of
// resize_height/resize_width or of crop_height/crop_width set, a random crop mixed with the
// deterministic geometry, a bad scale or ratio range, a flip probability outside [0, 1],
// normalize with uint8 output, a zero std, max_pixels <= 0, channels other than 1 or 3, hamming with
// Resample::kFast.
Status ValidateImageOps(const ImageOps& ops);

// Output size the ops produce for a src_width x src_height source (as displayed, i.e. after any
// EXIF rotation): the random crop's size, else the crop size if cropping, else the resize size,
// else the source size. REQUIRES: ValidateImageOps(ops).ok(), sources >= 1.
void OutputSize(const ImageOps& ops, int src_width, int src_height, int* out_width, int* out_height);

// Bytes of one output image of out_width x out_height in the ops' dtype (ops.channels, packed).
size_t OutputImageBytes(const ImageOps& ops, int out_width, int out_height);

// Where the ops put an image. The output is out_width x out_height; the rectangle
// [keep_x, keep_x + keep_width) x [keep_y, keep_y + keep_height) of the resized image lands at
// (dst_x, dst_y) of the output, and every other output pixel is zero padding.
struct ResizeCropPlan {
  int resized_width = 0;
  int resized_height = 0;
  int out_width = 0;
  int out_height = 0;
  int keep_x = 0;
  int keep_y = 0;
  int keep_width = 0;
  int keep_height = 0;
  int dst_x = 0;
  int dst_y = 0;
  // True when some output pixels are padding (the crop is larger than the resized image).
  bool padded() const { return keep_width < out_width || keep_height < out_height; }
};

// Plans the resize + center crop of a src_width x src_height image.
// REQUIRES: ValidateImageOps(ops).ok(), src_width >= 1, src_height >= 1.
ResizeCropPlan PlanResizeCrop(const ImageOps& ops, int src_width, int src_height);

// A rectangle of whole source pixels.
struct CropRect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
  bool operator==(const CropRect&) const = default;
};

// torchvision's RandomResizedCrop.get_params for a src_width x src_height image: up to ten
// attempts drawing an area fraction uniformly from ops.random_crop_scale and a log-uniform
// aspect ratio from ops.random_crop_ratio, w = round(sqrt(area * ratio)),
// h = round(sqrt(area / ratio)), accepted when it fits, at a uniform position; else the central
// crop of the largest size within the ratio range. Draws only from `rng`.
// REQUIRES: ValidateImageOps(ops).ok(), ops.random_crop(), sources >= 1.
CropRect PlanRandomResizedCrop(const ImageOps& ops, int src_width, int src_height, SampleRng& rng);

}  // namespace spdl::media
