#include "engine/accounts.h"

#include <algorithm>
#include <cassert>
#include <utility>

#include "engine/engine.h"

// ---------------------------------------------------------------- the table

namespace cxltier::engine {

uint32_t AccountTable::Index(uint64_t id, bool create) {
  if (const auto it = index_.find(id); it != index_.end()) return it->second;
  if (!create) return kNoIndex;
  const uint32_t index = TakeEntry(accounts_, free_);
  Account& a = accounts_[index];
  a = Account{};
  a.id = id;
  a.used = true;
  a.held = HeldOf(id);
  a.ranked_heat.resize(middle_tiers_);
  index_.emplace(id, index);
  return index;
}

void AccountTable::SetHeld(uint64_t id, size_t n) {
  if (n == 0) {
    held_.erase(id);
  } else {
    held_[id] = n;
  }
  if (const auto it = index_.find(id); it != index_.end()) accounts_[it->second].held = n;
}

void AccountTable::FreeIfUnused(uint32_t index) {
  Account& a = accounts_[index];
  if (!a.used || a.live > 0 || !a.quota.Unlimited()) return;
  index_.erase(a.id);
  a = Account{};
  free_.push_back(index);
}

void AccountTable::Attach(Slot s, uint32_t owner) {
  slot_accounts_[s] = {Index(owner, /*create=*/true),
                       clients_[s] == kNoAccount ? kNoIndex : Index(clients_[s], false)};
  ForEach(s, [](Account& a) { ++a.live; });
  if (clients_[s] != kNoAccount) ++client_live_[clients_[s]];
}

void AccountTable::Detach(Slot s) {
  for (uint32_t& i : slot_accounts_[s]) {
    if (i == kNoIndex) continue;
    --accounts_[i].live;
    FreeIfUnused(std::exchange(i, kNoIndex));
  }
  if (clients_[s] != kNoAccount) {
    const auto it = client_live_.find(clients_[s]);
    assert(it != client_live_.end());  // counted at its admit or by the rebuild
    if (--it->second == 0) client_live_.erase(it);
  }
}

void AccountTable::ClearCounts() {
  for (Account& a : accounts_) {
    if (!a.used) continue;
    const Quota q = a.quota;
    const uint64_t id = a.id, lost = a.quota_evictions;
    a = Account{};
    a.id = id;
    a.used = true;
    a.ranked_heat.resize(middle_tiers_);
    a.quota = q;
    a.quota_evictions = lost;
    a.held = HeldOf(id);
  }
  client_live_.clear();
}

std::vector<AccountUsage> AccountTable::Usage() const {
  std::vector<AccountUsage> out;
  for (const Account& a : accounts_) {
    if (!a.used) continue;
    out.push_back(AccountUsage{a.id, a.quota, a.tier_blocks, a.target[0], a.quota_evictions});
  }
  std::sort(out.begin(), out.end(),
            [](const AccountUsage& x, const AccountUsage& y) { return x.account < y.account; });
  return out;
}

size_t AccountTable::CapRoom(uint32_t owner, uint64_t client, unsigned tier) const {
  size_t room = kNoCap;
  for (const uint64_t id : {uint64_t{owner}, client}) {
    const auto it = index_.find(id);
    if (it == index_.end()) continue;
    const Account& a = accounts_[it->second];
    const size_t cap = a.quota.cap[tier];
    if (cap == kNoCap) continue;
    const size_t held = tier == 0 ? a.Charged0() : a.tier_blocks[tier];
    room = std::min(room, cap > held ? cap - held : size_t{0});
  }
  return room;
}

bool AccountTable::MayEnterSet(Slot s) const {
  for (uint32_t i : slot_accounts_[s]) {
    if (i != kNoIndex && accounts_[i].quota.cap[0] == 0) return false;
  }
  return true;
}

bool AccountTable::AtSetCap(Slot s) const {
  for (uint32_t i : slot_accounts_[s]) {
    if (i != kNoIndex && accounts_[i].target[0] >= accounts_[i].quota.cap[0]) return true;
  }
  return false;
}

bool AccountTable::Guaranteed(Slot v, Slot s) const {
  const uint32_t i = slot_accounts_[v][0];
  if (i == slot_accounts_[s][0]) return false;
  const Account& a = accounts_[i];
  return a.quota.guarantee > 0 && a.target[0] <= a.quota.guarantee;
}

bool AccountTable::GuaranteeAtStake(Slot s) const {
  const uint32_t own = slot_accounts_[s][0];
  for (uint32_t i = 0; i < accounts_.size(); ++i) {
    const Account& a = accounts_[i];
    if (i != own && a.used && !a.IsClient() && a.quota.guarantee > 0 && a.target[0] > 0 &&
        a.target[0] <= a.quota.guarantee) {
      return true;
    }
  }
  return false;
}

const HeapEntry* AccountTable::ColdestAboveGuarantee(Slot s) const {
  const uint32_t own = slot_accounts_[s][0];
  const HeapEntry* coldest = nullptr;
  for (uint32_t i = 0; i < accounts_.size(); ++i) {
    const Account& a = accounts_[i];
    if (!a.used || a.IsClient() || a.set_heat.Empty()) continue;
    if (i != own && a.target[0] <= a.quota.guarantee) continue;
    const HeapEntry& top = a.set_heat.Top();
    if (coldest == nullptr || SlotHeap::Less(top, *coldest)) coldest = &top;
  }
  return coldest;
}

void AccountTable::CountEviction(Slot v) {
  ++accounts_[slot_accounts_[v][0]].quota_evictions;
  if (slot_accounts_[v][1] != kNoIndex) ++accounts_[slot_accounts_[v][1]].quota_evictions;
}

}  // namespace cxltier::engine

