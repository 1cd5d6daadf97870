#include "engine/engine.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <utility>

namespace cxltier::engine {

Engine::Engine(const EngineOptions& options, std::unique_ptr<Policy> policy)
    : options_(options),
      policy_(std::move(policy)),
      capacity_(options.block_bytes ? options.tier0_budget_bytes / options.block_bytes : 0),
      ghosts_(options.persistence == Persistence::kPersist ? options.ghost_capacity : 0,
              options.ghost_capacity_per_owner) {
  assert(policy_ && options.block_bytes > 0);
  assert(options.lower_tier_budget_bytes.size() + 2 <= kMaxTiers);
  tiers_ = static_cast<unsigned>(options.lower_tier_budget_bytes.size()) + 2;
  for (uint64_t bytes : options.lower_tier_budget_bytes) {
    lower_capacity_.push_back(bytes / options.block_bytes);
  }
  lower_.resize(lower_capacity_.size());
  // Allocating (and so faulting in) the tables now keeps that cost out of the
  // first touches; without the hint they grow by doubling.
  states_.resize(options.expected_blocks);
  moved_tick_.resize(options.expected_blocks, 0);
  owners_.resize(options.expected_blocks, 0);
  retry_.resize(options.expected_blocks);
  slot_hints_.resize(options.expected_blocks);
  pool_serial_.resize(options.expected_blocks, 0);
  slot_accounts_.resize(options.expected_blocks, {kNoIndex, kNoIndex});
  clients_.resize(options.expected_blocks, kNoAccount);
  index_.Reserve(options.expected_blocks);
  policy_->Bind(&states_, capacity_, options.persistence, options.mode);
  policy_->Reserve(options.expected_blocks);
  heat_epoch_ = policy_->HeatEpoch();
}

size_t Engine::tier_capacity_blocks(unsigned k) const {
  if (k == 0) return capacity_;
  return k < tiers_ - 1 ? lower_capacity_[k - 1] : std::numeric_limits<size_t>::max();
}

Slot Engine::Find(const BlockKey& key) const { return index_.Find(key); }

Slot Engine::Admit(const BlockKey& key, uint32_t owner, uint64_t client) {
  return AdmitAt(key, Tier::kNone, owner, client);
}

Slot Engine::Admit(const BlockKey& key, Tier placed, uint32_t owner, uint64_t client) {
  assert(options_.mode == Mode::kTick && TierIndex(placed) < tiers_);
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
      pool_serial_.push_back(0);
      slot_accounts_.push_back({kNoIndex, kNoIndex});
      clients_.push_back(kNoAccount);
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
      st.flags |= kFlagRestored;
      ++counters_.ghost_restores;
    }
  }
  st.flags |= kFlagResident;
  moved_tick_[s] = 0;
  slot_hints_[s].placed_ahead = 0;
  slot_hints_[s].rank = 0;
  owners_[s] = owner;
  const auto [known_owner, new_owner] =
      owner_index_.try_emplace(owner, static_cast<uint32_t>(in_set_by_owner_.size()));
  if (new_owner) in_set_by_owner_.push_back(0);
  slot_hints_[s].owner = known_owner->second;
  retry_[s] = Retry{};
  clients_[s] = client;
  if (quotas_on_) AttachAccounts(s);
  ++counters_.admits;
  if (options_.mode == Mode::kTick) {
    if (placed == Tier::kNone) {
      bool room = tier_blocks_[0] < capacity_;
      if (quotas_on_) {
        ForAccounts(s, [&room](const Account& a) { room &= a.Projected0() < a.quota.cap[0]; });
      }
      placed = room ? Tier::kFast : TierAt(FirstLowerWithRoom());
    }
    const bool fast = placed == Tier::kFast;
    SetTier(s, placed);
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
  if (st.tier != Tier::kNone) --tier_blocks_[TierIndex(st.tier)];
  if (quotas_on_) {
    ForAccounts(s, [&](Account& a) {
      if (st.tier != Tier::kNone) --a.tier_blocks[TierIndex(st.tier)];
      if (t != Tier::kNone) ++a.tier_blocks[TierIndex(t)];
    });
  }
  st.tier = t;
  if (t != Tier::kNone) ++tier_blocks_[TierIndex(t)];
}

unsigned Engine::FirstLowerWithRoom() const {
  for (unsigned k = 1; k + 1 < tiers_; ++k) {
    if (lower_[k - 1].Size() < lower_capacity_[k - 1]) return k;
  }
  return tiers_ - 1;
}

