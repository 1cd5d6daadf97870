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

namespace cxltier::testing {

inline bool DropTo(const char* user) {
  const passwd* pw = getpwnam(user);
  if (!pw) return false;
  return setgroups(0, nullptr) == 0 && setgid(pw->pw_gid) == 0 && setuid(pw->pw_uid) == 0;
}

inline uid_t UidOf(const char* user) {
  const passwd* pw = getpwnam(user);
  return pw ? pw->pw_uid : static_cast<uid_t>(-1);
}

// Runs `fn` in a forked child as `user`; returns what fn returned ("" = every
// check passed), or why the child failed.
inline std::string RunAs(const char* user, const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string out;
    if (!DropTo(user)) {
      out = std::string("dropping to ") + user + ": " + std::strerror(errno);
    } else {
      try {
        out = fn();
      } catch (const std::exception& e) {
        out = std::string("exception: ") + e.what();
      }
    }
    if (write(fds[1], out.data(), out.size()) < 0) _exit(3);
    _exit(0);
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) out += " (child exited badly)";
  return out;
}

}  // namespace cxltier::testing
