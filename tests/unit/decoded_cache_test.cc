// The job's cache of decoded, shrunk samples (jobs/decoded_cache.h): its budget logic (the job's
// max_bytes and the daemon's memory budget), the shrink size, the BMP it keeps, the source
// decorator over a real JPEG (decoded once, served from memory after), and the job config key.
#include "jobs/decoded_cache.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "config/job_config.h"
#include "jobs/memory_budget.h"
#include "media/image_decoder.h"
#include "media/image_format.h"
#include "media/jpeg_encoder.h"

namespace spdl {
namespace {

using jobs::DecodedCache;

std::vector<uint8_t> Bytes(size_t n, uint8_t v) { return std::vector<uint8_t>(n, v); }

// A source whose samples are given byte strings, counting its reads.
class BytesSource final : public io::SampleSource {
 public:
  explicit BytesSource(std::vector<std::vector<uint8_t>> samples) : samples_(std::move(samples)) {
    for (size_t i = 0; i < samples_.size(); ++i) refs_.push_back(io::SampleRef{"s" + std::to_string(i), 0});
  }
  uint64_t size() const override { return refs_.size(); }
  const io::SampleRef& sample(uint64_t index) const override { return refs_[index]; }
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override {
    if (index >= refs_.size()) return InvalidArgument("index out of range");
    reads.fetch_add(1);
    *out = samples_[index];
    return Status::Ok();
  }
  std::string Describe() const override { return "bytes"; }
  std::string Identity() const override { return "bytes /x"; }
  mutable std::atomic<int> reads{0};

 private:
  std::vector<std::vector<uint8_t>> samples_;
  std::vector<io::SampleRef> refs_;
};

// A w x h RGB gradient.
std::vector<uint8_t> Gradient(int w, int h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / w);
      p[1] = static_cast<uint8_t>(y * 255 / h);
      p[2] = static_cast<uint8_t>((x + y) & 0xff);
    }
  }
  return rgb;
}

TEST_CASE("decoded cache: the job's max_bytes bounds it and what does not fit is refused and counted") {
  constexpr uint64_t kOver = DecodedCache::kEntryOverhead;
  DecodedCache cache(3 * (1000 + kOver), nullptr);
  REQUIRE(cache.Insert(0, Bytes(1000, 1)));
  REQUIRE(cache.Insert(1, Bytes(1000, 2)));
  REQUIRE(cache.Insert(2, Bytes(1000, 3)));
  CHECK_FALSE(cache.Insert(3, Bytes(1000, 4)));  // full: not cached, nothing evicted
  CHECK_FALSE(cache.Insert(4, Bytes(1, 5)));
  CHECK_FALSE(cache.Insert(1, Bytes(10, 9)));  // already cached: kept as it is, not a refusal
  REQUIRE(cache.Lookup(1) != nullptr);
  CHECK(cache.Lookup(1)->bytes[0] == 2);
  CHECK(cache.Lookup(3) == nullptr);
  CHECK(cache.Lookup(4) == nullptr);
  const DecodedCache::Counters c = cache.counters();
  CHECK(c.samples == 3);
  CHECK(c.bytes == 3 * (1000 + kOver));
  CHECK(c.bytes <= c.max_bytes);
  CHECK(c.refused == 2);
  CHECK(c.hits == 2);
}

TEST_CASE("decoded cache: entries are charged to the memory budget, a quarter of it kept free, and return on exit") {
  constexpr uint64_t kOver = DecodedCache::kEntryOverhead;
  auto budget = std::make_shared<jobs::MemoryBudget>(4 * (1000 + kOver));
  {
    DecodedCache cache(1 << 20, budget);  // max_bytes far above the budget: the budget binds
    REQUIRE(cache.Insert(0, Bytes(1000, 1)));
    REQUIRE(cache.Insert(1, Bytes(1000, 1)));
    REQUIRE(cache.Insert(2, Bytes(1000, 1)));
    CHECK(budget->scratch_bytes() == 3 * (1000 + kOver));
    CHECK_FALSE(cache.Insert(3, Bytes(1000, 1)));  // would leave less than a quarter free
    CHECK(cache.counters().refused == 1);
    CHECK(cache.counters().samples == 3);
    // Slots admitted later shrink the room further: nothing more fits even when small.
    budget->SetSlotBytes(1000);
    CHECK_FALSE(cache.Insert(4, Bytes(10, 1)));
    CHECK(cache.counters().refused == 2);
    // The decode scratch reservation sees what the cache holds.
    CHECK_FALSE(budget->ReserveScratch(1000, "test image", std::chrono::milliseconds(0)).ok());
  }
  CHECK(budget->scratch_bytes() == 0);  // the job ended: its cache's memory is back
}

