#include "media/jpeg_window.h"

// clang-format off
#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first
#include <jpeglib.h>
// clang-format on

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace spdl::media {
namespace {

// The most scans a progressive JPEG may have (TurboJPEG's TJFLAG_LIMITSCANS: a cheap guard against
// inputs that make libjpeg do quadratic work).
constexpr int kMaxScans = 500;
// Slack after the pixels: swscale's SIMD readers may read a few bytes past a row's end.
constexpr size_t kSlack = 256;
// Rows handed to jpeg_read_scanlines per call.
constexpr int kRowsPerRead = 16;

// libjpeg's error manager, extended with the jump back into the call that set it up and the
// message of the error (or warning) that ended the decode.
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

struct Progress {
  jpeg_progress_mgr pub;
};

[[noreturn]] void Fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void ErrorExit(j_common_ptr cinfo) { Fail(cinfo); }

// Warnings (level < 0) are errors; trace messages (level >= 0) are ignored.
void EmitMessage(j_common_ptr cinfo, int level) {
  if (level < 0) Fail(cinfo);
}

void ProgressMonitor(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number > kMaxScans) {
    auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
    std::snprintf(err->message, sizeof(err->message), "progressive JPEG has more than %d scans", kMaxScans);
    std::longjmp(err->jump, 1);
  }
}

// The functions below call setjmp: nothing in them has a destructor, and every libjpeg call that
// may fail runs inside them. Each returns true on success, false after a libjpeg error (message in
// err->message).

bool ReadHeader(jpeg_decompress_struct* cinfo, ErrorManager* err, const uint8_t* data, unsigned long size) {
  if (setjmp(err->jump) != 0) return false;
  jpeg_mem_src(cinfo, data, size);
  jpeg_read_header(cinfo, TRUE);
  return true;
}

bool Start(jpeg_decompress_struct* cinfo, ErrorManager* err, int scale_denom, J_COLOR_SPACE out_space) {
  if (setjmp(err->jump) != 0) return false;
  cinfo->scale_num = 1;
  cinfo->scale_denom = static_cast<unsigned int>(scale_denom);
  cinfo->out_color_space = out_space;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->do_fancy_upsampling = TRUE;
  jpeg_start_decompress(cinfo);
  return true;
}

bool Crop(jpeg_decompress_struct* cinfo, ErrorManager* err, JDIMENSION* xoffset, JDIMENSION* width) {
  if (setjmp(err->jump) != 0) return false;
  if (*width < cinfo->output_width) jpeg_crop_scanline(cinfo, xoffset, width);
  return true;
}

// Skips to row y0, reads rows [y0, y1) into buf, then stops: jpeg_finish_decompress when the last
// row was read (the rest of the file is read to its end, as a full decode does), else
// jpeg_abort_decompress (the rows below are never decoded).
bool ReadRows(jpeg_decompress_struct* cinfo, ErrorManager* err, JDIMENSION y0, JDIMENSION y1, uint8_t* buf,
              size_t stride) {
  if (setjmp(err->jump) != 0) return false;
  if (y0 > 0 && jpeg_skip_scanlines(cinfo, y0) != y0) {
    std::snprintf(err->message, sizeof(err->message), "JPEG: could not skip to row %u", y0);
    return false;
  }
  JSAMPROW rows[kRowsPerRead];
  while (cinfo->output_scanline < y1) {
    const JDIMENSION at = cinfo->output_scanline;
    const JDIMENSION n = std::min<JDIMENSION>(kRowsPerRead, y1 - at);
    for (JDIMENSION i = 0; i < n; ++i) rows[i] = buf + (at - y0 + i) * stride;
    if (jpeg_read_scanlines(cinfo, rows, n) == 0) {
      std::snprintf(err->message, sizeof(err->message), "JPEG: no data for row %u", at);
      return false;
    }
  }
  if (cinfo->output_scanline == cinfo->output_height) {
    jpeg_finish_decompress(cinfo);
  } else {
    jpeg_abort_decompress(cinfo);
  }
  return true;
}

// Whether the JPEG's marker structure reaches an end-of-image marker: walks the marker segments
// from SOI by their lengths and each scan's entropy-coded data to its next marker (a 0xFF not
// followed by a stuffed 0x00 or a restart marker). A memchr-speed pass over the bytes, without
// decoding: it tells a file cut short (or missing its EOI) when the window decode stops before the
// end. Bytes after the EOI are allowed, as libjpeg ignores them.
bool ReachesEndOfImage(std::span<const uint8_t> d) {
  size_t pos = 2;  // after SOI (checked by jpeg_read_header)
  while (pos < d.size()) {
    if (d[pos] != 0xFF) return false;
    while (pos < d.size() && d[pos] == 0xFF) ++pos;  // fill bytes
    if (pos >= d.size()) return false;
    const uint8_t m = d[pos++];
    if (m == 0xD9) return true;
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) continue;  // no length
    if (pos + 2 > d.size()) return false;
    const size_t len = (size_t{d[pos]} << 8) | d[pos + 1];
    if (len < 2) return false;
    pos += len;
    if (m != 0xDA) continue;
    // Entropy-coded data up to the next real marker.
    while (true) {
      if (pos >= d.size()) return false;
      const void* ff = std::memchr(d.data() + pos, 0xFF, d.size() - pos);
      if (ff == nullptr) return false;
      pos = static_cast<size_t>(static_cast<const uint8_t*>(ff) - d.data());
      size_t next = pos + 1;
      while (next < d.size() && d[next] == 0xFF) ++next;
      if (next >= d.size()) return false;
      if (d[next] == 0x00 || (d[next] >= 0xD0 && d[next] <= 0xD7)) {
        pos = next + 1;
        continue;
      }
      break;  // a marker: pos at its first 0xFF
    }
  }
  return false;
}

}  // namespace

