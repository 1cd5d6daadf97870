// fork() for tests, only from a process with no other thread.
//
// A child forked while another thread of the parent holds a lock keeps that
// lock held forever. glibc's malloc guards itself against this at fork, but
// the ASan allocator of GCC 12 does not: a child forked while another thread
// was inside malloc hangs in its first allocation (seen in CI: hostile_test
// hung the asan-ubsan stage until the run's time ran out). So a test forks
// only when alone, and says so loudly instead of hanging when it is not.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

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

// fork(), or -1 (errno EDEADLK, and a test failure) when another thread runs.
inline pid_t ForkAlone() {
  const int threads = ThreadCount();
  if (threads != 1) {
    ADD_FAILURE() << "fork with " << threads
                  << " threads running: the child could inherit a held lock";
    errno = EDEADLK;
    return -1;
  }
  return fork();
}

}  // namespace cxltier::testing
