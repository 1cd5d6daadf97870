// Attacks on the ghost store (docs/security.md): one uid releasing far more
// blocks than its share must not push out another uid's saved states, neither
// while the daemon runs nor across a restart from its checkpoint. The attacker
// is another uid; a good client of a third uid runs throughout.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "hostile/hostile_harness.h"

namespace cxltier::testing {
namespace {

#define NEED_ROOT()                                                \
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root"; \
  ASSERT_TRUE(EnsureHostileUsers())

// A small store so the attack is quick: 4096 ghosts in all, 1024 per uid.
constexpr uint32_t kGhostCapacity = 4096;
constexpr uint32_t kGhostsPerUid = 1024;
const std::string kSmallGhostStore =
    "[engine]\nblock_bytes = 4096\nghost_capacity = " + std::to_string(kGhostCapacity) +
    "\n[limits]\nmax_ghosts_per_uid = " + std::to_string(kGhostsPerUid) + "\n";

// The good user's blocks: well within its share.
constexpr uint32_t kGoodBlocks = 256;
BlockKey GoodKey(uint64_t i) { return BlockKey::FromSequence(5151, i); }
BlockKey EvilKey(uint64_t i) { return BlockKey::FromSequence(666, i); }

// As `kGood`: admits its blocks, touches each (so there is a score worth
// keeping), releases them all; they become ghosts.
std::string GoodLeavesGhosts(const std::string& socket) {
  Status st;
  auto c = Client::Connect({socket, kHostileModel, kGoodBlocks, "good-ghosts"}, &st);
  if (!c) return "connect: " + st.message;
  const int fd = SealedPool(kGoodBlocks, "good-ghosts");
  uint32_t pool = 0;
  if (fd < 0) return "memfd";
  if (!(st = c->RegisterMemfdPool(fd, kGoodBlocks * kHostileStride, kHostileStride, kGoodBlocks,
                                  &pool))
           .ok()) {
    return "register: " + st.message;
  }
  std::vector<wire::AdmitEntry> entries;
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < kGoodBlocks; ++i) {
    keys.push_back(GoodKey(i));
    entries.push_back({keys.back(), i});
  }
  std::vector<wire::AdmitResult> admitted;
  if (!(st = c->Admit(pool, entries, &admitted)).ok()) return "admit: " + st.message;
  std::vector<wire::Observation> obs;
  for (const wire::AdmitResult& r : admitted) obs.push_back({r.slot, 1.0f});
  if (!(st = c->Report(obs)).ok()) return "report: " + st.message;
  wire::ReleaseOk rel;
  if (!(st = c->Release(keys, &rel)).ok()) return "release: " + st.message;
  if (rel.released != kGoodBlocks) return "released " + std::to_string(rel.released);
  return "";
}

// As `kGood`: admits the same keys again; every one must come back restored.
std::string GoodGetsItsGhostsBack(const std::string& socket) {
  Status st;
  auto c = Client::Connect({socket, kHostileModel, kGoodBlocks, "good-back"}, &st);
  if (!c) return "connect: " + st.message;
  const int fd = SealedPool(kGoodBlocks, "good-back");
  uint32_t pool = 0;
  if (fd < 0) return "memfd";
  if (!(st = c->RegisterMemfdPool(fd, kGoodBlocks * kHostileStride, kHostileStride, kGoodBlocks,
                                  &pool))
           .ok()) {
    return "register: " + st.message;
  }
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < kGoodBlocks; ++i) entries.push_back({GoodKey(i), i});
  std::vector<wire::AdmitResult> admitted;
  if (!(st = c->Admit(pool, entries, &admitted)).ok()) return "admit: " + st.message;
  if (admitted.size() != kGoodBlocks) return "admitted " + std::to_string(admitted.size());
  uint32_t lost = 0, first_lost = kGoodBlocks;
  for (uint32_t i = 0; i < kGoodBlocks; ++i) {
    if (admitted[i].restored != 1) {
      ++lost;
      first_lost = std::min(first_lost, i);
    }
  }
  if (lost) {
    return std::to_string(lost) + " of the good user's " + std::to_string(kGoodBlocks) +
           " ghosts were lost (the first: block " + std::to_string(first_lost) + ")";
  }
  return "";
}