struct JpegWindowDecoder::State {
  State() = default;
  State(const State&) = delete;
  State& operator=(const State&) = delete;
  ~State() { Destroy(); }

  // Calls setjmp: no locals with destructors. False when libjpeg could not allocate its object.
  bool Create() {
    if (created) return true;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = ErrorExit;
    err.pub.emit_message = EmitMessage;
    err.message[0] = '\0';
    if (setjmp(err.jump) != 0) return false;
    jpeg_create_decompress(&cinfo);
    progress.pub.progress_monitor = ProgressMonitor;
    cinfo.progress = &progress.pub;
    created = true;
    return true;
  }
  void Destroy() {
    if (!created) return;
    jpeg_destroy_decompress(&cinfo);
    created = false;
  }
  // After an error libjpeg's object is dropped and made anew for the next image.
  Status Error(const char* what) {
    Status s = DataLoss(std::string(what) + ": " + err.message);
    Destroy();
    return s;
  }

  jpeg_decompress_struct cinfo{};
  ErrorManager err{};
  Progress progress{};
  bool created = false;
  std::vector<uint8_t> buffer;
};

JpegWindowDecoder::JpegWindowDecoder() : state_(std::make_unique<State>()) {}
JpegWindowDecoder::~JpegWindowDecoder() = default;
JpegWindowDecoder::JpegWindowDecoder(JpegWindowDecoder&&) noexcept = default;
JpegWindowDecoder& JpegWindowDecoder::operator=(JpegWindowDecoder&&) noexcept = default;

void JpegWindowDecoder::Trim(size_t max_bytes) {
  if (state_->buffer.size() > max_bytes) std::vector<uint8_t>().swap(state_->buffer);
}

