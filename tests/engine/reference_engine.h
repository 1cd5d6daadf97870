// A deliberately simple model of the engine, for differential tests.
//
// Nothing clever: blocks live in a vector that only grows (a re-admitted key
// gets a new entry), every list is "the members with this list id, ordered by
// the stamp they were pushed with", and every choice is a linear scan. It
// shares no code with daemon/engine except the count-min sketch (which has
// its own tests against exact counts) and the vocabulary types.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cxltier/block.h"
#include "engine/count_min.h"
#include "engine/engine.h"

namespace cxltier::engine::testing {

class ReferenceEngine {
 public:
  enum class Kind { kLru, kLfu, kEma, kMin, kArc, kS3Fifo, kSieve, kTinyLfu };

  ReferenceEngine(const EngineOptions& o, const std::string& policy) : o_(o) {
    cap_ = o.tier0_budget_bytes / o.block_bytes;
    if (policy == "lru")
      kind_ = Kind::kLru;
    else if (policy == "lfu")
      kind_ = Kind::kLfu;
    else if (policy == "min")
      kind_ = Kind::kMin;
    else if (policy == "arc")
      kind_ = Kind::kArc;
    else if (policy == "s3fifo")
      kind_ = Kind::kS3Fifo;
    else if (policy == "sieve")
      kind_ = Kind::kSieve;
    else if (policy == "tinylfu")
      kind_ = Kind::kTinyLfu;
    else {
      kind_ = Kind::kEma;
      alpha_ = std::stod(policy.substr(4));
    }
    small_cap_ = std::max<size_t>(1, cap_ / 10);
    s3_main_cap_ = cap_ - std::min(cap_, small_cap_);
    s3_ghost_cap_ = std::max<size_t>(1, cap_ * 9 / 10);
    window_cap_ = std::max<size_t>(1, cap_ / 100);
    protected_cap_ = (cap_ > window_cap_ ? cap_ - window_cap_ : 0) * 8 / 10;
    sketch_ = std::make_unique<CountMinSketch>(std::max<size_t>(16, cap_),
                                               10 * std::max<size_t>(1, cap_));
  }

  std::vector<EngineEvent> log;
  EngineCounters counters;

  void Admit(const BlockKey& key) {
    if (live_.count(key)) return;
    B b;
    b.key = key;
    if (Persist()) {
      for (auto it = ghosts_.begin(); it != ghosts_.end(); ++it) {
        if (it->key == key) {
          b.score = it->score;
          b.time = it->time;
          b.count = it->count;
          b.seq = it->seq;
          b.restored = true;
          ghosts_.erase(it);
          ++counters.ghost_restores;
          break;
        }
      }
    }
    blocks_.push_back(b);
    const size_t id = blocks_.size() - 1;
    live_[key] = id;
    ++counters.admits;
    if (o_.mode == Mode::kTick) {
      const bool room = CountTier(Tier::kFast) < cap_;
      blocks_[id].tier = room ? Tier::kFast : Tier::kSlow;
      if (room) ++counters.placed_fast;
      Log(room ? EngineEvent::kPlaceFast : EngineEvent::kPlaceSlow, id);
      Classify(id);
    }
  }

