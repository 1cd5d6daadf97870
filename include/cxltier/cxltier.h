/* libcxltier C ABI: opaque handles and error codes over the C++ client, so
 * Python (ctypes/cffi) or Rust serving engines can bind it.
 *
 * Every int-returning call gives 0 on success or a negative error code
 * (-CXLTIER_E_*, the wire protocol's codes); cxltier_last_error() then says why.
 * No C++ exception leaves a call: one that cannot allocate what it is asked
 * for returns -CXLTIER_E_TOO_LARGE.
 *
 * Threads: cxltier_observe, cxltier_tier, cxltier_begin_write and
 * cxltier_end_write may run on any thread, and each reader on its own; the
 * other calls on one client one at a time. cxltier_reconnect must run alone:
 * no other call on that client (observe and readers included) while it runs,
 * as it replaces the state segment they use. Free every reader before
 * cxltier_close. */
#ifndef CXLTIER_CXLTIER_H_
#define CXLTIER_CXLTIER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cxltier_client cxltier_client;

typedef struct cxltier_key {
  uint64_t hi;
  uint64_t lo;
} cxltier_key;

typedef struct cxltier_model {
  uint32_t layers, query_heads, kv_heads, head_dim, dtype_bytes, block_tokens;
} cxltier_model;

enum {
  CXLTIER_E_BAD_FRAME = 1,
  CXLTIER_E_BAD_VERSION = 2,
  CXLTIER_E_UNKNOWN_TYPE = 3,
  CXLTIER_E_TOO_LARGE = 4,
  CXLTIER_E_BAD_PAYLOAD = 5,
  CXLTIER_E_NOT_READY = 6,
  CXLTIER_E_BAD_POOL = 7,
  CXLTIER_E_LIMIT = 8,
  CXLTIER_E_BAD_SLOT = 9,
  CXLTIER_E_DENIED = 10,
  CXLTIER_E_INTERNAL = 11,
  CXLTIER_E_GEOMETRY = 12,
  CXLTIER_E_NO_LEASE = 13,
  CXLTIER_E_BUSY = 14
};

/* Connects and says hello. On failure *out is NULL and errbuf (if given) holds the reason. */
int cxltier_connect(const char* socket_path, const cxltier_model* model, uint32_t max_blocks,
                    const char* name, cxltier_client** out, char* errbuf, size_t errlen);
void cxltier_close(cxltier_client* client);
/* The message of this thread's last failed call ("" if none), as errno: a
 * later call on this thread, on any client or reader, replaces it. */
const char* cxltier_last_error(const cxltier_client* client);

int cxltier_register_memfd_pool(cxltier_client* client, int memfd, uint64_t length, uint64_t stride,
                                uint32_t blocks, uint32_t* pool_id);
int cxltier_register_range_pool(cxltier_client* client, const void* address, uint64_t length,
                                uint64_t stride, uint32_t blocks, uint32_t* pool_id);
/* Admits n keys held in blocks block_indexes[i] of the pool; slots[i] receives each slot. */
int cxltier_admit(cxltier_client* client, uint32_t pool_id, const cxltier_key* keys,
                  const uint32_t* block_indexes, size_t n, uint32_t* slots);
int cxltier_release(cxltier_client* client, const cxltier_key* keys, size_t n);

/* Scheduler hints about a group of this client's blocks (a sequence; `group`
 * is the client's own nonzero number for it): kind CXLTIER_HINT_IDLE,
 * CXLTIER_HINT_SOON or CXLTIER_HINT_DONE. The n keys (may be 0) join the group
 * first; then the hint applies to the whole group. Advice only: it can cost
 * only this client's user's blocks. result (may be NULL): keys grouped, keys
 * this client does not hold, and whether the group had blocks to apply it to.
 * -CXLTIER_E_BAD_PAYLOAD for another kind or group 0. */
enum { CXLTIER_HINT_IDLE = 1, CXLTIER_HINT_SOON = 2, CXLTIER_HINT_DONE = 3 };
typedef struct cxltier_hint_result {
  uint32_t grouped;
  uint32_t unknown;
  int applied;
} cxltier_hint_result;
int cxltier_hint(cxltier_client* client, uint32_t group, int kind, const cxltier_key* keys,
                 size_t n, cxltier_hint_result* result);
/* Shared-memory fast path: no syscall; one writer thread per slot.
 * Returns 0, or -CXLTIER_E_BAD_SLOT for a bad slot or a mass that is not finite, >= 0, <= 65535. */
int cxltier_observe(cxltier_client* client, uint32_t slot, float mass);
/* The block's tier: 0 = fast (DRAM), 1 = the next, ... (a host may have more than
 * two); -1 = not resident or bad slot. */
int cxltier_tier(const cxltier_client* client, uint32_t slot);
/* After the daemon restarted or dropped this client: connect again and admit
 * every held block. Copy mode: the tier pools go to the new daemon as they are,
 * every block stays where it is, held leases stay valid (Client::Reconnect);
 * a lease on an old place of a block keeps that place until released. */
int cxltier_reconnect(cxltier_client* client);
/* The slot `key` has now: slots change across cxltier_reconnect, so look a
 * held block's slot up again after one (a slot kept from before may name
 * another block). -CXLTIER_E_BAD_SLOT when this client does not hold the key. */
int cxltier_slot_of(const cxltier_client* client, cxltier_key key, uint32_t* slot);

/* ---- copy mode: a pool per tier, made by the daemon; blocks moved by copy ----
 * devdax_path: NULL (the daemon makes every pool) or "/dev/daxX.Y" (the last tier's). */
int cxltier_create_tier_pools(cxltier_client* client, uint32_t blocks, const char* devdax_path,
                              uint64_t devdax_offset);
/* Tier t's pool (0 .. the daemon's tiers - 1): its id (for cxltier_admit, block
 * index 0), mapping and length. */
int cxltier_tier_pool(const cxltier_client* client, int tier, uint32_t* pool_id, void** base,
                      uint64_t* bytes);
/* The write lease: the block stays at *data until cxltier_end_write. A block
 * just admitted into a tier pool comes with it: cxltier_write_address. */
int cxltier_begin_write(cxltier_client* client, uint32_t slot, void** data);
int cxltier_end_write(cxltier_client* client, uint32_t slot);
/* NULL unless this client holds the slot's write lease. */
void* cxltier_write_address(const cxltier_client* client, uint32_t slot);

/* Read leases, one reader per thread (at most 64 per client, 32 leases each). */
typedef struct cxltier_reader cxltier_reader;
typedef struct cxltier_lease {
  const void* data; /* the block's bytes, valid and unchanged until cxltier_lease_release */
  uint32_t slot;
  uint32_t entry;
} cxltier_lease;
int cxltier_reader_new(cxltier_client* client, cxltier_reader** out);
void cxltier_reader_free(cxltier_reader* reader);
int cxltier_lease_acquire(cxltier_reader* reader, uint32_t slot, cxltier_lease* lease);
int cxltier_lease_release(cxltier_reader* reader, const cxltier_lease* lease);
/* The message of this thread's last failed call ("" if none), as
 * cxltier_last_error: a reader is one thread's. */
const char* cxltier_reader_last_error(const cxltier_reader* reader);

#ifdef __cplusplus
}
#endif

#endif /* CXLTIER_CXLTIER_H_ */
