#include "copy_pools.h"

#include <cstdio>
#include <string>

namespace cxltier::loadgen {

int CreateTierPools(Session& s) {
  Client::TierPoolOptions o;
  o.blocks = s.opt.blocks + s.held_room;
  o.devdax_path = s.opt.devdax;
  const Status st = s.client->CreateTierPools(o);
  if (!st.ok()) return Fail("tier pools: " + st.message);
  s.pool_id = s.client->tier_pool(0);
  for (uint8_t t = 0; t < s.client->tiers(); ++t) {
    if (!s.KernelKnows(t)) continue;
    s.off_node_before_pin +=
        PagesOffNodes(s.client->tier_pool_base(t), s.client->tier_pool_bytes(t), s.nodes.of(t));
  }
  return 0;
}

int PinTierPools(Session& s) {
  for (uint8_t t = 0; t < s.client->tiers(); ++t) {
    if (t + 1u == s.client->tiers() && !s.opt.devdax.empty()) {
      // io_uring pins only anonymous, shmem and hugetlb memory (cudaHostRegister pins
      // device-DAX too); the device is never migratable memory anyway.
      std::fprintf(stderr,
                   "cxltier-loadgen: the device-DAX pool is not pinned (io_uring "
                   "refuses file-backed memory)\n");
      continue;
    }
    if (Status st = s.pins.Add(s.client->tier_pool_base(t), s.client->tier_pool_bytes(t));
        !st.ok()) {
      return Fail("pinning the tier " + std::to_string(t) + " pool: " + st.message);
    }
    if (!s.KernelKnows(t)) continue;
    s.off_node_after_pin +=
        PagesOffNodes(s.client->tier_pool_base(t), s.client->tier_pool_bytes(t), s.nodes.of(t));
  }
  return 0;
}

int VerifyCopyBlocks(Session& s, Verified* v) {
  s.readers->Stop();
  v->seen = s.readers->counts();
  Status st;
  auto reader = s.client->NewReader(&st);
  if (!reader) return Fail(st.message);
  for (const auto& [k, b] : s.live) {
    Client::Reader::Lease lease;
    if (!reader->Acquire(b.second, &lease).ok()) {
      ++v->corrupt;
      continue;
    }
    uint64_t generation = 0;
    const uint64_t want = s.readers->generation(b.second);
    const bool whole = BlockIntact(lease.data, s.opt.block_bytes, &s.trace_keys[k], &generation);
    v->corrupt += !whole || generation != want;
    v->stale += whole && generation < want;
    ++v->verified;
    (void)reader->Release(lease);
  }
  return 0;
}

}  // namespace cxltier::loadgen
