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

// Baseline: read every event of the trace and the slot index it names, as the
// replay loop does, and nothing else.
void BM_ReadTrace(benchmark::State& state) {
  const sim::Trace& t = AttentionTrace();
  std::vector<uint32_t> slot_of(t.keys.size(), 0);
  for (auto _ : state) {
    uint64_t sum = 0;
    for (const sim::TraceEvent& e : t.events) sum += e.step + slot_of[e.key] + (e.obs > 0.5f);
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * t.touches()));
}
BENCHMARK(BM_ReadTrace)->Unit(benchmark::kMillisecond);

void BM_Replay(benchmark::State& state, const std::string& policy) {
  const sim::Trace& t = AttentionTrace();
  sim::SimConfig c;
  c.policy = policy;
  c.persistence = engine::Persistence::kReset;
  c.block_bytes = kLlama3_70B.block_bytes();
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
BENCHMARK_CAPTURE(BM_Replay, lru, std::string("lru"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, lfu, std::string("lfu"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, ema, std::string("ema:0.01"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, arc, std::string("arc"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, s3fifo, std::string("s3fifo"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, sieve, std::string("sieve"))->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Replay, tinylfu, std::string("tinylfu"))->Unit(benchmark::kMillisecond);

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
    const auto base = rates_.find("BM_ReadTrace");
    if (base == rates_.end()) return;
    std::printf("\nsimulator replay, attention workload (%zu touches), one thread:\n",
                AttentionTrace().touches());
    std::printf("  %-22s %14s %12s\n", "", "touches/s", "vs read loop");
    for (const auto& [name, rate] : rates_) {
      std::printf("  %-22s %14.3g %11.3fx\n", name.c_str(), rate, rate / base->second);
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
