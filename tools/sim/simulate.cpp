#include "simulate.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <span>

#include "cxltier/model.h"

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

Result<SimResult> Simulate(const Trace& trace, const SimConfig& config,
                           const std::vector<uint64_t>* next_use) {
  const auto bad = [](std::string why) {
    return Status::Fail(wire::ErrorCode::kBadPayload, std::move(why));
  };
  SimResult result;
  result.config = config;
  auto made = engine::MakePolicy(config.policy);
  if (!made.ok()) return made.status();
  std::unique_ptr<engine::Policy> policy = std::move(*made);
  if (config.block_bytes == 0) {
    return bad("block bytes must be positive");
  }
  if (policy->NeedsFuture() && (!next_use || next_use->size() != trace.events.size())) {
    return bad("policy " + config.policy + " needs the future of the trace");
  }
  if (config.lower_budget_bytes.size() + 2 > kMaxTiers) {
    return bad("at most " + std::to_string(kMaxTiers) + " tiers");
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
  o.landing_percent = config.landing_percent;
  o.hint_slice_units = config.hint_slice_units;
  o.expected_blocks = trace.keys.size();
  const bool tick = config.mode == engine::Mode::kTick;
  const bool recorded = config.recorded_moves;
  if (recorded) {
    if (!tick) {
      return bad("--moves recorded replays the daemon's tick plans: it needs --mode tick");
    }
    if (!trace.recorded_moves) {
      return bad(trace.name +
                 ": records no plans or move outcomes (only a cxltierctl record of a daemon that "
                 "records them does, trace format version 3): replay it with --moves instant");
    }
    if (policy->NeedsFuture()) {
      return bad("policy " + config.policy +
                 " was never the daemon's: --moves recorded replays the daemon's plans with its "
                 "policy; use --moves instant");
    }
  }
  engine::Engine e(o, std::move(policy));
  result.capacity_blocks = e.capacity_blocks();
  // A policy that chooses a leader (shards) changes it where the daemon's did.
  if (recorded) e.FollowRecordedLeaders();

  const bool grouped = config.hints && !trace.groups.empty();
  const uint64_t every = config.tick_steps ? config.tick_steps : 1;
  std::vector<engine::Slot> slot_of(trace.keys.size(), engine::kNoSlot);
  // --moves recorded: the trace key of each engine slot, and the move the
  // replay planned for each key and was not told the outcome of yet.
  std::vector<uint32_t> key_of_slot;
  std::vector<engine::Move> pending;
  if (recorded) pending.assign(trace.keys.size(), engine::Move{engine::kNoSlot, 0, {}, {}});
  const auto admit = [&](uint32_t key, engine::Slot s) {
    if (grouped) e.SetGroup(s, trace.group_of(key));
    if (!recorded) return;
    if (s >= key_of_slot.size()) key_of_slot.resize(s + 1, 0);
    key_of_slot[s] = key;
  };
  const auto diverged = [&](size_t i, const std::string& what) {
    return bad(trace.name + ": event " + std::to_string(i) + " (step " +
               std::to_string(trace.events[i].step) + "): " + what +
               ". The replay no longer follows the recording: --moves recorded needs the daemon's "
               "policy and settings (the command cxltierctl record prints), a recording begun "
               "before the traffic it replays, and a policy that does not hash keys (tinylfu, "
               "adaptive, whose experts include it, and the default shards while tinylfu leads "
               "may part from the daemon); "
               "--moves instant replays any of them");
  };
  // A leader event (kind 9) naming a candidate the replay's policy lacks.
  const auto no_candidate = [&](size_t i) {
    return diverged(i, "the daemon's policy had candidate " + std::to_string(trace.events[i].key) +
                           " as its leader; the replay's policy (" + config.policy +
                           ") has no such candidate to follow");
  };
  const auto start = std::chrono::steady_clock::now();
  uint64_t last_step = trace.events.empty() ? 0 : trace.events.front().step;
  const TraceEvent* events = trace.events.data();
  const size_t n = trace.events.size();
  // The replay is bound by cache misses on the state table, not by work: load
  // the slot index and then the state line a few events ahead.
  constexpr size_t kSlotAhead = 16, kStateAhead = 8;
  // --moves recorded: the policy's leader changes the replay has made.
  uint64_t changes = 0;
  for (size_t i = 0; i < n; ++i) {
    // (A plan's, a hint's or a held count's key is no key index: bounded.)
    if (i + kSlotAhead < n && events[i + kSlotAhead].key < slot_of.size()) {
      __builtin_prefetch(&slot_of[events[i + kSlotAhead].key]);
    }
    if (i + kStateAhead < n && events[i + kStateAhead].key < slot_of.size()) {
      e.Prefetch(slot_of[events[i + kStateAhead].key]);
    }
    const TraceEvent& ev = events[i];
    if (IsMoveEvent(ev.kind)) {
      // The daemon's moves, when it made them; the what-if replay plans its own.
      if (!recorded) continue;
      if (ev.kind == EventKind::kPlan) {
        if (ev.obs > 0) {
          e.set_migrate_bytes_per_tick(static_cast<uint64_t>(ev.obs) * o.block_bytes);
        }
        const std::span<const engine::Move> moves = e.Plan();
        if (moves.size() != ev.key) {
          return diverged(i, "the daemon planned " + std::to_string(ev.key) +
                                 " moves here, the replay " + std::to_string(moves.size()));
        }
        for (const engine::Move& m : moves) pending[key_of_slot[m.slot]] = m;
      } else if (ev.kind == EventKind::kOutcome) {
        engine::Move& m = pending[ev.key];
        if (m.slot == engine::kNoSlot) {
          return diverged(i, "the daemon completed a move of a block the replay has no move of");
        }
        e.Complete(m, ev.obs == 1.0f);
        m.slot = engine::kNoSlot;
      } else if (ev.kind == EventKind::kHeld) {
        e.set_held_blocks(ev.key);
      } else if (ev.kind == EventKind::kLeader) {
        // Opening the trace: the leader when the recording began. Right
        // after a touch: that touch changed the leader (the replay was told
        // before it). Nowhere else (Trace::Validate refuses it too).
        if (i == 0) {
          if (!e.FollowLeader(ev.key, /*now=*/true)) return no_candidate(i);
        } else if (events[i - 1].kind != EventKind::kTouch) {
          return diverged(i, "a leader change that neither opens the trace nor follows a touch");
        } else if (e.policy().Leader() != ev.key || e.policy().LeaderChanges() != changes + 1) {
          return diverged(i, "the daemon's policy made candidate " + std::to_string(ev.key) +
                                 " its leader here, the replay's " +
                                 (e.policy().LeaderChanges() == changes
                                      ? std::string("did not change its leader")
                                      : "has candidate " + std::to_string(e.policy().Leader())));
        }
        changes = e.policy().LeaderChanges();
      } else {  // kRelocated
        if (slot_of[ev.key] == engine::kNoSlot) {
          return diverged(i, "the daemon relocated a block the replay does not hold");
        }
        const unsigned tier = std::min(static_cast<unsigned>(ev.obs), e.tiers() - 1);
        e.Relocated(slot_of[ev.key], TierAt(tier));
      }
      continue;
    }
    // The engine's clock: the daemon's, for a recording.
    const uint64_t now = trace.first_tick + ev.step;
    if (tick && !recorded && ev.step != last_step) {
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
        e.Hint(ev.key, static_cast<engine::HintKind>(static_cast<int>(ev.obs)), now);
      }
      continue;
    }
    engine::Slot& s = slot_of[ev.key];
    if (ev.kind == EventKind::kRelease) {
      if (s != engine::kNoSlot) {
        e.Release(s);
        s = engine::kNoSlot;
      }
      // A move of the block released: the engine would ignore its outcome,
      // and the daemon records none.
      if (recorded) pending[ev.key].slot = engine::kNoSlot;
      continue;
    }
    if (ev.kind == EventKind::kAdmit) {
      // Where the daemon found the block's pages (a tier this run lacks: its
      // last); demand mode places by touch.
      if (tick && s == engine::kNoSlot) {
        const unsigned placed = std::min(static_cast<unsigned>(ev.obs), e.tiers() - 1);
        s = e.Admit(trace.keys[ev.key], TierAt(placed));
        admit(ev.key, s);
      }
      continue;
    }
    if (ev.kind == EventKind::kPlace) {
      // A block the daemon's engine placed: this engine places it.
      if (tick && s == engine::kNoSlot) {
        s = e.Admit(trace.keys[ev.key]);
        admit(ev.key, s);
        if (recorded && TierIndex(e.state(s).tier) != static_cast<unsigned>(ev.obs)) {
          return diverged(i, "the daemon placed this block in tier " +
                                 std::to_string(static_cast<unsigned>(ev.obs)) +
                                 ", the replay in " + std::to_string(TierIndex(e.state(s).tier)));
        }
      }
      continue;
    }
    if (s == engine::kNoSlot) {
      s = e.Admit(trace.keys[ev.key]);
      admit(ev.key, s);
    }
    // The daemon's policy changed its leader at this touch (the next event
    // says so): so does the replay's, at the same point of the touch.
    const bool told = recorded && i + 1 < n && events[i + 1].kind == EventKind::kLeader;
    if (told && !e.FollowLeader(events[i + 1].key, /*now=*/false)) return no_candidate(i + 1);
    e.Touch(s, engine::Touch{ev.obs, now, next_use ? (*next_use)[i] : engine::kNever});
    // The replay's changed only where told.
    if (recorded && !told && e.policy().LeaderChanges() != changes) {
      return diverged(i, "the replay's policy changed its leader here, the daemon's did not");
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.counters = e.counters();
  if (const auto view = engine::ViewShards(e.policy())) {
    result.shards_leader = view->leader_name;
    result.shards_switches = view->switches;
  }
  return result;
}

std::optional<uint64_t> BudgetBytes(std::string_view spec, size_t distinct_blocks,
                                    uint64_t block_bytes) {
  if (!spec.ends_with('%')) return ParseSize(spec);
  spec.remove_suffix(1);
  double pct = 0;
  const auto [end, ec] = std::from_chars(spec.data(), spec.data() + spec.size(), pct);
  if (ec != std::errc{} || end != spec.data() + spec.size() || !(pct > 0) || pct > 100) {
    return std::nullopt;
  }
  const auto blocks = static_cast<uint64_t>(pct / 100.0 * static_cast<double>(distinct_blocks));
  return std::max<uint64_t>(blocks, 1) * block_bytes;
}

}  // namespace cxltier::sim
