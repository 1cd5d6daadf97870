// Copy mode with a real cxltierd: tier pools the daemon makes, blocks moved
// by copy while reader threads check every byte under their leases, and the
// bad input of the protocol. Both tiers are node 0 here (the harness), so
// each copy is between two pools on one node; the QEMU guests run the same
// with two nodes (tests/e2e/guest_test.sh).
#include <gtest/gtest.h>
#include <numaif.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cxltier/client.h"
#include "cxltier/cxltier.h"
#include "cxltier/detail/fd_passing.h"
#include "cxltier/segment.h"
#include "daemon_harness.h"
#include "models.h"

namespace cxltier {
namespace {

using testing::DaemonProcess;
using testing::WaitFor;

constexpr uint64_t kBlock = 8192;

BlockKey K(uint64_t i) { return BlockKey::FromSequence(91, i); }

// The bytes block i holds: a pattern only it has, in 8-byte words.
uint64_t Word(uint64_t i, uint64_t w) { return (i + 1) * 0x9e3779b97f4a7c15ULL ^ (w * 0x2545f491); }

bool Intact(const uint8_t* p, uint64_t i) {
  const auto* words = reinterpret_cast<const uint64_t*>(p);
  for (uint64_t w = 0; w < kBlock / 8; ++w) {
    if (words[w] != Word(i, w)) return false;
  }
  return true;
}

nlohmann::json CopyStats(const DaemonProcess& d) {
  std::string text;
  const Status st = Client::DaemonStats(d.socket(), "status", &text);
  EXPECT_TRUE(st.ok()) << st.message;
  return nlohmann::json::parse(text, nullptr, false)["migrations"]["copy"];
}

std::unique_ptr<Client> Connect(const DaemonProcess& d, uint32_t slots = 64) {
  Status st;
  auto c = Client::Connect({d.socket(), kTiny8KiB, slots, "copy"}, &st);
  EXPECT_TRUE(c) << st.message;
  return c;
}

// Admits n blocks into tier `tier`'s pool (the daemon places them) and
// writes each one's pattern under its write lease. Returns the slots.
std::vector<uint32_t> AdmitAndFill(Client& c, uint32_t n, uint8_t tier = 0,
                                   uint64_t first_key = 0) {
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < n; ++i) entries.push_back({K(first_key + i), 0});
  std::vector<wire::AdmitResult> results;
  const Status st = c.Admit(c.tier_pool(tier), entries, &results);
  EXPECT_TRUE(st.ok()) << st.message;
  std::vector<uint32_t> slots;
  for (uint32_t i = 0; i < results.size(); ++i) {
    uint8_t* p = nullptr;
    // The daemon gave the write lease with the place: BeginWrite says it is held.
    EXPECT_EQ(c.BeginWrite(results[i].slot, &p).code, wire::ErrorCode::kBusy);
    const Location at = c.LocationOf(results[i].slot);
    p = c.tier_pool_base(at.tier) + uint64_t{at.index} * c.tier_pool_stride();
    auto* words = reinterpret_cast<uint64_t*>(p);
    for (uint64_t w = 0; w < kBlock / 8; ++w) words[w] = Word(i, w);
    EXPECT_TRUE(c.EndWrite(results[i].slot).ok());
    slots.push_back(results[i].slot);
  }
  return slots;
}

// Every page of a mapping on `node` (the kernel's answer, move_pages).
bool OnNode(const uint8_t* base, uint64_t bytes, int node) {
  std::vector<void*> pages;
  for (uint64_t o = 0; o < bytes; o += 4096) pages.push_back(const_cast<uint8_t*>(base) + o);
  std::vector<int> status(pages.size(), -1);
  if (move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0) != 0) return false;
  for (int s : status) {
    if (s != node) return false;
  }
  return true;
}

TEST(CopyMode, BlocksMoveByCopyWhileReadersCheckEveryByte) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n");  // 8 blocks of tier 0
  auto c = Connect(d);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->CreateTierPools(32).ok());
  EXPECT_EQ(c->tier_pool_bytes(0), 8 * kBlock);  // the budget, not the 32 asked for
  EXPECT_EQ(c->tier_pool_bytes(1), 32 * kBlock);
  EXPECT_TRUE(OnNode(c->tier_pool_base(0), c->tier_pool_bytes(0), 0));
  EXPECT_TRUE(OnNode(c->tier_pool_base(1), c->tier_pool_bytes(1), 0));
  const std::vector<uint32_t> slots = AdmitAndFill(*c, 24);
  ASSERT_EQ(slots.size(), 24u);
  for (uint32_t i = 0; i < 24; ++i) {
    EXPECT_EQ(c->LocationOf(slots[i]).tier, i < 8 ? 0 : 1) << i;  // tier 0 while it had room
  }

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, torn{0}, failed{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      Status st;
      auto reader = c->NewReader(&st);
      if (!reader) {
        failed.fetch_add(1);
        return;
      }
      for (uint64_t n = r; !stop.load(); ++n) {
        const uint32_t i = static_cast<uint32_t>(n * 7 % 24);
        Client::Reader::Lease lease;
        if (!reader->Acquire(slots[i], &lease).ok()) {
          failed.fetch_add(1);
          continue;
        }
        if (!Intact(lease.data, i)) torn.fetch_add(1);
        if (!reader->Release(lease).ok()) failed.fetch_add(1);
        reads.fetch_add(1);
      }
    });
  }
  // Blocks 16..23 are hot: they move to tier 0 and cold ones leave it.
  const bool promoted = WaitFor([&] {
    for (uint32_t i = 16; i < 24; ++i) c->Observe(slots[i], 1.0f);
    for (uint32_t i = 16; i < 24; ++i) {
      if (c->LocationOf(slots[i]).tier != 0) return false;
    }
    return true;
  });
  // Let the readers see the blocks in their new places too.
  const uint64_t seen = reads.load();
  EXPECT_TRUE(WaitFor([&] { return reads.load() > seen + 1000; }));
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_TRUE(promoted) << d.Log();
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_EQ(failed.load(), 0u);
  EXPECT_GT(reads.load(), 1000u);
  // Every block whole in its place now, and the pools still on their node.
  for (uint32_t i = 0; i < 24; ++i) {
    const Location at = c->LocationOf(slots[i]);
    EXPECT_TRUE(Intact(c->tier_pool_base(at.tier) + uint64_t{at.index} * kBlock, i)) << i;
  }
  EXPECT_TRUE(OnNode(c->tier_pool_base(0), c->tier_pool_bytes(0), 0));
  const nlohmann::json copy = CopyStats(d);
  EXPECT_GE(copy["copies"].get<uint64_t>(), 8u) << copy.dump();
  EXPECT_GT(copy["places_freed"].get<uint64_t>(), 0u) << copy.dump();
  EXPECT_EQ(copy["dropped_mismatch"].get<uint64_t>(), 0u);
}

