#include "config/job_config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

#include "common/ascii.h"
#include "config/daemon_config.h"
#include "config/yaml_reader.h"

namespace spdl::config {
namespace {

using internal::Diagnostics;
using internal::Field;
using internal::MapReader;
using internal::Present;

constexpr int64_t kMaxImageSide = 16384;
constexpr int64_t kMaxPixelsLimit = int64_t{1} << 40;
constexpr const char* kNeedFixedSize =
    "transforms must produce a fixed image size (end with center_crop or resize {height, width})";
constexpr const char* kTransformNames =
    "resize, center_crop, random_resized_crop, horizontal_flip, normalize, op, or an augmentation (color_jitter, "
    "grayscale, gaussian_blur, posterize, solarize, equalize, autocontrast, sharpness, invert, rand_augment, "
    "trivial_augment_wide, auto_augment, vertical_flip, rotate, affine, random_crop, random_erasing)";
constexpr size_t kMaxUserOps = 16;
constexpr size_t kMaxOpArgsBytes = 64 * 1024;
constexpr int kMaxOpArgsDepth = 32;

// "cuda" or "cuda:N".
bool IsCudaDevice(const std::string& device) {
  if (device == "cuda") return true;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5) return false;
  return std::all_of(device.begin() + 5, device.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A number written as an integer or a decimal; nullopt (with an error) when it is anything else,
// or not finite.
std::optional<double> ReadNumber(Diagnostics& diag, const Field& f) {
  if (!Present(f)) return std::nullopt;
  if (f.node.IsScalar()) {
    const std::string& s = f.node.Scalar();
    double value = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty()) {
      if (std::isfinite(value)) return value;
      diag.Error(f, "expected a finite number, got " + internal::Describe(f.node));
      return std::nullopt;
    }
  }
  diag.Error(f, "expected a number, got " + internal::Describe(f.node));
  return std::nullopt;
}

// A list of exactly n numbers.
std::optional<std::vector<double>> ReadNumbers(Diagnostics& diag, const Field& f, size_t n) {
  if (!Present(f)) return std::nullopt;
  if (!f.node.IsSequence() || f.node.size() != n) {
    diag.Error(f, "expected a list of " + std::to_string(n) + " numbers, got " +
                      (f.node.IsSequence() ? "a list of " + std::to_string(f.node.size()) + " item(s)"
                                           : internal::Describe(f.node)));
    return std::nullopt;
  }
  std::optional<std::vector<Field>> items = internal::ReadList(diag, f);
  if (!items) return std::nullopt;
  std::vector<double> out;
  for (const Field& item : *items) {
    std::optional<double> v = ReadNumber(diag, item);
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  return out;
}

std::string FormatNumber(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// A size: an integer S (S x S) or [height, width], each 1..kMaxImageSide.
std::optional<std::pair<int, int>> ReadSize(Diagnostics& diag, const Field& size) {
  if (!Present(size)) return std::nullopt;
  if (size.node.IsSequence()) {
    std::optional<std::vector<Field>> items = internal::ReadList(diag, size);
    if (items && items->size() == 2) {
      auto h = internal::ReadInt(diag, (*items)[0], 1, kMaxImageSide);
      auto w = internal::ReadInt(diag, (*items)[1], 1, kMaxImageSide);
      if (h && w) return std::pair{static_cast<int>(*h), static_cast<int>(*w)};
    } else {
      diag.Error(size, "expected an integer or [height, width], got a list of " + std::to_string(size.node.size()) +
                           " item(s)");
    }
  } else if (size.node.IsScalar()) {
    if (auto s = internal::ReadInt(diag, size, 1, kMaxImageSide)) {
      return std::pair{static_cast<int>(*s), static_cast<int>(*s)};
    }
  } else {
    diag.Error(size, "expected an integer or [height, width], got " + internal::Describe(size.node));
  }
  return std::nullopt;
}

std::optional<Interpolation> ReadInterpolation(Diagnostics& diag, const Field& f) {
  return internal::ReadChoice<Interpolation>(diag, f,
                                             {{"bilinear", Interpolation::kBilinear},
                                              {"bicubic", Interpolation::kBicubic},
                                              {"area", Interpolation::kArea},
                                              {"box", Interpolation::kArea},
                                              {"nearest", Interpolation::kNearest},
                                              {"hamming", Interpolation::kHamming},
                                              {"lanczos", Interpolation::kLanczos}});
}

// Video frames are always resampled by swscale, which has no hamming filter.
std::optional<Interpolation> ReadVideoInterpolation(Diagnostics& diag, const Field& f) {
  return internal::ReadChoice<Interpolation>(diag, f,
                                             {{"bilinear", Interpolation::kBilinear},
                                              {"bicubic", Interpolation::kBicubic},
                                              {"area", Interpolation::kArea},
                                              {"nearest", Interpolation::kNearest},
                                              {"lanczos", Interpolation::kLanczos}});
}

// Reads a list of file name endings (".jpg"), lower-cased. nullopt when absent or bad.
std::optional<std::vector<std::string>> ReadExtensions(Diagnostics& diag, const Field& exts) {
  std::optional<std::vector<Field>> list = internal::ReadList(diag, exts);
  if (!list) return std::nullopt;
  if (list->empty()) diag.Error(exts, "must list at least one file name ending, e.g. [.jpg]");
  std::vector<std::string> lowered;
  for (const Field& item : *list) {
    std::optional<std::string> e = internal::ReadString(diag, item);
    if (!e) continue;
    if (e->size() < 2 || e->front() != '.') {
      diag.Error(item, "an extension starts with '.' and is not empty, e.g. .jpg (got '" + *e + "')");
      continue;
    }
    lowered.push_back(AsciiLower(*e));
  }
  return lowered;
}

// A required, non-empty string.
std::optional<std::string> ReadRequiredString(Diagnostics& diag, MapReader& m, std::string_view key) {
  const Field f = m.Require(key);
  std::optional<std::string> v = internal::ReadString(diag, f);
  if (v && v->empty()) {
    diag.Error(f, "must not be empty");
    return std::nullopt;
  }
  return v;
}

// The source keys and the types they belong to (a bit per SourceType).
constexpr unsigned Bit(SourceType t) { return 1u << static_cast<unsigned>(t); }
struct SourceKey {
  const char* name;
  unsigned types;
};
constexpr SourceKey kSourceKeys[] = {
    {"root",
     Bit(SourceType::kImageFolder) | Bit(SourceType::kFileList) | Bit(SourceType::kCoco) | Bit(SourceType::kWatch)},
    {"extensions",
     Bit(SourceType::kImageFolder) | Bit(SourceType::kTar) | Bit(SourceType::kS3Prefix) | Bit(SourceType::kWatch)},
    {"existing", Bit(SourceType::kWatch)},
    {"classes", Bit(SourceType::kWatch)},
    {"list", Bit(SourceType::kFileList) | Bit(SourceType::kHttp)},
    {"shards", Bit(SourceType::kTar)},
    {"label_extension", Bit(SourceType::kTar)},
    {"shuffle_buffer", Bit(SourceType::kTar)},
    {"base_url", Bit(SourceType::kHttp)},
    {"timeout_ms", Bit(SourceType::kHttp)},
    {"connect_timeout_ms", Bit(SourceType::kHttp)},
    {"max_attempts", Bit(SourceType::kHttp)},
    {"max_in_flight", Bit(SourceType::kHttp)},
    {"annotations", Bit(SourceType::kCoco)},
    {"max_boxes", Bit(SourceType::kCoco)},
    {"on_overflow", Bit(SourceType::kCoco)},
    {"contiguous_ids", Bit(SourceType::kCoco)},
    {"include_crowd", Bit(SourceType::kCoco)},
    {"masks", Bit(SourceType::kCoco)},
    {"min_box_size", Bit(SourceType::kCoco)},
    {"min_visibility", Bit(SourceType::kCoco)},
    {"prefix", Bit(SourceType::kS3Prefix)},
    {"s3", Bit(SourceType::kTar) | Bit(SourceType::kFileList) | Bit(SourceType::kS3Prefix)},
    {"name", Bit(SourceType::kStream) | Bit(SourceType::kWatch)},
    {"group", Bit(SourceType::kStream) | Bit(SourceType::kWatch)},
    {"max_samples", Bit(SourceType::kStream) | Bit(SourceType::kWatch)},
    {"retain_samples", Bit(SourceType::kStream) | Bit(SourceType::kWatch)},
    {"retain_bytes", Bit(SourceType::kStream) | Bit(SourceType::kWatch)},
    {"allowed_uids", Bit(SourceType::kStream) | Bit(SourceType::kWatch)},
};

std::string TypesOf(unsigned types) {
  std::string out;
  for (SourceType t : {SourceType::kImageFolder, SourceType::kFileList, SourceType::kTar, SourceType::kHttp,
                       SourceType::kCoco, SourceType::kS3Prefix, SourceType::kStream, SourceType::kWatch}) {
    if (types & Bit(t)) out += std::string(out.empty() ? "" : " and ") + SourceTypeName(t);
  }
  return out;
}

// The file name endings a source takes by default for audio and video jobs.
std::vector<std::string> DefaultExtensions(Media media) {
  if (media == Media::kAudio) return {".wav", ".flac", ".mp3", ".ogg", ".opus", ".m4a"};
  return {".mp4", ".webm", ".mkv", ".mov", ".avi"};
}

// source.type: coco (see CocoConfig).
void ReadCoco(Diagnostics& diag, MapReader& m, Media media, const Field& type_field, SourceConfig* out) {
  CocoConfig& c = out->coco;
  if (media != Media::kImage) {
    diag.Error(type_field, std::string("source.type coco holds images: it needs media: image (this job's media is ") +
                               MediaName(media) + ")");
  }
  if (auto v = ReadRequiredString(diag, m, "annotations")) c.annotations = *v;
  if (auto v = ReadRequiredString(diag, m, "root")) out->root = *v;
  if (auto v = internal::ReadInt(diag, m.Get("max_boxes"), 1, 10000)) c.max_boxes = *v;
  if (auto v = internal::ReadChoice<CocoConfig::OnOverflow>(
          diag, m.Get("on_overflow"),
          {{"error", CocoConfig::OnOverflow::kError}, {"truncate", CocoConfig::OnOverflow::kTruncate}})) {
    c.on_overflow = *v;
  }
  if (auto v = internal::ReadBool(diag, m.Get("contiguous_ids"))) c.contiguous_ids = *v;
  if (auto v = internal::ReadBool(diag, m.Get("include_crowd"))) c.include_crowd = *v;
  if (auto v = internal::ReadBool(diag, m.Get("masks"))) c.masks = *v;
  if (const Field f = m.Get("min_box_size"); auto v = ReadNumber(diag, f)) {
    if (*v < 0 || *v > kMaxImageSide)
      diag.Error(f, "must be between 0 and 16384 output pixels (got " + FormatNumber(*v) + ")");
    else
      c.min_box_size = *v;
  }
  if (const Field f = m.Get("min_visibility"); auto v = ReadNumber(diag, f)) {
    if (*v < 0 || *v > 1)
      diag.Error(f, "must be a fraction between 0 and 1 (got " + FormatNumber(*v) + ")");
    else
      c.min_visibility = *v;
  }
}

// The source's `s3:` map (S3SourceConfig).
void ReadS3Settings(Diagnostics& diag, const Field& field, S3SourceConfig* out) {
  if (!Present(field)) return;
  MapReader m(diag, field);
  const Field endpoint = m.Get("endpoint_url");
  if (auto v = internal::ReadString(diag, endpoint)) {
    if (v->rfind("http://", 0) != 0 && v->rfind("https://", 0) != 0) {
      diag.Error(endpoint, "must start with http:// or https:// (got '" + *v + "')");
    } else {
      out->endpoint_url = *v;
    }
  }
  if (auto v = internal::ReadString(diag, m.Get("region"))) out->region = *v;
  const Field addressing = m.Get("addressing");
  if (auto v = internal::ReadString(diag, addressing)) {
    if (*v != "auto" && *v != "path" && *v != "virtual") {
      diag.Error(addressing, "must be auto, path or virtual (got '" + *v + "')");
    } else {
      out->addressing = *v;
    }
  }
  if (auto v = internal::ReadInt(diag, m.Get("timeout_ms"), 1, 3'600'000)) out->timeout_ms = *v;
  if (auto v = internal::ReadInt(diag, m.Get("connect_timeout_ms"), 1, 3'600'000)) out->connect_timeout_ms = *v;
  if (auto v = internal::ReadInt(diag, m.Get("stall_timeout_ms"), 1000, 3'600'000)) out->stall_timeout_ms = *v;
  if (auto v = internal::ReadInt(diag, m.Get("max_attempts"), 1, 100)) out->max_attempts = static_cast<int>(*v);
  if (auto v = internal::ReadInt(diag, m.Get("initial_backoff_ms"), 0, 60'000)) out->initial_backoff_ms = *v;
  const Field max_backoff = m.Get("max_backoff_ms");
  if (auto v = internal::ReadInt(diag, max_backoff, 0, 600'000)) {
    if (*v < out->initial_backoff_ms) {
      diag.Error(max_backoff, "must be >= initial_backoff_ms (" + std::to_string(out->initial_backoff_ms) + ")");
    } else {
      out->max_backoff_ms = *v;
    }
  }
  if (auto v = internal::ReadInt(diag, m.Get("max_in_flight"), 1, 1024)) out->max_in_flight = static_cast<int>(*v);
  m.ReportUnknownKeys();
}

void ReadStreamSource(Diagnostics& diag, MapReader& m, StreamSourceConfig* out, bool name_required = true);

// source.type: watch's own keys (WatchSourceConfig), root and extensions as image_folder's, and
// the stream keys of source.type: stream (the stream the watch feeds; its name optional).
void ReadWatchSource(Diagnostics& diag, MapReader& m, Media media, SourceConfig* out) {
  ReadStreamSource(diag, m, &out->stream, /*name_required=*/false);
  if (auto v = ReadRequiredString(diag, m, "root")) out->root = *v;
  if (media != Media::kImage) out->extensions = DefaultExtensions(media);
  if (auto v = ReadExtensions(diag, m.Get("extensions"))) out->extensions = std::move(*v);
  const Field existing = m.Get("existing");
  if (auto v = internal::ReadString(diag, existing)) {
    if (*v == "include" || *v == "skip") {
      out->watch.include_existing = *v == "include";
    } else {
      diag.Error(existing, "must be include or skip (got '" + *v + "')");
    }
  }
  const Field classes = m.Get("classes");
  if (Present(classes)) {
    if (auto list = internal::ReadList(diag, classes)) {
      std::set<std::string> seen;
      for (const Field& item : *list) {
        auto v = internal::ReadString(diag, item);
        if (!v) continue;
        if (v->empty() || (*v)[0] == '.' || v->find('/') != std::string::npos) {
          diag.Error(item, "a class is a folder name: not empty, no '/', not starting with '.' (got '" + *v + "')");
        } else if (!seen.insert(*v).second) {
          diag.Error(item, "class '" + *v + "' is named twice");
        } else {
          out->watch.classes.push_back(*v);
        }
      }
      if (list->empty()) diag.Error(classes, "lists no class (leave it out to take every folder)");
    }
  }
}

// source.type: stream's keys (StreamSourceConfig); watch's, where the name may be left out.
void ReadStreamSource(Diagnostics& diag, MapReader& m, StreamSourceConfig* out, bool name_required) {
  const Field name = m.Get("name");
  if (auto v = name_required || Present(name) ? ReadRequiredString(diag, m, "name") : std::nullopt) {
    const Field f = m.Get("name");
    bool ok = !v->empty() && v->size() <= 128;
    for (char c : *v) {
      ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
                  c == '.');
    }
    if (!ok) {
      diag.Error(f, "a stream name is 1..128 letters, digits, '_', '-' or '.' (got '" + *v + "')");
    } else {
      out->name = *v;
    }
  }
  const Field group = m.Get("group");
  if (auto v = internal::ReadString(diag, group)) {
    if (v->empty() || v->size() > 128) {
      diag.Error(group, "a consumer group name is 1..128 characters");
    } else {
      out->group = *v;
    }
  }
  if (auto v = internal::ReadUint64(diag, m.Get("max_samples"))) out->max_samples = *v;
  if (auto v = internal::ReadInt(diag, m.Get("retain_samples"), 1, int64_t{1} << 40)) {
    out->retain_samples = static_cast<uint64_t>(*v);
  }
  const Field bytes = m.Get("retain_bytes");
  if (Present(bytes)) {
    if (auto v = internal::ReadString(diag, bytes)) {
      Result<uint64_t> n = ParseByteSize(*v);
      if (!n.ok() || *n == 0) {
        diag.Error(bytes, "must be a byte size above 0 such as 67108864 or 64MiB (got '" + *v + "')");
      } else {
        out->retain_bytes = *n;
      }
    }
  }
  const Field uids = m.Get("allowed_uids");
  if (Present(uids)) {
    if (auto list = internal::ReadList(diag, uids)) {
      for (const Field& item : *list) {
        if (auto v = internal::ReadInt(diag, item, 0, 4294967294))
          out->allowed_uids.push_back(static_cast<uint32_t>(*v));
      }
    }
  }
}

// `weight`: non-null for an entry of `sources:`, which may have a `weight` key (> 0, default 1).
void ReadSource(Diagnostics& diag, const Field& field, Media media, SourceConfig* out, double* weight = nullptr) {
  MapReader m(diag, field);
  if (weight != nullptr) {
    const Field w = m.Get("weight");
    if (auto v = ReadNumber(diag, w)) {
      if (*v <= 0 || *v > 1e6)
        diag.Error(w, "a weight is a number > 0 and at most 1000000, relative to the other sources (got " +
                          FormatNumber(*v) + ")");
      else
        *weight = *v;
    }
  }
  const Field type_field = m.Get("type");
  std::optional<SourceType> type = internal::ReadChoice<SourceType>(diag, type_field,
                                                                    {{"image_folder", SourceType::kImageFolder},
                                                                     {"file_list", SourceType::kFileList},
                                                                     {"tar", SourceType::kTar},
                                                                     {"http", SourceType::kHttp},
                                                                     {"coco", SourceType::kCoco},
                                                                     {"s3_prefix", SourceType::kS3Prefix},
                                                                     {"stream", SourceType::kStream},
                                                                     {"watch", SourceType::kWatch}});
  if (!Present(type_field)) type = SourceType::kImageFolder;
  if (!type) {
    // Without a type nothing more can be checked; mark every source key as known.
    for (const SourceKey& k : kSourceKeys) m.Get(k.name);
    m.ReportUnknownKeys();
    return;
  }
  out->type = *type;
  const char* type_name = SourceTypeName(*type);
  switch (*type) {
    case SourceType::kImageFolder: {
      if (auto v = ReadRequiredString(diag, m, "root")) out->root = *v;
      if (media != Media::kImage) out->extensions = DefaultExtensions(media);
      if (auto v = ReadExtensions(diag, m.Get("extensions"))) out->extensions = std::move(*v);
      break;
    }
    case SourceType::kFileList: {
      if (auto v = ReadRequiredString(diag, m, "list")) out->list = *v;
      const Field root = m.Get("root");
      if (auto v = internal::ReadString(diag, root)) out->root = *v;
      break;
    }
    case SourceType::kTar: {
      const Field shards = m.Require("shards");
      if (Present(shards) && shards.node.IsScalar()) {
        if (auto v = internal::ReadString(diag, shards)) {
          if (v->empty())
            diag.Error(shards, "must not be empty");
          else
            out->shards = {*v};
        }
      } else if (auto list = internal::ReadList(diag, shards)) {
        if (list->empty()) diag.Error(shards, "must name at least one shard file or pattern");
        for (const Field& item : *list) {
          std::optional<std::string> v = internal::ReadString(diag, item);
          if (!v) continue;
          if (v->empty())
            diag.Error(item, "must not be empty");
          else
            out->shards.push_back(*v);
        }
      }
      out->extensions = media == Media::kImage ? std::vector<std::string>{".jpg", ".jpeg", ".png", ".webp"}
                                               : DefaultExtensions(media);
      if (auto v = ReadExtensions(diag, m.Get("extensions"))) out->extensions = std::move(*v);
      const Field label = m.Get("label_extension");
      if (auto v = internal::ReadString(diag, label)) {
        if (!v->empty() && (v->size() < 2 || v->front() != '.')) {
          diag.Error(label, "a label extension starts with '.', e.g. .cls, or is '' for no labels (got '" + *v + "')");
        } else {
          out->label_extension = AsciiLower(*v);
        }
      }
      if (auto v = internal::ReadInt(diag, m.Get("shuffle_buffer"), 1, int64_t{1} << 24)) out->shuffle_buffer = *v;
      break;
    }
    case SourceType::kHttp: {
      if (auto v = ReadRequiredString(diag, m, "list")) out->list = *v;
      const Field base = m.Get("base_url");
      if (auto v = internal::ReadString(diag, base)) {
        if (v->rfind("http://", 0) != 0 && v->rfind("https://", 0) != 0) {
          diag.Error(base, "must start with http:// or https:// (got '" + *v + "')");
        } else {
          out->base_url = *v;
        }
      }
      if (auto v = internal::ReadInt(diag, m.Get("timeout_ms"), 1, 3'600'000)) out->timeout_ms = *v;
      if (auto v = internal::ReadInt(diag, m.Get("connect_timeout_ms"), 1, 3'600'000)) out->connect_timeout_ms = *v;
      if (auto v = internal::ReadInt(diag, m.Get("max_attempts"), 1, 100)) out->max_attempts = static_cast<int>(*v);
      if (auto v = internal::ReadInt(diag, m.Get("max_in_flight"), 1, 1024)) out->max_in_flight = static_cast<int>(*v);
      break;
    }
    case SourceType::kCoco: {
      ReadCoco(diag, m, media, type_field, out);
      break;
    }
    case SourceType::kS3Prefix: {
      const Field prefix = m.Require("prefix");
      if (auto v = internal::ReadString(diag, prefix)) {
        if (v->rfind("s3://", 0) != 0 || v->size() <= 5) {
          diag.Error(prefix, "must be an s3:// URL such as s3://bucket/train/ (got '" + *v + "')");
        } else {
          out->prefix = *v;
        }
      }
      if (auto v = ReadExtensions(diag, m.Get("extensions"))) out->extensions = std::move(*v);
      break;
    }
    case SourceType::kWatch: {
      ReadWatchSource(diag, m, media, out);
      break;
    }
    case SourceType::kStream: {
      ReadStreamSource(diag, m, &out->stream);
      break;
    }
  }
  if (*type == SourceType::kTar || *type == SourceType::kFileList || *type == SourceType::kS3Prefix) {
    ReadS3Settings(diag, m.Get("s3"), &out->s3);
  }
  // A key of another source type: say which type it belongs to rather than "unknown key".
  std::vector<std::string> present;
  for (const MapReader::Entry& e : m.entries()) {
    if (!e.used) present.push_back(e.key);
  }
  for (const std::string& key : present) {
    for (const SourceKey& k : kSourceKeys) {
      if (key != k.name || (k.types & Bit(*type))) continue;
      const Field f = m.Get(key);
      diag.ErrorAtKey(
          f, "'" + key + "' is not a key of source type " + type_name + " (it belongs to " + TypesOf(k.types) + ")");
    }
  }
  m.ReportUnknownKeys();
}

constexpr size_t kMaxMixSources = 64;

// sources: [{<a source map>, weight: W}, ...] (a mix; WeightedSource). Every entry is read as
// `source:` is; then the entries must deliver the same tensors.
void ReadSources(Diagnostics& diag, const Field& field, JobConfig* out) {
  std::optional<std::vector<Field>> items = internal::ReadList(diag, field);
  if (!items) return;
  if (items->empty() || items->size() > kMaxMixSources) {
    diag.ErrorAtKey(field, "a mix names 1 to " + std::to_string(kMaxMixSources) + " sources (got " +
                               std::to_string(items->size()) + ")");
    return;
  }
  for (const Field& item : *items) {
    WeightedSource w;
    w.line = item.key_mark.is_null() ? 0 : item.key_mark.line + 1;
    if (!item.node.IsMap()) {
      diag.Error(item,
                 "a source of a mix is a map like `source:` with a weight, e.g. {type: image_folder, root: "
                 "/data/a, weight: 0.7}, got " +
                     internal::Describe(item.node));
      continue;
    }
    ReadSource(diag, item, out->media, &w.source, &w.weight);
    out->sources.push_back(std::move(w));
  }
  if (out->sources.size() != items->size()) return;
  // One set of tensors for the whole job: a coco source adds boxes, box_labels, box_count (and mask).
  const SourceConfig& first = out->sources[0].source;
  const bool coco = first.type == SourceType::kCoco;
  for (size_t i = 1; i < out->sources.size(); ++i) {
    const SourceConfig& c = out->sources[i].source;
    const Field& item = (*items)[i];
    if ((c.type == SourceType::kCoco) != coco) {
      diag.Error(item, "sources." + std::to_string(i) + " is " + (coco ? "not " : "") + "a coco source and sources.0 " +
                           (coco ? "is" : "is not") +
                           ": a mix delivers one set of tensors, and a coco source's samples carry boxes, box_labels "
                           "and box_count (mix coco sources with coco sources only)");
    } else if (coco && (c.coco.max_boxes != first.coco.max_boxes || c.coco.masks != first.coco.masks)) {
      diag.Error(item, "sources." + std::to_string(i) +
                           ": coco sources of a mix need the same max_boxes and masks as sources.0 (their tensors' "
                           "shapes: max_boxes " +
                           std::to_string(first.coco.max_boxes) + ", masks " + (first.coco.masks ? "true" : "false") +
                           ")");
    }
  }
  out->source = first;
}

// With `sources:`: what `source:` would be refused for (extra_outputs, mask, mix against the
// source type), for every entry after the first (the first is checked as `source`).
void CheckMixedSources(Diagnostics& diag, const Field& sources_field, JobConfig* out) {
  if (out->sources.size() < 2) return;
  std::optional<std::vector<Field>> items = internal::ReadList(diag, sources_field);
  if (!items || items->size() != out->sources.size()) return;
  for (size_t i = 1; i < out->sources.size(); ++i) {
    const SourceType t = out->sources[i].source.type;
    const std::string name = "sources." + std::to_string(i) + " (type " + SourceTypeName(t) + ")";
    if (!out->extra_outputs.empty() && (t == SourceType::kHttp || t == SourceType::kS3Prefix)) {
      diag.Error((*items)[i],
                 name + ": the job's extra_outputs read sidecar files, which this source type does not have");
    }
    if (!out->mask.from.empty() && t == SourceType::kHttp) {
      diag.Error((*items)[i], name + ": the job's mask is a sidecar file, which source type http does not have");
    }
  }
}

// `mix`: the job has `sources:` (epoch_samples applies to a mix only).
void ReadSampler(Diagnostics& diag, const Field& field, bool mix, SamplerConfig* out) {
  MapReader m(diag, field);
  const Field epoch_samples = m.Get("epoch_samples");
  if (Present(epoch_samples) && !mix) {
    diag.ErrorAtKey(epoch_samples,
                    "epoch_samples sets the length of a mix's epoch: it needs `sources:` (one source's epoch is its "
                    "whole dataset)");
  } else if (auto v = internal::ReadInt(diag, epoch_samples, 1, int64_t{1} << 40)) {
    out->epoch_samples = static_cast<uint64_t>(*v);
  }
  if (auto v = internal::ReadBool(diag, m.Get("shuffle"))) out->shuffle = *v;
  if (auto v = internal::ReadUint64(diag, m.Get("seed"))) out->seed = *v;
  if (auto v = internal::ReadChoice<Uneven>(diag, m.Get("uneven"), {{"pad", Uneven::kPad}, {"drop", Uneven::kDrop}})) {
    out->uneven = *v;
  }
  m.ReportUnknownKeys();
}

void ReadBatch(Diagnostics& diag, const Field& field, BatchConfig* out) {
  MapReader m(diag, field);
  if (auto v = internal::ReadInt(diag, m.Get("size"), 1, 65536)) out->size = static_cast<int>(*v);
  if (auto v = internal::ReadBool(diag, m.Get("drop_last"))) out->drop_last = *v;
  m.ReportUnknownKeys();
}

void ReadOutput(Diagnostics& diag, const Field& field, OutputConfig* out) {
  MapReader m(diag, field);
  if (auto v = internal::ReadChoice<DType>(diag, m.Get("dtype"),
                                           {{"uint8", DType::kUInt8},
                                            {"float32", DType::kFloat32},
                                            {"float16", DType::kFloat16},
                                            {"bfloat16", DType::kBFloat16}})) {
    out->dtype = *v;
  }
  if (auto v =
          internal::ReadChoice<Layout>(diag, m.Get("layout"), {{"NHWC", Layout::kNHWC}, {"NCHW", Layout::kNCHW}})) {
    out->layout = *v;
  }
  const Field device = m.Get("device");
  if (auto v = internal::ReadString(diag, device)) {
    if (*v == "cpu") {
      out->device = *v;
    } else if (IsCudaDevice(*v)) {
      const std::string n = *v == "cuda" ? "0" : v->substr(5);
      if (n.size() > 3) {
        diag.Error(device, "device '" + *v + "': no such CUDA device number");
      } else {
        out->device = "cuda:" + std::to_string(std::stoi(n));
        out->cuda_device = std::stoi(n);
      }
    } else {
      diag.Error(device, "device must be cpu or cuda:N (got '" + *v + "')");
    }
  }
  const Field copy = m.Get("copy");
  if (auto v = internal::ReadChoice<OutputConfig::Copy>(
          diag, copy, {{"daemon", OutputConfig::Copy::kDaemon}, {"client", OutputConfig::Copy::kClient}})) {
    out->copy = *v;
    if (out->cuda_device < 0 && *v == OutputConfig::Copy::kClient) {
      diag.Error(copy, "copy: client needs a cuda device (output.device: cuda:N), not " + out->device);
    }
  }
  m.ReportUnknownKeys();
}

// Returns the resample field (absent when not given), for the check against the transforms;
// *device_field gets the device field.
Field ReadDecode(Diagnostics& diag, const Field& field, DecodeConfig* out, Field* device_field) {
  MapReader m(diag, field);
  *device_field = m.Get("device");
  if (auto v = internal::ReadChoice<DecodeDevice>(diag, *device_field,
                                                  {{"cpu", DecodeDevice::kCpu}, {"cuda", DecodeDevice::kCuda}})) {
    out->device = *v;
  }
  const Field resample = m.Get("resample");
  if (auto v =
          internal::ReadChoice<Resample>(diag, resample, {{"exact", Resample::kExact}, {"fast", Resample::kFast}})) {
    out->resample = *v;
  }
  if (auto v = internal::ReadChoice<ColorMode>(diag, m.Get("color"),
                                               {{"rgb", ColorMode::kRgb}, {"gray", ColorMode::kGray}})) {
    out->color = *v;
  }
  if (auto v = internal::ReadBool(diag, m.Get("exif_orientation"))) out->exif_orientation = *v;
  if (auto v = internal::ReadChoice<AlphaMode>(diag, m.Get("alpha"),
                                               {{"drop", AlphaMode::kDrop}, {"composite", AlphaMode::kComposite}})) {
    out->alpha = *v;
  }
  const Field background = m.Get("background");
  if (Present(background)) {
    std::optional<std::vector<Field>> items = internal::ReadList(diag, background);
    if (items && items->size() != 3) {
      diag.Error(background,
                 "expected [red, green, blue], got a list of " + std::to_string(items->size()) + " item(s)");
    } else if (items) {
      std::array<int, 3> rgb{};
      bool ok = true;
      for (size_t c = 0; c < 3; ++c) {
        auto v = internal::ReadInt(diag, (*items)[c], 0, 255);
        if (v)
          rgb[c] = static_cast<int>(*v);
        else
          ok = false;
      }
      if (ok) out->background = rgb;
    }
  }
  if (auto v = internal::ReadInt(diag, m.Get("max_pixels"), 1, kMaxPixelsLimit)) out->max_pixels = *v;
  m.ReportUnknownKeys();
  return resample;
}

// A parsed transform and the field a size complaint about it should point at.
struct ParsedOp {
  TransformOp op;
  Field size_field;
};

std::optional<ParsedOp> ReadResize(Diagnostics& diag, const Field& field) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  const Field shorter = m.Get("shorter");
  const Field height = m.Get("height");
  const Field width = m.Get("width");
  ResizeOp op;
  if (auto v = internal::ReadInt(diag, shorter, 1, kMaxImageSide)) op.shorter = static_cast<int>(*v);
  if (auto v = internal::ReadInt(diag, height, 1, kMaxImageSide)) op.height = static_cast<int>(*v);
  if (auto v = internal::ReadInt(diag, width, 1, kMaxImageSide)) op.width = static_cast<int>(*v);
  if (auto v = ReadInterpolation(diag, m.Get("interpolation"))) op.interpolation = *v;
  const Field max_size = m.Get("max_size");
  if (auto v = internal::ReadInt(diag, max_size, 1, kMaxImageSide)) {
    if (!Present(shorter))
      diag.Error(max_size, "max_size goes with 'shorter' (as torchvision's Resize(int, max_size))");
    else if (op.shorter > 0 && *v <= op.shorter)
      diag.Error(max_size,
                 "must be greater than shorter (" + std::to_string(op.shorter) + "), as torchvision requires");
    else
      op.max_size = static_cast<int>(*v);
  }
  const Field antialias = m.Get("antialias");
  if (auto v = internal::ReadBool(diag, antialias)) {
    if (!*v) {
      diag.Error(antialias,
                 "antialias: false is not supported: spdld resizes as PIL does (torchvision on PIL images), "
                 "which always antialiases");
    }
  }
  if (m.ok()) {
    if (Present(shorter) && (Present(height) || Present(width))) {
      diag.ErrorAtKey(field, "resize takes either 'shorter' or 'height' and 'width', not both");
    } else if (!Present(shorter) && !Present(height) && !Present(width)) {
      diag.ErrorAtKey(field, "resize needs 'shorter' or both 'height' and 'width'");
    } else if (Present(height) != Present(width)) {
      diag.ErrorAtKey(field, "resize needs both 'height' and 'width' (or only 'shorter')");
    }
  }
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{op, Present(shorter) ? shorter : field};
}

std::optional<ParsedOp> ReadCenterCrop(Diagnostics& diag, const Field& field) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  const Field size = m.Require("size");
  CenterCropOp op;
  if (auto hw = ReadSize(diag, size)) op = {hw->first, hw->second};
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{op, size};
}

// A range [min, max] with 0 < min <= max (and max <= hi when hi > 0) into *min, *max. Returns
// false (with an error) when it is not one; true when absent (the defaults stay).
bool ReadRange(Diagnostics& diag, const Field& f, const char* what, double hi, double* min, double* max) {
  if (!Present(f)) return true;
  std::optional<std::vector<double>> v = ReadNumbers(diag, f, 2);
  if (!v) return false;
  const double a = (*v)[0], b = (*v)[1];
  if (!(a > 0 && a <= b && (hi <= 0 || b <= hi))) {
    diag.Error(f, std::string(what) + " must be [min, max] with 0 < min <= max" +
                      (hi > 0 ? " <= " + FormatNumber(hi) : std::string()) + " (got [" + FormatNumber(a) + ", " +
                      FormatNumber(b) + "])");
    return false;
  }
  *min = a;
  *max = b;
  return true;
}

std::optional<ParsedOp> ReadRandomResizedCrop(Diagnostics& diag, const Field& field) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  const Field size = m.Require("size");
  RandomResizedCropOp op;
  if (auto hw = ReadSize(diag, size)) {
    op.height = hw->first;
    op.width = hw->second;
  }
  ReadRange(diag, m.Get("scale"), "scale", 1.0, &op.scale_min, &op.scale_max);
  ReadRange(diag, m.Get("ratio"), "ratio", 0, &op.ratio_min, &op.ratio_max);
  if (auto v = ReadInterpolation(diag, m.Get("interpolation"))) op.interpolation = *v;
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{op, size};
}

std::optional<ParsedOp> ReadHorizontalFlip(Diagnostics& diag, const Field& field) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  const Field p = m.Get("p");
  HorizontalFlipOp op;
  if (auto v = ReadNumber(diag, p)) {
    if (*v < 0 || *v > 1)
      diag.Error(p, "must be a probability in [0, 1] (got " + FormatNumber(*v) + ")");
    else
      op.p = *v;
  }
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{op, field};
}

// One value per channel: three for rgb; for gray one, as a number or a list of one. Returns
// them spread over three entries (a gray value in all three).
std::optional<std::array<double, 3>> ReadChannelValues(Diagnostics& diag, const Field& f, ColorMode color) {
  if (!Present(f)) return std::nullopt;
  if (color == ColorMode::kRgb) {
    std::optional<std::vector<double>> v = ReadNumbers(diag, f, 3);
    if (!v) return std::nullopt;
    return std::array<double, 3>{(*v)[0], (*v)[1], (*v)[2]};
  }
  std::optional<double> v;
  if (f.node.IsSequence()) {
    if (f.node.size() != 1) {
      diag.Error(f, "decode.color: gray gives one channel: expected one number (or a list of one), got a list of " +
                        std::to_string(f.node.size()) + " item(s)");
      return std::nullopt;
    }
    std::optional<std::vector<double>> list = ReadNumbers(diag, f, 1);
    if (list) v = (*list)[0];
  } else {
    v = ReadNumber(diag, f);
  }
  if (!v) return std::nullopt;
  return std::array<double, 3>{*v, *v, *v};
}

std::optional<ParsedOp> ReadNormalize(Diagnostics& diag, const Field& field, ColorMode color) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  const Field mean = m.Require("mean");
  const Field stddev = m.Require("std");
  NormalizeOp op;
  if (auto v = ReadChannelValues(diag, mean, color)) op.mean = *v;
  if (auto v = ReadChannelValues(diag, stddev, color)) {
    if (std::any_of(v->begin(), v->end(), [](double x) { return x <= 0; })) {
      diag.Error(stddev, "every std must be > 0");
    } else {
      op.stddev = *v;
    }
  }
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{op, field};
}

// A YAML value as JSON: maps (string keys) -> objects, lists -> arrays, plain scalars -> null
// (~, null, empty), booleans (true/false), integers, finite numbers, else strings; quoted
// scalars stay strings. nullopt after an error.
std::optional<nlohmann::json> YamlToJson(Diagnostics& diag, const Field& f, int depth) {
  if (depth > kMaxOpArgsDepth) {
    diag.Error(f, "args nest deeper than " + std::to_string(kMaxOpArgsDepth) + " levels");
    return std::nullopt;
  }
  const YAML::Node& n = f.node;
  if (!n.IsDefined() || n.IsNull()) return nlohmann::json(nullptr);
  if (n.IsScalar()) {
    const std::string& s = n.Scalar();
    if (n.Tag() == "!") return nlohmann::json(s);  // quoted: a string whatever it looks like
    if (s == "true" || s == "True" || s == "TRUE") return nlohmann::json(true);
    if (s == "false" || s == "False" || s == "FALSE") return nlohmann::json(false);
    int64_t i = 0;
    if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
        ec == std::errc() && p == s.data() + s.size() && !s.empty()) {
      return nlohmann::json(i);
    }
    double d = 0;
    if (auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
        ec == std::errc() && p == s.data() + s.size() && !s.empty() && std::isfinite(d)) {
      return nlohmann::json(d);
    }
    return nlohmann::json(s);
  }
  if (n.IsSequence()) {
    nlohmann::json out = nlohmann::json::array();
    size_t i = 0;
    for (const auto& item : n) {
      Field child{item, f.path + "." + std::to_string(i++), item.Mark()};
      auto v = YamlToJson(diag, child, depth + 1);
      if (!v) return std::nullopt;
      out.push_back(std::move(*v));
    }
    return out;
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& kv : n) {
    if (!kv.first.IsScalar()) {
      diag.Error(f, "args keys must be plain strings");
      return std::nullopt;
    }
    const std::string key = kv.first.Scalar();
    Field child{kv.second, f.path + "." + key, kv.first.Mark()};
    auto v = YamlToJson(diag, child, depth + 1);
    if (!v) return std::nullopt;
    out[key] = std::move(*v);
  }
  return out;
}

