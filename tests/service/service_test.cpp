// The daemon's service layer without a socket: config, checkpoints, mover,
// and an in-process Daemon's reload.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <xxhash.h>

#include "cxltier/lease.h"
#include "cxltier/segment.h"
#include "fork_alone.h"
#include "service/admin.h"
#include "service/checkpoint.h"
#include "service/client_table.h"
#include "service/config.h"
#include "service/daemon.h"
#include "service/devdax_reservations.h"
#include "service/fold.h"
#include "service/hints.h"
#include "service/mover.h"
#include "service/plan_pace.h"
#include "service/recorder.h"
#include "service/released_pages.h"
#include "service/status.h"
#include "test_migrator.h"

namespace cxltier::service {
namespace {

std::filesystem::path TempDir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("cxltier-service-" + name + "-" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// The uid of the Recorder tests' client events, when one uid's are enough.
constexpr uint32_t kUid = 1000;

// A recording hashes keys with its own secret: the same key is one trace key
// within a recording, no recorded key is a real one, and another secret gives
// other keys. It stops by itself after its ticks; a uid past its share of
// the caps loses its events, the recording goes on.
TEST(Recorder, HashesKeysPerRecordingAndStopsByItself) {
  const auto secret = [](uint8_t fill) {
    Recorder::Secret s;
    for (size_t i = 0; i < s.size(); ++i) s[i] = static_cast<uint8_t>(fill + 31 * i);
    return s;
  };
  const BlockKey a{1, 2}, b{1, 3};
  Recorder r;
  r.Start(100, 5, 1000, secret(1));
  r.Admit(101, kUid, a, Tier::kFast);
  r.Touch(101, kUid, a, 0.5, true);
  r.Touch(102, kUid, b, 0.25, false);
  r.Release(103, kUid, a);
  r.EndTick(104);
  EXPECT_TRUE(r.on());
  r.Touch(105, kUid, b, 1.0, false);
  r.EndTick(105);  // 5 ticks from 100: over
  ASSERT_TRUE(r.ready());
  r.Touch(106, kUid, a, 1.0, true);  // after the end: not recorded
  auto [t, sum] = r.Take();
  EXPECT_FALSE(r.ready());
  EXPECT_EQ(t.Validate().message, "");
  ASSERT_EQ(t.keys.size(), 2u);
  ASSERT_EQ(t.events.size(), 5u);
  EXPECT_EQ(t.events[0].kind, sim::EventKind::kAdmit);
  EXPECT_EQ(t.events[0].obs, 0.0f);
  EXPECT_EQ(t.events[0].step, 1u);
  EXPECT_EQ(t.events[0].key, t.events[1].key);  // a, twice
  EXPECT_EQ(t.events[3].kind, sim::EventKind::kRelease);
  EXPECT_EQ(t.events[3].key, t.events[0].key);
  EXPECT_EQ(t.events[4].step, 5u);
  EXPECT_EQ(t.events[1].obs, 0.5f);
  for (const BlockKey& k : t.keys) {
    EXPECT_FALSE(k == a || k == b) << k.ToString();
  }
  EXPECT_EQ(sum.touches, 3u);
  EXPECT_EQ(sum.hits, 1u);
  EXPECT_EQ(sum.end_tick, 105u);
  EXPECT_FALSE(sum.truncated);

  Recorder other;  // another secret: other keys for the same blocks
  other.Start(0, 10, 1000, secret(2));
  other.Touch(1, kUid, a, 1.0, false);
  other.Stop(1);
  auto [t2, sum2] = other.Take();
  ASSERT_EQ(t2.keys.size(), 1u);
  EXPECT_FALSE(t2.keys[0] == t.keys[t.events[0].key]);

  // A lone uid holds half the event cap (the other half is kept for the
  // next uid); past it, its events are dropped and counted, and the
  // recording goes on to its time. Once taken, nothing is left.
  Recorder capped;
  capped.Start(0, 1000, 4, secret(3));
  for (int i = 0; i < 5; ++i) {
    capped.Touch(1, kUid, BlockKey{9, static_cast<uint64_t>(i)}, 1.0, true);
  }
  EXPECT_TRUE(capped.on());
  capped.Stop(2);
  ASSERT_TRUE(capped.ready());
  auto [t3, sum3] = capped.Take();
  EXPECT_EQ(t3.events.size(), 2u);
  EXPECT_EQ(sum3.touches, 2u);  // only what was recorded
  EXPECT_FALSE(sum3.truncated);
  EXPECT_EQ(sum3.dropped, 3u);
  EXPECT_EQ(sum3.uids[kUid].events, 2u);
  EXPECT_EQ(sum3.uids[kUid].dropped, 3u);
  EXPECT_FALSE(sum3.replay_exact);
  EXPECT_FALSE(t3.recorded_moves);
  capped.EndTick(3);
  EXPECT_FALSE(capped.ready());
  EXPECT_FALSE(capped.on());

  // Every event a new block: the byte share (half the cap for a lone uid,
  // an event counted twice for the vector's growth) ends its events first.
  Recorder bytes;
  constexpr uint64_t kCap = 1 << 20;
  constexpr uint64_t kNewBlock =
      2 * Recorder::kBytesPerEvent + Recorder::kBytesPerKey + Recorder::kBytesPerGroupedKey;
  bytes.Start(0, 1000, uint64_t{1} << 24, secret(4), kCap);
  for (uint64_t i = 0; i < kCap / Recorder::kBytesPerKey + 10; ++i) {
    bytes.Touch(1, kUid, BlockKey{7, i}, 1.0, false);
  }
  EXPECT_TRUE(bytes.on());
  bytes.Stop(1);
  auto [t4, sum4] = bytes.Take();
  EXPECT_FALSE(sum4.truncated);
  EXPECT_EQ(t4.events.size(), kCap / 2 / kNewBlock);
  EXPECT_EQ(sum4.dropped, kCap / Recorder::kBytesPerKey + 10 - t4.events.size());
  EXPECT_LE(
      t4.events.capacity() * Recorder::kBytesPerEvent + t4.keys.size() * Recorder::kBytesPerKey,
      kCap);
}

// Issue 30, item 7: another uid's flood neither ends the recording nor takes
// the room of a uid that comes later. Each uid holds at most cap / (uids
// seen + 1); past it, a uid loses that event and all after it (a prefix
// without gaps), counted per uid, and the trace is no exact replay (its
// moves go). Only when a uid within its share finds no room does the
// recording stop, truncated.
TEST(Recorder, AUidPastItsShareLosesItsOwnEventsOnly) {
  Recorder::Secret secret;
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(11 * i + 5);
  constexpr uint32_t kFlood = 1001, kAdmin = 0, kLate = 1002;
  const auto key = [](uint64_t owner, uint64_t i) { return BlockKey{owner, i}; };
  Recorder r;
  r.Start(0, 1000, 12, secret);
  r.Plan(1, 0);  // exact so far: the daemon's moves are kept
  // The flood comes first: alone, its share is 12 / 2 = 6; the rest it
  // loses, and the trace its plan.
  for (uint64_t i = 0; i < 20; ++i) r.Touch(1, kFlood, key(kFlood, i), 1.0, false);
  EXPECT_TRUE(r.on());
  // The admin's client: with two uids its share is 12 / 3 = 4, and there is room for it.
  for (uint64_t i = 0; i < 4; ++i) r.Admit(2, kAdmin, key(kAdmin, i), Tier::kSlow);
  r.Touch(2, kFlood, key(kFlood, 0), 1.0, false);  // lost: never again, even an old block
  r.Plan(2, 0);                                    // no exact replay: no moves recorded
  EXPECT_TRUE(r.on());
  r.Touch(3, kAdmin, key(kAdmin, 0), 1.0, true);  // past its share of 4
  r.Release(3, kAdmin, key(kAdmin, 1));           // and everything after
  EXPECT_TRUE(r.on());
  // A third uid: its share is 12 / 4 = 3, but only 2 places are left: the
  // budget is full of shares, and the recording stops.
  for (uint64_t i = 0; i < 3; ++i) r.Touch(4, kLate, key(kLate, i), 1.0, false);
  ASSERT_TRUE(r.ready());
  auto [t, sum] = r.Take();
  ASSERT_EQ(t.Validate().message, "");
  EXPECT_TRUE(sum.truncated);
  EXPECT_EQ(sum.end_tick, 4u);
  EXPECT_FALSE(sum.replay_exact);
  EXPECT_FALSE(t.recorded_moves);
  EXPECT_EQ(sum.plans, 0u);
  ASSERT_EQ(sum.uids.size(), 3u);
  EXPECT_EQ(sum.uids[kFlood].events, 6u);
  EXPECT_EQ(sum.uids[kFlood].dropped, 15u);
  EXPECT_EQ(sum.uids[kAdmin].events, 4u);
  EXPECT_EQ(sum.uids[kAdmin].dropped, 2u);
  EXPECT_EQ(sum.uids[kLate].events, 2u);
  EXPECT_EQ(sum.uids[kLate].dropped, 0u);
  EXPECT_EQ(sum.dropped, 17u);
  // The trace: the flood's first 6 touches, the admin's 4 admits, the late uid's 2; no plan.
  using K = sim::EventKind;
  ASSERT_EQ(t.events.size(), 12u);
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(t.events[i].kind, i < 6 ? K::kTouch : i < 10 ? K::kAdmit : K::kTouch) << i;
  }
  EXPECT_EQ(t.keys.size(), 12u);
  // Written as a what-if trace (no moves: version 1) and read back.
  std::stringstream io;
  ASSERT_EQ(sim::WriteBinary(t, io).message, "");
  uint32_t version = 0;
  std::memcpy(&version, io.str().data() + 8, 4);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(sim::ReadBinary(io, "rec").status().message, "");

  // A uid past its byte share with a new block loses an old block's touch
  // too, though it would fit: its events stay a prefix without gaps.
  constexpr uint64_t kNewBlock =
      2 * Recorder::kBytesPerEvent + Recorder::kBytesPerKey + Recorder::kBytesPerGroupedKey;
  Recorder bytes;
  bytes.Start(0, 1000, 1000, secret, 2 * (2 * kNewBlock + 2 * Recorder::kBytesPerEvent + 8));
  bytes.Touch(1, kFlood, key(kFlood, 0), 1.0, false);
  bytes.Touch(1, kFlood, key(kFlood, 1), 1.0, false);
  bytes.Touch(1, kFlood, key(kFlood, 2), 1.0, false);  // a new block: past its share
  bytes.Touch(1, kFlood, key(kFlood, 0), 1.0, false);  // would fit; lost all the same
  bytes.Stop(2);
  auto [t2, sum2] = bytes.Take();
  EXPECT_EQ(t2.events.size(), 2u);
  EXPECT_EQ(sum2.uids[kFlood].dropped, 2u);
  EXPECT_FALSE(sum2.truncated);

  // The daemon's moves belong to no uid: when one does not fit, the moves go
  // (no exact replay) and the uids keep recording.
  Recorder moves;
  moves.Start(0, 1000, 4, secret);
  moves.Touch(1, kAdmin, key(kAdmin, 0), 1.0, false);
  moves.Plan(1, 0);
  moves.Plan(2, 0);
  moves.Plan(3, 0);
  moves.Plan(4, 0);  // no room: the plans go
  EXPECT_TRUE(moves.on());
  moves.Touch(5, kAdmin, key(kAdmin, 0), 1.0, false);
  moves.Stop(6);
  auto [t3, sum3] = moves.Take();
  EXPECT_FALSE(sum3.replay_exact);
  EXPECT_EQ(sum3.dropped, 0u);
  EXPECT_EQ(sum3.plans, 0u);
  ASSERT_EQ(t3.events.size(), 2u);
  EXPECT_EQ(t3.events[1].step, 5u);
  EXPECT_FALSE(sum3.truncated);
}

// The policy's leader (shards): the one it has when the recording starts,
// unless the first candidate, and each change after the touch that made it;
// nothing while the count of changes stays. A policy built anew (policy
// set, or a count that does not step by one) ends the exact replay.
TEST(Recorder, RecordsThePolicysLeaderAtTheStartAndAtEachChange) {
  Recorder::Secret secret{};
  const BlockKey a{1, 2};
  Recorder r;
  r.Start(10, 100, 1000, secret);
  r.Leader(10, 5, 3);  // five changes before the start: candidate 3 leads
  r.Touch(11, kUid, a, 1.0, true);
  r.Leader(11, 5, 3);
  r.Touch(12, kUid, a, 1.0, true);
  r.Leader(12, 6, 1);
  r.Stop(13);
  auto [t, sum] = r.Take();
  ASSERT_EQ(t.Validate().message, "");
  ASSERT_EQ(t.events.size(), 4u);
  EXPECT_EQ(t.events[0].kind, sim::EventKind::kLeader);
  EXPECT_EQ(t.events[0].key, 3u);
  EXPECT_EQ(t.events[2].kind, sim::EventKind::kTouch);
  EXPECT_EQ(t.events[3].kind, sim::EventKind::kLeader);
  EXPECT_EQ(t.events[3].key, 1u);
  EXPECT_EQ(t.events[3].step, 2u);
  EXPECT_EQ(sum.leader_changes, 2u);
  // The first candidate at the start: nothing to say.
  Recorder first;
  first.Start(0, 100, 1000, secret);
  first.Leader(0, 2, 0);
  first.Touch(1, kUid, a, 1.0, true);
  first.Leader(1, 2, 0);
  first.Stop(2);
  auto [t0, sum0] = first.Take();
  ASSERT_EQ(t0.events.size(), 1u);
  EXPECT_EQ(sum0.leader_changes, 0u);
  // Replaced: the moves go, leader events with them.
  for (const bool told : {true, false}) {
    Recorder set;
    set.Start(0, 100, 1000, secret);
    set.Leader(0, 4, 2);
    set.Touch(1, kUid, a, 1.0, true);
    if (told) {
      set.PolicyChanged();
    } else {
      set.Leader(1, 0, 0);  // a new shards policy counts from 0
    }
    set.Touch(2, kUid, a, 1.0, true);
    set.Stop(3);
    auto [ts, sums] = set.Take();
    EXPECT_FALSE(sums.replay_exact) << told;
    EXPECT_FALSE(ts.recorded_moves) << told;
    EXPECT_EQ(ts.events.size(), 2u) << told;  // the two touches
    EXPECT_EQ(sums.leader_changes, 0u) << told;
  }
}

// Hints and group membership: groups get the recording's own numbers (first
// seen = 1), a hint is an event naming that number, a block's group is the
// last it was seen in, and the trace carries the table only when there were
// any (a recording is version 3, whose table is all 0 without groups). The
// caps count the groups.
TEST(Recorder, RecordsHintsAndGroupsUnderItsOwnNumbers) {
  Recorder::Secret secret;
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(7 * i + 3);
  const BlockKey a{1, 2}, b{1, 3}, c{1, 4};
  const uint64_t g1 = (uint64_t{5} << 32) | 77, g2 = (uint64_t{9} << 32) | 77;
  Recorder r;
  r.Start(10, 100, 1000, secret);
  r.Touch(11, kUid, c, 1.0, true);  // no group yet
  r.Group(11, kUid, a, g2);         // first seen: number 1
  r.Group(11, kUid, b, g1);         // number 2
  r.Hint(11, kUid, g2, HintKind::kIdle);
  r.Touch(12, kUid, a, 0.5, false, g2);
  r.Touch(12, kUid, c, 0.5, false, g1);  // c seen in g1 now
  r.Hint(13, kUid, g1, HintKind::kSoon);
  r.Hint(13, kUid, g2, HintKind::kDone);
  r.Stop(14);
  auto [t, sum] = r.Take();
  ASSERT_EQ(t.Validate().message, "");
  ASSERT_EQ(t.keys.size(), 3u);
  ASSERT_EQ(t.groups.size(), 3u);
  // Keys in the order first seen: c, a, b.
  EXPECT_EQ(t.groups[0], 2u);
  EXPECT_EQ(t.groups[1], 1u);
  EXPECT_EQ(t.groups[2], 2u);
  ASSERT_EQ(t.events.size(), 6u);
  EXPECT_EQ(t.events[1].kind, sim::EventKind::kHint);
  EXPECT_EQ(t.events[1].key, 1u);
  EXPECT_EQ(t.events[1].obs, 1.0f);
  EXPECT_EQ(t.events[1].step, 1u);
  EXPECT_EQ(t.events[4].key, 2u);
  EXPECT_EQ(t.events[4].obs, 2.0f);
  EXPECT_EQ(t.events[5].key, 1u);
  EXPECT_EQ(t.events[5].obs, 3.0f);
  EXPECT_EQ(t.events[5].step, 3u);
  EXPECT_EQ(sum.hints, 3u);
  EXPECT_EQ(sum.groups, 2u);
  EXPECT_EQ(sum.touches, 3u);
  // Written and read back (version 3: a recording), groups and hints whole.
  std::stringstream io;
  ASSERT_EQ(sim::WriteBinary(t, io).message, "");
  const std::string bytes = io.str();
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  EXPECT_EQ(version, 3u);
  Result<sim::Trace> back = sim::ReadBinary(io, "rec");
  ASSERT_EQ(back.status().message, "");
  EXPECT_EQ(back->groups, t.groups);
  EXPECT_EQ(back->events.size(), t.events.size());

  // No hint and no group: no groups, written as a table of zeros, read back as none.
  Recorder plain;
  plain.Start(0, 100, 1000, secret);
  plain.Touch(1, kUid, a, 1.0, true);
  plain.Stop(2);
  auto [t2, sum2] = plain.Take();
  EXPECT_TRUE(t2.groups.empty());
  EXPECT_EQ(sum2.hints, 0u);
  std::stringstream io2;
  ASSERT_EQ(sim::WriteBinary(t2, io2).message, "");
  std::memcpy(&version, io2.str().data() + 8, 4);
  EXPECT_EQ(version, 3u);
  Result<sim::Trace> back2 = sim::ReadBinary(io2, "plain");
  ASSERT_EQ(back2.status().message, "");
  EXPECT_TRUE(back2->groups.empty());

  // A hint alone costs an event of its uid's share (half the cap, alone).
  Recorder capped;
  capped.Start(0, 100, 4, secret);
  capped.Hint(1, kUid, g1, HintKind::kIdle);
  capped.Hint(1, kUid, g1, HintKind::kSoon);
  capped.Hint(1, kUid, g1, HintKind::kDone);
  capped.Stop(2);
  auto [t3, sum3] = capped.Take();
  EXPECT_FALSE(sum3.truncated);
  EXPECT_EQ(t3.events.size(), 2u);
  EXPECT_EQ(sum3.hints, 2u);
  EXPECT_EQ(sum3.uids[kUid].dropped, 1u);

  // Every key in a new group: the byte share counts keys, their group
  // numbers and the groups, and ends the uid's records within it.
  Recorder grouped;
  constexpr uint64_t kCap = 1 << 20;
  grouped.Start(0, 1000, uint64_t{1} << 24, secret, kCap);
  for (uint64_t i = 0; i < kCap / Recorder::kBytesPerGroup + 10; ++i) {
    grouped.Group(1, kUid, BlockKey{7, i}, i + 1);
  }
  grouped.Stop(2);
  auto [t4, sum4] = grouped.Take();
  EXPECT_FALSE(sum4.truncated);
  EXPECT_EQ(t4.events.size(), 0u);
  EXPECT_EQ(t4.groups.size(), t4.keys.size());
  EXPECT_EQ(sum4.groups, kCap / 2 /
                             (Recorder::kBytesPerKey + Recorder::kBytesPerGroupedKey +
                              Recorder::kBytesPerGroup));
  EXPECT_GT(sum4.uids[kUid].dropped, 0u);
}

// The daemon's moves: each plan with the number of moves it planned, after
// the tick's touches; the outcome of each move planned during the recording
// (not of one planned before it began, nor of a block released since its
// plan); relocations. The trace records moves (version 3) and carries the
// tick it began at as the clock of step 0.
TEST(Recorder, RecordsPlansOutcomesAndRelocations) {
  Recorder::Secret secret;
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(5 * i + 1);
  const BlockKey a{1, 2}, b{1, 3}, c{1, 4};
  Recorder r;
  r.Start(100, 50, 1000, secret);
  r.Outcome(101, c, true);  // planned before the recording began
  r.Admit(101, kUid, a, Tier::kSlow);
  r.Admit(101, kUid, b, Tier::kFast);
  r.Touch(101, kUid, a, 1.0, false);
  r.Plan(101, 2);
  r.Planned(a);
  r.Planned(b);
  r.Outcome(101, b, false);  // refused at once
  r.Release(102, kUid, a);
  r.Outcome(102, a, true);  // its block was released since: stale
  r.Relocated(102, b, Tier::kFast);
  r.Plan(102, 1);
  r.Planned(b);
  r.Outcome(103, b, true);
  r.Outcome(103, b, true);  // told once only
  r.Stop(104);
  auto [t, sum] = r.Take();
  ASSERT_EQ(t.Validate().message, "");
  EXPECT_TRUE(t.recorded_moves);
  EXPECT_EQ(t.first_tick, 100u);
  using K = sim::EventKind;
  const std::vector<std::pair<K, uint32_t>> want = {
      {K::kAdmit, 1},   {K::kAdmit, 1},     {K::kTouch, 1}, {K::kPlan, 1},   {K::kOutcome, 1},
      {K::kRelease, 2}, {K::kRelocated, 2}, {K::kPlan, 2},  {K::kOutcome, 3}};
  ASSERT_EQ(t.events.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(t.events[i].kind, want[i].first) << i;
    EXPECT_EQ(t.events[i].step, want[i].second) << i;
  }
  const uint32_t ka = t.events[0].key, kb = t.events[1].key;
  EXPECT_EQ(t.events[3].key, 2u);  // a plan's key: its moves
  EXPECT_EQ(t.events[3].obs, 0.0f);
  EXPECT_EQ(t.events[4].key, kb);
  EXPECT_EQ(t.events[4].obs, 0.0f);  // not done
  EXPECT_EQ(t.events[5].key, ka);
  EXPECT_EQ(t.events[6].key, kb);
  EXPECT_EQ(t.events[6].obs, 0.0f);  // tier 0
  EXPECT_EQ(t.events[7].key, 1u);
  EXPECT_EQ(t.events[8].key, kb);
  EXPECT_EQ(t.events[8].obs, 1.0f);  // done
  EXPECT_EQ(t.keys.size(), 2u);      // c, never recorded, has no key
  EXPECT_EQ(sum.plans, 2u);
  EXPECT_EQ(sum.outcomes, 2u);
  EXPECT_EQ(sum.outcomes_done, 1u);
  EXPECT_EQ(sum.relocations, 1u);
  // Written as version 3 (the clock of step 0 after the header) and read back whole.
  std::stringstream io;
  ASSERT_EQ(sim::WriteBinary(t, io).message, "");
  const std::string bytes = io.str();
  uint32_t version = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  EXPECT_EQ(version, 3u);
  Result<sim::Trace> back = sim::ReadBinary(io, "rec");
  ASSERT_EQ(back.status().message, "");
  EXPECT_TRUE(back->recorded_moves);
  EXPECT_EQ(back->first_tick, 100u);
  ASSERT_EQ(back->events.size(), t.events.size());
  for (size_t i = 0; i < t.events.size(); ++i) {
    EXPECT_EQ(back->events[i].kind, t.events[i].kind) << i;
    EXPECT_EQ(back->events[i].key, t.events[i].key) << i;
  }

  // A plan costs an event of no uid's share: past the event cap the moves
  // go (no exact replay), and the recording goes on.
  Recorder capped;
  capped.Start(0, 100, 2, secret);
  capped.Plan(1, 0);
  capped.Plan(2, 3);
  EXPECT_TRUE(capped.on());
  capped.Plan(3, 0);
  EXPECT_TRUE(capped.on());
  capped.Stop(4);
  auto [t2, sum2] = capped.Take();
  EXPECT_FALSE(sum2.truncated);
  EXPECT_FALSE(sum2.replay_exact);
  EXPECT_FALSE(t2.recorded_moves);
  EXPECT_EQ(t2.events.size(), 0u);
  EXPECT_EQ(sum2.plans, 0u);
}

// A uid's hint budget (docs/protocol.md, "What a hint costs"): a bucket of
// units that fills at its rate up to its burst; a spend past it is a debt,
// and the wait is the time the rate takes to pay it back.
TEST(HintBudget, ADebtIsPaidBackAtTheRate) {
  const CostClock::time_point t0{};
  using std::chrono::milliseconds;
  CostBudget b(100, 1000, t0);  // 100 units at once, 1,000 a second
  EXPECT_EQ(b.Wait(t0).count(), 0);
  b.Spend(100, t0);
  EXPECT_EQ(b.Wait(t0).count(), 0);  // all of it, and no debt
  b.Spend(200, t0);
  EXPECT_EQ(b.Wait(t0), std::chrono::microseconds(200000));
  EXPECT_EQ(b.Wait(t0 + milliseconds(150)), std::chrono::microseconds(50000));
  EXPECT_EQ(b.Wait(t0 + milliseconds(200)).count(), 0);
  EXPECT_FALSE(b.Full(t0 + milliseconds(250)));
  EXPECT_TRUE(b.Full(t0 + milliseconds(300)));
  // Time refills at most the burst.
  b.Spend(150, t0 + milliseconds(5000));
  EXPECT_EQ(b.Wait(t0 + milliseconds(5000)), std::chrono::microseconds(50000));
}

// A hint folds at most 1,087 of its client's pending observations first
// (1,024 slots, a bitmap word whole), never all of them, and is charged for
// what it did: the rest wait for the tick's fold. Its group of 8,192 blocks
// costs it one slice, not a walk of the group.
TEST(Hints, AHintFoldsABoundedShareOfPendingObservationsAndPaysForIt) {
  constexpr uint32_t kSlots = 8192;
  ClientTable table;
  Client& c = table.Connect(server::Peer{1, getpid(), getuid(), getgid()});
  DaemonConfig config;
  const wire::Hello hello{ModelGeometry{"t", 1, 1, 1, 1024, 2, 16}, kSlots, "t"};
  ASSERT_TRUE(table.CheckHello(c, hello, config).ok());
  ASSERT_TRUE(table.Open(c, kSlots, "t").ok());
  engine::EngineOptions o;
  o.block_bytes = 64 << 10;
  o.tier0_budget_bytes = 64 * o.block_bytes;
  o.mode = engine::Mode::kTick;
  o.hint_slice_units = 100;
  engine::Engine e(o, std::move(*engine::MakePolicy("lru")));
  for (uint32_t i = 0; i < kSlots; ++i) {
    const BlockKey key = BlockKey::FromSequence(3, i);
    const engine::Slot es = e.Admit(key, Tier::kSlow, getuid());
    WriteBack(e, c, table.Bind(c, es, 0, i, key));
  }
  Recorder recorder;
  Fold fold(&recorder);
  UidBudgets budgets;
  Hints hints(&fold, &recorder, &budgets);
  const CostClock::time_point t0{};
  // Grouped as the library would: one hint per kMaxEntriesPerMessage keys.
  for (uint32_t from = 0; from < kSlots; from += wire::kMaxEntriesPerMessage) {
    wire::Hint grouping{HintKind::kSoon, 7, {}};
    for (uint32_t i = from; i < std::min(kSlots, from + wire::kMaxEntriesPerMessage); ++i) {
      grouping.keys.push_back(BlockKey::FromSequence(3, i));
    }
    ASSERT_TRUE(hints.Handle(c, grouping, e, 1, t0).ok());
  }
  // Every slot observed once since.
  for (uint32_t i = 0; i < kSlots; ++i) {
    ASSERT_TRUE(AddObservation(c.segment.slot(0), c.segment.dirty(), i, 1.0f));
  }
  const uint64_t units = hints.units();
  const auto answer = hints.Handle(c, wire::Hint{HintKind::kIdle, 7, {}}, e, 2, t0);
  ASSERT_TRUE(answer.ok());
  EXPECT_EQ(answer->applied, 1);
  const uint64_t folded = e.counters().touches;
  EXPECT_GE(folded, 1024u);
  EXPECT_LE(folded, 1087u);
  // Charged: the request, the slots folded, the bitmap's words looked at (17
  // words: 0 per 64), and its slice of the group's work.
  EXPECT_EQ(hints.units() - units, 1 + folded + 100);
  EXPECT_LE(hints.max_units(), 1 + 1087 + 100);
  EXPECT_EQ(e.counters().hint_deferred, 1u);  // 8,192 members: many slices
  // The tick's fold takes the rest.
  fold.Run(c, e, 3);
  EXPECT_EQ(e.counters().touches, kSlots);
}

// The plans' pace follows the mover: a tick that finds the last plan
// unfinished makes none and halves the budget (once a plan); a plan the
// mover kept up with, that used half its budget or more, doubles it; always
// between the floor and the cap, and a lowered cap is followed at once.
TEST(PlanPace, HalvesWhenTheMoverIsLateAndDoublesWhenItKeepsUp) {
  PlanPace p;
  constexpr uint64_t kFloor = 2, kCap = 64;
  ASSERT_TRUE(p.Ready(0, kCap, kFloor));
  EXPECT_EQ(p.budget(), kCap);  // it starts at the cap
  p.Planned(64);
  // The mover is still at it for three ticks: one halving, no plan.
  EXPECT_FALSE(p.Ready(5, kCap, kFloor));
  EXPECT_EQ(p.budget(), 32u);
  EXPECT_FALSE(p.Ready(3, kCap, kFloor));
  EXPECT_FALSE(p.Ready(1, kCap, kFloor));
  EXPECT_EQ(p.budget(), 32u);
  // Done: a plan at the halved budget (a late plan earns no doubling).
  ASSERT_TRUE(p.Ready(0, kCap, kFloor));
  EXPECT_EQ(p.budget(), 32u);
  p.Planned(20);  // at least half of 32
  // Kept up: doubled, up to the cap.
  ASSERT_TRUE(p.Ready(0, kCap, kFloor));
  EXPECT_EQ(p.budget(), 64u);
  p.Planned(10);  // less than half of 64: no evidence the mover does more
  ASSERT_TRUE(p.Ready(0, kCap, kFloor));
  EXPECT_EQ(p.budget(), 64u);
  // Late plans in a row go down to the floor, never below.
  for (int i = 0; i < 10; ++i) {
    p.Planned(p.budget());
    EXPECT_FALSE(p.Ready(1, kCap, kFloor));
    ASSERT_TRUE(p.Ready(0, kCap, kFloor));
  }
  EXPECT_EQ(p.budget(), kFloor);
  // A lowered cap (a reload) holds at once.
  p.Planned(kFloor);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(p.Ready(0, 16, kFloor));
    p.Planned(p.budget());
  }
  EXPECT_EQ(p.budget(), 16u);
  // A larger block size raises the floor: the budget follows it (under one
  // block, a plan could move nothing, and so never grow; seen in the cxl
  // guest after the engine was rebuilt for another block size).
  for (int i = 0; i < 10; ++i) {
    p.Planned(0);
    EXPECT_FALSE(p.Ready(1, 64, 2));
    ASSERT_TRUE(p.Ready(0, 64, 2));
  }
  EXPECT_EQ(p.budget(), 2u);
  ASSERT_TRUE(p.Ready(0, 64, 8));
  EXPECT_EQ(p.budget(), 8u);
}

TEST(Config, DefaultsValidateAndFileOverrides) {
  DaemonConfig c;
  EXPECT_EQ(c.Validate().message, "");
  const std::string err =
      LoadConfigText(
          "[daemon]\ntick_ms = 25\n[engine]\npolicy = \"ema:0.05\"\ntier0_budget = \"8GiB\"\n"
          "[tiers]\nfast_nodes = [0]\nslow_nodes = [2]\n[migration]\nrate_mib_s = 64\n",
          "t.toml", &c)
          .message;
  EXPECT_EQ(err, "");
  EXPECT_EQ(c.tick_ms, 25u);
  EXPECT_EQ(c.policy, "ema:0.05");
  EXPECT_EQ(c.tier0_budget_bytes, 8ull << 30);
  EXPECT_EQ(c.slow_nodes, std::vector<int>{2});
  EXPECT_EQ(c.migrate_rate_mib_s, 64u);
  // The TOML the daemon prints reads back to the same configuration.
  DaemonConfig back;
  EXPECT_EQ(LoadConfigText(ToToml(c), "back.toml", &back).message, "");
  EXPECT_EQ(back.policy, c.policy);
  EXPECT_EQ(back.tier0_budget_bytes, c.tier0_budget_bytes);
  EXPECT_EQ(back.slow_nodes, c.slow_nodes);
}

TEST(Config, NTiersAndTheirBudgets) {
  DaemonConfig c;
  ASSERT_EQ(LoadConfigText("[tiers]\nnodes = [[0], [1, 3], [2]]\nbudgets = [\"8GiB\", 4096]\n",
                           "t.toml", &c)
                .message,
            "");
  EXPECT_EQ(c.tier_nodes, (std::vector<std::vector<int>>{{0}, {1, 3}, {2}}));
  EXPECT_EQ(c.tier0_budget_bytes, 8ull << 30);
  EXPECT_EQ(c.lower_tier_budget_bytes, std::vector<uint64_t>{4096});
  EXPECT_EQ(TierBudgetBytes(c, 0, 3, 1 << 20), 8ull << 30);
  EXPECT_EQ(TierBudgetBytes(c, 1, 3, 1 << 20), 4096u);
  EXPECT_EQ(TierBudgetBytes(c, 2, 3, 1 << 20), 0u);  // the last tier holds the rest
  // A middle tier the budgets leave out: its nodes' memory.
  EXPECT_EQ(TierBudgetBytes(c, 2, 4, 1 << 20), uint64_t{1} << 20);
  DaemonConfig back;
  ASSERT_EQ(LoadConfigText(ToToml(c), "back.toml", &back).message, "") << ToToml(c);
  EXPECT_EQ(back.tier_nodes, c.tier_nodes);
  EXPECT_EQ(back.tier0_budget_bytes, c.tier0_budget_bytes);
  EXPECT_EQ(back.lower_tier_budget_bytes, c.lower_tier_budget_bytes);
  // Tier 0's budget alone, in [tiers]: the same as [engine] tier0_budget.
  DaemonConfig one;
  ASSERT_EQ(LoadConfigText("[tiers]\nbudgets = [\"2GiB\"]\n", "t.toml", &one).message, "");
  EXPECT_EQ(one.tier0_budget_bytes, 2ull << 30);
  EXPECT_TRUE(one.lower_tier_budget_bytes.empty());
  EXPECT_EQ(TierBudgetBytes(one, 1, 2, 1 << 20), 0u);
}

TEST(Config, ErrorsNameTheProblem) {
  for (auto [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"[daemon]\ntick_ms = \"fast\"\n", "tick_ms must be"},
           {"[daemon]\ntik_ms = 5\n", "unknown key 'tik_ms' in [daemon]"},
           {"[deamon]\n", "unknown table or key 'deamon'"},
           {"[engine]\npolicy = \"min\"\n", "policy min"},
           {"[engine]\npolicy = \"fifo\"\n", "unknown policy 'fifo'"},
           {"[engine]\ntier0_budget = \"lots\"\n", "tier0_budget must be"},
           {"[tiers]\nfast_nodes = [0]\n", "both fast_nodes and slow_nodes"},
           {"[tiers]\nfast_nodes = [-1]\nslow_nodes=[0]\n", "node numbers"},
           {"[tiers]\nnodes = [0, 1]\n", "[tiers] nodes must be an array of tiers"},
           {"[tiers]\nnodes = [[0], [-2]]\n", "arrays of node numbers (0-1023)"},
           {"[tiers]\nnodes = [[0]]\n", "[tiers] nodes must name 2 to 8 tiers"},
           {"[tiers]\nnodes = [[0], []]\n", "[tiers] nodes: tier 1 is empty"},
           {"[tiers]\nnodes = [[0], [1]]\nfast_nodes = [0]\nslow_nodes = [1]\n",
            "give one or the other"},
           {"[tiers]\nnodes = [[0], [1]]\nbudgets = [1, 2]\n", "2 budgets for 2 tiers"},
           {"[tiers]\nbudgets = []\n", "needs tier 0's budget"},
           {"[tiers]\nbudgets = \"1GiB\"\n", "[tiers] budgets must be an array"},
           {"[tiers]\nbudgets = [\"1GiB\", \"lots\"]\n", "[tiers] budgets must be an array"},
           {"[engine]\ntier0_budget = 5\n[tiers]\nbudgets = [5, 6]\n", "given twice"},
           {"[tiers]\nbudgets = [1, 2, 3, 4, 5, 6, 7, 8]\n", "at most 7"},
           {"[limits]\nmax_message_bytes = 10\n", "max_message_bytes"},
           // Found by fuzz_config: a size past int64 was accepted, then could not print back.
           {"[engine]\ntier0_budget = \"10000000000000000000K\"\n", "tier0_budget must be"},
           {"[engine]\ntier0_budget = \"9000000000000000000\"\n", "at most 1 EiB"},
           // Found by fuzz_config: a float where an integer belongs (1e100 overflowed a cast).
           {"[engine]\nghost_capacity = 1e100\n", "ghost_capacity must be"},
           {"[daemon]\ntick_ms = 50.0\n", "tick_ms must be"},
           {"[daemon\n", "t.toml:1"},
       }) {
    DaemonConfig c;
    const std::string err = LoadConfigText(text, "t.toml", &c).message;
    EXPECT_NE(err.find(want), std::string::npos) << text << " -> " << err;
  }
}

