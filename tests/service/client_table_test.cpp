// ClientTable and Fold alone: no socket, no io_context, no daemon. The
// table's invariants (client_table.h) checked after every Bind and Unbind
// against a plain model, its per-uid counts against the limits they
// enforce, and the fold's reading of a client's segment: dirty slots once,
// a full fold every kFullFoldTicks, implausible totals counted and dropped.
#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <random>
#include <vector>

#include "colliding_keys.h"
#include "cxltier/segment.h"
#include "engine/engine.h"
#include "engine/policy.h"
#include "models.h"
#include "service/client_table.h"
#include "service/config.h"
#include "service/fold.h"

namespace cxltier::service {
namespace {

server::Peer PeerOf(uint64_t session, uid_t uid) {
  return server::Peer{session, getpid(), uid, static_cast<gid_t>(uid)};
}

engine::Engine MakeEngine() {
  engine::EngineOptions o;
  o.block_bytes = kTiny4KiB.block_bytes();
  o.tier0_budget_bytes = 64 * o.block_bytes;
  o.mode = engine::Mode::kTick;
  return engine::Engine(o, std::move(*engine::MakePolicy("lru")));
}

// Every invariant client_table.h states, for every slot of `c`.
void ExpectInStep(ClientTable& table, Client& c) {
  uint64_t live = 0;
  for (uint32_t i = 0; i < c.slots.size(); ++i) {
    const SegSlot& s = c.slots[i];
    ASSERT_EQ(s.live, c.live_slots[i] != 0) << "slot " << i;
    if (!s.live) continue;
    ++live;
    ASSERT_EQ(c.by_key.Find(s.key), i) << "slot " << i;
    const auto holder = table.HolderOf(s.engine_slot);
    ASSERT_TRUE(holder) << "slot " << i;
    ASSERT_EQ(holder->client, &c);
    ASSERT_EQ(holder->seg_slot, i);
    ASSERT_EQ(c.segment.slot(i)->key, s.key) << "the segment names the block held";
  }
  ASSERT_EQ(c.live, live);
  ASSERT_EQ(c.by_key.size(), live) << "the key map holds exactly the live slots";
}

// A client's key map is keyed by the daemon's secret (KeyHashSeed): keys
// chosen to collide in an unkeyed index spread as any keys do.
TEST(ClientTable, AClientsKeyMapIsKeyedAgainstChosenCollisions) {
  constexpr uint32_t kSlots = 4096;
  ClientTable table;
  Client& c = table.Connect(PeerOf(1, 1000));
  ASSERT_TRUE(table.Open(c, kSlots, "t").ok());
  EXPECT_NE(KeyHashSeed(), 0u);
  for (uint32_t i = 0; i < kSlots; ++i) {
    c.slots[i].key = test::CollidingKey(i);
    ASSERT_EQ(c.by_key.Insert(c.slots[i].key, i), i);
  }
  EXPECT_LT(c.by_key.LongestRun(), 64u) << "an unkeyed map puts all 4,096 in one run";
  for (uint32_t i = 0; i < kSlots; ++i) c.by_key.Erase(c.slots[i].key);
}

// Keys live in one namespace per uid: the engine's key depends on the uid
// and on the secret, and the key that once reached another uid's (the key
// XORed with a public function of both uids) no longer does. The secret
// outlives the process in the state directory, readable by its owner only.
TEST(EngineKeys, OneNamespacePerUidUnderASecretKeptInTheStateDir) {
  char tmpl[] = "/tmp/cxltier-keys-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  bool created = false;
  Result<EngineKeys> first = EngineKeys::InStateDir(dir, &created);
  ASSERT_TRUE(first.ok()) << first.status().message;
  EXPECT_TRUE(created);
  const BlockKey k = BlockKey::FromSequence(5151, 7);
  const uid_t a = 65534, b = 1000;
  EXPECT_NE(first->Of(k, a), first->Of(k, b));
  const auto mask = [](uid_t u) { return 0x9e3779b97f4a7c15ULL * (uint64_t{u} + 1); };
  const BlockKey forged{k.hi ^ mask(b) ^ mask(a), k.lo};
  EXPECT_NE(first->Of(forged, a), first->Of(k, b));
  // Another secret, other keys; the same directory, the same keys.
  EXPECT_NE(EngineKeys().Of(k, b), first->Of(k, b));
  Result<EngineKeys> again = EngineKeys::InStateDir(dir, &created);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(again->Of(k, b), first->Of(k, b));
  struct stat st {};
  ASSERT_EQ(stat((dir + "/key-secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A secret others may read is not used: a new one replaces it.
  ASSERT_EQ(chmod((dir + "/key-secret").c_str(), 0644), 0);
  Result<EngineKeys> exposed = EngineKeys::InStateDir(dir, &created);
  ASSERT_TRUE(exposed.ok());
  EXPECT_TRUE(created);
  EXPECT_NE(exposed->Of(k, b), first->Of(k, b));
  ASSERT_EQ(stat((dir + "/key-secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::filesystem::remove_all(dir);
}

TEST(ClientTable, BindAndUnbindKeepEveryIndexInStep) {
  constexpr uint32_t kSlots = 256;
  ClientTable table;
  Client& c = table.Connect(PeerOf(1, 1000));
  ASSERT_TRUE(table.Open(c, kSlots, "t").ok());
  engine::Engine e = MakeEngine();
  std::mt19937_64 rng(7);
  std::map<uint64_t, uint32_t> model;  // sequence number -> segment slot
  for (int step = 0; step < 20000; ++step) {
    const uint64_t n = rng() % 400;
    const BlockKey key = BlockKey::FromSequence(5, n);
    const auto it = model.find(n);
    if (it == model.end() && model.size() < kSlots) {
      ASSERT_EQ(c.by_key.Find(key), engine::kNoSlot);
      const engine::Slot es = e.Admit(table.EngineKey(key, c.peer.uid), Tier::kSlow, c.peer.uid);
      model[n] = table.Bind(c, es, 0, static_cast<uint32_t>(n), key);
    } else if (it != model.end()) {
      const uint32_t seg = it->second;
      const engine::Slot es = c.slots[seg].engine_slot;
      e.Release(es);
      table.Unbind(c, seg);
      ASSERT_FALSE(table.HolderOf(es)) << "an unbound engine slot has no holder";
      ASSERT_EQ(c.by_key.Find(key), engine::kNoSlot);
      model.erase(it);
    }
    if (step % 1000 == 0) {
      ASSERT_NO_FATAL_FAILURE(ExpectInStep(table, c));
    }
  }
  ASSERT_NO_FATAL_FAILURE(ExpectInStep(table, c));
  EXPECT_EQ(c.live, model.size());
  EXPECT_EQ(c.free_slots.size() + c.live, kSlots);
}

TEST(ClientTable, ConnectionsAndSegmentsAreCountedPerUidAcrossConnections) {
  DaemonConfig config;
  config.max_connections_per_uid = 2;
  config.max_blocks_per_client = 1024;
  config.max_segment_bytes_per_uid = SegmentBytes(1024) + SegmentBytes(512);
  ClientTable table;
  Client& a = table.Connect(PeerOf(1, 1000));
  Client& b = table.Connect(PeerOf(2, 1000));
  // A third connection of uid 1000 is refused; another uid, and root, get in.
  EXPECT_FALSE(table.CheckConnect(PeerOf(3, 1000), false, config).ok());
  EXPECT_TRUE(table.CheckConnect(PeerOf(3, 1001), false, config).ok());
  EXPECT_TRUE(table.CheckConnect(PeerOf(3, 1000), true, config).ok());

  const wire::Hello too_many{kTiny4KiB, 1025, "a"};
  EXPECT_FALSE(table.CheckHello(a, too_many, config).ok()) << "more slots than a client may have";
  const wire::Hello big{kTiny4KiB, 1024, "a"};
  ASSERT_TRUE(table.CheckHello(a, big, config).ok());
  ASSERT_TRUE(table.Open(a, 1024, "a").ok());
  // The uid's segments together: 1,024 slots held, so 1,024 more are over.
  EXPECT_FALSE(table.CheckHello(b, big, config).ok());
  const wire::Hello fits{kTiny4KiB, 512, "b"};
  ASSERT_TRUE(table.CheckHello(b, fits, config).ok());

  // Gone, a connection's segment and its place among the uid's connections
  // are free again.
  table.MarkLeaving(a);
  table.Remove(a.peer.session_id);
  EXPECT_TRUE(table.CheckHello(b, big, config).ok());
  EXPECT_TRUE(table.CheckConnect(PeerOf(3, 1000), false, config).ok());
  EXPECT_EQ(table.connections(), 1u);
}

TEST(ClientTable, ClientsOfOneUidAndNameShareTheirAccount) {
  ClientTable table;
  Client& a = table.Connect(PeerOf(1, 1000));
  Client& b = table.Connect(PeerOf(2, 1000));
  Client& other_name = table.Connect(PeerOf(3, 1000));
  Client& other_uid = table.Connect(PeerOf(4, 1001));
  ASSERT_TRUE(table.Open(a, 8, "engine").ok());
  ASSERT_TRUE(table.Open(b, 8, "engine").ok());
  ASSERT_TRUE(table.Open(other_name, 8, "other").ok());
  ASSERT_TRUE(table.Open(other_uid, 8, "engine").ok());
  EXPECT_EQ(a.account, b.account) << "a second connection of the name is no way around a quota";
  EXPECT_NE(a.account, other_name.account);
  EXPECT_NE(a.account, other_uid.account);
  EXPECT_NE(a.account & engine::kClientAccount, 0u);
}

// A Fold over a client of `slots` bound slots: slot i holds key (9, i).
struct Folding {
  explicit Folding(uint32_t slots) : c(table.Connect(PeerOf(1, 1000))) {
    EXPECT_TRUE(table.Open(c, slots, "t").ok());
    for (uint32_t i = 0; i < slots; ++i) {
      const BlockKey key = BlockKey::FromSequence(9, i);
      const engine::Slot es = e.Admit(table.EngineKey(key, c.peer.uid), Tier::kSlow, c.peer.uid);
      WriteBack(e, c, table.Bind(c, es, 0, i, key));
    }
  }
  const BlockState& engine_state(uint32_t seg) { return e.state(c.slots[seg].engine_slot); }
  ClientTable table;
  Client& c;
  engine::Engine e = MakeEngine();
  Fold fold;
};

TEST(Fold, DirtySlotsAreFoldedOnceAndWrittenBack) {
  Folding f(128);
  BlockState* seg = f.c.segment.slot(0);
  uint64_t* dirty = f.c.segment.dirty();
  ASSERT_TRUE(AddObservation(seg, dirty, 3, 2.0f));
  ASSERT_TRUE(AddObservation(seg, dirty, 3, 1.0f));
  ASSERT_TRUE(AddObservation(seg, dirty, 70, 0.5f));
  f.fold.Run(f.c, f.e, 1);
  EXPECT_EQ(f.e.counters().touches, 2u) << "one touch per observed block, not per observation";
  EXPECT_EQ(f.c.observations, 3u);
  EXPECT_EQ(f.engine_state(3).touch_time, 1u);
  EXPECT_EQ(f.engine_state(70).touch_time, 1u);
  EXPECT_EQ(f.engine_state(4).touch_time, 0u);
  // Written back: the client reads the engine's view of its block.
  EXPECT_EQ(seg[3].touch_time, 1u);
  EXPECT_EQ(seg[3].touch_count, f.engine_state(3).touch_count);
  // Nothing new: the next fold touches nothing.
  f.fold.Run(f.c, f.e, 2);
  EXPECT_EQ(f.e.counters().touches, 2u);
  EXPECT_EQ(f.c.bad_observations, 0u);
}

// A hint's fold stops after `max_slots` dirty bits, a free slot's bit
// counted as a live one's: the client writes the bitmap, and a hint whose
// fold walked every bit a client set while counting only its live slots
// cost 1.2 ms and was charged 3 us of units (a helper's audit: one
// connection held the daemon at 97% CPU, never throttled).
TEST(Fold, AHintsFoldCountsEveryDirtyBitItTakes) {
  constexpr uint32_t kSlots = 8192;
  ClientTable table;
  Client& c = table.Connect(PeerOf(1, 1000));
  ASSERT_TRUE(table.Open(c, kSlots, "t").ok());
  engine::Engine e = MakeEngine();
  const BlockKey key = BlockKey::FromSequence(9, kSlots - 1);
  const engine::Slot es = e.Admit(table.EngineKey(key, c.peer.uid), Tier::kSlow, c.peer.uid);
  WriteBack(e, c, table.Bind(c, es, 0, 0, key));  // the one live slot: 0
  uint64_t* dirty = c.segment.dirty();
  for (uint32_t w = 0; w < SegmentDirtyWords(kSlots); ++w) dirty[w] = ~uint64_t{0};
  Fold fold;
  const Fold::Pending done = fold.RunPending(c, e, 1, 1024);
  EXPECT_LE(done.words, 1024u / 64 + 1) << "it stops after 1,024 bits, whole words";
  EXPECT_EQ(done.slots, done.words * 64) << "every bit taken is counted";
  EXPECT_EQ(dirty[SegmentDirtyWords(kSlots) - 1], ~uint64_t{0}) << "the rest waits for the tick";
}

TEST(Fold, AnUnmarkedObservationWaitsForTheFullFold) {
  Folding f(128);
  BlockState* seg = f.c.segment.slot(0);
  ASSERT_TRUE(AddObservation(&seg[5], 1.0f));  // no dirty bit: a lost race
  for (uint64_t tick = 1; tick < kFullFoldTicks; ++tick) {
    f.fold.Run(f.c, f.e, tick);
    ASSERT_EQ(f.e.counters().touches, 0u) << "tick " << tick;
  }
  f.fold.Run(f.c, f.e, kFullFoldTicks);
  EXPECT_EQ(f.e.counters().touches, 1u);
  EXPECT_EQ(f.engine_state(5).touch_time, kFullFoldTicks);
}

TEST(Fold, ImplausibleTotalsAreCountedAndFoldedAsNothing) {
  Folding f(128);
  BlockState* seg = f.c.segment.slot(0);
  uint64_t* dirty = f.c.segment.dirty();
  // A hostile client writes its totals directly: more touches than a tick
  // can have, and (another slot) more mass than its touches can carry.
  seg[1].client_touches = static_cast<uint32_t>(kMaxTouchesPerTick + 1);
  MarkDirty(dirty, 1);
  seg[2].client_touches = 1;
  seg[2].client_mass_q16 = ~0u;
  MarkDirty(dirty, 2);
  ASSERT_TRUE(AddObservation(seg, dirty, 3, 1.0f));
  f.fold.Run(f.c, f.e, 1);
  EXPECT_EQ(f.c.bad_observations, 2u);
  EXPECT_EQ(f.engine_state(1).touch_time, 0u) << "too many touches: not folded";
  EXPECT_EQ(f.engine_state(2).touch_time, 1u) << "too much mass: a touch of nothing";
  EXPECT_EQ(f.engine_state(3).touch_time, 1u) << "the honest slot beside them is folded";
}

}  // namespace
}  // namespace cxltier::service