// op: {library, name, args}. The library and the op are found when the job is submitted.
std::optional<ParsedOp> ReadUserOp(Diagnostics& diag, const Field& item, const Field& field) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  UserOp op;
  const Field library = m.Require("library");
  if (auto v = internal::ReadString(diag, library)) {
    if (v->empty() || v->find('/') != std::string::npos || *v == "." || *v == "..") {
      diag.Error(library, "a library is a file name in the daemon's plugin_dirs, without '/', e.g. libmyops.so (got '" +
                              *v + "')");
    } else {
      op.library = *v;
    }
  }
  const Field name = m.Require("name");
  if (auto v = internal::ReadString(diag, name)) {
    if (v->empty())
      diag.Error(name, "must not be empty");
    else
      op.name = *v;
  }
  const Field args = m.Get("args");
  if (Present(args) && !args.node.IsNull() && !args.node.IsMap()) {
    diag.Error(args, "args is a map of the op's settings, got " + internal::Describe(args.node));
  } else if (Present(args) && !args.node.IsNull()) {
    if (auto json = YamlToJson(diag, args, 0)) {
      // Invalid UTF-8 in a key or string cannot become JSON: refused here (dump would throw).
      std::string dumped = json->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
      if (dumped.find("\xEF\xBF\xBD") != std::string::npos &&
          dumped != json->dump(-1, ' ', false, nlohmann::json::error_handler_t::ignore)) {
        diag.Error(args, "args must be valid UTF-8 text (keys and strings)");
      }
      op.args_json = std::move(dumped);
      if (op.args_json.size() > kMaxOpArgsBytes) {
        diag.Error(args, "args take " + std::to_string(op.args_json.size()) + " bytes as JSON, more than " +
                             std::to_string(kMaxOpArgsBytes));
      }
    }
  }
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  op.path = field.path;
  op.line = item.key_mark.is_null() ? 0 : item.key_mark.line + 1;
  return ParsedOp{op, field};
}

