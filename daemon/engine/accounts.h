// Quota accounts (docs/policies.md, "Quotas"): the table of accounts and, by
// slot, the accounts each live block counts in. This part keeps the counts;
// which block leaves for a cap or a guarantee needs the policy and the set,
// and is the engine's (Engine's quota code, in accounts.cpp).
//
// Off, and costing nothing, until the first quota (or TrackAccounts).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cxltier/block.h"
#include "engine/slot_heap.h"
#include "engine/types.h"

namespace cxltier::engine {

// An account is an opaque 64-bit id: every block counts in its owner's
// account (id = Admit's owner) and, when admitted with one, in a client
// account (the daemon: kClientAccount | n, one per uid and hello name).
inline constexpr uint64_t kClientAccount = 1ull << 63;
inline constexpr uint64_t kNoAccount = ~0ull;
inline constexpr size_t kNoCap = SIZE_MAX;

struct Quota {
  // The most blocks the account may have in tier k: cap[0] bounds its blocks
  // in the policy's set (tier 0, or what the planner moves there), cap[k] its
  // blocks ranked in middle tier k. The last tier is never capped (every block
  // stays whole in some tier). An account at its cap that wants one more block
  // there gives up its own coldest (by the policy's Heat); cap[0] = 0 keeps
  // its blocks out of tier 0.
  std::array<size_t, kMaxTiers> cap = DefaultCaps();
  // Owner accounts only: while the account has at most this many blocks in
  // the set, other accounts' misses take none of them (each takes the coldest
  // block of the accounts above their guarantee instead).
  size_t guarantee = 0;

  static constexpr std::array<size_t, kMaxTiers> DefaultCaps() {
    std::array<size_t, kMaxTiers> c{};
    c.fill(kNoCap);
    return c;
  }
  bool Unlimited() const { return guarantee == 0 && cap == DefaultCaps(); }
  friend bool operator==(const Quota&, const Quota&) = default;
};

// One account as the operator sees it.
struct AccountUsage {
  uint64_t account = 0;
  Quota quota;
  std::array<size_t, kMaxTiers> tier_blocks{};  // its live blocks where they sit now
  size_t in_set = 0;                            // of them, in the policy's tier-0 set
  uint64_t quota_evictions = 0;                 // its blocks taken out of the set by quotas
};

struct Account {
  uint64_t id = 0;
  Quota quota;
  bool used = false;  // false: on the free list
  size_t live = 0;
  std::array<size_t, kMaxTiers> tier_blocks{};  // its live blocks where they sit
  std::array<size_t, kMaxTiers> target{};       // [0]: in the set; [k]: ranked in middle tier k
  size_t in0 = 0, out0 = 0;                     // its moves in flight into and out of tier 0
  size_t held = 0;          // pages its blocks left in tier 0 when released (AccountTable::SetHeld)
  SparseSlotHeap set_heat;  // its blocks in the set, coldest on top
  std::vector<SparseSlotHeap> ranked_heat;  // [k - 1]: its blocks ranked in tier k
  uint64_t quota_evictions = 0;
  bool IsClient() const { return (id & kClientAccount) != 0; }
  // Its tier-0 blocks once the moves in flight are done.
  size_t Projected0() const { return tier_blocks[0] + in0 - out0; }
  // What its tier-0 cap is charged: those, and the pages its released blocks
  // left there (room for its admissions and promotions; the blocks alone
  // are its excess to demote, as tier 0's held pages are no excess).
  size_t Charged0() const { return Projected0() + held; }
};

class AccountTable {
 public:
  static constexpr uint32_t kNoIndex = UINT32_MAX;

  // `middle_tiers`: the tiers between tier 0 and the last (an account keeps
  // a ranking heap for each).
  explicit AccountTable(size_t middle_tiers) : middle_tiers_(middle_tiers) {}

  bool on() const { return on_; }
  void TurnOn() { on_ = true; }

  // The per-slot tables (sized with the engine's).
  void Resize(size_t n) {
    slot_accounts_.resize(n, {kNoIndex, kNoIndex});
    clients_.resize(n, kNoAccount);
  }
  void Reserve(size_t n) {
    ReserveFor(slot_accounts_, n);
    ReserveFor(clients_, n);
  }
  void AddSlot() {
    slot_accounts_.push_back({kNoIndex, kNoIndex});
    clients_.push_back(kNoAccount);
  }
  // Admit's client id of the block in slot `s` (kNoAccount: none).
  void set_client(Slot s, uint64_t client) { clients_[s] = client; }
  uint64_t client(Slot s) const { return clients_[s]; }
  // The block's owner and client account indexes (kNoIndex: none).
  std::array<uint32_t, 2>& of(Slot s) { return slot_accounts_[s]; }
  const std::array<uint32_t, 2>& of(Slot s) const { return slot_accounts_[s]; }
  bool In(Slot s, uint32_t index) const {
    return slot_accounts_[s][0] == index || slot_accounts_[s][1] == index;
  }

