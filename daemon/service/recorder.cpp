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
  trace_.recorded_moves = true;
  trace_.first_tick = tick;
  index_.clear();
  groups_.clear();
  planned_.clear();
  shares_.clear();
  secret_ = secret;
  summary_ = Summary{};
  summary_.start_tick = tick;
  stop_tick_ = tick + ticks;
  max_events_ = max_events;
  max_bytes_ = max_bytes;
  state_ = State::kOn;
  held_recorded_ = 0;
  leader_changes_.reset();
}

void Recorder::PolicyChanged() {
  if (on() && summary_.replay_exact) DropMoves();
}

void Recorder::Leader(uint64_t tick, uint64_t changes, size_t leader) {
  if (!on()) return;
  const bool first = !leader_changes_;
  if (!first && changes == *leader_changes_) return;
  // One touch changes the leader at most once: any other step is a policy
  // built anew (policy set), which no replay follows.
  const bool one_more = !first && changes == *leader_changes_ + 1;
  leader_changes_ = changes;
  if (!first && !one_more) {
    PolicyChanged();
    return;
  }
  if (first && leader == 0) return;  // a replay starts with the first candidate
  if (!Admits(tick, std::nullopt, 1, false, false, !trace_.groups.empty())) return;
  // Its key is the candidate's place in the policy's spec (not a key index).
  const uint32_t k = static_cast<uint32_t>(std::min<size_t>(leader, UINT32_MAX));
  trace_.events.push_back(sim::TraceEvent{Step(tick), k, 0.0f, sim::EventKind::kLeader});
  ++summary_.leader_changes;
}

void Recorder::FlushHeld(uint64_t tick) {
  if (held_now_ == held_recorded_ ||
      !Admits(tick, std::nullopt, 1, false, false, !trace_.groups.empty())) {
    return;
  }
  // Its key is the count (not a key index), as a plan's is.
  trace_.events.push_back(sim::TraceEvent{Step(tick), held_now_, 0.0f, sim::EventKind::kHeld});
  held_recorded_ = held_now_;
}

bool Recorder::Fits(uint64_t events, uint64_t keys, uint64_t groups, bool grouped) const {
  // The events' vector at its next capacity, should it have to grow.
  const uint64_t cap = trace_.events.capacity();
  const uint64_t event_cap = events <= cap ? cap : std::max<uint64_t>(events, 2 * cap);
  const uint64_t bytes = event_cap * kBytesPerEvent + keys * kBytesPerKey +
                         (grouped ? keys * kBytesPerGroupedKey : 0) + groups * kBytesPerGroup +
                         shares_.size() * kBytesPerUid;
  return events <= max_events_ && bytes <= max_bytes_;
}

bool Recorder::Admits(uint64_t tick, std::optional<uint32_t> uid, uint64_t new_events, bool new_key,
                      bool new_group, bool grouped) {
  const auto fits = [&] {
    return Fits(trace_.events.size() + new_events, trace_.keys.size() + new_key,
                groups_.size() + new_group, grouped);
  };
  if (!uid) {
    // The daemon's moves: worth keeping only while the trace is exact, and
    // never at the cost of a uid's events.
    if (!summary_.replay_exact) return false;
    if (fits()) return true;
    DropMoves();
    return false;
  }
  Share& share = shares_[*uid];
  // A share for each uid seen and one for the next to come. An event is
  // charged twice its size: the events' vector may hold twice its events
  // (it doubles), so the shares together never pass the byte cap.
  const uint64_t n = shares_.size() + 1;
  const uint64_t bytes = new_events * 2 * kBytesPerEvent +
                         (new_key ? kBytesPerKey + kBytesPerGroupedKey : 0) +
                         (new_group ? kBytesPerGroup : 0);
  if (share.lost || share.events + new_events > max_events_ / n ||
      share.bytes + bytes > max_bytes_ / n) {
    // From now on nothing of this uid: the trace keeps a prefix of its
    // traffic without gaps.
    share.lost = true;
    ++share.dropped;
    ++summary_.dropped;
    if (summary_.replay_exact) DropMoves();
    return false;
  }
  if (!fits() && summary_.replay_exact) DropMoves();  // their room goes to the uids first
  if (!fits()) {
    // Every share taken (more uids than the free share was kept for).
    summary_.truncated = true;
    Stop(tick);
    return false;
  }
  share.events += new_events;
  share.bytes += bytes;
  return true;
}

void Recorder::DropMoves() {
  summary_.replay_exact = false;
  trace_.recorded_moves = false;
  planned_ = {};
  std::erase_if(trace_.events, [](const sim::TraceEvent& e) { return sim::IsMoveEvent(e.kind); });
  // Capacity at most twice the events again, as the shares count it.
  trace_.events.shrink_to_fit();
  summary_.plans = summary_.outcomes = summary_.outcomes_done = summary_.relocations = 0;
  summary_.leader_changes = 0;
}

BlockKey Recorder::Hash(const BlockKey& key) const {
  uint8_t raw[16];
  std::memcpy(raw, &key.hi, 8);
  std::memcpy(raw + 8, &key.lo, 8);
  const XXH128_hash_t h = XXH3_128bits_withSecret(raw, sizeof(raw), secret_.data(), secret_.size());
  return BlockKey{h.high64, h.low64};
}

