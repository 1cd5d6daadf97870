// Copy mode's hand-off protocol: where a block's bytes are, and the leases
// that keep them there while a client reads or writes them.
//
// In copy mode every tier has its own pool and a block moves by copy: the
// daemon copies its bytes into a free block of the other tier's pool and then
// publishes the new place. Pages never move, so the pools may be pinned
// (cudaHostRegister, io_uring fixed buffers) or device-DAX.
//
// Two things in the client's state segment carry the protocol:
//
// * One 64-bit location word per slot (LocationWords), written by the daemon
//   except for the W bit:
//     bits  0-23  block index in the tier's pool
//     bits 24-27  tier (kNoLocationTier: the slot has no location)
//     bit  28     W: the client holds the write lease
//     bit  29     M: the daemon is copying the block
//     bits 32-63  version: bumped by the daemon at every publish
// * A lease table: kLeaseRows rows of kLeasesPerRow entries. A reader (one
//   thread) owns a row; an entry it holds names (slot, version) of the place
//   it reads, and the daemon tick at which it took it.
//
// Read lease (AcquireRead): load the word, store (slot, version) in a free
// entry, load the word again; if the place changed, retry. Release: store 0.
// Write lease (BeginWrite): set W, clearing M, in one compare-and-swap;
// EndWrite clears W. Neither waits for the daemon: the writer wins a race.
//
// A move (daemon): BeginMove sets M if W is clear; copy and verify; PublishMove
// swaps {old place, M} for {new place, version + 1}, which fails if a writer
// came since (it cleared M), and then the copy is dropped. The old place is
// reused only once no lease entry names (slot, old version): a scan after the
// publish.
//
// Why a reader never reads a reused place (all four accesses seq_cst): the
// reader stores its entry, then loads the word; the daemon swaps the word,
// then loads the entries. In the single total order of seq_cst operations,
// either the reader's store comes before the daemon's load (the daemon sees
// the entry and keeps the old place) or the daemon's swap comes before the
// reader's load (the reader sees the new version and retries). The release
// store that frees an entry, read by the daemon's scan, orders the reader's
// last read of the bytes before the daemon's next write to them. And a reader
// sees the copied bytes: the publish is a release, the reader's load an
// acquire. docs/protocol.md has the whole argument and the state machine;
// tests/lease/lease_model_test.cpp checks every interleaving of it.
#pragma once

#include <atomic>
#include <cstdint>

#include "cxltier/block.h"

