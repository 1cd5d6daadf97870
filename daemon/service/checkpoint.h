// Ghost checkpoints: the ghost store written to the state directory so a
// restart keeps it. Written to a temporary file, fsynced, renamed; checked
// with XXH64 when read back.
#pragma once

#include <string>
#include <vector>

#include "cxltier/block.h"

namespace cxltier::service {

// Returns an error message or "".
std::string SaveGhosts(const std::string& path, const std::vector<BlockState>& ghosts);

struct LoadedGhosts {
  std::vector<BlockState> ghosts;
  bool found = false;  // a file was there
  std::string error;   // it was there but corrupt or unreadable (then it was set aside)
};

// Reads a checkpoint. A corrupt or truncated file is renamed to PATH.corrupt
// and reported, never loaded.
LoadedGhosts LoadGhosts(const std::string& path);

}  // namespace cxltier::service