void Engine::RekeyIfNeeded() {
  const uint64_t epoch = policy_->HeatEpoch();
  if (epoch == heat_epoch_) return;
  heat_epoch_ = epoch;
  std::vector<Slot> members;
  auto rekey = [&](auto& h) {
    members.clear();
    for (const SlotHeap::Entry& e : h.entries()) members.push_back(e.slot);
    for (Slot m : members) h.Set(m, policy_->Heat(m), states_[m].touch_seq);
  };
  for (SlotHeap& h : lower_) rekey(h);
  for (Account& a : accounts_) {
    rekey(a.set_heat);
    for (SparseSlotHeap& h : a.ranked_heat) rekey(h);
  }
}

void Engine::Rank(Slot s, unsigned tier) {
  Unrank(s);
  const unsigned last = tiers_ - 1;
  tier = std::min(tier, last);
  if (tier < last) RekeyIfNeeded();
  PlaceRanked(s, tier, s);
  Settle(s);
}

void Engine::PlaceRanked(Slot x, unsigned k, Slot s) {
  const unsigned last = tiers_ - 1;
  for (;;) {
    if (quotas_on_) k = CapTier(x, k, s);
    slot_hints_[x].rank = static_cast<uint8_t>(k);
    if (k < last) Enrank(x, k);
    if (x != s) Settle(x);
    // A middle tier over its capacity sends its coldest one tier down (`s`
    // itself when it is the coldest).
    if (k >= last || lower_[k - 1].Size() <= lower_capacity_[k - 1]) return;
    x = lower_[k - 1].Top().slot;
    Unrank(x);
    ++k;
  }
}

void Engine::Enrank(Slot x, unsigned k) {
  lower_[k - 1].Set(x, policy_->Heat(x), states_[x].touch_seq);
  if (quotas_on_) {
    ForAccounts(x, [&](Account& a) {
      ++a.target[k];
      a.ranked_heat[k - 1].Set(x, policy_->Heat(x), states_[x].touch_seq);
    });
  }
}

