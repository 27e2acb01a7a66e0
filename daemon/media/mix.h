// Batch-level mixing of images and their labels, as timm's Mixup (mode "batch", correct_lam) and
// torchvision's references (v2 MixUp / CutMix): per batch, one lambda from Beta(alpha, alpha);
// every row i is mixed with row n - 1 - i (the batch reversed), either blended (mixup: lam * a +
// (1 - lam) * b) or with a rectangle pasted (cutmix: a box of area (1 - lam) of the image at a
// uniform centre, clipped to the image; lambda then becomes the kept area's fraction). Labels are
// one-hot with label smoothing (off = smoothing / classes, on = 1 - smoothing + off) and mixed with
// the same lambda, so each row sums to 1.
//
// Pure functions over buffers; the draws come only from the SampleRng given. Safe from any thread
// on distinct buffers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "media/image_ops.h"
#include "media/sample_random.h"

namespace spdl::media {

struct MixOptions {
  double mixup_alpha = 0;    // > 0: mixup may be drawn
  double cutmix_alpha = 0;   // > 0: cutmix may be drawn
  double switch_prob = 0.5;  // with both: the chance of cutmix for a batch
  double prob = 1.0;         // the chance that a batch is mixed at all
};

// What one batch gets.
struct MixDraw {
  bool mixed = false;  // false: the batch is left as it is (lam = 1)
  bool cutmix = false;
  double lam = 1.0;  // the weight of each row's own image and label (after cutmix's correction)
  int box_x0 = 0, box_y0 = 0, box_x1 = 0, box_y1 = 0;  // cutmix: the pasted rectangle [x0, x1) x [y0, y1)
};

// A Beta(a, a) draw (from two Gamma(a, 1) draws). REQUIRES: a > 0.
double BetaSample(double a, SampleRng& rng);

// The draw for one batch of images width x height: use (prob), kind (switch_prob), lambda and the
// cutmix box (timm's rand_bbox: cut = sqrt(1 - lam) of each side, integer sizes, a uniform centre,
// clipped), lambda corrected to the box's real area. REQUIRES: mixup_alpha > 0 or cutmix_alpha > 0.
MixDraw DrawMix(const MixOptions& options, int width, int height, SampleRng& rng);

// Mixes `rows` images of one batch in place (each OutputImageBytes(ops, width, height) bytes,
// packed one after the other, in ops.dtype and ops.layout with ops.channels): row i with row
// rows - 1 - i. uint8 blends are rounded to nearest (as timm's uint8 collate: rint).
void MixImages(const MixDraw& draw, const ImageOps& ops, int width, int height, uint8_t* images, uint32_t rows);

// Writes the smoothed one-hot of `label` into row[0..classes). REQUIRES: 0 <= label < classes.
void SmoothedOneHot(int64_t label, int classes, double smoothing, float* row);

// Mixes `rows` label rows of `classes` floats in place: row i = lam * row i + (1 - lam) * row n-1-i.
void MixLabels(double lam, int classes, float* labels, uint32_t rows);

}  // namespace spdl::media
