// Stream: a named, node-local, unbounded sequence of samples that producers put and jobs consume as
// it arrives (issue 21). Each sample gets the next offset (0, 1, 2, ...). The stream retains a log of
// the samples not yet consumed, bounded by max_samples and max_bytes (and the daemon's memory
// budget, through a MemoryAccount): a Put that does not fit blocks (or, not blocking, fails with
// kResourceExhausted) until consumers acknowledge enough samples to evict the oldest. Nothing is
// dropped silently.
//
// Delivery: consumers join a named group. Each sample goes to exactly one consumer of a group (the
// consumers of a group share the stream, like ranks); every group sees every sample. A consumer
// Takes samples (they are then in flight, owned by it) and Acks them once the trainer has them;
// when it Leaves (its job ended, or its client died: kill -9 closes the session) its un-acknowledged
// samples go back to its group and are handed to the group's next Take first.
//
// Retention: a sample is evicted (only to make room for a Put) once every live group has acknowledged
// it. A group with no consumers stays live for StreamConfig::group_retention, then is forgotten
// (its position lost: a consumer joining it later starts where its resume token says).
// With no live group at all, the samples some forgotten group acknowledged are evictable, the others
// wait for a consumer (a stream nobody has read yet fills and then blocks its producers).
//
// Resume: a job's resume token is the last offset it delivered. Joining a group that is not live
// with resume_after = T starts the group at T + 1; when T + 1 was evicted already, Join fails with
// kDataLoss naming how many samples were lost. Joining a live group continues the group (its
// redelivered samples first), the token is then only checked against the log.
//
// Thread safety: a Stream is safe to share between threads (one mutex; blocked Puts and Takes wait
// on condition variables, outside nothing else). StreamRegistry likewise.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace spdl::streams {

// Counts the bytes streams retain against the daemon's memory budget (jobs::MemoryBudget implements
// it in the daemon; tests use a plain counter). Thread-safe implementations only.
class MemoryAccount {
 public:
  virtual ~MemoryAccount() = default;
  // Charges `bytes` when the budget has room for them: true; otherwise false and nothing charged.
  virtual bool TryCharge(uint64_t bytes) = 0;
  // Returns bytes charged before. REQUIRES: bytes <= what is charged.
  virtual void Release(uint64_t bytes) = 0;
};

// A stream's definition: its limits and who may use it. Given by whoever defines the stream first
// (the first producer, or the first stream job), see StreamRegistry::Define.
struct StreamConfig {
  std::string name;                                  // [A-Za-z0-9_.-]{1,128}
  uint64_t max_samples = 100000;                     // retained samples at most, >= 1
  uint64_t max_bytes = uint64_t{256} << 20;          // retained bytes at most (data + metadata), >= 1
  std::vector<uint32_t> allowed_uids;                // who besides the defining uid (and root) may produce and consume
  std::chrono::milliseconds group_retention{60000};  // how long a group with no consumer keeps its place
};

// "" when `name` is a valid stream name, else why not.
std::string CheckStreamName(const std::string& name);

// One sample of a stream, immutable once put; shared by the log and the consumers that hold it.
struct StreamSample {
  uint64_t offset = 0;
  int64_t label = -1;  // -1: none (io::kNoLabel)
  std::vector<uint8_t> data;
  std::string metadata;  // opaque bytes from the producer, delivered with the sample
  std::string key;       // a name for logs and errors (a file's path, "producer 12 sample 3")
  uint64_t bytes() const { return data.size() + metadata.size() + key.size(); }
};
using SamplePtr = std::shared_ptr<const StreamSample>;

// What a Put carries besides the bytes. Plain values.
struct PutOptions {
  bool block = true;  // false: a full stream fails the Put at once with kResourceExhausted
  // How long a blocking Put waits for room at most (then kResourceExhausted); max() = until room or Close.
  std::chrono::milliseconds max_wait = std::chrono::milliseconds::max();
  std::string key;  // StreamSample::key ("": none, logs name the stream and offset)
};

using ConsumerId = uint64_t;

