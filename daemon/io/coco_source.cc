#include "io/coco_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <exception>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "io/allowed_roots.h"

namespace spdl::io {

struct CocoIndex final : SourceIndex {
  std::string annotations;  // resolved
  std::string identity;
  std::vector<SampleRef> samples;
  std::vector<std::vector<ObjectAnnotation>> objects;  // per sample
  std::vector<std::string> class_names;
  uint64_t categories = 0;
  uint64_t object_count = 0;
};

namespace {

using nlohmann::json;

// FNV-1a of the JSON bytes, in hex (part of the dataset's identity).
std::string HashHex(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t b : bytes) h = (h ^ b) * 1099511628211ull;
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The checks of one JSON document, gathering the first problems.
struct Problems {
  std::vector<std::string> list;
  uint64_t more = 0;
  void Add(std::string p) {
    if (list.size() < 20)
      list.push_back(std::move(p));
    else
      ++more;
  }
  Status AsStatus(const std::string& file) const {
    std::string m = file + ": " + std::to_string(list.size() + more) + " problem(s):";
    for (const std::string& p : list) m += "\n  " + p;
    if (more > 0) m += "\n  ... and " + std::to_string(more) + " more";
    return InvalidArgument(m);
  }
};

bool IsInt(const json& j) { return j.is_number_integer() || j.is_number_unsigned(); }

// A coordinate spdld accepts: a JSON number within +-1e7 pixels (so that it fits a float and the
// rasteriser's integer arithmetic).
bool IsCoordinate(const json& j) {
  if (!j.is_number()) return false;
  const double v = j.get<double>();
  return v >= -1e7 && v <= 1e7;
}

// Reads and checks the annotations JSON (see CocoSource::Open).
Result<std::shared_ptr<const CocoIndex>> ParseCoco(const std::string& json_path, const std::string& real_root,
                                                   const CocoOptions& o) {
  auto src = std::make_shared<CocoIndex>();
  src->scan_start_ns = RealtimeNowNs();
  struct stat st;
  if (::stat(json_path.c_str(), &st) == 0) src->inputs.push_back(MakeStamp(json_path, st));  // before the read
  std::vector<uint8_t> bytes;
  SPDL_RETURN_IF_ERROR(ReadFile(json_path, &bytes, o.max_json_bytes));
  src->annotations = json_path;
  src->identity = "coco " + json_path + " root " + real_root + " " + HashHex(bytes);

  json doc;
  try {  // nlohmann throws; nothing escapes this function
    doc = json::parse(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    return InvalidArgument(json_path + ": not valid JSON: " + e.what());
  }
  bytes.clear();
  bytes.shrink_to_fit();
  Problems problems;
  if (!doc.is_object()) return InvalidArgument(json_path + ": a COCO annotations file is a JSON object");
  for (const char* key : {"images", "annotations", "categories"}) {
    if (!doc.contains(key) || !doc[key].is_array()) {
      problems.Add(std::string("'") + key + "' must be a list");
    }
  }
  if (!problems.list.empty()) return problems.AsStatus(json_path);

  // Categories: id -> label.
  std::map<int64_t, std::string> categories;
  const json& cats = doc["categories"];
  for (size_t i = 0; i < cats.size(); ++i) {
    const json& c = cats[i];
    const std::string where = "categories[" + std::to_string(i) + "]";
    if (!c.is_object() || !c.contains("id") || !IsInt(c["id"])) {
      problems.Add(where + ": needs an integer 'id'");
      continue;
    }
    const int64_t id = c["id"].get<int64_t>();
    std::string name = c.contains("name") && c["name"].is_string() ? c["name"].get<std::string>() : std::to_string(id);
    if (!categories.emplace(id, std::move(name)).second)
      problems.Add(where + ": category id " + std::to_string(id) + " appears twice");
  }
  std::unordered_map<int64_t, int64_t> label_of;
  int64_t next = 0;
  for (const auto& [id, name] : categories) {
    label_of[id] = o.contiguous_ids ? next : id;
    if (o.masks && (o.contiguous_ids ? next + 1 : id) > 255) {
      problems.Add("category " + std::to_string(id) + ": masks: true needs every category to fit a uint8 mask value (" +
                   (o.contiguous_ids ? "index + 1" : std::string("the id")) + " at most 255)");
    }
    if (o.contiguous_ids) src->class_names.push_back(name);
    ++next;
  }
  src->categories = categories.size();

  // Images, in id order.
  struct Image {
    int64_t id;
    std::string file;
  };
  std::vector<Image> images;
  const json& imgs = doc["images"];
  for (size_t i = 0; i < imgs.size(); ++i) {
    const json& im = imgs[i];
    const std::string where = "images[" + std::to_string(i) + "]";
    if (!im.is_object() || !im.contains("id") || !IsInt(im["id"]) || !im.contains("file_name") ||
        !im["file_name"].is_string() || im["file_name"].get<std::string>().empty()) {
      problems.Add(where + ": needs an integer 'id' and a non-empty 'file_name'");
      continue;
    }
    images.push_back({im["id"].get<int64_t>(), im["file_name"].get<std::string>()});
  }
  std::sort(images.begin(), images.end(), [](const Image& a, const Image& b) { return a.id < b.id; });
  std::unordered_map<int64_t, size_t> index_of;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!index_of.emplace(images[i].id, i).second)
      problems.Add("image id " + std::to_string(images[i].id) + " appears twice");
  }
  src->samples.reserve(images.size());
  for (Image& im : images) src->samples.push_back({std::move(im.file), kNoLabel});
  src->objects.resize(images.size());

