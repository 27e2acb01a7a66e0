#include "io/file_list_source.h"

#include <utility>

#include "io/allowed_roots.h"
#include "io/read_file.h"

namespace spdl::io {
namespace {

// True when `path` has a ".." component.
bool HasDotDot(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    if (end - start == 2 && path.compare(start, 2, "..") == 0) return true;
    start = end + 1;
  }
  return false;
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Turns entries into samples (see the key rules in the header), appending a problem for each entry
// whose path cannot be used.
std::vector<SampleRef> CheckEntries(std::vector<ListEntry> entries, const std::string& real_root,
                                    const std::vector<std::string>& allowed_roots, std::vector<ListProblem>* problems,
                                    uint64_t* labelled) {
  std::vector<SampleRef> samples;
  samples.reserve(entries.size());
  *labelled = 0;
  for (ListEntry& e : entries) {
    const bool absolute = e.item.front() == '/';
    if (absolute || HasDotDot(e.item)) {
      auto real = ResolveUnderRoots(absolute ? e.item : real_root + "/" + e.item, allowed_roots);
      if (!real.ok()) {
        problems->push_back({e.line, real.status().message()});
        continue;
      }
      e.item = std::move(real).value();
    }
    if (e.label >= 0) ++*labelled;
    samples.push_back(SampleRef{std::move(e.item), e.label});
  }
  return samples;
}

}  // namespace

FileListSource::FileListSource(std::string origin, std::shared_ptr<const RootDir> root,
                               std::shared_ptr<const RootSet> allowed,
                               std::shared_ptr<const std::vector<SampleRef>> samples, uint64_t labelled,
                               uint64_t max_sample_bytes)
    : origin_(std::move(origin)),
      root_(std::move(root)),
      allowed_(std::move(allowed)),
      samples_(std::move(samples)),
      labelled_(labelled),
      max_sample_bytes_(max_sample_bytes) {}

namespace {

// A file list's cached index: the checked samples, and the list file's stamp.
struct FileListIndex final : SourceIndex {
  std::vector<SampleRef> samples;
  uint64_t labelled = 0;
};

Result<std::shared_ptr<const FileListIndex>> ScanList(const std::string& real_list, const std::string& real_root,
                                                      const FileListOptions& o) {
  auto index = std::make_shared<FileListIndex>();
  index->scan_start_ns = RealtimeNowNs();
  // Stamped before it is read, so a later change shows as a newer mtime.
  std::string read_as;
  FileStamp stamp;
  SPDL_ASSIGN_OR_RETURN(std::string text, ReadListFile(real_list, o.allowed_roots, &read_as, &stamp));
  index->inputs.push_back(std::move(stamp));
  ParsedList parsed = ParseSampleList(text, "path");
  std::vector<ListProblem> problems = std::move(parsed.problems);
  index->samples = CheckEntries(std::move(parsed.entries), real_root, o.allowed_roots, &problems, &index->labelled);
  if (!problems.empty()) return ListProblemsStatus(real_list, std::move(problems), o.max_reported_errors);
  if (index->samples.empty()) return NotFound(real_list + ": the list names no sample");
  return std::shared_ptr<const FileListIndex>(std::move(index));
}

}  // namespace

Result<std::unique_ptr<FileListSource>> FileListSource::Open(const FileListOptions& options) {
  SPDL_ASSIGN_OR_RETURN(std::string real_list, ResolveUnderRoots(options.list, options.allowed_roots));
  FileListOptions o = options;
  if (o.root.empty()) o.root = DirName(real_list);
  auto real_root = ResolveUnderRoots(o.root, o.allowed_roots);
  if (!real_root.ok()) return real_root.status().WithPrefix(real_list + ": root");

  std::shared_ptr<const FileListIndex> index;
  if (o.index_cache == nullptr) {
    SPDL_ASSIGN_OR_RETURN(index, ScanList(real_list, *real_root, o));
  } else {
    // Entries with absolute or ".." paths are checked against the allowed roots: part of the key.
    std::vector<std::string> key = {"file_list", real_list, *real_root};
    key.insert(key.end(), o.allowed_roots.begin(), o.allowed_roots.end());
    SPDL_ASSIGN_OR_RETURN(index, o.index_cache->Get<FileListIndex>(IndexKey(key), "file list " + real_list,
                                                                   [&] { return ScanList(real_list, *real_root, o); }));
  }
  SPDL_ASSIGN_OR_RETURN(std::shared_ptr<const RootDir> dir, RootDir::Open(*real_root));
  std::shared_ptr<const std::vector<SampleRef>> samples(index, &index->samples);  // keeps the index alive
  return std::unique_ptr<FileListSource>(new FileListSource(real_list, std::move(dir), RootSet::Open(o.allowed_roots),
                                                            std::move(samples), index->labelled, o.max_sample_bytes));
}

Result<std::unique_ptr<FileListSource>> FileListSource::FromEntries(std::vector<ListEntry> entries,
                                                                    const std::string& origin,
                                                                    const FileListOptions& options) {
  if (options.root.empty()) return InvalidArgument(origin + ": no root given for the relative paths");
  auto real_root = ResolveUnderRoots(options.root, options.allowed_roots);
  if (!real_root.ok()) return real_root.status().WithPrefix(origin + ": root");
  std::vector<ListProblem> problems;
  for (const ListEntry& e : entries) {
    if (e.item.empty()) problems.push_back({e.line, "empty path"});
  }
  if (!problems.empty()) return ListProblemsStatus(origin, std::move(problems), options.max_reported_errors);
  uint64_t labelled = 0;
  std::vector<SampleRef> samples =
      CheckEntries(std::move(entries), *real_root, options.allowed_roots, &problems, &labelled);
  if (!problems.empty()) return ListProblemsStatus(origin, std::move(problems), options.max_reported_errors);
  if (samples.empty()) return NotFound(origin + ": the list names no sample");
  SPDL_ASSIGN_OR_RETURN(std::shared_ptr<const RootDir> dir, RootDir::Open(*real_root));
  return std::unique_ptr<FileListSource>(new FileListSource(
      origin, std::move(dir), RootSet::Open(options.allowed_roots),
      std::make_shared<const std::vector<SampleRef>>(std::move(samples)), labelled, options.max_sample_bytes));
}

Status FileListSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= size()) {
    out->clear();
    return InvalidArgument("file list " + origin_ + ": sample " + std::to_string(index) + " is out of range (" +
                           std::to_string(size()) + " samples)");
  }
  const std::string& key = (*samples_)[index].path;
  // The errors name the whole path, which is or ends with the key.
  if (key.front() == '/') return allowed_->ReadFile(key, out, max_sample_bytes_);
  return root_->ReadFile(key, out, max_sample_bytes_);
}

Status FileListSource::ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const {
  out->clear();
  if (index >= size()) return Read(index, out);  // its out-of-range error
  const std::string path = SidecarPath((*samples_)[index].path, extension);
  if (path.front() == '/') return allowed_->ReadFile(path, out, max_sample_bytes_);
  return root_->ReadFile(path, out, max_sample_bytes_);
}

std::string FileListSource::Describe() const {
  return "file list " + origin_ + " (" + std::to_string(size()) + " samples below " + root_->path() + ", " +
         std::to_string(labelled_) + " labelled)";
}

}  // namespace spdl::io