Status JpegWindowDecoder::Decode(std::span<const uint8_t> jpeg, const JpegWindowRequest& request, int64_t max_pixels,
                                 JpegWindowImage* out) {
  const int k = request.scale_denom;
  if (k != 1 && k != 2 && k != 4 && k != 8) {
    return InvalidArgument("JPEG window: scale 1/" + std::to_string(k) + " (1, 1/2, 1/4 or 1/8 only)");
  }
  if (jpeg.empty()) return DataLoss("not a JPEG: no data");
  State& s = *state_;
  // A fresh libjpeg object per image: a reused one keeps the last image's quantization and Huffman
  // tables (libjpeg's abbreviated streams), so a JPEG without its own would decode with another
  // file's tables, and the result would depend on what the worker decoded before (image_fuzz,
  // corpus/image/regress_jpeg_tables_of_the_previous_image). About 10 us.
  s.Destroy();
  if (!s.Create()) return Internal(std::string("JPEG decompressor: ") + s.err.message);
  jpeg_decompress_struct* cinfo = &s.cinfo;
  if (!ReadHeader(cinfo, &s.err, jpeg.data(), static_cast<unsigned long>(jpeg.size()))) {
    return s.Error("not a decodable JPEG");
  }
  const int64_t pixels = int64_t{cinfo->image_width} * cinfo->image_height;
  if (pixels > max_pixels) {
    jpeg_abort_decompress(cinfo);
    return ResourceExhausted("image " + std::to_string(cinfo->image_width) + "x" + std::to_string(cinfo->image_height) +
                             " has " + std::to_string(pixels) + " pixels, over the limit of " +
                             std::to_string(max_pixels));
  }
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  const bool gray = request.gray && !cmyk;
  const J_COLOR_SPACE space = gray ? JCS_GRAYSCALE : cmyk ? JCS_CMYK : JCS_RGB;
  if (!Start(cinfo, &s.err, k, space)) return s.Error("JPEG decode failed");
  const int w = static_cast<int>(cinfo->output_width), h = static_cast<int>(cinfo->output_height);
  const int x0 = std::max(request.x0, 0), x1 = std::min(request.x1, w);
  const int y0 = std::max(request.y0, 0), y1 = std::min(request.y1, h);
  if (x0 >= x1 || y0 >= y1) {
    jpeg_abort_decompress(cinfo);
    return InvalidArgument("JPEG window [" + std::to_string(request.x0) + ", " + std::to_string(request.x1) + ") x [" +
                           std::to_string(request.y0) + ", " + std::to_string(request.y1) + ") is empty inside the " +
                           std::to_string(w) + "x" + std::to_string(h) + " image");
  }
  // The margin gives the upsampler real neighbours around the window.
  const int dx0 = std::max(x0 - kJpegWindowMargin, 0), dx1 = std::min(x1 + kJpegWindowMargin, w);
  const int dy0 = std::max(y0 - kJpegWindowMargin, 0), dy1 = std::min(y1 + kJpegWindowMargin, h);
  auto xoffset = static_cast<JDIMENSION>(dx0);
  auto width = static_cast<JDIMENSION>(dx1 - dx0);
  if (!Crop(cinfo, &s.err, &xoffset, &width)) return s.Error("JPEG crop failed");
  const int in_channels = cinfo->output_components;
  const size_t stride = static_cast<size_t>(width) * in_channels;
  const size_t rows = static_cast<size_t>(dy1 - dy0);
  if (s.buffer.size() < stride * rows + kSlack) s.buffer.resize(stride * rows + kSlack);
  uint8_t* buf = s.buffer.data();
  if (!ReadRows(cinfo, &s.err, static_cast<JDIMENSION>(dy0), static_cast<JDIMENSION>(dy1), buf, stride)) {
    return s.Error("JPEG decode failed");
  }
  // Stopped before the last row: the rest was not decoded, but a file cut short is still refused.
  if (dy1 < h && !ReachesEndOfImage(jpeg)) {
    return DataLoss("JPEG decode failed: Premature end of JPEG file (no end-of-image marker after the scan data)");
  }
  if (cmyk) {
    // Adobe's inverted CMYK to RGB, row by row in place (the RGB output never overtakes the input).
    for (size_t r = 0; r < rows; ++r) {
      uint8_t* px = buf + r * stride;
      for (JDIMENSION i = 0; i < width; ++i) {
        const unsigned c = px[4 * i], m = px[4 * i + 1], y = px[4 * i + 2], kk = px[4 * i + 3];
        px[3 * i] = static_cast<uint8_t>((c * kk + 127) / 255);
        px[3 * i + 1] = static_cast<uint8_t>((m * kk + 127) / 255);
        px[3 * i + 2] = static_cast<uint8_t>((y * kk + 127) / 255);
      }
    }
  }
  out->data = buf;
  out->stride = stride;
  out->x = static_cast<int>(xoffset);
  out->y = dy0;
  out->width = static_cast<int>(width);
  out->height = dy1 - dy0;
  out->channels = gray ? 1 : 3;
  out->image_width = w;
  out->image_height = h;
  return Status::Ok();
}

}  // namespace spdl::media
