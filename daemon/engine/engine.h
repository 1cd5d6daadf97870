// The placement engine: the state table, a policy, the ghost store and the
// tick planner. Pure: no syscalls, no clock reads, no I/O. The simulator and the
// daemon drive the same class; only who calls Touch and Plan differs.
//
// Thread-safety: none. One owner calls every method.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cxltier/block.h"
#include "engine/accounts.h"
#include "engine/ghost_store.h"
#include "engine/hints.h"
#include "engine/key_index.h"
#include "engine/policy.h"
#include "engine/slot_heap.h"
#include "engine/slot_list.h"
#include "engine/tiers.h"
#include "engine/types.h"

namespace cxltier::engine {

struct EngineOptions {
  uint64_t block_bytes = 5ull << 20;          // bytes of one block (5 MiB: Llama-3 70B)
  uint64_t tier0_budget_bytes = 32ull << 30;  // bytes of tier 0 cxltier may fill
  // Bytes of tiers 1 .. N-2 cxltier may fill, for a host with N > 2 tiers;
  // the last tier holds the rest. Empty: two tiers.
  std::vector<uint64_t> lower_tier_budget_bytes;
  Persistence persistence = Persistence::kPersist;
  Mode mode = Mode::kDemand;
  size_t ghost_capacity = 1u << 20;  // ghosts kept after release (persist only)
  // Ghosts one owner (Admit's opaque `owner`; the daemon's uid) may keep;
  // 0 = no share of its own, the global capacity alone (the simulator).
  size_t ghost_capacity_per_owner = 0;
  uint64_t migrate_bytes_per_tick = 0;  // tick mode: byte budget of one Plan(); 0 = unlimited
  uint32_t hysteresis_ticks = 0;        // tick mode: ticks a moved block stays put
  // Tick mode: the share of tier 0's budget (percent, at most 50) kept free
  // for new blocks, as the kernel keeps free pages between its watermarks.
  // The policy's set is that much smaller than tier 0; Plan() demotes the
  // blocks outside the set to keep the room; a new block lands in tier 0
  // while any of its budget is free, so it needs no promotion and its first
  // reads hit. Tier 0 never holds more than its budget through an admission.
  // 0: no room kept (new blocks land only where tier 0 happens to have room).
  uint32_t landing_percent = 0;
  // Tick mode: after a failed move the block waits retry_min_ticks before it
  // is planned again, doubling with each failure in a row up to retry_max_ticks.
  uint32_t retry_min_ticks = 1;
  uint32_t retry_max_ticks = 64;
  size_t expected_blocks = 0;  // blocks to allocate tables for up front (a hint)
  // Keys the hash of the key indexes (live blocks and ghosts): the daemon
  // draws a secret one at start, so that no client can choose keys that
  // collide there (KeyIndex). 0: unkeyed, as the simulator runs.
  uint64_t key_hash_seed = 0;
  // Tick mode: a hint's group-wide work (docs/policies.md, "What a hint
  // costs") is done in slices of at most this many units (a group member
  // looked at, a block ordered, a waiting soon looked at); Hint() does one
  // slice (Release(): hint_release_units), the rest continues at the next
  // ticks. 0: all at once, as demand mode always does.
  size_t hint_slice_units = 16384;
  // Tick mode: units of the waiting soons' round one Release() serves for
  // the room it leaves (at most hint_slice_units; 0: a slice). A Release
  // request names up to 1,024 blocks: with 16 it does at most one slice of
  // that work in all, however many soons wait (the rest is served at ticks).
  size_t hint_release_units = 16;
  // Tick mode: units of that work one Plan() (or RunHints()) does, every
  // group's in turn, a slice each (0: no bound); a round of waiting soons
  // cut short gets at least a slice more, whatever the jobs took.
  size_t hint_tick_units = 16384;
};

struct EngineCounters {
  uint64_t touches = 0;
  uint64_t hits = 0;  // touches of a block in tier 0 at that moment
  // Touches of a block in tier k at that moment (tier_hits[0] == hits); a
  // touch of a block with no tier yet (demand mode's first) counts in none.
  std::array<uint64_t, kMaxTiers> tier_hits{};
  uint64_t admits = 0;
  uint64_t releases = 0;
  uint64_t ghost_restores = 0;  // admits that got a ghost's state back
  uint64_t ghosts_dropped = 0;  // ghosts pushed out of the bounded store (by either bound)
  uint64_t evictions = 0;       // blocks the policy took out of its tier-0 set
  uint64_t placed_fast = 0;     // new blocks placed straight into tier 0
  uint64_t promotions = 0;      // moves to a faster tier (tier 1 -> tier 0 with two)
  uint64_t demotions = 0;       // moves to a slower tier (tier 0 -> tier 1 with two)
  uint64_t promoted_bytes = 0;
  uint64_t demoted_bytes = 0;
  uint64_t failed_moves = 0;      // moves the caller reported as not done
  uint64_t bad_observations = 0;  // NaN, infinite or negative observations (counted as 0)
  uint64_t ticks = 0;
  uint64_t hints = 0;               // Hint() calls that named a known group
  uint64_t hint_displaced = 0;      // blocks of idle or done groups taken out of the set first
  uint64_t hint_prefetched = 0;     // blocks a soon hint put into the set ahead of their touch
  uint64_t hint_prefetch_hits = 0;  // of those, touched next while in tier 0
  uint64_t hint_work = 0;           // units of hints' group-wide work done (hint_slice_units)
  uint64_t hint_deferred = 0;       // hints whose work did not fit their slice and went on at ticks
  uint64_t quota_evictions = 0;     // blocks taken out of the set by a cap or a guarantee
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
  // block is placed in tier 0 while that has room (counting the promotions in
  // flight), else in the first lower tier with room; in demand mode
  // it is placed by its first touch. `owner` is opaque to the engine: the
  // block's ghost, once released, counts against that owner's ghost share
  // (a ghost of the key is restored whoever owned it). A known key keeps its owner.
  // `client` (kNoAccount: none) is the block's second account for quotas.
  Slot Admit(const BlockKey& key, uint32_t owner = 0, uint64_t client = kNoAccount);

