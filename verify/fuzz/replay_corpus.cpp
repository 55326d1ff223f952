// Replays the committed seed corpus through every fuzzed reader (fuzz_readers.hpp) with any
// compiler: the corpus is a regression test of every build, not only of the clang fuzz build.
// Usage: replay_corpus DIR...  (every regular file under each DIR, recursively)
#include "fuzz_readers.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

int main(int argc, char** argv) {
  std::size_t n = 0;
  for (int a = 1; a < argc; ++a)
    for (const auto& e : std::filesystem::recursive_directory_iterator(argv[a])) {
      if (!e.is_regular_file()) continue;
      std::ifstream in(e.path(), std::ios::binary);
      const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      orthros::fuzz::safetensors_one(bytes.data(), bytes.size());
      orthros::fuzz::case_one(bytes.data(), bytes.size());
      orthros::fuzz::result_one(bytes.data(), bytes.size());
      ++n;
    }
  std::printf("replayed %zu inputs through the safetensors, case and result readers: no crash\n", n);
  return n > 0 ? 0 : 1;
}
