#include "streams/stream.h"

#include <algorithm>

namespace spdl::streams {

std::string CheckStreamName(const std::string& name) {
  if (name.empty()) return "a stream name must not be empty";
  if (name.size() > 128) return "a stream name has at most 128 characters";
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) return "stream name '" + name + "' may hold only letters, digits, '_', '-' and '.'";
  }
  return "";
}

uint64_t Stream::Group::AckedBelow() const {
  uint64_t floor = next;
  if (!redeliver.empty()) floor = std::min(floor, *redeliver.begin());
  if (!in_flight.empty()) floor = std::min(floor, in_flight.begin()->first);
  return floor;
}

Stream::Stream(StreamConfig config, uint32_t owner_uid, MemoryAccount* account, uint64_t first_offset)
    : config_(std::move(config)),
      owner_uid_(owner_uid),
      account_(account),
      tail_(first_offset),
      consumed_floor_(first_offset) {}

Stream::~Stream() {
  if (account_ && retained_bytes_ > 0) account_->Release(retained_bytes_);
}

Status Stream::CheckAccess(uint32_t uid) const {
  if (uid == 0 || uid == owner_uid_) return Status::Ok();
  if (std::find(config_.allowed_uids.begin(), config_.allowed_uids.end(), uid) != config_.allowed_uids.end()) {
    return Status::Ok();
  }
  return PermissionDenied("stream '" + config_.name + "' belongs to uid " + std::to_string(owner_uid_) +
                          " and does not allow uid " + std::to_string(uid) + " (its allowed_uids)");
}

uint64_t Stream::FloorLocked() const {
  bool any = false;
  uint64_t floor = UINT64_MAX;
  for (const auto& [name, g] : groups_) {
    any = true;
    floor = std::min(floor, g.AckedBelow());
  }
  return any ? floor : consumed_floor_;
}

void Stream::ForgetIdleGroupsLocked(std::chrono::steady_clock::time_point now) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    const Group& g = it->second;
    if (g.consumers.empty() && now - g.idle_since >= config_.group_retention) {
      consumed_floor_ = std::max(consumed_floor_, g.AckedBelow());
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

bool Stream::MakeRoomLocked(uint64_t bytes) {
  auto fits = [&] {
    if (log_.size() + 1 > config_.max_samples) return false;
    if (retained_bytes_ + bytes > config_.max_bytes) return false;
    return true;
  };
  const uint64_t floor = FloorLocked();
  while (!fits() && !log_.empty() && log_.front()->offset < floor) {
    uint64_t n = log_.front()->bytes();
    log_.pop_front();
    retained_bytes_ -= n;
    if (account_) account_->Release(n);
    ++evicted_;
  }
  if (!fits()) return false;
  if (account_ && !account_->TryCharge(bytes)) {
    // The daemon's budget is full: evict what may go (even below the stream's own bounds), retry.
    while (!log_.empty() && log_.front()->offset < floor) {
      uint64_t n = log_.front()->bytes();
      log_.pop_front();
      retained_bytes_ -= n;
      account_->Release(n);
      ++evicted_;
      if (account_->TryCharge(bytes)) return true;
    }
    return false;
  }
  return true;
}

Result<uint64_t> Stream::Put(std::vector<uint8_t> data, int64_t label, const std::string& metadata,
                             const PutOptions& options) {
  return PutFrom(&data, label, metadata, options);
}

Result<uint64_t> Stream::PutFrom(std::vector<uint8_t>* data, int64_t label, const std::string& metadata,
                                 const PutOptions& options) {
  const uint64_t bytes = data->size() + metadata.size() + options.key.size();  // = StreamSample::bytes()
  if (bytes > config_.max_bytes) {
    return InvalidArgument("stream '" + config_.name + "': a sample of " + std::to_string(bytes) +
                           " bytes can never fit its max_bytes " + std::to_string(config_.max_bytes));
  }
  const bool forever = options.max_wait == std::chrono::milliseconds::max();
  const auto deadline =
      forever ? std::chrono::steady_clock::time_point::max() : std::chrono::steady_clock::now() + options.max_wait;
  std::unique_lock<std::mutex> lock(mu_);
  bool counted_block = false;
  for (;;) {
    if (closed_) return FailedPrecondition("stream '" + config_.name + "' is closed");
    auto now = std::chrono::steady_clock::now();
    ForgetIdleGroupsLocked(now);
    if (MakeRoomLocked(bytes)) break;
    if (!counted_block) {
      ++blocked_puts_;
      counted_block = true;
    }
    if (!options.block || now >= deadline) {
      return ResourceExhausted("stream '" + config_.name + "' is full (" + std::to_string(log_.size()) + " samples, " +
                               std::to_string(retained_bytes_) + " bytes retained; max_samples " +
                               std::to_string(config_.max_samples) + ", max_bytes " +
                               std::to_string(config_.max_bytes) + (account_ ? ", or the daemon's memory budget" : "") +
                               "): its consumers have not acknowledged the oldest samples yet");
    }
    // Wake now and then: an idle group's retention may run out with nobody signalling.
    auto until = std::min(deadline, now + std::chrono::milliseconds(100));
    space_cv_.wait_until(lock, until);
  }
  auto sample = std::make_shared<StreamSample>();
  sample->label = label;
  sample->data = std::move(*data);
  sample->metadata = metadata;
  sample->key = options.key;
  const uint64_t offset = tail_++;
  sample->offset = offset;
  retained_bytes_ += bytes;
  put_bytes_ += sample->data.size();
  log_.push_back(std::move(sample));
  lock.unlock();
  data_cv_.notify_all();
  return offset;
}

void Stream::Close() {
  std::vector<std::function<void()>> listeners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    listeners.swap(room_listeners_);
  }
  space_cv_.notify_all();
  data_cv_.notify_all();
  for (auto& fn : listeners) fn();
}

