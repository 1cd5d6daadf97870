// Recording of live traffic (`cxltierctl record`, docs/operations.md):
// while on, every admit (with the tier its pages sat in), every touch the
// fold gives the engine, every release and every scheduler hint the engine
// applied becomes an event of our binary trace (docs/workloads.md), one step
// per tick, so `cxltier-sim --trace bin:FILE --mode tick --tick-steps 1`
// replays it with any policy (the what-if replay). Keys are hashed with a secret drawn for this
// recording and never written anywhere: a file shows which blocks were
// touched together and how often, not which blocks they were, nor whose.
// Groups (the blocks hints speak of) are numbered 1, 2, ... in the order the
// recording first sees them, so no client's own group numbers, nor which
// client a group was, are written either. A block's group is the last group
// it was seen in (joined by a hint, or a touch while in a group); with any
// group or hint the trace carries the group table.
// The daemon's moves are recorded too (format version 3), so that
// `cxltier-sim --moves recorded` replays them exactly when the daemon had
// them: each Plan() the daemon ran (after the tick's fold) with the number
// of moves it planned, each outcome of a move the engine took (when the
// mover finished it, maybe ticks later, or at once when dispatch refused
// it), and each relocation the daemon told the engine of. An outcome is
// recorded only for a move planned during the recording and only while it
// is the block's current move (the engine ignores the others). And each
// change of the blocks' worth of released pages the engine counts in tier 0
// (Held), which the room of its placements depends on.
//
// The budget (events and bytes) is split per uid, so that one uid's traffic
// can neither end an admin's recording nor push out another uid's events
// (issue 30, item 7; docs/security.md). Each client event names its uid; a
// uid may hold at most budget / (uids seen + 1): the "+ 1" keeps a share
// free for the next uid to arrive, so a uid that floods first still leaves
// room for the others, and nothing recorded is ever taken back. A uid past
// its share loses the event (counted per uid) and records nothing more, so
// the trace holds a gap-free prefix of each uid's traffic. Such a trace is
// no exact replay any more: the daemon's moves are stripped from it at the
// first loss (it becomes a what-if trace, Summary::replay_exact false),
// which also frees their room. The daemon's moves belong to no uid: when
// one does not fit, they go the same way. The recording stops before its
// time (truncated) only when a uid within its share finds no room left.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "cxltier/block.h"
#include "cxltier/wire.h"  // HintKind
#include "trace.h"

namespace cxltier::service {

class Recorder {
 public:
  // What a recording may hold in the daemon's memory, events, key index and
  // groups together, split in shares per uid (above). A new block costs its key twice (the
  // trace's table and the index) plus a hash node and bucket, with room for
  // the vector's growth; once there are groups, its group number too (u32,
  // with room for growth); a new group its hash node and bucket.
  static constexpr uint64_t kMaxBytes = uint64_t{256} << 20;
  static constexpr uint64_t kBytesPerEvent = sizeof(sim::TraceEvent), kBytesPerKey = 128;
  static constexpr uint64_t kBytesPerGroupedKey = 8, kBytesPerGroup = 64;
  // A uid's entry in the share table.
  static constexpr uint64_t kBytesPerUid = 64;
  // XXH3's minimum secret is 136 bytes; this is its default size.
  static constexpr size_t kSecretBytes = 192;
  using Secret = std::array<uint8_t, kSecretBytes>;

  struct Summary {
    uint64_t start_tick = 0, end_tick = 0;
    uint64_t events = 0, keys = 0;
    bool truncated = false;  // stopped at a cap before its time was up
    // The recorded touches and how many of them were hits (the block was in
    // tier 0 when the engine folded it): what the daemon measured live.
    uint64_t touches = 0, hits = 0;
    uint64_t hints = 0, groups = 0;  // recorded hints; groups seen
    // The daemon's plans, the move outcomes (done or not) and relocations
    // recorded (all 0 when the trace is no exact replay: it holds none).
    uint64_t plans = 0, outcomes = 0, outcomes_done = 0, relocations = 0;
    // Leader events recorded (shards): each change of the policy's leader,
    // and the leader at the start when it was not the first candidate.
    uint64_t leader_changes = 0;
    // Per uid: the events it holds in the trace, and the records (events and
    // group joins) it lost past its share.
    struct PerUid {
      uint64_t events = 0, dropped = 0;
    };
    std::map<uint32_t, PerUid> uids;
    uint64_t dropped = 0;  // all uids'
    // The trace holds every event and the daemon's moves: cxltier-sim
    // --moves recorded replays it exactly. False once anything was lost.
    bool replay_exact = true;
  };