  // The account's index, kNoIndex when there is none and `create` is false.
  uint32_t Index(uint64_t id, bool create);
  bool Has(uint64_t id) const { return index_.contains(id); }
  Account& operator[](uint32_t index) { return accounts_[index]; }
  const Account& operator[](uint32_t index) const { return accounts_[index]; }
  uint32_t size() const { return static_cast<uint32_t>(accounts_.size()); }
  std::vector<Account>& all() { return accounts_; }
  const std::vector<Account>& all() const { return accounts_; }
  // Calls f(Account&) for each of the block's accounts.
  template <typename F>
  void ForEach(Slot s, F&& f) {
    for (uint32_t i : slot_accounts_[s]) {
      if (i != kNoIndex) f(accounts_[i]);
    }
  }
  template <typename F>
  void ForEach(Slot s, F&& f) const {
    for (uint32_t i : slot_accounts_[s]) {
      if (i != kNoIndex) f(accounts_[i]);
    }
  }

  // Frees an account with no quota and no live block.
  void FreeIfUnused(uint32_t index);
  // Live block `s` of `owner` joins its owner account (created) and its
  // client account (if it has one now), counted live there.
  void Attach(Slot s, uint32_t owner);
  // Live block `s` leaves its accounts (freed when unused).
  void Detach(Slot s);
  // Every account's counts and heaps emptied (ids, quotas and eviction counts
  // kept), and the blocks' client counts forgotten: the start of a rebuild.
  void ClearCounts();
  // A client account id has live blocks (counted in an account or not).
  bool ClientHasBlocks(uint64_t id) const { return client_live_.contains(id); }
  // `n` blocks' worth of pages in tier 0 that no block holds were left
  // there by released blocks of account `id` (the engine's held blocks, by
  // account): they are charged to its cap (Charged0) until they are gone,
  // whether the account exists now or is made later. Kept by id, for the
  // accounts with some only.
  void SetHeld(uint64_t id, size_t n);

  // Every account in use, by id.
  std::vector<AccountUsage> Usage() const;
  // How many more blocks of `owner` and client `client` tier `tier` may take
  // before one of those accounts is at its cap there (kNoCap: neither capped).
  // REQUIRES: `tier` is below the last tier, which has no cap (Engine::CapRoom
  // answers kNoCap for it).
  size_t CapRoom(uint32_t owner, uint64_t client, unsigned tier) const;
  // False when an account of `s` has a tier-0 cap of 0.
  bool MayEnterSet(Slot s) const;
  // An account of `s` has its cap's worth in the set.
  bool AtSetCap(Slot s) const;
  // The owner account of `v` is at or under its guarantee, and is not `s`'s.
  bool Guaranteed(Slot v, Slot s) const;
  // Some owner account other than `s`'s is at or under a guarantee with
  // blocks in the set (a policy eviction might take one of them).
  bool GuaranteeAtStake(Slot s) const;
  // The coldest block in the set of the owner accounts above their guarantee
  // (`s`'s own counts as above), or nullptr.
  const HeapEntry* ColdestAboveGuarantee(Slot s) const;
  // `v` leaves the set for a quota: counted in its accounts.
  void CountEviction(Slot v);

 private:
  size_t middle_tiers_;
  bool on_ = false;
  std::vector<Account> accounts_;  // by dense index
  std::vector<uint32_t> free_;
  std::unordered_map<uint64_t, uint32_t> index_;
  std::vector<std::array<uint32_t, 2>> slot_accounts_;  // by slot
  std::vector<uint64_t> clients_;                       // by slot
  // Live blocks per client account id, counted in an account or not (a new
  // client account skips the pass over the slots when it has none).
  std::unordered_map<uint64_t, uint32_t> client_live_;
  std::unordered_map<uint64_t, size_t> held_;  // SetHeld, by account id (none: 0)
  size_t HeldOf(uint64_t id) const {
    const auto it = held_.find(id);
    return it == held_.end() ? 0 : it->second;
  }
};

}  // namespace cxltier::engine