// ---- built-in augmentations (AugmentOp, RandomErasingOp) ----

// A probability in [0, 1] into *p when present.
void ReadProbability(Diagnostics& diag, const Field& f, double* p) {
  if (auto v = ReadNumber(diag, f)) {
    if (*v < 0 || *v > 1)
      diag.Error(f, "must be a probability in [0, 1] (got " + FormatNumber(*v) + ")");
    else
      *p = *v;
  }
}

// A jitter amount as torchvision's ColorJitter: a number v (>= 0) -> [center - v, center + v]
// (clipped at `lo`), or [min, max] with lo <= min <= max <= hi.
void ReadJitter(Diagnostics& diag, const Field& f, double center, double lo, double hi, std::array<double, 2>* out) {
  if (!Present(f)) return;
  if (f.node.IsSequence()) {
    if (auto v = ReadNumbers(diag, f, 2)) {
      if (!((*v)[0] >= lo && (*v)[0] <= (*v)[1] && (*v)[1] <= hi)) {
        diag.Error(f, "must be [min, max] with " + FormatNumber(lo) + " <= min <= max" +
                          (std::isfinite(hi) ? " <= " + FormatNumber(hi) : std::string()));
      } else {
        *out = {(*v)[0], (*v)[1]};
      }
    }
    return;
  }
  if (auto v = ReadNumber(diag, f)) {
    if (*v < 0 || (std::isfinite(hi) && center + *v > hi)) {
      diag.Error(f, "must be >= 0" + (std::isfinite(hi) ? " and <= " + FormatNumber(hi - center) : std::string()) +
                        " (got " + FormatNumber(*v) + ")");
    } else {
      *out = {std::max(lo, center - *v), center + *v};
    }
  }
}

