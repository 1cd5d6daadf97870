// Pools: the Pool class (a pool's id and its memory as numpy views) and the
// memory of the memfd and range pools a client creates.
#include "pools.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>

namespace cxltier::python {
namespace {

void MapShared(Mapping& map, int fd) {
  void* p = mmap(nullptr, map.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) Check(detail::ErrnoStatus("mapping the pool"));
  map.base = static_cast<uint8_t*>(p);
  map.owned = true;
  madvise(p, map.bytes, MADV_NOHUGEPAGE);
}

}  // namespace

py::array Pool::array() const {
  return View(map->base, {static_cast<py::ssize_t>(blocks), static_cast<py::ssize_t>(stride)}, map,
              true);
}

py::array Pool::block(uint32_t i) const {
  if (i >= blocks)
    throw py::index_error("block " + std::to_string(i) + " of " + std::to_string(blocks));
  return View(map->base + uint64_t{i} * stride, {static_cast<py::ssize_t>(block_bytes)}, map, true);
}

std::shared_ptr<Mapping> MapNewMemfd(uint64_t bytes, const std::string& name) {
  auto map = std::make_shared<Mapping>();
  map->bytes = bytes;
  map->fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (map->fd < 0) Check(detail::ErrnoStatus("memfd_create"));
  if (ftruncate(map->fd, static_cast<off_t>(map->bytes)) != 0)
    Check(detail::ErrnoStatus("ftruncate"));
  MapShared(*map, map->fd);
  return map;
}

std::shared_ptr<Mapping> MapCallersMemfd(int fd, uint64_t length) {
  auto map = std::make_shared<Mapping>();
  map->bytes = length;
  map->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (map->fd < 0) Check(detail::ErrnoStatus("duplicating the memfd"));
  MapShared(*map, map->fd);
  return map;
}

std::shared_ptr<Mapping> MapRange(uint64_t bytes) {
  auto map = std::make_shared<Mapping>();
  map->bytes = bytes;
  void* p = mmap(nullptr, map->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Check(detail::ErrnoStatus("mapping a range pool"));
  map->base = static_cast<uint8_t*>(p);
  map->owned = true;
  // THP off: a huge page spanning two blocks would make them move together.
  madvise(p, map->bytes, MADV_NOHUGEPAGE);
  return map;
}

void BindPools(py::module_& m) {
  py::class_<Pool>(m, "Pool", "A pool of blocks: its id, its memory as numpy views.")
      .def_readonly("id", &Pool::id)
      .def_readonly("kind", &Pool::kind)
      .def_readonly("blocks", &Pool::blocks)
      .def_readonly("stride", &Pool::stride)
      .def_readonly("block_bytes", &Pool::block_bytes)
      .def_property_readonly("fd", &Pool::fd)
      .def_property_readonly("array", &Pool::array,
                             "uint8 array (blocks, stride) over the pool's memory, no copy")
      .def("block", &Pool::block, py::arg("index"),
           "uint8 array of block_bytes over one block's memory, no copy")
      .def("__repr__", [](const Pool& p) {
        return "cxltier.Pool(id=" + std::to_string(p.id) + ", kind='" + p.kind +
               "', blocks=" + std::to_string(p.blocks) + ", stride=" + std::to_string(p.stride) +
               ")";
      });
}

}  // namespace cxltier::python
