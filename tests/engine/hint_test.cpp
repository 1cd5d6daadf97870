// Scheduler hints (Engine::SetGroup, Engine::Hint) on hand-worked cases.
// The reference model covers them on random traces in engine_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/engine.h"

namespace cxltier::engine {
namespace {

constexpr uint64_t kBlock = 4096;

BlockKey Key(uint64_t seq, uint64_t i) { return BlockKey::FromSequence(seq, i); }

std::unique_ptr<Policy> Make(const std::string& name) {
  auto p = MakePolicy(name);
  EXPECT_TRUE(p.ok()) << p.status().message;
  return p.ok() ? std::move(*p) : nullptr;
}

Engine MakeEngine(const std::string& policy, size_t capacity, Mode mode = Mode::kDemand) {
  EngineOptions o;
  o.block_bytes = kBlock;
  o.tier0_budget_bytes = capacity * kBlock;
  o.mode = mode;
  return Engine(o, Make(policy));
}

// Admits (seq, i) as `owner`'s, in `group`, and touches it `touches` times at `now`.
Slot Block(Engine& e, uint64_t seq, uint64_t i, GroupId group, int touches, uint64_t now,
           uint32_t owner = 0) {
  const Slot s = e.Admit(Key(seq, i), owner);
  EXPECT_TRUE(e.SetGroup(s, group));
  for (int k = 0; k < touches; ++k) e.Touch(s, Touch{1.0, now, kNever});
  return s;
}

Tier TierOf(const Engine& e, Slot s) { return e.state(s).tier; }

TEST(Hints, IdleBlocksLeaveBeforeThePolicysVictimColdestFirst) {
  Engine e = MakeEngine("lfu", 4);
  const Slot b1 = Block(e, 2, 1, 2, 1, 1);  // LFU's own victim: count 1, oldest
  const Slot b2 = Block(e, 2, 2, 2, 1, 2);
  const Slot a1 = Block(e, 1, 1, 1, 3, 3);
  const Slot a2 = Block(e, 1, 2, 1, 2, 4);  // the coldest of group 1
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 5));
  EXPECT_EQ(e.counters().hints, 1u);
  // Nothing moves until room is wanted.
  EXPECT_EQ(TierOf(e, a2), Tier::kFast);
  const Slot c = Block(e, 3, 1, kNoGroup, 1, 6);
  EXPECT_EQ(TierOf(e, a2), Tier::kSlow);
  EXPECT_EQ(TierOf(e, a1), Tier::kFast);
  EXPECT_EQ(TierOf(e, b1), Tier::kFast);
  EXPECT_EQ(TierOf(e, b2), Tier::kFast);
  EXPECT_EQ(TierOf(e, c), Tier::kFast);
  EXPECT_EQ(e.counters().hint_displaced, 1u);
  EXPECT_EQ(e.counters().evictions, 0u);
  // Then the rest of the idle group, then the policy again.
  Block(e, 3, 2, kNoGroup, 1, 7);
  EXPECT_EQ(TierOf(e, a1), Tier::kSlow);
  Block(e, 3, 3, kNoGroup, 1, 8);
  EXPECT_EQ(TierOf(e, b1), Tier::kSlow);
  EXPECT_EQ(e.counters().hint_displaced, 2u);
  EXPECT_EQ(e.counters().evictions, 1u);
}

TEST(Hints, ATouchEndsIdleAndDoneLeavesBeforeIdle) {
  Engine e = MakeEngine("lru", 4);
  const Slot a1 = Block(e, 1, 1, 1, 1, 1);
  const Slot b1 = Block(e, 2, 1, 2, 1, 2);
  const Slot b2 = Block(e, 2, 2, 2, 1, 3);
  const Slot x = Block(e, 3, 1, kNoGroup, 1, 4);
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 5));
  ASSERT_TRUE(e.Hint(2, HintKind::kDone, 5));
  Block(e, 4, 1, kNoGroup, 1, 6);  // done first: b1 (the colder of group 2)
  EXPECT_EQ(TierOf(e, b1), Tier::kSlow);
  EXPECT_EQ(TierOf(e, a1), Tier::kFast);
  e.Touch(b2, Touch{1.0, 7, kNever});  // group 2 runs again: no longer first to leave
  Block(e, 4, 2, kNoGroup, 1, 8);      // idle group 1 next
  EXPECT_EQ(TierOf(e, a1), Tier::kSlow);
  Block(e, 4, 3, kNoGroup, 1, 9);  // then LRU's own victim: x
  EXPECT_EQ(TierOf(e, x), Tier::kSlow);
  EXPECT_EQ(TierOf(e, b2), Tier::kFast);
}

