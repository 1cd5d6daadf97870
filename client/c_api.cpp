// The C ABI over cxltier::Client.
#include "cxltier/cxltier.h"

#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cxltier/client.h"

struct cxltier_client {
  std::unique_ptr<cxltier::Client> client;
};

// A reader is one thread's.
struct cxltier_reader {
  std::unique_ptr<cxltier::Client::Reader> reader;
};

namespace {

// The message of this thread's last failed call (as errno is kept): calls
// on one client from several threads (observe, begin and end write, each
// reader's) never write the same string.
thread_local std::string last_error;

// Sets this thread's message (`what`, then `more`); without memory for it,
// an empty one.
void SetError(std::string_view what, std::string_view more = {}) noexcept {
  try {
    last_error.assign(what).append(more);
  } catch (...) {
    last_error.clear();
  }
}

int Result(const cxltier::Status& st) {
  if (st.ok()) {
    last_error.clear();
    return 0;
  }
  SetError(st.message);
  return -static_cast<int>(st.code);
}

// No C++ exception crosses the C ABI: `f`'s becomes an error code (an
// allocation that failed, or a count no vector can hold: too large).
template <typename F>
int Guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    SetError("too large: out of memory");
    return -CXLTIER_E_TOO_LARGE;
  } catch (const std::length_error&) {
    SetError("too large: more than a vector holds");
    return -CXLTIER_E_TOO_LARGE;
  } catch (const std::exception& e) {
    SetError("internal: ", e.what());
    return -CXLTIER_E_INTERNAL;
  } catch (...) {
    SetError("internal: an unknown exception");
    return -CXLTIER_E_INTERNAL;
  }
}

std::vector<cxltier::BlockKey> Keys(const cxltier_key* keys, size_t n) {
  std::vector<cxltier::BlockKey> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = {keys[i].hi, keys[i].lo};
  return k;
}

}  // namespace

