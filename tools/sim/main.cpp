// cxltier-sim: replays a trace or a synthetic workload through the placement
// engine for every combination of budget, policy and persistence.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "attention_workload.h"
#include "cxltier/model.h"
#include "simulate.h"
#include "trace.h"

namespace {

using namespace cxltier;
using namespace cxltier::sim;

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = s.find(',', start);
    const std::string item =
        s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "cxltier-sim: %s\n", msg.c_str());
  return 2;
}

std::string Percent(double rate) { return fmt::format("{:.2f}%", 100.0 * rate); }

// Budgets of every tier but the last (which holds the rest), tier 0 first.
std::vector<uint64_t> TierBudgets(const SimConfig& c) {
  std::vector<uint64_t> b{c.budget_bytes};
  b.insert(b.end(), c.lower_budget_bytes.begin(), c.lower_budget_bytes.end());
  return b;
}

// Touches found in each tier, tier 0 first (a first touch in demand mode: in none).
std::vector<uint64_t> TierHits(const SimResult& r) {
  const size_t n = r.config.lower_budget_bytes.size() + 2;
  return {r.counters.tier_hits.begin(), r.counters.tier_hits.begin() + n};
}

nlohmann::json ToJson(const std::string& workload, const SimResult& r) {
  const auto& c = r.counters;
  return {
      {"workload", workload},
      {"policy", r.config.policy},
      {"persist", r.config.persistence == engine::Persistence::kPersist},
      {"mode", r.config.mode == engine::Mode::kDemand ? "demand" : "tick"},
      {"moves", r.config.recorded_moves ? "recorded" : "instant"},
      {"budget_bytes", r.config.budget_bytes},
      {"tier_budget_bytes", TierBudgets(r.config)},
      {"block_bytes", r.config.block_bytes},
      {"capacity_blocks", r.capacity_blocks},
      {"touches", c.touches},
      {"hits", c.hits},
      {"hit_rate", r.hit_rate()},
      {"shards_leader", r.shards_leader},
      {"shards_switches", r.shards_switches},
      {"tier_hits", TierHits(r)},
      {"promotions", c.promotions},
      {"demotions", c.demotions},
      {"promoted_bytes", c.promoted_bytes},
      {"demoted_bytes", c.demoted_bytes},
      {"placed_fast", c.placed_fast},
      {"evictions", c.evictions},
      {"admits", c.admits},
      {"releases", c.releases},
      {"ghost_restores", c.ghost_restores},
      {"hints", r.config.hints},
      {"hint_events", c.hints},
      {"hint_prefetched", c.hint_prefetched},
      {"hint_displaced", c.hint_displaced},
      {"hint_prefetch_hits", c.hint_prefetch_hits},
      {"ticks", c.ticks},
      {"tick_steps", r.config.tick_steps},
      {"migrate_bytes_per_tick", r.config.migrate_bytes_per_tick},
      {"hysteresis_ticks", r.config.hysteresis_ticks},
      {"landing_percent", r.config.landing_percent},
      {"seconds", r.seconds},
      {"touches_per_second", r.seconds > 0 ? c.touches / r.seconds : 0.0},
  };
}

// The policy, and "+hints" when the trace's hints were applied.
std::string Label(const SimResult& r) { return r.config.policy + (r.config.hints ? "+hints" : ""); }

