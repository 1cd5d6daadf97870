// libFuzzer target: a client that does hostile things to its own pools while
// a live in-process daemon serves it and moves its blocks with the real Linux
// migrator. The input is a program: register memfds sealed or not, a tmpfs
// file, a pipe, a socket, range pools at mapped, unmapped or PROT_NONE
// addresses (or of a child process that is killed), shrink, grow and punch
// the memfds, unmap or protect the ranges under admitted blocks, admit,
// release, report, hint, tick. The daemon must survive every program (no SIGBUS,
// no sanitizer report), answer every request with ok or an error that says
// something, refuse every pool fd that could shrink under it, and answer
// stats. One daemon serves every input; each input is one client session.
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "numa/migrator.h"
#include "service/daemon.h"

namespace {

using namespace cxltier;

constexpr uint32_t kSlots = 64;
constexpr uint32_t kPoolBlocks = 16;
constexpr int kMaxTicks = 12;
const ModelGeometry kModel{"fuzz", 1, 1, 1, 1024, 2, 16};  // 64 KiB blocks
const uint64_t kStride = kModel.block_bytes();
const uint64_t kPoolBytes = kStride * kPoolBlocks;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "fuzz_hostile: %s\n", what);
  std::abort();
}

// Every answer is a value or an error with a message; never anything else.
template <typename T>
bool Ok(const Result<T>& a) {
  if (a.ok()) return true;
  if (a.status().message.empty()) Fail("an error without a message");
  if (a.status().ok()) Fail("an error answer whose code is ok");
  // Result turns an ok Status into kInternal "no value": a handler that
  // answered ok without a reply.
  if (a.status().message == "no value") Fail("a handler answered ok without a reply");
  return false;
}

// Reads the program.
struct Input {
  const uint8_t* p;
  size_t n;
  uint8_t Byte() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | Byte();
    return v;
  }
};

// What the client holds for one pool it tried to register.
struct ClientPool {
  int fd = -1;                   // memfd / file / pipe / socket (client's copy)
  int peer_fd = -1;              // the other end of a pipe or socket
  void* range = nullptr;         // range pools: our own mapping, when there is one
  bool mapped_rw = false;        // range is mapped read-write (we may write it)
  bool refuse_expected = false;  // a fd the daemon must never take
  uint32_t id = UINT32_MAX;      // the daemon's pool id when accepted
};

struct Fixture {
  boost::asio::io_context io;
  std::unique_ptr<service::Daemon> daemon;
  uint64_t next_session = 1;

  Fixture() {
    // Refusals are logged, millions of them here; FUZZ_HOSTILE_LOG=1 shows them.
    spdlog::set_level(std::getenv("FUZZ_HOSTILE_LOG") ? spdlog::level::debug : spdlog::level::off);
    service::DaemonConfig c;
    c.state_dir = "/tmp/cxltier-fuzz-hostile-" + std::to_string(getpid());
    std::filesystem::create_directories(c.state_dir);
    c.persist = false;
    c.checkpoint_interval_s = 0;
    c.tier0_budget_bytes = 8 * kModel.block_bytes();  // fewer than the blocks: moves happen
    c.max_blocks_per_client = kSlots;
    c.max_pools_per_client = 8;
    c.migrate_rate_mib_s = 1u << 16;  // the mover never waits for its budget
    c.hysteresis_ticks = 0;
    daemon = std::make_unique<service::Daemon>(io, c, numa::Topology{},
                                               numa::TierAssignment{{0}, {0}, "fuzz", {}},
                                               numa::MakeLinuxMigrator(), true);
    if (!daemon->Start().ok()) Fail("daemon start");
  }

  // Lets the mover finish what it was handed and delivers its results.
  void Drain() {
    for (int spin = 0; spin < 2000; ++spin) {
      io.poll();
      io.restart();
      if (daemon->StatusJson()["migrations"]["pending"] == 0) break;
      usleep(500);  // a status costs more than a small move: ask seldom
    }
    io.poll();
    io.restart();
  }
};

// A child process whose address space is a copy of ours, as the peer of a
// range pool; killed by the program (then its pid means nothing).
pid_t SpawnPeer() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

