// DecodedCache and DecodedCacheSource: a job's opt-in cross-epoch cache of decoded, pre-shrunk
// samples (job config cache: {decoded: {max_side, max_bytes}}).
//
// The first time the job reads a sample, DecodedCacheSource reads its encoded bytes from the inner
// source, decodes them (any image format the decoder reads) and shrinks the image so that its
// longer side is at most max_side (aspect kept; PIL's box filter, i.e. area averaging, through the
// decoder's exact resampler; a smaller image keeps its size), and hands on, in place of the file,
// an uncompressed 24-bit BMP of that image — which it also keeps in the DecodedCache (a gray image,
// one whose every pixel has R = G = B, is kept as its gray bytes, a third of the memory, and
// expanded back to the same BMP when served: the pixels are unchanged). Every later
// read of the sample (the next epochs) is served from memory: no file read and no JPEG decode; the
// decode stage decodes the BMP (a copy and a channel swap) and runs the job's transforms on it. So
// the transforms see the shrunk image: a random crop of a 4000 px photo is resampled from at most
// max_side px. Alpha is dropped or composited as decode.alpha says before shrinking; 16-bit
// sources become 8-bit.
//
// Budget: an entry is charged its bytes plus kEntryOverhead, both to the job's cap (max_bytes) and
// to the daemon's memory budget (MemoryBudget::TryReserve, keeping a quarter of the budget free for
// slots and decode scratch); a sample that does not fit in either is simply not cached (counted
// as refused) and is decoded again next epoch. Entries are never evicted: with a shuffled order
// every sample comes back once per epoch, so replacing one cached sample by another gains nothing.
// The cache lives as long as the job; its memory returns to the budget when the job ends.
//
// A sample whose bytes do not decode is handed on unchanged (the decode stage then fails it with
// the decoder's own error, and on_error applies as without the cache); it is not cached, so the
// next epoch tries again.
//
// In a job the work is split between the stages: the read stage (the I/O pool) serves hits and
// reads a miss's encoded bytes (ReadCachedOrEncoded); the decode stage (the worker pool) shrinks and
// caches a miss (ShrinkAndCache) before decoding the BMP, so decoding never runs on I/O threads.
// Read does both at once for other callers.
//
// Thread safety: DecodedCache is safe to share between threads (one mutex; a payload is shared
// read-only, copied out after the lock is released). DecodedCacheSource is a SampleSource: Read may
// run concurrently on any thread (each thread keeps its own image decoder). Two threads that miss
// the same sample at once both decode it; the second insert is dropped.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "config/job_config.h"
#include "io/sample_source.h"
#include "jobs/memory_budget.h"

namespace spdl::jobs {

class DecodedCache {
 public:
  // Charged per entry on top of its bytes (map node, control block, bookkeeping).
  static constexpr uint64_t kEntryOverhead = 128;

  struct Counters {
    uint64_t samples = 0;    // entries held now
    uint64_t bytes = 0;      // charged bytes held now (payloads + overhead); <= max_bytes
    uint64_t max_bytes = 0;  // the job's cap
    uint64_t hits = 0;       // lookups served (decodes avoided)
    uint64_t refused = 0;    // inserts that did not fit (max_bytes or the memory budget)
  };

  // REQUIRES: max_bytes > 0. `budget` may be null (then only max_bytes bounds the cache).
  DecodedCache(uint64_t max_bytes, std::shared_ptr<MemoryBudget> budget);
  DecodedCache(const DecodedCache&) = delete;
  DecodedCache& operator=(const DecodedCache&) = delete;

  // What is kept for a sample: the bytes handed on (a BMP), or a gray image's pixels.
  struct Image {
    std::vector<uint8_t> bytes;
    int gray_width = 0;  // > 0: `bytes` are gray_width x gray_height gray pixels, row by row
    int gray_height = 0;
  };

  // The image cached for sample `index` (counted as a hit), or nullptr.
  std::shared_ptr<const Image> Lookup(uint64_t index);

  // Caches `bytes` for sample `index` unless it is already cached. Returns false and caches nothing
  // (counted as refused) when the charge would pass max_bytes or the memory budget has no room
  // (a quarter of it kept free); false without counting when `index` is already cached.
  bool Insert(uint64_t index, std::vector<uint8_t> bytes) { return Insert(index, Image{std::move(bytes)}); }
  // The same for an image of any kind; charged its bytes (a gray one: width x height).
  bool Insert(uint64_t index, Image image);

  Counters counters() const;

 private:
  struct Entry {
    std::shared_ptr<const Image> image;
    MemoryBudget::Lease lease;
    uint64_t charge = 0;
  };

