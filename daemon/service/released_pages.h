// Page mode: the pages a released block left in tier 0.
//
// A pool block keeps its pages when the block in it is released: they are
// the client's memory, and the client may admit a new block on them at any
// time, which is then admitted where they are. Were they forgotten, a burst
// of such admissions (an engine that frees a sequence and reuses its blocks
// for the next) would take tier 0 past its budget while the engine, seeing
// room, placed other new blocks there too. So they stay counted in tier 0
// (Engine::set_held_blocks) until either
//   - a new block is admitted on them (it takes their place in the count), or
//   - the mover has moved them down to the pool's new-pages tier: the next
//     plans' first moves (MoveDispatch::Dispatch).
// Only pools whose new pages are steered below tier 0 are tracked (the only
// ones whose budget the daemon bounds from admission; docs/operations.md).
//
// What it costs: an entry (about 64 bytes, with its place in a queue) per
// pool block held or being moved, so at most what the client's released
// blocks name, never what its pools span; a client's entries go when it
// leaves or its pool is dropped, and the tables' memory once nothing is
// held or moving. Everything here runs on the I/O thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace cxltier::service {

class ReleasedPages {
 public:
  // A client session's pool block.
  struct Block {
    uint64_t session = 0;
    uint32_t pool = 0, block = 0;
  };
  // What became of a block whose move came back (Done).
  enum class Outcome {
    kMoved,  // its pages are no longer held
    kTaken,  // a block was admitted on them while they moved (if released
             // again since, held anew and queued for another move)
    kGone,   // its client left or its pool was dropped
  };

  // The quota accounts a session's held blocks count in (Engine::
  // set_account_held): its uid's and its client account (kNoAccount: none).
  struct Accounts {
    uint64_t owner = 0;
    uint64_t client = kNoAccount;
  };
  static constexpr uint64_t kNoAccount = ~0ull;  // engine::kNoAccount

  // The block in `b` was released with its pages in tier 0 (or on their way
  // there); its session's blocks count in `accounts`. Held already: nothing
  // changes.
  void Add(const Block& b, const Accounts& accounts);
  // A block is admitted on `b`'s pages: they are no longer held. Whether they were.
  bool Take(const Block& b);
  // Up to `n` held blocks not being moved yet, now being moved: one of each
  // owner (uid) with some in turn, each owner's oldest first, so that one
  // uid's releases do not make everyone else's wait.
  std::vector<Block> Next(size_t n);
  // The move of `b` (from Next) came back, done or not.
  Outcome Done(const Block& b);
  // Forgets the entries of `session` (it left), or of its pool `*pool`
  // (dropped). Costs that session's entries, not anyone else's. Whether
  // the session had any (a block of it being moved has one).
  bool Drop(uint64_t session, std::optional<uint32_t> pool = std::nullopt);

  // Blocks held: the engine's held count.
  size_t size() const { return held_; }
  // Of them, those counted in account `id`.
  size_t HeldOf(uint64_t id) const {
    const auto it = account_held_.find(id);
    return it == account_held_.end() ? 0 : it->second;
  }
  bool empty() const { return held_ == 0; }
  // Calls f(account, held blocks counted in it) for each account whose count
  // changed since the last call (0 once it has none), for the engine.
  template <typename F>
  void DrainChangedAccounts(F&& f) {
    for (const uint64_t id : changed_) f(id, HeldOf(id));
    changed_.clear();
  }
  // Entries, held or being moved (what it costs).
  size_t entries() const;

 private:
  // A pool block's state bits; an entry whose bits are all clear goes.
  static constexpr uint8_t kHeld = 1;    // its pages are counted in tier 0
  static constexpr uint8_t kQueued = 2;  // in its owner's queue (maybe no longer held)
  static constexpr uint8_t kMoving = 4;  // handed to the mover by Next
  static constexpr uint8_t kTaken = 8;   // admitted on while moving

  // A session's states by pool block (pool << 32 | block), and its accounts.
  using States = std::unordered_map<uint64_t, uint8_t>;
  struct Session {
    States states;
    Accounts accounts;
  };
  // `b`'s state bits; 0 when it has no entry.
  uint8_t Get(const Block& b) const;
  // Sets them; all clear erases the entry (and a session left with none).
  void Set(const Block& b, uint8_t state);
  // Nothing held: the queue (all stale) and the tables' memory go.
  void TrimWhenIdle();

  // One more (+1) or one fewer (-1) of `session`'s blocks held.
  void CountHeld(const Session& session, int delta);
  // Queues `b` (kQueued set by the caller) in its owner's queue.
  void Enqueue(const Block& b);

  std::unordered_map<uint64_t, Session> sessions_;
  // Blocks to move by owner, each in release order, and the owners with a
  // queue in turn (each owner once).
  std::unordered_map<uint64_t, std::deque<Block>> queues_;
  std::deque<uint64_t> turn_;
  size_t held_ = 0;
  // Held blocks by account (none: no entry), and the accounts whose count
  // changed since DrainChangedAccounts.
  std::unordered_map<uint64_t, size_t> account_held_;
  std::unordered_set<uint64_t> changed_;  // at most the accounts of the sessions changed
};

}  // namespace cxltier::service