TEST(Hints, SoonPlacesTheHottestBackUpToItsWorkingSet) {
  Engine e = MakeEngine("lfu", 4);
  std::vector<Slot> a;
  for (int i = 0; i < 4; ++i) a.push_back(Block(e, 1, i, 1, 4 - i, 1 + i));  // heat 4, 3, 2, 1
  const Slot cold = Block(e, 1, 9, 1, 0, 5);  // never touched: never placed ahead
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 10));
  std::vector<Slot> x;
  for (int i = 0; i < 4; ++i) x.push_back(Block(e, 2, i, kNoGroup, 1, 11 + i));
  for (Slot s : a) ASSERT_EQ(TierOf(e, s), Tier::kSlow);
  EXPECT_EQ(e.counters().hint_displaced, 4u);

  // A working set of 4; the pool is empty and every set block is owner 0's,
  // so the policy's victims make room.
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, 20));
  EXPECT_EQ(e.counters().hint_prefetched, 4u);
  for (Slot s : a) EXPECT_EQ(TierOf(e, s), Tier::kFast);
  for (Slot s : x) EXPECT_EQ(TierOf(e, s), Tier::kSlow);
  EXPECT_NE(TierOf(e, cold), Tier::kFast);
  EXPECT_TRUE(e.Touch(a[0], Touch{1.0, 21, kNever}));
  EXPECT_EQ(e.counters().hint_prefetch_hits, 1u);
  // A second soon finds the working set in place: nothing more.
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, 22));
  EXPECT_EQ(e.counters().hint_prefetched, 4u);
}

TEST(Hints, SoonPlacesOnlyAsManyAsTheGroupHadInTheSet) {
  Engine e = MakeEngine("lru", 2);
  std::vector<Slot> a;
  for (int i = 0; i < 4; ++i) a.push_back(Block(e, 1, i, 1, 1, 1 + i));  // 2 left in the set
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 5));
  Block(e, 2, 0, kNoGroup, 1, 6);
  Block(e, 2, 1, kNoGroup, 1, 7);
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, 8));
  EXPECT_EQ(e.counters().hint_prefetched, 2u);
  // LRU's heat is recency: the two touched last.
  EXPECT_EQ(TierOf(e, a[3]), Tier::kFast);
  EXPECT_EQ(TierOf(e, a[2]), Tier::kFast);
  EXPECT_EQ(TierOf(e, a[1]), Tier::kSlow);
}

TEST(Hints, SoonNeverDisplacesAnotherOwnersBlock) {
  Engine e = MakeEngine("lru", 2);
  const Slot a0 = Block(e, 1, 0, 1, 2, 1, /*owner=*/5);
  const Slot a1 = Block(e, 1, 1, 1, 1, 2, /*owner=*/5);
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 3));
  const Slot y0 = Block(e, 2, 0, 2, 1, 4, /*owner=*/6);
  const Slot y1 = Block(e, 2, 1, 2, 1, 5, /*owner=*/6);
  ASSERT_EQ(TierOf(e, a0), Tier::kSlow);
  ASSERT_EQ(TierOf(e, a1), Tier::kSlow);
  // Owner 6's blocks fill the set: owner 5's soon waits.
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, 6));
  EXPECT_EQ(e.counters().hint_prefetched, 0u);
  EXPECT_EQ(TierOf(e, y0), Tier::kFast);
  EXPECT_EQ(TierOf(e, y1), Tier::kFast);
  // Room appears: a release, then owner 6's idle hint.
  e.Release(y0);
  EXPECT_EQ(e.counters().hint_prefetched, 1u);
  EXPECT_EQ(TierOf(e, a1), Tier::kFast);  // LRU: the one touched last is the hotter
  ASSERT_TRUE(e.Hint(2, HintKind::kIdle, 7));
  EXPECT_EQ(e.counters().hint_prefetched, 2u);
  EXPECT_EQ(TierOf(e, a0), Tier::kFast);
  EXPECT_EQ(TierOf(e, y1), Tier::kSlow);
}

