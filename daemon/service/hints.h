// Scheduler hints on the daemon's side (docs/protocol.md, "Hints"): a Hint
// request's keys join the client's group, the client's pending observations
// are folded first, the engine applies the hint, a recording is told; and
// every uid's hints spend from one cost budget, so that a flood of hints
// costs its sender its own latency while everyone else is served.
//
// What a hint costs on the I/O thread is bounded by what it names, not by
// its group (docs/protocol.md, "What a hint costs"): the keys it names, a
// bounded fold, and one slice of the engine's group-wide work (the rest
// continues at the ticks, engine::EngineOptions::hint_slice_units).
//
// Thread-safety: none; the I/O thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <unordered_map>

#include "engine/engine.h"
#include "server/server.h"
#include "service/client_table.h"
#include "service/fold.h"
#include "service/recorder.h"

namespace cxltier::service {

using CostClock = std::chrono::steady_clock;

// What one uid's hints may cost, in units (docs/protocol.md, "What a hint
// costs"): 1 for the request, 1 per key named, 1 per slot of pending
// observations folded first, 1 per 64 words of dirty bitmap looked at, and
// the units of the engine's group-wide work done while answering it.
struct HintCostLimits {
  // Slots of the sender's pending observations a hint folds before it applies.
  uint64_t fold_slots = 1024;
  // Units a uid may spend at once, and per second after that.
  uint64_t burst_units = 262144;
  uint64_t units_per_second = 1048576;
};

// A bucket of cost units that fills at a steady rate up to its burst; a
// spend may take it below zero (a debt). Pure: the caller passes the time.
class CostBudget {
 public:
  CostBudget(uint64_t burst_units, uint64_t units_per_second, CostClock::time_point now)
      : burst_(static_cast<double>(burst_units)),
        rate_(static_cast<double>(units_per_second)),
        units_(burst_),
        at_(now) {}
  void Spend(uint64_t units, CostClock::time_point now) {
    Refill(now);
    units_ -= static_cast<double>(units);
  }
  // How long until the debt is paid back (zero: there is none).
  std::chrono::microseconds Wait(CostClock::time_point now) const;
  // Full again: the same as a new bucket.
  bool Full(CostClock::time_point now) const;

 private:
  void Refill(CostClock::time_point now);
  double burst_, rate_;
  double units_;  // may be negative
  CostClock::time_point at_;
};

class Hints {
 public:
  // `fold` and `recorder` outlive this.
  Hints(Fold* fold, Recorder* recorder, HintCostLimits limits = {})
      : fold_(fold), recorder_(recorder), limits_(limits) {}

  // Answers `c`'s Hint at `tick` (the tick it belongs to, as admits and
  // releases) and charges its cost to c's uid at `now`.
  Result<wire::HintOk> Handle(Client& c, const wire::Hint& m, engine::Engine& engine, uint64_t tick,
                              CostClock::time_point now);
  // How long `uid`'s connections wait before their next request is read or
  // answered: until its hints' debt is paid back (zero: none).
  std::chrono::microseconds Throttle(uid_t uid, CostClock::time_point now);

  uint64_t requests() const { return requests_; }          // Hint messages answered HintOk
  uint64_t unknown_keys() const { return unknown_keys_; }  // keys they named that were not held
  uint64_t units() const { return units_; }                // cost units they were charged
  uint64_t throttled() const { return throttled_; }        // times a uid was made to wait
  // The most units one hint cost beyond the keys it named: its fold first,
  // its bitmap and its slice of group-wide work, bounded whatever its group.
  uint64_t max_units() const { return max_units_; }
  const HintCostLimits& limits() const { return limits_; }

 private:
  Fold* fold_;
  Recorder* recorder_;
  HintCostLimits limits_;
  std::unordered_map<uid_t, CostBudget> budgets_;  // uids that spent lately
  uint64_t requests_ = 0;
  uint64_t unknown_keys_ = 0;
  uint64_t units_ = 0;
  uint64_t throttled_ = 0;
  uint64_t max_units_ = 0;
};

}  // namespace cxltier::service
