// Figures 2 and 5 of docs/performance.md: batched reports over the socket, and
// page migration between two NUMA nodes.
#include <benchmark/benchmark.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <thread>

#include "cxltier/client.h"
#include "numa/migrator.h"
#include "numa/topology.h"
#include "server/server.h"
#include "service/admin.h"
#include "service/daemon.h"
#include "service/move_dispatch.h"

namespace cxltier::bench {
namespace {

// ---- 2. batched reports over the socket ----

constexpr uint32_t kReportSlots = 4096;
const ModelGeometry kReportModel{"bench", 1, 1, 1, 1024, 2, 16};  // 64 KiB blocks

// A real cxltierd core and server on a thread, and a connected client.
struct SocketDaemon {
  boost::asio::io_context io;
  std::unique_ptr<service::Daemon> daemon;
  std::unique_ptr<server::Server> srv;
  std::thread thread;
  std::unique_ptr<Client> client;
  std::string dir;
  int memfd = -1;

  SocketDaemon() {
    dir = "/tmp/cxltier-bench-sock-" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
    service::DaemonConfig c;
    c.socket_path = dir + "/d.sock";
    c.state_dir = dir + "/state";
    c.tick_ms = 100;
    c.persist = false;
    daemon = std::make_unique<service::Daemon>(io, c, numa::Discover(),
                                               numa::TierAssignment{{0}, {0}, "bench", {}},
                                               numa::MakeLinuxMigrator(), false);
    if (!daemon->Start().ok()) std::abort();
    srv = std::make_unique<server::Server>(io, daemon->requests(), server::ServerOptions{});
    if (!srv->Listen(c.socket_path, 0600).ok()) std::abort();
    thread = std::thread([this] { io.run(); });
    Status st;
    client = Client::Connect({c.socket_path, kReportModel, kReportSlots, "bench"}, &st);
    if (!client) std::abort();
    memfd = memfd_create("bench-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    const uint64_t bytes = uint64_t{kReportSlots} * kReportModel.block_bytes();
    if (ftruncate(memfd, static_cast<off_t>(bytes)) != 0) std::abort();
    uint32_t pool = 0;
    if (!client->RegisterMemfdPool(memfd, bytes, kReportModel.block_bytes(), kReportSlots, &pool)
             .ok()) {
      std::abort();
    }
    std::vector<wire::AdmitEntry> e;
    for (uint32_t i = 0; i < kReportSlots; ++i) e.push_back({BlockKey::FromSequence(3, i), i});
    if (!client->Admit(pool, e, nullptr).ok()) std::abort();
  }
  ~SocketDaemon() {
    client.reset();
    boost::asio::post(io, [this] {
      srv->Stop();
      daemon->Stop();
      io.stop();
    });
    thread.join();
    close(memfd);
    std::filesystem::remove_all(dir);
  }
};

std::vector<wire::Observation> Batch(size_t n) {
  std::vector<wire::Observation> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = {static_cast<uint32_t>(i * 7 % kReportSlots), 0.25f};
  return b;
}

void BM_ReportSocket(benchmark::State& state) {
  static SocketDaemon* d = new SocketDaemon();  // one daemon for all batch sizes
  const std::vector<wire::Observation> batch = Batch(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    wire::ReportOk ok;
    if (!d->client->Report(batch, &ok).ok() || ok.accepted != batch.size()) {
      state.SkipWithError("report failed");
      break;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * batch.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * (16 + 4 + 8 * batch.size())));
}
BENCHMARK(BM_ReportSocket)->Arg(1)->Arg(64)->Arg(4096)->UseRealTime();

// Baseline: the same request bytes over a socketpair to a thread that reads
// them and answers with a reply of the same size as ReportOk.
void BM_ReportSocketpairBaseline(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> req;
  wire::Encode(wire::Report{Batch(n)}, 1, req);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) std::abort();
  const size_t reply = 16 + 8;
  std::thread peer([fd = sv[1], len = req.size(), reply] {
    std::vector<uint8_t> buf(len), out(reply);
    for (;;) {
      size_t got = 0;
      while (got < len) {
        const ssize_t r = read(fd, buf.data() + got, len - got);
        if (r <= 0) return;
        got += static_cast<size_t>(r);
      }
      if (write(fd, out.data(), out.size()) != static_cast<ssize_t>(out.size())) return;
    }
  });
  std::vector<uint8_t> in(reply);
  for (auto _ : state) {
    if (write(sv[0], req.data(), req.size()) != static_cast<ssize_t>(req.size())) std::abort();
    size_t got = 0;
    while (got < reply) got += static_cast<size_t>(read(sv[0], in.data() + got, reply - got));
  }
  close(sv[0]);
  peer.join();
  close(sv[1]);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * req.size()));
}
BENCHMARK(BM_ReportSocketpairBaseline)->Arg(1)->Arg(64)->Arg(4096)->UseRealTime();

// ---- 5. migration between two nodes ----

constexpr size_t kMigrateBlocks = 32;
constexpr size_t kMigrateBlockBytes = 5u << 20;  // a Llama-3 70B block

bool TwoNodes(benchmark::State& state) {
  if (numa_available() < 0 || numa_num_configured_nodes() < 2) {
    state.SkipWithError(
        "one NUMA node: migration cannot be measured here (run it in the QEMU "
        "numa guest, see docs/performance.md)");
    return false;
  }
  return true;
}

