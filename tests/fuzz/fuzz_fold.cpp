// libFuzzer target: the daemon's fold of a state segment a client wrote. The
// input overwrites the segment's slots and dirty bitmap (anything a hostile
// client can write), the daemon ticks, and then must still hold every block,
// publish finite scores, and answer stats. One in-process daemon (no socket,
// moves reported done without moving) serves every input.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cxltier/segment.h"
#include "numa/migrator.h"
#include "service/daemon.h"

namespace {

using namespace cxltier;

constexpr uint32_t kSlots = 64;
const ModelGeometry kModel{"fuzz", 1, 1, 1, 1024, 2, 16};  // 64 KiB blocks

struct Fixture {
  boost::asio::io_context io;
  std::unique_ptr<service::Daemon> daemon;
  server::Peer peer{1, getpid(), getuid(), getgid()};
  uint8_t* segment = nullptr;

  Fixture() {
    service::DaemonConfig c;
    c.state_dir = "/tmp/cxltier-fuzz-fold-" + std::to_string(getpid());
    std::filesystem::create_directories(c.state_dir);
    c.checkpoint_interval_s = 0;
    c.tier0_budget_bytes = 16 * kModel.block_bytes();
    c.max_blocks_per_client = kSlots;
    daemon = std::make_unique<service::Daemon>(io, c, numa::Topology{},
                                               numa::TierAssignment{{0}, {0}, "fuzz"},
                                               std::make_unique<numa::NullMigrator>(), true);
    daemon->OnConnect(peer);
    int fd = -1;
    auto hello = daemon->OnHello(peer, wire::Hello{kModel, kSlots, "fuzz"}, &fd);
    if (!std::holds_alternative<wire::HelloOk>(hello)) std::abort();
    segment = static_cast<uint8_t*>(
        mmap(nullptr, SegmentBytes(kSlots), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    if (segment == MAP_FAILED) std::abort();
    const uint64_t stride = kModel.block_bytes();
    const int pool = memfd_create("fuzz-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ftruncate(pool, static_cast<off_t>(stride * kSlots)) != 0) std::abort();
    if (fcntl(pool, F_ADD_SEALS, F_SEAL_SHRINK) != 0) std::abort();  // the daemon requires it
    auto reg = daemon->OnRegisterPool(
        peer, wire::RegisterPool{wire::PoolKind::kMemfd, 0, stride * kSlots, stride, kSlots},
        server::UniqueFd(pool));
    if (!std::holds_alternative<wire::RegisterPoolOk>(reg)) std::abort();
    wire::Admit a{0, {}};
    for (uint32_t i = 0; i < kSlots; ++i) a.entries.push_back({BlockKey::FromSequence(3, i), i});
    if (!std::holds_alternative<wire::AdmitOk>(daemon->OnAdmit(peer, a))) std::abort();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();
  // The client's part of the segment: every slot byte and the bitmap.
  uint8_t* writable = f->segment + kSegmentSlotOffset;
  const size_t span = SegmentBytes(kSlots) - kSegmentSlotOffset;
  std::memcpy(writable, data, std::min(size, span));
  // A tail past the segment is a socket Report of raw observations.
  if (size > span) {
    wire::Report r;
    std::string why;
    std::vector<uint8_t> payload(data + span, data + size);
    if (wire::Decode(payload, &r, &why)) (void)f->daemon->OnReport(f->peer, r);
  }
  f->daemon->Tick();
  f->io.poll();
  f->io.restart();
  const nlohmann::json st = f->daemon->StatusJson();
  if (st["blocks"].get<uint64_t>() != kSlots)
    std::abort();  // nothing the client writes drops a block
  auto stats = f->daemon->OnStats(f->peer, wire::Stats{"blocks"});
  if (!std::holds_alternative<wire::StatsOk>(stats)) std::abort();
  const auto j = nlohmann::json::parse(std::get<wire::StatsOk>(stats).json);
  // Every score the engine holds is finite (JSON writes NaN and inf as null).
  for (const char* list : {"hottest", "coldest"}) {
    for (const auto& b : j[list]) {
      if (!b["score"].is_number() || !std::isfinite(b["score"].get<double>())) std::abort();
    }
  }
  return 0;
}
