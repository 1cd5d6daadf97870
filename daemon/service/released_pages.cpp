#include "service/released_pages.h"

#include <algorithm>

namespace cxltier::service {

uint8_t* ReleasedPages::StateOf(const Block& b) {
  auto it = pools_.find({b.session, b.pool});
  if (it == pools_.end() || b.block >= it->second.size()) return nullptr;
  return &it->second[b.block];
}

void ReleasedPages::Add(const Block& b, uint32_t pool_blocks) {
  if (b.block >= pool_blocks) return;
  std::vector<uint8_t>& states = pools_[{b.session, b.pool}];
  if (states.size() < pool_blocks) states.resize(pool_blocks);
  uint8_t& st = states[b.block];
  if (st & kHeld) return;
  st |= kHeld;
  ++held_;
  // One being moved is queued again when its move comes back (Done).
  if (!(st & (kQueued | kMoving))) {
    st |= kQueued;
    queue_.push_back(b);
  }
}

bool ReleasedPages::Take(const Block& b) {
  if (held_ == 0) return false;
  uint8_t* st = StateOf(b);
  if (!st || !(*st & kHeld)) return false;
  *st &= static_cast<uint8_t>(~kHeld);
  if (*st & kMoving) *st |= kTaken;
  --held_;
  TrimWhenEmpty();
  return true;
}

std::vector<ReleasedPages::Block> ReleasedPages::Next(size_t n) {
  std::vector<Block> out;
  while (out.size() < n && !queue_.empty()) {
    const Block b = queue_.front();
    queue_.pop_front();
    uint8_t* st = StateOf(b);
    if (!st) continue;  // its pool or client went
    *st &= static_cast<uint8_t>(~kQueued);
    if ((*st & kHeld) && !(*st & kMoving)) {
      *st |= kMoving;
      out.push_back(b);
    }
  }
  return out;
}

bool ReleasedPages::Done(const Block& b) {
  uint8_t* st = StateOf(b);
  if (!st) return false;
  const bool taken = *st & kTaken;
  *st &= static_cast<uint8_t>(~(kMoving | kTaken));
  if (!(*st & kHeld)) return false;  // taken (and not released again)
  if (!taken) {
    *st &= static_cast<uint8_t>(~kHeld);
    --held_;
    TrimWhenEmpty();
    return true;
  }
  // Taken and released again while it moved: held anew, to move again.
  if (!(*st & kQueued)) {
    *st |= kQueued;
    queue_.push_back(b);
  }
  return false;
}

void ReleasedPages::Drop(std::map<PoolKey, std::vector<uint8_t>>::iterator first,
                         std::map<PoolKey, std::vector<uint8_t>>::iterator last) {
  for (auto it = first; it != last; ++it) {
    held_ -= static_cast<size_t>(
        std::count_if(it->second.begin(), it->second.end(), [](uint8_t s) { return s & kHeld; }));
  }
  pools_.erase(first, last);  // their queue entries are skipped when popped
  TrimWhenEmpty();
}

void ReleasedPages::DropSession(uint64_t session) {
  Drop(pools_.lower_bound({session, 0}), pools_.lower_bound({session + 1, 0}));
}

void ReleasedPages::DropPool(uint64_t session, uint32_t pool) {
  const auto it = pools_.find({session, pool});
  if (it != pools_.end()) Drop(it, std::next(it));
}

void ReleasedPages::TrimWhenEmpty() {
  if (held_ != 0 || queue_.empty()) return;
  // Every entry is stale (a block being moved needs none: its Done does
  // without). A pass over the entries, each paid for by its push.
  for (const Block& b : queue_) {
    if (uint8_t* st = StateOf(b)) *st &= static_cast<uint8_t>(~kQueued);
  }
  std::deque<Block>().swap(queue_);
}

}  // namespace cxltier::service
