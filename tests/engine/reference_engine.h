// A deliberately simple model of the engine, for differential tests.
//
// Nothing clever: blocks live in a vector that only grows (a re-admitted key
// gets a new entry), every list is "the members with this list id, ordered by
// the stamp they were pushed with", and every choice is a linear scan. It
// shares no code with daemon/engine except the count-min sketch (which has
// its own tests against exact counts), the vocabulary types and the name
// kAdaptivePolicy stands for.
//
// A policy (`RefPolicy` below) is one set with its own lists over the engine's
// blocks; the engine has one, or, for `adaptive`, several experts and a set R
// of its own that follows the leading expert (docs/policies.md).
//
// Scheduler hints (docs/policies.md, "Scheduler hints"): a map group -> its
// members, the idle and done blocks as two explicit vectors in the order they
// leave, the soon groups still placing in a vector served round by round.
//
// More than two tiers (docs/policies.md, "More than two tiers"): each block
// outside the set has a rank (the tier it belongs in); a middle tier's members
// are found by a scan, and its coldest by ColdestFirst, as hints order blocks.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cxltier/block.h"
#include "engine/count_min.h"
#include "engine/engine.h"

namespace cxltier::engine::testing {

// Where the engine departs from the documented semantics, knowingly
// (engine_test.cpp says why): set, the reference does as the engine does.
struct ReferenceQuirks {
  // A soon placement feeds the policy a touch of observation 0 without
  // counting it in the block's touch count; an own-score EMA expert takes a
  // block touched once for a fresh one then and zeroes its average.
  bool placement_zeroes_own_ema_of_count_1 = false;
  // A soon group's blocks still to place are remembered by slot: a block
  // admitted into a released candidate's slot that joins the group takes
  // its place (touched or not).
  bool candidates_by_slot = false;
};

class ReferenceEngine {
 public:
  enum class Kind { kLru, kLfu, kEma, kMin, kArc, kS3Fifo, kSieve, kTinyLfu };

  using Quirks = ReferenceQuirks;

  ReferenceEngine(const EngineOptions& o, const std::string& policy, Quirks q = {})
      : quirks(q), o_(o) {
    tier0_cap_ = o.tier0_budget_bytes / o.block_bytes;
    // The set: tier 0 less its landing room (tick mode).
    cap_ = tier0_cap_ -
           (o.mode == Mode::kTick ? tier0_cap_ * std::min(o.landing_percent, 50u) / 100 : 0);
    tiers_ = static_cast<unsigned>(o.lower_tier_budget_bytes.size()) + 2;
    for (uint64_t bytes : o.lower_tier_budget_bytes) lower_cap_.push_back(bytes / o.block_bytes);
    std::string spec = policy == "default" ? std::string(kDefaultPolicy) : policy;
    if (spec == "adaptive") spec = std::string(kAdaptivePolicy);
    if (spec == "shards") spec = std::string(kShardsPolicy);
    // shards (docs/policies.md, "shards") is its first candidate until its
    // leader changes: the model is only asked about it while it cannot
    // (z=99 on short traces), with a first candidate whose score is the
    // block's (an ema, or no ema among the candidates). Its miniatures and
    // their switches are tested on their own (engine_test, Shards.*).
    if (spec.starts_with("shards:")) spec = spec.substr(7, spec.find_first_of("+;", 7) - 7);
    if (spec.starts_with("adaptive:")) {
      adaptive_ = true;
      ParseAdaptive(spec.substr(9));
    } else {
      policies_.emplace_back(this, spec, o.persistence, false);
    }
    // The first policy's score is the block's score: an ema's average, LRU's
    // touch order, the others' touch count (what hints read as heat).
    if (policies_[0].kind == Kind::kEma) score_alpha_ = policies_[0].alpha;
  }

  const Quirks quirks;
  std::vector<EngineEvent> log;
  EngineCounters counters;

  // `owner` only matters to hints (a group's blocks have one owner).
  void Admit(const BlockKey& key, uint32_t owner = 0) {
    if (live_.count(key)) return;
    B b;
    b.key = key;
    b.owner = owner;
    // The engine's slots: the last one freed first, else a new one.
    if (free_slots_.empty()) {
      b.slot = next_slot_++;
    } else {
      b.slot = free_slots_.back();
      free_slots_.pop_back();
    }
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
      const bool room = CountTier(Tier::kFast) + held_ < tier0_cap_;
      const unsigned below = FirstLowerWithRoom();
      blocks_[id].tier = room ? Tier::kFast : TierAt(below);
      // With a landing room, a block landed in tier 0 stays for the next plan.
      if (room && cap_ < tier0_cap_) blocks_[id].hold_until = tick_ + 2;
      if (room) ++counters.placed_fast;
      Log(room ? EngineEvent::kPlaceFast : EngineEvent::kPlaceSlow, id);
      if (room) {
        Classify(id);
      } else {
        RankBelow(id, below);
      }
    }
  }

