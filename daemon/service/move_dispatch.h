// Move dispatch: the engine's planned moves go to the mover, and its results
// come back here. Each move is aimed at its tier's first node, carries the
// pool block's page range, and on completion the engine learns whether it was
// done and the client's slot shows the block's tier. A block released while
// its move was queued is stale: its pool block may hold another key by now,
// so whatever holds it is asked of the kernel instead. A recording
// (service/recorder.h) is told of each plan, each outcome the engine takes
// and each relocation, in the order the engine sees them.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "numa/migrator.h"
#include "numa/topology.h"
#include "service/client_table.h"
#include "service/mover.h"
#include "service/plan_pace.h"
#include "service/recorder.h"
#include "service/released_pages.h"
#include "service/status.h"

namespace cxltier::service {

class MoveDispatch {
 public:
  // A line about a move of client `c`'s block, to log at its rate.
  using Warn = std::function<void(const Client& c, const std::string& what)>;
  // `on_done` runs on the mover thread and must post the result to the I/O
  // thread, which then calls Complete. `recorder`, when given, outlives this.
  MoveDispatch(numa::TierAssignment tiers, std::shared_ptr<numa::Migrator> migrator,
               uint64_t rate_bytes_per_s, std::function<void(MoveDone)> on_done,
               Recorder* recorder = nullptr);

  // Pages WhereIs asks the kernel about, spread over the range: a vote of 8
  // places a block that is mostly on one node, at a fraction of the cost of
  // asking for each page.
  static constexpr size_t kWhereSamples = 8;
  // Where the kernel has most of `range`'s sampled pages: their tier (fast
  // when on a node no tier names), or kNone when none exists yet. A node in
  // two tiers, as in a one-node setup, counts in `steered` when that tier has
  // it (where the pool's new pages go), else in the first.
  Tier WhereIs(const numa::PageRange& range, Tier steered = Tier::kFast) const;
  // Sets where `range`'s pages that do not exist yet will be faulted: on
  // tier `to`'s nodes (numa::Migrator::Steer: a memfd pool's, through our
  // mapping; an address range's is its client library's to set).
  Status Steer(const numa::PageRange& range, Tier to) const;
  // `absent` for a pool's blocks: the tier its new pages are steered to, else
  // fast (first touch by the client's CPUs).
  static Tier NewPagesTier(const server::Pool& pool) {
    return pool.new_pages_tier() >= 0 ? TierAt(static_cast<unsigned>(pool.new_pages_tier()))
                                      : Tier::kFast;
  }
  Tier TierOfNode(int node) const;
  // The node a page-mode move to `to` goes to: the first of that tier's.
  // REQUIRES: `to` is one of tiers() with a node.
  int TargetNode(Tier to) const;
  // At a tick: whether the mover has finished the last plan, so that a new
  // one may be made; sets `engine`'s budget for it (PlanPace), at most
  // `cap_bytes`.
  bool ReadyToPlan(engine::Engine& engine, uint64_t cap_bytes);
  // Plans (at the daemon's `tick`, after its fold) and hands every move of
  // `engine`'s plan to the mover; page-mode moves only with `page_moves`
  // (else they are not done). First, with `page_moves`, released blocks'
  // pages still held in tier 0 go down, with at most half of the budget.
  void Dispatch(engine::Engine& engine, ClientTable& clients, uint64_t tick,
                bool page_moves = true);
  // A move's result, on the I/O thread, between ticks (a recording puts it
  // in the next tick, as the daemon does admits). `engine` is null when it
  // was rebuilt since (no block of the move is left in it). `tick`: the
  // daemon's clock.
  void Complete(const MoveDone& d, engine::Engine* engine, ClientTable& clients, const Warn& warn,
                uint64_t tick);
  // Page mode: asks the kernel where the blocks of the moves that came back
  // stale are, for whichever slots hold them now, and tells the engine. At
  // the start of a tick, before the fold: one scan of each such client's
  // slots, however many of its moves were stale (a client that releases
  // blocks under moves costs a scan a tick, not a scan a move).
  void ResolveStale(engine::Engine& engine, ClientTable& clients, uint64_t tick);
  // Page mode: client `c`'s block at segment slot `seg` is being released
  // (call before Engine::Release). When its pages are in tier 0 or on their
  // way there, in a pool whose new pages go below tier 0, they stay counted
  // there (the engine's held blocks) until a block is admitted on them
  // (Reusing) or the next plans have moved them down (ReleasedPages).
  void Releasing(engine::Engine& engine, const Client& c, uint32_t seg);
  // A block is being admitted on pool block (`pool`, `block`) of `c`: call
  // before asking where its pages are, so that they count as its alone.
  void Reusing(engine::Engine& engine, const Client& c, uint32_t pool, uint32_t block);
  // Session `session` left, or its pool `*pool` was dropped: the pages its
  // released blocks left are no longer counted, nor moved.
  void ForgetReleased(engine::Engine& engine, uint64_t session,
                      std::optional<uint32_t> pool = std::nullopt);
  // The released blocks' pages held in tier 0 that quota account `account`
  // (a uid, or a client account) is charged for.
  size_t ReleasedHeldOf(uint64_t account) const { return released_.HeldOf(account); }
  // Copy mode's drains of every client, once a tick; write leases held past
  // `timeout_ticks` are counted as the moves they block are refused.
  void DrainPlaces(ClientTable& clients, uint64_t tick, uint64_t timeout_ticks, const Warn& warn);
  void set_lease_timeout_ticks(uint64_t t) { lease_timeout_ticks_ = t; }

  Mover& mover() { return *mover_; }
  const Mover& mover() const { return *mover_; }
  const MoveStats& stats() const { return stats_; }
  const numa::TierAssignment& tiers() const { return tiers_; }

  MoveStats& mutable_stats() { return stats_; }

 private:
  // Tells the engine a move's outcome, and the recording when the engine
  // takes it (the move is still its block's current one) at `tick`.
  void Tell(engine::Engine& engine, const engine::Move& mv, bool done, uint64_t tick);
  // Copy mode: a move of client slot `seg` to the other tier's pool.
  void DispatchCopy(engine::Engine& engine, const engine::Move& mv, Client& c, uint32_t seg,
                    uint64_t tick);
  void CompleteCopy(const MoveDone& d, engine::Engine* engine, Client* c, const Warn& warn,
                    uint64_t tick);
  // Page mode: hands the next held released pages to the mover, at most
  // `budget` bytes of them. Returns the bytes handed.
  uint64_t DispatchReleased(engine::Engine& engine, ClientTable& clients, uint64_t budget);
  void CompleteReleased(const MoveDone& d, engine::Engine* engine, ClientTable& clients);
  // The engine (and a recording) learn how many blocks' worth are held.
  void SyncHeld(engine::Engine& engine);
  // Whether a page-mode pool's released blocks' pages are kept counted.
  static bool TracksReleased(const server::Pool& pool);
  // Page mode: a move whose present pages were all busy marks its pool pinned.
  void NotePinned(const MoveDone& d, Client& c, const Warn& warn);

  numa::TierAssignment tiers_;
  // The mover moves with it on its thread; the I/O thread asks it Where().
  std::shared_ptr<numa::Migrator> migrator_;
  std::unique_ptr<Mover> mover_;
  MoveStats stats_;
  PlanPace pace_;
  ReleasedPages released_;
  uint64_t lease_timeout_ticks_ = 300;
  Recorder* recorder_;
};

}  // namespace cxltier::service
