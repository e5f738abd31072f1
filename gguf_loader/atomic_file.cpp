// Atomic file replacement through a temporary file, fsync and rename.
#include "atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "gguf.h"

namespace gguf {

namespace {

// Removes the temporary files of `name` in `dir` that a writer killed mid-write left behind
// (".NAME.PID.XXXXXX" whose process is gone); those of live writers stay.
void remove_orphans(const std::filesystem::path& dir, const std::string& name) {
  const std::string prefix = "." + name + ".";
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string f = entry.path().filename().string();
    if (!f.starts_with(prefix) || f.size() < prefix.size() + 8) continue;
    const std::string rest = f.substr(prefix.size());  // PID.XXXXXX
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || rest.size() - dot - 1 != 6 ||
        rest.find_first_not_of("0123456789") != dot)
      continue;
    const long pid = std::strtol(rest.c_str(), nullptr, 10);
    std::error_code ignored;
    if (pid > 0 && pid <= INT32_MAX && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove(entry.path(), ignored);
  }
}

}  // namespace

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  remove_orphans(dir, target.filename().string());
  std::string tmp = dir.string();
  tmp.append("/.").append(target.filename().string()).append(".").append(std::to_string(::getpid())).append(".XXXXXX");
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) throw Error(path + ": cannot create a temporary file in " + dir.string() + ": " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(path + ": " + what + ": " + std::strerror(e));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed");
    done += static_cast<size_t>(n);
  }
  if (::fchmod(fd, 0644) != 0) fail("chmod failed");
  if (::fsync(fd) != 0) fail("fsync failed");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(path + ": close failed: " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(path + ": rename failed: " + std::strerror(e));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace gguf