// The daemon made a tier pool and the client could not map it (here: its
// address space is full): the daemon keeps the pool (one per tier and
// connection), so the next CreateTierPools maps that one instead of asking
// for another, which the daemon refuses. Not under a sanitizer: they reserve
// more address space than any limit this test could set.
TEST(CopyMode, ATierPoolWhoseMappingFailedIsMappedByTheNextCall) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "an address-space limit and a sanitizer's shadow memory do not mix";
#else
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n");  // 8 blocks of tier 0
  auto c = Connect(d, 4096);
  ASSERT_TRUE(c);
  auto vm_bytes = [] {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
    }
    return 0ull;
  };
  rlimit was{};
  ASSERT_EQ(getrlimit(RLIMIT_AS, &was), 0);
  rlimit tight = was;
  tight.rlim_cur = vm_bytes() + (8 << 20);  // tier 1's pool is 4,096 x 8 KiB = 32 MiB
  ASSERT_EQ(setrlimit(RLIMIT_AS, &tight), 0);
  const Status failed = c->CreateTierPools(4096);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &was), 0);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.message.find("mapping it"), std::string::npos) << failed.message;
  EXPECT_EQ(c->tier_pool_base(1), nullptr);
  EXPECT_EQ(c->tier_pool(1), UINT32_MAX);  // not a pool to use (C: cxltier_tier_pool says so)
  const Status again = c->CreateTierPools(4096);
  ASSERT_TRUE(again.ok()) << again.message;
  EXPECT_EQ(c->tier_pool_bytes(1), 4096 * kBlock);
  EXPECT_EQ(c->tier_pool_bytes(0), 8 * kBlock);
  const std::vector<uint32_t> slots = AdmitAndFill(*c, 16);
  ASSERT_EQ(slots.size(), 16u);
  Status rs;
  auto reader = c->NewReader(&rs);
  ASSERT_TRUE(reader) << rs.message;
  for (uint32_t i = 0; i < 16; ++i) {
    Client::Reader::Lease lease;
    ASSERT_TRUE(reader->Acquire(slots[i], &lease).ok());
    EXPECT_TRUE(Intact(lease.data, i)) << i;
    reader->Release(lease);
  }
  // And a reconnect takes it to the next connection like any other (busy,
  // "try again", while the old connection's blocks are being released).
  Status last;
  ASSERT_TRUE(WaitFor([&] { return (last = c->Reconnect()).ok(); })) << last.message;
  EXPECT_NE(c->tier_pool_base(1), nullptr);
#endif
}

TEST(CopyMode, BadInputGetsClearErrorsAndTheDaemonServesOn) {
  DaemonProcess d(
      "[engine]\ntier0_budget = \"64KiB\"\n[limits]\nmax_tier_pool_bytes_per_uid = "
      "\"1MiB\"\nmax_blocks_per_client = 512\n");
  auto c = Connect(d);
  ASSERT_TRUE(c);
  // Not a device-DAX device: refused, and nothing taken from tier 0.
  Client::TierPoolOptions dax;
  dax.blocks = 8;
  dax.devdax_path = "/dev/null";
  Status st = c->CreateTierPools(dax);
  EXPECT_EQ(st.code, wire::ErrorCode::kBadPool) << st.message;
  EXPECT_NE(st.message.find("not a device-DAX device"), std::string::npos) << st.message;
  // More than the uid may have the daemon allocate: 200 blocks of 8 KiB in tier 1.
  auto big = Connect(d, 256);
  st = big->CreateTierPools(200);
  EXPECT_EQ(st.code, wire::ErrorCode::kLimit) << st.message;
  EXPECT_NE(st.message.find("max_tier_pool_bytes_per_uid"), std::string::npos) << st.message;
  // More blocks than slots.
  st = big->CreateTierPools(300);
  EXPECT_EQ(st.code, wire::ErrorCode::kLimit) << st.message;
  // c gets tier 0's whole budget (8 blocks); the next client none of it.
  ASSERT_TRUE(c->CreateTierPools(8).ok());
  EXPECT_EQ(c->CreateTierPools(8).code, wire::ErrorCode::kBadPool);  // it has both
  auto late = Connect(d);
  st = late->CreateTierPools(8);
  EXPECT_EQ(st.code, wire::ErrorCode::kLimit) << st.message;
  EXPECT_NE(st.message.find("budget"), std::string::npos) << st.message;

  Client* e = c.get();
  const std::vector<uint32_t> slots = AdmitAndFill(*e, 4);
  Status rs;
  auto reader = e->NewReader(&rs);
  ASSERT_TRUE(reader) << rs.message;
  Client::Reader::Lease lease;
  // A slot that holds no block; a release without an acquire; EndWrite without BeginWrite.
  EXPECT_EQ(reader->Acquire(60, &lease).code, wire::ErrorCode::kNoLease);
  EXPECT_EQ(reader->Acquire(1u << 30, &lease).code, wire::ErrorCode::kNoLease);
  EXPECT_EQ(reader->Release(Client::Reader::Lease{}).code, wire::ErrorCode::kNoLease);
  ASSERT_TRUE(reader->Acquire(slots[0], &lease).ok());
  EXPECT_TRUE(reader->Release(lease).ok());
  EXPECT_EQ(reader->Release(lease).code, wire::ErrorCode::kNoLease);  // twice
  EXPECT_EQ(e->EndWrite(slots[1]).code, wire::ErrorCode::kNoLease);
  uint8_t* p = nullptr;
  ASSERT_TRUE(e->BeginWrite(slots[1], &p).ok());
  EXPECT_EQ(e->BeginWrite(slots[1], &p).code, wire::ErrorCode::kBusy);
  EXPECT_TRUE(e->EndWrite(slots[1]).ok());
  // The pools hold 8 + 8 blocks: more is refused, nothing admitted.
  std::vector<wire::AdmitEntry> many;
  for (uint32_t i = 100; i < 120; ++i) many.push_back({K(i), 0});
  std::vector<wire::AdmitResult> results;
  st = e->Admit(e->tier_pool(0), many, &results);
  EXPECT_EQ(st.code, wire::ErrorCode::kLimit) << st.message;
  // A released block's slot has no place any more.
  ASSERT_TRUE(e->Release(std::vector<BlockKey>{K(2)}).ok());
  EXPECT_EQ(reader->Acquire(slots[2], &lease).code, wire::ErrorCode::kNoLease);
  EXPECT_TRUE(d.Alive());
  EXPECT_TRUE(CopyStats(d).is_object());
}

TEST(CopyMode, ALeaseNeverReleasedKeepsItsPlaceAndIsCounted) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n[limits]\nlease_timeout_s = 1\n");
  auto c = Connect(d);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->CreateTierPools(24).ok());
  const std::vector<uint32_t> slots = AdmitAndFill(*c, 16);
  Status st;
  auto reader = c->NewReader(&st);
  ASSERT_TRUE(reader);
  // Hold a lease on block 12 (in tier 1), never released, and make it hot.
  Client::Reader::Lease held;
  ASSERT_TRUE(reader->Acquire(slots[12], &held).ok());
  ASSERT_EQ(held.tier, Tier::kSlow);
  const bool moved = WaitFor([&] {
    for (uint32_t i = 8; i < 16; ++i) c->Observe(slots[i], 1.0f);
    return c->LocationOf(slots[12]).tier == 0 && c->LocationOf(slots[15]).tier == 0;
  });
  EXPECT_TRUE(moved) << d.Log();
  // Counted once it has been held past the timeout; the place is kept.
  EXPECT_TRUE(WaitFor([&] { return CopyStats(d)["lease_timeouts"].get<uint64_t>() >= 1; }))
      << CopyStats(d).dump();
  EXPECT_TRUE(Intact(held.data, 12));
  EXPECT_GE(CopyStats(d)["places_draining"].get<uint64_t>(), 1u);
  // The oldest waiting place's age (cxltier_lease_oldest_wait_seconds) passes
  // the timeout.
  EXPECT_TRUE(WaitFor([&] { return CopyStats(d)["oldest_lease_wait_s"].get<double>() >= 1.0; }))
      << CopyStats(d).dump();
  EXPECT_NE(d.Log().find("read lease(s) held over"), std::string::npos);
  // Released: the place drains.
  const uint64_t freed = CopyStats(d)["places_freed"].get<uint64_t>();
  EXPECT_TRUE(reader->Release(held).ok());
  EXPECT_TRUE(WaitFor([&] { return CopyStats(d)["places_freed"].get<uint64_t>() > freed; }));
  EXPECT_TRUE(WaitFor([&] { return CopyStats(d)["oldest_lease_wait_s"].get<double>() == 0; }))
      << CopyStats(d).dump();
}

