// Atomic file replacement: a crash at any moment leaves either the old file or the new one.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

namespace gguf {

// Writes `bytes` to a temporary file in the same directory as `path`, fsyncs it, renames it over
// `path` and fsyncs the directory. Throws gguf::Error naming the path on failure (the old file,
// if any, is then untouched and the temporary is removed). The temporary is ".NAME.PID.XXXXXX";
// those of the same path whose writer was killed mid-write (its process gone, the file an hour
// old) are removed here.
// A symbolic link is followed (its target is replaced); the new file keeps the old one's
// permission bits, or gets 0666 less the umask; a file this process may not write, and anything
// there that is not a regular file (a device, a FIFO, a directory), is refused.
void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes);

// Whether the file at `path` is a temporary of write_file_atomic, ".NAME.PID.XXXXXX", whose writer
// is gone (no process has its PID) and which is an hour old: one a writer killed mid-write left (a
// live writer in another PID namespace is not seen by kill(), hence the age). `name`, when not
// empty, must be the NAME it was written for.
bool is_orphaned_temporary(const std::filesystem::path& path, const std::string& name = "");

// Throws gguf::Error, as write_file_atomic would, when `path` cannot be written: its directory
// missing or not writable, or the file (a link's target) not writable. For checks before work.
void check_writable(const std::string& path);

}  // namespace gguf
