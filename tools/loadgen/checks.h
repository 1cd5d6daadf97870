// cxltier-loadgen's checks: what the process and the kernel say (open fds,
// mapped state segments, pgmigrate_success, where each live block's pages
// are), the bytes of every block, and the list of the checks that failed.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "copy_mode.h"
#include "session.h"
#include "workload.h"

namespace cxltier::loadgen {

// /proc/vmstat's pgmigrate_success: the kernel's page migrations.
uint64_t PgmigrateSuccess();
// Open file descriptors of this process, and mappings of state segments:
// what a reconnect must not leak.
size_t CountFds();
size_t CountSegmentMaps();

// Every byte of every block, whatever moved (copy mode: of the generation
// last written; an older one is a lost write or a stale copy published).
struct Verified {
  uint64_t corrupt = 0, verified = 0, stale = 0;
  CheckCounts seen;  // copy mode: what the reader and writer threads saw
};

// Where the kernel says each live block's pages are, against the tier the
// daemon published (never our own bookkeeping).
struct Placement {
  uint64_t checked = 0, mismatches = 0, kernel_fast = 0, kernel_slow = 0;
  std::vector<uint64_t> kernel_by_tier;  // blocks all on their tier's nodes
  bool same_nodes = false;               // a one-node test setup: no way to tell
};

// Everything the summary reports and the checks judge.
struct Results {
  WorkloadCounts counts;
  double seconds = 0;
  uint64_t blocks_fast = 0, blocks_slow = 0;  // live blocks in tier 0, in any tier below
  Placement placement;
  uint64_t pgmigrate = 0;  // this run's share of pgmigrate_success
  Verified verified;
  nlohmann::json mig_after;  // the daemon's migration totals at the end
};

// Counts the live blocks the daemon published in tier 0 and below.
void CountLiveTiers(const Session& s, Results* r);
// With --check-placement (after the daemon is quiet): asks the kernel.
Placement CheckPlacement(Session& s);
// The checks that failed, each a sentence; `out` is the JSON summary.
std::vector<std::string> FailedChecks(Session& s, const Results& r, const nlohmann::json& out);

}  // namespace cxltier::loadgen
