// cxltier-bench: hot-path figures, each next to a baseline measured in the same
// run (these machines are shared and noisy; ratios travel, absolute numbers less).
//
// Now: simulator replay throughput against a loop that only reads the same trace.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "attention_workload.h"
#include "cxltier/model.h"
#include "simulate.h"

namespace {

using namespace cxltier;

const sim::Trace& AttentionTrace() {
  static const sim::Trace trace = [] {
    sim::AttentionParams p;  // the documented defaults
    p.block_tokens = kLlama3_70B.block_tokens;
    return sim::GenerateAttention(p);
  }();
  return trace;
}

// The public Mooncake sample shipped with the tests (512-token blocks).
const sim::Trace& MooncakeTrace() {
  static const sim::Trace trace = [] {
    sim::TraceResult r =
        sim::ReadMooncakeFile(CXLTIER_SOURCE_DIR "/tests/data/mooncake_synthetic_trace.jsonl");
    return r.ok() ? std::move(r.trace) : sim::Trace{};
  }();
  return trace;
}

const sim::Trace& TraceNamed(const std::string& name) {
  return name == "mooncake" ? MooncakeTrace() : AttentionTrace();
}

// Baseline: read every event of the trace and the slot index it names, as the
// replay loop does, and nothing else.
void BM_ReadTrace(benchmark::State& state, const std::string& workload) {
  const sim::Trace& t = TraceNamed(workload);
  if (t.events.empty()) state.SkipWithError("trace not found");
  std::vector<uint32_t> slot_of(t.keys.size(), 0);
  for (auto _ : state) {
    uint64_t sum = 0;
    for (const sim::TraceEvent& e : t.events) sum += e.step + slot_of[e.key] + (e.obs > 0.5f);
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * t.touches()));
}
BENCHMARK_CAPTURE(BM_ReadTrace, attention, std::string("attention"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_ReadTrace, mooncake, std::string("mooncake"))->Unit(benchmark::kMillisecond);

void BM_Replay(benchmark::State& state, const std::string& workload, const std::string& policy) {
  const sim::Trace& t = TraceNamed(workload);
  if (t.events.empty()) state.SkipWithError("trace not found");
  sim::SimConfig c;
  c.policy = policy;
  c.persistence = engine::Persistence::kReset;
  c.block_bytes = kLlama3_70B.bytes_per_token() * t.block_tokens;
  c.budget_bytes = 32ull << 30;
  const std::vector<uint64_t> next = policy == "min" ? sim::NextUses(t) : std::vector<uint64_t>{};
  for (auto _ : state) {
    std::string err;
    sim::SimResult r = sim::Simulate(t, c, policy == "min" ? &next : nullptr, &err);
    if (!err.empty()) state.SkipWithError(err.c_str());
    benchmark::DoNotOptimize(r.counters.hits);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * t.touches()));
}
BENCHMARK_CAPTURE(BM_Replay, attention_lru, std::string("attention"), std::string("lru"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, attention_lfu, std::string("attention"), std::string("lfu"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, attention_ema, std::string("attention"), std::string("ema:0.01"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, attention_arc, std::string("attention"), std::string("arc"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, attention_s3fifo, std::string("attention"), std::string("s3fifo"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, attention_sieve, std::string("attention"), std::string("sieve"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, attention_tinylfu, std::string("attention"), std::string("tinylfu"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, mooncake_lru, std::string("mooncake"), std::string("lru"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, mooncake_lfu, std::string("mooncake"), std::string("lfu"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, mooncake_ema, std::string("mooncake"), std::string("ema:0.01"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, mooncake_arc, std::string("mooncake"), std::string("arc"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, mooncake_s3fifo, std::string("mooncake"), std::string("s3fifo"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, mooncake_sieve, std::string("mooncake"), std::string("sieve"))
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, mooncake_tinylfu, std::string("mooncake"), std::string("tinylfu"))
    ->Unit(benchmark::kMillisecond);

// Collects items/s per benchmark so the summary can print ratios.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.run_type != Run::RT_Iteration || r.error_occurred) continue;
      const auto it = r.counters.find("items_per_second");
      if (it != r.counters.end()) rates_[r.benchmark_name()] = it->second.value;
    }
  }
  void PrintSummary() const {
    for (const char* w : {"attention", "mooncake"}) {
      const auto base = rates_.find(std::string("BM_ReadTrace/") + w);
      if (base == rates_.end()) continue;
      std::printf("\nsimulator replay, %s (%zu touches), one thread:\n", w,
                  TraceNamed(w).touches());
      std::printf("  %-32s %14s %13s\n", "", "touches/s", "vs read loop");
      for (const auto& [name, rate] : rates_) {
        if (name.find(w) == std::string::npos) continue;
        std::printf("  %-32s %14.3g %12.4fx\n", name.c_str(), rate, rate / base->second);
      }
    }
  }

 private:
  std::map<std::string, double> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
