// The per-client shared-memory state segment: a header page, then one 64-byte
// BlockState slot per block. The daemon creates it (a sealed memfd) and passes
// the fd with HelloOk; the client maps it read-write.
//
// The client writes only pending_touches and pending_mass_bits, with atomics;
// the daemon swaps them to zero when it folds them into scores each tick, and
// writes score, touch time, touch count, tier and flags back for the client to
// read. Everything the client writes is untrusted by the daemon.
#pragma once

#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>

#include "cxltier/block.h"

namespace cxltier {

inline constexpr uint32_t kSegmentMagic = 0x47455343;  // "CSEG"
inline constexpr uint32_t kSegmentVersion = 1;
inline constexpr uint32_t kSegmentSlotOffset = 4096;  // slot 0 starts on the second page

struct SegmentHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t slot_offset;
  uint64_t client_id;
  uint64_t daemon_ticks;  // the daemon bumps it after every fold (relaxed)
};
static_assert(sizeof(SegmentHeader) <= kSegmentSlotOffset);

inline constexpr uint64_t SegmentBytes(uint32_t slots) {
  return kSegmentSlotOffset + uint64_t{slots} * sizeof(BlockState);
}

// Client side: adds one observation of `mass` to a slot. Lock-free, no syscall.
inline void AddObservation(BlockState* slot, float mass) {
  std::atomic_ref<uint32_t>(slot->pending_touches).fetch_add(1, std::memory_order_relaxed);
  std::atomic_ref<uint32_t> bits(slot->pending_mass_bits);
  uint32_t old = bits.load(std::memory_order_relaxed);
  for (;;) {
    const float sum = std::bit_cast<float>(old) + mass;
    if (bits.compare_exchange_weak(old, std::bit_cast<uint32_t>(sum), std::memory_order_release,
                                   std::memory_order_relaxed)) {
      return;
    }
  }
}

// Daemon side: takes what the client left in a slot and zeroes it.
struct PendingObservation {
  uint32_t touches;
  float mass;
};
inline PendingObservation TakeObservation(BlockState* slot) {
  const uint32_t touches =
      std::atomic_ref<uint32_t>(slot->pending_touches).exchange(0, std::memory_order_acquire);
  const uint32_t bits =
      std::atomic_ref<uint32_t>(slot->pending_mass_bits).exchange(0, std::memory_order_acquire);
  return {touches, std::bit_cast<float>(bits)};
}

// Reads the tier the daemon last wrote into a slot.
inline Tier ReadTier(const BlockState* slot) {
  return std::atomic_ref<Tier>(const_cast<BlockState*>(slot)->tier).load(std::memory_order_relaxed);
}

// Daemon side: publishes a slot's tier.
inline void WriteTier(BlockState* slot, Tier tier) {
  std::atomic_ref<Tier>(slot->tier).store(tier, std::memory_order_relaxed);
}

}  // namespace cxltier