// A number d -> [-d, d] (d >= 0), or [lo, hi] with lo <= hi.
void ReadSymmetric(Diagnostics& diag, const Field& f, double limit, std::array<double, 2>* out) {
  if (!Present(f)) return;
  std::array<double, 2> r;
  if (f.node.IsSequence()) {
    auto v = ReadNumbers(diag, f, 2);
    if (!v) return;
    r = {(*v)[0], (*v)[1]};
  } else {
    auto v = ReadNumber(diag, f);
    if (!v) return;
    if (*v < 0) {
      diag.Error(f, "a single value d means [-d, d]: it must be >= 0 (got " + FormatNumber(*v) + ")");
      return;
    }
    r = {-*v, *v};
  }
  if (!(r[0] <= r[1]) || (limit > 0 && (std::fabs(r[0]) >= limit || std::fabs(r[1]) >= limit))) {
    diag.Error(f, "must be [lo, hi] with lo <= hi" +
                      (limit > 0 ? ", each within (-" + FormatNumber(limit) + ", " + FormatNumber(limit) + ")"
                                 : std::string()));
    return;
  }
  *out = r;
}

std::optional<WarpFilter> ReadWarpFilter(Diagnostics& diag, const Field& f) {
  return internal::ReadChoice<WarpFilter>(
      diag, f,
      {{"nearest", WarpFilter::kNearest}, {"bilinear", WarpFilter::kBilinear}, {"bicubic", WarpFilter::kBicubic}});
}

// fill: a number 0..255 (every channel) or [r, g, b].
void ReadFill(Diagnostics& diag, const Field& f, std::array<uint8_t, 3>* out) {
  if (!Present(f)) return;
  std::vector<double> v;
  if (f.node.IsSequence()) {
    auto list = ReadNumbers(diag, f, 3);
    if (!list) return;
    v = *list;
  } else {
    auto one = ReadNumber(diag, f);
    if (!one) return;
    v = {*one, *one, *one};
  }
  for (double x : v) {
    if (x < 0 || x > 255 || x != std::floor(x)) {
      diag.Error(f, "fill is an integer 0..255 or three of them (got " + FormatNumber(x) + ")");
      return;
    }
  }
  *out = {static_cast<uint8_t>(v[0]), static_cast<uint8_t>(v[1]), static_cast<uint8_t>(v[2])};
}

// The names of the built-in augmentations, as written in YAML.
const std::vector<std::pair<std::string, AugmentKind>>& AugmentNames() {
  static const std::vector<std::pair<std::string, AugmentKind>> names = {
      {"color_jitter", AugmentKind::kColorJitter},
      {"grayscale", AugmentKind::kGrayscale},
      {"gaussian_blur", AugmentKind::kGaussianBlur},
      {"posterize", AugmentKind::kPosterize},
      {"solarize", AugmentKind::kSolarize},
      {"equalize", AugmentKind::kEqualize},
      {"autocontrast", AugmentKind::kAutocontrast},
      {"sharpness", AugmentKind::kSharpness},
      {"invert", AugmentKind::kInvert},
      {"rand_augment", AugmentKind::kRandAugment},
      {"trivial_augment_wide", AugmentKind::kTrivialAugmentWide},
      {"auto_augment", AugmentKind::kAutoAugment},
      {"vertical_flip", AugmentKind::kVerticalFlip},
      {"rotate", AugmentKind::kRotate},
      {"affine", AugmentKind::kAffine},
  };
  return names;
}

