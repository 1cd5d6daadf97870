// A client's shared-memory state segment: a sealed memfd holding a header
// page and 64-byte BlockState slots, mapped here and in the client.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include <memory>

#include "cxltier/segment.h"
#include "cxltier/status.h"
#include "numa/migrator.h"
#include "server/unique_fd.h"

namespace cxltier::server {

class Segment {
 public:
  Segment() = default;
  Segment(Segment&& o) noexcept = default;
  Segment& operator=(Segment&& o) noexcept = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates a memfd of SegmentBytes(slots), seals its size, maps it and writes
  // the header. kInternal when the kernel refuses.
  Status Create(uint32_t slots, uint64_t client_id);

  int fd() const { return fd_.get(); }
  uint32_t slots() const { return slots_; }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  // REQUIRES: i < slots().
  BlockState* slot(uint32_t i) const {
    return reinterpret_cast<BlockState*>(static_cast<char*>(base_) + kSegmentSlotOffset) + i;
  }
  uint64_t* dirty() const {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(base_) + SegmentDirtyOffset(slots_));
  }
  // Copy mode: the location words and the lease table (cxltier/lease.h).
  uint64_t* locations() const {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(base_) + SegmentLocationOffset(slots_));
  }
  const LeaseEntry* leases() const {
    return reinterpret_cast<const LeaseEntry*>(static_cast<char*>(base_) +
                                               SegmentLeaseOffset(slots_));
  }
  // Keeps the segment mapped (a copy in flight holds it).
  const std::shared_ptr<const numa::Mapping>& mapping() const { return mapping_; }

 private:
  UniqueFd fd_;
  std::shared_ptr<const numa::Mapping> mapping_;
  void* base_ = nullptr;
  uint32_t slots_ = 0;
};

// The daemon's side of the segment protocol (the client's side, and the
// memory-ordering argument, are in cxltier/segment.h).

// Daemon side: takes (and clears) one word of the dirty bitmap.
inline uint64_t TakeDirty(uint64_t* dirty, uint32_t word) {
  std::atomic_ref<uint64_t> w(dirty[word]);
  // A load first: most words are zero, and an exchange would dirty their line.
  if (w.load(std::memory_order_relaxed) == 0) return 0;
  return w.exchange(0, std::memory_order_acquire);
}

// Daemon side: what the client's running totals say now.
struct ClientTotals {
  uint32_t touches;
  uint32_t mass_q16;
};
inline ClientTotals ReadTotals(BlockState* slot) {
  const uint32_t touches =
      std::atomic_ref<uint32_t>(slot->client_touches).load(std::memory_order_acquire);
  const uint32_t mass =
      std::atomic_ref<uint32_t>(slot->client_mass_q16).load(std::memory_order_relaxed);
  return {touches, mass};
}

// Daemon side: publishes a slot's tier.
inline void WriteTier(BlockState* slot, Tier tier) {
  std::atomic_ref<Tier>(slot->tier).store(tier, std::memory_order_relaxed);
}

}  // namespace cxltier::server