// ---------------------------------------------------------------- the engine's quota code

namespace cxltier::engine {

void Engine::RebuildAccounts() {
  accounts_.ClearCounts();
  // The middle tiers' heaps too are keyed by this epoch's heat (the accounts'
  // are empty now and filled below with it).
  RekeyIfNeeded();
  for (Slot s = 0; s < next_slot_; ++s) {
    if (!IsLive(s)) continue;
    accounts_.Attach(s, owners_[s]);
    accounts_.ForEach(s, [&](Account& a) { CountInAccount(s, a); });
  }
  for (uint32_t i = 0; i < accounts_.size(); ++i) accounts_.FreeIfUnused(i);
}

void Engine::CountInAccount(Slot s, Account& a) {
  const BlockState& st = states_[s];
  const unsigned r = slot_hints_[s].rank;
  if (st.tier != Tier::kNone) ++a.tier_blocks[TierIndex(st.tier)];
  if (st.flags & kFlagInTarget) {
    ++a.target[0];
    a.set_heat.Set(s, policy_->Heat(s), st.touch_seq);
  }
  if (r != 0 && tiers_.IsMiddle(r) && tiers_.ranking(r).Contains(s)) {
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
  if (!a.IsClient() || !accounts_.ClientHasBlocks(id)) return;
  // Heaps keyed by an older heat epoch are rekeyed together, this one too.
  RekeyIfNeeded();
  for (Slot s = 0; s < next_slot_; ++s) {
    if (!IsLive(s) || accounts_.client(s) != id) continue;
    accounts_.of(s)[1] = index;
    ++a.live;
    CountInAccount(s, a);
  }
}

void Engine::TrackAccounts() {
  if (accounts_.on()) return;
  accounts_.TurnOn();
  RebuildAccounts();
}

void Engine::SetQuota(uint64_t id, const Quota& quota) {
  if (!accounts_.on() && quota.Unlimited()) return;
  const bool known = accounts_.Has(id);
  const uint32_t index = accounts_.Index(id, /*create=*/true);
  accounts_[index].quota = quota;
  if (!accounts_.on()) {
    accounts_.TurnOn();
    RebuildAccounts();  // every live block joins its accounts
  } else if (!known) {
    JoinAccount(index);  // the new account's live blocks join it
  }
  if (!accounts_[index].used) return;  // freed by the rebuild: no quota, no block
  EnforceCaps(index);
  accounts_.FreeIfUnused(index);
}

void Engine::EnforceCaps(uint32_t index) {
  const Account& a = accounts_[index];
  RekeyIfNeeded();
  while (a.target[0] > a.quota.cap[0]) EvictForQuota(a.set_heat.Top().slot);
  // Middle tiers: the coldest of the excess are ranked further down.
  for (unsigned k = 1; tiers_.IsMiddle(k); ++k) {
    while (a.target[k] > a.quota.cap[k]) {
      const Slot c = a.ranked_heat[k - 1].Top().slot;
      Unrank(c);
      PlaceRanked(c, k + 1, kNoSlot);
    }
  }
}

size_t Engine::CapRoom(uint32_t owner, uint64_t client, unsigned tier) const {
  if (!accounts_.on() || tier + 1 >= tiers_.count()) return kNoCap;
  return accounts_.CapRoom(owner, client, tier);
}

std::vector<AccountUsage> Engine::Accounts() const { return accounts_.Usage(); }

void Engine::MakeRoomByQuota(Slot s) {
  RekeyIfNeeded();
  for (uint32_t i : accounts_.of(s)) {
    if (i == AccountTable::kNoIndex) continue;
    const Account& a = accounts_[i];
    while (a.target[0] >= a.quota.cap[0] && !a.set_heat.Empty()) {
      EvictForQuota(a.set_heat.Top().slot);
    }
  }
  if (in_set_ < set_capacity_) return;
  // The set is full and the policy would pick the block to leave: unless that
  // may be a block of another owner at or under its guarantee, it does.
  if (!accounts_.GuaranteeAtStake(s)) return;
  // The coldest block of the owners above their guarantee (`s`'s own owner
  // counts as above: its block makes room for its own).
  if (const HeapEntry* coldest = accounts_.ColdestAboveGuarantee(s)) EvictForQuota(coldest->slot);
}

void Engine::EvictForQuota(Slot v) {
  accounts_.CountEviction(v);
  Displace(v, &counters_.quota_evictions);
}

unsigned Engine::CapTier(Slot x, unsigned k, Slot s) {
  const unsigned last = tiers_.last();
  for (; k < last; ++k) {
    const SlotHeap::Entry mine = HeatEntry(x);
    bool fits = true;
    for (uint32_t i : accounts_.of(x)) {
      if (i == AccountTable::kNoIndex) continue;
      const Account& a = accounts_[i];
      if (a.target[k] < a.quota.cap[k]) continue;
      // Full: `x` goes in only in place of a colder block of the account.
      if (a.quota.cap[k] == 0 || a.ranked_heat[k - 1].Empty() ||
          SlotHeap::Less(mine, a.ranked_heat[k - 1].Top())) {
        fits = false;
      }
    }
    if (!fits) continue;
    for (uint32_t i : accounts_.of(x)) {
      if (i == AccountTable::kNoIndex) continue;
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