TEST(CopyMode, AClientDyingWithLeasesLeavesOthersMoving) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n");
  const pid_t child = testing::ForkAlone();
  if (child == 0) {
    Status st;
    auto c = Client::Connect({d.socket(), kTiny8KiB, 16, "dies"}, &st);
    if (!c || !c->CreateTierPools(8).ok()) _exit(2);
    AdmitAndFill(*c, 8);
    auto r = c->NewReader(&st);
    Client::Reader::Lease l;
    for (uint32_t s = 0; s < 8; ++s) {
      if (!r->Acquire(s, &l).ok()) _exit(3);
    }
    uint8_t* p = nullptr;
    (void)c->BeginWrite(l.slot, &p);  // and a write lease
    _exit(0);                         // no Release, no EndWrite, no goodbye
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // Another client's blocks still move by copy, and its tier-0 pool gets
  // the budget the dead client's pool had.
  auto c = Connect(d);
  ASSERT_TRUE(c);
  // (Once the dead one's blocks are released: until then tier 0 is refused,
  // and each try makes only what is missing.)
  ASSERT_TRUE(WaitFor([&] { return c->CreateTierPools(16).ok(); })) << d.Log();
  EXPECT_EQ(c->tier_pool_bytes(0), 8 * kBlock);
  const std::vector<uint32_t> slots = AdmitAndFill(*c, 16);
  EXPECT_TRUE(WaitFor([&] {
    for (uint32_t i = 8; i < 16; ++i) c->Observe(slots[i], 1.0f);
    return c->LocationOf(slots[15]).tier == 0;
  })) << d.Log();
  EXPECT_TRUE(d.Alive());
}

// A hostile client writes garbage over its location words and lease table
// while its blocks move: only its own moves stall; the daemon and another
// client's copies carry on, and the other client's bytes stay whole.
TEST(CopyMode, GarbageInTheSegmentHurtsOnlyItsWriter) {
  DaemonProcess d("[engine]\ntier0_budget = \"128KiB\"\n");
  auto bad = Connect(d);
  auto good = Connect(d);
  ASSERT_TRUE(bad && good);
  ASSERT_TRUE(bad->CreateTierPools(8).ok());
  ASSERT_TRUE(good->CreateTierPools(16).ok());
  const std::vector<uint32_t> bad_slots = AdmitAndFill(*bad, 8, 0, 1000);
  const std::vector<uint32_t> slots = AdmitAndFill(*good, 16);
  std::atomic<bool> stop{false};
  std::thread vandal([&] {
    // The segment's copy-mode parts, as the client maps them.
    auto* seg =
        reinterpret_cast<uint8_t*>(const_cast<BlockState*>(bad->SlotState(0))) - kSegmentSlotOffset;
    auto* words = reinterpret_cast<uint64_t*>(seg + SegmentLocationOffset(bad->slots()));
    auto* leases = reinterpret_cast<uint64_t*>(seg + SegmentLeaseOffset(bad->slots()));
    uint64_t x = 88172645463325252ULL;
    while (!stop.load()) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      std::atomic_ref<uint64_t>(words[x % bad->slots()]).store(x, std::memory_order_relaxed);
      std::atomic_ref<uint64_t>(leases[x % (kLeaseRows * kLeasesPerRow * 2)])
          .store(x >> 3, std::memory_order_relaxed);
      for (uint32_t s : bad_slots) bad->Observe(s, 1.0f);
    }
  });
  const bool moved = WaitFor([&] {
    for (uint32_t i = 8; i < 16; ++i) good->Observe(slots[i], 1.0f);
    for (uint32_t i = 8; i < 16; ++i) {
      if (good->LocationOf(slots[i]).tier != 0) return false;
    }
    return true;
  });
  stop = true;
  vandal.join();
  EXPECT_TRUE(moved) << d.Log();
  EXPECT_TRUE(d.Alive());
  Status st;
  auto reader = good->NewReader(&st);
  ASSERT_TRUE(reader);
  for (uint32_t i = 0; i < 16; ++i) {
    Client::Reader::Lease lease;
    ASSERT_TRUE(reader->Acquire(slots[i], &lease).ok());
    EXPECT_TRUE(Intact(lease.data, i)) << i;
    EXPECT_TRUE(reader->Release(lease).ok());
  }
}

// ---- leases held across daemon ticks; rewrites with generations ----
//
// A reader's lease usually lasts microseconds, while the daemon reuses a
// place a tick later at the soonest; and a block written once reads back
// right whether or not a write was lost. So these readers hold their leases
// across many ticks while blocks move, are released and their places taken
// again, and then read every byte again; and a writer rewrites blocks (each
// time with the next generation) while the daemon copies them.

// Block `id` at generation `gen`: word 0 the id, word 1 the generation, then
// words of both (two generations of a block differ in every word after 1).
void FillGen(uint8_t* p, uint64_t bytes, uint64_t id, uint64_t gen) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  w[0] = id;
  w[1] = gen;
  for (uint64_t i = 2; i < bytes / 8; ++i) w[i] = Word(id, i) ^ ((gen + 1) * 0xd6e8feb86659fd93ULL);
}

enum class Seen { kWhole, kTorn, kStale };

// Whether p holds block `id` whole at generation `want` (kStale: whole, older).
Seen LookGen(const uint8_t* p, uint64_t bytes, uint64_t id, uint64_t want) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  if (w[0] != id) return Seen::kTorn;
  for (uint64_t i = 2; i < bytes / 8; ++i) {
    if (w[i] != (Word(id, i) ^ ((w[1] + 1) * 0xd6e8feb86659fd93ULL))) return Seen::kTorn;
  }
  if (w[1] < want) return Seen::kStale;
  return w[1] == want ? Seen::kWhole : Seen::kTorn;
}

// A client's blocks under churn: the test's thread admits, heats and
// releases them; reader threads hold read leases across `hold_ticks` daemon
// ticks and check every byte when they take them and when they let go; a
// writer thread (optional) rewrites blocks under write leases, at once when
// the daemon is copying one (its BeginWrite cancels the copy), checking what
// it replaces and, two ticks later, what a read lease shows. No block is
// written while one of our read leases holds it.
class Churn {
 public:
  struct Options {
    uint64_t block_bytes = kBlock;
    int readers = 2;
    uint32_t hold_ticks = 8;
    uint32_t hold_leases = 6;
    bool writer = false;
  };
  Churn(Client& c, const Options& o) : c_(c), o_(o) {
    // The segment's location words, to see a copy under way (the M bit).
    auto* seg =
        reinterpret_cast<uint8_t*>(const_cast<BlockState*>(c.SlotState(0))) - kSegmentSlotOffset;
    words_ = reinterpret_cast<uint64_t*>(seg + SegmentLocationOffset(c.slots()));
    for (int r = 0; r < o.readers; ++r) threads_.emplace_back([this, r] { Read(r); });
    if (o.writer) threads_.emplace_back([this] { Write(); });
  }
  ~Churn() { Stop(); }

  // Admits n new blocks into tier t's pool, writes generation 0 under the
  // write lease the admission gives, and hands them to the threads.
  void Admit(uint32_t n, uint8_t tier) {
    std::vector<wire::AdmitEntry> entries;
    for (uint32_t i = 0; i < n; ++i) entries.push_back({K(next_id_ + i), 0});
    std::vector<wire::AdmitResult> results;
    const Status st = c_.Admit(c_.tier_pool(tier), entries, &results);
    ASSERT_TRUE(st.ok()) << st.message;
    ASSERT_EQ(results.size(), n);
    for (uint32_t i = 0; i < n; ++i) {
      uint8_t* p = c_.WriteAddress(results[i].slot);
      ASSERT_NE(p, nullptr);
      std::lock_guard lock(mu_);  // after the leases on the place ended (Let)
      FillGen(p, o_.block_bytes, next_id_ + i, 0);
      ASSERT_TRUE(c_.EndWrite(results[i].slot).ok());
      live_.push_back(Block{results[i].slot, next_id_ + i});
    }
    next_id_ += n;
  }

