// cxltier-loadgen's page mode (--pool memfd or range): one pool of this
// process, filled with a known pattern, registered with the daemon, which
// moves its blocks' pages between nodes; every byte is checked at the end.
#pragma once

#include "checks.h"
#include "session.h"

namespace cxltier::loadgen {

// Each of these gives 0, or the exit code of a failure (Fail's).

// Maps the pool. THP off: a huge page spanning two blocks would make them
// move together.
int MapPagePool(Session& s);
// Registers the pool with the daemon (after Session::Connect).
int RegisterPagePool(Session& s);
// Fills every block with its pattern: after RegisterPagePool, as a serving
// engine writes its KV bytes into a pool it registered. A memfd pool's pages
// are then first faulted where the daemon's policy for the file puts them
// (the last tier), and the admits find them there.
void FillPagePool(Session& s);
// --pin: pins the pool with io_uring fixed buffers.
int PinPagePool(Session& s);
// Checks every word of every block against its pattern.
void VerifyPagePool(const Session& s, Verified* v);

}  // namespace cxltier::loadgen