TEST(Hints, AGroupHasOneOwnerAndUnknownGroupsAreRefused) {
  Engine e = MakeEngine("lru", 4);
  const Slot a = e.Admit(Key(1, 0), 5);
  const Slot b = e.Admit(Key(1, 1), 6);
  EXPECT_TRUE(e.SetGroup(a, 9));
  EXPECT_FALSE(e.SetGroup(b, 9));
  EXPECT_EQ(e.group(a), 9u);
  EXPECT_EQ(e.group(b), kNoGroup);
  EXPECT_FALSE(e.Hint(10, HintKind::kIdle, 1));
  EXPECT_EQ(e.counters().hints, 0u);
  // A block moves between groups; the last one out ends its group.
  EXPECT_TRUE(e.SetGroup(a, 11));
  EXPECT_FALSE(e.Hint(9, HintKind::kSoon, 1));
  EXPECT_TRUE(e.Hint(11, HintKind::kSoon, 1));
  e.Release(a);
  EXPECT_FALSE(e.Hint(11, HintKind::kIdle, 2));
  EXPECT_TRUE(e.SetGroup(b, 9));  // group 9 is gone: b may found it
}

TEST(Hints, APauseDoesNotAgeTheBlocksASoonPlaces) {
  Engine e = MakeEngine("ema:0.5", 1);
  const Slot a = Block(e, 1, 0, 1, 1, 10);
  const double score = e.state(a).score;
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 12));
  Block(e, 2, 0, kNoGroup, 1, 13);  // takes a's room
  ASSERT_EQ(TierOf(e, a), Tier::kSlow);
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, 100));
  ASSERT_EQ(TierOf(e, a), Tier::kFast);
  // Idle from 12 to 100: its touch time moves from 10 to 98, so its next touch
  // decays the score by two steps, as if the pause had not been.
  EXPECT_EQ(e.state(a).touch_time, 98u);
  e.Touch(a, Touch{0.0, 100, kNever});
  EXPECT_DOUBLE_EQ(e.state(a).score, score * 0.25);
  EXPECT_EQ(Resumed(10, 88, 100), 98u);
  EXPECT_EQ(Resumed(10, 1000, 100), 100u);  // never past now
  EXPECT_EQ(Resumed(200, 50, 100), 200u);   // a time ahead stays
  EXPECT_EQ(Resumed(~uint64_t{0} - 1, 5, ~uint64_t{0}), ~uint64_t{0});
}

TEST(Hints, MinIgnoresThem) {
  Engine e = MakeEngine("min", 2);
  const Slot a = e.Admit(Key(1, 0));
  ASSERT_TRUE(e.SetGroup(a, 1));
  e.Touch(a, Touch{1.0, 1, 5});
  const Slot c = e.Admit(Key(3, 0));
  e.Touch(c, Touch{1.0, 1, kNever});
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 2));
  const Slot b = e.Admit(Key(2, 0));
  e.Touch(b, Touch{1.0, 3, 4});  // MIN keeps a (used at 5): c goes, not the idle a
  EXPECT_EQ(TierOf(e, a), Tier::kFast);
  EXPECT_EQ(TierOf(e, c), Tier::kSlow);
  EXPECT_EQ(e.counters().hint_displaced, 0u);
}

TEST(Hints, TickModePlansThePlacedBlocksWithinTheBudget) {
  EngineOptions o;
  o.block_bytes = kBlock;
  o.tier0_budget_bytes = 2 * kBlock;
  o.mode = Mode::kTick;
  o.migrate_bytes_per_tick = 2 * kBlock;  // one promotion and its demotion per plan
  Engine e(o, Make("lru"));
  const Slot a0 = Block(e, 1, 0, 1, 1, 1);
  const Slot a1 = Block(e, 1, 1, 1, 1, 2);
  ASSERT_EQ(TierOf(e, a0), Tier::kFast);  // admitted while tier 0 had room
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 3));
  const Slot x0 = Block(e, 2, 0, kNoGroup, 1, 4);
  const Slot x1 = Block(e, 2, 1, kNoGroup, 1, 5);
  while (e.PlanAndApply() > 0) {
  }
  ASSERT_EQ(TierOf(e, x0), Tier::kFast);
  ASSERT_EQ(TierOf(e, x1), Tier::kFast);
  ASSERT_EQ(TierOf(e, a0), Tier::kSlow);
  EXPECT_EQ(e.counters().hint_displaced, 2u);
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, 6));
  EXPECT_EQ(e.counters().hint_prefetched, 2u);
  EXPECT_EQ(TierOf(e, a0), Tier::kSlow);  // placed in the set; moved by the planner
  EXPECT_EQ(e.PlanAndApply(), 2u);        // the budget: one pair
  EXPECT_EQ(e.PlanAndApply(), 2u);
  EXPECT_EQ(TierOf(e, a0), Tier::kFast);
  EXPECT_EQ(TierOf(e, a1), Tier::kFast);
  EXPECT_EQ(e.tier_blocks(Tier::kFast), 2u);
}

