#include "media/image_format.h"

#include <cstdint>
#include <cstring>
#include <string>

namespace spdl::media {
namespace {

constexpr uint32_t kMaxTiffEntries = 4096;
constexpr int kMaxJpegSegments = 256;
constexpr uint32_t kExifOrientationTag = 0x0112;

// Bounded reads from a byte span in one byte order. Each returns false (and sets nothing) past
// the end.
class Bytes {
 public:
  Bytes(std::span<const uint8_t> d, bool big_endian) : d_(d), be_(big_endian) {}

  bool Has(size_t at, size_t n) const { return at <= d_.size() && n <= d_.size() - at; }
  bool Equals(size_t at, const char* s) const {
    const size_t n = std::strlen(s);
    return Has(at, n) && std::memcmp(d_.data() + at, s, n) == 0;
  }
  bool U8(size_t at, uint32_t* v) const {
    if (!Has(at, 1)) return false;
    *v = d_[at];
    return true;
  }
  bool U16(size_t at, uint32_t* v) const {
    if (!Has(at, 2)) return false;
    const uint32_t a = d_[at], b = d_[at + 1];
    *v = be_ ? (a << 8) | b : a | (b << 8);
    return true;
  }
  bool U24(size_t at, uint32_t* v) const {
    if (!Has(at, 3)) return false;
    const uint32_t a = d_[at], b = d_[at + 1], c = d_[at + 2];
    *v = be_ ? (a << 16) | (b << 8) | c : a | (b << 8) | (c << 16);
    return true;
  }
  bool U32(size_t at, uint32_t* v) const {
    if (!Has(at, 4)) return false;
    const uint32_t a = d_[at], b = d_[at + 1], c = d_[at + 2], e = d_[at + 3];
    *v = be_ ? (a << 24) | (b << 16) | (c << 8) | e : a | (b << 8) | (c << 16) | (e << 24);
    return true;
  }

