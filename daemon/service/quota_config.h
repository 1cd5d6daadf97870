// The quotas of cxltierd's configuration, in bytes as the operator gives
// them (docs/operations.md, "Quotas"): their types, their checks, and
// `cxltierctl quota set`'s argument. quota_config.cpp reads [quotas];
// service/quotas.h applies them to the engine, in blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cxltier/status.h"
#include "engine/engine.h"

namespace cxltier::service {

struct DaemonConfig;

// A quota as the configuration gives it, in bytes (docs/operations.md,
// "Quotas"). The daemon converts it to blocks, rounding down, once the block
// size is known (ToEngineQuota).
inline constexpr uint64_t kNoCapBytes = UINT64_MAX;
struct QuotaBytes {
  // caps[k]: the most bytes of the account's blocks in tier k (kNoCapBytes:
  // none). Never one for the last tier, which holds every block that fits
  // nowhere else; trailing kNoCapBytes are dropped.
  std::vector<uint64_t> caps;
  uint64_t guarantee = 0;  // users only: tier-0 bytes other accounts' misses leave alone
  bool Unlimited() const;
  friend bool operator==(const QuotaBytes&, const QuotaBytes&) = default;
};
// [[quotas.user]]: a uid's quota (`user = "name"` is resolved to its uid at load).
struct UserQuota {
  uint32_t uid = 0;
  QuotaBytes quota;
  friend bool operator==(const UserQuota&, const UserQuota&) = default;
};
// [[quotas.client]]: the quota of the connections of `uid` whose hello names
// `name`, all of them together (no guarantee). A name is the client's own
// choice, so a client quota names its uid, and the uid's cap is on top: a
// uid with client quotas and no [[quotas.user]] is capped by their sum
// (EffectiveUserQuotas), so another name of the same uid escapes nothing.
struct ClientQuota {
  uint32_t uid = 0;
  std::string name;
  QuotaBytes quota;
  friend bool operator==(const ClientQuota&, const ClientQuota&) = default;
};

// Each quota's own checks, and that no two name the same account
// (DaemonConfig::Validate runs it).
Status ValidateQuotas(const DaemonConfig& config);

// What a host with `tiers` tiers can enforce: no quota caps the last tier
// (tier tiers-1) or a tier the host does not have. Validate() checks what it
// can without the host (at most 7 caps; fewer than [tiers] nodes names).
Status CheckQuotaTiers(const DaemonConfig& config, size_t tiers);

// Every uid's quota as the daemon applies it: each [[quotas.user]], and for
// each uid with client quotas but no [[quotas.user]] the uid's cap on top of
// them: in each tier the sum of its client quotas' caps there (no cap there
// if one of them has none), no guarantee. By uid.
std::vector<UserQuota> EffectiveUserQuotas(const DaemonConfig& config);

// The engine's quota for blocks of `block_bytes`: every byte figure divided
// by the block size, rounded down (a cap below one block is 0 blocks: none in
// that tier); `user`: with the guarantee (a client account has none).
engine::Quota ToEngineQuota(const QuotaBytes& quota, uint64_t block_bytes, bool user);

// `cxltierctl quota set`'s argument: whose quota ("uid=1001", "user=alice"
// resolved with the password database, or "client=vllm-0 uid=1001": that
// uid's connections named vllm-0, also with user=) and what it is,
// words separated by spaces: "tier0=8GiB", "tierK=SIZE", "tiers=8GiB,16GiB"
// (tiers 0, 1, ...; "none" for no cap on one), "guarantee=4GiB" (users
// only), or "none" alone to remove the quota (*quota is then unlimited).
// The quota replaces the account's whole quota. kBadPayload: what is wrong.
struct QuotaTarget {
  bool user = true;
  uint32_t uid = 0;    // the user, or the client's user
  std::string client;  // clients: the hello name
};
Status ParseQuotaArg(const std::string& arg, QuotaTarget* target, QuotaBytes* quota);
// "tier 0 cap 8.00 GiB, tier 1 cap 16.0 GiB, guarantee 4.00 GiB" (or "no quota").
std::string DescribeQuota(const QuotaBytes& quota);

}  // namespace cxltier::service
