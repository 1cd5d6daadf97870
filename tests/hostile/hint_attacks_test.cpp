// Attacks with scheduler hints (docs/security.md, "Hints"): another uid's
// idle, soon and done hints, for its own groups and naming others' keys,
// never move or demote a victim's blocks; a good client of a third uid is
// served throughout.
#include <gtest/gtest.h>
#include <poll.h>

#include <nlohmann/json.hpp>

#include "hostile/hostile_harness.h"

namespace cxltier::testing {
namespace {

#define NEED_ROOT()                                                \
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root"; \
  ASSERT_TRUE(EnsureHostileUsers())

// Tier 0 holds 16 blocks of 4 KiB; LRU, whose set is easy to follow.
const std::string kConfig =
    "[engine]\nblock_bytes = 4096\ntier0_budget = \"64KiB\"\npolicy = \"lru\"\n"
    "hysteresis_ticks = 0\n";

BlockKey EvilKey(uint64_t i) { return BlockKey::FromSequence(667, i); }
BlockKey VictimKey(uint64_t i) { return BlockKey::FromSequence(668, i); }
// The good client's keys (GoodClient admits these).
BlockKey GoodKey(uint64_t i) { return BlockKey::FromSequence(4242, i); }

// One byte through a pipe (false when the other side is gone).
bool Put(int fd, char c) { return write(fd, &c, 1) == 1; }
bool Get(int fd, char* c) { return read(fd, c, 1) == 1; }

// The attacker fills tier 0 with 16 blocks in two groups and marks them idle;
// the victim (root) and the good client (a third uid) take their room. Then
// the attacker hints soon, idle and done for its groups, over and over, and
// names the victim's and the good client's keys in its hints. The victim's
// blocks, never touched again, stay in tier 0 throughout: a hint can take
// room only from its sender's uid's blocks or from blocks hinted idle or done.
TEST(HostileHints, HintsNeverMoveAnotherUsersBlocks) {
  NEED_ROOT();
  HostileDaemon d(kConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string socket = d.socket();
  constexpr int kRounds = 60;
  int ready[2], go[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(done), 0);
  ChildAs evil(kEvil, [&]() -> std::string {
    Status st;
    auto c = Client::Connect({socket, kHostileModel, 64, "evil"}, &st);
    if (!c) return "connect: " + st.message;
    const int fd = SealedPool(16, "evil-pool");
    uint32_t pool = 0;
    if (fd < 0 ||
        !(st = c->RegisterMemfdPool(fd, 16 * kHostileStride, kHostileStride, 16, &pool)).ok()) {
      return "pool: " + st.message;
    }
    std::vector<wire::AdmitEntry> entries;
    std::vector<BlockKey> keys;
    for (uint32_t i = 0; i < 16; ++i) {
      keys.push_back(EvilKey(i));
      entries.push_back({keys.back(), i});
    }
    std::vector<wire::AdmitResult> res;
    if (!(st = c->Admit(pool, entries, &res)).ok()) return "admit: " + st.message;
    for (const auto& r : res) c->Observe(r.slot, 1.0f);
    auto in_tier = [&](Tier t) {
      int n = 0;
      for (const auto& r : res) n += c->TierOf(r.slot) == t;
      return n;
    };
    if (!WaitFor([&] { return in_tier(Tier::kFast) == 16; })) return "never filled tier 0";
    const std::vector<BlockKey> g1(keys.begin(), keys.begin() + 8),
        g2(keys.begin() + 8, keys.end());
    wire::HintOk ok;
    if (!c->Hint(1, HintKind::kIdle, g1, &ok).ok() || ok.grouped != 8) return "idle 1";
    if (!c->Hint(2, HintKind::kIdle, g2, &ok).ok() || ok.grouped != 8) return "idle 2";
    Put(ready[1], 'k');
    char c_go = 0;
    if (!Get(go[0], &c_go)) return "no go";
    // The victim (4) and the good client (8) took 12 of our 16 places.
    if (!WaitFor([&] { return in_tier(Tier::kSlow) >= 12; })) {
      return "the others never took the idle blocks' room: " +
             std::to_string(in_tier(Tier::kSlow)) + " of ours in tier 1";
    }
    std::vector<BlockKey> foreign;
    for (uint64_t i = 0; i < 4; ++i) foreign.push_back(VictimKey(i));
    for (uint64_t i = 0; i < 8; ++i) foreign.push_back(GoodKey(i));
    std::string err;
    for (int round = 0; round < kRounds && err.empty(); ++round) {
      const struct {
        uint32_t group;
        HintKind kind;
        bool name_foreign;
      } steps[] = {
          {1, HintKind::kSoon, false}, {2, HintKind::kSoon, true},  {1, HintKind::kDone, false},
          {2, HintKind::kSoon, false}, {3, HintKind::kSoon, true},  {2, HintKind::kIdle, true},
          {1, HintKind::kSoon, false}, {2, HintKind::kDone, false},
      };
      for (const auto& s : steps) {
        if (!(st =
                  c->Hint(s.group, s.kind, s.name_foreign ? foreign : std::vector<BlockKey>{}, &ok))
                 .ok()) {
          err = "hint: " + st.message;
          break;
        }
        if (s.name_foreign && (ok.unknown != foreign.size() || ok.grouped != 0)) {
          err = "another uid's keys: " + std::to_string(ok.grouped) + " grouped, " +
                std::to_string(ok.unknown) + " unknown";
          break;
        }
      }
      // Let the planner run on what the hints did before the next round.
      const uint64_t t = c->daemon_ticks();
      if (!WaitFor([&] { return c->daemon_ticks() >= t + 2; })) err = "the daemon stopped ticking";
    }
    Put(done[1], 'd');
    return err;
  });
  close(ready[1]);
  close(go[0]);
  close(done[1]);
  char c = 0;
  ASSERT_TRUE(Get(ready[0], &c)) << evil.Wait() << d.Log();

  // The victim: 4 blocks, touched once, in tier 0 in place of idle blocks.
  Status st;
  auto victim = Client::Connect({socket, kHostileModel, 16, "victim"}, &st);
  ASSERT_TRUE(victim) << st.message;
  const int fd = SealedPool(4, "victim-pool");
  ASSERT_GE(fd, 0);
  auto* bytes = static_cast<uint8_t*>(
      mmap(nullptr, 4 * kHostileStride, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(bytes, MAP_FAILED);
  for (uint64_t i = 0; i < 4 * kHostileStride; ++i) bytes[i] = static_cast<uint8_t>(i * 5 + 3);
  uint32_t pool = 0;
  ASSERT_TRUE(victim->RegisterMemfdPool(fd, 4 * kHostileStride, kHostileStride, 4, &pool).ok());
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t i = 0; i < 4; ++i) entries.push_back({VictimKey(i), i});
  std::vector<wire::AdmitResult> res;
  ASSERT_TRUE(victim->Admit(pool, entries, &res).ok());
  for (const auto& r : res) victim->Observe(r.slot, 1.0f);
  auto victim_fast = [&] {
    int n = 0;
    for (const auto& r : res) n += victim->TierOf(r.slot) == Tier::kFast;
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return victim_fast() == 4; })) << d.Log();
  GoodClient good;
  ASSERT_TRUE(good.Start(socket)) << d.Log();

  // The attack: the victim's blocks must be in tier 0 at every look.
  ASSERT_TRUE(Put(go[1], 'g'));
  int looks = 0, demoted = 0;
  for (;;) {
    pollfd p{done[0], POLLIN, 0};
    const bool finished = poll(&p, 1, 0) > 0;
    ++looks;
    demoted += victim_fast() != 4;
    if (finished) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(evil.Wait(), "") << d.Log();
  EXPECT_EQ(demoted, 0) << "of " << looks << " looks";
  // The engine agrees, and the victim's bytes never changed.
  std::vector<Tier> tiers;
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < 4; ++i) keys.push_back(VictimKey(i));
  ASSERT_TRUE(victim->QueryTiers(keys, &tiers).ok());
  for (Tier t : tiers) EXPECT_EQ(t, Tier::kFast);
  for (uint64_t i = 0; i < 4 * kHostileStride; ++i) {
    ASSERT_EQ(bytes[i], static_cast<uint8_t>(i * 5 + 3)) << "byte " << i;
  }
  std::string json;
  ASSERT_TRUE(Client::DaemonStats(socket, "status", &json).ok());
  const nlohmann::json s = nlohmann::json::parse(json);
  EXPECT_GE(s["hints"]["requests"].get<uint64_t>(), 2u + 8u * kRounds) << s["hints"].dump();
  EXPECT_GE(s["hints"]["unknown_keys"].get<uint64_t>(), 3u * 12u * kRounds);
  // The attack did move blocks: its own, in and out of its 4 places.
  EXPECT_GT(s["hints"]["prefetched"].get<uint64_t>(), 0u) << s["hints"].dump();
  EXPECT_GT(s["hints"]["displaced"].get<uint64_t>(), 12u) << s["hints"].dump();
  ExpectHealthy(d, good, 256ull << 20, 64);
  munmap(bytes, 4 * kHostileStride);
  close(fd);
  close(ready[0]);
  close(go[1]);
  close(done[0]);
}

}  // namespace
}  // namespace cxltier::testing
