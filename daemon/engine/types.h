// Vocabulary types of the placement engine. Pure: standard library only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "cxltier/block.h"

namespace cxltier::engine {

// Index of a block's state in the engine's table. Stable while the block is
// admitted; reused (with a new generation) after it is released.
using Slot = uint32_t;
inline constexpr Slot kNoSlot = std::numeric_limits<Slot>::max();

// "Never touched again": the next-use hint of a block with no future touch.
inline constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

// What happens to a block's score state when it leaves the policy's tier-0 set.
enum class Persistence {
  kReset,    // dropped: the block re-enters as new (classic in-cache policies)
  kPersist,  // kept by identity, and kept as a ghost after release
};

enum class Mode {
  kDemand,  // a touch outside tier 0 promotes the block at once (cache semantics)
  kTick,    // touches only score; a planner migrates every N steps (daemon semantics)
};

// Clock units from `then` to `now`, 0 when `then` is ahead of `now`. Every
// difference of the engine's clock against a stored time goes through it: a
// stored time can be ahead (a checkpoint of a clock that restarted, a state
// from another clock), and the unsigned difference would wrap to ~2^64.
constexpr uint64_t Elapsed(uint64_t now, uint64_t then) { return now > then ? now - then : 0; }

// A touch time moved on by a pause of `idle_for` (a soon hint), never past `now`
// nor back, and never wrapping.
constexpr uint64_t Resumed(uint64_t time, uint64_t idle_for, uint64_t now) {
  return time + std::min(idle_for, Elapsed(now, time));
}

// One touch of one block, as the engine sees it.
struct Touch {
  double obs = 1.0;            // aggregated observation (attention mass); finite, >= 0
  uint64_t now = 0;            // the engine's clock: the daemon's tick, the simulator's step
  uint64_t next_use = kNever;  // clock of the block's next touch; only MIN reads it
  // A soon hint's placement (Engine::Hint), not a touch: the block's state
  // counts nothing, and the policy sees a miss with nothing observed.
  bool ahead = false;
};

// Grows a per-slot table so that `s` is a valid index; new entries are
// `fill`. The capacity at least doubles (slots handed out one by one cost
// amortised O(1)), but only [0, s] is written: a million-slot table's
// spare half stays untouched address space, not memory. Filling the whole
// doubled table, as this once did, cost one uid at 2^20 + 8 slots 260
// bytes a block more (docs/security.md, "Hostile clients").
template <typename T>
void GrowFor(std::vector<T>& table, Slot s, const T& fill = T{}) {
  if (s < table.size()) return;
  if (s >= table.capacity()) table.reserve(std::max<size_t>(size_t{s} + 1, table.capacity() * 2));
  table.resize(size_t{s} + 1, fill);
}

// Room for `n` entries in a per-slot table without writing any (capacity
// only), at least doubling it: a table reserved for this many slots is not
// copied again until they are used, and a run of reservations that each ask
// a little more copies the table O(log n) times, not once each.
template <typename T>
void ReserveFor(std::vector<T>& table, size_t n) {
  if (n > table.capacity()) table.reserve(std::max(n, table.capacity() * 2));
}

// An entry of `items` for reuse: the last freed index, else a new one at the
// end. The caller resets the entry.
template <typename T>
uint32_t TakeEntry(std::vector<T>& items, std::vector<uint32_t>& free) {
  if (free.empty()) {
    items.emplace_back();
    return static_cast<uint32_t>(items.size() - 1);
  }
  const uint32_t index = free.back();
  free.pop_back();
  return index;
}

}  // namespace cxltier::engine
