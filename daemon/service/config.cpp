#include "service/config.h"

#include <pwd.h>
#include <toml++/toml.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "cxltier/model.h"
#include "engine/policy.h"
#include "server/http.h"

namespace cxltier::service {
namespace {

// A configuration that cannot be used: kBadPayload, as a reload request
// with it is refused.
Status Invalid(std::string message) {
  return Status::Fail(wire::ErrorCode::kBadPayload, std::move(message));
}

// Integers only: toml++'s value<int64_t>() converts floats, and 1e100 is
// undefined behaviour there (found by fuzz_config).
std::optional<int64_t> IntOf(const toml::node& n) {
  if (const auto* i = n.as_integer()) return i->get();
  return std::nullopt;
}

// Reads one table's keys into fields; anything else in the table is an error.
class TableReader {
 public:
  TableReader(const toml::table& root, const char* name, std::string* error)
      : label_("[" + std::string(name) + "]"), error_(error) {
    if (const toml::node* n = root.get(name)) {
      table_ = n->as_table();
      if (!table_) Fail(label_ + " must be a table");
    }
  }
  // One table of an array of tables, named `label` in errors ("[[quotas.user]] #2").
  TableReader(const toml::table* table, std::string label, std::string* error)
      : label_(std::move(label)), error_(error), table_(table) {}

  void Str(const char* key, std::string* out) {
    if (const toml::node* n = Get(key)) {
      if (auto v = n->value<std::string>()) {
        *out = *v;
      } else {
        Fail(key, "a string");
      }
    }
  }
  void Bool(const char* key, bool* out) {
    if (const toml::node* n = Get(key)) {
      if (auto v = n->value<bool>()) {
        *out = *v;
      } else {
        Fail(key, "true or false");
      }
    }
  }
  template <typename T>
  void Int(const char* key, T* out) {
    if (const toml::node* n = Get(key)) {
      auto v = IntOf(*n);
      if (!v || *v < 0 || static_cast<uint64_t>(*v) > std::numeric_limits<T>::max()) {
        return Fail(key, "a non-negative integer in range");
      }
      *out = static_cast<T>(*v);
    }
  }
  // A size: an integer (bytes) or a string like "32GiB".
  void Size(const char* key, uint64_t* out) {
    if (const toml::node* n = Get(key)) {
      if (auto i = IntOf(*n); i && *i >= 0) {
        *out = static_cast<uint64_t>(*i);
      } else if (auto s = n->value<std::string>(); s && ParseSize(*s)) {
        *out = *ParseSize(*s);
      } else {
        Fail(key, "a byte count or a size like \"32GiB\"");
      }
    }
  }
  void Nodes(const char* key, std::vector<int>* out) {
    if (const toml::node* n = Get(key)) {
      const toml::array* a = n->as_array();
      if (!a) return Fail(key, "an array of node numbers");
      out->clear();
      for (const toml::node& e : *a) {
        auto v = IntOf(e);
        if (!v || *v < 0 || *v > 1023) return Fail(key, "an array of node numbers (0-1023)");
        out->push_back(static_cast<int>(*v));
      }
    }
  }
  // An array of arrays of node numbers, one per tier.
  void TierNodes(const char* key, std::vector<std::vector<int>>* out) {
    if (const toml::node* n = Get(key)) {
      const toml::array* a = n->as_array();
      if (!a) return Fail(key, "an array of tiers, each an array of node numbers");
      out->clear();
      for (const toml::node& tier : *a) {
        const toml::array* nodes = tier.as_array();
        if (!nodes) return Fail(key, "an array of tiers, each an array of node numbers");
        out->emplace_back();
        for (const toml::node& e : *nodes) {
          auto v = IntOf(e);
          if (!v || *v < 0 || *v > 1023) return Fail(key, "arrays of node numbers (0-1023)");
          out->back().push_back(static_cast<int>(*v));
        }
      }
    }
  }
  // An array of sizes; returns whether the key was there.
  bool Sizes(const char* key, std::vector<uint64_t>* out) {
    const toml::node* n = Get(key);
    if (!n) return false;
    const toml::array* a = n->as_array();
    if (!a) {
      Fail(key, "an array of byte counts or sizes like \"32GiB\"");
      return true;
    }
    out->clear();
    for (const toml::node& e : *a) {
      if (auto i = IntOf(e); i && *i >= 0) {
        out->push_back(static_cast<uint64_t>(*i));
      } else if (auto s = e.value<std::string>(); s && ParseSize(*s)) {
        out->push_back(*ParseSize(*s));
      } else {
        Fail(key, "an array of byte counts or sizes like \"32GiB\"");
        return true;
      }
    }
    return true;
  }
  // A quota cap: a size, or "none" (kNoCapBytes).
  void Cap(const char* key, uint64_t* out) {
    if (const toml::node* n = Get(key)) {
      if (auto c = CapOf(*n)) {
        *out = *c;
      } else {
        Fail(key, "a byte count, a size like \"8GiB\" or \"none\"");
      }
    }
  }
  // An array of caps; returns whether the key was there.
  bool Caps(const char* key, std::vector<uint64_t>* out) {
    const toml::node* n = Get(key);
    if (!n) return false;
    const toml::array* a = n->as_array();
    out->clear();
    for (size_t i = 0; a && i < a->size(); ++i) {
      auto c = CapOf(*a->get(i));
      if (!c) break;
      out->push_back(*c);
    }
    if (!a || out->size() != a->size()) {
      Fail(key, "an array of caps, tier 0 first: byte counts, sizes like \"8GiB\" or \"none\"");
    }
    return true;
  }
  bool Has(const char* key) const { return table_ && table_->get(key); }
  // Call after reading every key: unknown keys are errors.
  void Finish() {
    if (!table_) return;
    for (const auto& [k, v] : *table_) {
      if (!seen_.count(std::string(k.str()))) {
        Fail("unknown key '" + std::string(k.str()) + "' in " + label_);
      }
    }
  }
  void Fail(const std::string& msg) {
    if (error_->empty()) *error_ = msg;
  }
  const std::string& label() const { return label_; }

