// Attacks on a recording (docs/security.md, "Recording"; issue 30, item 7):
// another uid's flood of touches neither ends an admin's recording nor
// pushes out the events of a uid that comes after it. Each uid holds at most
// its share of the recording's budget; past it, its own events are dropped
// and counted to it.
#include <gtest/gtest.h>
#include <poll.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "hostile/hostile_harness.h"

namespace cxltier::testing {
namespace {

#define NEED_ROOT()                                                \
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root"; \
  ASSERT_TRUE(EnsureHostileUsers())

bool Put(int fd, char c) { return write(fd, &c, 1) == 1; }
bool Get(int fd, char* c) { return read(fd, c, 1) == 1; }
bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

// Root records (the budget: kMaxEvents events) while another uid touches 256
// blocks every tick, from before root's client comes: the flood alone
// passes the whole budget within about 12 ticks. Then root's client admits
// 8 blocks, touches each once in each of 10 rounds (one fold each) and
// releases them: 96 events. The recording must still run when root stops
// it, not truncated, hold every one of root's 96 events, and hold at most
// the flood's share (the first uid: half the budget), the rest of the
// flood counted as dropped to its uid.
TEST(HostileRecord, AnotherUidsFloodNeitherEndsAnAdminsRecordingNorPushesOutItsEvents) {
  NEED_ROOT();
  HostileDaemon d;
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string socket = d.socket();
  constexpr uint64_t kMaxEvents = 3000;
  constexpr uint32_t kFloodBlocks = 256, kFloodRounds = 24;
  constexpr uint32_t kBlocks = 8, kRounds = 10;
  int ready[2], go[2], flooded[2], stop[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(go), 0);
  ASSERT_EQ(pipe(flooded), 0);
  ASSERT_EQ(pipe(stop), 0);
  ChildAs evil(kEvil, [&]() -> std::string {
    Status st;
    auto c = Client::Connect({socket, kHostileModel, kFloodBlocks, "flood"}, &st);
    if (!c) return "connect: " + st.message;
    const int fd = SealedPool(kFloodBlocks, "flood-pool");
    uint32_t pool = 0;
    if (fd < 0 || !(st = c->RegisterMemfdPool(fd, kFloodBlocks * kHostileStride, kHostileStride,
                                              kFloodBlocks, &pool))
                       .ok()) {
      return "pool: " + st.message;
    }
    std::vector<wire::AdmitEntry> entries;
    for (uint32_t i = 0; i < kFloodBlocks; ++i) {
      entries.push_back({BlockKey::FromSequence(777, i), i});
    }
    std::vector<wire::AdmitResult> res;
    if (!(st = c->Admit(pool, entries, &res)).ok()) return "admit: " + st.message;
    Put(ready[1], 'r');
    char x = 0;
    if (!Get(go[0], &x)) return "no go";
    // Every block touched in every tick until told to stop; the parent
    // hears when kFloodRounds ticks had the flood.
    std::string err;
    for (uint32_t round = 0; !Readable(stop[0]); ++round) {
      for (const auto& r : res) c->Observe(r.slot, 1.0f);
      const uint64_t t = c->daemon_ticks();
      if (!WaitFor([&] { return c->daemon_ticks() > t; })) {
        err = "the daemon stopped ticking";
        break;
      }
      if (round + 1 == kFloodRounds) Put(flooded[1], 'f');
    }
    Put(flooded[1], 'e');  // in case it never got that far
    return err;
  });
  close(ready[1]);
  close(go[0]);
  close(flooded[1]);
  close(stop[0]);
  char c = 0;
  ASSERT_TRUE(Get(ready[0], &c)) << evil.Wait() << d.Log();

  Status st;
  auto root = Client::Connect({socket, kHostileModel, kBlocks, "admin"}, &st);
  ASSERT_TRUE(root) << st.message;
  std::string text;
  ASSERT_TRUE(Client::DaemonAdmin(socket, wire::AdminOp::kRecordStart,
                                  "3600:" + std::to_string(kMaxEvents), &text)
                  .ok())
      << text;
  ASSERT_TRUE(Put(go[1], 'g'));
  ASSERT_TRUE(Get(flooded[0], &c));
  ASSERT_EQ(c, 'f') << evil.Wait();

  // Root's client, after the flood passed the whole budget.
  const int fd = SealedPool(kBlocks, "admin-pool");
  ASSERT_GE(fd, 0);
  uint32_t pool = 0;
  ASSERT_TRUE(
      root->RegisterMemfdPool(fd, kBlocks * kHostileStride, kHostileStride, kBlocks, &pool).ok());
  std::vector<wire::AdmitEntry> entries;
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < kBlocks; ++i) {
    keys.push_back(BlockKey::FromSequence(778, i));
    entries.push_back({keys.back(), i});
  }
  std::vector<wire::AdmitResult> res;
  ASSERT_TRUE(root->Admit(pool, entries, &res).ok());
  for (uint32_t round = 0; round < kRounds; ++round) {
    for (const auto& r : res) root->Observe(r.slot, 1.0f);
    WaitTicks(*root, 2);  // folded: one touch per block per round
  }
  ASSERT_TRUE(root->Release(keys).ok());
  const uint64_t last_tick = root->daemon_ticks();
  ASSERT_FALSE(Readable(flooded[0])) << "the flood stopped early: " << evil.Wait();

