// Runs a command line through /bin/sh for tests of the real binaries.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace cxltier::testing {

struct ShellResult {
  int status = -1;  // exit status, or -1 when the command did not exit normally
  std::string out;  // standard output (add 2>&1 to the command for standard error)
};

inline ShellResult Shell(const std::string& cmd) {
  ShellResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace cxltier::testing
