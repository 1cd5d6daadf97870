// cxltier-load: many concurrent clients against one cxltierd. Each client is a
// thread with its own connection, state segment and memfd pool: it admits its
// blocks, then until the deadline observes 64 blocks through shared memory
// and sends a 64-observation Report over the socket, again and again. The
// main thread samples the daemon's status once a second. It reports every
// error, each client's progress (no client may starve), the daemon's peak
// resident memory and its tick latency quantiles.
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cxltier/client.h"
#include "cxltier/model.h"

namespace {

using namespace cxltier;
using Clock = std::chrono::steady_clock;

// 2 KiB blocks in one page each: 256 clients x 1K blocks are 1 GiB of pools
// (memfd, never written by the clients; the daemon's own mapping faults them
// in as it asks the kernel where they are).
const ModelGeometry kLoadModel{"load", 1, 1, 1, 64, 2, 16};
constexpr uint64_t kStride = 4096;
constexpr uint32_t kObservationsPerRound = 64;

struct ClientResult {
  uint64_t rounds = 0;        // Report round trips that succeeded
  uint64_t observations = 0;  // through shared memory and the socket
  uint64_t errors = 0;
  std::string first_error;
};

// Reporting starts for every client together, once all of them are set up
// (connected, pool registered, blocks admitted) or have failed to: however long
// set-up takes on a loaded machine, no client starts late and looks starved.
struct StartGate {
  std::atomic<uint32_t> settled{0};  // clients set up or failed
  std::atomic<bool> open{false};     // `deadline` is set before this turns true
  Clock::time_point deadline;
};

void RunClient(const std::string& socket, uint32_t index, uint32_t blocks, StartGate* gate,
               ClientResult* out) {
  auto fail = [out](const std::string& what) {
    if (out->errors++ == 0) out->first_error = what;
  };
  struct Settle {  // counts this client as settled once, on every path out of set-up
    StartGate* gate;
    bool done = false;
    void operator()() {
      if (!done) gate->settled.fetch_add(1);
      done = true;
    }
    ~Settle() { (*this)(); }
  } settle{gate};
  Status st;
  std::unique_ptr<Client> c;
  // Every client connects at once: retry (up to 60 s) while the daemon's backlog is full.
  const auto connect_by = Clock::now() + std::chrono::seconds(60);
  while (!c && Clock::now() < connect_by) {
    c = Client::Connect({socket, kLoadModel, blocks, "load-" + std::to_string(index)}, &st);
    if (!c) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!c) return fail("connect: " + st.message);
  const int fd = memfd_create("cxltier-load", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(kStride * blocks)) != 0) {
    return fail("memfd");
  }
  uint32_t pool = 0;
  if (Status s = c->RegisterMemfdPool(fd, kStride * blocks, kStride, blocks, &pool); !s.ok()) {
    close(fd);
    return fail("register pool: " + s.message);
  }
  std::vector<wire::AdmitEntry> entries;
  for (uint32_t b = 0; b < blocks; ++b) {
    entries.push_back({BlockKey::FromSequence(1000 + index, b), b});
  }
  std::vector<wire::AdmitResult> admitted;
  if (Status s = c->Admit(pool, entries, &admitted); !s.ok()) {
    close(fd);
    return fail("admit: " + s.message);
  }
  std::mt19937 rng(index);
  std::vector<wire::Observation> batch(kObservationsPerRound);
  settle();
  gate->open.wait(false, std::memory_order_acquire);
  const Clock::time_point deadline = gate->deadline;
  while (Clock::now() < deadline) {
    // A skewed pattern: a few hot blocks, a long tail.
    for (auto& o : batch) {
      const double u = std::uniform_real_distribution<double>(0, 1)(rng);
      o.slot = admitted[static_cast<uint32_t>(u * u * u * blocks) % blocks].slot;
      o.mass = 1.0f / kObservationsPerRound;
      if (!c->Observe(o.slot, o.mass)) fail("observe");
    }
    wire::ReportOk ok;
    if (Status s = c->Report(batch, &ok); !s.ok() || ok.rejected != 0) {
      fail(s.ok() ? "report: observations rejected" : "report: " + s.message);
      if (!s.ok()) break;
      continue;
    }
    ++out->rounds;
    out->observations += 2 * kObservationsPerRound;
  }
  close(fd);
}

