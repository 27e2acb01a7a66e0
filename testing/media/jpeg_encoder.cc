#include "media/jpeg_encoder.h"

// clang-format off
#include <csetjmp>
#include <cstdio>
#include <jpeglib.h>
// clang-format on

#include <cstdlib>
#include <string>

#include "datagen/jpeg_writer.h"

namespace spdl::media {
namespace {

datagen::Subsampling ToWriter(ChromaSubsampling s) {
  switch (s) {
    case ChromaSubsampling::k444:
      return datagen::Subsampling::k444;
    case ChromaSubsampling::k422:
      return datagen::Subsampling::k422;
    case ChromaSubsampling::k420:
      return datagen::Subsampling::k420;
    case ChromaSubsampling::kGray:
      return datagen::Subsampling::kGray;
  }
  return datagen::Subsampling::k420;
}

}  // namespace

Result<std::vector<uint8_t>> EncodeJpeg(const uint8_t* rgb, int width, int height, int quality,
                                        ChromaSubsampling subsampling) {
  return datagen::CompressJpeg(rgb, width, height, quality, ToWriter(subsampling));
}

namespace {

struct EncodeError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void EncodeFail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<EncodeError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Calls setjmp: no locals with destructors. *out / *size: jpeg_mem_dest's malloc'ed buffer.
bool Compress(jpeg_compress_struct* cinfo, EncodeError* err, const uint8_t* rgb, int width, int height,
              const JpegEncodeOptions* o, unsigned char** out, unsigned long* size) {
  if (setjmp(err->jump) != 0) return false;
  jpeg_create_compress(cinfo);
  jpeg_mem_dest(cinfo, out, size);
  cinfo->image_width = static_cast<JDIMENSION>(width);
  cinfo->image_height = static_cast<JDIMENSION>(height);
  cinfo->input_components = 3;
  cinfo->in_color_space = JCS_RGB;
  jpeg_set_defaults(cinfo);
  jpeg_set_quality(cinfo, o->quality, TRUE);
  if (o->subsampling == ChromaSubsampling::kGray) {
    jpeg_set_colorspace(cinfo, JCS_GRAYSCALE);
  } else {
    const int h = o->subsampling == ChromaSubsampling::k444 || o->vertical_only ? 1 : 2;
    const int v = o->subsampling == ChromaSubsampling::k420 || o->vertical_only ? 2 : 1;
    cinfo->comp_info[0].h_samp_factor = h;
    cinfo->comp_info[0].v_samp_factor = v;
    for (int c = 1; c < 3; ++c) cinfo->comp_info[c].h_samp_factor = cinfo->comp_info[c].v_samp_factor = 1;
  }
  if (o->progressive) jpeg_simple_progression(cinfo);
  cinfo->restart_interval = static_cast<unsigned int>(o->restart_interval);
  jpeg_start_compress(cinfo, TRUE);
  while (cinfo->next_scanline < cinfo->image_height) {
    auto row = const_cast<JSAMPROW>(rgb + static_cast<size_t>(cinfo->next_scanline) * width * 3);
    jpeg_write_scanlines(cinfo, &row, 1);
  }
  jpeg_finish_compress(cinfo);
  return true;
}

}  // namespace

Result<std::vector<uint8_t>> EncodeJpegWith(const uint8_t* rgb, int width, int height,
                                            const JpegEncodeOptions& options) {
  if (rgb == nullptr || width <= 0 || height <= 0) {
    return InvalidArgument("EncodeJpegWith: bad image " + std::to_string(width) + "x" + std::to_string(height));
  }
  if (options.quality < 1 || options.quality > 100 || options.restart_interval < 0) {
    return InvalidArgument("EncodeJpegWith: quality outside [1, 100] or a negative restart interval");
  }
  jpeg_compress_struct cinfo{};
  EncodeError err{};
  cinfo.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = EncodeFail;
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const bool ok = Compress(&cinfo, &err, rgb, width, height, &options, &buf, &size);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out;
  if (ok) out.assign(buf, buf + size);
  std::free(buf);
  if (!ok) return Internal(std::string("libjpeg: ") + err.message);
  return out;
}

}  // namespace spdl::media
