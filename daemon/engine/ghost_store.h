// The ghost store: states of blocks that are not resident anywhere, kept by key
// so a re-admitted block gets its score back. Bounded; the oldest ghost goes first.
#pragma once

#include <cstddef>
#include <list>
#include <optional>
#include <unordered_map>

#include "cxltier/block.h"

namespace cxltier::engine {

class GhostStore {
 public:
  explicit GhostStore(size_t capacity) : capacity_(capacity) {}

  // Keeps `state` under `key`, replacing an older ghost of the same key.
  // Returns true if that pushed the oldest ghost out.
  bool Put(const BlockKey& key, const BlockState& state);

  // Removes and returns the ghost of `key`, if there is one.
  std::optional<BlockState> Take(const BlockKey& key);

  bool Contains(const BlockKey& key) const { return index_.count(key) != 0; }
  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }

  // Oldest first; for checkpoints.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it) fn(*it);
  }

 private:
  size_t capacity_;
  std::list<BlockState> order_;  // newest at the front
  std::unordered_map<BlockKey, std::list<BlockState>::iterator, BlockKeyHash> index_;
};

}  // namespace cxltier::engine
