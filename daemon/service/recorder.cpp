#include "service/recorder.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace cxltier::service {

void Recorder::Start(uint64_t tick, uint64_t ticks, uint64_t max_events, const Secret& secret,
                     const engine::EngineCounters& now, uint64_t max_bytes) {
  trace_ = sim::Trace{};
  trace_.name = "recording";
  index_.clear();
  done_.reset();
  secret_ = secret;
  summary_ = Summary{};
  summary_.start_tick = tick;
  stop_tick_ = tick + ticks;
  max_events_ = max_events;
  max_bytes_ = max_bytes;
  at_start_ = now;
  on_ = true;
}

void Recorder::Add(uint64_t tick, const BlockKey& key, float obs, sim::EventKind kind) {
  const uint64_t bytes =
      (trace_.events.size() + 1) * kBytesPerEvent + (trace_.keys.size() + 1) * kBytesPerKey;
  if (trace_.events.size() >= max_events_ || bytes > max_bytes_) {
    summary_.truncated = true;
    on_ = false;  // Stop() or EndTick() records the counters
    return;
  }
  uint8_t raw[16];
  std::memcpy(raw, &key.hi, 8);
  std::memcpy(raw + 8, &key.lo, 8);
  const XXH128_hash_t h = XXH3_128bits_withSecret(raw, sizeof(raw), secret_.data(), secret_.size());
  const BlockKey hashed{h.high64, h.low64};
  const auto [it, added] = index_.try_emplace(hashed, static_cast<uint32_t>(trace_.keys.size()));
  if (added) trace_.keys.push_back(hashed);
  // Steps count ticks from the recording's start (a trace's steps are u32,
  // and never decrease).
  const uint64_t since = tick > summary_.start_tick ? tick - summary_.start_tick : 0;
  uint32_t step = static_cast<uint32_t>(std::min<uint64_t>(since, UINT32_MAX));
  if (!trace_.events.empty()) step = std::max(step, trace_.events.back().step);
  trace_.events.push_back(sim::TraceEvent{step, it->second, obs, kind});
}

void Recorder::EndTick(uint64_t tick, const engine::EngineCounters& now) {
  if (on_ && tick >= stop_tick_) Stop(tick, now);
  if (!on_ && summary_.truncated && !done_) Stop(tick, now);
}

void Recorder::Stop(uint64_t tick, const engine::EngineCounters& now) {
  if (done_) return;
  on_ = false;
  secret_.fill(0);  // the keys cannot be matched against anything again
  summary_.end_tick = tick;
  summary_.events = trace_.events.size();
  summary_.keys = trace_.keys.size();
  summary_.touches = now.touches - at_start_.touches;
  summary_.hits = now.hits - at_start_.hits;
  done_ = true;
}

std::pair<sim::Trace, Recorder::Summary> Recorder::Take() {
  sim::Trace t = std::move(trace_);
  trace_ = sim::Trace{};
  index_.clear();
  done_.reset();
  return {std::move(t), summary_};
}

}  // namespace cxltier::service
