#include "jobs/decoded_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "jobs/sample_decoder.h"
#include "media/image_decoder.h"
#include "media/image_format.h"
#include "media/image_ops.h"

namespace spdl::jobs {

DecodedCache::DecodedCache(uint64_t max_bytes, std::shared_ptr<MemoryBudget> budget)
    : max_bytes_(max_bytes), budget_(std::move(budget)) {}

std::shared_ptr<const DecodedCache::Image> DecodedCache::Lookup(uint64_t index) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(index);
  if (it == entries_.end()) return nullptr;
  ++hits_;
  return it->second.image;
}

bool DecodedCache::Insert(uint64_t index, Image image) {
  const uint64_t charge = image.bytes.size() + kEntryOverhead;
  std::lock_guard lock(mu_);
  if (entries_.count(index) != 0) return false;
  if (bytes_ + charge > max_bytes_) {
    ++refused_;
    return false;
  }
  Entry entry;
  if (budget_) {
    Result<MemoryBudget::Lease> lease = budget_->TryReserve(charge, budget_->limit() / 4);
    if (!lease.ok()) {
      ++refused_;
      return false;
    }
    entry.lease = std::move(lease).value();
  }
  entry.image = std::make_shared<const Image>(std::move(image));
  entry.charge = charge;
  entries_.emplace(index, std::move(entry));
  bytes_ += charge;
  return true;
}

DecodedCache::Counters DecodedCache::counters() const {
  std::lock_guard lock(mu_);
  Counters c;
  c.samples = entries_.size();
  c.bytes = bytes_;
  c.max_bytes = max_bytes_;
  c.hits = hits_;
  c.refused = refused_;
  return c;
}

void ShrunkSize(int width, int height, int max_side, int* out_width, int* out_height) {
  const int longer = std::max(width, height);
  if (longer <= max_side) {
    *out_width = width;
    *out_height = height;
    return;
  }
  auto scale = [&](int side) {
    if (side == longer) return max_side;
    const long v = std::lround(static_cast<double>(side) * max_side / longer);
    return static_cast<int>(std::max(1L, v));
  };
  *out_width = scale(width);
  *out_height = scale(height);
}

namespace {

constexpr uint32_t kBmpHeader = 14 + 40;

size_t BmpRowBytes(int width) { return (static_cast<size_t>(width) * 3 + 3) & ~size_t{3}; }

// A zeroed 24-bit BMP of width x height with its header written.
std::vector<uint8_t> Bmp24Header(int width, int height) {
  const auto row = static_cast<uint32_t>(BmpRowBytes(width));
  const uint32_t pixels_bytes = row * static_cast<uint32_t>(height);
  const uint32_t header = kBmpHeader;
  std::vector<uint8_t> out(header + pixels_bytes, 0);
  auto put16 = [&](size_t at, uint16_t v) { std::memcpy(out.data() + at, &v, 2); };  // little-endian host
  auto put32 = [&](size_t at, uint32_t v) { std::memcpy(out.data() + at, &v, 4); };
  out[0] = 'B';
  out[1] = 'M';
  put32(2, header + pixels_bytes);  // file size
  put32(10, header);                // pixel data offset
  put32(14, 40);                    // BITMAPINFOHEADER
  put32(18, static_cast<uint32_t>(width));
  put32(22, static_cast<uint32_t>(-height));  // negative: rows top-down
  put16(26, 1);                               // planes
  put16(28, 24);                              // bits per pixel
  put32(30, 0);                               // BI_RGB
  put32(34, pixels_bytes);
  put32(38, 2835);  // 72 dpi
  put32(42, 2835);
  return out;
}

}  // namespace

std::vector<uint8_t> EncodeBmp24(std::span<const uint8_t> rgb, int width, int height) {
  std::vector<uint8_t> out = Bmp24Header(width, height);
  const size_t row = BmpRowBytes(width);
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = rgb.data() + static_cast<size_t>(y) * width * 3;
    uint8_t* dst = out.data() + kBmpHeader + static_cast<size_t>(y) * row;
    for (int x = 0; x < width; ++x) {
      dst[3 * x + 0] = src[3 * x + 2];
      dst[3 * x + 1] = src[3 * x + 1];
      dst[3 * x + 2] = src[3 * x + 0];
    }
  }
  return out;
}

std::vector<uint8_t> EncodeGrayAsBmp24(std::span<const uint8_t> gray, int width, int height) {
  std::vector<uint8_t> out = Bmp24Header(width, height);
  const size_t row = BmpRowBytes(width);
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = gray.data() + static_cast<size_t>(y) * width;
    uint8_t* dst = out.data() + kBmpHeader + static_cast<size_t>(y) * row;
    for (int x = 0; x < width; ++x) dst[3 * x + 0] = dst[3 * x + 1] = dst[3 * x + 2] = src[x];
  }
  return out;
}

