#include "service/released_pages.h"

#include <cassert>

namespace cxltier::service {

namespace {

uint64_t PoolBlock(const ReleasedPages::Block& b) { return uint64_t{b.pool} << 32 | b.block; }

}  // namespace

uint8_t ReleasedPages::Get(const Block& b) const {
  const auto s = sessions_.find(b.session);
  if (s == sessions_.end()) return 0;
  const auto it = s->second.states.find(PoolBlock(b));
  return it == s->second.states.end() ? 0 : it->second;
}

void ReleasedPages::Set(const Block& b, uint8_t state) {
  if (state != 0) {
    sessions_[b.session].states[PoolBlock(b)] = state;
    return;
  }
  const auto s = sessions_.find(b.session);
  if (s == sessions_.end()) return;
  s->second.states.erase(PoolBlock(b));
  if (s->second.states.empty()) sessions_.erase(s);
}

void ReleasedPages::CountHeld(const Session& session, int delta) {
  const auto add = [delta](size_t& n) {
    assert(delta > 0 || n > 0);
    n = delta > 0 ? n + 1 : n - 1;
  };
  add(held_);
  for (const uint64_t id : {session.accounts.owner, session.accounts.client}) {
    if (id == kNoAccount) continue;
    size_t& n = account_held_[id];
    add(n);
    if (n == 0) account_held_.erase(id);
    changed_.insert(id);
  }
}

size_t ReleasedPages::entries() const {
  size_t n = 0;
  for (const auto& [id, session] : sessions_) n += session.states.size();
  return n;
}

void ReleasedPages::Enqueue(const Block& b) {
  const uint64_t owner = sessions_.at(b.session).accounts.owner;
  auto [q, added] = queues_.try_emplace(owner);
  if (added) turn_.push_back(owner);
  q->second.push_back(b);
}

void ReleasedPages::Add(const Block& b, const Accounts& accounts) {
  uint8_t st = Get(b);
  if (st & kHeld) return;
  // A session's accounts are its uid's and its hello's, set once: the first
  // entry of the session names them.
  const auto [it, added] = sessions_.try_emplace(b.session);
  Session& session = it->second;
  if (added) session.accounts = accounts;
  st |= kHeld;
  // One being moved is queued again when its move comes back (Done).
  const bool enqueue = !(st & (kQueued | kMoving));
  if (enqueue) st |= kQueued;
  session.states[PoolBlock(b)] = st;
  if (enqueue) Enqueue(b);
  CountHeld(session, +1);
}

bool ReleasedPages::Take(const Block& b) {
  if (held_ == 0) return false;
  uint8_t st = Get(b);
  if (!(st & kHeld)) return false;
  st &= static_cast<uint8_t>(~kHeld);
  if (st & kMoving) st |= kTaken;
  CountHeld(sessions_.at(b.session), -1);
  // A queued entry stays (the queue's, skipped when popped) until popped.
  Set(b, st);
  TrimWhenIdle();
  return true;
}

std::vector<ReleasedPages::Block> ReleasedPages::Next(size_t n) {
  std::vector<Block> out;
  while (out.size() < n && !turn_.empty()) {
    const uint64_t owner = turn_.front();
    turn_.pop_front();
    const auto q = queues_.find(owner);
    // Its oldest entry still held; the stale ones before it (taken, or their
    // pool or client gone) were paid for by their push.
    while (!q->second.empty()) {
      const Block b = q->second.front();
      q->second.pop_front();
      uint8_t st = Get(b);
      if (st == 0) continue;
      st &= static_cast<uint8_t>(~kQueued);
      const bool move = (st & kHeld) && !(st & kMoving);
      if (move) st |= kMoving;
      Set(b, st);
      if (move) {
        out.push_back(b);
        break;
      }
    }
    if (q->second.empty()) {
      queues_.erase(q);
    } else {
      turn_.push_back(owner);
    }
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
    CountHeld(sessions_.at(b.session), -1);
  } else if ((st & kHeld) && !(st & kQueued)) {
    st |= kQueued;  // released again while it moved: move it again
    Enqueue(b);     // (its session has the entry being moved)
  }
  Set(b, st);
  TrimWhenIdle();
  return taken ? Outcome::kTaken : Outcome::kMoved;
}

bool ReleasedPages::Drop(uint64_t session, std::optional<uint32_t> pool) {
  const auto s = sessions_.find(session);
  if (s == sessions_.end()) return false;
  States& states = s->second.states;
  for (auto it = states.begin(); it != states.end();) {
    if (pool && static_cast<uint32_t>(it->first >> 32) != *pool) {
      ++it;
      continue;
    }
    if (it->second & kHeld) CountHeld(s->second, -1);
    it = states.erase(it);
  }
  if (states.empty()) sessions_.erase(s);
  // Their queue entries are skipped when popped.
  TrimWhenIdle();
  return true;
}

void ReleasedPages::TrimWhenIdle() {
  if (held_ != 0) return;
  if (!queues_.empty()) {
    // Nothing held: every queue entry is stale. Each is paid for by its push.
    for (const auto& [owner, queue] : queues_) {
      for (const Block& b : queue) {
        if (const uint8_t st = Get(b)) Set(b, st & static_cast<uint8_t>(~kQueued));
      }
    }
    std::unordered_map<uint64_t, std::deque<Block>>().swap(queues_);
    std::deque<uint64_t>().swap(turn_);
  }
  if (sessions_.empty() && sessions_.bucket_count() > 1) {
    std::unordered_map<uint64_t, Session>().swap(sessions_);  // its buckets too
  }
  if (account_held_.empty() && account_held_.bucket_count() > 1) {
    std::unordered_map<uint64_t, size_t>().swap(account_held_);
  }
}

}  // namespace cxltier::service
