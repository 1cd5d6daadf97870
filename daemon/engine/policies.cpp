// The eviction policies. Exact definitions: docs/policies.md.
#include <algorithm>
#include <array>
#include <cassert>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "engine/count_min.h"
#include "engine/keyed_hash.h"
#include "engine/policy.h"
#include "engine/slot_heap.h"
#include "engine/slot_list.h"

namespace cxltier::engine {

namespace {

// EmaOrderKey with log(1 - alpha) given: the one place the key is computed.
double EmaOrderKeyWith(double score, uint64_t time, double log_keep) {
  // score <= 0 gives -inf: such blocks order by touch_seq alone.
  return std::log(score) - static_cast<double>(time) * log_keep;
}

}  // namespace

double EmaOrderKey(double score, uint64_t time, double alpha) {
  return EmaOrderKeyWith(score, time, std::log1p(-alpha));
}

namespace {

// Most-recently-used first; evicts the least recently touched block.
class LruPolicy final : public Policy {
 public:
  std::string Name() const override { return "lru"; }
  double Score(const BlockState& st, double, uint64_t, bool, const Touch&) const override {
    return static_cast<double>(st.touch_seq);
  }
  void Reserve(size_t n) override { lists_.Reserve(n); }
  void OnHit(Slot s, const Touch&) override { lists_.MoveToFront(0, s); }
  Slot OnMiss(Slot s, const Touch&) override {
    const Slot victim = lists_.Size(0) >= capacity_ ? lists_.PopBack(0) : kNoSlot;
    lists_.PushFront(0, s);
    return victim;
  }
  void Erase(Slot s) override { lists_.Remove(s); }
  Slot EvictOne() override { return lists_.Size(0) > 0 ? lists_.PopBack(0) : kNoSlot; }

 private:
  SlotLists lists_{1};
};

// Base for policies that evict the minimum of a (primary, touch_seq) key.
class HeapPolicy : public Policy {
 public:
  void Reserve(size_t n) override { heap_.Reserve(n); }
  void OnHit(Slot s, const Touch& t) override { heap_.Set(s, Key(s, t), state(s).touch_seq); }
  Slot OnMiss(Slot s, const Touch& t) override {
    const Slot victim = heap_.Size() >= capacity_ ? heap_.Pop() : kNoSlot;
    heap_.Set(s, Key(s, t), state(s).touch_seq);
    return victim;
  }
  void Erase(Slot s) override { heap_.Erase(s); }
  Slot EvictOne() override { return heap_.Size() > 0 ? heap_.Pop() : kNoSlot; }

 protected:
  virtual double Key(Slot s, const Touch& t) const = 0;
  SlotHeap heap_;
};

// Score = touch count; ties go to the older touch. Blocks sit in one FIFO per
// count ("frequency buckets"): a touch moves a block to the back of the next
// count's bucket, so within a bucket blocks are in touch order, and the victim
// is the front of the lowest bucket. Each block keeps its bucket's iterator,
// and a touch's new bucket is the one right after its old one (or new, put
// there by hint): a hit costs no search at all, only a miss looks its count up.
class LfuPolicy final : public Policy {
 public:
  std::string Name() const override { return "lfu"; }
  double Score(const BlockState& st, double, uint64_t, bool, const Touch&) const override {
    return static_cast<double>(st.touch_count);
  }
  void Reserve(size_t n) override { ReserveFor(links_, n); }
  void OnHit(Slot s, const Touch&) override {
    const auto next = Unlink(s);
    Append(s, state(s).touch_count, next);
  }
  Slot OnMiss(Slot s, const Touch&) override {
    const Slot victim = members_ >= capacity_ ? EvictOne() : kNoSlot;
    const uint32_t count = state(s).touch_count;
    Append(s, count, buckets_.lower_bound(count));
    return victim;
  }
  void Erase(Slot s) override {
    if (s < links_.size() && links_[s].member) Unlink(s);
  }
  Slot EvictOne() override {
    if (members_ == 0) return kNoSlot;
    const Slot victim = buckets_.begin()->second.front;
    Unlink(victim);
    return victim;
  }
  void Prefetch(Slot s) const override {
    if (s < links_.size()) __builtin_prefetch(&links_[s], 1);
  }

 private:
  struct Bucket {
    Slot front = kNoSlot, back = kNoSlot;
  };
  using Buckets = std::map<uint32_t, Bucket>;
  struct Link {
    Slot prev = kNoSlot, next = kNoSlot;
    bool member = false;
    Buckets::iterator bucket;  // valid while member
  };
  // `hint`: the first bucket whose count is not below `count` (or end()).
  void Append(Slot s, uint32_t count, Buckets::iterator hint) {
    GrowFor(links_, s);
    const auto it = hint != buckets_.end() && hint->first == count
                        ? hint
                        : buckets_.emplace_hint(hint, count, Bucket{});
    Bucket& b = it->second;
    links_[s] = Link{b.back, kNoSlot, true, it};
    if (b.back != kNoSlot) links_[b.back].next = s;
    b.back = s;
    if (b.front == kNoSlot) b.front = s;
    ++members_;
  }
  // Returns the bucket after s's (still valid if s's bucket was erased).
  Buckets::iterator Unlink(Slot s) {
    Link& l = links_[s];
    const auto it = l.bucket;
    Bucket& b = it->second;
    if (l.prev != kNoSlot)
      links_[l.prev].next = l.next;
    else
      b.front = l.next;
    if (l.next != kNoSlot)
      links_[l.next].prev = l.prev;
    else
      b.back = l.prev;
    const auto next = std::next(it);
    if (b.front == kNoSlot) buckets_.erase(it);
    l = Link{};
    --members_;
    return next;
  }

  std::vector<Link> links_;
  Buckets buckets_;
  size_t members_ = 0;
};

// An EMA's arithmetic for one alpha, with what does not change per touch
// computed once: (1 - alpha)^k for the elapsed times k below kTable (each
// entry is the very std::pow the touch would call, so the results are the
// same to the bit), and log(1 - alpha) for the ordering key.
class EmaMath {
 public:
  explicit EmaMath(double alpha) : alpha_(alpha), log_keep_(std::log1p(-alpha)) {
    for (size_t k = 0; k < kTable; ++k) keep_[k] = std::pow(1.0 - alpha, static_cast<double>(k));
  }
  double alpha() const { return alpha_; }
  // The EMA after one touch: the value at `prev_time` decayed to now, plus
  // this touch's share. A previous touch ahead of now decays nothing
  // (Elapsed is 0), not (1-alpha)^(~2^64) = 0.
  double After(double prev, uint64_t prev_time, bool fresh, const Touch& t) const {
    // 0.0 + x, not x: as the decayed part of a fresh one (0.0) plus this
    // touch's share always was, -0.0 included.
    if (fresh) return 0.0 + alpha_ * t.obs;
    const uint64_t dt = Elapsed(t.now, prev_time);
    const double keep = dt < kTable ? keep_[dt] : std::pow(1.0 - alpha_, static_cast<double>(dt));
    return prev * keep + alpha_ * t.obs;
  }
  // EmaOrderKey, with log(1 - alpha) computed once.
  double OrderKey(double score, uint64_t time) const {
    return EmaOrderKeyWith(score, time, log_keep_);
  }

 private:
  static constexpr size_t kTable = 512;
  double alpha_, log_keep_;
  std::array<double, kTable> keep_;
};

// The alpha of "ema:<alpha>" (the text after "ema:"), if it is one: strictly
// between 0 and 1.
std::optional<double> ParseAlpha(std::string_view text) {
  double alpha = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), alpha);
  if (ec != std::errc() || end != text.data() + text.size() || !(alpha > 0.0 && alpha < 1.0)) {
    return std::nullopt;
  }
  return alpha;
}

