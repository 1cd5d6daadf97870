// Copy mode's bookkeeping on the daemon's side (service/copy_mode.h and
// MoveDispatch::Complete): a real client table, segment and tier pools, the
// steps the daemon takes called in a chosen order, so a copy can be "in
// flight" across a release and an admission. The same steps, in every
// order, are in tests/lease/lease_model_test.cpp (LeaseDaemonModel).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cxltier/lease.h"
#include "numa/migrator.h"
#include "service/client_table.h"
#include "service/config.h"
#include "service/copy_mode.h"
#include "service/move_dispatch.h"
#include "service/mover.h"

namespace cxltier::service {
namespace {

constexpr uint32_t kBlocksPerTier = 2;

struct CopyClient {
  ClientTable clients;
  MoveDispatch moves{numa::TierAssignment{{0}, {0}, "test: both tiers on node 0", {}},
                     std::shared_ptr<numa::Migrator>(numa::MakeLinuxMigrator()), 1 << 30,
                     [](MoveDone) {}};
  Client* c = nullptr;
  uint64_t tick = 100;
  std::vector<std::string> warnings;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));

  CopyClient() {
    c = &clients.Connect(server::Peer{1, getpid(), getuid(), getgid()});
    EXPECT_TRUE(clients.Open(*c, 4, "copy-state").ok());
    for (uint8_t tier : {0, 1}) {
      server::Pool p;
      const Status st = p.OpenTier(tier, kBlocksPerTier, page, page, {0},
                                   wire::TierPoolSource::kDaemon, server::UniqueFd(), 0);
      EXPECT_TRUE(st.ok()) << st.message;
      clients.AddTierPool(*c, std::move(p));
    }
  }

  uint64_t* words() const { return c->segment.locations(); }
  LeaseEntry* lease(uint32_t i) const { return const_cast<LeaseEntry*>(c->segment.leases()) + i; }

  // Daemon::AdmitCopy for one key, then the client fills it (EndWrite).
  uint32_t Admit(engine::Slot es) {
    uint32_t pool = 0, index = 0;
    TierRoom room;
    room.fill(UINT64_MAX);
    EXPECT_TRUE(PlaceNew(*c, static_cast<uint32_t>(c->copy.pool[0]), room, &pool, &index).ok());
    const uint32_t seg = clients.Bind(*c, es, pool, index, BlockKey{es, es});
    PublishAdmitted(*c, seg);
    EXPECT_TRUE(EndWrite(words(), seg));
    return seg;
  }

  // What MoveDispatch::DispatchCopy hands the mover for a move of `seg` to
  // the other tier.
  MoveJob StartCopy(uint32_t seg, engine::Slot es) {
    const SegSlot& s = c->slots[seg];
    const uint32_t to = static_cast<uint32_t>(c->copy.pool[1 - c->pools[s.pool].tier()]);
    uint32_t index = 0;
    EXPECT_TRUE(c->pools[to].TakeFree(&index));
    CopyJob j;
    j.src_pool = c->pools[s.pool].mapping();
    j.dst_pool = c->pools[to].mapping();
    j.segment = c->segment.mapping();
    j.src = c->pools[s.pool].BlockAddress(s.block);
    j.dst = c->pools[to].BlockAddress(index);
    j.bytes = page;
    j.words = words();
    j.seg = seg;
    j.expected = PlaceWord(*c, seg);
    j.next = LocationWord(c->pools[to].tier(), index, c->copy.version[seg] + 1);
    j.src_pool_id = s.pool;
    j.src_index = s.block;
    j.dst_pool_id = to;
    j.dst_index = index;
    CopyStarted(*c, seg);
    return MoveJob{engine::Move{es, 0, Tier::kFast, Tier::kSlow},
                   {},
                   j,
                   0,
                   c->peer.session_id,
                   seg,
                   s.pool,
                   s.block};
  }

  // Daemon::ReleaseSlot's copy-mode part.
  void Release(uint32_t seg) {
    EXPECT_TRUE(Retire(*c, seg, tick, false));
    clients.Unbind(*c, seg);
  }

  // The copy's result back on the I/O thread (no engine: the block is gone
  // from it, as after its release).
  void Back(const MoveJob& job, numa::MoveResult r) {
    moves.Complete(
        MoveDone{job, r}, nullptr, clients,
        [&](const Client&, const std::string& w) { warnings.push_back(w); }, tick);
  }
  static numa::MoveResult Cancelled() {
    numa::MoveResult r;
    r.call_errno = ECANCELED;
    return r;
  }

