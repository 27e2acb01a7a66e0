// Which image format a buffer holds, told by its magic bytes (never by the file name), and the
// image size its header gives, read without decoding any pixels (the decompression-bomb guard
// runs on it).
//
// Pure functions over the caller's bytes: safe from any thread. The header readers are bounded:
// they read at most the first few hundred bytes (TIFF: one directory of at most 4096 entries)
// and check every offset against the buffer's size.
#pragma once

#include <cstdint>
#include <span>

#include "common/status.h"

namespace spdl::media {

enum class ImageFormat { kUnknown, kJpeg, kPng, kGif, kBmp, kTiff, kWebp };

// "JPEG", "PNG", "GIF", "BMP", "TIFF", "WebP", or "unknown".
const char* ImageFormatName(ImageFormat format);

// The format whose signature `data` starts with:
//   JPEG FF D8 FF; PNG 89 'PNG' 0D 0A 1A 0A; GIF 'GIF87a' / 'GIF89a'; BMP 'BM';
//   TIFF 'II' 2A 00 / 'MM' 00 2A (classic TIFF); WebP 'RIFF' <size> 'WEBP'.
ImageFormat SniffImageFormat(std::span<const uint8_t> data);

// The size stored in the header of a PNG (IHDR), GIF (logical screen), BMP (info header; a
// negative, top-down, height counts as its magnitude), TIFF (ImageWidth / ImageLength of the first
// directory) or WebP (VP8, VP8L or VP8X canvas). kDataLoss when the header is cut short,
// malformed, or gives a zero size; kDataLoss for an animated WebP (not supported);
// kInvalidArgument for JPEG and kUnknown (JPEG headers are read by the JPEG decoder).
Status ReadImageSize(ImageFormat format, std::span<const uint8_t> data, int* width, int* height);

// Checks that a GIF's first image is all there: walks the blocks up to the end of the first
// image's data sub-blocks. kDataLoss when the file ends first (FFmpeg's GIF decoder shows a cut
// image without an error, with its missing part as background) or the structure is malformed.
Status CheckGifFirstImage(std::span<const uint8_t> gif);

// The EXIF Orientation tag (1..8) of a JPEG: the APP1 "Exif" segment's first directory, tag
// 0x0112. Returns 1 (upright) when there is none or the segment is malformed. Reads only the
// markers before the first scan.
int ReadJpegExifOrientation(std::span<const uint8_t> jpeg);

}  // namespace spdl::media