std::optional<ParsedOp> ReadAugment(Diagnostics& diag, AugmentKind kind, const Field& field) {
  using K = AugmentKind;
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  AugmentSpec s;
  s.kind = kind;
  // torchvision's defaults: the Random* photometric transforms apply with p = 0.5, RandomGrayscale 0.1.
  switch (kind) {
    case K::kGrayscale:
      s.p = 0.1;
      break;
    case K::kPosterize:
    case K::kSolarize:
    case K::kEqualize:
    case K::kAutocontrast:
    case K::kSharpness:
    case K::kInvert:
    case K::kVerticalFlip:
      s.p = 0.5;
      break;
    default:
      break;
  }
  const bool has_p = kind != K::kRandAugment && kind != K::kTrivialAugmentWide && kind != K::kAutoAugment &&
                     kind != K::kRotate && kind != K::kAffine && kind != K::kGaussianBlur;
  if (has_p) ReadProbability(diag, m.Get("p"), &s.p);
  switch (kind) {
    case K::kColorJitter: {
      const double inf = std::numeric_limits<double>::infinity();
      ReadJitter(diag, m.Get("brightness"), 1, 0, inf, &s.brightness);
      ReadJitter(diag, m.Get("contrast"), 1, 0, inf, &s.contrast);
      ReadJitter(diag, m.Get("saturation"), 1, 0, inf, &s.saturation);
      ReadJitter(diag, m.Get("hue"), 0, -0.5, 0.5, &s.hue);
      break;
    }
    case K::kGaussianBlur: {
      const Field k = m.Require("kernel_size");
      if (Present(k)) {
        if (auto hw = ReadSize(diag, k)) {  // an integer or [x, y] as torchvision (width first)
          s.kernel_x = hw->first;
          s.kernel_y = hw->second;
          if (s.kernel_x % 2 == 0 || s.kernel_y % 2 == 0 || s.kernel_x > 255 || s.kernel_y > 255)
            diag.Error(k, "kernel_size must be odd and at most 255");
        }
      }
      const Field sigma = m.Get("sigma");
      if (Present(sigma) && sigma.node.IsScalar()) {
        if (auto v = ReadNumber(diag, sigma)) {
          if (*v <= 0)
            diag.Error(sigma, "must be > 0");
          else
            s.sigma = {*v, *v};
        }
      } else if (Present(sigma)) {
        double lo = s.sigma[0], hi = s.sigma[1];
        if (ReadRange(diag, sigma, "sigma", 0, &lo, &hi)) s.sigma = {lo, hi};
      }
      break;
    }
    case K::kPosterize: {
      if (auto v = internal::ReadInt(diag, m.Require("bits"), 0, 8)) s.value = static_cast<double>(*v);
      break;
    }
    case K::kSolarize: {
      const Field t = m.Require("threshold");
      if (auto v = ReadNumber(diag, t)) {
        if (*v < 0 || *v > 256)
          diag.Error(t, "must be in [0, 256] (got " + FormatNumber(*v) + ")");
        else
          s.value = *v;
      }
      break;
    }
    case K::kSharpness: {
      const Field f = m.Require("sharpness_factor");
      if (auto v = ReadNumber(diag, f)) {
        if (*v < 0)
          diag.Error(f, "must be >= 0 (got " + FormatNumber(*v) + ")");
        else
          s.value = *v;
      }
      break;
    }
    case K::kRandAugment:
    case K::kTrivialAugmentWide:
    case K::kAutoAugment: {
      if (kind == K::kRandAugment) {
        if (auto v = internal::ReadInt(diag, m.Get("num_ops"), 0, 16)) s.num_ops = static_cast<int>(*v);
        if (auto v = internal::ReadInt(diag, m.Get("num_magnitude_bins"), 2, 1000))
          s.num_magnitude_bins = static_cast<int>(*v);
        const Field mag = m.Get("magnitude");
        if (auto v = internal::ReadInt(diag, mag, 0, 999)) {
          if (*v >= s.num_magnitude_bins)
            diag.Error(mag, "must be below num_magnitude_bins (" + std::to_string(s.num_magnitude_bins) + ")");
          else
            s.magnitude = static_cast<int>(*v);
        }
      } else if (kind == K::kTrivialAugmentWide) {
        if (auto v = internal::ReadInt(diag, m.Get("num_magnitude_bins"), 2, 1000))
          s.num_magnitude_bins = static_cast<int>(*v);
      } else {
        const Field policy = m.Get("policy");
        if (auto v = internal::ReadChoice<int>(diag, policy, {{"imagenet", 0}})) (void)*v;
      }
      if (auto v = ReadWarpFilter(diag, m.Get("interpolation"))) s.filter = *v;
      ReadFill(diag, m.Get("fill"), &s.fill);
      break;
    }
    case K::kRotate:
    case K::kAffine: {
      const Field degrees = m.Require("degrees");
      ReadSymmetric(diag, degrees, 0, &s.degrees);
      if (auto v = ReadWarpFilter(diag, m.Get("interpolation"))) s.filter = *v;
      ReadFill(diag, m.Get("fill"), &s.fill);
      if (kind == K::kRotate) {
        const Field expand = m.Get("expand");
        if (auto v = internal::ReadBool(diag, expand)) {
          if (*v)
            diag.Error(expand,
                       "expand: true changes the image size with the angle; a batch holds one size (not supported)");
        }
        break;
      }
      const Field translate = m.Get("translate");
      if (Present(translate)) {
        if (auto v = ReadNumbers(diag, translate, 2)) {
          if ((*v)[0] < 0 || (*v)[0] > 1 || (*v)[1] < 0 || (*v)[1] > 1)
            diag.Error(translate, "must be two fractions in [0, 1]");
          else
            s.translate = {(*v)[0], (*v)[1]};
        }
      }
      double lo = 1, hi = 1;
      if (ReadRange(diag, m.Get("scale"), "scale", 0, &lo, &hi)) s.scale = {lo, hi};
      const Field shear = m.Get("shear");
      if (Present(shear) && shear.node.IsSequence() && shear.node.size() == 4) {
        if (auto v = ReadNumbers(diag, shear, 4)) {
          const bool ok = (*v)[0] <= (*v)[1] && (*v)[2] <= (*v)[3] &&
                          std::all_of(v->begin(), v->end(), [](double x) { return std::fabs(x) < 90; });
          if (!ok)
            diag.Error(shear, "must be [xmin, xmax, ymin, ymax] with min <= max, each within (-90, 90)");
          else
            s.shear = {(*v)[0], (*v)[1], (*v)[2], (*v)[3]};
        }
      } else {
        std::array<double, 2> x = {0, 0};
        ReadSymmetric(diag, shear, 90, &x);
        s.shear = {x[0], x[1], 0, 0};
      }
      break;
    }
    default:
      break;
  }
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{AugmentOp{s}, field};
}

std::optional<ParsedOp> ReadRandomErasing(Diagnostics& diag, const Field& field, ColorMode color) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  RandomErasingOp op;
  ReadProbability(diag, m.Get("p"), &op.p);
  ReadRange(diag, m.Get("scale"), "scale", 1.0, &op.scale[0], &op.scale[1]);
  ReadRange(diag, m.Get("ratio"), "ratio", 0, &op.ratio[0], &op.ratio[1]);
  const Field value = m.Get("value");
  if (Present(value) && value.node.IsScalar() && value.node.Scalar() == "random") {
    op.random = true;
  } else if (Present(value) && value.node.IsScalar()) {
    if (auto v = ReadNumber(diag, value)) op.value = {*v, *v, *v};
  } else if (Present(value)) {
    if (auto v = ReadChannelValues(diag, value, color)) op.value = *v;
  }
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{op, field};
}

std::optional<ParsedOp> ReadRandomCrop(Diagnostics& diag, const Field& field) {
  const size_t errors_before = diag.count();
  MapReader m(diag, field);
  RandomCropSpec s;
  const Field size = m.Require("size");
  if (auto hw = ReadSize(diag, size)) {
    s.height = hw->first;
    s.width = hw->second;
  }
  const Field padding = m.Get("padding");
  if (Present(padding)) {
    std::vector<int64_t> v;
    if (padding.node.IsSequence() && (padding.node.size() == 2 || padding.node.size() == 4)) {
      if (auto items = internal::ReadList(diag, padding)) {
        for (const Field& item : *items) {
          if (auto x = internal::ReadInt(diag, item, 0, 4096)) v.push_back(*x);
        }
      }
    } else if (padding.node.IsScalar()) {
      if (auto x = internal::ReadInt(diag, padding, 0, 4096)) v = {*x};
    } else {
      diag.Error(padding, "expected p, [left/right, top/bottom] or [left, top, right, bottom], got " +
                              internal::Describe(padding.node));
    }
    auto at = [&v](size_t i) { return static_cast<int>(v[i]); };
    if (v.size() == 1) s.padding = {at(0), at(0), at(0), at(0)};
    if (v.size() == 2 && padding.node.size() == 2) s.padding = {at(0), at(1), at(0), at(1)};
    if (v.size() == 4) s.padding = {at(0), at(1), at(2), at(3)};
  }
  if (auto v = internal::ReadBool(diag, m.Get("pad_if_needed"))) s.pad_if_needed = *v;
  if (auto v = internal::ReadChoice<PadMode>(diag, m.Get("pad_mode"),
                                             {{"constant", PadMode::kConstant},
                                              {"edge", PadMode::kEdge},
                                              {"reflect", PadMode::kReflect},
                                              {"symmetric", PadMode::kSymmetric}})) {
    s.mode = *v;
  }
  ReadFill(diag, m.Get("fill"), &s.fill);
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{RandomCropOp{s}, size};
}

// One list entry: a map with exactly one key naming the transform.
std::optional<ParsedOp> ReadTransform(Diagnostics& diag, const Field& item, ColorMode color) {
  if (!item.node.IsMap()) {
    diag.Error(item, std::string("a transform is a map with one key (") + kTransformNames + "), got " +
                         internal::Describe(item.node));
    return std::nullopt;
  }
  MapReader m(diag, item);
  if (m.entries().size() != 1) {
    std::string keys;
    for (const auto& e : m.entries()) keys += (keys.empty() ? "" : ", ") + e.key;
    diag.Error(item, std::string("a transform is a map with exactly one key (") + kTransformNames + "), got " +
                         std::to_string(m.entries().size()) + ": " + keys);
    return std::nullopt;
  }
  const std::string name = m.entries().front().key;
  if (name == "resize") return ReadResize(diag, m.Get("resize"));
  if (name == "center_crop") return ReadCenterCrop(diag, m.Get("center_crop"));
  if (name == "random_resized_crop") return ReadRandomResizedCrop(diag, m.Get("random_resized_crop"));
  if (name == "horizontal_flip") return ReadHorizontalFlip(diag, m.Get("horizontal_flip"));
  if (name == "normalize") return ReadNormalize(diag, m.Get("normalize"), color);
  if (name == "op") return ReadUserOp(diag, item, m.Get("op"));
  for (const auto& [aug, kind] : AugmentNames()) {
    if (name == aug) return ReadAugment(diag, kind, m.Get(name));
  }
  if (name == "random_erasing") return ReadRandomErasing(diag, m.Get(name), color);
  if (name == "random_crop") return ReadRandomCrop(diag, m.Get(name));
  std::string message = "unknown transform '" + name + "'";
  std::vector<std::string> known = {"resize",    "center_crop", "random_resized_crop", "horizontal_flip",
                                    "normalize", "op",          "random_erasing"};
  for (const auto& a : AugmentNames()) known.push_back(a.first);
  const std::string suggestion = internal::Suggest(name, known);
  if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
  diag.ErrorAtKey(m.entries().front().field, message + "; expected " + kTransformNames);
  return std::nullopt;
}

// The name a transform is written with in YAML.
const char* TransformName(const TransformOp& op) {
  if (std::holds_alternative<ResizeOp>(op)) return "resize";
  if (std::holds_alternative<CenterCropOp>(op)) return "center_crop";
  if (std::holds_alternative<RandomResizedCropOp>(op)) return "random_resized_crop";
  if (std::holds_alternative<HorizontalFlipOp>(op)) return "horizontal_flip";
  if (std::holds_alternative<UserOp>(op)) return "op";
  if (const auto* a = std::get_if<AugmentOp>(&op)) {
    for (const auto& [name, kind] : AugmentNames()) {
      if (kind == a->spec.kind) return name.c_str();
    }
  }
  if (std::holds_alternative<RandomErasingOp>(op)) return "random_erasing";
  if (std::holds_alternative<RandomCropOp>(op)) return "random_crop";
  return "normalize";
}

