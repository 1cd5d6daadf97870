#include "cxltier/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "cxltier/detail/fd_passing.h"
#include "cxltier/segment.h"

namespace cxltier {
namespace {

using wire::ErrorCode;

Status Sys(const std::string& what) {
  return Status::Fail(ErrorCode::kInternal, what + ": " + std::strerror(errno));
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
  Unmap();
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
                           std::string* text) {
  Client c;
  c.options_.socket_path = socket_path;
  if (Status st = c.ConnectSocket(); !st.ok()) return st;
  wire::AdminOk ok;
  if (Status st = c.Call(wire::Admin{op, arg}, wire::MsgType::kAdminOk, &ok); !st.ok()) return st;
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

Status Client::Open() {
  if (Status st = ConnectSocket(); !st.ok()) return st;
  wire::Hello hello{options_.model, options_.max_blocks, options_.name};
  wire::HelloOk ok;
  int fd = -1;
  if (Status st = Call(hello, wire::MsgType::kHelloOk, &ok, -1, &fd); !st.ok()) {
    if (fd >= 0) close(fd);
    return st;
  }
  if (fd < 0) return Status::Fail(ErrorCode::kInternal, "hello answered without a segment fd");
  const uint64_t bytes = SegmentBytes(ok.slots);
  Unmap();
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Sys("mapping the state segment");
  const auto* h = static_cast<const SegmentHeader*>(p);
  if (h->magic != kSegmentMagic || h->version != kSegmentVersion || h->slots != ok.slots ||
      ok.slot_offset != kSegmentSlotOffset || h->dirty_offset != SegmentDirtyOffset(ok.slots)) {
    munmap(p, bytes);
    return Status::Fail(ErrorCode::kInternal, "state segment header does not match");
  }
  segment_ = p;
  segment_bytes_ = bytes;
  slots_ = ok.slots;
  client_id_ = ok.client_id;
  block_bytes_ = ok.block_bytes;
  tick_ms_ = ok.tick_ms;
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

Status Client::RegisterPool(const wire::RegisterPool& m, int fd, uint32_t* pool_id) {
  wire::RegisterPoolOk ok;
  if (Status st = Call(m, wire::MsgType::kRegisterPoolOk, &ok, fd); !st.ok()) return st;
  *pool_id = ok.pool_id;
  return Status::Ok();
}

Status Client::RegisterMemfdPool(int memfd, uint64_t length, uint64_t stride, uint32_t blocks,
                                 uint32_t* pool_id) {
  // The daemon takes only memfds that cannot shrink under its mapping. If
  // this fails (no MFD_ALLOW_SEALING, or F_SEAL_SEAL), the daemon's refusal
  // says how to fix it.
  (void)fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK);
  const wire::RegisterPool m{wire::PoolKind::kMemfd, 0, length, stride, blocks};
  if (Status st = RegisterPool(m, memfd, pool_id); !st.ok()) return st;
  pools_.resize(std::max<size_t>(pools_.size(), *pool_id + 1));
  pools_[*pool_id] = PoolRecord{m, fcntl(memfd, F_DUPFD_CLOEXEC, 0)};
  return Status::Ok();
}

Status Client::RegisterRangePool(const void* address, uint64_t length, uint64_t stride,
                                 uint32_t blocks, uint32_t* pool_id) {
  const wire::RegisterPool m{wire::PoolKind::kRange, reinterpret_cast<uintptr_t>(address), length,
                             stride, blocks};
  if (Status st = RegisterPool(m, -1, pool_id); !st.ok()) return st;
  pools_.resize(std::max<size_t>(pools_.size(), *pool_id + 1));
  pools_[*pool_id] = PoolRecord{m, -1};
  return Status::Ok();
}

Status Client::Admit(uint32_t pool_id, std::span<const wire::AdmitEntry> entries,
                     std::vector<wire::AdmitResult>* results) {
  std::vector<wire::AdmitResult> all;
  all.reserve(entries.size());
  // The daemon takes at most kMaxEntriesPerMessage per request.
  for (size_t at = 0; at < entries.size() || (at == 0 && entries.empty());
       at += wire::kMaxEntriesPerMessage) {
    const auto part =
        entries.subspan(at, std::min(entries.size() - at, size_t{wire::kMaxEntriesPerMessage}));
    wire::Admit m{pool_id, std::vector<wire::AdmitEntry>(part.begin(), part.end())};
    wire::AdmitOk ok;
    if (Status st = Call(m, wire::MsgType::kAdmitOk, &ok); !st.ok()) return st;
    if (ok.results.size() != part.size()) {
      return Status::Fail(ErrorCode::kBadPayload, "admit answered for a different number of keys");
    }
    for (size_t i = 0; i < part.size(); ++i) {
      held_[part[i].key] = Held{pool_id, part[i].block_index, ok.results[i].slot};
    }
    all.insert(all.end(), ok.results.begin(), ok.results.end());
    if (entries.empty()) break;
  }
  if (results) *results = std::move(all);
  return Status::Ok();
}

Status Client::Release(std::span<const BlockKey> keys, wire::ReleaseOk* result) {
  wire::ReleaseOk total;
  for (size_t at = 0; at < keys.size() || (at == 0 && keys.empty());
       at += wire::kMaxEntriesPerMessage) {
    const auto part =
        keys.subspan(at, std::min(keys.size() - at, size_t{wire::kMaxEntriesPerMessage}));
    wire::Release m{std::vector<BlockKey>(part.begin(), part.end())};
    wire::ReleaseOk ok;
    if (Status st = Call(m, wire::MsgType::kReleaseOk, &ok); !st.ok()) return st;
    for (const BlockKey& k : part) held_.erase(k);
    total.released += ok.released;
    total.unknown += ok.unknown;
    if (keys.empty()) break;
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
  wire::Report m{std::vector<wire::Observation>(observations.begin(), observations.end())};
  wire::ReportOk ok;
  if (Status st = Call(m, wire::MsgType::kReportOk, &ok); !st.ok()) return st;
  if (result) *result = ok;
  return Status::Ok();
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
  wire::QueryTiers m{std::vector<BlockKey>(keys.begin(), keys.end())};
  wire::QueryTiersOk ok;
  if (Status st = Call(m, wire::MsgType::kQueryTiersOk, &ok); !st.ok()) return st;
  *tiers = std::move(ok.tiers);
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
  if (Status st = Open(); !st.ok()) return st;
  std::vector<PoolRecord> old = std::move(pools_);
  pools_.clear();
  for (size_t i = 0; i < old.size(); ++i) {
    uint32_t id = 0;
    if (Status st = RegisterPool(old[i].reg, old[i].fd, &id); !st.ok()) return st;
    pools_.resize(std::max<size_t>(pools_.size(), id + 1));
    pools_[id] = old[i];
    if (id != i) return Status::Fail(ErrorCode::kInternal, "pool ids changed on reconnect");
  }
  // Admit everything again, pool by pool, in batches.
  std::unordered_map<BlockKey, Held, BlockKeyHash> held = std::move(held_);
  held_.clear();
  std::vector<std::vector<wire::AdmitEntry>> by_pool(pools_.size());
  for (const auto& [k, h] : held) by_pool[h.pool].push_back({k, h.block});
  for (uint32_t p = 0; p < by_pool.size(); ++p) {
    for (size_t i = 0; i < by_pool[p].size(); i += 4096) {
      const size_t n = std::min<size_t>(4096, by_pool[p].size() - i);
      std::vector<wire::AdmitResult> results;
      if (Status st = Admit(p, std::span(by_pool[p]).subspan(i, n), &results); !st.ok()) return st;
      if (restored) {
        for (const auto& r : results) *restored += r.restored;
      }
    }
  }
  return Status::Ok();
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