TEST_CASE("decoded cache: shrunk sizes keep the aspect and never enlarge") {
  int w = 0, h = 0;
  jobs::ShrunkSize(4000, 3000, 320, &w, &h);
  CHECK((w == 320 && h == 240));
  jobs::ShrunkSize(3000, 4000, 320, &w, &h);
  CHECK((w == 240 && h == 320));
  jobs::ShrunkSize(200, 100, 320, &w, &h);
  CHECK((w == 200 && h == 100));
  jobs::ShrunkSize(10000, 10, 320, &w, &h);
  CHECK((w == 320 && h == 1));  // at least one pixel
  jobs::ShrunkSize(321, 321, 320, &w, &h);
  CHECK((w == 320 && h == 320));
}

TEST_CASE("decoded cache: the kept BMP decodes back to exactly its pixels") {
  for (const auto& [w, h] : {std::pair{5, 3}, std::pair{64, 48}, std::pair{1, 1}, std::pair{7, 9}}) {
    const std::vector<uint8_t> rgb = Gradient(w, h);
    const std::vector<uint8_t> bmp = jobs::EncodeBmp24(rgb, w, h);
    CHECK(media::SniffImageFormat(bmp) == media::ImageFormat::kBmp);
    int rw = 0, rh = 0;
    REQUIRE(media::ReadImageSize(media::ImageFormat::kBmp, bmp, &rw, &rh).ok());
    CHECK((rw == w && rh == h));
    media::ImageDecoder decoder;
    media::ImageOps ops;  // no geometry: the image as stored
    std::vector<uint8_t> back(rgb.size());
    const Status s = decoder.DecodeRgbInto(bmp, ops, back.data(), w, h, static_cast<size_t>(w) * 3);
    INFO(w << "x" << h << ": " << s.message());
    REQUIRE(s.ok());
    CHECK(back == rgb);
  }
}

TEST_CASE("decoded cache: a JPEG is decoded and shrunk once, then served from memory") {
  const std::vector<uint8_t> rgb = Gradient(400, 300);
  auto jpeg = media::EncodeJpeg(rgb.data(), 400, 300);
  REQUIRE(jpeg.ok());
  const std::vector<uint8_t> garbage = Bytes(500, 7);
  auto inner = std::make_shared<BytesSource>(std::vector<std::vector<uint8_t>>{*jpeg, garbage});
  auto cache = std::make_shared<DecodedCache>(1 << 20, nullptr);
  config::DecodedCacheConfig dc;
  dc.max_side = 100;
  jobs::DecodedCacheSource source(inner, cache, dc, config::DecodeConfig{}, nullptr);

  std::vector<uint8_t> first;
  REQUIRE(source.Read(0, &first).ok());
  CHECK(media::SniffImageFormat(first) == media::ImageFormat::kBmp);
  int w = 0, h = 0;
  REQUIRE(media::ReadImageSize(media::ImageFormat::kBmp, first, &w, &h).ok());
  CHECK((w == 100 && h == 75));
  // The shrink is the decoder's area (box) resize of the JPEG.
  {
    media::ImageDecoder decoder;
    media::ImageOps ops;
    ops.resize_width = 100;
    ops.resize_height = 75;
    ops.interpolation = media::Interpolation::kArea;
    std::vector<uint8_t> want(100 * 75 * 3);
    REQUIRE(decoder.DecodeRgbInto(*jpeg, ops, want.data(), 100, 75, 300).ok());
    CHECK(first == jobs::EncodeBmp24(want, 100, 75));
  }
  CHECK(inner->reads == 1);
  CHECK(source.shrink_decodes() == 1);

  std::vector<uint8_t> again;
  REQUIRE(source.Read(0, &again).ok());
  CHECK(again == first);
  CHECK(inner->reads == 1);  // no file read and no decode
  CHECK(source.shrink_decodes() == 1);
  CHECK(cache->counters().hits == 1);

  // Bytes that do not decode pass through as read (the decode stage reports them) and are not cached.
  std::vector<uint8_t> bad;
  REQUIRE(source.Read(1, &bad).ok());
  CHECK(bad == garbage);
  REQUIRE(source.Read(1, &bad).ok());
  CHECK(inner->reads == 3);
  CHECK(cache->counters().samples == 1);
  CHECK(!source.Read(2, &bad).ok());  // out of range: the inner source's error
}

