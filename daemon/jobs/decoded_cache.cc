#include "jobs/decoded_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "jobs/sample_decoder.h"
#include "media/image_decoder.h"
#include "media/image_format.h"
#include "media/image_ops.h"

namespace spdl::jobs {

DecodedCache::DecodedCache(uint64_t max_bytes, std::shared_ptr<MemoryBudget> budget)
    : max_bytes_(max_bytes), budget_(std::move(budget)) {}

std::shared_ptr<const std::vector<uint8_t>> DecodedCache::Lookup(uint64_t index) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(index);
  if (it == entries_.end()) return nullptr;
  ++hits_;
  return it->second.bytes;
}

bool DecodedCache::Insert(uint64_t index, std::vector<uint8_t> bytes) {
  const uint64_t charge = bytes.size() + kEntryOverhead;
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
  entry.bytes = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
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

std::vector<uint8_t> EncodeBmp24(std::span<const uint8_t> rgb, int width, int height) {
  const uint32_t row = (static_cast<uint32_t>(width) * 3 + 3) & ~3u;
  const uint32_t pixels_bytes = row * static_cast<uint32_t>(height);
  const uint32_t header = 14 + 40;
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
  for (int y = 0; y < height; ++y) {
    const uint8_t* src = rgb.data() + static_cast<size_t>(y) * width * 3;
    uint8_t* dst = out.data() + header + static_cast<size_t>(y) * row;
    for (int x = 0; x < width; ++x) {
      dst[3 * x + 0] = src[3 * x + 2];
      dst[3 * x + 1] = src[3 * x + 1];
      dst[3 * x + 2] = src[3 * x + 0];
    }
  }
  return out;
}

DecodedCacheSource::DecodedCacheSource(std::shared_ptr<const io::SampleSource> inner,
                                       std::shared_ptr<DecodedCache> cache, const config::DecodedCacheConfig& config,
                                       const config::DecodeConfig& decode, std::shared_ptr<MemoryBudget> budget)
    : inner_(std::move(inner)),
      cache_(std::move(cache)),
      max_side_(config.max_side),
      decode_(decode),
      budget_(std::move(budget)) {}

Status DecodedCacheSource::Shrink(std::span<const uint8_t> encoded, std::vector<uint8_t>* out) const {
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
  *out = EncodeBmp24(rgb, out_w, out_h);
  return Status::Ok();
}

Status DecodedCacheSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= inner_->size()) return inner_->Read(index, out);  // the inner source's error
  if (auto hit = cache_->Lookup(index)) {
    out->assign(hit->begin(), hit->end());
    return Status::Ok();
  }
  std::vector<uint8_t> encoded;
  SPDL_RETURN_IF_ERROR(inner_->Read(index, &encoded));
  std::vector<uint8_t> shrunk;
  if (!Shrink(encoded, &shrunk).ok()) {
    *out = std::move(encoded);  // the decode stage fails it with the decoder's own error
    return Status::Ok();
  }
  shrink_decodes_.fetch_add(1, std::memory_order_relaxed);
  *out = shrunk;
  cache_->Insert(index, std::move(shrunk));
  return Status::Ok();
}

}  // namespace spdl::jobs