  // Tick mode, for the daemon: admits `key` whose pages already sit in `placed`
  // (any tier). A tier may then hold more than its budget (or an account more
  // than its cap); the next plans demote the excess. REQUIRES: mode kTick,
  // placed < tiers().
  Slot Admit(const BlockKey& key, Tier placed, uint32_t owner = 0, uint64_t client = kNoAccount);

  // Sets `account`'s quota (an unlimited Quota removes it), enforced at once:
  // an account over a lowered cap loses its coldest blocks there (demand mode
  // moves them now, tick mode queues them for Plan()). A client account's
  // guarantee is ignored. Quotas cost nothing until the first is set.
  void SetQuota(uint64_t account, const Quota& quota);
  // Starts keeping accounts before any quota (SetQuota starts it too): from
  // then on each hit also re-keys its block's place in its accounts' heaps.
  void TrackAccounts();
  // Once accounts are kept: every account with a quota or a live block, by id.
  std::vector<AccountUsage> Accounts() const;
  // How many more blocks of `owner` (and of client account `client`;
  // kNoAccount: none) tier k may take before one of those accounts is at its
  // cap there: tier 0 counting the moves in flight (as Plan() does), a middle
  // tier the blocks sitting in it. kNoCap when neither is capped there, for
  // the last tier, and while quotas are off. Copy mode places a new block in
  // a capped tier only with room here (its write lease may keep it there).
  size_t CapRoom(uint32_t owner, uint64_t client, unsigned tier) const;

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

  // Puts the live block `s` in `group` (kNoGroup: in none), out of the group it
  // was in. A group's blocks have one owner: returns false, and changes
  // nothing, when `s` has another owner than the group's blocks.
  bool SetGroup(Slot s, GroupId group);
  GroupId group(Slot s) const;

  // A hint about `group`'s live blocks, at clock `now`; false for a group with
  // no live block. kIdle and kDone mark the group's blocks in the policy's set
  // as the first to leave it: the next misses (and soon hints) take their room
  // before the policy evicts anything (done ones first, each group's coldest
  // first), and the group's next touch ends that. kSoon brings the group's
  // hottest blocks (by the policy's Heat) into the set, at most as many as it
  // had there when it last went idle or done, taking free room, then idle and
  // done blocks, then the policy's victims, but only while every block in the
  // set is the group owner's: a hint never displaces another owner's block. What
  // it cannot place now it places as room appears (idle, done and release),
  // groups served in turn, until its next hint. In tick mode Plan() moves
  // them within its budget, like any change of the set. Ignored by policies
  // that see the future (min).
  //
  // Cost: O(1) here, and the group-wide part (finding the blocks an idle or
  // done hint marks, or a soon's hottest, and ordering them) in slices of
  // hint_slice_units: in tick mode a large group's hint takes effect over the
  // next Plan() calls (docs/policies.md, "What a hint costs").
  bool Hint(GroupId group, HintKind kind, uint64_t now);

