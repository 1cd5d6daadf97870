#include "server/server.h"

#include "cxltier/detail/fd_passing.h"
#include "server/unique_fd.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <type_traits>

namespace cxltier::server {

namespace asio = boost::asio;
using stream = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

namespace {

// Every connection may hold one read chunk of input whatever its uid holds,
// so hello, stats and reports are never held back by another connection's
// big frame; only a frame larger than this competes for the uid's room.
constexpr size_t kChunkBytes = 64 * 1024;
// One turn of a session (a readable event, or its continuation) dispatches at
// most this many frames and payload bytes and reads at most this much; then
// it yields to the other sessions, so a deep pipeline cannot starve them.
constexpr size_t kMaxFramesPerTurn = 64;
constexpr size_t kMaxPayloadPerTurn = 1u << 20;
constexpr size_t kMaxReadPerTurn = 1u << 20;
// ...and once its handlers have run this long, it yields after the request
// at hand: a pipeline of requests that each cost milliseconds (1,024-block
// admits of a million-block client) passes others between every one.
constexpr std::chrono::microseconds kMaxTurnTime{1000};
// Accept back-off: out of fds, the listening socket stays readable and an
// immediate retry spins on a core while answering no one.
constexpr std::chrono::milliseconds kFirstBackoff{100};
constexpr std::chrono::milliseconds kMaxBackoff{1000};
// Lines the server logs about what clients made it do (closed connections,
// handler exceptions), at most this many per window; the rest are counted.
constexpr uint32_t kLogBurst = 20;
constexpr std::chrono::seconds kLogWindow{10};

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

std::string Seconds(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

// Errors after which accepting again at once is right: the failure belonged
// to one connection, not to the daemon.
bool TransientAcceptError(const boost::system::error_code& ec) {
  return ec == asio::error::connection_aborted || ec == asio::error::interrupted ||
         ec == asio::error::would_block || ec == asio::error::try_again;
}

}  // namespace

// Input bytes not yet framed. Unlike std::vector it neither zero-fills nor
// grows by doubling: the pages of a large frame's buffer are touched only as
// its bytes arrive, and its capacity is exactly what the server accounts for.
// Outside the anonymous namespace: Session, declared in server.h, holds one.
class InputBuffer {
 public:
  std::span<const uint8_t> bytes() const { return {data_.get(), size_}; }
  uint8_t* end() { return data_.get() + size_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  void Added(size_t n) { size_ += n; }
  void Consume(size_t n) {
    if (n == 0) return;
    std::memmove(data_.get(), data_.get() + n, size_ - n);
    size_ -= n;
  }
  // REQUIRES: capacity >= size(). Throws std::bad_alloc before changing anything.
  void Reallocate(size_t capacity) {
    if (capacity == capacity_) return;
    std::unique_ptr<uint8_t[]> fresh;
    if (capacity) fresh.reset(new uint8_t[capacity]);  // not value-initialized: no page touched
    if (size_) std::memcpy(fresh.get(), data_.get(), size_);
    data_ = std::move(fresh);
    capacity_ = capacity;
  }
  void Free() {
    data_.reset();
    size_ = capacity_ = 0;
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

// One client connection. Reads with recvmsg so SCM_RIGHTS fds arrive with the
// bytes; frames are parsed from an input buffer; answers are queued.
//
// Back-pressure: the session reads only while its input holds no complete
// frame it could not dispatch, its queued replies are within max_reply_bytes,
// the room its input needs fits its uid's share, and the handler does not
// throttle it (Handler::Throttle: a cost budget spent). Paused, it leaves the
// bytes in the kernel, whose socket buffer then blocks the client.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Server& server, stream::socket socket, Peer peer)
      : server_(server),
        socket_(std::move(socket)),
        peer_(peer),
        pause_timer_(server.io_),
        last_request_(Clock::now()) {}

  const Peer& peer() const { return peer_; }

  void Start() {
    try {
      Status refusal;
      try {
        refusal = server_.handler_.OnConnect(peer_);
        connected_ = refusal.ok();
      } catch (const std::exception& e) {
        connected_ = true;  // the handler may hold part of it: OnDisconnect cleans up
        HandlerThrew("connect", e.what());
        refusal =
            wire::Error{wire::ErrorCode::kInternal, "the daemon failed to take the connection"};
      }
      if (!refusal.ok()) {
        Send(refusal, 0);
        close_after_write_ = true;
        return;
      }
    } catch (const std::exception& e) {
      HandlerThrew("connect", e.what());
      return Close();
    }
    Pump();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ec;
    socket_.close(ec);
    pause_timer_.cancel();
    out_.clear();
    fds_.clear();
    DropInput();
    if (connected_) {
      try {
        server_.handler_.OnDisconnect(peer_);
      } catch (const std::exception& e) {
        HandlerThrew("disconnect", e.what());
      }
    }
    server_.Forget(this);
  }

  // The uid's input shrank: try again to get the room this session waits for.
  void ResumeInput() {
    if (closed_ || !waiting_input_) return;
    waiting_input_ = false;
    Pump();
  }

  // Closes the session if one of its timeouts passed.
  void CheckTimeouts(Clock::time_point now) {
    if (closed_) return;
    const ServerOptions& o = server_.options_;
    if (stall_since_ && now - *stall_since_ >= o.reply_stall_timeout) {
      ++server_.counters_.stalled_closed;
      server_.LogAbout(peer_, LogLevel::kWarn,
                       Who() + ": closed: " + Mib(out_bytes_) + " of replies not read for " +
                           Seconds(now - *stall_since_));
      return Close();
    }
    // A stalled or throttled session is not read, so its frame cannot
    // progress: only the stall counts then (the frame's clock restarts when
    // reading resumes).
    if (frame_since_ && !stall_since_ && !throttled_ && now - *frame_since_ >= o.frame_timeout) {
      ++server_.counters_.frame_timeouts;
      server_.LogAbout(peer_, LogLevel::kWarn,
                       Who() + ": closed: a frame started " + Seconds(now - *frame_since_) +
                           " ago is incomplete (" + std::to_string(in_.size()) +
                           " bytes of it arrived)");
      return Close();
    }
    if (!hello_ok_ && now - last_request_ >= o.idle_timeout) {
      ++server_.counters_.idle_closed;
      server_.LogAbout(
          peer_, LogLevel::kInfo,
          Who() + ": closed: no hello and no request for " + Seconds(now - last_request_));
      return Close();
    }
  }

 private:
  static constexpr size_t kMaxQueuedFds = 4;

  struct Turn {
    size_t frames = 0;
    size_t payload_bytes = 0;
    size_t read_bytes = 0;
  };
  enum class Read { kData, kAgain, kNoRoom, kClosed };

  std::string Who() const {
    return "client pid " + std::to_string(peer_.pid) + " uid " + std::to_string(peer_.uid);
  }

  bool Stalled() const { return out_bytes_ > server_.options_.max_reply_bytes; }

  // Bytes of the frame at the head of the input, once its header is in.
  size_t HeadFrameBytes() const {
    if (in_.size() < wire::kHeaderBytes) return 0;
    const wire::Header h = *wire::DecodeHeader(in_.bytes());
    // Process refused larger ones; the bound keeps this honest regardless.
    return wire::kHeaderBytes + std::min(h.payload_bytes, server_.options_.max_message_bytes);
  }
  bool HeadFrameComplete() const {
    const size_t frame = HeadFrameBytes();
    return frame && in_.size() >= frame;
  }

  void ArmRead() {
    socket_.async_wait(stream::socket::wait_read,
                       [self = shared_from_this()](const boost::system::error_code& ec) {
                         if (self->closed_) return;
                         if (ec) return self->Close();
                         self->Pump();
                       });
  }

  void Yield() {
    asio::post(server_.io_, [self = shared_from_this()] { self->Pump(); });
  }

  // The handler throttles this connection: nothing is dispatched or read
  // until `wait` has passed (replies still go out).
  void Pause(std::chrono::microseconds wait) {
    throttled_ = true;
    pause_timer_.expires_after(wait);
    pause_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->closed_) return;
      self->throttled_ = false;
      if (self->frame_since_) self->frame_since_ = Clock::now();  // it could not progress
      self->Pump();
    });
  }

