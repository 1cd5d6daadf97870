// Copy mode, the daemon's side (the protocol is cxltier/lease.h): a client's
// tier pools, where each of its blocks is, and the places a move or a release
// left behind, reused once no read lease names them.
//
// The daemon keeps its own record of every place: a slot's pool and block
// (SegSlot) and its version here. It never reads a place from the segment,
// whose words the client can write; it only compares with them.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "cxltier/lease.h"
#include "cxltier/wire.h"
#include "service/client_table.h"

namespace cxltier::engine {
class Engine;
}

namespace cxltier::service {

// What a tick's drain found.
struct DrainCounts {
  uint64_t freed = 0;
  uint64_t overdue = 0;  // places newly found waiting longer than the lease timeout
};

// The word the daemon's record gives slot `seg` (no W or M).
uint64_t PlaceWord(const Client& c, uint32_t seg);

// By tier: how many more new blocks the quotas let client `c` place there
// now (the engine's room under the caps of its uid and its client account;
// UINT64_MAX where none caps it). A block admitted into tier 0 holds its
// write lease from the start, and the daemon never copies under one: were
// it placed over a cap, nothing could move it down while the client kept
// the lease. So new blocks go over no cap.
using TierRoom = std::array<uint64_t, kMaxTiers>;
TierRoom AdmitRoom(const Client& c, const engine::Engine& engine);
// An admit of `fresh` new blocks into `c`'s tier pools: kLimit unless its
// pools have that many free places in tiers its quotas let it fill.
Status CheckCopyRoom(const Client& c, uint64_t fresh, const engine::Engine& engine);
// A free place for a new block: pool `preferred`'s tier when it has room
// (its pool a free block, `room` a block to spare), else the nearest slower
// tier's pool with room, else the nearest faster one's. Takes one of the
// tier's `room`. kLimit when no pool has room.
Status PlaceNew(Client& c, uint32_t preferred, TierRoom& room, uint32_t* pool, uint32_t* index);
// After Bind of a block at a new place: publishes it, write lease held (the
// client fills the block, then EndWrite).
void PublishAdmitted(Client& c, uint32_t seg);
// Before Unbind: the slot shows no place, and its place drains (kept for the
// mover while a copy of that place is in flight). False when
// the client still held the block's write lease (its writer may still
// write the place: the client's own bug, for the caller to warn about).
// `keep_word` (the client left, the daemon stops): the segment's word keeps
// the last place, for the client's readers and its reconnect; nothing drains.
bool Retire(Client& c, uint32_t seg, uint64_t tick, bool keep_word);
// A copy of slot `seg`'s block at its place now (the daemon's version) is
// handed to the mover.
void CopyStarted(Client& c, uint32_t seg);
// A copy of slot `seg`'s block at `version` came back: its source may drain
// (once no other copy of that place is in flight).
void CopyReturned(Client& c, uint32_t seg, uint32_t version);
// A place to reuse once no lease names (seg, version).
void AddDrain(Client& c, uint32_t seg, uint32_t version, uint32_t pool, uint32_t index,
              uint64_t tick);
// Frees the places no lease names any more (one scan of the lease table).
DrainCounts DrainPlaces(Client& c, uint64_t tick, uint64_t timeout_ticks);
// Free blocks over the client's tier pools; with `room`, only as many in a
// tier as the quotas leave there (what PlaceNew may fill).
uint64_t FreePlaces(const Client& c);
uint64_t FreePlaces(const Client& c, const TierRoom& room);

}  // namespace cxltier::service
