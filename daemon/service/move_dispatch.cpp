#include "service/move_dispatch.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <map>

#include "service/fold.h"

namespace cxltier::service {

MoveDispatch::MoveDispatch(numa::TierAssignment tiers, std::shared_ptr<numa::Migrator> migrator,
                           uint64_t rate_bytes_per_s, std::function<void(MoveDone)> on_done)
    : tiers_(std::move(tiers)),
      migrator_(std::move(migrator)),
      mover_(std::make_unique<Mover>(migrator_, rate_bytes_per_s, std::move(on_done))) {}

Tier MoveDispatch::TierOfNode(int node) const {
  if (std::count(tiers_.fast_nodes.begin(), tiers_.fast_nodes.end(), node)) return Tier::kFast;
  if (std::count(tiers_.slow_nodes.begin(), tiers_.slow_nodes.end(), node)) return Tier::kSlow;
  return Tier::kFast;  // a node we do not manage counts as fast: it is not CXL memory we know of
}

Tier MoveDispatch::WhereIs(const numa::PageRange& range) const {
  std::map<int, size_t> count;
  for (int n : migrator_->Where(range)) {
    if (n >= 0) ++count[n];
  }
  if (count.empty()) return Tier::kFast;  // not faulted in yet: it will be, locally
  const int node = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) {
                     return a.second < b.second;
                   })->first;
  return TierOfNode(node);
}

int MoveDispatch::TargetNode(Tier to) const {
  return to == Tier::kFast ? tiers_.fast_nodes.front() : tiers_.slow_nodes.front();
}

void MoveDispatch::Dispatch(engine::Engine& engine, ClientTable& clients) {
  for (const engine::Move& mv : engine.Plan()) {
    const auto holder = clients.HolderOf(mv.slot);
    if (!holder) {
      engine.Complete(mv, false);
      continue;
    }
    const Client& c = *holder->client;
    const SegSlot& s = c.slots[holder->seg_slot];
    ++stats_.in_flight;
    mover_->Submit(MoveJob{mv, c.pools[s.pool].Range(s.block), TargetNode(mv.to), c.peer.session_id,
                           holder->seg_slot, s.pool, s.block});
  }
}

void MoveDispatch::Complete(const MoveDone& d, engine::Engine* engine, ClientTable& clients,
                            const Warn& warn) {
  --stats_.in_flight;
  const bool done = d.result.done();
  stats_.pages_verified += d.result.verified;
  stats_.pages_absent += d.result.absent;
  spdlog::debug("move of client session {} slot {} (engine slot {} gen {}) to node {}: {}",
                d.job.session, d.job.segment_slot, d.job.move.slot, d.job.move.generation,
                d.job.node, numa::Summarize(d.result));
  Client* c = clients.Find(d.job.session);
  if (!done && d.result.call_errno != ECANCELED) {
    ++stats_.failed;
    stats_.pages_busy += d.result.busy;
    stats_.pages_elsewhere += d.result.elsewhere;
    for (auto [e, n] : d.result.errors) stats_.errors[e] += n;
    if (d.result.call_errno) ++stats_.errors[d.result.call_errno];
    // A client's own pool can fail every move (unmapped, pinned): its
    // warnings count against its rate, not everyone's journal.
    const std::string what =
        fmt::format("move to node {} not done: {}", d.job.node, numa::Summarize(d.result));
    if (c) {
      warn(*c, what);
    } else {
      spdlog::debug("{} (its client left)", what);
    }
  }
  if (!engine) return;
  engine->Complete(d.job.move, done);
  if (!c) return;
  const SegSlot& s = c->slots[d.job.segment_slot];
  const bool current = s.live && s.engine_slot == d.job.move.slot &&
                       engine->state(s.engine_slot).generation == d.job.move.generation;
  if (current) {
    WriteBack(*engine, *c, d.job.segment_slot);
    return;
  }
  // Stale: whatever holds that pool block now, ask the kernel where it is.
  for (uint32_t i = 0; i < c->slots.size(); ++i) {
    const SegSlot& o = c->slots[i];
    if (!o.live || o.pool != d.job.pool || o.block != d.job.block) continue;
    const Tier actual = WhereIs(c->pools[o.pool].Range(o.block));
    spdlog::debug("stale move: slot {} now holds {} (engine {}); kernel says {}, engine says {}", i,
                  o.key.ToString(), o.engine_slot, TierName(actual),
                  TierName(engine->state(o.engine_slot).tier));
    engine->Relocated(o.engine_slot, actual);
    WriteBack(*engine, *c, i);
  }
}

}  // namespace cxltier::service