TEST(Config, QuotasReadPrintBackAndConvertToBlocksRoundingDown) {
  DaemonConfig c;
  ASSERT_EQ(LoadConfigText("[engine]\ntier0_budget = \"16GiB\"\n"
                           "[tiers]\nnodes = [[0], [1], [2]]\n"
                           "[[quotas.user]]\nuid = 1001\ntier0 = \"8GiB\"\nguarantee = \"4GiB\"\n"
                           "[[quotas.user]]\nuser = \"root\"\ntiers = [\"none\", \"16GiB\"]\n"
                           "[[quotas.user]]\nuid = 7\ntiers = [\"1GiB\", \"none\"]\n"
                           "[[quotas.client]]\nname = \"vllm-0\"\nuid = 1001\ntier0 = 1000\n"
                           "[[quotas.client]]\nname = \"vllm-0\"\nuser = \"root\"\ntier0 = 1\n",
                           "t.toml", &c)
                .message,
            "");
  ASSERT_EQ(c.user_quotas.size(), 3u);
  EXPECT_EQ(c.user_quotas[0].uid, 1001u);
  EXPECT_EQ(c.user_quotas[0].quota.caps, std::vector<uint64_t>{8ull << 30});
  EXPECT_EQ(c.user_quotas[0].quota.guarantee, 4ull << 30);
  EXPECT_EQ(c.user_quotas[1].uid, 0u);  // user = "root", resolved at load
  EXPECT_EQ(c.user_quotas[1].quota.caps, (std::vector<uint64_t>{kNoCapBytes, 16ull << 30}));
  EXPECT_EQ(c.user_quotas[2].quota.caps, std::vector<uint64_t>{1ull << 30});  // trailing none
  ASSERT_EQ(c.client_quotas.size(), 2u);
  EXPECT_EQ(c.client_quotas[0].name, "vllm-0");
  EXPECT_EQ(c.client_quotas[0].uid, 1001u);
  EXPECT_EQ(c.client_quotas[1].uid, 0u);  // user = "root"
  EXPECT_EQ(c.UserQuotaOf(1001), &c.user_quotas[0].quota);
  // Keyed by uid and name: the same name of another uid is another quota, or none.
  EXPECT_EQ(c.ClientQuotaOf(1001, "vllm-0"), &c.client_quotas[0].quota);
  EXPECT_EQ(c.ClientQuotaOf(0, "vllm-0"), &c.client_quotas[1].quota);
  EXPECT_EQ(c.ClientQuotaOf(1002, "vllm-0"), nullptr);
  EXPECT_EQ(c.ClientQuotaOf(1001, "vllm-1"), nullptr);
  // Printed back (users by uid, every cap in tiers = [...]) and read again: the same.
  DaemonConfig back;
  ASSERT_EQ(LoadConfigText(ToToml(c), "back.toml", &back).message, "") << ToToml(c);
  EXPECT_EQ(back.user_quotas, c.user_quotas);
  EXPECT_EQ(back.client_quotas, c.client_quotas);
  EXPECT_EQ(ToToml(back), ToToml(c));
  // Blocks of 5 MiB: 8 GiB is 1638.4 blocks, so 1638; 1000 bytes is no block.
  const engine::Quota q = ToEngineQuota(c.user_quotas[0].quota, 5ull << 20, true);
  EXPECT_EQ(q.cap[0], 1638u);
  EXPECT_EQ(q.cap[1], engine::kNoCap);
  EXPECT_EQ(q.guarantee, 819u);
  const engine::Quota client = ToEngineQuota(c.client_quotas[0].quota, 5ull << 20, false);
  EXPECT_EQ(client.cap[0], 0u);  // below one block: kept out of tier 0
  EXPECT_EQ(ToEngineQuota(c.user_quotas[1].quota, 1ull << 30, true).cap[1], 16u);
  // This host's tiers: three take caps on tiers 0 and 1; two only on tier 0.
  EXPECT_EQ(CheckQuotaTiers(c, 3).message, "");
  const std::string two = CheckQuotaTiers(c, 2).message;
  EXPECT_NE(two.find("uid 0: caps for 2 tiers, but this host has 2 tiers and the last (tier 1) "
                     "is never capped"),
            std::string::npos)
      << two;
}