// ---- what a hint costs (docs/policies.md, "What a hint costs") ----

// Tick mode with hints' work in slices of `slice` units, `tick` per Plan().
Engine SlicedEngine(const std::string& policy, size_t capacity, size_t slice, size_t tick) {
  EngineOptions o;
  o.block_bytes = kBlock;
  o.tier0_budget_bytes = capacity * kBlock;
  o.mode = Mode::kTick;
  o.hint_slice_units = slice;
  o.hint_tick_units = tick;
  return Engine(o, Make(policy));
}

// `n` blocks of sequence `seq` in `group`, each touched once, in order; then
// plans until nothing moves.
std::vector<Slot> Fill(Engine& e, uint64_t seq, size_t n, GroupId group, uint64_t now) {
  std::vector<Slot> out;
  for (size_t i = 0; i < n; ++i) out.push_back(Block(e, seq, i, group, 1, now + i));
  while (e.PlanAndApply() > 0) {
  }
  return out;
}

size_t InFast(const Engine& e, const std::vector<Slot>& slots) {
  size_t n = 0;
  for (Slot s : slots) n += TierOf(e, s) == Tier::kFast;
  return n;
}

// An idle hint on a group of 10,000 blocks, 1,000 of them in tier 0, with
// slices of 64 units and 512 per tick: the call does at most a slice, the
// rest goes on at the ticks, at most 512 units each; once done, the hint
// has the effect it has at once without slices.
TEST(HintCost, AnIdleHintOnALargeGroupIsDoneInSlicesAtTheTicks) {
  constexpr size_t kBig = 10000, kCap = 1000;
  Engine sliced = SlicedEngine("lru", kCap, 64, 512);
  Engine whole = SlicedEngine("lru", kCap, 0, 0);
  std::vector<Slot> a = Fill(sliced, 1, kBig, 1, 1);
  std::vector<Slot> b = Fill(whole, 1, kBig, 1, 1);
  ASSERT_EQ(InFast(sliced, a), kCap);
  ASSERT_EQ(InFast(whole, b), kCap);

  uint64_t work = sliced.counters().hint_work;
  ASSERT_TRUE(sliced.Hint(1, HintKind::kIdle, 20000));
  EXPECT_LE(sliced.counters().hint_work - work, 64u);
  EXPECT_EQ(sliced.counters().hint_deferred, 1u);
  EXPECT_TRUE(sliced.HintWorkPending());
  ASSERT_TRUE(whole.Hint(1, HintKind::kIdle, 20000));
  EXPECT_GE(whole.counters().hint_work, kBig);
  EXPECT_EQ(whole.counters().hint_deferred, 0u);
  EXPECT_FALSE(whole.HintWorkPending());

  int ticks = 0;
  while (sliced.HintWorkPending()) {
    work = sliced.counters().hint_work;
    sliced.PlanAndApply();
    EXPECT_LE(sliced.counters().hint_work - work, 512u) << "tick " << ticks;
    ASSERT_LT(++ticks, 1000);
  }
  // A walk of 10,000 members and 1,000 ordered: about 11,000 units.
  EXPECT_GE(ticks, 20);
  // Then both give their idle blocks up first, the same ones: the coldest.
  std::vector<Slot> x = Fill(sliced, 2, 300, kNoGroup, 30000);
  std::vector<Slot> y = Fill(whole, 2, 300, kNoGroup, 30000);
  EXPECT_EQ(InFast(sliced, x), 300u);
  EXPECT_EQ(sliced.counters().hint_displaced, 300u);
  EXPECT_EQ(whole.counters().hint_displaced, 300u);
  EXPECT_EQ(sliced.counters().evictions, whole.counters().evictions);
  for (size_t i = 0; i < kBig; ++i) {
    ASSERT_EQ(TierOf(sliced, a[i]), TierOf(whole, b[i])) << "block " << i;
  }
  EXPECT_EQ(TierOf(sliced, a[kBig - kCap]), Tier::kSlow);  // the coldest in the set: gone
  EXPECT_EQ(TierOf(sliced, a[kBig - 1]), Tier::kFast);     // the hottest: stays
}

