#include "base/input_file.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

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
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open " + what);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(path + ": cannot read " + what);
  return ss.str();
}

void require_regular_file(const std::string& path, const std::string& what) {
  if (const std::string kind = other_kind(path); !kind.empty()) throw Error(path + ": is " + kind + ", not " + what);
}

}  // namespace vkllm