  // Releases a block one of our read leases holds now (any, if none does)
  // and, once the daemon ticked twice (its drain ran), admits a new block
  // into the same tier: the released block's place is free by then only if
  // the daemon forgot the lease, and then the new block is written over it.
  void ReleaseHeldAndAdmit() {
    uint32_t slot = 0;
    uint64_t id = 0;
    {
      std::unique_lock lock(mu_);
      if (live_.empty()) return;
      const size_t start = rng_() % live_.size();
      size_t pick = start;
      for (size_t k = 0; k < live_.size(); ++k) {
        if (live_[(start + k) % live_.size()].leases > 0) {
          pick = (start + k) % live_.size();
          break;
        }
      }
      id = live_[pick].id;
      cv_.wait(lock, [&] { return !Find(id)->writing; });
      Block* b = Find(id);
      slot = b->slot;
      *b = live_.back();
      live_.pop_back();
    }
    const uint8_t tier = c_.LocationOf(slot).tier;
    const Status st = c_.Release(std::vector<BlockKey>{K(id)});
    ASSERT_TRUE(st.ok()) << st.message;
    testing::WaitTicks(c_, 2);
    Admit(1, tier < 2 ? tier : 0);
  }

  // One observation for each block of a third of them, a third that
  // changes every 10 ticks: blocks keep moving both ways.
  void Heat() {
    const uint64_t phase = c_.daemon_ticks() / 10 % 3;
    std::lock_guard lock(mu_);
    for (const Block& b : live_) {
      if (b.id % 3 == phase) c_.Observe(b.slot, 1.0f);
    }
  }