  // Starts a recording at `tick` that stops by itself after `ticks` ticks,
  // `max_events` events or `max_bytes`. A finished recording not taken yet is
  // dropped. REQUIRES: !on().
  void Start(uint64_t tick, uint64_t ticks, uint64_t max_events, const Secret& secret,
             uint64_t max_bytes = kMaxBytes);
  bool on() const { return state_ == State::kOn; }
  // A stopped recording waits to be taken.
  bool ready() const { return state_ == State::kDone; }

  // A touch the fold gave the engine (`hit`: the block was in tier 0) of a
  // block of uid `uid` in engine group `group` (0: none), or a release, or
  // an admit with the block's pages in `placed`, at `tick`.
  void Touch(uint64_t tick, uint32_t uid, const BlockKey& key, double mass, bool hit,
             uint64_t group = 0) {
    if (on() && Add(tick, uid, key, static_cast<float>(mass), sim::EventKind::kTouch, group)) {
      ++summary_.touches;
      summary_.hits += hit;
    }
  }
  // The block of uid `uid` joined engine group `group` (nonzero) at `tick`:
  // no event, its group in the trace's table.
  void Group(uint64_t tick, uint32_t uid, const BlockKey& key, uint64_t group);
  // A hint the engine applied to engine group `group` (nonzero) of uid `uid` at `tick`.
  void Hint(uint64_t tick, uint32_t uid, uint64_t group, HintKind kind);
  void Release(uint64_t tick, uint32_t uid, const BlockKey& key) {
    if (!on()) return;
    planned_.erase(key);  // its move, if any, is stale now
    Add(tick, uid, key, 0.0f, sim::EventKind::kRelease);
  }
  // `chosen`: the engine chose `placed` (a block with no page yet, steered
  // there: kPlace); else its pages were found there (kAdmit).
  void Admit(uint64_t tick, uint32_t uid, const BlockKey& key, Tier placed, bool chosen = false) {
    if (on()) {
      if (chosen) FlushHeld(tick);
      Add(tick, uid, key, static_cast<float>(TierIndex(placed)),
          chosen ? sim::EventKind::kPlace : sim::EventKind::kAdmit);
    }
  }
  // The daemon ran the engine's Plan() at `tick` (after the tick's fold),
  // which planned `moves` moves; Planned then names each move's block.
  // `budget_blocks`: the plan's migration budget (the daemon paces it; 0:
  // the recording's migrate_bytes_per_tick).
  void Plan(uint64_t tick, size_t moves, uint64_t budget_blocks = 0);
  void Planned(const BlockKey& key) {
    if (on() && summary_.replay_exact) planned_.insert(key);
  }
  // The engine took the outcome (`done` or not) of the current move of
  // block `key` at `tick`: recorded if the move was planned during the
  // recording.
  void Outcome(uint64_t tick, const BlockKey& key, bool done);
  // The daemon told the engine block `key` sits in `tier` (Engine::Relocated,
  // when that changes its tier) at `tick`.
  void Relocated(uint64_t tick, const BlockKey& key, Tier tier) {
    if (on() && Add(tick, std::nullopt, key, static_cast<float>(TierIndex(tier)),
                    sim::EventKind::kRelocated)) {
      ++summary_.relocations;
    }
  }
  // The engine's held blocks (Engine::set_held_blocks: released blocks'
  // pages still in tier 0) are `blocks` from now on. Told whether a
  // recording is on or not. Recorded only where the engine reads it, before
  // a placement (kPlace) or a plan, and only when it changed since: a flood
  // of releases and reuses between those adds no event.
  void Held(size_t blocks) {
    held_now_ = static_cast<uint32_t>(std::min<size_t>(blocks, UINT32_MAX));
  }
  // The policy's leader is candidate `leader` after `changes` changes
  // (Policy::Leader, LeaderChanges): told right after each touch the fold
  // made, and once when the recording starts. Recorded (kLeader) when
  // `changes` moved since the last call, and at the start when the leader
  // is not the first candidate, so that an exact replay starts with the
  // same leader and changes it at the same touches.
  void Leader(uint64_t tick, uint64_t changes, size_t leader);
  // The daemon's policy was replaced (policy set, a reload): the replay
  // knows one policy, so the recording is no exact replay from here on (its
  // moves go, as when a uid loses events).
  void PolicyChanged();
  // Once per tick, after the fold: stops the recording when its time is up.
  void EndTick(uint64_t tick) {
    if (on() && tick >= stop_tick_) Stop(tick);
  }
  // Stops now (if on); the recording waits to be taken.
  void Stop(uint64_t tick);
  // Forgets everything, recording or not (the daemon is stopping).
  void Discard();

