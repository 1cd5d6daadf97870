#include "service/move_dispatch.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <span>

#include "cxltier/lease.h"
#include "service/copy_mode.h"
#include "service/fold.h"

namespace cxltier::service {

MoveDispatch::MoveDispatch(numa::TierAssignment tiers, std::shared_ptr<numa::Migrator> migrator,
                           uint64_t rate_bytes_per_s, std::function<void(MoveDone)> on_done,
                           Recorder* recorder)
    : tiers_(std::move(tiers)),
      migrator_(std::move(migrator)),
      mover_(std::make_unique<Mover>(migrator_, rate_bytes_per_s, std::move(on_done))),
      recorder_(recorder) {}

Tier MoveDispatch::TierOfNode(int node) const {
  const int tier = tiers_.TierOf(node);
  // A node we do not manage counts as fast: it is not CXL memory we know of.
  return tier < 0 ? Tier::kFast : TierAt(static_cast<unsigned>(tier));
}

Tier MoveDispatch::WhereIs(const numa::PageRange& range, Tier steered) const {
  std::map<int, size_t> count;
  for (int n : migrator_->Sample(range, kWhereSamples)) {
    if (n >= 0) ++count[n];
  }
  if (count.empty()) return Tier::kNone;  // not faulted in yet
  const int node = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) {
                     return a.second < b.second;
                   })->first;
  const std::vector<int>& nodes = tiers_.Nodes(TierIndex(steered));
  if (std::find(nodes.begin(), nodes.end(), node) != nodes.end()) return steered;
  return TierOfNode(node);
}

Status MoveDispatch::Steer(const numa::PageRange& range, Tier to) const {
  return migrator_->Steer(range, tiers_.Nodes(TierIndex(to)));
}

int MoveDispatch::TargetNode(Tier to) const { return tiers_.Nodes(TierIndex(to)).front(); }

void MoveDispatch::Tell(engine::Engine& engine, const engine::Move& mv, bool done, uint64_t tick) {
  if (recorder_ && recorder_->on() && engine.IsLive(mv.slot)) {
    const BlockState& st = engine.state(mv.slot);
    if (st.generation == mv.generation && (st.flags & kFlagMigrating)) {
      recorder_->Outcome(tick, st.key, done);
    }
  }
  engine.Complete(mv, done);
}

bool MoveDispatch::ReadyToPlan(engine::Engine& engine, uint64_t cap_bytes) {
  const uint64_t bb = engine.options().block_bytes;
  if (!pace_.Ready(mover_->pending(), std::max(cap_bytes, 2 * bb), 2 * bb)) {
    ++stats_.plans_paced;
    return false;
  }
  engine.set_migrate_bytes_per_tick(pace_.budget());
  return true;
}

void MoveDispatch::SyncHeld(engine::Engine& engine) {
  // Only the accounts whose count changed: the engine keeps the others'.
  // (A new engine is made only with no client and nothing held: shared.cpp.)
  released_.DrainChangedAccounts(
      [&engine](uint64_t account, size_t held) { engine.set_account_held(account, held); });
  if (engine.held_blocks() == released_.size()) return;
  engine.set_held_blocks(released_.size());
  stats_.released_held = released_.size();
  if (recorder_) recorder_->Held(released_.size());
}

// Steered below tier 0: the pool's new pages are the ones the budget bounds
// (a pinned pool's pages could not be moved down anyway; a copy-mode tier
// pool is the daemon's to place).
bool MoveDispatch::TracksReleased(const server::Pool& pool) {
  return !pool.is_tier() && !pool.dead() && !pool.pinned() && pool.new_pages_tier() > 0;
}

void MoveDispatch::Releasing(engine::Engine& engine, const Client& c, uint32_t seg) {
  const SegSlot& s = c.slots[seg];
  if (!TracksReleased(c.pools[s.pool])) return;
  const Tier where = engine.state(s.engine_slot).tier;
  if (where != Tier::kFast && engine.moving_to(s.engine_slot) != Tier::kFast) return;
  released_.Add({c.peer.session_id, s.pool, s.block}, {c.peer.uid, c.account});
  SyncHeld(engine);
}

void MoveDispatch::Reusing(engine::Engine& engine, const Client& c, uint32_t pool, uint32_t block) {
  if (released_.empty() || !released_.Take({c.peer.session_id, pool, block})) return;
  ++stats_.released_reused;
  SyncHeld(engine);
}

void MoveDispatch::ForgetReleased(engine::Engine& engine, uint64_t session,
                                  std::optional<uint32_t> pool) {
  if (!released_.Drop(session, pool)) return;  // no entry: no move of them either
  // Their moves not begun yet are not made (one running finishes: the
  // migrator checks the range is still the client's).
  mover_->CancelIf([&](const MoveJob& j) {
    return j.released && j.session == session && (!pool || j.pool == *pool);
  });
  SyncHeld(engine);
}

