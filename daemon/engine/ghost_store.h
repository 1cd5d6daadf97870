// The ghost store: states of blocks that are not resident anywhere, kept by key
// so a re-admitted block gets its score back. Bounded twice: a global capacity,
// and a share per owner (an opaque id; the daemon passes the client's uid) so
// that one owner releasing a million blocks cannot push out anyone else's ghosts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "cxltier/block.h"
#include "engine/key_index.h"

namespace cxltier::engine {

class GhostStore {
 public:
  // `capacity`: ghosts kept in all (0: none). `capacity_per_owner`: ghosts one
  // owner may keep (0: no cap of its own; the global capacity alone bounds it).
  // `key_hash_seed` keys its key index (EngineOptions::key_hash_seed).
  explicit GhostStore(size_t capacity, size_t capacity_per_owner = 0, uint64_t key_hash_seed = 0);

  // Keeps `state` under `key` as `owner`'s newest ghost, replacing an older ghost
  // of the same key (whoever owned it). Then, if `owner` holds more than its
  // share, its own oldest ghost goes; else, if the store holds more than its
  // capacity, the oldest ghost of the owner with the most ghosts goes (of
  // several such owners, the one whose oldest ghost is oldest). So a put costs
  // another owner a ghost only if that owner holds at least as many as the one
  // putting. Returns true if a ghost was pushed out. O(log owners).
  bool Put(const BlockKey& key, const BlockState& state, uint32_t owner = 0);

  // Removes and returns the ghost of `key`, if there is one (whoever owns it).
  std::optional<BlockState> Take(const BlockKey& key);

  bool Contains(const BlockKey& key) const { return index_.Find(key) != kNoSlot; }
  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }
  size_t capacity_per_owner() const { return capacity_per_owner_; }
  // Ghosts `owner` holds now.
  size_t owner_size(uint32_t owner) const;
  // Owners holding at least one ghost.
  size_t owners() const { return owners_.size(); }
  // Ghosts pushed out by their owner's own share (the rest by the capacity).
  uint64_t dropped_by_owner_cap() const { return dropped_by_owner_cap_; }

  // Oldest first, over all owners: fn(const BlockState&, uint32_t owner). For
  // checkpoints: putting them back in this order rebuilds the same store.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (uint32_t n = oldest_; n != kNil; n = links_[n].next) fn(states_[n], links_[n].owner);
  }

 private:
  static constexpr uint32_t kNil = kNoSlot;

  // One ghost's place in the global order and in its owner's order (both
  // oldest to newest), by node; the ghost's state sits in states_ at the same index.
  struct Link {
    uint32_t prev = kNil, next = kNil;              // global order
    uint32_t owner_prev = kNil, owner_next = kNil;  // its owner's order
    uint32_t owner = 0;
    uint64_t put_seq = 0;  // global age, for the tie between equally large owners
  };
  // Owners ranked for eviction at the capacity: most ghosts first, then the
  // oldest oldest-ghost.
  struct Rank {
    size_t size;
    uint64_t oldest_seq;
    uint32_t owner;
    friend bool operator<(const Rank& a, const Rank& b) {
      if (a.size != b.size) return a.size > b.size;
      if (a.oldest_seq != b.oldest_seq) return a.oldest_seq < b.oldest_seq;
      return a.owner < b.owner;
    }
  };
  struct Owner {
    uint32_t oldest = kNil, newest = kNil;
    size_t size = 0;
    std::set<Rank>::iterator rank;  // valid once ranked
    bool ranked = false;
  };

  void Remove(uint32_t node);  // unlinks, unindexes and frees one ghost
  void Rerank(uint32_t owner, Owner& o);

  size_t capacity_;
  size_t capacity_per_owner_;
  std::vector<BlockState> states_;  // by node
  std::vector<Link> links_;         // by node
  std::vector<uint32_t> free_nodes_;
  uint32_t oldest_ = kNil, newest_ = kNil;
  uint64_t put_seq_ = 0;
  KeyIndex index_;  // key -> node (states_[node].key)
  std::unordered_map<uint32_t, Owner> owners_;
  std::set<Rank> ranks_;  // one per owner in owners_
  uint64_t dropped_by_owner_cap_ = 0;
};

}  // namespace cxltier::engine
