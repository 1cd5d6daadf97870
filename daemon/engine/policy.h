// The policy interface: one small class per eviction policy, chosen by name.
//
// A policy owns a set of at most `capacity` blocks: the blocks it wants in
// tier 0. The engine tells it about touches; on a touch of a block outside the
// set the policy admits it and names the block it evicts to make room. In
// demand mode the set is tier 0; in tick mode the planner moves tier 0 towards it.
// Exact definitions of every policy: docs/policies.md.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cxltier/block.h"
#include "cxltier/status.h"
#include "engine/types.h"

namespace cxltier::engine {

class Policy {
 public:
  virtual ~Policy() = default;

  // The policy's name as given to MakePolicy ("lfu", "ema:0.01", ...).
  virtual std::string Name() const = 0;

  // The secret that keys the policy's own hashes of block keys (shards'
  // sample), EngineOptions::key_hash_seed; call before Bind. 0, the
  // simulator's, gives the same hashes in every run.
  void SetKeySeed(uint64_t seed) { key_seed_ = seed; }

  // Called once by the engine before any other call. `states` outlives the policy.
  void Bind(const std::vector<BlockState>* states, size_t capacity, Persistence persistence,
            Mode mode = Mode::kDemand) {
    states_ = states;
    capacity_ = capacity;
    persistence_ = persistence;
    mode_ = mode;
    OnBind();
  }

  // The block's new score after a touch. The engine has already advanced
  // st.touch_count, st.touch_time (= t.now) and st.touch_seq; `prev_score` and
  // `prev_time` are the values before this touch, `fresh` says it had none.
  virtual double Score(const BlockState& st, double prev_score, uint64_t prev_time, bool fresh,
                       const Touch& t) const = 0;

  // The block's new policy_word after a touch, called just before Score with
  // the same arguments (st.policy_word still the value before this touch). A
  // second score kept with the block (restored from a ghost, zeroed by
  // reset): shards keeps a second ema's average there. Unchanged by default.
  virtual uint32_t Word(const BlockState& st, uint64_t /*prev_time*/, bool /*fresh*/,
                        const Touch& /*t*/) const {
    return st.policy_word;
  }

  // A touch of `s`, which is in the set.
  virtual void OnHit(Slot s, const Touch& t) = 0;

  // A touch of `s`, which is not in the set: admit it. Returns the block evicted
  // to make room (never `s`), or kNoSlot when the set had room.
  virtual Slot OnMiss(Slot s, const Touch& t) = 0;

  // `s` is released: forget it entirely (the set and any history of the policy's own).
  virtual void Erase(Slot s) = 0;

  // Takes the next block of its own eviction order out of the set, as an
  // eviction (ARC keeps a ghost entry, S3-FIFO may first move blocks to its
  // main queue), and returns it; kNoSlot when the set is empty. It is
  // OnMiss's victim save where OnMiss weighs the incoming block against it
  // (W-TinyLFU's admission test, ARC's for a block in its ghost lists).
  // Shards drains a former leader's blocks with it (docs/policies.md,
  // "shards"): every policy that can be a shards candidate has one;
  // adaptive, which cannot, returns kNoSlot.
  virtual Slot EvictOne() { return kNoSlot; }

  // How hot the live block `s` is, higher hotter: orders a group's blocks for a
  // soon hint (Engine::Hint), and ranks the blocks below tier 0 when there are
  // more than two tiers. The block's score unless the policy knows better.
  virtual double Heat(Slot s) const { return state(s).score; }
  // Changes when Heat's scale changes (adaptive: its leader), so that heats
  // taken before are not compared with heats taken after.
  virtual uint64_t HeatEpoch() const { return 0; }

  // A policy that chooses among candidates (shards): the leading one, by its
  // place in the spec, and how many times the leader changed. A recording
  // writes each change (trace kind 9), and its exact replay makes the same
  // changes at the same touches instead of choosing: the policy's own
  // choice depends on a keyed hash of the keys, and a recording's keys are
  // hashed again. Every other policy: 0, 0, and nothing to follow.
  virtual size_t Leader() const { return 0; }
  virtual uint64_t LeaderChanges() const { return 0; }
  // From now on the leader changes only as told (FollowLeader), never by the
  // policy's own choice. False for a policy that chooses none.
  virtual bool FollowRecordedLeaders() { return false; }
  // Changes the leader to candidate `k`: `now`, or at the next touch that is
  // not ahead (OnHit or OnMiss), at the point where the recorded policy
  // changed it. False when there is no candidate `k`, or before
  // FollowRecordedLeaders (or for a policy that chooses none).
  virtual bool FollowLeader(size_t /*k*/, bool /*now*/) { return false; }