uint64_t MoveDispatch::DispatchReleased(engine::Engine& engine, ClientTable& clients,
                                        uint64_t budget) {
  const uint64_t bb = engine.options().block_bytes;
  if (released_.empty() || budget < bb) return 0;
  uint64_t handed = 0;
  for (const ReleasedPages::Block& b :
       released_.Next(budget == UINT64_MAX ? SIZE_MAX : budget / bb)) {
    const Client* c = clients.Find(b.session);
    const server::Pool* pool = c && b.pool < c->pools.size() ? &c->pools[b.pool] : nullptr;
    if (!pool || !TracksReleased(*pool)) {
      released_.Done(b);  // nothing of ours to move any more (or nothing movable)
      continue;
    }
    const Tier to = TierAt(static_cast<unsigned>(pool->new_pages_tier()));
    MoveJob job{engine::Move{engine::kNoSlot, 0, Tier::kFast, to},
                pool->Range(b.block),
                std::nullopt,
                TargetNode(to),
                b.session,
                0,
                b.pool,
                b.block};
    job.released = true;
    ++stats_.in_flight;
    handed += bb;
    mover_->Submit(std::move(job));
  }
  SyncHeld(engine);
  return handed;
}

void MoveDispatch::CompleteReleased(const MoveDone& d, engine::Engine* engine,
                                    ClientTable& clients) {
  const bool done = d.result.done();
  if (d.result.call_errno != ECANCELED) {
    ++stats_.released_moved;
    stats_.released_failed += !done;
  }
  spdlog::debug("released pages of client session {} pool {} block {} to node {}: {}",
                d.job.session, d.job.pool, d.job.block, d.job.node, numa::Summarize(d.result));
  const ReleasedPages::Outcome o = released_.Done({d.job.session, d.job.pool, d.job.block});
  if (o == ReleasedPages::Outcome::kTaken) {
    // A block was admitted on them while they moved: where they are now is
    // the kernel's to say, at the next tick.
    if (Client* c = clients.Find(d.job.session)) {
      c->stale_blocks.push_back(uint64_t{d.job.pool} << 32 | d.job.block);
    }
  }
  if (engine) SyncHeld(*engine);
}

void MoveDispatch::Dispatch(engine::Engine& engine, ClientTable& clients, uint64_t tick,
                            bool page_moves) {
  const uint64_t bb = engine.options().block_bytes;
  // Released blocks' pages still in tier 0 go down first, with at most half
  // of the budget: the plan's moves (other clients' promotions and
  // demotions) keep the rest, however much one client releases.
  uint64_t handed = 0;
  if (page_moves && !released_.empty()) {
    const uint64_t budget = engine.options().migrate_bytes_per_tick;
    handed = DispatchReleased(engine, clients, budget ? budget / 2 : UINT64_MAX);
    if (handed && budget) engine.set_migrate_bytes_per_tick(budget - handed);
  }
  const std::span<const engine::Move> plan = engine.Plan();
  pace_.Planned(handed + plan.size() * bb);
  if (recorder_ && recorder_->on()) {
    recorder_->Plan(tick, plan.size(), engine.options().migrate_bytes_per_tick / bb);
    for (const engine::Move& mv : plan) recorder_->Planned(engine.state(mv.slot).key);
  }
  for (const engine::Move& mv : plan) {
    const auto holder = clients.HolderOf(mv.slot);
    if (!holder) {
      Tell(engine, mv, false, tick);
      continue;
    }
    Client& c = *holder->client;
    const SegSlot& s = c.slots[holder->seg_slot];
    const server::Pool& pool = c.pools[s.pool];
    if (pool.is_tier()) {
      DispatchCopy(engine, mv, c, holder->seg_slot, tick);
      continue;
    }
    if (!page_moves || TierIndex(mv.to) >= tiers_.count() ||
        tiers_.Nodes(TierIndex(mv.to)).empty()) {
      Tell(engine, mv, false, tick);
      continue;
    }
    if (pool.dead()) {  // its process is gone: its blocks are being released
      Tell(engine, mv, false, tick);
      continue;
    }
    if (pool.pinned()) {  // said once; trying again would only fail again
      ++stats_.moves_refused_pinned;
      Tell(engine, mv, false, tick);
      continue;
    }
    ++stats_.in_flight;
    mover_->Submit(MoveJob{mv, pool.Range(s.block), std::nullopt, TargetNode(mv.to),
                           c.peer.session_id, holder->seg_slot, s.pool, s.block});
  }
}

