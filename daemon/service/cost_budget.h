// What a uid's requests may cost the I/O thread beyond a constant: hints
// (docs/protocol.md, "What a hint costs"), `Stats blocks` and hellos, whose
// work grows with what they name, spend from one budget per uid, so that a
// loop of them costs its sender its own latency while everyone else is
// served.
//
// Thread-safety: none; the I/O thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <unordered_map>

namespace cxltier::service {

using CostClock = std::chrono::steady_clock;

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

// Every uid's budget, in units of about 11 ns of the I/O thread's work.
struct CostLimits {
  uint64_t burst_units = 262144;        // a uid may spend at once
  uint64_t units_per_second = 1048576;  // and per second after that
};

// One CostBudget per uid that spent lately.
class UidBudgets {
 public:
  explicit UidBudgets(CostLimits limits = {}) : limits_(limits) {}

  void Spend(uid_t uid, uint64_t units, CostClock::time_point now);
  // How long `uid`'s connections wait before their next request is read or
  // answered: until its debt is paid back (zero: none).
  std::chrono::microseconds Throttle(uid_t uid, CostClock::time_point now);

  uint64_t throttled() const { return throttled_; }  // times a uid was made to wait
  const CostLimits& limits() const { return limits_; }

 private:
  CostLimits limits_;
  std::unordered_map<uid_t, CostBudget> budgets_;
  uint64_t throttled_ = 0;
};

}  // namespace cxltier::service