  // Reads and dispatches until the socket is drained, the turn is used up or
  // back-pressure pauses the session. Exactly one way back is left armed: a
  // read wait, a posted continuation, the uid's wake-up, or (stalled) the
  // writer.
  void Pump() {
    if (closed_ || throttled_) return;
    try {
      RunTurn();
    } catch (const std::exception& e) {
      HandlerThrew("session", e.what());
      Close();
    }
  }

  void RunTurn() {
    const Clock::time_point now = Clock::now();
    Turn turn;
    for (;;) {
      Process(&turn, now);
      if (closed_) return;
      if (close_after_write_) return DropInput();  // nothing more is read; the writer closes
      if (throttle_.count() > 0) {
        const std::chrono::microseconds wait = std::exchange(throttle_, {});
        TrimInput();
        return Pause(wait);
      }
      if (Stalled()) {
        paused_for_replies_ = true;
        return TrimInput();
      }
      if (HeadFrameComplete()) return Yield();  // frames left over: the others go first
      if (in_.size() == 0) {
        frame_since_.reset();
      } else if (!frame_since_) {
        frame_since_ = now;
      }
      if (turn.read_bytes >= kMaxReadPerTurn) return Yield();
      switch (ReadOnce(&turn)) {
        case Read::kData:
          continue;
        case Read::kAgain:
          TrimInput();
          return ArmRead();
        case Read::kNoRoom:
          waiting_input_ = true;
          return server_.WaitForInput(peer_.uid, weak_from_this());
        case Read::kClosed:
          return Close();
      }
    }
  }