  // A soon hint places the block, whose group was idle for `idle_for` clock
  // units and runs again (now `now`): history the policy keeps by time of its
  // own (not in the block's state) should not age by that pause (Resumed).
  // The engine moves the state's touch_time on the same way.
  virtual void OnResume(Slot, uint64_t /*idle_for*/, uint64_t /*now*/) {}

  // A hint: about `n` slots will be used; make room in per-slot tables now
  // (capacity only, ReserveFor: nothing is written until a slot is used).
  virtual void Reserve(size_t) {}
  // A hint: the caller will touch slot s soon (a prefetch of its links).
  virtual void Prefetch(Slot) const {}

  // True when MIN-style future knowledge is needed (simulator only).
  virtual bool NeedsFuture() const { return false; }

 protected:
  virtual void OnBind() {}
  const BlockState& state(Slot s) const { return (*states_)[s]; }
  // A block the engine has seen before this touch, with history kept by
  // `persist`: SIEVE treats it as re-referenced.
  bool Returning(Slot s) const {
    return persistence_ == Persistence::kPersist && state(s).touch_count >= 2;
  }
  // A block whose state came back from the ghost store (it was released and
  // is admitted again, with `persist`), on its first miss since: S3-FIFO's
  // own ghost list forgot it when its slot was freed. Call it once per miss.
  bool BackFromGhost(Slot s) {
    const BlockState& st = state(s);
    if (persistence_ != Persistence::kPersist || !(st.flags & kFlagRestored)) return false;
    GrowFor(back_from_ghost_, s);
    if (back_from_ghost_[s] == st.generation) return false;
    back_from_ghost_[s] = st.generation;
    return true;
  }

  const std::vector<BlockState>* states_ = nullptr;
  std::vector<uint32_t> back_from_ghost_;  // the generation BackFromGhost last said yes to
  size_t capacity_ = 0;
  uint64_t key_seed_ = 0;
  Persistence persistence_ = Persistence::kPersist;
  Mode mode_ = Mode::kDemand;  // how the engine realises the set (only adaptive asks)
};

// "adaptive" alone: these experts (docs/policies.md, "adaptive").
inline constexpr std::string_view kAdaptivePolicy =
    "adaptive:sieve+arc+ema:0.05+ema:0.01+lru+s3fifo+tinylfu";
// "shards" alone: these candidates, the first leading first (docs/policies.md, "shards").
inline constexpr std::string_view kShardsPolicy =
    "shards:arc+lfu+ema:0.05+ema:0.01+lru+s3fifo+sieve+tinylfu";
// The policy "default" stands for the daemon's default, whatever it is
// (docs/policies.md, "The default", says why it is this one).
inline constexpr std::string_view kDefaultPolicy = kShardsPolicy;

// What a shards policy knows (docs/policies.md, "shards"), for tests and
// status; nullopt for any other policy.
struct ShardsView {
  size_t leader = 0;  // the leading candidate, by its place in the spec
  std::string leader_name;
  uint64_t switches = 0;
  double rate = 1;           // the sampling rate
  size_t mini_capacity = 0;  // each miniature's capacity
  uint64_t sampled_touches = 0;
  size_t sampled_keys = 0;             // keys in the sample, live or released (at most its `keys`)
  std::vector<uint64_t> sampled_hits;  // by candidate
  // Blocks of the set the leader holds, those still held by the former
  // leader (a switch hands the set over block by block), and whether there
  // is one (0 or 1).
  size_t leader_blocks = 0;
  size_t former_blocks = 0;
  size_t formers = 0;
};
std::optional<ShardsView> ViewShards(const Policy& policy);
// Whether `key` is in a shards sample at `rate` with key seed 0 (the
// simulator's): a hash of the key below rate x 2^32. The daemon keys the
// hash with its secret (Policy::SetKeySeed), so a client cannot choose keys
// that are sampled.
bool InShardsSample(const BlockKey& key, double rate);

// Builds a policy from its name: default, adaptive[:experts], lru, lfu,
// ema:<alpha>, arc, s3fifo, sieve, tinylfu, min, shards[:candidates]. A bad name is kBadPayload,
// saying what is known.
Result<std::unique_ptr<Policy>> MakePolicy(std::string_view spec);

// The names MakePolicy accepts, for help texts.
std::string PolicyNames();

// The EMA ordering key: log(score) + now * -log(1 - alpha). Decay multiplies
// every block by the same factor per step, so comparing keys orders blocks by
// their value at any common time without touching untouched blocks.
double EmaOrderKey(double score, uint64_t time, double alpha);

}  // namespace cxltier::engine
