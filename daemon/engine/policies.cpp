// The eviction policies. Exact definitions: docs/policies.md.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "engine/count_min.h"
#include "engine/policy.h"
#include "engine/slot_heap.h"
#include "engine/slot_list.h"

namespace cxltier::engine {

double EmaOrderKey(double score, uint64_t time, double alpha) {
  // score <= 0 gives -inf: such blocks order by touch_seq alone.
  return std::log(score) - static_cast<double>(time) * std::log1p(-alpha);
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
  void Reserve(size_t n) override {
    if (n > links_.size()) links_.resize(n);
  }
  void OnHit(Slot s, const Touch&) override {
    const auto next = Unlink(s);
    Append(s, state(s).touch_count, next);
  }
  Slot OnMiss(Slot s, const Touch&) override {
    Slot victim = kNoSlot;
    if (members_ >= capacity_) {
      victim = buckets_.begin()->second.front;
      Unlink(victim);
    }
    const uint32_t count = state(s).touch_count;
    Append(s, count, buckets_.lower_bound(count));
    return victim;
  }
  void Erase(Slot s) override {
    if (s < links_.size() && links_[s].member) Unlink(s);
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

// Score = exponential moving average of observations on the workload clock.
class EmaPolicy final : public HeapPolicy {
 public:
  explicit EmaPolicy(double alpha, std::string name) : alpha_(alpha), name_(std::move(name)) {}
  std::string Name() const override { return name_; }
  double Score(const BlockState&, double prev_score, uint64_t prev_time, bool fresh,
               const Touch& t) const override {
    // A previous touch ahead of now decays nothing (Elapsed is 0), not (1-alpha)^(~2^64) = 0.
    const double decayed =
        fresh ? 0.0
              : prev_score * std::pow(1.0 - alpha_, static_cast<double>(Elapsed(t.now, prev_time)));
    return decayed + alpha_ * t.obs;
  }

 private:
  double Key(Slot s, const Touch&) const override {
    return EmaOrderKey(state(s).score, state(s).touch_time, alpha_);
  }
  double alpha_;
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

 private:
  // Min-heap on -next_use = max-heap on next_use.
  double Key(Slot, const Touch& t) const override { return -static_cast<double>(t.next_use); }
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
    lists_.PushFront(Returning(s) ? kT2 : kT1, s);
    return victim;
  }

  void Erase(Slot s) override { lists_.Remove(s); }

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
    if (n > freq_.size()) freq_.resize(n, 0);
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
      lists_.PushFront(Returning(s) ? kM : kS, s);
    }
    Freq(s) = 0;
    return victim;
  }
  void Erase(Slot s) override { lists_.Remove(s); }

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
    if (n > visited_.size()) visited_.resize(n, 0);
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
    if (lists_.Size(kW) + main > capacity_) {
      Slot victim = MainVictim();
      if (victim == kNoSlot) victim = lists_.Back(kW);
      lists_.Remove(victim);
      return victim;
    }
    return kNoSlot;
  }
  void Erase(Slot s) override { lists_.Remove(s); }

 protected:
  void OnBind() override {
    window_cap_ = std::max<size_t>(1, capacity_ / 100);
    const size_t main = capacity_ > window_cap_ ? capacity_ - window_cap_ : 0;
    protected_cap_ = main * 8 / 10;
    sketch_ = std::make_unique<CountMinSketch>(std::max<size_t>(16, capacity_),
                                               10 * std::max<size_t>(1, capacity_));
  }

 private:
  enum { kW = 0, kProbation = 1, kProtected = 2 };
  Slot MainVictim() const {
    const Slot v = lists_.Back(kProbation);
    return v != kNoSlot ? v : lists_.Back(kProtected);
  }
  unsigned Freq(Slot s) const {
    unsigned f = sketch_->Estimate(state(s).key);
    if (persistence_ == Persistence::kPersist) {
      f = std::max(f, std::min<unsigned>(state(s).touch_count, CountMinSketch::kMaxCount));
    }
    return f;
  }

  SlotLists lists_{3};
  std::unique_ptr<CountMinSketch> sketch_;
  size_t window_cap_ = 1, protected_cap_ = 0;
};

}  // namespace

std::string PolicyNames() { return "lru, lfu, ema:<alpha>, arc, s3fifo, sieve, tinylfu, min"; }

Result<std::unique_ptr<Policy>> MakePolicy(std::string_view spec) {
  const auto bad = [](std::string why) { return Status::Fail(wire::ErrorCode::kBadPayload, why); };
  if (spec == "lru") return std::make_unique<LruPolicy>();
  if (spec == "lfu") return std::make_unique<LfuPolicy>();
  if (spec == "arc") return std::make_unique<ArcPolicy>();
  if (spec == "s3fifo") return std::make_unique<S3FifoPolicy>();
  if (spec == "sieve") return std::make_unique<SievePolicy>();
  if (spec == "tinylfu") return std::make_unique<TinyLfuPolicy>();
  if (spec == "min") return std::make_unique<MinPolicy>();
  if (spec.starts_with("ema:")) {
    const std::string_view text = spec.substr(4);
    double alpha = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), alpha);
    if (ec != std::errc() || end != text.data() + text.size() || !(alpha > 0.0 && alpha < 1.0)) {
      return bad("ema needs an alpha strictly between 0 and 1, as in ema:0.01");
    }
    return std::make_unique<EmaPolicy>(alpha, std::string(spec));
  }
  return bad(spec == "ema" ? "ema needs an alpha, as in ema:0.01"
                           : "unknown policy '" + std::string(spec) + "'; known: " + PolicyNames());
}

}  // namespace cxltier::engine
