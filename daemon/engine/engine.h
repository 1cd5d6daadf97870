// The placement engine: the state table, a policy, the ghost store and the
// tick planner. Pure: no syscalls, no clock reads, no I/O. The simulator and the
// daemon drive the same class; only who calls Touch and Plan differs.
//
// Thread-safety: none. One owner calls every method.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cxltier/block.h"
#include "engine/ghost_store.h"
#include "engine/key_index.h"
#include "engine/policy.h"
#include "engine/slot_list.h"
#include "engine/types.h"

namespace cxltier::engine {

struct EngineOptions {
  uint64_t block_bytes = 5ull << 20;          // bytes of one block (5 MiB: Llama-3 70B)
  uint64_t tier0_budget_bytes = 32ull << 30;  // bytes of tier 0 cxltier may fill
  Persistence persistence = Persistence::kPersist;
  Mode mode = Mode::kDemand;
  size_t ghost_capacity = 1u << 20;  // ghosts kept after release (persist only)
  // Ghosts one owner (Admit's opaque `owner`; the daemon's uid) may keep;
  // 0 = no share of its own, the global capacity alone (the simulator).
  size_t ghost_capacity_per_owner = 0;
  uint64_t migrate_bytes_per_tick = 0;  // tick mode: byte budget of one Plan(); 0 = unlimited
  uint32_t hysteresis_ticks = 0;        // tick mode: ticks a moved block stays put
  // Tick mode: after a failed move the block waits retry_min_ticks before it
  // is planned again, doubling with each failure in a row up to retry_max_ticks.
  uint32_t retry_min_ticks = 1;
  uint32_t retry_max_ticks = 64;
  size_t expected_blocks = 0;  // blocks to allocate tables for up front (a hint)
};

struct EngineCounters {
  uint64_t touches = 0;
  uint64_t hits = 0;  // touches of a block in tier 0 at that moment
  uint64_t admits = 0;
  uint64_t releases = 0;
  uint64_t ghost_restores = 0;  // admits that got a ghost's state back
  uint64_t ghosts_dropped = 0;  // ghosts pushed out of the bounded store (by either bound)
  uint64_t evictions = 0;       // blocks the policy took out of its tier-0 set
  uint64_t placed_fast = 0;     // new blocks placed straight into tier 0
  uint64_t promotions = 0;      // tier 1 -> tier 0 moves
  uint64_t demotions = 0;       // tier 0 -> tier 1 moves
  uint64_t promoted_bytes = 0;
  uint64_t demoted_bytes = 0;
  uint64_t failed_moves = 0;      // moves the caller reported as not done
  uint64_t bad_observations = 0;  // NaN, infinite or negative observations (counted as 0)
  uint64_t ticks = 0;
};

// One planned move. The caller carries it out and reports back with Complete().
struct Move {
  Slot slot;
  uint32_t generation;  // the slot's generation when planned; stale moves are ignored
  Tier from;
  Tier to;
};

// What the engine did, in order; recorded only when a log is attached (tests).
struct EngineEvent {
  enum Kind : uint8_t { kEvict, kPromote, kDemote, kPlaceFast, kPlaceSlow, kRelease };
  Kind kind;
  BlockKey key;
  friend bool operator==(const EngineEvent&, const EngineEvent&) = default;
};

class Engine {
 public:
  // REQUIRES: policy != nullptr, options.block_bytes > 0.
  Engine(const EngineOptions& options, std::unique_ptr<Policy> policy);

  // Admits `key` (idempotent: a known key returns its slot). With persist, a
  // ghost of the key restores its score, count and touch time. In tick mode the
  // block is placed in tier 0 while that has room, else in tier 1; in demand mode
  // it is placed by its first touch. `owner` is opaque to the engine: the
  // block's ghost, once released, counts against that owner's ghost share
  // (a ghost of the key is restored whoever owned it). A known key keeps its owner.
  Slot Admit(const BlockKey& key, uint32_t owner = 0);

  // Tick mode, for the daemon: admits `key` whose pages already sit in `placed`
  // (kFast or kSlow). Tier 0 may then hold more than the budget; the next plans
  // demote the excess. REQUIRES: mode kTick.
  Slot Admit(const BlockKey& key, Tier placed, uint32_t owner = 0);

  // Persist only: puts a ghost (from a checkpoint) into the ghost store as
  // `owner`'s, unless its key is live. Returns false when it was not kept.
  bool RestoreGhost(const BlockState& ghost, uint32_t owner = 0);

  // The slot of `key`, or kNoSlot.
  Slot Find(const BlockKey& key) const;

  // Folds one touch into the block's state. Returns true on a hit (the block was
  // in tier 0). In demand mode a miss promotes the block at once. REQUIRES: a live slot.
  bool Touch(Slot slot, const Touch& touch);

  // Forgets the block; with persist its state becomes a ghost. REQUIRES: a live slot.
  void Release(Slot slot);

