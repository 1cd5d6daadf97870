#include "engine/ghost_store.h"

#include <algorithm>
#include <cassert>

namespace cxltier::engine {

// Nodes are 32-bit with kNil as the end marker, so at most kNil - 1 ghosts (one
// more than the capacity exists for a moment during a Put).
GhostStore::GhostStore(size_t capacity, size_t capacity_per_owner, uint64_t key_hash_seed)
    : capacity_(std::min<size_t>(capacity, kNil - 2)),
      capacity_per_owner_(capacity_per_owner),
      index_(&states_, key_hash_seed) {}

size_t GhostStore::owner_size(uint32_t owner) const {
  auto it = owners_.find(owner);
  return it == owners_.end() ? 0 : it->second.size;
}

void GhostStore::Rerank(uint32_t owner, Owner& o) {
  const Rank r{o.size, links_[o.oldest].put_seq, owner};
  if (!o.ranked) {
    o.rank = ranks_.insert(r).first;
    o.ranked = true;
    return;
  }
  // Reuses the set's node: no allocation per Put or Take.
  auto handle = ranks_.extract(o.rank);
  handle.value() = r;
  o.rank = ranks_.insert(std::move(handle)).position;
}

bool GhostStore::Put(const BlockKey& key, const BlockState& state, uint32_t owner) {
  if (capacity_ == 0) return false;
  if (const uint32_t old = index_.Find(key); old != kNil) Remove(old);

  uint32_t n;
  if (!free_nodes_.empty()) {
    n = free_nodes_.back();
    free_nodes_.pop_back();
  } else {
    n = static_cast<uint32_t>(states_.size());
    states_.emplace_back();
    links_.emplace_back();
  }
  states_[n] = state;
  states_[n].key = key;
  Link& l = links_[n];
  l = Link{};
  l.owner = owner;
  l.put_seq = ++put_seq_;
  l.prev = newest_;
  if (newest_ != kNil) links_[newest_].next = n;
  newest_ = n;
  if (oldest_ == kNil) oldest_ = n;
  index_.Insert(key, n);

  Owner& o = owners_[owner];  // references into an unordered_map survive rehashing
  l.owner_prev = o.newest;
  if (o.newest != kNil) links_[o.newest].owner_next = n;
  o.newest = n;
  if (o.oldest == kNil) o.oldest = n;
  ++o.size;
  Rerank(owner, o);

  if (capacity_per_owner_ != 0 && o.size > capacity_per_owner_) {
    // o.size >= 2 here, so its oldest is not the ghost just put.
    Remove(o.oldest);
    ++dropped_by_owner_cap_;
    return true;
  }
  if (index_.size() > capacity_) {
    Remove(owners_.at(ranks_.begin()->owner).oldest);
    return true;
  }
  return false;
}

std::optional<BlockState> GhostStore::Take(const BlockKey& key) {
  const uint32_t n = index_.Find(key);
  if (n == kNil) return std::nullopt;
  BlockState s = states_[n];
  Remove(n);
  return s;
}

void GhostStore::Remove(uint32_t n) {
  const Link l = links_[n];
  (l.prev != kNil ? links_[l.prev].next : oldest_) = l.next;
  (l.next != kNil ? links_[l.next].prev : newest_) = l.prev;

  auto it = owners_.find(l.owner);
  assert(it != owners_.end());
  Owner& o = it->second;
  (l.owner_prev != kNil ? links_[l.owner_prev].owner_next : o.oldest) = l.owner_next;
  (l.owner_next != kNil ? links_[l.owner_next].owner_prev : o.newest) = l.owner_prev;
  if (--o.size == 0) {
    ranks_.erase(o.rank);
    owners_.erase(it);
  } else {
    Rerank(l.owner, o);
  }

  index_.Erase(states_[n].key);
  free_nodes_.push_back(n);
}

}  // namespace cxltier::engine
