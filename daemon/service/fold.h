// The observation fold: what clients observed since the last tick becomes one
// engine Touch per block. A client observes a block by adding to its slot's
// running totals in the shared segment and setting the slot's dirty bit
// (cxltier/segment.h), or by a socket Report. Each tick the fold takes the
// dirty bits, reads the totals of the marked slots, checks that the difference
// is plausible (the client is not trusted), touches the engine and writes the
// engine's state back into the slot. It needs a client table entry and an
// engine, nothing else: no socket, no io_context, no state directory.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/engine.h"
#include "server/server.h"
#include "service/client_table.h"
#include "service/recorder.h"

namespace cxltier::service {

// More observations than this for one block in one tick is not a real client.
inline constexpr uint64_t kMaxTouchesPerTick = 1u << 20;
// Every this many ticks the fold reads every live slot's totals, not only the
// dirty ones': the bound on how long a dirty-bit race can leave totals unfolded.
inline constexpr uint64_t kFullFoldTicks = 10;

// A socket Report: each plausible observation is kept on its slot until the
// next fold; the others are counted as rejected (and as bad observations).
wire::ReportOk AddReport(Client& c, const wire::Report& m);

// Publishes the engine's state of the block at `c`'s live segment slot `seg`
// (score, touch time and count, flags, generation, tier) in the segment.
void WriteBack(const engine::Engine& engine, Client& c, uint32_t seg);

class Fold {
 public:
  // `recorder`, when given, is told of every touch the fold makes (it outlives the fold).
  explicit Fold(Recorder* recorder = nullptr) : recorder_(recorder) {}

  // Folds what `c` observed into `engine` as touches at `tick`: the dirty
  // slots, and when `tick` is a multiple of kFullFoldTicks every live slot
  // whose totals moved without a dirty bit.
  void Run(Client& c, engine::Engine& engine, uint64_t tick);

  // What RunPending did.
  struct Pending {
    uint64_t words = 0;  // words of the dirty bitmaps looked at
    uint64_t slots = 0;  // dirty bits taken (slots folded, and free slots' bits dropped)
  };
  // Before a hint (docs/protocol.md, "Hints"): folds `c`'s dirty slots, in
  // slot order, until at least `max_slots` dirty bits were taken (a bitmap
  // word is taken whole: up to 63 more; a free slot's bit counts too) or
  // none is left. Never every live slot (the
  // tick's full fold); what it leaves is folded by the next tick.
  Pending RunPending(Client& c, engine::Engine& engine, uint64_t tick, uint64_t max_slots);

 private:
  void FoldBatch(Client& c, engine::Engine& engine, uint64_t tick);
  void FoldSlot(Client& c, engine::Engine& engine, uint64_t tick, uint32_t seg);

  Recorder* recorder_;
  std::vector<uint32_t> batch_;  // segment slots to fold, their lines prefetched first
};

}  // namespace cxltier::service