  bool Touch(const BlockKey& key, double obs, uint64_t now, uint64_t next_use) {
    const size_t id = live_.at(key);
    B& b = blocks_[id];
    const bool hit = b.tier == Tier::kFast;
    ++counters.touches;
    if (hit) ++counters.hits;
    // Score, straight from the definitions in docs/policies.md.
    const bool fresh = b.count == 0;
    if (kind_ == Kind::kEma) {
      b.score =
          (fresh ? 0.0 : b.score * std::pow(1.0 - alpha_, double(now - b.time))) + alpha_ * obs;
    }
    ++b.count;
    b.time = now;
    b.seq = ++seq_;
    b.next_use = next_use;
    if (cap_ == 0) {
      if (b.tier == Tier::kNone) b.tier = Tier::kSlow;
      return hit;
    }
    if (b.in_set) {
      Hit(id);
      if (blocks_[id].queue == kPromoteQ) {  // touched again while it waits
        blocks_[id].retouched = true;
        blocks_[id].queue_stamp = ++qstamp_;
      }
      return hit;
    }
    const std::optional<size_t> victim = Miss(id);
    blocks_[id].in_set = true;
    if (victim) {
      B& v = blocks_[*victim];
      v.in_set = false;
      ++counters.evictions;
      Log(EngineEvent::kEvict, *victim);
      if (!Persist()) v.score = 0, v.count = 0, v.time = 0;
    }
    if (o_.mode == Mode::kDemand) {
      if (victim) {
        blocks_[*victim].tier = Tier::kSlow;
        ++counters.demotions;
        Log(EngineEvent::kDemote, *victim);
      }
      if (blocks_[id].tier == Tier::kSlow) {
        ++counters.promotions;
        Log(EngineEvent::kPromote, id);
      } else {
        ++counters.placed_fast;
        Log(EngineEvent::kPlaceFast, id);
      }
      blocks_[id].tier = Tier::kFast;
    } else {
      if (victim) Classify(*victim);
      Classify(id);
    }
    return hit;
  }

  void Release(const BlockKey& key) {
    const size_t id = live_.at(key);
    B& b = blocks_[id];
    if (kind_ == Kind::kSieve && hand_ == id) hand_ = Newer(0, id);
    b.list = kNone;
    b.in_set = false;
    b.queue = kNone;
    Log(EngineEvent::kRelease, id);
    b.tier = Tier::kNone;
    if (Persist() && o_.ghost_capacity > 0) {
      for (auto it = ghosts_.begin(); it != ghosts_.end(); ++it) {
        if (it->key == key) {
          ghosts_.erase(it);
          break;
        }
      }
      ghosts_.push_back(Ghost{key, b.score, b.time, b.count, b.seq});
      if (ghosts_.size() > o_.ghost_capacity) {
        ghosts_.pop_front();
        ++counters.ghosts_dropped;
      }
    }
    b.live = false;
    live_.erase(key);
    ++counters.releases;
  }

  // Plans and applies, as Engine::PlanAndApply.
  void PlanAndApply() {
    ++tick_;
    ++counters.ticks;
    const uint64_t bb = o_.block_bytes;
    uint64_t budget = o_.migrate_bytes_per_tick ? o_.migrate_bytes_per_tick : UINT64_MAX;
    size_t projected = CountTier(Tier::kFast);
    // Promotions: those touched again while queued first, then the others,
    // each most recently touched or queued first; demotions: oldest first.
    std::vector<size_t> promos = QueueOrder(kPromoteQ);
    std::reverse(promos.begin(), promos.end());
    std::stable_partition(promos.begin(), promos.end(),
                          [&](size_t id) { return blocks_[id].retouched; });
    const std::vector<size_t> demos = QueueOrder(kDemoteQ);
    std::vector<std::pair<size_t, Tier>> moves;
    size_t di = 0;
    for (size_t p : promos) {
      if (Held(p)) continue;
      if (projected < cap_) {
        if (budget < bb) break;
        budget -= bb;
        moves.push_back({p, Tier::kFast});
        ++projected;
      } else {
        while (di < demos.size() && Held(demos[di])) ++di;
        if (di == demos.size() || budget / 2 < bb) break;
        budget -= 2 * bb;
        moves.push_back({demos[di++], Tier::kSlow});
        moves.push_back({p, Tier::kFast});
      }
    }
    for (auto& [id, _] : moves) blocks_[id].queue = kNone;
    for (auto& [id, to] : moves) {
      blocks_[id].tier = to;
      blocks_[id].moved_tick = tick_;
      if (to == Tier::kFast) {
        ++counters.promotions;
        Log(EngineEvent::kPromote, id);
      } else {
        ++counters.demotions;
        Log(EngineEvent::kDemote, id);
      }
      Classify(id);
    }
  }

