// cxltier-pool-bytes: what cxltier-loadgen's code sees in a pool that another
// process (the Python tests) maps. It fills or checks blocks of a memfd pool
// passed as an inherited fd with loadgen's own FillBlock and BlockIntact
// (each block's key in its first 16 bytes, then words derived from it).
//
//   cxltier-pool-bytes check|fill FD STRIDE BLOCK_BYTES BLOCK:HI:LO...
// Exit 0: every named block was filled, or is whole and of its key; 1: one is
// not (printed); 2: bad arguments or the fd cannot be mapped.
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../tools/loadgen/copy_mode.h"

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr,
                 "usage: cxltier-pool-bytes check|fill FD STRIDE BLOCK_BYTES BLOCK:HI:LO...\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int fd = std::atoi(argv[2]);
  const uint64_t stride = std::strtoull(argv[3], nullptr, 10);
  const uint64_t block_bytes = std::strtoull(argv[4], nullptr, 10);
  struct stat st {};
  if ((mode != "check" && mode != "fill") || fstat(fd, &st) != 0 || st.st_size <= 0) {
    std::fprintf(stderr, "cxltier-pool-bytes: bad mode or fd %d\n", fd);
    return 2;
  }
  const auto bytes = static_cast<uint64_t>(st.st_size);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    std::perror("cxltier-pool-bytes: mmap");
    return 2;
  }
  auto* base = static_cast<uint8_t*>(p);
  int bad = 0;
  for (int i = 5; i < argc; ++i) {
    unsigned long long block = 0, hi = 0, lo = 0;
    if (std::sscanf(argv[i], "%llu:%llu:%llu", &block, &hi, &lo) != 3 ||
        (block + 1) * stride > bytes) {
      std::fprintf(stderr, "cxltier-pool-bytes: bad block %s\n", argv[i]);
      return 2;
    }
    const cxltier::BlockKey key{hi, lo};
    uint8_t* at = base + block * stride;
    if (mode == "fill") {
      cxltier::loadgen::FillBlock(at, block_bytes, key);
    } else if (!cxltier::loadgen::BlockIntact(at, block_bytes, &key)) {
      std::printf("block %llu: not the bytes of key %s\n", block, key.ToString().c_str());
      ++bad;
    }
  }
  std::printf("%s %d blocks, %d bad\n", mode.c_str(), argc - 5, bad);
  return bad ? 1 : 0;
}
