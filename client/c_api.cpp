// The C ABI over cxltier::Client.
#include "cxltier/cxltier.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cxltier/client.h"

struct cxltier_client {
  std::unique_ptr<cxltier::Client> client;
  std::string last_error;
};

// A reader is one thread's: its errors are its own (cxltier_reader_last_error).
struct cxltier_reader {
  std::unique_ptr<cxltier::Client::Reader> reader;
  std::string last_error;
};

namespace {

int Result(cxltier_client* c, const cxltier::Status& st) {
  if (st.ok()) {
    c->last_error.clear();
    return 0;
  }
  c->last_error = st.message;
  return -static_cast<int>(st.code);
}

int ReaderResult(cxltier_reader* r, const cxltier::Status& st) {
  r->last_error = st.message;
  return st.ok() ? 0 : -static_cast<int>(st.code);
}

}  // namespace

extern "C" {

int cxltier_connect(const char* socket_path, const cxltier_model* model, uint32_t max_blocks,
                    const char* name, cxltier_client** out, char* errbuf, size_t errlen) {
  *out = nullptr;
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
  *out = new cxltier_client{std::move(client), {}};
  return 0;
}

void cxltier_close(cxltier_client* client) { delete client; }

const char* cxltier_last_error(const cxltier_client* client) {
  return client ? client->last_error.c_str() : "";
}

int cxltier_register_memfd_pool(cxltier_client* c, int memfd, uint64_t length, uint64_t stride,
                                uint32_t blocks, uint32_t* pool_id) {
  return Result(c, c->client->RegisterMemfdPool(memfd, length, stride, blocks, pool_id));
}

int cxltier_register_range_pool(cxltier_client* c, const void* address, uint64_t length,
                                uint64_t stride, uint32_t blocks, uint32_t* pool_id) {
  return Result(c, c->client->RegisterRangePool(address, length, stride, blocks, pool_id));
}

int cxltier_admit(cxltier_client* c, uint32_t pool_id, const cxltier_key* keys,
                  const uint32_t* block_indexes, size_t n, uint32_t* slots) {
  std::vector<cxltier::wire::AdmitEntry> entries(n);
  for (size_t i = 0; i < n; ++i) entries[i] = {{keys[i].hi, keys[i].lo}, block_indexes[i]};
  std::vector<cxltier::wire::AdmitResult> results;
  const int rc = Result(c, c->client->Admit(pool_id, entries, &results));
  if (rc == 0 && slots) {
    for (size_t i = 0; i < n; ++i) slots[i] = results[i].slot;
  }
  return rc;
}

int cxltier_release(cxltier_client* c, const cxltier_key* keys, size_t n) {
  std::vector<cxltier::BlockKey> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = {keys[i].hi, keys[i].lo};
  return Result(c, c->client->Release(k));
}

int cxltier_hint(cxltier_client* c, uint32_t group, int kind, const cxltier_key* keys, size_t n,
                 cxltier_hint_result* result) {
  if (kind < 0 || kind > 255) {
    return Result(c, cxltier::Status::Fail(
                         cxltier::wire::ErrorCode::kBadPayload,
                         "bad-payload: unknown hint kind " + std::to_string(kind) + " (1 to 3)"));
  }
  std::vector<cxltier::BlockKey> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = {keys[i].hi, keys[i].lo};
  cxltier::wire::HintOk ok;
  const int rc = Result(c, c->client->Hint(group, static_cast<cxltier::HintKind>(kind), k, &ok));
  if (rc == 0 && result) *result = cxltier_hint_result{ok.grouped, ok.unknown, ok.applied};
  return rc;
}

int cxltier_observe(cxltier_client* c, uint32_t slot, float mass) {
  return c->client->Observe(slot, mass) ? 0 : -CXLTIER_E_BAD_SLOT;
}

int cxltier_tier(const cxltier_client* c, uint32_t slot) {
  const cxltier::Tier t = c->client->TierOf(slot);
  const unsigned k = cxltier::TierIndex(t);
  return k < cxltier::kMaxTiers ? static_cast<int>(k) : -1;
}

int cxltier_reconnect(cxltier_client* c) { return Result(c, c->client->Reconnect()); }

int cxltier_create_tier_pools(cxltier_client* c, uint32_t blocks, const char* devdax_path,
                              uint64_t devdax_offset) {
  cxltier::Client::TierPoolOptions o;
  o.blocks = blocks;
  if (devdax_path) o.devdax_path = devdax_path;
  o.devdax_offset = devdax_offset;
  return Result(c, c->client->CreateTierPools(o));
}

int cxltier_tier_pool(const cxltier_client* c, int tier, uint32_t* pool_id, void** base,
                      uint64_t* bytes) {
  if (tier < 0 || tier >= static_cast<int>(cxltier::kMaxTiers)) return -CXLTIER_E_BAD_POOL;
  const uint8_t t = static_cast<uint8_t>(tier);
  if (c->client->tier_pool(t) == UINT32_MAX) return -CXLTIER_E_NOT_READY;
  if (pool_id) *pool_id = c->client->tier_pool(t);
  if (base) *base = c->client->tier_pool_base(t);
  if (bytes) *bytes = c->client->tier_pool_bytes(t);
  return 0;
}

int cxltier_begin_write(cxltier_client* c, uint32_t slot, void** data) {
  uint8_t* p = nullptr;
  const int rc = Result(c, c->client->BeginWrite(slot, &p));
  if (rc == 0 && data) *data = p;
  return rc;
}

int cxltier_end_write(cxltier_client* c, uint32_t slot) {
  return Result(c, c->client->EndWrite(slot));
}

void* cxltier_write_address(const cxltier_client* c, uint32_t slot) {
  return c->client->WriteAddress(slot);
}

int cxltier_reader_new(cxltier_client* c, cxltier_reader** out) {
  *out = nullptr;
  cxltier::Status st;
  auto r = c->client->NewReader(&st);
  if (!r) return Result(c, st);
  *out = new cxltier_reader{std::move(r), {}};
  return 0;
}

void cxltier_reader_free(cxltier_reader* r) { delete r; }

int cxltier_lease_acquire(cxltier_reader* r, uint32_t slot, cxltier_lease* lease) {
  cxltier::Client::Reader::Lease l;
  const int rc = ReaderResult(r, r->reader->Acquire(slot, &l));
  if (rc == 0) *lease = cxltier_lease{l.data, l.slot, l.entry};
  return rc;
}

int cxltier_lease_release(cxltier_reader* r, const cxltier_lease* lease) {
  cxltier::Client::Reader::Lease l;
  l.data = static_cast<const uint8_t*>(lease->data);
  l.slot = lease->slot;
  l.entry = lease->entry;
  return ReaderResult(r, r->reader->Release(l));
}

const char* cxltier_reader_last_error(const cxltier_reader* r) {
  return r ? r->last_error.c_str() : "";
}

}  // extern "C"