// Score = exponential moving average of observations on the workload clock.
class EmaPolicy final : public HeapPolicy {
 public:
  explicit EmaPolicy(double alpha, std::string name) : ema_(alpha), name_(std::move(name)) {}
  std::string Name() const override { return name_; }
  double Score(const BlockState&, double prev_score, uint64_t prev_time, bool fresh,
               const Touch& t) const override {
    return ema_.After(prev_score, prev_time, fresh, t);
  }
  double Heat(Slot s) const override { return ema_.OrderKey(state(s).score, state(s).touch_time); }

 private:
  double Key(Slot s, const Touch&) const override {
    return ema_.OrderKey(state(s).score, state(s).touch_time);
  }
  EmaMath ema_;
  std::string name_;
};

// Belady's MIN with forced admission: evicts the member whose next touch is
// farthest away (never-again first; ties go to the older touch).
class MinPolicy final : public HeapPolicy {
 public:
  std::string Name() const override { return "min"; }
  bool NeedsFuture() const override { return true; }
  double Score(const BlockState& st, double, uint64_t, bool, const Touch&) const override {
    return static_cast<double>(st.touch_count);
  }
  void OnHit(Slot s, const Touch& t) override {
    Remember(s, t);
    HeapPolicy::OnHit(s, t);
  }
  Slot OnMiss(Slot s, const Touch& t) override {
    Remember(s, t);
    return HeapPolicy::OnMiss(s, t);
  }
  void Erase(Slot s) override {
    if (s < next_use_.size()) next_use_[s] = kNever;
    HeapPolicy::Erase(s);
  }
  // Below tier 0 too, the sooner the next touch, the hotter.
  double Heat(Slot s) const override {
    return -static_cast<double>(s < next_use_.size() ? next_use_[s] : kNever);
  }

 private:
  void Remember(Slot s, const Touch& t) {
    GrowFor(next_use_, s, kNever);
    next_use_[s] = t.next_use;
  }
  // Min-heap on -next_use = max-heap on next_use.
  double Key(Slot, const Touch& t) const override { return -static_cast<double>(t.next_use); }
  std::vector<uint64_t> next_use_;  // by slot: the next touch its last touch foretold
};

// Adaptive Replacement Cache (Megiddo and Modha, FAST'03).
class ArcPolicy final : public Policy {
 public:
  std::string Name() const override { return "arc"; }
  double Score(const BlockState& st, double, uint64_t, bool, const Touch&) const override {
    return static_cast<double>(st.touch_count);
  }
  void Reserve(size_t n) override { lists_.Reserve(n); }
  void OnHit(Slot s, const Touch&) override { lists_.MoveToFront(kT2, s); }

  Slot OnMiss(Slot s, const Touch&) override {
    const size_t c = capacity_;
    Slot victim = kNoSlot;
    if (lists_.Contains(kB1, s)) {
      const double delta = std::max(
          1.0, static_cast<double>(lists_.Size(kB2)) / static_cast<double>(lists_.Size(kB1)));
      p_ = std::min(static_cast<double>(c), p_ + delta);
      if (Full()) victim = Replace(false);
      lists_.Remove(s);
      lists_.PushFront(kT2, s);
      return victim;
    }
    if (lists_.Contains(kB2, s)) {
      const double delta = std::max(
          1.0, static_cast<double>(lists_.Size(kB1)) / static_cast<double>(lists_.Size(kB2)));
      p_ = std::max(0.0, p_ - delta);
      if (Full()) victim = Replace(true);
      lists_.Remove(s);
      lists_.PushFront(kT2, s);
      return victim;
    }
    const size_t t1 = lists_.Size(kT1), b1 = lists_.Size(kB1);
    if (t1 + b1 >= c) {
      if (t1 < c) {
        lists_.PopBack(kB1);
        if (Full()) victim = Replace(false);
      } else {
        victim = lists_.PopBack(kT1);  // dropped without a ghost entry
      }
    } else {
      const size_t total = t1 + b1 + lists_.Size(kT2) + lists_.Size(kB2);
      if (total >= c) {
        if (total >= 2 * c && lists_.Size(kB2) > 0) lists_.PopBack(kB2);
        if (Full()) victim = Replace(false);
      }
    }
    // A block back from the ghost store enters T1 as any new block: ARC's own
    // B1 and B2 are its history. Entering T2 instead cost up to 0.55 points
    // where sessions are released on pause (docs/policies.md) and gained
    // nothing on any row of docs/results.md.
    lists_.PushFront(kT1, s);
    return victim;
  }

  void Erase(Slot s) override { lists_.Remove(s); }
  Slot EvictOne() override {
    return lists_.Size(kT1) + lists_.Size(kT2) > 0 ? Replace(false) : kNoSlot;
  }

 private:
  enum { kT1 = 0, kT2 = 1, kB1 = 2, kB2 = 3 };
  bool Full() const { return lists_.Size(kT1) + lists_.Size(kT2) >= capacity_; }
  Slot Replace(bool in_b2) {
    const double t1 = static_cast<double>(lists_.Size(kT1));
    const bool from_t1 = t1 >= 1 && ((in_b2 && t1 == p_) || t1 > p_ || lists_.Size(kT2) == 0);
    const Slot v = lists_.PopBack(from_t1 ? kT1 : kT2);
    lists_.PushFront(from_t1 ? kB1 : kB2, v);
    return v;
  }

  SlotLists lists_{4};
  // The target size of T1. Real-valued, as in the paper (and libCacheSim):
  // a ghost hit moves it by |B2|/|B1| (or |B1|/|B2|), not by its floor.
  double p_ = 0;
};

// S3-FIFO (Yang et al., SOSP'23): small FIFO, main FIFO with 2-bit counters, ghost FIFO.
class S3FifoPolicy final : public Policy {
 public:
  std::string Name() const override { return "s3fifo"; }
  double Score(const BlockState& st, double, uint64_t, bool, const Touch&) const override {
    return static_cast<double>(st.touch_count);
  }
  void Reserve(size_t n) override {
    lists_.Reserve(n);
    ReserveFor(freq_, n);
  }
  void OnHit(Slot s, const Touch&) override {
    uint8_t& f = Freq(s);
    if (f < 3) ++f;
  }
  Slot OnMiss(Slot s, const Touch&) override {
    const Slot victim = lists_.Size(kS) + lists_.Size(kM) >= capacity_ ? Evict() : kNoSlot;
    if (lists_.Contains(kG, s)) {
      lists_.Remove(s);
      lists_.PushFront(kM, s);
    } else {
      lists_.PushFront(BackFromGhost(s) ? kM : kS, s);
    }
    Freq(s) = 0;
    return victim;
  }
  void Erase(Slot s) override { lists_.Remove(s); }
  Slot EvictOne() override { return lists_.Size(kS) + lists_.Size(kM) > 0 ? Evict() : kNoSlot; }

 protected:
  void OnBind() override {
    small_cap_ = std::max<size_t>(1, capacity_ / 10);
    main_cap_ = capacity_ - std::min(capacity_, small_cap_);
    ghost_cap_ = std::max<size_t>(1, capacity_ * 9 / 10);
  }

 private:
  enum { kS = 0, kM = 1, kG = 2 };
  uint8_t& Freq(Slot s) {
    GrowFor(freq_, s);
    return freq_[s];
  }
  // As libCacheSim's S3FIFO.c (by the paper's authors): S gives the victim
  // unless M is over its share, so S holds more than its share while M has room.
  Slot Evict() {
    return lists_.Size(kM) > main_cap_ || lists_.Size(kS) == 0 ? EvictMain() : EvictSmall();
  }
  Slot EvictSmall() {
    while (lists_.Size(kS) > 0) {
      const Slot t = lists_.PopBack(kS);
      if (Freq(t) >= kMoveToMain) {
        Freq(t) = 0;
        lists_.PushFront(kM, t);
        continue;
      }
      lists_.PushFront(kG, t);
      if (lists_.Size(kG) > ghost_cap_) lists_.PopBack(kG);
      return t;
    }
    return EvictMain();
  }
  Slot EvictMain() {
    while (lists_.Size(kM) > 0) {
      const Slot t = lists_.Back(kM);
      if (Freq(t) >= 1) {
        --Freq(t);
        lists_.MoveToFront(kM, t);
        continue;
      }
      lists_.Remove(t);
      return t;
    }
    return kNoSlot;
  }

