// cxltierd's configuration: read from TOML over the defaults, checked, written
// back as TOML, and turned into the engine's options. The quotas' part is in
// quota_config.cpp.
#include "service/config.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "cxltier/model.h"
#include "engine/policy.h"
#include "server/http.h"
#include "service/config_toml.h"

namespace cxltier::service {
namespace {

using config_toml::IntOf;
using config_toml::Invalid;
using config_toml::ReadQuotas;
using config_toml::TableReader;

Status Apply(const toml::table& root, DaemonConfig* c) {
  Status error;  // the first problem any table reader finds
  for (const auto& [k, v] : root) {
    const std::string key(k.str());
    if (key != "daemon" && key != "engine" && key != "migration" && key != "tiers" &&
        key != "limits" && key != "metrics" && key != "quotas") {
      return Invalid("unknown table or key '" + key + "'");
    }
  }
  TableReader d(root, "daemon", &error);
  d.Str("socket", &c->socket_path);
  d.Str("state_dir", &c->state_dir);
  d.Str("log_level", &c->log_level);
  d.Int("tick_ms", &c->tick_ms);
  d.Int("checkpoint_interval_s", &c->checkpoint_interval_s);
  d.Str("socket_group", &c->socket_group);
  d.Str("admin_group", &c->admin_group);
  d.Finish();
  TableReader e(root, "engine", &error);
  e.Str("policy", &c->policy);
  e.Bool("persist", &c->persist);
  e.Size("tier0_budget", &c->tier0_budget_bytes);
  e.Size("block_bytes", &c->block_bytes);
  e.Int("ghost_capacity", &c->ghost_capacity);
  e.Int("hysteresis_ticks", &c->hysteresis_ticks);
  e.Int("landing_percent", &c->landing_percent);
  e.Finish();
  TableReader m(root, "migration", &error);
  m.Bool("enabled", &c->migrate);
  m.Int("rate_mib_s", &c->migrate_rate_mib_s);
  m.Int("max_pending_moves", &c->max_pending_moves);
  m.Finish();
  TableReader t(root, "tiers", &error);
  t.Nodes("fast_nodes", &c->fast_nodes);
  t.Nodes("slow_nodes", &c->slow_nodes);
  t.TierNodes("nodes", &c->tier_nodes);
  std::vector<uint64_t> budgets;
  if (t.Sizes("budgets", &budgets) && error.ok()) {
    if (e.Has("tier0_budget")) {
      error = Invalid("tier 0's budget is given twice: [engine] tier0_budget and [tiers] budgets");
    } else if (budgets.empty()) {
      error = Invalid("[tiers] budgets needs tier 0's budget at least");
    } else {
      c->tier0_budget_bytes = budgets.front();
      c->lower_tier_budget_bytes.assign(budgets.begin() + 1, budgets.end());
    }
  }
  t.Finish();
  TableReader x(root, "metrics", &error);
  x.Bool("enabled", &c->metrics_enabled);
  x.Str("listen", &c->metrics_listen);
  x.Bool("per_uid", &c->metrics_per_uid);
  x.Finish();
  TableReader l(root, "limits", &error);
  l.Int("max_clients", &c->max_clients);
  l.Int("max_blocks_per_client", &c->max_blocks_per_client);
  l.Int("max_message_bytes", &c->max_message_bytes);
  l.Int("max_pools_per_client", &c->max_pools_per_client);
  l.Int("max_connections_per_uid", &c->max_connections_per_uid);
  l.Int("admin_reserved_connections", &c->admin_reserved_connections);
  l.Int("max_blocks_per_uid", &c->max_blocks_per_uid);
  l.Int("max_pools_per_uid", &c->max_pools_per_uid);
  l.Size("max_segment_bytes_per_uid", &c->max_segment_bytes_per_uid);
  l.Int("max_ghosts_per_uid", &c->max_ghosts_per_uid);
  l.Size("max_reply_bytes", &c->max_reply_bytes);
  l.Int("reply_stall_timeout_s", &c->reply_stall_timeout_s);
  l.Size("max_input_bytes_per_uid", &c->max_input_bytes_per_uid);
  l.Int("frame_timeout_s", &c->frame_timeout_s);
  l.Int("idle_timeout_s", &c->idle_timeout_s);
  l.Size("max_tier_pool_bytes_per_uid", &c->max_tier_pool_bytes_per_uid);
  l.Size("max_pool_bytes_per_uid", &c->max_pool_bytes_per_uid);
  l.Int("lease_timeout_s", &c->lease_timeout_s);
  l.Finish();
  if (error.ok()) error = ReadQuotas(root, c);
  if (!error.ok()) return error;
  return c->Validate();
}

}  // namespace

Status DaemonConfig::Validate() const {
  if (socket_path.empty()) return Invalid("socket path is empty");
  if (socket_path.size() > 107) return Invalid("socket path is longer than 107 bytes");
  if (tick_ms == 0 || tick_ms > 60000) return Invalid("tick_ms must be between 1 and 60000");
  if (policy == "min") return Invalid("policy min needs the future; it exists only in cxltier-sim");
  if (auto p = engine::MakePolicy(policy); !p.ok()) return p.status();
  if (log_level != "trace" && log_level != "debug" && log_level != "info" && log_level != "warn" &&
      log_level != "error") {
    return Invalid("log_level must be trace, debug, info, warn or error");
  }
  if (migrate_rate_mib_s == 0)
    return Invalid("rate_mib_s must be positive (use enabled = false to stop)");
  // Absurd sizes are refused, not wrapped: every value must also print back
  // as a TOML integer (int64).
  if (tier0_budget_bytes > (uint64_t{1} << 60))
    return Invalid("tier0_budget must be at most 1 EiB");
  if (ghost_capacity > (uint64_t{1} << 32)) return Invalid("ghost_capacity must be at most 2^32");
  if (landing_percent > 50) return Invalid("landing_percent must be between 0 and 50");
  if (migrate_rate_mib_s > (uint64_t{1} << 30)) return Invalid("rate_mib_s must be at most 2^30");
  if (max_clients == 0 || max_blocks_per_client == 0 || max_connections_per_uid == 0 ||
      max_blocks_per_uid == 0 || max_pools_per_uid == 0 || max_segment_bytes_per_uid == 0 ||
      max_reply_bytes == 0 || max_input_bytes_per_uid == 0 || max_ghosts_per_uid == 0) {
    return Invalid("limits must be positive");
  }
  if (block_bytes > kMaxBlockBytes) {
    return Invalid("block_bytes must be at most " + std::to_string(kMaxBlockBytes >> 20) + " MiB");
  }
  if (max_segment_bytes_per_uid > (uint64_t{1} << 40) || max_reply_bytes > (uint64_t{1} << 32) ||
      max_input_bytes_per_uid > (uint64_t{1} << 40)) {
    return Invalid("per-uid byte limits must be at most 1 TiB (max_reply_bytes at most 4 GiB)");
  }
  if (max_tier_pool_bytes_per_uid > (uint64_t{1} << 50)) {
    return Invalid("max_tier_pool_bytes_per_uid must be at most 1 PiB");
  }
  if (max_pool_bytes_per_uid > (uint64_t{1} << 46)) {
    return Invalid("max_pool_bytes_per_uid must be at most 64 TiB");
  }
  if (reply_stall_timeout_s == 0 || frame_timeout_s == 0 || idle_timeout_s == 0 ||
      lease_timeout_s == 0) {
    return Invalid("timeouts must be at least 1 s");
  }
  if (max_message_bytes < 4096 || max_message_bytes > (256u << 20)) {
    return Invalid("max_message_bytes must be between 4 KiB and 256 MiB");
  }
  if (metrics_enabled) {
    std::string host;
    uint16_t port = 0;
    if (!server::ParseHostPort(metrics_listen, &host, &port)) {
      return Invalid("metrics listen must be host:port, e.g. \"127.0.0.1:9464\" or \"[::1]:9464\"");
    }
  }
  if (fast_nodes.empty() != slow_nodes.empty()) {
    return Invalid("[tiers] needs both fast_nodes and slow_nodes, or neither");
  }
  if (!tier_nodes.empty() && !fast_nodes.empty()) {
    return Invalid("[tiers] nodes replaces fast_nodes and slow_nodes: give one or the other");
  }
  if (!tier_nodes.empty() && (tier_nodes.size() < 2 || tier_nodes.size() > 8)) {
    return Invalid("[tiers] nodes must name 2 to 8 tiers");
  }
  for (size_t k = 0; k < tier_nodes.size(); ++k) {
    if (tier_nodes[k].empty())
      return Invalid("[tiers] nodes: tier " + std::to_string(k) + " is empty");
  }
  if (lower_tier_budget_bytes.size() > 6) {
    return Invalid("[tiers] budgets: at most 7 (tiers 0 to 6; the last tier holds the rest)");
  }
  if (!tier_nodes.empty() && lower_tier_budget_bytes.size() + 1 >= tier_nodes.size()) {
    return Invalid("[tiers] budgets: " + std::to_string(lower_tier_budget_bytes.size() + 1) +
                   " budgets for " + std::to_string(tier_nodes.size()) +
                   " tiers (one per tier but the last, which holds the rest)");
  }
  for (uint64_t b : lower_tier_budget_bytes) {
    if (b > (uint64_t{1} << 60)) return Invalid("[tiers] budgets must be at most 1 EiB each");
  }
  return ValidateQuotas(*this);
}

Status LoadConfigText(const std::string& text, const std::string& name, DaemonConfig* c) {
  try {
    return Apply(toml::parse(text, name), c).Context(name + ": ");
  } catch (const toml::parse_error& e) {
    std::ostringstream out;
    out << name << ":" << e.source().begin.line << ": " << e.description();
    return Invalid(out.str());
  }
}

Status LoadConfigFile(const std::string& path, DaemonConfig* c) {
  try {
    return Apply(toml::parse_file(path), c).Context(path + ": ");
  } catch (const toml::parse_error& e) {
    std::ostringstream out;
    out << path << ":" << e.source().begin.line << ": " << e.description();
    return Invalid(out.str());
  }
}

std::string ToToml(const DaemonConfig& c) {
  toml::array fast, slow, tier_nodes, budgets;
  for (int n : c.fast_nodes) fast.push_back(n);
  for (int n : c.slow_nodes) slow.push_back(n);
  for (const std::vector<int>& tier : c.tier_nodes) {
    toml::array nodes;
    for (int n : tier) nodes.push_back(n);
    tier_nodes.push_back(std::move(nodes));
  }
  toml::table tiers{{"fast_nodes", fast}, {"slow_nodes", slow}};
  if (!c.tier_nodes.empty()) tiers.insert("nodes", tier_nodes);
  // With lower budgets, tier 0's is the first of [tiers] budgets (and not in [engine]).
  if (!c.lower_tier_budget_bytes.empty()) {
    budgets.push_back(static_cast<int64_t>(c.tier0_budget_bytes));
    for (uint64_t b : c.lower_tier_budget_bytes) budgets.push_back(static_cast<int64_t>(b));
    tiers.insert("budgets", budgets);
  }
  toml::table t{
      {"daemon", toml::table{{"socket", c.socket_path},
                             {"state_dir", c.state_dir},
                             {"log_level", c.log_level},
                             {"tick_ms", c.tick_ms},
                             {"checkpoint_interval_s", c.checkpoint_interval_s},
                             {"socket_group", c.socket_group},
                             {"admin_group", c.admin_group}}},
      {"engine", toml::table{{"policy", c.policy},
                             {"persist", c.persist},
                             {"tier0_budget", static_cast<int64_t>(c.tier0_budget_bytes)},
                             {"block_bytes", static_cast<int64_t>(c.block_bytes)},
                             {"ghost_capacity", static_cast<int64_t>(c.ghost_capacity)},
                             {"hysteresis_ticks", c.hysteresis_ticks},
                             {"landing_percent", c.landing_percent}}},
      {"migration", toml::table{{"enabled", c.migrate},
                                {"rate_mib_s", static_cast<int64_t>(c.migrate_rate_mib_s)},
                                {"max_pending_moves", c.max_pending_moves}}},
      {"tiers", tiers},
      {"metrics", toml::table{{"enabled", c.metrics_enabled},
                              {"listen", c.metrics_listen},
                              {"per_uid", c.metrics_per_uid}}},
      {"limits",
       toml::table{
           {"max_clients", c.max_clients},
           {"max_blocks_per_client", c.max_blocks_per_client},
           {"max_message_bytes", c.max_message_bytes},
           {"max_pools_per_client", c.max_pools_per_client},
           {"max_connections_per_uid", c.max_connections_per_uid},
           {"admin_reserved_connections", c.admin_reserved_connections},
           {"max_blocks_per_uid", c.max_blocks_per_uid},
           {"max_pools_per_uid", c.max_pools_per_uid},
           {"max_segment_bytes_per_uid", static_cast<int64_t>(c.max_segment_bytes_per_uid)},
           {"max_ghosts_per_uid", c.max_ghosts_per_uid},
           {"max_reply_bytes", static_cast<int64_t>(c.max_reply_bytes)},
           {"reply_stall_timeout_s", c.reply_stall_timeout_s},
           {"max_input_bytes_per_uid", static_cast<int64_t>(c.max_input_bytes_per_uid)},
           {"frame_timeout_s", c.frame_timeout_s},
           {"idle_timeout_s", c.idle_timeout_s},
           {"max_tier_pool_bytes_per_uid", static_cast<int64_t>(c.max_tier_pool_bytes_per_uid)},
           {"max_pool_bytes_per_uid", static_cast<int64_t>(c.max_pool_bytes_per_uid)},
           {"lease_timeout_s", c.lease_timeout_s}}},
  };
  if (!c.lower_tier_budget_bytes.empty()) t["engine"].as_table()->erase("tier0_budget");
  // [[quotas.user]] and [[quotas.client]]: every cap as tiers = [...] (bytes,
  // "none" for none), users by uid.
  auto quota_table = [](const QuotaBytes& q) {
    toml::table out;
    toml::array caps;
    for (uint64_t cap : q.caps) {
      if (cap == kNoCapBytes) {
        caps.push_back("none");
      } else {
        caps.push_back(static_cast<int64_t>(cap));
      }
    }
    if (!caps.empty()) out.insert("tiers", caps);
    if (q.guarantee) out.insert("guarantee", static_cast<int64_t>(q.guarantee));
    return out;
  };
  toml::array users, clients;
  for (const UserQuota& u : c.user_quotas) {
    toml::table e = quota_table(u.quota);
    e.insert("uid", static_cast<int64_t>(u.uid));
    users.push_back(std::move(e));
  }
  for (const ClientQuota& q : c.client_quotas) {
    toml::table e = quota_table(q.quota);
    e.insert("uid", static_cast<int64_t>(q.uid));
    e.insert("name", q.name);
    clients.push_back(std::move(e));
  }
  if (!users.empty() || !clients.empty()) {
    toml::table quotas;
    if (!users.empty()) quotas.insert("user", std::move(users));
    if (!clients.empty()) quotas.insert("client", std::move(clients));
    t.insert("quotas", std::move(quotas));
  }
  std::ostringstream out;
  out << t << "\n";
  return out.str();
}

uint64_t TierBudgetBytes(const DaemonConfig& config, size_t tier, size_t tiers,
                         uint64_t memory_bytes) {
  if (tier == 0) return config.tier0_budget_bytes;
  if (tier + 1 >= tiers) return 0;
  if (tier - 1 < config.lower_tier_budget_bytes.size()) {
    return config.lower_tier_budget_bytes[tier - 1];
  }
  return memory_bytes;
}

uint64_t MigrateBytesPerTick(const DaemonConfig& config, uint64_t block_bytes) {
  return std::max<uint64_t>(2 * block_bytes,
                            (config.migrate_rate_mib_s << 20) / 1000 * config.tick_ms);
}

uint64_t PlanCapBytes(const DaemonConfig& config, uint64_t block_bytes) {
  return std::min(MigrateBytesPerTick(config, block_bytes),
                  std::max<uint64_t>(2, config.max_pending_moves) * block_bytes);
}

engine::EngineOptions EngineOptionsFor(const DaemonConfig& config, uint64_t block_bytes,
                                       std::vector<uint64_t> lower_tier_budgets) {
  engine::EngineOptions o;
  o.block_bytes = block_bytes;
  o.tier0_budget_bytes = config.tier0_budget_bytes;
  o.lower_tier_budget_bytes = std::move(lower_tier_budgets);
  o.persistence = config.persist ? engine::Persistence::kPersist : engine::Persistence::kReset;
  o.mode = engine::Mode::kTick;
  o.ghost_capacity = config.ghost_capacity;
  // Every uid, root and admins too, gets the same share of the ghost store.
  o.ghost_capacity_per_owner = config.max_ghosts_per_uid;
  o.migrate_bytes_per_tick = MigrateBytesPerTick(config, block_bytes);
  o.hysteresis_ticks = config.hysteresis_ticks;
  o.landing_percent = config.landing_percent;
  return o;
}

}  // namespace cxltier::service
