// A trace made to fit a pool of N blocks, as a serving engine's KV cache
// does: when a block must be admitted and all N are taken, the engine frees
// its least recently touched block (a release event, at the same step). The
// result is what every arm replays and what cxltier-sim is given, so every
// arm and the simulator see the same admissions and releases. Hints (and
// the keys' groups) are kept as they are; the daemon's recorded moves are not.
#pragma once

#include <cstdint>

#include "trace.h"

namespace cxltier::replay {

struct FitStats {
  uint64_t forced_releases = 0;  // releases added because the pool was full
  uint32_t max_live = 0;         // most blocks live at once (<= pool blocks)
  uint64_t admissions = 0;       // touches of a block not live (first or after a release)
  uint64_t readmissions = 0;     // of those, keys that were live before
};

// REQUIRES: pool_blocks >= 1.
sim::Trace FitToPool(const sim::Trace& trace, uint32_t pool_blocks, FitStats* stats);

}  // namespace cxltier::replay