  bool Touch(const BlockKey& key, double obs, uint64_t now, uint64_t next_use) {
    const size_t id = live_.at(key);
    B& b = blocks_[id];
    const bool hit = b.tier == Tier::kFast;
    ++counters.touches;
    if (hit) ++counters.hits;
    if (b.tier != Tier::kNone) ++counters.tier_hits[TierIndex(b.tier)];
    now_ = now;
    if (b.placed_ahead) {  // a soon placed it: this is its next touch
      b.placed_ahead = false;
      if (hit) ++counters.hint_prefetch_hits;
    }
    if (b.group != kNoGroup && groups_.at(b.group).hinted_out) Activate(b.group);
    // Score, straight from the definitions in docs/policies.md: the first
    // policy's (LRU: the touch order; EMA: its average; the others: the count).
    const bool fresh = b.count == 0;
    if (score_alpha_ > 0) {
      b.score = (fresh ? 0.0 : b.score * std::pow(1.0 - score_alpha_, double(now - b.time))) +
                score_alpha_ * obs;
    }
    ++b.count;
    b.time = now;
    b.seq = ++seq_;
    b.next_use = next_use;
    if (policies_[0].kind == Kind::kLru) b.score = static_cast<double>(b.seq);
    if (policies_[0].kind != Kind::kLru && policies_[0].kind != Kind::kEma) b.score = b.count;
    if (cap_ == 0) {
      if (b.tier == Tier::kNone) {
        const unsigned k = FirstLowerWithRoom();
        b.tier = TierAt(k);
        RankBelow(id, k);
      }
      return hit;
    }
    if (b.in_set) {
      if (adaptive_) {
        AdaptiveHit(id, obs, now);
      } else {
        policies_[0].Hit(id, obs, now);
      }
      if (blocks_[id].queue == kPromoteQ) {  // touched again while it waits
        blocks_[id].retouched = true;
        blocks_[id].queue_stamp = ++qstamp_;
      }
      return hit;
    }
    // Idle and done blocks leave before the policy chooses (`id`, on its way
    // in, is no longer ranked).
    b.rank = 0;
    if (InSet() >= cap_ && Pooled()) Displace(NextPooled());
    const std::optional<size_t> victim =
        adaptive_ ? AdaptiveMiss(id, obs, now) : policies_[0].Miss(id, obs, now);
    blocks_[id].in_set = true;
    blocks_[id].rank = 0;
    if (victim) {
      B& v = blocks_[*victim];
      v.in_set = false;
      Unpool(*victim);
      ++counters.evictions;
      Log(EngineEvent::kEvict, *victim);
      if (!Persist()) v.score = 0, v.count = 0, v.time = 0;
    }
    if (o_.mode == Mode::kDemand) {
      if (victim) RankBelow(*victim, 1);
      if (blocks_[id].tier != Tier::kNone) {
        ++counters.promotions;
        Log(EngineEvent::kPromote, id);
      } else {
        ++counters.placed_fast;
        Log(EngineEvent::kPlaceFast, id);
      }
      blocks_[id].tier = Tier::kFast;
    } else {
      if (victim) LeftSetTick(*victim);
      Classify(id);
    }
    return hit;
  }

  void Release(const BlockKey& key) {
    const size_t id = live_.at(key);
    B& b = blocks_[id];
    for (RefPolicy& p : policies_) p.Erase(id);
    b.in_set = false;
    Unpool(id);
    LeaveGroup(id);
    b.queue = kNone;
    b.rank = 0;
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
    free_slots_.push_back(b.slot);
    ++counters.releases;
    ServePending(now_);  // the room it leaves
  }

  // ---- scheduler hints ----

  // Puts the live block in group `g` (kNoGroup: in none). False, and nothing
  // changes, when the group's blocks have another owner.
  bool SetGroup(const BlockKey& key, GroupId g) {
    const size_t id = live_.at(key);
    if (g == kNoGroup) {
      LeaveGroup(id);
      return true;
    }
    if (blocks_[id].group == g) return true;
    if (groups_.count(g) && groups_.at(g).owner != blocks_[id].owner) return false;
    LeaveGroup(id);
    if (!groups_.count(g)) groups_[g].owner = blocks_[id].owner;
    groups_.at(g).members.push_back(id);
    blocks_[id].group = g;
    return true;
  }

  bool Hint(GroupId gid, HintKind kind, uint64_t now) {
    if (!groups_.count(gid)) return false;
    ++counters.hints;
    now_ = now;
    if ((!adaptive_ && policies_[0].kind == Kind::kMin) || cap_ == 0) return true;
    G& g = groups_.at(gid);
    std::erase(pending_, gid);  // a new hint ends a soon's placing
    g.candidates.clear();
    g.prefetch_left = 0;
    std::vector<size_t> in, out;
    for (size_t m : g.members) (blocks_[m].in_set ? in : out).push_back(m);
    if (kind == HintKind::kIdle || kind == HintKind::kDone) {
      // Leaves after every block hinted before, coldest first.
      std::vector<size_t>& pool = pools_[kind == HintKind::kDone ? 0 : 1];
      for (size_t m : ColdestFirst(in)) {
        Unpool(m);
        pool.push_back(m);
      }
      g.working_set = static_cast<uint32_t>(in.size());
      g.idle_at = now;
      g.hinted_out = true;
      ServePending(now);  // the room it may give a waiting soon
      return true;
    }
    if (g.hinted_out) Activate(gid);
    if (g.working_set <= in.size()) return true;
    std::vector<size_t> touched;
    for (size_t m : out) {
      if (blocks_[m].count > 0) touched.push_back(m);
    }
    if (touched.empty()) return true;
    g.prefetch_left = g.working_set - static_cast<uint32_t>(in.size());
    // The hottest prefetch_left of them, hottest at the back.
    g.candidates = ColdestFirst(touched);
    if (g.candidates.size() > g.prefetch_left) {
      g.candidates.erase(g.candidates.begin(),
                         g.candidates.end() - static_cast<ptrdiff_t>(g.prefetch_left));
    }
    pending_.push_back(gid);
    ServePending(now);
    return true;
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
    std::vector<size_t> planned_into(kMaxTiers, 0);
    auto plan = [&](size_t id, Tier to) {
      moves.push_back({id, to});
      ++planned_into[TierIndex(to)];
      blocks_[id].queue = kNone;
    };
    size_t di = 0;
    // Tier 0 over the set's size (its landing room taken): blocks outside the
    // set leave, oldest first, until the room is back, with at most half the
    // tick's budget while promotions wait (tier 0 is never over its budget
    // here: instant moves).
    uint64_t room = promos.empty() ? budget : budget / 2;
    for (size_t after = projected; after > cap_; --after) {
      while (di < demos.size() && Held(demos[di])) ++di;
      if (di == demos.size() || room < bb) break;
      room -= bb;
      budget -= bb;
      const size_t d = demos[di++];
      if (blocks_[d].rank == 0) RankBelow(d, 1);
      plan(d, TierAt(blocks_[d].rank));
    }
    for (size_t p : promos) {
      if (Held(p)) continue;
      if (projected + held_ < cap_) {
        if (budget < bb) break;
        budget -= bb;
        plan(p, Tier::kFast);
        ++projected;
      } else {
        while (di < demos.size() && Held(demos[di])) ++di;
        if (di == demos.size() || budget / 2 < bb) break;
        budget -= 2 * bb;
        const size_t d = demos[di++];
        // To its rank; ranked now if it never was (admitted into tier 0).
        if (blocks_[d].rank == 0) RankBelow(d, 1);
        plan(d, TierAt(blocks_[d].rank));
        plan(p, Tier::kFast);
      }
    }
    // Below tier 0: rank changes, longest waiting first, into tiers with room.
    for (size_t id : QueueOrder(kLowerQ)) {
      if (budget < bb) break;
      const unsigned to = blocks_[id].rank;
      if (blocks_[id].queue != kLowerQ || Held(id)) continue;
      if (to == tiers_ - 1 || CountTier(TierAt(to)) + planned_into[to] < lower_cap_[to - 1]) {
        budget -= bb;
        plan(id, TierAt(to));
      }
    }
    for (auto& [id, to] : moves) {
      const bool up = TierIndex(to) < TierIndex(blocks_[id].tier);
      blocks_[id].tier = to;
      blocks_[id].moved_tick = tick_;
      if (up) {
        ++counters.promotions;
        Log(EngineEvent::kPromote, id);
      } else {
        ++counters.demotions;
        Log(EngineEvent::kDemote, id);
      }
      Classify(id);
    }
  }