namespace cxltier {

inline constexpr uint32_t kLeaseRows = 64;     // reader threads per client at once
inline constexpr uint32_t kLeasesPerRow = 32;  // leases one reader holds at once
inline constexpr uint32_t kMaxPoolIndex = (1u << 24) - 1;
inline constexpr uint8_t kNoLocationTier = 0xf;

inline constexpr uint64_t kLocIndexMask = (uint64_t{1} << 24) - 1;
inline constexpr uint64_t kLocWriting = uint64_t{1} << 28;  // W
inline constexpr uint64_t kLocMoving = uint64_t{1} << 29;   // M
inline constexpr uint64_t kLocFlags = kLocWriting | kLocMoving;

// One lease entry: 0, or (slot + 1) << 32 | version of the place read.
struct LeaseEntry {
  uint64_t held = 0;
  uint64_t since_tick = 0;  // the segment's daemon_ticks when it was taken
};
static_assert(sizeof(LeaseEntry) == 16);

struct Location {
  uint8_t tier = kNoLocationTier;
  uint32_t index = 0;
  uint32_t version = 0;
  bool has_place() const { return tier != kNoLocationTier; }
};

constexpr uint64_t LocationWord(uint8_t tier, uint32_t index, uint32_t version) {
  return uint64_t{version} << 32 | uint64_t{tier & 0xfu} << 24 | (index & kLocIndexMask);
}
constexpr Location DecodeLocation(uint64_t word) {
  return Location{static_cast<uint8_t>((word >> 24) & 0xf),
                  static_cast<uint32_t>(word & kLocIndexMask), static_cast<uint32_t>(word >> 32)};
}
// The place and version, without the W and M bits.
constexpr uint64_t PlaceOf(uint64_t word) { return word & ~(kLocFlags | (uint64_t{3} << 30)); }
constexpr uint64_t LeaseWord(uint32_t slot, uint32_t version) {
  return (uint64_t{slot} + 1) << 32 | version;
}

// ---- client side ----

// Takes a read lease on `slot` in `entry` (free: held == 0, owned by the
// calling thread). False, holding nothing, when the slot has no place (not
// admitted in copy mode). Lock-free: it retries only while the daemon
// publishes a new place for the slot, which it does at most once per move.
inline bool AcquireRead(uint64_t* words, LeaseEntry* entry, uint32_t slot, uint64_t now_tick,
                        Location* where) {
  std::atomic_ref<uint64_t> word(words[slot]);
  std::atomic_ref<uint64_t> held(entry->held);
  uint64_t seen = word.load(std::memory_order_acquire);
  for (bool stored = false;; stored = true) {
    const Location loc = DecodeLocation(seen);
    if (!loc.has_place()) {
      if (stored) held.store(0, std::memory_order_release);  // released between our loads
      return false;
    }
    std::atomic_ref<uint64_t>(entry->since_tick).store(now_tick, std::memory_order_relaxed);
    held.store(LeaseWord(slot, loc.version), std::memory_order_seq_cst);
    const uint64_t again = word.load(std::memory_order_seq_cst);
    if (PlaceOf(again) == PlaceOf(seen)) {
      *where = loc;
      return true;
    }
    seen = again;
  }
}

// Ends a read lease: after it the daemon may reuse the place.
inline void ReleaseRead(LeaseEntry* entry) {
  std::atomic_ref<uint64_t>(entry->held).store(0, std::memory_order_release);
}

enum class WriteStart { kOk, kNoPlace, kAlreadyWriting };

// Takes the write lease of `slot`, cancelling a copy in progress (the daemon
// then drops it). The place cannot change until EndWrite.
inline WriteStart BeginWrite(uint64_t* words, uint32_t slot, Location* where) {
  std::atomic_ref<uint64_t> word(words[slot]);
  uint64_t seen = word.load(std::memory_order_relaxed);
  for (;;) {
    if (!DecodeLocation(seen).has_place()) return WriteStart::kNoPlace;
    if (seen & kLocWriting) return WriteStart::kAlreadyWriting;
    if (word.compare_exchange_weak(seen, (seen | kLocWriting) & ~kLocMoving,
                                   std::memory_order_acq_rel, std::memory_order_relaxed)) {
      *where = DecodeLocation(seen);
      return WriteStart::kOk;
    }
  }
}

// Ends the write lease; false (changing nothing) when none was held.
inline bool EndWrite(uint64_t* words, uint32_t slot) {
  std::atomic_ref<uint64_t> word(words[slot]);
  return word.fetch_and(~kLocWriting, std::memory_order_release) & kLocWriting;
}

// ---- daemon side (everything the client wrote is untrusted) ----

// Publishes a place (admission, release) with no copy under way.
inline void SetLocation(uint64_t* words, uint32_t slot, uint64_t word) {
  std::atomic_ref<uint64_t>(words[slot]).store(word, std::memory_order_seq_cst);
}

// Starts a copy of the block at `expected` (the daemon's own record of its
// place). False when a write lease is held or the client changed the word.
inline bool BeginMove(uint64_t* words, uint32_t slot, uint64_t expected) {
  uint64_t want = expected;
  return std::atomic_ref<uint64_t>(words[slot])
      .compare_exchange_strong(want, expected | kLocMoving, std::memory_order_acquire,
                               std::memory_order_relaxed);
}

// Publishes the copy's place `next`. False when a writer took the lease
// during the copy (the copy must then be dropped).
inline bool PublishMove(uint64_t* words, uint32_t slot, uint64_t expected, uint64_t next) {
  uint64_t want = expected | kLocMoving;
  return std::atomic_ref<uint64_t>(words[slot])
      .compare_exchange_strong(want, next, std::memory_order_seq_cst, std::memory_order_relaxed);
}

// After a failed PublishMove: clears M (a writer usually has already).
inline void AbortMove(uint64_t* words, uint32_t slot) {
  std::atomic_ref<uint64_t>(words[slot]).fetch_and(~kLocMoving, std::memory_order_relaxed);
}

// What one lease entry holds now (0: free).
inline uint64_t ReadLease(const LeaseEntry* entry) {
  return std::atomic_ref<uint64_t>(const_cast<LeaseEntry*>(entry)->held)
      .load(std::memory_order_seq_cst);
}

}  // namespace cxltier
