// UserSource: a SampleSource decorator that reads as a user. Every Read and ReadSidecar of the
// wrapped source runs with the user's filesystem identity (io/fs_identity.h) on the calling thread,
// so the kernel checks the user's own rights on every open, whichever pool thread reads. The job's
// source is opened (scans, lists, tar indexes) under the same identity by the job registry.
//
// Thread safety: immutable; Read may be called concurrently from any thread.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/fs_identity.h"
#include "io/sample_source.h"

namespace spdl::io {

class UserSource final : public SampleSource {
 public:
  // REQUIRES: inner != nullptr. identity == nullptr: reads with the daemon's own rights.
  UserSource(std::shared_ptr<const SampleSource> inner, std::shared_ptr<const FsIdentity> identity)
      : inner_(std::move(inner)), identity_(std::move(identity)) {}

  uint64_t size() const override { return inner_->size(); }
  const SampleRef& sample(uint64_t index) const override { return inner_->sample(index); }
  // The inner Read as the user; a thread that cannot switch -> kInternal (a daemon fault, never the
  // sample's), nothing opened.
  Status Read(uint64_t index, std::vector<uint8_t>* out) const override {
    ScopedFsIdentity as(identity_.get());
    if (!as.ok()) return Switch(out, as.status());
    return inner_->Read(index, out);
  }
  Status ReadSidecar(uint64_t index, const std::string& extension, std::vector<uint8_t>* out) const override {
    ScopedFsIdentity as(identity_.get());
    if (!as.ok()) return Switch(out, as.status());
    return inner_->ReadSidecar(index, extension, out);
  }
  std::string Describe() const override { return inner_->Describe(); }
  std::string Identity() const override { return inner_->Identity(); }
  std::vector<uint64_t> ShardSizes() const override { return inner_->ShardSizes(); }
  std::vector<std::string> ClassNames() const override { return inner_->ClassNames(); }
  std::optional<std::string> DatasetDigest() const override { return inner_->DatasetDigest(); }
  SourceCounters Counters() const override { return inner_->Counters(); }
  const std::vector<ObjectAnnotation>* Objects(uint64_t index) const override { return inner_->Objects(index); }

  const FsIdentity& identity() const { return *identity_; }

 private:
  static Status Switch(std::vector<uint8_t>* out, const Status& why) {
    out->clear();
    return Internal("spdld could not read as the job's user: " + why.message());
  }

  // Constant after construction.
  const std::shared_ptr<const SampleSource> inner_;
  const std::shared_ptr<const FsIdentity> identity_;
};

}  // namespace spdl::io
