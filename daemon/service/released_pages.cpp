#include "service/released_pages.h"

namespace cxltier::service {

void ReleasedPages::Set(States::iterator it, uint8_t state) {
  if (state == 0) {
    states_.erase(it);
  } else {
    it->second = state;
  }
}

void ReleasedPages::Add(const Block& b) {
  uint8_t& st = states_[b];
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
  const auto it = states_.find(b);
  if (it == states_.end() || !(it->second & kHeld)) return false;
  uint8_t st = it->second & static_cast<uint8_t>(~kHeld);
  if (st & kMoving) st |= kTaken;
  --held_;
  // A queued entry stays (the queue's, skipped when popped) until popped.
  Set(it, st);
  TrimWhenIdle();
  return true;
}

std::vector<ReleasedPages::Block> ReleasedPages::Next(size_t n) {
  std::vector<Block> out;
  while (out.size() < n && !queue_.empty()) {
    const Block b = queue_.front();
    queue_.pop_front();
    const auto it = states_.find(b);
    if (it == states_.end()) continue;  // its pool or client went
    uint8_t st = it->second & static_cast<uint8_t>(~kQueued);
    if ((st & kHeld) && !(st & kMoving)) {
      st |= kMoving;
      out.push_back(b);
    }
    Set(it, st);
  }
  TrimWhenIdle();
  return out;
}

ReleasedPages::Outcome ReleasedPages::Done(const Block& b) {
  const auto it = states_.find(b);
  if (it == states_.end() || !(it->second & kMoving)) return Outcome::kGone;
  uint8_t st = it->second;
  const bool taken = st & kTaken;
  st &= static_cast<uint8_t>(~(kMoving | kTaken));
  if (!taken) {  // held all along
    st &= static_cast<uint8_t>(~kHeld);
    --held_;
  } else if ((st & kHeld) && !(st & kQueued)) {
    st |= kQueued;  // released again while it moved: move it again
    queue_.push_back(b);
  }
  Set(it, st);
  TrimWhenIdle();
  return taken ? Outcome::kTaken : Outcome::kMoved;
}

template <class Gone>
void ReleasedPages::DropIf(Gone gone) {
  for (auto it = states_.begin(); it != states_.end();) {
    if (!gone(it->first)) {
      ++it;
      continue;
    }
    held_ -= (it->second & kHeld) != 0;
    it = states_.erase(it);
  }
  // Their queue entries are skipped when popped.
  TrimWhenIdle();
}

void ReleasedPages::DropSession(uint64_t session) {
  DropIf([session](const Block& b) { return b.session == session; });
}

void ReleasedPages::DropPool(uint64_t session, uint32_t pool) {
  DropIf([&](const Block& b) { return b.session == session && b.pool == pool; });
}

void ReleasedPages::TrimWhenIdle() {
  if (held_ != 0) return;
  if (!queue_.empty()) {
    // Nothing held: every queue entry is stale. Each is paid for by its push.
    for (const Block& b : queue_) {
      if (const auto it = states_.find(b); it != states_.end()) {
        Set(it, it->second & static_cast<uint8_t>(~kQueued));
      }
    }
    std::deque<Block>().swap(queue_);
  }
  if (states_.empty() && states_.bucket_count() > 1) States().swap(states_);  // its buckets too
}

}  // namespace cxltier::service
