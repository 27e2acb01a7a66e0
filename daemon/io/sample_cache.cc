#include "io/sample_cache.h"

#include <utility>

namespace spdl::io {

SampleCache::SampleCache(uint64_t budget_bytes) : budget_(budget_bytes) {}

std::shared_ptr<const std::vector<uint8_t>> SampleCache::Lookup(const std::string& key) {
  std::lock_guard lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->bytes;
}

void SampleCache::EraseLocked(std::list<Entry>::iterator it) {
  bytes_ -= it->charge;
  index_.erase(it->key);
  lru_.erase(it);
}

bool SampleCache::Insert(const std::string& key, std::vector<uint8_t> bytes) {
  const uint64_t charge = bytes.size() + key.size();
  if (charge > budget_) return false;
  auto payload = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  std::shared_ptr<const std::vector<uint8_t>> dropped;  // freed after the lock, not under it
  std::lock_guard lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) EraseLocked(it->second);
  while (bytes_ + charge > budget_ && !lru_.empty()) {
    EraseLocked(std::prev(lru_.end()));
    ++evictions_;
  }
  lru_.push_front(Entry{key, std::move(payload), charge});
  index_.emplace(key, lru_.begin());
  bytes_ += charge;
  ++inserts_;
  return true;
}

SampleCache::Counters SampleCache::counters() const {
  std::lock_guard lock(mu_);
  Counters c;
  c.hits = hits_;
  c.misses = misses_;
  c.evictions = evictions_;
  c.inserts = inserts_;
  c.bytes = bytes_;
  c.entries = lru_.size();
  c.budget = budget_;
  return c;
}

CachedSource::CachedSource(std::shared_ptr<const SampleSource> inner, std::shared_ptr<SampleCache> cache,
                           std::string scope)
    : inner_(std::move(inner)), cache_(std::move(cache)), identity_(inner_->Identity()), scope_(std::move(scope)) {}

std::string CachedSource::KeyFor(uint64_t index) const {
  std::string key = scope_;
  key += '\n';
  key += identity_;
  key += '\n';
  key += std::to_string(index);
  key += '\n';
  key += inner_->sample(index).path;
  return key;
}

Status CachedSource::Read(uint64_t index, std::vector<uint8_t>* out) const {
  if (index >= inner_->size()) return inner_->Read(index, out);  // the inner source's error
  const std::string key = KeyFor(index);
  if (auto hit = cache_->Lookup(key)) {
    hits_.fetch_add(1, std::memory_order_relaxed);
    out->assign(hit->begin(), hit->end());
    return Status::Ok();
  }
  misses_.fetch_add(1, std::memory_order_relaxed);
  Status s = inner_->Read(index, out);
  if (s.ok()) cache_->Insert(key, *out);
  return s;
}

}  // namespace spdl::io