  // One recvmsg into the input, after making room for the head frame (or one
  // chunk) if the uid's share allows it.
  Read ReadOnce(Turn* turn) {
    const size_t want = std::max(kChunkBytes, HeadFrameBytes());
    if (in_.capacity() < want) {
      if (!server_.InputFits(peer_.uid, in_.capacity(), want)) return Read::kNoRoom;
      SetInputCapacity(want);
    }
    const size_t room = std::min(in_.capacity() - in_.size(), kMaxReadPerTurn - turn->read_bytes);
    for (;;) {
      bool dropped = false;
      const ssize_t n = detail::RecvWithFds(
          socket_.native_handle(), in_.end(), room, MSG_DONTWAIT,
          [this](int fd) {
            fds_.emplace_back(fd);
            // Stray fds beyond a few are closed.
            if (fds_.size() > kMaxQueuedFds) fds_.pop_front();
          },
          &dropped);
      if (dropped) {
        fds_dropped_ = true;
        ++server_.counters_.fds_dropped;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return Read::kAgain;
        return Read::kClosed;
      }
      if (n == 0) return Read::kClosed;
      in_.Added(static_cast<size_t>(n));
      turn->read_bytes += static_cast<size_t>(n);
      return Read::kData;
    }
  }

  void SetInputCapacity(size_t capacity) {
    const size_t old = in_.capacity();
    in_.Reallocate(capacity);
    server_.AccountInput(peer_.uid, old, capacity);
  }
  void DropInput() {
    const size_t old = in_.capacity();
    in_.Free();
    server_.AccountInput(peer_.uid, old, 0);
  }
  // Gives back what the input no longer needs: all of it when empty, the rest
  // of a large frame's room once that frame is gone.
  void TrimInput() {
    if (in_.size() == 0) return DropInput();
    const size_t keep = std::max({kChunkBytes, HeadFrameBytes(), in_.size()});
    if (in_.capacity() > keep) SetInputCapacity(keep);
  }

  void ProtocolError(const std::string& what) {
    if (server_.options_.on_protocol_error) server_.options_.on_protocol_error(peer_, what);
  }

  void HandlerThrew(const char* what, const char* why) {
    ++server_.counters_.handler_exceptions;
    server_.LogAbout(peer_, LogLevel::kError, Who() + ": " + what + " threw: " + why);
  }

