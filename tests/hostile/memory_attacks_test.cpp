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
constexpr uint64_t kPerUidBound = 640 * kMiB;
constexpr uint64_t kRegrowth = 64 * kMiB;

// The default limits where memory is measured. Under a sanitizer, where
// memory is not measured and a million blocks take minutes (252 s of the
// ASan stage), the hog takes an eighth: the same paths (every admit and
// release at the protocol's largest, tables grown past their first sizes),
// checked for memory errors and for another uid's round trips.
constexpr uint32_t kBlocks =
    kMemoryIsMeasurable ? 1u << 20 : 1u << 17;  // 1M: max_blocks_per_uid's default
constexpr uint32_t kSlots = kBlocks;

BlockKey HogKey(uint64_t i) { return BlockKey::FromSequence(669, i); }

struct HogShared {
  std::atomic<int> step{0};          // 1: admitting, 2: all admitted and observed, 3: released
  std::atomic<bool> release{false};  // set by the test: step 2 lasts until then
  std::atomic<uint64_t> admitted{0};
  std::atomic<bool> failed{false};  // it returned an error: the test waits no more
  char error[256] = {};
};

// The attacker (as kEvil): one client of kSlots slots, a range pool of
// kBlocks blocks (address space never touched), every block admitted in the
// largest admits the protocol takes and observed, then released; then it leaves.
std::string Hog(const std::string& socket, HogShared* sh) {
  Status st;
  // The daemon frees the last run's segment once it has released that
  // client's slots, after its disconnect: until then the uid's segment
  // bytes are at their limit (kLimit). Wait for that, with a generous bound.
  std::unique_ptr<Client> c;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!(c = Client::Connect({socket, kHostileModel, kSlots, "hog"}, &st)) &&
         st.code == wire::ErrorCode::kLimit && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
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
  while (!sh->release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
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

// What one run of the hog cost: the daemon's anonymous memory at its peak
// and once the hog's blocks are gone, and the hog's own error ("": none).
struct HogRun {
  uint64_t peak = 0;
  uint64_t after = 0;
  std::string error;
  bool left = false;
  bool released = false;
};

// Runs the hog as kEvil against the daemon while the prober samples: its
// round trips while the hog admits are filed as phase 1, while it holds
// everything (ticks folding and planning all its blocks, no request of
// its own) as phase ProbeShared::kHolding, at least 300 of them.
HogRun RunHog(HostileDaemon& d, ProbeShared* probe, HogShared* hog) {
  new (hog) HogShared();
  HogRun run;
  run.peak = Usage(d.pid()).anon_bytes;
  std::atomic<bool> sampling{true};
  ChildAs attacker(kEvil, [&] {
    std::string error = Hog(d.socket(), hog);
    if (!error.empty()) hog->failed = true;
    return error;
  });
  std::thread sampler([&] {
    while (sampling) {
      run.peak = std::max(run.peak, Usage(d.pid()).anon_bytes);
      const int step = hog->step.load();
      probe->phase = step == 1 ? 1 : step == 2 ? ProbeShared::kHolding : 3;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const int held_until = probe->count[2].load() + 300;
  // A prober that fails takes no more samples: end the wait (the test then
  // fails on its failures) instead of running into ctest's timeout.
  WaitFor(
      [&] {
        return (hog->step.load() == 2 && probe->count[2].load() >= held_until) ||
               probe->failures.load() > 0 || hog->failed.load();
      },
      std::chrono::seconds(600));
  hog->release = true;
  run.left = WaitFor([&] { return hog->step.load() == 3 || hog->failed.load(); },
                     std::chrono::seconds(600)) &&
             hog->step.load() == 3;
  run.error = attacker.Wait();
  // Its blocks released: only the prober's 8 remain. And it has left: the
  // pages its blocks left in tier 0 are no longer counted (an entry each
  // while they are: 64 MiB for a million, until it leaves or they move),
  // and the daemon is done with it (its million slots released a chunk at a
  // time, then its tables freed: measured before that, "after" was up to
  // 91 MiB higher, its tables).
  run.released = WaitFor([&] {
    std::string json;
    if (!Client::DaemonStats(d.socket(), "status", &json).ok()) return false;
    const nlohmann::json j = nlohmann::json::parse(json, nullptr, false);
    return j.value("blocks", uint64_t{0}) == 8 &&
           j["migrations"]["released_pages"].value("held_blocks", uint64_t{1}) == 0 &&
           j.value("leaving_clients", uint64_t{1}) == 0;
  });
  sampling = false;
  sampler.join();
  run.after = Usage(d.pid()).anon_bytes;
  return run;
}

// Issue 30, item 9: a uid at its limits costs the daemon at most
// kPerUidBound; what it leaves is the engine's tables at their high-water
// mark, which the next uid reuses (a second run adds at most kRegrowth);
// and its admits of a million blocks (an eighth under a sanitizer), 1,024
// blocks each, let another uid's round trips pass: their p99 while it
// admits within 3x their p99 while it only holds its blocks (the ticks over
// all of them), or 10x quiet. With
// 16,384-block admits the p99 was 4 to 5x the holding p99 (141 and 172 ms
// against 31 and 36); with 1,024, 1.7x (21 and 22 ms against 12 and 13).
// Since the full fold reads only totals (2026-12-06) holding costs less
// (2.1 to 2.5 ms) and admitting 5.9 to 6.9 ms, so the bound is also at
// least 20 ms.
TEST(HostileMemory, OneUidAtItsLimitsStaysWithinTheStatedBoundAndLeavesLittle) {
  NEED_ROOT();
  HostileDaemon d("[engine]\nblock_bytes = 4096\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  void* mem = mmap(nullptr, sizeof(ProbeShared) + sizeof(HogShared), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  ProbeShared* probe = new (mem) ProbeShared();
  HogShared* hog = new (static_cast<char*>(mem) + sizeof(ProbeShared)) HogShared();
  const pid_t prober = ForkAlone();
  if (prober == 0) _exit(Prober(d.socket(), probe));
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
  ASSERT_EQ(probe->failures.load(), 0) << "the prober failed before the hog began";
  const uint64_t before = Usage(d.pid()).anon_bytes;
  probe->phase = 3;

  const HogRun first = RunHog(d, probe, hog);
  ASSERT_TRUE(first.left) << "the attacker never finished (" << hog->admitted.load()
                          << " admitted): " << first.error;
  EXPECT_EQ(first.error, "");
  EXPECT_TRUE(first.released);
  // The same uid again: the tables it left are reused, not grown. Only
  // where memory is measured (not under a sanitizer, where one run takes
  // minutes).
  HogRun second = first;
  if (kMemoryIsMeasurable) {
    second = RunHog(d, probe, hog);
    EXPECT_EQ(second.error, "");
    EXPECT_TRUE(second.released);
  }
  // Round trips of both runs.
  const int64_t quiet = probe->P99(0), busy = probe->P99(1), holding = probe->P99(2);
  const int busy_trips = probe->count[1].load();
  auto mib = [](double b) { return b / 1048576.0; };
  std::printf(
      "one uid at its limits: the daemon's anonymous memory %.0f MiB before, peak %.0f MiB "
      "(+%.0f), %.0f MiB after it left (+%.0f); the same again: peak %.0f MiB, %.0f MiB after; "
      "another uid's p99 %lld us quiet, %lld us while the uid admitted (%d round trips), %lld "
      "us while it held %u blocks\n",
      mib(before), mib(first.peak), mib(first.peak - before), mib(first.after),
      mib(static_cast<double>(first.after) - before), mib(second.peak), mib(second.after),
      static_cast<long long>(quiet), static_cast<long long>(busy), busy_trips,
      static_cast<long long>(holding), kBlocks);
  std::printf("p50/p90: quiet %lld/%lld, admitting %lld/%lld, holding %lld/%lld us\n",
              static_cast<long long>(probe->Percentile(0, 50)),
              static_cast<long long>(probe->Percentile(0, 90)),
              static_cast<long long>(probe->Percentile(1, 50)),
              static_cast<long long>(probe->Percentile(1, 90)),
              static_cast<long long>(probe->Percentile(2, 50)),
              static_cast<long long>(probe->Percentile(2, 90)));
  EXPECT_EQ(probe->failures.load(), 0);
  EXPECT_GE(busy_trips, 100);
  // 20 ms: about 3x what 1,024-entry admits cost here once the full fold
  // became cheap (5.9 to 6.9 ms, with holding at 2.1 to 2.5 ms: 3 x holding
  // alone left no margin), and several times below what a larger limit costs
  // (16,384-entry admits: 53.7 ms now, 141 and 172 ms before, see above).
  // ASan makes the daemon's work about 4x slower (quiet p99 0.47 against
  // 0.07 to 0.13 ms; admitting 21.5 ms with an eighth of the blocks): 80 ms.
  constexpr int64_t kAdmittingUs = kMemoryIsMeasurable ? 20000 : 80000;
  EXPECT_LE(busy, std::max({10 * quiet, 3 * holding, kAdmittingUs}))
      << "another uid's p99 while one uid admitted " << kBlocks << " blocks";
  if (kMemoryIsMeasurable) {
    EXPECT_LE(first.peak - before, kPerUidBound) << "the daemon's memory for one uid at its limits";
    EXPECT_LE(first.after - std::min(first.after, before), kPerUidBound)
        << "what the uid left behind";
    EXPECT_LE(second.peak - std::min(second.peak, first.peak), kRegrowth)
        << "the second run's peak over the first's: the tables were not reused";
    EXPECT_LE(second.after - std::min(second.after, first.after), kRegrowth)
        << "what the second run left beyond the first";
  }
}

}  // namespace
}  // namespace cxltier::testing