// A soon on a large group orders its hottest out-of-set blocks in slices
// too; what it places is the same, hottest first, its working set at most.
TEST(HintCost, ASoonOnALargeGroupPlacesTheSameBlocksOnceItsWorkIsDone) {
  constexpr size_t kBig = 5000, kCap = 400;
  Engine sliced = SlicedEngine("lru", kCap, 100, 1000);
  Engine whole = SlicedEngine("lru", kCap, 0, 0);
  for (Engine* e : {&sliced, &whole}) {
    Fill(*e, 1, kBig, 1, 1);
    ASSERT_TRUE(e->Hint(1, HintKind::kIdle, 10000));
    while (e->HintWorkPending()) e->PlanAndApply();
    Fill(*e, 2, kCap, 2, 20000);  // takes all of the idle group's room
    ASSERT_EQ(e->counters().hint_displaced, kCap);
    ASSERT_TRUE(e->Hint(2, HintKind::kIdle, 30000));
  }
  ASSERT_TRUE(sliced.Hint(1, HintKind::kSoon, 30001));
  ASSERT_TRUE(whole.Hint(1, HintKind::kSoon, 30001));
  EXPECT_EQ(sliced.counters().hint_prefetched, 0u);  // not yet: a slice is 100 units
  EXPECT_EQ(whole.counters().hint_prefetched, kCap);
  while (sliced.HintWorkPending()) sliced.PlanAndApply();
  EXPECT_EQ(sliced.counters().hint_prefetched, kCap);
  while (sliced.PlanAndApply() > 0) {
  }
  while (whole.PlanAndApply() > 0) {
  }
  for (size_t i = 0; i < kBig; ++i) {
    ASSERT_EQ(TierOf(sliced, Slot(i)), TierOf(whole, Slot(i))) << "slot " << i;
  }
  // LRU's hottest: the last kCap touched.
  EXPECT_EQ(TierOf(sliced, Slot(kBig - 1)), Tier::kFast);
  EXPECT_EQ(TierOf(sliced, Slot(kBig - kCap - 1)), Tier::kSlow);
}

// A flood of hints on a large group: every call does at most one slice, and
// each new hint starts the group's work again (its last hint is what
// counts); the flood never finishes the work, and harms no other group.
TEST(HintCost, AFloodOfHintsCostsASliceEachAndOnlyItsOwnGroupWaits) {
  Engine e = SlicedEngine("lru", 100, 50, 200);
  Fill(e, 1, 3000, 1, 1);
  std::vector<Slot> small = Fill(e, 2, 10, 2, 5000);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t work = e.counters().hint_work;
    ASSERT_TRUE(e.Hint(1, i % 2 ? HintKind::kIdle : HintKind::kDone, 6000 + i));
    ASSERT_LE(e.counters().hint_work - work, 50u);
  }
  EXPECT_EQ(e.counters().hint_deferred, 1000u);
  // A small group's hint is done in its own call, flood or not.
  ASSERT_TRUE(e.Hint(2, HintKind::kDone, 7000));
  EXPECT_EQ(e.counters().hint_deferred, 1000u);
  Fill(e, 3, 10, kNoGroup, 8000);
  EXPECT_EQ(InFast(e, small), 0u);  // group 2's blocks left first
  EXPECT_EQ(e.counters().hint_displaced, 10u);
}

