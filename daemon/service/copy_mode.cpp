#include "service/copy_mode.h"

#include <algorithm>
#include <atomic>

#include "engine/engine.h"
#include "service/client_table.h"

namespace cxltier::service {

using wire::Error;
using wire::ErrorCode;

uint64_t PlaceWord(const Client& c, uint32_t seg) {
  const SegSlot& s = c.slots[seg];
  return LocationWord(c.pools[s.pool].tier(), s.block, c.copy.version[seg]);
}

TierRoom AdmitRoom(const Client& c, const engine::Engine& engine) {
  TierRoom room;
  for (unsigned t = 0; t < room.size(); ++t) {
    const size_t r = engine.CapRoom(c.peer.uid, c.account, t);
    room[t] = r == engine::kNoCap ? UINT64_MAX : r;
  }
  return room;
}

Status CheckCopyRoom(const Client& c, uint64_t fresh, const engine::Engine& engine) {
  const uint64_t free = FreePlaces(c);
  const uint64_t may = FreePlaces(c, AdmitRoom(c, engine));
  if (fresh <= may) return Status::Ok();
  return Error{ErrorCode::kLimit,
               "admitting " + std::to_string(fresh) + " blocks needs more than the " +
                   std::to_string(may) + " free blocks of this client's tier pools" +
                   (may < free ? " that its quota lets it fill (" + std::to_string(free - may) +
                                     " more are in tiers its uid's or its client's cap has full)"
                               : "")};
}

Status PlaceNew(Client& c, uint32_t preferred, TierRoom& room, uint32_t* pool, uint32_t* index) {
  const int first = c.pools[preferred].tier();
  const int n = static_cast<int>(c.copy.pool.size());
  // first, first + 1, ..., n - 1, then first - 1, ..., 0
  for (int i = 0; i < n; ++i) {
    const int t = first + i < n ? first + i : n - 1 - i;
    const int32_t p = c.copy.pool[static_cast<size_t>(t)];
    if (p >= 0 && room[t] > 0 && c.pools[p].TakeFree(index)) {
      if (room[t] != UINT64_MAX) --room[t];
      *pool = static_cast<uint32_t>(p);
      return Status::Ok();
    }
  }
  return Error{ErrorCode::kLimit,
               "every block of this client's tier pools holds a block, or is in a tier its quota "
               "caps"};
}

void PublishAdmitted(Client& c, uint32_t seg) {
  ++c.copy.version[seg];
  c.copy.word_kept[seg] = 0;
  c.copy.write_refused_since[seg] = 0;
  c.copy.write_overdue[seg] = 0;
  SetLocation(c.segment.locations(), seg, PlaceWord(c, seg) | kLocWriting);
}

bool Retire(Client& c, uint32_t seg, uint64_t tick, bool keep_word) {
  // The client left, or the daemon stops: the word keeps the last place it
  // was given. Its bytes stay there (nothing is punched, and the pools go
  // with the client, so nothing reuses the place), readers may go on reading
  // them, and a reconnect re-admits the block where the word says. A copy
  // still running may yet publish its new place there (CompleteCopy).
  if (keep_word) {
    c.copy.word_kept[seg] = 1;
    return true;
  }
  const SegSlot& s = c.slots[seg];
  AddDrain(c, seg, c.copy.version[seg], s.pool, s.block, tick);
  // Only a copy of this place keeps it: one of an earlier admission of the
  // slot reads another place, and its return clears only that one.
  const auto& f = c.copy.in_flight;
  c.copy.draining.back().mover_reads =
      c.copy.copying[seg] > 0 &&
      std::find(f.begin(), f.end(), CopyState::Copying{seg, c.copy.version[seg]}) != f.end();
  ++c.copy.version[seg];
  const uint64_t was = std::atomic_ref<uint64_t>(c.segment.locations()[seg])
                           .exchange(LocationWord(kNoLocationTier, 0, c.copy.version[seg]),
                                     std::memory_order_seq_cst);
  return !(was & kLocWriting);
}

void CopyStarted(Client& c, uint32_t seg) {
  ++c.copy.copying[seg];
  c.copy.in_flight.push_back({seg, c.copy.version[seg]});
}

void CopyReturned(Client& c, uint32_t seg, uint32_t version) {
  if (c.copy.copying[seg] > 0) --c.copy.copying[seg];
  auto& f = c.copy.in_flight;
  const CopyState::Copying me{seg, version};
  if (auto it = std::find(f.begin(), f.end(), me); it != f.end()) {
    *it = f.back();
    f.pop_back();
  }
  if (std::find(f.begin(), f.end(), me) != f.end()) return;  // another copy still reads it
  for (CopyState::Drain& d : c.copy.draining) {
    if (d.seg == seg && d.version == version) d.mover_reads = false;
  }
}

void AddDrain(Client& c, uint32_t seg, uint32_t version, uint32_t pool, uint32_t index,
              uint64_t tick) {
  c.copy.draining.push_back(CopyState::Drain{seg, version, pool, index, tick, false});
}

DrainCounts DrainPlaces(Client& c, uint64_t tick, uint64_t timeout_ticks) {
  DrainCounts n;
  if (c.copy.draining.empty()) return n;
  // Every lease held now, once: the entries are the client's, so each is
  // only a (slot, version) to look up, never an index.
  std::vector<uint64_t> held;
  const LeaseEntry* table = c.segment.leases();
  for (uint32_t i = 0; i < kLeaseRows * kLeasesPerRow; ++i) {
    if (const uint64_t w = ReadLease(&table[i])) held.push_back(w);
  }
  std::sort(held.begin(), held.end());
  auto& d = c.copy.draining;
  size_t keep = 0;
  for (size_t i = 0; i < d.size(); ++i) {
    CopyState::Drain& e = d[i];
    if (!e.mover_reads &&
        !std::binary_search(held.begin(), held.end(), LeaseWord(e.seg, e.version))) {
      c.pools[e.pool].PutFree(e.index);
      ++n.freed;
      continue;
    }
    if (!e.overdue && tick - e.since_tick > timeout_ticks) {
      e.overdue = true;
      ++n.overdue;
    }
    d[keep++] = e;
  }
  d.resize(keep);
  return n;
}

uint64_t FreePlaces(const Client& c) {
  TierRoom all;
  all.fill(UINT64_MAX);
  return FreePlaces(c, all);
}

uint64_t FreePlaces(const Client& c, const TierRoom& room) {
  uint64_t n = 0;
  for (size_t t = 0; t < c.copy.pool.size(); ++t) {
    const int32_t p = c.copy.pool[t];
    if (p >= 0) n += std::min<uint64_t>(c.pools[p].free_blocks(), room[t]);
  }
  return n;
}

}  // namespace cxltier::service
