// Figure 7 of docs/performance.md: copy mode. A block moved as the mover does
// it (BeginMove; memcpy and memcmp with the source, a cache-sized chunk at a
// time; PublishMove) against memcpy alone between the same two pools; the
// verification the mover does not use (XXH3 of both sides) for reference; and
// a read lease (AcquireRead + ReleaseRead) against one atomic increment.
// The copies are timed by the wall clock (UseRealTime), the clock of their
// p50/p99 counters too, so a rate and its latencies agree and a copy and its
// baseline are compared on one clock, in one run (process CPU time also
// counted another process's share of a loaded machine differently).
#include <benchmark/benchmark.h>
#include <xxhash.h>
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>  // XXH3 with AVX2 or AVX-512 where the CPU has them
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "cxltier/lease.h"
#include "cxltier/model.h"
#include "numa/tier_memory.h"
#include "numa/topology.h"
#include "service/mover.h"

namespace cxltier::bench {
namespace {

// Llama-3 70B blocks (5 MiB), 32 per pool: 160 MiB each, far beyond the caches.
const uint64_t kBlock = kLlama3_70B.block_bytes();
constexpr uint32_t kBlocks = 32;

// Two tier pools as the daemon makes them: tier 0 on the first node with
// CPUs, tier 1 on the first memory-only node (the same node on a one-node host).
struct Pools {
  numa::TierMemory fast, slow;
  std::string error;
  Pools() {
    const numa::Topology topo = numa::Discover();
    const Result<numa::TierAssignment> tiers = numa::AssignTiers(topo, {}, {});
    if (!tiers.ok()) {
      error = tiers.status().message;
      return;
    }
    const int f = tiers->fast_nodes.empty() ? 0 : tiers->fast_nodes.front();
    const int s = tiers->slow_nodes.empty() ? f : tiers->slow_nodes.front();
    Result<numa::TierMemory> a = numa::CreateTierMemory({f}, kBlock * kBlocks, "bench-fast");
    if (!a.ok()) {
      error = a.status().message;
      return;
    }
    fast = std::move(*a);
    Result<numa::TierMemory> b = numa::CreateTierMemory({s}, kBlock * kBlocks, "bench-slow");
    if (!b.ok()) {
      error = b.status().message;
      return;
    }
    slow = std::move(*b);
    for (uint64_t i = 0; i < kBlock * kBlocks; ++i) fast.mapping->bytes()[i] = uint8_t(i * 7);
    error.clear();
  }
};
Pools& TheP() {
  static Pools p;
  return p;
}

void Percentiles(benchmark::State& state, std::vector<double>& us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  state.counters["p50_us"] = us[us.size() / 2];
  state.counters["p99_us"] = us[std::min(us.size() - 1, us.size() * 99 / 100)];
}

void BM_CopyMemcpyBaseline(benchmark::State& state) {
  Pools& p = TheP();
  if (!p.error.empty()) return state.SkipWithError(p.error.c_str());
  uint32_t i = 0;
  std::vector<double> us;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(p.slow.mapping->bytes() + i * kBlock, p.fast.mapping->bytes() + i * kBlock, kBlock);
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    i = (i + 1) % kBlocks;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBlock));
  Percentiles(state, us);
}
BENCHMARK(BM_CopyMemcpyBaseline)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_CopyMove(benchmark::State& state) {
  Pools& p = TheP();
  if (!p.error.empty()) return state.SkipWithError(p.error.c_str());
  uint64_t words[kBlocks] = {};
  for (uint32_t b = 0; b < kBlocks; ++b) words[b] = LocationWord(0, b, 0);
  uint32_t i = 0;
  std::vector<double> us;
  uint64_t failed = 0;
  for (auto _ : state) {
    service::CopyJob j;
    j.src = p.fast.mapping->bytes() + i * kBlock;
    j.dst = p.slow.mapping->bytes() + i * kBlock;
    j.bytes = kBlock;
    j.words = words;
    j.seg = i;
    j.expected = words[i];
    j.next = LocationWord(0, i, DecodeLocation(words[i]).version + 1);  // stays "tier 0" to repeat
    const auto t0 = std::chrono::steady_clock::now();
    failed += !service::RunCopy(j).done();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    i = (i + 1) % kBlocks;
  }
  if (failed) state.SkipWithError("a copy was not done");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBlock));
  Percentiles(state, us);
}
BENCHMARK(BM_CopyMove)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The copy verified by an XXH3-64 of each side instead of a compare, in the
// same 64 KiB chunks: what the mover would cost if it hashed.
void BM_CopyXxhashBothSides(benchmark::State& state) {
  Pools& p = TheP();
  if (!p.error.empty()) return state.SkipWithError(p.error.c_str());
  constexpr uint64_t kChunk = 64 << 10;
  XXH3_state_t* a = XXH3_createState();
  XXH3_state_t* b = XXH3_createState();
  uint32_t i = 0;
  uint64_t differ = 0;
  for (auto _ : state) {
    const uint8_t* src = p.fast.mapping->bytes() + i * kBlock;
    uint8_t* dst = p.slow.mapping->bytes() + i * kBlock;
    XXH3_64bits_reset(a);
    XXH3_64bits_reset(b);
    for (uint64_t off = 0; off < kBlock; off += kChunk) {
      const uint64_t n = std::min(kChunk, kBlock - off);
      std::memcpy(dst + off, src + off, n);
      XXH3_64bits_update(a, src + off, n);
      XXH3_64bits_update(b, dst + off, n);
    }
    differ += XXH3_64bits_digest(a) != XXH3_64bits_digest(b);
    i = (i + 1) % kBlocks;
  }
  XXH3_freeState(a);
  XXH3_freeState(b);
  if (differ) state.SkipWithError("a copy differed");
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBlock));
}
BENCHMARK(BM_CopyXxhashBothSides)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_LeaseAtomicIncrementBaseline(benchmark::State& state) {
  std::atomic<uint64_t> counter{0};
  for (auto _ : state) counter.fetch_add(1);
  benchmark::DoNotOptimize(counter.load());
}
BENCHMARK(BM_LeaseAtomicIncrementBaseline);

void BM_LeaseAcquireRelease(benchmark::State& state) {
  uint64_t words[8] = {};
  words[3] = LocationWord(1, 42, 7);
  LeaseEntry entry;
  Location where;
  for (auto _ : state) {
    if (!AcquireRead(words, &entry, 3, 0, &where)) state.SkipWithError("no place");
    ReleaseRead(&entry);
  }
  benchmark::DoNotOptimize(where.index);
}
BENCHMARK(BM_LeaseAcquireRelease);

}  // namespace
}  // namespace cxltier::bench
