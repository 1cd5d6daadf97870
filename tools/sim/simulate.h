// Replays a trace through the engine (the same daemon/engine code the daemon runs).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "trace.h"

namespace cxltier::sim {

struct SimConfig {
  std::string policy = "lru";
  engine::Persistence persistence = engine::Persistence::kPersist;
  engine::Mode mode = engine::Mode::kDemand;
  uint64_t budget_bytes = 32ull << 30;  // tier 0
  // Budgets of tiers 1 .. N-2 (--tiers); the last tier holds the rest. Empty: two tiers.
  std::vector<uint64_t> lower_budget_bytes;
  uint64_t block_bytes = 5ull << 20;
  uint32_t tick_steps = 1;              // tick mode: plan every N steps of the workload clock
  uint64_t migrate_bytes_per_tick = 0;  // tick mode: 0 = unlimited
  uint32_t hysteresis_ticks = 0;        // tick mode
  uint32_t landing_percent = 0;         // tick mode: EngineOptions::landing_percent
  size_t ghost_capacity = 1u << 20;
  bool hints = true;  // apply the trace's scheduler hints (kHint events), if it has any
  // Tick mode: units of a hint's group-wide work per Hint() call, the rest at
  // the next plans (EngineOptions::hint_slice_units; 0: all at once). The
  // daemon's by default.
  size_t hint_slice_units = engine::EngineOptions{}.hint_slice_units;
  // Tick mode: plan and complete moves when the recording says the daemon
  // did (kPlan, kOutcome, kRelocated events; Trace::recorded_moves), instead
  // of planning every tick_steps steps and completing every move at once.
  bool recorded_moves = false;
};

struct SimResult {
  SimConfig config;
  uint64_t capacity_blocks = 0;
  engine::EngineCounters counters;
  double seconds = 0;  // wall time of the replay alone
  // shards: the leader at the end and how often it changed (empty otherwise).
  std::string shards_leader;
  uint64_t shards_switches = 0;

  double hit_rate() const {
    return counters.touches ? static_cast<double>(counters.hits) / counters.touches : 0.0;
  }
};

// For each event, the index of the next touch of the same key (kNever if none).
// Only MIN reads it.
std::vector<uint64_t> NextUses(const Trace& trace);

// A tier-0 budget in bytes: a size ("32GiB", "512MiB") or a share of the
// trace's `distinct_blocks` ("5%", "0.5%": that many blocks rounded down, at
// least one) of `block_bytes` each. nullopt when it is neither, or a share
// is not in (0, 100].
std::optional<uint64_t> BudgetBytes(std::string_view spec, size_t distinct_blocks,
                                    uint64_t block_bytes);

// Replays `trace`. `next_use` may be null unless the policy is MIN.
// kBadPayload for a bad policy name or budget; with recorded_moves, also for
// a trace that records no moves, and for a replay that stops following the
// recording (it planned other moves than the daemon: another policy or
// setting than the daemon's), saying where.
Result<SimResult> Simulate(const Trace& trace, const SimConfig& config,
                           const std::vector<uint64_t>* next_use);

}  // namespace cxltier::sim
