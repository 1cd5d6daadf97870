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

#include "engine/engine.h"
#include "server/server.h"
#include "service/client_table.h"
#include "service/cost_budget.h"
#include "service/fold.h"
#include "service/recorder.h"

namespace cxltier::service {

// What one hint may fold first: slots of the sender's pending observations
// (docs/protocol.md, "What a hint costs").
inline constexpr uint64_t kHintFoldSlots = 1024;

class Hints {
 public:
  // `fold`, `recorder` and `budgets` outlive this.
  Hints(Fold* fold, Recorder* recorder, UidBudgets* budgets)
      : fold_(fold), recorder_(recorder), budgets_(budgets) {}

  // Answers `c`'s Hint at `tick` (the tick it belongs to, as admits and
  // releases) and charges its cost to c's uid's budget at `now`: 1 for the
  // request, 1 per key named, 1 per slot of pending observations folded
  // first, 1 per 64 words of dirty bitmap looked at, and the units of the
  // engine's group-wide work done while answering it.
  Result<wire::HintOk> Handle(Client& c, const wire::Hint& m, engine::Engine& engine, uint64_t tick,
                              CostClock::time_point now);
  uint64_t requests() const { return requests_; }          // Hint messages answered HintOk
  uint64_t unknown_keys() const { return unknown_keys_; }  // keys they named that were not held
  uint64_t units() const { return units_; }                // cost units they were charged
  // The most units one hint cost beyond the keys it named: its fold first,
  // its bitmap and its slice of group-wide work, bounded whatever its group.
  uint64_t max_units() const { return max_units_; }

 private:
  Fold* fold_;
  Recorder* recorder_;
  UidBudgets* budgets_;
  uint64_t requests_ = 0;
  uint64_t unknown_keys_ = 0;
  uint64_t units_ = 0;
  uint64_t max_units_ = 0;
};

}  // namespace cxltier::service