  SlotLists lists_{3};
  // Touches while in S that move a block to M when it leaves S.
  static constexpr uint8_t kMoveToMain = 2;
  std::vector<uint8_t> freq_;
  size_t small_cap_ = 1, main_cap_ = 0, ghost_cap_ = 1;
};

// SIEVE (Zhang et al., NSDI'24): a FIFO with a visited bit and a moving hand.
class SievePolicy final : public Policy {
 public:
  std::string Name() const override { return "sieve"; }
  double Score(const BlockState& st, double, uint64_t, bool, const Touch&) const override {
    return static_cast<double>(st.touch_count);
  }
  void Reserve(size_t n) override {
    lists_.Reserve(n);
    ReserveFor(visited_, n);
  }
  void OnHit(Slot s, const Touch&) override { Visited(s) = 1; }
  Slot OnMiss(Slot s, const Touch&) override {
    const Slot victim = lists_.Size(0) >= capacity_ ? Evict() : kNoSlot;
    lists_.PushFront(0, s);
    Visited(s) = Returning(s) ? 1 : 0;
    return victim;
  }
  void Erase(Slot s) override {
    if (hand_ == s) hand_ = lists_.Prev(s);
    lists_.Remove(s);
  }
  Slot EvictOne() override { return lists_.Size(0) > 0 ? Evict() : kNoSlot; }

 private:
  uint8_t& Visited(Slot s) {
    GrowFor(visited_, s);
    return visited_[s];
  }
  Slot Evict() {
    Slot o = hand_ != kNoSlot ? hand_ : lists_.Back(0);
    while (Visited(o)) {
      Visited(o) = 0;
      o = lists_.Prev(o);
      if (o == kNoSlot) o = lists_.Back(0);
    }
    hand_ = lists_.Prev(o);
    lists_.Remove(o);
    return o;
  }

  SlotLists lists_{1};
  std::vector<uint8_t> visited_;
  Slot hand_ = kNoSlot;
};

// W-TinyLFU (Einziger et al., TOS'17; as in Caffeine): a 1% LRU window, a
// segmented-LRU main area (20% probation, 80% protected) and a count-min
// sketch that decides whether the window's victim replaces main's victim.
class TinyLfuPolicy final : public Policy {
 public:
  std::string Name() const override { return "tinylfu"; }
  double Score(const BlockState& st, double, uint64_t, bool, const Touch&) const override {
    return static_cast<double>(st.touch_count);
  }
  void Reserve(size_t n) override { lists_.Reserve(n); }
  void OnHit(Slot s, const Touch&) override {
    sketch_->Increment(state(s).key);
    switch (lists_.ListOf(s)) {
      case kW:
        lists_.MoveToFront(kW, s);
        break;
      case kProbation:
        lists_.Remove(s);
        lists_.PushFront(kProtected, s);
        if (lists_.Size(kProtected) > protected_cap_) {
          lists_.PushFront(kProbation, lists_.PopBack(kProtected));
        }
        break;
      default:
        lists_.MoveToFront(kProtected, s);
        break;
    }
  }
  Slot OnMiss(Slot s, const Touch&) override {
    sketch_->Increment(state(s).key);
    lists_.PushFront(kW, s);
    const size_t main = lists_.Size(kProbation) + lists_.Size(kProtected);
    if (lists_.Size(kW) > window_cap_) {
      const Slot cand = lists_.PopBack(kW);
      if (lists_.Size(kW) + main + 1 <= capacity_) {
        lists_.PushFront(kProbation, cand);
        return kNoSlot;
      }
      const Slot victim = MainVictim();
      if (victim == kNoSlot) return cand;
      if (Freq(cand) > Freq(victim)) {
        lists_.Remove(victim);
        lists_.PushFront(kProbation, cand);
        return victim;
      }
      return cand;
    }
    return lists_.Size(kW) + main > capacity_ ? EvictOne() : kNoSlot;
  }
  void Erase(Slot s) override { lists_.Remove(s); }
  Slot EvictOne() override {
    Slot victim = MainVictim();
    if (victim == kNoSlot) victim = lists_.Back(kW);
    if (victim != kNoSlot) lists_.Remove(victim);
    return victim;
  }

 protected:
  void OnBind() override {
    window_cap_ = std::max<size_t>(1, capacity_ / 100);
    const size_t main = capacity_ > window_cap_ ? capacity_ - window_cap_ : 0;
    protected_cap_ = main * 8 / 10;
    sketch_ = std::make_unique<CountMinSketch>(std::max<size_t>(16, capacity_),
                                               10 * std::max<size_t>(1, capacity_), key_seed_);
  }

 private:
  enum { kW = 0, kProbation = 1, kProtected = 2 };
  Slot MainVictim() const {
    const Slot v = lists_.Back(kProbation);
    return v != kNoSlot ? v : lists_.Back(kProtected);
  }
  // With persist as with reset: the sketch is keyed by block, outlives
  // eviction and release, and ages by halving. (The engine's lifetime count,
  // which never ages, used to be a floor here: it cost 25 to 30 points.)
  unsigned Freq(Slot s) const { return sketch_->Estimate(state(s).key); }

  SlotLists lists_{3};
  std::unique_ptr<CountMinSketch> sketch_;
  size_t window_cap_ = 1, protected_cap_ = 0;
};

// EMA over a per-slot score of its own, for an expert of AdaptivePolicy that
// is not the one whose score the engine keeps. Its history follows the slot:
// kept while the block stays (in either tier), lost when it is released.
class OwnEmaPolicy final : public Policy {
 public:
  explicit OwnEmaPolicy(double alpha) : ema_(alpha) {}
  std::string Name() const override { return "ema:" + std::to_string(ema_.alpha()); }
  double Score(const BlockState&, double prev, uint64_t, bool, const Touch&) const override {
    return prev;
  }
  void Reserve(size_t n) override {
    heap_.Reserve(n);
    ReserveFor(own_, n);
  }
  void OnHit(Slot s, const Touch& t) override {
    Update(s, t);
    heap_.Set(s, Key(s), state(s).touch_seq);
  }
  Slot OnMiss(Slot s, const Touch& t) override {
    Update(s, t);
    const Slot victim = heap_.Size() >= capacity_ ? heap_.Pop() : kNoSlot;
    heap_.Set(s, Key(s), state(s).touch_seq);
    return victim;
  }
  void Erase(Slot s) override { heap_.Erase(s); }
  Slot EvictOne() override { return heap_.Size() > 0 ? heap_.Pop() : kNoSlot; }
  double Heat(Slot s) const override {
    return s < own_.size() && own_[s].generation == state(s).generation ? Key(s) : -HUGE_VAL;
  }
  void OnResume(Slot s, uint64_t idle_for, uint64_t now) override {
    if (s < own_.size() && own_[s].generation == state(s).generation) {
      own_[s].time = Resumed(own_[s].time, idle_for, now);
    }
  }

 private:
  struct Own {
    double score = 0;
    uint64_t time = 0;
    uint32_t generation = 0;
  };
  void Update(Slot s, const Touch& t) {
    GrowFor(own_, s);
    Own& o = own_[s];
    const BlockState& st = state(s);
    // A new occupant of the slot, or a block the engine reset (its count
    // restarted on this touch; a placement ahead is no touch): no history.
    const bool fresh = o.generation != st.generation || (st.touch_count <= 1 && !t.ahead);
    o = Own{ema_.After(o.score, o.time, fresh, t), t.now, st.generation};
  }
  double Key(Slot s) const { return ema_.OrderKey(own_[s].score, own_[s].time); }