std::optional<std::vector<uint8_t>> GrayIfGray(std::span<const uint8_t> rgb) {
  const size_t n = rgb.size() / 3;
  for (size_t i = 0; i < n; ++i) {
    if (rgb[3 * i] != rgb[3 * i + 1] || rgb[3 * i] != rgb[3 * i + 2]) return std::nullopt;
  }
  std::vector<uint8_t> gray(n);
  for (size_t i = 0; i < n; ++i) gray[i] = rgb[3 * i];
  return gray;
}

DecodedCacheSource::DecodedCacheSource(std::shared_ptr<const io::SampleSource> inner,
                                       std::shared_ptr<DecodedCache> cache, const config::DecodedCacheConfig& config,
                                       const config::DecodeConfig& decode, std::shared_ptr<MemoryBudget> budget)
    : inner_(std::move(inner)),
      cache_(std::move(cache)),
      max_side_(config.max_side),
      decode_(decode),
      budget_(std::move(budget)) {}

Status DecodedCacheSource::Shrink(std::span<const uint8_t> encoded, DecodedCache::Image* out) const {
  thread_local media::ImageDecoder decoder;  // not thread-safe: one per reading thread
  const media::ImageFormat format = media::SniffImageFormat(encoded);
  int width = 0, height = 0;
  if (format == media::ImageFormat::kJpeg) {
    media::ImageInfo info;
    SPDL_RETURN_IF_ERROR(decoder.ReadJpegHeader(encoded, &info));
    width = info.width;
    height = info.height;
  } else {
    SPDL_RETURN_IF_ERROR(media::ReadImageSize(format, encoded, &width, &height));
  }
  if (width < 1 || height < 1) return DataLoss("no image size in the header");
  if (static_cast<int64_t>(width) * height > decode_.max_pixels) {
    return ResourceExhausted("over max_pixels");  // the decode stage reports it with its own message
  }
  int out_w = 0, out_h = 0;
  ShrunkSize(width, height, max_side_, &out_w, &out_h);

  media::ImageOps ops;
  ops.resize_width = out_w;
  ops.resize_height = out_h;
  ops.interpolation = media::Interpolation::kArea;
  ops.resample = media::Resample::kExact;
  ops.channels = 3;
  ops.max_pixels = decode_.max_pixels;
  ops.alpha = decode_.alpha == config::AlphaMode::kComposite ? media::AlphaMode::kComposite : media::AlphaMode::kDrop;
  for (int i = 0; i < 3; ++i) ops.background[i] = static_cast<uint8_t>(decode_.background[i]);

  SPDL_ASSIGN_OR_RETURN(MemoryBudget::Lease scratch, ReserveDecodeScratch(budget_.get(), encoded, ops.max_pixels));
  // Not thread_local: a large max_side would leave a large buffer behind on every reading thread.
  std::vector<uint8_t> rgb(static_cast<size_t>(out_w) * out_h * 3);
  SPDL_RETURN_IF_ERROR(decoder.DecodeRgbInto(encoded, ops, rgb.data(), out_w, out_h, static_cast<size_t>(out_w) * 3));
  if (std::optional<std::vector<uint8_t>> gray = GrayIfGray(rgb)) {
    *out = DecodedCache::Image{std::move(*gray), out_w, out_h};
  } else {
    *out = DecodedCache::Image{EncodeBmp24(rgb, out_w, out_h)};
  }
  return Status::Ok();
}

namespace {

// The BMP a cached image is handed on as.
void CopyOut(const DecodedCache::Image& image, std::vector<uint8_t>* out) {
  if (image.gray_width > 0) {
    *out = EncodeGrayAsBmp24(image.bytes, image.gray_width, image.gray_height);
  } else {
    out->assign(image.bytes.begin(), image.bytes.end());
  }
}

}  // namespace

Status DecodedCacheSource::ReadCachedOrEncoded(uint64_t index, std::vector<uint8_t>* out, bool* hit) const {
  *hit = false;
  if (index < inner_->size()) {
    if (auto image = cache_->Lookup(index)) {
      CopyOut(*image, out);
      *hit = true;
      return Status::Ok();
    }
  }
  return inner_->Read(index, out);  // out of range: the inner source's error
}

void DecodedCacheSource::ShrinkAndCache(uint64_t index, std::vector<uint8_t>* bytes) const {
  DecodedCache::Image image;
  if (!Shrink(*bytes, &image).ok()) return;  // the decode stage fails it with the decoder's own error
  shrink_decodes_.fetch_add(1, std::memory_order_relaxed);
  CopyOut(image, bytes);
  cache_->Insert(index, std::move(image));
}

Status DecodedCacheSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  bool hit = false;
  SPDL_RETURN_IF_ERROR(ReadCachedOrEncoded(index, out, &hit));
  if (!hit) ShrinkAndCache(index, out);
  return Status::Ok();
}

}  // namespace spdl::jobs
