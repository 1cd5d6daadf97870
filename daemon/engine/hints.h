// Scheduler hints' tables (docs/policies.md, "Scheduler hints"): the groups
// that hints name, their resumable jobs, the soons waiting for room, the pool
// of blocks idle and done hints marked to leave the set first, and the set's
// blocks by owner (a soon never displaces another owner's block). This part
// keeps them consistent; what a hint does to the set needs the policy, and is
// the engine's (Engine's hint code, in hints.cpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

#include "engine/slot_list.h"
#include "engine/types.h"

namespace cxltier::engine {

// Scheduler hints about a group of blocks (one sequence or request), named by
// the engine that serves it. Advice only.
enum class HintKind : uint8_t {
  kIdle = 1,  // the group waits (for its user): its blocks leave tier 0 first
  kSoon = 2,  // the group runs again soon: bring its hottest blocks back ahead of use
  kDone = 3,  // the request finished: its blocks leave tier 0 before idle ones
};
using GroupId = uint64_t;
inline constexpr GroupId kNoGroup = 0;

// A block as a hint orders it: by the policy's heat when it was looked at,
// then by its last touch, then by slot (a strict order: no two are equal).
struct Ordered {
  double heat;
  uint64_t seq;
  Slot slot;
  uint32_t generation;  // the slot's when it was looked at (a reused slot is another block)

  static bool Colder(const Ordered& a, const Ordered& b) {
    if (a.heat != b.heat) return a.heat < b.heat;
    if (a.seq != b.seq) return a.seq < b.seq;
    return a.slot < b.slot;
  }
  // For std::push_heap and friends: the coldest on top.
  static bool Hotter(const Ordered& a, const Ordered& b) { return Colder(b, a); }
};

// The group-wide part of a hint, resumable (Hint's cost): a walk over the
// members that collects the blocks it wants into a heap, coldest on top,
// then a drain of the heap coldest first.
struct HintJob {
  enum Phase : uint8_t { kNone, kWalk, kDrain };
  Phase phase = kNone;
  HintKind kind = HintKind::kIdle;
  uint32_t cursor = 0;  // kWalk: members[0, cursor) were looked at
  uint32_t keep = 0;    // soon: the hottest this many are kept
  std::vector<Ordered> heap;
};

// A group of blocks that hints name.
struct Group {
  GroupId id = kNoGroup;
  uint32_t owner = 0;
  HintKind last = HintKind::kSoon;  // the last hint; kSoon also while active
  bool hinted_out = false;          // idle or done, and not touched since
  bool pending = false;             // in the pending list: a soon with blocks still to place
  uint32_t working_set = 0;         // its blocks in the set when it last went idle or done
  uint64_t idle_at = 0;             // the clock of its last idle or done hint
  uint32_t prefetch_left = 0;       // soon: blocks it may still place
  uint32_t in_set = 0;              // its members in the policy's set, kept as they change
  // Changes with every hint and reuse of the entry: a pool entry or a pending
  // entry of an older one is stale.
  uint32_t serial = 0;
  uint64_t queued = 0;  // the ticket of its entry in the job queue (0: none)
  std::vector<Slot> members;
  struct Candidate {
    Slot slot;
    uint32_t generation;  // the slot's when the soon came (a reused slot is another block)
  };
  std::vector<Candidate> candidates;  // soon: blocks still to place, hottest at the back
  HintJob job;

  // Its next touch after an idle or done hint: its blocks in the pool are
  // stale there now, and an idle or done hint's work still to do is dropped.
  void Activate() {
    hinted_out = false;
    job = HintJob{};
  }
};

// A group with a soon still placing (stale once the group's serial changed).
struct PendingRef {
  uint32_t index;
  uint32_t serial;  // the group's when it became pending
};

// Where a round over the pending soons stopped when it ran out of units: it
// goes on at pending[from] at the next call.
struct ServeCursor {
  bool left = false;
  size_t from = 0;
  bool progress = false;  // that round had placed a block
};

class GroupTable {
 public:
  enum Pool { kDonePool = 0, kIdlePool = 1 };  // pool lists, taken from in this order
  static constexpr uint32_t kStale = UINT32_MAX;

  // The per-slot table (sized with the engine's).
  void Resize(size_t n) { pool_serial_.resize(n, 0); }
  void Reserve(size_t n) { ReserveFor(pool_serial_, n); }
  void AddSlot() { pool_serial_.push_back(0); }

