#include "service/recorder.h"

#include <string.h>  // explicit_bzero
#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace cxltier::service {

void Recorder::Start(uint64_t tick, uint64_t ticks, uint64_t max_events, const Secret& secret,
                     uint64_t max_bytes) {
  trace_ = sim::Trace{};
  trace_.name = "recording";
  index_.clear();
  secret_ = secret;
  summary_ = Summary{};
  summary_.start_tick = tick;
  stop_tick_ = tick + ticks;
  max_events_ = max_events;
  max_bytes_ = max_bytes;
  state_ = State::kOn;
}

bool Recorder::Add(uint64_t tick, const BlockKey& key, float obs, sim::EventKind kind) {
  const size_t n = trace_.events.size(), cap = trace_.events.capacity();
  const uint64_t next_cap = n < cap ? cap : std::max<size_t>(1, 2 * cap);
  const uint64_t bytes = next_cap * kBytesPerEvent + (trace_.keys.size() + 1) * kBytesPerKey;
  if (n >= max_events_ || bytes > max_bytes_) {
    summary_.truncated = true;
    Stop(tick);
    return false;
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
  return true;
}

void Recorder::ForgetSecret() { explicit_bzero(secret_.data(), secret_.size()); }

void Recorder::Stop(uint64_t tick) {
  if (state_ != State::kOn) return;
  ForgetSecret();  // the keys cannot be matched against anything again
  index_ = {};     // the trace's key table is all that is needed now
  summary_.end_tick = tick;
  summary_.events = trace_.events.size();
  summary_.keys = trace_.keys.size();
  state_ = State::kDone;
}

void Recorder::Discard() {
  ForgetSecret();
  trace_ = sim::Trace{};
  index_ = {};
  summary_ = Summary{};
  state_ = State::kIdle;
}

std::pair<sim::Trace, Recorder::Summary> Recorder::Take() {
  std::pair<sim::Trace, Summary> out{std::move(trace_), summary_};
  Discard();
  return out;
}

}  // namespace cxltier::service
