// ImageOps: the geometric transform applied to one decoded image (resize, then center crop), and
// the plan that says which part of the source ends up where in the output.
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
#pragma once

#include <cstdint>

#include "common/status.h"

namespace spdl::media {

enum class Interpolation { kBilinear, kBicubic, kArea };

// What to do to one image, already resolved from the job config by the caller.
struct ImageOps {
  // > 0: scale so the shorter side is this (aspect kept), like torchvision Resize(int).
  int resize_shorter = 0;
  // Both > 0: scale to exactly this size (used instead of resize_shorter).
  int resize_height = 0;
  int resize_width = 0;
  // Both > 0: center crop after the resize, like torchvision CenterCrop (zero-pad when the
  // image is smaller than the crop).
  int crop_height = 0;
  int crop_width = 0;
  Interpolation interpolation = Interpolation::kBilinear;
  // Decompression-bomb guard on the source header's width * height (PIL's default limit).
  int64_t max_pixels = 178956970;
  // Let the JPEG decoder downscale in the DCT domain (1/2, 1/4, 1/8) when the target is at most
  // half the source; faster, and within resampling tolerance of a full decode.
  bool allow_dct_scaling = true;
};

// Returns kInvalidArgument naming every bad field: negative sizes, only one of
// resize_height/resize_width or of crop_height/crop_width set, max_pixels <= 0.
Status ValidateImageOps(const ImageOps& ops);

// Output size the ops produce for a src_width x src_height source: the crop size if cropping,
// else the resize size, else the source size. REQUIRES: ValidateImageOps(ops).ok(), sources >= 1.
void OutputSize(const ImageOps& ops, int src_width, int src_height, int* out_width,
                int* out_height);

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

}  // namespace spdl::media