struct GroupStats {
  std::string name;
  uint32_t consumers = 0;
  uint64_t next_offset = 0;  // the next fresh offset this group hands out
  uint64_t acked_below = 0;  // every offset below it is acknowledged by the group
  uint64_t lag = 0;          // samples put and not yet acknowledged by the group (tail - acked_below)
  uint64_t in_flight = 0;    // taken by a consumer, not acknowledged
  uint64_t redeliver = 0;    // waiting to be handed out again (their consumer left)
  uint64_t delivered = 0;    // Takes' samples, redeliveries included
  uint64_t redelivered = 0;  // of which handed out a second (or later) time
};

struct StreamStats {
  std::string name;
  uint32_t owner_uid = 0;
  uint64_t max_samples = 0, max_bytes = 0;
  uint64_t head_offset = 0;  // the oldest retained offset
  uint64_t tail_offset = 0;  // the next offset a Put gets (= samples put in all)
  uint64_t retained_samples = 0, retained_bytes = 0;
  uint64_t put_bytes = 0;     // in all
  uint64_t evicted = 0;       // samples evicted in all
  uint64_t blocked_puts = 0;  // Puts that had to wait (or failed, not blocking) for room
  uint32_t producers = 0;     // attached producers (AddProducer)
  bool closed = false;
  std::vector<GroupStats> groups;  // live groups, by name
};

class Stream {
 public:
  // REQUIRES: config is valid (StreamRegistry::Define checks it). `account` may be null (no budget);
  // it must outlive the stream. first_offset: the first offset Puts get (0 for a new stream).
  Stream(StreamConfig config, uint32_t owner_uid, MemoryAccount* account, uint64_t first_offset = 0);
  ~Stream();  // releases the retained bytes from the account
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const std::string& name() const { return config_.name; }
  const StreamConfig& config() const { return config_; }
  uint32_t owner_uid() const { return owner_uid_; }
  // OK when `uid` may produce into and consume from the stream (the owner, allowed_uids, root);
  // else kPermissionDenied naming the stream and the uid.
  Status CheckAccess(uint32_t uid) const;

  // ---- producing ----
  // Appends a sample and returns its offset. Blocks while the stream is full (options.block; up to
  // options.max_wait). Errors: kInvalidArgument when the sample alone exceeds max_bytes (it could
  // never fit); kResourceExhausted when full and not blocking / waited max_wait (naming the bound);
  // kFailedPrecondition when the stream is closed (also wakes a blocked Put).
  Result<uint64_t> Put(std::vector<uint8_t> data, int64_t label, const std::string& metadata,
                       const PutOptions& options = {});
  // Put, taking *data's bytes (moving them out) only when it succeeds: a refused put leaves *data
  // as it was, for a caller that queues and retries (options.block false). REQUIRES: data != nullptr.
  Result<uint64_t> PutFrom(std::vector<uint8_t>* data, int64_t label, const std::string& metadata,
                           const PutOptions& options);
  // Ends the stream: further Puts fail; consumers drain what is retained and then see the end.
  // Idempotent.
  void Close();
  bool closed() const;
  // Closed, and every sample it was put acknowledged by every live group (with none live: by the
  // groups it had): nothing is left to deliver.
  bool drained() const;
  // Calls `fn` once, outside the stream's lock and on the thread that frees it, the next time room
  // may have appeared (an Ack, a Leave, a Close): for a producer that cannot block (a session on
  // the daemon's control thread), which then tries a non-blocking Put again. `fn` must be cheap.
  void NotifyOnRoom(std::function<void()> fn);
  // Producers attached (for stats; a session's producer calls Add on open and Remove on close).
  void AddProducer();
  void RemoveProducer();

  // ---- consuming ----
  // Joins `group` (created when not live; it starts at the oldest retained sample, or right after
  // *resume_after). Errors: kDataLoss when the samples after *resume_after were evicted (how many);
  // kInvalidArgument when *resume_after >= the tail (a token of another stream); kInvalidArgument
  // for an empty group name.
  Result<ConsumerId> Join(const std::string& group, std::optional<uint64_t> resume_after = std::nullopt);

