// Quotas (Engine::SetQuota; docs/policies.md, "Quotas"): caps per tier, a
// guarantee, owner and client accounts. Hand-worked cases, then random traces
// checked against the invariants the quotas promise.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "engine/engine.h"

namespace cxltier::engine {
namespace {

constexpr uint64_t kBlock = 4096;
constexpr uint32_t kA = 1001, kB = 1002;

BlockKey Key(uint64_t seq, uint64_t i) { return BlockKey::FromSequence(seq, i); }

Engine Make(size_t tier0, Mode mode, std::vector<uint64_t> middle = {},
            const char* policy = "lru") {
  EngineOptions o;
  o.block_bytes = kBlock;
  o.tier0_budget_bytes = tier0 * kBlock;
  for (uint64_t& m : middle) m *= kBlock;
  o.lower_tier_budget_bytes = middle;
  o.mode = mode;
  auto p = MakePolicy(policy);
  EXPECT_TRUE(p.ok());
  return Engine(o, std::move(*p));
}

Quota Cap0(size_t blocks) {
  Quota q;
  q.cap[0] = blocks;
  return q;
}

AccountUsage Usage(const Engine& e, uint64_t account) {
  for (const AccountUsage& u : e.Accounts()) {
    if (u.account == account) return u;
  }
  ADD_FAILURE() << "no account " << account;
  return {};
}

unsigned TierOf(const Engine& e, Slot s) { return TierIndex(e.state(s).tier); }

// Touches each slot once, in order, at clocks from *now on.
void TouchAll(Engine& e, const std::vector<Slot>& slots, uint64_t* now) {
  for (Slot s : slots) e.Touch(s, Touch{1.0, ++*now, kNever});
}

std::vector<Slot> AdmitN(Engine& e, uint64_t seq, int n, uint32_t owner,
                         uint64_t client = kNoAccount) {
  std::vector<Slot> out;
  for (int i = 0; i < n; ++i) out.push_back(e.Admit(Key(seq, i), owner, client));
  return out;
}

// LRU, tier 0 of 4 blocks. B has two blocks in tier 0; A, capped at 2, touches
// three: its third miss takes A's own coldest out of tier 0, not B's (which
// plain LRU would pick: B's are the least recent).
TEST(Quota, AnOwnerAtItsCapLosesOnlyItsOwnPlacement) {
  for (const bool capped : {false, true}) {
    Engine e = Make(4, Mode::kDemand);
    if (capped) e.SetQuota(kA, Cap0(2));
    uint64_t now = 0;
    const std::vector<Slot> b = AdmitN(e, 2, 2, kB);
    const std::vector<Slot> a = AdmitN(e, 1, 4, kA);
    TouchAll(e, b, &now);
    TouchAll(e, a, &now);  // a0..a3: tier 0 has room for two more after b's
    if (!capped) {
      // Plain LRU: a2 and a3 push b0 and b1 out.
      EXPECT_EQ(TierOf(e, b[0]), 1u);
      EXPECT_EQ(TierOf(e, b[1]), 1u);
      continue;
    }
    EXPECT_EQ(TierOf(e, b[0]), 0u);
    EXPECT_EQ(TierOf(e, b[1]), 0u);
    EXPECT_EQ(TierOf(e, a[0]), 1u);  // A's coldest, twice
    EXPECT_EQ(TierOf(e, a[1]), 1u);
    EXPECT_EQ(TierOf(e, a[2]), 0u);
    EXPECT_EQ(TierOf(e, a[3]), 0u);
    EXPECT_EQ(e.counters().quota_evictions, 2u);
    EXPECT_EQ(e.counters().evictions, 0u);  // the policy evicted nothing itself
    const AccountUsage ua = Usage(e, kA), ub = Usage(e, kB);
    EXPECT_EQ(ua.in_set, 2u);
    EXPECT_EQ(ua.tier_blocks[0], 2u);
    EXPECT_EQ(ua.tier_blocks[1], 2u);
    EXPECT_EQ(ua.quota_evictions, 2u);
    EXPECT_EQ(ub.tier_blocks[0], 2u);
    EXPECT_EQ(ub.quota_evictions, 0u);
    EXPECT_EQ(ua.quota.cap[0], 2u);
  }
}

// Tier 0 of 4. A touched two blocks long ago; B then cycles through six. Plain
// LRU gives A nothing; with a guarantee of 2, B's misses take B's own coldest
// once A is down to its guarantee.
TEST(Quota, AGuaranteeKeepsAnOwnersShareUnderContention) {
  for (const bool guaranteed : {false, true}) {
    Engine e = Make(4, Mode::kDemand);
    if (guaranteed) {
      Quota q;
      q.guarantee = 2;
      e.SetQuota(kA, q);
    }
    uint64_t now = 0;
    const std::vector<Slot> a = AdmitN(e, 1, 3, kA);
    const std::vector<Slot> b = AdmitN(e, 2, 6, kB);
    TouchAll(e, a, &now);
    for (int round = 0; round < 3; ++round) TouchAll(e, b, &now);
    if (guaranteed) {
      const AccountUsage ua = Usage(e, kA);
      EXPECT_EQ(ua.in_set, 2u);  // its third block was the policy's to take
      EXPECT_EQ(ua.tier_blocks[0], 2u);
      EXPECT_EQ(TierOf(e, a[0]), 1u);
      EXPECT_EQ(Usage(e, kB).tier_blocks[0], 2u);
      EXPECT_GT(e.counters().quota_evictions, 0u);
    } else {
      EXPECT_EQ(e.Accounts().size(), 0u);  // no quota: no accounts kept
      EXPECT_EQ(e.tier_blocks(Tier::kFast), 4u);
      for (Slot s : a) EXPECT_EQ(TierOf(e, s), 1u);
    }
  }
}

TEST(Quota, ACapOfZeroKeepsAnOwnerOutOfTierZero) {
  Engine e = Make(4, Mode::kDemand);
  e.SetQuota(kA, Cap0(0));
  uint64_t now = 0;
  const std::vector<Slot> a = AdmitN(e, 1, 3, kA);
  for (int round = 0; round < 2; ++round) TouchAll(e, a, &now);
  for (Slot s : a) EXPECT_EQ(TierOf(e, s), 1u);
  EXPECT_EQ(e.counters().hits, 0u);
  EXPECT_EQ(e.counters().tier_hits[1], 3u);
  // B has tier 0 to itself.
  const std::vector<Slot> b = AdmitN(e, 2, 4, kB);
  TouchAll(e, b, &now);
  EXPECT_EQ(Usage(e, kB).tier_blocks[0], 4u);
}

// A lowered cap takes effect at once: the owner's coldest leave (demand:
// moved now). Removing the quota lets A grow again.
TEST(Quota, LoweringACapDemotesTheColdestAtOnce) {
  Engine e = Make(4, Mode::kDemand);
  uint64_t now = 0;
  const std::vector<Slot> a = AdmitN(e, 1, 4, kA);
  TouchAll(e, a, &now);
  e.SetQuota(kA, Cap0(1));
  EXPECT_EQ(TierOf(e, a[0]), 1u);
  EXPECT_EQ(TierOf(e, a[1]), 1u);
  EXPECT_EQ(TierOf(e, a[2]), 1u);
  EXPECT_EQ(TierOf(e, a[3]), 0u);
  EXPECT_EQ(e.counters().quota_evictions, 3u);
  e.SetQuota(kA, Quota{});
  TouchAll(e, a, &now);
  EXPECT_EQ(e.tier_blocks(Tier::kFast), 4u);
}

// Tick mode: Admit places in tier 0 only below the cap; a lowered cap makes
// Plan() demote the excess (the set's and the blocks outside it) and promote
// nothing of A's past the cap.
TEST(Quota, TickModeKeepsTierZeroWithinTheCap) {
  Engine e = Make(6, Mode::kTick);
  e.SetQuota(kA, Cap0(2));
  const std::vector<Slot> a = AdmitN(e, 1, 4, kA);
  EXPECT_EQ(Usage(e, kA).tier_blocks[0], 2u);  // placed by Admit: two in tier 0, two below
  uint64_t now = 0;
  TouchAll(e, a, &now);
  e.PlanAndApply();
  EXPECT_EQ(Usage(e, kA).tier_blocks[0], 2u);
  EXPECT_EQ(Usage(e, kA).in_set, 2u);
  EXPECT_EQ(TierOf(e, a[2]), 0u);  // the two most recent
  EXPECT_EQ(TierOf(e, a[3]), 0u);
  e.SetQuota(kA, Cap0(1));
  e.PlanAndApply();
  EXPECT_EQ(Usage(e, kA).tier_blocks[0], 1u);
  EXPECT_EQ(TierOf(e, a[3]), 0u);
  // Blocks admitted where their pages already are may start over the cap;
  // the next plan demotes them.
  const Slot placed = e.Admit(Key(1, 9), Tier::kFast, kA);
  EXPECT_EQ(Usage(e, kA).tier_blocks[0], 2u);
  e.PlanAndApply();
  EXPECT_EQ(Usage(e, kA).tier_blocks[0], 1u);
  EXPECT_EQ(TierOf(e, placed), 1u);
}

// Three tiers (tier 0 of 2, tier 1 of 4): A capped at 1 block in tier 1 sends
// the rest of its demoted blocks on to tier 2, leaving tier 1's room to B.
TEST(Quota, ACapOnAMiddleTierSendsTheRestFurtherDown) {
  Engine e = Make(2, Mode::kDemand, {4});
  Quota q;
  q.cap[1] = 1;
  e.SetQuota(kA, q);
  uint64_t now = 0;
  const std::vector<Slot> a = AdmitN(e, 1, 5, kA);
  TouchAll(e, a, &now);
  const AccountUsage ua = Usage(e, kA);
  EXPECT_EQ(ua.tier_blocks[0], 2u);
  EXPECT_EQ(ua.tier_blocks[1], 1u);
  EXPECT_EQ(ua.tier_blocks[2], 2u);
  EXPECT_EQ(TierOf(e, a[2]), 1u);  // the hottest of those out of tier 0
  // Lowered to 0: the one in tier 1 moves down too.
  q.cap[1] = 0;
  e.SetQuota(kA, q);
  EXPECT_EQ(Usage(e, kA).tier_blocks[1], 0u);
  EXPECT_EQ(Usage(e, kA).tier_blocks[2], 3u);
}

// A client account caps one client of an owner; the owner's other client is
// not held back by it.
TEST(Quota, AClientCapLimitsThatClientOnly) {
  Engine e = Make(6, Mode::kDemand);
  const uint64_t x = kClientAccount | 7, y = kClientAccount | 8;
  e.SetQuota(x, Cap0(1));
  uint64_t now = 0;
  const std::vector<Slot> bx = AdmitN(e, 1, 3, kA, x);
  const std::vector<Slot> by = AdmitN(e, 2, 3, kA, y);
  TouchAll(e, bx, &now);
  TouchAll(e, by, &now);
  EXPECT_EQ(Usage(e, x).tier_blocks[0], 1u);
  EXPECT_EQ(Usage(e, kA).tier_blocks[0], 4u);  // x's one and y's three
  for (Slot s : by) EXPECT_EQ(TierOf(e, s), 0u);
  // A client account with no quota is not kept: y has none.
  for (const AccountUsage& u : e.Accounts()) EXPECT_NE(u.account, y);
  // Its blocks gone and its quota removed, the account is forgotten.
  for (Slot s : bx) e.Release(s);
  e.SetQuota(x, Quota{});
  for (const AccountUsage& u : e.Accounts()) EXPECT_NE(u.account, x);
}

// Random traces: three owners with caps, guarantees and clients changing on
// the way, demand and tick, LRU and adaptive. After every step the accounts
// agree with a recount of the blocks; no capped account holds more than its
// cap in the set (or, once a tick's moves are done, in tier 0); an owner at
// or under its guarantee loses no set block to another owner's touch.
TEST(Quota, RandomTracesKeepEveryCapAndGuarantee) {
  const uint32_t owners[] = {11, 12, 13};
  uint64_t guarantee_checks = 0, quota_evictions = 0;
  uint64_t held_checks = 0;  // tier-0 gains of accounts with held pages
  for (const Mode mode : {Mode::kDemand, Mode::kTick}) {
    for (const char* policy : {"lru", "adaptive", "ema:0.05"}) {
      for (int trace = 0; trace < 12; ++trace) {
        SCOPED_TRACE(std::string(policy) + (mode == Mode::kTick ? " tick " : " demand ") +
                     std::to_string(trace));
        std::mt19937_64 rng(1000 + trace);
        const bool three = trace % 2 == 1;
        Engine e =
            Make(8, mode, three ? std::vector<uint64_t>{6} : std::vector<uint64_t>{}, policy);
        std::map<uint64_t, Quota> quotas;
        auto set_random_quota = [&] {
          const uint32_t o = owners[rng() % 3];
          const uint64_t id = rng() % 4 == 0 ? (kClientAccount | (2 * o + rng() % 2)) : o;
          Quota q;
          if (rng() % 3 != 0) q.cap[0] = rng() % 6;
          if (three && rng() % 2 == 0) q.cap[1] = rng() % 4;
          if (!(id & kClientAccount) && rng() % 2 == 0) q.guarantee = 1 + rng() % 2;
          if (rng() % 5 == 0) q = Quota{};
          quotas[id] = q;
          e.SetQuota(id, q);
        };
        set_random_quota();
        std::vector<Slot> live;
        std::map<Slot, uint64_t> client_of;  // each live slot's client account
        // Tick mode: released tier-0 blocks' pages held there (the daemon's
        // ReleasedPages), by owner and client, until "moved down" at random.
        std::vector<std::pair<uint64_t, uint64_t>> held_pages;
        std::map<uint64_t, size_t> held;  // by account
        auto tell_held = [&] {
          for (auto& [id, n] : held) n = 0;
          for (const auto& [o, c] : held_pages) {
            ++held[o];
            if (c != kNoAccount) ++held[c];
          }
          e.set_held_blocks(held_pages.size());
          for (const auto& [id, n] : held) e.set_account_held(id, n);
        };
        uint64_t now = 0, next_key = 0;
        for (int step = 0; step < 600; ++step) {
          const unsigned r = rng() % 100;
          // Each account's tier-0 blocks before the step: one that gains
          // some must have had room for them beside its held pages.
          std::map<uint64_t, size_t> blocks0_before;
          for (const AccountUsage& u : e.Accounts()) blocks0_before[u.account] = u.tier_blocks[0];
          if (r < 3) {
            set_random_quota();
          } else if (mode == Mode::kTick && r < 6) {
            if (!held_pages.empty()) {
              held_pages.erase(held_pages.begin() + static_cast<long>(rng() % held_pages.size()));
              tell_held();
            }
          } else if (r < 15 || live.empty()) {
            const uint32_t o = owners[rng() % 3];
            // Each client is one owner's, as the daemon's are.
            const uint64_t c = rng() % 2 == 0 ? (kClientAccount | (2 * o + rng() % 2)) : kNoAccount;
            live.push_back(e.Admit(Key(o, next_key++), o, c));
            client_of[live.back()] = c;
          } else if (r < 20) {
            const size_t i = rng() % live.size();
            if (mode == Mode::kTick && e.state(live[i]).tier == Tier::kFast && rng() % 2) {
              held_pages.emplace_back(e.owner(live[i]), client_of.at(live[i]));
              tell_held();
            }
            e.Release(live[i]);
            live[i] = live.back();
            live.pop_back();
          } else {
            // Skewed: low indexes are hot.
            const size_t i = std::min<size_t>(live.size() - 1, (rng() % 8) * (rng() % 8));
            const Slot s = live[i];
            std::map<uint64_t, size_t> before;
            for (const AccountUsage& u : e.Accounts()) before[u.account] = u.in_set;
            e.Touch(s, Touch{1.0 + static_cast<double>(rng() % 4), ++now, kNever});
            for (const AccountUsage& u : e.Accounts()) {
              if (u.account == e.owner(s) || (u.account & kClientAccount)) continue;
              if (before.count(u.account) && before[u.account] <= u.quota.guarantee) {
                guarantee_checks += before[u.account] > 0;
                EXPECT_GE(u.in_set, before[u.account]) << "owner " << u.account;
              }
            }
          }
          if (mode == Mode::kTick && step % 5 == 0) e.PlanAndApply();
          // A recount of the owners' and clients' blocks from the blocks themselves.
          std::map<uint64_t, AccountUsage> count;
          for (Slot s : live) {
            for (const uint64_t id : {uint64_t{e.owner(s)}, client_of.at(s)}) {
              if (id == kNoAccount) continue;
              AccountUsage& c = count[id];
              if (e.state(s).tier != Tier::kNone) ++c.tier_blocks[TierIndex(e.state(s).tier)];
              c.in_set += (e.state(s).flags & kFlagInTarget) != 0;
            }
          }
          for (const AccountUsage& u : e.Accounts()) {
            const auto was = blocks0_before.find(u.account);
            if (was != blocks0_before.end() && u.tier_blocks[0] > was->second &&
                u.quota.cap[0] != kNoCap) {
              held_checks += held[u.account] > 0;
              EXPECT_LE(u.tier_blocks[0] + held[u.account], u.quota.cap[0])
                  << "account " << u.account << " gained tier-0 blocks past its cap with "
                  << held[u.account] << " held, step " << step;
            }
            EXPECT_LE(u.in_set, u.quota.cap[0]) << "account " << u.account << " step " << step;
            if (mode == Mode::kDemand) {
              EXPECT_LE(u.tier_blocks[0], u.quota.cap[0]);
            }
            const AccountUsage& c = count[u.account];
            ASSERT_EQ(u.in_set, c.in_set) << "account " << u.account << " step " << step;
            for (unsigned k = 0; k < e.tiers(); ++k) {
              ASSERT_EQ(u.tier_blocks[k], c.tier_blocks[k]) << "tier " << k << " step " << step;
            }
          }
        }
        quota_evictions += e.counters().quota_evictions;
        if (mode == Mode::kTick) {
          e.PlanAndApply();
          e.PlanAndApply();
          for (const AccountUsage& u : e.Accounts()) {
            EXPECT_LE(u.tier_blocks[0], u.quota.cap[0]) << "account " << u.account;
          }
        }
      }
    }
  }
  // The traces did put guarantees and caps to work.
  EXPECT_GT(guarantee_checks, 1000u);
  EXPECT_GT(quota_evictions, 1000u);
  std::printf("%llu tier-0 gains of capped accounts with held pages checked\n",
              static_cast<unsigned long long>(held_checks));
  EXPECT_GT(held_checks, 20u);
}

// Keeping accounts (before any quota) changes no decision: the same trace
// gives the same events with and without them.
TEST(Quota, KeepingAccountsChangesNothing) {
  for (const Mode mode : {Mode::kDemand, Mode::kTick}) {
    std::vector<EngineEvent> plain, tracked;
    Engine e1 = Make(6, mode, {5}, "adaptive"), e2 = Make(6, mode, {5}, "adaptive");
    e1.set_event_log(&plain);
    e2.set_event_log(&tracked);
    e2.TrackAccounts();
    std::mt19937_64 rng(7);
    std::vector<Slot> s1, s2;
    for (int step = 0; step < 2000; ++step) {
      if (s1.size() < 30 && rng() % 4 == 0) {
        const uint32_t o = 1 + rng() % 3;
        s1.push_back(e1.Admit(Key(o, step), o));
        s2.push_back(e2.Admit(Key(o, step), o));
        continue;
      }
      if (s1.empty()) continue;
      const size_t i = std::min<size_t>(s1.size() - 1, (rng() % 6) * (rng() % 6));
      const Touch t{static_cast<double>(rng() % 5), static_cast<uint64_t>(step), kNever};
      e1.Touch(s1[i], t);
      e2.Touch(s2[i], t);
      if (mode == Mode::kTick && step % 7 == 0) {
        e1.PlanAndApply();
        e2.PlanAndApply();
      }
    }
    EXPECT_EQ(plain, tracked);
    EXPECT_FALSE(e2.Accounts().empty());
    EXPECT_TRUE(e1.Accounts().empty());
  }
}

// CapRoom (copy mode's admissions): what tier 0 may still take of an owner
// and its client account, tier 0 counting the moves in flight; kNoCap where
// neither is capped, for the last tier, and before any quota.
TEST(Quota, CapRoomIsWhatTheTightestAccountLeaves) {
  Engine e = Make(16, Mode::kTick);
  const uint64_t client = kClientAccount | 5;
  EXPECT_EQ(e.CapRoom(kA, client, 0), kNoCap);  // quotas off
  e.SetQuota(kA, Cap0(3));
  e.SetQuota(client, Cap0(2));
  EXPECT_EQ(e.CapRoom(kA, kNoAccount, 0), 3u);
  EXPECT_EQ(e.CapRoom(kA, client, 0), 2u);
  EXPECT_EQ(e.CapRoom(kB, kNoAccount, 0), kNoCap);
  EXPECT_EQ(e.CapRoom(kA, client, 1), kNoCap);  // the last tier is never capped
  e.Admit(Key(1, 0), Tier::kFast, kA, client);
  e.Admit(Key(1, 1), Tier::kFast, kA);
  EXPECT_EQ(e.CapRoom(kA, kNoAccount, 0), 1u);
  EXPECT_EQ(e.CapRoom(kA, client, 0), 1u);
  e.Admit(Key(1, 2), Tier::kSlow, kA, client);  // below tier 0: takes none of its room
  EXPECT_EQ(e.CapRoom(kA, client, 0), 1u);
  e.Admit(Key(1, 3), Tier::kFast, kA, client);
  EXPECT_EQ(e.CapRoom(kA, client, 0), 0u);
  // Over the cap (a cap lowered): no room, not a wrap-around.
  e.SetQuota(kA, Cap0(1));
  EXPECT_EQ(e.CapRoom(kA, kNoAccount, 0), 0u);
  // Demotions planned count as done (tier 0's blocks once the moves land):
  // the plan takes all three out (none is in the set), which leaves room for one.
  size_t out = 0;
  for (const Move& m : e.Plan()) out += m.from == Tier::kFast;
  ASSERT_EQ(out, 3u);
  EXPECT_EQ(e.CapRoom(kA, kNoAccount, 0), 1u);
}

}  // namespace
}  // namespace cxltier::engine