  int trace_fd = -1;
  ASSERT_TRUE(Client::DaemonAdmin(socket, wire::AdminOp::kRecordStop, "", &text, &trace_fd).ok())
      << text;
  ASSERT_TRUE(Put(stop[1], 's'));
  EXPECT_EQ(evil.Wait(), "") << d.Log();
  const nlohmann::json s = nlohmann::json::parse(text);
  const std::string evil_uid = std::to_string(UidOf(kEvil));
  // Ran until root stopped it: the flood did not end it.
  EXPECT_FALSE(s["truncated"].get<bool>()) << s.dump(2);
  EXPECT_GE(s["end_tick"].get<uint64_t>(), last_tick) << s.dump(2);
  // Every one of root's events, none lost.
  ASSERT_TRUE(s["uids"].contains("0")) << s.dump(2);
  EXPECT_EQ(s["uids"]["0"].get<uint64_t>(), kBlocks + kRounds * kBlocks + kBlocks) << s.dump(2);
  EXPECT_FALSE(s["dropped"].contains("0")) << s.dump(2);
  // The flood: its share (the first uid's: half the budget), the rest
  // dropped and counted to it.
  ASSERT_TRUE(s["uids"].contains(evil_uid)) << s.dump(2);
  EXPECT_EQ(s["uids"][evil_uid].get<uint64_t>(), kMaxEvents / 2) << s.dump(2);
  ASSERT_TRUE(s["dropped"].contains(evil_uid)) << s.dump(2);
  // (Each of its kFloodRounds rounds was folded, two rounds at worst in one tick.)
  EXPECT_GE(s["dropped"][evil_uid].get<uint64_t>(),
            kFloodRounds / 2 * kFloodBlocks - kMaxEvents / 2)
      << s.dump(2);
  EXPECT_EQ(s["dropped_events"].get<uint64_t>(), s["dropped"][evil_uid].get<uint64_t>());
  // Events were lost: no exact replay, and no moves in the trace.
  EXPECT_FALSE(s["exact"].get<bool>()) << s.dump(2);
  EXPECT_FALSE(s["recorded_moves"].get<bool>()) << s.dump(2);
  EXPECT_EQ(s["plans"].get<uint64_t>(), 0u) << s.dump(2);
  EXPECT_EQ(s["events"].get<uint64_t>(), kMaxEvents / 2 + s["uids"]["0"].get<uint64_t>());
  // The trace itself: a version 1 file (no moves, no groups) of that many events.
  ASSERT_GE(trace_fd, 0);
  uint8_t header[32] = {};
  ASSERT_EQ(pread(trace_fd, header, sizeof(header), 0), static_cast<ssize_t>(sizeof(header)));
  uint32_t version = 0;
  uint64_t events = 0;
  std::memcpy(&version, header + 8, 4);
  std::memcpy(&events, header + 24, 8);
  EXPECT_EQ(version, 1u);
  EXPECT_EQ(events, s["events"].get<uint64_t>());
  close(trace_fd);
  EXPECT_TRUE(d.Alive()) << d.Log();
  close(fd);
  close(ready[0]);
  close(go[1]);
  close(flooded[0]);
  close(stop[1]);
}

}  // namespace
}  // namespace cxltier::testing