void Engine::Unrank(Slot s) {
  const unsigned r = slot_hints_[s].rank;
  if (r != 0 && r + 1 < tiers_ && lower_[r - 1].Contains(s)) {
    lower_[r - 1].Erase(s);
    if (quotas_on_) {
      ForAccounts(s, [&](Account& a) {
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
  ++in_set_by_owner_[slot_hints_[s].owner];
  if (const uint32_t g = slot_hints_[s].group; g != 0) ++groups_[g - 1].in_set;
  if (quotas_on_) {
    ForAccounts(s, [&](Account& a) {
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
  --in_set_by_owner_[slot_hints_[s].owner];
  if (const uint32_t g = slot_hints_[s].group; g != 0) --groups_[g - 1].in_set;
  hinted_.Remove(s);
  if (quotas_on_) {
    ForAccounts(s, [s](Account& a) {
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
  if (quotas_on_) MakeRoomByQuota(s);
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
    Activate(groups_[g - 1]);
  }

  const double prev_score = st.score;
  const uint64_t prev_time = st.touch_time;
  const bool fresh = st.touch_count == 0;
  if (st.touch_count != std::numeric_limits<uint32_t>::max()) ++st.touch_count;
  st.touch_time = t.now;
  st.touch_seq = ++seq_;
  st.score = policy_->Score(st, prev_score, prev_time, fresh, t);

  if (capacity_ == 0) {
    // No tier 0 at all: every block lives below it, ranked as it first comes.
    if (st.tier == Tier::kNone) {
      const unsigned k = FirstLowerWithRoom();
      SetTier(s, TierAt(k));
      Rank(s, k);
    }
    return hit;
  }
  if (st.flags & kFlagInTarget) {
    policy_->OnHit(s, t);
    if (quotas_on_) {
      RekeyIfNeeded();
      ForAccounts(s, [&](Account& a) { a.set_heat.Set(s, policy_->Heat(s), st.touch_seq); });
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
  if (quotas_on_ && !MayEnterSet(s)) {
    // Its account has no tier 0: it stays below, ranked as it first comes.
    if (st.tier == Tier::kNone) {
      const unsigned k = FirstLowerWithRoom();
      SetTier(s, TierAt(k));
      Rank(s, k);
    }
    return hit;
  }
  // The blocks of done and idle groups leave the set before the policy's own
  // choice (but not another account's under its guarantee); `s`, on its way
  // in, no longer counts in its tier's ranking.
  Unrank(s);
  if (in_set_ >= capacity_) {
    const Slot v = PoolBack();
    if (v != kNoSlot && !(quotas_on_ && Guaranteed(v, s))) {
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
    --inflight_in_[slot_hints_[s].moving_to];
    --inflight_out_[TierIndex(st.tier)];
    if (quotas_on_) {
      ForAccounts(s, [&](Account& a) {
        a.in0 -= slot_hints_[s].moving_to == 0;
        a.out0 -= st.tier == Tier::kFast;
      });
    }
  }
  SetTier(s, Tier::kNone);
  if (quotas_on_) {
    for (uint32_t& i : slot_accounts_[s]) {
      if (i == kNoIndex) continue;
      --accounts_[i].live;
      FreeAccountIfUnused(std::exchange(i, kNoIndex));
    }
    if (clients_[s] != kNoAccount) {
      const auto it = client_live_.find(clients_[s]);
      assert(it != client_live_.end());  // counted at its admit or by the rebuild
      if (--it->second == 0) client_live_.erase(it);
    }
  }
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
  if (!pending_.empty()) {  // the room it leaves
    size_t units = SliceUnits();
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
  size_t projected = tier_blocks_[0] + inflight_in_[0];

  auto plan_move = [&](Slot s, Tier to) {
    BlockState& st = states_[s];
    moves_.push_back(Move{s, st.generation, st.tier, to});
    st.flags |= kFlagMigrating;
    queues_.Remove(s);
    slot_hints_[s].moving_to = static_cast<uint8_t>(TierIndex(to));
    ++inflight_in_[TierIndex(to)];
    ++inflight_out_[TierIndex(st.tier)];
    if (quotas_on_) {
      ForAccounts(s, [&](Account& a) {
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
  if (quotas_on_) {
    for (uint32_t i = 0; i < accounts_.size(); ++i) {
      const Account& a = accounts_[i];
      if (!a.used || a.quota.cap[0] == kNoCap || a.Projected0() < a.quota.cap[0]) continue;
      for (Slot d = queues_.Back(kDemoteQueue); d != kNoSlot && budget >= bb;) {
        const Slot prev = queues_.Prev(d);
        if (!Held(d) && (slot_accounts_[d][0] == i || slot_accounts_[d][1] == i)) {
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
    if (quotas_on_) {
      ForAccounts(p, [&full](const Account& a) { full |= a.Projected0() >= a.quota.cap[0]; });
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
  // demote outside-the-set blocks first.
  for (size_t after = projected - std::min(projected, inflight_out_[0]);
       after > capacity_ && next_demotable() != kNoSlot && budget >= bb; --after) {
    const Slot d = demote_cursor;
    demote_cursor = queues_.Prev(d);
    budget -= bb;
    demote(d);
  }
  // Promotions: the blocks touched again while queued, then the others, each
  // from its queue's head (most recently touched or queued first).
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
    if (projected < capacity_) {
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
    if (!Held(s) && tier_blocks_[to] + inflight_in_[to] < tier_capacity_blocks(to)) {
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
  --inflight_in_[TierIndex(m.to)];
  --inflight_out_[TierIndex(m.from)];
  if (quotas_on_) {
    ForAccounts(m.slot, [&m](Account& a) {
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
  ReserveFor(pool_serial_, n);
  ReserveFor(slot_accounts_, n);
  ReserveFor(clients_, n);
  index_.Reserve(n);
  policy_->Reserve(n);
}

void Engine::SetPolicy(std::unique_ptr<Policy> policy) {
  assert(policy && options_.mode == Mode::kTick);
  policy_ = std::move(policy);
  policy_->Bind(&states_, capacity_, options_.persistence, options_.mode);
  policy_->Reserve(states_.size());
  heat_epoch_ = policy_->HeatEpoch();
  std::vector<Slot> live;
  for (Slot s = 0; s < next_slot_; ++s) {
    if (!IsLive(s)) continue;
    ClearSet(s);
    Unrank(s);
    if (states_[s].touch_count > 0) live.push_back(s);
  }
  for (Group& g : groups_) {
    if (g.hinted_out) Activate(g);
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
  if (quotas_on_) {
    RebuildAccounts();  // heaps by the new policy's heat
    for (uint32_t i = 0; i < accounts_.size(); ++i) {
      if (accounts_[i].used) EnforceCaps(i);
    }
  }
}

void Engine::Relocated(Slot s, Tier tier) {
  if (!IsLive(s) || (states_[s].flags & kFlagMigrating) || states_[s].tier == tier) return;
  if (TierIndex(tier) >= tiers_) return;
  SetTier(s, tier);
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

// ---------------------------------------------------------------- hints

namespace cxltier::engine {

Engine::Group* Engine::FindGroup(GroupId id) {
  const auto it = group_index_.find(id);
  return it == group_index_.end() ? nullptr : &groups_[it->second];
}

GroupId Engine::group(Slot s) const {
  return s < slot_hints_.size() && slot_hints_[s].group != 0 ? groups_[slot_hints_[s].group - 1].id
                                                             : kNoGroup;
}

bool Engine::SetGroup(Slot s, GroupId id) {
  assert(IsLive(s));
  if (id == kNoGroup) {
    LeaveGroup(s);
    return true;
  }
  if (group(s) == id) return true;
  Group* g = FindGroup(id);
  if (g != nullptr && g->owner != owners_[s]) return false;
  LeaveGroup(s);
  if (g == nullptr) {
    const uint32_t index = TakeEntry(groups_, free_groups_);
    group_index_.emplace(id, index);
    g = &groups_[index];
    const uint32_t serial = g->serial;  // kept across reuse: older entries stay stale
    *g = Group{};
    g->serial = serial;
    g->id = id;
    g->owner = owners_[s];
  }
  slot_hints_[s].group = group_index_[id] + 1;
  slot_hints_[s].pos = static_cast<uint32_t>(g->members.size());
  g->members.push_back(s);
  if (states_[s].flags & kFlagInTarget) ++g->in_set;
  return true;
}

void Engine::LeaveGroup(Slot s) {
  const uint32_t index1 = slot_hints_[s].group;
  if (index1 == 0) return;
  Group& g = groups_[index1 - 1];
  if (states_[s].flags & kFlagInTarget) --g.in_set;
  const uint32_t pos = slot_hints_[s].pos;
  const uint32_t last = static_cast<uint32_t>(g.members.size() - 1);
  if (g.job.phase == HintJob::kWalk && pos < g.job.cursor) {
    // A walk is under way: the members before its cursor stay those it has
    // looked at. The last one it looked at fills the hole, and the last
    // member (not looked at yet) takes that one's place, past the cursor.
    const uint32_t c = --g.job.cursor;
    if (pos != c) PlaceMember(g, pos, g.members[c]);
    if (c != last) PlaceMember(g, c, g.members[last]);
  } else if (pos != last) {
    PlaceMember(g, pos, g.members[last]);
  }
  g.members.pop_back();
  slot_hints_[s].group = 0;
  hinted_.Remove(s);
  if (g.members.empty()) FreeGroup(index1 - 1);
}

void Engine::FreeGroup(uint32_t index) {
  Group& g = groups_[index];
  group_index_.erase(g.id);
  // Its entries in pending_ and jobs_ go stale with the serial and the ticket.
  const uint32_t serial = g.serial + 1;
  g = Group{};
  g.serial = serial;
  free_groups_.push_back(index);
}

void Engine::Activate(Group& g) {
  g.hinted_out = false;  // its blocks in the pool are stale there now (PoolValid)
  g.job = HintJob{};     // an idle or done hint's work still to do, if any
}

bool Engine::PoolValid(Slot s) const {
  const uint32_t g = slot_hints_[s].group;
  return g != 0 && groups_[g - 1].hinted_out && groups_[g - 1].serial == pool_serial_[s];
}

Slot Engine::PoolBack() {
  for (const int pool : {kDonePool, kIdlePool}) {
    for (Slot s = hinted_.Back(pool); s != kNoSlot; s = hinted_.Back(pool)) {
      if (PoolValid(s)) return s;
      hinted_.Remove(s);  // its group ran or was hinted again since
    }
  }
  return kNoSlot;
}

void Engine::Displace(Slot v, uint64_t* counter) {
  BlockState& st = states_[v];
  policy_->Erase(v);
  ClearSet(v);
  ++*counter;
  Log(EngineEvent::kEvict, v);
  ForgetIfReset(st);
  if (options_.mode == Mode::kDemand) {
    DemoteNow(v);
  } else {
    LeftSetTick(v);
  }
}

bool Engine::PlaceAhead(Slot s, uint32_t owner, uint64_t now) {
  if (capacity_ == 0 || (quotas_on_ && !MayEnterSet(s))) return false;
  // An account at its cap makes room with its own coldest block.
  if (in_set_ >= capacity_ && !(quotas_on_ && AtSetCap(s))) {
    const Slot v = PoolBack();
    if (v != kNoSlot && !(quotas_on_ && Guaranteed(v, s))) {
      Unrank(s);  // on its way in
      Displace(v, &counters_.hint_displaced);
    } else if (in_set_by_owner_[owner_index_.at(owner)] != in_set_) {
      return false;  // the policy might evict another owner's block
    }
  }
  BlockState& st = states_[s];
  // A pause does not age the block: its touch time moves on by the time its
  // group was idle (so an EMA's score is what it was when the group stopped).
  const uint64_t idle_for = Elapsed(now, groups_[slot_hints_[s].group - 1].idle_at);
  st.touch_time = Resumed(st.touch_time, idle_for, now);
  policy_->OnResume(s, idle_for, now);
  JoinSet(s, engine::Touch{0.0, now, kNever, /*ahead=*/true});
  ++counters_.hint_prefetched;
  slot_hints_[s].placed_ahead = 1;
  if (options_.mode == Mode::kTick) {
    // Needed soon: planned with the blocks in use, ahead of those merely queued.
    if (queues_.ListOf(s) == kPromoteQueue) {
      queues_.Remove(s);
      queues_.PushFront(kRetouchedQueue, s);
    }
  }
  return true;
}

void Engine::ServePending(uint64_t now, size_t* units) {
  // Rounds over the waiting groups, a block each per round, while a round
  // places any. A round cut short by the units goes on where it stopped.
  size_t i = serve_left_ ? serve_from_ : 0;
  bool progress = serve_left_ && serve_progress_;
  serve_left_ = false;
  for (;;) {
    size_t keep = i;  // entries before `keep` stay; stale and finished ones are dropped
    bool cut = false;
    for (; i < pending_.size(); ++i) {
      if (*units == 0) {
        cut = true;
        break;
      }
      --*units;
      const PendingRef r = pending_[i];
      Group& g = groups_[r.index];
      if (!g.pending || g.serial != r.serial) continue;  // stale: dropped
      // The next block still out of the set (a candidate may have been
      // touched, released or regrouped since the hint).
      bool found = false;
      while (!g.candidates.empty()) {
        const Group::Candidate& c = g.candidates.back();
        if (IsLive(c.slot) && states_[c.slot].generation == c.generation &&
            slot_hints_[c.slot].group == r.index + 1 && !(states_[c.slot].flags & kFlagInTarget)) {
          found = true;
          break;
        }
        if (*units == 0) break;
        g.candidates.pop_back();
        --*units;
      }
      if (!found && !g.candidates.empty()) {  // out of units: this one goes on next time
        cut = true;
        break;
      }
      if (!found || g.prefetch_left == 0) {
        g.pending = false;
        g.candidates = {};
        continue;
      }
      if (PlaceAhead(g.candidates.back().slot, g.owner, now)) {
        g.candidates.pop_back();
        --g.prefetch_left;
        progress = true;
      }
      pending_[keep++] = r;
    }
    if (cut) {
      serve_left_ = true;
      serve_from_ = keep;
      serve_progress_ = progress;
    }
    for (; i < pending_.size(); ++i) pending_[keep++] = pending_[i];
    pending_.resize(keep);
    if (cut || !progress || pending_.empty()) return;
    i = 0;
    progress = false;
  }
}

size_t Engine::SliceUnits() const {
  return options_.mode == Mode::kTick && options_.hint_slice_units > 0 ? options_.hint_slice_units
                                                                       : SIZE_MAX;
}

size_t Engine::TickUnits() const {
  return options_.hint_tick_units > 0 ? options_.hint_tick_units : SIZE_MAX;
}

void Engine::Queue(uint32_t index) {
  Group& g = groups_[index];
  if (g.queued != 0) return;  // its entry serves whatever job it has then
  g.queued = ++next_ticket_;
  jobs_.push_back(JobRef{index, g.queued});
}

void Engine::StartJob(uint32_t index, HintKind kind, uint32_t keep) {
  HintJob& job = groups_[index].job;
  job = HintJob{};
  job.phase = HintJob::kWalk;
  job.kind = kind;
  job.keep = keep;
}

bool Engine::RunJob(uint32_t index, size_t* units) {
  Group& g = groups_[index];
  HintJob& job = g.job;
  const bool soon = job.kind == HintKind::kSoon;
  // The walk: an idle or done hint wants the members in the set, a soon the
  // hottest `keep` of those outside it that were touched.
  while (job.phase == HintJob::kWalk && *units > 0) {
    if (job.cursor == g.members.size()) {
      job.phase = HintJob::kDrain;
      break;
    }
    --*units;
    const Slot m = g.members[job.cursor++];
    const BlockState& st = states_[m];
    const bool in_set = st.flags & kFlagInTarget;
    if (!soon) {
      if (!in_set) continue;
      job.heap.push_back(OrderOf(m));
      std::push_heap(job.heap.begin(), job.heap.end(), Hotter);
    } else if (!in_set && st.touch_count > 0) {
      const Ordered o = OrderOf(m);
      if (job.heap.size() < job.keep) {
        job.heap.push_back(o);
        std::push_heap(job.heap.begin(), job.heap.end(), Hotter);
      } else if (Colder(job.heap.front(), o)) {
        std::pop_heap(job.heap.begin(), job.heap.end(), Hotter);
        job.heap.back() = o;
        std::push_heap(job.heap.begin(), job.heap.end(), Hotter);
      }
    }
  }
  // The drain, coldest first. Idle and done: each block pushed in front of
  // the pool, so that the group's coldest leave first, and groups hinted
  // earlier before those hinted later. Soon: candidates, hottest at the back.
  while (job.phase == HintJob::kDrain && !job.heap.empty() && *units > 0) {
    --*units;
    std::pop_heap(job.heap.begin(), job.heap.end(), Hotter);
    const Ordered o = job.heap.back();
    job.heap.pop_back();
    if (soon) {
      g.candidates.push_back(Group::Candidate{o.slot, o.generation});
    } else if (IsLive(o.slot) && states_[o.slot].generation == o.generation &&
               slot_hints_[o.slot].group == index + 1 && (states_[o.slot].flags & kFlagInTarget)) {
      hinted_.Remove(o.slot);
      hinted_.PushFront(job.kind == HintKind::kDone ? kDonePool : kIdlePool, o.slot);
      pool_serial_[o.slot] = g.serial;
    }
  }
  if (job.phase == HintJob::kDrain && job.heap.empty()) FinishJob(index, units);
  return job.phase == HintJob::kNone;
}

void Engine::FinishJob(uint32_t index, size_t* units) {
  Group& g = groups_[index];
  const bool soon = g.job.kind == HintKind::kSoon;
  const uint32_t keep = g.job.keep;
  g.job = HintJob{};
  if (!soon) {
    if (!pending_.empty()) ServePending(now_, units);  // room it may give a waiting soon
    return;
  }
  if (g.candidates.empty()) return;
  g.prefetch_left = keep;
  g.pending = true;
  pending_.push_back(PendingRef{index, g.serial});
  ServePending(now_, units);
}

void Engine::RunHints() {
  if (jobs_.empty() && !serve_left_) return;
  size_t units = TickUnits();
  const size_t budget = units;
  const size_t slice = SliceUnits();
  // Each queued job a slice in turn, until the units run out.
  while (!jobs_.empty() && units > 0) {
    const JobRef r = jobs_.front();
    jobs_.pop_front();
    if (groups_[r.index].queued != r.ticket) {  // stale
      --units;
      continue;
    }
    groups_[r.index].queued = 0;
    size_t give = std::min(slice, units);
    const size_t given = give;
    const bool done = RunJob(r.index, &give);
    units -= given - give;
    if (!done) Queue(r.index);
  }
  if (serve_left_ && units > 0) ServePending(now_, &units);
  counters_.hint_work += budget - units;
}

bool Engine::Hint(GroupId id, HintKind kind, uint64_t now) {
  Group* found = FindGroup(id);
  if (found == nullptr) return false;
  Group& g = *found;
  const uint32_t index = static_cast<uint32_t>(&g - groups_.data());
  ++counters_.hints;
  now_ = now;
  if (policy_->NeedsFuture() || capacity_ == 0) return true;
  // A new hint ends what the last one still had to do: its soon's placing,
  // its work, its blocks' places in the pool.
  ++g.serial;
  g.pending = false;
  g.candidates = {};
  g.prefetch_left = 0;
  g.job = HintJob{};
  uint32_t keep = 0;
  if (kind == HintKind::kIdle || kind == HintKind::kDone) {
    g.working_set = g.in_set;
    g.idle_at = now;
    g.hinted_out = true;
    g.last = kind;
  } else {
    if (g.hinted_out) Activate(g);
    g.last = kind;
    if (g.working_set <= g.in_set) return true;
    keep = g.working_set - g.in_set;
  }
  size_t units = SliceUnits();
  const size_t budget = units;
  if (kind != HintKind::kSoon && g.in_set == 0) {
    // Nothing of it to mark: no walk.
    if (!pending_.empty()) ServePending(now, &units);
  } else {
    StartJob(index, kind, keep);
    if (!RunJob(index, &units)) {
      Queue(index);
      ++counters_.hint_deferred;
    }
  }
  counters_.hint_work += budget - units;
  return true;
}

}  // namespace cxltier::engine

// ---------------------------------------------------------------- quotas

namespace cxltier::engine {

uint32_t Engine::AccountIndex(uint64_t id, bool create) {
  if (const auto it = account_index_.find(id); it != account_index_.end()) return it->second;
  if (!create) return kNoIndex;
  const uint32_t index = TakeEntry(accounts_, free_accounts_);
  Account& a = accounts_[index];
  a = Account{};
  a.id = id;
  a.used = true;
  a.ranked_heat.resize(lower_.size());
  account_index_.emplace(id, index);
  return index;
}

void Engine::FreeAccountIfUnused(uint32_t index) {
  Account& a = accounts_[index];
  if (!a.used || a.live > 0 || !a.quota.Unlimited()) return;
  account_index_.erase(a.id);
  a = Account{};
  free_accounts_.push_back(index);
}

void Engine::AttachAccounts(Slot s) {
  slot_accounts_[s] = {AccountIndex(owners_[s], /*create=*/true),
                       clients_[s] == kNoAccount ? kNoIndex : AccountIndex(clients_[s], false)};
  ForAccounts(s, [](Account& a) { ++a.live; });
  if (clients_[s] != kNoAccount) ++client_live_[clients_[s]];
}

void Engine::RebuildAccounts() {
  for (Account& a : accounts_) {
    if (!a.used) continue;
    const Quota q = a.quota;
    const uint64_t id = a.id, lost = a.quota_evictions;
    a = Account{};
    a.id = id;
    a.used = true;
    a.ranked_heat.resize(lower_.size());
    a.quota = q;
    a.quota_evictions = lost;
  }
  // The middle tiers' heaps too are keyed by this epoch's heat (the accounts'
  // are empty now and filled below with it).
  RekeyIfNeeded();
  client_live_.clear();
  for (Slot s = 0; s < next_slot_; ++s) {
    if (!IsLive(s)) continue;
    AttachAccounts(s);
    ForAccounts(s, [&](Account& a) { CountInAccount(s, a); });
  }
  for (uint32_t i = 0; i < accounts_.size(); ++i) FreeAccountIfUnused(i);
}

void Engine::CountInAccount(Slot s, Account& a) {
  const BlockState& st = states_[s];
  const unsigned r = slot_hints_[s].rank;
  if (st.tier != Tier::kNone) ++a.tier_blocks[TierIndex(st.tier)];
  if (st.flags & kFlagInTarget) {
    ++a.target[0];
    a.set_heat.Set(s, policy_->Heat(s), st.touch_seq);
  }
  if (r != 0 && r < tiers_ - 1 && lower_[r - 1].Contains(s)) {
    ++a.target[r];
    a.ranked_heat[r - 1].Set(s, policy_->Heat(s), st.touch_seq);
  }
  if (st.flags & kFlagMigrating) {
    a.in0 += slot_hints_[s].moving_to == 0;
    a.out0 += st.tier == Tier::kFast;
  }
}

void Engine::JoinAccount(uint32_t index) {
  Account& a = accounts_[index];
  const uint64_t id = a.id;
  // A client account with no live block (every hello of a client whose name
  // has a quota) and an owner's (an owner's blocks always have one): nothing
  // to join, no pass over the slots. Else its blocks have no client account
  // yet (one exists only while its quota does, with all of them in it).
  if (!a.IsClient() || !client_live_.contains(id)) return;
  // Heaps keyed by an older heat epoch are rekeyed together, this one too.
  RekeyIfNeeded();
  for (Slot s = 0; s < next_slot_; ++s) {
    if (!IsLive(s) || clients_[s] != id) continue;
    slot_accounts_[s][1] = index;
    ++a.live;
    CountInAccount(s, a);
  }
}

void Engine::TrackAccounts() {
  if (quotas_on_) return;
  quotas_on_ = true;
  RebuildAccounts();
}

void Engine::SetQuota(uint64_t id, const Quota& quota) {
  if (!quotas_on_ && quota.Unlimited()) return;
  const bool known = account_index_.contains(id);
  const uint32_t index = AccountIndex(id, /*create=*/true);
  accounts_[index].quota = quota;
  if (!quotas_on_) {
    quotas_on_ = true;
    RebuildAccounts();  // every live block joins its accounts
  } else if (!known) {
    JoinAccount(index);  // the new account's live blocks join it
  }
  if (!accounts_[index].used) return;  // freed by the rebuild: no quota, no block
  EnforceCaps(index);
  FreeAccountIfUnused(index);
}

void Engine::EnforceCaps(uint32_t index) {
  const Account& a = accounts_[index];
  RekeyIfNeeded();
  while (a.target[0] > a.quota.cap[0]) EvictForQuota(a.set_heat.Top().slot);
  // Middle tiers: the coldest of the excess are ranked further down.
  for (unsigned k = 1; k + 1 < tiers_; ++k) {
    while (a.target[k] > a.quota.cap[k]) {
      const Slot c = a.ranked_heat[k - 1].Top().slot;
      Unrank(c);
      PlaceRanked(c, k + 1, kNoSlot);
    }
  }
}

size_t Engine::CapRoom(uint32_t owner, uint64_t client, unsigned tier) const {
  size_t room = kNoCap;
  if (!quotas_on_ || tier + 1 >= tiers_) return room;
  for (const uint64_t id : {uint64_t{owner}, client}) {
    const auto it = account_index_.find(id);
    if (it == account_index_.end()) continue;
    const Account& a = accounts_[it->second];
    const size_t cap = a.quota.cap[tier];
    if (cap == kNoCap) continue;
    const size_t held = tier == 0 ? a.Projected0() : a.tier_blocks[tier];
    room = std::min(room, cap > held ? cap - held : size_t{0});
  }
  return room;
}

std::vector<AccountUsage> Engine::Accounts() const {
  std::vector<AccountUsage> out;
  for (const Account& a : accounts_) {
    if (!a.used) continue;
    out.push_back(AccountUsage{a.id, a.quota, a.tier_blocks, a.target[0], a.quota_evictions});
  }
  std::sort(out.begin(), out.end(),
            [](const AccountUsage& x, const AccountUsage& y) { return x.account < y.account; });
  return out;
}

bool Engine::MayEnterSet(Slot s) const {
  for (uint32_t i : slot_accounts_[s]) {
    if (i != kNoIndex && accounts_[i].quota.cap[0] == 0) return false;
  }
  return true;
}

bool Engine::AtSetCap(Slot s) const {
  for (uint32_t i : slot_accounts_[s]) {
    if (i != kNoIndex && accounts_[i].target[0] >= accounts_[i].quota.cap[0]) return true;
  }
  return false;
}

bool Engine::Guaranteed(Slot v, Slot s) const {
  const uint32_t i = slot_accounts_[v][0];
  if (i == slot_accounts_[s][0]) return false;
  const Account& a = accounts_[i];
  return a.quota.guarantee > 0 && a.target[0] <= a.quota.guarantee;
}

void Engine::MakeRoomByQuota(Slot s) {
  RekeyIfNeeded();
  for (uint32_t i : slot_accounts_[s]) {
    if (i == kNoIndex) continue;
    const Account& a = accounts_[i];
    while (a.target[0] >= a.quota.cap[0] && !a.set_heat.Empty()) {
      EvictForQuota(a.set_heat.Top().slot);
    }
  }
  if (in_set_ < capacity_) return;
  // The set is full and the policy would pick the block to leave: unless that
  // may be a block of another owner at or under its guarantee, it does.
  const uint32_t own = slot_accounts_[s][0];
  bool at_stake = false;
  for (uint32_t i = 0; i < accounts_.size() && !at_stake; ++i) {
    const Account& a = accounts_[i];
    at_stake = i != own && a.used && !a.IsClient() && a.quota.guarantee > 0 && a.target[0] > 0 &&
               a.target[0] <= a.quota.guarantee;
  }
  if (!at_stake) return;
  // The coldest block of the owners above their guarantee (`s`'s own owner
  // counts as above: its block makes room for its own).
  const HeapEntry* coldest = nullptr;
  for (uint32_t i = 0; i < accounts_.size(); ++i) {
    const Account& a = accounts_[i];
    if (!a.used || a.IsClient() || a.set_heat.Empty()) continue;
    if (i != own && a.target[0] <= a.quota.guarantee) continue;
    const HeapEntry& top = a.set_heat.Top();
    if (coldest == nullptr || SlotHeap::Less(top, *coldest)) coldest = &top;
  }
  if (coldest != nullptr) EvictForQuota(coldest->slot);
}

void Engine::EvictForQuota(Slot v) {
  ++accounts_[slot_accounts_[v][0]].quota_evictions;
  if (slot_accounts_[v][1] != kNoIndex) ++accounts_[slot_accounts_[v][1]].quota_evictions;
  Displace(v, &counters_.quota_evictions);
}

unsigned Engine::CapTier(Slot x, unsigned k, Slot s) {
  const unsigned last = tiers_ - 1;
  for (; k < last; ++k) {
    const SlotHeap::Entry mine = HeatEntry(x);
    bool fits = true;
    for (uint32_t i : slot_accounts_[x]) {
      if (i == kNoIndex) continue;
      const Account& a = accounts_[i];
      if (a.target[k] < a.quota.cap[k]) continue;
      // Full: `x` goes in only in place of a colder block of the account.
      if (a.quota.cap[k] == 0 || a.ranked_heat[k - 1].Empty() ||
          SlotHeap::Less(mine, a.ranked_heat[k - 1].Top())) {
        fits = false;
      }
    }
    if (!fits) continue;
    for (uint32_t i : slot_accounts_[x]) {
      if (i == kNoIndex) continue;
      const Account& a = accounts_[i];
      while (a.target[k] >= a.quota.cap[k] && !a.ranked_heat[k - 1].Empty()) {
        const Slot c = a.ranked_heat[k - 1].Top().slot;
        Unrank(c);
        PlaceRanked(c, k + 1, s);
      }
    }
    return k;
  }
  return last;
}

}  // namespace cxltier::engine
