// The pace of the daemon's plans (docs/operations.md, "Migration pace"): a
// plan's byte budget follows what the mover gets done, so that the moves in
// flight (which count against tier 0's room, docs/policies.md) stay about
// one tick's work. A plan is made only once the mover has finished the last
// one; when it had not by the next tick, the budget halves (once a plan); when
// it had, and that plan used at least half its budget, the budget doubles.
// Always between two blocks (a promotion and its demotion) and the cap.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace cxltier::service {

class PlanPace {
 public:
  // At a tick, with `pending` jobs at the mover: whether to plan now. `cap`:
  // the configured budget of a tick; `floor`: two blocks. REQUIRES floor <= cap.
  bool Ready(size_t pending, uint64_t cap, uint64_t floor) {
    // Start at the cap; follow a lowered cap, and a raised floor (a new
    // block size: a budget under one block would plan nothing, ever).
    budget_ = std::clamp(budget_ == 0 ? cap : budget_, floor, cap);
    if (pending > 0) {
      if (!late_) budget_ = std::max(floor, budget_ / 2);
      late_ = true;
      return false;
    }
    if (!late_ && planned_ >= budget_ / 2) budget_ = std::min(cap, budget_ * 2);
    late_ = false;
    return true;
  }
  // The plan made after Ready() said yes moves `bytes`.
  void Planned(uint64_t bytes) { planned_ = bytes; }
  // The next plan's budget (0 before the first Ready()).
  uint64_t budget() const { return budget_; }

 private:
  uint64_t budget_ = 0;
  uint64_t planned_ = 0;
  bool late_ = false;  // a tick found the mover still busy since the last plan
};

}  // namespace cxltier::service