  uint32_t CountOf(const BlockKey& key) const { return blocks_[live_.at(key)].count; }

 private:
  static constexpr int kNone = -1;
  enum { kPromoteQ = 0, kDemoteQ = 1 };
  // List ids per policy: LRU 0; ARC T1 0, T2 1, B1 2, B2 3; S3-FIFO S 0, M 1, G 2;
  // SIEVE 0; TinyLFU W 0, probation 1, protected 2.
  struct B {
    BlockKey key;
    bool live = true;
    double score = 0;
    uint64_t time = 0;
    uint32_t count = 0;
    uint64_t seq = 0;
    uint64_t next_use = kNever;
    Tier tier = Tier::kNone;
    bool in_set = false;
    int list = kNone;
    uint64_t stamp = 0;     // larger = nearer the front of its list
    int freq = 0;           // S3-FIFO
    bool visited = false;   // SIEVE
    bool restored = false;  // its state came from a ghost; no miss since
    int queue = kNone;
    uint64_t queue_stamp = 0;
    bool retouched = false;  // promotion candidate touched since it was queued
    uint64_t moved_tick = 0;
  };
  struct Ghost {
    BlockKey key;
    double score;
    uint64_t time;
    uint32_t count;
    uint64_t seq;
  };

  bool Persist() const { return o_.persistence == Persistence::kPersist; }
  bool Returning(size_t id) const { return Persist() && blocks_[id].count >= 2; }
  // S3-FIFO: the first miss of a block restored from a ghost.
  bool BackFromGhost(size_t id) {
    const bool back = Persist() && blocks_[id].restored;
    blocks_[id].restored = false;
    return back;
  }
  void Log(EngineEvent::Kind k, size_t id) { log.push_back(EngineEvent{k, blocks_[id].key}); }
  size_t CountTier(Tier t) const {
    size_t n = 0;
    for (const B& b : blocks_) n += b.live && b.tier == t;
    return n;
  }
  bool Held(size_t id) const {
    return o_.hysteresis_ticks > 0 && blocks_[id].moved_tick != 0 &&
           tick_ - blocks_[id].moved_tick < o_.hysteresis_ticks;
  }
  void Classify(size_t id) {
    B& b = blocks_[id];
    int want = kNone;
    if (b.live && b.in_set && b.tier != Tier::kFast) want = kPromoteQ;
    if (b.live && !b.in_set && b.tier == Tier::kFast) want = kDemoteQ;
    if (want != b.queue) {
      b.queue = want;
      b.queue_stamp = ++qstamp_;
      b.retouched = false;
    }
  }
  std::vector<size_t> QueueOrder(int q) const {
    std::vector<size_t> ids;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].live && blocks_[i].queue == q) ids.push_back(i);
    }
    std::sort(ids.begin(), ids.end(),
              [&](size_t a, size_t b) { return blocks_[a].queue_stamp < blocks_[b].queue_stamp; });
    return ids;
  }

  // ---- lists as stamps ----
  size_t Size(int list) const {
    size_t n = 0;
    for (const B& b : blocks_) n += b.live && b.list == list;
    return n;
  }
  void Push(int list, size_t id) {
    blocks_[id].list = list;
    blocks_[id].stamp = ++stamp_;
  }
  std::optional<size_t> Back(int list) const {
    std::optional<size_t> best;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].live && blocks_[i].list == list &&
          (!best || blocks_[i].stamp < blocks_[*best].stamp)) {
        best = i;
      }
    }
    return best;
  }
  std::optional<size_t> PopBack(int list) {
    auto b = Back(list);
    if (b) blocks_[*b].list = kNone;
    return b;
  }
  // The member of `list` just newer than `id` (towards the front).
  std::optional<size_t> Newer(int list, size_t id) const {
    std::optional<size_t> best;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].live && blocks_[i].list == list && blocks_[i].stamp > blocks_[id].stamp &&
          (!best || blocks_[i].stamp < blocks_[*best].stamp)) {
        best = i;
      }
    }
    return best;
  }
  std::vector<size_t> Members() const {
    std::vector<size_t> m;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].live && blocks_[i].in_set) m.push_back(i);
    }
    return m;
  }

  // ---- policies ----
  void Hit(size_t id) {
    B& b = blocks_[id];
    switch (kind_) {
      case Kind::kArc:
        Push(1, id);
        break;
      case Kind::kS3Fifo:
        b.freq = std::min(b.freq + 1, 3);
        break;
      case Kind::kSieve:
        b.visited = true;
        break;
      case Kind::kTinyLfu:
        sketch_->Increment(b.key);
        if (b.list == 0) {
          Push(0, id);
        } else if (b.list == 1) {
          Push(2, id);
          if (Size(2) > protected_cap_) Push(1, *Back(2));
        } else {
          Push(2, id);
        }
        break;
      default:
        break;  // score policies: nothing beyond the score
    }
  }

  std::optional<size_t> Miss(size_t id) {
    switch (kind_) {
      case Kind::kArc:
        return ArcMiss(id);
      case Kind::kS3Fifo:
        return S3Miss(id);
      case Kind::kSieve:
        return SieveMiss(id);
      case Kind::kTinyLfu:
        return TinyMiss(id);
      default:
        break;
    }
    const std::vector<size_t> m = Members();
    if (m.size() < cap_) return std::nullopt;
    return *std::min_element(m.begin(), m.end(),
                             [&](size_t a, size_t b) { return Worse(blocks_[a], blocks_[b]); });
  }

  // True when `a` should be evicted before `b`.
  bool Worse(const B& a, const B& b) const {
    switch (kind_) {
      case Kind::kLru:
        return a.seq < b.seq;
      case Kind::kLfu:
        return a.count != b.count ? a.count < b.count : a.seq < b.seq;
      case Kind::kEma: {
        // Value of each block at a common time: score x (1 - alpha)^(T - touch time).
        const uint64_t t = std::max(a.time, b.time);
        const long double va =
            a.score * std::pow(1.0L - alpha_, static_cast<long double>(t - a.time));
        const long double vb =
            b.score * std::pow(1.0L - alpha_, static_cast<long double>(t - b.time));
        return va != vb ? va < vb : a.seq < b.seq;
      }
      case Kind::kMin:
        return a.next_use != b.next_use ? a.next_use > b.next_use : a.seq < b.seq;
      default:
        return false;
    }
  }

  std::optional<size_t> ArcReplace(bool in_b2) {
    const double t1 = static_cast<double>(Size(0));
    const bool from_t1 = t1 >= 1 && ((in_b2 && t1 == p_) || t1 > p_ || Size(1) == 0);
    const size_t v = *Back(from_t1 ? 0 : 1);
    Push(from_t1 ? 2 : 3, v);
    return v;
  }
  std::optional<size_t> ArcMiss(size_t id) {
    const auto full = [&] { return Size(0) + Size(1) >= cap_; };
    std::optional<size_t> victim;
    const int where = blocks_[id].list;
    if (where == 2 || where == 3) {
      if (where == 2) {
        p_ = std::min<double>(static_cast<double>(cap_),
                              p_ + std::max(1.0, double(Size(3)) / double(Size(2))));
      } else {
        p_ = std::max(0.0, p_ - std::max(1.0, double(Size(2)) / double(Size(3))));
      }
      if (full()) victim = ArcReplace(where == 3);
      Push(1, id);
      return victim;
    }
    const size_t t1 = Size(0), b1 = Size(2);
    if (t1 + b1 >= cap_) {
      if (t1 < cap_) {
        PopBack(2);
        if (full()) victim = ArcReplace(false);
      } else {
        victim = PopBack(0);
      }
    } else {
      const size_t total = t1 + b1 + Size(1) + Size(3);
      if (total >= cap_) {
        if (total >= 2 * cap_ && Size(3) > 0) PopBack(3);
        if (full()) victim = ArcReplace(false);
      }
    }
    Push(0, id);
    return victim;
  }

  std::optional<size_t> S3EvictMain() {
    while (auto t = Back(1)) {
      if (blocks_[*t].freq >= 1) {
        --blocks_[*t].freq;
        Push(1, *t);
        continue;
      }
      blocks_[*t].list = kNone;
      return t;
    }
    return std::nullopt;
  }
  std::optional<size_t> S3Miss(size_t id) {
    std::optional<size_t> victim;
    if (Size(0) + Size(1) >= cap_) {
      if (Size(1) <= s3_main_cap_ && Size(0) > 0) {
        for (;;) {
          auto t = PopBack(0);
          if (!t) {
            victim = S3EvictMain();
            break;
          }
          if (blocks_[*t].freq >= 2) {
            blocks_[*t].freq = 0;
            Push(1, *t);
            continue;
          }
          Push(2, *t);
          if (Size(2) > s3_ghost_cap_) PopBack(2);
          victim = t;
          break;
        }
      } else {
        victim = S3EvictMain();
      }
    }
    if (blocks_[id].list == 2) {
      Push(1, id);
    } else {
      Push(BackFromGhost(id) ? 1 : 0, id);
    }
    blocks_[id].freq = 0;
    return victim;
  }

  std::optional<size_t> SieveMiss(size_t id) {
    std::optional<size_t> victim;
    if (Size(0) >= cap_) {
      std::optional<size_t> o = hand_ ? hand_ : Back(0);
      while (blocks_[*o].visited) {
        blocks_[*o].visited = false;
        o = Newer(0, *o);
        if (!o) o = Back(0);
      }
      hand_ = Newer(0, *o);
      blocks_[*o].list = kNone;
      victim = o;
    }
    Push(0, id);
    blocks_[id].visited = Returning(id);
    return victim;
  }

  unsigned TinyFreq(size_t id) const {
    return sketch_->Estimate(blocks_[id].key);  // persist adds nothing: the sketch is keyed
  }
  std::optional<size_t> TinyMiss(size_t id) {
    sketch_->Increment(blocks_[id].key);
    Push(0, id);
    const size_t main = Size(1) + Size(2);
    auto main_victim = [&]() -> std::optional<size_t> {
      auto v = Back(1);
      return v ? v : Back(2);
    };
    if (Size(0) > window_cap_) {
      const size_t cand = *PopBack(0);
      if (Size(0) + main + 1 <= cap_) {
        Push(1, cand);
        return std::nullopt;
      }
      auto v = main_victim();
      if (!v) return cand;
      if (TinyFreq(cand) > TinyFreq(*v)) {
        blocks_[*v].list = kNone;
        Push(1, cand);
        return v;
      }
      return cand;
    }
    if (Size(0) + main > cap_) {
      auto v = main_victim();
      if (!v) v = Back(0);
      blocks_[*v].list = kNone;
      return v;
    }
    return std::nullopt;
  }

  EngineOptions o_;
  Kind kind_;
  double alpha_ = 0;
  size_t cap_;
  size_t small_cap_, s3_main_cap_, s3_ghost_cap_, window_cap_, protected_cap_;
  std::unique_ptr<CountMinSketch> sketch_;
  std::vector<B> blocks_;
  std::map<BlockKey, size_t> live_;
  std::deque<Ghost> ghosts_;
  uint64_t seq_ = 0, stamp_ = 0, qstamp_ = 0, tick_ = 0;
  double p_ = 0;  // ARC's T1 target, real-valued
  std::optional<size_t> hand_;
};

}  // namespace cxltier::engine::testing
