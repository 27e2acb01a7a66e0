// Affine2D: where a geometric transform moves a point of the image. Every geometric op (resize,
// crops, padding, flips, rotate, affine) states its effect on one sample as an Affine2D from its
// input's pixel coordinates to its output's, so that targets attached to the image (boxes, masks)
// follow the pixels: the maps of the ops a sample went through compose into one.
//
// Coordinates are continuous, in pixels, with the origin at the top-left corner of the top-left
// pixel (pixel (i, j) covers [i, i + 1) x [j, j + 1), its centre at (i + 0.5, j + 0.5)), as
// torchvision's box conventions (x1, y1, x2, y2 in pixel units).
//
// A plain value; every function is pure. Safe from any thread.
#pragma once

#include <array>

namespace spdl::media {

// x' = m[0] * x + m[1] * y + m[2];  y' = m[3] * x + m[4] * y + m[5].
struct Affine2D {
  std::array<double, 6> m = {1, 0, 0, 0, 1, 0};

  static Affine2D Identity() { return {}; }
  static Affine2D Translate(double dx, double dy) { return {{1, 0, dx, 0, 1, dy}}; }
  static Affine2D Scale(double sx, double sy) { return {{sx, 0, 0, 0, sy, 0}}; }
  // Mirror left-right within an image `width` wide: x' = width - x.
  static Affine2D FlipX(double width) { return {{-1, 0, width, 0, 1, 0}}; }
  // Mirror top-bottom within an image `height` high: y' = height - y.
  static Affine2D FlipY(double height) { return {{1, 0, 0, 0, -1, height}}; }

  // The point (x, y) moved by this map.
  std::array<double, 2> Apply(double x, double y) const {
    return {m[0] * x + m[1] * y + m[2], m[3] * x + m[4] * y + m[5]};
  }
  // `this` first, then `next`: Then(next).Apply(p) == next.Apply(Apply(p)).
  Affine2D Then(const Affine2D& next) const {
    const auto& n = next.m;
    return {{n[0] * m[0] + n[1] * m[3], n[0] * m[1] + n[1] * m[4], n[0] * m[2] + n[1] * m[5] + n[2],
             n[3] * m[0] + n[4] * m[3], n[3] * m[1] + n[4] * m[4], n[3] * m[2] + n[4] * m[5] + n[5]}};
  }
  // The map back (output to input), for sampling a target (mask) at each output pixel.
  // REQUIRES: the map is invertible (determinant != 0).
  Affine2D Inverse() const {
    const double det = m[0] * m[4] - m[1] * m[3];
    const double a = m[4] / det, b = -m[1] / det, d = -m[3] / det, e = m[0] / det;
    return {{a, b, -(a * m[2] + b * m[5]), d, e, -(d * m[2] + e * m[5])}};
  }
  bool operator==(const Affine2D&) const = default;
};

// One geometric step a sample went through: its map (input pixels -> output pixels) and its
// output size.
struct GeometryStep {
  Affine2D map;
  int width = 0;
  int height = 0;
};

}  // namespace spdl::media