  size_t Drain() {
    DrainPlaces(*c, ++tick, 1000);
    return c->copy.draining.size();
  }
  uint64_t Free() const { return FreePlaces(*c); }
};

// The leak this bookkeeping had: a copy of the slot's first admission still
// in flight (here queued, later cancelled) while the slot is released,
// admitted again and released again. The second place is no copy's source,
// so it drains at once; the first waits for its copy only.
TEST(CopyState, ReleaseReadmitAndReleaseWhileACopyIsInFlightLeaksNothing) {
  CopyClient t;
  const uint32_t seg = t.Admit(1);
  const MoveJob copy = t.StartCopy(seg, 1);  // takes the tier-1 block
  t.Release(seg);
  ASSERT_EQ(t.Admit(2), seg);  // the same segment slot, another place
  t.Release(seg);
  EXPECT_EQ(t.Drain(), 1u) << "only the first place waits, for its copy";
  EXPECT_EQ(t.Free(), 2 * kBlocksPerTier - 2);
  t.Back(copy, CopyClient::Cancelled());
  EXPECT_EQ(t.Drain(), 0u) << "a place is kept for a copy that will never come back";
  EXPECT_EQ(t.Free(), 2 * kBlocksPerTier);
  EXPECT_TRUE(t.c->copy.in_flight.empty());
  EXPECT_EQ(t.c->copy.copying[seg], 0);
}

// A copy published, then the slot released before the copy is back: the
// source waits for the mover and for a reader's lease, the new place (where
// readers may have gone after the publish) for its readers.
TEST(CopyState, ASourceWaitsForItsCopyAndItsReaders) {
  CopyClient t;
  const uint32_t seg = t.Admit(1);
  Location where;
  ASSERT_TRUE(AcquireRead(t.words(), t.lease(0), seg, t.tick, &where));  // on the source
  const MoveJob copy = t.StartCopy(seg, 1);
  const numa::MoveResult r = RunCopy(*copy.copy);
  ASSERT_TRUE(r.done()) << r.call_errno;
  ASSERT_TRUE(AcquireRead(t.words(), t.lease(1), seg, t.tick, &where));  // on the copy
  t.Release(seg);
  EXPECT_EQ(t.Drain(), 1u) << "the source: the mover and a reader";
  t.Back(copy, r);
  EXPECT_EQ(t.Drain(), 2u) << "the source (a reader) and the copy (a reader)";
  ReleaseRead(t.lease(0));
  EXPECT_EQ(t.Drain(), 1u);
  ReleaseRead(t.lease(1));
  EXPECT_EQ(t.Drain(), 0u);
  EXPECT_EQ(t.Free(), 2 * kBlocksPerTier);
}

// Two copies of one slot in flight at once, of its first and its second
// admission: each place waits for its own copy.
TEST(CopyState, TwoAdmissionsCopiesEachKeepTheirOwnSource) {
  CopyClient t;
  const uint32_t seg = t.Admit(1);
  const MoveJob first = t.StartCopy(seg, 1);
  t.Release(seg);
  ASSERT_EQ(t.Admit(2), seg);
  const MoveJob second = t.StartCopy(seg, 2);
  t.Release(seg);
  EXPECT_EQ(t.Drain(), 2u);
  EXPECT_EQ(t.c->copy.copying[seg], 2);
  t.Back(first, CopyClient::Cancelled());
  EXPECT_EQ(t.Drain(), 1u) << "the second place: its copy is still in flight";
  t.Back(second, CopyClient::Cancelled());
  EXPECT_EQ(t.Drain(), 0u);
  EXPECT_EQ(t.Free(), 2 * kBlocksPerTier);
}

// A client that left (or a daemon that stops) keeps each block's last place
// in the segment, and nothing drains: the client's readers may go on
// reading those bytes, and a reconnect re-admits each block there.
TEST(CopyState, ALeavingClientKeepsItsPlacesInTheSegment) {
  CopyClient t;
  const uint32_t seg = t.Admit(1);
  const uint64_t before = std::atomic_ref<uint64_t>(t.words()[seg]).load();
  EXPECT_TRUE(Retire(*t.c, seg, t.tick, true));
  EXPECT_EQ(std::atomic_ref<uint64_t>(t.words()[seg]).load(), before);
  EXPECT_TRUE(DecodeLocation(before).has_place());
  EXPECT_TRUE(t.c->copy.draining.empty());
}

