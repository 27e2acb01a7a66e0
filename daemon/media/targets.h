// Targets that follow the image: the geometry one decoded image went through as one Affine2D
// (GeometryChain), and the boxes and masks moved by it.
//
// The chain composes, per sample, one map per geometric step, in order: EXIF orientation (stored
// -> upright), resize + center crop (padding included) or random resized crop, horizontal flip,
// then the steps run after the decoder that its caller reported (ImageInfo::after: random_crop,
// the flip as a pixel step, the augmentations' drawn maps).
// A new geometric op of the decoder adds one line to ImageGeometry: chain.Then(ItsMap(params, ...),
// out_w, out_h); an augmentation's map arrives through ImageInfo::after.
//
// Boxes (torchvision v2's handling): step by step, the four corners are moved, the box becomes
// their enclosing box and is clipped to the step's output; at the end it is dropped when narrower or lower than
// min_size, empty, or less than min_visibility of its moved area is left after clipping. Masks: nearest-neighbour
// sampling, each output pixel's centre mapped back by the inverse map and floored to the source pixel; outside the
// source: 0. Exact for flips, crops and padding; a resize step samples as PIL's NEAREST and a rotate / affine / shear
// step as PIL's affine NEAREST (WarpMaskSteps), so masks equal torchvision's on PIL masks.
//
// Plain values and pure functions: safe from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "media/geometry.h"
#include "media/image_decoder.h"
#include "media/image_ops.h"
#include "media/pixel_convert.h"

namespace spdl::media {

// The map from a source image's pixels to the output's, the sizes at both ends, and the steps.
class GeometryChain {
 public:
  // The identity on a width x height source (as stored). REQUIRES: width, height >= 1.
  GeometryChain(int width, int height) : width_(width), height_(height), source_width_(width), source_height_(height) {}

  // Appends a step: `map` from the current output's pixels to the step's, whose output is
  // out_width x out_height.
  void Then(const Affine2D& map, int out_width, int out_height) {
    map_ = map_.Then(map);
    width_ = out_width;
    height_ = out_height;
    steps_.push_back({map, out_width, out_height});
  }

  const Affine2D& map() const { return map_; }
  int width() const { return width_; }  // the output's size after every step so far
  int height() const { return height_; }
  int source_width() const { return source_width_; }
  int source_height() const { return source_height_; }
  // The steps in order (masks are moved step by step: WarpMaskSteps).
  const std::vector<GeometryStep>& steps() const { return steps_; }

 private:
  Affine2D map_;
  std::vector<GeometryStep> steps_;
  int width_, height_;
  int source_width_, source_height_;
};

// ---- the maps of the geometric steps (each pure) ----

// Stored -> upright for an image stored sw x sh turned by `o` (pixel_convert.h's convention).
Affine2D OrientationMap(Orientation o, int sw, int sh);
// A resize + center crop plan (image_ops.h) of a src_width x src_height image: the scale to the
// resized size, then the kept rectangle moved to its place (padding: a positive offset).
// (ImageGeometry adds the two as separate steps: ResizeMap, then CropMap.)
Affine2D ResizeCropMap(const ResizeCropPlan& plan, int src_width, int src_height);
Affine2D ResizeMap(int src_width, int src_height, int out_width, int out_height);
Affine2D CropMap(const ResizeCropPlan& plan);
// A crop of rectangle `r` resized to out_width x out_height (random resized crop).
Affine2D ResizedCropMap(const CropRect& r, int out_width, int out_height);

// The chain the image decoder applied, from the ops and what it reported for the image (its
// stored size, the EXIF orientation, the random crop, the flip).
// REQUIRES: ValidateImageOps(ops).ok(), info from a successful decode with these ops.
GeometryChain ImageGeometry(const ImageOps& ops, const ImageInfo& info);

// ---- boxes ----

struct Box {
  float x1 = 0, y1 = 0, x2 = 0, y2 = 0;
  bool operator==(const Box&) const = default;
};

struct BoxFilter {
  double min_size = 1.0;        // drop when the clipped width or height is below this
  double min_visibility = 0.0;  // drop when clipped area / moved area is below this
};

// `in` moved by `map` into an out_width x out_height output (corners, enclosing box, clip);
// false when it is dropped (see the header), *out then unspecified.
bool MoveBox(const Box& in, const Affine2D& map, int out_width, int out_height, const BoxFilter& filter, Box* out);

// `in` moved through every step of `chain` as torchvision v2 moves boxes op by op: at each step the
// corners are moved, the box becomes their enclosing box and is clipped to that step's output (so a
// part cut off by a crop does not come back with a later padding, and a rotation turns the clipped
// box). Dropped (false) when it empties at any step, or at the end as MoveBox drops it (min_size;
// min_visibility against the area of `in` moved by chain.map() unclipped).
bool MoveBoxSteps(const Box& in, const GeometryChain& chain, const BoxFilter& filter, Box* out);

// ---- masks ----

// Moves a mask (src_width x src_height = chain.source_width() x source_height(), packed) through
// every step of `chain` into dst (chain.width() x chain.height()): a step that is a pure scale
// (a resize) samples as PIL's Image.resize(NEAREST) does (its accumulated source steps, so the
// result equals torchvision's Resize on a PIL mask exactly); a step whose linear part only swaps and
// mirrors axes by WarpMaskNearest (exact for flips, crops, padding and 90-degree turns); any other
// (rotate, affine, shear) as PIL's Image.transform(AFFINE, NEAREST) with fill 0 (augment.h
// WarpAffine), as torchvision's rotate / affine on a PIL mask. Safe from any thread (thread_local scratch).
void WarpMaskSteps(const uint8_t* src, const GeometryChain& chain, uint8_t* dst);

// Fills dst (dst_width x dst_height, one byte per pixel, packed) by nearest sampling of src
// (src_width x src_height, packed) through the inverse of `map` (src -> dst); 0 outside src.
// REQUIRES: map invertible.
void WarpMaskNearest(const uint8_t* src, int src_width, int src_height, const Affine2D& map, uint8_t* dst,
                     int dst_width, int dst_height);

// Sets to `value` every pixel of `mask` (width x height, packed) whose centre lies inside the
// polygon `xy` (flat x0, y0, x1, y1, ...; even-odd rule). Fewer than 3 points: nothing.
void FillPolygon(std::span<const float> xy, uint8_t value, uint8_t* mask, int width, int height);

}  // namespace spdl::media