void Stream::NotifyOnRoom(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  room_listeners_.push_back(std::move(fn));
}

bool Stream::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

bool Stream::drained() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_ && FloorLocked() >= tail_;
}

void Stream::AddProducer() {
  std::lock_guard<std::mutex> lock(mu_);
  ++producers_;
}

void Stream::RemoveProducer() {
  std::lock_guard<std::mutex> lock(mu_);
  if (producers_ > 0) --producers_;
}

const StreamSample* Stream::FindLocked(uint64_t offset) const {
  uint64_t head = HeadLocked();
  if (offset < head || offset >= tail_) return nullptr;
  return log_[offset - head].get();
}

Result<ConsumerId> Stream::Join(const std::string& group, std::optional<uint64_t> resume_after) {
  if (group.empty()) return InvalidArgument("stream '" + config_.name + "': a consumer group needs a name");
  std::lock_guard<std::mutex> lock(mu_);
  ForgetIdleGroupsLocked(std::chrono::steady_clock::now());
  const uint64_t head = HeadLocked();
  if (resume_after && *resume_after >= tail_) {
    return InvalidArgument("stream '" + config_.name + "': resume token " + std::to_string(*resume_after) +
                           " is beyond the stream's last offset (" +
                           (tail_ == 0 ? std::string("none put yet") : std::to_string(tail_ - 1)) +
                           "): a token of another stream, or of a daemon since restarted");
  }
  auto it = groups_.find(group);
  if (it == groups_.end()) {
    uint64_t start = head;
    if (resume_after) {
      start = *resume_after + 1;
      if (start < head) {
        return DataLoss("stream '" + config_.name + "': cannot resume group '" + group + "' after offset " +
                        std::to_string(*resume_after) + ": " + std::to_string(head - start) + " samples (offsets " +
                        std::to_string(start) + ".." + std::to_string(head - 1) +
                        ") were evicted; the oldest retained is " + std::to_string(head));
      }
    }
    Group g;
    g.name = group;
    g.next = start;
    it = groups_.emplace(group, std::move(g)).first;
  }
  ConsumerId id = next_consumer_++;
  it->second.consumers.insert(id);
  consumers_[id] = Consumer{group, false};
  return id;
}

Result<Stream::Taken> Stream::Take(ConsumerId id, size_t max, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto cit = consumers_.find(id);
    if (cit == consumers_.end()) {
      return NotFound("stream '" + config_.name + "': consumer " + std::to_string(id) + " is not joined");
    }
    if (cit->second.cancelled) return Cancelled("stream '" + config_.name + "': consumer cancelled");
    Group& g = groups_.at(cit->second.group);
    Taken out;
    while (out.samples.size() < max && !g.redeliver.empty()) {
      uint64_t off = *g.redeliver.begin();
      g.redeliver.erase(g.redeliver.begin());
      const StreamSample* s = FindLocked(off);
      if (!s) continue;  // cannot happen: un-acked samples are never evicted
      out.samples.push_back(log_[off - HeadLocked()]);
      g.in_flight[off] = id;
      ++g.delivered;
      ++g.redelivered;
    }
    while (out.samples.size() < max && g.next < tail_) {
      uint64_t off = g.next++;
      out.samples.push_back(log_[off - HeadLocked()]);
      g.in_flight[off] = id;
      ++g.delivered;
    }
    if (!out.samples.empty()) return out;
    if (closed_ && g.redeliver.empty() && g.next >= tail_) {
      out.end = true;
      return out;
    }
    if (std::chrono::steady_clock::now() >= deadline) return out;
    data_cv_.wait_until(lock, deadline);
  }
}

