// libFuzzer target: the GGUF reader must turn any input into a File or a gguf::Error.
#include <cstddef>
#include <cstdint>

#include "gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    gguf::File f = gguf::File::parse({data, size}, "fuzz.gguf");
    for (const auto& [key, value] : f.metadata()) {
      (void)key;
      (void)value;
    }
  } catch (const gguf::Error&) {
  }
  return 0;
}