  // Pages in tier 0 that no block holds (a released block's, until the
  // daemon moves them down): they take room from admissions and
  // promotions, and are no excess to demote.
  void set_held_blocks(size_t n) { held_ = n; }

  uint32_t CountOf(const BlockKey& key) const { return blocks_[live_.at(key)].count; }
  // Adaptive: how often the leader changed.
  uint64_t leader_changes() const { return leader_changes_; }
  // Evictions by an ema (alone or an expert) whose victim was within rounding
  // of another member's value: the engine's float keys may choose either, so
  // a trace with one is not a fair comparison.
  uint64_t ambiguous_choices() const {
    uint64_t n = heat_ambiguous_;
    for (const RefPolicy& p : policies_) n += p.ambiguous;
    return n;
  }

 private:
  static constexpr int kNone = -1;
  enum { kPromoteQ = 0, kDemoteQ = 1, kLowerQ = 2 };
  // What the engine keeps of a block (its 64-byte state, its tier, R and the
  // planner's queues). What a policy keeps is in RefPolicy::Entry.
  struct B {
    BlockKey key;
    bool live = true;
    double score = 0;
    uint64_t time = 0;
    uint32_t count = 0;
    uint64_t seq = 0;
    uint64_t next_use = kNever;
    Tier tier = Tier::kNone;
    bool in_set = false;    // in the engine's set (R)
    bool restored = false;  // its state came from a ghost (this life)
    uint32_t owner = 0;
    GroupId group = kNoGroup;
    bool placed_ahead = false;  // a soon placed it, not touched since
    uint32_t slot = 0;          // the engine's slot
    int queue = kNone;
    uint64_t queue_stamp = 0;
    unsigned rank = 0;       // outside the set: the tier it belongs in (0: not ranked)
    bool retouched = false;  // promotion candidate touched since it was queued
    uint64_t moved_tick = 0;
    uint64_t hold_until = 0;  // landed: no move before this tick
  };
  struct Ghost {
    BlockKey key;
    double score;
    uint64_t time;
    uint32_t count;
    uint64_t seq;
  };

  // One policy: a set of at most C blocks and its own lists, over the
  // engine's blocks. It reads the engine's state of a block (count, touch
  // order, score) when the block is touched and ranks its members by what it
  // read then (for a policy alone that is the live state, since only a touch
  // changes a member's state; inside adaptive, R's eviction with `reset`
  // zeroes the state of a block an expert may still hold, and the expert
  // goes on ranking it by what it was told).
  class RefPolicy {
   public:
    RefPolicy(const ReferenceEngine* engine, const std::string& name, Persistence persistence,
              bool own_ema)
        : e_(engine), persistence_(persistence), own_ema_(own_ema), cap_(engine->cap_) {
      if (name == "lru")
        kind = Kind::kLru;
      else if (name == "lfu")
        kind = Kind::kLfu;
      else if (name == "min")
        kind = Kind::kMin;
      else if (name == "arc")
        kind = Kind::kArc;
      else if (name == "s3fifo")
        kind = Kind::kS3Fifo;
      else if (name == "sieve")
        kind = Kind::kSieve;
      else if (name == "tinylfu")
        kind = Kind::kTinyLfu;
      else if (name.starts_with("ema:"))
        kind = Kind::kEma, alpha = std::stod(name.substr(4));
      else
        throw std::invalid_argument("reference: unknown policy " + name);
      small_cap_ = std::max<size_t>(1, cap_ / 10);
      s3_main_cap_ = cap_ - std::min(cap_, small_cap_);
      s3_ghost_cap_ = std::max<size_t>(1, cap_ * 9 / 10);
      window_cap_ = std::max<size_t>(1, cap_ / 100);
      protected_cap_ = (cap_ > window_cap_ ? cap_ - window_cap_ : 0) * 8 / 10;
      sketch_ = std::make_unique<CountMinSketch>(std::max<size_t>(16, cap_),
                                                 10 * std::max<size_t>(1, cap_));
    }

