// Figures 1, 3 and 4 of docs/performance.md: observation ingest through shared
// memory, the daemon's tick (fold + plan) and the seeds' serving scenario.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <malloc.h>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "cxltier/segment.h"
#include "engine/engine.h"
#include "engine/policy.h"
#include "numa/migrator.h"
#include "numa/topology.h"
#include "server/server.h"
#include "service/daemon.h"

namespace cxltier::bench {
namespace {

// Moves nothing: every move is reported done and every page on node 0,
// without a syscall: the benchmarks measure the daemon's own work, not the
// kernel's.
class NullMigrator final : public numa::Migrator {
 public:
  numa::MoveResult Move(const numa::PageRange& r, int) override {
    numa::MoveResult res;
    res.pages = res.verified = r.length / 4096;
    return res;
  }
  std::vector<int> Where(const numa::PageRange& r) override {
    return std::vector<int>(r.length / 4096, 0);
  }
};

// ---- 1. ingest ----

std::vector<uint32_t> RandomSlots(size_t slots, size_t n) {
  std::mt19937 rng(42);
  std::vector<uint32_t> idx(n);
  for (auto& i : idx) i = static_cast<uint32_t>(rng() % slots);
  return idx;
}

// Baseline: a plain store of the observation into a 64-byte record per slot.
void BM_IngestBaseline(benchmark::State& state) {
  const size_t slots = static_cast<size_t>(state.range(0));
  std::vector<BlockState> table(slots);
  const std::vector<uint32_t> idx = RandomSlots(slots, 1 << 16);
  size_t k = 0;
  for (auto _ : state) {
    BlockState& s = table[idx[k++ & 0xffff]];
    s.client_mass_q16 = static_cast<uint32_t>(k);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_IngestBaseline)->Arg(8192)->Arg(1 << 20);

// The client's fast path: AddObservation into the shared segment's slot and
// its dirty bit. range(1) = 1: the bitmap is cleared every 65,536
// observations, as the daemon's tick would, so first observations of a slot
// pay the atomic OR; 0: the bits stay set (a slot observed again in a tick).
void BM_IngestShm(benchmark::State& state) {
  const uint32_t slots = static_cast<uint32_t>(state.range(0));
  const bool clear = state.range(1) != 0;
  std::vector<BlockState> table(slots);
  std::vector<uint64_t> dirty(SegmentDirtyWords(slots));
  const std::vector<uint32_t> idx = RandomSlots(slots, 1 << 16);
  size_t k = 0;
  for (auto _ : state) {
    if (clear && (k & 0xffff) == 0) std::fill(dirty.begin(), dirty.end(), 0);
    AddObservation(table.data(), dirty.data(), idx[k++ & 0xffff], 0.015625f);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_IngestShm)->ArgsProduct({{8192, 1 << 20}, {0, 1}});

// ---- an in-process daemon (no socket; the handler is called directly) ----

// A model with 64 KiB blocks: the pool is a sparse memfd, and admitting a
// million blocks stays quick. The daemon's work per block does not depend on
// the block size; the migration rate is scaled so that a tick moves as many
// blocks as 1 GiB/s moves 5 MiB Llama-3 70B blocks (20 per 100 ms tick).
const ModelGeometry kBenchModel{"bench", 1, 1, 1, 1024, 2, 16};
constexpr uint64_t kBlocksPerTick = 20;

struct InProcessDaemon {
  boost::asio::io_context io;
  std::unique_ptr<service::Daemon> daemon;
  server::Peer peer{1, getpid(), getuid(), getgid()};
  BlockState* slots = nullptr;
  uint64_t* dirty = nullptr;
  void Observe(uint32_t i, float mass) { AddObservation(slots, dirty, i, mass); }
  uint32_t n = 0;
  int memfd = -1;

  // Its own client holds `blocks`; any client may hello with up to
  // `max_blocks_per_client` slots (0: `blocks`).
  InProcessDaemon(uint32_t blocks, const ModelGeometry& model, uint64_t budget_bytes,
                  std::string_view policy = engine::kDefaultPolicy,
                  uint32_t max_blocks_per_client = 0)
      : n(blocks) {
    service::DaemonConfig c;
    c.policy = std::string(policy);
    c.tick_ms = 100;
    c.migrate_rate_mib_s = std::max<uint64_t>(1, (kBlocksPerTick * model.block_bytes() * 10) >> 20);
    c.state_dir = "/tmp/cxltier-bench-state-" + std::to_string(getpid());
    c.persist = true;
    c.checkpoint_interval_s = 0;
    std::filesystem::create_directories(c.state_dir);
    c.tier0_budget_bytes = budget_bytes;
    c.max_blocks_per_client = max_blocks_per_client ? max_blocks_per_client : blocks;
    numa::Topology topo = numa::Discover();
    numa::TierAssignment tiers{{0}, {0}, "bench", {}};
    daemon = std::make_unique<service::Daemon>(io, c, topo, tiers, std::make_unique<NullMigrator>(),
                                               true);
    daemon->requests().OnConnect(peer);
    int seg_fd = -1;
    auto hello = daemon->requests().OnHello(peer, wire::Hello{model, blocks, "bench"}, &seg_fd);
    if (!hello.ok()) std::abort();
    void* p = mmap(nullptr, SegmentBytes(blocks), PROT_READ | PROT_WRITE, MAP_SHARED, seg_fd, 0);
    slots = reinterpret_cast<BlockState*>(static_cast<char*>(p) + kSegmentSlotOffset);
    dirty = reinterpret_cast<uint64_t*>(static_cast<char*>(p) + SegmentDirtyOffset(blocks));
    const uint64_t stride = (model.block_bytes() + 4095) / 4096 * 4096;
    memfd = memfd_create("bench-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ftruncate(memfd, static_cast<off_t>(stride * blocks)) != 0) std::abort();
    if (fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) std::abort();  // the daemon requires it
    auto pool = daemon->requests().OnRegisterPool(
        peer, wire::RegisterPool{wire::PoolKind::kMemfd, 0, stride * blocks, stride, blocks},
        server::UniqueFd(dup(memfd)));
    if (!pool.ok()) std::abort();
    for (uint32_t i = 0; i < blocks; i += wire::kMaxEntriesPerMessage) {
      wire::Admit a{0, {}};
      for (uint32_t j = i; j < std::min(blocks, i + wire::kMaxEntriesPerMessage); ++j) {
        a.entries.push_back({BlockKey::FromSequence(1, j), j});
      }
      if (!daemon->requests().OnAdmit(peer, a).ok()) std::abort();
    }
  }
  ~InProcessDaemon() {
    daemon.reset();
    close(memfd);
    std::error_code ec;
    std::filesystem::remove_all("/tmp/cxltier-bench-state-" + std::to_string(getpid()), ec);
  }
  void Tick() {
    daemon->Tick();
    io.poll();  // the mover's completions
    io.restart();
  }
};

// ---- 3. tick cost ----

// Baseline: one sequential read of a state table of the same size.
void BM_TickBaseline(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<BlockState> table(n);
  for (auto _ : state) {
    uint64_t sum = 0;
    for (const BlockState& s : table) sum += s.client_touches;
    benchmark::DoNotOptimize(sum);
  }
  state.counters["blocks"] = static_cast<double>(n);
}
BENCHMARK(BM_TickBaseline)->Arg(8192)->Arg(65536)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// The touches both floors below fold, as BM_Tick makes them: `percent` of
// the slots' worth of observations at random slots (every slot in order at
// 100%), made outside the timed part.
void MakeTouches(std::vector<BlockState>& client, std::vector<uint64_t>& dirty, uint32_t percent,
                 std::mt19937& rng) {
  const uint32_t n = static_cast<uint32_t>(client.size());
  const uint32_t touched = std::max<uint32_t>(1, n / 100 * percent);
  for (uint32_t i = 0; i < touched; ++i) {
    AddObservation(client.data(), dirty.data(), percent == 100 ? i : rng() % n, 0.5f);
  }
}

// The scan of the dirty bitmap: clears it and calls fold(slot) for each marked slot.
template <typename Fold>
void ForEachDirty(std::vector<uint64_t>& dirty, Fold&& fold) {
  for (uint32_t w = 0; w < dirty.size(); ++w) {
    uint64_t bits = std::exchange(dirty[w], 0);
    while (bits) {
      fold(w * 64 + static_cast<uint32_t>(std::countr_zero(bits)));
      bits &= bits - 1;
    }
  }
}

// The floor under any fold of `percent` touched blocks that keeps its own
// copy of each block's state: the dirty bitmap's scan, and for each marked
// slot a read of the client's totals against what was folded last, an
// update of the daemon's 64-byte state and the write of it back into the
// client's slot. No policy, no planner, no bookkeeping: what BM_Tick could
// cost if all of that were free. The same touched slots as BM_Tick.
void BM_TickFloor(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const uint32_t percent = static_cast<uint32_t>(state.range(1));
  std::vector<BlockState> client(n), daemon(n);
  std::vector<uint64_t> seen(n, 0);
  std::vector<uint64_t> dirty(SegmentDirtyWords(n));
  std::mt19937 rng(7);
  uint64_t tick = 0;
  for (auto _ : state) {
    state.PauseTiming();
    MakeTouches(client, dirty, percent, rng);
    ++tick;
    state.ResumeTiming();
    ForEachDirty(dirty, [&](uint32_t i) {
      BlockState& c = client[i];
      const uint64_t now = (uint64_t{c.client_touches} << 32) | c.client_mass_q16;
      if (now == seen[i]) return;
      seen[i] = now;
      BlockState& d = daemon[i];
      d.touch_count += 1;
      d.touch_time = tick;
      d.score = d.score * 0.5 + 1.0;
      c.score = d.score;
      c.touch_time = d.touch_time;
      c.touch_count = d.touch_count;
    });
    benchmark::ClobberMemory();
  }
  state.counters["blocks"] = n;
  state.counters["touched_percent"] = percent;
}
BENCHMARK(BM_TickFloor)
    ->ArgsProduct({{8192, 65536, 1 << 20}, {1, 10, 100}})
    ->Unit(benchmark::kMicrosecond);

// Not the daemon's design: a batch tick over small records, to say what
// issue 32's tick target (3x one read of the table at 1M blocks) would take
// (docs/performance.md, "Ticks at 1M blocks"). The same touches and fold
// into the client's slot as BM_TickFloor, but the daemon keeps a 16-byte
// record per block (count, the totals folded last, whether it is in tier
// 0) instead of a 64-byte state; tier 0 (half the blocks) is the blocks of
// the highest counts, found by a histogram of counts instead of per-touch
// entries and exits, and one pass over the records makes the set's changes
// into promote and demote lists. Ties at the threshold: members stay.
void BM_TickBatchFloor(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const uint32_t percent = static_cast<uint32_t>(state.range(1));
  const uint32_t capacity = n / 2;
  struct Record {
    uint32_t count = 0;
    uint32_t touches = 0;  // the client's totals folded last
    uint32_t mass = 0;
    uint32_t in_set = 0;
  };
  static_assert(sizeof(Record) == 16);
  constexpr uint32_t kTop = 65535;  // counts at or above it share a bucket
  std::vector<BlockState> client(n);
  std::vector<Record> records(n);
  std::vector<uint32_t> histogram(kTop + 1, 0);
  histogram[0] = n;
  std::vector<uint64_t> dirty(SegmentDirtyWords(n));
  std::vector<uint32_t> promote, demote;
  promote.reserve(n);
  demote.reserve(n);
  std::mt19937 rng(7);
  uint64_t tick = 0;
  for (auto _ : state) {
    state.PauseTiming();
    MakeTouches(client, dirty, percent, rng);
    ++tick;
    state.ResumeTiming();
    ForEachDirty(dirty, [&](uint32_t i) {
      BlockState& c = client[i];
      Record& r = records[i];
      if (c.client_touches == r.touches && c.client_mass_q16 == r.mass) return;
      r.touches = c.client_touches;
      r.mass = c.client_mass_q16;
      --histogram[std::min(r.count, kTop)];
      ++r.count;
      ++histogram[std::min(r.count, kTop)];
      c.score = r.count;
      c.touch_time = tick;
      c.touch_count = r.count;
    });
    // The threshold: the blocks above it fit, those at it fill what is left.
    uint32_t above = 0, threshold = kTop;
    for (; threshold > 0 && above + histogram[threshold] < capacity; --threshold) {
      above += histogram[threshold];
    }
    uint32_t room_at = capacity - above;
    promote.clear();
    demote.clear();
    for (uint32_t i = 0; i < n; ++i) {
      Record& r = records[i];
      const uint32_t count = std::min(r.count, kTop);
      bool in = count > threshold;
      if (count == threshold && r.in_set && room_at > 0) {
        in = true;
        --room_at;
      }
      if (in != static_cast<bool>(r.in_set)) {
        (in ? promote : demote).push_back(i);
        r.in_set = in;
      }
    }
    benchmark::DoNotOptimize(promote.data());
    benchmark::DoNotOptimize(demote.data());
    benchmark::ClobberMemory();
  }
  state.counters["blocks"] = n;
  state.counters["touched_percent"] = percent;
  state.counters["promoted_last_tick"] = static_cast<double>(promote.size());
}
BENCHMARK(BM_TickBatchFloor)->ArgsProduct({{1 << 20}, {1, 10, 100}})->Unit(benchmark::kMicrosecond);

// Fold + plan with `percent` of the blocks touched since the last tick; the
// tier-0 budget holds half the blocks, so touched blocks keep moving.
// BM_Tick/adaptive: the same with the adaptive policy, which feeds every touch
// to each of its experts; BM_Tick/default: with the default policy.
void BM_Tick(benchmark::State& state, std::string_view policy) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  const uint32_t percent = static_cast<uint32_t>(state.range(1));
  InProcessDaemon d(n, kBenchModel, uint64_t{n / 2} * kBenchModel.block_bytes(), policy);
  std::mt19937 rng(7);
  const uint32_t touched = std::max<uint32_t>(1, n / 100 * percent);
  for (auto _ : state) {
    state.PauseTiming();
    for (uint32_t i = 0; i < touched; ++i) {
      d.Observe(percent == 100 ? i : rng() % n, 0.5f);
    }
    state.ResumeTiming();
    d.Tick();
  }
  state.counters["blocks"] = n;
  state.counters["touched_percent"] = percent;
  // A shards policy's switches each rebuild its leader from the whole set:
  // a tick that made one costs far more than the others.
  if (const nlohmann::json st = d.daemon->StatusJson(); st["shards"].is_object()) {
    state.counters["policy_switches"] = st["shards"]["switches"].get<double>();
  }
}
BENCHMARK_CAPTURE(BM_Tick, lfu, "lfu")
    ->ArgsProduct({{8192, 65536, 1 << 20}, {1, 10, 100}})
    ->Unit(benchmark::kMicrosecond);
// Other policies at 1M blocks, 10% touched: whether a policy's own
// structures (lists, buckets, a hand) are what a tick there costs.
BENCHMARK_CAPTURE(BM_Tick, lru, "lru")->Args({1 << 20, 10})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Tick, arc, "arc")->Args({1 << 20, 10})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Tick, sieve, "sieve")->Args({1 << 20, 10})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Tick, adaptive, engine::kAdaptivePolicy)
    ->ArgsProduct({{8192, 65536}, {1, 10}})
    ->Unit(benchmark::kMicrosecond);
// Whatever the daemon's default policy is (issue 32's tick targets at 1M
// blocks hold for it as for lfu).
BENCHMARK_CAPTURE(BM_Tick, default, engine::kDefaultPolicy)
    ->ArgsProduct({{8192, 65536, 1 << 20}, {1, 10, 100}})
    ->Unit(benchmark::kMicrosecond);

// A change of the default's leader (shards) with `n` blocks, half of them in
// the set: the time the switch itself holds the I/O thread (manual time:
// only the switch, made as a replay makes it, FollowLeader). Between two
// switches, touches of random blocks hand the set over to the new leader
// until the former holds none, as the policy's own switches wait for
// (docs/policies.md, "shards"). Compare with BM_TickBaseline (one read of
// the table): a switch that rebuilt the leader from the whole set took 128
// ms at 1M blocks, 55 to 59 of those (docs/performance.md).
void BM_ShardsSwitch(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  engine::EngineOptions o;
  o.block_bytes = kBenchModel.block_bytes();
  o.tier0_budget_bytes = uint64_t{n / 2} * o.block_bytes;
  o.mode = engine::Mode::kTick;
  o.expected_blocks = n;
  engine::Engine e(o, std::move(*engine::MakePolicy(engine::kDefaultPolicy)));
  e.FollowRecordedLeaders();
  std::vector<engine::Slot> slots;
  for (uint32_t i = 0; i < n; ++i) slots.push_back(e.Admit(BlockKey::FromSequence(1, i)));
  std::mt19937 rng(3);
  uint64_t now = 1;
  const auto touch = [&](uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) {
      e.Touch(slots[rng() % n], engine::Touch{0.5, now++, engine::kNever});
    }
  };
  touch(2 * n);
  const size_t candidates = engine::ViewShards(e.policy())->sampled_hits.size();
  size_t leader = 0;
  for (auto _ : state) {
    leader = (leader + 1) % candidates;
    const auto start = std::chrono::steady_clock::now();
    e.FollowLeader(leader, /*now=*/true);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    while (engine::ViewShards(e.policy())->former_blocks > 0) touch(n / 8);
  }
  state.counters["blocks"] = n;
  state.counters["set_blocks"] = static_cast<double>(e.set_blocks());
  state.counters["former_blocks"] =
      static_cast<double>(engine::ViewShards(e.policy())->former_blocks);
}
BENCHMARK(BM_ShardsSwitch)
    ->Arg(65536)
    ->Arg(1 << 20)
    ->UseManualTime()
    ->Iterations(8)
    ->Unit(benchmark::kMicrosecond);

