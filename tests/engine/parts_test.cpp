// The engine's parts on their own (TierTable, GroupTable, AccountTable): the
// invariants each keeps for the engine. The engine's behaviour with them is
// covered by engine_test's differential tests against the reference model.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/accounts.h"
#include "engine/hints.h"
#include "engine/tiers.h"

namespace cxltier::engine {
namespace {

TEST(TierTable, CountsMovesAndFindsTheFirstMiddleTierWithRoom) {
  TierTable t({2, 1});  // four tiers: 0, two middle ones, the last
  EXPECT_EQ(t.count(), 4u);
  EXPECT_EQ(t.last(), 3u);
  EXPECT_FALSE(t.IsMiddle(0));
  EXPECT_TRUE(t.IsMiddle(2));
  EXPECT_FALSE(t.IsMiddle(3));
  EXPECT_EQ(t.LowerCapacity(1), 2u);
  EXPECT_EQ(t.LowerCapacity(3), SIZE_MAX);

  EXPECT_EQ(t.FirstLowerWithRoom(), 1u);
  t.ranking(1).Set(10, 1.0, 1);
  t.ranking(1).Set(11, 2.0, 2);
  EXPECT_EQ(t.FirstLowerWithRoom(), 2u);
  EXPECT_FALSE(t.OverCapacity(1));
  t.ranking(1).Set(12, 0.5, 3);
  EXPECT_TRUE(t.OverCapacity(1));
  EXPECT_EQ(t.ranking(1).Top().slot, 12u);  // the coldest on top
  t.ranking(2).Set(13, 1.0, 4);
  EXPECT_EQ(t.FirstLowerWithRoom(), 3u);  // the last tier always has room

  t.Moved(Tier::kNone, TierAt(0));
  t.Moved(Tier::kNone, TierAt(0));
  t.Moved(TierAt(0), TierAt(2));
  EXPECT_EQ(t.blocks(0), 1u);
  EXPECT_EQ(t.blocks(2), 1u);
  t.StartMove(0, 1);
  EXPECT_EQ(t.out(0), 1u);
  EXPECT_EQ(t.in(1), 1u);
  t.EndMove(0, 1);
  EXPECT_EQ(t.out(0) + t.in(1), 0u);

  t.set_epoch(5);
  EXPECT_FALSE(t.NewEpoch(5));
  EXPECT_TRUE(t.NewEpoch(6));
  EXPECT_FALSE(t.NewEpoch(6));
}

TEST(GroupTable, AFreedGroupsQueuedJobAndReusedEntryAreStale) {
  GroupTable g;
  const uint32_t a = g.Create(/*id=*/100, /*owner=*/7);
  EXPECT_EQ(g.Find(100), &g[a]);
  EXPECT_EQ(g[a].owner, 7u);
  g.Queue(a);
  g.Queue(a);  // one entry per group
  const uint32_t serial = g[a].serial;
  g.Free(a);
  EXPECT_EQ(g.Find(100), nullptr);
  EXPECT_NE(g[a].serial, serial);  // its pending entries are stale
  // The entry is reused by the next group; the old queue entry stays stale.
  const uint32_t b = g.Create(200, 8);
  EXPECT_EQ(b, a);
  EXPECT_NE(g[b].serial, serial);
  g.Queue(b);
  ASSERT_TRUE(g.HasJobs());
  EXPECT_EQ(g.PopJob(), GroupTable::kStale);  // a's entry
  ASSERT_TRUE(g.HasJobs());
  EXPECT_EQ(g.PopJob(), b);
  EXPECT_FALSE(g.HasJobs());
  EXPECT_EQ(g[b].queued, 0u);
}

TEST(GroupTable, ThePoolServesDoneBeforeIdleAndDropsStaleEntries) {
  GroupTable g;
  g.Resize(8);
  const uint32_t idle = g.Create(1, 0), done = g.Create(2, 0);
  g[idle].hinted_out = g[done].hinted_out = true;
  std::vector<uint32_t> group1(8, 0);
  group1[3] = idle + 1;
  group1[4] = done + 1;
  group1[5] = done + 1;
  g.PoolPut(GroupTable::kIdlePool, 3, g[idle].serial);
  g.PoolPut(GroupTable::kDonePool, 4, g[done].serial);
  g.PoolPut(GroupTable::kDonePool, 5, g[done].serial);  // in front of 4: 4 leaves first
  auto of = [&](Slot s) { return group1[s]; };
  EXPECT_EQ(g.PoolBack(of), 4u);
  g.PoolRemove(4);
  EXPECT_EQ(g.PoolBack(of), 5u);
  // The done group is hinted again: its entry is stale and dropped.
  ++g[done].serial;
  EXPECT_EQ(g.PoolBack(of), 3u);
  // The idle group runs: stale too.
  g[idle].Activate();
  EXPECT_EQ(g.PoolBack(of), kNoSlot);
}

TEST(GroupTable, CountsTheSetByOwner) {
  GroupTable g;
  const uint32_t a = g.OwnerIndex(1000), b = g.OwnerIndex(2000);
  EXPECT_EQ(g.OwnerIndex(1000), a);
  g.EnterSet(a);
  g.EnterSet(a);
  g.EnterSet(b);
  g.LeaveSet(a);
  EXPECT_EQ(g.InSetOf(1000), 1u);
  EXPECT_EQ(g.InSetOf(2000), 1u);
}

TEST(AccountTable, AttachDetachCountAndFreeUnusedAccounts) {
  AccountTable t(/*middle_tiers=*/1);
  t.Resize(4);
  t.TurnOn();
  const uint64_t client = kClientAccount | 1;
  t.set_client(0, client);
  t.Attach(0, /*owner=*/5);
  t.Attach(1, 5);
  // The client has no account (no quota): counted live all the same.
  EXPECT_TRUE(t.ClientHasBlocks(client));
  EXPECT_FALSE(t.Has(client));
  const uint32_t owner = t.Index(5, false);
  ASSERT_NE(owner, AccountTable::kNoIndex);
  EXPECT_EQ(t[owner].live, 2u);
  EXPECT_EQ(t[owner].ranked_heat.size(), 1u);
  t.Detach(0);
  EXPECT_FALSE(t.ClientHasBlocks(client));
  t.Detach(1);
  EXPECT_FALSE(t.Has(5));  // no quota, no live block: freed
  // An account with a quota stays without blocks.
  const uint32_t q = t.Index(9, true);
  t[q].quota.cap[0] = 3;
  t.FreeIfUnused(q);
  EXPECT_TRUE(t.Has(9));
}

TEST(AccountTable, CapRoomIsTheLeastRoomOfTheBlocksAccounts) {
  AccountTable t(1);
  t.Resize(2);
  const uint64_t client = kClientAccount | 2;
  const uint32_t o = t.Index(1, true), c = t.Index(client, true);
  t[o].quota.cap[0] = 10;
  t[o].tier_blocks[0] = 4;
  t[o].in0 = 2;  // moves in flight count in tier 0
  t[c].quota.cap[0] = 5;
  t[c].tier_blocks[0] = 2;
  EXPECT_EQ(t.CapRoom(1, kNoAccount, 0), 4u);
  EXPECT_EQ(t.CapRoom(1, client, 0), 3u);
  EXPECT_EQ(t.CapRoom(1, client, 1), kNoCap);
  t[c].tier_blocks[0] = 9;  // over its cap: no room, not a wrap-around
  EXPECT_EQ(t.CapRoom(1, client, 0), 0u);
  EXPECT_EQ(t.CapRoom(77, kNoAccount, 0), kNoCap);  // no account: no cap
}

TEST(AccountTable, GuaranteesProtectOtherOwnersOnly) {
  AccountTable t(0);
  t.Resize(3);
  t.TurnOn();
  t.Attach(0, 1);
  t.Attach(1, 2);
  t.Attach(2, 2);
  const uint32_t one = t.Index(1, false), two = t.Index(2, false);
  t[one].quota.guarantee = 1;
  t[one].target[0] = 1;
  t[one].set_heat.Set(0, 5.0, 1);
  t[two].target[0] = 2;
  t[two].set_heat.Set(1, 1.0, 2);
  t[two].set_heat.Set(2, 9.0, 3);
  EXPECT_TRUE(t.Guaranteed(0, 1));   // owner 1 at its guarantee, s is owner 2's
  EXPECT_FALSE(t.Guaranteed(0, 0));  // its own block makes room for its own
  EXPECT_TRUE(t.GuaranteeAtStake(1));
  EXPECT_FALSE(t.GuaranteeAtStake(0));
  const HeapEntry* coldest = t.ColdestAboveGuarantee(1);
  ASSERT_NE(coldest, nullptr);
  EXPECT_EQ(coldest->slot, 1u);  // owner 2's coldest; owner 1's block is protected
  t.CountEviction(1);
  EXPECT_EQ(t[two].quota_evictions, 1u);
}

}  // namespace
}  // namespace cxltier::engine