    Kind kind = Kind::kLru;
    double alpha = 0;
    uint64_t ambiguous = 0;  // ema victims chosen among near-ties (NearTie)
    bool own_ema() const { return own_ema_; }

    // What this policy keeps per block (by the engine's block id).
    struct Entry {
      bool in = false;  // in this policy's set
      int list = kNone;
      uint64_t stamp = 0;       // larger = nearer the front of its list
      int freq = 0;             // S3-FIFO
      bool visited = false;     // SIEVE
      bool back_asked = false;  // S3-FIFO: BackFromGhost said yes (once a life)
      double score = 0;         // the block's score as of its last touch here
      uint64_t time = 0;        // ... its touch time
      uint32_t count = 0;       // ... its touch count
      uint64_t seq = 0;         // ... its touch order
      uint64_t seen = 0;        // when this policy was last told of it (a touch or a placement)
      uint64_t next_use = kNever;
      bool has_own = false;  // an ema that is not the block's score: its own average
      double own = 0;
      uint64_t own_time = 0;
      uint64_t dropped = 0;  // adaptive: when this expert last evicted it (0: never)
      bool held = false;     // adaptive, tick: in the set when the hold window began
    };
    Entry& At(size_t id) {
      if (id >= entries_.size()) entries_.resize(id + 1);
      return entries_[id];
    }
    bool In(size_t id) const { return id < entries_.size() && entries_[id].in; }
    Entry Get(size_t id) const { return id < entries_.size() ? entries_[id] : Entry{}; }

    // A soon places the block after its group was idle `idle_for`: its own
    // average's time moves on by that pause, never past `now`.
    void Resume(size_t id, uint64_t idle_for, uint64_t now) {
      if (!own_ema_ || id >= entries_.size() || !entries_[id].has_own) return;
      Entry& x = entries_[id];
      x.own_time += std::min(idle_for, now > x.own_time ? now - x.own_time : 0);
    }

    // A touch of `id`, which is in the set.
    void Hit(size_t id, double obs, uint64_t now) {
      See(id, obs, now);
      Entry& b = At(id);
      switch (kind) {
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
          sketch_->Increment(e_->blocks_[id].key);
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
          break;  // score policies: nothing beyond what See() read
      }
    }

    // A touch of `id`, which is not in the set: admits it, returns the victim.
    std::optional<size_t> Miss(size_t id, double obs, uint64_t now) {
      See(id, obs, now);
      std::optional<size_t> victim;
      switch (kind) {
        case Kind::kArc:
          victim = ArcMiss(id);
          break;
        case Kind::kS3Fifo:
          victim = S3Miss(id);
          break;
        case Kind::kSieve:
          victim = SieveMiss(id);
          break;
        case Kind::kTinyLfu:
          victim = TinyMiss(id);
          break;
        default: {
          const std::vector<size_t> m = Members();
          if (m.size() >= cap_) {
            victim = *std::min_element(m.begin(), m.end(),
                                       [&](size_t a, size_t b) { return Worse(a, b); });
            for (size_t x : m) ambiguous += x != *victim && NearTie(x, *victim);
          }
        }
      }
      At(id).in = true;
      if (victim) At(*victim).in = false;
      return victim;
    }

    // `id` is released or displaced by a hint: out of the set and of every
    // list (ghost lists too); not held.
    void Erase(size_t id) {
      if (id >= entries_.size()) return;
      if (kind == Kind::kSieve && hand_ == id) hand_ = Newer(0, id);
      entries_[id].list = kNone;
      entries_[id].in = false;
      entries_[id].dropped = 0;
      entries_[id].held = false;
    }

    // Adaptive, tick mode: the hold window begins.
    void HoldNow() {
      for (Entry& x : entries_) x.held = x.in;
    }

   private:
    bool Persist() const { return persistence_ == Persistence::kPersist; }
    // The touch count includes this touch: 2 or more is a block seen before.
    bool Returning(size_t id) const { return Persist() && e_->blocks_[id].count >= 2; }
    // S3-FIFO: the first miss (here) of a block restored from a ghost.
    bool BackFromGhost(size_t id) {
      if (!Persist() || !e_->blocks_[id].restored || At(id).back_asked) return false;
      At(id).back_asked = true;
      return true;
    }
    // Reads the block's state as it is at this touch.
    void See(size_t id, double obs, uint64_t now) {
      const B& b = e_->blocks_[id];
      Entry& x = At(id);
      x.score = b.score;
      x.time = b.time;
      x.seen = ++seen_;
      if (own_ema_) {
        // Its own average: none before this life's first touch here, and
        // none when the engine reset the block (its count restarted). A
        // placement is no touch: the count is the last touch's.
        const bool count_restarted =
            b.count <= 1 && (!e_->placing_ || e_->quirks.placement_zeroes_own_ema_of_count_1);
        const bool fresh = !x.has_own || count_restarted;
        x.own =
            (fresh ? 0.0 : x.own * std::pow(1.0 - alpha, double(now - x.own_time))) + alpha * obs;
        x.own_time = now;
        x.has_own = true;
        x.score = x.own;
        x.time = x.own_time;
      }
      x.count = b.count;
      x.seq = b.seq;
      x.next_use = b.next_use;
    }

