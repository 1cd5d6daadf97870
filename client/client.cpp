#include "cxltier/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_set>

#include "cxltier/detail/fd_passing.h"
#include "cxltier/segment.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxltier {
namespace {

using wire::ErrorCode;

Status Sys(const std::string& what) {
  return Status::Fail(ErrorCode::kInternal, what + ": " + std::strerror(errno));
}

// Calls `send` with each part of `items` that the daemon takes in one
// request (at most `per_part`: wire::kMaxEntriesPerMessage keys, or
// wire::kMaxObservationsPerReport observations), in order, and once with
// none when `items` is empty; stops at the first error `send` returns.
template <typename T, typename Send>
Status InParts(std::span<const T> items, Send&& send,
               size_t per_part = wire::kMaxEntriesPerMessage) {
  size_t at = 0;
  do {
    const std::span<const T> part = items.subspan(at, std::min(items.size() - at, per_part));
    if (Status st = send(part); !st.ok()) return st;
    at += part.size();
  } while (at < items.size());
  return Status::Ok();
}

bool WriteAll(int fd, const uint8_t* p, size_t n, int send_fd) {
  while (n > 0) {
    const ssize_t w = detail::SendWithFd(fd, p, n, send_fd, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    send_fd = -1;  // sent with the first byte
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; the first fd that arrives is stored in *fd, others closed.
bool ReadAll(int sock, uint8_t* p, size_t n, int* fd) {
  while (n > 0) {
    const ssize_t r = detail::RecvWithFds(sock, p, n, 0, [fd](int got) {
      if (fd && *fd < 0) {
        *fd = got;
      } else {
        close(got);
      }
    });
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {
      errno = ECONNRESET;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

std::unique_ptr<Client> Client::Connect(const Options& options, Status* status) {
  std::unique_ptr<Client> c(new Client());
  c->options_ = options;
  *status = c->Open();
  if (!status->ok()) return nullptr;
  return c;
}

Client::~Client() {
  for (TierPoolMap& t : tier_pools_) {
    if (t.base) munmap(t.base, t.bytes);
    if (t.fd >= 0) close(t.fd);
  }
  Unmap();
  if (carried_.base) munmap(carried_.base, carried_.bytes);
  if (sock_ >= 0) close(sock_);
  for (PoolRecord& p : pools_) {
    if (p.fd >= 0) close(p.fd);
  }
}

void Client::Unmap() {
  if (segment_) munmap(segment_, segment_bytes_);
  segment_ = nullptr;
  slots_ = 0;
}

Status Client::DaemonStats(const std::string& socket_path, const std::string& what,
                           std::string* json) {
  Client c;
  c.options_.socket_path = socket_path;
  if (Status st = c.ConnectSocket(); !st.ok()) return st;
  return c.Stats(what, json);
}

Status Client::DaemonAdmin(const std::string& socket_path, wire::AdminOp op, const std::string& arg,
                           std::string* text, int* fd) {
  Client c;
  c.options_.socket_path = socket_path;
  if (Status st = c.ConnectSocket(); !st.ok()) return st;
  wire::AdminOk ok;
  int got = -1;
  Status st = c.Call(wire::Admin{op, arg}, wire::MsgType::kAdminOk, &ok, -1, &got);
  if (fd) {
    *fd = st.ok() ? got : -1;
  }
  if (got >= 0 && (!fd || !st.ok())) close(got);
  if (!st.ok()) return st;
  if (text) *text = ok.text;
  return Status::Ok();
}

Status Client::ConnectSocket() {
  if (sock_ >= 0) close(sock_);
  sock_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock_ < 0) return Sys("socket");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options_.socket_path.size() >= sizeof(addr.sun_path)) {
    return Status::Fail(ErrorCode::kInternal, "socket path too long");
  }
  std::strcpy(addr.sun_path, options_.socket_path.c_str());
  if (connect(sock_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Sys("connect to " + options_.socket_path);
  }
  return Status::Ok();
}

Status Client::Open(MappedSegment* previous) {
  if (Status st = ConnectSocket(); !st.ok()) return st;
  // Until the new segment is mapped and checked, the client is as it was:
  // a failure closes the new connection and changes nothing else.
  auto fail = [this](Status st) {
    close(sock_);
    sock_ = -1;
    return st;
  };
  wire::Hello hello{options_.model, options_.max_blocks, options_.name};
  wire::HelloOk ok;
  int fd = -1;
  if (Status st = Call(hello, wire::MsgType::kHelloOk, &ok, -1, &fd); !st.ok()) {
    if (fd >= 0) close(fd);
    return fail(st);
  }
  if (fd < 0) {
    return fail(Status::Fail(ErrorCode::kInternal, "hello answered without a segment fd"));
  }
  const uint64_t bytes = SegmentBytes(ok.slots);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return fail(Sys("mapping the state segment"));
  const auto* h = static_cast<const SegmentHeader*>(p);
  if (h->magic != kSegmentMagic || h->version != kSegmentVersion || h->slots != ok.slots ||
      ok.slot_offset != kSegmentSlotOffset || h->dirty_offset != SegmentDirtyOffset(ok.slots) ||
      h->location_offset != SegmentLocationOffset(ok.slots) ||
      h->lease_offset != SegmentLeaseOffset(ok.slots)) {
    munmap(p, bytes);
    return fail(Status::Fail(ErrorCode::kInternal, "state segment header does not match"));
  }
  if (previous) {
    *previous = MappedSegment{segment_, segment_bytes_, slots_};
    segment_ = nullptr;
    slots_ = 0;
  } else {
    Unmap();
  }
  segment_ = p;
  segment_bytes_ = bytes;
  slots_ = ok.slots;
  client_id_ = ok.client_id;
  block_bytes_ = ok.block_bytes;
  tick_ms_ = ok.tick_ms;
  tiers_ = ok.tiers;
  return Status::Ok();
}

template <typename Req, typename Resp>
Status Client::Call(const Req& req, wire::MsgType want, Resp* resp, int send_fd, int* recv_fd) {
  if (sock_ < 0) return Status::Fail(ErrorCode::kNotReady, "not connected");
  std::vector<uint8_t> buf;
  const uint32_t id = next_request_++;
  wire::Encode(req, id, buf);
  // A daemon that refuses the connection (a limit) answers with an Error and
  // closes, possibly before our request is written: read its answer anyway.
  const bool sent = WriteAll(sock_, buf.data(), buf.size(), send_fd);
  const Status send_error = sent ? Status::Ok() : Sys("sending to cxltierd");
  uint8_t head[wire::kHeaderBytes];
  if (!ReadAll(sock_, head, sizeof(head), recv_fd)) {
    return sent ? Sys("reading from cxltierd") : send_error;
  }
  const wire::Header h = *wire::DecodeHeader(head);
  if (h.magic != wire::kMagic || h.payload_bytes > (256u << 20)) {
    return Status::Fail(ErrorCode::kBadFrame, "cxltierd sent a bad frame");
  }
  std::vector<uint8_t> payload(h.payload_bytes);
  if (!ReadAll(sock_, payload.data(), payload.size(), recv_fd)) return Sys("reading from cxltierd");
  if (h.type == wire::MsgType::kError) {
    wire::Error e;
    if (Status st = wire::Decode(payload, &e); !st.ok()) return st;
    return e.Context(std::string(wire::ErrorName(e.code)) + ": ");
  }
  if (!sent) return send_error;
  if (h.type != want || h.request_id != id) {
    return Status::Fail(ErrorCode::kBadFrame, "unexpected answer from cxltierd");
  }
  return wire::Decode(payload, resp);
}

Status Client::RegisterPool(const wire::RegisterPool& m, int fd, uint32_t* pool_id,
                            std::array<uint64_t, kMaxTiers>* tier_nodes) {
  wire::RegisterPoolOk ok;
  if (Status st = Call(m, wire::MsgType::kRegisterPoolOk, &ok, fd); !st.ok()) return st;
  *pool_id = ok.pool_id;
  *tier_nodes = {};
  if (m.kind == wire::PoolKind::kRange && tiers_ >= 1 && tiers_ <= kMaxTiers &&
      ok.tier_nodes[tiers_ - 1] != 0) {
    *tier_nodes = ok.tier_nodes;
    SteerNewPages(m.address, m.length, ok.tier_nodes[tiers_ - 1]);
  }
  return Status::Ok();
}

// The daemon's answer for an address-range pool: where its new pages go,
// the last tier for the whole range at registration, then each admitted
// block's tier for its range (Admit), so that tier 0 holds no more than its
// budget. Policy only (flags 0): pages already written stay where they are,
// and the daemon moves them. MPOL_PREFERRED_MANY for several nodes; a kernel
// before 5.15 takes the lowest alone. A policy belongs to the mapping: a
// range not (wholly) mapped now, or mapped again later, is not steered
// (mbind fails or is undone), and its pages land where first touched, as
// without it.
void Client::SteerNewPages(uint64_t address, uint64_t length, uint64_t nodes) {
  constexpr int kPreferred = 1, kPreferredMany = 5;  // MPOL_* of <linux/mempolicy.h>
  const unsigned long mask = nodes;
  const bool many = (nodes & (nodes - 1)) != 0;
  long rc = syscall(SYS_mbind, address, length, many ? kPreferredMany : kPreferred, &mask, 65, 0);
  if (rc != 0 && errno == EINVAL && many) {
    const unsigned long lowest = nodes & -nodes;
    (void)syscall(SYS_mbind, address, length, kPreferred, &lowest, 65, 0);
  }
}

// An address range's admitted blocks: each block's pages that do not exist
// yet go to the tier the daemon answered (tier 0 when it placed the block
// there, within its budget). Write a block after its admission for this to
// count; one written before was admitted where its pages already are.
void Client::SteerAdmitted(uint32_t pool_id, std::span<const wire::AdmitEntry> entries,
                           const std::vector<wire::AdmitResult>& results) {
  if (pool_id >= pools_.size()) return;
  const PoolRecord& p = pools_[pool_id];
  if (p.reg.kind != wire::PoolKind::kRange || p.tier_nodes[0] == 0) return;
  for (size_t i = 0; i < entries.size() && i < results.size(); ++i) {
    const unsigned t = TierIndex(results[i].tier);
    if (entries[i].block_index >= p.reg.blocks || t >= kMaxTiers || p.tier_nodes[t] == 0) continue;
    const uint64_t at = uint64_t{entries[i].block_index} * p.reg.stride;
    if (at >= p.reg.length) continue;
    SteerNewPages(p.reg.address + at, std::min(p.reg.stride, p.reg.length - at), p.tier_nodes[t]);
  }
}

Status Client::RegisterMemfdPool(int memfd, uint64_t length, uint64_t stride, uint32_t blocks,
                                 uint32_t* pool_id) {
  // The daemon takes only memfds that cannot shrink under its mapping. If
  // this fails (no MFD_ALLOW_SEALING, or F_SEAL_SEAL), the daemon's refusal
  // says how to fix it.
  (void)fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK);
  const wire::RegisterPool m{wire::PoolKind::kMemfd, 0, length, stride, blocks};
  // Our duplicate, for a reconnect, taken first: without it every later
  // Reconnect would fail.
  const int dup = fcntl(memfd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return Sys("duplicating the pool's memfd");
  std::array<uint64_t, kMaxTiers> nodes;
  if (Status st = RegisterPool(m, memfd, pool_id, &nodes); !st.ok()) {
    close(dup);
    return st;
  }
  pools_.resize(std::max<size_t>(pools_.size(), *pool_id + 1));
  pools_[*pool_id] = PoolRecord{m, dup, -1, nodes};
  return Status::Ok();
}

Status Client::RegisterRangePool(const void* address, uint64_t length, uint64_t stride,
                                 uint32_t blocks, uint32_t* pool_id) {
  const wire::RegisterPool m{wire::PoolKind::kRange, reinterpret_cast<uintptr_t>(address), length,
                             stride, blocks};
  std::array<uint64_t, kMaxTiers> nodes;
  if (Status st = RegisterPool(m, -1, pool_id, &nodes); !st.ok()) return st;
  pools_.resize(std::max<size_t>(pools_.size(), *pool_id + 1));
  pools_[*pool_id] = PoolRecord{m, -1, -1, nodes};
  return Status::Ok();
}

Status Client::Admit(uint32_t pool_id, std::span<const wire::AdmitEntry> entries,
                     std::vector<wire::AdmitResult>* results) {
  ReleaseParked();
  std::vector<wire::AdmitResult> all;
  all.reserve(entries.size());
  const Status sent = InParts(entries, [&](std::span<const wire::AdmitEntry> part) {
    wire::Admit m{pool_id, std::vector<wire::AdmitEntry>(part.begin(), part.end())};
    wire::AdmitOk ok;
    if (Status st = Call(m, wire::MsgType::kAdmitOk, &ok); !st.ok()) return st;
    if (ok.results.size() != part.size()) {
      return Status::Fail(ErrorCode::kBadPayload, "admit answered for a different number of keys");
    }
    for (size_t i = 0; i < part.size(); ++i) {
      Held& h = held_[part[i].key];  // a key held already keeps its group
      h.pool = pool_id;
      h.block = part[i].block_index;
      h.slot = ok.results[i].slot;
    }
    SteerAdmitted(pool_id, part, ok.results);
    all.insert(all.end(), ok.results.begin(), ok.results.end());
    return Status::Ok();
  });
  if (!sent.ok()) return sent;
  if (results) *results = std::move(all);
  return Status::Ok();
}

// ---- copy mode ----

static_assert(kLeaseRows == 64 && kLeasesPerRow == 32,
              "the row and entry masks are 64 and 32 bits");

uint64_t* Client::location_words() const {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(segment_) + SegmentLocationOffset(slots_));
}

LeaseEntry* Client::lease_row(uint32_t row) const {
  return reinterpret_cast<LeaseEntry*>(static_cast<char*>(segment_) + SegmentLeaseOffset(slots_)) +
         uint64_t{row} * kLeasesPerRow;
}

namespace {

// The client's device-DAX device, to pass with a CreateTierPool.
Status OpenDevdax(const std::string& path, int* fd) {
  *fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (*fd >= 0) return Status::Ok();
  return Status::Fail(ErrorCode::kBadPool, "cannot open " + path + ": " + std::strerror(errno));
}

}  // namespace

Status Client::CreateTierPool(uint8_t tier, const TierPoolOptions& o, uint64_t stride) {
  const std::string what = "tier " + std::to_string(tier) + " pool: ";
  // The daemon made it before and our mapping failed: map it again (the
  // daemon holds one tier pool per tier and connection).
  if (tier_pools_[tier].id != UINT32_MAX) return MapTierPool(tier).Context(what);
  wire::CreateTierPool m;
  m.tier = tier;
  m.blocks = o.blocks;
  m.stride = stride;
  int send_fd = -1;
  const bool devdax = tier + 1u == tiers_ && !o.devdax_path.empty();
  if (devdax) {
    m.source = wire::TierPoolSource::kDevdax;
    m.offset = o.devdax_offset;
    if (Status st = OpenDevdax(o.devdax_path, &send_fd); !st.ok()) return st;
  }
  wire::CreateTierPoolOk ok;
  int fd = -1;
  Status st = Call(m, wire::MsgType::kCreateTierPoolOk, &ok, send_fd, &fd);
  if (st.ok() && !devdax && fd < 0) {
    st = Status::Fail(ErrorCode::kInternal, "the tier pool came without its fd");
  }
  if (!st.ok()) {
    if (fd >= 0) close(fd);
    if (send_fd >= 0) close(send_fd);
    return st.Context(what);
  }
  // The pool's fd is kept: the daemon's memfd, or the device-DAX device the
  // daemon checked (never opened again by path: that could be another device
  // by now). A retried mapping and a reconnect use it. Recorded before it is
  // mapped: if mapping fails, the daemon still holds the pool, and the next
  // CreateTierPools maps it instead of asking again.
  if (devdax && fd >= 0) close(fd);  // the device is ours; a daemon sends no fd for it
  tier_pools_[tier] = TierPoolMap{ok.pool_id,
                                  nullptr,
                                  ok.bytes,
                                  ok.blocks,
                                  devdax ? send_fd : fd,
                                  devdax ? o.devdax_path : "",
                                  devdax ? o.devdax_offset : 0};
  pools_.resize(std::max<size_t>(pools_.size(), ok.pool_id + 1));
  pools_[ok.pool_id] = PoolRecord{{}, -1, tier};
  tier_stride_ = stride;
  return MapTierPool(tier).Context(what);
}

Status Client::MapTierPool(uint8_t tier) {
  TierPoolMap& t = tier_pools_[tier];
  void* p = mmap(nullptr, t.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, t.fd,
                 t.devdax_path.empty() ? 0 : static_cast<off_t>(t.devdax_offset));
  Status st = p == MAP_FAILED ? Sys("mapping it") : Status::Ok();
  // Map every page now (the daemon placed them all): pinning it later, or
  // asking the kernel where it is, finds every page in this process's tables.
  if (st.ok() && madvise(p, t.bytes, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
    st = Sys("faulting it in");
    munmap(p, t.bytes);
  }
  if (st.ok()) t.base = static_cast<uint8_t*>(p);
  return st;
}

Status Client::CreateTierPools(const TierPoolOptions& o) {
  if (!segment_) return Status::Fail(ErrorCode::kNotReady, "not connected");
  if (tiers_ < 2 || tiers_ > kMaxTiers) {
    return Status::Fail(ErrorCode::kInternal,
                        "the daemon said it has " + std::to_string(tiers_) + " tiers");
  }
  if (copy_mode() && std::all_of(tier_pools_.begin(), tier_pools_.begin() + tiers_,
                                 [](const TierPoolMap& t) { return t.base != nullptr; })) {
    return Status::Fail(ErrorCode::kBadPool, "this client has its tier pools already");
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t stride = o.stride ? o.stride : (block_bytes_ + page - 1) / page * page;
  if (tier_stride_ && stride != tier_stride_) {
    return Status::Fail(ErrorCode::kBadPool, "every tier pool needs the same stride");
  }
  // The last tier first: a device-DAX path or a size limit is what most
  // often refuses, and then nothing is taken from the faster tiers' budgets.
  // A tier made before a refusal stays; calling again makes only what is
  // missing.
  for (uint8_t t = static_cast<uint8_t>(tiers_); t-- > 0;) {
    if (tier_pools_[t].base) continue;
    if (Status st = CreateTierPool(t, o, stride); !st.ok()) return st;
  }
  return Status::Ok();
}

uint32_t Client::tier_pool(uint8_t tier) const {
  // A pool the daemon made but this client could not map is not one yet.
  return tier < kMaxTiers && tier_pools_[tier].base ? tier_pools_[tier].id : UINT32_MAX;
}
uint8_t* Client::tier_pool_base(uint8_t tier) const {
  return tier < kMaxTiers ? tier_pools_[tier].base : nullptr;
}
uint64_t Client::tier_pool_bytes(uint8_t tier) const {
  return tier < kMaxTiers ? tier_pools_[tier].bytes : 0;
}
bool Client::copy_mode() const {
  return std::any_of(tier_pools_.begin(), tier_pools_.end(),
                     [](const TierPoolMap& t) { return t.base != nullptr; });
}

Location Client::LocationOf(uint32_t slot) const {
  if (slot >= slots_) return Location{};
  return DecodeLocation(
      std::atomic_ref<uint64_t>(location_words()[slot]).load(std::memory_order_acquire));
}

namespace {

// The daemon published a place this client has no pool for (it never does;
// the segment is writable by the client's own threads, though).
Status OutsidePools(uint32_t slot) {
  return Status::Fail(ErrorCode::kInternal,
                      "slot " + std::to_string(slot) + " names a place outside the tier pools");
}

Status NoPlace(uint32_t slot) {
  return Status::Fail(ErrorCode::kNoLease,
                      "slot " + std::to_string(slot) + " holds no block in copy mode");
}

}  // namespace

uint8_t* Client::PlaceAddress(const Location& where) const {
  if (where.tier >= kMaxTiers) return nullptr;
  const TierPoolMap& t = tier_pools_[where.tier];
  if (!t.base || uint64_t{where.index + 1} * tier_stride_ > t.bytes) return nullptr;
  return t.base + uint64_t{where.index} * tier_stride_;
}

Status Client::BeginWrite(uint32_t slot, uint8_t** data) {
  if (slot >= slots_) return NoPlace(slot);
  Location where;
  switch (cxltier::BeginWrite(location_words(), slot, &where)) {
    case WriteStart::kNoPlace:
      return NoPlace(slot);
    case WriteStart::kAlreadyWriting:
      return Status::Fail(ErrorCode::kBusy,
                          "slot " + std::to_string(slot) + ": the write lease is held already");
    case WriteStart::kOk:
      break;
  }
  uint8_t* p = PlaceAddress(where);
  if (!p) {
    cxltier::EndWrite(location_words(), slot);
    return OutsidePools(slot);
  }
  *data = p;
  return Status::Ok();
}

uint8_t* Client::WriteAddress(uint32_t slot) const {
  if (slot >= slots_) return nullptr;
  const uint64_t w =
      std::atomic_ref<uint64_t>(location_words()[slot]).load(std::memory_order_acquire);
  return (w & kLocWriting) ? PlaceAddress(DecodeLocation(w)) : nullptr;
}

Status Client::EndWrite(uint32_t slot) {
  if (slot >= slots_ || !cxltier::EndWrite(location_words(), slot)) {
    return Status::Fail(ErrorCode::kNoLease,
                        "slot " + std::to_string(slot) + ": EndWrite without BeginWrite");
  }
  return Status::Ok();
}

std::unique_ptr<Client::Reader> Client::NewReader(Status* status) {
  std::lock_guard lock(rows_mu_);
  if (!segment_ || rows_used_ == ~uint64_t{0}) {
    *status = Status::Fail(
        ErrorCode::kBusy, segment_ ? "all " + std::to_string(kLeaseRows) + " reader rows are in use"
                                   : "not connected");
    return nullptr;
  }
  const uint32_t row = static_cast<uint32_t>(__builtin_ctzll(~rows_used_));
  rows_used_ |= uint64_t{1} << row;
  *status = Status::Ok();
  auto r = std::unique_ptr<Reader>(new Reader(this, row));
  readers_[row] = r.get();
  return r;
}

Client::Reader::~Reader() {
  LeaseEntry* row = client_->lease_row(row_);
  for (uint32_t e = 0; e < kLeasesPerRow; ++e) {
    if (used_ & (1u << e)) ReleaseRead(&row[e]);
  }
  std::lock_guard lock(client_->rows_mu_);
  client_->rows_used_ &= ~(uint64_t{1} << row_);
  client_->readers_[row_] = nullptr;
}

Status Client::Reader::Acquire(uint32_t slot, Lease* lease) {
  if (slot >= client_->slots_) return NoPlace(slot);
  if (used_ == ~0u) {
    return Status::Fail(ErrorCode::kBusy, "this reader holds " + std::to_string(kLeasesPerRow) +
                                              " leases already; release one");
  }
  const uint32_t e = static_cast<uint32_t>(__builtin_ctz(~used_));
  LeaseEntry* entry = &client_->lease_row(row_)[e];
  const uint64_t now = client_->daemon_ticks();
  Location where;
  if (!AcquireRead(client_->location_words(), entry, slot, now, &where)) return NoPlace(slot);
  const uint8_t* p = client_->PlaceAddress(where);
  if (!p) {
    ReleaseRead(entry);
    return OutsidePools(slot);
  }
  used_ |= 1u << e;
  data_[e] = p;
  *lease = Lease{p, slot, e, static_cast<Tier>(where.tier)};
  return Status::Ok();
}

Status Client::Reader::Release(const Lease& lease) {
  if (lease.entry >= kLeasesPerRow || !(used_ & (1u << lease.entry))) {
    return Status::Fail(ErrorCode::kNoLease, "release of a lease this reader does not hold");
  }
  // The bytes it was given, not the slot: a Reconnect carries a lease to the
  // block's new slot, and its bytes stay where they were.
  if (data_[lease.entry] != lease.data) {
    return Status::Fail(ErrorCode::kNoLease, "release of a lease on slot " +
                                                 std::to_string(lease.slot) +
                                                 " that this reader does not hold");
  }
  ReleaseRead(&client_->lease_row(row_)[lease.entry]);
  used_ &= ~(1u << lease.entry);
  data_[lease.entry] = nullptr;
  return Status::Ok();
}

Status Client::Release(std::span<const BlockKey> keys, wire::ReleaseOk* result) {
  ReleaseParked();
  wire::ReleaseOk total;
  const Status sent = InParts(keys, [&](std::span<const BlockKey> part) {
    wire::Release m{std::vector<BlockKey>(part.begin(), part.end())};
    wire::ReleaseOk ok;
    if (Status st = Call(m, wire::MsgType::kReleaseOk, &ok); !st.ok()) return st;
    for (const BlockKey& k : part) held_.erase(k);
    total.released += ok.released;
    total.unknown += ok.unknown;
    return Status::Ok();
  });
  if (!sent.ok()) return sent;
  if (result) *result = total;
  return Status::Ok();
}

Status Client::Hint(uint32_t group, HintKind kind, std::span<const BlockKey> keys,
                    wire::HintOk* result) {
  wire::HintOk total;
  // Each part joins its keys and applies the hint, the last with all of them in.
  const Status sent = InParts(keys, [&](std::span<const BlockKey> part) {
    wire::Hint m{kind, group, std::vector<BlockKey>(part.begin(), part.end())};
    wire::HintOk ok;
    if (Status st = Call(m, wire::MsgType::kHintOk, &ok); !st.ok()) return st;
    total.grouped += ok.grouped;
    total.unknown += ok.unknown;
    total.applied = ok.applied;
    return Status::Ok();
  });
  if (!sent.ok()) return sent;
  // Remembered for Reconnect: the daemon grouped the keys this client holds.
  for (const BlockKey& k : keys) {
    if (auto it = held_.find(k); it != held_.end()) it->second.group = group;
  }
  group_hints_[group] = kind;
  // Groups whose keys were all released (a group per sequence, hinted done and
  // released) are forgotten now and then, so that the map follows what is held.
  if (group_hints_.size() > 2 * held_.size() + 64) {
    std::unordered_set<uint32_t> in_use;
    for (const auto& [k, h] : held_) in_use.insert(h.group);
    std::erase_if(group_hints_, [&](const auto& g) { return !in_use.contains(g.first); });
  }
  if (result) *result = total;
  return Status::Ok();
}

bool Client::Observe(uint32_t slot, float mass) {
  if (slot >= slots_) return false;
  auto* base = static_cast<char*>(segment_);
  return AddObservation(reinterpret_cast<BlockState*>(base + kSegmentSlotOffset),
                        reinterpret_cast<uint64_t*>(base + SegmentDirtyOffset(slots_)), slot, mass);
}

Status Client::Report(std::span<const wire::Observation> observations, wire::ReportOk* result) {
  // In parts of kMaxObservationsPerReport: one frame stays within what the
  // daemon reads at once (wire::kDefaultMaxPayload).
  wire::ReportOk total;
  const Status sent = InParts(
      observations,
      [&](std::span<const wire::Observation> part) {
        wire::Report m{std::vector<wire::Observation>(part.begin(), part.end())};
        wire::ReportOk ok;
        if (Status st = Call(m, wire::MsgType::kReportOk, &ok); !st.ok()) return st;
        total.accepted += ok.accepted;
        total.rejected += ok.rejected;
        return Status::Ok();
      },
      wire::kMaxObservationsPerReport);
  if (result) *result = total;  // on an error, what the parts before it applied
  return sent;
}

const BlockState* Client::SlotState(uint32_t slot) const {
  if (slot >= slots_) return nullptr;
  return reinterpret_cast<const BlockState*>(static_cast<const char*>(segment_) +
                                             kSegmentSlotOffset) +
         slot;
}

Tier Client::TierOf(uint32_t slot) const {
  const BlockState* s = SlotState(slot);
  return s ? ReadTier(s) : Tier::kNone;
}

uint32_t Client::SlotOf(const BlockKey& key) const {
  auto it = held_.find(key);
  return it == held_.end() ? UINT32_MAX : it->second.slot;
}

uint64_t Client::daemon_ticks() const {
  if (!segment_) return 0;
  return std::atomic_ref<uint64_t>(static_cast<SegmentHeader*>(segment_)->daemon_ticks)
      .load(std::memory_order_relaxed);
}

Status Client::QueryTiers(std::span<const BlockKey> keys, std::vector<Tier>* tiers) {
  std::vector<Tier> all;
  all.reserve(keys.size());
  const Status sent = InParts(keys, [&](std::span<const BlockKey> part) {
    wire::QueryTiers m{std::vector<BlockKey>(part.begin(), part.end())};
    wire::QueryTiersOk ok;
    if (Status st = Call(m, wire::MsgType::kQueryTiersOk, &ok); !st.ok()) return st;
    if (ok.tiers.size() != part.size()) {
      return Status::Fail(wire::ErrorCode::kBadPayload,
                          "QueryTiersOk answered " + std::to_string(ok.tiers.size()) +
                              " tiers for " + std::to_string(part.size()) + " keys");
    }
    all.insert(all.end(), ok.tiers.begin(), ok.tiers.end());
    return Status::Ok();
  });
  if (!sent.ok()) return sent;
  *tiers = std::move(all);
  return Status::Ok();
}

Status Client::Stats(const std::string& what, std::string* json) {
  wire::StatsOk ok;
  if (Status st = Call(wire::Stats{what}, wire::MsgType::kStatsOk, &ok); !st.ok()) return st;
  *json = std::move(ok.json);
  return Status::Ok();
}

bool Client::SlotOf(const BlockKey& key, uint32_t* slot) const {
  auto it = held_.find(key);
  if (it == held_.end()) return false;
  *slot = it->second.slot;
  return true;
}

Status Client::Reconnect(uint64_t* restored) {
  if (restored) *restored = 0;
  const bool copy = copy_mode();
  // Copy mode: the previous segment is kept (carried_) until every block is
  // admitted again: its words say where each block is, its lease table what
  // the readers hold. A Reconnect that failed, in Open or after it, left it
  // the client's segment (below), and carried_ empty; only an exception out
  // of one leaves it in carried_, kept for this attempt.
  const auto was = std::tuple{client_id_, block_bytes_, tick_ms_, tiers_};
  if (Status st = Open(copy && !carried_.base ? &carried_ : nullptr); !st.ok()) return st;
  // On a failure below, the client is as before the attempt, so that its
  // slots name the blocks they named and the next attempt starts over from
  // the same record: held_ as it was, and the new daemon's session closed
  // (it forgets the blocks admitted so far; nothing of theirs is copied, as
  // each is admitted under its write lease). In copy mode the previous
  // segment is put back: its words still say where every block is, so a
  // read of SlotOf(key) between attempts gets that block's bytes. (Left with
  // the new segment and the old slots, a slot named whatever block the new
  // daemon put there: another block's bytes.) In page mode the new segment
  // stays mapped; its session is gone, so what is written there changes
  // nothing, and requests fail with kNotReady until a Reconnect succeeds.
  const std::unordered_map<BlockKey, Held, BlockKeyHash> held = held_;
  auto failed = [&](Status st) {
    std::tie(client_id_, block_bytes_, tick_ms_, tiers_) = was;
    held_ = held;
    parked_.clear();
    close(sock_);
    sock_ = -1;
    if (copy && carried_.base) {
      Unmap();
      segment_ = carried_.base;
      segment_bytes_ = carried_.bytes;
      slots_ = carried_.slots;
      carried_ = MappedSegment{};
    }
    return st;
  };
  parked_.clear();  // the old daemon's: a lease that still holds one is parked again
  for (uint32_t i = 0; i < pools_.size(); ++i) {
    uint32_t id = 0;
    Status st = pools_[i].tier >= 0
                    ? ReimportTierPool(pools_[i], &id)
                    : RegisterPool(pools_[i].reg, pools_[i].fd, &id, &pools_[i].tier_nodes);
    if (!st.ok()) return failed(st);
    if (id != i) {
      return failed(Status::Fail(ErrorCode::kInternal, "pool ids changed on reconnect"));
    }
  }
  // Admit everything again, pool by pool, in batches.
  held_.clear();
  std::vector<std::vector<wire::AdmitEntry>> by_pool(pools_.size());
  for (const auto& [k, h] : held) {
    if (pools_[h.pool].tier < 0) by_pool[h.pool].push_back({k, h.block});
  }
  for (uint32_t p = 0; p < by_pool.size(); ++p) {
    for (size_t i = 0; i < by_pool[p].size(); i += 4096) {
      const size_t n = std::min<size_t>(4096, by_pool[p].size() - i);
      std::vector<wire::AdmitResult> results;
      if (Status st = Admit(p, std::span(by_pool[p]).subspan(i, n), &results); !st.ok()) {
        return failed(st);
      }
      if (restored) {
        for (const auto& r : results) *restored += r.restored;
      }
    }
  }
  if (copy) {
    if (Status st = ReadmitCopyBlocks(carried_, held, restored); !st.ok()) return failed(st);
    munmap(carried_.base, carried_.bytes);
    carried_ = MappedSegment{};
  }
  // The groups, each with its last hint (groups with no held key are dropped).
  std::unordered_map<uint32_t, std::vector<BlockKey>> groups;
  for (const auto& [k, h] : held) {
    const auto it = held_.find(k);
    if (h.group == 0 || it == held_.end()) continue;  // released under a lost answer
    it->second.group = h.group;
    groups[h.group].push_back(k);
  }
  std::erase_if(group_hints_, [&](const auto& g) { return !groups.contains(g.first); });
  // Idle and done first, so that a soon finds the room they give up.
  for (const bool soon : {false, true}) {
    for (const auto& [group, keys] : groups) {
      const HintKind kind = group_hints_.at(group);
      if ((kind == HintKind::kSoon) != soon) continue;
      if (Status st = Hint(group, kind, keys); !st.ok()) return st;
    }
  }
  return Status::Ok();
}

namespace {

uint64_t* WordsOf(void* segment, uint32_t slots) {
  return reinterpret_cast<uint64_t*>(static_cast<char*>(segment) + SegmentLocationOffset(slots));
}
LeaseEntry* LeasesOf(void* segment, uint32_t slots) {
  return reinterpret_cast<LeaseEntry*>(static_cast<char*>(segment) + SegmentLeaseOffset(slots));
}
uint64_t LoadWord(uint64_t* words, uint32_t slot) {
  return std::atomic_ref<uint64_t>(words[slot]).load(std::memory_order_acquire);
}

}  // namespace

Status Client::ReimportTierPool(PoolRecord& record, uint32_t* id) {
  TierPoolMap& t = tier_pools_[static_cast<size_t>(record.tier)];
  wire::CreateTierPool m;
  m.tier = static_cast<uint8_t>(record.tier);
  m.blocks = t.blocks;
  m.stride = tier_stride_;
  // The fd this client's pool was made with (the device-DAX device the old
  // daemon checked, not the path opened again), or the daemon's memfd.
  if (!t.devdax_path.empty()) {
    m.source = wire::TierPoolSource::kDevdax;
    m.offset = t.devdax_offset;
  } else {
    m.source = wire::TierPoolSource::kImport;
  }
  wire::CreateTierPoolOk ok;
  int got = -1;
  Status st = Call(m, wire::MsgType::kCreateTierPoolOk, &ok, t.fd, &got);
  if (got >= 0) close(got);
  const std::string what = "tier " + std::to_string(record.tier) + " pool: ";
  if (!st.ok()) return st.Context(what);
  if (ok.blocks != t.blocks || ok.bytes != t.bytes) {
    return Status::Fail(ErrorCode::kInternal,
                        what + "the daemon took " + std::to_string(ok.blocks) + " blocks (" +
                            std::to_string(ok.bytes) + " bytes), not the pool's " +
                            std::to_string(t.blocks) + " (" + std::to_string(t.bytes) + ")");
  }
  t.id = ok.pool_id;
  *id = ok.pool_id;
  return Status::Ok();
}

// Every copy-mode block goes back to the place the old segment's word names
// (the new daemon takes it there: kAdmitAtPlace), the readers' leases are
// written into the new segment, and then the admission's write leases end.
// A lease on a place no held block is at any more (its block moved or was
// released under it) keeps that place too: a parked key is admitted there,
// and released once no lease holds it (ReleaseParked).
Status Client::ReadmitCopyBlocks(const MappedSegment& old,
                                 const std::unordered_map<BlockKey, Held, BlockKeyHash>& held,
                                 uint64_t* restored) {
  uint64_t* old_words = WordsOf(old.base, old.slots);
  std::array<std::vector<wire::AdmitEntry>, kMaxTiers> by_tier;
  std::unordered_map<uint32_t, BlockKey> key_at;  // old slot -> key
  for (const auto& [k, h] : held) {
    if (pools_[h.pool].tier < 0) continue;
    const Location at =
        h.slot < old.slots ? DecodeLocation(LoadWord(old_words, h.slot)) : Location{};
    // A word that says "no place" (only a release writes one) is a Release
    // the old daemon applied whose answer never came back (the connection
    // dropped first): the key is released, and not admitted again. A lease
    // on its old place parks that place below, as for any released block.
    if (h.slot < old.slots && !at.has_place()) continue;
    if (!at.has_place() || at.tier >= kMaxTiers || at.index >= tier_pools_[at.tier].blocks) {
      return Status::Fail(ErrorCode::kInternal, "key " + k.ToString() + " (slot " +
                                                    std::to_string(h.slot) +
                                                    ") has no place in the old state segment");
    }
    by_tier[at.tier].push_back({k, wire::kAdmitAtPlace | at.index});
    key_at[h.slot] = k;
  }
  // Each held lease: the key it carries over to (a held block's, or a parked place's).
  const LeaseEntry* old_leases = LeasesOf(old.base, old.slots);
  constexpr uint32_t kEntries = kLeaseRows * kLeasesPerRow;
  std::vector<BlockKey> carry(kEntries);
  std::vector<bool> carried(kEntries, false);
  std::map<std::pair<uint32_t, uint32_t>, BlockKey> parks;  // (tier, index) -> parked key
  {
    std::lock_guard lock(rows_mu_);
    for (uint32_t i = 0; i < kEntries; ++i) {
      const uint64_t w = ReadLease(&old_leases[i]);
      if (w == 0) continue;
      const uint32_t slot = static_cast<uint32_t>((w >> 32) - 1);
      if (auto it = key_at.find(slot);
          it != key_at.end() &&
          DecodeLocation(LoadWord(old_words, slot)).version == static_cast<uint32_t>(w)) {
        carry[i] = it->second;
        carried[i] = true;
        continue;
      }
      const Reader* r = readers_[i / kLeasesPerRow];
      const uint8_t* data = r ? r->data_[i % kLeasesPerRow] : nullptr;
      bool found = false;
      for (uint32_t t = 0; t < kMaxTiers && data && !found; ++t) {
        const TierPoolMap& m = tier_pools_[t];
        if (!m.base || data < m.base || data >= m.base + m.bytes) continue;
        const uint32_t index = static_cast<uint32_t>((data - m.base) / tier_stride_);
        auto [at, fresh] = parks.try_emplace({t, index}, BlockKey{kParkedKeyHi, 0});
        if (fresh) {
          at->second.lo = client_id_ << 32 | uint64_t{t} << 24 | index;
          by_tier[t].push_back({at->second, wire::kAdmitAtPlace | index});
        }
        carry[i] = at->second;
        carried[i] = found = true;
      }
      // Not a lease this library gave (a stray write to the table): dropped.
    }
  }
  for (uint32_t t = 0; t < kMaxTiers; ++t) {
    for (size_t i = 0; i < by_tier[t].size(); i += 4096) {
      const size_t n = std::min<size_t>(4096, by_tier[t].size() - i);
      std::vector<wire::AdmitResult> results;
      if (Status st = Admit(tier_pools_[t].id, std::span(by_tier[t]).subspan(i, n), &results);
          !st.ok()) {
        return st;
      }
      if (restored) {
        for (const auto& r : results) *restored += r.restored;
      }
    }
  }
  // Every block (and parked place) is published with the write lease held,
  // as any admission is, so the daemon cannot move it before the leases on
  // it are in the new table.
  LeaseEntry* leases = LeasesOf(segment_, slots_);
  const uint64_t now = daemon_ticks();
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> parked_slots;
  for (const auto& [place, key] : parks) parked_slots[key] = held_.at(key).slot;
  for (uint32_t i = 0; i < kEntries; ++i) {
    if (!carried[i]) continue;
    const uint32_t slot = held_.at(carry[i]).slot;
    const uint32_t version = DecodeLocation(LoadWord(location_words(), slot)).version;
    std::atomic_ref<uint64_t>(leases[i].since_tick).store(now, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(leases[i].held)
        .store(LeaseWord(slot, version), std::memory_order_seq_cst);
    if (parked_slots.contains(carry[i])) parked_.push_back(Parked{carry[i], i, leases[i].held});
  }
  // A block whose writer held its write lease keeps it (EndWrite on its new
  // slot ends it); every other admission's write lease ends now.
  for (const auto& [old_slot, key] : key_at) {
    if (!(LoadWord(old_words, old_slot) & kLocWriting)) {
      cxltier::EndWrite(location_words(), held_.at(key).slot);
    }
  }
  for (const auto& [key, slot] : parked_slots) {
    cxltier::EndWrite(location_words(), slot);
    held_.erase(key);  // the library's, not the caller's
  }
  return Status::Ok();
}

void Client::ReleaseParked() {
  if (parked_.empty()) return;
  const LeaseEntry* leases = LeasesOf(segment_, slots_);
  std::unordered_set<BlockKey, BlockKeyHash> busy, done;
  for (const Parked& p : parked_) {
    if (ReadLease(&leases[p.lease]) == p.held) busy.insert(p.key);
  }
  std::erase_if(parked_, [&](const Parked& p) {
    if (busy.contains(p.key)) return false;
    done.insert(p.key);
    return true;
  });
  if (done.empty()) return;
  // In parts, as Release (2,048 leases can park 2,048 keys); a failure
  // leaves its part to the daemon's cleanup and the next part is sent.
  const std::vector<BlockKey> keys(done.begin(), done.end());
  (void)InParts(std::span<const BlockKey>(keys), [&](std::span<const BlockKey> part) {
    wire::Release m{std::vector<BlockKey>(part.begin(), part.end())};
    wire::ReleaseOk ok;
    (void)Call(m, wire::MsgType::kReleaseOk, &ok);
    return Status::Ok();
  });
}

uint32_t KvHeadOfQueryHead(const ModelGeometry& model, uint32_t query_head) {
  const uint32_t group = model.gqa_group();
  return group ? query_head / group : 0;
}

namespace {

float Combine(float acc, float v, Reduce how, bool first) {
  if (first) return v;
  return how == Reduce::kMax ? std::max(acc, v) : acc + v;
}

}  // namespace

float AggregateStreams(const ModelGeometry& model, std::span<const float> per_stream, Reduce how) {
  if (per_stream.empty() || per_stream.size() != model.streams()) return 0.0f;
  float acc = 0.0f;
  size_t n = 0;
  for (float v : per_stream) {
    if (!std::isfinite(v)) continue;
    acc = Combine(acc, v, how, n == 0);
    ++n;
  }
  if (n == 0) return 0.0f;
  return how == Reduce::kMean ? acc / static_cast<float>(n) : acc;
}

bool QueryHeadsToStreams(const ModelGeometry& model, std::span<const float> per_query_head,
                         std::span<float> per_stream, Reduce how) {
  const uint32_t group = model.gqa_group();
  if (group == 0 || per_query_head.size() != uint64_t{model.layers} * model.query_heads ||
      per_stream.size() != model.streams()) {
    return false;
  }
  for (uint32_t l = 0; l < model.layers; ++l) {
    for (uint32_t kv = 0; kv < model.kv_heads; ++kv) {
      float acc = 0.0f;
      for (uint32_t g = 0; g < group; ++g) {
        const float v = per_query_head[size_t{l} * model.query_heads + kv * group + g];
        acc = Combine(acc, v, how, g == 0);
      }
      per_stream[size_t{l} * model.kv_heads + kv] = how == Reduce::kMean ? acc / group : acc;
    }
  }
  return true;
}

}  // namespace cxltier
