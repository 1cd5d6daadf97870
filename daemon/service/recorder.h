// What-if recording of live traffic (`cxltierctl record`, docs/operations.md):
// while on, every admit (with the tier its pages sat in), every touch the
// fold gives the engine and every release becomes an event of our binary trace
// (docs/workloads.md), one step per tick, so
// `cxltier-sim --trace bin:FILE --mode tick --tick-steps 1` replays it with
// any policy. Keys are hashed with a secret drawn for this recording and
// never written anywhere: a file shows which blocks were touched together
// and how often, not which blocks they were, nor whose.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

#include "cxltier/block.h"
#include "trace.h"

namespace cxltier::service {

class Recorder {
 public:
  // What a recording may hold in the daemon's memory, events and key index
  // together: when a new event would pass it, the recording stops, marked
  // truncated. A new block costs its key twice (the trace's table and the
  // index) plus a hash node and bucket, with room for the vector's growth.
  static constexpr uint64_t kMaxBytes = uint64_t{256} << 20;
  static constexpr uint64_t kBytesPerEvent = sizeof(sim::TraceEvent), kBytesPerKey = 128;
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
  };

  // Starts a recording at `tick` that stops by itself after `ticks` ticks,
  // `max_events` events or `max_bytes`. A finished recording not taken yet is
  // dropped. REQUIRES: !on().
  void Start(uint64_t tick, uint64_t ticks, uint64_t max_events, const Secret& secret,
             uint64_t max_bytes = kMaxBytes);
  bool on() const { return state_ == State::kOn; }
  // A stopped recording waits to be taken.
  bool ready() const { return state_ == State::kDone; }

  // A touch the fold gave the engine (`hit`: the block was in tier 0), or a
  // release, or an admit with the block's pages in `placed`, at `tick`.
  void Touch(uint64_t tick, const BlockKey& key, double mass, bool hit) {
    if (on() && Add(tick, key, static_cast<float>(mass), sim::EventKind::kTouch)) {
      ++summary_.touches;
      summary_.hits += hit;
    }
  }
  void Release(uint64_t tick, const BlockKey& key) {
    if (on()) Add(tick, key, 0.0f, sim::EventKind::kRelease);
  }
  void Admit(uint64_t tick, const BlockKey& key, Tier placed) {
    if (on()) Add(tick, key, placed == Tier::kFast ? 0.0f : 1.0f, sim::EventKind::kAdmit);
  }
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
  // False when a cap stopped the recording instead.
  bool Add(uint64_t tick, const BlockKey& key, float obs, sim::EventKind kind);
  void ForgetSecret();

  State state_ = State::kIdle;
  uint64_t stop_tick_ = 0, max_events_ = 0, max_bytes_ = 0;
  Secret secret_{};
  Summary summary_;
  sim::Trace trace_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> index_;  // hashed key -> trace key
};

}  // namespace cxltier::service