// A uid with client quotas and no user quota is capped by their sum: another
// hello name of that uid shares it, and escapes nothing.
TEST(Config, ClientQuotasCapTheirUidUnlessItHasAUserQuota) {
  DaemonConfig c;
  ASSERT_EQ(LoadConfigText("[tiers]\nnodes = [[0], [1], [2]]\n"
                           "[[quotas.user]]\nuid = 7\ntier0 = \"8GiB\"\n"
                           "[[quotas.client]]\nname = \"a\"\nuid = 7\ntier0 = \"1GiB\"\n"
                           "[[quotas.client]]\nname = \"a\"\nuid = 8\ntiers = [\"1GiB\", "
                           "\"4GiB\"]\n"
                           "[[quotas.client]]\nname = \"b\"\nuid = 8\ntiers = [\"2GiB\", "
                           "\"none\"]\n"
                           "[[quotas.client]]\nname = \"c\"\nuid = 9\ntiers = [\"none\", "
                           "\"1GiB\"]\n",
                           "t.toml", &c)
                .message,
            "");
  const std::vector<UserQuota> users = EffectiveUserQuotas(c);
  ASSERT_EQ(users.size(), 3u);
  // uid 7: its own user quota, not its client quota's.
  EXPECT_EQ(users[0].uid, 7u);
  EXPECT_EQ(users[0].quota.caps, std::vector<uint64_t>{8ull << 30});
  // uid 8: tier 0 1 + 2 GiB; tier 1 capped by one of its client quotas only: none.
  EXPECT_EQ(users[1].uid, 8u);
  EXPECT_EQ(users[1].quota.caps, std::vector<uint64_t>{3ull << 30});
  EXPECT_EQ(users[1].quota.guarantee, 0u);
  // uid 9: what its one client quota caps.
  EXPECT_EQ(users[2].uid, 9u);
  EXPECT_EQ(users[2].quota.caps, (std::vector<uint64_t>{kNoCapBytes, 1ull << 30}));
  // Only [[quotas.user]] is a user quota of the file.
  EXPECT_EQ(c.UserQuotaOf(8), nullptr);
}

