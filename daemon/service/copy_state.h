// Copy mode's record of one client (a member of Client): its tier pools, the
// version of each slot's place, the copies in flight and the places left to
// drain. The functions that work on it are in copy_mode.h.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "cxltier/block.h"

namespace cxltier::service {

struct CopyState {
  CopyState() { pool.fill(-1); }
  std::array<int32_t, kMaxTiers> pool;  // by tier: index in Client::pools, -1: none yet
  std::vector<uint32_t> version;        // by segment slot: the version last published
  // By segment slot: the tick a move was first refused because the client
  // held the write lease (0: not refused), and whether that was counted overdue.
  std::vector<uint64_t> write_refused_since;
  std::vector<uint8_t> write_overdue;
  // By segment slot: copies of its block in flight (the mover reads the
  // source place until the copy comes back); 0 spares a release the search
  // of in_flight.
  std::vector<uint8_t> copying;
  // By segment slot: released keeping its word (its client left, or the
  // daemon stops; Retire). The word names the block's last place, readers
  // may still take leases there, and nothing may free it: a copy that
  // publishes after such a release leaves its new place in the word.
  std::vector<uint8_t> word_kept;
  // Every copy in flight: (segment slot, version of the place it reads). A
  // slot released and admitted again while a copy of its first place runs
  // has a copy in flight that does not read its new place.
  struct Copying {
    uint32_t seg = 0;
    uint32_t version = 0;
    bool operator==(const Copying&) const = default;
  };
  std::vector<Copying> in_flight;
  // A place no block is at any more, kept until no lease names (slot, version).
  struct Drain {
    uint32_t seg = 0;
    uint32_t version = 0;
    uint32_t pool = 0;
    uint32_t index = 0;
    uint64_t since_tick = 0;
    bool overdue = false;      // counted as a lease held too long
    bool mover_reads = false;  // the source of a copy still running: kept until it is back
  };
  std::vector<Drain> draining;

  bool on() const {
    for (int32_t p : pool) {
      if (p >= 0) return true;
    }
    return false;
  }
};

}  // namespace cxltier::service
