#include "io/sample_source.h"

#include <utility>

#include "io/allowed_roots.h"
#include "io/read_file.h"

namespace spdl::io {

std::string SidecarPath(const std::string& path, const std::string& extension) {
  const size_t slash = path.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos || dot <= base) return path + extension;
  return path.substr(0, dot) + extension;
}

namespace {

// An image folder's cached index: its manifest and the directories the scan listed.
struct ImageFolderIndex final : SourceIndex {
  Manifest manifest;
};

Result<std::shared_ptr<const ImageFolderIndex>> ScanFolderIndex(const std::string& real_root,
                                                                const std::vector<std::string>& extensions) {
  auto index = std::make_shared<ImageFolderIndex>();
  index->scan_start_ns = RealtimeNowNs();
  SPDL_ASSIGN_OR_RETURN(index->manifest, ScanImageFolder(real_root, extensions, &index->inputs));
  return std::shared_ptr<const ImageFolderIndex>(std::move(index));
}

}  // namespace

Result<std::unique_ptr<ImageFolderSource>> ImageFolderSource::Open(const std::string& root,
                                                                   const std::vector<std::string>& extensions,
                                                                   const std::vector<std::string>& allowed_roots,
                                                                   uint64_t max_sample_bytes,
                                                                   SourceIndexCache* index_cache) {
  SPDL_ASSIGN_OR_RETURN(std::string real_root, ResolveUnderRoots(root, allowed_roots));
  std::shared_ptr<const ImageFolderIndex> index;
  if (index_cache == nullptr) {
    SPDL_ASSIGN_OR_RETURN(index, ScanFolderIndex(real_root, extensions));
  } else {
    // The manifest depends on the resolved root and the extensions only (not on the allowed roots,
    // which the resolution above has checked).
    std::vector<std::string> key = {"image_folder", real_root};
    key.insert(key.end(), extensions.begin(), extensions.end());
    SPDL_ASSIGN_OR_RETURN(index, index_cache->Get<ImageFolderIndex>(IndexKey(key), "image folder " + real_root, [&] {
      return ScanFolderIndex(real_root, extensions);
    }));
  }
  SPDL_ASSIGN_OR_RETURN(std::shared_ptr<const RootDir> dir, RootDir::Open(real_root));
  // The manifest, keeping its index alive (aliasing).
  std::shared_ptr<const Manifest> manifest(index, &index->manifest);
  return std::make_unique<ImageFolderSource>(std::move(manifest), std::move(dir), max_sample_bytes);
}

ImageFolderSource::ImageFolderSource(Manifest manifest, std::shared_ptr<const RootDir> root, uint64_t max_sample_bytes)
    : ImageFolderSource(std::make_shared<const Manifest>(std::move(manifest)), std::move(root), max_sample_bytes) {}

ImageFolderSource::ImageFolderSource(std::shared_ptr<const Manifest> manifest, std::shared_ptr<const RootDir> root,
                                     uint64_t max_sample_bytes)
    : manifest_(std::move(manifest)), root_(std::move(root)), max_sample_bytes_(max_sample_bytes) {}

Status ImageFolderSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= size()) {
    out->clear();
    return InvalidArgument("image folder " + manifest_->root + ": sample " + std::to_string(index) +
                           " is out of range (" + std::to_string(size()) + " samples)");
  }
  // RootDir's errors name the whole path, which ends with the key.
  return root_->ReadFile(manifest_->samples[index].path, out, max_sample_bytes_);
}

Status ImageFolderSource::ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return Read(index, out);  // its out-of-range error
  return root_->ReadFile(SidecarPath(manifest_->samples[index].path, extension), out, max_sample_bytes_);
}

std::string ImageFolderSource::Describe() const {
  return "image folder " + manifest_->root + " (" + std::to_string(size()) + " samples, " +
         std::to_string(manifest_->classes.size()) + " classes)";
}

}  // namespace spdl::io