TEST(Config, QuotaErrorsNameTheProblem) {
  for (auto [text, want] : std::vector<std::pair<std::string, std::string>>{
           {"[quotas]\nuser = 5\n", "quotas.user must be an array of tables"},
           {"[quotas]\ngroup = []\n", "unknown key 'group' in [quotas]"},
           {"quotas = 5\n", "[quotas] must be a table"},
           {"[[quotas.user]]\nuid = 5\ntier0 = \"1GiB\"\ntier = 5\n",
            "unknown key 'tier' in [[quotas.user]] #1"},
           {"[[quotas.user]]\ntier0 = \"1GiB\"\n", "give uid = N or user = \"name\""},
           {"[[quotas.user]]\nuid = 5\nuser = \"root\"\ntier0 = 1\n", "(one of them)"},
           {"[[quotas.user]]\nuser = \"no-such-user-here\"\ntier0 = 1\n",
            "no user 'no-such-user-here'"},
           {"[[quotas.user]]\nuid = -1\ntier0 = 1\n", "uid must be"},
           {"[[quotas.user]]\nuid = 4294967295\ntier0 = 1\n", "out of range"},
           {"[[quotas.user]]\nuid = 5\n", "uid 5: no cap and no guarantee"},
           {"[[quotas.user]]\nuid = 5\ntier0 = \"lots\"\n", "tier0 must be a byte count"},
           {"[[quotas.user]]\nuid = 5\ntiers = [\"1GiB\", true]\n", "tiers must be an array"},
           {"[[quotas.user]]\nuid = 5\ntier0 = 1\ntiers = [1]\n", "given twice"},
           {"[[quotas.user]]\nuid = 5\ntiers = [1, 1, 1, 1, 1, 1, 1, 1]\n",
            "caps for 8 tiers; at most 7"},
           {"[tiers]\nnodes = [[0], [1]]\n[[quotas.user]]\nuid = 5\ntiers = [1, 1]\n",
            "[tiers] nodes names 2 and the last (tier 1) is never capped"},
           {"[[quotas.user]]\nuid = 5\ntier0 = \"2GiB\"\nguarantee = \"3GiB\"\n",
            "guarantee 3.00 GiB is above its tier-0 cap 2.00 GiB"},
           {"[engine]\ntier0_budget = \"4GiB\"\n[[quotas.user]]\nuid = 5\nguarantee = "
            "\"3GiB\"\n[[quotas.user]]\nuid = 6\nguarantee = \"2GiB\"\n",
            "the guarantees add up to more than tier 0's budget less its landing room, 3.88 GiB "
            "(at [quotas] uid 6)"},
           // Guarantees that fill tier 0 leave no landing room: refused (with
           // landing_percent = 0 they fit).
           {"[engine]\ntier0_budget = \"4GiB\"\n[[quotas.user]]\nuid = 5\nguarantee = "
            "\"2GiB\"\n[[quotas.user]]\nuid = 6\nguarantee = \"2GiB\"\n",
            "less its landing room, 3.88 GiB (at [quotas] uid 6)"},
           {"[[quotas.user]]\nuid = 5\ntier0 = 1\n[[quotas.user]]\nuid = 5\ntier0 = 2\n",
            "uid 5 has two quotas"},
           {"[[quotas.user]]\nuid = 0\ntier0 = 1\n[[quotas.user]]\nuser = \"root\"\ntier0 = 2\n",
            "uid 0 has two quotas"},
           {"[[quotas.client]]\nname = \"a\"\nuid = 5\ntier0 = 1\nguarantee = 1\n",
            "a client has no guarantee"},
           {"[[quotas.client]]\nuid = 5\ntier0 = 1\n", "give name ="},
           {"[[quotas.client]]\nname = \"\"\nuid = 5\ntier0 = 1\n", "name must be 1 to 64 bytes"},
           {"[[quotas.client]]\nname = \"a\"\ntier0 = 1\n",
            "give uid = N or user = \"name\": whose connections of that name"},
           {"[[quotas.client]]\nname = \"a\"\nuid = 0\nuser = \"root\"\ntier0 = 1\n",
            "(one of them)"},
           {"[[quotas.client]]\nname = \"a\"\nuid = 5\ntier0 = 1\n[[quotas.client]]\nname = "
            "\"a\"\nuid = 5\ntier0 = 2\n",
            "client 'a' of uid 5 has two quotas"},
       }) {
    DaemonConfig c;
    const std::string err = LoadConfigText(text, "t.toml", &c).message;
    EXPECT_NE(err.find(want), std::string::npos) << text << " -> " << err;
  }
}

// Without a landing room, guarantees may fill tier 0.
TEST(Config, GuaranteesMayFillTierZeroWithoutALandingRoom) {
  DaemonConfig c;
  const Status st = LoadConfigText(
      "[engine]\ntier0_budget = \"4GiB\"\nlanding_percent = 0\n[[quotas.user]]\nuid = 5\n"
      "guarantee = \"2GiB\"\n[[quotas.user]]\nuid = 6\nguarantee = \"2GiB\"\n",
      "t.toml", &c);
  EXPECT_TRUE(st.ok()) << st.message;
  DaemonConfig bad;
  EXPECT_NE(LoadConfigText("[engine]\nlanding_percent = 51\n", "t.toml", &bad)
                .message.find("landing_percent must be between 0 and 50"),
            std::string::npos);
}

TEST(Config, QuotaArgumentsOfTheAdminRequest) {
  QuotaTarget t;
  QuotaBytes q;
  ASSERT_EQ(ParseQuotaArg("uid=1001 tier0=8GiB guarantee=4GiB", &t, &q).message, "");
  EXPECT_TRUE(t.user);
  EXPECT_EQ(t.uid, 1001u);
  EXPECT_EQ(q.caps, std::vector<uint64_t>{8ull << 30});
  EXPECT_EQ(q.guarantee, 4ull << 30);
  EXPECT_EQ(DescribeQuota(q), "tier 0 cap 8.00 GiB, guarantee 4.00 GiB");
  ASSERT_EQ(ParseQuotaArg("user=root tier1=16GiB", &t, &q).message, "");
  EXPECT_EQ(t.uid, 0u);
  EXPECT_EQ(q.caps, (std::vector<uint64_t>{kNoCapBytes, 16ull << 30}));
  ASSERT_EQ(ParseQuotaArg("client=vllm-0 uid=1001 tiers=1GiB,none", &t, &q).message, "");
  EXPECT_FALSE(t.user);
  EXPECT_EQ(t.client, "vllm-0");
  EXPECT_EQ(t.uid, 1001u);
  ASSERT_EQ(ParseQuotaArg("user=root client=vllm-1 tier0=1GiB", &t, &q).message, "");
  EXPECT_FALSE(t.user);
  EXPECT_EQ(t.client, "vllm-1");
  EXPECT_EQ(t.uid, 0u);
  EXPECT_EQ(q.caps, std::vector<uint64_t>{1ull << 30});
  ASSERT_EQ(ParseQuotaArg("uid=1001 none", &t, &q).message, "");
  EXPECT_TRUE(q.Unlimited());
  EXPECT_EQ(DescribeQuota(q), "no quota");
  for (auto [arg, want] : std::vector<std::pair<std::string, std::string>>{
           {"tier0=1GiB", "whose?"},
           {"uid=1 user=root tier0=1", "one of uid= or user="},
           {"client=a tier0=1", "client=a needs uid= or user= too"},
           {"client=a client=b uid=1 tier0=1", "give client= once"},
           {"uid=abc tier0=1", "uid 'abc' is no uid"},
           {"uid=99999999999 tier0=1", "is no uid"},
           {"user=no-such-user-here tier0=1", "no user 'no-such-user-here'"},
           {"uid=1", "no cap and no guarantee"},
           {"uid=1 tier0=lots", "'lots' is no size or none"},
           {"uid=1 tier0=1 tier0=2", "tier 0's cap is given twice"},
           {"uid=1 tiers=1 tier0=2", "given twice"},
           {"uid=1 tier0=1 tiers=1", "give one or the other"},
           {"uid=1 none tier0=1", "none removes the quota"},
           {"uid=1 guarantee=x", "guarantee=SIZE"},
           {"uid=1 colour=red", "unknown key 'colour'"},
           {"uid=1 nothing", "'nothing' is not key=value"},
           {"client=a uid=1 guarantee=1", "a client has no guarantee"},
       }) {
    EXPECT_NE(ParseQuotaArg(arg, &t, &q).message.find(want), std::string::npos)
        << arg << " -> " << ParseQuotaArg(arg, &t, &q).message;
  }
}

TEST(Status, QuotasRenderAndNonAdminsSeeOnlyTheirOwnUid) {
  StatusSnapshot s;
  s.block_bytes = 1 << 20;
  AccountStatus a;
  a.uid = 1001;
  a.tier_blocks = {3, 5};
  a.cap_blocks = {4, AccountStatus::kNoCapBlocks};
  a.guarantee_blocks = 2;
  a.has_quota = true;
  a.quota_evictions = 9;
  AccountStatus b;
  b.uid = 1002;
  b.tier_blocks = {7, 0};
  b.cap_blocks = {AccountStatus::kNoCapBlocks, AccountStatus::kNoCapBlocks};
  AccountStatus cl = a;
  cl.client_id = 3;
  cl.client_name = "vllm-0";
  s.quotas.users = {a, b};
  s.quotas.clients = {cl};
  s.quotas.quota_evictions = 9;
  const nlohmann::json j = StatusToJson(s)["quotas"];
  EXPECT_EQ(j["quota_evictions"], 9);
  ASSERT_EQ(j["users"].size(), 2u);
  EXPECT_EQ(j["users"][0]["tiers"][0]["bytes"], 3 << 20);
  EXPECT_EQ(j["users"][0]["tiers"][0]["cap_bytes"], 4 << 20);
  EXPECT_FALSE(j["users"][0]["tiers"][1].contains("cap_bytes"));
  EXPECT_EQ(j["users"][0]["guarantee_bytes"], 2 << 20);
  EXPECT_EQ(j["clients"][0]["name"], "vllm-0");
  // Per-uid series only when [metrics] per_uid asks for them.
  EXPECT_EQ(MetricsExposition(s).find("uid=\""), std::string::npos) << MetricsExposition(s);
  EXPECT_NE(MetricsExposition(s).find("cxltier_quota_evictions_total 9"), std::string::npos);
  s.per_uid_metrics = true;
  const std::string m = MetricsExposition(s);
  for (const char* line :
       {"cxltier_user_tier_bytes{uid=\"1001\",tier=\"0\"} 3145728",
        "cxltier_user_tier_bytes{uid=\"1002\",tier=\"0\"} 7340032",
        "cxltier_user_tier_cap_bytes{uid=\"1001\",tier=\"0\"} 4194304",
        "cxltier_user_guarantee_bytes{uid=\"1001\"} 2097152",
        "cxltier_user_quota_evictions_total{uid=\"1001\"} 9", "cxltier_quota_evictions_total 9"}) {
    EXPECT_NE(m.find(line), std::string::npos) << line;
  }
  EXPECT_EQ(m.find("cxltier_user_tier_cap_bytes{uid=\"1002\""), std::string::npos);
  s.quotas.KeepOnly(1002);
  ASSERT_EQ(s.quotas.users.size(), 1u);
  EXPECT_EQ(s.quotas.users[0].uid, 1002u);
  EXPECT_TRUE(s.quotas.clients.empty());  // the client is uid 1001's
  // Uid 1001's evictions are not uid 1002's to see.
  EXPECT_EQ(s.quotas.quota_evictions, 0u);
}

// In a state directory others can write (a user's daemon with its state in
// /tmp), a link planted at the checkpoint's temporary name: the daemon
// writes a new file, and the file the link names is left as it was.
TEST(Checkpoint, ALinkAtTheTemporaryNameIsNotFollowed) {
  const auto dir = TempDir("ckpt-link");
  const std::string path = (dir / "ghosts.bin").string(), victim = (dir / "victim").string();
  std::ofstream(victim) << "precious";
  ASSERT_EQ(symlink(victim.c_str(), (path + ".tmp").c_str()), 0);
  std::vector<BlockState> g(2);
  g[1].key = BlockKey{7, 1};
  ASSERT_EQ(SaveGhosts(path, g).message, "");
  std::ifstream in(victim);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
            "precious");
  const LoadedGhosts l = LoadGhosts(path);
  ASSERT_EQ(l.ghosts.size(), 2u);
  EXPECT_EQ(l.ghosts[1].key, (BlockKey{7, 1}));
}

TEST(Checkpoint, RoundTripAndCorruptionIsSetAside) {
  const auto dir = TempDir("ckpt");
  const std::string path = (dir / "ghosts.bin").string();
  EXPECT_FALSE(LoadGhosts(path).found);
  std::vector<BlockState> g(3);
  for (int i = 0; i < 3; ++i) {
    g[i].key = BlockKey{7, static_cast<uint64_t>(i)};
    g[i].touch_count = 10 + i;
  }
  ASSERT_EQ(SaveGhosts(path, g).message, "");
  LoadedGhosts l = LoadGhosts(path);
  ASSERT_TRUE(l.found);
  ASSERT_EQ(l.status.message, "");
  ASSERT_EQ(l.ghosts.size(), 3u);
  EXPECT_EQ(l.ghosts[2].touch_count, 12u);
  EXPECT_EQ(l.ghosts[1].key, (BlockKey{7, 1}));

  // A flipped byte: checksum mismatch, file set aside, nothing loaded.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x55');
  }
  l = LoadGhosts(path);
  EXPECT_TRUE(l.ghosts.empty());
  EXPECT_NE(l.status.message.find("checksum"), std::string::npos) << l.status.message;
  EXPECT_TRUE(std::filesystem::exists(path + ".corrupt"));
  EXPECT_FALSE(std::filesystem::exists(path));
  // A second bad file does not replace the first one set aside.
  const uintmax_t first_aside = std::filesystem::file_size(path + ".corrupt");
  std::ofstream(path) << "not a checkpoint";
  l = LoadGhosts(path);
  EXPECT_NE(l.status.message.find("set aside as " + path + ".corrupt.1"), std::string::npos)
      << l.status.message;
  EXPECT_EQ(std::filesystem::file_size(path + ".corrupt"), first_aside);
  EXPECT_TRUE(std::filesystem::exists(path + ".corrupt.1"));
  // A newer daemon's file (a downgrade) is kept under its version's name.
  ASSERT_EQ(SaveGhosts(path, g).message, "");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    const uint32_t future = 9;
    f.write(reinterpret_cast<const char*>(&future), 4);
  }
  l = LoadGhosts(path);
  EXPECT_TRUE(l.ghosts.empty());
  EXPECT_NE(l.status.message.find("written by a newer cxltierd (version 9"), std::string::npos)
      << l.status.message;
  EXPECT_TRUE(std::filesystem::exists(path + ".v9"));
  std::filesystem::remove(path + ".corrupt.1");
  std::filesystem::remove(path + ".v9");

  // Truncated.
  ASSERT_EQ(SaveGhosts(path, g).message, "");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  l = LoadGhosts(path);
  EXPECT_TRUE(l.ghosts.empty());
  EXPECT_NE(l.status.message.find("truncated"), std::string::npos) << l.status.message;

  // A failed write leaves the previous checkpoint intact.
  ASSERT_EQ(SaveGhosts(path, g).message, "");
  std::filesystem::create_directories(path + ".tmp");  // the temporary name is taken
  EXPECT_NE(SaveGhosts(path, std::vector<BlockState>(1)).message, "");
  l = LoadGhosts(path);
  EXPECT_EQ(l.status.message, "");
  EXPECT_EQ(l.ghosts.size(), 3u);
  std::filesystem::remove_all(dir);
}

