// Atomic file replacement through a temporary file, fsync and rename.
#include "atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "gguf.h"

namespace gguf {

namespace {

// Removes the temporary files of `name` in `dir` that a writer killed mid-write left behind (see
// is_orphaned_temporary); those of live writers stay.
void remove_orphans(const std::filesystem::path& dir, const std::string& name) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ignored;
    if (is_orphaned_temporary(it->path(), name)) std::filesystem::remove(it->path(), ignored);
  }
}

// The file a write to `path` lands in: a symbolic link's target (followed as open() would, a
// chain of them too), so that renaming over it replaces the file the link names, not the link.
std::filesystem::path resolve_links(const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  for (int hops = 0; std::filesystem::is_symlink(std::filesystem::symlink_status(p, ec)); ++hops) {
    if (hops == 40) throw Error(path + ": too many levels of symbolic links");
    const std::filesystem::path to = std::filesystem::read_symlink(p, ec);
    if (ec) throw Error(path + ": cannot read the link: " + ec.message());
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p;
}

// The process's umask, read without changing it (umask(2) would, for every thread at once).
mode_t current_umask() {
  FILE* f = std::fopen("/proc/self/status", "r");
  mode_t mask = 022;
  if (!f) return mask;
  char line[256];
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "Umask:", 6) == 0) {
      mask = static_cast<mode_t>(std::strtoul(line + 6, nullptr, 8));
      break;
    }
  std::fclose(f);
  return mask;
}

std::filesystem::path dir_of(const std::filesystem::path& target) {
  return target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
}

// Refuses, as open() for writing would, a file this process may not write, and a directory it
// cannot create the temporary in.
void require_writable(const std::string& link_path, const std::filesystem::path& target, bool exists) {
  const std::filesystem::path dir = dir_of(target);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw Error(link_path + ": " + dir.string() + (std::filesystem::exists(dir, ec) ? " is not a directory" : ": the directory does not exist"));
  if (::access(dir.c_str(), W_OK | X_OK) != 0) throw Error(link_path + ": cannot create files in " + dir.string() + ": " + std::strerror(errno));
  if (exists && ::access(target.c_str(), W_OK) != 0) throw Error(link_path + ": cannot write: " + std::strerror(errno));
  // The temporary ".NAME.PID.XXXXXX" (below) must be a name the directory takes too (a legal name of
  // 245 bytes failed only once the file was written, after the whole generation).
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  const size_t longest_temp = target.filename().string().size() + 1 + 1 + 7 + 7;  // a PID has at most 7 digits (pid_max ≤ 2^22)
  if (name_max > 0 && longest_temp > size_t(name_max))
    throw Error(link_path + ": the file name is too long to be written safely (its temporary's name would pass the " + std::to_string(name_max) +
                " bytes a name may have here; " + std::to_string(longest_temp - size_t(name_max)) + " bytes shorter would do)");
}

// SIGINT, SIGTERM and SIGHUP held back on this thread while a file is written: a Ctrl+C or a
// `timeout` in the middle took the process down with the temporary left for an hour and the update
// lost; now it arrives once the new file is in place (or the write failed and its temporary is gone).
class HoldStopSignals {
 public:
  HoldStopSignals() {
    sigset_t stop;
    sigemptyset(&stop);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&stop, sig);
    held_ = ::pthread_sigmask(SIG_BLOCK, &stop, &old_) == 0;
  }
  ~HoldStopSignals() {
    if (held_) ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  HoldStopSignals(const HoldStopSignals&) = delete;
  HoldStopSignals& operator=(const HoldStopSignals&) = delete;

 private:
  sigset_t old_{};
  bool held_ = false;
};

}  // namespace

bool is_orphaned_temporary(const std::filesystem::path& path, const std::string& name) {
  const std::string filename = path.filename().string();
  // From the end: ".XXXXXX" (six characters), then ".PID" (digits), then ".NAME".
  const size_t x = filename.rfind('.');
  if (x == std::string::npos || x < 3 || filename.size() - x - 1 != 6 || filename[0] != '.') return false;
  const size_t p = filename.rfind('.', x - 1);
  if (p == std::string::npos || p < 2 || p + 1 == x || x - p - 1 > 10 || filename.find_first_not_of("0123456789", p + 1) != x) return false;
  if (!name.empty() && filename.compare(1, p - 1, name) != 0) return false;
  const long pid = std::strtol(filename.c_str() + p + 1, nullptr, 10);
  if (pid <= 0 || pid > INT32_MAX || ::kill(pid_t(pid), 0) == 0 || errno != ESRCH) return false;
  // An hour old: a writer in another PID namespace (a container sharing the directory) is no
  // process here, and its temporary is seconds old.
  std::error_code ec;
  const auto written = std::filesystem::last_write_time(path, ec);
  return !ec && written < std::filesystem::file_time_type::clock::now() - std::chrono::hours(1);
}

void check_writable(const std::string& path) {
  const std::filesystem::path target = resolve_links(path);
  struct stat st {};
  require_writable(path, target, ::stat(target.c_str(), &st) == 0);
}

void write_file_atomic(const std::string& link_path, std::span<const uint8_t> bytes) {
  const std::filesystem::path target = resolve_links(link_path);
  const std::string path = target.string();
  // The new file takes the old one's permissions, or those a new file gets (0666 less the umask).
  struct stat old {};
  const bool exists = ::stat(path.c_str(), &old) == 0;
  // A device, FIFO or directory there is not ours to replace (a link to /dev/zero would have been).
  if (exists && !S_ISREG(old.st_mode)) throw Error(link_path + ": not a regular file");
  require_writable(link_path, target, exists);
  const mode_t mode = exists ? (old.st_mode & 07777) : (0666 & ~current_umask());
  const std::filesystem::path dir = dir_of(target);
  remove_orphans(dir, target.filename().string());
  std::string tmp = dir.string();
  tmp.append("/.").append(target.filename().string()).append(".").append(std::to_string(::getpid())).append(".XXXXXX");
  const HoldStopSignals hold;
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
  if (::fchmod(fd, mode) != 0) fail("chmod failed");
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