void PrintTable(const std::string& workload, const std::vector<SimResult>& results) {
  std::printf("%-10s %-10s %-7s %-6s %9s %8s %10s %10s %8s %10s %10s\n", "workload", "policy",
              "persist", "mode", "budget", "blocks", "touches", "hits", "hit rate", "promoted",
              "demoted");
  for (const SimResult& r : results) {
    std::printf("%-10s %-10s %-7s %-6s %9s %8llu %10llu %10llu %8s %10s %10s\n",
                workload.substr(0, 10).c_str(), Label(r).c_str(),
                r.config.persistence == engine::Persistence::kPersist ? "persist" : "reset",
                r.config.mode == engine::Mode::kDemand ? "demand" : "tick",
                FormatBytes(r.config.budget_bytes).c_str(),
                static_cast<unsigned long long>(r.capacity_blocks),
                static_cast<unsigned long long>(r.counters.touches),
                static_cast<unsigned long long>(r.counters.hits), Percent(r.hit_rate()).c_str(),
                FormatBytes(r.counters.promoted_bytes).c_str(),
                FormatBytes(r.counters.demoted_bytes).c_str());
    if (!r.config.lower_budget_bytes.empty()) {
      std::string line = "  tiers";
      const std::vector<uint64_t> budgets = TierBudgets(r.config);
      const std::vector<uint64_t> hits = TierHits(r);
      for (size_t k = 0; k < hits.size(); ++k) {
        line += fmt::format(
            " | tier {} {}: {} hits ({})", k,
            k < budgets.size() ? FormatBytes(budgets[k]) : std::string("rest"), hits[k],
            Percent(r.counters.touches ? static_cast<double>(hits[k]) / r.counters.touches : 0.0));
      }
      std::printf("%s\n", line.c_str());
    }
  }
  // The persistence effect: persist minus reset, in percentage points.
  std::map<std::pair<std::string, uint64_t>, std::pair<double, double>> pairs;
  std::map<std::pair<std::string, uint64_t>, int> seen;
  for (const SimResult& r : results) {
    auto& p = pairs[{Label(r), r.config.budget_bytes}];
    (r.config.persistence == engine::Persistence::kPersist ? p.first : p.second) = r.hit_rate();
    ++seen[{Label(r), r.config.budget_bytes}];
  }
  bool header = false;
  for (const auto& [k, v] : pairs) {
    if (seen[k] != 2) continue;
    if (!header) {
      std::printf("\npersistence effect (persist - reset):\n");
      header = true;
    }
    std::printf("  %-10s %9s  %s -> %s  %+.2f points\n", k.first.c_str(),
                FormatBytes(k.second).c_str(), Percent(v.second).c_str(), Percent(v.first).c_str(),
                100.0 * (v.first - v.second));
  }
}

