#include "service/cost_budget.h"

#include <algorithm>
#include <cmath>

namespace cxltier::service {

void CostBudget::Refill(CostClock::time_point now) {
  if (now <= at_) return;
  const double seconds = std::chrono::duration<double>(now - at_).count();
  units_ = std::min(burst_, units_ + seconds * rate_);
  at_ = now;
}

std::chrono::microseconds CostBudget::Wait(CostClock::time_point now) const {
  const double seconds = now > at_ ? std::chrono::duration<double>(now - at_).count() : 0.0;
  const double have = units_ + seconds * rate_;
  if (have >= 0 || rate_ <= 0) return std::chrono::microseconds(0);
  return std::chrono::microseconds(static_cast<int64_t>(std::ceil(-have / rate_ * 1e6)));
}

bool CostBudget::Full(CostClock::time_point now) const {
  const double seconds = now > at_ ? std::chrono::duration<double>(now - at_).count() : 0.0;
  return units_ + seconds * rate_ >= burst_;
}

void UidBudgets::Spend(uid_t uid, uint64_t units, CostClock::time_point now) {
  budgets_.try_emplace(uid, limits_.burst_units, limits_.units_per_second, now)
      .first->second.Spend(units, now);
}

std::chrono::microseconds UidBudgets::Throttle(uid_t uid, CostClock::time_point now) {
  const auto it = budgets_.find(uid);
  if (it == budgets_.end()) return std::chrono::microseconds(0);
  const std::chrono::microseconds wait = it->second.Wait(now);
  if (wait.count() > 0) {
    ++throttled_;
  } else if (it->second.Full(now)) {
    budgets_.erase(it);  // as a new one would be: no need to keep it
  }
  return wait;
}

}  // namespace cxltier::service