double Percentile(std::vector<uint64_t> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return static_cast<double>(v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cxltier-load: many concurrent clients reporting to one cxltierd"};
  std::string socket;
  uint32_t clients = 256, blocks = 1024;
  double seconds = 60, starved_below = 0.1;
  bool json = false;
  app.add_option("--socket", socket, "cxltierd's socket")->required();
  app.add_option("--clients", clients, "concurrent clients (threads)")->capture_default_str();
  app.add_option("--blocks", blocks, "blocks per client")->capture_default_str();
  app.add_option("--seconds", seconds, "how long every client reports")->capture_default_str();
  app.add_option("--starved-below", starved_below,
                 "a client with fewer rounds than this fraction of the median is starved")
      ->capture_default_str();
  app.add_flag("--json", json, "print a JSON summary");
  CLI11_PARSE(app, argc, argv);
  if (clients == 0 || blocks == 0 || seconds <= 0) {
    std::fprintf(stderr, "cxltier-load: --clients, --blocks and --seconds must be positive\n");
    return 2;
  }

  std::vector<ClientResult> results(clients);
  std::vector<std::thread> threads;
  // Connecting and admitting 256K blocks takes a moment: reporting starts for
  // everyone together once every client is set up (a bound of 60 s plus 1 s
  // per client only keeps a hung set-up from hanging the run; the clients not
  // set up by then start late and are counted starved).
  StartGate gate;
  for (uint32_t i = 0; i < clients; ++i) {
    threads.emplace_back(RunClient, socket, i, blocks, &gate, &results[i]);
  }
  const auto setup_bound = Clock::now() + std::chrono::seconds(60 + clients);
  while (gate.settled.load() < clients && Clock::now() < setup_bound) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  gate.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(seconds));
  const Clock::time_point deadline = gate.deadline;
  gate.open.store(true, std::memory_order_release);
  gate.open.notify_all();
  // Sample the daemon once a second while the clients run.
  uint64_t peak_rss = 0, peak_anon = 0, samples = 0, live_blocks_max = 0;
  nlohmann::json last;
  std::string stats_error;
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::string text;
    if (Status s = Client::DaemonStats(socket, "status", &text); !s.ok()) {
      stats_error = s.message;
      continue;
    }
    last = nlohmann::json::parse(text, nullptr, false);
    if (last.is_discarded()) continue;
    ++samples;
    peak_rss = std::max<uint64_t>(peak_rss, last["memory"]["peak_rss_bytes"].get<uint64_t>());
    peak_anon = std::max<uint64_t>(peak_anon, last["memory"]["anon_bytes"].get<uint64_t>());
    live_blocks_max = std::max<uint64_t>(live_blocks_max, last["blocks"].get<uint64_t>());
  }
  for (auto& t : threads) t.join();

  std::vector<uint64_t> rounds;
  uint64_t errors = 0, observations = 0;
  std::string first_error;
  for (const auto& r : results) {
    rounds.push_back(r.rounds);
    errors += r.errors;
    observations += r.observations;
    if (first_error.empty() && !r.first_error.empty()) first_error = r.first_error;
  }
  const double median = Percentile(rounds, 0.5);
  const uint64_t min = *std::min_element(rounds.begin(), rounds.end());
  const uint64_t max = *std::max_element(rounds.begin(), rounds.end());
  const uint64_t starved =
      static_cast<uint64_t>(std::count_if(rounds.begin(), rounds.end(), [&](uint64_t r) {
        return static_cast<double>(r) < starved_below * median;
      }));
  const nlohmann::json ticks = last.is_object() ? last["tick_seconds"] : nlohmann::json::object();
  const bool ok = errors == 0 && starved == 0 && samples > 0 && median > 0;

  nlohmann::json j = {
      {"clients", clients},
      {"blocks_per_client", blocks},
      {"seconds", seconds},
      {"errors", errors},
      {"first_error", first_error},
      {"observations", observations},
      {"observations_per_s", static_cast<double>(observations) / seconds},
      {"rounds_per_client", {{"min", min}, {"p50", median}, {"max", max}}},
      {"starved_clients", starved},
      {"daemon_peak_rss_bytes", peak_rss},
      {"daemon_peak_anon_bytes", peak_anon},
      {"daemon_anon_bytes_per_block",
       live_blocks_max ? static_cast<double>(peak_anon) / static_cast<double>(live_blocks_max) : 0},
      {"daemon_blocks_max", live_blocks_max},
      {"tick_seconds",
       {{"p50", ticks.value("p50", 0.0)},
        {"p99", ticks.value("p99", 0.0)},
        {"max_recent", ticks.value("max_recent", 0.0)},
        {"count", ticks.value("count", 0)}}},
      {"ok", ok},
  };
  if (json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("cxltier-load: %u clients x %u blocks for %.0f s\n", clients, blocks, seconds);
    std::printf("  errors %llu%s%s\n", static_cast<unsigned long long>(errors),
                first_error.empty() ? "" : ", first: ", first_error.c_str());
    std::printf("  observations %llu (%.3g/s)\n", static_cast<unsigned long long>(observations),
                static_cast<double>(observations) / seconds);
    std::printf("  rounds per client: min %llu, median %.0f, max %llu; starved %llu\n",
                static_cast<unsigned long long>(min), median, static_cast<unsigned long long>(max),
                static_cast<unsigned long long>(starved));
    std::printf(
        "  daemon: peak RSS %s (own memory %s, the rest shared pools and segments), %llu blocks; "
        "tick p50 %.0f us, p99 %.0f us\n",
        FormatBytes(peak_rss).c_str(), FormatBytes(peak_anon).c_str(),
        static_cast<unsigned long long>(live_blocks_max), ticks.value("p50", 0.0) * 1e6,
        ticks.value("p99", 0.0) * 1e6);
  }
  if (!stats_error.empty() && samples == 0) {
    std::fprintf(stderr, "cxltier-load: no daemon status: %s\n", stats_error.c_str());
  }
  return ok ? 0 : 1;
}