void MoveDispatch::DispatchCopy(engine::Engine& engine, const engine::Move& mv, Client& c,
                                uint32_t seg, uint64_t tick) {
  const SegSlot& s = c.slots[seg];
  const unsigned tier = TierIndex(mv.to);
  const int32_t to = tier < c.copy.pool.size() ? c.copy.pool[tier] : -1;
  uint32_t index = 0;
  if (to < 0 || !c.pools[to].TakeFree(&index)) {
    ++stats_.copies_no_room;
    Tell(engine, mv, false, tick);
    return;
  }
  const server::Pool& src = c.pools[s.pool];
  const server::Pool& dst = c.pools[to];
  CopyJob j;
  j.src_pool = src.mapping();
  j.dst_pool = dst.mapping();
  j.segment = c.segment.mapping();
  j.src = src.BlockAddress(s.block);
  j.dst = dst.BlockAddress(index);
  j.bytes = engine.options().block_bytes;
  j.words = c.segment.locations();
  j.seg = seg;
  j.expected = PlaceWord(c, seg);
  j.next = LocationWord(dst.tier(), index, c.copy.version[seg] + 1);
  j.src_pool_id = s.pool;
  j.src_index = s.block;
  j.dst_pool_id = static_cast<uint32_t>(to);
  j.dst_index = index;
  ++stats_.in_flight;
  CopyStarted(c, seg);
  MoveJob job{mv, {}, std::move(j), dst.node(), c.peer.session_id, seg, s.pool, s.block};
  mover_->Submit(std::move(job));
}

void MoveDispatch::CompleteCopy(const MoveDone& d, engine::Engine* engine, Client* c,
                                const Warn& warn, uint64_t tick) {
  const CopyJob& j = *d.job.copy;
  const bool done = d.result.done();
  if (done) {
    ++stats_.copies;
    stats_.copied_bytes += j.bytes;
  } else if (d.result.call_errno == EBUSY) {
    ++stats_.copies_written;
  } else if (d.result.call_errno == EIO) {
    ++stats_.copies_mismatch;
  } else if (d.result.call_errno != ECANCELED) {
    ++stats_.failed;
  }
  // Between ticks: the next tick's, for a recording.
  if (engine) Tell(*engine, d.job.move, done, tick + 1);
  if (!c) return;  // its pools went with it
  const uint32_t seg = d.job.segment_slot;
  CopyReturned(*c, seg, DecodeLocation(j.expected).version);
  const SegSlot& s = c->slots[seg];
  const bool current = s.live && engine && s.engine_slot == d.job.move.slot &&
                       engine->state(s.engine_slot).generation == d.job.move.generation;
  if (!done) {
    c->pools[j.dst_pool_id].PutFree(j.dst_index);  // never published
    if (d.result.call_errno == EIO) warn(*c, "copy dropped: " + numa::Summarize(d.result));
    if (current && d.result.call_errno == EBUSY) {
      uint64_t& since = c->copy.write_refused_since[seg];
      if (since == 0) since = tick;
      if (!c->copy.write_overdue[seg] && tick - since > lease_timeout_ticks_) {
        c->copy.write_overdue[seg] = 1;
        ++stats_.write_lease_timeouts;
        warn(*c, fmt::format("slot {}: the write lease has kept the block from moving for {} "
                             "ticks (limits.lease_timeout_s); call EndWrite when it is written",
                             seg, tick - since));
      }
    }
    return;
  }
  const uint32_t published = c->copy.version[seg] + 1;
  if (!current && c->copy.word_kept[seg] && static_cast<uint32_t>(j.next >> 32) == published) {
    // Released keeping its word (its client left, or the daemon stops), and
    // this copy published: the word names the copy's place now, where readers
    // of the old segment go, and a reconnect re-admits the block. That place
    // stays; the source drains as a current copy's does.
    AddDrain(*c, seg, c->copy.version[seg], j.src_pool_id, j.src_index, tick);
    c->copy.version[seg] = published;
    return;
  }
  if (!current || static_cast<uint32_t>(j.next >> 32) != published) {
    // Released (or released and admitted again) after the publish: readers
    // may have taken the new place in between, so it drains like any other.
    AddDrain(*c, seg, static_cast<uint32_t>(j.next >> 32), j.dst_pool_id, j.dst_index, tick);
    return;
  }
  AddDrain(*c, seg, c->copy.version[seg], j.src_pool_id, j.src_index, tick);
  c->copy.version[seg] = published;
  c->copy.write_refused_since[seg] = 0;
  c->copy.write_overdue[seg] = 0;
  c->slots[seg].pool = j.dst_pool_id;
  c->slots[seg].block = j.dst_index;
  WriteBack(*engine, *c, seg);
}

