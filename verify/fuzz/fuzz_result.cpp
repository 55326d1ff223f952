// libFuzzer target (clang -fsanitize=fuzzer,address,undefined): the result reader (fuzz_readers.hpp).
#include "fuzz_readers.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  orthros::fuzz::result_one(data, size);
  return 0;
}