  // Dispatches complete frames from the head of the input while the turn and
  // the reply bound allow, then drops what it consumed.
  void Process(Turn* turn, Clock::time_point now) {
    const uint32_t max_payload = server_.options_.max_message_bytes;
    size_t pos = 0;
    while (!close_after_write_ && !Stalled() && turn->frames < kMaxFramesPerTurn &&
           turn->payload_bytes < kMaxPayloadPerTurn &&
           (turn->frames == 0 || Clock::now() - now < kMaxTurnTime)) {
      const std::span<const uint8_t> rest = in_.bytes().subspan(pos);
      if (rest.size() < wire::kHeaderBytes) break;
      // A request waits while the handler throttles the connection; then
      // so does reading (RunTurn).
      if ((throttle_ = server_.handler_.Throttle(peer_)).count() > 0) break;
      const wire::Header h = *wire::DecodeHeader(rest);
      Status err = wire::CheckHeader(h, max_payload);
      // An unknown message is skipped whole, so its size must be bounded too.
      if (err.code == wire::ErrorCode::kUnknownType && h.payload_bytes > max_payload) {
        err = wire::Error{wire::ErrorCode::kTooLarge,
                          err.message + " with a payload of " + std::to_string(h.payload_bytes) +
                              " bytes, over the limit of " + std::to_string(max_payload)};
      }
      if (!err.ok() && err.code != wire::ErrorCode::kUnknownType) {
        ProtocolError(err.message);
        Send(err, h.request_id);
        close_after_write_ = true;  // the stream cannot be trusted past this point
        break;
      }
      const size_t frame = wire::kHeaderBytes + h.payload_bytes;
      if (rest.size() < frame) break;
      if (!err.ok()) {
        ProtocolError(err.message);
        Send(err, h.request_id);
      } else {
        Dispatch(h, rest.subspan(wire::kHeaderBytes, h.payload_bytes));
      }
      pos += frame;
      ++turn->frames;
      turn->payload_bytes += h.payload_bytes;
      last_request_ = now;
      frame_since_.reset();
    }
    in_.Consume(pos);
  }

  // Decodes one request, runs `fn` and queues its answer. A handler that
  // throws gets kInternal; unless `read_only`, the connection is then closed.
  template <typename M, typename Fn>
  void Handle(const wire::Header& h, std::span<const uint8_t> payload, const char* name,
              bool read_only, Fn&& fn) {
    try {
      M m;
      if (Status st = wire::Decode(payload, &m); !st.ok()) {
        st = st.Context(std::string(name) + ": ");
        ProtocolError(st.message);
        return Send(st, h.request_id);
      }
      auto answer = fn(m);
      if (answer.ok()) {
        Send(*answer, h.request_id);
      } else {
        Send(answer.status(), h.request_id);
      }
    } catch (const std::exception& e) {
      HandlerThrew(name, e.what());
      Send(wire::Error{wire::ErrorCode::kInternal,
                       std::string(name) + " failed inside the daemon (" + e.what() + ")" +
                           (read_only ? "; try again" : "; the connection is closed")},
           h.request_id);
      if (!read_only) close_after_write_ = true;  // its state may be half changed
    }
  }

  // The oldest fd that came with this connection's bytes, if any.
  UniqueFd TakeFd() {
    UniqueFd fd;
    if (!fds_.empty()) {
      fd = std::move(fds_.front());
      fds_.pop_front();
    }
    return fd;
  }
  // The answer to a request that needed an fd and came without one.
  wire::Error MissingFd(const std::string& what) {
    if (std::exchange(fds_dropped_, false)) {
      return wire::Error{wire::ErrorCode::kLimit,
                         "the daemon could not receive the fd (out of file descriptors or too "
                         "many fds in one message)"};
    }
    return wire::Error{wire::ErrorCode::kBadPool, what};
  }

