#include "service/fold.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <utility>

#include "cxltier/segment.h"

namespace cxltier::service {

namespace {
// Slots folded together, their cache lines prefetched first.
constexpr size_t kFoldBatch = 32;
}  // namespace

wire::ReportOk AddReport(Client& c, const wire::Report& m) {
  wire::ReportOk ok;
  for (const wire::Observation& o : m.observations) {
    if (o.slot >= c.slots.size() || !c.slots[o.slot].live || !std::isfinite(o.mass) || o.mass < 0) {
      ++ok.rejected;
      continue;
    }
    // Kept here, not in the segment: the client is the segment's only writer.
    ++c.slots[o.slot].socket_touches;
    c.slots[o.slot].socket_mass += o.mass;
    c.socket_dirty[o.slot / 64] |= uint64_t{1} << (o.slot % 64);
    ++ok.accepted;
  }
  c.bad_observations += ok.rejected;
  return ok;
}

void WriteBack(const engine::Engine& engine, Client& c, uint32_t seg) {
  BlockState* slot = c.segment.slot(seg);
  const BlockState& st = engine.state(c.slots[seg].engine_slot);
  slot->score = st.score;
  slot->touch_time = st.touch_time;
  slot->touch_count = st.touch_count;
  slot->touch_seq = st.touch_seq;
  slot->flags = st.flags;
  slot->generation = st.generation;
  server::WriteTier(slot, st.tier);
}

namespace {

// Whether the client's totals moved since the fold last took them.
bool Moved(const server::ClientTotals& now, const FoldState& f) {
  return now.touches != f.seen_touches || now.mass_q16 != f.seen_mass_q16;
}

// The live slots of bitmap word `w` whose client totals moved since the
// last fold: a full fold's slots to fold besides the dirty ones (a lost
// dirty-bit race). It reads the segment's lines and the fold states in
// order and nothing else, so a full fold costs about one read of the table
// (folding every live slot, with the prefetches of every engine line, took
// LFU's average tick at 1M slots, 1% touched, from 4.1 to 6.2 ms). A slot
// it leaves out is one FoldSlot would leave as it is: its totals have not
// moved, and a slot with socket reports has its socket dirty bit.
uint64_t MovedTotals(Client& c, uint32_t w, uint32_t n) {
  uint64_t moved = 0;
  const uint32_t end = std::min(n, (w + 1) * 64);
  for (uint32_t i = w * 64; i < end; ++i) {
    if (c.live_slots[i] && Moved(server::ReadTotals(c.segment.slot(i)), c.fold[i])) {
      moved |= uint64_t{1} << (i - w * 64);
    }
  }
  return moved;
}

}  // namespace

void Fold::Run(Client& c, engine::Engine& engine, uint64_t tick) {
  const bool full = tick % kFullFoldTicks == 0;
  const uint32_t n = static_cast<uint32_t>(c.slots.size());
  uint64_t* dirty = c.segment.dirty();
  batch_.clear();
  for (uint32_t w = 0; w < c.socket_dirty.size(); ++w) {
    uint64_t bits = server::TakeDirty(dirty, w) | std::exchange(c.socket_dirty[w], 0);
    if (full) bits |= MovedTotals(c, w, n);
    while (bits) {
      const uint32_t i = w * 64 + static_cast<uint32_t>(std::countr_zero(bits));
      bits &= bits - 1;
      if (i >= n || !c.live_slots[i]) continue;
      batch_.push_back(i);
      if (batch_.size() == kFoldBatch) FoldBatch(c, engine, tick);
    }
  }
  FoldBatch(c, engine, tick);
}

Fold::Pending Fold::RunPending(Client& c, engine::Engine& engine, uint64_t tick,
                               uint64_t max_slots) {
  Pending done;
  const uint32_t n = static_cast<uint32_t>(c.slots.size());
  uint64_t* dirty = c.segment.dirty();
  batch_.clear();
  for (uint32_t w = 0; w < c.socket_dirty.size() && done.slots < max_slots; ++w) {
    ++done.words;
    uint64_t bits = server::TakeDirty(dirty, w) | std::exchange(c.socket_dirty[w], 0);
    while (bits) {
      const uint32_t i = w * 64 + static_cast<uint32_t>(std::countr_zero(bits));
      bits &= bits - 1;
      // Counted whether live or not: the client sets the bits, and a bit
      // of a free slot costs its look as a live one's does.
      ++done.slots;
      if (i >= n || !c.live_slots[i]) continue;
      batch_.push_back(i);
      if (batch_.size() == kFoldBatch) FoldBatch(c, engine, tick);
    }
  }
  FoldBatch(c, engine, tick);
  return done;
}

// The slots are scattered over the segment, the client table and the
// engine's states, so their lines are asked for first, all of them, and the
// misses overlap instead of coming one by one.
void Fold::FoldBatch(Client& c, engine::Engine& engine, uint64_t tick) {
  for (uint32_t i : batch_) {
    __builtin_prefetch(c.segment.slot(i), 1);
    __builtin_prefetch(&c.fold[i], 1);
    __builtin_prefetch(&c.slots[i], 1);
  }
  for (uint32_t i : batch_) engine.Prefetch(c.slots[i].engine_slot);
  for (uint32_t i : batch_) FoldSlot(c, engine, tick, i);
  batch_.clear();
}

// The client's totals only grow (modulo 2^32); the fold takes the difference.
void Fold::FoldSlot(Client& c, engine::Engine& engine, uint64_t tick, uint32_t i) {
  FoldState& f = c.fold[i];
  SegSlot& s = c.slots[i];
  const server::ClientTotals now = server::ReadTotals(c.segment.slot(i));
  if (!Moved(now, f) && s.socket_touches == 0) return;
  const uint32_t shm_touches = now.touches - f.seen_touches;
  const double shm_mass = static_cast<double>(now.mass_q16 - f.seen_mass_q16) / kMassUnit;
  f.seen_touches = now.touches;
  f.seen_mass_q16 = now.mass_q16;
  const uint64_t touches = uint64_t{shm_touches} + s.socket_touches;
  double mass = shm_mass + s.socket_mass;
  s.socket_touches = 0;
  s.socket_mass = 0;
  // Totals that jump implausibly are counted and folded as nothing.
  if (touches == 0 || touches > kMaxTouchesPerTick ||
      mass > static_cast<double>(touches) * kMaxObservationMass) {
    ++c.bad_observations;
    if (touches == 0 || touches > kMaxTouchesPerTick) return;
    mass = 0;
  }
  c.observations += touches;
  // The engine folds the mass as a recording holds it (a float), so that
  // the exact replay of a recording (cxltier-sim --moves recorded) folds the
  // very same.
  mass = static_cast<float>(mass);
  const bool hit = engine.Touch(s.engine_slot, engine::Touch{mass, tick, engine::kNever});
  if (recorder_ && recorder_->on()) {
    // Its group too: a block may have joined it before the recording began.
    recorder_->Touch(tick, c.peer.uid, engine.state(s.engine_slot).key, mass, hit,
                     engine.group(s.engine_slot));
    // Right after its touch: the touch that changed the policy's leader.
    recorder_->Leader(tick, engine.policy().LeaderChanges(), engine.policy().Leader());
  }
  WriteBack(engine, c, i);
}

}  // namespace cxltier::service
