#include "service/daemon.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include "service/snapshot.h"

namespace cxltier::service {

namespace asio = boost::asio;
using wire::Error;
using wire::ErrorCode;

Daemon::Daemon(asio::io_context& io, DaemonConfig config, numa::Topology topology,
               numa::TierAssignment tiers, std::unique_ptr<numa::Migrator> migrator,
               bool can_migrate)
    : shared_(io, std::move(config), std::move(topology), std::move(tiers), std::move(migrator),
              can_migrate),
      checkpoints_(shared_.config.state_dir,
                   [&io](std::function<void()> f) { asio::post(io, std::move(f)); }),
      timer_(io) {}

Daemon::~Daemon() { Stop(); }

Status Daemon::Start() {
  Shared& d = shared_;
  std::error_code ec;
  std::filesystem::create_directories(d.config.state_dir, ec);
  if (ec)
    return Error{ErrorCode::kInternal, "state dir " + d.config.state_dir + ": " + ec.message()};
  checkpoints_.KeepPrivate();
  if (d.config.persist) {
    if (Status st = checkpoints_.Lock(); !st.ok()) return st;
    // The ghosts' keys are engine keys: the secret they were made with
    // comes with them.
    Result<EngineKeys> keys = EngineKeys::InStateDir(d.config.state_dir);
    if (!keys.ok()) return keys.status().Context("state dir " + d.config.state_dir + ": ");
    d.clients.set_engine_keys(*keys);
    LoadedGhosts loaded = checkpoints_.Load(*keys);
    d.pending_ghosts.states = std::move(loaded.ghosts);
    d.pending_ghosts.owners = std::move(loaded.owners);
    d.restored_from_checkpoint = d.pending_ghosts.states.size();
    // The states' touch times are ticks of the previous run's clock: this
    // run's continues it, so that they are in the past (EMA decays by the
    // ticks since; recency orders see them as older than what comes next).
    d.tick = last_checkpoint_tick_ = loaded.clock.resume_tick;
    checkpoints_.StartWriter();
    // Device-DAX regions a client may still read, across this restart.
    d.devdax = DevdaxReservations(d.config.state_dir + "/devdax-reservations");
    if (Status st = d.devdax.Load(); !st.ok()) return st;
  }
  if (d.config.block_bytes) {
    if (Status st = d.EnsureEngine(d.config.block_bytes); !st.ok()) return st;
  }
  d.moves.set_lease_timeout_ticks(d.LeaseTimeoutTicks());
  ScheduleTick();
  return Status::Ok();
}

void Daemon::Stop() {
  Shared& d = shared_;
  if (d.stopped) return;
  d.stopped = true;
  timer_.cancel();
  d.moves.mover().Stop();  // finishes the move in flight; queued ones come back as not done
  d.recorder.Discard();    // nobody can take it any more
  // Turn every live block into a ghost.
  for (auto& [id, c] : d.clients.all()) {
    for (uint32_t i = 0; i < c.slots.size(); ++i) {
      if (c.slots[i].live) d.ReleaseSlot(c, i);
    }
  }
  Checkpoint();
}

Status Daemon::CheckReload(const DaemonConfig& config) const {
  return CheckQuotaTiers(config, shared_.TierCount());
}

StatusSnapshot Daemon::Snapshot() const { return service::Snapshot(shared_); }
nlohmann::json Daemon::StatusJson() const { return StatusToJson(Snapshot()); }
std::string Daemon::MetricsText() const { return MetricsExposition(Snapshot()); }

void Daemon::ScheduleTick() {
  if (shared_.stopped) return;
  timer_.expires_after(std::chrono::milliseconds(shared_.config.tick_ms));
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || shared_.stopped) return;
    Tick();
    ScheduleTick();
  });
}

// The tick: fold every client's observations into the engine, plan, hand the
// moves to the mover, checkpoint now and then.
void Daemon::Tick() {
  Shared& d = shared_;
  const auto t0 = std::chrono::steady_clock::now();
  d.peer_log.MaybeSweep(t0);
  ++d.tick;
  if (d.engine) {
    d.in_tick = true;
    DropGonePools();
    // Where the blocks of stale moves are now: before the fold, as when each
    // was resolved between ticks (the recording's tick is this one).
    d.moves.ResolveStale(*d.engine, d.clients, d.tick);
    for (auto& [id, c] : d.clients.all()) {
      if (!c.hello || c.leaving) continue;
      d.fold.Run(c, *d.engine, d.tick);
      c.segment.header()->daemon_ticks = d.tick;
    }
    d.recorder.EndTick(d.tick);
    d.moves.DrainPlaces(d.clients, d.tick, d.LeaseTimeoutTicks(), d.ClientWarner());
    // Plan and hand the moves to the mover, unless it is still busy.
    // Page moves need a slow node and CAP_SYS_NICE; copies need neither (a
    // device-DAX tier 1 is no node at all).
    // Plans follow the mover's pace (PlanPace), each at most the configured
    // rate's bytes a tick and max_pending_moves moves.
    if ((d.can_migrate || d.copy_moves) &&
        d.moves.ReadyToPlan(*d.engine, PlanCapBytes(d.config, d.engine->options().block_bytes))) {
      d.moves.Dispatch(*d.engine, d.clients, d.tick, d.can_migrate);
    }
    if (d.config.persist && d.config.checkpoint_interval_s > 0 &&
        (d.tick - last_checkpoint_tick_) * d.config.tick_ms >=
            d.config.checkpoint_interval_s * 1000ull) {
      Checkpoint();
    }
    d.in_tick = false;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  d.tick_seconds.Add(s, d.config.tick_ms / 1000.0);
}

// An address-range pool names its process by pid; once that process has
// exited the pid may be anyone's, so the pool's blocks become ghosts (as on
// disconnect) and the pool takes no more admits. The pidfd tells, one poll
// each. The blocks are released a chunk per turn of the I/O thread
// (Requests::ReleaseDeadPool): a million of them at once stalled a tick for
// 0.6 s, and a client can make it happen again every few seconds.
void Daemon::DropGonePools() {
  Shared& d = shared_;
  for (auto& [id, c] : d.clients.all()) {
    for (uint32_t p = 0; p < c.pools.size(); ++p) {
      server::Pool& pool = c.pools[p];
      if (pool.dead() || !pool.ProcessGone()) continue;
      // Dead first: its blocks' pages are no longer ours to count or move.
      pool.MarkDead();
      d.moves.ForgetReleased(*d.engine, c.peer.session_id, p);
      requests_.ReleaseDeadPool(c.peer.session_id, p);
    }
  }
}

void Daemon::Checkpoint() {
  Shared& d = shared_;
  last_checkpoint_tick_ = d.tick;
  if (!d.config.persist) return;
  // The ghosts, and the live blocks' states too: after a crash (SIGKILL, no
  // Stop), the live blocks of the last checkpoint come back as ghosts, and
  // their clients' re-admissions restore them.
  GhostSnapshot snap = d.CollectGhosts(true);
  // Stop's final checkpoint: the clock stops here and resumes here.
  snap.clock = {d.tick, d.stopped ? d.tick
                                  : ResumeTickAfterCrash(d.config.checkpoint_interval_s,
                                                         d.config.tick_ms, d.tick)};
  if (d.stopped) {
    checkpoints_.SaveFinal(snap);
  } else {
    checkpoints_.Save(std::move(snap));
  }
}

}  // namespace cxltier::service