  // Tick mode: the hints' work left from earlier calls, at most
  // hint_tick_units of it, as Plan() does first. The daemon runs it only in
  // Plan() (a tick whose plan is skipped leaves it for the next), so that a
  // recording's exact replay, which replays the daemon's plans, does the same.
  void RunHints();
  // Hints' work is left for the next ticks (a soon waiting for room is not work).
  bool HintWorkPending() const { return groups_.WorkPending(); }

  // Tick mode: plans moves that bring tier 0 towards the policy's set within the
  // migration byte budget and hysteresis: promotes the blocks of the set not in
  // tier 0, first those touched again since they were queued, then the others,
  // each group most recently touched first, each paired (when tier 0 is full) with
  // the demotion of the tier-0 block that left the set longest ago. Demotions
  // come before the promotions they make room for. With more than two tiers, a
  // block demoted from tier 0 goes to the tier its rank gives it, and then the
  // blocks below tier 0 whose rank changed move, longest waiting first, into
  // tiers with room (the last always has). Returns the moves; the span lives
  // until the next Plan().
  // Hints' work left from earlier calls comes first (RunHints()).
  std::span<const Move> Plan();

  // Reports the outcome of a planned move. Only a move reported done changes the
  // block's tier. A move whose slot was released (or reused) since is ignored.
  void Complete(const Move& move, bool done);

  // The caller found the block's pages in `tier` without a planned move of its
  // own (a stale move of the previous owner of the same memory landed there).
  // Records it; not counted as a migration. Ignored while a move is in flight.
  // A block it moves loses its landing hold and its failed-move backoff.
  void Relocated(Slot slot, Tier tier);

  // Tick mode: replaces the policy at run time. The new policy's tier-0 set is
  // rebuilt from the live blocks, offered in the order they were last touched
  // (no touch is counted, nothing is evicted in the counters); blocks then in
  // the wrong tier are queued for Plan(). Scores carry over as they are until
  // each block's next touch re-scores it.
  void SetPolicy(std::unique_ptr<Policy> policy);
  // Room for `n` slots in every per-slot table and the key index, so that
  // admits up to n slots copy no table (capacity only, except the key
  // index's probe table: 16 bytes a slot written). The daemon calls it at a
  // client's hello for the slots the client may fill: a table is then copied
  // at a hello, not in the middle of a run of admits (docs/security.md).
  void Reserve(size_t n);

  // Plan() and complete every move at once (the simulator). Returns the moves made.
  size_t PlanAndApply();

  bool IsLive(Slot slot) const {
    return slot < states_.size() && (states_[slot].flags & kFlagResident);
  }
  const BlockState& state(Slot slot) const { return states_[slot]; }
  // The owner the live block was admitted with.
  uint32_t owner(Slot slot) const { return owners_[slot]; }
  // Owner `owner`'s live blocks by tier (status: no pass over the blocks).
  std::array<size_t, kMaxTiers> TierBlocksOf(uint32_t owner) const {
    return groups_.TierBlocksOf(owner);
  }
  // A hint that slot s will be touched soon: starts loading its state line,
  // its hint line, its policy links and its planner-queue link.
  void Prefetch(Slot s) const {
    if (s >= states_.size()) return;
    __builtin_prefetch(&states_[s], 1);
    __builtin_prefetch(&slot_hints_[s], 1);
    policy_->Prefetch(s);
    queues_.Prefetch(s);
  }
  const EngineCounters& counters() const { return counters_; }
  const EngineOptions& options() const { return options_; }
  // Tick mode: the byte budget of the next Plan() calls (0 = unlimited). The
  // daemon's reload changes its tick and migration rate, so the budget too.
  void set_migrate_bytes_per_tick(uint64_t bytes) { options_.migrate_bytes_per_tick = bytes; }
  // Tick mode, for the daemon: tier-0 blocks' worth of pages that no block
  // holds (released blocks' pages, still in tier 0 until the daemon moves
  // them down or a new block is admitted on them). They count as tier 0's
  // in the room of admissions and of promotions, never in its excess: Plan()
  // does not demote blocks for them (the daemon moves them itself, first).
  void set_held_blocks(size_t blocks) { held_ = blocks; }
  size_t held_blocks() const { return held_; }
  // Of them, `blocks` were left by released blocks of account `account`
  // (an owner's or a client's): they count against its tier-0 cap in the
  // room of its admissions and promotions (none while they fill its cap),
  // never as its excess, until set to 0.
  void set_account_held(uint64_t account, size_t blocks) { accounts_.SetHeld(account, blocks); }
  const Policy& policy() const { return *policy_; }
  // An exact replay of a recording (cxltier-sim --moves recorded): the
  // policy's leader changes only where the recording says, now or at the
  // next touch (Policy::FollowRecordedLeaders, FollowLeader).
  bool FollowRecordedLeaders() { return policy_->FollowRecordedLeaders(); }
  bool FollowLeader(size_t candidate, bool now) { return policy_->FollowLeader(candidate, now); }
  size_t capacity_blocks() const { return capacity_; }
  // Blocks the policy's set may hold: tier 0's capacity less its landing room.
  size_t set_capacity_blocks() const { return set_capacity_; }
  size_t live_blocks() const { return index_.size(); }
  // Blocks in the policy's set (kFlagInTarget).
  size_t set_blocks() const { return in_set_; }
  size_t tier_blocks(Tier t) const {
    return TierIndex(t) < tiers_.count() ? tiers_.blocks(TierIndex(t)) : 0;
  }
  // The number of tiers: 2 + lower_tier_budget_bytes.size().
  unsigned tiers() const { return tiers_.count(); }
  // Tier k's capacity in blocks (the last tier's: unbounded, SIZE_MAX).
  size_t tier_capacity_blocks(unsigned k) const;
  // Below tier 0: the tier the block outside the policy's set is ranked in (it
  // sits there, or will once Plan() moves it); 0 for a block in the set or
  // not ranked yet (admitted into tier 0 and not demoted since).
  unsigned rank(Slot s) const { return slot_hints_[s].rank; }
  // The tier a live block's move in flight goes to; kNone when none is.
  Tier moving_to(Slot s) const {
    return (states_[s].flags & kFlagMigrating) ? TierAt(slot_hints_[s].moving_to) : Tier::kNone;
  }
  const GhostStore& ghosts() const { return ghosts_; }