void Stream::Cancel(ConsumerId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = consumers_.find(id);
    if (it == consumers_.end()) return;
    it->second.cancelled = true;
  }
  data_cv_.notify_all();
}

void Stream::Ack(ConsumerId id, const std::vector<uint64_t>& offsets) {
  std::vector<std::function<void()>> listeners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto cit = consumers_.find(id);
    if (cit == consumers_.end()) return;
    listeners.swap(room_listeners_);
    Group& g = groups_.at(cit->second.group);
    for (uint64_t off : offsets) {
      auto it = g.in_flight.find(off);
      if (it != g.in_flight.end() && it->second == id) g.in_flight.erase(it);
    }
  }
  space_cv_.notify_all();
  for (auto& fn : listeners) fn();
}

void Stream::Leave(ConsumerId id) {
  bool returned = false;
  std::vector<std::function<void()>> listeners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto cit = consumers_.find(id);
    if (cit == consumers_.end()) return;
    listeners.swap(room_listeners_);
    Group& g = groups_.at(cit->second.group);
    for (auto it = g.in_flight.begin(); it != g.in_flight.end();) {
      if (it->second == id) {
        g.redeliver.insert(it->first);
        it = g.in_flight.erase(it);
        returned = true;
      } else {
        ++it;
      }
    }
    g.consumers.erase(id);
    if (g.consumers.empty()) g.idle_since = std::chrono::steady_clock::now();
    consumers_.erase(cit);
  }
  if (returned) data_cv_.notify_all();
  space_cv_.notify_all();  // a group may be forgotten now (retention 0)
  for (auto& fn : listeners) fn();
}

StreamStats Stream::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  StreamStats s;
  s.name = config_.name;
  s.owner_uid = owner_uid_;
  s.max_samples = config_.max_samples;
  s.max_bytes = config_.max_bytes;
  s.head_offset = HeadLocked();
  s.tail_offset = tail_;
  s.retained_samples = log_.size();
  s.retained_bytes = retained_bytes_;
  s.put_bytes = put_bytes_;
  s.evicted = evicted_;
  s.blocked_puts = blocked_puts_;
  s.producers = producers_;
  s.closed = closed_;
  for (const auto& [name, g] : groups_) {
    GroupStats gs;
    gs.name = name;
    gs.consumers = static_cast<uint32_t>(g.consumers.size());
    gs.next_offset = g.next;
    gs.acked_below = g.AckedBelow();
    gs.lag = tail_ - gs.acked_below;
    gs.in_flight = g.in_flight.size();
    gs.redeliver = g.redeliver.size();
    gs.delivered = g.delivered;
    gs.redelivered = g.redelivered;
    s.groups.push_back(std::move(gs));
  }
  return s;
}

Result<std::shared_ptr<Stream>> StreamRegistry::Define(const StreamConfig& config, uint32_t uid) {
  std::string problems;
  auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  if (std::string e = CheckStreamName(config.name); !e.empty()) add(e);
  if (config.max_samples < 1) add("max_samples must be at least 1");
  if (config.max_bytes < 1) add("max_bytes must be at least 1");
  if (config.group_retention.count() < 0) add("group_retention must not be negative");
  if (!problems.empty()) return InvalidArgument("stream '" + config.name + "': " + problems);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(config.name);
  uint64_t first = 0;
  if (it != streams_.end()) {
    SPDL_RETURN_IF_ERROR(it->second->CheckAccess(uid));
    // A drained stream nobody uses any more is defined anew (by this uid), its offsets continuing.
    if (!(it->second->drained() && it->second.use_count() == 1)) return it->second;
    first = it->second->Stats().tail_offset;
    streams_.erase(it);
  }
  auto stream = std::make_shared<Stream>(config, uid, account_, first);
  streams_[config.name] = stream;
  return stream;
}

Result<std::shared_ptr<Stream>> StreamRegistry::Open(const std::string& name, uint32_t uid) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(name);
  if (it == streams_.end()) return NotFound("no stream '" + name + "' on this daemon");
  SPDL_RETURN_IF_ERROR(it->second->CheckAccess(uid));
  return it->second;
}

std::vector<std::shared_ptr<Stream>> StreamRegistry::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<Stream>> out;
  out.reserve(streams_.size());
  for (const auto& [name, s] : streams_) out.push_back(s);
  return out;
}

void StreamRegistry::CloseAll() {
  for (auto& s : List()) s->Close();
}

}  // namespace spdl::streams
