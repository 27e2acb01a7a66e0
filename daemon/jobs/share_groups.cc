#include "jobs/share_groups.h"

namespace spdl::jobs {

std::string ShareGroups::Key(const proto::SubmitJob& req, const PeerInfo& peer, uint64_t fingerprint, uint32_t epochs) {
  std::string key =
      std::to_string(peer.uid) + "\n" + std::to_string(fingerprint) + "\n" + std::to_string(epochs) + "\n";
  for (const auto& o : req.overrides()) key += o.path() + "=" + o.value() + "\n";
  key += '\n';
  key += req.config_yaml();
  return key;
}

std::optional<ShareGroups::Entry> ShareGroups::FindJoinable(const std::string& key) const {
  auto it = groups_.find(key);
  if (it == groups_.end()) return std::nullopt;
  std::shared_ptr<ShareGroup> group = it->second.group.lock();
  if (!group || !group->joinable()) return std::nullopt;
  return Entry{std::move(group), it->second.cached, it->second.decoded.lock()};
}

void ShareGroups::Add(const std::string& key, const std::shared_ptr<ShareGroup>& group,
                      std::shared_ptr<const io::CachedSource> cached,
                      const std::shared_ptr<const DecodedCacheSource>& decoded) {
  groups_[key] = Weak{group, std::move(cached), decoded};
  DropExpired();
}

void ShareGroups::DropExpired() {
  for (auto it = groups_.begin(); it != groups_.end();) {
    it = it->second.group.expired() ? groups_.erase(it) : std::next(it);
  }
}

}  // namespace spdl::jobs