  // Attach a log that receives every EngineEvent (nullptr detaches).
  void set_event_log(std::vector<EngineEvent>* log) { log_ = log; }

 private:
  // kLowerQueue: blocks below tier 0 whose rank differs from the tier they sit in.
  enum Queue { kPromoteQueue = 0, kDemoteQueue = 1, kRetouchedQueue = 2, kLowerQueue = 3 };

  void Log(EngineEvent::Kind kind, Slot s) {
    if (__builtin_expect(log_ != nullptr, 0)) log_->push_back(EngineEvent{kind, states_[s].key});
  }
  Slot AdmitAt(const BlockKey& key, Tier placed, uint32_t owner, uint64_t client);
  void SetTier(Slot s, Tier t);
  // `s`, outside the set, enters it (a miss, or a soon's placement): the
  // policy's victim leaves, and demand mode moves both now, tick mode queues.
  void JoinSet(Slot s, const engine::Touch& t);
  void LeaveSet(Slot victim);
  // Tick mode: `v` left the set. Below tier 0 it is ranked in the tier it sits
  // in; in tier 0 it waits there unranked, and is ranked when Plan() demotes it.
  void LeftSetTick(Slot v);
  // With reset, a block that leaves the set loses its history.
  void ForgetIfReset(BlockState& v) const;
  // Demand mode: `v` leaves tier 0 now; `s` enters it now (a promotion from
  // tier 1, or a block with no tier yet placed there).
  void DemoteNow(Slot v);
  void EnterFastNow(Slot s);
  void EnterSet(Slot s);
  void ClearSet(Slot s);
  // Ranking below tier 0 (docs/policies.md, "More than two tiers"): `s`,
  // outside the set, enters tier `tier`'s ranking by its heat; each middle
  // tier over its capacity then sends its coldest one tier down. Every block
  // whose rank changed is settled: moved now (demand) or queued (tick).
  void Rank(Slot s, unsigned tier);
  void Unrank(Slot s);
  // Demand mode: moves `s` to its rank now; tick mode: queues it for Plan().
  void Settle(Slot s);
  // A completed move of `s` up (to a faster tier) or down: counted and logged.
  void CountMove(Slot s, bool up);
  // The policy's heat changed its scale (adaptive's leader): re-keys the rankings.
  void RekeyIfNeeded();
  // Takes the block out of the set for a hint or a quota (no policy eviction
  // is counted; `counter` is).
  void Displace(Slot v, uint64_t* counter);
  // Puts `s` into the set for a soon hint; returns false when there is no room.
  bool PlaceAhead(Slot s, uint32_t owner, uint64_t now);
  // Places waiting soons' blocks as room allows, spending at most *units.
  void ServePending(uint64_t now, size_t* units);
  // The next block of a done, then an idle group to leave (kNoSlot: none).
  Slot PoolBack() {
    return groups_.PoolBack([this](Slot s) { return slot_hints_[s].group; });
  }
  void LeaveGroup(Slot s);
  // Puts a member at `at` in its group's member list.
  void PlaceMember(Group& g, uint32_t at, Slot m) {
    g.members[at] = m;
    slot_hints_[m].pos = at;
  }
  // The units of one slice and of one tick (SIZE_MAX: no bound).
  size_t SliceUnits() const;
  size_t ReleaseUnits() const;  // SliceUnits(), at most hint_release_units
  size_t TickUnits() const;
  // Group `index`'s new job (the one it had, if any, ends).
  void StartJob(uint32_t index, HintKind kind, uint32_t keep);
  // Runs group `index`'s job for at most *units; true when it has finished.
  bool RunJob(uint32_t index, size_t* units);
  // A job done: an idle or done hint's blocks are in the pool (room for the
  // waiting soons), a soon's candidates wait for room.
  void FinishJob(uint32_t index, size_t* units);
  Ordered OrderOf(Slot s) const {
    return Ordered{policy_->Heat(s), states_[s].touch_seq, s, states_[s].generation};
  }
  void Reclassify(Slot s);
  bool Held(Slot s) const;  // by hysteresis or by a failed move's backoff