  void Stop() {
    stop_ = true;
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  // Every live block under a read lease: whole, of its last generation.
  void CheckAll() {
    Status st;
    auto reader = c_.NewReader(&st);
    ASSERT_TRUE(reader) << st.message;
    std::lock_guard lock(mu_);
    for (const Block& b : live_) {
      Client::Reader::Lease lease;
      ASSERT_TRUE(reader->Acquire(b.slot, &lease).ok());
      const Seen seen = LookGen(lease.data, o_.block_bytes, b.id, b.gen);
      EXPECT_EQ(seen, Seen::kWhole) << "block " << b.id << " generation " << b.gen
                                    << (seen == Seen::kStale ? ": an older one" : ": torn");
      EXPECT_TRUE(reader->Release(lease).ok());
    }
  }

  std::string Counts() const {
    return "holds " + std::to_string(holds) + ", of moved blocks " + std::to_string(held_moved) +
           ", of released ones " + std::to_string(held_released) + ", changed " +
           std::to_string(changed) + " (" + std::to_string(changed_moved) + " of moved blocks, " +
           std::to_string(changed_released) + " of released ones); reads " + std::to_string(reads) +
           ": torn " + std::to_string(torn) + ", stale " + std::to_string(stale) + "; rewrites " +
           std::to_string(rewrites) + " (" + std::to_string(over_copy) + " over a copy); " +
           std::to_string(failed) + " failed calls " + first_error_;
  }

  std::atomic<uint64_t> holds{0}, held_moved{0}, held_released{0}, changed{0};
  std::atomic<uint64_t> changed_moved{0}, changed_released{0};  // changed, of such blocks
  std::atomic<uint64_t> reads{0}, torn{0}, stale{0}, rewrites{0}, over_copy{0}, failed{0};

 private:
  struct Block {
    uint32_t slot = 0;
    uint64_t id = 0;
    uint64_t gen = 0;     // the last completed write's
    uint32_t leases = 0;  // our read leases on it now
    bool writing = false;
  };
  struct Held {
    Client::Reader::Lease lease;
    uint64_t id = 0;
    uint64_t gen = 0;
    bool whole = false;  // at the first look
  };

  Block* Find(uint64_t id) {  // REQUIRES mu_
    for (Block& b : live_) {
      if (b.id == id) return &b;
    }
    return nullptr;
  }
  void Fail(const std::string& what, const Status& st) {  // REQUIRES mu_
    failed.fetch_add(1);
    if (first_error_.empty()) first_error_ = "(" + what + ": " + st.message + ")";
  }
  bool Moving(uint32_t slot) const {
    return std::atomic_ref<uint64_t>(words_[slot]).load(std::memory_order_relaxed) & kLocMoving;
  }
  // Takes a read lease on the live block b; false when it fails (counted).
  bool Take(Client::Reader& reader, Block& b, Held* h) {  // REQUIRES mu_
    const Status st = reader.Acquire(b.slot, &h->lease);
    if (!st.ok()) {
      Fail("Acquire", st);
      return false;
    }
    *h = Held{h->lease, b.id, b.gen};
    ++b.leases;
    return true;
  }
  // Under mu_: the daemon hands a place on only once our leases on it
  // ended, through its own process and the socket, which TSan cannot see;
  // leases released under mu_, and places written only after taking mu_
  // (Admit, Write), show it the order.
  void Let(Client::Reader& reader, const Held& h) {
    std::lock_guard lock(mu_);
    const Status st = reader.Release(h.lease);
    if (!st.ok()) Fail("Release", st);
    if (Block* b = Find(h.id)) --b->leases;
  }
  void Count(Seen seen) {
    reads.fetch_add(1);
    if (seen == Seen::kTorn) torn.fetch_add(1);
    if (seen == Seen::kStale) stale.fetch_add(1);
  }

  void Read(int r) {
    Status st;
    auto reader = c_.NewReader(&st);
    if (!reader) {
      std::lock_guard lock(mu_);
      return Fail("NewReader", st);
    }
    std::mt19937_64 rng(static_cast<uint64_t>(r) + 1);
    while (!stop_.load()) {
      std::vector<Held> hold;
      {
        std::lock_guard lock(mu_);
        for (uint32_t tries = 0;
             tries < 4 * o_.hold_leases && hold.size() < o_.hold_leases && !live_.empty();
             ++tries) {
          Block& b = live_[rng() % live_.size()];
          const bool have =
              std::any_of(hold.begin(), hold.end(), [&](const Held& h) { return h.id == b.id; });
          Held h;
          if (!have && !b.writing && Take(*reader, b, &h)) hold.push_back(h);
        }
      }
      if (hold.empty()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      for (Held& h : hold) {
        const Seen seen = LookGen(h.lease.data, o_.block_bytes, h.id, h.gen);
        h.whole = seen == Seen::kWhole;
        Count(seen);
      }
      // Held while the daemon ticks (moving, releasing and reusing places).
      const uint64_t until = c_.daemon_ticks() + o_.hold_ticks;
      testing::WaitFor([&] { return stop_.load() || c_.daemon_ticks() >= until; });
      for (const Held& h : hold) {
        bool released = false;
        {
          std::lock_guard lock(mu_);
          released = Find(h.id) == nullptr;
        }
        const Location now = c_.LocationOf(h.lease.slot);
        const bool moved = !released && (now.tier != static_cast<uint8_t>(h.lease.tier) ||
                                         c_.tier_pool_base(now.tier) +
                                                 uint64_t{now.index} * c_.tier_pool_stride() !=
                                             h.lease.data);
        held_released.fetch_add(released);
        held_moved.fetch_add(moved);
        if (h.whole && LookGen(h.lease.data, o_.block_bytes, h.id, h.gen) != Seen::kWhole) {
          changed.fetch_add(1);
          changed_moved.fetch_add(moved);
          changed_released.fetch_add(released);
        }
        holds.fetch_add(1);
        Let(*reader, h);
      }
    }
  }

  void Write() {
    Status st;
    auto reader = c_.NewReader(&st);  // to look again at the blocks of cancelled copies
    if (!reader) {
      std::lock_guard lock(mu_);
      return Fail("NewReader", st);
    }
    std::mt19937_64 rng(7);
    struct Again {
      uint64_t id;
      uint64_t tick;
    };
    std::deque<Again> again;
    auto next_any = std::chrono::steady_clock::now();
    uint64_t cancels = 0;
    while (!stop_.load()) {
      // Two ticks after a rewrite that cancelled a copy: a daemon that
      // published the copy anyway has done so by now.
      while (!again.empty() && c_.daemon_ticks() >= again.front().tick) {
        Held h;
        bool took = false;
        {
          std::lock_guard lock(mu_);
          Block* b = Find(again.front().id);
          took = b && !b->writing && Take(*reader, *b, &h);
        }
        again.pop_front();
        if (!took) continue;
        Count(LookGen(h.lease.data, o_.block_bytes, h.id, h.gen));
        Let(*reader, h);
      }
      // A block the daemon is copying now, else (each millisecond) any.
      Block was;
      {
        std::lock_guard lock(mu_);
        Block* pick = nullptr;
        const size_t n = live_.size();
        const size_t start = n ? rng() % n : 0;
        for (size_t k = 0; k < n && !pick; ++k) {
          Block& b = live_[(start + k) % n];
          if (!b.writing && b.leases == 0 && Moving(b.slot)) pick = &b;
        }
        if (!pick && n && std::chrono::steady_clock::now() >= next_any) {
          next_any = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
          Block& b = live_[rng() % n];
          if (!b.writing && b.leases == 0) pick = &b;
        }
        if (pick) {
          pick->writing = true;
          was = *pick;
        }
      }
      if (!was.writing) {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        continue;
      }
      const bool during_copy = Moving(was.slot);
      uint8_t* p = nullptr;
      st = c_.BeginWrite(was.slot, &p);
      if (st.ok() && during_copy && ++cancels % 2 == 0) {
        // Every other time, write once the copy is through (about 1 us a
        // KiB): the daemon then finds its copy whole and must still drop it
        // because of the write lease, not because the bytes differ.
        std::this_thread::sleep_for(std::chrono::microseconds(o_.block_bytes / 1024));
      }
      if (st.ok()) {
        { std::lock_guard lock(mu_); }  // after the leases on the place ended (Let)
        // The write lease holds the place: it holds our last write.
        Count(LookGen(p, o_.block_bytes, was.id, was.gen));
        FillGen(p, o_.block_bytes, was.id, was.gen + 1);
        // Fails if the lease was lost meanwhile: a copy published over it.
        const Status end = c_.EndWrite(was.slot);
        std::lock_guard lock(mu_);
        if (!end.ok()) Fail("EndWrite", end);
      }
      {
        std::lock_guard lock(mu_);
        if (!st.ok()) Fail("BeginWrite", st);
        Block* b = Find(was.id);
        b->writing = false;
        if (st.ok()) b->gen = was.gen + 1;
      }
      cv_.notify_all();
      if (!st.ok()) continue;
      rewrites.fetch_add(1);
      if (during_copy) {
        over_copy.fetch_add(1);
        again.push_back({was.id, c_.daemon_ticks() + 2});
      }
    }
  }

  Client& c_;
  const Options o_;
  uint64_t* words_ = nullptr;
  uint64_t next_id_ = 0;  // the test's thread only
  std::mt19937_64 rng_{1};
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Block> live_;  // GUARDED_BY(mu_)
  std::string first_error_;  // GUARDED_BY(mu_)
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Readers hold leases for 8 ticks each while blocks move both ways and
// blocks they hold are released and new ones admitted in their tier: a
// daemon that reuses a place without looking up its read leases (a tick
// after the move or release) gives the place to a copy or a new block, and
// the second look at the held bytes sees them.
TEST(CopyMode, LeasesHeldAcrossTicksKeepTheirBytesWhilePlacesAreReused) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n");  // 8 blocks of tier 0
  auto c = Connect(d, 128);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->CreateTierPools(40).ok());  // room for 20 live blocks and what leases keep
  Churn w(*c, Churn::Options{});
  w.Admit(20, 0);
  // Until enough held blocks were moved and released under their leases.
  const bool enough = WaitFor(
      [&] {
        w.Heat();
        w.ReleaseHeldAndAdmit();
        return w.held_moved >= 24 && w.held_released >= 24;
      },
      std::chrono::seconds(180));
  w.Stop();
  std::printf("%s\n", w.Counts().c_str());
  EXPECT_TRUE(enough) << w.Counts() << "\n" << d.Log();
  EXPECT_EQ(w.changed.load(), 0u) << w.Counts();
  EXPECT_EQ(w.torn.load(), 0u) << w.Counts();
  EXPECT_EQ(w.failed.load(), 0u) << w.Counts();
  w.CheckAll();
  const nlohmann::json copy = CopyStats(d);
  EXPECT_GT(copy["places_freed"].get<uint64_t>(), 0u) << copy.dump();
  EXPECT_TRUE(d.Alive());
}

// A writer rewrites blocks under write leases, each time with the next
// generation, at once when the daemon is copying one (its BeginWrite cancels
// the copy), while readers hold leases across ticks and blocks move and are
// released: every read, the writer's own look before it writes and the last
// check see the last generation written. A daemon that publishes a copy a
// writer cancelled shows an older generation (or a torn block, or takes the
// write lease away: EndWrite fails); one that forgets read leases changes
// held bytes.
TEST(CopyMode, RewritesWhileBlocksMoveReadBackTheLastGeneration) {
  // 512 KiB blocks: a copy lasts long enough for the writer to see it under way.
  const ModelGeometry big{"big", 64, 1, 1, 128, 2, 16};
  constexpr uint64_t kBig = 64 * kBlock;
  DaemonProcess d("[engine]\ntier0_budget = \"4MiB\"\n");  // 8 blocks of tier 0
  Status st;
  auto c = Client::Connect({d.socket(), big, 128, "rewrites"}, &st);
  ASSERT_TRUE(c) << st.message;
  ASSERT_TRUE(c->CreateTierPools(40).ok());
  Churn::Options o;
  o.block_bytes = kBig;
  o.readers = 1;
  o.writer = true;
  Churn w(*c, o);
  w.Admit(20, 0);
  const bool enough = WaitFor(
      [&] {
        w.Heat();
        w.ReleaseHeldAndAdmit();
        return w.over_copy >= 40 && w.held_moved >= 12 && w.held_released >= 12;
      },
      std::chrono::seconds(180));
  w.Stop();
  std::printf("%s\n", w.Counts().c_str());
  EXPECT_TRUE(enough) << w.Counts() << "\n" << d.Log();
  EXPECT_EQ(w.stale.load(), 0u) << w.Counts();
  EXPECT_EQ(w.torn.load(), 0u) << w.Counts();
  EXPECT_EQ(w.changed.load(), 0u) << w.Counts();
  EXPECT_EQ(w.failed.load(), 0u) << w.Counts();
  w.CheckAll();
  const nlohmann::json copy = CopyStats(d);
  EXPECT_GT(copy["dropped_written"].get<uint64_t>(), 0u) << copy.dump();  // writes cancelled copies
  EXPECT_TRUE(d.Alive());
}

TEST(CopyMode, TheCApiWritesReadsAndRefusesBadLeases) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n");
  const cxltier_model m{1, 1, 1, 128, 2, 16};
  cxltier_client* c = nullptr;
  char err[256] = {};
  ASSERT_EQ(cxltier_connect(d.socket().c_str(), &m, 16, "c-copy", &c, err, sizeof(err)), 0) << err;
  ASSERT_EQ(cxltier_create_tier_pools(c, 8, nullptr, 0), 0) << cxltier_last_error(c);
  EXPECT_EQ(cxltier_create_tier_pools(c, 8, nullptr, 0), -CXLTIER_E_BAD_POOL);
  uint32_t pool = 0;
  void* base = nullptr;
  uint64_t bytes = 0;
  ASSERT_EQ(cxltier_tier_pool(c, 0, &pool, &base, &bytes), 0);
  EXPECT_EQ(bytes, 8 * kBlock);
  // Tier 2 could exist (not on this two-tier daemon); tier 8 never does.
  EXPECT_EQ(cxltier_tier_pool(c, 2, &pool, &base, &bytes), -CXLTIER_E_NOT_READY);
  EXPECT_EQ(cxltier_tier_pool(c, 8, &pool, &base, &bytes), -CXLTIER_E_BAD_POOL);
  const cxltier_key key{91, 0};
  const uint32_t index = 0;
  uint32_t slot = 0;
  ASSERT_EQ(cxltier_admit(c, pool, &key, &index, 1, &slot), 0) << cxltier_last_error(c);
  auto* p = static_cast<uint8_t*>(cxltier_write_address(c, slot));
  ASSERT_NE(p, nullptr);
  auto* words = reinterpret_cast<uint64_t*>(p);
  for (uint64_t w = 0; w < kBlock / 8; ++w) words[w] = Word(0, w);
  ASSERT_EQ(cxltier_end_write(c, slot), 0);
  EXPECT_EQ(cxltier_write_address(c, slot), nullptr);
  EXPECT_EQ(cxltier_end_write(c, slot), -CXLTIER_E_NO_LEASE);
  cxltier_reader* r = nullptr;
  ASSERT_EQ(cxltier_reader_new(c, &r), 0);
  cxltier_lease lease{};
  ASSERT_EQ(cxltier_lease_acquire(r, slot, &lease), 0) << cxltier_reader_last_error(r);
  EXPECT_TRUE(Intact(static_cast<const uint8_t*>(lease.data), 0));
  EXPECT_EQ(cxltier_lease_release(r, &lease), 0);
  EXPECT_EQ(cxltier_lease_release(r, &lease), -CXLTIER_E_NO_LEASE);
  EXPECT_NE(std::string(cxltier_reader_last_error(r)), "");
  EXPECT_EQ(cxltier_lease_acquire(r, 15, &lease), -CXLTIER_E_NO_LEASE);
  cxltier_reader_free(r);
  cxltier_close(c);
}