// As `kEvil`: admits and releases `rounds` x 512 fresh keys through one pool,
// ten times its share of ghosts. Every request must still be answered.
std::string EvilFloodsGhosts(const std::string& socket, uint32_t rounds) {
  constexpr uint32_t kBatch = 512;
  Status st;
  auto c = Client::Connect({socket, kHostileModel, kBatch, "evil-ghosts"}, &st);
  if (!c) return "connect: " + st.message;
  const int fd = SealedPool(kBatch, "evil-ghosts");
  uint32_t pool = 0;
  if (fd < 0) return "memfd";
  if (!(st = c->RegisterMemfdPool(fd, kBatch * kHostileStride, kHostileStride, kBatch, &pool))
           .ok()) {
    return "register: " + st.message;
  }
  uint64_t next = 0;
  for (uint32_t r = 0; r < rounds; ++r) {
    std::vector<wire::AdmitEntry> entries;
    std::vector<BlockKey> keys;
    for (uint32_t i = 0; i < kBatch; ++i) {
      keys.push_back(EvilKey(next++));
      entries.push_back({keys.back(), i});
    }
    std::vector<wire::AdmitResult> admitted;
    if (!(st = c->Admit(pool, entries, &admitted)).ok()) return "admit: " + st.message;
    wire::ReleaseOk rel;
    if (!(st = c->Release(keys, &rel)).ok()) return "release: " + st.message;
    if (rel.released != kBatch) return "released " + std::to_string(rel.released);
  }
  return "";
}

// The daemon's ghost count, as root (status).
int64_t DaemonGhosts(const std::string& socket) {
  std::string json;
  if (!Client::DaemonStats(socket, "status", &json).ok()) return -1;
  const auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.contains("ghosts")) return -1;
  return j["ghosts"].get<int64_t>();
}

// 20 x 512 = 10240 released blocks, ten times the attacker's share and 2.5
// times the whole store: before ghosts had owners, this emptied the store of
// everyone else's states (one global FIFO).
TEST(HostileGhosts, OneUidReleasingTenTimesItsShareKeepsEveryOtherUidsGhosts) {
  NEED_ROOT();
  HostileDaemon d(kSmallGhostStore);
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string socket = d.socket();
  GoodClient good;
  ASSERT_TRUE(good.Start(socket)) << d.Log();

  ASSERT_EQ(RunAs(kGood, [&] { return GoodLeavesGhosts(socket); }), "") << d.Log();
  EXPECT_EQ(DaemonGhosts(socket), kGoodBlocks);
  ASSERT_EQ(RunAs(kEvil, [&] { return EvilFloodsGhosts(socket, 20); }), "") << d.Log();
  // The attacker keeps its share (its newest ghosts), no more.
  EXPECT_EQ(DaemonGhosts(socket), kGoodBlocks + kGhostsPerUid);
  EXPECT_EQ(RunAs(kGood, [&] { return GoodGetsItsGhostsBack(socket); }), "");
  ExpectHealthy(d, good, 256ull << 20, 64);
}

// The shares survive a restart: the checkpoint keeps each ghost's uid. (Had
// it lost them, all 1280 ghosts would come back as one owner's and the 256
// oldest, the good user's, would go to that owner's cap of 1024.)
TEST(HostileGhosts, SharesSurviveARestartFromTheCheckpoint) {
  NEED_ROOT();
  HostileDaemon d(kSmallGhostStore);
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string socket = d.socket();
  ASSERT_EQ(RunAs(kGood, [&] { return GoodLeavesGhosts(socket); }), "") << d.Log();
  ASSERT_EQ(RunAs(kEvil, [&] { return EvilFloodsGhosts(socket, 20); }), "") << d.Log();
  EXPECT_EQ(d.Stop(SIGTERM), 0) << d.Log();  // the final checkpoint is written at stop
  d.Start();
  ASSERT_TRUE(d.Alive()) << d.Log();
  EXPECT_EQ(DaemonGhosts(socket), kGoodBlocks + kGhostsPerUid) << d.Log();
  GoodClient good;
  ASSERT_TRUE(good.Start(socket)) << d.Log();
  // The attacker comes back for more: still only its own share moves.
  ASSERT_EQ(RunAs(kEvil, [&] { return EvilFloodsGhosts(socket, 4); }), "") << d.Log();
  EXPECT_EQ(RunAs(kGood, [&] { return GoodGetsItsGhostsBack(socket); }), "");
  ExpectHealthy(d, good, 256ull << 20, 64);
}