  struct Taken {
    std::vector<SamplePtr> samples;  // in flight for the consumer from now on, oldest redelivery first
    bool end = false;                // the stream is closed and the group has nothing left to hand out
  };
  // Hands up to `max` samples to consumer `id`: its group's redeliveries first, then fresh ones in
  // offset order. Waits up to `wait` until at least one is there (or the end, or Cancel). Returns
  // with no samples and end == false when the wait ran out. Errors: kNotFound for an unknown id
  // (it left); kCancelled after Cancel(id). REQUIRES: max >= 1.
  Result<Taken> Take(ConsumerId id, size_t max, std::chrono::milliseconds wait);
  // Wakes consumer `id`'s Take (now and later) with kCancelled: its job stops.
  void Cancel(ConsumerId id);
  // Acknowledges samples consumer `id` took: its group is done with them (they may be evicted).
  // Offsets it does not hold are ignored (acknowledged twice, or after it left).
  void Ack(ConsumerId id, const std::vector<uint64_t>& offsets);
  // The consumer leaves: its un-acknowledged samples go back to its group for redelivery. The group
  // stays live for group_retention when it was its last consumer. Unknown ids are ignored.
  void Leave(ConsumerId id);

  StreamStats Stats() const;

 private:
  struct Group {
    std::string name;
    std::set<ConsumerId> consumers;
    uint64_t next = 0;                                   // next fresh offset
    std::set<uint64_t> redeliver;                        // offsets to hand out again
    std::map<uint64_t, ConsumerId> in_flight;            // offset -> consumer holding it
    std::chrono::steady_clock::time_point idle_since{};  // when its last consumer left
    uint64_t delivered = 0, redelivered = 0;
    uint64_t AckedBelow() const;
  };
  struct Consumer {
    std::string group;
    bool cancelled = false;
  };

  // Everything below holds mu_.
  uint64_t FloorLocked() const;  // offsets below are acknowledged by every live group
  void ForgetIdleGroupsLocked(std::chrono::steady_clock::time_point now);
  // Evicts acknowledged samples from the head until `bytes` more fit (or nothing more may go).
  bool MakeRoomLocked(uint64_t bytes);
  const StreamSample* FindLocked(uint64_t offset) const;
  uint64_t HeadLocked() const { return log_.empty() ? tail_ : log_.front()->offset; }

  // Constant after construction.
  const StreamConfig config_;
  const uint32_t owner_uid_;
  MemoryAccount* const account_;

  mutable std::mutex mu_;
  std::condition_variable space_cv_;  // room freed, or closed
  std::condition_variable data_cv_;   // a sample put, redelivered, closed, or a consumer cancelled
  // Guarded by mu_.
  std::deque<SamplePtr> log_;  // retained samples, offsets contiguous from HeadLocked()
  uint64_t tail_ = 0;          // next offset
  uint64_t retained_bytes_ = 0;
  uint64_t consumed_floor_ = 0;  // the highest floor a forgotten group had reached
  uint64_t put_bytes_ = 0, evicted_ = 0, blocked_puts_ = 0;
  uint32_t producers_ = 0;
  bool closed_ = false;
  ConsumerId next_consumer_ = 1;
  std::map<std::string, Group> groups_;
  std::map<ConsumerId, Consumer> consumers_;
  std::vector<std::function<void()>> room_listeners_;  // NotifyOnRoom's, called once
};

// The daemon's streams by name. A stream is defined by the first producer or stream job that names
// it (Define, with that one's limits, owned by its uid); later users must have access (owner,
// allowed_uids, root) and get the existing stream, whatever limits they give.
//
// Thread safety: safe to share between threads.
class StreamRegistry {
 public:
  // `account` (may be null) counts every stream's retained bytes; it must outlive the registry.
  explicit StreamRegistry(MemoryAccount* account = nullptr) : account_(account) {}

  // Returns stream config.name, defining it (owned by `uid`) when it does not exist, or exists but
  // is drained and unused (a new incarnation: its offsets continue after the old ones; a closed
  // stream still holding samples nobody consumed is kept until they are). Errors:
  // kInvalidArgument for a bad name or limits (every problem named); kPermissionDenied when it
  // exists and `uid` may not use it.
  Result<std::shared_ptr<Stream>> Define(const StreamConfig& config, uint32_t uid);
  // The stream `name` when `uid` may use it: kNotFound, kPermissionDenied.
  Result<std::shared_ptr<Stream>> Open(const std::string& name, uint32_t uid) const;
  // Every stream, by name.
  std::vector<std::shared_ptr<Stream>> List() const;
  // Closes every stream (daemon shutdown): blocked Puts and Takes return.
  void CloseAll();

 private:
  MemoryAccount* const account_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Stream>> streams_;  // guarded by mu_
};

}  // namespace spdl::streams
