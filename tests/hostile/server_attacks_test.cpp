// Attacks on the socket server (docs/security.md, "Hostile clients"): replies
// never read, frames never finished, connections that never say hello, and a
// daemon run out of file descriptors. Each runs the attacker as kEvil while
// the good client is served, and checks what the daemon holds and does.
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "hostile/hostile_harness.h"
#include "server/server.h"

namespace cxltier::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kMiB = 1 << 20;

// The highest anonymous memory of a process while it runs, sampled every
// 10 ms by a forked sampler (a thread would make every later fork of the
// test unsafe: see fork_alone.h).
class PeakAnon {
 public:
  explicit PeakAnon(pid_t pid) {
    void* p =
        mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    shared_ = new (p) Shared();
    sampler_ = ForkAlone();
    if (sampler_ == 0) {
      while (!shared_->stop.load()) {
        Sample(pid);
        std::this_thread::sleep_for(10ms);
      }
      Sample(pid);
      _exit(0);
    }
  }
  ~PeakAnon() {
    Stop();
    if (shared_) munmap(shared_, sizeof(Shared));
  }
  PeakAnon(const PeakAnon&) = delete;
  PeakAnon& operator=(const PeakAnon&) = delete;

  uint64_t Stop() {
    if (!shared_) return 0;
    shared_->stop = true;
    if (sampler_ > 0) waitpid(sampler_, nullptr, 0);
    sampler_ = -1;
    return shared_->peak.load();
  }

 private:
  struct Shared {
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> peak{0};
  };
  void Sample(pid_t pid) {
    const uint64_t now = Usage(pid).anon_bytes;
    if (now > shared_->peak.load()) shared_->peak = now;
  }

  Shared* shared_ = nullptr;
  pid_t sampler_ = -1;
};

// True once the daemon closed its end of `fd` (POLLHUP), without reading what
// it sent: reading would relieve the back-pressure under test.
bool HungUp(int fd, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, 0, 0};  // no events asked: only POLLHUP and POLLERR come back
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    const int r = poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 100)));
    if (r > 0 && (p.revents & (POLLHUP | POLLERR))) return true;
    if (Clock::now() >= deadline) return false;
  }
}

// A frame header announcing `payload_bytes` of `type`, with none of them.
std::vector<uint8_t> HeaderOnly(wire::MsgType type, uint32_t payload_bytes) {
  std::vector<uint8_t> frame;
  wire::Encode(wire::Stats{"status"}, 1, frame);
  frame.resize(wire::kHeaderBytes);
  const uint16_t t = static_cast<uint16_t>(type);
  std::memcpy(frame.data() + 6, &t, sizeof(t));  // little-endian, as the host
  std::memcpy(frame.data() + 8, &payload_bytes, sizeof(payload_bytes));
  return frame;
}

// One byte over a pipe: the child and the test tell each other where they are.
struct Signal {
  int fds[2] = {-1, -1};
  Signal() { EXPECT_EQ(pipe(fds), 0); }
  ~Signal() {
    close(fds[0]);
    close(fds[1]);
  }
  void Raise() const { EXPECT_EQ(write(fds[1], "x", 1), 1); }
  bool Wait(std::chrono::milliseconds timeout) const {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) != 1) return false;
    char c;
    return read(fds[0], &c, 1) == 1;
  }
};

// A client names its own process (its comm, 15 bytes, any characters):
// one shaped like the fields after it must not move the start time read
// at accept (Peer::start_time, which names a device-DAX region's owner).
// Fails if the command name is ended at its first ')' instead of its last,
// or if the file is read a line at a time (a name may hold a newline).
TEST(HostileServer, AProcessNameCannotChangeItsStartTime) {
  const std::optional<uint64_t> before = server::ProcessStartTime(getpid());
  ASSERT_TRUE(before.has_value());
  EXPECT_GT(*before, 0u);
  char name[17] = {};
  ASSERT_EQ(prctl(PR_GET_NAME, name), 0);
  struct Restore {  // the name back however the test ends
    const char* name;
    ~Restore() { prctl(PR_SET_NAME, name); }
  } restore{name};
  for (const char* fake : {"a) R 1 2 3 4 5", ") 7 7 7 7 7 7 7", "x)\n9 9 9 9 9 9"}) {
    ASSERT_EQ(prctl(PR_SET_NAME, fake), 0);
    EXPECT_EQ(server::ProcessStartTime(getpid()), before) << fake;
  }
  EXPECT_EQ(server::ProcessStartTime(0), std::nullopt);
  EXPECT_EQ(server::ProcessStartTime(-1), std::nullopt);
}

