// Intrusive doubly-linked lists over slots. A slot is in at most one of the
// lists of one SlotLists at a time, so one prev/next pair per slot serves
// them all (ARC's T1/T2/B1/B2, S3-FIFO's S/M/G, ...). All operations O(1).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

#include "engine/types.h"

namespace cxltier::engine {

class SlotLists {
 public:
  static constexpr uint8_t kNoList = 0xff;

  explicit SlotLists(int lists)
      : heads_(lists, kNoSlot), tails_(lists, kNoSlot), sizes_(lists, 0) {}

  // Which list `s` is in, or kNoList.
  uint8_t ListOf(Slot s) const { return s < links_.size() ? links_[s].which : kNoList; }
  void Prefetch(Slot s) const {
    if (s < links_.size()) __builtin_prefetch(&links_[s], 1);
  }
  bool Contains(int list, Slot s) const { return ListOf(s) == list; }
  size_t Size(int list) const { return sizes_[list]; }
  // Front = most recently pushed with PushFront (MRU / queue head).
  Slot Front(int list) const { return heads_[list]; }
  // Back = least recently pushed (LRU / queue tail).
  Slot Back(int list) const { return tails_[list]; }
  // The neighbour of `s` towards the front, or kNoSlot.
  Slot Prev(Slot s) const { return links_[s].prev; }
  // The neighbour of `s` towards the back, or kNoSlot.
  Slot Next(Slot s) const { return links_[s].next; }

  void Reserve(size_t n) { ReserveFor(links_, n); }

  // REQUIRES: `s` is in no list.
  void PushFront(int list, Slot s) {
    Ensure(s);
    Link& l = links_[s];
    assert(l.which == kNoList);
    l.which = static_cast<uint8_t>(list);
    l.prev = kNoSlot;
    l.next = heads_[list];
    if (heads_[list] != kNoSlot) links_[heads_[list]].prev = s;
    heads_[list] = s;
    if (tails_[list] == kNoSlot) tails_[list] = s;
    ++sizes_[list];
  }

  // Removes `s` from whatever list holds it; no-op if none.
  void Remove(Slot s) {
    if (s >= links_.size() || links_[s].which == kNoList) return;
    Link& l = links_[s];
    const uint8_t list = l.which;
    if (l.prev != kNoSlot) {
      links_[l.prev].next = l.next;
    } else {
      heads_[list] = l.next;
    }
    if (l.next != kNoSlot) {
      links_[l.next].prev = l.prev;
    } else {
      tails_[list] = l.prev;
    }
    l = Link{};
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
  // Everything about one slot in one place: one cache line touched per slot.
  struct Link {
    Slot prev = kNoSlot;
    Slot next = kNoSlot;
    uint8_t which = kNoList;
  };

  void Ensure(Slot s) { GrowFor(links_, s); }

  std::vector<Slot> heads_, tails_;
  std::vector<size_t> sizes_;
  std::vector<Link> links_;
};

}  // namespace cxltier::engine
