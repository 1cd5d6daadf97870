// cxltier-loadgen's command line: every option in a plain struct.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "copy_mode.h"

namespace cxltier::loadgen {

struct Options {
  std::string socket_path, pool_kind = "memfd", block_bytes_text = "2MiB", name = "loadgen";
  uint32_t blocks = 256, steps = 400, step_ms = 5, sessions = 4, batch = 2;
  double max_seconds = 0;
  uint64_t seed = 1;
  bool json = false, check_placement = false, expect_moves = false, expect_restored = false;
  bool expect_slow_tier = false, expect_kernel_migrations = false, reconnect = false;
  bool expect_no_leaks = false, until_signal = false, pin = false, expect_pinned = false;
  bool hints = false;
  uint32_t expect_tiers = 0;
  uint32_t hint_lead = 0;  // set to sim::AttentionParams' default by ParseOptions
  CheckOptions checks;     // copy mode's reader and writer threads
  std::string devdax;
  uint64_t until_moves = 0;
  // Derived from the above once parsed and checked.
  uint64_t block_bytes = 0;  // --block-bytes
  bool copy = false;         // --pool copy
};

// Prints a failure of the run (not of a check) and gives its exit code, 2.
int Fail(const std::string& msg);

// Parses and checks the command line into *o. An exit code when the run ends
// here (--help, a bad option), nothing when it goes on.
std::optional<int> ParseOptions(int argc, char** argv, Options* o);

}  // namespace cxltier::loadgen
