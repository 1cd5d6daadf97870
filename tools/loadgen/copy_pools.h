// cxltier-loadgen's copy mode (--pool copy), the driver's side: the daemon
// makes a pool per tier and moves blocks by copying them; the loadgen writes
// each block it admits under the write lease the Admit gives (workload.cpp)
// and checks blocks under read leases. The reader and writer threads, the
// block format and pinning are copy_mode.h's (which the Python tests' pool
// reader builds on its own, so it knows nothing of a Session).
#pragma once

#include "checks.h"
#include "session.h"

namespace cxltier::loadgen {

// Each of these gives 0, or the exit code of a failure (Fail's).

// Has the daemon create the tier pools (after Session::Connect) and counts
// their pages off their tier's nodes.
int CreateTierPools(Session& s);
// --pin: pins every tier pool but a device-DAX one, counting the pages off
// their tier's nodes again after.
int PinTierPools(Session& s);
// Stops the reader and writer threads (their counts in v->seen) and checks
// every live block under a read lease: whole, of its key, and of the
// generation last written.
int VerifyCopyBlocks(Session& s, Verified* v);

}  // namespace cxltier::loadgen
