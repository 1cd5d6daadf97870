// The per-client shared-memory state segment: a header page, one 64-byte
// BlockState slot per block, a dirty bitmap (one bit per slot), then copy
// mode's location words (8 bytes per slot) and lease table (cxltier/lease.h).
// The daemon creates it (a sealed memfd) and passes the fd with HelloOk; the
// client maps it read-write.
//
// The client writes only client_touches and client_mass_q16: running totals
// that only it writes (one writer per slot), with plain relaxed stores, so an
// observation costs no atomic read-modify-write and no syscall. Each tick the
// daemon reads them and folds the difference from what it saw last time
// (modulo 2^32). It writes score, touch time, touch count, tier and flags
// back for the client to read. Everything the client writes is untrusted.
//
// The dirty bitmap spares the daemon a scan of every slot each tick: after
// updating a slot's totals the client sets the slot's bit (an atomic OR, only
// when the bit is not already set), and the daemon takes each word with an
// atomic exchange and folds only the slots whose bits were set. A bit the
// client saw set just before the daemon cleared it can leave the newest totals
// unfolded until the slot's next observation; the daemon also scans every slot
// every few ticks, so nothing waits longer than that. The bitmap is a hint:
// a bit set without new totals folds nothing.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "cxltier/block.h"
#include "cxltier/lease.h"

namespace cxltier {

inline constexpr uint32_t kSegmentMagic = 0x47455343;  // "CSEG"
inline constexpr uint32_t kSegmentVersion = 3;
inline constexpr uint32_t kSegmentSlotOffset = 4096;  // slot 0 starts on the second page

struct SegmentHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t slot_offset;
  uint64_t client_id;
  uint64_t daemon_ticks;  // the daemon's tick from the hello on, bumped after every fold (relaxed)
  uint64_t dirty_offset;  // byte offset of the dirty bitmap: SegmentDirtyOffset(slots)
  uint64_t location_offset;  // SegmentLocationOffset(slots): one word per slot
  uint64_t lease_offset;     // SegmentLeaseOffset(slots): kLeaseRows x kLeasesPerRow entries
};
static_assert(sizeof(SegmentHeader) <= kSegmentSlotOffset);

inline constexpr uint64_t SegmentDirtyOffset(uint32_t slots) {
  return kSegmentSlotOffset + uint64_t{slots} * sizeof(BlockState);
}
inline constexpr uint32_t SegmentDirtyWords(uint32_t slots) { return (slots + 63) / 64; }
inline constexpr uint64_t SegmentLocationOffset(uint32_t slots) {
  const uint64_t end = SegmentDirtyOffset(slots) + uint64_t{SegmentDirtyWords(slots)} * 8;
  return (end + 63) / 64 * 64;
}
inline constexpr uint64_t SegmentLeaseOffset(uint32_t slots) {
  return (SegmentLocationOffset(slots) + uint64_t{slots} * 8 + 4095) / 4096 * 4096;
}
inline constexpr uint64_t SegmentBytes(uint32_t slots) {
  return SegmentLeaseOffset(slots) + uint64_t{kLeaseRows} * kLeasesPerRow * sizeof(LeaseEntry);
}

// Observation masses are fixed point: 1/65536 units, at most kMaxObservationMass.
inline constexpr float kMaxObservationMass = 65535.0f;
inline constexpr double kMassUnit = 65536.0;

// Client side: adds one observation of `mass` to a slot. No syscall, no atomic
// read-modify-write: REQUIRES one writer thread per slot. Returns false (and
// writes nothing) for a mass that is NaN, infinite or negative.
inline bool AddObservation(BlockState* slot, float mass) {
  if (!(mass >= 0.0f) || !(mass <= kMaxObservationMass)) return false;
  const uint32_t q = static_cast<uint32_t>(mass * static_cast<float>(kMassUnit) + 0.5f);
  std::atomic_ref<uint32_t> mass_total(slot->client_mass_q16);
  std::atomic_ref<uint32_t> touches(slot->client_touches);
  mass_total.store(mass_total.load(std::memory_order_relaxed) + q, std::memory_order_relaxed);
  // Release: a daemon that sees the new count also sees the mass added before it.
  touches.store(touches.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  return true;
}

// Client side: marks slot i dirty. The OR is skipped when the bit is already
// set, so a slot observed many times per tick pays for one atomic.
inline void MarkDirty(uint64_t* dirty, uint32_t i) {
  std::atomic_ref<uint64_t> word(dirty[i / 64]);
  const uint64_t bit = uint64_t{1} << (i % 64);
  if ((word.load(std::memory_order_relaxed) & bit) == 0)
    word.fetch_or(bit, std::memory_order_release);
}

// Client side: AddObservation into slots[i], then MarkDirty.
inline bool AddObservation(BlockState* slots, uint64_t* dirty, uint32_t i, float mass) {
  if (!AddObservation(&slots[i], mass)) return false;
  MarkDirty(dirty, i);
  return true;
}

// Reads the tier the daemon last wrote into a slot.
inline Tier ReadTier(const BlockState* slot) {
  return std::atomic_ref<Tier>(const_cast<BlockState*>(slot)->tier).load(std::memory_order_relaxed);
}

}  // namespace cxltier
