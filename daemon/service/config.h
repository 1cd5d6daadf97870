// DaemonConfig: every setting of cxltierd, with its default. Loaded from TOML
// (toml++); flags override the file. docs/operations.md lists the keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cxltier/socket_path.h"
#include "cxltier/status.h"
#include "cxltier/wire.h"
#include "engine/engine.h"
#include "engine/policy.h"
#include "service/quota_config.h"

namespace cxltier::service {

struct DaemonConfig {
  // [daemon]
  std::string socket_path = kDefaultSocketPath;  // client socket
  std::string state_dir = "/var/lib/cxltierd";   // ghost checkpoints
  std::string log_level = "info";                // trace, debug, info, warn, error
  uint32_t tick_ms = 100;                        // one fold + plan + migrate round
  uint32_t checkpoint_interval_s = 60;           // ghosts saved this often (0 = only at stop)
  std::string socket_group = "cxltier";          // group of the socket (mode 0660): clients
  std::string admin_group = "cxltier-admin";     // may change policy and reload (and root)
  // [engine]
  std::string policy{engine::kDefaultPolicy};  // any cxltier-sim policy but min
  bool persist = true;                         // keep state across eviction and release
  uint64_t tier0_budget_bytes = 32ull << 30;   // tier-0 bytes cxltier may fill
  uint64_t block_bytes = 0;                    // 0: set by the first client's model
  uint64_t ghost_capacity = 1u << 20;          // ghosts kept
  uint32_t hysteresis_ticks = 2;               // ticks a moved block stays put
  uint32_t landing_percent = 3;  // share of tier 0 kept free for new blocks (EngineOptions)
  // [migration]
  bool migrate = true;                 // false: score and plan, never move pages
  uint64_t migrate_rate_mib_s = 1024;  // bytes moved per second, at most
  uint32_t max_pending_moves = 256;    // moves queued for the mover, at most
  // [tiers] (all empty: the daemon orders the nodes itself, docs/operations.md)
  std::vector<int> fast_nodes;               // two tiers: tier 0's nodes (with slow_nodes)
  std::vector<int> slow_nodes;               // two tiers: tier 1's nodes
  std::vector<std::vector<int>> tier_nodes;  // `nodes`: every tier's nodes, tier 0 first
  // `budgets` after tier 0's (which is tier0_budget_bytes): tiers 1, 2, ...;
  // the last tier has none (it holds the rest). Empty: each middle tier's
  // budget is its nodes' memory.
  std::vector<uint64_t> lower_tier_budget_bytes;
  // [metrics] (Prometheus text format over HTTP: GET /metrics)
  bool metrics_enabled = true;
  std::string metrics_listen = "127.0.0.1:9464";  // loopback by default; port 0: any free port
  // Per-uid series (cxltier_user_*): every uid's bytes, caps and guarantees
  // to whoever reaches the endpoint, so off unless asked for.
  bool metrics_per_uid = false;
  // [limits]
  uint32_t max_clients = 64;
  uint32_t max_blocks_per_client = 1u << 20;
  uint32_t max_message_bytes = wire::kDefaultMaxPayload;
  uint32_t max_pools_per_client = 16;
  // Per uid (root and members of admin_group are exempt from the connection
  // caps, and get admin_reserved_connections beyond max_clients).
  uint32_t max_connections_per_uid = 16;             // connections of one uid at once
  uint32_t admin_reserved_connections = 8;           // room kept for root and the admin group
  uint32_t max_blocks_per_uid = 1u << 20;            // live blocks of one uid, all connections
  uint32_t max_pools_per_uid = 64;                   // pools of one uid, all connections
  uint64_t max_segment_bytes_per_uid = 80ull << 20;  // state segments of one uid (1.1M slots)
  uint32_t max_ghosts_per_uid = 1u << 18;            // one uid's share of the ghost store
  // Per connection (the server).
  uint64_t max_reply_bytes = 4ull << 20;           // queued replies before reading stops
  uint32_t reply_stall_timeout_s = 30;             // replies not read this long: closed
  uint64_t max_input_bytes_per_uid = 32ull << 20;  // unprocessed input of one uid
  uint32_t frame_timeout_s = 10;                   // a started frame must arrive within this
  uint32_t idle_timeout_s = 60;                    // no hello and no request this long: closed
  // Copy mode: memory the daemon allocates on a client's word, and how long
  // a lease may keep a place from reuse (or a block from moving) before it
  // is counted and warned about. Leases are never broken: a reader's DMA
  // may still run. One uid's tier pools of one tier never hold more than
  // that tier's budget (the last tier's: its nodes' memory); this bounds
  // their sum over the tiers too (0: no bound beyond the budgets).
  uint64_t max_tier_pool_bytes_per_uid = 0;
  // Page mode: bytes of one uid's memfd pools that the daemon maps (blocks x
  // stride each); 0: the memory of every node the topology found, and at
  // least 1 TiB. Sparse memfds cost no memory, but each pool takes the
  // daemon's address space.
  uint64_t max_pool_bytes_per_uid = 0;
  uint32_t lease_timeout_s = 30;
  // [quotas] (empty: none). Reload replaces both lists, and so does nothing
  // else but `cxltierctl quota set` (until the next reload).
  std::vector<UserQuota> user_quotas;
  std::vector<ClientQuota> client_quotas;

  // The user quota of `uid` ([[quotas.user]] only), the client quota of
  // `uid`'s connections named `name`, or nullptr.
  const QuotaBytes* UserQuotaOf(uint32_t uid) const;
  const QuotaBytes* ClientQuotaOf(uint32_t uid, const std::string& name) const;

  // Ok when the values make sense together; otherwise (kBadPayload) what is wrong.
  Status Validate() const;
};

// Reads a TOML file over the defaults. Unknown keys are errors (a typo must
// not silently keep a default). An error (kBadPayload) names the file.
Status LoadConfigFile(const std::string& path, DaemonConfig* config);

// Parses TOML text (for tests and `config show`).
Status LoadConfigText(const std::string& text, const std::string& name, DaemonConfig* config);

// The effective configuration as TOML.
std::string ToToml(const DaemonConfig& config);

// Tier k's byte budget with `tiers` tiers (from the config, or `memory_bytes`,
// the tier's nodes' memory, for a middle tier the config leaves out); 0 for
// the last tier, which holds the rest.
uint64_t TierBudgetBytes(const DaemonConfig& config, size_t tier, size_t tiers,
                         uint64_t memory_bytes);

// The planner's byte budget of one tick: no more than the mover may move in
// one tick at the migration rate (the planner's view then stays close to what
// the kernel has done), and at least two blocks: with tier 0 full a promotion
// is planned only with the demotion that makes room for it, so a budget of
// one block would never swap anything.
// Start-up and reload both use it, so a reload's tick and rate reach the planner.
uint64_t MigrateBytesPerTick(const DaemonConfig& config, uint64_t block_bytes);
// The cap of a plan's budget (PlanPace): MigrateBytesPerTick, and at most
// max_pending_moves blocks (two at least).
uint64_t PlanCapBytes(const DaemonConfig& config, uint64_t block_bytes);
// The daemon's engine for blocks of `block_bytes`: tick mode, the budgets,
// ghost capacities and hysteresis of `config`; `lower_tier_budgets`: those of
// tiers 1 .. N-2 on a host with N > 2 tiers (TierBudgetBytes), empty with two.
engine::EngineOptions EngineOptionsFor(const DaemonConfig& config, uint64_t block_bytes,
                                       std::vector<uint64_t> lower_tier_budgets = {});

}  // namespace cxltier::service
