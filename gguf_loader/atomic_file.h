// Atomic file replacement: a crash at any moment leaves either the old file or the new one.
#pragma once
#include <cstdint>
#include <span>
#include <string>

namespace gguf {

// Writes `bytes` to a temporary file in the same directory as `path`, fsyncs it, renames it over
// `path` and fsyncs the directory. Throws gguf::Error naming the path on failure (the old file,
// if any, is then untouched and the temporary is removed). The temporary is ".NAME.PID.XXXXXX";
// those of the same path whose writer was killed mid-write (its process gone) are removed here.
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace gguf