  // The stopped recording; the recorder is idle again. REQUIRES: ready().
  std::pair<sim::Trace, Summary> Take();

 private:
  enum class State { kIdle, kOn, kDone };
  // What a uid holds of the budget, and whether it lost a record.
  struct Share {
    uint64_t events = 0, bytes = 0, dropped = 0;
    bool lost = false;
  };
  // An event of uid `uid` (none: the daemon's move events); false when it
  // was not recorded (Admits said why).
  bool Add(uint64_t tick, std::optional<uint32_t> uid, const BlockKey& key, float obs,
           sim::EventKind kind, uint64_t group = 0);
  // Whether `new_events` more events, a new key and a new group (when
  // `new_key`, `new_group`) may be recorded for `uid` (none: the daemon's
  // moves). A uid past its share loses them and everything after (counted),
  // and the trace its moves; a move event that does not fit strips the
  // moves too; a uid within its share that finds no room stops the
  // recording at `tick`, truncated.
  bool Admits(uint64_t tick, std::optional<uint32_t> uid, uint64_t new_events, bool new_key,
              bool new_group, bool grouped);
  // Whether the whole recording may hold `events` events, `keys` keys and
  // `groups` groups (with the group table when `grouped`).
  bool Fits(uint64_t events, uint64_t keys, uint64_t groups, bool grouped) const;
  // The trace is no exact replay any more: its move events go (and their room).
  void DropMoves();
  BlockKey Hash(const BlockKey& key) const;
  // The trace key of a hashed key: a new one is added (Fits said there is room).
  uint32_t KeyOf(const BlockKey& hashed);
  // The recording's number for an engine group (Fits said there is room), and
  // the group table made (all 0) if it was not yet.
  uint32_t GroupNumber(uint64_t group);
  // The step of an event at `tick`: ticks since the start, never decreasing.
  uint32_t Step(uint64_t tick) const;
  void ForgetSecret();
  // Records Held()'s count at `tick` if it changed since the trace last said.
  void FlushHeld(uint64_t tick);

  State state_ = State::kIdle;
  uint64_t stop_tick_ = 0, max_events_ = 0, max_bytes_ = 0;
  Secret secret_{};
  Summary summary_;
  sim::Trace trace_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> index_;  // hashed key -> trace key
  std::unordered_map<uint64_t, uint32_t> groups_;  // engine group -> the recording's number
  // The engine keys of blocks whose moves were planned during the recording
  // and have no outcome yet: as many as moves in flight, so not counted
  // against the caps.
  std::unordered_set<BlockKey, BlockKeyHash> planned_;
  // Held()'s count, and the count the trace last said (a replay starts at 0).
  uint32_t held_now_ = 0, held_recorded_ = 0;
  // The policy's leader changes when last told (Leader); none yet.
  std::optional<uint64_t> leader_changes_;
  std::map<uint32_t, Share> shares_;  // per uid
};

}  // namespace cxltier::service
