// The files a person names on the command line (prompts, messages, templates, sessions), opened
// so that a directory, a FIFO where a file is written back, or a missing file is one line naming
// it rather than an internal error or a blocked read.
#pragma once
#include <cstddef>
#include <string>

namespace vkllm {

// The most bytes read from one text input: `-f /dev/zero` or an endless pipe ends in an error
// naming it instead of filling the memory.
inline constexpr size_t k_max_text_input = size_t(1) << 30;
// The error for an input past it: "NAME: WHAT is longer than 1 GiB, …".
[[noreturn]] void refuse_endless_input(const std::string& name, const std::string& what);

// The whole of a text input: a regular file, or a pipe or device (`-f <(cmd)`, `-f /dev/stdin`).
// A directory is refused. `what` names the input in the error ("the prompt file").
std::string read_text_input(const std::string& path, const std::string& what);

// The rest of an open descriptor (stdin: fd 0, named "stdin"); a read error is one line with its
// reason, never a short text taken for the whole.
std::string read_fd_input(int fd, const std::string& name, const std::string& what);

// Throws when something other than a regular file is at path (following links): a file vkllm also
// writes (a session) must not be a directory, where reading fails, or a FIFO, where opening it
// waits for a writer. Nothing there passes (opening it then says so).
void require_regular_file(const std::string& path, const std::string& what);

}  // namespace vkllm