 private:
  static std::optional<uint64_t> CapOf(const toml::node& n) {
    if (auto i = IntOf(n); i && *i >= 0) return static_cast<uint64_t>(*i);
    if (auto s = n.value<std::string>()) {
      if (*s == "none") return kNoCapBytes;
      return ParseSize(*s);
    }
    return std::nullopt;
  }
  const toml::node* Get(const char* key) {
    seen_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }
  void Fail(const char* key, const char* want) { Fail(label_ + " " + key + " must be " + want); }

  std::string label_;
  std::string* error_;
  const toml::table* table_ = nullptr;
  std::set<std::string> seen_;
};

// Drops trailing "none" caps: a quota means the same with or without them.
void TrimCaps(std::vector<uint64_t>* caps) {
  while (!caps->empty() && caps->back() == kNoCapBytes) caps->pop_back();
}

// tier0 / tiers / guarantee of one [[quotas.*]] table.
void ReadQuota(TableReader& r, bool user, QuotaBytes* q) {
  uint64_t tier0 = kNoCapBytes;
  const bool has_tier0 = r.Has("tier0");
  r.Cap("tier0", &tier0);
  std::vector<uint64_t> tiers;
  const bool has_tiers = r.Caps("tiers", &tiers);
  if (has_tier0 && has_tiers) {
    r.Fail(r.label() + ": tier 0's cap is given twice: tier0 and tiers");
  }
  q->caps = has_tiers ? tiers : std::vector<uint64_t>{tier0};
  TrimCaps(&q->caps);
  if (!user && r.Has("guarantee")) {
    r.Fail(r.label() + ": a client has no guarantee (a user's guarantee covers its clients)");
  }
  if (user) r.Size("guarantee", &q->guarantee);
}

std::optional<uint32_t> UidOfUser(const std::string& name) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) != 0 || !found) {
    return std::nullopt;
  }
  return found->pw_uid;
}