// Reads the transform list and computes the output size into *out. Returns the normalize entry,
// if any, for the check against output.dtype.
//
// Order rules: random_resized_crop replaces resize and center_crop (never with them);
// horizontal_flip and normalize come after every geometric transform; an op before normalize and
// either before every geometric transform or after every one;
// each of random_resized_crop, horizontal_flip and normalize at most once, op at most 16 times.
std::optional<Field> ReadTransforms(Diagnostics& diag, const Field& field, JobConfig* out) {
  if (!Present(field) || field.node.IsNull()) {
    diag.ErrorAtKey(field, kNeedFixedSize);
    return std::nullopt;
  }
  std::optional<std::vector<Field>> items = internal::ReadList(diag, field);
  if (!items) return std::nullopt;
  if (items->empty()) {
    diag.ErrorAtKey(field, kNeedFixedSize);
    return std::nullopt;
  }
  // The image size as the chain goes: unknown (as decoded), shorter side known, or fixed.
  enum class Size { kAsDecoded, kShorter, kFixed } state = Size::kAsDecoded;
  int shorter = 0, height = 0, width = 0;
  bool all_ok = true;
  bool seen_resize_or_crop = false;
  std::string seen_random_crop, seen_flip, seen_normalize, seen_op;  // the item path, once seen
  std::string seen_augment, seen_erasing, seen_random_crop_op;
  size_t user_ops = 0;
  bool seen_geometry = false;
  std::optional<Field> normalize_item;
  for (const Field& item : *items) {
    std::optional<ParsedOp> parsed = ReadTransform(diag, item, out->decode.color);
    if (!parsed) {
      all_ok = false;
      continue;
    }
    const std::string name = TransformName(parsed->op);
    const bool user_op = std::holds_alternative<UserOp>(parsed->op);
    const bool augment = std::holds_alternative<AugmentOp>(parsed->op);
    const bool erasing = std::holds_alternative<RandomErasingOp>(parsed->op);
    const bool random_crop = std::holds_alternative<RandomCropOp>(parsed->op);
    const bool geometric = !std::holds_alternative<HorizontalFlipOp>(parsed->op) &&
                           !std::holds_alternative<NormalizeOp>(parsed->op) && !user_op && !augment && !erasing &&
                           !random_crop;
    if (random_crop) {
      if (!seen_random_crop_op.empty())
        diag.Error(item, "only one random_crop (the first is " + seen_random_crop_op + ")");
      if (!seen_flip.empty() || !seen_augment.empty() || !seen_normalize.empty() || !seen_op.empty()) {
        diag.Error(item,
                   "random_crop comes right after the geometry (resize, center_crop, random_resized_crop), "
                   "before horizontal_flip, ops, augmentations and normalize");
      } else if (all_ok && state != Size::kFixed) {
        diag.Error(item,
                   "random_crop needs a fixed-size image before it: end the geometry with center_crop, "
                   "resize {height, width} or random_resized_crop");
      }
      seen_random_crop_op = item.path;
    }
    if (geometric && !seen_random_crop_op.empty()) {
      diag.Error(item, name + " comes after random_crop (" + seen_random_crop_op + "): the geometry comes first");
    }
    // Built-in augmentations: after every geometric transform, before normalize; random_erasing last.
    if (!seen_erasing.empty()) {
      diag.Error(item, name + " comes after random_erasing (" + seen_erasing +
                           "): random_erasing works on the final tensor, so it is the last transform");
    }
    if (erasing) {
      if (!seen_erasing.empty()) diag.Error(item, "only one random_erasing (the first is " + seen_erasing + ")");
      seen_erasing = item.path;
    }
    if (augment) {
      if (!seen_normalize.empty()) {
        diag.Error(item, name + " comes after normalize (" + seen_normalize +
                             "): augmentations work on uint8 pixels, so they come before normalize");
      }
      if (seen_augment.empty()) seen_augment = item.path;
    }
    if (geometric && !seen_augment.empty()) {
      diag.Error(item, name + " comes after " + seen_augment +
                           ": resize, center_crop and random_resized_crop come before the augmentations");
    }
    if (augment && !seen_geometry) {
      diag.Error(item, name +
                           " comes before the geometry: augmentations run on the output-size image, after "
                           "resize / center_crop / random_resized_crop");
    }
    if (geometric && (!seen_flip.empty() || !seen_normalize.empty())) {
      diag.Error(item, name + " comes after " + (seen_flip.empty() ? "normalize" : "horizontal_flip") +
                           ": resize, center_crop and random_resized_crop must come before "
                           "horizontal_flip and normalize");
    } else if (geometric && !seen_op.empty()) {
      diag.Error(item, name + " comes after the op at " + seen_op +
                           ", which follows a geometric transform: an op runs either before all of resize, "
                           "center_crop and random_resized_crop (on the whole decoded image) or after all of "
                           "them (on the output-size image)");
    }
    if (geometric) seen_geometry = true;
    if (user_op) {
      if (!seen_normalize.empty()) {
        diag.Error(item, "op comes after normalize (" + seen_normalize +
                             "): ops work on uint8 pixels, so they come before normalize");
      }
      if (++user_ops == kMaxUserOps + 1) {
        diag.Error(item, "at most " + std::to_string(kMaxUserOps) + " ops in one job");
      }
      if (seen_op.empty() && seen_geometry) seen_op = item.path;  // an op after some geometry
    }
    out->transforms.push_back(parsed->op);
    if (const auto* r = std::get_if<ResizeOp>(&parsed->op)) {
      seen_resize_or_crop = true;
      if (r->shorter > 0) {
        state = Size::kShorter;
        shorter = r->shorter;
      } else {
        state = Size::kFixed;
        height = r->height;
        width = r->width;
      }
    } else if (const auto* c = std::get_if<CenterCropOp>(&parsed->op)) {
      seen_resize_or_crop = true;
      const std::string crop = std::to_string(c->height) + "x" + std::to_string(c->width);
      if (state == Size::kShorter && (c->height > shorter || c->width > shorter)) {
        diag.Error(parsed->size_field, "center_crop " + crop + " is larger than the shorter side (" +
                                           std::to_string(shorter) + ") after the resize before it");
      } else if (state == Size::kFixed && (c->height > height || c->width > width)) {
        diag.Error(parsed->size_field, "center_crop " + crop + " is larger than the image (" + std::to_string(height) +
                                           "x" + std::to_string(width) + ") after the transforms before it");
      }
      state = Size::kFixed;
      height = c->height;
      width = c->width;
    } else if (const auto* rc = std::get_if<RandomResizedCropOp>(&parsed->op)) {
      if (!seen_random_crop.empty()) {
        diag.Error(item, "only one random_resized_crop (the first is " + seen_random_crop + ")");
      }
      seen_random_crop = item.path;
      state = Size::kFixed;
      height = rc->height;
      width = rc->width;
    } else if (random_crop) {
      const RandomCropSpec& rc = std::get<RandomCropOp>(parsed->op).spec;
      if (state == Size::kFixed && !rc.pad_if_needed &&
          (rc.height > height + rc.padding[1] + rc.padding[3] || rc.width > width + rc.padding[0] + rc.padding[2])) {
        diag.Error(parsed->size_field, "random_crop " + std::to_string(rc.height) + "x" + std::to_string(rc.width) +
                                           " is larger than the padded image (" +
                                           std::to_string(height + rc.padding[1] + rc.padding[3]) + "x" +
                                           std::to_string(width + rc.padding[0] + rc.padding[2]) +
                                           "): lower it, add padding or set pad_if_needed: true");
      }
      state = Size::kFixed;
      height = rc.height;
      width = rc.width;
    } else if (user_op || augment || erasing) {
      // no size change; order checked above
    } else if (std::holds_alternative<HorizontalFlipOp>(parsed->op)) {
      if (!seen_flip.empty()) {
        diag.Error(item, "only one horizontal_flip (the first is " + seen_flip + ")");
      }
      seen_flip = item.path;
    } else {
      if (!seen_normalize.empty()) {
        diag.Error(item, "only one normalize (the first is " + seen_normalize + ")");
      }
      seen_normalize = item.path;
      normalize_item = item;
    }
    if (!seen_random_crop.empty() && seen_resize_or_crop &&
        (std::holds_alternative<RandomResizedCropOp>(parsed->op) || std::holds_alternative<ResizeOp>(parsed->op) ||
         std::holds_alternative<CenterCropOp>(parsed->op))) {
      diag.Error(item,
                 "random_resized_crop replaces resize and center_crop: it cannot be "
                 "combined with them");
    }
  }
  if (!all_ok) return normalize_item;  // the size of a chain with a bad link is unknown
  if (state != Size::kFixed) {
    diag.ErrorAtKey(field, kNeedFixedSize);
    return normalize_item;
  }
  out->out_height = height;
  out->out_width = width;
  return normalize_item;
}

// `first`: the first stage, whose queue is the slot ring's rows (not configurable).
void ReadStage(Diagnostics& diag, const Field& field, bool first, StageConfig* out) {
  MapReader m(diag, field);
  if (auto v = internal::ReadInt(diag, m.Get("concurrency"), 1, 1024)) out->concurrency = static_cast<int>(*v);
  const Field queue = m.Get("queue");
  if (first && Present(queue)) {
    diag.ErrorAtKey(queue,
                    "the first stage is fed by the slot ring (prefetch x batch.size rows): set prefetch "
                    "instead");
  } else if (auto v = internal::ReadInt(diag, queue, 1, 65536)) {
    out->queue = static_cast<int>(*v);
  }
  m.ReportUnknownKeys();
}

void ReadStages(Diagnostics& diag, const Field& field, StagesConfig* out) {
  MapReader m(diag, field);
  ReadStage(diag, m.Get("read"), /*first=*/true, &out->read);
  ReadStage(diag, m.Get("decode"), /*first=*/false, &out->decode);
  m.ReportUnknownKeys();
}

// max_failures: an integer count (100) or a decimal fraction in [0, 1] (0.01).
void ReadMaxFailures(Diagnostics& diag, const Field& f, MaxFailures* out) {
  if (!Present(f)) return;
  if (f.node.IsScalar()) {
    const std::string& s = f.node.Scalar();
    int64_t count = 0;
    const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), count);
    if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty()) {
      if (count < 0) {
        diag.Error(f, "a count must be at least 0 (got " + s + ")");
      } else {
        out->count = count;
        out->fraction = -1;  // the limit given replaces the default one
      }
      return;
    }
  }
  std::optional<double> v = ReadNumber(diag, f);
  if (!v) return;
  if (*v < 0 || *v > 1) {
    diag.Error(
        f, "must be a count (an integer, e.g. 100) or a fraction between 0 and 1 (e.g. 0.01), got " + FormatNumber(*v));
    return;
  }
  out->fraction = *v;
  out->count = -1;
}

// audio: {sample_rate, channels, length | seconds, crop, dtype, max_seconds}.
void ReadAudio(Diagnostics& diag, const Field& field, AudioConfig* out) {
  MapReader m(diag, field);
  if (auto v = internal::ReadInt(diag, m.Get("sample_rate"), 1, 768000)) out->sample_rate = static_cast<int>(*v);
  const Field channels = m.Get("channels");
  if (auto v = internal::ReadInt(diag, channels, 1, 2)) out->channels = static_cast<int>(*v);
  const Field length = m.Get("length");
  const Field seconds = m.Get("seconds");
  constexpr int64_t kMaxLength = int64_t{1} << 31;
  if (Present(length) && Present(seconds)) {
    diag.ErrorAtKey(seconds, "audio takes either 'length' (samples) or 'seconds', not both");
  } else if (Present(length)) {
    if (auto v = internal::ReadInt(diag, length, 1, kMaxLength)) out->length = *v;
  } else if (Present(seconds)) {
    if (auto v = ReadNumber(diag, seconds)) {
      const double samples = std::round(*v * out->sample_rate);
      if (!(*v > 0) || samples < 1 || samples > static_cast<double>(kMaxLength)) {
        diag.Error(seconds, "must be > 0 and at most 2^31 samples at sample_rate " + std::to_string(out->sample_rate) +
                                " (got " + FormatNumber(*v) + ")");
      } else {
        out->length = static_cast<int64_t>(samples);
      }
    }
  } else if (m.ok()) {
    diag.ErrorAtKey(field, "audio needs 'length' (samples per channel) or 'seconds'");
  }
  if (auto v = internal::ReadChoice<AudioCrop>(diag, m.Get("crop"),
                                               {{"start", AudioCrop::kStart}, {"random", AudioCrop::kRandom}})) {
    out->crop = *v;
  }
  if (auto v = internal::ReadChoice<AudioDType>(diag, m.Get("dtype"),
                                                {{"float32", AudioDType::kFloat32}, {"int16", AudioDType::kInt16}})) {
    out->dtype = *v;
  }
  const Field max_seconds = m.Get("max_seconds");
  if (auto v = ReadNumber(diag, max_seconds)) {
    if (*v <= 0)
      diag.Error(max_seconds, "must be > 0 (got " + FormatNumber(*v) + ")");
    else
      out->max_seconds = *v;
  }
  m.ReportUnknownKeys();
}

