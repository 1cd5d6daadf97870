// An indexed binary min-heap of slots ordered by (primary, secondary, slot).
// Push, Update, Erase and Pop are O(log n); Top and Contains are O(1).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <vector>

#include "engine/types.h"

namespace cxltier::engine {

class SlotHeap {
 public:
  struct Entry {
    double primary;
    uint64_t secondary;
    Slot slot;
  };

  bool Contains(Slot s) const { return s < pos_.size() && pos_[s] != kNoPos; }
  size_t Size() const { return heap_.size(); }
  bool Empty() const { return heap_.empty(); }
  // REQUIRES: !Empty().
  const Entry& Top() const { return heap_.front(); }
  // Every entry, in heap order.
  const std::vector<Entry>& entries() const { return heap_; }

  void Reserve(size_t n) {
    if (n > pos_.size()) pos_.resize(n, kNoPos);
    heap_.reserve(n);
  }

  // Inserts `s`, or re-keys it when already present.
  void Set(Slot s, double primary, uint64_t secondary) {
    if (Contains(s)) {
      const uint32_t i = pos_[s];
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
    GrowFor(pos_, s, kNoPos);
    heap_.push_back(Entry{primary, secondary, s});
    pos_[s] = static_cast<uint32_t>(heap_.size() - 1);
    SiftUp(pos_[s]);
  }

  // Removes `s` if present.
  void Erase(Slot s) {
    if (!Contains(s)) return;
    const uint32_t i = pos_[s];
    pos_[s] = kNoPos;
    const Entry last = heap_.back();
    heap_.pop_back();
    if (i == heap_.size()) return;
    heap_[i] = last;
    pos_[last.slot] = i;
    if (i > 0 && Less(heap_[i], heap_[(i - 1) / 2])) {
      SiftUp(i);
    } else {
      SiftDown(i);
    }
  }

  Slot Pop() {
    assert(!heap_.empty());
    const Slot s = heap_.front().slot;
    Erase(s);
    return s;
  }

 private:
  static constexpr uint32_t kNoPos = UINT32_MAX;

  static bool Less(const Entry& a, const Entry& b) {
    if (a.primary != b.primary) return a.primary < b.primary;
    if (a.secondary != b.secondary) return a.secondary < b.secondary;
    return a.slot < b.slot;  // a fixed order for full ties
  }

  void Place(uint32_t i, const Entry& e) {
    heap_[i] = e;
    pos_[e.slot] = i;
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
  std::vector<uint32_t> pos_;
};

}  // namespace cxltier::engine