  // Annotations, in file order.
  const json& anns = doc["annotations"];
  for (size_t i = 0; i < anns.size(); ++i) {
    const json& a = anns[i];
    const std::string where = "annotations[" + std::to_string(i) + "]";
    if (!a.is_object() || !a.contains("image_id") || !IsInt(a["image_id"]) || !a.contains("category_id") ||
        !IsInt(a["category_id"])) {
      problems.Add(where + ": needs integer 'image_id' and 'category_id'");
      continue;
    }
    const bool crowd = a.contains("iscrowd") && a["iscrowd"].is_number() && a["iscrowd"].get<double>() != 0;
    if (crowd && !o.include_crowd) continue;
    const auto img = index_of.find(a["image_id"].get<int64_t>());
    if (img == index_of.end()) {
      problems.Add(where + ": image_id " + std::to_string(a["image_id"].get<int64_t>()) + " is not in 'images'");
      continue;
    }
    const auto cat = label_of.find(a["category_id"].get<int64_t>());
    if (cat == label_of.end()) {
      problems.Add(where + ": category_id " + std::to_string(a["category_id"].get<int64_t>()) +
                   " is not in 'categories'");
      continue;
    }
    const json* bbox = a.contains("bbox") ? &a["bbox"] : nullptr;
    if (bbox == nullptr || !bbox->is_array() || bbox->size() != 4 ||
        !std::all_of(bbox->begin(), bbox->end(), IsCoordinate)) {
      problems.Add(where + ": 'bbox' must be [x, y, width, height], numbers within +-1e7");
      continue;
    }
    const double x = (*bbox)[0].get<double>(), y = (*bbox)[1].get<double>();
    const double w = (*bbox)[2].get<double>(), h = (*bbox)[3].get<double>();
    if (!(w >= 0) || !(h >= 0)) {
      problems.Add(where + ": 'bbox' has a negative width or height");
      continue;
    }
    ObjectAnnotation obj;
    obj.x1 = static_cast<float>(x);
    obj.y1 = static_cast<float>(y);
    obj.x2 = static_cast<float>(x + w);
    obj.y2 = static_cast<float>(y + h);
    obj.category = cat->second;
    if (o.masks && a.contains("segmentation")) {
      const json& seg = a["segmentation"];
      if (seg.is_array()) {
        for (const json& poly : seg) {
          if (!poly.is_array() || poly.size() % 2 != 0 || !std::all_of(poly.begin(), poly.end(), IsCoordinate)) {
            problems.Add(where +
                         ": a polygon of 'segmentation' must be a flat list [x0, y0, x1, y1, ...] of numbers "
                         "within +-1e7");
            break;
          }
          std::vector<float> xy;
          xy.reserve(poly.size());
          for (const json& v : poly) xy.push_back(static_cast<float>(v.get<double>()));
          obj.polygons.push_back(std::move(xy));
        }
      } else {
        problems.Add(where +
                     ": an RLE 'segmentation' (a crowd region) cannot be rasterised by spdld: "
                     "set include_crowd: false or masks: false");
        continue;
      }
    }
    src->objects[img->second].push_back(std::move(obj));
    ++src->object_count;
  }
  if (!problems.list.empty()) return problems.AsStatus(json_path);
  if (src->samples.empty()) return NotFound(json_path + ": no image in 'images'");
  return std::shared_ptr<const CocoIndex>(std::move(src));
}

}  // namespace

