// The Unix-socket server: accepts clients, frames and decodes their messages,
// hands them to a Handler on the I/O thread, and writes the answers back. The
// only code in the daemon that speaks the wire.
#pragma once

#include <sys/types.h>

#include <utility>  // Boost 1.74 Asio uses std::exchange without including it

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cxltier/wire.h"
#include "server/log_limiter.h"
#include "server/unique_fd.h"

namespace cxltier::server {

// Who is on the other end, from SO_PEERCRED (never from a message).
struct Peer {
  uint64_t session_id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // When `pid` started, read at accept (ProcessStartTime); 0: not known (a
  // pid in another PID namespace is 0). A pid and its start name one
  // process, whatever reuses the pid after it exits.
  uint64_t start_time = 0;
};

// When process `pid` started (field 22 of /proc/<pid>/stat, in clock ticks
// since boot); nothing when it does not run or cannot be seen.
std::optional<uint64_t> ProcessStartTime(pid_t pid);

// Called on the I/O thread only. A handler may throw (std::bad_alloc most
// likely): the server answers that request with kInternal and, unless the
// request only read state, closes the connection, since the handler may have
// changed part of what it keeps for it. OnDisconnect is called for every
// connection whose OnConnect was called, even one that threw.
class Handler {
 public:
  virtual ~Handler() = default;
  // A new connection; an error refuses it (the error is sent, then it closes).
  virtual Status OnConnect(const Peer& peer) = 0;
  virtual void OnDisconnect(const Peer& peer) = 0;
  // *segment_fd: the state segment's fd to pass back (the handler keeps owning it).
  virtual Result<wire::HelloOk> OnHello(const Peer& peer, const wire::Hello& m,
                                        int* segment_fd) = 0;
  virtual Result<wire::RegisterPoolOk> OnRegisterPool(const Peer& peer, const wire::RegisterPool& m,
                                                      UniqueFd memfd) = 0;
  // Copy mode. `fd`: the client's device-DAX fd (kDevdax) or the memfd it
  // imports (kImport). *pool_fd: the memfd the daemon made, to pass back (the
  // handler keeps owning it); -1: none to pass.
  virtual Result<wire::CreateTierPoolOk> OnCreateTierPool(const Peer& peer,
                                                          const wire::CreateTierPool& m,
                                                          UniqueFd fd, int* pool_fd) = 0;
  virtual Result<wire::AdmitOk> OnAdmit(const Peer& peer, const wire::Admit& m) = 0;
  virtual Result<wire::ReleaseOk> OnRelease(const Peer& peer, const wire::Release& m) = 0;
  virtual Result<wire::ReportOk> OnReport(const Peer& peer, const wire::Report& m) = 0;
  virtual Result<wire::HintOk> OnHint(const Peer& peer, const wire::Hint& m) = 0;
  virtual Result<wire::QueryTiersOk> OnQueryTiers(const Peer& peer, const wire::QueryTiers& m) = 0;
  virtual Result<wire::StatsOk> OnStats(const Peer& peer, const wire::Stats& m) = 0;
  // *reply_fd: an fd to pass back with the reply (a recording); the server
  // owns it and closes it once sent or when the connection closes.
  virtual Result<wire::AdminOk> OnAdmin(const Peer& peer, const wire::Admin& m,
                                        UniqueFd* reply_fd) = 0;
  // How long `peer`'s connection must wait before its next request is
  // dispatched or its socket read (a cost budget the handler keeps; zero: go
  // on). Asked before each request; while it waits, the others are served.
  virtual std::chrono::microseconds Throttle(const Peer& /*peer*/) {
    return std::chrono::microseconds(0);
  }
};

// Every bound here is what one hostile local user can make the daemon hold or
// do; the defaults match DaemonConfig's [limits].
struct ServerOptions {
  uint32_t max_message_bytes = wire::kDefaultMaxPayload;
  // Queued reply bytes of one connection above which its requests are no
  // longer dispatched nor its socket read (one larger reply is still sent).
  uint64_t max_reply_bytes = 4ull << 20;
  // A connection over max_reply_bytes this long is closed.
  std::chrono::milliseconds reply_stall_timeout{30000};
  // Unprocessed input held for one uid, over all its connections. Every
  // connection may hold one 64 KiB read chunk besides; a larger frame waits
  // for room. Raised to one largest frame plus a chunk if set lower.
  uint64_t max_input_bytes_per_uid = 32ull << 20;
  // A frame whose first byte arrived this long ago and that is still
  // incomplete closes its connection.
  std::chrono::milliseconds frame_timeout{10000};
  // A connection that never said hello and sent no complete request for this
  // long is closed (cxltierctl sends no hello, but a request every second).
  std::chrono::milliseconds idle_timeout{60000};
  // Called with a one-line description of every protocol error a client caused.
  std::function<void(const Peer&, const std::string&)> on_protocol_error;
  // The server's own events: accept back-offs, closed connections, handler
  // exceptions. Rate-limited by the server where an attacker could repeat them.
  std::function<void(LogLevel, const std::string&)> log;
  // Where lines about one connection go, limited per uid together with the
  // handler's own lines about its clients; null: `log`, limited server-wide.
  PeerLog* peer_log = nullptr;
};

// What the server did to protect itself, since it started.
struct ServerCounters {
  uint64_t stalled_closed = 0;      // closed: replies not read within reply_stall_timeout
  uint64_t frame_timeouts = 0;      // closed: a frame not complete within frame_timeout
  uint64_t idle_closed = 0;         // closed: no hello and no request within idle_timeout
  uint64_t accept_backoffs = 0;     // accept failed (out of fds or memory): waited before retrying
  uint64_t fds_dropped = 0;         // messages whose fds the kernel dropped (MSG_CTRUNC)
  uint64_t handler_exceptions = 0;  // exceptions caught around the handler or a session
};

class Session;

class Server {
 public:
  Server(boost::asio::io_context& io, Handler& handler, ServerOptions options);
  ~Server();

