#include "simulate.h"

#include <algorithm>
#include <chrono>

namespace cxltier::sim {

std::vector<uint64_t> NextUses(const Trace& trace) {
  std::vector<uint64_t> next(trace.events.size(), engine::kNever);
  std::vector<uint64_t> seen(trace.keys.size(), engine::kNever);
  for (size_t i = trace.events.size(); i-- > 0;) {
    const TraceEvent& e = trace.events[i];
    if (e.kind != EventKind::kTouch) continue;
    next[i] = seen[e.key];
    seen[e.key] = i;
  }
  return next;
}

SimResult Simulate(const Trace& trace, const SimConfig& config,
                   const std::vector<uint64_t>* next_use, std::string* error) {
  SimResult result;
  result.config = config;
  auto made = engine::MakePolicy(config.policy);
  if (!made.ok()) {
    if (error) *error = made.status().message;
    return result;
  }
  std::unique_ptr<engine::Policy> policy = std::move(*made);
  if (config.block_bytes == 0) {
    *error = "block bytes must be positive";
    return result;
  }
  if (policy->NeedsFuture() && (!next_use || next_use->size() != trace.events.size())) {
    *error = "policy " + config.policy + " needs the future of the trace";
    return result;
  }
  if (config.lower_budget_bytes.size() + 2 > kMaxTiers) {
    *error = "at most " + std::to_string(kMaxTiers) + " tiers";
    return result;
  }
  engine::EngineOptions o;
  o.block_bytes = config.block_bytes;
  o.tier0_budget_bytes = config.budget_bytes;
  o.lower_tier_budget_bytes = config.lower_budget_bytes;
  o.persistence = config.persistence;
  o.mode = config.mode;
  o.ghost_capacity = config.ghost_capacity;
  o.migrate_bytes_per_tick = config.migrate_bytes_per_tick;
  o.hysteresis_ticks = config.hysteresis_ticks;
  o.expected_blocks = trace.keys.size();
  engine::Engine e(o, std::move(policy));
  result.capacity_blocks = e.capacity_blocks();

  const bool tick = config.mode == engine::Mode::kTick;
  const bool grouped = config.hints && !trace.groups.empty();
  const uint64_t every = config.tick_steps ? config.tick_steps : 1;
  std::vector<engine::Slot> slot_of(trace.keys.size(), engine::kNoSlot);
  const auto start = std::chrono::steady_clock::now();
  uint64_t last_step = trace.events.empty() ? 0 : trace.events.front().step;
  const TraceEvent* events = trace.events.data();
  const size_t n = trace.events.size();
  // The replay is bound by cache misses on the state table, not by work: load
  // the slot index and then the state line a few events ahead.
  constexpr size_t kSlotAhead = 16, kStateAhead = 8;
  for (size_t i = 0; i < n; ++i) {
    if (i + kSlotAhead < n) __builtin_prefetch(&slot_of[events[i + kSlotAhead].key]);
    if (i + kStateAhead < n) e.Prefetch(slot_of[events[i + kStateAhead].key]);
    const TraceEvent& ev = events[i];
    if (tick && ev.step != last_step) {
      // One plan per multiple of `every` crossed; once plans stop moving
      // anything and hysteresis has run out, further plans would change nothing.
      const uint64_t plans = ev.step / every - last_step / every;
      for (uint64_t k = 0; k < plans; ++k) {
        if (e.PlanAndApply() == 0 && k > o.hysteresis_ticks) break;
      }
      last_step = ev.step;
    }
    if (ev.kind == EventKind::kHint) {
      // A hint about a group (its number in ev.key); advice the engine may ignore.
      if (config.hints) {
        e.Hint(ev.key, static_cast<engine::HintKind>(static_cast<int>(ev.obs)), ev.step);
      }
      continue;
    }
    engine::Slot& s = slot_of[ev.key];
    if (ev.kind == EventKind::kRelease) {
      if (s != engine::kNoSlot) {
        e.Release(s);
        s = engine::kNoSlot;
      }
      continue;
    }
    if (ev.kind == EventKind::kAdmit) {
      // Where the daemon found the block's pages (a tier this run lacks: its
      // last); demand mode places by touch.
      if (tick && s == engine::kNoSlot) {
        const unsigned placed = std::min(static_cast<unsigned>(ev.obs), e.tiers() - 1);
        s = e.Admit(trace.keys[ev.key], TierAt(placed));
        if (grouped) e.SetGroup(s, trace.group_of(ev.key));
      }
      continue;
    }
    if (s == engine::kNoSlot) {
      s = e.Admit(trace.keys[ev.key]);
      if (grouped) e.SetGroup(s, trace.group_of(ev.key));
    }
    e.Touch(s, engine::Touch{ev.obs, ev.step, next_use ? (*next_use)[i] : engine::kNever});
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.counters = e.counters();
  return result;
}

}  // namespace cxltier::sim