// video: {frames, stride | fps, start, height, width, interpolation}.
void ReadVideo(Diagnostics& diag, const Field& field, VideoConfig* out) {
  MapReader m(diag, field);
  if (auto v = internal::ReadInt(diag, m.Get("frames"), 1, 4096)) out->frames = static_cast<int>(*v);
  const Field stride = m.Get("stride");
  const Field fps = m.Get("fps");
  if (Present(stride) && Present(fps)) {
    diag.ErrorAtKey(fps, "video takes either 'stride' or 'fps', not both");
  } else if (auto v = internal::ReadInt(diag, stride, 1, 10000)) {
    out->stride = static_cast<int>(*v);
  } else if (auto f = ReadNumber(diag, fps)) {
    if (!(*f > 0 && *f <= 1000))
      diag.Error(fps, "must be in (0, 1000] (got " + FormatNumber(*f) + ")");
    else
      out->fps = *f;
  }
  const Field start = m.Get("start");
  if (Present(start)) {
    if (start.node.IsScalar() && start.node.Scalar() == "random") {
      out->random_start = true;
    } else if (start.node.IsScalar()) {
      const std::string& s = start.node.Scalar();
      double value = 0;
      const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
      if (ec != std::errc() || ptr != s.data() + s.size() || s.empty() || !std::isfinite(value) || value < 0) {
        diag.Error(start, "must be a time in seconds >= 0 or 'random' (got '" + s + "')");
      } else {
        out->start_seconds = value;
      }
    } else {
      diag.Error(start, "must be a time in seconds >= 0 or 'random', got " + internal::Describe(start.node));
    }
  }
  const Field height = m.Require("height");
  const Field width = m.Require("width");
  if (auto v = internal::ReadInt(diag, height, 1, kMaxImageSide)) out->height = static_cast<int>(*v);
  if (auto v = internal::ReadInt(diag, width, 1, kMaxImageSide)) out->width = static_cast<int>(*v);
  if (auto v = ReadVideoInterpolation(diag, m.Get("interpolation"))) out->interpolation = *v;
  m.ReportUnknownKeys();
}

// The tensors a job of this media kind has before its extra outputs.
std::vector<std::string> OwnTensorNames(Media media) {
  switch (media) {
    case Media::kImage:  // with the targets' names (boxes: a coco source; mask), reserved for them
      return {"image", "label", "boxes", "box_labels", "box_count", "mask"};
    case Media::kAudio:
      return {"audio", "length", "label"};
    case Media::kVideo:
      return {"video", "frames", "label"};
  }
  return {"label"};
}

constexpr int64_t kMaxExtraBytes = int64_t{1} << 24;
constexpr size_t kMaxExtraOutputs = 16;

// extra_outputs: [{name, from, max_bytes, on_missing, on_overflow}, ...].
void ReadExtraOutputs(Diagnostics& diag, const Field& field, JobConfig* out) {
  if (!Present(field)) return;
  std::optional<std::vector<Field>> items = internal::ReadList(diag, field);
  if (!items) return;
  if (out->source.type == SourceType::kHttp && !items->empty()) {
    diag.ErrorAtKey(field,
                    "extra_outputs read sidecar files, which source type http does not have (use image_folder, "
                    "file_list or tar)");
    return;
  }
  if (out->source.type == SourceType::kS3Prefix && !items->empty()) {
    diag.ErrorAtKey(field,
                    "extra_outputs read sidecar files, which source type s3_prefix does not have (use tar shards "
                    "in s3://, whose members are read as sidecars)");
    return;
  }
  if (items->size() > kMaxExtraOutputs) {
    diag.ErrorAtKey(field, "at most " + std::to_string(kMaxExtraOutputs) + " extra outputs (got " +
                               std::to_string(items->size()) + ")");
  }
  std::vector<std::string> taken = OwnTensorNames(out->media);
  for (const Field& item : *items) {
    if (!item.node.IsMap()) {
      diag.Error(item, "an extra output is a map {name, from, max_bytes[, on_missing, on_overflow]}, got " +
                           internal::Describe(item.node));
      continue;
    }
    const size_t errors_before = diag.count();
    MapReader m(diag, item);
    ExtraOutputConfig e;
    const Field name = m.Require("name");
    if (auto v = internal::ReadString(diag, name)) {
      const bool well_formed = !v->empty() && v->size() <= 64 && std::all_of(v->begin(), v->end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
      });
      if (!well_formed) {
        diag.Error(name, "a tensor name is 1 to 64 letters, digits or '_' (got '" + *v + "')");
      } else {
        const std::string length = *v + "_length";
        for (const std::string& n : {*v, length}) {
          if (std::find(taken.begin(), taken.end(), n) != taken.end()) {
            std::string names;
            for (const std::string& t : taken) names += (names.empty() ? "" : ", ") + t;
            diag.Error(name, "the batch already has a tensor '" + n + "' (its tensors: " + names + ")");
            break;
          }
        }
        taken.push_back(*v);
        taken.push_back(length);
        e.name = *v;
      }
    }
    const Field from = m.Require("from");
    if (auto v = internal::ReadString(diag, from)) {
      if (v->size() < 2 || v->front() != '.' || v->find('/') != std::string::npos) {
        diag.Error(from, "the sidecar's ending starts with '.' and has no '/', e.g. .txt (got '" + *v + "')");
      } else {
        e.from = *v;
      }
    }
    if (auto v = internal::ReadInt(diag, m.Require("max_bytes"), 1, kMaxExtraBytes)) e.max_bytes = *v;
    if (auto v = internal::ReadChoice<ExtraOutputConfig::OnMissing>(
            diag, m.Get("on_missing"),
            {{"error", ExtraOutputConfig::OnMissing::kError}, {"empty", ExtraOutputConfig::OnMissing::kEmpty}})) {
      e.on_missing = *v;
    }
    if (auto v = internal::ReadChoice<ExtraOutputConfig::OnOverflow>(
            diag, m.Get("on_overflow"),
            {{"error", ExtraOutputConfig::OnOverflow::kError},
             {"truncate", ExtraOutputConfig::OnOverflow::kTruncate}})) {
      e.on_overflow = *v;
    }
    m.ReportUnknownKeys();
    if (diag.count() == errors_before) out->extra_outputs.push_back(std::move(e));
  }
}

// mask: {from: .png, on_missing: error|empty} (see MaskConfig).
void ReadMask(Diagnostics& diag, const Field& field, JobConfig* out) {
  if (!Present(field)) return;
  if (out->media != Media::kImage) {
    diag.ErrorAtKey(
        field, std::string("'mask' applies to media: image only (this job's media is ") + MediaName(out->media) + ")");
    return;
  }
  if (out->source.type == SourceType::kHttp || out->source.type == SourceType::kCoco) {
    diag.ErrorAtKey(field, out->source.type == SourceType::kCoco
                               ? "a coco source rasterises its polygons with source.masks: true, not a mask sidecar"
                               : "a mask is a sidecar file, which source type http does not have (use image_folder, "
                                 "file_list or tar)");
    return;
  }
  MapReader m(diag, field);
  if (!m.ok()) return;
  const Field from = m.Require("from");
  if (auto v = internal::ReadString(diag, from)) {
    if (v->size() < 2 || v->front() != '.' || v->find('/') != std::string::npos) {
      diag.Error(from, "the sidecar's ending starts with '.' and has no '/', e.g. .png (got '" + *v + "')");
    } else {
      out->mask.from = *v;
    }
  }
  if (auto v = internal::ReadChoice<bool>(diag, m.Get("on_missing"), {{"error", false}, {"empty", true}})) {
    out->mask.empty_on_missing = *v;
  }
  m.ReportUnknownKeys();
}

// cache: {decoded: {max_side, max_bytes}}. After ReadMask (it checks the mask against it).
void ReadCache(Diagnostics& diag, const Field& field, JobConfig* out) {
  if (!Present(field)) return;
  MapReader m(diag, field);
  if (!m.ok()) return;
  const Field decoded = m.Get("decoded");
  if (Present(decoded)) {
    if (out->media != Media::kImage) {
      diag.ErrorAtKey(decoded, std::string("'cache.decoded' applies to media: image only (this job's media is ") +
                                   MediaName(out->media) + ")");
    } else if (out->decode.exif_orientation) {
      diag.ErrorAtKey(decoded, "cache.decoded keeps images as stored: it cannot be used with decode.exif_orientation");
    } else if (!out->mask.from.empty()) {
      diag.ErrorAtKey(decoded,
                      "cache.decoded shrinks the image, which a mask sidecar of the stored size would not "
                      "follow: it cannot be used with mask");
    } else if (out->source.type == SourceType::kCoco) {
      diag.ErrorAtKey(decoded,
                      "cache.decoded shrinks the image, which a coco source's boxes and polygons (in stored "
                      "pixels) would not follow: it cannot be used with a coco source");
    } else {
      MapReader d(diag, decoded);
      if (d.ok()) {
        if (auto v = internal::ReadInt(diag, d.Require("max_side"), 16, 16384))
          out->cache.decoded.max_side = static_cast<int>(*v);
        if (auto v = internal::ReadInt(diag, d.Get("max_bytes"), int64_t{1} << 20, int64_t{1} << 40))
          out->cache.decoded.max_bytes = *v;
        d.ReportUnknownKeys();
      }
    }
  }
  m.ReportUnknownKeys();
}

// mix: {mixup: {alpha}, cutmix: {alpha}, switch_prob, prob, num_classes, label_smoothing}.
void ReadMix(Diagnostics& diag, const Field& field, JobConfig* out) {
  if (!Present(field)) return;
  if (out->media != Media::kImage) {
    diag.ErrorAtKey(
        field, std::string("'mix' applies to media: image only (this job's media is ") + MediaName(out->media) + ")");
    return;
  }
  if (out->source.type == SourceType::kCoco) {
    diag.ErrorAtKey(field, "mix blends class labels: a coco source's samples have boxes, not a class label");
    return;
  }
  MapReader m(diag, field);
  if (!m.ok()) return;
  MixConfig& c = out->mix;
  auto fraction = [&](const char* key, double* dst) {
    const Field f = m.Get(key);
    if (auto v = ReadNumber(diag, f)) {
      if (*v < 0 || *v > 1)
        diag.Error(f, "must be between 0 and 1 (got " + FormatNumber(*v) + ")");
      else
        *dst = *v;
    }
  };
  auto alpha = [&](const char* key, double* dst) {
    const Field f = m.Get(key);
    if (!Present(f)) return;
    MapReader a(diag, f);
    if (!a.ok()) return;
    const Field af = a.Require("alpha");
    if (auto v = ReadNumber(diag, af)) {
      if (*v <= 0 || *v > 1000)
        diag.Error(af, "must be > 0 and at most 1000 (got " + FormatNumber(*v) + ")");
      else
        *dst = *v;
    }
    a.ReportUnknownKeys();
  };
  alpha("mixup", &c.mixup_alpha);
  alpha("cutmix", &c.cutmix_alpha);
  fraction("switch_prob", &c.switch_prob);
  fraction("prob", &c.prob);
  const Field classes = m.Require("num_classes");
  if (auto v = internal::ReadInt(diag, classes, 1, 100000)) c.num_classes = static_cast<int>(*v);
  const Field smoothing = m.Get("label_smoothing");
  if (auto v = ReadNumber(diag, smoothing)) {
    if (*v < 0 || *v >= 1)
      diag.Error(smoothing, "must be >= 0 and below 1 (got " + FormatNumber(*v) + ")");
    else
      c.label_smoothing = *v;
  }
  if (!c.enabled() && !Present(m.Get("mixup")) && !Present(m.Get("cutmix"))) {
    diag.ErrorAtKey(field, "mix needs mixup: {alpha} or cutmix: {alpha} (or both)");
  }
  m.ReportUnknownKeys();
}