  // Binds `path` (replacing a stale socket file) with file mode `mode`.
  // `group` (unless -1) becomes the socket file's group before it listens; a
  // failure to set it is left in *group_status (the socket still works for
  // its owner).
  Status Listen(const std::string& path, unsigned mode, gid_t group = static_cast<gid_t>(-1),
                Status* group_status = nullptr);
  // Uses an already listening socket (systemd socket activation).
  Status Adopt(int listen_fd);
  // Stops accepting and closes every session.
  void Stop();
  size_t sessions() const { return sessions_.size(); }
  const ServerCounters& counters() const { return counters_; }
  // Unprocessed input bytes (buffer capacity) held for `uid` now.
  uint64_t input_bytes(uid_t uid) const;

 private:
  friend class Session;
  // Input held for one uid, and its sessions waiting for room.
  struct UidInput {
    uint64_t bytes = 0;
    std::vector<std::weak_ptr<Session>> waiting;
  };

  void Accept();
  void OnAccepted(boost::asio::local::stream_protocol::socket socket);
  void BackOff(const boost::system::error_code& ec);
  void Forget(Session* s);
  void ArmSweep();
  void Sweep();
  // Whether a session of `uid` holding `own_bytes` may grow its input to `new_bytes`.
  bool InputFits(uid_t uid, size_t own_bytes, size_t new_bytes) const;
  void AccountInput(uid_t uid, size_t old_bytes, size_t new_bytes);
  void WaitForInput(uid_t uid, std::weak_ptr<Session> s);
  void Log(LogLevel level, const std::string& what) const;
  // For lines a client can repeat at will: at most a burst per window.
  void LogLimited(LogLevel level, const std::string& what);
  // A line about a connection of `peer`: limited per uid (options_.peer_log).
  void LogAbout(const Peer& peer, LogLevel level, const std::string& what);

  boost::asio::io_context& io_;
  Handler& handler_;
  ServerOptions options_;
  uint64_t input_limit_bytes_;  // options_.max_input_bytes_per_uid, at least one frame
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::set<std::shared_ptr<Session>> sessions_;
  std::unordered_map<uid_t, UidInput> input_by_uid_;
  uint64_t next_session_id_ = 1;
  std::string path_;
  ino_t path_ino_ = 0;  // the socket file Listen made: Stop removes only that one
  dev_t path_dev_ = 0;
  UniqueFd path_lock_;  // flock on `path_.lock` while listening (Listen)
  bool stopped_ = false;
  ServerCounters counters_;
  // The sweep closes sessions past their timeouts; it runs while there are any.
  boost::asio::steady_timer sweep_timer_;
  bool sweep_armed_ = false;
  // Accept back-off: one burst of failures, the wait doubling up to 1 s.
  boost::asio::steady_timer backoff_timer_;
  std::chrono::milliseconds backoff_{0};
  uint64_t backoff_burst_failures_ = 0;
  std::chrono::steady_clock::time_point backoff_burst_start_;
  // LogLimited's window.
  LogLimiter log_limit_;  // one window for the whole server
};

}  // namespace cxltier::server
