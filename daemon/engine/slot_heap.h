// An indexed binary min-heap of slots ordered by (primary, secondary, slot).
// Push, Update, Erase and Pop are O(log n); Top and Contains are O(1).
// SlotHeap keeps each slot's place in a table by slot (fast; memory for every
// slot up to the largest); SparseSlotHeap in a hash map (memory for its
// members only: one per quota account).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/types.h"

namespace cxltier::engine {

struct HeapEntry {
  double primary;
  uint64_t secondary;
  Slot slot;
};

// Where each slot sits in the heap, by slot.
class DenseHeapPositions {
 public:
  static constexpr uint32_t kNoPos = UINT32_MAX;
  bool Has(Slot s) const { return s < pos_.size() && pos_[s] != kNoPos; }
  uint32_t Get(Slot s) const { return pos_[s]; }
  void Put(Slot s, uint32_t i) {
    GrowFor(pos_, s, kNoPos);
    pos_[s] = i;
  }
  void Drop(Slot s) { pos_[s] = kNoPos; }
  void Reserve(size_t n) { ReserveFor(pos_, n); }

 private:
  std::vector<uint32_t> pos_;
};

class SparseHeapPositions {
 public:
  bool Has(Slot s) const { return pos_.contains(s); }
  uint32_t Get(Slot s) const { return pos_.find(s)->second; }
  void Put(Slot s, uint32_t i) { pos_[s] = i; }
  void Drop(Slot s) { pos_.erase(s); }
  void Reserve(size_t n) { pos_.reserve(n); }

 private:
  std::unordered_map<Slot, uint32_t> pos_;
};

template <typename Positions>
class BasicSlotHeap {
 public:
  using Entry = HeapEntry;

  bool Contains(Slot s) const { return pos_.Has(s); }
  size_t Size() const { return heap_.size(); }
  bool Empty() const { return heap_.empty(); }
  // REQUIRES: !Empty().
  const Entry& Top() const { return heap_.front(); }
  // Every entry, in heap order.
  const std::vector<Entry>& entries() const { return heap_; }

  void Reserve(size_t n) {
    pos_.Reserve(n);
    heap_.reserve(n);
  }

  // Inserts `s`, or re-keys it when already present.
  void Set(Slot s, double primary, uint64_t secondary) {
    if (Contains(s)) {
      const uint32_t i = pos_.Get(s);
      const bool up = Less(Entry{primary, secondary, s}, heap_[i]);
      heap_[i].primary = primary;
      heap_[i].secondary = secondary;
      if (up) {
        SiftUp(i);
      } else {
        SiftDown(i);
      }
      return;
    }
    heap_.push_back(Entry{primary, secondary, s});
    const uint32_t i = static_cast<uint32_t>(heap_.size() - 1);
    pos_.Put(s, i);
    SiftUp(i);
  }

  // Removes `s` if present.
  void Erase(Slot s) {
    if (!Contains(s)) return;
    const uint32_t i = pos_.Get(s);
    pos_.Drop(s);
    const Entry last = heap_.back();
    heap_.pop_back();
    if (i == heap_.size()) return;
    heap_[i] = last;
    pos_.Put(last.slot, i);
    if (i > 0 && Less(heap_[i], heap_[(i - 1) / 2])) {
      SiftUp(i);
    } else {
      SiftDown(i);
    }
  }

  static bool Less(const Entry& a, const Entry& b) {
    if (a.primary != b.primary) return a.primary < b.primary;
    if (a.secondary != b.secondary) return a.secondary < b.secondary;
    return a.slot < b.slot;  // a fixed order for full ties
  }

  Slot Pop() {
    assert(!heap_.empty());
    const Slot s = heap_.front().slot;
    Erase(s);
    return s;
  }

 private:
  void Place(uint32_t i, const Entry& e) {
    heap_[i] = e;
    pos_.Put(e.slot, i);
  }

  void SiftUp(uint32_t i) {
    const Entry e = heap_[i];
    while (i > 0) {
      const uint32_t parent = (i - 1) / 2;
      if (!Less(e, heap_[parent])) break;
      Place(i, heap_[parent]);
      i = parent;
    }
    Place(i, e);
  }

  void SiftDown(uint32_t i) {
    const Entry e = heap_[i];
    const uint32_t n = static_cast<uint32_t>(heap_.size());
    for (;;) {
      uint32_t child = 2 * i + 1;
      if (child >= n) break;
      if (child + 1 < n && Less(heap_[child + 1], heap_[child])) ++child;
      if (!Less(heap_[child], e)) break;
      Place(i, heap_[child]);
      i = child;
    }
    Place(i, e);
  }

  std::vector<Entry> heap_;
  Positions pos_;
};

using SlotHeap = BasicSlotHeap<DenseHeapPositions>;
using SparseSlotHeap = BasicSlotHeap<SparseHeapPositions>;

}  // namespace cxltier::engine