  void Dispatch(const wire::Header& h, std::span<const uint8_t> payload) {
    Handler& handler = server_.handler_;
    switch (h.type) {
      case wire::MsgType::kHello:
        return Handle<wire::Hello>(h, payload, "hello", false, [&](const wire::Hello& m) {
          int fd = -1;
          auto a = handler.OnHello(peer_, m, &fd);
          if (a.ok()) {
            pending_fd_ = fd;
            hello_ok_ = true;
          }
          return a;
        });
      case wire::MsgType::kRegisterPool:
        return Handle<wire::RegisterPool>(
            h, payload, "register-pool", false,
            [&](const wire::RegisterPool& m) -> Result<wire::RegisterPoolOk> {
              UniqueFd fd = TakeFd();
              if (m.kind == wire::PoolKind::kMemfd && !fd.valid()) {
                return MissingFd("a memfd pool needs its fd passed with SCM_RIGHTS");
              }
              return handler.OnRegisterPool(peer_, m, std::move(fd));
            });
      case wire::MsgType::kCreateTierPool:
        return Handle<wire::CreateTierPool>(
            h, payload, "create-tier-pool", false,
            [&](const wire::CreateTierPool& m) -> Result<wire::CreateTierPoolOk> {
              UniqueFd fd = TakeFd();
              if (m.source == wire::TierPoolSource::kDevdax && !fd.valid()) {
                return MissingFd("a device-DAX tier pool needs the device's fd (SCM_RIGHTS)");
              }
              if (m.source == wire::TierPoolSource::kImport && !fd.valid()) {
                return MissingFd("an imported tier pool needs its memfd (SCM_RIGHTS)");
              }
              if (m.source == wire::TierPoolSource::kDaemon && fd.valid()) {
                return wire::Error{wire::ErrorCode::kBadPool,
                                   "a tier pool the daemon creates takes no fd"};
              }
              int pool_fd = -1;
              auto a = handler.OnCreateTierPool(peer_, m, std::move(fd), &pool_fd);
              if (a.ok()) pending_fd_ = pool_fd;
              return a;
            });
      case wire::MsgType::kAdmit:
        return Handle<wire::Admit>(h, payload, "admit", false,
                                   [&](const wire::Admit& m) { return handler.OnAdmit(peer_, m); });
      case wire::MsgType::kRelease:
        return Handle<wire::Release>(h, payload, "release", false, [&](const wire::Release& m) {
          return handler.OnRelease(peer_, m);
        });
      case wire::MsgType::kReport:
        return Handle<wire::Report>(h, payload, "report", false, [&](const wire::Report& m) {
          return handler.OnReport(peer_, m);
        });
      case wire::MsgType::kHint:
        return Handle<wire::Hint>(h, payload, "hint", false,
                                  [&](const wire::Hint& m) { return handler.OnHint(peer_, m); });
      case wire::MsgType::kQueryTiers:
        return Handle<wire::QueryTiers>(
            h, payload, "query-tiers", true,
            [&](const wire::QueryTiers& m) { return handler.OnQueryTiers(peer_, m); });
      case wire::MsgType::kStats:
        return Handle<wire::Stats>(h, payload, "stats", true,
                                   [&](const wire::Stats& m) { return handler.OnStats(peer_, m); });
      case wire::MsgType::kAdmin:
        // What an admin request changes is the daemon's, not this connection's.
        return Handle<wire::Admin>(h, payload, "admin", true, [&](const wire::Admin& m) {
          UniqueFd fd;
          auto a = handler.OnAdmin(peer_, m, &fd);
          if (a.ok()) owned_fd_ = std::move(fd);
          return a;
        });
      default: {
        const std::string text = "message type " + std::to_string(static_cast<int>(h.type)) +
                                 " is a reply; clients may not send it";
        ProtocolError(text);
        return Send(wire::Error{wire::ErrorCode::kUnknownType, text}, h.request_id);
      }
    }
  }

  template <typename M>
  void Send(const M& m, uint32_t request_id) {
    Out out;
    // An admin answer's fd goes with that answer or is closed: never with a
    // later one (an Error sent instead, or an Encode that throws).
    if constexpr (std::is_same_v<M, wire::AdminOk>) out.owned = std::move(owned_fd_);
    owned_fd_.Reset();
    wire::Encode(m, request_id, out.bytes);
    if constexpr (std::is_same_v<M, wire::HelloOk> || std::is_same_v<M, wire::CreateTierPoolOk>) {
      out.fd = std::exchange(pending_fd_, -1);
    }
    if constexpr (std::is_same_v<M, wire::AdminOk>) out.fd = out.owned.get();
    const bool was_stalled = Stalled();
    out_bytes_ += out.bytes.size();
    out_.push_back(std::move(out));
    if (!was_stalled && Stalled()) stall_since_ = Clock::now();
    if (!writing_) WriteNext();
  }

  struct Out {
    std::vector<uint8_t> bytes;
    int fd = -1;  // sent with the first byte; not owned, unless it is `owned`'s
    UniqueFd owned;
    size_t sent = 0;
  };

  void WriteNext() {
    if (closed_) return;
    if (out_.empty()) {
      writing_ = false;
      if (close_after_write_) Close();
      return;
    }
    writing_ = true;
    socket_.async_wait(
        stream::socket::wait_write,
        [self = shared_from_this()](const boost::system::error_code& ec) { self->OnWritable(ec); });
  }

  void OnWritable(const boost::system::error_code& ec) {
    if (closed_) return;
    if (ec) return Close();
    while (!out_.empty()) {
      Out& o = out_.front();
      const ssize_t n = detail::SendWithFd(socket_.native_handle(), o.bytes.data() + o.sent,
                                           o.bytes.size() - o.sent, o.sent == 0 ? o.fd : -1,
                                           MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return Close();
      }
      o.sent += static_cast<size_t>(n);
      out_bytes_ -= static_cast<size_t>(n);
      if (o.sent == o.bytes.size()) out_.pop_front();
    }
    if (stall_since_ && !Stalled()) {
      stall_since_.reset();
      if (frame_since_) frame_since_ = Clock::now();  // it could not progress while paused
    }
    if (paused_for_replies_ && !Stalled()) {
      paused_for_replies_ = false;
      Pump();  // its replies queue behind ours; the wait below covers them
      if (closed_) return;
    }
    WriteNext();
  }