// The engine's keys were the client's key XORed with a public function of
// the uid, so any uid could compute the key that reached another uid's:
// learn whether it held a block (its own admit was refused "admitted by
// another client of this user"), squat a key before it, and take its ghost,
// score and all. Root holds K0 and left a ghost of K1; the attacker forges
// the keys that reached K0, K1 and K2 under the old derivation, and holds
// them. Its admits are its own new blocks; root then admits K2 and gets
// its ghost of K1 back.
TEST(HostileKeys, AForgedKeyNeverReachesAnotherUid) {
  NEED_ROOT();
  HostileDaemon d(kSmallGhostStore);
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string socket = d.socket();
  Status st;
  auto root = Client::Connect({socket, kHostileModel, 8, "root-keys"}, &st);
  ASSERT_TRUE(root) << st.message;
  const int fd = SealedPool(8, "root-keys");
  uint32_t pool = 0;
  ASSERT_TRUE(root->RegisterMemfdPool(fd, 8 * kHostileStride, kHostileStride, 8, &pool).ok());
  const BlockKey k0 = GoodKey(0), k1 = GoodKey(1), k2 = GoodKey(2);
  std::vector<wire::AdmitResult> r;
  ASSERT_TRUE(root->Admit(pool, std::vector<wire::AdmitEntry>{{k0, 0}, {k1, 1}}, &r).ok());
  ASSERT_TRUE(root->Report(std::vector<wire::Observation>{{r[1].slot, 4.0f}}).ok());
  wire::ReleaseOk rel;
  ASSERT_TRUE(root->Release(std::vector<BlockKey>{k1}, &rel).ok());
  ASSERT_EQ(rel.released, 1u);

  // What reached uid 0's key k from uid `evil` before.
  const uid_t evil = UidOf(kEvil);
  const auto forged = [evil](const BlockKey& k) {
    const auto mask = [](uint64_t u) { return 0x9e3779b97f4a7c15ULL * (u + 1); };
    return BlockKey{k.hi ^ mask(0) ^ mask(evil), k.lo};
  };
  HeldAttacker attacker([&]() -> char {
    Status s;
    auto c = Client::Connect({socket, kHostileModel, 8, "forger"}, &s);
    const int pfd = SealedPool(8, "forger");
    uint32_t p = 0;
    if (!c || pfd < 0 || !c->RegisterMemfdPool(pfd, 8 * kHostileStride, kHostileStride, 8, &p).ok())
      return 'c';
    std::vector<wire::AdmitResult> a;
    // Root's live K0: refused before ("admitted by another client").
    if (!c->Admit(p, std::vector<wire::AdmitEntry>{{forged(k0), 0}}, &a).ok()) return '0';
    // Root's ghost of K1: restored before.
    if (!c->Admit(p, std::vector<wire::AdmitEntry>{{forged(k1), 1}}, &a).ok()) return '1';
    if (a.size() != 1 || a[0].restored) return 'g';
    // Not root's yet: squatted before.
    if (!c->Admit(p, std::vector<wire::AdmitEntry>{{forged(k2), 2}}, &a).ok()) return '2';
    return 'y';
  });
  EXPECT_EQ(attacker.report(), 'y')
      << "'0': learnt that root holds K0; 'g': took root's ghost; '1', '2', 'c': refused";
  // While the attacker holds its blocks, root's K2 is root's own, and its
  // ghost of K1 comes back.
  ASSERT_TRUE(root->Admit(pool, std::vector<wire::AdmitEntry>{{k2, 2}}, &r).ok())
      << "root's key was squatted";
  ASSERT_TRUE(root->Admit(pool, std::vector<wire::AdmitEntry>{{k1, 1}}, &r).ok());
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].restored, 1) << "root's ghost was taken";
  attacker.Release();
  EXPECT_TRUE(d.Alive()) << d.Log();
}

}  // namespace
}  // namespace cxltier::testing
