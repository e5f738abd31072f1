#include "base/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace vkllm {

namespace {

// What path is when it is there but not a regular file ("a directory"), else "" (a regular file,
// or nothing there: opening it then says so).
std::string other_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "a directory";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return "a device";
}

}  // namespace

std::string read_text_input(const std::string& path, const std::string& what) {
  if (other_kind(path) == "a directory") throw Error(path + ": is a directory, not " + what);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path + ": cannot open " + what + ": " + std::strerror(errno));
  try {
    std::string text = read_fd_input(fd, path, what);
    ::close(fd);
    return text;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::string read_fd_input(int fd, const std::string& name, const std::string& what) {
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n > 0) {
      if (text.size() + size_t(n) > k_max_text_input) refuse_endless_input(name, what);
      text.append(buf, size_t(n));
    } else if (n == 0) return text;
    else if (errno != EINTR) throw Error(name + ": cannot read " + what + ": " + std::strerror(errno));
  }
}

void refuse_endless_input(const std::string& name, const std::string& what) {
  throw Error(name + ": " + what + " is longer than " + std::to_string(k_max_text_input >> 30) +
              " GiB, the most vkllm reads as text (an endless device or pipe?)");
}

void require_regular_file(const std::string& path, const std::string& what) {
  if (const std::string kind = other_kind(path); !kind.empty()) throw Error(path + ": is " + kind + ", not " + what);
}

}  // namespace vkllm