// ---- nothing a client can still read is changed: stops, drops, reconnects ----

// The blocks of one client: the pattern of block i is Word(i, .), its key K(i).
std::vector<uint32_t> AdmitPatterned(Client& c, uint32_t n) {
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < n; ++i) entries.push_back({K(i), 0});
  std::vector<wire::AdmitResult> results;
  const Status st = c.Admit(c.tier_pool(0), entries, &results);
  EXPECT_TRUE(st.ok()) << st.message;
  std::vector<uint32_t> slots;
  for (uint32_t i = 0; i < results.size(); ++i) {
    auto* words = reinterpret_cast<uint64_t*>(c.WriteAddress(results[i].slot));
    EXPECT_TRUE(words) << "an admitted block comes with its write lease";
    if (!words) continue;
    for (uint64_t w = 0; w < kBlock / 8; ++w) words[w] = Word(i, w);
    EXPECT_TRUE(c.EndWrite(results[i].slot).ok());
    slots.push_back(results[i].slot);
  }
  return slots;
}

uint64_t Copies(const DaemonProcess& d) { return CopyStats(d)["copies"].get<uint64_t>(); }

// Heats blocks [from, to) until the daemon has made `more` copies.
bool MovesHappen(Client& c, const DaemonProcess& d, uint32_t from, uint32_t to, uint64_t more) {
  const uint64_t start = Copies(d);
  return WaitFor([&] {
    for (uint32_t i = from; i < to; ++i) {
      uint32_t slot = 0;
      if (c.SlotOf(K(i), &slot)) c.Observe(slot, 1.0f);
    }
    return Copies(d) >= start + more;
  });
}

// The connected socket the client library opened (the one new fd that is a socket).
int ClientSocket(const std::vector<int>& before) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:", 0) == 0 &&
        std::find(before.begin(), before.end(), fd) == before.end()) {
      return fd;
    }
  }
  return -1;
}

std::vector<int> OpenSockets() {
  std::vector<int> fds;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(e.path(), ec).string().rfind("socket:", 0) == 0) {
      fds.push_back(std::stoi(e.path().filename().string()));
    }
  }
  return fds;
}

// One request on a connection of its own, as a client library of another
// language would send it: hello (of `slots` slots), then CreateTierPool with
// `fd` attached.
Status RawCreateTierPool(const std::string& socket_path, uint8_t tier, wire::TierPoolSource source,
                         uint32_t blocks, uint64_t stride, int fd, uint32_t slots = 64) {
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strcpy(a.sun_path, socket_path.c_str());
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(s);
    return Status::Fail(wire::ErrorCode::kInternal, "connect");
  }
  auto call = [&](const std::vector<uint8_t>& frame, int send_fd, std::vector<uint8_t>* payload,
                  wire::MsgType* type) {
    if (detail::SendWithFd(s, frame.data(), frame.size(), send_fd, MSG_NOSIGNAL) !=
        static_cast<ssize_t>(frame.size())) {
      return false;
    }
    std::vector<uint8_t> head(wire::kHeaderBytes);
    auto read_all = [&](uint8_t* p, size_t n) {
      while (n > 0) {
        const ssize_t r = detail::RecvWithFds(s, p, n, 0, [](int got) { close(got); });
        if (r <= 0) return false;
        p += r;
        n -= static_cast<size_t>(r);
      }
      return true;
    };
    if (!read_all(head.data(), head.size())) return false;
    const wire::Header h = *wire::DecodeHeader(head);
    payload->resize(h.payload_bytes);
    *type = h.type;
    return read_all(payload->data(), payload->size());
  };
  std::vector<uint8_t> frame, payload;
  wire::MsgType type{};
  wire::Encode(wire::Hello{kTiny8KiB, slots, "raw"}, 1, frame);
  Status st = Status::Fail(wire::ErrorCode::kInternal, "no answer");
  if (call(frame, -1, &payload, &type) && type == wire::MsgType::kHelloOk) {
    frame.clear();
    wire::CreateTierPool m;
    m.tier = tier;
    m.source = source;
    m.blocks = blocks;
    m.stride = stride;
    wire::Encode(m, 2, frame);
    if (call(frame, fd, &payload, &type)) {
      if (type == wire::MsgType::kError) {
        wire::Error e;
        st = wire::Decode(payload, &e);
        if (st.ok()) st = Status::Fail(e.code, e.message);
      } else {
        st = Status::Ok();
      }
    }
  }
  close(s);
  return st;
}

enum class Drop { kSigterm, kSigkill, kConnection };

