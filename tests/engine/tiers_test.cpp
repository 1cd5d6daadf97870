// More than two tiers (EngineOptions::lower_tier_budget_bytes) on hand-worked
// cases. The reference model covers them on random traces in engine_test.cpp
// (Differential and DifferentialHints run half their traces with 3 or 4 tiers).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"

namespace cxltier::engine {
namespace {

constexpr uint64_t kBlock = 4096;

BlockKey Key(uint64_t i) { return BlockKey::FromSequence(7, i); }

Engine ThreeTiers(size_t tier0, size_t tier1, Mode mode) {
  EngineOptions o;
  o.block_bytes = kBlock;
  o.tier0_budget_bytes = tier0 * kBlock;
  o.lower_tier_budget_bytes = {tier1 * kBlock};
  o.mode = mode;
  auto p = MakePolicy("lru");
  EXPECT_TRUE(p.ok());
  return Engine(o, std::move(*p));
}

std::vector<unsigned> TiersOf(const Engine& e, const std::vector<Slot>& slots) {
  std::vector<unsigned> out;
  for (Slot s : slots) out.push_back(TierIndex(e.state(s).tier));
  return out;
}

TEST(Tiers, TwoTiersUnlessMiddleBudgetsAreGiven) {
  EngineOptions o;
  o.block_bytes = kBlock;
  o.tier0_budget_bytes = 2 * kBlock;
  Engine two(o, std::move(*MakePolicy("lru")));
  EXPECT_EQ(two.tiers(), 2u);
  EXPECT_EQ(two.tier_capacity_blocks(0), 2u);
  EXPECT_EQ(two.tier_capacity_blocks(1), SIZE_MAX);
  Engine three = ThreeTiers(2, 3, Mode::kDemand);
  EXPECT_EQ(three.tiers(), 3u);
  EXPECT_EQ(three.tier_capacity_blocks(1), 3u);
  EXPECT_EQ(three.tier_capacity_blocks(2), SIZE_MAX);
}

// LRU, tier 0 of 2 blocks, tier 1 of 2, tier 2 the rest. Six new blocks
// touched in turn: each miss sends tier 0's least recent to tier 1, and
// tier 1's least recent on to tier 2. Then a touch of block 1 (in tier 2)
// brings it to tier 0 and pushes one block down each tier.
TEST(Tiers, DemandPlacesByRankAcrossThreeTiers) {
  Engine e = ThreeTiers(2, 2, Mode::kDemand);
  std::vector<Slot> s;
  for (uint64_t i = 1; i <= 6; ++i) {
    s.push_back(e.Admit(Key(i)));
    EXPECT_FALSE(e.Touch(s.back(), Touch{1.0, i, kNever}));
  }
  // Blocks 1..6: 5 and 6 in tier 0, 3 and 4 in tier 1, 1 and 2 in tier 2.
  EXPECT_EQ(TiersOf(e, s), (std::vector<unsigned>{2, 2, 1, 1, 0, 0}));
  EXPECT_EQ(e.counters().demotions, 6u);  // 1, 2, 3, 4 out of tier 0; 1, 2 out of tier 1
  EXPECT_EQ(e.counters().promotions, 0u);

  EXPECT_FALSE(e.Touch(s[0], Touch{1.0, 7, kNever}));  // block 1, found in tier 2
  EXPECT_EQ(TiersOf(e, s), (std::vector<unsigned>{0, 2, 2, 1, 1, 0}));
  EXPECT_EQ(e.counters().promotions, 1u);  // 1: tier 2 -> tier 0
  EXPECT_EQ(e.counters().demotions, 8u);   // 5: 0 -> 1, 3: 1 -> 2
  EXPECT_EQ(e.counters().tier_hits[2], 1u);
  EXPECT_EQ(e.counters().tier_hits[0], e.counters().hits);
  EXPECT_EQ(e.tier_blocks(TierAt(0)), 2u);
  EXPECT_EQ(e.tier_blocks(TierAt(1)), 2u);
  EXPECT_EQ(e.tier_blocks(TierAt(2)), 2u);

  EXPECT_TRUE(e.Touch(s[0], Touch{1.0, 8, kNever}));
  EXPECT_EQ(e.counters().tier_hits[0], 1u);
  EXPECT_EQ(e.counters().touches, 8u);
  // A block's first touch (no tier yet) counts in no tier.
  EXPECT_EQ(e.counters().tier_hits[0] + e.counters().tier_hits[1] + e.counters().tier_hits[2], 2u);
}

// Tick mode: admitted blocks fill tier 0, then tier 1, then the last tier. A
// promotion into a full tier 0 demotes a block straight to the tier its rank
// gives it (here tier 2: tier 1 holds a block ranked above it), one move.
TEST(Tiers, TickModeMovesBetweenAnyTwoTiers) {
  Engine e = ThreeTiers(1, 1, Mode::kTick);
  const Slot a = e.Admit(Key(1));
  const Slot b = e.Admit(Key(2));
  const Slot c = e.Admit(Key(3));
  EXPECT_EQ(TiersOf(e, {a, b, c}), (std::vector<unsigned>{0, 1, 2}));

  EXPECT_FALSE(e.Touch(c, Touch{1.0, 1, kNever}));  // c joins the set; a leaves tier 0
  const std::span<const Move> moves = e.Plan();
  ASSERT_EQ(moves.size(), 2u);
  // a and b were never touched: equal heat, equal touch order; a's lower slot
  // makes it the colder, so a goes below b, to tier 2.
  EXPECT_EQ(moves[0].slot, a);
  EXPECT_EQ(moves[0].from, TierAt(0));
  EXPECT_EQ(moves[0].to, TierAt(2));
  EXPECT_EQ(moves[1].slot, c);
  EXPECT_EQ(moves[1].from, TierAt(2));
  EXPECT_EQ(moves[1].to, TierAt(0));
  for (const Move& m : std::vector<Move>(moves.begin(), moves.end())) e.Complete(m, true);
  EXPECT_EQ(TiersOf(e, {a, b, c}), (std::vector<unsigned>{2, 1, 0}));
  EXPECT_EQ(e.rank(a), 2u);
  EXPECT_EQ(e.rank(b), 1u);

  // b joins the set; c, now the least recent, is ranked in tier 1, above a.
  EXPECT_FALSE(e.Touch(b, Touch{1.0, 2, kNever}));
  e.PlanAndApply();
  EXPECT_EQ(TiersOf(e, {a, b, c}), (std::vector<unsigned>{2, 0, 1}));
  EXPECT_EQ(e.counters().tier_hits[1], 1u);
  EXPECT_EQ(e.counters().tier_hits[2], 1u);
  EXPECT_EQ(e.counters().promotions, 2u);
  EXPECT_EQ(e.counters().demotions, 2u);
}

// A middle tier over its budget (blocks admitted where their pages already
// were) sends its coldest down, within the migration budget.
TEST(Tiers, AMiddleTierOverItsBudgetSendsItsColdestDown) {
  Engine e = ThreeTiers(1, 1, Mode::kTick);
  const Slot x = e.Admit(Key(1), TierAt(1));
  e.Touch(x, Touch{1.0, 1, kNever});  // x joins the set (tier 0 is empty)
  const Slot y = e.Admit(Key(2), TierAt(1));
  const Slot z = e.Admit(Key(3), TierAt(1));
  // y and z both ranked in tier 1 (budget 1): the colder, y (lower slot), goes to tier 2.
  EXPECT_EQ(e.rank(y), 2u);
  EXPECT_EQ(e.rank(z), 1u);
  e.PlanAndApply();
  EXPECT_EQ(TiersOf(e, {x, y, z}), (std::vector<unsigned>{0, 2, 1}));
}

}  // namespace
}  // namespace cxltier::engine
