// The tiers as the engine counts them (docs/policies.md, "More than two
// tiers"): how many there are, the blocks in each, the moves in flight into
// and out of each, and the ranking of each middle tier (tiers 1 .. N-2: the
// blocks ranked there by their heat when they entered, coldest on top, and
// its capacity in blocks). Tier 0's set is the policy's; the last tier holds
// the rest and is not ranked.
#pragma once

#include <array>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cxltier/block.h"
#include "engine/slot_heap.h"
#include "engine/types.h"

namespace cxltier::engine {

class TierTable {
 public:
  // `middle_capacity[k - 1]`: middle tier k's capacity in blocks.
  explicit TierTable(std::vector<size_t> middle_capacity)
      : count_(static_cast<unsigned>(middle_capacity.size()) + 2),
        middle_capacity_(std::move(middle_capacity)),
        middle_(middle_capacity_.size()) {
    assert(count_ <= kMaxTiers);
  }

  unsigned count() const { return count_; }
  unsigned last() const { return count_ - 1; }
  bool IsMiddle(unsigned k) const { return k >= 1 && k + 1 < count_; }
  // Middle tier k's capacity (the last tier's: SIZE_MAX). REQUIRES: k >= 1.
  size_t LowerCapacity(unsigned k) const {
    return k < last() ? middle_capacity_[k - 1] : std::numeric_limits<size_t>::max();
  }
  // The first tier below tier 0 with room in its ranking (the last if none).
  unsigned FirstLowerWithRoom() const {
    for (unsigned k = 1; IsMiddle(k); ++k) {
      if (middle_[k - 1].Size() < middle_capacity_[k - 1]) return k;
    }
    return last();
  }
  // Middle tier k's ranking. REQUIRES: IsMiddle(k).
  SlotHeap& ranking(unsigned k) { return middle_[k - 1]; }
  const SlotHeap& ranking(unsigned k) const { return middle_[k - 1]; }
  std::vector<SlotHeap>& rankings() { return middle_; }
  // Middle tier k holds more blocks in its ranking than its capacity.
  bool OverCapacity(unsigned k) const { return middle_[k - 1].Size() > middle_capacity_[k - 1]; }

  // Blocks sitting in tier k.
  size_t blocks(unsigned k) const { return blocks_[k]; }
  // A block moves from tier `from` to `to` (either kNone: admitted, released).
  void Moved(Tier from, Tier to) {
    if (from != Tier::kNone) --blocks_[TierIndex(from)];
    if (to != Tier::kNone) ++blocks_[TierIndex(to)];
  }

  // Moves planned and not completed, into and out of tier k.
  size_t in(unsigned k) const { return in_[k]; }
  size_t out(unsigned k) const { return out_[k]; }
  void StartMove(unsigned from, unsigned to) {
    ++out_[from];
    ++in_[to];
  }
  void EndMove(unsigned from, unsigned to) {
    --out_[from];
    --in_[to];
  }

  // The policy's heat epoch the rankings are keyed by: true (and remembered)
  // when `epoch` is another one.
  bool NewEpoch(uint64_t epoch) {
    if (epoch == heat_epoch_) return false;
    heat_epoch_ = epoch;
    return true;
  }
  void set_epoch(uint64_t epoch) { heat_epoch_ = epoch; }

 private:
  unsigned count_;
  std::vector<size_t> middle_capacity_;
  std::vector<SlotHeap> middle_;
  std::array<size_t, kMaxTiers> blocks_{};
  std::array<size_t, kMaxTiers> in_{};
  std::array<size_t, kMaxTiers> out_{};
  uint64_t heat_epoch_ = 0;
};

}  // namespace cxltier::engine
