#include "media/targets.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "media/augment.h"

namespace spdl::media {

Affine2D OrientationMap(Orientation o, int sw, int sh) {
  // Displayed (x, y) = stored (sx, sy) with u = flip_x ? sw - sx : sx, v = flip_y ? sh - sy : sy,
  // (x, y) = transpose ? (v, u) : (u, v) (continuous coordinates).
  Affine2D m;
  if (o.flip_x) m = m.Then(Affine2D::FlipX(sw));
  if (o.flip_y) m = m.Then(Affine2D::FlipY(sh));
  if (o.transpose) m = m.Then(Affine2D{{0, 1, 0, 1, 0, 0}});
  return m;
}

Affine2D ResizeCropMap(const ResizeCropPlan& p, int src_width, int src_height) {
  return Affine2D::Scale(static_cast<double>(p.resized_width) / src_width,
                         static_cast<double>(p.resized_height) / src_height)
      .Then(Affine2D::Translate(p.dst_x - p.keep_x, p.dst_y - p.keep_y));
}

Affine2D ResizeMap(int src_width, int src_height, int out_width, int out_height) {
  return Affine2D::Scale(static_cast<double>(out_width) / src_width, static_cast<double>(out_height) / src_height);
}

Affine2D CropMap(const ResizeCropPlan& p) { return Affine2D::Translate(p.dst_x - p.keep_x, p.dst_y - p.keep_y); }

Affine2D ResizedCropMap(const CropRect& r, int out_width, int out_height) {
  return Affine2D::Translate(-r.x, -r.y)
      .Then(Affine2D::Scale(static_cast<double>(out_width) / r.width, static_cast<double>(out_height) / r.height));
}

GeometryChain ImageGeometry(const ImageOps& ops, const ImageInfo& info) {
  GeometryChain chain(info.width, info.height);
  // 1. upright (EXIF orientation)
  const Orientation o = OrientationFromExif(info.orientation);
  const int dw = o.transpose ? info.height : info.width;
  const int dh = o.transpose ? info.width : info.height;
  chain.Then(OrientationMap(o, info.width, info.height), dw, dh);
  // 2. resize + center crop, or the random resized crop
  if (ops.random_crop()) {  // torchvision's resized_crop: crop, then resize
    const CropRect& r = info.crop;
    chain.Then(Affine2D::Translate(-r.x, -r.y), r.width, r.height);
    chain.Then(ResizeMap(r.width, r.height, ops.random_crop_width, ops.random_crop_height), ops.random_crop_width,
               ops.random_crop_height);
  } else {  // Resize, then CenterCrop (with its padding)
    const ResizeCropPlan p = PlanResizeCrop(ops, dw, dh);
    chain.Then(ResizeMap(dw, dh, p.resized_width, p.resized_height), p.resized_width, p.resized_height);
    chain.Then(CropMap(p), p.out_width, p.out_height);
  }
  // 3. horizontal flip
  if (info.flipped) chain.Then(Affine2D::FlipX(chain.width()), chain.width(), chain.height());
  // 4. what ran after the decoder (random_crop, the flip as a pixel step, augmentations)
  for (const GeometryStep& s : info.after) chain.Then(s.map, s.width, s.height);
  return chain;
}

bool MoveBox(const Box& in, const Affine2D& map, int out_width, int out_height, const BoxFilter& filter, Box* out) {
  const std::array<std::array<double, 2>, 4> corners = {map.Apply(in.x1, in.y1), map.Apply(in.x2, in.y1),
                                                        map.Apply(in.x1, in.y2), map.Apply(in.x2, in.y2)};
  double x1 = corners[0][0], x2 = x1, y1 = corners[0][1], y2 = y1;
  for (const auto& c : corners) {
    x1 = std::min(x1, c[0]);
    x2 = std::max(x2, c[0]);
    y1 = std::min(y1, c[1]);
    y2 = std::max(y2, c[1]);
  }
  const double moved_area = (x2 - x1) * (y2 - y1);
  const double cx1 = std::clamp(x1, 0.0, double(out_width)), cx2 = std::clamp(x2, 0.0, double(out_width));
  const double cy1 = std::clamp(y1, 0.0, double(out_height)), cy2 = std::clamp(y2, 0.0, double(out_height));
  const double w = cx2 - cx1, h = cy2 - cy1;
  if (w <= 0 || h <= 0 || w < filter.min_size || h < filter.min_size) return false;
  if (filter.min_visibility > 0 && moved_area > 0 && (w * h) / moved_area < filter.min_visibility) return false;
  *out = {static_cast<float>(cx1), static_cast<float>(cy1), static_cast<float>(cx2), static_cast<float>(cy2)};
  return true;
}

bool MoveBoxSteps(const Box& in, const GeometryChain& chain, const BoxFilter& filter, Box* out) {
  double x1 = in.x1, y1 = in.y1, x2 = in.x2, y2 = in.y2;
  for (const GeometryStep& s : chain.steps()) {
    const std::array<std::array<double, 2>, 4> c = {s.map.Apply(x1, y1), s.map.Apply(x2, y1), s.map.Apply(x1, y2),
                                                    s.map.Apply(x2, y2)};
    x1 = x2 = c[0][0];
    y1 = y2 = c[0][1];
    for (const auto& p : c) {
      x1 = std::min(x1, p[0]);
      x2 = std::max(x2, p[0]);
      y1 = std::min(y1, p[1]);
      y2 = std::max(y2, p[1]);
    }
    x1 = std::clamp(x1, 0.0, double(s.width));
    x2 = std::clamp(x2, 0.0, double(s.width));
    y1 = std::clamp(y1, 0.0, double(s.height));
    y2 = std::clamp(y2, 0.0, double(s.height));
    if (x2 - x1 <= 0 || y2 - y1 <= 0) return false;
  }
  const double w = x2 - x1, h = y2 - y1;
  if (w < filter.min_size || h < filter.min_size) return false;
  if (filter.min_visibility > 0) {  // against the box moved by the whole map, unclipped
    const auto& m = chain.map();
    const std::array<std::array<double, 2>, 4> c = {m.Apply(in.x1, in.y1), m.Apply(in.x2, in.y1), m.Apply(in.x1, in.y2),
                                                    m.Apply(in.x2, in.y2)};
    double a1 = c[0][0], a2 = a1, b1 = c[0][1], b2 = b1;
    for (const auto& p : c) {
      a1 = std::min(a1, p[0]);
      a2 = std::max(a2, p[0]);
      b1 = std::min(b1, p[1]);
      b2 = std::max(b2, p[1]);
    }
    const double moved_area = (a2 - a1) * (b2 - b1);
    if (moved_area > 0 && (w * h) / moved_area < filter.min_visibility) return false;
  }
  *out = {static_cast<float>(x1), static_cast<float>(y1), static_cast<float>(x2), static_cast<float>(y2)};
  return true;
}

void WarpMaskNearest(const uint8_t* src, int src_width, int src_height, const Affine2D& map, uint8_t* dst,
                     int dst_width, int dst_height) {
  const Affine2D inv = map.Inverse();
  const auto& m = inv.m;
  if (m[1] == 0 && m[3] == 0) {
    // Axis-aligned (scales, crops, padding, flips): one source index per column and per row.
    thread_local std::vector<int> xs, ys;
    auto table = [](double scale, double offset, int n, int limit, std::vector<int>* out) {
      out->resize(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        const double f = std::floor(scale * (i + 0.5) + offset);
        (*out)[i] = (f >= 0 && f < limit) ? static_cast<int>(f) : -1;
      }
    };
    table(m[0], m[2], dst_width, src_width, &xs);
    table(m[4], m[5], dst_height, src_height, &ys);
    for (int y = 0; y < dst_height; ++y) {
      uint8_t* row = dst + static_cast<size_t>(y) * dst_width;
      if (ys[y] < 0) {
        std::memset(row, 0, static_cast<size_t>(dst_width));
        continue;
      }
      const uint8_t* in = src + static_cast<size_t>(ys[y]) * src_width;
      for (int x = 0; x < dst_width; ++x) row[x] = xs[x] < 0 ? 0 : in[xs[x]];
    }
    return;
  }
  for (int y = 0; y < dst_height; ++y) {
    uint8_t* row = dst + static_cast<size_t>(y) * dst_width;
    const double cy = y + 0.5;
    for (int x = 0; x < dst_width; ++x) {
      const double cx = x + 0.5;
      const double sx = m[0] * cx + m[1] * cy + m[2];
      const double sy = m[3] * cx + m[4] * cy + m[5];
      // Flips, crops and padding map centres to exact half-integers: no rounding question there.
      const double fx = std::floor(sx), fy = std::floor(sy);
      row[x] = (fx >= 0 && fy >= 0 && fx < src_width && fy < src_height)
                   ? src[static_cast<size_t>(fy) * src_width + static_cast<size_t>(fx)]
                   : 0;
    }
  }
}

namespace {

// PIL's NEAREST source index per output index along one axis (Image.resize -> ImagingScaleAffine:
// start at half a step, add the step in doubles, truncate).
void PilNearestTable(int in, int out, std::vector<int>* idx) {
  const double a = static_cast<double>(in) / out;
  double o = a * 0.5;
  idx->resize(static_cast<size_t>(out));
  for (int i = 0; i < out; ++i) {
    (*idx)[i] = std::clamp(static_cast<int>(o), 0, in - 1);
    o += a;
  }
}

// A map whose linear part only swaps and mirrors axes (entries -1, 0, 1): it sends pixel centres
// to pixel centres (for whole-pixel offsets), so floor sampling is exact.
bool IsUnitPermutation(const Affine2D& a) {
  const auto& m = a.m;
  auto unit = [](double v) { return v == 0 || v == 1 || v == -1; };
  return unit(m[0]) && unit(m[1]) && unit(m[3]) && unit(m[4]);
}

}  // namespace

void WarpMaskSteps(const uint8_t* src, const GeometryChain& chain, uint8_t* dst) {
  thread_local std::vector<uint8_t> a, b;
  thread_local std::vector<int> xs, ys;
  const auto& steps = chain.steps();
  const uint8_t* in = src;
  int w = chain.source_width(), h = chain.source_height();
  for (size_t i = 0; i < steps.size(); ++i) {
    const GeometryStep& s = steps[i];
    const bool last = i + 1 == steps.size();
    if (s.map == Affine2D{} && s.width == w && s.height == h && !last) continue;  // nothing to do
    std::vector<uint8_t>& buf = (in == a.data()) ? b : a;
    uint8_t* out = dst;
    if (!last) {
      buf.resize(static_cast<size_t>(s.width) * static_cast<size_t>(s.height));
      out = buf.data();
    }
    const auto& m = s.map.m;
    if (m[1] == 0 && m[3] == 0 && m[2] == 0 && m[5] == 0 && m[0] > 0 && m[4] > 0) {  // a resize
      PilNearestTable(w, s.width, &xs);
      PilNearestTable(h, s.height, &ys);
      for (int y = 0; y < s.height; ++y) {
        const uint8_t* row = in + static_cast<size_t>(ys[y]) * w;
        uint8_t* o = out + static_cast<size_t>(y) * s.width;
        for (int x = 0; x < s.width; ++x) o[x] = row[xs[x]];
      }
    } else if (IsUnitPermutation(s.map)) {  // flips, crops, padding, 90-degree turns: exact
      WarpMaskNearest(in, w, h, s.map, out, s.width, s.height);
    } else {  // rotate, affine, shears: PIL's Image.transform(AFFINE, NEAREST), fill 0
      WarpAffine(ImageView{const_cast<uint8_t*>(in), w, h, 1, static_cast<size_t>(w)},
                 ImageView{out, s.width, s.height, 1, static_cast<size_t>(s.width)}, s.map, WarpFilter::kNearest,
                 {0, 0, 0});
    }
    in = out;
    w = s.width;
    h = s.height;
  }
  if (in != dst) std::memcpy(dst, in, static_cast<size_t>(w) * static_cast<size_t>(h));  // no step at all
}

void FillPolygon(std::span<const float> xy, uint8_t value, uint8_t* mask, int width, int height) {
  const size_t n = xy.size() / 2;
  if (n < 3) return;
  std::vector<double> xs;
  for (int y = 0; y < height; ++y) {
    const double cy = y + 0.5;
    xs.clear();
    for (size_t i = 0; i < n; ++i) {
      const double ax = xy[2 * i], ay = xy[2 * i + 1];
      const size_t j = (i + 1) % n;
      const double bx = xy[2 * j], by = xy[2 * j + 1];
      if ((ay <= cy) != (by <= cy)) xs.push_back(ax + (cy - ay) * (bx - ax) / (by - ay));
    }
    std::sort(xs.begin(), xs.end());
    uint8_t* row = mask + static_cast<size_t>(y) * width;
    for (size_t k = 0; k + 1 < xs.size(); k += 2) {
      // pixels whose centre x + 0.5 lies in [xs[k], xs[k + 1])
      // (clamped in double first: a far-away vertex must not overflow the int)
      const int from = static_cast<int>(std::clamp(std::ceil(xs[k] - 0.5), 0.0, double(width)));
      const int to = static_cast<int>(std::clamp(std::ceil(xs[k + 1] - 0.5), 0.0, double(width)));
      for (int x = from; x < to; ++x) row[x] = value;
    }
  }
}

}  // namespace spdl::media
