// Key -> slot map: open addressing with linear probing and backward-shift
// deletion (no tombstones). One probe sequence per lookup, insert or erase;
// the table stays at most half full. Faster than std::unordered_map for the
// admit/release churn of the simulator and the daemon.
//
// An entry holds the slot and 32 bits of the key's hash, not the key: the
// key is the one its owner keeps at that slot (items[slot].key), read only
// when the hash bits match. 8 bytes an entry instead of 24: at 2 to 4
// entries a key, a uid's million keys cost 16 to 32 MiB here, not 48 to 96
// (docs/security.md, "Hostile clients"). Growing and deletion's shifts need
// no key: an entry's home comes from its hash bits.
#pragma once

#include <cstdint>
#include <vector>

#include "cxltier/block.h"
#include "engine/keyed_hash.h"
#include "engine/types.h"

namespace cxltier::engine {

template <typename Item>
class BasicKeyIndex {
 public:
  // `items`: by slot, where every slot inserted keeps its key (Item::key)
  // while it is in the index (it outlives this; hence no copies). `seed`
  // keys the hash: with a secret one (the daemon draws it at start), a client
  // cannot choose keys whose homes collide and make every probe walk one
  // long cluster (docs/security.md, "Hostile clients"); 0 in the simulator.
  explicit BasicKeyIndex(const std::vector<Item>* items, uint64_t seed = 0)
      : items_(items), seed_(seed) {
    table_.resize(16);
  }
  BasicKeyIndex(const BasicKeyIndex&) = delete;
  BasicKeyIndex& operator=(const BasicKeyIndex&) = delete;

  size_t size() const { return size_; }

  // Sizes the table for `n` keys without further growth.
  void Reserve(size_t n) {
    size_t want = table_.size();
    while (want < 2 * n) want *= 2;
    if (want > table_.size()) Rehash(want);
  }

  // Bytes of the table.
  size_t bytes() const { return table_.size() * sizeof(Entry); }

  // The longest run of occupied entries: the most probes one lookup makes.
  size_t LongestRun() const {
    size_t longest = 0, run = 0;
    for (size_t i = 0; i < 2 * table_.size(); ++i) {  // twice round: a run may wrap
      run = table_[i & mask()].slot == kNoSlot ? 0 : run + 1;
      longest = run > longest ? run : longest;
    }
    return longest < table_.size() ? longest : table_.size();
  }

  Slot Find(const BlockKey& key) const {
    const uint32_t h = Hash(key);
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      const Entry& e = table_[i];
      if (e.slot == kNoSlot) return kNoSlot;
      if (Is(e, h, key)) return e.slot;
    }
  }

  // Inserts key -> slot unless the key is present. Returns the slot now
  // stored. `slot` need not hold `key` yet (nor exist): only the slots
  // already in the index are read.
  Slot Insert(const BlockKey& key, Slot slot) {
    if (2 * (size_ + 1) > table_.size()) Grow();
    const uint32_t h = Hash(key);
    for (size_t i = h & mask();; i = (i + 1) & mask()) {
      Entry& e = table_[i];
      if (e.slot == kNoSlot) {
        e = Entry{slot, h};
        ++size_;
        return slot;
      }
      if (Is(e, h, key)) return e.slot;
    }
  }

  // Removes `key` if present.
  void Erase(const BlockKey& key) {
    const uint32_t h = Hash(key);
    size_t i = h & mask();
    for (;; i = (i + 1) & mask()) {
      if (table_[i].slot == kNoSlot) return;
      if (Is(table_[i], h, key)) break;
    }
    // Backward shift: pull later entries of the cluster into the hole when
    // their home position does not lie (cyclically) between the hole and them.
    size_t hole = i;
    for (size_t j = (hole + 1) & mask(); table_[j].slot != kNoSlot; j = (j + 1) & mask()) {
      const size_t home = table_[j].hash & mask();
      const bool stays = ((j - home) & mask()) < ((j - hole) & mask());
      if (stays) continue;
      table_[hole] = table_[j];
      hole = j;
    }
    table_[hole] = Entry{};
    --size_;
  }

 private:
  struct Entry {
    Slot slot = kNoSlot;
    uint32_t hash = 0;  // the key's Hash (its home: hash & mask)
  };

  // Past 2^32 entries the homes would crowd the table's first 2^32; slots
  // are 32 bits, so a table never holds that many.
  uint32_t Hash(const BlockKey& key) const { return static_cast<uint32_t>(KeyedHash(key, seed_)); }
  bool Is(const Entry& e, uint32_t h, const BlockKey& key) const {
    return e.hash == h && (*items_)[e.slot].key == key;
  }
  size_t mask() const { return table_.size() - 1; }

  void Grow() { Rehash(table_.size() * 2); }

  void Rehash(size_t buckets) {
    std::vector<Entry> old(buckets);
    old.swap(table_);
    size_ = 0;
    for (const Entry& e : old) {
      if (e.slot == kNoSlot) continue;
      size_t i = e.hash & mask();
      while (table_[i].slot != kNoSlot) i = (i + 1) & mask();
      table_[i] = e;
      ++size_;
    }
  }

  const std::vector<Item>* items_;
  uint64_t seed_;
  std::vector<Entry> table_;
  size_t size_ = 0;
};

using KeyIndex = BasicKeyIndex<BlockState>;

}  // namespace cxltier::engine
