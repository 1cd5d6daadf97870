#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <utility>

namespace cxltier::engine {

namespace {

// Middle tier k's capacity in blocks at [k - 1].
std::vector<size_t> MiddleCapacities(const EngineOptions& options) {
  assert(options.lower_tier_budget_bytes.size() + 2 <= kMaxTiers);
  std::vector<size_t> capacity;
  for (uint64_t bytes : options.lower_tier_budget_bytes) {
    capacity.push_back(options.block_bytes ? bytes / options.block_bytes : 0);
  }
  return capacity;
}

}  // namespace

Engine::Engine(const EngineOptions& options, std::unique_ptr<Policy> policy)
    : options_(options),
      policy_(std::move(policy)),
      capacity_(options.block_bytes ? options.tier0_budget_bytes / options.block_bytes : 0),
      set_capacity_(capacity_ - (options.mode == Mode::kTick
                                     ? capacity_ * std::min(options.landing_percent, 50u) / 100
                                     : 0)),
      index_(&states_, options.key_hash_seed),
      ghosts_(options.persistence == Persistence::kPersist ? options.ghost_capacity : 0,
              options.ghost_capacity_per_owner, options.key_hash_seed),
      tiers_(MiddleCapacities(options)),
      accounts_(options.lower_tier_budget_bytes.size()) {
  assert(policy_ && options.block_bytes > 0);
  // Allocating (and so faulting in) the tables now keeps that cost out of the
  // first touches; without the hint they grow by doubling.
  states_.resize(options.expected_blocks);
  moved_tick_.resize(options.expected_blocks, 0);
  owners_.resize(options.expected_blocks, 0);
  retry_.resize(options.expected_blocks);
  slot_hints_.resize(options.expected_blocks);
  groups_.Resize(options.expected_blocks);
  accounts_.Resize(options.expected_blocks);
  index_.Reserve(options.expected_blocks);
  policy_->SetKeySeed(options.key_hash_seed);
  policy_->Bind(&states_, set_capacity_, options.persistence, options.mode);
  policy_->Reserve(options.expected_blocks);
  tiers_.set_epoch(policy_->HeatEpoch());
}

size_t Engine::tier_capacity_blocks(unsigned k) const {
  return k == 0 ? capacity_ : tiers_.LowerCapacity(k);
}

Slot Engine::Find(const BlockKey& key) const { return index_.Find(key); }

Slot Engine::Admit(const BlockKey& key, uint32_t owner, uint64_t client) {
  return AdmitAt(key, Tier::kNone, owner, client);
}

Slot Engine::Admit(const BlockKey& key, Tier placed, uint32_t owner, uint64_t client) {
  assert(options_.mode == Mode::kTick && TierIndex(placed) < tiers_.count());
  return AdmitAt(key, placed, owner, client);
}

bool Engine::RestoreGhost(const BlockState& ghost, uint32_t owner) {
  if (options_.persistence != Persistence::kPersist || Find(ghost.key) != kNoSlot) return false;
  BlockState g = ghost;
  g.tier = Tier::kNone;
  g.flags = 0;
  g.client_touches = g.client_mass_q16 = 0;
  seq_ = std::max(seq_, g.touch_seq);
  if (ghosts_.Put(g.key, g, owner)) ++counters_.ghosts_dropped;
  return true;
}

// `placed` kNone: the engine decides (tick mode: tier 0 while it has room,
// then the first tier below with room in its ranking).
Slot Engine::AdmitAt(const BlockKey& key, Tier placed, uint32_t owner, uint64_t client) {
  if (const Slot known = index_.Find(key); known != kNoSlot) return known;
  const Slot s = free_slots_.empty() ? next_slot_ : free_slots_.back();
  if (!free_slots_.empty()) {
    free_slots_.pop_back();
  } else {
    ++next_slot_;
    if (s == states_.size()) {
      states_.emplace_back();
      moved_tick_.push_back(0);
      owners_.push_back(0);
      retry_.emplace_back();
      slot_hints_.emplace_back();
      groups_.AddSlot();
      accounts_.AddSlot();
    }
  }
  BlockState& st = states_[s];
  const uint32_t generation = st.generation + 1;
  st = BlockState{};
  st.key = key;
  st.generation = generation;
  // The index reads a slot's key from states_: it names the slot only once
  // the slot holds the key (and Release erases it before the slot is reused).
  index_.Insert(key, s);
  if (options_.persistence == Persistence::kPersist) {
    if (auto ghost = ghosts_.Take(key)) {
      st.score = ghost->score;
      st.touch_time = ghost->touch_time;
      st.touch_count = ghost->touch_count;
      st.touch_seq = ghost->touch_seq;
      st.policy_word = ghost->policy_word;
      st.flags |= kFlagRestored;
      ++counters_.ghost_restores;
    }
  }
  st.flags |= kFlagResident;
  moved_tick_[s] = 0;
  slot_hints_[s].placed_ahead = 0;
  slot_hints_[s].rank = 0;
  owners_[s] = owner;
  slot_hints_[s].owner = groups_.OwnerIndex(owner);
  retry_[s] = Retry{};
  accounts_.set_client(s, client);
  if (accounts_.on()) accounts_.Attach(s, owner);
  ++counters_.admits;
  if (options_.mode == Mode::kTick) {
    const bool chosen = placed == Tier::kNone;
    if (chosen) {
      // Room counts the promotions in flight, which land in tier 0 too, and
      // the pages no block holds there: what tier 0 holds never passes its
      // budget through an admission.
      bool room = tiers_.blocks(0) + tiers_.in(0) + held_ < capacity_;
      if (accounts_.on()) {
        accounts_.ForEach(s, [&room](const Account& a) { room &= a.Charged0() < a.quota.cap[0]; });
      }
      placed = room ? Tier::kFast : TierAt(tiers_.FirstLowerWithRoom());
    }
    const bool fast = placed == Tier::kFast;
    SetTier(s, placed);
    // Landed by the engine in a landing room: its first reads may come after
    // the next plan, which does not demote it (Held).
    if (fast && chosen && set_capacity_ < capacity_) retry_[s].not_before = tick_ + 2;
    if (fast) ++counters_.placed_fast;
    Log(fast ? EngineEvent::kPlaceFast : EngineEvent::kPlaceSlow, s);
    if (fast) {
      Reclassify(s);
    } else {
      Rank(s, TierIndex(placed));
    }
  }
  return s;
}

void Engine::SetTier(Slot s, Tier t) {
  BlockState& st = states_[s];
  tiers_.Moved(st.tier, t);
  groups_.MovedTier(slot_hints_[s].owner, st.tier, t);
  if (accounts_.on()) {
    accounts_.ForEach(s, [&](Account& a) {
      if (st.tier != Tier::kNone) --a.tier_blocks[TierIndex(st.tier)];
      if (t != Tier::kNone) ++a.tier_blocks[TierIndex(t)];
    });
  }
  st.tier = t;
}

void Engine::RekeyIfNeeded() {
  if (!tiers_.NewEpoch(policy_->HeatEpoch())) return;
  std::vector<Slot> members;
  auto rekey = [&](auto& h) {
    members.clear();
    for (const SlotHeap::Entry& e : h.entries()) members.push_back(e.slot);
    for (Slot m : members) h.Set(m, policy_->Heat(m), states_[m].touch_seq);
  };
  for (SlotHeap& h : tiers_.rankings()) rekey(h);
  for (Account& a : accounts_.all()) {
    rekey(a.set_heat);
    for (SparseSlotHeap& h : a.ranked_heat) rekey(h);
  }
}

void Engine::Rank(Slot s, unsigned tier) {
  Unrank(s);
  const unsigned last = tiers_.last();
  tier = std::min(tier, last);
  if (tier < last) RekeyIfNeeded();
  PlaceRanked(s, tier, s);
  Settle(s);
}

void Engine::PlaceRanked(Slot x, unsigned k, Slot s) {
  const unsigned last = tiers_.last();
  for (;;) {
    if (accounts_.on()) k = CapTier(x, k, s);
    slot_hints_[x].rank = static_cast<uint8_t>(k);
    if (k < last) Enrank(x, k);
    if (x != s) Settle(x);
    // A middle tier over its capacity sends its coldest one tier down (`s`
    // itself when it is the coldest).
    if (k >= last || !tiers_.OverCapacity(k)) return;
    x = tiers_.ranking(k).Top().slot;
    Unrank(x);
    ++k;
  }
}

void Engine::Enrank(Slot x, unsigned k) {
  tiers_.ranking(k).Set(x, policy_->Heat(x), states_[x].touch_seq);
  if (accounts_.on()) {
    accounts_.ForEach(x, [&](Account& a) {
      ++a.target[k];
      a.ranked_heat[k - 1].Set(x, policy_->Heat(x), states_[x].touch_seq);
    });
  }
}

void Engine::Unrank(Slot s) {
  const unsigned r = slot_hints_[s].rank;
  if (r != 0 && tiers_.IsMiddle(r) && tiers_.ranking(r).Contains(s)) {
    tiers_.ranking(r).Erase(s);
    if (accounts_.on()) {
      accounts_.ForEach(s, [&](Account& a) {
        --a.target[r];
        a.ranked_heat[r - 1].Erase(s);
      });
    }
  }
  slot_hints_[s].rank = 0;
}

void Engine::Settle(Slot s) {
  if (options_.mode == Mode::kTick) {
    Reclassify(s);
    return;
  }
  BlockState& st = states_[s];
  const Tier to = TierAt(slot_hints_[s].rank);
  if (st.tier == to || st.tier == Tier::kNone) return;
  const bool up = TierIndex(to) < TierIndex(st.tier);
  SetTier(s, to);
  CountMove(s, up);
}

void Engine::CountMove(Slot s, bool up) {
  if (up) {
    ++counters_.promotions;
    counters_.promoted_bytes += options_.block_bytes;
  } else {
    ++counters_.demotions;
    counters_.demoted_bytes += options_.block_bytes;
  }
  Log(up ? EngineEvent::kPromote : EngineEvent::kDemote, s);
}

void Engine::EnterSet(Slot s) {
  Unrank(s);
  states_[s].flags |= kFlagInTarget;
  ++in_set_;
  groups_.EnterSet(slot_hints_[s].owner);
  if (const uint32_t g = slot_hints_[s].group; g != 0) ++groups_[g - 1].in_set;
  if (accounts_.on()) {
    accounts_.ForEach(s, [&](Account& a) {
      ++a.target[0];
      a.set_heat.Set(s, policy_->Heat(s), states_[s].touch_seq);
    });
  }
}

void Engine::ClearSet(Slot s) {
  BlockState& st = states_[s];
  if (!(st.flags & kFlagInTarget)) return;
  st.flags &= static_cast<uint8_t>(~kFlagInTarget);
  --in_set_;
  groups_.LeaveSet(slot_hints_[s].owner);
  if (const uint32_t g = slot_hints_[s].group; g != 0) --groups_[g - 1].in_set;
  groups_.PoolRemove(s);
  if (accounts_.on()) {
    accounts_.ForEach(s, [s](Account& a) {
      --a.target[0];
      a.set_heat.Erase(s);
    });
  }
}

void Engine::ForgetIfReset(BlockState& v) const {
  if (options_.persistence != Persistence::kReset) return;
  v.score = 0;
  v.touch_count = 0;
  v.touch_time = 0;
  v.policy_word = 0;
  v.flags &= static_cast<uint8_t>(~kFlagRestored);
}

void Engine::DemoteNow(Slot v) {
  assert(states_[v].tier == Tier::kFast);
  Rank(v, 1);
}

void Engine::EnterFastNow(Slot s) {
  if (states_[s].tier != Tier::kNone && states_[s].tier != Tier::kFast) {
    CountMove(s, /*up=*/true);
  } else {
    ++counters_.placed_fast;
    Log(EngineEvent::kPlaceFast, s);
  }
  SetTier(s, Tier::kFast);
}

void Engine::JoinSet(Slot s, const engine::Touch& t) {
  if (accounts_.on()) MakeRoomByQuota(s);
  const Slot victim = policy_->OnMiss(s, t);
  assert(victim != s);
  EnterSet(s);
  if (victim != kNoSlot) LeaveSet(victim);
  if (options_.mode == Mode::kDemand) {
    if (victim != kNoSlot) DemoteNow(victim);
    EnterFastNow(s);
  } else {
    if (victim != kNoSlot) LeftSetTick(victim);
    Reclassify(s);
  }
}

void Engine::LeftSetTick(Slot v) {
  const Tier t = states_[v].tier;
  if (t == Tier::kFast) {
    Reclassify(v);  // ranked when Plan() demotes it
  } else {
    Rank(v, TierIndex(t));
  }
}

void Engine::LeaveSet(Slot victim) {
  BlockState& v = states_[victim];
  ClearSet(victim);
  ++counters_.evictions;
  Log(EngineEvent::kEvict, victim);
  ForgetIfReset(v);
}

bool Engine::Touch(Slot s, const engine::Touch& in) {
  assert(IsLive(s));
  BlockState& st = states_[s];
  engine::Touch t = in;
  if (!std::isfinite(t.obs) || t.obs < 0) {
    t.obs = 0;
    ++counters_.bad_observations;
  }
  const bool hit = st.tier == Tier::kFast;
  ++counters_.touches;
  if (hit) ++counters_.hits;
  if (st.tier != Tier::kNone) ++counters_.tier_hits[TierIndex(st.tier)];
  now_ = t.now;
  if (slot_hints_[s].placed_ahead) {
    slot_hints_[s].placed_ahead = 0;
    if (hit) ++counters_.hint_prefetch_hits;
  }
  if (const uint32_t g = slot_hints_[s].group; g != 0 && groups_[g - 1].hinted_out) {
    groups_[g - 1].Activate();
  }

  const double prev_score = st.score;
  const uint64_t prev_time = st.touch_time;
  const bool fresh = st.touch_count == 0;
  if (st.touch_count != std::numeric_limits<uint32_t>::max()) ++st.touch_count;
  st.touch_time = t.now;
  st.touch_seq = ++seq_;
  st.policy_word = policy_->Word(st, prev_time, fresh, t);
  st.score = policy_->Score(st, prev_score, prev_time, fresh, t);

  if (capacity_ == 0) {
    // No tier 0 at all: every block lives below it, ranked as it first comes.
    if (st.tier == Tier::kNone) {
      const unsigned k = tiers_.FirstLowerWithRoom();
      SetTier(s, TierAt(k));
      Rank(s, k);
    }
    return hit;
  }
  if (st.flags & kFlagInTarget) {
    policy_->OnHit(s, t);
    if (accounts_.on()) {
      RekeyIfNeeded();
      accounts_.ForEach(s, [&](Account& a) { a.set_heat.Set(s, policy_->Heat(s), st.touch_seq); });
    }
    // Tick mode: a block touched again while it waits for promotion has shown
    // reuse; Plan() serves those first, most recent first, so the budget goes to
    // wanted blocks in use, not to those that entered the set longest ago.
    const uint8_t queued = queues_.ListOf(s);
    if (queued == kPromoteQueue || queued == kRetouchedQueue) {
      queues_.MoveToFront(kRetouchedQueue, s);
    }
    return hit;
  }
  if (accounts_.on() && !accounts_.MayEnterSet(s)) {
    // Its account has no tier 0: it stays below, ranked as it first comes.
    if (st.tier == Tier::kNone) {
      const unsigned k = tiers_.FirstLowerWithRoom();
      SetTier(s, TierAt(k));
      Rank(s, k);
    }
    return hit;
  }
  // The blocks of done and idle groups leave the set before the policy's own
  // choice (but not another account's under its guarantee); `s`, on its way
  // in, no longer counts in its tier's ranking.
  Unrank(s);
  if (in_set_ >= set_capacity_) {
    const Slot v = PoolBack();
    if (v != kNoSlot && !(accounts_.on() && accounts_.Guaranteed(v, s))) {
      Displace(v, &counters_.hint_displaced);
    }
  }
  JoinSet(s, t);
  return hit;
}

void Engine::Release(Slot s) {
  assert(IsLive(s));
  BlockState& st = states_[s];
  policy_->Erase(s);
  ClearSet(s);
  LeaveGroup(s);
  queues_.Remove(s);
  Unrank(s);
  Log(EngineEvent::kRelease, s);
  // A move in flight will be ignored by Complete(); stop counting it now.
  if (st.flags & kFlagMigrating) {
    tiers_.EndMove(TierIndex(st.tier), slot_hints_[s].moving_to);
    if (accounts_.on()) {
      accounts_.ForEach(s, [&](Account& a) {
        a.in0 -= slot_hints_[s].moving_to == 0;
        a.out0 -= st.tier == Tier::kFast;
      });
    }
  }
  SetTier(s, Tier::kNone);
  if (accounts_.on()) accounts_.Detach(s);
  if (options_.persistence == Persistence::kPersist) {
    BlockState ghost = st;
    ghost.flags = 0;
    if (ghosts_.Put(st.key, ghost, owners_[s])) ++counters_.ghosts_dropped;
  }
  index_.Erase(st.key);
  st.flags = 0;
  ++st.generation;
  free_slots_.push_back(s);
  ++counters_.releases;
  if (!groups_.pending().empty()) {  // the room it leaves
    size_t units = ReleaseUnits();
    const size_t budget = units;
    ServePending(now_, &units);
    counters_.hint_work += budget - units;
  }
}

bool Engine::Held(Slot s) const {
  if (tick_ < retry_[s].not_before) return true;
  return options_.hysteresis_ticks > 0 && moved_tick_[s] != 0 &&
         Elapsed(tick_, moved_tick_[s]) < options_.hysteresis_ticks;
}

void Engine::Reclassify(Slot s) {
  const BlockState& st = states_[s];
  int want = -1;
  if ((st.flags & kFlagResident) && !(st.flags & kFlagMigrating)) {
    const bool in_set = st.flags & kFlagInTarget;
    if (in_set && st.tier != Tier::kFast) want = kPromoteQueue;
    if (!in_set && st.tier == Tier::kFast) want = kDemoteQueue;
    if (!in_set && st.tier != Tier::kFast && slot_hints_[s].rank != 0 &&
        slot_hints_[s].rank != TierIndex(st.tier)) {
      want = kLowerQueue;
    }
  }
  uint8_t have = queues_.ListOf(s);
  if (have == kRetouchedQueue) have = kPromoteQueue;  // one candidate queue, in two parts
  if (want < 0) {
    queues_.Remove(s);
  } else if (have != want) {
    queues_.Remove(s);
    queues_.PushFront(want, s);
  }
}

std::span<const Move> Engine::Plan() {
  RunHints();
  ++tick_;
  ++counters_.ticks;
  moves_.clear();
  const uint64_t bb = options_.block_bytes;
  uint64_t budget = options_.migrate_bytes_per_tick ? options_.migrate_bytes_per_tick
                                                    : std::numeric_limits<uint64_t>::max();
  // Tier-0 blocks once every promotion planned so far (this tick or earlier) is done.
  size_t projected = tiers_.blocks(0) + tiers_.in(0);

  auto plan_move = [&](Slot s, Tier to) {
    BlockState& st = states_[s];
    moves_.push_back(Move{s, st.generation, st.tier, to});
    st.flags |= kFlagMigrating;
    queues_.Remove(s);
    slot_hints_[s].moving_to = static_cast<uint8_t>(TierIndex(to));
    tiers_.StartMove(TierIndex(st.tier), TierIndex(to));
    if (accounts_.on()) {
      accounts_.ForEach(s, [&](Account& a) {
        a.in0 += to == Tier::kFast;
        a.out0 += st.tier == Tier::kFast;
      });
    }
  };
  // A block leaving tier 0 goes to its rank (ranked now if it was not: a
  // block admitted into tier 0 and never in the set).
  auto demote = [&](Slot d) {
    if (slot_hints_[d].rank == 0) Rank(d, 1);
    plan_move(d, TierAt(slot_hints_[d].rank));
  };

  // Accounts at or over their tier-0 cap (blocks admitted where their pages
  // were, a cap lowered, or blocks that left the set for the account's own):
  // their tier-0 blocks outside the set leave first, making room for its set.
  if (accounts_.on()) {
    for (uint32_t i = 0; i < accounts_.size(); ++i) {
      const Account& a = accounts_[i];
      if (!a.used || a.quota.cap[0] == kNoCap || a.Projected0() < a.quota.cap[0]) continue;
      for (Slot d = queues_.Back(kDemoteQueue); d != kNoSlot && budget >= bb;) {
        const Slot prev = queues_.Prev(d);
        if (!Held(d) && accounts_.In(d, i)) {
          budget -= bb;
          demote(d);
        }
        d = prev;
      }
    }
  }
  // An account with its cap's worth in tier 0 (counting moves in flight)
  // promotes nothing more until its blocks outside the set have left.
  auto over_cap = [this](Slot p) {
    bool full = false;
    if (accounts_.on()) {
      accounts_.ForEach(p, [&full](const Account& a) { full |= a.Charged0() >= a.quota.cap[0]; });
    }
    return full;
  };

  Slot demote_cursor = queues_.Back(kDemoteQueue);
  auto next_demotable = [&] {
    while (demote_cursor != kNoSlot && Held(demote_cursor)) {
      demote_cursor = queues_.Prev(demote_cursor);
    }
    return demote_cursor;
  };
  // Tier 0 over its budget (blocks admitted where their pages already were):
  // demote outside-the-set blocks first, those queued longest first. Then,
  // into its landing room (blocks landed and not in the set, blocks that left
  // it), with at most half of what is left while promotions wait: the rest is
  // theirs. A block that landed since the last plan is held for this one (Held).
  size_t after = projected - std::min(projected, tiers_.out(0));
  // Demotes outside-the-set blocks while tier 0 (once they left) is over
  // `down_to`, spending at most `allowance` of the budget.
  auto demote_outside_set = [&](size_t down_to, uint64_t allowance) {
    for (; after > down_to && next_demotable() != kNoSlot && allowance >= bb; --after) {
      const Slot d = demote_cursor;
      demote_cursor = queues_.Prev(d);
      allowance -= bb;
      budget -= bb;
      demote(d);
    }
  };
  demote_outside_set(capacity_, budget);
  const bool promotions_wait =
      queues_.Front(kRetouchedQueue) != kNoSlot || queues_.Front(kPromoteQueue) != kNoSlot;
  demote_outside_set(set_capacity_, promotions_wait ? budget / 2 : budget);
  // Promotions: the blocks touched again while queued, then the others, each
  // from its queue's head (most recently touched or queued first), while
  // tier 0 has room for them beside the pages no block holds (held_).
  Slot p = queues_.Front(kRetouchedQueue);
  if (p == kNoSlot) p = queues_.Front(kPromoteQueue);
  while (p != kNoSlot) {
    Slot next = queues_.Next(p);
    if (next == kNoSlot && queues_.ListOf(p) == kRetouchedQueue) {
      next = queues_.Front(kPromoteQueue);
    }
    if (Held(p) || over_cap(p)) {
      p = next;
      continue;
    }
    if (projected + held_ < set_capacity_) {
      if (budget < bb) break;
      budget -= bb;
      plan_move(p, Tier::kFast);
      ++projected;
    } else {
      if (next_demotable() == kNoSlot || budget / 2 < bb) break;
      budget -= 2 * bb;
      const Slot d = demote_cursor;
      demote_cursor = queues_.Prev(d);
      demote(d);
      plan_move(p, Tier::kFast);
    }
    p = next;
  }
  // Below tier 0: blocks whose rank changed, longest waiting first, each into
  // its tier when that has room (once the moves planned into it are done).
  for (Slot s = queues_.Back(kLowerQueue); s != kNoSlot && budget >= bb;) {
    const Slot prev = queues_.Prev(s);
    const unsigned to = slot_hints_[s].rank;
    if (!Held(s) && tiers_.blocks(to) + tiers_.in(to) < tier_capacity_blocks(to)) {
      budget -= bb;
      plan_move(s, TierAt(to));
    }
    s = prev;
  }
  return moves_;
}

void Engine::Complete(const Move& m, bool done) {
  if (m.slot >= states_.size()) return;
  BlockState& st = states_[m.slot];
  if (st.generation != m.generation || !(st.flags & kFlagResident)) return;
  if (!(st.flags & kFlagMigrating)) return;
  st.flags &= static_cast<uint8_t>(~kFlagMigrating);
  tiers_.EndMove(TierIndex(m.from), TierIndex(m.to));
  if (accounts_.on()) {
    accounts_.ForEach(m.slot, [&m](Account& a) {
      a.in0 -= m.to == Tier::kFast;
      a.out0 -= m.from == Tier::kFast;
    });
  }
  if (!done) {
    ++counters_.failed_moves;
    // Back off: 1, 2, 4, ... x retry_min_ticks, at most retry_max_ticks.
    Retry& r = retry_[m.slot];
    const uint32_t shift = std::min<uint32_t>(r.failures, 31);
    const uint64_t wait =
        std::min<uint64_t>(uint64_t{options_.retry_min_ticks} << shift,
                           std::max(options_.retry_max_ticks, options_.retry_min_ticks));
    r.not_before = tick_ + wait;
    if (r.failures < std::numeric_limits<uint32_t>::max()) ++r.failures;
  } else if (st.tier == m.from) {
    retry_[m.slot] = Retry{};
    SetTier(m.slot, m.to);
    moved_tick_[m.slot] = tick_;
    CountMove(m.slot, TierIndex(m.to) < TierIndex(m.from));
  }
  Reclassify(m.slot);
}

void Engine::Reserve(size_t n) {
  ReserveFor(states_, n);
  ReserveFor(moved_tick_, n);
  ReserveFor(owners_, n);
  ReserveFor(retry_, n);
  ReserveFor(slot_hints_, n);
  groups_.Reserve(n);
  accounts_.Reserve(n);
  index_.Reserve(n);
  policy_->Reserve(n);
}

void Engine::SetPolicy(std::unique_ptr<Policy> policy) {
  assert(policy && options_.mode == Mode::kTick);
  policy_ = std::move(policy);
  policy_->SetKeySeed(options_.key_hash_seed);
  policy_->Bind(&states_, set_capacity_, options_.persistence, options_.mode);
  policy_->Reserve(states_.size());
  tiers_.set_epoch(policy_->HeatEpoch());
  std::vector<Slot> live;
  for (Slot s = 0; s < next_slot_; ++s) {
    if (!IsLive(s)) continue;
    ClearSet(s);
    Unrank(s);
    if (states_[s].touch_count > 0) live.push_back(s);
  }
  for (Group& g : groups_.all()) {
    if (g.hinted_out) g.Activate();
  }
  std::sort(live.begin(), live.end(),
            [this](Slot a, Slot b) { return states_[a].touch_seq < states_[b].touch_seq; });
  if (capacity_ > 0) {
    for (Slot s : live) {
      BlockState& st = states_[s];
      const Slot victim = policy_->OnMiss(s, engine::Touch{0, st.touch_time, kNever});
      EnterSet(s);
      if (victim != kNoSlot) ClearSet(victim);
    }
  }
  // Below tier 0, the blocks are ranked again by the new policy's heat, in the
  // tiers they sit in (in the order they were last touched).
  std::vector<Slot> below;
  for (Slot s = 0; s < next_slot_; ++s) {
    if (IsLive(s) && !(states_[s].flags & kFlagInTarget) && states_[s].tier != Tier::kFast) {
      below.push_back(s);
    }
  }
  std::sort(below.begin(), below.end(),
            [this](Slot a, Slot b) { return states_[a].touch_seq < states_[b].touch_seq; });
  for (Slot s : below) Rank(s, TierIndex(states_[s].tier));
  for (Slot s = 0; s < next_slot_; ++s) {
    if (IsLive(s)) Reclassify(s);
  }
  if (accounts_.on()) {
    RebuildAccounts();  // heaps by the new policy's heat
    for (uint32_t i = 0; i < accounts_.size(); ++i) {
      if (accounts_[i].used) EnforceCaps(i);
    }
  }
}

void Engine::Relocated(Slot s, Tier tier) {
  if (!IsLive(s) || (states_[s].flags & kFlagMigrating) || states_[s].tier == tier) return;
  if (TierIndex(tier) >= tiers_.count()) return;
  SetTier(s, tier);
  // A landed block's hold and a failed move's backoff were about the tier
  // it no longer sits in.
  retry_[s] = Retry{};
  if (!(states_[s].flags & kFlagInTarget) && tier != Tier::kFast) {
    Rank(s, TierIndex(tier));
  } else {
    if (!(states_[s].flags & kFlagInTarget)) Unrank(s);
    Reclassify(s);
  }
}

size_t Engine::PlanAndApply() {
  Plan();
  for (const Move& m : moves_) Complete(m, true);
  return moves_.size();
}

}  // namespace cxltier::engine
