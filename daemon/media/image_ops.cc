#include "media/image_ops.h"

#include <algorithm>
#include <string>
#include <vector>

namespace spdl::media {
namespace {

// Python's int(round(d / 2.0)) for an integer d >= 0: half-way cases go to the even neighbour.
int HalfRoundEven(int d) {
  int q = d / 2;
  if ((d & 1) && (q & 1)) ++q;
  return q;
}

// One axis of torchvision's CenterCrop applied to a line of `size` pixels: which part survives
// and where it lands.
void CropAxis(int size, int crop, int* keep_start, int* keep_len, int* dst_start) {
  if (crop <= 0) {  // no crop on this axis
    *keep_start = 0;
    *keep_len = size;
    *dst_start = 0;
  } else if (crop <= size) {
    *keep_start = HalfRoundEven(size - crop);
    *keep_len = crop;
    *dst_start = 0;
  } else {  // pad (crop - size) // 2 before; the crop offset into the padded line is then 0
    *keep_start = 0;
    *keep_len = size;
    *dst_start = (crop - size) / 2;
  }
}

}  // namespace

Status ValidateImageOps(const ImageOps& ops) {
  std::vector<std::string> errors;
  if (ops.resize_shorter < 0) errors.push_back("resize_shorter < 0");
  if (ops.resize_height < 0 || ops.resize_width < 0) errors.push_back("resize size < 0");
  if ((ops.resize_height > 0) != (ops.resize_width > 0)) {
    errors.push_back("resize_height and resize_width must be set together");
  }
  if (ops.crop_height < 0 || ops.crop_width < 0) errors.push_back("crop size < 0");
  if ((ops.crop_height > 0) != (ops.crop_width > 0)) {
    errors.push_back("crop_height and crop_width must be set together");
  }
  if (ops.max_pixels <= 0) errors.push_back("max_pixels <= 0");
  if (errors.empty()) return Status::Ok();
  std::string msg = "bad image ops:";
  for (const std::string& e : errors) msg += " " + e + ";";
  msg.pop_back();
  return InvalidArgument(msg);
}

ResizeCropPlan PlanResizeCrop(const ImageOps& ops, int src_width, int src_height) {
  ResizeCropPlan p;
  if (ops.resize_height > 0 && ops.resize_width > 0) {
    p.resized_width = ops.resize_width;
    p.resized_height = ops.resize_height;
  } else if (ops.resize_shorter > 0) {
    // torchvision: new_short = S, new_long = int(S * long / short). Integer division gives the
    // same floor as Python's float division for any realistic size.
    const int64_t s = ops.resize_shorter;
    if (src_width <= src_height) {
      p.resized_width = static_cast<int>(s);
      p.resized_height = static_cast<int>(s * src_height / src_width);
    } else {
      p.resized_height = static_cast<int>(s);
      p.resized_width = static_cast<int>(s * src_width / src_height);
    }
  } else {
    p.resized_width = src_width;
    p.resized_height = src_height;
  }
  const bool crop = ops.crop_height > 0 && ops.crop_width > 0;
  CropAxis(p.resized_width, crop ? ops.crop_width : 0, &p.keep_x, &p.keep_width, &p.dst_x);
  CropAxis(p.resized_height, crop ? ops.crop_height : 0, &p.keep_y, &p.keep_height, &p.dst_y);
  p.out_width = crop ? ops.crop_width : p.resized_width;
  p.out_height = crop ? ops.crop_height : p.resized_height;
  return p;
}

void OutputSize(const ImageOps& ops, int src_width, int src_height, int* out_width,
                int* out_height) {
  const ResizeCropPlan p = PlanResizeCrop(ops, src_width, src_height);
  *out_width = p.out_width;
  *out_height = p.out_height;
}

}  // namespace spdl::media
