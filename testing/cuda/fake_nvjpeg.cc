#include "cuda/fake_nvjpeg.h"

#include <cstring>
#include <string>

#include "media/image_decoder.h"
#include "media/image_ops.h"

namespace spdl::cuda {
namespace {

Status Nv(NvjpegStatus s, const char* call) { return NvjpegError(static_cast<int>(s), call); }

struct Sof {
  int marker = 0;  // 0xC0.. 0xCF
  JpegHeader header;
};

// The first SOF of a JPEG, as nvjpegGetImageInfo finds it.
Result<Sof> ReadSof(std::span<const uint8_t> d) {
  if (d.size() < 4 || d[0] != 0xFF || d[1] != 0xD8) return Nv(NvjpegStatus::kBadJpeg, "nvjpegGetImageInfo");
  size_t i = 2;
  while (i + 4 <= d.size()) {
    if (d[i] != 0xFF) return Nv(NvjpegStatus::kBadJpeg, "nvjpegGetImageInfo");
    const int m = d[i + 1];
    if (m == 0xFF) {
      ++i;
      continue;
    }
    const size_t len = (size_t{d[i + 2]} << 8) | d[i + 3];
    if (len < 2 || i + 2 + len > d.size()) return Nv(NvjpegStatus::kBadJpeg, "nvjpegGetImageInfo");
    if (m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC) {
      if (len < 8) return Nv(NvjpegStatus::kBadJpeg, "nvjpegGetImageInfo");
      Sof s;
      s.marker = m;
      s.header.height = (d[i + 5] << 8) | d[i + 6];
      s.header.width = (d[i + 7] << 8) | d[i + 8];
      s.header.components = d[i + 9];
      if (s.header.width == 0 || s.header.height == 0) return Nv(NvjpegStatus::kBadJpeg, "nvjpegGetImageInfo");
      // Lossless (SOF3, 7, 11, 15) and arithmetic coding (SOF9..): nvJPEG has neither.
      if (m == 0xC3 || m == 0xC7 || m >= 0xC9) return Nv(NvjpegStatus::kJpegNotSupported, "nvjpegGetImageInfo");
      return s;
    }
    if (m == 0xDA) break;
    i += 2 + len;
  }
  return Nv(NvjpegStatus::kBadJpeg, "nvjpegGetImageInfo");
}

}  // namespace

Result<JpegHeader> FakeNvjpeg::ReadHeader(std::span<const uint8_t> jpeg) {
  SPDL_ASSIGN_OR_RETURN(Sof s, ReadSof(jpeg));
  return s.header;
}

void FakeNvjpeg::FailNext(int nvjpeg_status) {
  std::lock_guard lock(mu_);
  fail_next_.push_back(nvjpeg_status);
}

int FakeNvjpeg::batches() const {
  std::lock_guard lock(mu_);
  return batches_;
}

int FakeNvjpeg::ones() const {
  std::lock_guard lock(mu_);
  return ones_;
}

Status FakeNvjpeg::DecodeLocked(std::span<const uint8_t> jpeg, const DeviceImage& out, Stream stream,
                                const char* call) {
  auto sof = ReadSof(jpeg);
  if (!sof.ok()) return sof.status();
  const JpegHeader& h = sof->header;
  if (sof->marker == 0xC2 || sof->marker == 0xC6) return Nv(NvjpegStatus::kJpegNotSupported, call);  // progressive
  if (h.components == 4) return Nv(NvjpegStatus::kJpegNotSupported, call);
  if (h.width > max_side_ || h.height > max_side_) return Nv(NvjpegStatus::kJpegNotSupported, call);
  if (out.width != h.width || out.height != h.height || out.pitch < size_t(h.width) * 3 || out.data == nullptr) {
    return Nv(NvjpegStatus::kInvalidParameter, call);
  }
  std::vector<uint8_t> pixels(out.pitch * static_cast<size_t>(h.height));
  media::ImageDecoder dec(media::JpegDecodePath::kRgb);
  media::ImageOps ops;  // the whole image, RGB, as stored
  if (!dec.DecodeJpegInto(jpeg, ops, pixels.data(), h.width, h.height, out.pitch).ok()) {
    return Nv(NvjpegStatus::kBadJpeg, call);
  }
  SPDL_RETURN_IF_ERROR(device_.MemcpyH2DAsync(out.data, pixels.data(), pixels.size(), stream));
  host_.push_back(std::move(pixels));
  return Status::Ok();
}

Status FakeNvjpeg::DecodeBatch(std::span<const std::span<const uint8_t>> jpegs, std::span<const DeviceImage> out,
                               Stream stream) {
  std::lock_guard lock(mu_);
  ++batches_;
  host_.clear();
  if (!fail_next_.empty()) {
    const int s = fail_next_.front();
    fail_next_.pop_front();
    return NvjpegError(s, "nvjpegDecodeBatched");
  }
  if (jpegs.size() != out.size() || jpegs.empty()) return Nv(NvjpegStatus::kInvalidParameter, "nvjpegDecodeBatched");
  // nvjpegDecodeBatched fails as a whole: check every image before any work is queued.
  for (const auto& j : jpegs) {
    auto sof = ReadSof(j);
    if (!sof.ok()) return sof.status().WithPrefix("nvjpegDecodeBatched");
    if (sof->marker == 0xC2 || sof->marker == 0xC6 || sof->header.components == 4 || sof->header.width > max_side_ ||
        sof->header.height > max_side_) {
      return Nv(NvjpegStatus::kJpegNotSupported, "nvjpegDecodeBatched");
    }
  }
  for (size_t i = 0; i < jpegs.size(); ++i)
    SPDL_RETURN_IF_ERROR(DecodeLocked(jpegs[i], out[i], stream, "nvjpegDecodeBatched"));
  return Status::Ok();
}

Status FakeNvjpeg::DecodeOne(std::span<const uint8_t> jpeg, const DeviceImage& out, Stream stream) {
  std::lock_guard lock(mu_);
  ++ones_;
  if (!fail_next_.empty()) {
    const int s = fail_next_.front();
    fail_next_.pop_front();
    return NvjpegError(s, "nvjpegDecode");
  }
  return DecodeLocked(jpeg, out, stream, "nvjpegDecode");
}

Status FakeImageKernels::ResizeInto(const DeviceImage& src, const imgmath::ResizePlan& plan,
                                    const imgmath::OutputSpec& o, void* dst, Stream stream) {
  std::lock_guard lock(mu_);
  ++launches_;
  src_.resize(src.pitch * static_cast<size_t>(src.height));
  SPDL_RETURN_IF_ERROR(device_.MemcpyD2HAsync(src_.data(), src.data, src_.size(), stream));
  size_t sample = o.dtype == imgmath::kOutF32 ? 4 : (o.dtype == imgmath::kOutU16Bits ? 2 : 1);
  std::vector<uint8_t> out(static_cast<size_t>(o.width) * o.height * o.channels * sample);
  imgmath::RunResizeOnHost(src_.data(), src.pitch, plan, o, out.data(), mid_);
  SPDL_RETURN_IF_ERROR(device_.MemcpyH2DAsync(dst, out.data(), out.size(), stream));
  if (out_.size() > 64) out_.erase(out_.begin());
  out_.push_back(std::move(out));
  return Status::Ok();
}

int FakeImageKernels::launches() const {
  std::lock_guard lock(mu_);
  return launches_;
}

}  // namespace spdl::cuda
