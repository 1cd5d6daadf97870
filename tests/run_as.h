// Running test code as another user: a forked child that drops to the
// user's uid and primary group (no supplementary groups). Needs root.
#pragma once

#include <grp.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <string>

#include "fork_alone.h"

namespace cxltier::testing {

// A user's uid and primary gid, looked up before any fork (the lookup may
// load NSS modules and allocate).
struct Identity {
  uid_t uid = static_cast<uid_t>(-1);
  gid_t gid = static_cast<gid_t>(-1);
  bool ok() const { return uid != static_cast<uid_t>(-1); }
};

inline Identity IdentityOf(const char* user) {
  const passwd* pw = getpwnam(user);
  return pw ? Identity{pw->pw_uid, pw->pw_gid} : Identity{};
}

inline bool DropTo(const Identity& id) {
  return id.ok() && setgroups(0, nullptr) == 0 && setgid(id.gid) == 0 && setuid(id.uid) == 0;
}
inline bool DropTo(const char* user) { return DropTo(IdentityOf(user)); }

inline uid_t UidOf(const char* user) { return IdentityOf(user).uid; }

// `fn` running in a forked child as a user; Wait() returns what fn returned
// ("" = every check passed), or why the child failed. The fork happens in the
// constructor, so other threads may start once it returned.
class ChildAs {
 public:
  ChildAs(const char* user, const std::function<std::string()>& fn) {
    const Identity id = IdentityOf(user);
    if (pipe(fds_) != 0) {
      early_ = "pipe";
      return;
    }
    pid_ = ForkAlone();
    if (pid_ < 0) {
      early_ = "fork: " + std::string(std::strerror(errno));
    } else if (pid_ == 0) {
      close(fds_[0]);
      std::string out;
      if (!DropTo(id)) {
        out = std::string("dropping to ") + user + ": " + std::strerror(errno);
      } else {
        try {
          out = fn();
        } catch (const std::exception& e) {
          out = std::string("exception: ") + e.what();
        }
      }
      if (write(fds_[1], out.data(), out.size()) < 0) _exit(3);
      _exit(0);
    }
    close(fds_[1]);
    fds_[1] = -1;
  }
  ~ChildAs() { Wait(); }
  ChildAs(const ChildAs&) = delete;
  ChildAs& operator=(const ChildAs&) = delete;

  std::string Wait() {
    if (pid_ <= 0) {
      if (fds_[0] >= 0) close(fds_[0]);
      if (fds_[1] >= 0) close(fds_[1]);
      fds_[0] = fds_[1] = -1;
      return early_;
    }
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = read(fds_[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    close(fds_[0]);
    fds_[0] = -1;
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) out += " (child exited badly)";
    early_ = out;
    return out;
  }

 private:
  int fds_[2] = {-1, -1};
  pid_t pid_ = -1;
  std::string early_;
};

// Runs `fn` in a forked child as `user` and waits for it.
inline std::string RunAs(const char* user, const std::function<std::string()>& fn) {
  return ChildAs(user, fn).Wait();
}

}  // namespace cxltier::testing