// A full disk: a 64 KiB tmpfs. The write of a bigger checkpoint fails with a
// clear error, the previous checkpoint stays intact and loadable, and no
// temporary file is left to fill the disk further.
TEST(Checkpoint, FullDiskKeepsThePreviousCheckpoint) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  const auto dir = TempDir("full");
  ASSERT_EQ(mount("cxltier-test", dir.c_str(), "tmpfs", 0, "size=64k"), 0) << std::strerror(errno);
  const std::string path = (dir / "ghosts.bin").string();
  std::vector<BlockState> small(3), big(20000);  // 192 bytes, 1.25 MiB
  for (size_t i = 0; i < big.size(); ++i) big[i].key = BlockKey{1, i};
  for (size_t i = 0; i < small.size(); ++i) small[i].key = BlockKey{2, i};
  ASSERT_EQ(SaveGhosts(path, small).message, "");
  const std::string err = SaveGhosts(path, big).message;
  EXPECT_NE(err.find("No space left"), std::string::npos) << err;
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  LoadedGhosts l = LoadGhosts(path);
  EXPECT_EQ(l.status.message, "");
  ASSERT_EQ(l.ghosts.size(), 3u);
  EXPECT_EQ(l.ghosts[1].key, (BlockKey{2, 1}));
  // Space again: the next checkpoint goes through.
  ASSERT_EQ(SaveGhosts(path, std::vector<BlockState>(big.begin(), big.begin() + 100)).message, "");
  EXPECT_EQ(LoadGhosts(path).ghosts.size(), 100u);
  EXPECT_EQ(umount(dir.c_str()), 0);
  std::filesystem::remove_all(dir);
}

// Version 2 keeps each state's owner; a file of version 1 (states only, as
// daemons before owners wrote it) still loads, its states owned by nobody known.
TEST(Checkpoint, RoundTripKeepsOwnersAndVersionOneStillLoads) {
  const auto dir = TempDir("owners");
  const std::string path = (dir / "ghosts.bin").string();
  GhostSnapshot snap;
  for (uint32_t i = 0; i < 5; ++i) {
    BlockState st;
    st.key = BlockKey{3, i};
    st.touch_count = 100 + i;
    snap.states.push_back(st);
    snap.owners.push_back(i % 2 ? 1000 + i : 0);
  }
  ASSERT_EQ(SaveGhosts(path, snap).message, "");
  LoadedGhosts l = LoadGhosts(path);
  ASSERT_EQ(l.status.message, "");
  EXPECT_EQ(l.version, 4u);
  EXPECT_TRUE(l.keyed());
  ASSERT_EQ(l.ghosts.size(), 5u);
  EXPECT_EQ(l.owners, snap.owners);
  EXPECT_EQ(l.ghosts[4].touch_count, 104u);
  EXPECT_EQ(l.ghosts[3].key, (BlockKey{3, 3}));

  // A flipped owner byte is caught by the checksum too.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24 + 16 + 5 * 64 + 2);
    f.put('\x7f');
  }
  l = LoadGhosts(path);
  EXPECT_NE(l.status.message.find("checksum"), std::string::npos) << l.status.message;
  EXPECT_TRUE(l.ghosts.empty() && l.owners.empty());

  // States without owners are written as owned by nobody known; owners that do
  // not match the states are refused.
  ASSERT_EQ(SaveGhosts(path, snap.states).message, "");
  l = LoadGhosts(path);
  EXPECT_EQ(l.owners, std::vector<uint32_t>(5, kUnknownOwner));
  EXPECT_NE(SaveGhosts(path, snap.states, std::vector<uint32_t>(4, 1)).message.find("owners"),
            std::string::npos);

  // A version-1 file, byte for byte as the old daemon wrote it.
  std::string v1(24, '\0');
  const uint32_t version = 1, entry = 64;
  const uint64_t count = snap.states.size();
  std::memcpy(v1.data(), "CXLGHOST", 8);
  std::memcpy(v1.data() + 8, &version, 4);
  std::memcpy(v1.data() + 12, &entry, 4);
  std::memcpy(v1.data() + 16, &count, 8);
  v1.append(reinterpret_cast<const char*>(snap.states.data()), count * 64);
  const uint64_t sum = XXH64(v1.data(), v1.size(), 0);
  v1.append(reinterpret_cast<const char*>(&sum), 8);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << v1;
  l = LoadGhosts(path);
  ASSERT_EQ(l.status.message, "");
  EXPECT_EQ(l.version, 1u);
  ASSERT_EQ(l.ghosts.size(), 5u);
  EXPECT_EQ(l.ghosts[2].touch_count, 102u);
  EXPECT_EQ(l.owners, std::vector<uint32_t>(5, kUnknownOwner));
  // An unknown version is set aside, not guessed at.
  const uint32_t v0 = 0;
  std::memcpy(v1.data() + 8, &v0, 4);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << v1;
  l = LoadGhosts(path);
  EXPECT_NE(l.status.message.find("unknown version"), std::string::npos) << l.status.message;
  std::filesystem::remove_all(dir);
}

// A file of `version` (1 or 2), byte for byte as the daemons before the clock
// (version 3) wrote it.
std::string OldCheckpoint(uint32_t version, const std::vector<BlockState>& states) {
  std::string f(24, '\0');
  const uint32_t entry = 64;
  const uint64_t count = states.size();
  std::memcpy(f.data(), "CXLGHOST", 8);
  std::memcpy(f.data() + 8, &version, 4);
  std::memcpy(f.data() + 12, &entry, 4);
  std::memcpy(f.data() + 16, &count, 8);
  f.append(reinterpret_cast<const char*>(states.data()), count * 64);
  if (version == 2) {
    for (uint64_t i = 0; i < count; ++i) {
      const uint32_t owner = 1000;
      f.append(reinterpret_cast<const char*>(&owner), 4);
    }
  }
  const uint64_t sum = XXH64(f.data(), f.size(), 0);
  f.append(reinterpret_cast<const char*>(&sum), 8);
  return f;
}

// Version 3 keeps the daemon's clock (states' touch times are its ticks): the
// tick the states were taken at and the tick the next daemon resumes at. No
// state is ever ahead of the resume tick; files of versions 1 and 2 (no
// clock) resume at their latest touch time.
TEST(Checkpoint, KeepsTheClockAndOlderVersionsResumeAtTheirLatestTouch) {
  const auto dir = TempDir("clock");
  const std::string path = (dir / "ghosts.bin").string();
  GhostSnapshot snap;
  for (uint32_t i = 0; i < 4; ++i) {
    BlockState st;
    st.key = BlockKey{5, i};
    st.touch_time = 900 + i;
    snap.states.push_back(st);
    snap.owners.push_back(1000);
  }
  snap.clock = {1000, 1050};
  ASSERT_EQ(SaveGhosts(path, snap).message, "");
  EXPECT_EQ(std::filesystem::file_size(path), 24u + 16 + 4 * (64 + 4) + 8);
  LoadedGhosts l = LoadGhosts(path);
  ASSERT_EQ(l.status.message, "");
  EXPECT_EQ(l.version, 4u);
  EXPECT_EQ(l.clock.tick, 1000u);
  EXPECT_EQ(l.clock.resume_tick, 1050u);
  EXPECT_EQ(l.ghosts[3].touch_time, 903u);
  EXPECT_EQ(l.owners, snap.owners);

  // A state touched after the clock's tick (not something a daemon writes)
  // still resumes behind no state.
  snap.states[2].touch_time = 5000;
  ASSERT_EQ(SaveGhosts(path, snap).message, "");
  l = LoadGhosts(path);
  EXPECT_EQ(l.clock.tick, 1000u);
  EXPECT_EQ(l.clock.resume_tick, 5000u);
  snap.states[2].touch_time = 902;

  // The clock is under the checksum.
  ASSERT_EQ(SaveGhosts(path, snap).message, "");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24 + 9);
    f.put('\x7f');
  }
  l = LoadGhosts(path);
  EXPECT_NE(l.status.message.find("checksum"), std::string::npos) << l.status.message;

  // Versions 1 and 2 still load; their clock is their latest touch time.
  for (uint32_t version : {1u, 2u}) {
    SCOPED_TRACE(version);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << OldCheckpoint(version, snap.states);
    l = LoadGhosts(path);
    ASSERT_EQ(l.status.message, "");
    EXPECT_EQ(l.version, version);
    ASSERT_EQ(l.ghosts.size(), 4u);
    EXPECT_EQ(l.clock.tick, 903u);
    EXPECT_EQ(l.clock.resume_tick, 903u);
    EXPECT_EQ(l.owners, std::vector<uint32_t>(4, version == 2 ? 1000 : kUnknownOwner));
  }
  // A version-3 header cut before its clock is truncated, not misread.
  std::string cut = OldCheckpoint(2, {});
  const uint32_t v3 = 3;
  std::memcpy(cut.data() + 8, &v3, 4);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << cut;
  l = LoadGhosts(path);
  EXPECT_NE(l.status.message.find("truncated"), std::string::npos) << l.status.message;
  std::filesystem::remove_all(dir);
}

// A sink that blocks until the test lets it go: a disk as slow as the test wants.
class GatedSink {
 public:
  Status Write(const std::string&, const GhostSnapshot& s) {
    std::unique_lock lock(mu_);
    sizes_.push_back(s.states.size());
    ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
    ++finished_;
    cv_.notify_all();
    return fail_ ? Status::Fail(wire::ErrorCode::kInternal, "disk on fire") : Status::Ok();
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Generous bounds: these wait for events, never for time to pass.
  bool WaitEntered(int n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return entered_ >= n; });
  }
  int finished() {
    std::lock_guard lock(mu_);
    return finished_;
  }
  std::vector<size_t> sizes() {
    std::lock_guard lock(mu_);
    return sizes_;
  }
  bool fail_ = false;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int entered_ = 0, finished_ = 0;
  std::vector<size_t> sizes_;
};

GhostSnapshot Snapshot(size_t n) {
  GhostSnapshot s;
  s.states.resize(n);
  s.owners.resize(n, 7);
  return s;
}

// The I/O thread never waits for the disk: while a write hangs, Submit returns
// at once, and of the snapshots handed in meanwhile only the newest is kept.
TEST(CheckpointWriter, SubmitNeverWaitsForAWriteInProgress) {
  GatedSink sink;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> reports;
  CheckpointWriter w(
      [&](const Status& written) {
        std::lock_guard lock(mu);
        reports.push_back(written.message);
        cv.notify_all();
      },
      [&](const std::string& p, const GhostSnapshot& s) { return sink.Write(p, s); });
  // The submits run on a thread of their own, the I/O thread: if one waited
  // for a write, it could never return before the sink is opened below.
  std::promise<std::vector<bool>> submitted;
  std::thread io([&] {
    std::vector<bool> fresh;
    fresh.push_back(w.Submit("x", Snapshot(1)));
    sink.WaitEntered(1);  // the writer is now stuck in the first write
    fresh.push_back(w.Submit("x", Snapshot(2)));
    fresh.push_back(w.Submit("x", Snapshot(3)));  // replaces the waiting 2
    submitted.set_value(fresh);
  });
  auto f = submitted.get_future();
  const bool returned = f.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  EXPECT_TRUE(returned) << "Submit waited for the write in progress";
  EXPECT_EQ(sink.finished(), 0);  // returned while the write was still stuck
  EXPECT_EQ(w.written(), 0u);
  EXPECT_TRUE(w.busy());
  EXPECT_EQ(w.replaced(), 1u);
  sink.Open();
  io.join();
  if (returned) {
    EXPECT_EQ(f.get(), (std::vector<bool>{true, true, false}));  // 3 replaced 2
  }
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return reports.size() >= 2; }));
    EXPECT_EQ(reports, (std::vector<std::string>{"", ""}));
  }
  w.Stop();
  EXPECT_EQ(sink.sizes(), (std::vector<size_t>{1, 3}));  // 2 was never written
  EXPECT_EQ(w.written(), 2u);
}

// Stop waits for the write in flight (so the final checkpoint, written after
// it by the caller, is the one that stays), drops a waiting snapshot, and
// makes later submits no-ops. Errors reach the callback.
TEST(CheckpointWriter, StopFinishesTheWriteInFlightFirst) {
  GatedSink sink;
  sink.fail_ = true;
  std::atomic<int> errors{0};
  CheckpointWriter w(
      [&](const Status& written) { errors += written.message == "disk on fire"; },
      [&](const std::string& p, const GhostSnapshot& s) { return sink.Write(p, s); });
  w.Submit("x", Snapshot(1));
  ASSERT_TRUE(sink.WaitEntered(1));
  w.Submit("x", Snapshot(2));
  std::atomic<int> finished_when_stopped{-1};
  std::thread stopper([&] {
    w.Stop();
    finished_when_stopped = sink.finished();
  });
  // Open the sink only once Stop has begun, so snapshot 2 cannot slip in first.
  for (int i = 0; i < 600000 && !w.stopped(); ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_TRUE(w.stopped());
  sink.Open();
  stopper.join();
  EXPECT_EQ(finished_when_stopped.load(), 1);  // Stop returned only after the write ended
  EXPECT_EQ(errors.load(), 1);                 // reported before Stop returned
  EXPECT_FALSE(w.Submit("x", Snapshot(3)));
  w.Stop();  // twice is fine
  EXPECT_EQ(sink.sizes(), std::vector<size_t>{1});
  EXPECT_EQ(w.written(), 1u);
}

// The real sink: the file on disk is the newest snapshot once the writer is idle.
TEST(CheckpointWriter, WritesCheckpointsThatLoad) {
  const auto dir = TempDir("writer");
  const std::string path = (dir / "ghosts.bin").string();
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  CheckpointWriter w([&](const Status& written) {
    EXPECT_EQ(written.message, "");
    std::lock_guard lock(mu);
    ++done;
    cv.notify_all();
  });
  GhostSnapshot s = Snapshot(1000);
  for (size_t i = 0; i < s.states.size(); ++i) s.states[i].key = BlockKey{9, i};
  w.Submit(path, s);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done >= 1; }));
  }
  w.Stop();
  LoadedGhosts l = LoadGhosts(path);
  ASSERT_EQ(l.status.message, "");
  ASSERT_EQ(l.ghosts.size(), 1000u);
  EXPECT_EQ(l.ghosts[999].key, (BlockKey{9, 999}));
  EXPECT_EQ(l.owners, std::vector<uint32_t>(1000, 7));
  std::filesystem::remove_all(dir);
}

// A slow migrator (2 ms a move) that records its calls; with hold_first the
// first move waits until Release().
test::TestMigrator::Options Slow(bool hold_first = false) {
  return {.hold_first = hold_first, .delay = std::chrono::milliseconds(2)};
}

