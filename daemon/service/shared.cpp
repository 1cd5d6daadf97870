#include "service/shared.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "service/copy_mode.h"

namespace cxltier::service {

namespace asio = boost::asio;
using wire::Error;
using wire::ErrorCode;

Shared::Shared(asio::io_context& io_context, DaemonConfig daemon_config,
               numa::Topology host_topology, numa::TierAssignment tiers,
               std::unique_ptr<numa::Migrator> migrator, bool can_page_migrate)
    : io(io_context),
      config(std::move(daemon_config)),
      topology(std::move(host_topology)),
      can_migrate(can_page_migrate && config.migrate && tiers.has_slow()),
      copy_moves(config.migrate),
      moves(
          std::move(tiers), std::move(migrator), config.migrate_rate_mib_s << 20,
          // The mover's thread reports a move done; the I/O thread completes it.
          [this](MoveDone done) {
            asio::post(io, [this, d = std::move(done)] {
              moves.Complete(d, engine.get(), clients, ClientWarner(), tick);
            });
          },
          &recorder) {
  peer_log.set_sink([](server::LogLevel level, const std::string& line) {
    spdlog::log(level == server::LogLevel::kError  ? spdlog::level::err
                : level == server::LogLevel::kWarn ? spdlog::level::warn
                : level == server::LogLevel::kInfo ? spdlog::level::info
                                                   : spdlog::level::debug,
                "{}", line);
  });
}

Status Shared::EnsureEngine(uint64_t block_bytes, uint64_t* rebuilt) {
  if (engine && engine->options().block_bytes != block_bytes) {
    // Without [engine] block_bytes, the first hello set the size, but only
    // for as long as a client that said hello is connected: one client's
    // first word must not decide it for everyone for good.
    if (config.block_bytes || clients.AnyHello() || moves.stats().in_flight > 0) {
      return Error{
          ErrorCode::kGeometry,
          "this daemon places blocks of " + std::to_string(engine->options().block_bytes) +
              " bytes; the model's blocks are " + std::to_string(block_bytes) + " bytes" +
              (config.block_bytes ? " ([engine] block_bytes)"
                                  : " (set by a connected client; set [engine] block_bytes to "
                                    "fix it for every client)")};
    }
    spdlog::info("block size {} -> {} bytes: no client holds blocks of the old size; ghosts kept",
                 engine->options().block_bytes, block_bytes);
    // A recording ends here: its replay has one block size.
    recorder.Stop(tick);
    GhostSnapshot kept = CollectGhosts(false);
    pending_ghosts.states = std::move(kept.states);
    pending_ghosts.owners = std::move(kept.owners);
    if (rebuilt) *rebuilt = pending_ghosts.states.size();
    engine.reset();
    quotas.Clear();
    clients.ForgetEngineSlots();
  }
  if (engine) return Status::Ok();
  auto policy = engine::MakePolicy(config.policy);
  if (!policy.ok()) return policy.status();
  engine::EngineOptions options = EngineOptionsFor(config, block_bytes, LowerTierBudgets());
  options.key_hash_seed = KeyHashSeed();
  engine = std::make_unique<engine::Engine>(options, std::move(*policy));
  const std::vector<BlockState>& ghosts = pending_ghosts.states;
  const std::vector<uint32_t>& owners = pending_ghosts.owners;
  for (size_t i = 0; i < ghosts.size(); ++i) {
    engine->RestoreGhost(ghosts[i], i < owners.size() ? owners[i] : kUnknownOwner);
  }
  pending_ghosts = {};
  spdlog::info("engine: policy {}, {}, block {} bytes, tier-0 budget {} ({} blocks)", config.policy,
               config.persist ? "persist" : "reset", block_bytes,
               FormatBytes(config.tier0_budget_bytes), engine->capacity_blocks());
  ApplyQuotas();
  return Status::Ok();
}

void Shared::ReleaseSlot(Client& c, uint32_t seg) {
  const SegSlot& s = c.slots[seg];
  if (!s.live) return;
  const BlockState& st = engine->state(s.engine_slot);
  if (st.flags & kFlagMigrating) moves.mover().Cancel(s.engine_slot, st.generation);
  // A client that left, or any client when the daemon stops, keeps the last
  // place of each block in its segment (docs/protocol.md, "Reconnect").
  const bool keep_place = c.leaving || stopped;
  if (c.pools[s.pool].is_tier() && !Retire(c, seg, tick, keep_place) && !keep_place) {
    ClientWarning(c.peer, fmt::format("slot {} was released while its write lease was held: "
                                      "writes after the release may land in a block that "
                                      "another of this client's blocks is given",
                                      seg));
  }
  recorder.Release(EventTick(), c.peer.uid, st.key);
  // Pages it leaves in tier 0 stay counted there until moved down or reused.
  if (!keep_place) moves.Releasing(*engine, c, seg);
  engine->Release(s.engine_slot);
  clients.Unbind(c, seg);
}

void Shared::ApplyQuotas() {
  if (engine) quotas.Apply(*engine, config, clients);  // else the first hello's engine does
}

Status Shared::SetPolicy(const std::string& name) {
  if (name == "min") {
    return Error{ErrorCode::kBadPayload,
                 "policy min needs the future; it exists only in cxltier-sim"};
  }
  auto policy = engine::MakePolicy(name);
  if (!policy.ok()) return policy.status();
  const std::string old = config.policy;
  config.policy = name;
  // No engine yet: the first client's hello builds it with the new policy.
  if (engine) engine->SetPolicy(std::move(*policy));
  recorder.PolicyChanged();  // a replay knows one policy
  spdlog::info("policy {} -> {}", old, name);
  return Status::Ok();
}

void Shared::Reload(const DaemonConfig& next) {
  config.tick_ms = next.tick_ms;
  config.migrate_rate_mib_s = next.migrate_rate_mib_s;
  config.log_level = next.log_level;
  config.checkpoint_interval_s = next.checkpoint_interval_s;
  config.max_pending_moves = next.max_pending_moves;
  config.admin_group = next.admin_group;
  config.lease_timeout_s = next.lease_timeout_s;
  moves.set_lease_timeout_ticks(LeaseTimeoutTicks());
  moves.mover().set_rate(config.migrate_rate_mib_s << 20);
  // The planner's budget follows the new tick and rate (no engine yet: the
  // first hello builds it from config).
  if (engine) {
    engine->set_migrate_bytes_per_tick(MigrateBytesPerTick(config, engine->options().block_bytes));
  }
  if (next.policy != config.policy) {
    if (Status st = SetPolicy(next.policy); !st.ok()) {
      spdlog::error("reload: policy {} refused: {}", next.policy, st.message);
    }
  }
  // The file's quotas replace every quota, those `cxltierctl quota set` made too.
  if (next.user_quotas != config.user_quotas || next.client_quotas != config.client_quotas) {
    config.user_quotas = next.user_quotas;
    config.client_quotas = next.client_quotas;
    spdlog::info("quotas: {} user and {} client quotas", config.user_quotas.size(),
                 config.client_quotas.size());
  }
  ApplyQuotas();
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::info("configuration reloaded (tick {} ms, migration {} MiB/s)", config.tick_ms,
               config.migrate_rate_mib_s);
}

GhostSnapshot Shared::CollectGhosts(bool with_live) const {
  if (engine) return CollectStates(*engine, with_live ? &clients : nullptr);
  GhostSnapshot out;
  out.states = pending_ghosts.states;
  out.owners = pending_ghosts.owners;
  out.owners.resize(out.states.size(), kUnknownOwner);
  return out;
}

void Shared::ClientWarning(const server::Peer& peer, const std::string& what) {
  peer_log.Line(peer.uid, server::LogLevel::kWarn,
                fmt::format("client pid {} uid {}: {}", peer.pid, peer.uid, what));
}

void Shared::ClientInfo(const server::Peer& peer, const std::string& line) {
  peer_log.Line(peer.uid, server::LogLevel::kInfo, line);
}

MoveDispatch::Warn Shared::ClientWarner() {
  return [this](const Client& c, const std::string& what) { ClientWarning(c.peer, what); };
}

size_t Shared::TierCount() const { return std::max<size_t>(2, moves.tiers().count()); }

uint64_t Shared::TierMemoryBytes(size_t tier) const {
  uint64_t bytes = 0;
  if (tier >= moves.tiers().count()) return 0;
  for (int n : moves.tiers().Nodes(tier)) {
    if (const numa::NumaNode* node = topology.Find(n)) bytes += node->memory_bytes;
  }
  return bytes;
}

uint64_t Shared::HostMemoryBytes() const {
  uint64_t bytes = 0;
  for (const numa::NumaNode& node : topology.nodes) bytes += node.memory_bytes;
  return bytes;
}

std::vector<uint64_t> Shared::LowerTierBudgets() const {
  std::vector<uint64_t> out;
  const size_t tiers = moves.tiers().count();
  for (size_t k = 1; k + 1 < tiers; ++k) {
    out.push_back(TierBudgetBytes(config, k, tiers, TierMemoryBytes(k)));
  }
  return out;
}

uint64_t Shared::LeaseTimeoutTicks() const {
  return uint64_t{config.lease_timeout_s} * 1000 / std::max<uint32_t>(config.tick_ms, 1);
}

}  // namespace cxltier::service
