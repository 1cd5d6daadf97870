// Pools (pools.cpp): the Pool class and the mappings of the pools this module
// makes; the client (client.cpp) registers them with the daemon.
#pragma once

#include <memory>
#include <string>

#include "bind.h"

namespace cxltier::python {

struct Pool {
  uint32_t id = UINT32_MAX;
  std::string kind;  // memfd, range, tier0, tier1
  uint32_t blocks = 0;
  uint64_t stride = 0;
  uint64_t block_bytes = 0;
  std::shared_ptr<Mapping> map;

  py::array array() const;
  py::array block(uint32_t i) const;
  int fd() const { return map->fd; }
};

// A new sealable memfd of `bytes` (named `name`), mapped shared.
std::shared_ptr<Mapping> MapNewMemfd(uint64_t bytes, const std::string& name);
// The caller's memfd `fd` of `length` bytes, duplicated and mapped shared.
std::shared_ptr<Mapping> MapCallersMemfd(int fd, uint64_t length);
// `bytes` of anonymous memory of this process, for an address-range pool.
std::shared_ptr<Mapping> MapRange(uint64_t bytes);

}  // namespace cxltier::python
