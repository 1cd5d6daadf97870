// What one uid costs the daemon at its limits (docs/security.md, "Memory per
// uid"): another uid holds as many slots and blocks as the default limits
// let it, observes them all, releases them and leaves. The daemon's own
// memory while it does stays within the bound docs/security.md states, what
// stays after it left within the leftover bound, and a third uid's round
// trips keep their pace meanwhile.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <new>
#include <thread>

#include <nlohmann/json.hpp>

#include "hostile/hostile_harness.h"

namespace cxltier::testing {
namespace {

#define NEED_ROOT()                                                \
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root"; \
  ASSERT_TRUE(EnsureHostileUsers())

// The bounds the fix of issue 30 item 9 is to meet for one uid at the
// default limits (1.1M slots in 80 MiB of segments, 1M blocks, 262,144
// ghosts): the daemon's anonymous memory while the uid holds everything,
// and what stays once it left (its ghosts and the allocator's slack).
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kPerUidBound = 512 * kMiB;
constexpr uint64_t kLeftoverBound = 96 * kMiB;

constexpr uint32_t kSlots = 1u << 20;
constexpr uint32_t kBlocks = 1u << 20;  // max_blocks_per_uid's default

BlockKey HogKey(uint64_t i) { return BlockKey::FromSequence(669, i); }

struct HogShared {
  std::atomic<int> step{0};  // 1: admitting, 2: all admitted and observed, 3: released
  std::atomic<uint64_t> admitted{0};
  char error[256] = {};
};

// The attacker (as kEvil): one client of 1M slots, a range pool of 1M
// blocks (address space never touched), every block admitted in the largest
// admits the protocol takes and observed, then released; then it leaves.
std::string Hog(const std::string& socket, HogShared* sh) {
  Status st;
  auto c = Client::Connect({socket, kHostileModel, kSlots, "hog"}, &st);
  if (!c) return "connect: " + st.message;
  const uint64_t bytes = uint64_t{kBlocks} * kHostileStride;
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return "mmap";
  uint32_t pool = 0;
  if (!(st = c->RegisterRangePool(base, bytes, kHostileStride, kBlocks, &pool)).ok()) {
    return "pool: " + st.message;
  }
  sh->step = 1;
  std::vector<wire::AdmitEntry> entries;
  std::vector<wire::AdmitResult> res;
  for (uint32_t from = 0; from < kBlocks; from += wire::kMaxEntriesPerMessage) {
    entries.clear();
    const uint32_t to = std::min<uint32_t>(kBlocks, from + wire::kMaxEntriesPerMessage);
    for (uint32_t i = from; i < to; ++i) entries.push_back({HogKey(i), i});
    if (!(st = c->Admit(pool, entries, &res)).ok()) {
      return "admit at " + std::to_string(from) + ": " + st.message;
    }
    for (const wire::AdmitResult& r : res) c->Observe(r.slot, 1.0f);
    sh->admitted = to;
  }
  // Every block folded at least once: the daemon's state of them all exists.
  std::string json;
  for (int i = 0; i < 20 && (st = c->Stats("status", &json)).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  sh->step = 2;
  std::vector<BlockKey> keys;
  for (uint32_t from = 0; from < kBlocks; from += wire::kMaxEntriesPerMessage) {
    keys.clear();
    const uint32_t to = std::min<uint32_t>(kBlocks, from + wire::kMaxEntriesPerMessage);
    for (uint32_t i = from; i < to; ++i) keys.push_back(HogKey(i));
    if (!(st = c->Release(keys)).ok()) return "release: " + st.message;
  }
  sh->step = 3;
  c.reset();
  munmap(base, bytes);
  return "";
}

// Issue 30, item 9. Disabled: it fails until the fix lands (docs/security.md
// has the figures it prints today).
TEST(HostileMemory, DISABLED_OneUidAtItsLimitsStaysWithinTheStatedBoundAndLeavesLittle) {
  NEED_ROOT();
  HostileDaemon d("[engine]\nblock_bytes = 4096\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  const std::string socket = d.socket();
  void* mem = mmap(nullptr, sizeof(ProbeShared) + sizeof(HogShared), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  ProbeShared* probe = new (mem) ProbeShared();
  HogShared* hog = new (static_cast<char*>(mem) + sizeof(ProbeShared)) HogShared();
  const pid_t prober = ForkAlone();
  if (prober == 0) _exit(Prober(socket, probe));
  ASSERT_GT(prober, 0);
  struct Ending {
    ProbeShared* probe;
    pid_t prober;
    ~Ending() {
      probe->phase = 2;
      kill(prober, SIGKILL);
      waitpid(prober, nullptr, 0);
    }
  } ending{probe, prober};
  // 300 quiet round trips, and the daemon's memory with the prober in.
  probe->phase = 0;
  ASSERT_TRUE(WaitFor([&] { return probe->count[0].load() >= 300 || probe->failures > 0; }));
  const uint64_t before = Usage(d.pid()).anon_bytes;
  probe->phase = 3;

  std::atomic<uint64_t> peak{before};
  std::atomic<bool> sampling{true};
  ChildAs attacker(kEvil, [&] { return Hog(socket, hog); });
  std::thread sampler([&] {
    while (sampling) {
      peak = std::max(peak.load(), Usage(d.pid()).anon_bytes);
      probe->phase = hog->step.load() == 1 ? 1 : 3;  // sampled while it admits
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::string evil;
  const bool left = WaitFor([&] { return hog->step.load() == 3; }, std::chrono::seconds(600));
  evil = attacker.Wait();
  // Its blocks released: only the prober's 8 remain.
  const bool released = WaitFor([&] {
    std::string json;
    return Client::DaemonStats(socket, "status", &json).ok() &&
           nlohmann::json::parse(json, nullptr, false).value("blocks", uint64_t{0}) == 8;
  });
  sampling = false;
  sampler.join();
  ASSERT_TRUE(left) << "the attacker never finished (" << hog->admitted.load() << " admitted)";
  EXPECT_EQ(evil, "");
  EXPECT_TRUE(released);
  const uint64_t after = Usage(d.pid()).anon_bytes;
  const int64_t quiet = probe->P99(0), busy = probe->P99(1);
  std::printf(
      "one uid at its limits: the daemon's anonymous memory %.0f MiB before, peak %.0f MiB "
      "(+%.0f), "
      "%.0f MiB after it left (+%.0f); another uid's p99 %lld us quiet, %lld us while it admitted "
      "(%d round trips)\n",
      before / 1048576.0, peak / 1048576.0, (peak - before) / 1048576.0, after / 1048576.0,
      (static_cast<double>(after) - before) / 1048576.0, static_cast<long long>(quiet),
      static_cast<long long>(busy), probe->count[1].load());
  EXPECT_EQ(probe->failures.load(), 0);
  EXPECT_GE(probe->count[1].load(), 100);
  EXPECT_LE(busy, 10 * quiet) << "another uid's p99 while one uid admitted a million blocks";
  if (kMemoryIsMeasurable) {
    EXPECT_LE(peak - before, kPerUidBound) << "the daemon's memory for one uid at its limits";
    EXPECT_LE(after - std::min(after, before), kLeftoverBound) << "what the uid left behind";
  }
}

}  // namespace
}  // namespace cxltier::testing
