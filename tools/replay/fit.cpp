#include "fit.h"

#include <list>
#include <vector>

namespace cxltier::replay {

sim::Trace FitToPool(const sim::Trace& trace, uint32_t pool_blocks, FitStats* stats) {
  FitStats s;
  sim::Trace out;
  out.name = trace.name;
  out.block_tokens = trace.block_tokens;
  out.keys = trace.keys;
  out.groups = trace.groups;
  out.events.reserve(trace.events.size());
  // Live keys, least recently touched first; where each live key sits in it.
  std::list<uint32_t> lru;
  std::vector<std::list<uint32_t>::iterator> where(trace.keys.size(), lru.end());
  std::vector<bool> seen(trace.keys.size(), false);
  for (const sim::TraceEvent& e : trace.events) {
    // Blocks are admitted at their first touch; hints name groups, not keys,
    // and stay as they are; the daemon's recorded moves are the daemon's, not
    // the trace's.
    if (e.kind == sim::EventKind::kHint) {
      out.events.push_back(e);
      continue;
    }
    if (e.kind != sim::EventKind::kTouch && e.kind != sim::EventKind::kRelease) continue;
    auto& at = where[e.key];
    if (e.kind == sim::EventKind::kRelease) {
      if (at == lru.end()) continue;  // not live: nothing to free
      lru.erase(at);
      at = lru.end();
      out.events.push_back(e);
      continue;
    }
    if (at == lru.end()) {
      if (lru.size() >= pool_blocks) {
        const uint32_t victim = lru.front();
        lru.pop_front();
        where[victim] = lru.end();
        out.events.push_back(sim::TraceEvent{e.step, victim, 0.0f, sim::EventKind::kRelease});
        ++s.forced_releases;
      }
      ++s.admissions;
      s.readmissions += seen[e.key];
      seen[e.key] = true;
      at = lru.insert(lru.end(), e.key);
    } else {
      lru.splice(lru.end(), lru, at);
    }
    s.max_live = std::max<uint32_t>(s.max_live, static_cast<uint32_t>(lru.size()));
    out.events.push_back(e);
  }
  if (stats) *stats = s;
  return out;
}

}  // namespace cxltier::replay