extern "C" {

int cxltier_connect(const char* socket_path, const cxltier_model* model, uint32_t max_blocks,
                    const char* name, cxltier_client** out, char* errbuf, size_t errlen) {
  *out = nullptr;
  if (errbuf && errlen) errbuf[0] = '\0';
  const int rc = Guarded([&]() -> int {
    if (!socket_path || !model) {
      if (errbuf && errlen) std::snprintf(errbuf, errlen, "socket path and model are required");
      return -CXLTIER_E_BAD_PAYLOAD;
    }
    cxltier::Client::Options o;
    o.socket_path = socket_path;
    o.model = cxltier::ModelGeometry{"custom",           model->layers,   model->query_heads,
                                     model->kv_heads,    model->head_dim, model->dtype_bytes,
                                     model->block_tokens};
    o.max_blocks = max_blocks;
    o.name = name ? name : "";
    cxltier::Status st;
    auto client = cxltier::Client::Connect(o, &st);
    if (!client) {
      if (errbuf && errlen) std::snprintf(errbuf, errlen, "%s", st.message.c_str());
      return -static_cast<int>(st.code);
    }
    *out = new cxltier_client{std::move(client)};
    return 0;
  });
  if (rc < 0 && !*out && errbuf && errlen && errbuf[0] == '\0') {
    std::snprintf(errbuf, errlen, "%s", last_error.c_str());  // an exception's message
  }
  return rc;
}

void cxltier_close(cxltier_client* client) { delete client; }

const char* cxltier_last_error(const cxltier_client*) { return last_error.c_str(); }

int cxltier_register_memfd_pool(cxltier_client* c, int memfd, uint64_t length, uint64_t stride,
                                uint32_t blocks, uint32_t* pool_id) {
  return Guarded([&]() -> int {
    return Result(c->client->RegisterMemfdPool(memfd, length, stride, blocks, pool_id));
  });
}

int cxltier_register_range_pool(cxltier_client* c, const void* address, uint64_t length,
                                uint64_t stride, uint32_t blocks, uint32_t* pool_id) {
  return Guarded([&]() -> int {
    return Result(c->client->RegisterRangePool(address, length, stride, blocks, pool_id));
  });
}

int cxltier_admit(cxltier_client* c, uint32_t pool_id, const cxltier_key* keys,
                  const uint32_t* block_indexes, size_t n, uint32_t* slots) {
  return Guarded([&]() -> int {
    std::vector<cxltier::wire::AdmitEntry> entries(n);
    for (size_t i = 0; i < n; ++i) entries[i] = {{keys[i].hi, keys[i].lo}, block_indexes[i]};
    std::vector<cxltier::wire::AdmitResult> results;
    const int rc = Result(c->client->Admit(pool_id, entries, &results));
    if (rc == 0 && slots) {
      for (size_t i = 0; i < n; ++i) slots[i] = results[i].slot;
    }
    return rc;
  });
}

int cxltier_release(cxltier_client* c, const cxltier_key* keys, size_t n) {
  return Guarded([&]() -> int { return Result(c->client->Release(Keys(keys, n))); });
}

int cxltier_hint(cxltier_client* c, uint32_t group, int kind, const cxltier_key* keys, size_t n,
                 cxltier_hint_result* result) {
  return Guarded([&]() -> int {
    if (kind < 0 || kind > 255) {
      return Result(cxltier::Status::Fail(
          cxltier::wire::ErrorCode::kBadPayload,
          "bad-payload: unknown hint kind " + std::to_string(kind) + " (1 to 3)"));
    }
    cxltier::wire::HintOk ok;
    const int rc =
        Result(c->client->Hint(group, static_cast<cxltier::HintKind>(kind), Keys(keys, n), &ok));
    if (rc == 0 && result) *result = cxltier_hint_result{ok.grouped, ok.unknown, ok.applied};
    return rc;
  });
}

int cxltier_observe(cxltier_client* c, uint32_t slot, float mass) {
  if (c->client->Observe(slot, mass)) return 0;
  SetError("bad-slot: a slot or mass out of range");
  return -CXLTIER_E_BAD_SLOT;
}

int cxltier_tier(const cxltier_client* c, uint32_t slot) {
  const cxltier::Tier t = c->client->TierOf(slot);
  const unsigned k = cxltier::TierIndex(t);
  return k < cxltier::kMaxTiers ? static_cast<int>(k) : -1;
}

int cxltier_reconnect(cxltier_client* c) {
  return Guarded([&]() -> int { return Result(c->client->Reconnect()); });
}

int cxltier_slot_of(const cxltier_client* c, cxltier_key key, uint32_t* slot) {
  uint32_t s = 0;
  if (!c->client->SlotOf(cxltier::BlockKey{key.hi, key.lo}, &s)) {
    SetError("bad-slot: this client holds no such key");
    return -CXLTIER_E_BAD_SLOT;
  }
  if (slot) *slot = s;
  return 0;
}

int cxltier_create_tier_pools(cxltier_client* c, uint32_t blocks, const char* devdax_path,
                              uint64_t devdax_offset) {
  return Guarded([&]() -> int {
    cxltier::Client::TierPoolOptions o;
    o.blocks = blocks;
    if (devdax_path) o.devdax_path = devdax_path;
    o.devdax_offset = devdax_offset;
    return Result(c->client->CreateTierPools(o));
  });
}

int cxltier_tier_pool(const cxltier_client* c, int tier, uint32_t* pool_id, void** base,
                      uint64_t* bytes) {
  if (tier < 0 || tier >= static_cast<int>(cxltier::kMaxTiers)) {
    SetError("bad-pool: no such tier");
    return -CXLTIER_E_BAD_POOL;
  }
  const uint8_t t = static_cast<uint8_t>(tier);
  if (c->client->tier_pool(t) == UINT32_MAX) {
    SetError("not-ready: no pool for this tier (create them first)");
    return -CXLTIER_E_NOT_READY;
  }
  if (pool_id) *pool_id = c->client->tier_pool(t);
  if (base) *base = c->client->tier_pool_base(t);
  if (bytes) *bytes = c->client->tier_pool_bytes(t);
  return 0;
}

int cxltier_begin_write(cxltier_client* c, uint32_t slot, void** data) {
  uint8_t* p = nullptr;
  const int rc = Guarded([&]() -> int { return Result(c->client->BeginWrite(slot, &p)); });
  if (rc == 0 && data) *data = p;
  return rc;
}

int cxltier_end_write(cxltier_client* c, uint32_t slot) {
  return Guarded([&]() -> int { return Result(c->client->EndWrite(slot)); });
}

void* cxltier_write_address(const cxltier_client* c, uint32_t slot) {
  return c->client->WriteAddress(slot);
}

int cxltier_reader_new(cxltier_client* c, cxltier_reader** out) {
  return Guarded([&]() -> int {
    *out = nullptr;
    cxltier::Status st;
    auto r = c->client->NewReader(&st);
    if (!r) return Result(st);
    *out = new cxltier_reader{std::move(r)};
    return 0;
  });
}

void cxltier_reader_free(cxltier_reader* r) { delete r; }

int cxltier_lease_acquire(cxltier_reader* r, uint32_t slot, cxltier_lease* lease) {
  cxltier::Client::Reader::Lease l;
  const int rc = Guarded([&]() -> int { return Result(r->reader->Acquire(slot, &l)); });
  if (rc == 0) *lease = cxltier_lease{l.data, l.slot, l.entry};
  return rc;
}

int cxltier_lease_release(cxltier_reader* r, const cxltier_lease* lease) {
  cxltier::Client::Reader::Lease l;
  l.data = static_cast<const uint8_t*>(lease->data);
  l.slot = lease->slot;
  l.entry = lease->entry;
  return Guarded([&]() -> int { return Result(r->reader->Release(l)); });
}

const char* cxltier_reader_last_error(const cxltier_reader*) { return last_error.c_str(); }

}  // extern "C"