  Server& server_;
  stream::socket socket_;
  Peer peer_;
  asio::steady_timer pause_timer_;        // wakes a throttled session
  std::chrono::microseconds throttle_{};  // Process stopped for this: pause before going on
  InputBuffer in_;
  std::deque<UniqueFd> fds_;
  std::deque<Out> out_;
  uint64_t out_bytes_ = 0;  // queued reply bytes not yet sent
  int pending_fd_ = -1;
  UniqueFd owned_fd_;                             // an admin reply's fd, until Send takes it
  Clock::time_point last_request_;                // connected, or the last complete frame
  std::optional<Clock::time_point> frame_since_;  // an incomplete frame's first byte
  std::optional<Clock::time_point> stall_since_;  // out_bytes_ went over the bound
  bool writing_ = false;
  bool connected_ = false;
  bool closed_ = false;
  bool close_after_write_ = false;
  bool hello_ok_ = false;
  bool fds_dropped_ = false;  // the kernel dropped fds sent to us (MSG_CTRUNC)
  bool paused_for_replies_ = false;
  bool waiting_input_ = false;
  bool throttled_ = false;  // waiting for pause_timer_
};

Server::Server(asio::io_context& io, Handler& handler, ServerOptions options)
    : io_(io),
      handler_(handler),
      options_(std::move(options)),
      input_limit_bytes_(std::max<uint64_t>(
          options_.max_input_bytes_per_uid,
          wire::kHeaderBytes + uint64_t{options_.max_message_bytes} + kChunkBytes)),
      acceptor_(io),
      sweep_timer_(io),
      backoff_timer_(io),
      log_limit_(kLogBurst, kLogWindow) {}

Server::~Server() { Stop(); }

namespace {
// Whether a process listens on the Unix socket at `path` (a connect that
// succeeds, or finds its backlog full), rather than a file left by a run
// that ended.
bool SomeoneListens(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool answers =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 || errno == EAGAIN;
  ::close(fd);
  return answers;
}
}  // namespace

namespace {
std::string lock_path_for(const std::string& path) { return path + ".lock"; }
}  // namespace

Status Server::Listen(const std::string& path, unsigned mode, gid_t group, Status* group_status) {
  boost::system::error_code ec;
  // Two daemons starting together could both find no one listening (between
  // one's bind and its listen) and each replace the other's socket: the
  // check and the bind are made under a lock on `path.lock`, held while this
  // server listens. The file stays (removing a lock file races its next
  // taker). It is the daemon's alone (0600, its euid's): a client that could
  // open it could take the lock the moment this daemon stops and keep every
  // later start out. One that is not ours (a run of another uid made it, or
  // someone who can write the directory) is not used: the start goes on
  // without the lock, as before it, and says so.
  const std::string lock_path = lock_path_for(path);
  const auto open_lock = [&] {
    return UniqueFd(
        ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600));
  };
  UniqueFd lock = open_lock();
  struct stat ls {};
  std::string unlocked;
  if (lock.valid() && ::fstat(lock.get(), &ls) == 0 && S_ISREG(ls.st_mode) &&
      ls.st_uid == ::geteuid() && (ls.st_mode & 077) != 0) {
    // Ours but open to others (a build of 2026-12-07 made it 0644): someone
    // may hold it open already, so a new file, not a chmod.
    lock.Reset();
    ::unlink(lock_path.c_str());
    lock = open_lock();
  }
  if (!lock.valid()) {
    unlocked = std::strerror(errno);
  } else if (::fstat(lock.get(), &ls) != 0 || !S_ISREG(ls.st_mode) || ls.st_uid != ::geteuid() ||
             (ls.st_mode & 077) != 0) {
    unlocked = "not a regular file of this daemon's uid, 0600";
    lock.Reset();
  }
  if (!unlocked.empty()) {
    Log(LogLevel::kWarn, lock_path + ": " + unlocked +
                             "; starting without the lock that keeps two daemons starting "
                             "together off one socket");
  } else if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return Status::Internal(
        lock_path + ": " +
        (errno == EWOULDBLOCK ? std::string("another cxltierd is starting or listening on this "
                                            "socket; stop it, or give this daemon its own [daemon] "
                                            "socket")
                              : std::string(std::strerror(errno))));
  }
  if (SomeoneListens(path)) {
    return Status::Internal(
        path +
        ": another process listens on this socket; stop it, or give this daemon "
        "its own [daemon] socket");
  }
  ::unlink(path.c_str());
  acceptor_.open(stream(), ec);
  if (!ec) acceptor_.bind(stream::endpoint(path), ec);
  if (ec) return Status::Internal(path + ": " + ec.message());
  struct stat made {};
  if (::stat(path.c_str(), &made) == 0) {
    path_ino_ = made.st_ino;
    path_dev_ = made.st_dev;
  }
  // Mode and group before listen(): a client of the group that connects the
  // moment the socket accepts must not find it still root's alone.
  if (::chmod(path.c_str(), mode) != 0)
    return Status::Internal(path + ": chmod: " + std::strerror(errno));
  if (group != static_cast<gid_t>(-1) &&
      ::chown(path.c_str(), static_cast<uid_t>(-1), group) != 0) {
    if (group_status) {
      *group_status =
          Status::Fail(wire::ErrorCode::kInternal, std::string("chown: ") + std::strerror(errno));
    }
  }
  acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::Internal(path + ": " + ec.message());
  path_ = path;
  path_lock_ = std::move(lock);
  Accept();
  return Status::Ok();
}