// (a) Requests pipelined without ever reading a reply: the daemon stops
// reading them once its reply queue is full (the attacker's writes block),
// holds bounded memory, and closes the connection after reply_stall_timeout_s.
TEST(HostileServer, UnreadRepliesPauseReadingAndCloseAfterTheStallTimeout) {
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root";
  ASSERT_TRUE(EnsureHostileUsers());
  HostileDaemon d("[limits]\nreply_stall_timeout_s = 2\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  GoodClient good;
  ASSERT_TRUE(good.Start(d.socket()));
  const uint64_t base = Usage(d.pid()).anon_bytes;
  PeakAnon peak(d.pid());
  const std::string socket = d.socket();
  const std::string out = RunAs(kEvil, [&]() -> std::string {
    constexpr uint64_t kAttackBytes = 40 * kMiB;
    const int s = RawConnect(socket);
    if (s < 0) return "connect failed";
    std::vector<uint8_t> batch;  // 26-byte requests, written round and round
    for (uint32_t i = 0; i < 4096; ++i) wire::Encode(wire::Stats{"status"}, i, batch);
    uint64_t written = 0;
    size_t off = 0;
    bool closed = false;
    auto progress = Clock::now();
    while (written < kAttackBytes) {
      const ssize_t n =
          send(s, batch.data() + off, batch.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        written += static_cast<uint64_t>(n);
        off = (off + static_cast<size_t>(n)) % batch.size();
        progress = Clock::now();
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        // Blocked: the daemon stopped reading. Long enough without progress
        // and we only wait for the close below.
        if (Clock::now() - progress > 20s) break;
        pollfd p{s, POLLOUT, 0};
        poll(&p, 1, 100);
      } else {
        closed = true;  // EPIPE or ECONNRESET: the daemon closed it
        break;
      }
    }
    std::string why;
    if (written >= kAttackBytes) {
      why = "the daemon read all " + std::to_string(written) +
            " bytes of requests whose replies were never read; ";
    }
    if (!closed && !HungUp(s, Clock::now() + 60s)) {
      why += "the connection was not closed within 60 s of the writes stopping";
    }
    close(s);
    return why;
  });
  const uint64_t high = peak.Stop();
  EXPECT_EQ(out, "");
  if (kMemoryIsMeasurable) {
    EXPECT_LT(high, base + 64 * kMiB) << "daemon anon memory grew from " << base << " to " << high;
  }
  ExpectHealthy(d, good, base + 64 * kMiB, 64);
}

// (b) 16 connections each send a 16 MiB frame but its last byte: the daemon
// holds about max_input_bytes_per_uid for them (32 MiB), not 16 x 16 MiB, and
// closes each once frame_timeout_s passed with its frame incomplete.
TEST(HostileServer, UnfinishedFramesAreBoundedPerUidAndTimedOut) {
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root";
  ASSERT_TRUE(EnsureHostileUsers());
  // A long idle timeout: the frames, not idleness, must close them.
  // Frames of up to 16 MiB allowed (the default is 1 MiB).
  HostileDaemon d(
      "[limits]\nframe_timeout_s = 2\nidle_timeout_s = 600\nmax_message_bytes = 16777216\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  GoodClient good;
  ASSERT_TRUE(good.Start(d.socket()));
  const uint64_t base = Usage(d.pid()).anon_bytes;
  PeakAnon peak(d.pid());
  const std::string socket = d.socket();
  const std::string out = RunAs(kEvil, [&]() -> std::string {
    constexpr int kConnections = 16;
    constexpr uint32_t kPayload = 16u << 20;  // max_message_bytes above
    const std::vector<uint8_t> header = HeaderOnly(wire::MsgType::kReport, kPayload);
    const std::vector<uint8_t> zeros(kMiB, 0);
    std::vector<int> socks;
    std::vector<uint64_t> sent(kConnections, 0);
    std::vector<bool> closed(kConnections, false);
    for (int i = 0; i < kConnections; ++i) {
      const int s = RawConnect(socket);
      if (s < 0) return "connect " + std::to_string(i) + " failed";
      socks.push_back(s);
    }
    const uint64_t total = wire::kHeaderBytes + kPayload - 1;  // all but the last byte
    auto progress = Clock::now();
    for (;;) {
      bool all_done = true;
      for (int i = 0; i < kConnections; ++i) {
        if (closed[i] || sent[i] == total) continue;
        all_done = false;
        const uint8_t* from = sent[i] < wire::kHeaderBytes ? header.data() + sent[i] : zeros.data();
        const uint64_t chunk = sent[i] < wire::kHeaderBytes
                                   ? wire::kHeaderBytes - sent[i]
                                   : std::min<uint64_t>(kMiB, total - sent[i]);
        const ssize_t n = send(socks[i], from, chunk, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          sent[i] += static_cast<uint64_t>(n);
          progress = Clock::now();
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          closed[i] = true;
        }
      }
      if (all_done || Clock::now() - progress > 20s) break;
      std::this_thread::sleep_for(1ms);
    }
    const auto deadline = Clock::now() + 60s;
    int open = 0;
    for (int i = 0; i < kConnections; ++i) {
      if (!closed[i] && !HungUp(socks[i], deadline)) ++open;
      close(socks[i]);
    }
    if (open)
      return std::to_string(open) + " connections holding an unfinished frame were not closed";
    return "";
  });
  const uint64_t high = peak.Stop();
  EXPECT_EQ(out, "");
  // The uid's 32 MiB, a 64 KiB chunk per connection, and room for the rest.
  if (kMemoryIsMeasurable) {
    EXPECT_LT(high, base + 48 * kMiB) << "daemon anon memory grew from " << base << " to " << high;
  }
  ExpectHealthy(d, good, base + 48 * kMiB, 64);
}

// (c) Connections that never say hello and send nothing are closed after
// idle_timeout_s; one that sends a request now and then without hello (as
// cxltierctl top does) and one that said hello and is silent are not.
TEST(HostileServer, IdleConnectionsWithoutHelloAreClosed) {
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root";
  ASSERT_TRUE(EnsureHostileUsers());
  HostileDaemon d("[limits]\nidle_timeout_s = 4\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  GoodClient good;
  ASSERT_TRUE(good.Start(d.socket()));
  const size_t fds_before = Usage(d.pid()).fds;
  const std::string socket = d.socket();
  const std::string out = RunAs(kEvil, [&]() -> std::string {
    constexpr int kIdle = 12;  // within max_connections_per_uid (16) with the two below
    std::vector<int> idle;
    for (int i = 0; i < kIdle; ++i) {
      const int s = RawConnect(socket);
      if (s < 0) return "connect " + std::to_string(i) + " failed";
      idle.push_back(s);
    }
    Status st;
    auto hello = Client::Connect({socket, kHostileModel, 8, "silent"}, &st);
    if (!hello) return "hello: " + st.message;
    const int ctl = RawConnect(socket);
    if (ctl < 0) return "ctl connect failed";
    std::vector<uint8_t> request;
    wire::Encode(wire::Stats{"status"}, 7, request);
    // Like cxltierctl top: a request and its reply every 200 ms, no hello.
    auto ask = [&]() -> bool {
      if (!WriteAll(ctl, request)) return false;
      std::vector<uint8_t> got(wire::kHeaderBytes);
      size_t have = 0;
      while (have < got.size()) {
        const ssize_t n = recv(ctl, got.data() + have, got.size() - have, 0);
        if (n <= 0) return false;
        have += static_cast<size_t>(n);
      }
      const wire::Header h = *wire::DecodeHeader(got);
      std::vector<uint8_t> payload(h.payload_bytes);
      have = 0;
      while (have < payload.size()) {
        const ssize_t n = recv(ctl, payload.data() + have, payload.size() - have, 0);
        if (n <= 0) return false;
        have += static_cast<size_t>(n);
      }
      return h.type == wire::MsgType::kStatsOk;
    };
    const auto deadline = Clock::now() + 60s;
    std::vector<bool> gone(kIdle, false);
    int left = kIdle;
    while (left > 0 && Clock::now() < deadline) {
      if (!ask()) return "a connection sending a request every 200 ms without hello was closed";
      for (int i = 0; i < kIdle; ++i) {
        if (!gone[i] && HungUp(idle[i], Clock::now())) {
          gone[i] = true;
          --left;
        }
      }
      std::this_thread::sleep_for(200ms);
    }
    for (int s : idle) close(s);
    if (left)
      return std::to_string(left) + " idle connections without hello were not closed in 60 s";
    std::string json;
    if (!(st = hello->Stats("status", &json)).ok()) {
      return "the silent connection that said hello was closed: " + st.message;
    }
    if (!ask()) return "the connection without hello but with requests was closed";
    close(ctl);
    return "";
  });
  EXPECT_EQ(out, "");
  ExpectHealthy(d, good, 256 * kMiB, fds_before + 8);
}

// (d) The daemon run out of fds by a flood of connections: accept backs off
// instead of spinning (its CPU time stays well under the wall time), a pool
// registered meanwhile gets a clear `limit` error rather than "needs its fd",
// and once the attacker leaves, new clients are served again.
TEST(HostileServer, OutOfFdsTheDaemonBacksOffAndRecovers) {
  if (geteuid() != 0) GTEST_SKIP() << "creating users needs root";
  ASSERT_TRUE(EnsureHostileUsers());
  HostileDaemon d("[limits]\nmax_clients = 1000\nmax_connections_per_uid = 1000\n");
  ASSERT_TRUE(d.Alive()) << d.Log();
  GoodClient good;
  ASSERT_TRUE(good.Start(d.socket()));
  Signal connected, limited, at_limit, registered, leave;
  const std::string socket = d.socket();
  ChildAs attacker(kEvil, [&]() -> std::string {
    Status st;
    auto c = Client::Connect({socket, kHostileModel, 8, "flood"}, &st);
    if (!c) return "hello: " + st.message;
    std::vector<int> flood;
    auto connect = [&] {
      for (int i = 0; i < 200; ++i) {
        const int s = RawConnect(socket);  // queued in the backlog when not accepted
        if (s >= 0) flood.push_back(s);
      }
    };
    connect();
    connected.Raise();
    // Once the daemon's limit is set, more: the daemon may have accepted
    // every one of the first 200 by then.
    if (!limited.Wait(120s)) return "the test never set the daemon's fd limit";
    connect();
    std::string why;
    if (!at_limit.Wait(120s)) why = "the test never saw the daemon at its fd limit; ";
    const int pool = SealedPool(8, "flood-pool");
    uint32_t id = 0;
    st = c->RegisterMemfdPool(pool, 8 * kHostileStride, kHostileStride, 8, &id);
    close(pool);
    if (st.ok()) {
      why += "a pool registered while the daemon had no fd to spare; ";
    } else if (st.code != wire::ErrorCode::kLimit ||
               st.message.find("could not receive the fd") == std::string::npos) {
      why += "registering while out of fds: " + std::string(wire::ErrorName(st.code)) + ": " +
             st.message + "; ";
    }
    registered.Raise();
    leave.Wait(120s);
    for (int s : flood) close(s);
    return why;
  });
  ASSERT_TRUE(connected.Wait(60s));
  // Leave the daemon a few fds beyond what it holds now: the flood takes them.
  const size_t held = Usage(d.pid()).fds;
  const rlim_t limit = held + 8;
  const rlimit r{limit, limit};
  ASSERT_EQ(prlimit(d.pid(), RLIMIT_NOFILE, &r, nullptr), 0) << std::strerror(errno);
  limited.Raise();
  const bool full = WaitFor([&] { return Usage(d.pid()).fds >= limit; }, 60s);
  EXPECT_TRUE(full) << "the daemon holds " << Usage(d.pid()).fds << " fds of " << limit;
  // At the limit with connections still queued: a spinning accept would burn
  // a core here.
  const double cpu0 = CpuSeconds(d.pid());
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(3s);
  const double cpu = CpuSeconds(d.pid()) - cpu0;
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(cpu, 0.25 * wall) << "the daemon used " << cpu << " s of CPU in " << wall << " s";
  at_limit.Raise();
  EXPECT_TRUE(registered.Wait(60s));
  leave.Raise();
  EXPECT_EQ(attacker.Wait(), "");
  // Served again: a new client's hello (a new segment fd) and requests.
  const std::string back = RunAs(kGood, [&]() -> std::string {
    std::string last;
    const bool ok = WaitFor(
        [&] {
          Status st;
          auto c = Client::Connect({socket, kHostileModel, 8, "after"}, &st);
          std::string json;
          if (c && (st = c->Stats("status", &json)).ok()) return true;
          last = st.message;
          return false;
        },
        60s);
    return ok ? "" : "not served within 60 s after the flood left: " + last;
  });
  EXPECT_EQ(back, "");
  ExpectHealthy(d, good, 256 * kMiB, limit);
}

// ---- the server alone, with a handler that misbehaves on purpose ----

// Reads one whole frame (blocking, the socket has a receive timeout set).
// False on close or timeout.
bool ReadFrame(int fd, wire::Header* h, std::vector<uint8_t>* payload) {
  std::vector<uint8_t> head(wire::kHeaderBytes);
  auto read_all = [fd](uint8_t* p, size_t n) {
    for (size_t have = 0; have < n;) {
      const ssize_t r = recv(fd, p + have, n - have, 0);
      if (r <= 0) return false;
      have += static_cast<size_t>(r);
    }
    return true;
  };
  if (!read_all(head.data(), head.size())) return false;
  *h = *wire::DecodeHeader(head);
  payload->resize(h->payload_bytes);
  return read_all(payload->data(), payload->size());
}

// Answers Stats with what it was asked, throws where told to, and records
// the order in which requests reached it. I/O thread only.
class ThrowingHandler : public server::Handler {
 public:
  std::function<void(const std::string&)> on_stats;  // runs before each Stats answer
  // Handler::Throttle, asked before each request (unset: never).
  std::function<std::chrono::microseconds(const server::Peer&)> throttle;
  std::vector<std::string> stats_seen;
  int disconnects = 0;

  std::chrono::microseconds Throttle(const server::Peer& peer) override {
    return throttle ? throttle(peer) : std::chrono::microseconds(0);
  }

  Status OnConnect(const server::Peer&) override { return Status::Ok(); }
  void OnDisconnect(const server::Peer&) override { ++disconnects; }
  Result<wire::HelloOk> OnHello(const server::Peer&, const wire::Hello&, int*) override {
    return wire::Error{wire::ErrorCode::kNotReady, "no hello here"};
  }
  Result<wire::RegisterPoolOk> OnRegisterPool(const server::Peer&, const wire::RegisterPool&,
                                              server::UniqueFd) override {
    return wire::Error{wire::ErrorCode::kNotReady, "no pools here"};
  }
  Result<wire::CreateTierPoolOk> OnCreateTierPool(const server::Peer&, const wire::CreateTierPool&,
                                                  server::UniqueFd, int*) override {
    return wire::Error{wire::ErrorCode::kNotReady, "no tier pools here"};
  }
  Result<wire::AdmitOk> OnAdmit(const server::Peer&, const wire::Admit&) override {
    return wire::Error{wire::ErrorCode::kNotReady, "no admits here"};
  }
  Result<wire::ReleaseOk> OnRelease(const server::Peer&, const wire::Release&) override {
    return wire::Error{wire::ErrorCode::kNotReady, "no releases here"};
  }
  Result<wire::ReportOk> OnReport(const server::Peer&, const wire::Report&) override {
    throw std::runtime_error("report handler broke");
  }
  Result<wire::HintOk> OnHint(const server::Peer&, const wire::Hint&) override {
    return wire::Error{wire::ErrorCode::kNotReady, "no hints here"};
  }
  Result<wire::QueryTiersOk> OnQueryTiers(const server::Peer&, const wire::QueryTiers&) override {
    return wire::QueryTiersOk{};
  }
  Result<wire::StatsOk> OnStats(const server::Peer&, const wire::Stats& m) override {
    stats_seen.push_back(m.what);
    if (on_stats) on_stats(m.what);
    if (m.what == "bad-alloc") throw std::bad_alloc();
    return wire::StatsOk{m.what};
  }
  Result<wire::AdminOk> OnAdmin(const server::Peer&, const wire::Admin&,
                                server::UniqueFd*) override {
    return wire::AdminOk{""};
  }
};

// A Server on its own I/O thread, listening on a fresh socket.
struct ServerOnThread {
  boost::asio::io_context io;
  ThrowingHandler handler;
  std::unique_ptr<server::Server> srv;
  std::string path;
  std::thread thread;
  std::string escaped;  // what escaped io.run(), if anything

  explicit ServerOnThread(const char* name) {
    path = (std::filesystem::temp_directory_path() /
            (std::string("cxltier-") + name + "-" + std::to_string(getpid()) + ".sock"))
               .string();
    srv = std::make_unique<server::Server>(io, handler, server::ServerOptions{});
    EXPECT_EQ(srv->Listen(path, 0600).message, "");
    thread = std::thread([this] {
      try {
        io.run();
      } catch (const std::exception& e) {
        escaped = e.what();
      }
    });
  }
  ~ServerOnThread() { StopAndJoin(); }
  void StopAndJoin() {
    if (!thread.joinable()) return;
    boost::asio::post(io, [this] {
      srv->Stop();
      io.stop();
    });
    thread.join();
  }
  int Connect() const {
    const int s = RawConnect(path);
    timeval tv{30, 0};  // generous: a stuck server fails the read, not the test run
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return s;
  }
};

std::vector<uint8_t> StatsFrame(const std::string& what, uint32_t id) {
  std::vector<uint8_t> f;
  wire::Encode(wire::Stats{what}, id, f);
  return f;
}

// A handler that throws (std::bad_alloc from a query, anything from a request
// that changes state) costs that request an `internal` error, not the daemon:
// after a query the connection goes on, after a change it is closed, and the
// other connections are served throughout.
TEST(HostileServer, HandlerExceptionsAnswerInternalAndServingGoesOn) {
  ServerOnThread s("throw");
  const int a = s.Connect();
  const int b = s.Connect();
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  wire::Header h;
  std::vector<uint8_t> p;
  wire::Error err;

  ASSERT_TRUE(WriteAll(a, StatsFrame("bad-alloc", 1)));
  ASSERT_TRUE(ReadFrame(a, &h, &p)) << "no answer to a request whose handler threw";
  ASSERT_EQ(h.type, wire::MsgType::kError);
  ASSERT_EQ(wire::Decode(p, &err).message, "");
  EXPECT_EQ(err.code, wire::ErrorCode::kInternal);
  EXPECT_NE(err.message.find("stats"), std::string::npos) << err.message;
  EXPECT_EQ(h.request_id, 1u);

  // A query changed nothing: the same connection is served on.
  ASSERT_TRUE(WriteAll(a, StatsFrame("fine", 2)));
  ASSERT_TRUE(ReadFrame(a, &h, &p));
  EXPECT_EQ(h.type, wire::MsgType::kStatsOk);

  std::vector<uint8_t> report;
  wire::Encode(wire::Report{}, 3, report);
  ASSERT_TRUE(WriteAll(a, report));
  ASSERT_TRUE(ReadFrame(a, &h, &p));
  ASSERT_EQ(h.type, wire::MsgType::kError);
  ASSERT_EQ(wire::Decode(p, &err).message, "");
  EXPECT_EQ(err.code, wire::ErrorCode::kInternal);
  EXPECT_FALSE(ReadFrame(a, &h, &p)) << "the connection stays open after a failed report";

  ASSERT_TRUE(WriteAll(b, StatsFrame("other", 4)));
  ASSERT_TRUE(ReadFrame(b, &h, &p)) << "another connection was not served";
  EXPECT_EQ(h.type, wire::MsgType::kStatsOk);
  close(a);
  close(b);
  s.StopAndJoin();
  EXPECT_EQ(s.escaped, "") << "an exception escaped io.run()";
  EXPECT_EQ(s.srv->counters().handler_exceptions, 2u);
  EXPECT_EQ(s.handler.disconnects, 2);
}

// A deep pipeline cannot starve another connection: a request that arrives
// while 1000 others of one connection wait is served before the last of them.
TEST(HostileServer, ADeepPipelineYieldsToOtherConnections) {
  ServerOnThread s("fair");
  const int deep = s.Connect();
  const int other = s.Connect();
  ASSERT_GE(deep, 0);
  ASSERT_GE(other, 0);
  constexpr uint32_t kDepth = 1000;
  std::vector<uint8_t> pipeline;
  for (uint32_t i = 0; i < kDepth; ++i) wire::Encode(wire::Stats{"deep"}, i, pipeline);
  // The other request arrives once the first of the pipeline is dispatched,
  // i.e. while the rest of it is already in the daemon's input.
  bool sent = false;
  s.handler.on_stats = [&](const std::string& what) {
    if (what == "deep" && !sent) {
      sent = true;
      const std::vector<uint8_t> f = StatsFrame("other", 1);
      EXPECT_EQ(send(other, f.data(), f.size(), MSG_NOSIGNAL), static_cast<ssize_t>(f.size()));
    }
  };
  ASSERT_TRUE(WriteAll(deep, pipeline));
  wire::Header h;
  std::vector<uint8_t> p;
  ASSERT_TRUE(ReadFrame(other, &h, &p));
  EXPECT_EQ(h.type, wire::MsgType::kStatsOk);
  for (uint32_t i = 0; i < kDepth; ++i) ASSERT_TRUE(ReadFrame(deep, &h, &p)) << i;
  close(deep);
  close(other);
  s.StopAndJoin();
  const auto& seen = s.handler.stats_seen;
  const auto at = std::find(seen.begin(), seen.end(), "other") - seen.begin();
  EXPECT_LT(at, static_cast<ptrdiff_t>(kDepth))
      << "served after all " << kDepth << " of the pipeline";
}

// A connection its handler throttles (a spent cost budget, Handler::Throttle:
// the daemon's hint budget) has neither its requests answered nor its socket
// read until the wait is over, while another connection is served at once.
TEST(HostileServer, AThrottledConnectionWaitsWhileOthersAreServed) {
  ServerOnThread s("throttle");
  const int slow = s.Connect();
  const int other = s.Connect();
  ASSERT_GE(slow, 0);
  ASSERT_GE(other, 0);
  constexpr std::chrono::milliseconds kWait{400};
  // After its first request the slow connection owes kWait, once.
  uint64_t slow_session = 0;
  bool owed = false, paid = false;
  std::chrono::steady_clock::time_point owed_since;
  s.handler.on_stats = [&](const std::string& what) {
    if (what == "slow-1") owed = true;
  };
  s.handler.throttle = [&](const server::Peer& peer) -> std::chrono::microseconds {
    if (!owed || paid) return std::chrono::microseconds(0);
    if (slow_session == 0) {
      slow_session = peer.session_id;
      owed_since = std::chrono::steady_clock::now();
    }
    if (peer.session_id != slow_session) return std::chrono::microseconds(0);
    const auto left = owed_since + kWait - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) {
      paid = true;
      return std::chrono::microseconds(0);
    }
    return std::chrono::duration_cast<std::chrono::microseconds>(left) +
           std::chrono::microseconds(1);
  };
  std::vector<uint8_t> two = StatsFrame("slow-1", 1);
  const std::vector<uint8_t> second = StatsFrame("slow-2", 2);
  two.insert(two.end(), second.begin(), second.end());
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(WriteAll(slow, two));
  wire::Header h;
  std::vector<uint8_t> p;
  ASSERT_TRUE(ReadFrame(slow, &h, &p));
  EXPECT_EQ(h.request_id, 1u);
  // While the slow one waits, the other is served (several times over).
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(WriteAll(other, StatsFrame("other", 10 + i)));
    ASSERT_TRUE(ReadFrame(other, &h, &p));
    EXPECT_EQ(h.type, wire::MsgType::kStatsOk);
  }
  ASSERT_TRUE(ReadFrame(slow, &h, &p));
  EXPECT_EQ(h.request_id, 2u);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, kWait);
  close(slow);
  close(other);
  s.StopAndJoin();
  const auto& seen = s.handler.stats_seen;
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen.front(), "slow-1");
  EXPECT_EQ(seen.back(), "slow-2") << "the throttled request was answered before the others";
  EXPECT_TRUE(paid);
}

}  // namespace
}  // namespace cxltier::testing