Result<std::unique_ptr<CocoSource>> CocoSource::Open(const CocoOptions& o) {
  SPDL_ASSIGN_OR_RETURN(std::string json_path, ResolveUnderRoots(o.annotations, o.allowed_roots));
  SPDL_ASSIGN_OR_RETURN(std::string real_root, ResolveUnderRoots(o.root, o.allowed_roots));
  std::shared_ptr<const CocoIndex> index;
  if (o.index_cache == nullptr) {
    SPDL_ASSIGN_OR_RETURN(index, ParseCoco(json_path, real_root, o));
  } else {
    const std::vector<std::string> key = {"coco",
                                          json_path,
                                          real_root,
                                          o.include_crowd ? "crowd" : "-",
                                          o.contiguous_ids ? "contiguous" : "-",
                                          o.masks ? "masks" : "-",
                                          std::to_string(o.max_json_bytes)};
    SPDL_ASSIGN_OR_RETURN(index, o.index_cache->Get<CocoIndex>(IndexKey(key), "coco " + json_path,
                                                               [&] { return ParseCoco(json_path, real_root, o); }));
  }
  SPDL_ASSIGN_OR_RETURN(std::shared_ptr<const RootDir> dir, RootDir::Open(real_root));
  return std::unique_ptr<CocoSource>(new CocoSource(std::move(index), std::move(dir), o.max_sample_bytes));
}

uint64_t CocoSource::size() const { return index_->samples.size(); }
const SampleRef& CocoSource::sample(uint64_t index) const { return index_->samples[index]; }
std::string CocoSource::Identity() const { return index_->identity; }
std::vector<std::string> CocoSource::ClassNames() const { return index_->class_names; }
const std::vector<ObjectAnnotation>* CocoSource::Objects(uint64_t index) const { return &index_->objects[index]; }
uint64_t CocoSource::object_count() const { return index_->object_count; }

Status CocoSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= size()) {
    out->clear();
    return InvalidArgument("coco " + index_->annotations + ": sample " + std::to_string(index) + " is out of range (" +
                           std::to_string(size()) + " samples)");
  }
  return root_->ReadFile(index_->samples[index].path, out, max_sample_bytes_);
}

Status CocoSource::ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return Read(index, out);
  return root_->ReadFile(SidecarPath(index_->samples[index].path, extension), out, max_sample_bytes_);
}

std::string CocoSource::Describe() const {
  return "coco " + index_->annotations + " (" + std::to_string(size()) + " images, " +
         std::to_string(index_->object_count) + " objects, " + std::to_string(index_->categories) + " categories)";
}

}  // namespace spdl::io
