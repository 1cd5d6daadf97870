// SCM_RIGHTS over a Unix stream socket, shared by libcxltier and the daemon's
// server. Not part of the client API.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <cstring>

namespace cxltier::detail {

// sendmsg of up to `n` bytes with `fd` attached when fd >= 0 (the fd travels
// with the first byte). Returns sendmsg's result.
inline ssize_t SendWithFd(int sock, const void* data, size_t n, int fd, int flags) {
  iovec iov{const_cast<void*>(data), n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(sock, &msg, flags);
}

// recvmsg of up to `n` bytes; `on_fd(int)` takes ownership of every fd that
// came with them. Returns recvmsg's result. *fds_dropped (if given) is set
// when the kernel dropped fds that came with these bytes (MSG_CTRUNC): the
// receiver is out of fds, or more than 8 came in one message. The sender
// cannot tell, so the receiver must say so when it misses one.
template <typename OnFd>
ssize_t RecvWithFds(int sock, void* data, size_t n, int flags, OnFd&& on_fd,
                    bool* fds_dropped = nullptr) {
  iovec iov{data, n};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t r = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
  if (r < 0) return r;
  if (fds_dropped) *fds_dropped = (msg.msg_flags & MSG_CTRUNC) != 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      on_fd(fd);
    }
  }
  return r;
}

}  // namespace cxltier::detail