// A hint about one group of `n` blocks, all touched, tier 0 holding 4,096 of
// them (docs/protocol.md, "What a hint costs"): the group's blocks in tier 0
// are touched, it is hinted idle; another group takes their room, and it is
// hinted soon. `slice` units of the group's work per Hint() call
// (EngineOptions::hint_slice_units; 0: the whole group at once, as before
// issue 30). Timed: the two Hint() calls; not the touches.
void BM_HintOnAHugeGroup(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  constexpr uint32_t kCap = 4096;
  engine::EngineOptions o;
  o.block_bytes = kBenchModel.block_bytes();
  o.tier0_budget_bytes = uint64_t{kCap} * o.block_bytes;
  o.mode = engine::Mode::kTick;
  o.hint_slice_units = static_cast<size_t>(state.range(1));
  o.expected_blocks = n + kCap;
  engine::Engine e(o, std::move(*engine::MakePolicy("lru")));
  uint64_t now = 1;
  std::vector<engine::Slot> big, other;
  for (uint32_t i = 0; i < n; ++i) {
    big.push_back(e.Admit(BlockKey::FromSequence(1, i)));
    e.SetGroup(big.back(), 1);
    e.Touch(big.back(), engine::Touch{1.0, now++, engine::kNever});
  }
  for (uint32_t i = 0; i < kCap; ++i) {
    other.push_back(e.Admit(BlockKey::FromSequence(2, i)));
    e.SetGroup(other.back(), 2);
  }
  for (auto _ : state) {
    state.PauseTiming();
    for (uint32_t i = 0; i < kCap; ++i) e.Touch(big[i], engine::Touch{1.0, now++, engine::kNever});
    state.ResumeTiming();
    e.Hint(1, engine::HintKind::kIdle, now++);
    state.PauseTiming();
    for (engine::Slot s : other) e.Touch(s, engine::Touch{1.0, now++, engine::kNever});
    state.ResumeTiming();
    e.Hint(1, engine::HintKind::kSoon, now++);
  }
  state.counters["blocks"] = n;
  state.counters["units_per_hint"] =
      static_cast<double>(e.counters().hint_work) / static_cast<double>(e.counters().hints);
}
BENCHMARK(BM_HintOnAHugeGroup)
    ->ArgsProduct({{65536, 1 << 20}, {0, 16384}})
    ->Unit(benchmark::kMicrosecond);