// move_pages (the daemon's path) or mbind(MPOL_MF_MOVE): node 0 -> 1 -> 0 per iteration.
void BM_Migrate(benchmark::State& state, bool use_mbind) {
  if (!TwoNodes(state)) return;
  const size_t bytes = kMigrateBlocks * kMigrateBlockBytes;
  auto* p = static_cast<char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  madvise(p, bytes, MADV_NOHUGEPAGE);
  std::memset(p, 1, bytes);
  auto m = numa::MakeLinuxMigrator();
  int node = 0;
  size_t not_done = 0;
  std::string why;
  for (auto _ : state) {
    node ^= 1;
    for (size_t b = 0; b < kMigrateBlocks; ++b) {
      char* block = p + b * kMigrateBlockBytes;
      if (use_mbind) {
        unsigned long mask = 1ul << node;
        mbind(block, kMigrateBlockBytes, MPOL_BIND, &mask, 64, MPOL_MF_MOVE | MPOL_MF_STRICT);
      } else {
        const numa::MoveResult r = m->Move(
            numa::PageRange{0, reinterpret_cast<uintptr_t>(block), kMigrateBlockBytes, false},
            node);
        if (!r.done()) {
          ++not_done;
          why = numa::Summarize(r);
        }
      }
    }
  }
  size_t on = 0;
  for (int n : m->Where(numa::PageRange{0, reinterpret_cast<uintptr_t>(p), bytes, false}))
    on += n == node;
  state.counters["pages_on_target"] = static_cast<double>(on);
  state.counters["moves_not_done"] = static_cast<double>(not_done);
  if (!why.empty()) state.SetLabel("last failure: " + why);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  munmap(p, bytes);
}
BENCHMARK_CAPTURE(BM_Migrate, move_pages, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Migrate, mbind, true)->Unit(benchmark::kMillisecond)->UseRealTime();

// Baseline: memcpy of the same bytes between buffers on the two nodes.
void BM_MigrateMemcpyBaseline(benchmark::State& state) {
  if (!TwoNodes(state)) return;
  const size_t bytes = kMigrateBlocks * kMigrateBlockBytes;
  auto* a = static_cast<char*>(numa_alloc_onnode(bytes, 0));
  auto* b = static_cast<char*>(numa_alloc_onnode(bytes, 1));
  std::memset(a, 1, bytes);
  std::memset(b, 2, bytes);
  int dir = 0;
  for (auto _ : state) {
    std::memcpy(dir ? a : b, dir ? b : a, bytes);
    dir ^= 1;
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  numa_free(a, bytes);
  numa_free(b, bytes);
}
BENCHMARK(BM_MigrateMemcpyBaseline)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- 5. where a block is, asked at admission ----

// A memfd pool the "client" wrote, seen through a fresh daemon mapping each
// iteration (as at admission: the daemon never touched the block): Where of
// all 512 pages of each 2 MiB block (the baseline) against Sample of 8, the
// call WhereIs makes. Both fault in what they ask about.
constexpr size_t kWhereBlocks = 32, kWhereBlockBytes = 2 << 20;

// `mapped`: the daemon's mapping is kept across iterations, as for a pool
// block admitted again under another key: its pages are in our page tables.
void BM_AdmissionWhere(benchmark::State& state, bool sampled, bool mapped) {
  const size_t bytes = kWhereBlocks * kWhereBlockBytes;
  const int fd = memfd_create("cxltier-bench-where", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    state.SkipWithError("memfd");
    return;
  }
  void* client = mmap(nullptr, bytes, PROT_WRITE, MAP_SHARED, fd, 0);
  if (client == MAP_FAILED) {
    state.SkipWithError("mmap");
    return;
  }
  std::memset(client, 1, bytes);
  auto m = numa::MakeLinuxMigrator();
  size_t seen = 0;
  void* kept = mapped ? mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  for (auto _ : state) {
    state.PauseTiming();
    void* daemon = kept ? kept : mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    state.ResumeTiming();
    for (size_t b = 0; b < kWhereBlocks; ++b) {
      const numa::PageRange r{0, reinterpret_cast<uintptr_t>(daemon) + b * kWhereBlockBytes,
                              kWhereBlockBytes, true};
      for (int n : sampled ? m->Sample(r, service::MoveDispatch::kWhereSamples) : m->Where(r)) {
        seen += n >= 0;
      }
    }
    state.PauseTiming();
    if (!kept) munmap(daemon, bytes);
    state.ResumeTiming();
  }
  if (kept) munmap(kept, bytes);
  // Seconds per block (printed with its unit: "us" is microseconds).
  state.counters["per_block"] = benchmark::Counter(
      kWhereBlocks, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["pages_seen"] =
      static_cast<double>(seen) / static_cast<double>(state.iterations());
  munmap(client, bytes);
  close(fd);
}
BENCHMARK_CAPTURE(BM_AdmissionWhere, sample_first, true, false)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_AdmissionWhere, where_first, false, false)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_AdmissionWhere, sample_again, true, true)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_AdmissionWhere, where_again, false, true)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
// Who is an admin (service/admin.h): IsAdmin reads the group and user
// databases, which the daemon asks on every connect, hello, Stats and Admin
// request; AdminCache asks them once per peer per 5 s. The peer is nobody
// (uid and gid 65534) and the group root's, so every lookup finds the group,
// the user and its group list (this machine's backend: /etc/nsswitch.conf).
void BM_AdminLookup(benchmark::State& state, bool cached) {
  const server::Peer nobody{1, 1, 65534, 65534};
  service::AdminCache cache;
  for (auto _ : state) {
    benchmark::DoNotOptimize(cached ? cache.Is(nobody, "root", service::AdminCache::Clock::now())
                                    : service::IsAdmin(nobody, "root"));
  }
}
BENCHMARK_CAPTURE(BM_AdminLookup, database, false);
BENCHMARK_CAPTURE(BM_AdminLookup, cached, true);

}  // namespace cxltier::bench