void Reap(pid_t* pid) {
  if (*pid <= 0) return;
  kill(*pid, SIGKILL);
  while (waitpid(*pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  *pid = -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();
  Input in{data, size};
  const uint8_t mode = in.Byte();
  // A fork of this (sanitized) process costs milliseconds: one input in 16.
  pid_t child = mode % 16 == 1 ? SpawnPeer() : -1;
  server::Peer peer{f->next_session++, child > 0 ? child : getpid(), getuid(), getgid()};
  if (!f->daemon->requests().OnConnect(peer).ok()) Fail("connect refused");
  int seg_fd = -1;
  if (!Ok(f->daemon->requests().OnHello(peer, wire::Hello{kModel, kSlots, "fuzz"}, &seg_fd))) {
    Fail("hello refused");
  }
  std::vector<ClientPool> pools;
  std::vector<BlockKey> admitted;
  std::vector<uint32_t> slots;

  int ticks = 0;
  for (int op = 0; op < 64 && in.n > 0; ++op) {
    const uint8_t what = in.Byte() % 16;
    const uint8_t arg = in.Byte();
    ClientPool* last = pools.empty() ? nullptr : &pools[arg % pools.size()];
    switch (what) {
      case 0:    // a memfd, sealed or not
      case 1: {  // a file that is not a memfd: tmpfs via open(2), a pipe, a socket
        if (pools.size() >= 12) break;
        ClientPool cp;
        wire::RegisterPool reg{wire::PoolKind::kMemfd, 0, kPoolBytes, kStride, kPoolBlocks};
        if (what == 0) {
          cp.fd = memfd_create("fuzz-hostile", MFD_CLOEXEC | (arg & 1 ? MFD_ALLOW_SEALING : 0));
          if (cp.fd < 0) Fail("memfd_create");
          const off_t len = (arg & 2) ? static_cast<off_t>(kPoolBytes) : arg * 4096;
          if (ftruncate(cp.fd, len) != 0) Fail("ftruncate");
          const bool sealed =
              (arg & 1) && (arg & 4) && fcntl(cp.fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0;
          if ((arg & 8) && (arg & 1)) fcntl(cp.fd, F_ADD_SEALS, F_SEAL_SEAL);
          cp.refuse_expected = !sealed;
          if (arg & 16) {  // some bytes written, through the fd: no fault here either
            std::vector<char> bytes(kStride, static_cast<char>(arg));
            (void)!pwrite(cp.fd, bytes.data(), bytes.size(), (arg >> 5) * kStride);
          }
        } else if (arg % 3 == 0) {
          const std::string path = "/dev/shm/cxltier-fuzz-hostile-" + std::to_string(getpid());
          cp.fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
          unlink(path.c_str());
          if (cp.fd < 0) break;  // no /dev/shm here
          if (ftruncate(cp.fd, static_cast<off_t>(kPoolBytes)) != 0) Fail("ftruncate tmpfs");
          cp.refuse_expected = true;  // carries F_SEAL_SEAL only: it could shrink
        } else {
          int fds[2];
          const int r = arg % 3 == 1 ? pipe2(fds, O_CLOEXEC)
                                     : socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds);
          if (r != 0) Fail("pipe/socketpair");
          cp.fd = fds[0];
          cp.peer_fd = fds[1];
          cp.refuse_expected = true;
        }
        auto a = f->daemon->requests().OnRegisterPool(peer, reg, server::UniqueFd(dup(cp.fd)));
        if (Ok(a)) {
          if (cp.refuse_expected) Fail("a pool fd that can shrink (or is no memfd) was accepted");
          cp.id = a->pool_id;
        }
        pools.push_back(cp);
        break;
      }
      case 2: {  // a range pool: ours mapped, PROT_NONE, unmapped, or anywhere
        if (pools.size() >= 12) break;
        ClientPool cp;
        uint64_t address = 0;
        const int how = arg % 4;
        if (how == 3) {
          address = in.U64() & ~uint64_t{4095};
        } else {
          cp.range = mmap(nullptr, kPoolBytes, how == 1 ? PROT_NONE : PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (cp.range == MAP_FAILED) Fail("mmap range");
          address = reinterpret_cast<uintptr_t>(cp.range);
          cp.mapped_rw = how == 0;
          if (how == 0) std::memset(cp.range, arg, kPoolBytes / 2);
          if (how == 2) {
            munmap(cp.range, kPoolBytes);
            cp.range = nullptr;
          }
        }
        auto a = f->daemon->requests().OnRegisterPool(
            peer,
            wire::RegisterPool{wire::PoolKind::kRange, address, kPoolBytes, kStride, kPoolBlocks},
            server::UniqueFd());
        if (Ok(a)) cp.id = a->pool_id;
        pools.push_back(cp);
        break;
      }
      case 3:  // shrink or grow a memfd (the seal, when there is one, says no to shrinking)
        if (last && last->fd >= 0) {
          (void)!ftruncate(last->fd,
                           static_cast<off_t>((in.Byte() % (2 * kPoolBlocks + 1)) * (kStride / 2)));
        }
        break;
      case 4:  // punch a hole under whatever blocks live there
        if (last && last->fd >= 0) {
          (void)!fallocate(last->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                           static_cast<off_t>((arg % kPoolBlocks) * kStride),
                           static_cast<off_t>((in.Byte() % 4 + 1) * kStride / 2));
        }
        break;
      case 5:  // unmap the range under its admitted blocks
        if (last && last->range) {
          munmap(last->range, kPoolBytes);
          last->range = nullptr;
          last->mapped_rw = false;
        }
        break;
      case 6:  // take the range's pages away another way
        if (last && last->range) {
          mprotect(last->range, kPoolBytes, PROT_NONE);
          last->mapped_rw = false;
        }
        break;
      case 7:  // touch the range's pages (only while we may)
        if (last && last->mapped_rw) std::memset(last->range, arg, kPoolBytes);
        break;
      case 8:
      case 9: {  // admit a few blocks, to a pool that exists or not
        wire::Admit a{pools.empty() || (arg & 0x80) ? arg : pools[arg % pools.size()].id, {}};
        const uint8_t count = in.Byte() % 8 + 1;
        for (uint8_t i = 0; i < count; ++i) {
          a.entries.push_back({BlockKey::FromSequence(in.Byte() % 4, in.Byte() % 96),
                               static_cast<uint32_t>(in.Byte() % (kPoolBlocks + 2))});
        }
        auto r = f->daemon->requests().OnAdmit(peer, a);
        if (Ok(r)) {
          const auto& ok = (*r);
          if (ok.results.size() != a.entries.size()) Fail("admit answered for other keys");
          for (size_t i = 0; i < a.entries.size(); ++i) {
            admitted.push_back(a.entries[i].key);
            slots.push_back(ok.results[i].slot);
          }
        }
        break;
      }
      case 10: {  // release some keys, held or not
        wire::Release r;
        for (uint8_t i = 0; i < arg % 8; ++i) {
          r.keys.push_back(admitted.empty() || (i & 1)
                               ? BlockKey::FromSequence(in.Byte() % 4, in.Byte() % 96)
                               : admitted[in.Byte() % admitted.size()]);
        }
        (void)Ok(f->daemon->requests().OnRelease(peer, r));
        break;
      }
      case 11:
      case 12: {  // make blocks hot (or any slot) so the planner moves them
        wire::Report r;
        for (uint8_t i = 0; i < arg % 16 + 1; ++i) {
          const uint32_t slot =
              slots.empty() || (i & 3) == 3 ? in.Byte() : slots[in.Byte() % slots.size()];
          r.observations.push_back({slot, static_cast<float>(in.Byte()) / 16.0f});
        }
        (void)Ok(f->daemon->requests().OnReport(peer, r));
        break;
      }
      case 13:  // the peer process of the range pools exits
        Reap(&child);
        break;
      case 14: {  // a scheduler hint for one of a few groups, naming held keys or not
        wire::Hint h{
            static_cast<HintKind>(arg % 3 + 1), static_cast<uint32_t>(arg / 3 % 4 + 1), {}};
        const uint8_t count = in.Byte() % 8;
        for (uint8_t i = 0; i < count; ++i) {
          h.keys.push_back(admitted.empty() || (i & 1)
                               ? BlockKey::FromSequence(in.Byte() % 4, in.Byte() % 96)
                               : admitted[in.Byte() % admitted.size()]);
        }
        auto r = f->daemon->requests().OnHint(peer, h);
        if (Ok(r) && r->grouped + r->unknown != h.keys.size()) {
          Fail("a hint answered for other keys");
        }
        break;
      }
      default:  // ticks, moves with the real migrator
        // At most kMaxTicks per input: each waits for real moves.
        for (int t = 0; t < arg % 4 + 1 && ticks < kMaxTicks; ++t, ++ticks) {
          f->daemon->Tick();
          f->Drain();
        }
        break;
    }
  }
  for (int t = 0; t < 2; ++t) {
    f->daemon->Tick();
    f->Drain();
  }
  for (const char* what : {"status", "tiers", "clients", "blocks"}) {
    auto st = f->daemon->requests().OnStats(peer, wire::Stats{what});
    if (!Ok(st)) Fail("stats refused");
    if (!nlohmann::json::accept(st->json)) Fail("stats not JSON");
  }
  (void)Ok(f->daemon->requests().OnQueryTiers(peer, wire::QueryTiers{admitted}));

  f->daemon->requests().OnDisconnect(peer);
  f->Drain();
  Reap(&child);
  for (ClientPool& cp : pools) {
    if (cp.fd >= 0) close(cp.fd);
    if (cp.peer_fd >= 0) close(cp.peer_fd);
    if (cp.range) munmap(cp.range, kPoolBytes);
  }
  return 0;
}