    // ---- lists as stamps ----
    size_t Size(int list) const {
      size_t n = 0;
      for (const Entry& x : entries_) n += x.list == list;
      return n;
    }
    void Push(int list, size_t id) {
      At(id).list = list;
      At(id).stamp = ++stamp_;
    }
    std::optional<size_t> Back(int list) const {
      std::optional<size_t> best;
      for (size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].list == list && (!best || entries_[i].stamp < entries_[*best].stamp)) {
          best = i;
        }
      }
      return best;
    }
    std::optional<size_t> PopBack(int list) {
      auto b = Back(list);
      if (b) entries_[*b].list = kNone;
      return b;
    }
    // The member of `list` just newer than `id` (towards the front).
    std::optional<size_t> Newer(int list, size_t id) const {
      std::optional<size_t> best;
      for (size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].list == list && entries_[i].stamp > entries_[id].stamp &&
            (!best || entries_[i].stamp < entries_[*best].stamp)) {
          best = i;
        }
      }
      return best;
    }
    std::vector<size_t> Members() const {
      std::vector<size_t> m;
      for (size_t i = 0; i < entries_.size(); ++i) {
        if (entries_[i].in) m.push_back(i);
      }
      return m;
    }

    // An ema's value at a common time.
    long double ValueAt(const Entry& x, uint64_t t) const {
      return x.score * std::pow(1.0L - alpha, static_cast<long double>(t - x.time));
    }
    // Two ema values equal or within rounding of each other that the engine's
    // keys (log S - t log(1 - alpha), doubles) may order either way: equal
    // values with different histories (ema:0.2 after 1/1024 observations:
    // 0.2 x 680/1024 x 0.8 = 0.2 x 544/1024 a step later).
    bool NearTie(size_t ia, size_t ib) const {
      const Entry& a = entries_[ia];
      const Entry& b = entries_[ib];
      if (kind != Kind::kEma || (a.score == b.score && a.time == b.time)) return false;
      const uint64_t t = std::max(a.time, b.time);
      const long double va = ValueAt(a, t), vb = ValueAt(b, t);
      return std::fabs(va - vb) <= 1e-9L * std::max(va, vb);
    }

    // True when `a` should be evicted before `b`.
    bool Worse(size_t ia, size_t ib) const {
      const Entry& a = entries_[ia];
      const Entry& b = entries_[ib];
      switch (kind) {
        case Kind::kLru:
          return a.seen < b.seen;
        case Kind::kLfu:
          return a.count != b.count ? a.count < b.count : a.seen < b.seen;
        case Kind::kEma: {
          // Value of each block at a common time: score x (1 - alpha)^(T - touch time).
          const uint64_t t = std::max(a.time, b.time);
          const long double va = ValueAt(a, t), vb = ValueAt(b, t);
          return va != vb ? va < vb : a.seq < b.seq;
        }
        case Kind::kMin:
          return a.next_use != b.next_use ? a.next_use > b.next_use : a.seq < b.seq;
        default:
          return false;
      }
    }

    // List ids: ARC T1 0, T2 1, B1 2, B2 3.
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
      const int where = At(id).list;
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

    // List ids: S3-FIFO S 0, M 1, G 2.
    std::optional<size_t> S3EvictMain() {
      while (auto t = Back(1)) {
        if (entries_[*t].freq >= 1) {
          --entries_[*t].freq;
          Push(1, *t);
          continue;
        }
        entries_[*t].list = kNone;
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
            if (entries_[*t].freq >= 2) {
              entries_[*t].freq = 0;
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
      if (At(id).list == 2) {
        Push(1, id);
      } else {
        Push(BackFromGhost(id) ? 1 : 0, id);
      }
      At(id).freq = 0;
      return victim;
    }

    // List id: SIEVE 0.
    std::optional<size_t> SieveMiss(size_t id) {
      std::optional<size_t> victim;
      if (Size(0) >= cap_) {
        std::optional<size_t> o = hand_ ? hand_ : Back(0);
        while (entries_[*o].visited) {
          entries_[*o].visited = false;
          o = Newer(0, *o);
          if (!o) o = Back(0);
        }
        hand_ = Newer(0, *o);
        entries_[*o].list = kNone;
        victim = o;
      }
      Push(0, id);
      At(id).visited = Returning(id);
      return victim;
    }

    // List ids: TinyLFU W 0, probation 1, protected 2.
    unsigned TinyFreq(size_t id) const {
      return sketch_->Estimate(e_->blocks_[id].key);  // persist adds nothing: the sketch is keyed
    }
    std::optional<size_t> TinyMiss(size_t id) {
      sketch_->Increment(e_->blocks_[id].key);
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
          entries_[*v].list = kNone;
          Push(1, cand);
          return v;
        }
        return cand;
      }
      if (Size(0) + main > cap_) {
        auto v = main_victim();
        if (!v) v = Back(0);
        entries_[*v].list = kNone;
        return v;
      }
      return std::nullopt;
    }

    const ReferenceEngine* e_;
    Persistence persistence_;
    bool own_ema_;  // an ema whose average is its own, not the block's score
    size_t cap_;
    size_t small_cap_, s3_main_cap_, s3_ghost_cap_, window_cap_, protected_cap_;
    std::unique_ptr<CountMinSketch> sketch_;
    std::vector<Entry> entries_;
    uint64_t stamp_ = 0;
    uint64_t seen_ = 0;
    double p_ = 0;  // ARC's T1 target, real-valued
    std::optional<size_t> hand_;
  };

  // ---- adaptive (docs/policies.md, "adaptive") ----

  // "E1+E2+...[;epoch=N][;decay=X][;z=Y][;hold=N]".
  void ParseAdaptive(const std::string& spec) {
    const size_t semi = spec.find(';');
    std::string experts = spec.substr(0, semi);
    std::string settings = semi == std::string::npos ? "" : spec.substr(semi + 1);
    while (!experts.empty()) {
      const size_t plus = experts.find('+');
      std::string one = experts.substr(0, plus);
      experts = plus == std::string::npos ? "" : experts.substr(plus + 1);
      Persistence p = o_.persistence;
      if (one.ends_with("/reset")) {
        p = Persistence::kReset;
        one.resize(one.size() - 6);
      }
      // Only the first expert's score is the block's: a later ema keeps its own.
      const bool own = !policies_.empty() && one.starts_with("ema:");
      policies_.emplace_back(this, one, p, own);
    }
    while (!settings.empty()) {
      const size_t next = settings.find(';');
      const std::string kv = settings.substr(0, next);
      settings = next == std::string::npos ? "" : settings.substr(next + 1);
      const std::string k = kv.substr(0, kv.find('=')), v = kv.substr(kv.find('=') + 1);
      if (k == "epoch") epoch_ = static_cast<uint32_t>(std::stoul(v));
      if (k == "decay") decay_ = std::stod(v);
      if (k == "z") z_ = std::stod(v);
      if (k == "hold") hold_ = static_cast<uint32_t>(std::stoul(v));
    }
    wins_.assign(policies_.size(), 0);
    losses_.assign(policies_.size(), 0);
    epoch_wins_.assign(policies_.size(), 0);
    epoch_losses_.assign(policies_.size(), 0);
  }

  // Every expert is told about the touch as if it alone decided. It hits when
  // the block is in its set (in tick mode: and was when the hold window
  // began); against the leader it wins (it hit, the leader missed) or loses.
  void Feed(size_t id, double obs, uint64_t now) {
    std::vector<bool> hit;
    for (RefPolicy& x : policies_) {
      if (x.In(id)) {
        hit.push_back(o_.mode != Mode::kTick || x.At(id).held);
        x.Hit(id, obs, now);
      } else {
        hit.push_back(false);
        if (const std::optional<size_t> v = x.Miss(id, obs, now)) x.At(*v).dropped = ++drops_;
      }
    }
    for (size_t k = 0; k < policies_.size(); ++k) {
      epoch_wins_[k] += hit[k] && !hit[leader_];
      epoch_losses_[k] += !hit[k] && hit[leader_];
    }
  }

  void AdaptiveHit(size_t id, double obs, uint64_t now) {
    Feed(id, obs, now);
    EndTouch();
  }

  // R evicts, of its blocks the leader does not hold, the one the leader
  // dropped longest ago; blocks it never held go before those, oldest touch
  // first.
  std::optional<size_t> AdaptiveMiss(size_t id, double obs, uint64_t now) {
    Feed(id, obs, now);
    std::optional<size_t> victim;
    size_t r = 0;
    for (const B& b : blocks_) r += b.live && b.in_set;
    if (r >= cap_) {
      RefPolicy& leader = policies_[leader_];
      for (size_t i = 0; i < blocks_.size(); ++i) {
        if (!blocks_[i].live || !blocks_[i].in_set || leader.In(i)) continue;
        if (!victim || leader.At(i).dropped < leader.At(*victim).dropped ||
            (leader.At(i).dropped == leader.At(*victim).dropped &&
             blocks_[i].seq < blocks_[*victim].seq)) {
          victim = i;
        }
      }
      // R and the touched block are C + 1 blocks, the leader holds C at most.
      if (!victim) throw std::logic_error("reference: every block of R is in the leader's set");
    }
    EndTouch();
    return victim;
  }

  void EndTouch() {
    if (o_.mode == Mode::kTick && ++hold_touches_ >= uint64_t{hold_} * std::max<size_t>(1, cap_)) {
      hold_touches_ = 0;
      for (RefPolicy& x : policies_) x.HoldNow();
    }
    if (++touches_ < epoch_) return;
    touches_ = 0;
    size_t best = leader_;
    double best_lead = 0;
    for (size_t k = 0; k < policies_.size(); ++k) {
      wins_[k] = wins_[k] * decay_ + epoch_wins_[k];
      losses_[k] = losses_[k] * decay_ + epoch_losses_[k];
      epoch_wins_[k] = epoch_losses_[k] = 0;
      // A sign test: the lead must be over z standard deviations.
      const double lead = wins_[k] - losses_[k];
      if (lead > z_ * std::sqrt(wins_[k] + losses_[k]) && lead > best_lead) {
        best = k;
        best_lead = lead;
      }
    }
    if (best != leader_) {
      leader_ = best;
      ++leader_changes_;
      std::fill(wins_.begin(), wins_.end(), 0);  // they were against the old leader
      std::fill(losses_.begin(), losses_.end(), 0);
    }
  }

  // ---- the engine ----
  bool Persist() const { return o_.persistence == Persistence::kPersist; }
  void Log(EngineEvent::Kind k, size_t id) { log.push_back(EngineEvent{k, blocks_[id].key}); }
  size_t CountTier(Tier t) const {
    size_t n = 0;
    for (const B& b : blocks_) n += b.live && b.tier == t;
    return n;
  }
  bool Held(size_t id) const {
    if (tick_ < blocks_[id].hold_until) return true;
    return o_.hysteresis_ticks > 0 && blocks_[id].moved_tick != 0 &&
           tick_ - blocks_[id].moved_tick < o_.hysteresis_ticks;
  }
  void Classify(size_t id) {
    B& b = blocks_[id];
    int want = kNone;
    if (b.live && b.in_set && b.tier != Tier::kFast) want = kPromoteQ;
    if (b.live && !b.in_set && b.tier == Tier::kFast) want = kDemoteQ;
    if (b.live && !b.in_set && b.tier != Tier::kFast && b.rank != 0 &&
        b.rank != TierIndex(b.tier)) {
      want = kLowerQ;
    }
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

  // ---- more than two tiers ----

  std::vector<size_t> RankedIn(unsigned k) const {
    std::vector<size_t> ids;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      if (blocks_[i].live && !blocks_[i].in_set && blocks_[i].rank == k) ids.push_back(i);
    }
    return ids;
  }
  unsigned FirstLowerWithRoom() const {
    for (unsigned k = 1; k + 1 < tiers_; ++k) {
      if (RankedIn(k).size() < lower_cap_[k - 1]) return k;
    }
    return tiers_ - 1;
  }
  // `id` belongs in tier `tier` (it left the set, or was placed there); each
  // middle tier then over its capacity sends its coldest one tier down.
  void RankBelow(size_t id, unsigned tier) {
    blocks_[id].rank = std::min(tier, tiers_ - 1);
    for (unsigned k = tier; k + 1 < tiers_; ++k) {
      const std::vector<size_t> m = RankedIn(k);
      if (m.size() <= lower_cap_[k - 1]) break;
      const size_t c = ColdestFirst(m).front();
      blocks_[c].rank = k + 1;
      if (c != id) Settle(c);
    }
    Settle(id);
  }
  // Tick mode: a block that left the set is ranked where it sits, unless that
  // is tier 0: then when it is demoted.
  void LeftSetTick(size_t id) {
    if (blocks_[id].tier == Tier::kFast) {
      Classify(id);
    } else {
      RankBelow(id, TierIndex(blocks_[id].tier));
    }
  }
  // Demand: to its rank now; tick: queued.
  void Settle(size_t id) {
    B& b = blocks_[id];
    if (o_.mode == Mode::kTick) {
      Classify(id);
      return;
    }
    const Tier to = TierAt(b.rank);
    if (b.tier == to || b.tier == Tier::kNone) return;
    const bool up = b.rank < TierIndex(b.tier);
    b.tier = to;
    ++(up ? counters.promotions : counters.demotions);
    Log(up ? EngineEvent::kPromote : EngineEvent::kDemote, id);
  }

  // ---- scheduler hints ----

  // A group: its members (live blocks, one owner), and what its hints left.
  struct G {
    uint32_t owner = 0;
    std::vector<size_t> members;
    bool hinted_out = false;   // idle or done, not touched (or soon) since
    uint32_t working_set = 0;  // its blocks in the set at its last idle or done
    uint64_t idle_at = 0;      // the clock of its last idle or done
    // A soon still placing: its blocks still to place, hottest at the back,
    // and how many more it may place.
    std::vector<size_t> candidates;
    uint32_t prefetch_left = 0;
  };

  size_t InSet() const {
    size_t n = 0;
    for (const B& b : blocks_) n += b.live && b.in_set;
    return n;
  }
  bool Pooled() const { return !pools_[0].empty() || !pools_[1].empty(); }
  // The next idle or done block to leave: done ones first.
  size_t NextPooled() const { return pools_[0].empty() ? pools_[1].front() : pools_[0].front(); }
  void Unpool(size_t id) {
    for (std::vector<size_t>& p : pools_) std::erase(p, id);
  }
  void Activate(GroupId gid) {
    G& g = groups_.at(gid);
    g.hinted_out = false;
    for (size_t m : g.members) Unpool(m);
  }
  void LeaveGroup(size_t id) {
    const GroupId gid = blocks_[id].group;
    if (gid == kNoGroup) return;
    blocks_[id].group = kNoGroup;
    Unpool(id);
    std::erase(groups_.at(gid).members, id);
    if (groups_.at(gid).members.empty()) {
      groups_.erase(gid);
      std::erase(pending_, gid);
    }
  }

  // `ids` from the coldest to the hottest: by the policy's heat (adaptive:
  // its leader's), then by last touch. Heat is the block's score (the first
  // policy's), except for an EMA: its ordering key, compared here as the
  // value at a common time, exactly (a near-tie is counted as ambiguous).
  std::vector<size_t> ColdestFirst(std::vector<size_t> ids) {
    const RefPolicy& p = adaptive_ ? policies_[leader_] : policies_[0];
    struct Ema {
      long double score;
      uint64_t time;
    };
    auto ema = [&](size_t id) -> Ema {
      if (!p.own_ema()) return {blocks_[id].score, blocks_[id].time};
      const auto x = p.Get(id);
      return x.has_own ? Ema{x.own, x.own_time} : Ema{0, 0};
    };
    uint64_t t = 0;
    for (size_t id : ids) t = std::max(t, ema(id).time);
    auto heat = [&](size_t id) -> long double {
      // MIN (never hinted): the sooner the next touch, the hotter.
      if (p.kind == Kind::kMin) return -static_cast<long double>(blocks_[id].next_use);
      if (p.kind != Kind::kEma) return blocks_[id].score;
      const Ema x = ema(id);
      return x.score * std::pow(1.0L - p.alpha, static_cast<long double>(t - x.time));
    };
    std::sort(ids.begin(), ids.end(), [&](size_t a, size_t b) {
      const long double ha = heat(a), hb = heat(b);
      if (ha != hb) return ha < hb;
      if (blocks_[a].seq != blocks_[b].seq) return blocks_[a].seq < blocks_[b].seq;
      return blocks_[a].slot < blocks_[b].slot;  // never touched: by slot
    });
    if (p.kind == Kind::kEma) {
      for (size_t a : ids) {
        for (size_t b : ids) {
          const Ema xa = ema(a), xb = ema(b);
          const long double ha = heat(a), hb = heat(b);
          if (a >= b || (xa.score == xb.score && xa.time == xb.time) || (ha == 0 && hb == 0)) {
            continue;
          }
          heat_ambiguous_ += std::fabs(ha - hb) <= 1e-9L * std::max(ha, hb);
        }
      }
    }
    return ids;
  }

  // Takes the block out of the set for a hint: the policy forgets it (as a
  // release), the block leaves as an eviction would, counted apart.
  void Displace(size_t v) {
    B& b = blocks_[v];
    for (RefPolicy& p : policies_) p.Erase(v);
    b.in_set = false;
    Unpool(v);
    ++counters.hint_displaced;
    Log(EngineEvent::kEvict, v);
    if (!Persist()) b.score = 0, b.count = 0, b.time = 0;
    if (o_.mode == Mode::kDemand) {
      RankBelow(v, 1);
    } else {
      LeftSetTick(v);
    }
  }

  // A soon puts `id` (of `owner`'s group) into the set: free room, else an
  // idle or done block's, else the policy's victim while every block of the
  // set is the owner's. False when there is no room for it.
  bool PlaceAhead(size_t id, uint32_t owner, uint64_t now) {
    if (cap_ == 0) return false;
    if (InSet() >= cap_) {
      if (Pooled()) {
        blocks_[id].rank = 0;  // on its way in
        Displace(NextPooled());
      } else {
        for (const B& x : blocks_) {
          if (x.live && x.in_set && x.owner != owner) return false;
        }
      }
    }
    B& b = blocks_[id];
    // The pause does not age it: its touch time (and an own EMA's) moves on
    // by the time its group was idle, never past now.
    const uint64_t idle_at = groups_.at(b.group).idle_at;
    const uint64_t idle_for = now > idle_at ? now - idle_at : 0;
    b.time += std::min(idle_for, now > b.time ? now - b.time : 0);
    for (RefPolicy& p : policies_) p.Resume(id, idle_for, now);
    // The policy is told as of a touch of observation 0 (not counted).
    placing_ = true;
    const std::optional<size_t> victim =
        adaptive_ ? AdaptiveMiss(id, 0.0, now) : policies_[0].Miss(id, 0.0, now);
    placing_ = false;
    blocks_[id].in_set = true;
    blocks_[id].rank = 0;
    blocks_[id].placed_ahead = true;
    ++counters.hint_prefetched;
    if (victim) {
      B& v = blocks_[*victim];
      v.in_set = false;
      Unpool(*victim);
      ++counters.evictions;
      Log(EngineEvent::kEvict, *victim);
      if (!Persist()) v.score = 0, v.count = 0, v.time = 0;
    }
    if (o_.mode == Mode::kDemand) {
      if (victim) RankBelow(*victim, 1);
      if (blocks_[id].tier != Tier::kNone) {
        ++counters.promotions;
        Log(EngineEvent::kPromote, id);
      } else {
        ++counters.placed_fast;  // a block with no tier yet (admitted from a ghost)
        Log(EngineEvent::kPlaceFast, id);
      }
      blocks_[id].tier = Tier::kFast;
    } else {
      if (victim) LeftSetTick(*victim);
      Classify(id);
      // Wanted soon: planned with the blocks touched while queued.
      if (blocks_[id].queue == kPromoteQ) {
        blocks_[id].retouched = true;
        blocks_[id].queue_stamp = ++qstamp_;
      }
    }
    return true;
  }

  // The block a soon group places next, if any: its hottest candidate still
  // live, in the group and out of the set (those that are not are dropped).
  std::optional<size_t> NextCandidate(GroupId gid) {
    G& g = groups_.at(gid);
    while (!g.candidates.empty()) {
      size_t c = g.candidates.back();
      if (quirks.candidates_by_slot) {
        // Whatever live block holds the slot now.
        const uint32_t slot = blocks_[c].slot;
        for (size_t i = 0; i < blocks_.size(); ++i) {
          if (blocks_[i].live && blocks_[i].slot == slot) c = i;
        }
      }
      if (blocks_[c].live && blocks_[c].group == gid && !blocks_[c].in_set) return c;
      g.candidates.pop_back();
    }
    return std::nullopt;
  }

  // Soon groups still placing, in the order they started, one block each per
  // round, while a round places any.
  void ServePending(uint64_t now) {
    bool progress = true;
    while (progress && !pending_.empty()) {
      progress = false;
      for (size_t i = 0; i < pending_.size();) {
        G& g = groups_.at(pending_[i]);
        const std::optional<size_t> c = NextCandidate(pending_[i]);
        if (!c || g.prefetch_left == 0) {
          g.candidates.clear();
          pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
          continue;
        }
        if (PlaceAhead(*c, g.owner, now)) {
          g.candidates.pop_back();
          --g.prefetch_left;
          progress = true;
        }
        ++i;
      }
    }
  }

  EngineOptions o_;
  size_t cap_;        // the set's size: tier 0 less its landing room
  size_t tier0_cap_;  // tier 0's budget in blocks
  size_t held_ = 0;   // tier 0's pages no block holds (set_held_blocks)
  unsigned tiers_ = 2;
  std::vector<size_t> lower_cap_;  // tiers 1 .. N-2, in blocks
  double score_alpha_ = 0;         // the alpha of the ema whose value is the block's score, if any
  std::vector<B> blocks_;
  std::map<BlockKey, size_t> live_;
  std::deque<Ghost> ghosts_;
  uint64_t seq_ = 0, qstamp_ = 0, tick_ = 0;
  // One policy, or adaptive's experts in the order named.
  std::vector<RefPolicy> policies_;
  bool adaptive_ = false;
  uint32_t epoch_ = 4096, hold_ = 16;
  double decay_ = 0.99, z_ = 3;
  std::vector<double> wins_, losses_;
  std::vector<uint32_t> epoch_wins_, epoch_losses_;
  size_t leader_ = 0;
  uint64_t leader_changes_ = 0, drops_ = 0, hold_touches_ = 0;
  uint32_t touches_ = 0;
  // Hints.
  std::map<GroupId, G> groups_;
  std::vector<size_t> pools_[2];  // done, idle: in the order they leave
  std::vector<GroupId> pending_;  // soon groups still placing, in turn
  uint64_t now_ = 0;              // the clock of the last touch or hint
  bool placing_ = false;          // a soon placement is being told to the policy
  uint64_t heat_ambiguous_ = 0;   // near-ties of EMA heat
  std::vector<uint32_t> free_slots_;
  uint32_t next_slot_ = 0;
};

}  // namespace cxltier::engine::testing
