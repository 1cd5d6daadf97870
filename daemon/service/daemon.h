// The daemon: its lifecycle and its tick. What it holds is shared with the
// requests (service/shared.h); the clients' messages are answered by
// Requests (service/requests.h), which the server calls. The tick folds the
// observations, plans, hands the moves to the mover and checkpoints. The
// status snapshot (snapshot.h) reads the shared state and status.h renders
// it. Everything here runs on the I/O thread except the mover's migrations
// and the checkpoint writes.
#pragma once

#include <utility>  // before Asio: Boost 1.74 uses std::exchange without it

#include <boost/asio.hpp>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "numa/topology.h"
#include "server/server.h"
#include "service/checkpointer.h"
#include "service/config.h"
#include "service/requests.h"
#include "service/shared.h"

namespace cxltier::service {

class Daemon {
 public:
  Daemon(boost::asio::io_context& io, DaemonConfig config, numa::Topology topology,
         numa::TierAssignment tiers, std::unique_ptr<numa::Migrator> migrator, bool can_migrate);
  ~Daemon();

  // Loads the ghost checkpoint and starts the tick timer.
  Status Start();
  // Stops ticking and moving, turns every live block into a ghost, saves them.
  void Stop();
  // One round: fold, plan, hand out moves, checkpoint. Public for tests.
  void Tick();

  // What the server calls: the answers to every message.
  Requests& requests() { return requests_; }

  // Applies what can change at run time (Shared::Reload).
  void Reload(const DaemonConfig& config) { shared_.Reload(config); }
  // What Reload cannot take from `config` on this host (a quota capping the
  // last tier or a tier the host lacks); main checks it before Reload.
  Status CheckReload(const DaemonConfig& config) const;
  // The engine's tiers on this host: 2, or every tier the topology found.
  size_t TierCount() const { return shared_.TierCount(); }
  // What an Admin kReload request runs (the daemon's main re-reads its config
  // file); without one, kReload re-applies the running configuration.
  void set_reload_hook(std::function<Status()> hook) { requests_.set_reload_hook(std::move(hook)); }
  // The server's counters (connections it closed, accept back-offs...), for
  // status and metrics.
  void set_server_counters(std::function<server::ServerCounters()> f) {
    shared_.server_counters = std::move(f);
  }
  // Where the metrics server listens (shown in status), or "".
  void set_metrics_endpoint(std::string e) { shared_.metrics_endpoint = std::move(e); }

  // Logs a warning caused by a client (protocol errors from the server come
  // here too), rate-limited per uid with every other line about its clients.
  void ClientWarning(const server::Peer& peer, const std::string& what) {
    shared_.ClientWarning(peer, what);
  }
  // Where every line about a client goes, the server's too (main passes it).
  server::PeerLog& peer_log() { return shared_.peer_log; }

  const DaemonConfig& config() const { return shared_.config; }
  // Everything status reports, read once (snapshot.h); `Stats status`, and
  // the Prometheus text exposition.
  StatusSnapshot Snapshot() const;
  nlohmann::json StatusJson() const;
  std::string MetricsText() const;

 private:
  void ScheduleTick();
  // The tick's steps, in order.
  void DropGonePools();
  void Checkpoint();

  Shared shared_;
  Requests requests_{shared_};
  Checkpointer checkpoints_;
  boost::asio::steady_timer timer_;
  uint64_t last_checkpoint_tick_ = 0;
};

}  // namespace cxltier::service
