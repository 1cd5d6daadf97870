#include "ghost_store.h"

namespace cxltier::engine {

bool GhostStore::Put(const BlockKey& key, const BlockState& state) {
  if (capacity_ == 0) return false;
  if (auto it = index_.find(key); it != index_.end()) {
    order_.erase(it->second);
    index_.erase(it);
  }
  order_.push_front(state);
  order_.front().key = key;
  index_.emplace(key, order_.begin());
  if (order_.size() > capacity_) {
    index_.erase(order_.back().key);
    order_.pop_back();
    return true;
  }
  return false;
}

std::optional<BlockState> GhostStore::Take(const BlockKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  BlockState s = *it->second;
  order_.erase(it->second);
  index_.erase(it);
  return s;
}

}  // namespace cxltier::engine
