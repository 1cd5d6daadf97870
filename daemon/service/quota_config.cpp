// The quotas of cxltierd's configuration (docs/operations.md, "Quotas"):
// read from [quotas], checked, summed per uid, converted to blocks, and
// `cxltierctl quota set`'s argument parsed and described. service/quotas.h
// applies them to the engine.
#include "service/quota_config.h"

#include <fmt/format.h>
#include <pwd.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "cxltier/model.h"
#include "server/http.h"
#include "service/config.h"
#include "service/config_toml.h"

namespace cxltier::service {

using config_toml::IntOf;
using config_toml::Invalid;
using config_toml::TableReader;

namespace {

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

}  // namespace

// [quotas]: [[quotas.user]] and [[quotas.client]] tables.
Status config_toml::ReadQuotas(const toml::table& root, DaemonConfig* c) {
  Status error;  // the first problem any table reader finds
  const toml::node* n = root.get("quotas");
  if (!n) return Status::Ok();
  const toml::table* quotas = n->as_table();
  if (!quotas) {
    return Invalid("[quotas] must be a table (of [[quotas.user]] and [[quotas.client]] tables)");
  }
  for (const auto& [k, v] : *quotas) {
    const std::string key(k.str());
    if (key != "user" && key != "client") {
      return Invalid("unknown key '" + key +
                     "' in [quotas] (known: [[quotas.user]], [[quotas.client]])");
    }
    const toml::array* entries = v.as_array();
    if (!entries || !entries->is_array_of_tables()) {
      return Invalid("quotas." + key + " must be an array of tables: write [[quotas." + key + "]]");
    }
    std::vector<UserQuota>& users = c->user_quotas;
    std::vector<ClientQuota>& clients = c->client_quotas;
    if (key == "user") users.clear();
    if (key == "client") clients.clear();
    for (size_t i = 0; i < entries->size() && error.ok(); ++i) {
      const std::string label = "[[quotas." + key + "]] #" + std::to_string(i + 1);
      TableReader r(entries->get(i)->as_table(), label, &error);
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
        } else if (has_user && error.ok()) {
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
  return error;
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
    // (1 EiB): no overflow. The policy's set, where guarantees are kept, is
    // tier 0 less its landing room.
    guaranteed += u.quota.guarantee;
    const uint64_t set_bytes =
        c.tier0_budget_bytes - c.tier0_budget_bytes / 100 * std::min(c.landing_percent, 50u);
    if (guaranteed > set_bytes) {
      return Invalid(
          "[quotas] the guarantees add up to more than tier 0's budget less its "
          "landing room, " +
          FormatBytes(set_bytes) + " (at " + QuotaName(u) +
          "): every guarantee must fit in tier 0 at once, beside the room "
          "([engine] landing_percent) kept for new blocks");
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

}  // namespace cxltier::service