// Read leases on 8 blocks, held while blocks are copied away (so some
// leases name old places) and other blocks move, then across a daemon stop
// (or the daemon dropping the connection), a reconnect, and more moves under
// the new daemon: every leased byte reads back the same throughout, every
// block is where the client can find it, and the leases release cleanly.
void LeasesSurvive(Drop how) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n[limits]\nframe_timeout_s = 1\n");
  const std::vector<int> before = OpenSockets();
  auto c = Connect(d);
  ASSERT_TRUE(c);
  const int sock = ClientSocket(before);
  ASSERT_GE(sock, 0);
  ASSERT_TRUE(c->CreateTierPools(32).ok());
  const std::vector<uint32_t> slots = AdmitPatterned(*c, 24);  // 0..7 in tier 0
  Status st;
  auto reader = c->NewReader(&st);
  ASSERT_TRUE(reader) << st.message;
  // Leases on blocks 0..3 (tier 0) and 8..11 (tier 1).
  const std::vector<uint32_t> leased = {0, 1, 2, 3, 8, 9, 10, 11};
  std::vector<Client::Reader::Lease> leases(leased.size());
  auto all_intact = [&] {
    for (size_t j = 0; j < leased.size(); ++j) EXPECT_TRUE(Intact(leases[j].data, leased[j])) << j;
  };
  for (size_t j = 0; j < leased.size(); ++j) {
    ASSERT_TRUE(reader->Acquire(slots[leased[j]], &leases[j]).ok());
  }
  all_intact();
  // Blocks 16..23 get hot: 0..7 are copied out of tier 0 (0..3 keep their
  // old places for the leases) and four of 16..23 take 4..7's places.
  ASSERT_TRUE(MovesHappen(*c, d, 16, 24, 10)) << d.Log();
  all_intact();

  if (how == Drop::kConnection) {
    // A frame started and never finished: the daemon closes the connection
    // after frame_timeout_s, as it does to any client that stalls.
    const uint8_t partial[4] = {0x43, 0x58, 0x4c, 0x54};
    ASSERT_EQ(write(sock, partial, sizeof(partial)), 4);
    std::string json;
    EXPECT_TRUE(WaitFor([&] { return !c->Stats("status", &json).ok(); }));
  } else {
    d.Stop(how == Drop::kSigterm ? SIGTERM : SIGKILL);
  }
  all_intact();
  for (uint32_t i = 0; i < 24; ++i) {  // each block where the segment last said
    const Location at = c->LocationOf(c->SlotOf(K(i)));
    ASSERT_TRUE(at.has_place()) << i;
    EXPECT_TRUE(Intact(c->tier_pool_base(at.tier) + uint64_t{at.index} * c->tier_pool_stride(), i))
        << i;
  }
  if (how != Drop::kConnection) d.Start();
  // The dropped connection's pools go back to the budget once its blocks
  // are released: until then the import of tier 0 is refused, changing nothing.
  ASSERT_TRUE(WaitFor([&] {
    Status r = c->Reconnect();
    return r.ok();
  })) << d.Log();
  all_intact();
  // The new daemon moves blocks (0..7 back into tier 0, the parked places'
  // keys and 16..23 out) and reuses the places they leave: never one a
  // lease holds.
  const uint64_t freed = CopyStats(d)["places_freed"].get<uint64_t>();
  ASSERT_TRUE(MovesHappen(*c, d, 0, 8, 8)) << CopyStats(d).dump();
  EXPECT_TRUE(WaitFor([&] { return CopyStats(d)["places_freed"].get<uint64_t>() > freed; }));
  all_intact();
  for (const auto& l : leases) EXPECT_TRUE(reader->Release(l).ok());
  // Every block reads back whole under a new lease, at its new slot.
  for (uint32_t i = 0; i < 24; ++i) {
    Client::Reader::Lease l;
    ASSERT_TRUE(reader->Acquire(c->SlotOf(K(i)), &l).ok()) << i;
    EXPECT_TRUE(Intact(l.data, i)) << i;
    EXPECT_TRUE(reader->Release(l).ok());
  }
  // The places the leases kept are given back: once the next call has
  // released the library's parked keys, the client holds its 24 blocks.
  ASSERT_TRUE(c->Release({}).ok());
  std::string json;
  ASSERT_TRUE(c->Stats("clients", &json).ok());
  uint64_t blocks = 0;
  for (const auto& cl : nlohmann::json::parse(json)) blocks += cl["blocks"].get<uint64_t>();
  EXPECT_EQ(blocks, 24u) << json;
  EXPECT_TRUE(d.Alive());
}

// A Reconnect that fails half-way: the restarted daemon lets the uid hold 8
// blocks, so tier 0's 8 are admitted again and tier 1's 16 are refused. The
// client is left as before the attempt: every key's slot reads that key's
// bytes (it used to keep the new segment with the old slots: a slot read
// whatever block the new daemon had put there), and the next attempt, with
// room again, succeeds.
TEST(CopyMode, AReconnectThatFailsHalfWayLeavesEveryReadRight) {
  DaemonProcess d(
      "[engine]\ntier0_budget = \"64KiB\"\n[limits]\nframe_timeout_s = 1\n"
      "max_blocks_per_uid = 1000\n");
  auto c = Connect(d);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->CreateTierPools(32).ok());
  ASSERT_EQ(AdmitPatterned(*c, 24).size(), 24u);  // 0..7 in tier 0
  Status st;
  auto reader = c->NewReader(&st);
  ASSERT_TRUE(reader) << st.message;
  auto every_read_right = [&](const char* when) {
    for (uint32_t i = 0; i < 24; ++i) {
      uint32_t slot = 0;
      ASSERT_TRUE(c->SlotOf(K(i), &slot)) << when << ": block " << i;
      Client::Reader::Lease l;
      ASSERT_TRUE(reader->Acquire(slot, &l).ok()) << when << ": block " << i;
      EXPECT_TRUE(Intact(l.data, i)) << when << ": block " << i << " reads another's bytes";
      EXPECT_TRUE(reader->Release(l).ok());
    }
  };
  every_read_right("before");
  // A lease held across both attempts: carried by the one that succeeds.
  Client::Reader::Lease held;
  ASSERT_TRUE(reader->Acquire(c->SlotOf(K(8)), &held).ok());
  auto set_limit = [&](const char* from, const char* to) {
    std::ifstream in(d.config_path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos);
    text.replace(at, std::strlen(from), to);
    std::ofstream(d.config_path()) << text;
  };
  d.Stop(SIGKILL);
  set_limit("max_blocks_per_uid = 1000", "max_blocks_per_uid = 8");
  d.Start();
  Status last;
  ASSERT_TRUE(WaitFor([&] {
    last = c->Reconnect();
    return last.code == wire::ErrorCode::kLimit;
  })) << last.message
      << "\n"
      << d.Log();
  every_read_right("after a Reconnect that failed half-way");
  // Requests wait for a Reconnect that succeeds.
  std::vector<wire::AdmitResult> r;
  EXPECT_EQ(c->Admit(c->tier_pool(0), std::vector<wire::AdmitEntry>{{K(99), 0}}, &r).code,
            wire::ErrorCode::kNotReady);
  d.Stop(SIGKILL);
  set_limit("max_blocks_per_uid = 8", "max_blocks_per_uid = 1000");
  d.Start();
  ASSERT_TRUE(WaitFor([&] { return (last = c->Reconnect()).ok(); })) << last.message << "\n"
                                                                     << d.Log();
  every_read_right("after the next Reconnect");
  EXPECT_TRUE(Intact(held.data, 8));
  EXPECT_TRUE(reader->Release(held).ok());
  EXPECT_TRUE(d.Alive());
}