// Image-only keys in an audio or video job: each is an error at its key.
// decode.device: cuda: what the GPU path needs of the rest of the job, each missing piece named.
void CheckGpuDecode(Diagnostics& diag, const Field& device, const JobConfig& c) {
  const std::string what = "decode.device: cuda ";
  if (c.output.cuda_device < 0) {
    diag.Error(device, what +
                           "decodes into the job's GPU slots: it needs output.device: cuda:N (this job delivers to " +
                           c.output.device + ")");
  } else if (c.output.copy != OutputConfig::Copy::kDaemon) {
    diag.Error(device, what +
                           "needs output.copy: daemon (spdld decodes into its own device slots; with copy: client "
                           "it has none)");
  }
  if (c.decode.resample != Resample::kExact) {
    diag.Error(device, what + "computes PIL's exact resampling: decode.resample: fast has no GPU path");
  }
  if (c.decode.color != ColorMode::kRgb) diag.Error(device, what + "decodes to RGB only (decode.color: gray)");
  if (c.decode.exif_orientation) diag.Error(device, what + "does not apply EXIF orientation (decode.exif_orientation)");
  for (const TransformOp& t : c.transforms) {
    const bool gpu = std::holds_alternative<ResizeOp>(t) || std::holds_alternative<CenterCropOp>(t) ||
                     std::holds_alternative<RandomResizedCropOp>(t) || std::holds_alternative<HorizontalFlipOp>(t) ||
                     std::holds_alternative<NormalizeOp>(t);
    if (!gpu) {
      diag.Error(device, what +
                             "runs resize, center_crop, random_resized_crop, horizontal_flip and normalize only; "
                             "this job has other transforms (augmentations, user ops, random erasing, random crop)");
      break;
    }
  }
  if (!c.mask.from.empty() || c.source.type == SourceType::kCoco) {
    diag.Error(device, what + "has no path for masks or boxes (mask, a coco source)");
  }
  if (c.mix.enabled()) diag.Error(device, what + "has no path for mixup / cutmix (mix)");
  bool jpeg = false;
  for (const std::string& e : c.source.extensions)
    jpeg = jpeg || e == ".jpg" || e == ".jpeg" || e == ".JPG" || e == ".JPEG";
  if (!c.source.extensions.empty() && !jpeg) {
    diag.Error(device, what +
                           "decodes JPEG: source.extensions lists no .jpg or .jpeg (other formats would all go "
                           "to the CPU)");
  }
}

void RefuseImageKeys(Diagnostics& diag, MapReader& m, Media media) {
  const std::string why = std::string(" applies to media: image only (this job's media is ") + MediaName(media) + ")";
  for (const char* key : {"transforms", "decode"}) {
    const Field f = m.Get(key);
    if (Present(f)) diag.ErrorAtKey(f, std::string("'") + key + "'" + why);
  }
  const Field output = m.Get("output");
  if (!Present(output) || !output.node.IsMap()) return;
  MapReader o(diag, output);
  for (const char* key : {"dtype", "layout"}) {
    const Field f = o.Get(key);
    if (Present(f)) {
      diag.ErrorAtKey(f, std::string("output.") + key + why +
                             (media == Media::kAudio ? "; audio sets its dtype in audio.dtype" : "; video is uint8"));
    }
  }
}

void ReadJob(Diagnostics& diag, const Field& root, JobConfig* out) {
  MapReader m(diag, root);
  if (!m.ok()) return;  // not a map: nothing else can be said
  if (auto v = internal::ReadChoice<Media>(
          diag, m.Get("media"), {{"image", Media::kImage}, {"audio", Media::kAudio}, {"video", Media::kVideo}})) {
    out->media = *v;
  }
  const Field audio = m.Get("audio");
  const Field video = m.Get("video");
  for (const auto& [f, kind] : {std::pair{audio, Media::kAudio}, std::pair{video, Media::kVideo}}) {
    if (Present(f) && out->media != kind) {
      diag.ErrorAtKey(f, std::string("'") + MediaName(kind) + "' applies to media: " + MediaName(kind) +
                             " only (this job's media is " + MediaName(out->media) + ")");
    }
  }
  if (out->media == Media::kAudio) {
    if (Present(audio))
      ReadAudio(diag, audio, &out->audio);
    else
      diag.ErrorAtKey(m.Get("media"), "media: audio needs an audio block with 'length' or 'seconds'");
  }
  if (out->media == Media::kVideo) {
    if (Present(video))
      ReadVideo(diag, video, &out->video);
    else
      diag.ErrorAtKey(m.Get("media"), "media: video needs a video block with 'height' and 'width'");
  }
  const Field source_field = m.Get("source");
  const Field sources_field = m.Get("sources");
  if (Present(sources_field)) {
    if (Present(source_field)) {
      diag.ErrorAtKey(source_field, "give either `source` (one dataset) or `sources` (a mix), not both");
    }
    ReadSources(diag, sources_field, out);
  } else {
    ReadSource(diag, source_field, out->media, &out->source);
  }
  ReadSampler(diag, m.Get("sampler"), Present(sources_field), &out->sampler);
  ReadBatch(diag, m.Get("batch"), &out->batch);
  std::optional<Field> normalize;
  Field decode_device;
  if (out->media == Media::kImage) {
    const Field resample = ReadDecode(diag, m.Get("decode"), &out->decode, &decode_device);
    normalize = ReadTransforms(diag, m.Get("transforms"), out);
    if (out->decode.resample == Resample::kFast) {
      for (const TransformOp& t : out->transforms) {
        const auto* r = std::get_if<ResizeOp>(&t);
        const auto* c = std::get_if<RandomResizedCropOp>(&t);
        if ((r && r->interpolation == Interpolation::kHamming) || (c && c->interpolation == Interpolation::kHamming)) {
          diag.Error(resample, "hamming interpolation has no fast path: use resample: exact");
          break;
        }
      }
    }
  } else {
    RefuseImageKeys(diag, m, out->media);
  }
  ReadOutput(diag, m.Get("output"), &out->output);
  ReadExtraOutputs(diag, m.Get("extra_outputs"), out);
  ReadMask(diag, m.Get("mask"), out);
  ReadMix(diag, m.Get("mix"), out);
  if (Present(sources_field)) CheckMixedSources(diag, sources_field, out);
  if (out->media == Media::kImage && out->decode.device == DecodeDevice::kCuda) {
    CheckGpuDecode(diag, decode_device, *out);
  }
  ReadCache(diag, m.Get("cache"), out);
  if (normalize && out->output.dtype == DType::kUInt8) {
    diag.Error(*normalize,
               "normalize needs a floating-point output.dtype (float32, float16 or "
               "bfloat16), not uint8");
  }
  if (auto v = internal::ReadInt(diag, m.Get("prefetch"), 1, 64)) out->prefetch = static_cast<int>(*v);
  if (auto v = internal::ReadChoice<OnError>(diag, m.Get("on_error"),
                                             {{"skip", OnError::kSkip}, {"fail", OnError::kFail}})) {
    out->on_error = *v;
  }
  ReadStages(diag, m.Get("stages"), &out->stages);
  if (auto v = internal::ReadChoice<Order>(diag, m.Get("order"),
                                           {{"sampler", Order::kSampler}, {"completion", Order::kCompletion}})) {
    out->order = *v;
  }
  ReadMaxFailures(diag, m.Get("max_failures"), &out->max_failures);
  if (auto v = internal::ReadInt(diag, m.Get("max_failures_warmup"), 0, 1000000000)) {
    out->max_failures_warmup = static_cast<int>(*v);
  }
  if (auto v = internal::ReadInt(diag, m.Get("weight"), 1, 1000)) out->weight = static_cast<int>(*v);
  if (const Field f = m.Get("max_batch_delay_ms"); Present(f)) {
    if (auto v = internal::ReadInt(diag, f, 0, 3'600'000)) {
      if (out->source.type != SourceType::kStream && out->source.type != SourceType::kWatch && *v > 0) {
        diag.Error(f, "max_batch_delay_ms applies to source.type: stream and watch only");
      } else {
        out->max_batch_delay_ms = *v;
      }
    }
  }
  if (auto v = internal::ReadBool(diag, m.Get("share"))) out->share = *v;
  if (auto v = internal::ReadInt(diag, m.Get("share_members"), 1, 1024)) out->share_members = static_cast<int>(*v);
  if (const Field wait = m.Get("share_wait_seconds"); auto v = ReadNumber(diag, wait)) {
    if (*v <= 0 || *v > 86400)
      diag.Error(wait, "must be > 0 and at most 86400 (got " + FormatNumber(*v) + ")");
    else
      out->share_wait_seconds = *v;
  }
  m.ReportUnknownKeys();
}

}  // namespace

const char* MediaName(Media media) {
  switch (media) {
    case Media::kImage:
      return "image";
    case Media::kAudio:
      return "audio";
    case Media::kVideo:
      return "video";
  }
  return "?";
}

const char* SourceTypeName(SourceType type) {
  switch (type) {
    case SourceType::kImageFolder:
      return "image_folder";
    case SourceType::kFileList:
      return "file_list";
    case SourceType::kTar:
      return "tar";
    case SourceType::kHttp:
      return "http";
    case SourceType::kCoco:
      return "coco";
    case SourceType::kS3Prefix:
      return "s3_prefix";
    case SourceType::kWatch:
      return "watch";
    case SourceType::kStream:
      return "stream";
  }
  return "?";
}

bool SourceConfig::UsesS3() const {
  if (type == SourceType::kS3Prefix) return true;
  if (type != SourceType::kTar) return false;
  return std::any_of(shards.begin(), shards.end(), [](const std::string& s) { return s.rfind("s3://", 0) == 0; });
}

std::string CheckJobConfigShape(std::string_view text, const std::vector<Override>& overrides) {
  size_t total = text.size();
  for (const Override& o : overrides) total += o.path.size() + o.value.size();
  if (total > kMaxJobConfigBytes) {
    return "the job config (with its overrides) is " + std::to_string(total) + " bytes, more than the " +
           std::to_string(kMaxJobConfigBytes) + " a job config may have";
  }
  // Nesting, counted before yaml-cpp builds anything: flow brackets outside quotes, and block
  // indentation levels (a stack of the indents in force).
  auto depth_of = [](std::string_view t) {
    size_t flow = 0, deepest = 0;
    std::vector<size_t> indents;
    bool line_start = true;
    size_t indent = 0;
    char quote = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      const char c = t[i];
      if (c == '\n') {
        line_start = true;
        indent = 0;
        if (quote == '\'') quote = 0;  // keep it simple: quotes do not span lines here
        continue;
      }
      if (line_start) {
        if (c == ' ') {
          ++indent;
          continue;
        }
        line_start = false;
        if (c != '#') {
          while (!indents.empty() && indents.back() > indent) indents.pop_back();
          if (indents.empty() || indents.back() < indent) indents.push_back(indent);
        }
      }
      if (quote) {
        if (c == quote) quote = 0;
        continue;
      }
      if (c == '"' || c == '\'')
        quote = c;
      else if (c == '#') {
        while (i + 1 < t.size() && t[i + 1] != '\n') ++i;
      } else if (c == '[' || c == '{') {
        deepest = std::max(deepest, indents.size() + ++flow);
      } else if ((c == ']' || c == '}') && flow > 0) {
        --flow;
      }
      deepest = std::max(deepest, indents.size() + flow);
    }
    return deepest;
  };
  size_t depth = depth_of(text);
  for (const Override& o : overrides) depth = std::max(depth, depth_of(o.value));
  if (depth > kMaxJobConfigDepth) {
    return "the job config nests " + std::to_string(depth) + " levels deep, more than the " +
           std::to_string(kMaxJobConfigDepth) + " a job config may have";
  }
  return "";
}

JobConfigResult ParseJobConfig(std::string_view yaml_text, const std::vector<Override>& overrides) {
  std::vector<std::string> override_paths;
  override_paths.reserve(overrides.size());
  for (const Override& o : overrides) override_paths.push_back(o.path);
  Diagnostics diag(std::move(override_paths));
  JobConfig config;
  // Limits first: a client's text is checked before any YAML node is built.
  if (std::string why = CheckJobConfigShape(yaml_text, overrides); !why.empty()) {
    diag.ErrorNoLine("", why);
    JobConfigResult refused;
    refused.errors = diag.Take();
    return refused;
  }
  try {  // yaml-cpp throws; nothing may escape this module
    std::optional<YAML::Node> root = internal::LoadDocument(yaml_text, overrides, &diag);
    if (root) ReadJob(diag, internal::RootField(*root), &config);
  } catch (const std::exception& e) {
    diag.ErrorNoLine("", std::string("internal error while reading the job config: ") + e.what());
  }
  JobConfigResult result;
  result.errors = diag.Take();
  if (result.errors.empty()) result.config = std::move(config);
  return result;
}

}  // namespace spdl::config