// The released pages' states: held once however often released, moved
// once, and a block admitted on pages while they move takes them (their
// move's return says so); released again meanwhile, they are held anew and
// moved again. A client or pool that goes takes its share with it, and its
// moves come back as gone. Entries cost what is held or moving, nothing
// once it is all done.
TEST(ReleasedPages, HeldUntilTakenOrMovedAndMovedAgainWhenReleasedWhileMoving) {
  using B = ReleasedPages::Block;
  using O = ReleasedPages::Outcome;
  const auto blocks = [](const std::vector<B>& v) {
    std::vector<uint32_t> out;
    for (const B& b : v) out.push_back(b.block);
    return out;
  };
  // Session 1 is uid 100's, with a client account; session 2 uid 200's.
  constexpr uint64_t kClient1 = uint64_t{1} << 63 | 1;
  const auto acc = [](uint64_t session) {
    return session == 1 ? ReleasedPages::Accounts{100, kClient1}
                        : ReleasedPages::Accounts{200, ReleasedPages::kNoAccount};
  };
  // The held count by account, as the engine is told it.
  std::map<uint64_t, size_t> held;
  const auto account_held = [&](ReleasedPages& r) {
    r.DrainChangedAccounts([&](uint64_t id, size_t n) { held[id] = n; });
    return held;
  };
  ReleasedPages r;
  r.Add({1, 0, 5}, acc(1));
  r.Add({1, 0, 5}, acc(1));
  EXPECT_EQ(r.size(), 1u);
  r.Add({1, 0, 6}, acc(1));
  EXPECT_TRUE(r.Take({1, 0, 6}));  // admitted on before any move
  EXPECT_FALSE(r.Take({1, 0, 6}));
  EXPECT_EQ(r.size(), 1u);
  EXPECT_EQ(blocks(r.Next(10)), (std::vector<uint32_t>{5}));
  EXPECT_TRUE(r.Next(10).empty());  // 5 is moving, 6 was taken
  EXPECT_EQ(r.Done({1, 0, 5}), O::kMoved);
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.entries(), 0u);
  // Admitted on while moving, released again, admitted on again.
  r.Add({1, 0, 2}, acc(1));
  ASSERT_EQ(blocks(r.Next(1)), (std::vector<uint32_t>{2}));
  EXPECT_TRUE(r.Take({1, 0, 2}));
  EXPECT_EQ(r.size(), 0u);
  EXPECT_EQ(r.entries(), 1u) << "its move is still out";
  r.Add({1, 0, 2}, acc(1));
  EXPECT_EQ(r.size(), 1u);
  EXPECT_TRUE(r.Next(1).empty()) << "its move is still out";
  EXPECT_EQ(r.Done({1, 0, 2}), O::kTaken) << "a block was admitted on it while it moved";
  EXPECT_EQ(r.size(), 1u);
  EXPECT_EQ(blocks(r.Next(1)), (std::vector<uint32_t>{2})) << "held anew: moved again";
  EXPECT_EQ(r.Done({1, 0, 2}), O::kMoved);
  r.Add({1, 0, 3}, acc(1));
  ASSERT_EQ(r.Next(1).size(), 1u);
  EXPECT_TRUE(r.Take({1, 0, 3}));
  EXPECT_EQ(r.Done({1, 0, 3}), O::kTaken);
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.entries(), 0u);
  // Stale queue entries (taken before their move) cost nothing once nothing
  // is held: the next release is the next move.
  for (uint32_t i = 0; i < 100; ++i) r.Add({1, 0, i}, acc(1));
  for (uint32_t i = 0; i < 100; ++i) EXPECT_TRUE(r.Take({1, 0, i}));
  EXPECT_EQ(r.entries(), 0u);
  r.Add({1, 0, 40}, acc(1));
  EXPECT_EQ(blocks(r.Next(10)), (std::vector<uint32_t>{40}));
  EXPECT_EQ(r.Done({1, 0, 40}), O::kMoved);
  // One owner's oldest, then the next owner's (OwnersTakeTurns); a pool or
  // client that goes takes its own, moving or not.
  r.Add({2, 0, 1}, acc(2));
  r.Add({1, 1, 0}, acc(1));
  r.Add({1, 0, 7}, acc(1));
  r.Add({2, 1, 3}, acc(2));
  EXPECT_EQ(r.size(), 4u);
  EXPECT_EQ(account_held(r), (std::map<uint64_t, size_t>{{100, 2}, {200, 2}, {kClient1, 2}}));
  const std::vector<B> next = r.Next(2);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].session, 2u);
  EXPECT_EQ(next[0].block, 1u);
  EXPECT_EQ(next[1].session, 1u);
  EXPECT_EQ(next[1].pool, 1u);
  r.Drop(1, 1);  // its pool 1, whose block 0 is moving
  EXPECT_EQ(r.size(), 3u);
  EXPECT_EQ(account_held(r), (std::map<uint64_t, size_t>{{100, 1}, {200, 2}, {kClient1, 1}}));
  EXPECT_EQ(r.Done({1, 1, 0}), O::kGone);
  r.Drop(2);
  EXPECT_EQ(r.size(), 1u);
  EXPECT_EQ(account_held(r)[200], 0u) << "its client left";
  EXPECT_EQ(r.Done({2, 0, 1}), O::kGone) << "its client left";
  EXPECT_EQ(blocks(r.Next(10)), (std::vector<uint32_t>{7}));
  EXPECT_EQ(r.Done({1, 0, 7}), O::kMoved);
  EXPECT_EQ(account_held(r), (std::map<uint64_t, size_t>{{100, 0}, {200, 0}, {kClient1, 0}}));
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.entries(), 0u);
  EXPECT_TRUE(r.Next(10).empty());
}

// The moves of released pages take each owner's blocks in turn: one uid's
// thousand releases do not make another's one wait behind them.
TEST(ReleasedPages, OwnersTakeTurns) {
  ReleasedPages r;
  const ReleasedPages::Accounts churner{100, ReleasedPages::kNoAccount};
  const ReleasedPages::Accounts other{200, ReleasedPages::kNoAccount};
  for (uint32_t i = 0; i < 1000; ++i) r.Add({1, 0, i}, churner);
  r.Add({2, 0, 7}, other);
  r.Add({3, 0, 9}, churner);  // another session of the same uid: its queue
  std::vector<ReleasedPages::Block> next = r.Next(2);
  ASSERT_EQ(next.size(), 2u);
  EXPECT_EQ(next[0].session, 1u);
  EXPECT_EQ(next[0].block, 0u);
  EXPECT_EQ(next[1].session, 2u) << "the other uid's waited behind the churner's";
  for (const auto& b : next) EXPECT_EQ(r.Done(b), ReleasedPages::Outcome::kMoved);
  // The churner's next, in release order, its stale entries skipped.
  EXPECT_TRUE(r.Take({1, 0, 1}));
  next = r.Next(3);
  ASSERT_EQ(next.size(), 3u);
  EXPECT_EQ(next[0].block, 2u);
  EXPECT_EQ(next[1].block, 3u);
  EXPECT_EQ(next[2].block, 4u);
  for (const auto& b : next) EXPECT_EQ(r.Done(b), ReleasedPages::Outcome::kMoved);
  EXPECT_EQ(r.size(), 1002u - 2 - 1 - 3);  // moved, taken, moved
}

TEST(MoveDispatch, ThreeTiersMapNodesBothWays) {
  MoveDispatch d(numa::TierAssignment{{0}, {1}, "test: three tiers", {{2, 3}}},
                 std::make_shared<test::TestMigrator>(Slow()), 1 << 30, [](MoveDone) {});
  EXPECT_EQ(d.TierOfNode(0), Tier::kFast);
  EXPECT_EQ(d.TierOfNode(1), Tier::kSlow);
  EXPECT_EQ(d.TierOfNode(3), TierAt(2));
  EXPECT_EQ(d.TierOfNode(7), Tier::kFast);  // a node no tier names
  EXPECT_EQ(d.TargetNode(TierAt(2)), 2);
  EXPECT_EQ(d.TargetNode(Tier::kSlow), 1);
}

// Waits (up to 60 s) until the mover has nothing queued or running.
bool WaitIdle(const Mover& m) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (m.pending() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(Mover, RateLimitsCancelsAndReportsEveryJob) {
  auto fake = std::make_unique<test::TestMigrator>(Slow(/*hold_first=*/true));
  test::TestMigrator* f = fake.get();
  std::mutex mu;
  std::vector<MoveDone> done;
  // 1 MiB/s: each 64 KiB job waits ~62 ms behind the previous one.
  Mover m(std::move(fake), 1 << 20, [&](MoveDone d) {
    std::lock_guard lock(mu);
    done.push_back(std::move(d));
  });
  for (uint32_t i = 0; i < 6; ++i) {
    MoveJob j;
    j.move = engine::Move{i, 1, Tier::kFast, Tier::kSlow};
    j.range = numa::PageRange{0, 0x100000 + i * 0x10000, 0x10000, false};
    j.node = 1;
    m.Submit(j);
  }
  // Cancel jobs while the first one is being moved: the others are all queued.
  if (!f->WaitForCalls(1)) {
    f->Release();
    FAIL() << "the mover did not start the first job in 60 s";
  }
  m.Cancel(3, 1);
  m.Cancel(5, 1);
  m.Cancel(4, 99);  // wrong generation: not cancelled
  f->Release();
  EXPECT_TRUE(WaitIdle(m)) << m.pending() << " jobs still pending after 60 s";
  m.Stop();
  std::lock_guard lock(mu);
  ASSERT_EQ(done.size(), 6u);  // every job is reported, moved or cancelled
  size_t cancelled = 0;
  for (const MoveDone& d : done) {
    if (d.result.call_errno == ECANCELED) {
      ++cancelled;
      EXPECT_TRUE(d.job.move.slot == 3 || d.job.move.slot == 5);
    }
  }
  EXPECT_EQ(cancelled, 2u);
  EXPECT_EQ(f->moved.size(), 4u);
}

TEST(Mover, CancellingTheOnlyWaitingJobIsSafe) {
  // The second job waits for the rate limit (64 KiB at 1 MiB/s: 62 ms) with the
  // lock released; cancelling it leaves the queue empty when the wait ends.
  // Whether the cancel lands inside that wait depends on the scheduler, so a
  // round counts only when the cancel caught the job (it was reported
  // cancelled); rounds go on until 20 counted, or 60 s.
  int counted = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int round = 0; counted < 20 && std::chrono::steady_clock::now() < deadline; ++round) {
    auto fake = std::make_unique<test::TestMigrator>(Slow());
    test::TestMigrator* f = fake.get();
    std::atomic<int> reported{0}, cancelled{0};
    Mover m(std::move(fake), 1 << 20, [&](MoveDone d) {
      ++reported;
      cancelled += d.result.call_errno == ECANCELED;
    });
    for (uint32_t i = 0; i < 2; ++i) {
      MoveJob j;
      j.move = engine::Move{i, 1, Tier::kFast, Tier::kSlow};
      j.range = numa::PageRange{0, 0x100000, 0x10000, false};
      m.Submit(j);
    }
    // Once the first job is reported, the worker goes on to wait for the second.
    const auto first_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (reported.load() == 0 && std::chrono::steady_clock::now() < first_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GT(reported.load(), 0) << "round " << round << ": the first job took 60 s";
    m.Cancel(1, 1);
    // Let the rate-limit wait end by itself (it does not need to, for the checks).
    std::this_thread::sleep_for(std::chrono::milliseconds(80));
    m.Stop();
    EXPECT_EQ(reported.load(), 2) << "round " << round;  // every job reported, moved or not
    std::lock_guard lock(f->mu);
    for (const auto& [addr, node] : f->moved) EXPECT_EQ(addr, 0x100000u);
    if (cancelled.load() == 0) continue;  // the job had started: this round proves nothing
    ++counted;
    ASSERT_EQ(f->moved.size(), 1u) << "round " << round << ": a cancelled job was moved";
  }
  EXPECT_GT(counted, 0) << "no cancel caught the waiting job in 60 s of rounds";
}

TEST(Mover, StopDropsTheQueueAndReportsIt) {
  auto fake = std::make_unique<test::TestMigrator>(Slow());
  std::atomic<int> reported{0}, cancelled{0};
  // 1 KiB/s: after the first, each 64 KiB job waits 64 s, so Stop() finds the
  // queue full however slowly this thread gets to it (Stop ends the wait).
  Mover m(std::move(fake), 1 << 10, [&](MoveDone d) {
    ++reported;
    cancelled += d.result.call_errno == ECANCELED;
  });
  for (uint32_t i = 0; i < 20; ++i) {
    MoveJob j;
    j.move = engine::Move{i, 1, Tier::kFast, Tier::kSlow};
    j.range = numa::PageRange{0, 0x100000, 0x10000, false};
    m.Submit(j);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  m.Stop();
  EXPECT_EQ(reported.load(), 20);
  EXPECT_GE(cancelled.load(), 19);  // at most the first job ran
}

// RunCopy on real memory: the copy the mover makes in copy mode.
struct CopyFixture {
  static constexpr uint64_t kBytes = (1 << 20) + 4096 + 17;  // not a multiple of the chunk
  std::vector<uint8_t> src = std::vector<uint8_t>(kBytes), dst = std::vector<uint8_t>(kBytes);
  uint64_t words[2] = {LocationWord(0, 3, 7), 0};
  CopyJob Job() {
    for (uint64_t i = 0; i < kBytes; ++i) src[i] = uint8_t(i * 131 + (i >> 12));
    CopyJob j;
    j.src = src.data();
    j.dst = dst.data();
    j.bytes = kBytes;
    j.words = words;
    j.seg = 0;
    j.expected = words[0];
    j.next = LocationWord(1, 5, 8);
    return j;
  }
};

TEST(RunCopy, CopiesComparesAndPublishesTheNewPlace) {
  CopyFixture f;
  const CopyJob j = f.Job();
  const numa::MoveResult r = RunCopy(j);
  EXPECT_TRUE(r.done()) << r.call_errno;
  EXPECT_EQ(r.verified, r.pages);
  EXPECT_EQ(f.words[0], j.next);
  EXPECT_EQ(f.dst, f.src);
}

TEST(RunCopy, RefusedWhileTheClientHoldsTheWriteLease) {
  CopyFixture f;
  const CopyJob j = f.Job();
  Location where;
  ASSERT_EQ(BeginWrite(f.words, 0, &where), WriteStart::kOk);
  const numa::MoveResult r = RunCopy(j);
  EXPECT_EQ(r.call_errno, EBUSY);
  EXPECT_EQ(f.words[0], j.expected | kLocWriting);  // untouched: still the old place, written
  EXPECT_EQ(std::count(f.dst.begin(), f.dst.end(), 0), static_cast<long>(f.dst.size()));
  ASSERT_TRUE(EndWrite(f.words, 0));
  EXPECT_EQ(f.words[0], j.expected);
}

TEST(RunCopy, WrongExpectedPlaceIsRefused) {
  CopyFixture f;
  CopyJob j = f.Job();
  j.expected = LocationWord(0, 4, 7);  // the daemon's record disagrees with the word
  EXPECT_EQ(RunCopy(j).call_errno, EBUSY);
  EXPECT_EQ(f.words[0], LocationWord(0, 3, 7));
}

#if !defined(__SANITIZE_THREAD__)
// A client that writes the block without a write lease (a bug, or hostile): a
// copy that differs from its source is never published. The writer races
// with the copy on purpose, so TSan (which would report exactly that race)
// does not run this test. Copies repeat until one sees the writer, or 60 s.
TEST(RunCopy, ACopyThatDiffersFromItsSourceIsNotPublished) {
  CopyFixture f;
  const CopyJob first = f.Job();
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); i += 4093) {
      volatile uint8_t* p = f.src.data() + (i % CopyFixture::kBytes);
      *p = uint8_t(*p + 1);
    }
  });
  int mismatches = 0, published = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (mismatches == 0 && std::chrono::steady_clock::now() < deadline) {
    CopyJob j = first;
    j.expected = f.words[0];
    j.next = LocationWord(1, 5, DecodeLocation(j.expected).version + 1);
    const numa::MoveResult r = RunCopy(j);
    if (r.done()) {
      ++published;
      // Published copies are fine: the writer missed that chunk's window. Put
      // the place back so the next copy starts from the same record.
      f.words[0] = LocationWord(0, 3, DecodeLocation(f.words[0]).version);
      continue;
    }
    EXPECT_EQ(r.call_errno, EIO) << "no writer took the lease, so only EIO can refuse";
    EXPECT_EQ(f.words[0], j.expected) << "a refused copy leaves the old place, M cleared";
    ++mismatches;  // ends the loop (the writer thread must be joined, so no ASSERT here)
  }
  stop = true;
  writer.join();
  EXPECT_GT(mismatches, 0) << "60 s of copies (" << published << " published) never saw the writer";
}
#endif

