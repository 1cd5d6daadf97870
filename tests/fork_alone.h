// fork() for tests, only from a process with no other thread.
//
// A child forked while another thread of the parent holds a lock keeps that
// lock held forever. glibc's malloc guards itself against this at fork, but
// the ASan allocator of GCC 12 does not: a child forked while another thread
// was inside malloc hangs in its first allocation (seen in CI: hostile_test
// hung the asan-ubsan stage until the run's time ran out). So a test forks
// only when alone, and stops loudly instead of hanging when it is not.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace cxltier::testing {

// The threads of this process (1 when alone), from /proc/self/status.
inline int ThreadCount() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int n = -1;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::sscanf(line, "Threads: %d", &n) == 1) break;
  }
  std::fclose(f);
  return n;
}

// fork(), from a process with no other thread; otherwise the test binary
// stops at once, saying why (a caller cannot go on with a missing child, and
// waiting for one that hangs would hang the run). TSan starts a thread of its
// own and makes fork safe itself: there the check is off (the plain and ASan
// runs of the same tests keep it).
inline pid_t ForkAlone() {
#if !defined(__SANITIZE_THREAD__)
  const int threads = ThreadCount();
  if (threads != 1) {
    std::fprintf(stderr,
                 "ForkAlone: fork with %d threads running: the child could inherit a held lock\n",
                 threads);
    std::abort();
  }
#endif
  return fork();
}

}  // namespace cxltier::testing