// [quotas]: [[quotas.user]] and [[quotas.client]] tables.
void ReadQuotas(const toml::table& root, DaemonConfig* c, std::string* error) {
  const toml::node* n = root.get("quotas");
  if (!n) return;
  const toml::table* quotas = n->as_table();
  if (!quotas) {
    *error = "[quotas] must be a table (of [[quotas.user]] and [[quotas.client]] tables)";
    return;
  }
  for (const auto& [k, v] : *quotas) {
    const std::string key(k.str());
    if (key != "user" && key != "client") {
      *error = "unknown key '" + key + "' in [quotas] (known: [[quotas.user]], [[quotas.client]])";
      return;
    }
    const toml::array* entries = v.as_array();
    if (!entries || !entries->is_array_of_tables()) {
      *error = "quotas." + key + " must be an array of tables: write [[quotas." + key + "]]";
      return;
    }
    std::vector<UserQuota>& users = c->user_quotas;
    std::vector<ClientQuota>& clients = c->client_quotas;
    if (key == "user") users.clear();
    if (key == "client") clients.clear();
    for (size_t i = 0; i < entries->size() && error->empty(); ++i) {
      const std::string label = "[[quotas." + key + "]] #" + std::to_string(i + 1);
      TableReader r(entries->get(i)->as_table(), label, error);
      // uid = N or user = "name": whose quota (a client quota's too).
      auto read_uid = [&](const std::string& missing) {
        uint64_t uid = 0;
        std::string name;
        const bool has_uid = r.Has("uid"), has_user = r.Has("user");
        r.Int("uid", &uid);
        r.Str("user", &name);
        if (has_uid == has_user) {
          r.Fail(label + ": " +
                 (has_uid ? "give uid = N or user = \"name\" (one of them)" : missing));
        } else if (has_uid && uid > 0xfffffffeull) {
          r.Fail(label + ": uid " + std::to_string(uid) + " is out of range");
        } else if (has_user && error->empty()) {
          if (auto resolved = UidOfUser(name)) {
            uid = *resolved;
          } else {
            r.Fail(label + ": no user '" + name + "' in the password database");
          }
        }
        return static_cast<uint32_t>(uid);
      };
      if (key == "user") {
        UserQuota u;
        u.uid = read_uid("give uid = N or user = \"name\" (one of them)");
        ReadQuota(r, true, &u.quota);
        r.Finish();
        users.push_back(std::move(u));
      } else {
        ClientQuota q;
        if (!r.Has("name")) r.Fail(label + ": give name = \"the client's hello name\"");
        r.Str("name", &q.name);
        q.uid = read_uid(
            "give uid = N or user = \"name\": whose connections of that name (a hello's name is "
            "the client's own choice: a quota on a name alone would bind no one, another name "
            "escapes it)");
        ReadQuota(r, false, &q.quota);
        r.Finish();
        clients.push_back(std::move(q));
      }
    }
  }
}

