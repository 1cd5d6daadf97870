// What-if recording of live traffic (`cxltierctl record`, docs/operations.md):
// while on, every admit (with the tier its pages sat in), every touch the
// fold gives the engine and every release becomes an event of our binary trace (docs/workloads.md),
// one step per tick, so `cxltier-sim --trace bin:FILE --mode tick --tick-steps 1` replays it with
// any policy. Keys are hashed with a secret drawn for this recording and
// never written anywhere: a file shows which blocks were touched together
// and how often, not which blocks they were, nor whose.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cxltier/block.h"
#include "engine/engine.h"
#include "trace.h"

namespace cxltier::service {

class Recorder {
 public:
  // What a recording may hold in the daemon's memory, events and key index
  // together (about 16 bytes per event and 64 per distinct block): when a new
  // event would pass it, the recording stops, marked truncated.
  static constexpr uint64_t kMaxBytes = uint64_t{256} << 20;
  static constexpr uint64_t kBytesPerEvent = sizeof(sim::TraceEvent), kBytesPerKey = 64;
  // XXH3's minimum secret is 136 bytes; this is its default size.
  static constexpr size_t kSecretBytes = 192;
  using Secret = std::array<uint8_t, kSecretBytes>;

  struct Summary {
    uint64_t start_tick = 0, end_tick = 0;
    uint64_t events = 0, keys = 0;
    bool truncated = false;  // stopped at the event cap before the end
    // The engine's counters over the recording: what the daemon measured live.
    uint64_t touches = 0, hits = 0;
  };

  // Starts a recording at `tick` that stops by itself after `ticks` ticks,
  // `max_events` events or `max_bytes`. REQUIRES: !on().
  void Start(uint64_t tick, uint64_t ticks, uint64_t max_events, const Secret& secret,
             const engine::EngineCounters& now, uint64_t max_bytes = kMaxBytes);
  bool on() const { return on_; }
  // Whether a stopped recording is waiting to be taken.
  bool ready() const { return !on_ && done_.has_value(); }

  // A touch the fold gave the engine, or a release, at `tick`.
  void Touch(uint64_t tick, const BlockKey& key, double mass) {
    if (on_) Add(tick, key, static_cast<float>(mass), sim::EventKind::kTouch);
  }
  void Release(uint64_t tick, const BlockKey& key) {
    if (on_) Add(tick, key, 0.0f, sim::EventKind::kRelease);
  }
  // A block admitted with its pages in `placed`.
  void Admit(uint64_t tick, const BlockKey& key, Tier placed) {
    if (on_) Add(tick, key, placed == Tier::kFast ? 0.0f : 1.0f, sim::EventKind::kAdmit);
  }
  // Once per tick, after the fold: stops the recording when its time is up.
  void EndTick(uint64_t tick, const engine::EngineCounters& now);
  // Stops now (if on).
  void Stop(uint64_t tick, const engine::EngineCounters& now);

  // The stopped recording, and the recorder is empty again. REQUIRES: ready().
  std::pair<sim::Trace, Summary> Take();
  const Summary& summary() const { return summary_; }

 private:
  void Add(uint64_t tick, const BlockKey& key, float obs, sim::EventKind kind);

  bool on_ = false;
  uint64_t stop_tick_ = 0, max_events_ = 0, max_bytes_ = 0;
  Secret secret_{};
  engine::EngineCounters at_start_;
  Summary summary_;
  sim::Trace trace_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> index_;  // hashed key -> trace key
  std::optional<bool> done_;                                    // set when stopped, until taken
};

}  // namespace cxltier::service
