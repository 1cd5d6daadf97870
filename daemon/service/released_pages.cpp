#include "service/released_pages.h"

namespace cxltier::service {

namespace {

uint64_t PoolBlock(const ReleasedPages::Block& b) { return uint64_t{b.pool} << 32 | b.block; }

}  // namespace

uint8_t ReleasedPages::Get(const Block& b) const {
  const auto s = sessions_.find(b.session);
  if (s == sessions_.end()) return 0;
  const auto it = s->second.find(PoolBlock(b));
  return it == s->second.end() ? 0 : it->second;
}

void ReleasedPages::Set(const Block& b, uint8_t state) {
  if (state != 0) {
    sessions_[b.session][PoolBlock(b)] = state;
    return;
  }
  const auto s = sessions_.find(b.session);
  if (s == sessions_.end()) return;
  s->second.erase(PoolBlock(b));
  if (s->second.empty()) sessions_.erase(s);
}

size_t ReleasedPages::entries() const {
  size_t n = 0;
  for (const auto& [session, states] : sessions_) n += states.size();
  return n;
}

void ReleasedPages::Add(const Block& b) {
  uint8_t st = Get(b);
  if (st & kHeld) return;
  st |= kHeld;
  ++held_;
  // One being moved is queued again when its move comes back (Done).
  if (!(st & (kQueued | kMoving))) {
    st |= kQueued;
    queue_.push_back(b);
  }
  Set(b, st);
}

bool ReleasedPages::Take(const Block& b) {
  if (held_ == 0) return false;
  uint8_t st = Get(b);
  if (!(st & kHeld)) return false;
  st &= static_cast<uint8_t>(~kHeld);
  if (st & kMoving) st |= kTaken;
  --held_;
  // A queued entry stays (the queue's, skipped when popped) until popped.
  Set(b, st);
  TrimWhenIdle();
  return true;
}

std::vector<ReleasedPages::Block> ReleasedPages::Next(size_t n) {
  std::vector<Block> out;
  while (out.size() < n && !queue_.empty()) {
    const Block b = queue_.front();
    queue_.pop_front();
    uint8_t st = Get(b);
    if (st == 0) continue;  // its pool or client went
    st &= static_cast<uint8_t>(~kQueued);
    if ((st & kHeld) && !(st & kMoving)) {
      st |= kMoving;
      out.push_back(b);
    }
    Set(b, st);
  }
  TrimWhenIdle();
  return out;
}

ReleasedPages::Outcome ReleasedPages::Done(const Block& b) {
  uint8_t st = Get(b);
  if (!(st & kMoving)) return Outcome::kGone;
  const bool taken = st & kTaken;
  st &= static_cast<uint8_t>(~(kMoving | kTaken));
  if (!taken) {  // held all along
    st &= static_cast<uint8_t>(~kHeld);
    --held_;
  } else if ((st & kHeld) && !(st & kQueued)) {
    st |= kQueued;  // released again while it moved: move it again
    queue_.push_back(b);
  }
  Set(b, st);
  TrimWhenIdle();
  return taken ? Outcome::kTaken : Outcome::kMoved;
}

bool ReleasedPages::Drop(uint64_t session, std::optional<uint32_t> pool) {
  const auto s = sessions_.find(session);
  if (s == sessions_.end()) return false;
  for (auto it = s->second.begin(); it != s->second.end();) {
    if (pool && static_cast<uint32_t>(it->first >> 32) != *pool) {
      ++it;
      continue;
    }
    held_ -= (it->second & kHeld) != 0;
    it = s->second.erase(it);
  }
  if (s->second.empty()) sessions_.erase(s);
  // Their queue entries are skipped when popped.
  TrimWhenIdle();
  return true;
}

void ReleasedPages::TrimWhenIdle() {
  if (held_ != 0) return;
  if (!queue_.empty()) {
    // Nothing held: every queue entry is stale. Each is paid for by its push.
    for (const Block& b : queue_) {
      if (const uint8_t st = Get(b)) Set(b, st & static_cast<uint8_t>(~kQueued));
    }
    std::deque<Block>().swap(queue_);
  }
  if (sessions_.empty() && sessions_.bucket_count() > 1) {
    std::unordered_map<uint64_t, States>().swap(sessions_);  // its buckets too
  }
}

}  // namespace cxltier::service
