// A main for the fuzz targets outside a libFuzzer build: runs
// LLVMFuzzerTestOneInput once on each file named (directories are walked), so
// the plain build compiles every target and ctest replays the seed corpora and
// the saved regressions. tests/fuzz/run.sh does the fuzzing itself.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", p.c_str());
    return 1;
  }
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in), {}};
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int failed = 0, ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) failed += RunFile(e.path()), ++ran;
      }
    } else {
      failed += RunFile(arg), ++ran;
    }
  }
  std::printf("%d inputs replayed\n", ran);
  return failed == 0 && ran > 0 ? 0 : 1;
}