  Group* Find(GroupId id) {
    const auto it = index_.find(id);
    return it == index_.end() ? nullptr : &groups_[it->second];
  }
  uint32_t IndexOf(const Group& g) const { return static_cast<uint32_t>(&g - groups_.data()); }
  Group& operator[](uint32_t index) { return groups_[index]; }
  const Group& operator[](uint32_t index) const { return groups_[index]; }
  std::vector<Group>& all() { return groups_; }
  // A new group `id` of `owner`, with no member; returns its index.
  uint32_t Create(GroupId id, uint32_t owner);
  // Frees the entry of a group with no member left: its entries in the
  // pending list and the job queue go stale with its serial and ticket.
  void Free(uint32_t index);

  // The job queue: groups whose hint's work goes on at the ticks, in turn.
  // Queue puts group `index` at the back, unless it has an entry there.
  void Queue(uint32_t index);
  bool HasJobs() const { return !jobs_.empty(); }
  // Takes the front entry: its group's index, or kStale for a stale entry.
  // REQUIRES: HasJobs().
  uint32_t PopJob();

  // Soons with blocks still to place, in the order they became so.
  std::vector<PendingRef>& pending() { return pending_; }
  ServeCursor& serve() { return serve_; }
  bool WorkPending() const { return !jobs_.empty() || serve_.left; }

  // The pool: set blocks of done and idle groups, coldest at the back. An
  // entry whose group was touched or hinted again since is stale: dropped
  // when it reaches the back, not looked for when the group changes.
  void PoolPut(Pool pool, Slot s, uint32_t serial) {
    pool_.Remove(s);
    pool_.PushFront(pool, s);
    pool_serial_[s] = serial;
  }
  void PoolRemove(Slot s) { pool_.Remove(s); }
  // Block `s`, of group `group1` (index + 1; 0: none), is validly in the pool.
  bool PoolValid(Slot s, uint32_t group1) const {
    return group1 != 0 && groups_[group1 - 1].hinted_out &&
           groups_[group1 - 1].serial == pool_serial_[s];
  }
  // The next block of a done, then an idle group to leave (kNoSlot: none),
  // dropping the stale entries on its way. group1_of(s): s's group1.
  template <typename GroupOf>
  Slot PoolBack(GroupOf group1_of) {
    for (const int pool : {kDonePool, kIdlePool}) {
      for (Slot s = pool_.Back(pool); s != kNoSlot; s = pool_.Back(pool)) {
        if (PoolValid(s, group1_of(s))) return s;
        pool_.Remove(s);  // its group ran or was hinted again since
      }
    }
    return kNoSlot;
  }

  // The set's blocks by owner, each owner by a dense index.
  uint32_t OwnerIndex(uint32_t owner);
  void EnterSet(uint32_t owner_index) { ++in_set_by_owner_[owner_index]; }
  void LeaveSet(uint32_t owner_index) { --in_set_by_owner_[owner_index]; }
  size_t InSetOf(uint32_t owner) const { return in_set_by_owner_[owners_.at(owner)]; }
  // Live blocks by owner and tier (a block with no tier yet counts in none),
  // kept as blocks move: status needs no pass over every block.
  void MovedTier(uint32_t owner_index, Tier from, Tier to) {
    std::array<size_t, kMaxTiers>& n = tier_blocks_by_owner_[owner_index];
    if (from != Tier::kNone) --n[TierIndex(from)];
    if (to != Tier::kNone) ++n[TierIndex(to)];
  }
  std::array<size_t, kMaxTiers> TierBlocksOf(uint32_t owner) const {
    const auto it = owners_.find(owner);
    return it == owners_.end() ? std::array<size_t, kMaxTiers>{}
                               : tier_blocks_by_owner_[it->second];
  }

 private:
  struct JobRef {
    uint32_t index;
    uint64_t ticket;  // Group::queued when queued
  };

  std::vector<Group> groups_;
  std::vector<uint32_t> free_;
  std::unordered_map<GroupId, uint32_t> index_;
  std::vector<PendingRef> pending_;
  std::deque<JobRef> jobs_;
  uint64_t next_ticket_ = 0;
  ServeCursor serve_;
  SlotLists pool_{2};
  std::vector<uint32_t> pool_serial_;  // by slot: its group's serial when it entered the pool
  std::unordered_map<uint32_t, uint32_t> owners_;
  std::vector<size_t> in_set_by_owner_;
  std::vector<std::array<size_t, kMaxTiers>> tier_blocks_by_owner_;
};

}  // namespace cxltier::engine