// A copy that publishes around a release that keeps the word (the client
// left; its later slots are still being released, so it is still in the
// table): the word names the copy's place, where the old segment's readers
// go. That place must never be drained, freed or handed to another copy;
// the source drains once its readers are gone. Both orders: published before
// the release, and after it (the mover's compare-and-swap still finds the
// word it expects, since a kept word is left alone).
TEST(CopyState, ALeavingClientsCopyKeepsThePlaceItPublished) {
  for (const bool publish_first : {true, false}) {
    SCOPED_TRACE(publish_first ? "published before the release" : "published after it");
    CopyClient t;
    const uint32_t a = t.Admit(1);
    const uint32_t b = t.Admit(2);
    auto place = [&](uint64_t w) {
      const Location l = DecodeLocation(w);
      return t.c->pools[static_cast<size_t>(t.c->copy.pool[l.tier])].BlockAddress(l.index);
    };
    std::memset(place(t.words()[a]), 'A', t.page);
    std::memset(place(t.words()[b]), 'B', t.page);
    const uint64_t free_before = t.Free();
    const MoveJob copy = t.StartCopy(a, 1);
    numa::MoveResult r;
    if (publish_first) r = RunCopy(*copy.copy);
    // The connection drops: ReleaseSlot with keep_place, a's slot first.
    t.clients.MarkLeaving(*t.c);
    ASSERT_TRUE(Retire(*t.c, a, t.tick, /*keep_word=*/true));
    t.clients.Unbind(*t.c, a);
    if (!publish_first) r = RunCopy(*copy.copy);
    ASSERT_TRUE(r.done());
    const uint64_t kept = std::atomic_ref<uint64_t>(t.words()[a]).load();
    ASSERT_EQ(kept, copy.copy->next) << "the copy published its place into the kept word";
    const uint8_t* bytes = place(kept);
    // The copy comes back while the client is still in the table; ticks drain.
    t.Back(copy, r);
    t.Drain();
    t.Drain();
    // A reader of the old segment takes a lease where the word says.
    Location where;
    ASSERT_TRUE(AcquireRead(t.words(), t.lease(0), a, t.tick, &where));
    EXPECT_EQ(std::atomic_ref<uint64_t>(t.words()[a]).load(), kept);
    // The source went back to the free places; the copy's place did not.
    EXPECT_EQ(t.Free(), free_before) << "one place taken by the copy, one freed";
    EXPECT_TRUE(t.c->pools[copy.copy->src_pool_id].IsFree(copy.copy->src_index)) << "the source";
    EXPECT_FALSE(t.c->pools[copy.copy->dst_pool_id].IsFree(copy.copy->dst_index))
        << "the place a's word names";
    // A later tick copies b, another block of the leaving client.
    const MoveJob next = t.StartCopy(b, 2);
    EXPECT_NE(next.copy->dst, bytes) << "the place a's word names went to another copy";
    EXPECT_TRUE(RunCopy(*next.copy).done());
    EXPECT_EQ(bytes[0], 'A') << "a reader holding a lease on a's word reads b's bytes";
    EXPECT_EQ(bytes[t.page - 1], 'A');
  }
}

// A tier pool handed to another daemon (a reconnect) is adopted with its
// bytes; a block is then taken at the place a reconnect names, and only once.
TEST(CopyState, AnImportedPoolKeepsItsBytesAndPlacesAreTakenWhereNamed) {
  CopyClient t;
  const server::Pool& made = t.c->pools[static_cast<size_t>(t.c->copy.pool[1])];
  for (uint32_t i = 0; i < kBlocksPerTier; ++i)
    made.BlockAddress(i)[7] = static_cast<uint8_t>(i + 1);
  server::Pool adopted;
  const Status st =
      adopted.OpenTier(1, kBlocksPerTier, t.page, t.page, {0}, wire::TierPoolSource::kImport,
                       server::UniqueFd(fcntl(made.tier_fd(), F_DUPFD_CLOEXEC, 0)), 0);
  ASSERT_TRUE(st.ok()) << st.message;
  EXPECT_EQ(adopted.tier_fd(), -1);  // nothing to pass back: the client has it
  EXPECT_TRUE(adopted.daemon_memory());
  for (uint32_t i = 0; i < kBlocksPerTier; ++i) EXPECT_EQ(adopted.BlockAddress(i)[7], i + 1);
  EXPECT_TRUE(adopted.TakeAt(1));
  EXPECT_FALSE(adopted.TakeAt(1));
  EXPECT_FALSE(adopted.TakeAt(kBlocksPerTier));
  uint32_t index = 99;
  ASSERT_TRUE(adopted.TakeFree(&index));
  EXPECT_EQ(index, 0u);  // the one left
  EXPECT_FALSE(adopted.TakeFree(&index));
  adopted.PutFree(1);
  adopted.PutFree(1);  // twice: counted once
  EXPECT_EQ(adopted.free_blocks(), 1u);
  // The wrong tier's name, or a pool of another size: refused.
  server::Pool wrong;
  EXPECT_FALSE(wrong
                   .OpenTier(0, kBlocksPerTier, t.page, t.page, {0}, wire::TierPoolSource::kImport,
                             server::UniqueFd(fcntl(made.tier_fd(), F_DUPFD_CLOEXEC, 0)), 0)
                   .ok());
  EXPECT_FALSE(wrong
                   .OpenTier(1, kBlocksPerTier + 1, t.page, t.page, {0},
                             wire::TierPoolSource::kImport,
                             server::UniqueFd(fcntl(made.tier_fd(), F_DUPFD_CLOEXEC, 0)), 0)
                   .ok());
}