  // Constant after construction.
  const uint64_t max_bytes_;
  const std::shared_ptr<MemoryBudget> budget_;

  mutable std::mutex mu_;
  // Guarded by mu_.
  std::unordered_map<uint64_t, Entry> entries_;
  uint64_t bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t refused_ = 0;
};

// The longer side a max_side shrink gives a width x height image, as (width, height): unchanged
// when both sides are at most max_side, else the longer side becomes max_side and the shorter one
// round(shorter * max_side / longer), at least 1. REQUIRES: width, height, max_side >= 1.
void ShrunkSize(int width, int height, int max_side, int* out_width, int* out_height);

// An uncompressed 24-bit BMP (top-down rows, BGR, rows padded to 4 bytes) of a packed RGB image.
// REQUIRES: rgb holds width * height * 3 bytes; width, height >= 1.
std::vector<uint8_t> EncodeBmp24(std::span<const uint8_t> rgb, int width, int height);
// The same BMP for a gray image (each pixel's byte as B, G and R): equal to EncodeBmp24 of the RGB
// image with R = G = B = the gray byte. REQUIRES: gray holds width * height bytes; width, height >= 1.
std::vector<uint8_t> EncodeGrayAsBmp24(std::span<const uint8_t> gray, int width, int height);
// The gray bytes of a packed RGB image whose every pixel has R = G = B, or nullopt (some pixel has
// colour). REQUIRES: rgb holds a multiple of 3 bytes.
std::optional<std::vector<uint8_t>> GrayIfGray(std::span<const uint8_t> rgb);

class DecodedCacheSource final : public io::SampleSource {
 public:
  // REQUIRES: inner != nullptr, cache != nullptr, config.max_side >= 1. `decode` gives the alpha
  // handling and max_pixels of the shrinking decode; `budget` (may be null) accounts the decode's
  // scratch for a large image, as the decode stage does.
  DecodedCacheSource(std::shared_ptr<const io::SampleSource> inner, std::shared_ptr<DecodedCache> cache,
                     const config::DecodedCacheConfig& config, const config::DecodeConfig& decode,
                     std::shared_ptr<MemoryBudget> budget);

  uint64_t size() const override { return inner_->size(); }
  const io::SampleRef& sample(uint64_t index) const override { return inner_->sample(index); }
  // A hit copies the cached image (as a BMP) into *out. A miss reads the inner source, shrinks the
  // image into a BMP in *out and caches it; bytes that do not decode are passed on as read (not
  // cached). ReadCachedOrEncoded + ShrinkAndCache on one thread.
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  // The read stage's half: a hit copies the cached image (as a BMP) into *out and sets *hit; a
  // miss reads the inner source's bytes into *out as they are, *hit = false (errors: the inner
  // source's). REQUIRES: hit != nullptr.
  Status ReadCachedOrEncoded(uint64_t index, std::vector<uint8_t>* out, bool* hit) const;
  // The decode stage's half, for a miss: replaces the encoded bytes in *bytes by the shrunk BMP and
  // caches it; bytes that do not decode are left as they are and not cached.
  void ShrinkAndCache(uint64_t index, std::vector<uint8_t>* bytes) const;
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override {
    return inner_->ReadSidecar(index, extension, out);
  }
  std::string Describe() const override { return inner_->Describe(); }
  std::string Identity() const override { return inner_->Identity(); }
  std::vector<uint64_t> ShardSizes() const override { return inner_->ShardSizes(); }
  std::vector<std::string> ClassNames() const override { return inner_->ClassNames(); }
  const std::vector<io::ObjectAnnotation>* Objects(uint64_t index) const override { return inner_->Objects(index); }

  const DecodedCache& cache() const { return *cache_; }
  // Samples decoded and shrunk by this source (misses whose bytes decoded).
  uint64_t shrink_decodes() const { return shrink_decodes_.load(std::memory_order_relaxed); }

 private:
  // Decodes `encoded` and writes the shrunk image to *out: its BMP, or (a gray image) its gray
  // bytes with the size set.
  Status Shrink(std::span<const uint8_t> encoded, DecodedCache::Image* out) const;

  // Constant after construction.
  const std::shared_ptr<const io::SampleSource> inner_;
  const std::shared_ptr<DecodedCache> cache_;
  const int max_side_;
  const config::DecodeConfig decode_;
  const std::shared_ptr<MemoryBudget> budget_;

  mutable std::atomic<uint64_t> shrink_decodes_{0};
};

}  // namespace spdl::jobs