Status Apply(const toml::table& root, DaemonConfig* c) {
  std::string error;
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
  if (t.Sizes("budgets", &budgets) && error.empty()) {
    if (e.Has("tier0_budget")) {
      error = "tier 0's budget is given twice: [engine] tier0_budget and [tiers] budgets";
    } else if (budgets.empty()) {
      error = "[tiers] budgets needs tier 0's budget at least";
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
  l.Int("lease_timeout_s", &c->lease_timeout_s);
  l.Finish();
  if (error.empty()) ReadQuotas(root, c, &error);
  if (!error.empty()) return Invalid(error);
  return c->Validate();
}

}  // namespace

Status ValidateQuotas(const DaemonConfig& c);

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

namespace {

std::string QuotaName(const UserQuota& u) { return "[quotas] uid " + std::to_string(u.uid); }
std::string QuotaName(const ClientQuota& c) {
  return "[quotas] client '" + c.name + "' of uid " + std::to_string(c.uid);
}

// One quota's own checks (the host's tiers come later: CheckQuotaTiers).
Status ValidateQuota(const std::string& who, const QuotaBytes& q, size_t tier_nodes) {
  if (q.Unlimited()) {
    return Invalid(who + ": no cap and no guarantee (give tier0, tiers or guarantee)");
  }
  if (q.caps.size() > kMaxTiers - 1) {
    return Invalid(who + ": caps for " + std::to_string(q.caps.size()) + " tiers; at most " +
                   std::to_string(kMaxTiers - 1) + " (of " + std::to_string(kMaxTiers) +
                   " tiers the last is never capped)");
  }
  if (tier_nodes && q.caps.size() >= tier_nodes) {
    return Invalid(who + ": caps for " + std::to_string(q.caps.size()) + " tiers, but [tiers] " +
                   "nodes names " + std::to_string(tier_nodes) + " and the last (tier " +
                   std::to_string(tier_nodes - 1) +
                   ") is never capped: it holds every block that fits nowhere else");
  }
  for (uint64_t cap : q.caps) {
    if (cap != kNoCapBytes && cap > (uint64_t{1} << 60)) {
      return Invalid(who + ": caps must be at most 1 EiB (or \"none\")");
    }
  }
  if (q.guarantee > (uint64_t{1} << 60)) return Invalid(who + ": guarantee must be at most 1 EiB");
  if (q.guarantee > 0 && !q.caps.empty() && q.guarantee > q.caps[0]) {
    return Invalid(who + ": guarantee " + FormatBytes(q.guarantee) + " is above its tier-0 cap " +
                   FormatBytes(q.caps[0]));
  }
  return Status::Ok();
}

}  // namespace

Status ValidateQuotas(const DaemonConfig& c) {
  std::set<uint32_t> uids;
  uint64_t guaranteed = 0;
  for (const UserQuota& u : c.user_quotas) {
    if (!uids.insert(u.uid).second) {
      return Invalid(QuotaName(u) + " has two quotas (one [[quotas.user]] per uid; a user = " +
                     "\"name\" entry counts as its uid)");
    }
    if (Status st = ValidateQuota(QuotaName(u), u.quota, c.tier_nodes.size()); !st.ok()) return st;
    // Each guarantee is at most 1 EiB and the sum so far at most the budget
    // (1 EiB): no overflow.
    guaranteed += u.quota.guarantee;
    if (guaranteed > c.tier0_budget_bytes) {
      return Invalid("[quotas] the guarantees add up to more than tier 0's budget " +
                     FormatBytes(c.tier0_budget_bytes) + " (at " + QuotaName(u) +
                     "): every guarantee must fit in tier 0 at once");
    }
  }
  std::set<std::pair<uint32_t, std::string>> names;
  for (const ClientQuota& q : c.client_quotas) {
    if (q.name.empty() || q.name.size() > 64) {
      return Invalid(
          "[quotas] a client quota's name must be 1 to 64 bytes (hello names are cut "
          "at 64)");
    }
    if (!names.insert({q.uid, q.name}).second) {
      return Invalid(QuotaName(q) +
                     " has two quotas (one [[quotas.client]] per uid and name; a user = "
                     "\"name\" entry counts as its uid)");
    }
    if (q.quota.guarantee) {
      return Invalid(QuotaName(q) +
                     ": a client has no guarantee (a user's guarantee covers its clients)");
    }
    if (Status st = ValidateQuota(QuotaName(q), q.quota, c.tier_nodes.size()); !st.ok()) {
      return st;
    }
  }
  return Status::Ok();
}

bool QuotaBytes::Unlimited() const {
  return guarantee == 0 &&
         std::all_of(caps.begin(), caps.end(), [](uint64_t c) { return c == kNoCapBytes; });
}

const QuotaBytes* DaemonConfig::UserQuotaOf(uint32_t uid) const {
  for (const UserQuota& u : user_quotas) {
    if (u.uid == uid) return &u.quota;
  }
  return nullptr;
}

const QuotaBytes* DaemonConfig::ClientQuotaOf(uint32_t uid, const std::string& name) const {
  for (const ClientQuota& q : client_quotas) {
    if (q.uid == uid && q.name == name) return &q.quota;
  }
  return nullptr;
}

std::vector<UserQuota> EffectiveUserQuotas(const DaemonConfig& c) {
  std::map<uint32_t, UserQuota> out;
  for (const UserQuota& u : c.user_quotas) out[u.uid] = u;
  std::set<uint32_t> explicit_uids;
  for (const UserQuota& u : c.user_quotas) explicit_uids.insert(u.uid);
  for (const ClientQuota& q : c.client_quotas) {
    if (explicit_uids.count(q.uid)) continue;
    auto [it, first] = out.try_emplace(q.uid);
    UserQuota& u = it->second;
    u.uid = q.uid;
    if (first) {
      u.quota.caps = q.quota.caps;
      continue;
    }
    // A tier is capped for the uid only where every one of its client
    // quotas caps it; the caps add up (each at most 1 EiB: no overflow).
    std::vector<uint64_t>& caps = u.quota.caps;
    caps.resize(std::min(caps.size(), q.quota.caps.size()));
    for (size_t k = 0; k < caps.size(); ++k) {
      caps[k] = caps[k] == kNoCapBytes || q.quota.caps[k] == kNoCapBytes
                    ? kNoCapBytes
                    : caps[k] + q.quota.caps[k];
    }
    TrimCaps(&caps);
  }
  std::vector<UserQuota> list;
  for (auto& [uid, u] : out) {
    if (!u.quota.Unlimited()) list.push_back(std::move(u));
  }
  return list;
}

Status CheckQuotaTiers(const DaemonConfig& c, size_t tiers) {
  auto check = [tiers](const std::string& who, const QuotaBytes& q) {
    if (q.caps.size() < tiers) return Status::Ok();
    return Invalid(who + ": caps for " + std::to_string(q.caps.size()) + " tiers, but this host " +
                   "has " + std::to_string(tiers) + " tiers and the last (tier " +
                   std::to_string(tiers - 1) +
                   ") is never capped: it holds every block that fits nowhere else");
  };
  for (const UserQuota& u : c.user_quotas) {
    if (Status st = check(QuotaName(u), u.quota); !st.ok()) return st;
  }
  for (const ClientQuota& q : c.client_quotas) {
    if (Status st = check(QuotaName(q), q.quota); !st.ok()) return st;
  }
  return Status::Ok();
}

engine::Quota ToEngineQuota(const QuotaBytes& q, uint64_t block_bytes, bool user) {
  engine::Quota out;
  for (size_t k = 0; k < q.caps.size() && k < out.cap.size(); ++k) {
    if (q.caps[k] != kNoCapBytes) out.cap[k] = static_cast<size_t>(q.caps[k] / block_bytes);
  }
  if (user) out.guarantee = static_cast<size_t>(q.guarantee / block_bytes);
  return out;
}

Status ParseQuotaArg(const std::string& arg, QuotaTarget* target, QuotaBytes* quota) {
  std::istringstream in(arg);
  std::string word;
  bool have_uid = false, have_client = false, none = false, have_tiers = false,
       have_guarantee = false;
  std::set<size_t> tiers_given;
  *quota = QuotaBytes{};
  std::vector<uint64_t> caps;
  auto cap_of = [](const std::string& v) -> std::optional<uint64_t> {
    if (v == "none") return kNoCapBytes;
    return ParseSize(v);
  };
  const std::string usage =
      " (usage: uid=N|user=NAME, with client=NAME for that uid's connections of that name, then "
      "tier0=SIZE, tierK=SIZE, tiers=SIZE,SIZE,..., guarantee=SIZE, or none)";
  while (in >> word) {
    const size_t eq = word.find('=');
    const std::string key = word.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : word.substr(eq + 1);
    if (eq == std::string::npos) {
      if (word != "none") return Invalid("quota: '" + word + "' is not key=value" + usage);
      none = true;
      continue;
    }
    if (key == "uid" || key == "user") {
      if (have_uid) return Invalid("quota: give one of uid= or user=");
      have_uid = true;
      if (key == "uid") {
        const std::optional<uint64_t> uid =
            value.find_first_not_of("0123456789") == std::string::npos && !value.empty() &&
                    value.size() <= 10
                ? std::optional<uint64_t>(std::stoull(value))
                : std::nullopt;
        if (!uid || *uid > 0xfffffffeull) return Invalid("quota: uid '" + value + "' is no uid");
        target->uid = static_cast<uint32_t>(*uid);
      } else if (key == "user") {
        const std::optional<uint32_t> uid = UidOfUser(value);
        if (!uid) return Invalid("quota: no user '" + value + "' in the password database");
        target->uid = *uid;
      }
    } else if (key == "client") {
      if (have_client) return Invalid("quota: give client= once");
      have_client = true;
      if (value.empty() || value.size() > 64) {
        return Invalid("quota: a client name must be 1 to 64 bytes");
      }
      target->client = value;
    } else if (key == "guarantee") {
      const std::optional<uint64_t> g = ParseSize(value);
      if (!g || have_guarantee) return Invalid("quota: guarantee=SIZE, once, e.g. guarantee=4GiB");
      have_guarantee = true;
      quota->guarantee = *g;
    } else if (key == "tiers") {
      if (have_tiers || !tiers_given.empty()) {
        return Invalid("quota: tiers= and tierK= name the same caps: give one or the other");
      }
      have_tiers = true;
      std::istringstream list(value);
      std::string item;
      while (std::getline(list, item, ',')) {
        const std::optional<uint64_t> c = cap_of(item);
        if (!c) return Invalid("quota: tiers=" + value + ": '" + item + "' is no size or none");
        caps.push_back(*c);
      }
      if (caps.empty()) return Invalid("quota: tiers= needs tier 0's cap at least");
    } else if (key.size() >= 5 && key.compare(0, 4, "tier") == 0 &&
               key.find_first_not_of("0123456789", 4) == std::string::npos && key.size() <= 5) {
      const size_t k = static_cast<size_t>(key[4] - '0');
      if (have_tiers || !tiers_given.insert(k).second) {
        return Invalid("quota: tier " + std::to_string(k) + "'s cap is given twice");
      }
      const std::optional<uint64_t> c = cap_of(value);
      if (!c) return Invalid("quota: " + word + ": '" + value + "' is no size or none");
      if (caps.size() <= k) caps.resize(k + 1, kNoCapBytes);
      caps[k] = *c;
    } else {
      return Invalid("quota: unknown key '" + key + "'" + usage);
    }
  }
  if (!have_uid) {
    return Invalid(have_client
                       ? "quota: client=" + target->client +
                             " needs uid= or user= too: whose connections of that name "
                             "(a hello's name is the client's own choice)"
                       : "quota: whose? give uid=, user= or client= with uid= or user=" + usage);
  }
  target->user = !have_client;
  if (!have_client) target->client.clear();
  if (none && (have_tiers || have_guarantee || !tiers_given.empty())) {
    return Invalid("quota: none removes the quota; it takes no caps");
  }
  if (!none && !have_tiers && !have_guarantee && tiers_given.empty()) {
    return Invalid("quota: no cap and no guarantee: give tier0=SIZE, guarantee=SIZE or none" +
                   usage);
  }
  if (!target->user && have_guarantee) {
    return Invalid("quota: a client has no guarantee (a user's guarantee covers its clients)");
  }
  TrimCaps(&caps);
  quota->caps = std::move(caps);
  return Status::Ok();
}

std::string DescribeQuota(const QuotaBytes& q) {
  std::string out;
  for (size_t k = 0; k < q.caps.size(); ++k) {
    if (q.caps[k] == kNoCapBytes) continue;
    out += (out.empty() ? "" : ", ") +
           ("tier " + std::to_string(k) + " cap " + FormatBytes(q.caps[k]));
  }
  if (q.guarantee) out += (out.empty() ? "" : ", ") + ("guarantee " + FormatBytes(q.guarantee));
  return out.empty() ? "no quota" : out;
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
                             {"hysteresis_ticks", c.hysteresis_ticks}}},
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
  return o;
}

}  // namespace cxltier::service