// Two soons wait for room; an idle hint gives two blocks' room, and the
// units left in its slice serve only the first soon: the next tick goes on
// with the second, as one call would have (each soon a block per round).
TEST(HintCost, WaitingSoonsAreServedInTurnAcrossSlices) {
  for (const size_t slice : {size_t{0}, size_t{5}}) {
    Engine e = SlicedEngine("lru", 4, slice, 100);
    const Slot a0 = Block(e, 1, 0, 1, 1, 1, /*owner=*/1);
    const Slot a1 = Block(e, 1, 1, 1, 1, 2, 1);
    const Slot b0 = Block(e, 2, 0, 2, 1, 3, 1);
    const Slot b1 = Block(e, 2, 1, 2, 1, 4, 1);
    ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 5));
    ASSERT_TRUE(e.Hint(2, HintKind::kIdle, 5));
    // Owner 2 takes all four places: owner 1's soons can take only hinted room.
    Block(e, 3, 0, 3, 1, 6, 2);
    Block(e, 3, 1, 3, 1, 7, 2);
    Block(e, 4, 0, kNoGroup, 1, 8, 2);
    Block(e, 4, 1, kNoGroup, 1, 9, 2);
    ASSERT_TRUE(e.Hint(1, HintKind::kSoon, 10));
    ASSERT_TRUE(e.Hint(2, HintKind::kSoon, 10));
    ASSERT_EQ(e.counters().hint_prefetched, 0u);
    // Group 3 idle: a walk of 2 and 2 ordered leave 1 unit of a slice of 5.
    ASSERT_TRUE(e.Hint(3, HintKind::kIdle, 11));
    if (slice != 0) {
      EXPECT_EQ(e.counters().hint_prefetched, 1u);
      EXPECT_TRUE(e.HintWorkPending());
      e.RunHints();
    }
    EXPECT_FALSE(e.HintWorkPending());
    EXPECT_EQ(e.counters().hint_prefetched, 2u) << "slice " << slice;
    auto in_set = [&](Slot x, Slot y) {
      return int{(e.state(x).flags & kFlagInTarget) != 0} +
             int{(e.state(y).flags & kFlagInTarget) != 0};
    };
    EXPECT_EQ(in_set(a0, a1), 1) << "slice " << slice;
    EXPECT_EQ(in_set(b0, b1), 1) << "slice " << slice;
  }
}

// A group hinted idle, touched, and hinted idle again: until the second
// hint's work is done, none of its blocks is in the pool (not at the places
// the first hint gave them); then all are again.
TEST(HintCost, AGroupHintedAgainIsOutOfThePoolUntilItsWorkIsDone) {
  Engine e = SlicedEngine("lru", 100, 16, 16);
  const std::vector<Slot> a = Fill(e, 1, 100, 1, 1);
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 200));
  while (e.HintWorkPending()) e.RunHints();
  e.Touch(a[99], Touch{1.0, 201, kNever});  // it runs again
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 202));
  ASSERT_TRUE(e.HintWorkPending());
  Block(e, 2, 0, kNoGroup, 1, 203);  // a miss: the policy's victim, no idle block
  EXPECT_EQ(e.counters().hint_displaced, 0u);
  EXPECT_EQ(e.counters().evictions, 1u);
  while (e.HintWorkPending()) e.RunHints();
  Block(e, 2, 1, kNoGroup, 1, 204);  // now an idle block
  EXPECT_EQ(e.counters().hint_displaced, 1u);
  EXPECT_EQ(e.counters().evictions, 1u);
}

// Members leave the group (released) and join it while a walk is under way:
// every block in the set when the work ends is found once, none twice.
TEST(HintCost, MembersThatComeAndGoDuringTheWalkAreEachFoundOnce) {
  Engine e = SlicedEngine("lru", 600, 16, 16);
  std::vector<Slot> a = Fill(e, 1, 600, 1, 1);
  ASSERT_EQ(InFast(e, a), 600u);
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, 1000));
  // Half way through the walk: release every third block, some before the
  // cursor and some after it, and put new ones in the group.
  for (int i = 0; i < 18; ++i) e.PlanAndApply();
  size_t released = 0;
  for (size_t i = 0; i < a.size(); i += 3) {
    e.Release(a[i]);
    ++released;
  }
  while (e.HintWorkPending()) e.PlanAndApply();
  const size_t left = a.size() - released;
  // New blocks need room: exactly the idle group's blocks still in the set
  // leave first, each once.
  Fill(e, 2, 600, kNoGroup, 2000);
  EXPECT_EQ(e.counters().hint_displaced, left);
  EXPECT_EQ(e.counters().evictions, 0u);
}