void MoveDispatch::DrainPlaces(ClientTable& clients, uint64_t tick, uint64_t timeout_ticks,
                               const Warn& warn) {
  for (auto& [id, c] : clients.all()) {
    if (c.copy.draining.empty()) continue;
    const DrainCounts n = service::DrainPlaces(c, tick, timeout_ticks);
    stats_.places_freed += n.freed;
    stats_.lease_timeouts += n.overdue;
    if (n.overdue) {
      warn(c, fmt::format("{} read lease(s) held over {} ticks (limits.lease_timeout_s) keep "
                          "old places of moved or released blocks from reuse; call Release",
                          n.overdue, timeout_ticks));
    }
  }
}

void MoveDispatch::NotePinned(const MoveDone& d, Client& c, const Warn& warn) {
  const numa::MoveResult& r = d.result;
  if (d.job.pool >= c.pools.size() || r.call_errno == ECANCELED) return;
  const bool all_busy = r.busy > 0 && r.busy + r.absent == r.pages;
  if (!c.pools[d.job.pool].NoteMove(all_busy)) return;
  ++stats_.pools_pinned;
  warn(c, fmt::format("pool {} looks pinned: move_pages found every present page busy in {} "
                      "moves in a row (block {}: {} pages). Page mode cannot move pinned memory "
                      "(cudaHostRegister, io_uring fixed buffers); moves of its blocks are no "
                      "longer tried. Use copy mode (Client::CreateTierPools): a pool per tier, "
                      "blocks moved by copy",
                      d.job.pool, server::Pool::kPinnedAfter, d.job.block, r.busy));
}

void MoveDispatch::Complete(const MoveDone& d, engine::Engine* engine, ClientTable& clients,
                            const Warn& warn, uint64_t tick) {
  --stats_.in_flight;
  if (d.job.copy) return CompleteCopy(d, engine, clients.Find(d.job.session), warn, tick);
  if (d.job.released) return CompleteReleased(d, engine, clients);
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
  if (c) NotePinned(d, *c, warn);
  if (!engine) return;
  // Between ticks: the next tick's, for a recording.
  Tell(*engine, d.job.move, done, tick + 1);
  if (!c) return;
  const SegSlot& s = c->slots[d.job.segment_slot];
  const bool current = s.live && s.engine_slot == d.job.move.slot &&
                       engine->state(s.engine_slot).generation == d.job.move.generation;
  if (current) {
    WriteBack(*engine, *c, d.job.segment_slot);
    return;
  }
  // Stale: whatever holds that pool block now is found at the next tick.
  ++stats_.stale_moves;
  c->stale_blocks.push_back(uint64_t{d.job.pool} << 32 | d.job.block);
}

void MoveDispatch::ResolveStale(engine::Engine& engine, ClientTable& clients, uint64_t tick) {
  for (auto& [id, c] : clients.all()) {
    if (c.stale_blocks.empty()) continue;
    std::vector<uint64_t>& stale = c.stale_blocks;
    std::sort(stale.begin(), stale.end());
    stale.erase(std::unique(stale.begin(), stale.end()), stale.end());
    ++stats_.stale_scans;
    for (uint32_t i = 0; i < c.slots.size(); ++i) {
      const SegSlot& o = c.slots[i];
      if (!o.live || o.pool >= c.pools.size() ||
          !std::binary_search(stale.begin(), stale.end(), uint64_t{o.pool} << 32 | o.block)) {
        continue;
      }
      const server::Pool& pool = c.pools[o.pool];
      if (pool.dead()) continue;  // its process is gone: being released (ReleaseDeadPool)
      const numa::PageRange range = pool.Range(o.block);
      Tier actual = WhereIs(range, NewPagesTier(pool));
      if (actual == Tier::kNone) {
        // No page yet: they go where its admission placed it, whichever
        // policy the stale move's target left on the range.
        actual = engine.state(o.engine_slot).tier;
        if (actual == Tier::kNone) actual = NewPagesTier(pool);
        (void)Steer(range, actual);
      }
      spdlog::debug("stale move: slot {} now holds {} (engine {}); kernel says {}, engine says {}",
                    i, o.key.ToString(), o.engine_slot, TierName(actual),
                    TierName(engine.state(o.engine_slot).tier));
      const Tier was = engine.state(o.engine_slot).tier;
      engine.Relocated(o.engine_slot, actual);
      if (recorder_ && engine.state(o.engine_slot).tier != was) {
        recorder_->Relocated(tick, engine.state(o.engine_slot).key, actual);
      }
      WriteBack(engine, c, i);
    }
    stale.clear();
  }
}

}  // namespace cxltier::service