  // Tick mode: plans moves that bring tier 0 towards the policy's set within the
  // migration byte budget and hysteresis: promotes the blocks of the set not in
  // tier 0, first those touched again since they were queued, then the others,
  // each group most recently touched first, each paired (when tier 0 is full) with
  // the demotion of the tier-0 block that left the set longest ago. Demotions
  // come before the promotions they make room for. Returns the moves; the span
  // lives until the next Plan().
  std::span<const Move> Plan();

  // Reports the outcome of a planned move. Only a move reported done changes the
  // block's tier. A move whose slot was released (or reused) since is ignored.
  void Complete(const Move& move, bool done);

  // The caller found the block's pages in `tier` without a planned move of its
  // own (a stale move of the previous owner of the same memory landed there).
  // Records it; not counted as a migration. Ignored while a move is in flight.
  void Relocated(Slot slot, Tier tier);

  // Tick mode: replaces the policy at run time. The new policy's tier-0 set is
  // rebuilt from the live blocks, offered in the order they were last touched
  // (no touch is counted, nothing is evicted in the counters); blocks then in
  // the wrong tier are queued for Plan(). Scores carry over as they are until
  // each block's next touch re-scores it.
  void SetPolicy(std::unique_ptr<Policy> policy);

  // Plan() and complete every move at once (the simulator). Returns the moves made.
  size_t PlanAndApply();

  bool IsLive(Slot slot) const {
    return slot < states_.size() && (states_[slot].flags & kFlagResident);
  }
  const BlockState& state(Slot slot) const { return states_[slot]; }
  // The owner the live block was admitted with.
  uint32_t owner(Slot slot) const { return owners_[slot]; }
  // A hint that slot s will be touched soon: starts loading its state line,
  // its policy links and its planner-queue link.
  void Prefetch(Slot s) const {
    if (s >= states_.size()) return;
    __builtin_prefetch(&states_[s], 1);
    policy_->Prefetch(s);
    queues_.Prefetch(s);
  }
  const EngineCounters& counters() const { return counters_; }
  const EngineOptions& options() const { return options_; }
  // Tick mode: the byte budget of the next Plan() calls (0 = unlimited). The
  // daemon's reload changes its tick and migration rate, so the budget too.
  void set_migrate_bytes_per_tick(uint64_t bytes) { options_.migrate_bytes_per_tick = bytes; }
  const Policy& policy() const { return *policy_; }
  size_t capacity_blocks() const { return capacity_; }
  size_t live_blocks() const { return index_.size(); }
  size_t tier_blocks(Tier t) const { return t == Tier::kFast ? fast_blocks_ : slow_blocks_; }
  const GhostStore& ghosts() const { return ghosts_; }

  // Attach a log that receives every EngineEvent (nullptr detaches).
  void set_event_log(std::vector<EngineEvent>* log) { log_ = log; }

 private:
  enum Queue { kPromoteQueue = 0, kDemoteQueue = 1, kRetouchedQueue = 2 };

  void Log(EngineEvent::Kind kind, Slot s) {
    if (__builtin_expect(log_ != nullptr, 0)) log_->push_back(EngineEvent{kind, states_[s].key});
  }
  Slot AdmitAt(const BlockKey& key, Tier placed, uint32_t owner);
  void SetTier(Slot s, Tier t);
  void LeaveSet(Slot victim);
  void Reclassify(Slot s);
  bool Held(Slot s) const;  // by hysteresis or by a failed move's backoff

  EngineOptions options_;
  std::unique_ptr<Policy> policy_;
  size_t capacity_;
  std::vector<BlockState> states_;
  std::vector<Slot> free_slots_;
  Slot next_slot_ = 0;                // slots [0, next_slot_) have been handed out at least once
  std::vector<uint64_t> moved_tick_;  // tick of the block's last completed move (0 = never)
  std::vector<uint32_t> owners_;      // by slot: Admit's owner, the owner of its ghost
  struct Retry {
    uint64_t not_before = 0;  // first tick the block may be planned again
    uint32_t failures = 0;    // failed moves in a row
  };
  std::vector<Retry> retry_;  // by slot
  KeyIndex index_;
  GhostStore ghosts_;
  // Tick mode: promotion candidates not touched since they were queued (newest
  // at the front), demotion candidates (oldest at the back, served first), and
  // promotion candidates touched again while waiting (most recent at the front,
  // served before the others).
  SlotLists queues_{3};
  std::vector<Move> moves_;
  EngineCounters counters_;
  uint64_t seq_ = 0;
  uint64_t tick_ = 0;
  size_t fast_blocks_ = 0;
  size_t slow_blocks_ = 0;
  size_t inflight_promotions_ = 0;  // planned moves to tier 0 not yet completed
  size_t inflight_demotions_ = 0;   // planned moves to tier 1 not yet completed
  std::vector<EngineEvent>* log_ = nullptr;
};

}  // namespace cxltier::engine