// 4 KiB blocks, tier 0 of `blocks` of them with no landing room.
EngineOptions SmallTier0(size_t blocks, Mode mode) {
  EngineOptions o;
  o.block_bytes = 4096;
  o.tier0_budget_bytes = blocks * o.block_bytes;
  o.mode = mode;
  o.landing_percent = 0;
  return o;
}
// How many of `v` are in the set, and the first that is (kNoSlot: none).
size_t InSet(const Engine& e, const std::vector<Slot>& v) {
  size_t n = 0;
  for (Slot s : v) n += (e.state(s).flags & kFlagInTarget) != 0;
  return n;
}
Slot FirstInSet(const Engine& e, const std::vector<Slot>& v) {
  for (Slot s : v) {
    if (e.state(s).flags & kFlagInTarget) return s;
  }
  return kNoSlot;
}

// Soons that cannot be placed (the set is full of another owner's blocks)
// wait; each Release() serves them for the room it leaves, but with
// hint_release_units, not a slice: a Release request of 1,024 keys of a third
// owner did 1,024 slices (one per key, each a walk of every waiting soon)
// before. The waiting soons are still served when room comes.
TEST(HintCost, AReleaseServesWaitingSoonsWithinItsOwnUnits) {
  constexpr size_t kWaiting = 512;
  EngineOptions o = SmallTier0(kWaiting, Mode::kTick);
  Engine e(o, std::move(*MakePolicy("lru")));
  constexpr uint32_t kA = 1, kB = 2, kC = 3;
  uint64_t now = 1;
  std::vector<Slot> a, b, c;
  for (size_t i = 0; i < kWaiting; ++i) {
    a.push_back(e.Admit(BlockKey::FromSequence(1, i), kA));
    ASSERT_TRUE(e.SetGroup(a.back(), i + 1));
    e.Touch(a.back(), Touch{1.0, now++, kNever});
  }
  for (size_t i = 0; i < kWaiting; ++i) ASSERT_TRUE(e.Hint(i + 1, HintKind::kIdle, now++));
  while (e.HintWorkPending()) e.PlanAndApply();
  for (size_t i = 0; i < kWaiting + 8; ++i) {  // B's blocks push A's idle ones out
    b.push_back(e.Admit(BlockKey::FromSequence(2, i), kB));
    e.Touch(b.back(), Touch{1.0, now++, kNever});
  }
  for (Slot s : a) ASSERT_FALSE(e.state(s).flags & kFlagInTarget);
  for (size_t i = 0; i < kWaiting; ++i) ASSERT_TRUE(e.Hint(i + 1, HintKind::kSoon, now++));
  while (e.HintWorkPending()) e.PlanAndApply();
  for (Slot s : a) ASSERT_FALSE(e.state(s).flags & kFlagInTarget) << "no room: the soons wait";
  // A third owner's 1,024 blocks, in no group and out of the set, released.
  for (size_t i = 0; i < 1024; ++i) c.push_back(e.Admit(BlockKey::FromSequence(3, i), kC));
  const uint64_t before = e.counters().hint_work;
  for (Slot s : c) e.Release(s);
  EXPECT_LE(e.counters().hint_work - before, 1024 * o.hint_release_units);
  // Room: B releases 8 of its blocks in the set; by the next ticks 8 of A's
  // waiting blocks are placed.
  size_t released = 0;
  for (Slot s : b) {
    if (released < 8 && (e.state(s).flags & kFlagInTarget)) {
      e.Release(s);
      ++released;
    }
  }
  ASSERT_EQ(released, 8u);
  for (int t = 0; t < 64; ++t) e.PlanAndApply();
  size_t placed = 0;
  for (Slot s : a) placed += (e.state(s).flags & kFlagInTarget) != 0;
  EXPECT_EQ(placed, 8u);
}

