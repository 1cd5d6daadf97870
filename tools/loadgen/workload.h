// cxltier-loadgen's workload: cxltier-sim's attention workload, sized so
// every live key fits the pool, and its replay against the daemon (admits,
// releases, touches and hints), pass after pass while a --until-* condition
// is not met.
#pragma once

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "attention_workload.h"
#include "session.h"

namespace cxltier::loadgen {

// Set by SIGUSR1 with --until-signal: the workload ends, the checks still run.
extern volatile sig_atomic_t g_stop_requested;
void RequestStop(int);

struct Workload {
  sim::Trace trace;
  // Each group's keys (Trace::groups), for the hints.
  std::unordered_map<uint32_t, std::vector<uint32_t>> group_keys;
};

// What the replay did.
struct WorkloadCounts {
  uint64_t touches = 0, hits = 0, dropped = 0, admitted = 0, released = 0, restored = 0;
  uint64_t passes = 1;
  uint64_t hints_sent = 0, hints_applied = 0, hint_keys_grouped = 0, hint_keys_unknown = 0;
  uint64_t hint_events_skipped = 0;
  std::chrono::steady_clock::time_point start;  // when the replay began
};

// Generates the trace (and the session's trace keys); 0, or Fail's exit code.
int MakeWorkload(Session& s, Workload* w);
// Replays it until it is done (or stopped); 0, or Fail's exit code.
int ReplayWorkload(Session& s, const Workload& w, WorkloadCounts* counts);

}  // namespace cxltier::loadgen