// The quotas' room: a new block goes to a tier only while the room there
// lasts (its write lease would keep it where it lands), else to the next
// tier with a free place and room; none left: refused.
TEST(CopyState, NewBlocksGoOverNoCap) {
  CopyClient t;
  TierRoom room;
  room.fill(UINT64_MAX);
  room[0] = 1;  // tier 0 has two free places, its cap room for one
  uint32_t pool = 0, index = 0;
  const uint32_t fast = static_cast<uint32_t>(t.c->copy.pool[0]);
  const uint32_t slow = static_cast<uint32_t>(t.c->copy.pool[1]);
  ASSERT_TRUE(PlaceNew(*t.c, fast, room, &pool, &index).ok());
  EXPECT_EQ(pool, fast);
  EXPECT_EQ(room[0], 0u);
  EXPECT_EQ(FreePlaces(*t.c), 2 * kBlocksPerTier - 1);
  EXPECT_EQ(FreePlaces(*t.c, room), kBlocksPerTier);  // tier 0's free place is past the cap
  for (uint32_t i = 0; i < kBlocksPerTier; ++i) {
    ASSERT_TRUE(PlaceNew(*t.c, fast, room, &pool, &index).ok());
    EXPECT_EQ(pool, slow) << i;
  }
  EXPECT_EQ(FreePlaces(*t.c, room), 0u);
  const Status full = PlaceNew(*t.c, fast, room, &pool, &index);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.code, wire::ErrorCode::kLimit);
  EXPECT_EQ(t.c->pools[fast].free_blocks(), 1u);  // left alone
}

// One uid's tier pools of a tier stay within that tier's bound over all its
// connections: the second connection's pool counts the first's.
TEST(CopyState, TierPoolBytesOfAUidAddUpAcrossItsConnections) {
  CopyClient t;  // uid getuid(): two pools of kBlocksPerTier pages, tiers 0 and 1
  Client& second = t.clients.Connect(server::Peer{2, getpid(), getuid(), getgid()});
  ASSERT_TRUE(t.clients.Open(second, 4, "copy-state-2").ok());
  const DaemonConfig config;  // max_tier_pool_bytes_per_uid: 0, the tiers' bounds alone
  wire::CreateTierPool m;
  m.tier = 1;
  m.stride = t.page;
  m.blocks = 2;
  const ClientTable::TierBound bound{4 * t.page, "the memory of tier 1's nodes"};
  EXPECT_TRUE(t.clients.CheckTierPoolBytes(second, m, 2, bound, config).ok());  // 2 + 2 pages
  const Status over = t.clients.CheckTierPoolBytes(second, m, 3, bound, config);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.code, wire::ErrorCode::kLimit);
  EXPECT_NE(over.message.find("the memory of tier 1's nodes"), std::string::npos) << over.message;
  EXPECT_NE(over.message.find("it holds 8.00 KiB of them already"), std::string::npos)
      << over.message;
  // Each tier on its own: tier 0's 2 pages and tier 1's 2 are not added up.
  m.tier = 0;
  EXPECT_TRUE(t.clients.CheckTierPoolBytes(second, m, 2, bound, config).ok());
  EXPECT_FALSE(t.clients.CheckTierPoolBytes(second, m, 3, bound, config).ok());
  // Device-DAX memory is the client's own.
  m.tier = 1;
  m.source = wire::TierPoolSource::kDevdax;
  EXPECT_TRUE(t.clients.CheckTierPoolBytes(second, m, 3, bound, config).ok());
  EXPECT_EQ(t.clients.UidTierPoolBlocks(getuid(), 1), kBlocksPerTier);
  EXPECT_EQ(t.clients.AccountTierPoolBlocks(t.c->account, 0), kBlocksPerTier);
  EXPECT_EQ(t.clients.AccountTierPoolBlocks(second.account, 0), 0u);  // another name
}

}  // namespace
}  // namespace cxltier::service