// `Stats status` with every block live: its per-user shares walk every
// client's slots (docs/operations.md, "Quotas"); BM_TickBaseline-sized.
void BM_StatusJson(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  InProcessDaemon d(n, kBenchModel, uint64_t{n / 2} * kBenchModel.block_bytes(), "lfu");
  for (auto _ : state) benchmark::DoNotOptimize(d.daemon->StatusJson());
  state.counters["blocks"] = n;
}
BENCHMARK(BM_StatusJson)->Arg(65536)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// `Stats blocks` with every block live, all of one uid: it looks at every
// slot of the clients it shows, and charges the sender's uid a unit per
// slot (docs/protocol.md, "Stats"). Baseline: BM_TickBaseline, one read of
// the table; the counter `ns_per_slot` is what a unit per slot stands for.
void BM_StatsBlocks(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  InProcessDaemon d(n, kBenchModel, uint64_t{n / 2} * kBenchModel.block_bytes(), "lfu");
  for (uint32_t i = 0; i < n; ++i) d.Observe(i, static_cast<float>(i % 977) / 16.0f);
  d.Tick();
  for (auto _ : state) {
    auto answer = d.daemon->requests().OnStats(d.peer, wire::Stats{"blocks"});
    if (!answer.ok()) std::abort();
    benchmark::DoNotOptimize(answer);
  }
  state.counters["blocks"] = n;
  state.counters["ns_per_slot"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_StatsBlocks)->Arg(65536)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// What the daemon's accept pays to name the process that connected
// (Peer::start_time, read from /proc/<pid>/stat for device-DAX owners): a
// connection's accept with (arg 1) and without (arg 0, the baseline) that
// read, on a real Unix socket: connect, accept, SO_PEERCRED, close both.
void BM_AcceptPeer(benchmark::State& state) {
  const bool start_time = state.range(0) != 0;
  const std::string path = "/tmp/cxltier-bench-accept-" + std::to_string(getpid()) + ".sock";
  unlink(path.c_str());
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
  if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 16) != 0) {
    state.SkipWithError("cannot listen on a Unix socket in /tmp");
    return;
  }
  for (auto _ : state) {
    const int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) std::abort();
    const int a = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (a < 0 || getsockopt(a, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) std::abort();
    if (start_time) {
      const std::optional<uint64_t> start = server::ProcessStartTime(cred.pid);
      if (!start) std::abort();
      benchmark::DoNotOptimize(*start);
    }
    close(a);
    close(c);
  }
  close(listener);
  unlink(path.c_str());
}
BENCHMARK(BM_AcceptPeer)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// A Hello of `n` slots from a new connection of another uid, which leaves
// (not timed) before the next: the segment and the client's tables written
// whole. Charged to the uid at 2 units a slot (docs/protocol.md, "Hello").
void BM_Hello(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  InProcessDaemon d(8, kBenchModel, 8 * kBenchModel.block_bytes(), "lfu", n);
  uint64_t session = 1000;
  for (auto _ : state) {
    const server::Peer p{session++, getpid(), 54321, 54321};
    d.daemon->requests().OnConnect(p);
    int fd = -1;
    auto ok = d.daemon->requests().OnHello(p, wire::Hello{kBenchModel, n, "hello"}, &fd);
    if (!ok.ok()) std::abort();
    state.PauseTiming();
    close(fd);
    d.daemon->requests().OnDisconnect(p);
    d.Tick();
    state.ResumeTiming();
  }
  state.counters["slots"] = n;
  state.counters["ns_per_slot"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * n,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Hello)->Arg(65536)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// A hello with a new block size while no client is connected (no [engine]
// block_bytes): the daemon rebuilds its engine with every ghost. `n` ghosts;
// each iteration one hello, the sizes alternating. Baseline: none; the cost
// per ghost (`ns_per_ghost`) is what the hello's charge is set from
// (service/requests.cpp, kRebuildUnitsPerGhost).
void BM_BlockSizeChange(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  InProcessDaemon d(n, kBenchModel, uint64_t{n / 2} * kBenchModel.block_bytes(), "lfu");
  d.daemon->requests().OnDisconnect(d.peer);  // its n blocks become ghosts
  d.io.run();
  ModelGeometry other = kBenchModel;
  other.block_tokens = 32;
  uint64_t session = 1000;
  for (auto _ : state) {
    const server::Peer p{session, getpid(), 54321, 54321};
    d.daemon->requests().OnConnect(p);
    int fd = -1;
    auto ok = d.daemon->requests().OnHello(
        p, wire::Hello{session++ % 2 ? other : kBenchModel, 8, "size"}, &fd);
    if (!ok.ok()) std::abort();
    state.PauseTiming();
    close(fd);
    d.daemon->requests().OnDisconnect(p);
    d.io.restart();
    d.io.run();
    state.ResumeTiming();
  }
  // The ghosts kept ([limits] max_ghosts_per_uid caps one uid's).
  const double ghosts = d.daemon->StatusJson()["ghosts"].get<double>();
  state.counters["ghosts"] = ghosts;
  state.counters["ns_per_ghost"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * ghosts,
                         benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_BlockSizeChange)->Arg(65536)->Arg(1 << 20)->Unit(benchmark::kMillisecond);

// A quota set for an account the engine has not seen, with quotas already on
// and `n` live blocks (half in tier 0) of 16 uids, each of 64 clients: what a
// hello with a name that [[quotas.client]] caps costs the daemon, which any
// local user can send in a loop. Each iteration sets and lifts the quota (the
// account is freed again). Baseline: BM_TickBaseline, one read of the table.
void BM_SetQuotaNewAccount(benchmark::State& state) {
  const uint32_t n = static_cast<uint32_t>(state.range(0));
  engine::EngineOptions o;
  o.block_bytes = 4096;
  o.tier0_budget_bytes = uint64_t{n / 2} * o.block_bytes;
  auto policy = engine::MakePolicy("lfu");
  if (!policy.ok()) std::abort();
  engine::Engine e(o, std::move(*policy));
  for (uint32_t i = 0; i < n; ++i) {
    const engine::Slot s = e.Admit(BlockKey::FromSequence(i / 64, i), 1000 + i % 16,
                                   engine::kClientAccount | (i % 64));
    e.Touch(s, engine::Touch{1.0 + i % 7, i});
  }
  engine::Quota cap;
  cap.cap[0] = n / 8;
  e.SetQuota(1000, cap);  // quotas on: every uid's account is kept
  uint64_t next = 1 << 20;
  for (auto _ : state) {
    const uint64_t id = engine::kClientAccount | next++;
    e.SetQuota(id, cap);
    e.SetQuota(id, engine::Quota{});
  }
  state.counters["blocks"] = n;
}
BENCHMARK(BM_SetQuotaNewAccount)->Arg(65536)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

// ---- 4. the seeds' scenario ----

// Llama-3 70B, 128K-token contexts, 32 sequences decoding at 30 tokens/s,
// sparse attention touching 64 blocks per step. With 100 ms ticks each
// sequence takes 3 steps per tick: 32 x 3 x 64 observations per tick.
void BM_SeedScenarioTick(benchmark::State& state, std::string_view policy) {
  constexpr uint32_t kSeqs = 32, kBlocksPerSeq = 8192, kTouches = 64, kStepsPerTick = 3;
  const uint32_t n = kSeqs * kBlocksPerSeq;
  // Memory the daemon holds per block, against the 64-byte state: its heap
  // (engine, policy, key index, per-client tables) plus the segment slot.
  auto heap = [] {
    const struct mallinfo2 mi = mallinfo2();
    return static_cast<uint64_t>(mi.uordblks + mi.hblkhd);
  };
  const uint64_t before = heap();
  // 32 GiB of 5 MiB blocks = 6553 blocks of tier 0, in bench-model blocks.
  InProcessDaemon d(n, kBenchModel, 6553 * kBenchModel.block_bytes(), policy);
  std::mt19937 rng(3);
  for (auto _ : state) {
    state.PauseTiming();
    for (uint32_t s = 0; s < kSeqs; ++s) {
      for (uint32_t step = 0; step < kStepsPerTick; ++step) {
        for (uint32_t t = 0; t < kTouches; ++t) {
          // Sink, recent window and heavy hitters concentrate on few blocks.
          const uint32_t b =
              t < 5 ? t
                    : static_cast<uint32_t>(std::min<double>(
                          kBlocksPerSeq - 1, std::pow(rng() % 1000 / 1000.0, 3) * kBlocksPerSeq));
          d.Observe(s * kBlocksPerSeq + b, 1.0f / kTouches);
        }
      }
    }
    state.ResumeTiming();
    d.Tick();
  }
  state.counters["blocks"] = n;
  // Heap per block plus the 64-byte segment slot.
  // Measured after the ticks: policies grow their per-slot tables as blocks are touched.
  const uint64_t after = heap() + uint64_t{n} * sizeof(BlockState);
  state.counters["daemon_bytes_per_block"] = static_cast<double>(after - before) / n;
  state.counters["observations_per_tick"] = kSeqs * kStepsPerTick * kTouches;
}
BENCHMARK_CAPTURE(BM_SeedScenarioTick, lfu, "lfu")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SeedScenarioTick, adaptive, engine::kAdaptivePolicy)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_SeedScenarioTick, shards, engine::kShardsPolicy)
    ->Unit(benchmark::kMicrosecond);
// Whatever the daemon's default policy is (issue 32's targets are against lfu).
BENCHMARK_CAPTURE(BM_SeedScenarioTick, default, engine::kDefaultPolicy)
    ->Unit(benchmark::kMicrosecond);

// The client's side of one decode step of one sequence: 64 observations.
void BM_SeedScenarioClientStep(benchmark::State& state) {
  std::vector<BlockState> segment(8192);
  std::vector<uint64_t> dirty(SegmentDirtyWords(8192));
  std::mt19937 rng(5);
  std::vector<uint32_t> blocks(64);
  for (auto& b : blocks) b = rng() % 8192;
  for (auto _ : state) {
    // Each step starts with clean bits, the worst case (a tick between steps);
    // the 64 stores that clear them are counted in the step.
    for (uint32_t b : blocks) dirty[b / 64] = 0;
    for (uint32_t b : blocks) AddObservation(segment.data(), dirty.data(), b, 1.0f / 64);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_SeedScenarioClientStep);

}  // namespace
}  // namespace cxltier::bench