uint32_t Recorder::KeyOf(const BlockKey& hashed) {
  const auto [it, added] = index_.try_emplace(hashed, static_cast<uint32_t>(trace_.keys.size()));
  if (added) {
    trace_.keys.push_back(hashed);
    if (!trace_.groups.empty()) trace_.groups.push_back(0);
  }
  return it->second;
}

uint32_t Recorder::GroupNumber(uint64_t group) {
  if (trace_.groups.empty()) trace_.groups.assign(trace_.keys.size(), 0);
  const auto [it, added] = groups_.try_emplace(group, static_cast<uint32_t>(groups_.size() + 1));
  return it->second;
}

uint32_t Recorder::Step(uint64_t tick) const {
  // Steps count ticks from the recording's start (a trace's steps are u32,
  // and never decrease).
  const uint64_t since = tick > summary_.start_tick ? tick - summary_.start_tick : 0;
  const uint32_t step = static_cast<uint32_t>(std::min<uint64_t>(since, UINT32_MAX));
  return trace_.events.empty() ? step : std::max(step, trace_.events.back().step);
}

bool Recorder::Add(uint64_t tick, std::optional<uint32_t> uid, const BlockKey& key, float obs,
                   sim::EventKind kind, uint64_t group) {
  const BlockKey hashed = Hash(key);
  const bool new_key = !index_.contains(hashed);
  const bool new_group = group != 0 && !groups_.contains(group);
  if (!Admits(tick, uid, 1, new_key, new_group, group != 0 || !trace_.groups.empty())) {
    return false;
  }
  const uint32_t k = KeyOf(hashed);
  if (group != 0) trace_.groups[k] = GroupNumber(group);
  trace_.events.push_back(sim::TraceEvent{Step(tick), k, obs, kind});
  return true;
}

void Recorder::Group(uint64_t tick, uint32_t uid, const BlockKey& key, uint64_t group) {
  if (!on() || group == 0) return;
  const BlockKey hashed = Hash(key);
  const bool new_key = !index_.contains(hashed);
  const bool new_group = !groups_.contains(group);
  if (!Admits(tick, uid, 0, new_key, new_group, true)) return;
  const uint32_t k = KeyOf(hashed);
  trace_.groups[k] = GroupNumber(group);
}

void Recorder::Hint(uint64_t tick, uint32_t uid, uint64_t group, HintKind kind) {
  if (!on() || group == 0) return;
  const bool new_group = !groups_.contains(group);
  if (!Admits(tick, uid, 1, false, new_group, true)) return;
  const uint32_t g = GroupNumber(group);
  trace_.events.push_back(sim::TraceEvent{Step(tick), g, static_cast<float>(static_cast<int>(kind)),
                                          sim::EventKind::kHint});
  ++summary_.hints;
}

void Recorder::Plan(uint64_t tick, size_t moves, uint64_t budget_blocks) {
  if (!on()) return;
  FlushHeld(tick);
  if (!Admits(tick, std::nullopt, 1, false, false, !trace_.groups.empty())) return;
  // A plan's key is the number of moves it planned, its observation its
  // budget in blocks (whole, and exact in a float up to 2^24).
  const uint32_t n = static_cast<uint32_t>(std::min<size_t>(moves, UINT32_MAX));
  const float budget = static_cast<float>(std::min<uint64_t>(budget_blocks, uint64_t{1} << 24));
  trace_.events.push_back(sim::TraceEvent{Step(tick), n, budget, sim::EventKind::kPlan});
  ++summary_.plans;
}

void Recorder::Outcome(uint64_t tick, const BlockKey& key, bool done) {
  // Planned before the recording began: the replay never planned it.
  if (!on() || planned_.erase(key) == 0) return;
  if (Add(tick, std::nullopt, key, done ? 1.0f : 0.0f, sim::EventKind::kOutcome)) {
    ++summary_.outcomes;
    summary_.outcomes_done += done;
  }
}

void Recorder::ForgetSecret() { explicit_bzero(secret_.data(), secret_.size()); }

void Recorder::Stop(uint64_t tick) {
  if (state_ != State::kOn) return;
  ForgetSecret();  // the keys cannot be matched against anything again
  index_ = {};     // the trace's key table is all that is needed now
  planned_ = {};
  summary_.groups = groups_.size();
  groups_ = {};  // the engine's group ids: not needed, not kept
  summary_.end_tick = tick;
  summary_.events = trace_.events.size();
  summary_.keys = trace_.keys.size();
  for (const auto& [uid, share] : shares_) summary_.uids[uid] = {share.events, share.dropped};
  shares_ = {};
  state_ = State::kDone;
}

void Recorder::Discard() {
  ForgetSecret();
  trace_ = sim::Trace{};
  index_ = {};
  groups_ = {};
  planned_ = {};
  shares_ = {};
  summary_ = Summary{};
  state_ = State::kIdle;
}

std::pair<sim::Trace, Recorder::Summary> Recorder::Take() {
  std::pair<sim::Trace, Summary> out{std::move(trace_), summary_};
  Discard();
  return out;
}

}  // namespace cxltier::service