Status Server::Adopt(int listen_fd) {
  boost::system::error_code ec;
  acceptor_.assign(stream(), listen_fd, ec);
  if (ec) return Status::Internal("adopting fd " + std::to_string(listen_fd) + ": " + ec.message());
  Accept();
  return Status::Ok();
}

void Server::Accept() {
  if (stopped_ || !acceptor_.is_open()) return;
  acceptor_.async_accept([this](const boost::system::error_code& ec, stream::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec && !TransientAcceptError(ec)) return BackOff(ec);
    if (!ec) {
      if (backoff_burst_failures_) {
        Log(LogLevel::kWarn, "accept works again after " + std::to_string(backoff_burst_failures_) +
                                 " failures over " + Seconds(Clock::now() - backoff_burst_start_));
        backoff_burst_failures_ = 0;
      }
      try {
        OnAccepted(std::move(socket));
      } catch (const std::exception& e) {
        ++counters_.handler_exceptions;
        LogLimited(LogLevel::kError, std::string("accepting a connection threw: ") + e.what());
      }
    }
    Accept();
  });
}

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  // Read on every accept: one open and one read(2) of at most 1 KiB, not a
  // stream (BM_AcceptPeer measures it against the accept itself). The whole
  // file, not a line: a command name may hold a newline.
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  const UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  char text[1024];
  ssize_t got;
  do {
    got = ::read(fd.get(), text, sizeof(text));
  } while (got < 0 && errno == EINTR);
  if (got <= 0) return std::nullopt;
  const std::string_view line(text, static_cast<size_t>(got));
  // The command name (field 2) may hold spaces, parentheses and newlines:
  // the fields after it start past its last ')'. Field 22 is the start time.
  const size_t close = line.rfind(')');
  if (close == std::string_view::npos) return std::nullopt;
  std::string_view rest = line.substr(close + 1);
  std::string_view field;
  for (int i = 3; i <= 22; ++i) {
    const size_t begin = rest.find_first_not_of(' ');
    if (begin == std::string_view::npos) return std::nullopt;
    rest = rest.substr(begin);
    field = rest.substr(0, std::min(rest.find(' '), rest.size()));
    rest = rest.substr(field.size());
  }
  uint64_t start = 0;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), start);
  if (ec != std::errc() || end != field.data() + field.size()) return std::nullopt;
  return start;
}

void Server::OnAccepted(stream::socket socket) {
  Peer peer;
  peer.session_id = next_session_id_++;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
    peer.start_time = ProcessStartTime(cred.pid).value_or(0);
  }
  auto s = std::make_shared<Session>(*this, std::move(socket), peer);
  sessions_.insert(s);
  ArmSweep();
  s->Start();
}

