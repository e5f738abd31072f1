#include "base/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace vkllm {

namespace {

// stat()'s view of path, or an Error naming it when it cannot be had.
struct stat status_of(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw Error(path + ": cannot open " + what + ": " + std::strerror(errno));
  return st;
}

}  // namespace

std::string read_text_input(const std::string& path, const std::string& what) {
  if (S_ISDIR(status_of(path, what).st_mode)) throw Error(path + ": is a directory, not " + what);
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open " + what);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": cannot read " + what);
  return ss.str();
}

void require_regular_file(const std::string& path, const std::string& what) {
  if (!S_ISREG(status_of(path, what).st_mode)) throw Error(path + ": not a regular file (" + what + ")");
}

}  // namespace vkllm
