// An engine's build against the installed client library: compiled through
// find_package(cxltier) and through pkg-config by scripts/package.sh.
#include <cstdio>

#include "cxltier/client.h"

int main(int argc, char** argv) {
  const char* socket = argc > 1 ? argv[1] : "/nonexistent/cxltierd.sock";
  cxltier::Status st;
  auto c = cxltier::Client::Connect({socket, cxltier::kLlama3_70B, 16, "consumer"}, &st);
  // No daemon there: the library must say so, clearly.
  std::printf("connect: %s\n", c ? "ok" : st.message.c_str());
  return c ? 0 : 3;
}
