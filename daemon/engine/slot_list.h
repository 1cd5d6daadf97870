// Intrusive doubly-linked lists over slots. A slot is in at most one of the
// lists of one SlotLists at a time, so one prev/next pair per slot serves
// them all (ARC's T1/T2/B1/B2, S3-FIFO's S/M/G, ...). All operations O(1).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

#include "types.h"

namespace cxltier::engine {

class SlotLists {
 public:
  static constexpr uint8_t kNoList = 0xff;

  explicit SlotLists(int lists)
      : heads_(lists, kNoSlot), tails_(lists, kNoSlot), sizes_(lists, 0) {}

  // Which list `s` is in, or kNoList.
  uint8_t ListOf(Slot s) const { return s < which_.size() ? which_[s] : kNoList; }
  bool Contains(int list, Slot s) const { return ListOf(s) == list; }
  size_t Size(int list) const { return sizes_[list]; }
  // Front = most recently pushed with PushFront (MRU / queue head).
  Slot Front(int list) const { return heads_[list]; }
  // Back = least recently pushed (LRU / queue tail).
  Slot Back(int list) const { return tails_[list]; }
  // The neighbour of `s` towards the front, or kNoSlot.
  Slot Prev(Slot s) const { return prev_[s]; }
  // The neighbour of `s` towards the back, or kNoSlot.
  Slot Next(Slot s) const { return next_[s]; }

  // REQUIRES: `s` is in no list.
  void PushFront(int list, Slot s) {
    Ensure(s);
    assert(which_[s] == kNoList);
    which_[s] = static_cast<uint8_t>(list);
    prev_[s] = kNoSlot;
    next_[s] = heads_[list];
    if (heads_[list] != kNoSlot) prev_[heads_[list]] = s;
    heads_[list] = s;
    if (tails_[list] == kNoSlot) tails_[list] = s;
    ++sizes_[list];
  }

  // Removes `s` from whatever list holds it; no-op if none.
  void Remove(Slot s) {
    const uint8_t list = ListOf(s);
    if (list == kNoList) return;
    if (prev_[s] != kNoSlot) {
      next_[prev_[s]] = next_[s];
    } else {
      heads_[list] = next_[s];
    }
    if (next_[s] != kNoSlot) {
      prev_[next_[s]] = prev_[s];
    } else {
      tails_[list] = prev_[s];
    }
    prev_[s] = next_[s] = kNoSlot;
    which_[s] = kNoList;
    --sizes_[list];
  }

  void MoveToFront(int list, Slot s) {
    Remove(s);
    PushFront(list, s);
  }

  // Removes and returns the back of `list`, or kNoSlot when empty.
  Slot PopBack(int list) {
    const Slot s = tails_[list];
    if (s != kNoSlot) Remove(s);
    return s;
  }

 private:
  void Ensure(Slot s) {
    if (s >= which_.size()) {
      const size_t n = std::max<size_t>(s + 1, which_.size() * 2);
      which_.resize(n, kNoList);
      prev_.resize(n, kNoSlot);
      next_.resize(n, kNoSlot);
    }
  }

  std::vector<Slot> heads_, tails_;
  std::vector<size_t> sizes_;
  std::vector<uint8_t> which_;
  std::vector<Slot> prev_, next_;
};

}  // namespace cxltier::engine
