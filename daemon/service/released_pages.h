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
//     plans' moves start with them, before any promotion.
// Only pools whose new pages are steered below tier 0 are tracked (the only
// ones whose budget the daemon bounds from admission; docs/operations.md).
//
// What it costs: a byte per pool block of each pool that had one (made at
// its first), and 16 bytes per held block waiting in the queue; a client's
// share goes when it leaves or its pool is dropped, and the queue's memory
// when nothing is held. Everything here runs on the I/O thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <vector>

namespace cxltier::service {

class ReleasedPages {
 public:
  // A client session's pool block.
  struct Block {
    uint64_t session = 0;
    uint32_t pool = 0, block = 0;
  };

  // The block in `b` was released with its pages in tier 0 (or on their way
  // there); its pool has `pool_blocks` blocks. Held already: nothing changes.
  void Add(const Block& b, uint32_t pool_blocks);
  // A block is admitted on `b`'s pages: they are no longer held. Whether they were.
  bool Take(const Block& b);
  // Up to `n` held blocks not being moved yet, oldest first, now being moved.
  std::vector<Block> Next(size_t n);
  // The move of `b` (from Next) came back, done or not. True: its pages are
  // no longer held. False: a block was admitted on them while they moved
  // (where they are is the kernel's to say; if released again since, they
  // are held again and queued for another move), or its client or pool went.
  bool Done(const Block& b);
  // Forgets every entry of `session` (it left), or of its pool `pool` (dropped).
  void DropSession(uint64_t session);
  void DropPool(uint64_t session, uint32_t pool);

  // Blocks held: the engine's held count.
  size_t size() const { return held_; }
  bool empty() const { return held_ == 0; }

 private:
  // A pool block's state bits.
  static constexpr uint8_t kHeld = 1;    // its pages are counted in tier 0
  static constexpr uint8_t kQueued = 2;  // in queue_ (maybe no longer held)
  static constexpr uint8_t kMoving = 4;  // handed to the mover by Next
  static constexpr uint8_t kTaken = 8;   // admitted on while moving

  using PoolKey = std::pair<uint64_t, uint32_t>;  // session, pool
  uint8_t* StateOf(const Block& b);
  // Drops pools_[first, last) and what they held.
  void Drop(std::map<PoolKey, std::vector<uint8_t>>::iterator first,
            std::map<PoolKey, std::vector<uint8_t>>::iterator last);
  // Nothing held: the queue's memory goes (its entries are all stale).
  void TrimWhenEmpty();

  std::map<PoolKey, std::vector<uint8_t>> pools_;  // state by pool block
  std::deque<Block> queue_;                        // release order
  size_t held_ = 0;
};

}  // namespace cxltier::service