// Out of fds (EMFILE, ENFILE) or memory (ENOBUFS, ENOMEM): the pending
// connection stays queued and the listening socket readable, so retrying at
// once would spin. Wait instead, longer each time, and log once per burst.
void Server::BackOff(const boost::system::error_code& ec) {
  ++counters_.accept_backoffs;
  if (backoff_burst_failures_++ == 0) {
    backoff_burst_start_ = Clock::now();
    backoff_ = kFirstBackoff;
    Log(LogLevel::kWarn, "accept: " + ec.message() +
                             "; retrying after 100 ms, doubling up to 1 s, until it works (out "
                             "of file descriptors? see LimitNOFILE and [limits])");
  } else {
    backoff_ = std::min(backoff_ * 2, kMaxBackoff);
  }
  backoff_timer_.expires_after(backoff_);
  backoff_timer_.async_wait([this](const boost::system::error_code& e) {
    if (e == asio::error::operation_aborted || stopped_) return;
    Accept();
  });
}

void Server::Forget(Session* s) {
  for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
    if (it->get() == s) {
      // Keep the session alive until its handlers unwind.
      asio::post(io_, [keep = *it] {});
      sessions_.erase(it);
      return;
    }
  }
}

void Server::ArmSweep() {
  if (sweep_armed_ || stopped_) return;
  sweep_armed_ = true;
  // A quarter of the shortest timeout: a session is closed at most that late.
  const auto shortest =
      std::min({options_.reply_stall_timeout, options_.frame_timeout, options_.idle_timeout});
  const auto period = std::clamp<std::chrono::milliseconds>(
      shortest / 4, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
  sweep_timer_.expires_after(period);
  sweep_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;
    sweep_armed_ = false;
    Sweep();
    if (!sessions_.empty()) ArmSweep();
  });
}

void Server::Sweep() {
  const Clock::time_point now = Clock::now();
  const std::vector<std::shared_ptr<Session>> all(sessions_.begin(), sessions_.end());
  for (const auto& s : all) s->CheckTimeouts(now);
}

uint64_t Server::input_bytes(uid_t uid) const {
  const auto it = input_by_uid_.find(uid);
  return it == input_by_uid_.end() ? 0 : it->second.bytes;
}

bool Server::InputFits(uid_t uid, size_t own_bytes, size_t new_bytes) const {
  if (new_bytes <= kChunkBytes) return true;
  return input_bytes(uid) - own_bytes + new_bytes <= input_limit_bytes_;
}

void Server::AccountInput(uid_t uid, size_t old_bytes, size_t new_bytes) {
  if (old_bytes == new_bytes) return;
  UidInput& u = input_by_uid_[uid];
  u.bytes = u.bytes - old_bytes + new_bytes;
  if (new_bytes < old_bytes && !u.waiting.empty()) {
    // Every waiter tries again; those that still do not fit wait again.
    for (const std::weak_ptr<Session>& w : std::exchange(u.waiting, {})) {
      asio::post(io_, [w] {
        if (auto s = w.lock()) s->ResumeInput();
      });
    }
  }
  if (u.bytes == 0 && u.waiting.empty()) input_by_uid_.erase(uid);
}

void Server::WaitForInput(uid_t uid, std::weak_ptr<Session> s) {
  input_by_uid_[uid].waiting.push_back(std::move(s));
}

void Server::Log(LogLevel level, const std::string& what) const {
  if (options_.log) options_.log(level, what);
}

void Server::LogLimited(LogLevel level, const std::string& what) {
  const LogLimiter::Verdict v = log_limit_.Allow(0, Clock::now());
  if (v.suppressed) {
    Log(LogLevel::kWarn, std::to_string(v.suppressed) + " more lines about clients in " +
                             Seconds(v.ended) + " were suppressed");
  }
  if (v.log) Log(level, what);
}

void Server::LogAbout(const Peer& peer, LogLevel level, const std::string& what) {
  if (options_.peer_log) {
    options_.peer_log->Line(peer.uid, level, what);
  } else {
    LogLimited(level, what);
  }
}

void Server::Stop() {
  stopped_ = true;
  boost::system::error_code ec;
  acceptor_.close(ec);
  sweep_timer_.cancel();
  backoff_timer_.cancel();
  // Only the socket this server made: another daemon's, made at the same
  // path since, stays.
  struct stat now {};
  if (!path_.empty() && ::stat(path_.c_str(), &now) == 0 && now.st_ino == path_ino_ &&
      now.st_dev == path_dev_) {
    ::unlink(path_.c_str());
  }
  path_.clear();
  path_lock_.Reset();
  auto all = sessions_;
  for (const auto& s : all) s->Close();
}

}  // namespace cxltier::server
