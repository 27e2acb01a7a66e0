// SwsCache: a small least-recently-used cache of swscale contexts, keyed by everything that
// shapes one (sizes, pixel formats, flags, source range). Building a context costs ~0.07 ms,
// about a tenth of a JPEG decode, so a worker keeps the few it used last.
//
// Internal to media/. Not thread-safe: each ImageDecoder (one per worker thread) owns one.
#pragma once

extern "C" {
#include <libavutil/opt.h>
#include <libavutil/pixdesc.h>
#include <libavutil/pixfmt.h>
#include <libswscale/swscale.h>
}

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace spdl::media {

// Frees a SwsContext; used by the owning pointer below.
struct SwsContextDeleter {
  void operator()(SwsContext* c) const noexcept { sws_freeContext(c); }
};
using SwsContextPtr = std::unique_ptr<SwsContext, SwsContextDeleter>;

struct SwsKey {
  int src_width = 0;
  int src_height = 0;
  AVPixelFormat src_format = AV_PIX_FMT_NONE;
  int dst_width = 0;
  int dst_height = 0;
  AVPixelFormat dst_format = AV_PIX_FMT_NONE;
  int flags = 0;
  // YUV and gray sources only: full range (JPEG's BT.601, PNG gray; true), or limited range
  // (false: most video, lossy WebP).
  bool src_full_range = true;
  // YUV sources only: where chroma sample 0 sits relative to luma sample 0, in 1/256 of a luma
  // pixel (swscale's src_h_chr_pos / src_v_chr_pos); kDefaultChromaPos lets swscale use the
  // centred siting JPEG uses. A window that starts mid chroma pair sets these.
  static constexpr int kDefaultChromaPos = -513;
  int src_h_chroma_pos = kDefaultChromaPos;
  int src_v_chroma_pos = kDefaultChromaPos;
  // YUV sources only: the YCbCr -> RGB matrix, as an AVColorSpace value (AVCOL_SPC_BT709, ...,
  // the same numbers as swscale's SWS_CS_*); kDefaultColorspace keeps swscale's BT.601, which
  // JPEG uses. Video frames set it from their colour tags.
  static constexpr int kDefaultColorspace = -1;
  int src_colorspace = kDefaultColorspace;

  bool operator==(const SwsKey&) const = default;
};

class SwsCache {
 public:
  // REQUIRES: capacity >= 1.
  explicit SwsCache(size_t capacity = 16) : capacity_(capacity) {}
  SwsCache(SwsCache&&) noexcept = default;
  SwsCache& operator=(SwsCache&&) noexcept = default;
  SwsCache(const SwsCache&) = delete;
  SwsCache& operator=(const SwsCache&) = delete;

  // Returns the context for key, building it on a miss and evicting the least recently used
  // one when full; nullptr when swscale refuses the parameters. The pointer stays valid until
  // the next Get() or the cache's destruction.
  SwsContext* Get(const SwsKey& key);

  size_t size() const { return entries_.size(); }
  // Contexts built so far (misses), for tests and stats.
  uint64_t builds() const { return builds_; }

 private:
  struct Entry {
    SwsKey key;
    uint64_t last_use = 0;
    SwsContextPtr context;
  };

  size_t capacity_;
  uint64_t clock_ = 0;
  uint64_t builds_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace spdl::media