TEST_CASE("decoded cache: a gray image is kept as gray, a third of the memory, and served with its pixels unchanged") {
  const std::vector<uint8_t> rgb = Gradient(400, 300);
  auto gray_jpeg = media::EncodeJpeg(rgb.data(), 400, 300, 90, media::ChromaSubsampling::kGray);
  auto colour_jpeg = media::EncodeJpeg(rgb.data(), 400, 300);
  REQUIRE(gray_jpeg.ok());
  REQUIRE(colour_jpeg.ok());
  auto inner = std::make_shared<BytesSource>(std::vector<std::vector<uint8_t>>{*gray_jpeg, *colour_jpeg});
  auto cache = std::make_shared<DecodedCache>(1 << 20, nullptr);
  config::DecodedCacheConfig dc;
  dc.max_side = 100;
  jobs::DecodedCacheSource source(inner, cache, dc, config::DecodeConfig{}, nullptr);

  // What the decoder's own shrink gives (the pixels every read must hand on).
  media::ImageDecoder decoder;
  media::ImageOps ops;
  ops.resize_width = 100;
  ops.resize_height = 75;
  ops.interpolation = media::Interpolation::kArea;
  std::vector<uint8_t> want(100 * 75 * 3);
  REQUIRE(decoder.DecodeRgbInto(*gray_jpeg, ops, want.data(), 100, 75, 300).ok());
  for (size_t i = 0; i < want.size(); i += 3) REQUIRE((want[i] == want[i + 1] && want[i] == want[i + 2]));

  // The job's way: the read stage reads the file, the decode stage shrinks and caches it.
  std::vector<uint8_t> first;
  bool hit = true;
  REQUIRE(source.ReadCachedOrEncoded(0, &first, &hit).ok());
  CHECK_FALSE(hit);
  CHECK(first == *gray_jpeg);  // the read stage does no decoding
  CHECK(source.shrink_decodes() == 0);
  source.ShrinkAndCache(0, &first);
  CHECK(source.shrink_decodes() == 1);
  CHECK(first == jobs::EncodeBmp24(want, 100, 75));
  const uint64_t gray_bytes = cache->counters().bytes;
  CHECK(gray_bytes == 100 * 75 + DecodedCache::kEntryOverhead);  // one byte per pixel

  // Served from memory: expanded back to the very same BMP.
  std::vector<uint8_t> again;
  REQUIRE(source.ReadCachedOrEncoded(0, &again, &hit).ok());
  CHECK(hit);
  CHECK(again == first);
  CHECK(inner->reads == 1);
  std::vector<uint8_t> decoded(100 * 75 * 3);
  REQUIRE(decoder.DecodeRgbInto(again, media::ImageOps{}, decoded.data(), 100, 75, 300).ok());
  CHECK(decoded == want);

  // A colour image keeps its 24-bit BMP (three bytes per pixel, rows padded to 4).
  std::vector<uint8_t> colour;
  REQUIRE(source.Read(1, &colour).ok());
  CHECK(cache->counters().bytes - gray_bytes == colour.size() + DecodedCache::kEntryOverhead);
  CHECK(colour.size() == 54 + 100 * 75 * 3);
  std::vector<uint8_t> colour_again;
  REQUIRE(source.Read(1, &colour_again).ok());
  CHECK(colour_again == colour);
}

TEST_CASE("decoded cache: a gray BMP expands exactly to the RGB one") {
  for (const auto& [w, h] : {std::pair{5, 3}, std::pair{1, 1}, std::pair{7, 9}}) {
    std::vector<uint8_t> gray(static_cast<size_t>(w) * h);
    for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 37);
    std::vector<uint8_t> rgb;
    for (uint8_t g : gray) rgb.insert(rgb.end(), {g, g, g});
    CHECK(jobs::EncodeGrayAsBmp24(gray, w, h) == jobs::EncodeBmp24(rgb, w, h));
    auto back = jobs::GrayIfGray(rgb);
    REQUIRE(back.has_value());
    CHECK(*back == gray);
    rgb[1] ^= 1;  // one channel off: colour
    CHECK_FALSE(jobs::GrayIfGray(rgb).has_value());
  }
}

TEST_CASE("decoded cache: the job config key cache.decoded") {
  const std::string base =
      "source: {type: image_folder, root: /data}\n"
      "transforms:\n"
      "  - random_resized_crop: {size: 32}\n";
  auto ok = config::ParseJobConfig(base + "cache: {decoded: {max_side: 320, max_bytes: 67108864}}\n");
  REQUIRE(ok.config);
  CHECK(ok.config->cache.decoded.max_side == 320);
  CHECK(ok.config->cache.decoded.max_bytes == 67108864);
  auto def = config::ParseJobConfig(base + "cache: {decoded: {max_side: 64}}\n");
  REQUIRE(def.config);
  CHECK(def.config->cache.decoded.max_bytes == (int64_t{1} << 30));
  CHECK(config::ParseJobConfig(base).config->cache.decoded.max_side == 0);  // off unless asked

  auto first_error = [&](const std::string& yaml) {
    auto r = config::ParseJobConfig(yaml);
    REQUIRE_FALSE(r.config);
    return r.errors.front().path + ": " + r.errors.front().message;
  };
  CHECK_THAT(first_error(base + "cache: {decoded: {}}\n"), Catch::Contains("max_side"));
  CHECK_THAT(first_error(base + "cache: {decoded: {max_side: 8}}\n"), Catch::Contains("16"));
  CHECK_THAT(first_error(base + "cache: {decoded: {max_side: 64, size: 3}}\n"), Catch::Contains("size"));
  CHECK_THAT(first_error(base + "cache: {decodd: {max_side: 64}}\n"), Catch::Contains("decodd"));
  CHECK_THAT(first_error(base + "decode: {exif_orientation: true}\ncache: {decoded: {max_side: 64}}\n"),
             Catch::Contains("exif_orientation"));
  CHECK_THAT(first_error(base + "mask: {from: .png}\ncache: {decoded: {max_side: 64}}\n"), Catch::Contains("mask"));
}

}  // namespace
}  // namespace spdl