// A Release the daemon applied whose answer the client never read (the
// connection dropped first): the library still lists the key, and the old
// segment's word for it says "no place". A Reconnect takes it as released;
// it used to fail every attempt ("has no place in the old state segment").
TEST(CopyMode, AReleaseWhoseAnswerWasLostDoesNotStopAReconnect) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n[limits]\nframe_timeout_s = 1\n");
  const std::vector<int> before = OpenSockets();
  auto c = Connect(d);
  ASSERT_TRUE(c);
  const int sock = ClientSocket(before);
  ASSERT_GE(sock, 0);
  ASSERT_TRUE(c->CreateTierPools(32).ok());
  const std::vector<uint32_t> slots = AdmitPatterned(*c, 8);
  ASSERT_EQ(slots.size(), 8u);
  // In a group, whose hint a Reconnect sends again (without block 3).
  const BlockKey grouped[] = {K(3), K(4)};
  ASSERT_TRUE(c->Hint(5, HintKind::kSoon, grouped).ok());
  // Block 3's release on the library's socket behind its back, then the
  // start of a frame that never finishes: the daemon releases the block,
  // answers, and closes the connection after frame_timeout_s.
  std::vector<uint8_t> bytes;
  wire::Encode(wire::Release{{K(3)}}, 1u << 30, bytes);
  for (uint8_t b : {0x43, 0x58, 0x4c, 0x54}) bytes.push_back(b);
  ASSERT_EQ(write(sock, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  std::string json;
  EXPECT_TRUE(WaitFor([&] { return !c->Stats("status", &json).ok(); }));
  EXPECT_FALSE(c->LocationOf(slots[3]).has_place());  // released: the word says so
  Status last;
  ASSERT_TRUE(WaitFor([&] { return (last = c->Reconnect()).ok(); })) << last.message << "\n"
                                                                     << d.Log();
  uint32_t slot = 0;
  EXPECT_FALSE(c->SlotOf(K(3), &slot));
  Status st;
  auto reader = c->NewReader(&st);
  ASSERT_TRUE(reader) << st.message;
  for (uint32_t i = 0; i < 8; ++i) {
    if (i == 3) continue;
    ASSERT_TRUE(c->SlotOf(K(i), &slot)) << i;
    Client::Reader::Lease l;
    ASSERT_TRUE(reader->Acquire(slot, &l).ok()) << i;
    EXPECT_TRUE(Intact(l.data, i)) << i;
    EXPECT_TRUE(reader->Release(l).ok());
  }
  ASSERT_TRUE(c->Stats("clients", &json).ok());
  uint64_t blocks = 0;
  for (const auto& cl : nlohmann::json::parse(json)) blocks += cl["blocks"].get<uint64_t>();
  EXPECT_EQ(blocks, 7u) << json;
}

TEST(CopyMode, HeldLeasesReadEveryByteAcrossSigtermAndAReconnect) { LeasesSurvive(Drop::kSigterm); }
TEST(CopyMode, HeldLeasesReadEveryByteAcrossSigkillAndAReconnect) { LeasesSurvive(Drop::kSigkill); }
TEST(CopyMode, HeldLeasesReadEveryByteAcrossADroppedConnection) {
  LeasesSurvive(Drop::kConnection);
}

// An imported pool must be one a daemon made for that tier: a memfd of the
// right name, sealed, the right size, with no hole. Anything else is refused
// with the reason and costs the daemon nothing.
TEST(CopyMode, AnImportIsCheckedAsTheDaemonWouldMakeIt) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n");
  struct Case {
    const char* name;
    uint64_t bytes;
    unsigned seals;
    bool fill;
    const char* why;
  };
  const unsigned all = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  for (const Case& k : {Case{"other", 8 * kBlock, all, true, "not the memfd"},
                        Case{"cxltier-tier1", 8 * kBlock, all, true, "not the memfd"},
                        Case{"cxltier-tier0", 8 * kBlock, F_SEAL_SHRINK, true, "sealed"},
                        Case{"cxltier-tier0", 9 * kBlock, all, true, "bytes"},
                        Case{"cxltier-tier0", 8 * kBlock, all, false, "hole"}}) {
    const int fd = memfd_create(k.name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, static_cast<off_t>(k.bytes)), 0);
    if (k.fill) {
      std::vector<uint8_t> ones(k.bytes, 1);
      ASSERT_EQ(pwrite(fd, ones.data(), ones.size(), 0), static_cast<ssize_t>(k.bytes));
    }
    ASSERT_EQ(fcntl(fd, F_ADD_SEALS, k.seals), 0);
    const Status st =
        RawCreateTierPool(d.socket(), 0, wire::TierPoolSource::kImport, 8, kBlock, fd);
    close(fd);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadPool) << k.name << ": " << st.message;
    EXPECT_NE(st.message.find(k.why), std::string::npos) << st.message;
  }
  // A hugetlbfs memfd of the right name, seals and size (all holes, which
  // lseek does not show there): refused before its pages are looked at.
  // (A kernel without hugetlbfs, or whose huge pages are not 2 MiB: this
  // part says so and is not run.)
  const int huge = memfd_create("cxltier-tier1", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB);
  if (huge >= 0 && ftruncate(huge, 2 << 20) == 0 && fcntl(huge, F_ADD_SEALS, all) == 0) {
    const Status st =
        RawCreateTierPool(d.socket(), 1, wire::TierPoolSource::kImport, 256, kBlock, huge, 256);
    close(huge);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadPool) << st.message;
    EXPECT_NE(st.message.find("tmpfs"), std::string::npos) << st.message;
  } else {
    std::printf("hugetlbfs memfd not made here (%s): its import is not checked\n",
                std::strerror(errno));
    if (huge >= 0) close(huge);
  }
  // A live client's own tier pool, imported on another connection: busy (two
  // owners would hand out the same places).
  auto c = Connect(d);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->CreateTierPools(8).ok());
  int theirs = -1;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (std::filesystem::read_symlink(e.path(), ec).string() == "/memfd:cxltier-tier1 (deleted)") {
      theirs = std::stoi(e.path().filename().string());
    }
  }
  ASSERT_GE(theirs, 0) << "the library keeps the daemon's memfd for a reconnect";
  const Status st =
      RawCreateTierPool(d.socket(), 1, wire::TierPoolSource::kImport, 8, kBlock, theirs);
  EXPECT_EQ(st.code, wire::ErrorCode::kBusy) << st.message;
  EXPECT_NE(st.message.find("still in use"), std::string::npos) << st.message;
  EXPECT_TRUE(d.Alive());
}

// A good import (the right name, seals, size, no hole, on the tier's node)
// is still held to the quotas: a uid capped at 2 blocks of tier 0 imports no
// tier-0 pool of 8 (any local user can make such a memfd), and gets 2 when
// it asks for new pools.
TEST(CopyMode, AnImportIsHeldToItsUidsCaps) {
  DaemonProcess d("[engine]\ntier0_budget = \"64KiB\"\n[[quotas.user]]\nuid = " +
                  std::to_string(getuid()) + "\ntier0 = \"16KiB\"\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  const int fd = memfd_create("cxltier-tier0", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(8 * kBlock)), 0);
  std::vector<uint8_t> ones(8 * kBlock, 1);
  ASSERT_EQ(pwrite(fd, ones.data(), ones.size(), 0), static_cast<ssize_t>(ones.size()));
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  const Status st = RawCreateTierPool(d.socket(), 0, wire::TierPoolSource::kImport, 8, kBlock, fd);
  close(fd);
  EXPECT_EQ(st.code, wire::ErrorCode::kLimit) << st.message;
  EXPECT_NE(st.message.find("the imported tier-0 pool holds 8 blocks and only 2 fit: uid " +
                            std::to_string(getuid()) + "'s tier-0 cap is 2 blocks"),
            std::string::npos)
      << st.message;
  auto c = Connect(d);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->CreateTierPools(8).ok());
  EXPECT_EQ(c->tier_pool_bytes(0), 2 * kBlock);
  EXPECT_TRUE(d.Alive());
}

}  // namespace
}  // namespace cxltier
