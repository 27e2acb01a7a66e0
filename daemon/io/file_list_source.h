// FileListSource: the samples named by a list file (text or CSV, "path[,label]" per line; the
// format is in sample_list.h), each read whole with io::ReadFile. Immutable after Open: safe to
// share between threads (see sample_source.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "io/sample_list.h"
#include "io/sample_source.h"
#include "io/source_index_cache.h"

namespace spdl::io {

struct FileListOptions {
  std::string list;                                    // the list file; must resolve below allowed_roots
  std::string root;                                    // relative paths are below it; "" = the list's directory
  std::vector<std::string> allowed_roots;              // the daemon's allowed data roots (empty refuses all)
  uint64_t max_sample_bytes = kDefaultMaxSampleBytes;  // a larger file fails its Read
  size_t max_reported_errors = 100;                    // bad lines listed in the error; the rest are counted
  // Open shares the parsed list with other opens of the same list, root and allowed roots while
  // one of them lives (source_index_cache.h; reused while the list file is unchanged). nullptr =
  // always read it. FromEntries does not use it.
  SourceIndexCache* index_cache = nullptr;
};

// Keys (sample(i).path):
//   - a plain relative path (no ".." component) is kept as written and opened beneath the root
//     (RootDir). Like ImageFolderSource it is not resolved at Open (that would cost a realpath per
//     sample); a missing file fails its Read, a symbolic link that stays below the root is
//     followed, one that leads out of it fails the Read.
//   - an absolute path, or one with a ".." component, is resolved at Open and must lie below the
//     allowed roots; its key is the resolved absolute path, opened beneath the allowed root that
//     holds it (RootSet). A missing one is a bad line.
class FileListSource final : public SampleSource {
 public:
  // Reads and checks the whole list. Errors: the list or the root outside the allowed roots or
  // missing (ResolveUnderRoots' errors); every bad line at once, each with its line number
  // (kInvalidArgument, see ListProblemsStatus); no sample -> kNotFound.
  static Result<std::unique_ptr<FileListSource>> Open(const FileListOptions& options);

  // The same over entries already parsed (e.g. built by the caller); `origin` names them in
  // errors and Describe (line numbers are the entries' .line). options.list is not read;
  // options.root is required.
  static Result<std::unique_ptr<FileListSource>> FromEntries(std::vector<ListEntry> entries, const std::string& origin,
                                                             const FileListOptions& options);

  uint64_t size() const override { return samples_->size(); }
  const SampleRef& sample(uint64_t index) const override { return (*samples_)[index]; }
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override;
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override;
  std::string Describe() const override;
  std::string Identity() const override { return "file_list " + origin_ + " root " + root_->path(); }

  const std::string& root() const { return root_->path(); }  // resolved

 private:
  FileListSource(std::string origin, std::shared_ptr<const RootDir> root, std::shared_ptr<const RootSet> allowed,
                 std::shared_ptr<const std::vector<SampleRef>> samples, uint64_t labelled, uint64_t max_sample_bytes);

  // Constant after construction.
  const std::string origin_;                      // the list file (resolved) or the caller's name for the entries
  const std::shared_ptr<const RootDir> root_;     // resolved
  const std::shared_ptr<const RootSet> allowed_;  // for absolute keys
  const std::shared_ptr<const std::vector<SampleRef>> samples_;  // possibly shared with other sources
  const uint64_t labelled_;                                      // samples with a label
  const uint64_t max_sample_bytes_;
};

}  // namespace spdl::io