// A reload's tick and rate reach the planner: its bytes per tick is the larger
// of two blocks and rate x tick, at start, after a reload, and in an engine built
// by a hello after the reload.
// The daemon asks the migrator it was given where a block's pages are (it
// once built a Linux migrator of its own for that, so fakes could not answer).
TEST(Daemon, AsksItsOwnMigratorWhereBlocksAre) {
  const std::filesystem::path dir = TempDir("where");
  DaemonConfig c;
  c.state_dir = dir.string();
  c.persist = false;
  c.block_bytes = 4096;
  boost::asio::io_context io;
  auto fake = std::make_unique<test::TestMigrator>(test::TestMigrator::Options{.where_node = 1});
  test::TestMigrator* where = fake.get();  // every page on node 1
  Daemon d(io, c, numa::Discover(), numa::TierAssignment{{0}, {1}, "test: node 1 is slow", {}},
           std::move(fake), false);
  ASSERT_EQ(d.Start().message, "");
  const server::Peer peer{1, getpid(), getuid(), getgid()};
  ASSERT_TRUE(d.requests().OnConnect(peer).ok());
  int seg_fd = -1;
  const ModelGeometry model{"where", 1, 1, 1, 64, 2, 16};  // 4 KiB blocks
  ASSERT_TRUE(d.requests().OnHello(peer, wire::Hello{model, 4, "where"}, &seg_fd).ok());
  close(seg_fd);
  const int memfd = memfd_create("where-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(memfd, 4 * 4096), 0);
  ASSERT_EQ(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto pool = d.requests().OnRegisterPool(
      peer, wire::RegisterPool{wire::PoolKind::kMemfd, 0, 4 * 4096, 4096, 4},
      server::UniqueFd(memfd));
  ASSERT_TRUE(pool.ok());
  auto admitted = d.requests().OnAdmit(peer, wire::Admit{0, {{BlockKey::FromSequence(1, 1), 0}}});
  ASSERT_TRUE(admitted.ok());
  EXPECT_GE(where->asked(), 1);
  EXPECT_EQ(admitted->results.at(0).tier, Tier::kSlow);
  d.requests().OnDisconnect(peer);
  d.Stop();
}

// A range pool whose process exited is dropped at a tick, and its blocks
// become ghosts a chunk of slots per turn of the I/O thread, not all in the
// tick: a million of them at once stalled a tick for 0.6 s (a helper's
// audit), and a client can have it happen again every few seconds. The
// pool's process is a real one, reaped before the tick.
TEST(Daemon, ADeadPoolsBlocksAreReleasedAChunkAtATime) {
  constexpr uint32_t kBlocks = 3000;  // three chunks of 1,024 slots
  const std::filesystem::path dir = TempDir("dead-pool");
  DaemonConfig c;
  c.state_dir = dir.string();
  c.persist = false;
  c.block_bytes = 4096;
  c.tick_ms = 3600 * 1000;            // no tick but the test's
  c.tier0_budget_bytes = 256 * 4096;  // the blocks are over it: the plan would demote
  boost::asio::io_context io;
  Daemon d(io, c, numa::Discover(), numa::TierAssignment{{0}, {1}, "test: node 1 is slow", {}},
           std::make_unique<test::TestMigrator>(test::TestMigrator::Options{}), true);
  ASSERT_EQ(d.Start().message, "");
  void* range =
      mmap(nullptr, kBlocks * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(range, MAP_FAILED);
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  const pid_t owner = fork();
  ASSERT_GE(owner, 0);
  if (owner == 0) {  // the pool's process: waits until the test lets it go
    char b;
    close(hold[1]);
    (void)!read(hold[0], &b, 1);
    _exit(0);
  }
  close(hold[0]);
  const server::Peer peer{1, owner, getuid(), getgid()};
  ASSERT_TRUE(d.requests().OnConnect(peer).ok());
  int seg_fd = -1;
  const ModelGeometry model{"dead", 1, 1, 1, 64, 2, 16};  // 4 KiB blocks
  ASSERT_TRUE(d.requests().OnHello(peer, wire::Hello{model, kBlocks, "dead"}, &seg_fd).ok());
  close(seg_fd);
  auto pool = d.requests().OnRegisterPool(
      peer,
      wire::RegisterPool{wire::PoolKind::kRange, reinterpret_cast<uint64_t>(range),
                         uint64_t{kBlocks} * 4096, 4096, kBlocks},
      server::UniqueFd());
  ASSERT_TRUE(pool.ok()) << pool.status().message;
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < kBlocks; i += 1024) {
    wire::Admit a{pool->pool_id, {}};
    for (uint32_t j = i; j < std::min(kBlocks, i + 1024); ++j) {
      keys.push_back(BlockKey::FromSequence(7, j));
      a.entries.push_back({keys.back(), j});
    }
    auto ok = d.requests().OnAdmit(peer, a);
    ASSERT_TRUE(ok.ok()) << ok.status().message;
  }
  auto live = [&] {
    size_t n = 0;
    for (size_t i = 0; i < keys.size(); i += 1024) {
      wire::QueryTiers q;
      q.keys.assign(keys.begin() + static_cast<ptrdiff_t>(i),
                    keys.begin() + static_cast<ptrdiff_t>(std::min(keys.size(), i + 1024)));
      auto t = d.requests().OnQueryTiers(peer, q);
      EXPECT_TRUE(t.ok());
      if (t.ok())
        n += std::count_if(t->tiers.begin(), t->tiers.end(),
                           [](Tier x) { return x != Tier::kNone; });
    }
    return n;
  };
  ASSERT_EQ(live(), kBlocks);
  close(hold[1]);  // the pool's process exits
  ASSERT_EQ(waitpid(owner, nullptr, 0), owner);
  d.Tick();
  EXPECT_EQ(live(), kBlocks - 1024) << "the tick released one chunk, the rest waits its turns";
  // The rest are no one's to move: no move is planned for them meanwhile.
  const nlohmann::json m = d.StatusJson()["migrations"];
  EXPECT_EQ(m["pending"].get<uint64_t>(), 0u) << m.dump();
  EXPECT_EQ(m["failed"].get<uint64_t>(), 0u) << m.dump();
  io.poll();
  EXPECT_EQ(live(), 0u) << "every block of the dead pool is a ghost once the turns ran";
  d.requests().OnDisconnect(peer);
  io.poll();
  d.Stop();
  munmap(range, kBlocks * 4096);
}

// A hello with a new block size, while no client is connected and no
// [engine] block_bytes is set, carries every ghost into a new engine (about
// 100 ns each): its sender's uid pays for them (kRebuildUnitsPerGhost), so
// a loop of hellos alternating two sizes waits for its own work. A hello of
// the same size carries nothing and pays nothing of it.
TEST(Daemon, AHelloThatChangesTheBlockSizePaysForTheGhostsItCarries) {
  constexpr uint32_t kGhosts = 200000;
  const std::filesystem::path dir = TempDir("size-change");
  DaemonConfig c;
  c.state_dir = dir.string();
  c.persist = true;
  c.checkpoint_interval_s = 0;
  c.tick_ms = 3600 * 1000;
  c.max_blocks_per_client = kGhosts;
  boost::asio::io_context io;
  Daemon d(io, c, numa::Discover(), numa::TierAssignment{{0}, {1}, "test: node 1 is slow", {}},
           std::make_unique<test::TestMigrator>(test::TestMigrator::Options{}), true);
  ASSERT_EQ(d.Start().message, "");
  const ModelGeometry small{"small", 1, 1, 1, 64, 2, 16};  // 4 KiB blocks
  const ModelGeometry large{"large", 1, 1, 1, 64, 2, 32};  // 8 KiB blocks
  // One uid's blocks, then its disconnect: they become ghosts.
  const server::Peer owner{1, getpid(), getuid(), getgid()};  // a range pool checks the process
  ASSERT_TRUE(d.requests().OnConnect(owner).ok());
  int seg_fd = -1;
  ASSERT_TRUE(d.requests().OnHello(owner, wire::Hello{small, kGhosts, "owner"}, &seg_fd).ok());
  close(seg_fd);
  void* range = mmap(nullptr, uint64_t{kGhosts} * 4096, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(range, MAP_FAILED);
  auto pool = d.requests().OnRegisterPool(
      owner,
      wire::RegisterPool{wire::PoolKind::kRange, reinterpret_cast<uintptr_t>(range),
                         uint64_t{kGhosts} * 4096, 4096, kGhosts},
      server::UniqueFd());
  ASSERT_TRUE(pool.ok()) << pool.status().message;
  for (uint32_t i = 0; i < kGhosts; i += wire::kMaxEntriesPerMessage) {
    wire::Admit a{pool->pool_id, {}};
    for (uint32_t j = i; j < std::min(kGhosts, i + wire::kMaxEntriesPerMessage); ++j) {
      a.entries.push_back({BlockKey::FromSequence(1, j), j});
    }
    ASSERT_TRUE(d.requests().OnAdmit(owner, a).ok());
  }
  d.requests().OnDisconnect(owner);
  io.poll();  // its slots are released a chunk per turn
  ASSERT_EQ(d.StatusJson()["ghosts"].get<uint64_t>(), kGhosts);
  // Another uid's hello of the same size: no engine is made, no debt.
  const server::Peer same{2, getpid(), 54321, 54321};
  ASSERT_TRUE(d.requests().OnConnect(same).ok());
  ASSERT_TRUE(d.requests().OnHello(same, wire::Hello{small, 8, "same"}, &seg_fd).ok());
  close(seg_fd);
  EXPECT_EQ(d.requests().Throttle(same).count(), 0);
  d.requests().OnDisconnect(same);
  io.poll();
  // A third uid's hello with another size: 200,000 ghosts carried, 800,000
  // units charged, 537,000 past its burst: about half a second of debt.
  const server::Peer changer{3, getpid(), 54322, 54322};
  ASSERT_TRUE(d.requests().OnConnect(changer).ok());
  ASSERT_TRUE(d.requests().OnHello(changer, wire::Hello{large, 8, "changer"}, &seg_fd).ok());
  const auto owed = d.requests().Throttle(changer);
  close(seg_fd);
  EXPECT_GT(owed.count(), 0) << "the rebuild of " << kGhosts << " ghosts was free";
  EXPECT_EQ(d.StatusJson()["ghosts"].get<uint64_t>(), kGhosts);  // carried, not lost
  d.requests().OnDisconnect(changer);
  io.poll();
  d.Stop();
  munmap(range, uint64_t{kGhosts} * 4096);
}

// A device-DAX region stays reserved for the process that made a tier pool
// there after the daemon's mapping of it is gone (its connection left, or the
// daemon restarted): that process still maps the device, and its held read
// leases read there. Only it may take the region again; another process may
// once it has exited. The owner here is a real child process.
TEST(DevdaxReservations, ARegionIsKeptForItsProcessAcrossDisconnectAndRestart) {
  const std::filesystem::path dir = TempDir("devdax");
  const std::string path = (dir / "devdax-reservations").string();
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  const pid_t owner = testing::ForkAlone();
  ASSERT_GE(owner, 0);
  if (owner == 0) {  // waits until the test lets it go
    close(hold[1]);
    char c;
    (void)!read(hold[0], &c, 1);
    _exit(0);
  }
  close(hold[0]);
  const server::Peer owner_peer{1, owner, 54340, 54340, *server::ProcessStartTime(owner)};
  const server::Peer other{2, getpid(), 54341, 54341, *server::ProcessStartTime(getpid())};
  // A connection whose process exited and whose pid went to the owner: the
  // same pid, another start time. It is not the owner.
  server::Peer stale = owner_peer;
  stale.session_id = 3;
  stale.start_time -= 1;
  const DevdaxReservations::Region region{7, 2 << 20, 10 << 20};
  const DevdaxReservations::Region overlapping{7, 8 << 20, 16 << 20};
  const DevdaxReservations::Region elsewhere{7, 10 << 20, 12 << 20};
  const DevdaxReservations::Region other_device{8, 2 << 20, 10 << 20};
  {
    DevdaxReservations r(path);
    ASSERT_TRUE(r.Load().ok());
    auto mapping = std::make_shared<int>(0);  // the daemon's mapping of the owner's pool
    ASSERT_TRUE(r.Claim(region, owner_peer, mapping).ok());
    // While the daemon maps it, nobody else gets it.
    Status st = r.Claim(overlapping, other, std::make_shared<int>(0));
    EXPECT_EQ(st.code, wire::ErrorCode::kBusy);
    EXPECT_NE(st.message.find("a tier pool of a connection of this daemon"), std::string::npos)
        << st.message;
    EXPECT_TRUE(r.Claim(elsewhere, other, std::make_shared<int>(0)).ok());
    EXPECT_TRUE(r.Claim(other_device, other, std::make_shared<int>(0)).ok());
    // The owner's connection left: the mapping is gone, the owner runs.
    mapping.reset();
    st = r.Claim(overlapping, other, std::make_shared<int>(0));
    EXPECT_EQ(st.code, wire::ErrorCode::kBusy);
    EXPECT_NE(st.message.find("reserved for pid " + std::to_string(owner)), std::string::npos)
        << st.message;
  }
  // A restart: the file says whose it is.
  {
    DevdaxReservations r(path);
    ASSERT_TRUE(r.Load().ok());
    const Status st = r.Claim(region, stale, std::make_shared<int>(0));
    EXPECT_EQ(st.code, wire::ErrorCode::kBusy) << "a reused pid passed for the owner";
  }
  DevdaxReservations again(path);
  ASSERT_TRUE(again.Load().ok());
  Status st = again.Claim(overlapping, other, std::make_shared<int>(0));
  EXPECT_EQ(st.code, wire::ErrorCode::kBusy) << "a restart forgot the reservation";
  // The same file from another boot names other processes: not kept.
  {
    std::ifstream in(path);
    std::string boot, rest, line;
    std::getline(in, boot);
    while (std::getline(in, line)) rest += line + "\n";
    EXPECT_EQ(boot.rfind("boot ", 0), 0u) << boot;
    const std::string other_boot = (dir / "other-boot").string();
    std::ofstream(other_boot) << "boot 00000000-0000-0000-0000-000000000000\n" << rest;
    DevdaxReservations old_boot(other_boot);
    ASSERT_TRUE(old_boot.Load().ok());
    EXPECT_EQ(old_boot.size(), 0u);
  }
  // Its owner takes it again (its Reconnect).
  auto back = std::make_shared<int>(0);
  EXPECT_TRUE(again.Claim(region, owner_peer, back).ok());
  back.reset();
  // Once the owner has exited, anyone may.
  close(hold[1]);
  ASSERT_EQ(waitpid(owner, nullptr, 0), owner);
  EXPECT_TRUE(again.Claim(overlapping, other, std::make_shared<int>(0)).ok());
  // One uid keeps at most kPerUid regions for its live processes.
  std::vector<std::shared_ptr<int>> held;
  Status limit;
  for (uint64_t i = 0; i <= DevdaxReservations::kPerUid + 1 && limit.ok(); ++i) {
    const DevdaxReservations::Region r{9, i << 21, (i + 1) << 21};
    held.push_back(std::make_shared<int>(0));
    limit = again.Claim(r, other, held.back());
  }
  EXPECT_EQ(limit.code, wire::ErrorCode::kLimit) << limit.message;
  EXPECT_LE(again.size(), DevdaxReservations::kPerUid + 2);
  std::filesystem::remove_all(dir);
}

TEST(Daemon, ReloadRecomputesThePlannersBudget) {
  const std::filesystem::path dir = TempDir("reload");
  const numa::TierAssignment tiers{{0}, {0}, "test: both tiers on node 0", {}};
  auto budget = [](const Daemon& d) {
    return d.StatusJson()["migrations"]["budget_bytes_per_tick"].get<uint64_t>();
  };
  DaemonConfig c;
  c.state_dir = dir.string();
  c.persist = false;
  c.tick_ms = 100;
  c.migrate_rate_mib_s = 64;
  {
    boost::asio::io_context io;
    DaemonConfig fixed = c;
    fixed.block_bytes = 64 << 10;  // the engine exists from the start
    Daemon d(io, fixed, numa::Discover(), tiers, std::make_unique<test::TestMigrator>(Slow()),
             true);
    ASSERT_EQ(d.Start().message, "");
    EXPECT_EQ(budget(d), (uint64_t{64} << 20) / 1000 * 100);
    DaemonConfig next = fixed;
    next.tick_ms = 1000;
    next.migrate_rate_mib_s = 2;
    d.Reload(next);
    EXPECT_EQ(budget(d), (uint64_t{2} << 20) / 1000 * 1000);
    next.tick_ms = 10;
    next.migrate_rate_mib_s = 1;  // 10,480 bytes a tick: one swap (two blocks) at least
    d.Reload(next);
    EXPECT_EQ(budget(d), uint64_t{128} << 10);
    d.Stop();
  }
  {
    boost::asio::io_context io;
    Daemon d(io, c, numa::Discover(), tiers, std::make_unique<test::TestMigrator>(Slow()), true);
    ASSERT_EQ(d.Start().message, "");
    EXPECT_EQ(budget(d), 0u);  // no engine before the first hello
    DaemonConfig next = c;
    next.tick_ms = 500;
    next.migrate_rate_mib_s = 8;
    d.Reload(next);
    const server::Peer peer{1, getpid(), getuid(), getgid()};
    d.requests().OnConnect(peer);
    int seg_fd = -1;
    const ModelGeometry model{"reload", 1, 1, 1, 1024, 2, 16};  // 64 KiB blocks
    auto hello = d.requests().OnHello(peer, wire::Hello{model, 16, "reload"}, &seg_fd);
    ASSERT_TRUE(hello.ok());
    close(seg_fd);
    EXPECT_EQ(budget(d), (uint64_t{8} << 20) / 1000 * 500);
    d.requests().OnDisconnect(peer);
    d.Stop();
  }
  std::filesystem::remove_all(dir);
}

// The three views of status render one snapshot: the same figures under the
// names cxltierctl, Prometheus and `systemctl status` know them by.
TEST(Status, JsonMetricsAndStatusLineRenderOneSnapshot) {
  StatusSnapshot s;
  s.clients = 3;
  s.blocks = 40;
  s.touches = 1000;
  s.hits = 875;
  s.memory.rss_bytes = 12345678;
  s.tiers.resize(2);
  s.tiers[0].tier = 0;
  s.tiers[0].blocks = 25;
  s.tiers[0].budget_bytes = 4096;
  s.tiers[0].nodes.push_back({0, true, 1 << 30, 4, 80, std::nullopt, 4});
  s.tiers[1].tier = 1;
  s.tiers[1].blocks = 15;
  s.tiers[1].nodes.push_back({7, false, 0, 0, std::nullopt, std::nullopt, std::nullopt});
  s.migrations.moves.failed = 6;
  s.migrations.moves.errors[ENOMEM] = 2;
  s.tick_seconds.count = 9;
  s.tick_seconds.overruns = 2;
  s.tick_seconds.cumulative.fill(9);
  s.tick_ms = 250;
  s.lease_timeout_s = 30;
  s.migrations.enabled = true;
  s.migrations.oldest_drain_ticks = 8;  // 2 s at 250 ms
  s.hints = {12, 3, 10, 40, 35, 30};
  s.shards = ShardsStatus{"ema:0.05", 4, 0.01, 7000, 60};

  EXPECT_EQ(SystemdStatusLine(s),
            "3 clients, 40 blocks, hit rate 87.5%, tier 0 25 blocks, 6 moves failed");

  const nlohmann::json j = StatusToJson(s);
  EXPECT_EQ(j["clients"], 3);
  EXPECT_EQ(j["blocks"], 40);
  EXPECT_DOUBLE_EQ(j["hit_rate"].get<double>(), 0.875);
  EXPECT_EQ(j["tiers"][0]["blocks"], 25);
  EXPECT_EQ(j["tiers"][0]["budget_bytes"], 4096);
  EXPECT_EQ(j["tiers"][0]["nodes"][0]["read_latency_ns"], 80);
  EXPECT_FALSE(j["tiers"][0]["nodes"][0].contains("read_bandwidth_mib_s"));
  // A node outside the topology shows only its number.
  EXPECT_EQ(j["tiers"][1]["nodes"][0], (nlohmann::json{{"node", 7}}));
  EXPECT_EQ(j["migrations"]["failed"], 6);
  EXPECT_EQ(j["migrations"]["errors"][std::strerror(ENOMEM)], 2);
  EXPECT_EQ(j["memory"]["rss_bytes"], 12345678);
  EXPECT_EQ(j["tick_seconds"]["buckets"].size(), TickTimes::kBounds.size() + 1);
  EXPECT_EQ(j["tick_seconds"]["buckets"].back()["le"], "+Inf");
  EXPECT_EQ(j["hints"]["requests"], 12);
  EXPECT_EQ(j["hints"]["unknown_keys"], 3);
  EXPECT_EQ(j["hints"]["applied"], 10);
  EXPECT_EQ(j["hints"]["prefetched"], 40);
  EXPECT_EQ(j["hints"]["displaced"], 35);
  EXPECT_EQ(j["hints"]["prefetch_hits"], 30);
  EXPECT_EQ(j["tick_seconds"]["overruns"], 2);
  EXPECT_EQ(j["lease_timeout_s"], 30);
  EXPECT_DOUBLE_EQ(j["migrations"]["copy"]["oldest_lease_wait_s"].get<double>(), 2.0);
  EXPECT_EQ(j["shards"]["leader"], "ema:0.05");
  EXPECT_EQ(j["shards"]["switches"], 4);
  EXPECT_DOUBLE_EQ(j["shards"]["rate"].get<double>(), 0.01);
  EXPECT_EQ(j["shards"]["sampled_touches"], 7000);
  EXPECT_EQ(j["shards"]["sampled_keys"], 60);

  const std::string m = MetricsExposition(s);
  for (const char* line :
       {"cxltier_clients 3\n", "cxltier_blocks 40\n", "cxltier_hit_ratio 0.875\n",
        "cxltier_tier_blocks{tier=\"0\"} 25\n", "cxltier_tier_blocks{tier=\"1\"} 15\n",
        "cxltier_tier0_budget_bytes 4096\n", "cxltier_migration_failed_moves_total 6\n",
        "cxltier_migration_failures_total{errno=\"ENOMEM\"} 2\n",
        "cxltier_tick_duration_seconds_bucket{le=\"+Inf\"} 9\n",
        "cxltier_tick_duration_seconds_count 9\n", "process_resident_memory_bytes 12345678\n",
        "cxltier_hint_requests_total 12\n", "cxltier_hints_total 10\n",
        "cxltier_hint_prefetched_blocks_total 40\n", "cxltier_hint_displaced_blocks_total 35\n",
        "cxltier_hint_prefetch_hits_total 30\n",
        "cxltier_policy_leader_info{leader=\"ema:0.05\"} 1\n",
        "cxltier_policy_switches_total 4\n"}) {
    EXPECT_NE(m.find(line), std::string::npos) << line << "\n" << m;
  }
  // Under another policy there is no leader to show.
  StatusSnapshot other = s;
  other.shards.reset();
  EXPECT_TRUE(StatusToJson(other)["shards"].is_null());
  EXPECT_EQ(MetricsExposition(other).find("cxltier_policy_"), std::string::npos);
  // The series the alert rules of deploy/prometheus read.
  for (const char* line :
       {"cxltier_tick_overruns_total 2\n", "cxltier_tick_interval_seconds 0.25\n",
        "cxltier_lease_timeout_seconds 30\n", "cxltier_lease_oldest_wait_seconds 2\n",
        "cxltier_migration_enabled 1\n"}) {
    EXPECT_NE(m.find(line), std::string::npos) << line << "\n" << m;
  }
}

// A tick longer than its interval is an overrun; one of exactly the
// interval, or shorter, is not.
TEST(Status, TickTimesCountOverruns) {
  TickTimes t;
  t.Add(0.010, 0.100);
  t.Add(0.100, 0.100);
  EXPECT_EQ(t.Summary().overruns, 0u);
  t.Add(0.150, 0.100);
  t.Add(0.020, 0.010);
  const TickSummary s = t.Summary();
  EXPECT_EQ(s.overruns, 2u);
  EXPECT_EQ(s.count, 4u);
}

TEST(Admin, RootOrTheAdminGroupByPrimaryGid) {
  const server::Peer root{1, 1, 0, 0};
  EXPECT_TRUE(IsAdmin(root, ""));
  EXPECT_TRUE(IsAdmin(root, "no-such-group-cxltier"));
  // A uid without a passwd entry whose primary gid is the admin group's.
  const server::Peer in_group{2, 1, 54321, 0};
  EXPECT_TRUE(IsAdmin(in_group, "root"));
  EXPECT_FALSE(IsAdmin(in_group, ""));
  EXPECT_FALSE(IsAdmin(in_group, "no-such-group-cxltier"));
  // Neither its primary gid nor (no passwd entry) any supplementary group.
  const server::Peer outsider{3, 1, 54321, 54321};
  EXPECT_FALSE(IsAdmin(outsider, "root"));
}

// The daemon asks who is an admin on every connect, hello, Stats and Admin
// request; the group database is read once per peer per ttl, again when the
// admin group changes, never for root, and the cache stays bounded.
TEST(Admin, TheGroupDatabaseIsReadOncePerPeerPerTtl) {
  using Clock = AdminCache::Clock;
  std::vector<uid_t> asked;
  AdminCache cache(
      [&](const server::Peer& p, const std::string& group) {
        asked.push_back(p.uid);
        return group == "ops" && p.uid == 1000;
      },
      std::chrono::seconds(5), 4);
  const Clock::time_point t0 = Clock::now();
  const server::Peer admin{1, 1, 1000, 100}, other{2, 1, 1001, 100};
  for (int i = 0; i < 1000; ++i) {
    ASSERT_TRUE(cache.Is(admin, "ops", t0 + std::chrono::milliseconds(i)));
    ASSERT_FALSE(cache.Is(other, "ops", t0 + std::chrono::milliseconds(i)));
  }
  EXPECT_EQ(asked, (std::vector<uid_t>{1000, 1001}));
  // Root: no lookup.
  EXPECT_TRUE(cache.Is(server::Peer{3, 1, 0, 0}, "ops", t0));
  EXPECT_EQ(cache.lookups(), 2u);
  // After the ttl the database is read again (a change to the group applies).
  EXPECT_TRUE(cache.Is(admin, "ops", t0 + std::chrono::seconds(5)));
  EXPECT_EQ(cache.lookups(), 3u);
  // Another admin group (a reload): every answer is asked again.
  EXPECT_FALSE(cache.Is(admin, "other", t0 + std::chrono::seconds(6)));
  EXPECT_EQ(cache.lookups(), 4u);
  // The same uid with another gid is another peer.
  EXPECT_FALSE(cache.Is(server::Peer{4, 1, 1000, 200}, "other", t0 + std::chrono::seconds(6)));
  EXPECT_EQ(cache.lookups(), 5u);
  // Bounded: 100 peers, at most 4 entries; the newest is still answered.
  for (uid_t u = 2000; u < 2100; ++u) {
    cache.Is(server::Peer{5, 1, u, u}, "other", t0 + std::chrono::seconds(7));
    ASSERT_LE(cache.size(), 4u);
  }
  const uint64_t before = cache.lookups();
  cache.Is(server::Peer{5, 1, 2099, 2099}, "other", t0 + std::chrono::seconds(7));
  EXPECT_EQ(cache.lookups(), before);
}

// Lines about clients are limited per uid, whatever the connection: one uid
// past its burst is held back and summed up once its window is over, while
// another uid's lines go on.
TEST(PeerLog, LimitsEachUidAcrossItsConnectionsAndSumsUpTheRest) {
  using Clock = server::PeerLog::Clock;
  server::PeerLog log(3, std::chrono::seconds(10));
  std::vector<std::string> lines;
  log.set_sink([&](server::LogLevel, const std::string& l) { lines.push_back(l); });
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < 50; ++i) log.Line(1000, server::LogLevel::kWarn, "evil", t0);
  log.Line(2000, server::LogLevel::kInfo, "good", t0);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "evil"), 3);
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "good"), 1);
  EXPECT_EQ(log.suppressed(), 47u);
  // Nothing more from uid 1000: the sweep sums its window up once it is over,
  // and forgets both uids.
  log.MaybeSweep(t0 + std::chrono::seconds(5));
  EXPECT_EQ(lines.size(), 4u);
  log.MaybeSweep(t0 + std::chrono::seconds(11));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines.back(),
            "uid 1000: 47 more lines about its clients were suppressed in the last 11 s");
  EXPECT_EQ(log.uids(), 0u);
  // A new window: its burst again.
  for (int i = 0; i < 5; ++i) {
    log.Line(1000, server::LogLevel::kWarn, "evil", t0 + std::chrono::seconds(12));
  }
  EXPECT_EQ(std::count(lines.begin(), lines.end(), "evil"), 6);
}

}  // namespace
}  // namespace cxltier::service
