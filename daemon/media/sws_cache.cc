#include "media/sws_cache.h"

#include <algorithm>
#include <utility>

namespace spdl::media {
namespace {

// YUV and gray formats carry a range (full or limited); RGB and palette formats do not.
bool IsYuvOrGray(AVPixelFormat f) {
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(f);
  return d != nullptr && !(d->flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL));
}

SwsContextPtr Build(const SwsKey& k) {
  SwsContextPtr c(sws_alloc_context());
  if (!c) return c;
  // JPEG stores full-range BT.601 YCbCr (swscale's default matrix); the range is said explicitly
  // instead of using the deprecated YUVJ formats. The destination is always full range (RGB, or
  // gray / YUV for the test encoders).
  const bool yuv = IsYuvOrGray(k.src_format);
  const std::pair<const char*, int64_t> options[] = {
      {"srcw", k.src_width},
      {"srch", k.src_height},
      {"src_format", k.src_format},
      {"dstw", k.dst_width},
      {"dsth", k.dst_height},
      {"dst_format", k.dst_format},
      {"sws_flags", k.flags},
      {"src_range", yuv && k.src_full_range ? 1 : 0},
      {"dst_range", 1},
      {"src_h_chr_pos", k.src_h_chroma_pos},
      {"src_v_chr_pos", k.src_v_chroma_pos},
  };
  for (const auto& [name, value] : options) {
    if (av_opt_set_int(c.get(), name, value, 0) < 0) return nullptr;
  }
  if (sws_init_context(c.get(), nullptr, nullptr) < 0) return nullptr;
  if (yuv && k.src_colorspace != SwsKey::kDefaultColorspace) {
    int *inv_table = nullptr, *table = nullptr;
    int src_range = 0, dst_range = 0, brightness = 0, contrast = 0, saturation = 0;
    if (sws_getColorspaceDetails(c.get(), &inv_table, &src_range, &table, &dst_range, &brightness, &contrast,
                                 &saturation) < 0 ||
        sws_setColorspaceDetails(c.get(), sws_getCoefficients(k.src_colorspace), src_range, table, dst_range,
                                 brightness, contrast, saturation) < 0) {
      return nullptr;
    }
  }
  return c;
}

}  // namespace

SwsContext* SwsCache::Get(const SwsKey& key) {
  ++clock_;
  for (Entry& e : entries_) {
    if (e.key == key) {
      e.last_use = clock_;
      return e.context.get();
    }
  }
  SwsContextPtr built = Build(key);
  if (!built) return nullptr;
  ++builds_;
  if (entries_.size() >= capacity_) {
    auto lru = std::min_element(entries_.begin(), entries_.end(),
                                [](const Entry& a, const Entry& b) { return a.last_use < b.last_use; });
    entries_.erase(lru);
  }
  entries_.push_back(Entry{key, clock_, std::move(built)});
  return entries_.back().context.get();
}

}  // namespace spdl::media
