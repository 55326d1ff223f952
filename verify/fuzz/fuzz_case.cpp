// libFuzzer target (clang -fsanitize=fuzzer,address,undefined): the case reader (fuzz_readers.hpp).
#include "fuzz_readers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  orthros::fuzz::case_one(data, size);
  return 0;
}