std::string Plot(const std::string& path, const std::string& workload,
                 const std::vector<SimResult>& results) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("cxltier-sim-plot-{}", getpid());
  fs::create_directories(dir);
  std::map<std::string, std::ofstream> files;
  std::vector<std::string> series;
  for (const SimResult& r : results) {
    const bool persist = r.config.persistence == engine::Persistence::kPersist;
    const std::string name = Label(r) + (persist ? " persist" : " reset");
    auto it = files.find(name);
    if (it == files.end()) {
      series.push_back(name);
      std::string file = name;
      for (char& ch : file) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      it = files.emplace(name, std::ofstream(dir / (file + ".dat"))).first;
    }
    it->second << static_cast<double>(r.config.budget_bytes) / (1ull << 30) << ' '
               << 100.0 * r.hit_rate() << '\n';
  }
  for (auto& [_, f] : files) f.close();
  std::ofstream gp(dir / "plot.gp");
  gp << "set terminal pngcairo size 1400,560 noenhanced font 'sans,10'\n"
     << "set output '" << path << "'\n"
     << "set multiplot layout 1,2 title 'cxltier-sim: " << workload << "'\n"
     << "set xlabel 'tier-0 budget (GiB)'\nset ylabel 'hit rate (%)'\nset grid\n"
     << "set key bottom right\nset yrange [0:*]\n";
  for (const char* side : {"persist", "reset"}) {
    gp << "set title '" << side << "'\nplot ";
    bool first = true;
    for (const std::string& name : series) {
      if (name.find(side) == std::string::npos) continue;
      std::string file = name;
      for (char& ch : file) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      gp << (first ? "" : ", ") << "'" << (dir / (file + ".dat")).string()
         << "' using 1:2 with linespoints title '" << name.substr(0, name.find(' ')) << "'";
      first = false;
    }
    gp << (first ? "0 notitle" : "") << "\n";
  }
  gp << "unset multiplot\n";
  gp.close();
  const std::string cmd = "gnuplot '" + (dir / "plot.gp").string() + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (rc != 0) return "gnuplot failed (is gnuplot installed? apt-get install gnuplot-nox)";
  return {};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cxltier-sim: replay block traces through the cxltier placement engine"};
  std::string trace_spec, workload_spec, model_name = "llama3-70b", budgets = "32GiB";
  std::string policies = "lru,lfu,ema:0.01,ema:0.15", persist = "both", mode = "demand";
  std::string migrate = "0", write_trace, plot, block_bytes_flag;
  uint32_t tick_steps = 1, hysteresis = 0, landing = 0, jobs = 1;
  size_t ghosts = 1u << 20;
  bool json = false;
  auto* trace_opt = app.add_option("--trace", trace_spec,
                                   "trace: mooncake:FILE, bin:FILE, csv:FILE (or by extension)");
  auto* workload_opt =
      app.add_option("--workload", workload_spec, "synthetic workload: attention[:k=v,...]");
  trace_opt->excludes(workload_opt);
  app.add_option("--model", model_name, "model preset (block bytes)")->capture_default_str();
  app.add_option("--block-bytes", block_bytes_flag,
                 "bytes per block (instead of --model's), as cxltierctl record prints it");
  auto* budget_opt =
      app.add_option("--budget", budgets,
                     "tier-0 budgets, comma-separated: sizes (32GiB,64GiB) or shares of "
                     "the trace's distinct blocks (1%,50%)")
          ->capture_default_str();
  std::string tiers_flag;
  app.add_option("--tiers", tiers_flag,
                 "more than two tiers: the budgets of tier 0, 1, ... (16GiB,32GiB: three "
                 "tiers, the last holds the rest)");
  app.add_option("--policy", policies, "policies, comma-separated: " + engine::PolicyNames())
      ->capture_default_str();
  app.add_option("--persist", persist, "persist, reset or both")->capture_default_str();
  std::string hints = "on";
  app.add_option(
         "--hints", hints,
         "apply the trace's scheduler hints (attention:hints=1 makes them): on, off or both")
      ->capture_default_str();
  app.add_option("--mode", mode, "demand or tick")->capture_default_str();
  app.add_option("--tick-steps", tick_steps, "tick mode: plan every N steps")
      ->capture_default_str();
  app.add_option("--migrate-per-tick", migrate, "tick mode: bytes moved per tick, 0 = unlimited")
      ->capture_default_str();
  app.add_option("--hysteresis", hysteresis, "tick mode: ticks a moved block stays put")
      ->capture_default_str();
  app.add_option("--landing", landing,
                 "tick mode: percent of tier 0 kept free for new blocks (the daemon's "
                 "[engine] landing_percent, 3 by default there; 0 here, as docs/results.md's "
                 "tick tables were run)")
      ->check(CLI::Range(0, 50))
      ->capture_default_str();
  std::string moves = "instant";
  app.add_option("--moves", moves,
                 "tick mode: instant (plan every --tick-steps, every move done at once: the "
                 "what-if replay) or recorded (plan and complete moves when the daemon did, from "
                 "a cxltierctl record: the exact replay)")
      ->capture_default_str();
  size_t hint_slice = engine::EngineOptions{}.hint_slice_units;
  app.add_option("--hint-slice", hint_slice,
                 "tick mode: units of a hint's work per hint, the rest at the next plans "
                 "(0: all at once; the default is the daemon's)")
      ->capture_default_str();
  app.add_option("--ghosts", ghosts, "ghost store entries (persist)")->capture_default_str();
  app.add_option("--jobs", jobs, "simulations run in parallel")->capture_default_str();
  app.add_flag("--json", json, "print one JSON array");
  app.add_option("--plot", plot, "draw hit rate against budget into FILE.png (gnuplot)");
  app.add_option("--write-trace", write_trace,
                 "write the trace (FILE.csv or binary FILE.bin) and exit: converts formats");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  std::optional<ModelGeometry> model = FindModelPreset(model_name);
  if (!model) return Fail("unknown model '" + model_name + "'");

  // Every flag the trace does not decide is checked before the trace is read
  // or generated: a typo fails at once, not after the workload is made. (An
  // empty list of budgets or policies is refused after it: --write-trace
  // needs neither.)
  SimConfig base;
  std::optional<uint64_t> block_bytes;
  if (!block_bytes_flag.empty()) {
    block_bytes = ParseSize(block_bytes_flag);
    if (!block_bytes || *block_bytes == 0) {
      return Fail("bad --block-bytes '" + block_bytes_flag + "'");
    }
  }
  base.tick_steps = tick_steps;
  base.hysteresis_ticks = hysteresis;
  base.landing_percent = landing;
  base.hint_slice_units = hint_slice;
  base.ghost_capacity = ghosts;
  if (mode == "demand") {
    base.mode = engine::Mode::kDemand;
  } else if (mode == "tick") {
    base.mode = engine::Mode::kTick;
  } else {
    return Fail("--mode must be demand or tick");
  }
  if (moves == "recorded") {
    if (base.mode != engine::Mode::kTick) {
      return Fail("--moves recorded replays the daemon's tick plans: it needs --mode tick");
    }
    base.recorded_moves = true;
  } else if (moves != "instant") {
    return Fail("--moves must be instant or recorded");
  }
  if (auto m = ParseSize(migrate)) {
    base.migrate_bytes_per_tick = *m;
  } else {
    return Fail("bad --migrate-per-tick '" + migrate + "'");
  }
  std::vector<engine::Persistence> persists;
  if (persist == "persist" || persist == "both") persists.push_back(engine::Persistence::kPersist);
  if (persist == "reset" || persist == "both") persists.push_back(engine::Persistence::kReset);
  if (persists.empty()) return Fail("--persist must be persist, reset or both");

  std::vector<bool> hint_sides;
  if (hints == "on" || hints == "both") hint_sides.push_back(true);
  if (hints == "off" || hints == "both") hint_sides.push_back(false);
  if (hint_sides.empty()) return Fail("--hints must be on, off or both");

  if (!tiers_flag.empty()) {
    if (budget_opt->count() > 0) return Fail("give --budget or --tiers, not both");
    const std::vector<std::string> list = SplitList(tiers_flag);
    if (list.empty() || list.size() + 1 > kMaxTiers) {
      return Fail("--tiers takes 1 to " + std::to_string(kMaxTiers - 1) + " budgets");
    }
    budgets = list[0];
    for (size_t k = 1; k < list.size(); ++k) {
      const auto bytes = ParseSize(list[k]);
      if (!bytes) return Fail("bad tier budget '" + list[k] + "' (examples: 32GiB, 512MiB)");
      base.lower_budget_bytes.push_back(*bytes);
    }
  }
  for (const std::string& b : SplitList(budgets)) {
    if (!BudgetBytes(b, 1, 1)) {
      return Fail("bad budget '" + b +
                  "' (examples: 32GiB, 512MiB, 5%: of the trace's distinct blocks)");
    }
  }
  for (const std::string& p : SplitList(policies)) {
    if (auto check = engine::MakePolicy(p); !check.ok()) return Fail(check.status().message);
  }

  Trace trace;
  std::string workload;
  if (!trace_spec.empty()) {
    Result<Trace> r = OpenTrace(trace_spec);
    if (!r.ok()) return Fail(r.status().message);
    trace = std::move(*r);
    workload = trace.name;
  } else if (!workload_spec.empty()) {
    const size_t colon = workload_spec.find(':');
    const std::string kind = workload_spec.substr(0, colon);
    if (kind != "attention") return Fail("unknown workload '" + kind + "'; known: attention");
    AttentionParams params;
    params.block_tokens = model->block_tokens;
    if (colon != std::string::npos) {
      if (std::string err = params.Parse(workload_spec.substr(colon + 1)); !err.empty()) {
        return Fail(err);
      }
    }
    if (std::string err = params.Validate(); !err.empty()) return Fail(err);
    trace = GenerateAttention(params);
    workload = "attention";
  } else {
    return Fail("give --trace or --workload");
  }

  if (!write_trace.empty()) {
    if (Status st = SaveTrace(trace, write_trace); !st.ok()) return Fail(st.message);
    std::fprintf(stderr, "cxltier-sim: wrote %zu events, %zu keys to %s\n", trace.events.size(),
                 trace.keys.size(), write_trace.c_str());
    return 0;
  }

  // Configurations.
  base.block_bytes = model->bytes_per_token() * trace.block_tokens;
  if (block_bytes) base.block_bytes = *block_bytes;
  if (base.recorded_moves && !trace.recorded_moves) {
    return Fail(workload +
                ": records no plans or move outcomes (only a cxltierctl record of a daemon "
                "that records them does, trace format version 3): use --moves instant");
  }

  const bool has_hints =
      std::any_of(trace.events.begin(), trace.events.end(),
                  [](const TraceEvent& e) { return e.kind == EventKind::kHint; });
  if (!has_hints) hint_sides.resize(1);  // nothing to switch off

  std::vector<SimConfig> configs;
  bool needs_future = false;
  for (const std::string& b : SplitList(budgets)) {
    const std::optional<uint64_t> bytes = BudgetBytes(b, trace.keys.size(), base.block_bytes);
    for (const std::string& p : SplitList(policies)) {
      auto check = engine::MakePolicy(p);
      needs_future |= (*check)->NeedsFuture();
      for (engine::Persistence pers : persists) {
        for (bool h : hint_sides) {
          // MIN knows the future: hints tell it nothing, and it runs once.
          if (!h && (*check)->NeedsFuture() && hint_sides.size() > 1) continue;
          SimConfig c = base;
          c.policy = p;
          c.persistence = pers;
          c.budget_bytes = *bytes;
          c.hints = h && has_hints;
          configs.push_back(c);
        }
      }
    }
  }
  if (configs.empty()) return Fail("nothing to simulate: give --budget and --policy");

  const std::vector<uint64_t> next_use = needs_future ? NextUses(trace) : std::vector<uint64_t>{};
  std::vector<SimResult> results(configs.size());
  std::vector<std::string> errors(configs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < configs.size();) {
      Result<SimResult> r = Simulate(trace, configs[i], needs_future ? &next_use : nullptr);
      if (r.ok()) {
        results[i] = std::move(*r);
      } else {
        errors[i] = r.status().message;
      }
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t j = 1; j < std::max<uint32_t>(1, jobs); ++j) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  for (const std::string& e : errors) {
    if (!e.empty()) return Fail(e);
  }

  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const SimResult& r : results) out.push_back(ToJson(workload, r));
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("%s: %zu touches of %zu distinct blocks (%s each), %zu events%s\n\n",
                workload.c_str(), trace.touches(), trace.keys.size(),
                FormatBytes(base.block_bytes).c_str(), trace.events.size(),
                base.recorded_moves ? "; plans and moves when the daemon had them" : "");
    PrintTable(workload, results);
  }
  if (!plot.empty()) {
    if (std::string err = Plot(plot, workload, results); !err.empty()) return Fail(err);
    std::fprintf(stderr, "cxltier-sim: plot written to %s\n", plot.c_str());
  }
  return 0;
}
