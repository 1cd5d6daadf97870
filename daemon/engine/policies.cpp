// The eviction policies. Exact definitions: docs/policies.md.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
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
  void Reserve(size_t n) override { ReserveFor(links_, n); }
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

// An EMA after one touch: the value at `prev_time` decayed to now, plus this
// touch's share. A previous touch ahead of now decays nothing (Elapsed is 0),
// not (1-alpha)^(~2^64) = 0.
double EmaAfter(double prev, uint64_t prev_time, bool fresh, double alpha, const Touch& t) {
  const double decayed =
      fresh ? 0.0 : prev * std::pow(1.0 - alpha, static_cast<double>(Elapsed(t.now, prev_time)));
  return decayed + alpha * t.obs;
}

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
  explicit EmaPolicy(double alpha, std::string name) : alpha_(alpha), name_(std::move(name)) {}
  std::string Name() const override { return name_; }
  double Score(const BlockState&, double prev_score, uint64_t prev_time, bool fresh,
               const Touch& t) const override {
    return EmaAfter(prev_score, prev_time, fresh, alpha_, t);
  }
  double Heat(Slot s) const override {
    return EmaOrderKey(state(s).score, state(s).touch_time, alpha_);
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
  explicit OwnEmaPolicy(double alpha) : alpha_(alpha) {}
  std::string Name() const override { return "ema:" + std::to_string(alpha_); }
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
    o = Own{EmaAfter(o.score, o.time, fresh, alpha_, t), t.now, st.generation};
  }
  double Key(Slot s) const { return EmaOrderKey(own_[s].score, own_[s].time, alpha_); }

  double alpha_;
  SlotHeap heap_;
  std::vector<Own> own_;
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

// "adaptive:E1+E2+...[;epoch=N][;decay=X][;z=Y][;hold=N]", named `name`.
Result<std::unique_ptr<Policy>> ParseAdaptive(std::string_view spec, std::string_view name) {
  const auto bad = [](std::string why) { return Status::Fail(wire::ErrorCode::kBadPayload, why); };
  std::string_view rest = spec.substr(9);
  std::string_view experts = rest.substr(0, rest.find(';'));
  rest = rest.substr(experts.size());
  uint32_t epoch = 4096, hold = 16;
  double decay = 0.99, z = 3;
  while (!rest.empty()) {
    rest.remove_prefix(1);  // ';'
    const std::string_view kv = rest.substr(0, rest.find(';'));
    rest = rest.substr(kv.size());
    const size_t eq = kv.find('=');
    const std::string_view k = kv.substr(0, eq);
    const std::string_view v = eq == std::string_view::npos ? "" : kv.substr(eq + 1);
    std::from_chars_result r{nullptr, std::errc::invalid_argument};
    if (k == "epoch") {
      r = std::from_chars(v.data(), v.data() + v.size(), epoch);
      if (epoch == 0) r.ec = std::errc::invalid_argument;
    } else if (k == "decay") {
      r = std::from_chars(v.data(), v.data() + v.size(), decay);
      if (!(decay >= 0 && decay < 1)) r.ec = std::errc::invalid_argument;
    } else if (k == "hold") {
      r = std::from_chars(v.data(), v.data() + v.size(), hold);
      if (hold == 0) r.ec = std::errc::invalid_argument;
    } else if (k == "z") {
      r = std::from_chars(v.data(), v.data() + v.size(), z);
      if (!(z >= 0 && z < 100)) r.ec = std::errc::invalid_argument;
    }
    if (r.ec != std::errc() || r.ptr != v.data() + v.size()) {
      return bad("adaptive: bad setting '" + std::string(kv) +
                 "' (epoch=N >= 1, decay=X in [0, 1), z=Y in [0, 100), hold=N >= 1)");
    }
  }
  return MakeAdaptive(name, experts, epoch, decay, z, hold);
}

}  // namespace

std::string PolicyNames() {
  return "default, adaptive[:E1+E2...], lru, lfu, ema:<alpha>, arc, s3fifo, sieve, tinylfu, min";
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