  EmaMath ema_;
  SlotHeap heap_;
  std::vector<Own> own_;
};

// Miniature simulations (SHARDS: Waldspurger et al., ATC'17; docs/policies.md,
// "shards"). One full instance of the leading candidate holds the set the
// engine sees. Every candidate also runs as a miniature: a policy of its own
// over the keys whose fixed hash falls below a threshold (a spatial sample
// at rate R), with dense slots, its own block states and capacity round(C x
// R). Each sampled touch is fed to every miniature; the leader changes to the
// candidate whose miniature leads the leader's miniature by a significant
// margin (a sign test, as adaptive's). The new leader's full instance starts
// empty and takes the set over block by block from the former leader's
// (ShardsPolicy::Switch), so the set is unchanged by the switch.
// EMA whose average is kept in the block's policy_word (a float), for the
// second ema candidate of ShardsPolicy, which writes it (Word): it is kept
// with the block as its score is, restored from ghosts and zeroed by reset.
float WordFloat(uint32_t w) {
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
uint32_t FloatWord(float f) {
  uint32_t w;
  std::memcpy(&w, &f, sizeof w);
  return w;
}

class WordEmaPolicy final : public HeapPolicy {
 public:
  WordEmaPolicy(double alpha, std::string name) : ema_(alpha), name_(std::move(name)) {}
  std::string Name() const override { return name_; }
  double Score(const BlockState&, double prev, uint64_t, bool, const Touch&) const override {
    return prev;
  }
  double Heat(Slot s) const override { return Key(s, Touch{}); }

 private:
  double Key(Slot s, const Touch&) const override {
    return ema_.OrderKey(WordFloat(state(s).policy_word), state(s).touch_time);
  }
  EmaMath ema_;
  std::string name_;
};

// The sample's hash, keyed by the engine's secret (Policy::SetKeySeed,
// KeyedHash): a client that cannot know the secret cannot choose keys that
// are sampled, nor keys that collide in the sample's index. With seed 0 (the
// simulator's) the sample is the same keys in every run. Its top 32 bits are
// compared with the threshold.
struct ShardsKeyHash {
  uint64_t seed = 0;
  uint64_t operator()(const BlockKey& key) const {
    // Salted, so that the sample is not the key index's low hashes.
    return KeyedHash(BlockKey{key.hi ^ 0x5348415244535348ULL, key.lo}, seed);
  }
};
uint64_t ShardsHash(const BlockKey& key, const ShardsKeyHash& hash = ShardsKeyHash()) {
  return hash(key) >> 32;
}
uint64_t ShardsThreshold(double rate) {
  return rate >= 1.0 ? (uint64_t{1} << 32)
                     : static_cast<uint64_t>(rate * static_cast<double>(uint64_t{1} << 32));
}

class ShardsPolicy final : public Policy {
 public:
  struct Settings {
    double rate = 0.01;      // the sampling rate at large capacities
    uint32_t min_cap = 256;  // a miniature's capacity at least (R grows for small C)
    uint32_t epoch = 256;    // sampled touches between tests
    double decay = 0.98;     // per epoch, of the hits and disagreements counted
    double z = 3;            // the lead a switch needs, in standard deviations
    double gain = 0.01;      // and as a share of the sampled touches (decayed alike)
    uint32_t warm = 8;       // no switch before warm x a miniature's capacity sampled touches
    // Keys in the sample at most, live or released: each costs every
    // miniature a state, whatever the traffic (a new key past it takes a
    // released key's place, or stays out of the sample while none is).
    uint32_t keys = 65536;
  };
  ShardsPolicy(std::string name, std::vector<std::string> candidates, Settings settings)
      : name_(std::move(name)), specs_(std::move(candidates)), set_(settings) {
    // The block's score is the first ema candidate's (a full ema reads it),
    // else the first candidate's.
    size_t scorer = 0;
    for (size_t k = 0; k < specs_.size(); ++k) {
      if (specs_[k].starts_with("ema:")) {
        scorer = k;
        break;
      }
    }
    score_spec_ = specs_[scorer];
    scorer_ = Make(score_spec_, true);
    // The second ema candidate, if any, keeps its average in policy_word.
    for (size_t k = scorer + 1; k < specs_.size(); ++k) {
      if (specs_[k].starts_with("ema:") && specs_[k] != score_spec_) {
        word_spec_ = specs_[k];
        word_ema_.emplace(*ParseAlpha(std::string_view(word_spec_).substr(4)));
        break;
      }
    }
    for (const std::string& spec : specs_) {
      Mini m;
      m.policy = Make(spec, false);
      minis_.push_back(std::move(m));
    }
    hits_.assign(minis_.size(), 0);
    epoch_hits_.assign(minis_.size(), 0);
    apart_.assign(minis_.size() * minis_.size(), 0);
    epoch_apart_.assign(minis_.size() * minis_.size(), 0);
  }
  std::string Name() const override { return name_; }
  double Score(const BlockState& st, double prev_score, uint64_t prev_time, bool fresh,
               const Touch& t) const override {
    return scorer_->Score(st, prev_score, prev_time, fresh, t);
  }
  uint32_t Word(const BlockState& st, uint64_t prev_time, bool fresh,
                const Touch& t) const override {
    if (word_spec_.empty()) return st.policy_word;
    return FloatWord(
        static_cast<float>(word_ema_->After(WordFloat(st.policy_word), prev_time, fresh, t)));
  }
  void Reserve(size_t n) override {
    reserved_ = std::max(reserved_, n);
    full_->Reserve(n);
    if (former_) former_->Reserve(n);
  }
  void Prefetch(Slot s) const override { full_->Prefetch(s); }
  // The leader's heat, for the former's blocks too: the heats of one epoch
  // are compared with each other (an account's coldest block, a group's
  // order), so they are on one scale (an ema's key is not a count).
  double Heat(Slot s) const override { return full_->Heat(s); }
  uint64_t HeatEpoch() const override { return switches_; }
  void OnResume(Slot s, uint64_t idle_for, uint64_t now) override {
    (FormersBlock(s) ? *former_ : *full_).OnResume(s, idle_for, now);
  }
  void OnHit(Slot s, const Touch& t) override {
    if (FormersBlock(s)) {
      // The former leader's block joins the leader's set as a new block
      // would (there is room: the leader's and the former's blocks are the
      // set, at most its capacity).
      former_->Erase(s);
      LeftFormer();
      [[maybe_unused]] const Slot none = full_->OnMiss(s, t);
      assert(none == kNoSlot);
      Joined(s);
    } else {
      full_->OnHit(s, t);
    }
    if (Switches(s, t)) Switch();
  }
  Slot OnMiss(Slot s, const Touch& t) override {
    Slot victim = full_->OnMiss(s, t);
    Joined(s);
    if (victim != kNoSlot) {
      --full_size_;
    } else if (former_size_ > 0 && full_size_ + former_size_ > capacity_) {
      // The leader's room is the former's blocks': they leave first.
      victim = EvictFormer();
    }
    if (Switches(s, t)) Switch();
    return victim;
  }
  Slot EvictOne() override {
    if (former_size_ > 0) return EvictFormer();
    const Slot v = full_->EvictOne();
    if (v != kNoSlot) --full_size_;
    return v;
  }
  size_t Leader() const override { return leader_; }
  uint64_t LeaderChanges() const override { return switches_; }
  bool FollowRecordedLeaders() override {
    recorded_ = true;
    return true;
  }
  bool FollowLeader(size_t k, bool now) override {
    if (!recorded_ || k >= minis_.size()) return false;
    if (now) {
      pending_ = k;
      Switch();
    } else {
      told_ = k;
    }
    return true;
  }
  void Erase(Slot s) override {
    if (FormersBlock(s)) {
      LeftFormer();
    } else if (state(s).flags & kFlagInTarget) {
      --full_size_;
    }
    full_->Erase(s);
    if (former_) former_->Erase(s);  // the block, or its history there
    if (!Sampled(s)) return;
    const auto it = dense_.find(state(s).key);
    if (it == dense_.end()) return;
    const uint32_t d = it->second;
    for (Mini& m : minis_) {
      m.policy->Erase(d);
      if (d < m.member.size()) m.member[d] = 0;
      BlockState& st = m.states[d];
      if (persistence_ == Persistence::kReset) {
        Forget(st);
      } else {
        st.flags |= kFlagRestored;  // as a ghost comes back
        ++st.generation;
      }
    }
    released_.push_back({d, ++stamp_[d]});
    released_now_[d] = 1;
    while (released_.size() > ghost_limit_) Reclaim();
  }

  ShardsView View() const {
    ShardsView v;
    v.leader = leader_;
    v.leader_name = specs_[leader_];
    v.switches = switches_;
    v.rate = rate_;
    v.mini_capacity = mini_cap_;
    v.sampled_touches = sampled_touches_;
    v.sampled_keys = dense_.size();
    v.leader_blocks = full_size_;
    v.former_blocks = former_size_;
    v.formers = former_ ? 1 : 0;
    for (const Mini& m : minis_) v.sampled_hits.push_back(m.hits);
    return v;
  }

 protected:
  void OnBind() override {
    const double c = static_cast<double>(std::max<size_t>(1, capacity_));
    rate_ = std::min(1.0, std::max(set_.rate, set_.min_cap / c));
    threshold_ = ShardsThreshold(rate_);
    mini_cap_ = capacity_ == 0 ? 0
                               : std::max<size_t>(1, static_cast<size_t>(std::llround(
                                                         static_cast<double>(capacity_) * rate_)));
    ghost_limit_ = std::max<size_t>(4096, static_cast<size_t>(rate_ * (1 << 20)));
    hash_ = ShardsKeyHash{key_seed_};
    dense_ = decltype(dense_)(0, hash_);
    for (Mini& m : minis_) {
      m.policy->SetKeySeed(key_seed_);
      m.policy->Bind(&m.states, mini_cap_, persistence_, Mode::kDemand);
    }
    BindFull(leader_);
  }

 private:
  struct Mini {
    std::unique_ptr<Policy> policy;
    std::vector<BlockState> states;  // by dense slot
    std::vector<uint8_t> member;     // in this miniature's set
    uint64_t seq = 0;
    uint64_t hits = 0;
    bool hit = false;
  };

  // A candidate: a full instance reads the engine's states, where only the
  // scoring ema's score is kept, so another ema keeps its own; a miniature
  // keeps its own states, so every ema there is an ema.
  std::unique_ptr<Policy> Make(const std::string& spec, bool full) const {
    if (spec.starts_with("ema:")) {
      const double alpha = *ParseAlpha(std::string_view(spec).substr(4));
      if (full && spec == word_spec_) return std::make_unique<WordEmaPolicy>(alpha, spec);
      if (full && spec != score_spec_) return std::make_unique<OwnEmaPolicy>(alpha);
      return std::make_unique<EmaPolicy>(alpha, spec);
    }
    return std::move(MakePolicy(spec).value());
  }

  // The full instance of candidate k, bound to the engine's states.
  void BindFull(size_t k) {
    full_ = Make(specs_[k], true);
    full_->SetKeySeed(key_seed_);
    full_->Bind(states_, capacity_, persistence_, mode_);
  }

  bool Sampled(Slot s) const { return ShardsHash(state(s).key, hash_) < threshold_; }

  static void Forget(BlockState& st) {
    st.score = 0;
    st.touch_count = 0;
    st.touch_time = 0;
    st.flags &= static_cast<uint8_t>(~kFlagRestored);
  }

  // The dense slot of `key`, made on its first sampled touch; kNoDense when
  // the sample holds `keys` keys, none of them released.
  static constexpr uint32_t kNoDense = UINT32_MAX;
  uint32_t Dense(const BlockKey& key) {
    if (const auto found = dense_.find(key); found != dense_.end()) {
      released_now_[found->second] = 0;
      return found->second;
    }
    while (dense_.size() >= set_.keys && !released_.empty()) Reclaim();
    if (dense_.size() >= set_.keys) return kNoDense;
    const auto it = dense_.try_emplace(key, 0).first;
    uint32_t d;
    if (!free_.empty()) {
      d = free_.back();
      free_.pop_back();
    } else {
      d = static_cast<uint32_t>(keys_.size());
      keys_.emplace_back();
      stamp_.push_back(0);
      released_now_.push_back(0);
      for (Mini& m : minis_) {
        m.states.emplace_back();
        m.member.push_back(0);
      }
    }
    keys_[d] = key;
    released_now_[d] = 0;
    for (Mini& m : minis_) {
      const uint32_t g = m.states[d].generation + 1;
      m.states[d] = BlockState{};
      m.states[d].key = key;
      m.states[d].generation = g;
    }
    it->second = d;
    return d;
  }

  // The oldest released key still released leaves the sample's history.
  void Reclaim() {
    const auto [d, stamp] = released_.front();
    released_.pop_front();
    if (stamp != stamp_[d] || !released_now_[d]) return;
    dense_.erase(keys_[d]);
    released_now_[d] = 0;
    free_.push_back(d);
  }

  // One sampled touch, in every miniature (demand semantics, as the engine:
  // count, time, order and score first, then a hit or an admission).
  // True when the leader is to change (to pending_).
  bool FeedMinis(Slot s, const Touch& t) {
    const uint32_t d = Dense(state(s).key);
    if (d == kNoDense) return false;
    ++sampled_touches_;
    for (Mini& m : minis_) {
      BlockState& st = m.states[d];
      const double prev_score = st.score;
      const uint64_t prev_time = st.touch_time;
      const bool fresh = st.touch_count == 0;
      if (st.touch_count != std::numeric_limits<uint32_t>::max()) ++st.touch_count;
      st.touch_time = t.now;
      st.touch_seq = ++m.seq;
      st.score = m.policy->Score(st, prev_score, prev_time, fresh, t);
      if (mini_cap_ == 0) {
        m.hit = false;
        continue;
      }
      if (m.member[d]) {
        m.hit = true;
        ++m.hits;
        m.policy->OnHit(d, t);
        continue;
      }
      m.hit = false;
      const Slot v = m.policy->OnMiss(d, t);
      m.member[d] = 1;
      if (v != kNoSlot) {
        m.member[v] = 0;
        if (persistence_ == Persistence::kReset) Forget(m.states[v]);
      }
    }
    // Hits and, for every pair, the touches one hit and the other missed.
    const size_t n = minis_.size();
    for (size_t k = 0; k < n; ++k) {
      if (!minis_[k].hit) continue;
      ++epoch_hits_[k];
      for (size_t j = 0; j < n; ++j) epoch_apart_[k * n + j] += !minis_[j].hit;
    }
    return ++epoch_touches_ >= set_.epoch && EndEpoch();
  }

  bool EndEpoch() {
    window_ = window_ * set_.decay + epoch_touches_;
    epoch_touches_ = 0;
    const size_t n = minis_.size();
    for (size_t k = 0; k < n; ++k) {
      hits_[k] = hits_[k] * set_.decay + epoch_hits_[k];
      epoch_hits_[k] = 0;
      for (size_t j = 0; j < n; ++j) {
        apart_[k * n + j] = apart_[k * n + j] * set_.decay + epoch_apart_[k * n + j];
        epoch_apart_[k * n + j] = 0;
      }
    }
    size_t best = leader_;
    double best_lead = 0;
    for (size_t k = 0; k < n; ++k) {
      // A sign test: were k and the leader equally good, the difference of
      // their hits would be about normal with variance the touches where
      // they differ. Kept across switches: going back needs a lead as large.
      const double lead = hits_[k] - hits_[leader_];
      const double differ = apart_[k * n + leader_] + apart_[leader_ * n + k];
      // Only a gain worth a switch: a switch loses the new leader's
      // history (ARC's ghosts, W-TinyLFU's sketch).
      if (lead > set_.z * std::sqrt(differ) && lead > set_.gain * window_ && lead > best_lead) {
        best = k;
        best_lead = lead;
      }
    }
    // Cold miniatures say little: every policy hits alike while the sets fill.
    if (sampled_touches_ < uint64_t{set_.warm} * mini_cap_) return false;
    pending_ = best;
    return best != leader_;
  }

  // Whether the touch of `s` changes the leader (to pending_): by the
  // miniatures' test, or, replaying a recording, where it was told to.
  bool Switches(Slot s, const Touch& t) {
    const bool chose = Sampled(s) && !t.ahead && FeedMinis(s, t);
    // One handover at a time: a new leader waits until the former leader's
    // blocks are gone (Switch). A replay switches where the recording did.
    if (!recorded_) return chose && !former_;
    if (t.ahead || told_ == kNoLeader) return false;
    pending_ = std::exchange(told_, kNoLeader);
    return true;
  }

  // The leader changes to pending_ without a pass over the set. The
  // leader's instance becomes the former leader's, with its blocks; the new
  // leader's starts empty. The set is the leader's blocks and the former's:
  // a former's block the engine touches joins the leader's set (a hit, for
  // the engine), and while the former holds blocks, the room the set needs
  // is made by its own next eviction (Policy::EvictOne), so the leader's
  // blocks stay. The set is unchanged by the switch itself. A switch at a
  // million blocks used to rebuild the new leader from the whole set in
  // touch order (128 ms on this VM, on the I/O thread: BM_ShardsSwitch built
  // at 692d116, docs/performance.md).
  //
  // The policy's own choice waits for the former to be drained (Switches);
  // a replay changes the leader where the recording says, so a former may
  // still hold blocks then: the leader takes them first (Absorb), which
  // costs a pass over them, so that there is never more than one former.
  void Switch() {
    if (former_) Absorb();
    if (full_size_ > 0) {
      former_ = std::move(full_);
      former_size_ = full_size_;
      full_size_ = 0;
    }
    leader_ = pending_;
    ++switches_;
    BindFull(leader_);
    full_->Reserve(std::max(reserved_, states_->size()));
  }

  // Which instance holds a block of the set during a handover: the leader,
  // if the block joined its set since the switch (it was stamped with the
  // low 32 bits of switches_ then), else the former. Stamps are written
  // only during a handover (a miss in steady state writes no extra line);
  // a stamp left from an earlier one is lower than any later switches_ (2^32
  // switches apart at least before one could match again).
  uint32_t Stamp() const { return static_cast<uint32_t>(switches_); }
  bool FormersBlock(Slot s) const {
    return former_ && (state(s).flags & kFlagInTarget) &&
           (s >= stamp_of_.size() || stamp_of_[s] != Stamp());
  }
  // `s` entered the leader's set.
  void Joined(Slot s) {
    if (former_) {
      GrowFor(stamp_of_, s, uint32_t{0});
      stamp_of_[s] = Stamp();
    }
    ++full_size_;
  }
  // A block left the former's set (evicted, released, or the leader's now).
  void LeftFormer() {
    if (--former_size_ == 0) former_.reset();
  }
  // The former's next victim.
  Slot EvictFormer() {
    const Slot v = former_->EvictOne();
    assert(v != kNoSlot);  // it holds blocks
    LeftFormer();
    return v;
  }
  // The former's blocks join the leader's set, coldest (its next victim)
  // first, as blocks the engine did not touch.
  void Absorb() {
    while (former_) {
      const Slot v = EvictFormer();
      if (v == kNoSlot) continue;  // not expected (it holds blocks); counted down
      [[maybe_unused]] const Slot none =
          full_->OnMiss(v, Touch{0.0, state(v).touch_time, kNever, true});
      assert(none == kNoSlot);
      Joined(v);
    }
  }

 private:
  std::string name_;
  std::vector<std::string> specs_;
  Settings set_;
  std::string score_spec_, word_spec_;  // the emas whose averages the blocks keep
  std::optional<EmaMath> word_ema_;     // word_spec_'s
  std::unique_ptr<Policy> scorer_;      // only its Score is used
  std::unique_ptr<Policy> full_;        // the leader's full instance
  size_t full_size_ = 0;                // its blocks in the set
  std::unique_ptr<Policy> former_;      // the former leader, while it holds blocks
  size_t former_size_ = 0;              // its blocks in the set
  std::vector<uint32_t> stamp_of_;      // by slot: Stamp() when it joined the leader's set
  std::vector<Mini> minis_;
  double rate_ = 1;
  uint64_t threshold_ = uint64_t{1} << 32;
  size_t mini_cap_ = 0, ghost_limit_ = 4096, reserved_ = 0;
  size_t leader_ = 0;
  size_t pending_ = 0;  // the leader the last test chose
  // Replaying a recording: the leader changes only where the recording
  // says (FollowLeader), at the next touch to the candidate told_.
  static constexpr size_t kNoLeader = SIZE_MAX;
  bool recorded_ = false;
  size_t told_ = kNoLeader;
  uint64_t switches_ = 0;
  uint64_t sampled_touches_ = 0;
  uint32_t epoch_touches_ = 0;
  // Decayed every epoch: sampled touches, each miniature's hits, and by pair
  // (k, j) the touches k hit and j missed; the epoch's own counts.
  double window_ = 0;
  std::vector<double> hits_, apart_;
  std::vector<uint32_t> epoch_hits_, epoch_apart_;
  // The sample's keys: dense slot by key, key by dense slot, free slots, and
  // released keys kept as ghosts (oldest reclaimed first) with a stamp per slot.
  ShardsKeyHash hash_;
  std::unordered_map<BlockKey, uint32_t, ShardsKeyHash> dense_;
  std::vector<BlockKey> keys_;
  std::vector<uint32_t> free_;
  std::vector<uint32_t> stamp_;
  std::vector<uint8_t> released_now_;
  std::deque<std::pair<uint32_t, uint32_t>> released_;
};

// Follows the best of several policies (docs/policies.md, "adaptive"). Every
// expert keeps a set of C blocks of its own, fed every touch, as if it alone
// decided; the set the engine sees (R) follows the expert with the most hits
// lately (the leader): on a miss R evicts a block the leader does not hold,
// the one the leader dropped longest ago. While the leader does not change, R
// converges to the leader's set and then evicts exactly what the leader
// evicts. The first expert's score is the block's score.
class AdaptivePolicy final : public Policy {
 public:
  struct ExpertSpec {
    std::unique_ptr<Policy> policy;
    bool reset = false;  // bound with Persistence::kReset whatever the engine's
  };
  AdaptivePolicy(std::string name, std::vector<ExpertSpec> experts, uint32_t epoch_touches,
                 double decay, double z, uint32_t hold)
      : name_(std::move(name)), epoch_(epoch_touches), decay_(decay), z_(z), hold_(hold) {
    for (ExpertSpec& e : experts) {
      Expert x;
      x.policy = std::move(e.policy);
      x.reset = e.reset;
      experts_.push_back(std::move(x));
    }
  }
  std::string Name() const override { return name_; }
  double Score(const BlockState& st, double prev_score, uint64_t prev_time, bool fresh,
               const Touch& t) const override {
    return experts_[0].policy->Score(st, prev_score, prev_time, fresh, t);
  }
  void Reserve(size_t n) override {
    lists_.Reserve(n);
    for (Expert& e : experts_) {
      e.policy->Reserve(n);
      ReserveFor(e.member, n);
    }
  }
  void Prefetch(Slot s) const override {
    for (const Expert& e : experts_) e.policy->Prefetch(s);
  }
  double Heat(Slot s) const override { return experts_[leader_].policy->Heat(s); }
  uint64_t HeatEpoch() const override { return follows_; }
  void OnResume(Slot s, uint64_t idle_for, uint64_t now) override {
    for (Expert& e : experts_) e.policy->OnResume(s, idle_for, now);
  }
  void OnHit(Slot s, const Touch& t) override {
    Feed(s, t);
    EndTouch();
  }
  Slot OnMiss(Slot s, const Touch& t) override {
    Feed(s, t);
    Slot victim = kNoSlot;
    if (lists_.Size(kAgree) + lists_.Size(kOther) >= capacity_) {
      // R plus s hold C + 1 blocks and the leader only C, s among them: one
      // of R is outside the leader's set.
      victim = lists_.Back(kOther);
      if (victim == kNoSlot) victim = lists_.Back(kAgree);  // (not reached)
      lists_.Remove(victim);
    }
    lists_.PushFront(kAgree, s);
    EndTouch();
    return victim;
  }
  void Erase(Slot s) override {
    lists_.Remove(s);
    for (Expert& e : experts_) {
      e.policy->Erase(s);  // members or not: ARC's and S3-FIFO's ghosts know s too
      if (s < e.member.size()) e.member[s] = 0;
      if (s < e.dropped.size()) e.dropped[s] = 0;
      if (s < e.held.size()) e.held[s] = 0;  // a new block in the slot was not held
    }
  }

 protected:
  void OnBind() override {
    for (Expert& e : experts_) {
      e.policy->SetKeySeed(key_seed_);  // a shards expert's sample
      e.policy->Bind(states_, capacity_, e.reset ? Persistence::kReset : persistence_);
    }
  }

 private:
  enum { kAgree = 0, kOther = 1 };  // R's blocks the leader holds, and the rest
  struct Expert {
    std::unique_ptr<Policy> policy;
    bool reset = false;
    std::vector<uint8_t> member;    // in this expert's set
    std::vector<uint64_t> dropped;  // when this expert last evicted the block (0: never)
    std::vector<uint8_t> held;      // tick mode: in its set when the epoch began
    // Against the leader, decayed over epochs: touches this expert hit and the
    // leader missed (wins), and the other way round (losses).
    double wins = 0, losses = 0;
    uint32_t epoch_wins = 0, epoch_losses = 0;
    bool hit = false;  // on the touch being fed
  };

  void Feed(Slot s, const Touch& t) {
    for (size_t k = 0; k < experts_.size(); ++k) {
      Expert& e = experts_[k];
      GrowFor(e.member, s);
      if (e.member[s]) {
        // In tick mode tier 0 follows the set late, by the migration budget:
        // a hit counts for an expert only on a block it already held when
        // the last hold window began.
        e.hit = mode_ != Mode::kTick || (s < e.held.size() && e.held[s]);
        e.policy->OnHit(s, t);
        continue;
      }
      e.hit = false;
      const Slot v = e.policy->OnMiss(s, t);
      e.member[s] = 1;
      if (v != kNoSlot) {
        e.member[v] = 0;
        GrowFor(e.dropped, v);
        e.dropped[v] = ++drops_;
      }
      if (k == leader_) {
        if (lists_.Contains(kOther, s)) {
          lists_.Remove(s);
          lists_.PushFront(kAgree, s);
        }
        if (v != kNoSlot && lists_.Contains(kAgree, v)) {
          lists_.Remove(v);
          lists_.PushFront(kOther, v);
        }
      }
    }
    const bool leader_hit = experts_[leader_].hit;
    for (Expert& e : experts_) {
      e.epoch_wins += e.hit && !leader_hit;
      e.epoch_losses += !e.hit && leader_hit;
    }
  }

  void EndTouch() {
    if (mode_ == Mode::kTick && ++hold_touches_ >= hold_ * std::max<size_t>(1, capacity_)) {
      hold_touches_ = 0;
      for (Expert& e : experts_) e.held = e.member;
    }
    if (++touches_ < epoch_) return;
    touches_ = 0;
    size_t best = leader_;
    double best_lead = 0;
    for (size_t k = 0; k < experts_.size(); ++k) {
      Expert& e = experts_[k];
      e.wins = e.wins * decay_ + e.epoch_wins;
      e.losses = e.losses * decay_ + e.epoch_losses;
      e.epoch_wins = e.epoch_losses = 0;
      // A sign test: were k and the leader equally good, wins - losses would
      // be about normal with variance wins + losses. Switch only on a lead
      // beyond z standard deviations: a switch costs the hits R misses while
      // it moves to the new leader's set.
      const double lead = e.wins - e.losses;
      if (lead > z_ * std::sqrt(e.wins + e.losses) && lead > best_lead) {
        best = k;
        best_lead = lead;
      }
    }
    if (best != leader_) {
      for (Expert& e : experts_) e.wins = e.losses = 0;  // they were against the old leader
      Follow(best);
    }
  }

  // R's blocks sorted again by the new leader's set; those outside it queue
  // for eviction in the order the new leader dropped them (never held first,
  // by their last touch), so R evicts as that leader did.
  void Follow(size_t k) {
    leader_ = k;
    ++follows_;
    std::vector<Slot> out;
    const std::vector<uint8_t>& in = experts_[k].member;
    for (int l : {kAgree, kOther}) {
      for (Slot x = lists_.Back(l); x != kNoSlot;) {
        const Slot prev = lists_.Prev(x);
        if (!(x < in.size() && in[x])) {
          lists_.Remove(x);
          out.push_back(x);
        } else if (l == kOther) {
          lists_.Remove(x);
          lists_.PushFront(kAgree, x);
        }
        x = prev;
      }
    }
    const std::vector<uint64_t>& dropped = experts_[k].dropped;
    const auto when = [&dropped](Slot x) { return x < dropped.size() ? dropped[x] : 0; };
    std::sort(out.begin(), out.end(), [&](Slot a, Slot b) {
      return when(a) != when(b) ? when(a) < when(b) : state(a).touch_seq < state(b).touch_seq;
    });
    for (Slot x : out) lists_.PushFront(kOther, x);
  }

  std::string name_;
  std::vector<Expert> experts_;
  uint32_t epoch_;
  double decay_, z_;
  uint32_t hold_;  // tick mode: the hold window, in touches per tier-0 block
  uint32_t touches_ = 0;
  uint64_t hold_touches_ = 0;
  uint64_t drops_ = 0;  // evictions by any expert, for Expert::dropped
  size_t leader_ = 0;
  uint64_t follows_ = 0;  // leader changes: Heat's scale changes with them
  SlotLists lists_{2};
};

// "adaptive:E1+E2+...": experts by name (ema:A, lru, arc, s3fifo, sieve,
// tinylfu, lfu), each optionally "/reset"; only the first may be an ema that
// uses the engine's score (later emas keep their own).
Result<std::unique_ptr<Policy>> MakeAdaptive(std::string_view name, std::string_view experts,
                                             uint32_t epoch, double decay, double z,
                                             uint32_t hold) {
  std::vector<AdaptivePolicy::ExpertSpec> specs;
  while (!experts.empty()) {
    const size_t plus = experts.find('+');
    std::string_view one = experts.substr(0, plus);
    experts = plus == std::string_view::npos ? std::string_view{} : experts.substr(plus + 1);
    AdaptivePolicy::ExpertSpec e;
    if (one.ends_with("/reset")) {
      e.reset = true;
      one.remove_suffix(6);
    }
    if (!specs.empty() && one.starts_with("ema:")) {
      const std::optional<double> alpha = ParseAlpha(one.substr(4));
      if (!alpha) {
        return Status::Fail(wire::ErrorCode::kBadPayload,
                            "adaptive: bad expert '" + std::string(one) + "'");
      }
      e.policy = std::make_unique<OwnEmaPolicy>(*alpha);
    } else if (one == "min" || one.starts_with("adaptive") || one == "default") {
      return Status::Fail(wire::ErrorCode::kBadPayload,
                          "adaptive: '" + std::string(one) + "' cannot be an expert");
    } else {
      auto p = MakePolicy(one);
      if (!p.ok()) return p.status();
      e.policy = std::move(p.value());
    }
    specs.push_back(std::move(e));
  }
  if (specs.empty()) {
    return Status::Fail(wire::ErrorCode::kBadPayload, "adaptive needs at least one expert");
  }
  return std::make_unique<AdaptivePolicy>(std::string(name), std::move(specs), epoch, decay, z,
                                          hold);
}

// The settings after a policy's list, ";key=value" each: calls set(key,
// value) for each, in order; returns the first "key=value" that set()
// refused (an unknown key, or a value it does not take), or nullopt.
template <typename Set>
std::optional<std::string_view> EachSetting(std::string_view rest, Set set) {
  while (!rest.empty()) {
    rest.remove_prefix(1);  // ';'
    const std::string_view kv = rest.substr(0, rest.find(';'));
    rest = rest.substr(kv.size());
    const size_t eq = kv.find('=');
    const std::string_view v = eq == std::string_view::npos ? "" : kv.substr(eq + 1);
    if (!set(kv.substr(0, eq), v)) return kv;
  }
  return std::nullopt;
}

// A setting's value, all of `v`, into *out; false if it is not a number.
template <typename T>
bool SettingValue(std::string_view v, T* out) {
  const std::from_chars_result r = std::from_chars(v.data(), v.data() + v.size(), *out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}

// "adaptive:E1+E2+...[;epoch=N][;decay=X][;z=Y][;hold=N]", named `name`.
Result<std::unique_ptr<Policy>> ParseAdaptive(std::string_view spec, std::string_view name) {
  std::string_view rest = spec.substr(9);
  std::string_view experts = rest.substr(0, rest.find(';'));
  rest = rest.substr(experts.size());
  uint32_t epoch = 4096, hold = 16;
  double decay = 0.99, z = 3;
  const auto refused = EachSetting(rest, [&](std::string_view k, std::string_view v) {
    if (k == "epoch") return SettingValue(v, &epoch) && epoch > 0;
    if (k == "decay") return SettingValue(v, &decay) && decay >= 0 && decay < 1;
    if (k == "hold") return SettingValue(v, &hold) && hold > 0;
    if (k == "z") return SettingValue(v, &z) && z >= 0 && z < 100;
    return false;
  });
  if (refused) {
    return Status::Fail(wire::ErrorCode::kBadPayload,
                        "adaptive: bad setting '" + std::string(*refused) +
                            "' (epoch=N >= 1, decay=X in [0, 1), z=Y in [0, 100), hold=N >= 1)");
  }
  return MakeAdaptive(name, experts, epoch, decay, z, hold);
}

// "shards:C1+C2+...[;rate=X][;min=N][;epoch=N][;decay=X][;z=Y]", named `name`:
// candidates lfu, lru, ema:A, arc, s3fifo, sieve, tinylfu (the first leads first).
Result<std::unique_ptr<Policy>> ParseShards(std::string_view spec, std::string_view name) {
  const auto bad = [](std::string why) { return Status::Fail(wire::ErrorCode::kBadPayload, why); };
  std::string_view rest = spec.substr(7);
  std::string_view list = rest.substr(0, rest.find(';'));
  rest = rest.substr(list.size());
  std::vector<std::string> candidates;
  while (!list.empty()) {
    const size_t plus = list.find('+');
    const std::string_view one = list.substr(0, plus);
    list = plus == std::string_view::npos ? std::string_view{} : list.substr(plus + 1);
    const bool known = one == "lfu" || one == "lru" || one == "arc" || one == "s3fifo" ||
                       one == "sieve" || one == "tinylfu" ||
                       (one.starts_with("ema:") && ParseAlpha(one.substr(4)));
    if (!known) return bad("shards: bad candidate '" + std::string(one) + "'");
    candidates.emplace_back(one);
  }
  if (candidates.empty()) return bad("shards needs at least one candidate");
  ShardsPolicy::Settings set;
  const auto refused = EachSetting(rest, [&](std::string_view k, std::string_view v) {
    if (k == "rate") return SettingValue(v, &set.rate) && set.rate > 0 && set.rate <= 1;
    if (k == "min") return SettingValue(v, &set.min_cap);
    if (k == "epoch") return SettingValue(v, &set.epoch) && set.epoch > 0;
    if (k == "decay") return SettingValue(v, &set.decay) && set.decay >= 0 && set.decay < 1;
    if (k == "z") return SettingValue(v, &set.z) && set.z >= 0 && set.z < 100;
    if (k == "warm") return SettingValue(v, &set.warm);
    if (k == "gain") return SettingValue(v, &set.gain) && set.gain >= 0 && set.gain < 1;
    if (k == "keys") return SettingValue(v, &set.keys) && set.keys > 0;
    return false;
  });
  if (refused) {
    return bad("shards: bad setting '" + std::string(*refused) +
               "' (rate=X in (0, 1], min=N, epoch=N >= 1, decay=X in [0, 1), z=Y in [0, 100), "
               "gain=X in [0, 1), warm=N, keys=N >= 1)");
  }
  return std::make_unique<ShardsPolicy>(std::string(name), std::move(candidates), set);
}

}  // namespace

std::optional<ShardsView> ViewShards(const Policy& policy) {
  const auto* shards = dynamic_cast<const ShardsPolicy*>(&policy);
  if (!shards) return std::nullopt;
  return shards->View();
}

bool InShardsSample(const BlockKey& key, double rate) {
  return ShardsHash(key) < ShardsThreshold(rate);
}

std::string PolicyNames() {
  return "default, shards[:C1+C2...], adaptive[:E1+E2...], lru, lfu, ema:<alpha>, arc, s3fifo, "
         "sieve, tinylfu, min";
}

Result<std::unique_ptr<Policy>> MakePolicy(std::string_view spec) {
  const auto bad = [](std::string why) { return Status::Fail(wire::ErrorCode::kBadPayload, why); };
  if (spec == "lru") return std::make_unique<LruPolicy>();
  if (spec == "lfu") return std::make_unique<LfuPolicy>();
  if (spec == "arc") return std::make_unique<ArcPolicy>();
  if (spec == "s3fifo") return std::make_unique<S3FifoPolicy>();
  if (spec == "sieve") return std::make_unique<SievePolicy>();
  if (spec == "tinylfu") return std::make_unique<TinyLfuPolicy>();
  if (spec == "min") return std::make_unique<MinPolicy>();
  if (spec == "default") return MakePolicy(kDefaultPolicy);
  if (spec == "adaptive") return ParseAdaptive(kAdaptivePolicy, "adaptive");
  if (spec == "shards") return ParseShards(kShardsPolicy, "shards");
  if (spec.starts_with("shards:")) return ParseShards(spec, spec);
  if (spec.starts_with("adaptive:")) return ParseAdaptive(spec, spec);
  if (spec.starts_with("ema:")) {
    const std::optional<double> alpha = ParseAlpha(spec.substr(4));
    if (!alpha) {
      return bad("ema needs an alpha strictly between 0 and 1, as in ema:0.01");
    }
    return std::make_unique<EmaPolicy>(*alpha, std::string(spec));
  }
  return bad(spec == "ema" ? "ema needs an alpha, as in ema:0.01"
                           : "unknown policy '" + std::string(spec) + "'; known: " + PolicyNames());
}

}  // namespace cxltier::engine
