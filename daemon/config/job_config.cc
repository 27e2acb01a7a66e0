#include "config/job_config.h"

#include <algorithm>
#include <cctype>
#include <exception>
#include <utility>

#include "config/yaml_reader.h"

namespace spdl::config {
namespace {

using internal::Diagnostics;
using internal::Field;
using internal::MapReader;
using internal::Present;

constexpr int64_t kMaxImageSide = 16384;
constexpr const char* kNeedFixedSize =
    "transforms must produce a fixed image size (end with center_crop or resize {height, width})";

// "cuda" or "cuda:N".
bool IsCudaDevice(const std::string& device) {
  if (device == "cuda") return true;
  if (device.rfind("cuda:", 0) != 0 || device.size() == 5) return false;
  return std::all_of(device.begin() + 5, device.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void ReadSource(Diagnostics& diag, const Field& field, SourceConfig* out) {
  MapReader m(diag, field);
  const Field type = m.Get("type");
  if (auto v = internal::ReadString(diag, type)) {
    if (*v == "image_folder") {
      out->type = *v;
    } else {
      diag.Error(type, "source type '" + *v + "' is not supported (only image_folder)");
    }
  }
  const Field root = m.Require("root");
  if (auto v = internal::ReadString(diag, root)) {
    if (v->empty()) diag.Error(root, "must not be empty");
    else out->root = *v;
  }
  const Field exts = m.Get("extensions");
  if (auto list = internal::ReadList(diag, exts)) {
    if (list->empty()) diag.Error(exts, "must list at least one file name ending, e.g. [.jpg]");
    std::vector<std::string> lowered;
    for (const Field& item : *list) {
      std::optional<std::string> e = internal::ReadString(diag, item);
      if (!e) continue;
      if (e->size() < 2 || e->front() != '.') {
        diag.Error(item, "an extension starts with '.' and is not empty, e.g. .jpg (got '" + *e + "')");
        continue;
      }
      lowered.push_back(Lower(*e));
    }
    out->extensions = std::move(lowered);
  }
  m.ReportUnknownKeys();
}

void ReadSampler(Diagnostics& diag, const Field& field, SamplerConfig* out) {
  MapReader m(diag, field);
  if (auto v = internal::ReadBool(diag, m.Get("shuffle"))) out->shuffle = *v;
  if (auto v = internal::ReadUint64(diag, m.Get("seed"))) out->seed = *v;
  if (auto v = internal::ReadChoice<Uneven>(diag, m.Get("uneven"),
                                            {{"pad", Uneven::kPad}, {"drop", Uneven::kDrop}})) {
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
  const Field dtype = m.Get("dtype");
  if (auto v = internal::ReadString(diag, dtype)) {
    if (*v == "uint8") out->dtype = *v;
    else diag.Error(dtype, "dtype '" + *v + "' is not supported yet in this version (only uint8)");
  }
  const Field layout = m.Get("layout");
  if (auto v = internal::ReadString(diag, layout)) {
    if (*v == "NHWC") out->layout = *v;
    else diag.Error(layout, "layout '" + *v + "' is not supported yet in this version (only NHWC)");
  }
  const Field device = m.Get("device");
  if (auto v = internal::ReadString(diag, device)) {
    if (*v == "cpu") {
      out->device = *v;
    } else if (IsCudaDevice(*v)) {
      diag.Error(device, "device '" + *v +
                             "' is not supported yet in this version (only cpu; GPU delivery "
                             "comes later)");
    } else {
      diag.Error(device, "device must be cpu or cuda:N (got '" + *v + "')");
    }
  }
  m.ReportUnknownKeys();
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
  if (auto v = internal::ReadChoice<Interpolation>(diag, m.Get("interpolation"),
                                                   {{"bilinear", Interpolation::kBilinear},
                                                    {"bicubic", Interpolation::kBicubic},
                                                    {"area", Interpolation::kArea}})) {
    op.interpolation = *v;
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
  if (Present(size)) {
    if (size.node.IsSequence()) {
      std::optional<std::vector<Field>> items = internal::ReadList(diag, size);
      if (items && items->size() == 2) {
        auto h = internal::ReadInt(diag, (*items)[0], 1, kMaxImageSide);
        auto w = internal::ReadInt(diag, (*items)[1], 1, kMaxImageSide);
        if (h && w) op = {static_cast<int>(*h), static_cast<int>(*w)};
      } else {
        diag.Error(size, "expected an integer or [height, width], got a list of " +
                             std::to_string(size.node.size()) + " item(s)");
      }
    } else if (size.node.IsScalar()) {
      if (auto s = internal::ReadInt(diag, size, 1, kMaxImageSide)) {
        op = {static_cast<int>(*s), static_cast<int>(*s)};
      }
    } else {
      diag.Error(size, "expected an integer or [height, width], got " + internal::Describe(size.node));
    }
  }
  m.ReportUnknownKeys();
  if (diag.count() != errors_before) return std::nullopt;
  return ParsedOp{op, size};
}

// One list entry: a map with exactly one key naming the transform.
std::optional<ParsedOp> ReadTransform(Diagnostics& diag, const Field& item) {
  if (!item.node.IsMap()) {
    diag.Error(item, "a transform is a map with one key (resize or center_crop), got " +
                         internal::Describe(item.node));
    return std::nullopt;
  }
  MapReader m(diag, item);
  if (m.entries().size() != 1) {
    std::string keys;
    for (const auto& e : m.entries()) keys += (keys.empty() ? "" : ", ") + e.key;
    diag.Error(item, "a transform is a map with exactly one key (resize or center_crop), got " +
                         std::to_string(m.entries().size()) + ": " + keys);
    return std::nullopt;
  }
  const std::string name = m.entries().front().key;
  if (name == "resize") return ReadResize(diag, m.Get("resize"));
  if (name == "center_crop") return ReadCenterCrop(diag, m.Get("center_crop"));
  std::string message = "unknown transform '" + name + "'";
  const std::string suggestion = internal::Suggest(name, {"resize", "center_crop"});
  if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
  diag.ErrorAtKey(m.entries().front().field, message + "; expected resize or center_crop");
  return std::nullopt;
}

// Reads the transform list and computes the output size into *out.
void ReadTransforms(Diagnostics& diag, const Field& field, JobConfig* out) {
  if (!Present(field) || field.node.IsNull()) {
    diag.ErrorAtKey(field, kNeedFixedSize);
    return;
  }
  std::optional<std::vector<Field>> items = internal::ReadList(diag, field);
  if (!items) return;
  if (items->empty()) {
    diag.ErrorAtKey(field, kNeedFixedSize);
    return;
  }
  // The image size as the chain goes: unknown (as decoded), shorter side known, or fixed.
  enum class Size { kAsDecoded, kShorter, kFixed } state = Size::kAsDecoded;
  int shorter = 0, height = 0, width = 0;
  bool all_ok = true;
  for (const Field& item : *items) {
    std::optional<ParsedOp> parsed = ReadTransform(diag, item);
    if (!parsed) {
      all_ok = false;
      continue;
    }
    out->transforms.push_back(parsed->op);
    if (const auto* r = std::get_if<ResizeOp>(&parsed->op)) {
      if (r->shorter > 0) {
        state = Size::kShorter;
        shorter = r->shorter;
      } else {
        state = Size::kFixed;
        height = r->height;
        width = r->width;
      }
    } else if (const auto* c = std::get_if<CenterCropOp>(&parsed->op)) {
      const std::string crop = std::to_string(c->height) + "x" + std::to_string(c->width);
      if (state == Size::kShorter && (c->height > shorter || c->width > shorter)) {
        diag.Error(parsed->size_field, "center_crop " + crop +
                                           " is larger than the shorter side (" +
                                           std::to_string(shorter) + ") after the resize before it");
      } else if (state == Size::kFixed && (c->height > height || c->width > width)) {
        diag.Error(parsed->size_field, "center_crop " + crop + " is larger than the image (" +
                                           std::to_string(height) + "x" + std::to_string(width) +
                                           ") after the transforms before it");
      }
      state = Size::kFixed;
      height = c->height;
      width = c->width;
    }
  }
  if (!all_ok) return;  // the size of a chain with a bad link is unknown; say nothing more
  if (state != Size::kFixed) {
    diag.ErrorAtKey(field, kNeedFixedSize);
    return;
  }
  out->out_height = height;
  out->out_width = width;
}

void ReadJob(Diagnostics& diag, const Field& root, JobConfig* out) {
  MapReader m(diag, root);
  if (!m.ok()) return;  // not a map: nothing else can be said
  ReadSource(diag, m.Get("source"), &out->source);
  ReadSampler(diag, m.Get("sampler"), &out->sampler);
  ReadBatch(diag, m.Get("batch"), &out->batch);
  ReadTransforms(diag, m.Get("transforms"), out);
  ReadOutput(diag, m.Get("output"), &out->output);
  if (auto v = internal::ReadInt(diag, m.Get("prefetch"), 1, 64)) out->prefetch = static_cast<int>(*v);
  if (auto v = internal::ReadChoice<OnError>(diag, m.Get("on_error"),
                                             {{"skip", OnError::kSkip}, {"fail", OnError::kFail}})) {
    out->on_error = *v;
  }
  m.ReportUnknownKeys();
}

}  // namespace

JobConfigResult ParseJobConfig(std::string_view yaml_text, const std::vector<Override>& overrides) {
  std::vector<std::string> override_paths;
  for (const Override& o : overrides) override_paths.push_back(o.path);
  Diagnostics diag(std::move(override_paths));
  JobConfig config;
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