// Demand mode does a hint's work at once, at a release too: a soon whose
// next candidates were touched into the set since (stale ones, more than a
// release's units) still gets the room a release leaves, at the release.
// (hint_release_units, meant for tick mode's slices, once cut that round in
// demand mode, where no tick resumes it: the room stayed empty.)
TEST(HintCost, DemandModeServesWaitingSoonsWholeAtARelease) {
  constexpr size_t kCap = 64;
  EngineOptions o = SmallTier0(kCap, Mode::kDemand);
  Engine e(o, std::move(*MakePolicy("lru")));
  uint64_t now = 1;
  std::vector<Slot> a, b;
  for (size_t i = 0; i < kCap; ++i) {  // A's group: its working set is the whole tier
    a.push_back(e.Admit(BlockKey::FromSequence(1, i), 1));
    ASSERT_TRUE(e.SetGroup(a.back(), 1));
    e.Touch(a.back(), Touch{1.0, now++, kNever});
  }
  ASSERT_TRUE(e.Hint(1, HintKind::kIdle, now++));
  for (size_t i = 0; i < kCap; ++i) {  // B takes the set
    b.push_back(e.Admit(BlockKey::FromSequence(2, i), 2));
    e.Touch(b.back(), Touch{1.0, now++, kNever});
  }
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, now++));  // no room: it waits
  ASSERT_EQ(InSet(e, a), 0u);
  // A's hottest blocks (its candidates, hottest first) come back on their own
  // touches: more than a release's units of them are stale when it serves.
  for (size_t i = kCap; i-- > kCap - 3 * o.hint_release_units;) {
    e.Touch(a[i], Touch{1.0, now++, kNever});
  }
  const size_t before = InSet(e, a);
  ASSERT_GT(before, 2 * o.hint_release_units);
  const Slot gone = FirstInSet(e, b);
  ASSERT_NE(gone, kNoSlot);
  e.Release(gone);
  EXPECT_EQ(InSet(e, a), before + 1) << "the room the release left went to the waiting soon";
}

// Tick mode: a round of waiting soons that a release cut short (it serves
// only hint_release_units) goes on at the next tick with at least a slice,
// even while a long job (an idle hint about a large group, which new hints
// can keep restarting) takes all of the tick's units.
TEST(HintCost, ARoundAReleaseCutGoesOnAtTheNextTickBesideALongJob) {
  constexpr size_t kCap = 64;
  EngineOptions o = SmallTier0(kCap, Mode::kTick);
  o.hint_slice_units = 64;
  o.hint_tick_units = 64;
  o.hint_release_units = 4;
  Engine e(o, std::move(*MakePolicy("lru")));
  uint64_t now = 1;
  std::vector<Slot> a, b, c;
  auto group = [&](std::vector<Slot>& v, uint32_t owner, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      v.push_back(e.Admit(BlockKey::FromSequence(owner, i), owner));
      ASSERT_TRUE(e.SetGroup(v.back(), owner));
      e.Touch(v.back(), Touch{1.0, now++, kNever});
    }
    ASSERT_TRUE(e.Hint(owner, HintKind::kIdle, now++));
    while (e.HintWorkPending()) e.PlanAndApply();
  };
  group(a, 1, kCap);                   // A: a group that will wait for room with a soon
  group(c, 3, 2000);                   // C: a large group, touched once, idle
  for (size_t i = 0; i < kCap; ++i) {  // B takes the set
    b.push_back(e.Admit(BlockKey::FromSequence(2, i), 2));
    e.Touch(b.back(), Touch{1.0, now++, kNever});
  }
  ASSERT_TRUE(e.Hint(1, HintKind::kSoon, now++));
  while (e.HintWorkPending()) e.PlanAndApply();
  ASSERT_EQ(InSet(e, a), 0u) << "no room: the soon waits";
  // C's soon: a walk of its 2,000 members, 64 units a tick.
  ASSERT_TRUE(e.Hint(3, HintKind::kSoon, now++));
  ASSERT_TRUE(e.HintWorkPending());
  // A's hottest candidates come back on their own: stale when served.
  for (size_t i = kCap; i-- > kCap - 12;) e.Touch(a[i], Touch{1.0, now++, kNever});
  const size_t before = InSet(e, a);
  const Slot gone = FirstInSet(e, b);
  ASSERT_NE(gone, kNoSlot);
  e.Release(gone);
  ASSERT_EQ(InSet(e, a), before) << "the release's few units went to stale candidates";
  e.PlanAndApply();
  EXPECT_TRUE(e.HintWorkPending()) << "C's job took the tick's units and goes on";
  EXPECT_EQ(InSet(e, a), before + 1) << "and A's waiting soon got the room all the same";
}

}  // namespace
}  // namespace cxltier::engine
