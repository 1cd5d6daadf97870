#include "service/hints.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>

namespace cxltier::service {

using wire::Error;
using wire::ErrorCode;

namespace {

// The engine's name for a client's group: groups are per client (connection),
// so one client can never name, join or hint another's group. Client ids
// count connections from 1; only after 2^32 connections would an id's low
// bits repeat, and even then the engine keeps a group to one owner (uid).
engine::GroupId EngineGroup(const Client& c, uint32_t group) { return (c.id << 32) | group; }

}  // namespace

Result<wire::HintOk> Hints::Handle(Client& c, const wire::Hint& m, engine::Engine& engine,
                                   uint64_t tick, CostClock::time_point now) {
  // The codec refused kinds other than 1 to 3 and group 0.
  if (Status st = CheckEntryCount(m.keys.size(), "a hint"); !st.ok()) return st;
  static_assert(static_cast<int>(HintKind::kIdle) == static_cast<int>(engine::HintKind::kIdle) &&
                static_cast<int>(HintKind::kSoon) == static_cast<int>(engine::HintKind::kSoon) &&
                static_cast<int>(HintKind::kDone) == static_cast<int>(engine::HintKind::kDone));
  const engine::GroupId group = EngineGroup(c, m.group);
  const uint64_t work_before = engine.counters().hint_work;
  // A hint comes after every observation the client made before sending it
  // (an idle hint after the turn's last touches, not undone by them): fold
  // what it observed so far now, as touches of the tick the hint belongs to.
  // At most fold_slots of them: a client that keeps more pending than that
  // has the rest folded by the next tick, after its hint.
  const Fold::Pending folded = fold_->RunPending(c, engine, tick, kHintFoldSlots);
  wire::HintOk ok;
  for (const BlockKey& k : m.keys) {
    // Only this client's own table: another client's key is unknown here.
    const uint32_t seg = c.by_key.Find(k);
    const engine::Slot es = seg == engine::kNoSlot ? engine::kNoSlot : c.slots[seg].engine_slot;
    // SetGroup refuses a block of another owner than the group's: this
    // client's blocks are all its uid's, so only a broken table would.
    if (es == engine::kNoSlot || !engine.SetGroup(es, group)) {
      ++ok.unknown;
      continue;
    }
    recorder_->Group(tick, c.peer.uid, engine.state(es).key, group);
    ++ok.grouped;
  }
  ok.applied = engine.Hint(group, static_cast<engine::HintKind>(m.kind), tick) ? 1 : 0;
  if (ok.applied) recorder_->Hint(tick, c.peer.uid, group, m.kind);
  ++requests_;
  unknown_keys_ += ok.unknown;
  const uint64_t units = 1 + m.keys.size() + folded.slots + folded.words / 64 +
                         (engine.counters().hint_work - work_before);
  units_ += units;
  max_units_ = std::max(max_units_, units - m.keys.size());
  budgets_->Spend(c.peer.uid, units, now);
  spdlog::debug("client {} hint {} for group {}: {} grouped, {} unknown, {}, {} units", c.id,
                static_cast<int>(m.kind), m.group, ok.grouped, ok.unknown,
                ok.applied ? "applied" : "no live block", units);
  return ok;
}

}  // namespace cxltier::service
