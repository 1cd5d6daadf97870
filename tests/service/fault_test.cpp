// The daemon under a migrator that fails: an in-process Daemon (no socket)
// whose moves go through the real LinuxMigrator on real memory, with faults
// injected in front of it: EBUSY pages, ENOMEM and EFAULT from the call, and
// partial moves. Checks that a block's tier is written only after a verified
// move, that failures back off, that no KV byte changes, and that the daemon
// keeps serving.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cxltier/segment.h"
#include "models.h"
#include "numa/migrator.h"
#include "service/daemon.h"
#include "simulate.h"
#include "test_migrator.h"

namespace cxltier::service {
namespace {

// Every Move call while failing gets the next of four faults in turn
// (EBUSY, ENOMEM, EFAULT, a partial move); otherwise moves pass through to
// the real migrator.
std::unique_ptr<test::TestMigrator> FaultMigrator() {
  return std::make_unique<test::TestMigrator>(
      test::TestMigrator::Options{.real = true, .failing = true});
}

constexpr uint32_t kBlocks = 16;

uint64_t Sum(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A daemon's configuration for these tests: Tick() called by hand, a fresh
// state directory named by `tag`, no periodic checkpoint, room for kBlocks
// blocks, tier 0 holding `tier0_blocks` of them.
DaemonConfig TestConfig(const std::string& tag, uint32_t tier0_blocks) {
  DaemonConfig c;
  c.tick_ms = 1000;
  c.state_dir =
      (std::filesystem::temp_directory_path() / (tag + std::to_string(getpid()))).string();
  std::filesystem::create_directories(c.state_dir);
  c.checkpoint_interval_s = 0;
  c.tier0_budget_bytes = uint64_t{tier0_blocks} * kSmall64KiB.block_bytes();
  c.max_blocks_per_client = kBlocks;
  c.migrate_rate_mib_s = 1024;
  return c;
}

// The test's client, said hello as `name` (kBlocks slots of 64 KiB blocks):
// its state segment's slots and dirty bits, mapped here (null on failure).
struct ClientSegment {
  void* base = nullptr;  // the mapping, SegmentBytes(kBlocks)
  BlockState* slots = nullptr;
  uint64_t* dirty = nullptr;
};
ClientSegment Hello(Daemon& d, const server::Peer& peer, const char* name) {
  d.requests().OnConnect(peer);
  int seg_fd = -1;
  auto hello = d.requests().OnHello(peer, wire::Hello{kSmall64KiB, kBlocks, name}, &seg_fd);
  EXPECT_TRUE(hello.ok());
  if (!hello.ok()) return {};
  void* seg = mmap(nullptr, SegmentBytes(kBlocks), PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
  close(seg_fd);
  EXPECT_NE(seg, MAP_FAILED);
  if (seg == MAP_FAILED) return {};
  return {seg, reinterpret_cast<BlockState*>(static_cast<char*>(seg) + kSegmentSlotOffset),
          reinterpret_cast<uint64_t*>(static_cast<char*>(seg) + SegmentDirtyOffset(kBlocks))};
}

// A memfd of kBlocks 64 KiB blocks, sealed against shrinking (the daemon
// requires it); -1 on failure.
int SealedPoolFile(const char* name) {
  const int memfd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd < 0 || ftruncate(memfd, static_cast<off_t>(kSmall64KiB.block_bytes() * kBlocks)) != 0 ||
      fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    ADD_FAILURE() << "memfd: " << std::strerror(errno);
    return -1;
  }
  return memfd;
}

TEST(Faults, FailedMovesAreNeverRecordedAndBackOff) {
  auto owned = FaultMigrator();
  test::TestMigrator* mig = owned.get();

  boost::asio::io_context io;
  DaemonConfig c = TestConfig("cxltier-fault-", kBlocks / 2);
  c.persist = true;
  numa::TierAssignment tiers{{0}, {0}, "test: both tiers on node 0", {}};
  Daemon d(io, c, numa::Discover(), tiers, std::move(owned), true);
  ASSERT_EQ(d.Start().message, "");

  const server::Peer peer{1, getpid(), getuid(), getgid()};
  const ClientSegment seg = Hello(d, peer, "fault");
  ASSERT_NE(seg.slots, nullptr);
  BlockState* slots = seg.slots;
  uint64_t* dirty = seg.dirty;

  // A memfd pool with a known pattern, mapped here as the engine would.
  const uint64_t stride = kSmall64KiB.block_bytes();
  const int memfd = SealedPoolFile("fault-pool");
  ASSERT_GE(memfd, 0);
  auto* kv = static_cast<uint8_t*>(
      mmap(nullptr, stride * kBlocks, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  ASSERT_NE(kv, MAP_FAILED);
  for (size_t i = 0; i < stride * kBlocks; ++i) kv[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  const uint64_t before = Sum(kv, stride * kBlocks);
  auto pool = d.requests().OnRegisterPool(
      peer, wire::RegisterPool{wire::PoolKind::kMemfd, 0, stride * kBlocks, stride, kBlocks},
      server::UniqueFd(dup(memfd)));
  ASSERT_TRUE(pool.ok());
  wire::Admit admit{0, {}};
  for (uint32_t i = 0; i < kBlocks; ++i) admit.entries.push_back({BlockKey::FromSequence(9, i), i});
  auto admitted = d.requests().OnAdmit(peer, admit);
  ASSERT_TRUE(admitted.ok());
  std::vector<uint32_t> seg_slot(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) seg_slot[i] = admitted->results[i].slot;

  // The daemon's memory-range addresses are its own mapping's; match moves to
  // blocks by order of first appearance instead: record tiers per slot and
  // the number of done moves overall.
  std::vector<Tier> tier(kBlocks);
  for (uint32_t i = 0; i < kBlocks; ++i) tier[i] = ReadTier(&slots[seg_slot[i]]);
  int done_seen = 0;
  size_t tier_changes = 0;
  int most_calls_while_failing = 0;
  for (int tick = 0; tick < 160; ++tick) {
    if (tick == 60) {  // 60 ticks of nothing but faults, then moves work
      for (auto [addr, n] : mig->calls())
        most_calls_while_failing = std::max(most_calls_while_failing, n);
      mig->set_failing(false);
    }
    // The upper half is hot, the lower half cold: they swap tiers.
    for (uint32_t i = kBlocks / 2; i < kBlocks; ++i)
      AddObservation(slots, dirty, seg_slot[i], 1.0f);
    d.Tick();
    // Let the mover finish what was handed out and deliver the results (up to
    // 60 s: its thread may get little CPU on a loaded machine).
    for (int spin = 0; spin < 60000 && d.StatusJson()["migrations"]["pending"] != 0; ++spin) {
      usleep(1000);
    }
    EXPECT_EQ(d.StatusJson()["migrations"]["pending"], 0) << "tick " << tick;
    io.poll();
    io.restart();
    int done_now = 0;
    for (auto [addr, n] : mig->done()) done_now += n;
    size_t changed = 0;
    for (uint32_t i = 0; i < kBlocks; ++i) {
      const Tier t = ReadTier(&slots[seg_slot[i]]);
      if (t != tier[i]) ++changed;
      tier[i] = t;
    }
    // Every tier written back is backed by a move the migrator verified.
    EXPECT_LE(changed, static_cast<size_t>(done_now - done_seen)) << "tick " << tick;
    done_seen = done_now;
    tier_changes += changed;
  }
  EXPECT_GE(mig->injected(), 16u);
  const nlohmann::json st = d.StatusJson();
  const auto& m = st["migrations"];
  EXPECT_EQ(m["failed"].get<uint64_t>(), mig->injected());
  EXPECT_GT(m["pages_busy"].get<uint64_t>(), 0u);
  EXPECT_GT(m["pages_elsewhere"].get<uint64_t>(), 0u);
  EXPECT_GT(m["errors"]["Cannot allocate memory"].get<uint64_t>(), 0u);
  EXPECT_GT(m["errors"]["Bad address"].get<uint64_t>(), 0u);
  // After the faults every swap completed: hot blocks fast, cold blocks slow.
  for (uint32_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(ReadTier(&slots[seg_slot[i]]), i >= kBlocks / 2 ? Tier::kFast : Tier::kSlow) << i;
  }
  EXPECT_EQ(m["promotions"].get<uint64_t>() + m["demotions"].get<uint64_t>(),
            static_cast<uint64_t>(done_seen));
  EXPECT_GT(tier_changes, 0u);
  // Backoff: in 60 ticks of failures a block was tried at ticks 1, 2, 4, 8,
  // 16, 32 (and the first), not every tick.
  EXPECT_GT(most_calls_while_failing, 2);
  EXPECT_LE(most_calls_while_failing, 8) << "a failing block was retried too often";
  // No KV byte changed, and the daemon still answers.
  EXPECT_EQ(Sum(kv, stride * kBlocks), before);
  auto stats = d.requests().OnStats(peer, wire::Stats{"clients"});
  EXPECT_TRUE(stats.ok());

  d.Stop();
  munmap(kv, stride * kBlocks);
  munmap(seg.base, SegmentBytes(kBlocks));
  close(memfd);
  std::filesystem::remove_all(c.state_dir);
}

// A recording stopped, and its replays: with the daemon's moves
// (cxltier-sim --moves recorded) and without (--moves instant).
struct Replayed {
  nlohmann::json rec;  // the recording's summary
  sim::Trace trace;
  sim::SimResult exact, what_if;
};
void StopAndReplay(Daemon& d, const server::Peer& peer, Replayed* out) {
  server::UniqueFd trace_fd;
  auto stopped = d.requests().OnAdmin(peer, wire::Admin{wire::AdminOp::kRecordStop, ""}, &trace_fd);
  ASSERT_TRUE(stopped.ok());
  ASSERT_TRUE(trace_fd.valid());
  out->rec = nlohmann::json::parse(stopped->text);
  const nlohmann::json& rec = out->rec;
  std::string bytes;
  char buf[65536];
  for (off_t off = 0;;) {
    const ssize_t n = pread(trace_fd.get(), buf, sizeof(buf), off);
    ASSERT_GE(n, 0);
    if (n == 0) break;
    bytes.append(buf, static_cast<size_t>(n));
    off += n;
  }
  std::istringstream in(bytes);
  Result<sim::Trace> trace = sim::ReadBinary(in, "recording");
  ASSERT_TRUE(trace.ok()) << trace.status().message;
  ASSERT_TRUE(trace->recorded_moves);
  out->trace = std::move(*trace);
  sim::SimConfig sc;
  sc.policy = rec["policy"].get<std::string>();
  sc.persistence =
      rec["persist"].get<bool>() ? engine::Persistence::kPersist : engine::Persistence::kReset;
  sc.mode = engine::Mode::kTick;
  sc.budget_bytes = rec["tier0_budget_bytes"].get<uint64_t>();
  sc.block_bytes = rec["block_bytes"].get<uint64_t>();
  sc.migrate_bytes_per_tick = rec["migrate_bytes_per_tick"].get<uint64_t>();
  sc.hysteresis_ticks = rec["hysteresis_ticks"].get<uint32_t>();
  sc.landing_percent = rec["landing_percent"].get<uint32_t>();
  sc.ghost_capacity = rec["ghost_capacity"].get<size_t>();
  sc.recorded_moves = true;
  Result<sim::SimResult> exact = sim::Simulate(out->trace, sc, nullptr);
  ASSERT_TRUE(exact.ok()) << exact.status().message;
  out->exact = std::move(*exact);
  sc.recorded_moves = false;
  Result<sim::SimResult> what_if = sim::Simulate(out->trace, sc, nullptr);
  ASSERT_TRUE(what_if.ok()) << what_if.status().message;
  out->what_if = std::move(*what_if);
}

// A recording made while moves fail, land ticks after their plan (the
// mover's results are delivered every third tick only), plans may be
// skipped (the mover has its max_pending_moves) and blocks are released and
// admitted again, replayed with the recorded moves (cxltier-sim --moves
// recorded): the replay's touches and hits are exactly the daemon's.
// Records a daemon whose moves fail, then land late, and replays the
// recording exactly. `write_first`: every page is written before its block
// is admitted (admitted where its pages are); else the engine places each
// new block (in its landing room, with `landing_percent`), and the client
// writes it after.
void RecordLateAndFailingMovesAndReplay(uint32_t landing_percent, bool write_first) {
  auto owned = FaultMigrator();
  test::TestMigrator* mig = owned.get();
  boost::asio::io_context io;
  DaemonConfig c = TestConfig("cxltier-fault-rec-", kBlocks / 4);
  c.persist = true;
  c.max_pending_moves = 3;
  c.landing_percent = landing_percent;
  // The default's experts but tinylfu, whose sketch hashes keys: a
  // recording's keys are hashed again (record_test says more).
  c.policy = "adaptive:sieve+arc+ema:0.05+ema:0.01+lru+s3fifo";
  numa::TierAssignment tiers{{0}, {0}, "test: both tiers on node 0", {}};
  Daemon d(io, c, numa::Discover(), tiers, std::move(owned), true);
  ASSERT_EQ(d.Start().message, "");

  const server::Peer peer{1, getpid(), getuid(), getgid()};
  const ClientSegment seg = Hello(d, peer, "fault-rec");
  ASSERT_NE(seg.slots, nullptr);
  BlockState* slots = seg.slots;
  uint64_t* dirty = seg.dirty;
  const uint64_t stride = kSmall64KiB.block_bytes();
  const int memfd = SealedPoolFile("fault-rec-pool");
  ASSERT_GE(memfd, 0);
  auto* kv = static_cast<uint8_t*>(
      mmap(nullptr, stride * kBlocks, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0));
  ASSERT_NE(kv, MAP_FAILED);
  const auto write = [&](uint32_t block) {
    for (size_t i = block * stride; i < (block + 1) * stride; ++i) kv[i] = static_cast<uint8_t>(i);
  };
  if (write_first) {
    for (uint32_t i = 0; i < kBlocks; ++i) write(i);
  }
  auto pool = d.requests().OnRegisterPool(
      peer, wire::RegisterPool{wire::PoolKind::kMemfd, 0, stride * kBlocks, stride, kBlocks},
      server::UniqueFd(dup(memfd)));
  ASSERT_TRUE(pool.ok());

  server::UniqueFd no_fd;
  auto started =
      d.requests().OnAdmin(peer, wire::Admin{wire::AdminOp::kRecordStart, "3600"}, &no_fd);
  ASSERT_TRUE(started.ok());
  std::vector<uint32_t> seg_slot(kBlocks);
  const auto admit = [&](uint32_t i) {
    auto a = d.requests().OnAdmit(peer, wire::Admit{0, {{BlockKey::FromSequence(11, i), i}}});
    ASSERT_TRUE(a.ok());
    seg_slot[i] = a->results[0].slot;
    if (!write_first) write(i);
  };
  for (uint32_t i = 0; i < kBlocks; ++i) admit(i);
  const auto deliver = [&] {
    // The mover's results so far (it may get little CPU on a loaded machine).
    for (int spin = 0; spin < 60000 && d.StatusJson()["migrations"]["pending"] != 0; ++spin) {
      usleep(1000);
    }
    io.poll();
    io.restart();
  };
  for (uint32_t tick = 0; tick < 150; ++tick) {
    if (tick == 45) mig->set_failing(false);
    // Four hot blocks at a time, a new four every 15 ticks.
    for (uint32_t k = 0; k < 4; ++k) {
      AddObservation(slots, dirty, seg_slot[(tick / 15 * 4 + k) % kBlocks], 1.0f);
    }
    AddObservation(slots, dirty, seg_slot[tick % kBlocks], 0.5f);
    // A hot block leaves (its move may be in flight) and comes back: at
    // once, or two ticks later, its pages counted in tier 0 meanwhile
    // (recorded, as the plans' room depends on it) unless moved down.
    const uint32_t leaving = (tick / 15 * 4) % kBlocks;
    if (tick % 20 == 10 || tick % 20 == 15) {
      auto r = d.requests().OnRelease(peer, wire::Release{{BlockKey::FromSequence(11, leaving)}});
      ASSERT_TRUE(r.ok());
      if (tick % 20 == 10) admit(leaving);
    }
    if (tick % 20 == 17) admit(leaving);
    d.Tick();
    if (tick % 3 == 2) deliver();
  }
  deliver();
  d.Tick();
  // Released blocks' pages moved down (by the real migrator, when a hot
  // block was in tier 0 at its release: how many depends on the mover's
  // pace) while the client kept them mapped and wrote new blocks on them:
  // not a byte changed.
  std::printf("released blocks' pages moved: %s\n",
              d.StatusJson()["migrations"]["released_pages"]["moved"].dump().c_str());
  for (size_t i = 0; i < stride * kBlocks; ++i) {
    ASSERT_EQ(kv[i], static_cast<uint8_t>(i)) << "byte " << i;
  }
  Replayed r;
  ASSERT_NO_FATAL_FAILURE(StopAndReplay(d, peer, &r));
  const nlohmann::json& rec = r.rec;
  // The recording holds failed moves (the first 45 ticks) and done ones.
  // How many plans were skipped depends on the mover thread's pace: printed
  // below, not asserted.
  EXPECT_GT(rec["move_outcomes"].get<uint64_t>(), rec["moves_done"].get<uint64_t>());
  EXPECT_GT(rec["moves_done"].get<uint64_t>(), 0u);
  EXPECT_GT(rec["touches"].get<uint64_t>(), 300u);
  const sim::SimResult& exact = r.exact;
  const sim::SimResult& what_if = r.what_if;
  EXPECT_EQ(exact.counters.touches, rec["touches"].get<uint64_t>());
  EXPECT_EQ(exact.counters.hits, rec["hits"].get<uint64_t>());
  EXPECT_EQ(exact.counters.failed_moves,
            rec["move_outcomes"].get<uint64_t>() - rec["moves_done"].get<uint64_t>());
  std::printf(
      "live %s hits of %s touches; exact replay %llu, what-if replay %llu (%s plans in %s ticks, "
      "%s of %s moves done)\n",
      rec["hits"].dump().c_str(), rec["touches"].dump().c_str(),
      static_cast<unsigned long long>(exact.counters.hits),
      static_cast<unsigned long long>(what_if.counters.hits), rec["plans"].dump().c_str(),
      rec["ticks"].dump().c_str(), rec["moves_done"].dump().c_str(),
      rec["move_outcomes"].dump().c_str());

  d.Stop();
  munmap(kv, stride * kBlocks);
  munmap(seg.base, SegmentBytes(kBlocks));
  close(memfd);
  std::filesystem::remove_all(c.state_dir);
}

TEST(Faults, ARecordingOfLateAndFailingMovesReplaysExactly) {
  RecordLateAndFailingMovesAndReplay(0, /*write_first=*/true);
}

// Blocks the engine placed, some in its landing room (tier 0 of 4 blocks, 2
// of them kept free) and held for a plan: the replay places them itself.
TEST(Faults, ARecordingOfBlocksLandedInTheRoomReplaysExactly) {
  RecordLateAndFailingMovesAndReplay(50, /*write_first=*/false);
}

// A client that releases blocks while their moves are in flight, and admits
// other keys onto the same blocks, makes those moves come back stale. The
// daemon finds each block's new holder and asks the kernel where its pages
// are, at the next tick, in one scan of the client's slots however many
// moves were stale (a scan per move let a client with many blocks stall the
// I/O thread).
TEST(Faults, StaleMovesCostOneScanATickAndFindTheBlocksNewHolders) {
  auto owned = std::make_unique<test::TestMigrator>(
      test::TestMigrator::Options{.where_node = 1, .hold_first = true});
  test::TestMigrator* mig = owned.get();
  boost::asio::io_context io;
  DaemonConfig c = TestConfig("cxltier-fault-stale-", kBlocks / 2);
  c.persist = false;
  Daemon d(io, c, numa::Discover(), numa::TierAssignment{{0}, {1}, "test: node 1 is slow", {}},
           std::move(owned), true);
  ASSERT_EQ(d.Start().message, "");
  const server::Peer peer{1, getpid(), getuid(), getgid()};
  const ClientSegment seg = Hello(d, peer, "stale");
  ASSERT_NE(seg.slots, nullptr);
  BlockState* slots = seg.slots;
  uint64_t* dirty = seg.dirty;
  const uint64_t stride = kSmall64KiB.block_bytes();
  const int memfd = SealedPoolFile("stale-pool");
  ASSERT_GE(memfd, 0);
  auto pool = d.requests().OnRegisterPool(
      peer, wire::RegisterPool{wire::PoolKind::kMemfd, 0, stride * kBlocks, stride, kBlocks},
      server::UniqueFd(memfd));
  ASSERT_TRUE(pool.ok());
  const auto admit_all = [&](uint64_t seq) {
    wire::Admit admit{0, {}};
    for (uint32_t i = 0; i < kBlocks; ++i)
      admit.entries.push_back({BlockKey::FromSequence(seq, i), i});
    auto a = d.requests().OnAdmit(peer, admit);
    EXPECT_TRUE(a.ok());
    std::vector<uint32_t> seg_slot;
    for (const auto& r : a->results) {
      EXPECT_EQ(r.tier, Tier::kSlow);  // every page on node 1, as the migrator says
      seg_slot.push_back(r.slot);
    }
    return seg_slot;
  };
  const std::vector<uint32_t> first = admit_all(11);
  ASSERT_EQ(first.size(), kBlocks);
  // All hot: the tick promotes half of them (tier 0's budget); the first
  // move waits inside the migrator, the others behind it.
  for (uint32_t i = 0; i < kBlocks; ++i) AddObservation(slots, dirty, first[i], 1.0f);
  d.Tick();
  ASSERT_TRUE(mig->WaitForCalls(1));
  // Every block released under its move, and another key admitted onto it.
  wire::Release release;
  for (uint32_t i = 0; i < kBlocks; ++i) release.keys.push_back(BlockKey::FromSequence(11, i));
  ASSERT_TRUE(d.requests().OnRelease(peer, release).ok());
  const std::vector<uint32_t> second = admit_all(12);
  ASSERT_EQ(second.size(), kBlocks);
  // The moved blocks' pages are on node 0 now; the rest stay on node 1.
  mig->set_where_node(0);
  mig->Release();
  for (int spin = 0; spin < 60000 && d.StatusJson()["migrations"]["pending"] != 0; ++spin) {
    usleep(1000);
  }
  io.poll();
  io.restart();
  const nlohmann::json m = d.StatusJson()["migrations"];
  const uint64_t stale = m["stale_moves"].get<uint64_t>();
  EXPECT_GE(stale, 2u) << m.dump();             // several moves, all stale
  EXPECT_EQ(m["stale_scans"], 0u) << m.dump();  // none resolved before the tick
  d.Tick();
  EXPECT_EQ(d.StatusJson()["migrations"]["stale_scans"], 1u);
  // Each block a stale move was for now holds a key of the second batch,
  // which the daemon relocated to where the migrator says its pages are.
  uint32_t fast = 0;
  for (uint32_t i = 0; i < kBlocks; ++i) fast += ReadTier(&slots[second[i]]) == Tier::kFast;
  EXPECT_EQ(fast, stale);
  d.requests().OnDisconnect(peer);
  d.Stop();
  std::filesystem::remove_all(c.state_dir);
}

// The released-pages tests' setting: an in-process daemon whose two tiers
// are both node 0 (so that a pool's new pages can be steered on any host),
// with a test migrator, and one client with a registered memfd pool of
// kBlocks 64 KiB blocks (no page written: the engine places each new block).
struct PoolDaemon {
  boost::asio::io_context io;
  test::TestMigrator* mig = nullptr;
  DaemonConfig config;
  std::unique_ptr<Daemon> daemon;
  const server::Peer peer{1, getpid(), getuid(), getgid()};
  ClientSegment seg;

  // `tag` names the state directory; tier 0 holds `tier0_blocks`; `tune`
  // changes the configuration first (persist is off).
  void Start(const std::string& tag, uint32_t tier0_blocks, test::TestMigrator::Options options,
             const std::function<void(DaemonConfig&)>& tune = {}) {
    auto owned = std::make_unique<test::TestMigrator>(options);
    mig = owned.get();
    config = TestConfig(tag, tier0_blocks);
    config.persist = false;
    if (tune) tune(config);
    daemon = std::make_unique<Daemon>(
        io, config, numa::Discover(),
        numa::TierAssignment{{0}, {0}, "test: both tiers on node 0", {}}, std::move(owned), true);
    ASSERT_EQ(daemon->Start().message, "");
    seg = Hello(*daemon, peer, tag.c_str());
    ASSERT_NE(seg.slots, nullptr);
    const uint64_t stride = kSmall64KiB.block_bytes();
    const int memfd = SealedPoolFile(tag.c_str());
    ASSERT_GE(memfd, 0);
    ASSERT_TRUE(daemon->requests()
                    .OnRegisterPool(peer,
                                    wire::RegisterPool{wire::PoolKind::kMemfd, 0, stride * kBlocks,
                                                       stride, kBlocks},
                                    server::UniqueFd(memfd))
                    .ok());
  }
  // Keys (seq, from .. from + n - 1) admitted on pool blocks from ..: their results.
  std::vector<wire::AdmitResult> Admit(uint64_t seq, uint32_t from, uint32_t n) {
    wire::Admit a{0, {}};
    for (uint32_t i = from; i < from + n; ++i)
      a.entries.push_back({BlockKey::FromSequence(seq, i), i});
    auto r = daemon->requests().OnAdmit(peer, a);
    EXPECT_TRUE(r.ok()) << r.status().message;
    return r.ok() ? r->results : std::vector<wire::AdmitResult>{};
  }
  void Release(uint64_t seq, uint32_t from, uint32_t n) {
    wire::Release r;
    for (uint32_t i = from; i < from + n; ++i) r.keys.push_back(BlockKey::FromSequence(seq, i));
    EXPECT_TRUE(daemon->requests().OnRelease(peer, r).ok());
  }
  uint64_t Released(const char* what) {
    return daemon->StatusJson()["migrations"]["released_pages"][what].get<uint64_t>();
  }
  // The mover's results so far, delivered.
  void Settle() {
    for (int spin = 0; spin < 60000 && daemon->StatusJson()["migrations"]["pending"] != 0; ++spin) {
      usleep(1000);
    }
    io.poll();
    io.restart();
  }
  ~PoolDaemon() {
    if (daemon) {
      daemon->requests().OnDisconnect(peer);
      daemon->Stop();
    }
    if (seg.base) munmap(seg.base, SegmentBytes(kBlocks));
    if (!config.state_dir.empty()) std::filesystem::remove_all(config.state_dir);
  }
};

// Tier 0's bound from admission (issue 32): a block released from tier 0
// leaves its pages there (they are the client's, which may admit a new
// block on them at once). They stay counted in tier 0 until the next plan
// moves them down, its first moves, or a block is admitted on them, which
// takes their place; a new block finds no room meanwhile, and no promotion
// does. A block admitted on pages while they move is found by the kernel's
// word at the next tick, as a stale move's block is.
TEST(Faults, ReleasedPagesStayCountedInTier0UntilMovedDownFirst) {
  // Where says "no page" (-1): the engine places each new block. The moves
  // tell released pages from promotions by their blocks.
  PoolDaemon p;
  ASSERT_NO_FATAL_FAILURE(
      p.Start("cxltier-fault-released-", 4, {.where_node = -1, .hold_first = true}));
  Daemon& d = *p.daemon;
  test::TestMigrator* mig = p.mig;
  const ClientSegment& seg = p.seg;
  const uint64_t stride = kSmall64KiB.block_bytes();
  const auto admit = [&](uint64_t seq, uint32_t from, uint32_t n) { return p.Admit(seq, from, n); };
  const auto release = [&](uint64_t seq, uint32_t from, uint32_t n) { p.Release(seq, from, n); };
  const auto released = [&](const char* what) { return p.Released(what); };
  const auto tier0 = [&] { return d.StatusJson()["tiers"][0]["blocks"].get<uint64_t>(); };
  const auto settle = [&] { p.Settle(); };
  const auto moved = [&] {
    std::lock_guard lock(mig->mu);
    return mig->moved;
  };

  // Blocks 0..7 with no page yet: 0..3 placed in tier 0 (its budget), the rest below.
  const std::vector<wire::AdmitResult> first = admit(1, 0, 8);
  ASSERT_EQ(first.size(), 8u);
  for (uint32_t i = 0; i < 8; ++i) EXPECT_EQ(first[i].tier, i < 4 ? Tier::kFast : Tier::kSlow);
  release(1, 0, 4);
  EXPECT_EQ(tier0(), 0u);
  EXPECT_EQ(released("held_blocks"), 4u);
  EXPECT_EQ(admit(2, 8, 1).at(0).tier, Tier::kSlow) << "a new block found room beside them";
  // Hot blocks below wait: the plan moves the released pages down first (the
  // first Move waits inside the migrator until Release, the rest queued).
  for (uint32_t i = 4; i < 8; ++i) AddObservation(seg.slots, seg.dirty, first[i].slot, 1.0f);
  d.Tick();
  ASSERT_TRUE(mig->WaitForCalls(1));
  // A block admitted on the first released block's pages takes their place.
  const std::vector<wire::AdmitResult> reused = admit(3, 0, 1);
  ASSERT_EQ(reused.size(), 1u);
  EXPECT_EQ(reused[0].tier, Tier::kFast);
  EXPECT_EQ(released("held_blocks"), 3u);
  EXPECT_EQ(released("reused"), 1u);
  EXPECT_EQ(tier0(), 1u);
  mig->Release();
  settle();
  const auto down = moved();
  ASSERT_EQ(down.size(), 4u) << "no promotion while the released pages held tier 0";
  // Pool blocks by address: block 0's is the lowest moved (it was released).
  uintptr_t base = UINTPTR_MAX;
  for (const auto& [address, node] : down) base = std::min(base, address);
  const auto block_of = [&](uintptr_t address) { return (address - base) / stride; };
  std::set<uintptr_t> blocks;
  for (const auto& [address, node] : down) blocks.insert(block_of(address));
  EXPECT_EQ(blocks, (std::set<uintptr_t>{0, 1, 2, 3})) << "one move for each released block";
  EXPECT_EQ(released("held_blocks"), 0u);
  EXPECT_EQ(released("moved"), 4u);
  EXPECT_EQ(released("failed"), 0u);
  // The block admitted on moving pages: where they landed (node 0, the
  // last tier's too), at the next tick.
  mig->set_where_node(0);
  d.Tick();
  EXPECT_EQ(ReadTier(&seg.slots[reused[0].slot]), Tier::kSlow);
  settle();
  // Now tier 0 has room: the hot blocks are promoted, after the pages went down.
  const auto all = moved();
  ASSERT_GT(all.size(), 4u) << d.StatusJson().dump();
  for (size_t i = 4; i < all.size(); ++i) {
    EXPECT_GE(block_of(all[i].first), 4u) << "move " << i << ": a promotion of a hot block";
  }
  EXPECT_LE(tier0(), 4u);
}

// A uid's released blocks' pages held in tier 0 count against its tier-0
// cap (ReleasedPages by account, Engine::set_account_held): releasing its
// tier-0 blocks and admitting new ones gets it no more than its cap there
// until the pages have moved down.
TEST(Faults, ReleasedPagesCountAgainstTheirUidsCap) {
  PoolDaemon p;
  ASSERT_NO_FATAL_FAILURE(
      p.Start("cxltier-fault-held-cap-", 8, {.where_node = -1}, [](DaemonConfig& c) {
        c.user_quotas.push_back(
            UserQuota{getuid(), QuotaBytes{{2 * kSmall64KiB.block_bytes()}, 0}});
      }));
  Daemon& d = *p.daemon;
  const auto admit = [&](uint64_t seq, uint32_t block) {
    const std::vector<wire::AdmitResult> r = p.Admit(seq, block, 1);
    return r.empty() ? Tier::kNone : r[0].tier;
  };
  EXPECT_EQ(admit(1, 0), Tier::kFast);
  EXPECT_EQ(admit(1, 1), Tier::kFast);
  EXPECT_EQ(admit(1, 2), Tier::kSlow) << "at its cap of 2";
  p.Release(1, 0, 2);
  const nlohmann::json held = d.StatusJson();
  ASSERT_EQ(held["migrations"]["released_pages"]["held_blocks"], 2u);
  ASSERT_EQ(held["quotas"]["users"].size(), 1u) << held["quotas"].dump();
  EXPECT_EQ(held["quotas"]["users"][0]["held_blocks"], 2u) << held["quotas"].dump();
  EXPECT_EQ(admit(2, 3), Tier::kSlow) << "its held pages fill its cap; tier 0 has room for 6";
  d.Tick();
  p.Settle();
  ASSERT_EQ(p.Released("held_blocks"), 0u);
  EXPECT_EQ(admit(2, 4), Tier::kFast) << "moved down: its cap is its blocks' again";
}

// The exact replay of a recording in which released pages held tier 0's
// room (trace events of kind 8, the held count): a block admitted while
// they were held was placed below tier 0, and its first touch was a miss.
// The replay, told the held count, places it below too; without it, the
// replay would place it in tier 0's free room and count a hit. Deterministic:
// the migrator's moves and their outcomes are recorded, whatever its pace.
TEST(Faults, ARecordingWithReleasedPagesHeldReplaysExactly) {
  PoolDaemon p;
  ASSERT_NO_FATAL_FAILURE(
      p.Start("cxltier-fault-held-rec-", 4, {.where_node = -1}, [](DaemonConfig& c) {
        // One that does not hash keys (record_test says why).
        c.policy = "lfu";
      }));
  Daemon& d = *p.daemon;
  server::UniqueFd no_fd;
  ASSERT_TRUE(
      d.requests().OnAdmin(p.peer, wire::Admin{wire::AdminOp::kRecordStart, "3600"}, &no_fd).ok());
  // Blocks 0..7 with no page yet: 0..3 placed in tier 0 (its budget), the
  // rest below. 0..3 leave, their pages held in tier 0.
  const std::vector<wire::AdmitResult> first = p.Admit(1, 0, 8);
  ASSERT_EQ(first.size(), 8u);
  for (uint32_t i = 0; i < 8; ++i) ASSERT_EQ(first[i].tier, i < 4 ? Tier::kFast : Tier::kSlow);
  p.Release(1, 0, 4);
  ASSERT_EQ(p.Released("held_blocks"), 4u);
  // A new block, on a pool block of its own, while they are held: below.
  const std::vector<wire::AdmitResult> late = p.Admit(2, 8, 1);
  ASSERT_EQ(late.size(), 1u);
  ASSERT_EQ(late[0].tier, Tier::kSlow);
  // Touched from the next tick on, with 4..7: misses until promoted, once
  // the released pages have gone down.
  for (uint32_t tick = 0; tick < 12; ++tick) {
    AddObservation(p.seg.slots, p.seg.dirty, late[0].slot, 1.0f);
    for (uint32_t i = 4; i < 8; ++i) AddObservation(p.seg.slots, p.seg.dirty, first[i].slot, 0.5f);
    d.Tick();
    p.Settle();
  }
  const nlohmann::json status = d.StatusJson();
  EXPECT_EQ(status["migrations"]["released_pages"]["moved"], 4u) << status.dump();
  EXPECT_EQ(status["migrations"]["released_pages"]["held_blocks"], 0u) << status.dump();
  Replayed r;
  ASSERT_NO_FATAL_FAILURE(StopAndReplay(d, p.peer, &r));
  uint64_t held_events = 0;
  for (const sim::TraceEvent& ev : r.trace.events) held_events += ev.kind == sim::EventKind::kHeld;
  EXPECT_GE(held_events, 2u) << "the count went up to 4 and back to 0";
  const uint64_t touches = r.rec["touches"].get<uint64_t>();
  const uint64_t hits = r.rec["hits"].get<uint64_t>();
  EXPECT_EQ(touches, 12u * 5);
  EXPECT_LT(hits, touches) << "the late block missed until promoted";
  EXPECT_EQ(r.exact.counters.touches, touches);
  EXPECT_EQ(r.exact.counters.hits, hits) << r.rec.dump(2);
  std::printf("live %llu hits of %llu touches; exact replay %llu; %llu held events\n",
              static_cast<unsigned long long>(hits), static_cast<unsigned long long>(touches),
              static_cast<unsigned long long>(r.exact.counters.hits),
              static_cast<unsigned long long>(held_events));
}

}  // namespace
}  // namespace cxltier::service
