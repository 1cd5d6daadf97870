// Key -> slot map: open addressing with linear probing and backward-shift
// deletion (no tombstones). One probe sequence per lookup, insert or erase;
// the table stays at most half full. Faster than std::unordered_map for the
// admit/release churn of the simulator and the daemon.
#pragma once

#include <cstdint>
#include <vector>

#include "cxltier/block.h"
#include "engine/types.h"

namespace cxltier::engine {

class KeyIndex {
 public:
  KeyIndex() { table_.resize(16); }

  size_t size() const { return size_; }

  // Sizes the table for `n` keys without further growth.
  void Reserve(size_t n) {
    size_t want = table_.size();
    while (want < 2 * n) want *= 2;
    if (want > table_.size()) Rehash(want);
  }

  Slot Find(const BlockKey& key) const {
    for (size_t i = Home(key);; i = (i + 1) & mask()) {
      const Entry& e = table_[i];
      if (e.slot == kNoSlot) return kNoSlot;
      if (e.key == key) return e.slot;
    }
  }

  // Inserts key -> slot unless the key is present. Returns the slot now stored.
  Slot Insert(const BlockKey& key, Slot slot) {
    if (2 * (size_ + 1) > table_.size()) Grow();
    for (size_t i = Home(key);; i = (i + 1) & mask()) {
      Entry& e = table_[i];
      if (e.slot == kNoSlot) {
        e = Entry{key, slot};
        ++size_;
        return slot;
      }
      if (e.key == key) return e.slot;
    }
  }

  // Removes `key` if present.
  void Erase(const BlockKey& key) {
    size_t i = Home(key);
    for (;; i = (i + 1) & mask()) {
      if (table_[i].slot == kNoSlot) return;
      if (table_[i].key == key) break;
    }
    // Backward shift: pull later entries of the cluster into the hole when
    // their home position does not lie (cyclically) between the hole and them.
    size_t hole = i;
    for (size_t j = (hole + 1) & mask(); table_[j].slot != kNoSlot; j = (j + 1) & mask()) {
      const size_t home = Home(table_[j].key);
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
    BlockKey key;
    Slot slot = kNoSlot;
  };

  size_t mask() const { return table_.size() - 1; }
  size_t Home(const BlockKey& key) const { return static_cast<size_t>(HashKey(key)) & mask(); }

  void Grow() { Rehash(table_.size() * 2); }

  void Rehash(size_t buckets) {
    std::vector<Entry> old(buckets);
    old.swap(table_);
    size_ = 0;
    for (const Entry& e : old) {
      if (e.slot != kNoSlot) Insert(e.key, e.slot);
    }
  }

  std::vector<Entry> table_;
  size_t size_ = 0;
};

}  // namespace cxltier::engine