 private:
  std::span<const uint8_t> d_;
  bool be_;
};

Status Malformed(ImageFormat f) {
  return DataLoss(std::string(ImageFormatName(f)) + " header is cut short or malformed");
}

Status SetSize(ImageFormat f, uint64_t w, uint64_t h, int* width, int* height) {
  if (w == 0 || h == 0 || w > INT32_MAX || h > INT32_MAX) {
    return DataLoss(std::string(ImageFormatName(f)) + " header gives an impossible size " + std::to_string(w) + "x" +
                    std::to_string(h));
  }
  *width = static_cast<int>(w);
  *height = static_cast<int>(h);
  return Status::Ok();
}

// PNG: signature, then the IHDR chunk: length, "IHDR", width, height (big-endian).
Status PngSize(std::span<const uint8_t> data, int* w, int* h) {
  const Bytes b(data, true);
  uint32_t width, height;
  if (!b.Equals(12, "IHDR") || !b.U32(16, &width) || !b.U32(20, &height)) {
    return Malformed(ImageFormat::kPng);
  }
  return SetSize(ImageFormat::kPng, width, height, w, h);
}

// GIF: "GIF8?a", then the logical screen width and height (little-endian 16-bit). FFmpeg's
// decoder gives frames of the logical screen's size.
Status GifSize(std::span<const uint8_t> data, int* w, int* h) {
  const Bytes b(data, false);
  uint32_t width, height;
  if (!b.U16(6, &width) || !b.U16(8, &height)) return Malformed(ImageFormat::kGif);
  return SetSize(ImageFormat::kGif, width, height, w, h);
}

// BMP: a 14-byte file header, then the DIB header: its size, then the width and height (16-bit
// in the 12-byte OS/2 core header, signed 32-bit otherwise; negative height = top-down rows).
Status BmpSize(std::span<const uint8_t> data, int* w, int* h) {
  const Bytes b(data, false);
  uint32_t header_size, width, height;
  if (!b.U32(14, &header_size)) return Malformed(ImageFormat::kBmp);
  if (header_size == 12) {
    if (!b.U16(18, &width) || !b.U16(20, &height)) return Malformed(ImageFormat::kBmp);
    return SetSize(ImageFormat::kBmp, width, height, w, h);
  }
  if (header_size < 16 || !b.U32(18, &width) || !b.U32(22, &height)) {
    return Malformed(ImageFormat::kBmp);
  }
  const int64_t sw = static_cast<int32_t>(width), sh = static_cast<int32_t>(height);
  return SetSize(ImageFormat::kBmp, sw < 0 ? 0 : sw, sh < 0 ? -sh : sh, w, h);
}

// One entry of a TIFF directory as an unsigned integer: a SHORT or LONG held in the entry itself.
bool TiffValue(const Bytes& b, size_t entry, uint32_t* value) {
  uint32_t type, count;
  if (!b.U16(entry + 2, &type) || !b.U32(entry + 4, &count) || count != 1) return false;
  if (type == 3) return b.U16(entry + 8, value);  // SHORT
  if (type == 4) return b.U32(entry + 8, value);  // LONG
  return false;
}

// TIFF: byte order, 42, the first directory's offset; the directory: a count of 12-byte entries
// (tag, type, count, value). ImageWidth is tag 256, ImageLength 257.
Status TiffSize(std::span<const uint8_t> data, int* w, int* h) {
  const Bytes b(data, data[0] == 'M');
  uint32_t ifd, entries;
  if (!b.U32(4, &ifd) || !b.U16(ifd, &entries) || entries > kMaxTiffEntries) {
    return Malformed(ImageFormat::kTiff);
  }
  uint32_t width = 0, height = 0;
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t entry = ifd + 2 + size_t{12} * i;
    uint32_t tag;
    if (!b.U16(entry, &tag)) return Malformed(ImageFormat::kTiff);
    if (tag == 256 && !TiffValue(b, entry, &width)) return Malformed(ImageFormat::kTiff);
    if (tag == 257 && !TiffValue(b, entry, &height)) return Malformed(ImageFormat::kTiff);
  }
  return SetSize(ImageFormat::kTiff, width, height, w, h);
}

// WebP: "RIFF" <size> "WEBP", then the first chunk:
//   "VP8 " (lossy): a 3-byte frame tag, the start code 9D 01 2A, 14-bit width and height;
//   "VP8L" (lossless): 0x2F, then 14 bits of width - 1 and 14 of height - 1;
//   "VP8X" (extended): flags (bit 1: animation), 3 reserved bytes, 24-bit canvas width - 1 and
//   height - 1.
Status WebpSize(std::span<const uint8_t> data, int* w, int* h) {
  const Bytes b(data, false);
  uint32_t width, height;
  if (b.Equals(12, "VP8 ")) {
    uint32_t c0, c1, c2;
    if (!b.U8(23, &c0) || !b.U8(24, &c1) || !b.U8(25, &c2) || c0 != 0x9D || c1 != 0x01 || c2 != 0x2A ||
        !b.U16(26, &width) || !b.U16(28, &height)) {
      return Malformed(ImageFormat::kWebp);
    }
    return SetSize(ImageFormat::kWebp, width & 0x3FFF, height & 0x3FFF, w, h);
  }
  if (b.Equals(12, "VP8L")) {
    uint32_t sig, bits;
    if (!b.U8(20, &sig) || sig != 0x2F || !b.U32(21, &bits)) return Malformed(ImageFormat::kWebp);
    return SetSize(ImageFormat::kWebp, (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, w, h);
  }
  if (b.Equals(12, "VP8X")) {
    uint32_t flags;
    if (!b.U8(20, &flags) || !b.U24(24, &width) || !b.U24(27, &height)) {
      return Malformed(ImageFormat::kWebp);
    }
    if (flags & 0x02) return DataLoss("animated WebP is not supported");
    return SetSize(ImageFormat::kWebp, uint64_t{width} + 1, uint64_t{height} + 1, w, h);
  }
  return Malformed(ImageFormat::kWebp);
}

// The Orientation tag of the TIFF structure inside an Exif segment, or 1.
int ExifOrientation(std::span<const uint8_t> tiff) {
  if (tiff.size() < 8) return 1;
  bool big_endian;
  if (tiff[0] == 'I' && tiff[1] == 'I') {
    big_endian = false;
  } else if (tiff[0] == 'M' && tiff[1] == 'M') {
    big_endian = true;
  } else {
    return 1;
  }
  const Bytes b(tiff, big_endian);
  uint32_t magic, ifd, entries;
  if (!b.U16(2, &magic) || magic != 42 || !b.U32(4, &ifd) || !b.U16(ifd, &entries) || entries > kMaxTiffEntries) {
    return 1;
  }
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t entry = ifd + 2 + size_t{12} * i;
    uint32_t tag, value;
    if (!b.U16(entry, &tag)) return 1;
    if (tag != kExifOrientationTag) continue;
    if (!TiffValue(b, entry, &value) || value < 1 || value > 8) return 1;
    return static_cast<int>(value);
  }
  return 1;
}

}  // namespace

const char* ImageFormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kUnknown:
      break;
  }
  return "unknown";
}