  // Quotas (docs/policies.md, "Quotas"), each only while accounts_.on(): the
  // engine's part of them (accounts.cpp).
  // Recomputes every account's counts and heaps from the live blocks.
  void RebuildAccounts();
  // A new account while quotas are on: its live blocks (a client's admitted
  // before its quota; an owner's have one already) join it alone, without
  // rebuilding the others: one pass over the slots' account ids, none for a
  // client with no live block.
  void JoinAccount(uint32_t index);
  // Counts live block `s` in `a`: its tiers, its place in the set or in a
  // middle tier's ranking, a move in flight.
  void CountInAccount(Slot s, Account& a);
  // Before `s` enters the set: each of its accounts at its tier-0 cap gives up
  // its coldest block; with the set full and a guarantee at stake, the coldest
  // block of the accounts above their guarantee leaves.
  void MakeRoomByQuota(Slot s);
  void EvictForQuota(Slot v);
  // Ranks `x` (unranked) in tier `k` or, where an account of `x` is at its
  // cap and `x` is colder than that account's coldest there, lower. The
  // blocks it pushes out (an account's coldest, a tier's coldest over its
  // capacity) go one tier lower in turn, and are settled; `x` is too unless
  // it is `s` (Rank settles `s` last).
  void PlaceRanked(Slot x, unsigned k, Slot s);
  unsigned CapTier(Slot x, unsigned k, Slot s);
  SlotHeap::Entry HeatEntry(Slot x) const {
    return SlotHeap::Entry{policy_->Heat(x), states_[x].touch_seq, x};
  }
  void Enrank(Slot x, unsigned k);  // into tier k's ranking (and its accounts')
  void EnforceCaps(uint32_t index);

  EngineOptions options_;
  std::unique_ptr<Policy> policy_;
  size_t capacity_;      // tier 0's budget in blocks
  size_t set_capacity_;  // the policy's set: capacity_ less the landing room
  size_t held_ = 0;      // set_held_blocks()
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
  // By slot, in one line for the touch path: its group (index + 1 into
  // groups_; 0: none) and its place in the group's members, its owner's dense
  // index (GroupTable::OwnerIndex), whether a soon hint placed it and it was
  // not touched since, its rank below tier 0 and where its move in flight goes.
  struct SlotHint {
    uint32_t group = 0;
    uint32_t pos = 0;
    uint32_t owner = 0;
    uint8_t placed_ahead = 0;
    uint8_t rank = 0;       // Engine::rank()
    uint8_t moving_to = 0;  // the destination of its move in flight
  };
  std::vector<SlotHint> slot_hints_;
  size_t in_set_ = 0;  // blocks in the policy's set
  uint64_t now_ = 0;   // the clock of the last touch or hint
  KeyIndex index_;     // key -> slot (states_[slot].key)
  GhostStore ghosts_;
  // Tick mode: promotion candidates not touched since they were queued (newest
  // at the front), demotion candidates (oldest at the back, served first), and
  // promotion candidates touched again while waiting (most recent at the front,
  // served before the others).
  SlotLists queues_{4};
  std::vector<Move> moves_;
  EngineCounters counters_;
  uint64_t seq_ = 0;
  uint64_t tick_ = 0;
  // The parts: the tiers' counts and rankings, the hints' groups, the quotas'
  // accounts.
  TierTable tiers_;
  GroupTable groups_;
  AccountTable accounts_;
  std::vector<EngineEvent>* log_ = nullptr;
};

}  // namespace cxltier::engine