ImageFormat SniffImageFormat(std::span<const uint8_t> data) {
  const Bytes b(data, false);
  auto starts = [&](std::initializer_list<uint8_t> sig) {
    if (!b.Has(0, sig.size())) return false;
    return std::memcmp(data.data(), sig.begin(), sig.size()) == 0;
  };
  if (starts({0xFF, 0xD8, 0xFF})) return ImageFormat::kJpeg;
  if (starts({0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A})) return ImageFormat::kPng;
  if (b.Equals(0, "GIF87a") || b.Equals(0, "GIF89a")) return ImageFormat::kGif;
  if (starts({'I', 'I', 0x2A, 0x00}) || starts({'M', 'M', 0x00, 0x2A})) return ImageFormat::kTiff;
  if (b.Equals(0, "RIFF") && b.Equals(8, "WEBP")) return ImageFormat::kWebp;
  // Last: two letters are a weak signature; a BMP file header also has its size and a reserved
  // zero word, but writers disagree on both, so only the DIB header size is checked.
  if (b.Equals(0, "BM")) {
    uint32_t dib = 0;
    if (b.U32(14, &dib) &&
        (dib == 12 || dib == 16 || dib == 40 || dib == 52 || dib == 56 || dib == 64 || dib == 108 || dib == 124)) {
      return ImageFormat::kBmp;
    }
  }
  return ImageFormat::kUnknown;
}

Status ReadImageSize(ImageFormat format, std::span<const uint8_t> data, int* width, int* height) {
  switch (format) {
    case ImageFormat::kPng:
      return PngSize(data, width, height);
    case ImageFormat::kGif:
      return GifSize(data, width, height);
    case ImageFormat::kBmp:
      return BmpSize(data, width, height);
    case ImageFormat::kTiff:
      return TiffSize(data, width, height);
    case ImageFormat::kWebp:
      return WebpSize(data, width, height);
    case ImageFormat::kJpeg:
    case ImageFormat::kUnknown:
      break;
  }
  return InvalidArgument(std::string("ReadImageSize does not read ") + ImageFormatName(format) + " headers");
}

Status CheckGifFirstImage(std::span<const uint8_t> gif) {
  const Bytes b(gif, false);
  Status cut = DataLoss("GIF is cut short before the end of its first image");
  // Skips data sub-blocks (a length byte, then that many bytes) up to the zero-length one.
  auto skip_sub_blocks = [&](size_t at, size_t* end) {
    uint32_t n;
    while (b.U8(at, &n)) {
      if (n == 0) {
        *end = at + 1;
        return true;
      }
      at += 1 + n;
    }
    return false;
  };
  uint32_t flags;
  if (!b.U8(10, &flags)) return cut;
  size_t at = 13 + ((flags & 0x80) ? 3 * (size_t{2} << (flags & 7)) : 0);  // + global palette
  for (;;) {
    uint32_t block;
    if (!b.U8(at, &block)) return cut;
    if (block == 0x21) {  // extension: label, then sub-blocks
      if (!skip_sub_blocks(at + 2, &at)) return cut;
    } else if (block == 0x2C) {  // image: descriptor, local palette, LZW code size, sub-blocks
      uint32_t image_flags;
      if (!b.U8(at + 9, &image_flags)) return cut;
      at += 10 + ((image_flags & 0x80) ? 3 * (size_t{2} << (image_flags & 7)) : 0) + 1;
      size_t end;
      return skip_sub_blocks(at, &end) ? Status::Ok() : cut;
    } else if (block == 0x3B) {
      return DataLoss("GIF has no image");
    } else {
      return DataLoss("GIF is malformed (block type " + std::to_string(block) + ")");
    }
  }
}

int ReadJpegExifOrientation(std::span<const uint8_t> jpeg) {
  const Bytes b(jpeg, true);
  size_t at = 2;  // after SOI
  for (int segment = 0; segment < kMaxJpegSegments; ++segment) {
    uint32_t ff, marker;
    if (!b.U8(at, &ff) || ff != 0xFF) return 1;
    // Fill bytes: any number of 0xFF before the marker code.
    do {
      if (!b.U8(++at, &marker)) return 1;
    } while (marker == 0xFF);
    ++at;
    if (marker == 0xDA || marker == 0xD9) return 1;                      // start of scan, end of image
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;  // no length
    uint32_t length;
    if (!b.U16(at, &length) || length < 2 || !b.Has(at, length)) return 1;
    if (marker == 0xE1 && length >= 8 && b.Equals(at + 2, "Exif") && jpeg[at + 6] == 0 && jpeg[at + 7] == 0) {
      return ExifOrientation(jpeg.subspan(at + 8, length - 8));
    }
    at += length;
  }
  return 1;
}

}  // namespace spdl::media
