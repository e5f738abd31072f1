// `vkllm chat`: the interactive terminal chat. Line editing and history through libedit; replies
// streamed to stdout; slash commands; Ctrl+C stops a reply. The chat state lives in
// core/chat/conversation.h; this file owns the terminal. Design in docs/chat.md.
#include <histedit.h>
#include <langinfo.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <clocale>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>

#include "base/input_file.h"
#include "chat/template.h"
#include "base/cache_dir.h"
#include "commands.h"
#include "common.h"
#include "chat/conversation.h"
#include "format.h"
#include "model/kv_layout.h"
#include "model/summary.h"
#include "persistence.h"
#include "store/session_file.h"

namespace vkllm::cli {
namespace {

struct ChatCommand {
  RunOptions opts;
  std::string system, system_file, chat_template;
  std::string session;  // --session FILE ("" = none)
  int32_t n_predict = GenerateOptions::kUntilFull;
  std::vector<std::string> stop;        // every reply's stop strings
  GrammarFlags grammar;                 // each reply's grammar (a turn starts it afresh)
  std::vector<std::string> logit_bias;  // -l, every reply's
  SpeculativeOptions speculative;
  std::vector<CLI::Option*> sampling_flags;  // which a resumed session takes (apply_sampling_flags)
  std::vector<CLI::Option*> draft_flags;     // add_speculative_options' (note_idle_draft_flags)
};

// A signal sent to the process runs its handler on any thread that does not block it, often one of
// the Vulkan driver's (a SIGCONT after `fg` never reached the line editor's read). Each handler
// below then wakes the main thread with a signal of its own (g_wake, a no-op handler), whose read
// returns EINTR as if it had had the signal itself.
pthread_t g_main_thread;
int g_wake = 0;
extern "C" void on_wake(int) {}
void wake_main() {
  if (g_wake != 0 && !pthread_equal(pthread_self(), g_main_thread)) {
    const int saved = errno;
    pthread_kill(g_main_thread, g_wake);
    errno = saved;
  }
}

// Ctrl+C: counted by the handler, read by the reply callback and the input loop.
std::atomic<int> g_sigint{0};
extern "C" void on_sigint(int) {
  g_sigint.fetch_add(1);
  wake_main();
}
// SIGTERM or SIGHUP (a closed terminal): the chat ends as at Ctrl+D, the reply stopped, the
// session saved and the terminal restored, status 128 + the signal. A second one ends it at once.
std::atomic<int> g_end_signal{0};
extern "C" void on_end_signal(int sig) {
  int none = 0;
  g_end_signal.compare_exchange_strong(none, sig);
  wake_main();
}
// SIGCONT (`fg` after Ctrl+Z) and SIGWINCH (a resized terminal) while a line is edited: the line
// editor takes the terminal again and redraws (LineReader::read).
std::atomic<bool> g_redraw{false};
extern "C" void on_redraw(int) {
  g_redraw = true;
  wake_main();
}

bool ending() { return g_end_signal.load() != 0; }
int end_status() { return 128 + g_end_signal.load(); }

// Ctrl+C without SA_RESTART: a pending read or write returns EINTR, so the prompt sees the key and
// a reply stops. SIGTERM and SIGHUP restart the calls they interrupt (a write to a full pipe is
// not cut short) but while the chat waits for input (WaitingForInput). A signal the process was
// started ignoring (SIGHUP under nohup) stays ignored.
bool install(int sig, void (*fn)(int), int flags, struct sigaction* old = nullptr) {
  struct sigaction prev {};
  sigaction(sig, nullptr, &prev);
  if (old) *old = prev;
  if (prev.sa_handler == SIG_IGN && sig != SIGINT) return false;
  struct sigaction sa {};
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  sigaction(sig, &sa, nullptr);
  return true;
}

void install_signals() {
  g_main_thread = pthread_self();
  g_wake = SIGRTMIN;
  install(g_wake, on_wake, SA_RESTART);
  install(SIGINT, on_sigint, 0);
  install(SIGTERM, on_end_signal, SA_RESETHAND | SA_RESTART);
  install(SIGHUP, on_end_signal, SA_RESETHAND | SA_RESTART);
}

// While the chat blocks for input: SIGTERM and SIGHUP interrupt the read (EINTR), and in a terminal
// so do SIGCONT and SIGWINCH, which nothing else may see interrupted (a write to a pipe, a paste).
class WaitingForInput {
 public:
  explicit WaitingForInput(bool tty) {
    if (!ending()) {
      swap(SIGTERM, on_end_signal, SA_RESETHAND);
      swap(SIGHUP, on_end_signal, SA_RESETHAND);
    }
    if (tty) {
      swap(SIGCONT, on_redraw, 0);
      swap(SIGWINCH, on_redraw, 0);
    }
    swap(g_wake, on_wake, 0);
  }
  ~WaitingForInput() {
    for (const auto& [sig, old] : saved_)
      if (!((sig == SIGTERM || sig == SIGHUP) && ending())) sigaction(sig, &old, nullptr);  // a delivered SIGTERM stays reset
  }
  WaitingForInput(const WaitingForInput&) = delete;
  WaitingForInput& operator=(const WaitingForInput&) = delete;

 private:
  void swap(int sig, void (*fn)(int), int flags) {
    struct sigaction old {};
    if (install(sig, fn, flags, &old)) saved_.emplace_back(sig, old);
  }
  std::vector<std::pair<int, struct sigaction>> saved_;
};

// Where the prompt and the echo of the line go (see LineReader).
FILE* term_out() { return stdout_is_tty() ? stdout : stderr; }

bool no_color() {
  const char* v = std::getenv("NO_COLOR");
  return v && *v;
}

// $XDG_STATE_HOME/vkllm/chat_history (default ~/.local/state/vkllm); "" when there is no home.
// A relative XDG_STATE_HOME is ignored, as the XDG spec says (and as XDG_CACHE_HOME is).
std::string history_path() {
  const std::string dir = user_state_dir();
  if (dir.empty()) return "";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return "";
  // Only a regular file (or none yet) is history: a FIFO there hung the start, /dev/zero ate memory.
  const std::string path = dir + "/chat_history";
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (!ec && st.type() != std::filesystem::file_type::regular) {
    // (A link to /dev/null, the usual way to turn history off, is taken so without a word.)
    if (st.type() != std::filesystem::file_type::character)
      std::fprintf(stderr, "vkllm: warning: %s is not a regular file: no input history this session\n", path.c_str());
    return "";
  }
  return path;
}

// Where input lines come from: libedit on a terminal, plain lines otherwise.
class LineReader {
 public:
  enum class Status { Line, Eof, Interrupted, Ended };

  explicit LineReader(bool tty) : tty_(tty) {
    if (!tty_) return;
    // libedit takes multibyte (UTF-8) input only under a UTF-8 LC_CTYPE: in the "C" locale every
    // non-ASCII character typed was dropped, and a paste holding one was lost whole. The
    // environment's, else C.UTF-8; LC_CTYPE alone, so numbers keep their format.
    if (!std::setlocale(LC_CTYPE, "") || std::strcmp(nl_langinfo(CODESET), "UTF-8") != 0) std::setlocale(LC_CTYPE, "C.UTF-8");
    hist_ = history_init();
    HistEvent ev;
    history(hist_, &ev, H_SETSIZE, 1000);
    history(hist_, &ev, H_SETUNIQUE, 1);
    path_ = history_path();
    if (!path_.empty()) history(hist_, &ev, H_LOAD, path_.c_str());
    // With stdout redirected the prompt and the line editing go to stderr, keeping stdout clean.
    el_ = el_init("vkllm", stdin, term_out(), stderr);
    el_set(el_, EL_EDITOR, "emacs");
    el_set(el_, EL_HIST, history, hist_);
    el_set(el_, EL_CLIENTDATA, this);
    el_set(el_, EL_PROMPT, &LineReader::prompt_fn);
    el_set(el_, EL_SIGNAL, 0);  // our SIGINT handler; el_gets returns on EINTR
    el_source(el_, nullptr);    // ~/.editrc
    // Bracketed paste: the terminal wraps pasted text in ESC[200~ … ESC[201~, and the whole
    // paste, newlines included, goes into the line instead of sending each line.
    el_set(el_, EL_ADDFN, "vkllm-paste", "insert bracketed paste", &LineReader::paste_fn);
    el_set(el_, EL_BIND, "\033[200~", "vkllm-paste", nullptr);
    el_set(el_, EL_BIND, "^I", "ed-insert", nullptr);  // a Tab is text (there is nothing to complete)
    // The line being edited when a redraw interrupted it, put back by a key the reader pushes.
    el_set(el_, EL_ADDFN, "vkllm-restore", "restore the line after a redraw", &LineReader::restore_fn);
    el_set(el_, EL_BIND, k_restore_key, "vkllm-restore", nullptr);
    if (isatty(fileno(term_out())) == 1) {
      std::fputs("\033[?2004h", term_out());
      std::fflush(term_out());
      paste_mode_ = true;
    }
  }
  ~LineReader() {
    if (paste_mode_) {
      std::fputs("\033[?2004l", term_out());
      std::fflush(term_out());
    }
    if (el_) el_end(el_);
    if (hist_) history_end(hist_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // One line without its newline.
  Status read(std::string& line, const char* prompt) {
    line.clear();
    if (ending()) return Status::Ended;
    const WaitingForInput waiting(tty_);
    if (!tty_) {
      // std::getline, bounded: piped from an endless source without newlines, the chat ends in an
      // error naming it instead of filling the memory.
      std::streambuf* in = std::cin.rdbuf();
      int ch = EOF;
      for (;;) {
        errno = 0;
        while ((ch = in->sbumpc()) != EOF && ch != '\n') {
          if (line.size() == k_max_text_input) refuse_endless_input("stdin", "a line");
          line.push_back(char(ch));
        }
        // (std::cin reads through stdio: a failed read is an EOF with the error flag set. A signal
        // interrupts the read, EINTR: Ctrl+C ends a piped chat as its end of input does, status 0;
        // another signal's read is taken up again.)
        const int error = ch == EOF && std::ferror(stdin) ? (errno ? errno : EIO) : 0;
        if (error == 0) break;
        std::clearerr(stdin);
        if (error != EINTR) throw Error(std::string("stdin: cannot read the messages: ") + std::strerror(error));
        if (ending() || g_sigint.load() > 0) break;
      }
      if (ending()) return Status::Ended;
      if (ch == EOF && line.empty()) return Status::Eof;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return Status::Line;
    }
    prompt_ = prompt;
    g_sigint = 0;
    g_redraw = false;
    int count = 0;
    const char* s = nullptr;
    for (;;) {
      s = el_gets(el_, &count);
      // (count -1: el_gets was interrupted; 0 with no line is Ctrl+D)
      if (s || count != -1 || !g_redraw.exchange(false) || ending() || g_sigint.load() > 0) break;
      // Back from Ctrl+Z, or resized: el_gets puts the terminal in its mode again and redraws the
      // prompt, from the start of the row; the line typed so far comes back through the restore key.
      const LineInfo* li = el_line(el_);
      restore_.assign(li && li->lastchar > li->buffer ? std::string(li->buffer, size_t(li->lastchar - li->buffer)) : "");
      // Characters after the cursor (UTF-8 lead bytes), to put the cursor back where it was.
      restore_after_ = 0;
      if (li && li->cursor >= li->buffer && li->cursor < li->lastchar)
        for (const char* p = li->cursor; p < li->lastchar; ++p) restore_after_ += (static_cast<unsigned char>(*p) & 0xC0) != 0x80;
      el_reset(el_);
      std::fputs("\r\033[K", term_out());
      std::fflush(term_out());
      if (!restore_.empty()) el_push(el_, k_restore_key);
    }
    if (!s) {
      if (ending()) return Status::Ended;
      // libedit's cleanup after EINTR may change errno; the handler's count is what tells.
      if (g_sigint.load() > 0) {
        const LineInfo* li = el_line(el_);  // what was typed before Ctrl+C
        if (li && li->lastchar > li->buffer) line.assign(li->buffer, size_t(li->lastchar - li->buffer));
        el_reset(el_);
        return Status::Interrupted;
      }
      return Status::Eof;
    }
    line.assign(s, size_t(count));
    while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    return Status::Line;
  }

  // Whether more input is already waiting: lines that arrive together were pasted, not typed.
  bool input_pending() const {
    if (!tty_) return false;
    pollfd p{STDIN_FILENO, POLLIN, 0};
    return poll(&p, 1, 15) > 0 && (p.revents & POLLIN);
  }

  void remember(const std::string& entry) {
    if (!hist_ || entry.empty()) return;
    HistEvent ev;
    history(hist_, &ev, H_ENTER, entry.c_str());
    if (!path_.empty()) history(hist_, &ev, H_SAVE, path_.c_str());
  }

 private:
  // Reads the pasted bytes up to ESC[201~ straight from the terminal and inserts them.
  static unsigned char paste_fn(EditLine* el, int) {
    std::string text;
    char c;
    for (;;) {
      const ssize_t n = ::read(STDIN_FILENO, &c, 1);
      if (n < 0 && errno == EINTR && !ending() && g_sigint.load() == 0) continue;  // a resize mid-paste
      if (n != 1) break;
      text += c;
      if (text.ends_with("\033[201~")) {
        text.resize(text.size() - 6);
        break;
      }
    }
    // Terminals send Enter in a paste as CR, and the terminal's input modes (icrnl, inlcr) turn a
    // pasted CRLF into LF CR: either pair is one line break, a lone CR or LF another.
    std::string lines;
    lines.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      const char ch = text[i];
      if (ch != '\r' && ch != '\n') {
        lines += ch;
        continue;
      }
      lines += '\n';
      if (i + 1 < text.size() && (text[i + 1] == '\r' || text[i + 1] == '\n') && text[i + 1] != ch) ++i;
    }
    text = std::move(lines);
    if (!text.empty()) el_insertstr(el, text.c_str());
    return CC_REFRESH;
  }

  static unsigned char restore_fn(EditLine* el, int) {
    void* self = nullptr;
    el_get(el, EL_CLIENTDATA, &self);
    const LineReader& r = *static_cast<LineReader*>(self);
    if (!r.restore_.empty()) el_insertstr(el, r.restore_.c_str());
    if (r.restore_after_ > 0) el_cursor(el, -r.restore_after_);
    return CC_REFRESH;
  }

  static const char* prompt_fn(EditLine* el) {
    void* self = nullptr;
    el_get(el, EL_CLIENTDATA, &self);
    return static_cast<LineReader*>(self)->prompt_;
  }

  bool tty_;
  EditLine* el_ = nullptr;
  History* hist_ = nullptr;
  std::string path_;
  const char* prompt_ = "> ";
  bool paste_mode_ = false;
  std::string restore_;
  int restore_after_ = 0;  // characters of restore_ after the cursor
  static constexpr const char* k_restore_key = "\033[99999~";  // no terminal sends it
};

class ChatSession {
 public:
  // `reply`: what every reply is generated with (its limit, grammar and logit bias).
  ChatSession(const ChatCommand& c, Session& s, Sampler& sampler, Conversation& conv, GenerateOptions reply)
      : c_(c), s_(s), sampler_(sampler), conv_(conv), reply_(std::move(reply)), tty_in_(isatty(STDIN_FILENO) == 1), reader_(tty_in_) {}

  // --session: loads the file when there is one to resume (session_to_resume; an Error ends the
  // chat before it starts). `system`: the system prompt the flags asked for, which the saved one replaces.
  void start_session(const std::string& system, bool resuming);
  int run();

 private:
  // Reads one message (joining pasted lines and """ blocks); nullopt at the end of input.
  std::optional<std::string> read_message();
  void stream_reply(bool regen, const std::string& text);
  bool command(const std::string& line);  // false: exit
  void print_stats() const;
  void print_kv() const;
  void status_line() const;
  // Once per pin: a pin (BOS and the system prompt) longer than the cache can hold is said.
  void warn_pin_cut();
  void save_session(const std::string& file);
  void load_session(const std::string& file);
  // Loads `file` into the conversation and says so, "vkllm: <label>: 4 messages, 312 tokens
  // restored in 2.10 ms", unless quiet; then whether the saved sampler differs from the flags.
  void restore(const std::string& file, const std::string& label, bool quiet);
  // --session: saves the conversation after every change to it.
  void autosave();
  const ModelFingerprint& fingerprint();

  const ChatCommand& c_;
  Session& s_;
  Sampler& sampler_;  // the conversation's; a load replaces its state
  Conversation& conv_;
  const GenerateOptions reply_;
  bool tty_in_;
  // Where a command's output goes: stdout in a terminal, stderr for a script (stdin not a
  // terminal) or when stdout is redirected: stdout then carries nothing but the replies.
  FILE* command_out() const { return tty_in_ && stdout_is_tty() ? stdout : stderr; }
  LineReader reader_;
  bool last_interrupted_ = false;  // the previous event was a Ctrl+C
  int exit_code_ = -1;
  std::pair<uint32_t, uint32_t> pin_cut_said_{};  // the pin (wanted, held) last warned of
  bool failed_ = false;  // a turn, a --session save, a /save or a /load failed: a piped chat then exits 1
  // A script piping messages learns from the status that a reply, a save or a load failed.
  int exit_status(int code) const { return !tty_in_ && failed_ ? 1 : code; }
  std::optional<ModelFingerprint> fingerprint_;  // computed on the first save or load
};

std::optional<std::string> ChatSession::read_message() {
  std::string line, msg;
  for (;;) {
    g_sigint = 0;
    const auto st = reader_.read(line, "> ");
    if (st == LineReader::Status::Ended) {
      if (tty_in_) std::fputc('\n', term_out());
      exit_code_ = end_status();
      return std::nullopt;
    }
    if (st == LineReader::Status::Eof) {
      if (tty_in_) std::fputc('\n', term_out());
      exit_code_ = 0;
      return std::nullopt;
    }
    if (st == LineReader::Status::Interrupted) {
      std::fputc('\n', term_out());
      if (!line.empty()) {  // Ctrl+C on a typed line drops the line, as in a shell
        last_interrupted_ = true;
        continue;
      }
      // Ctrl+C at the prompt ends the chat: 0, or 130 when the previous event was a Ctrl+C too.
      exit_code_ = last_interrupted_ ? 130 : 0;
      return std::nullopt;
    }
    if (line.empty() && !reader_.input_pending()) continue;
    last_interrupted_ = false;
    msg = line;
    break;
  }
  if (msg.starts_with("\"\"\"")) {
    // A """ block: everything up to a line ending in """.
    std::string block = msg.substr(3), line2;
    const bool closed_at_once = block.size() >= 3 && block.ends_with("\"\"\"");
    if (closed_at_once) return block.substr(0, block.size() - 3);
    for (;;) {
      const auto st = reader_.read(line2, "... ");
      if (st == LineReader::Status::Ended) {
        exit_code_ = end_status();
        return std::nullopt;
      }
      if (st == LineReader::Status::Interrupted) {  // Ctrl+C drops the unfinished block
        std::fputc('\n', term_out());
        last_interrupted_ = true;
        return read_message();
      }
      if (st != LineReader::Status::Line) break;
      if (line2.ends_with("\"\"\"")) {
        // A closing line of """ alone adds no line (it left a trailing newline in the message).
        if (line2.size() > 3) block += (block.empty() ? "" : "\n") + line2.substr(0, line2.size() - 3);
        break;
      }
      block += (block.empty() ? "" : "\n") + line2;
    }
    reader_.remember("\"\"\"" + block + "\"\"\"");
    return block;
  }
  // Pasted lines arrive together: join them into one message instead of sending each.
  while (reader_.input_pending()) {
    std::string more;
    if (reader_.read(more, "") != LineReader::Status::Line) break;
    msg += "\n" + more;
  }
  reader_.remember(msg);
  return msg;
}

// A line of the chat's own on stderr, dim where stderr is a terminal and NO_COLOR is unset.
void dim_line(const std::string& text) {
  if (no_color() || !stderr_is_tty()) std::fprintf(stderr, "%s\n", text.c_str());
  else std::fprintf(stderr, "\033[2m%s\033[0m\n", text.c_str());
}

void ChatSession::warn_pin_cut() {
  const std::pair pin{conv_.pin_wanted(), conv_.pinned()};
  if (pin == pin_cut_said_) return;  // once per pin (a /system or /load may make another)
  if (cli::warn_pin_cut(pin.first, pin.second, s_.engine->cache())) pin_cut_said_ = pin;
}

void ChatSession::status_line() const {
  if (!stderr_is_tty()) return;
  const KvCache& kv = s_.engine->cache();
  const GenerationStats& st = conv_.last_stats();
  char times[64];
  std::snprintf(times, sizeof times, "TTFT %.2f s · %.1f tok/s", st.ttft_ms / 1000, st.decode_tok_s());
  const std::string text = "[ " + with_commas(kv.used()) + "/" + with_commas(kv.capacity()) + " tok · " +
                           human_bytes(kv.bytes_used()) + " KV · " + times + " ]";
  dim_line(text);
}

// Turns the terminal's echo off while a reply streams, so keys typed meanwhile do not mix into
// it (ISIG stays on: Ctrl+C still interrupts), and drops them when it ends.
class EchoOff {
 public:
  explicit EchoOff(bool tty) : on_(tty && tcgetattr(STDIN_FILENO, &saved_) == 0) {
    if (!on_) return;
    termios t = saved_;
    t.c_lflag &= ~tcflag_t(ECHO);
    tcsetattr(STDIN_FILENO, TCSANOW, &t);
  }
  // Keys typed during the reply are dropped (they were sent as the next message once it ended).
  ~EchoOff() {
    if (on_)
      while (tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved_) != 0 && errno == EINTR) {
      }
  }
  EchoOff(const EchoOff&) = delete;
  EchoOff& operator=(const EchoOff&) = delete;

 private:
  termios saved_{};
  bool on_;
};

void ChatSession::stream_reply(bool regen, const std::string& text) {
  const EchoOff quiet_keys(tty_in_);
  GenerateOptions go = reply_;
  g_sigint = 0;
  const auto on_text = [](const std::string& piece) {
    // A reply nobody can read (a closed pipe, a full disk) stops; main() reports it, status 1.
    return write_stdout(piece) && g_sigint.load() == 0 && !ending();
  };
  ProgressBar bar("prefill", "tok", c_.opts.quiet);
  // Ctrl+C (or SIGTERM) during the prefill drops the message at the next chunk (a /regen keeps the
  // reply it had), as a reply stops at its next token (it went on to the first token of the reply).
  const auto progress = [&](uint64_t done, uint64_t total) {
    if (g_sigint.load() > 0 || ending()) throw PrefillInterrupted{};
    bar.update(done, total);
  };
  // The bar ends before the reply (its line would be cleared under the reply's last line).
  const Conversation::ReplyHooks hooks{[&] {
                                         bar.finish();
                                         catch_up_draft(s_, reply_.speculative, c_.opts.quiet);
                                         warn_pin_cut();
                                       },
                                       {}};
  const GenerationStats* reply = nullptr;
  try {
    reply = &(regen ? conv_.regen(go, on_text, progress, hooks) : conv_.say(text, go, on_text, progress, hooks));
  } catch (const PrefillInterrupted&) {
    bar.finish();
    last_interrupted_ = true;
    if (tty_in_ && !ending()) dim_line(regen ? "[interrupted: the reply stays as it was]" : "[interrupted: message dropped]");
    return;
  }
  const GenerationStats& st = *reply;
  std::fputc('\n', stdout);
  std::fflush(stdout);
  last_interrupted_ = st.stop_reason == "interrupted";
  // A message that leaves the cache no room (without -n a reply stops before it would evict its
  // own turn) got no reply: said, and a piped chat's status says so.
  if (st.generated == 0 && st.stop_reason == "context full") {
    const uint32_t pinned = conv_.pinned();
    std::fprintf(stderr, "vkllm: error: the message fills --ctx %s%s: no room for a reply (a larger --ctx, or -n N to run through the ring)\n",
                 with_commas(s_.engine->cache().capacity()).c_str(),
                 pinned <= 1            ? ""
                 : c_.opts.keep >= 0 ? (" with the " + with_commas(pinned) + " tokens --keep pins").c_str()
                                     : (" with the " + with_commas(pinned) + " pinned tokens of BOS and the system prompt").c_str());
    failed_ = true;
  }
  if (last_interrupted_ && tty_in_) dim_line("[interrupted]");
  if (!c_.opts.quiet) status_line();
}

void ChatSession::print_stats() const {
  FILE* out = command_out();
  const KvCache& kv = s_.engine->cache();
  const GenerationStats& st = conv_.last_stats();
  const uint64_t stale = conv_.stale();
  std::fprintf(out, "tokens      %s / %s in the cache (%s pinned%s), conversation %s\n", with_commas(kv.used()).c_str(),
               with_commas(kv.capacity()).c_str(), with_commas(conv_.pinned()).c_str(),
               stale ? (", " + with_commas(stale) + " of an undone exchange, replaced at the next message").c_str() : "",
               with_commas(conv_.tokens().size()).c_str());
  std::fprintf(out, "evicted     %s tokens of this conversation are out of the cache (%s evicted since it was last emptied)\n",
               with_commas(conv_.evicted()).c_str(), with_commas(kv.evicted()).c_str());
  std::fprintf(out, "KV cache    %s used, %s/token, K %s, V %s\n", human_bytes(kv.bytes_used()).c_str(),
               human_bytes(kv.bytes_per_token()).c_str(), cache_type_name(kv.type_k()), cache_type_name(kv.type_v()));
  std::fprintf(out, "last turn   %s prompt tokens (the conversation), %s cached, %s prefilled%s, %s generated (%s)\n",
               with_commas(st.prompt_tokens).c_str(), with_commas(st.cached_tokens).c_str(), with_commas(st.prefilled()).c_str(),
               st.skipped_tokens ? (", " + with_commas(st.skipped_tokens) + " past the window (not run)").c_str() : "",
               with_commas(st.generated).c_str(), st.stop_reason.empty() ? "-" : st.stop_reason.c_str());
  std::fprintf(out, "speed       TTFT %s · prefill %.1f tok/s · decode %.1f tok/s%s\n", fmt_ms(st.ttft_ms).c_str(),
               st.prefill_tok_s(), st.decode_tok_s(), reply_.speculative.on() ? draft_summary(st).c_str() : "");
  std::fprintf(out, "messages    %zu exchange%s%s\n", conv_.n_exchanges(), conv_.n_exchanges() == 1 ? "" : "s",
               conv_.system().empty() ? "" : " + system prompt");
}

// The KV table of `vkllm info`, for this run's context and cache types.
void ChatSession::print_kv() const {
  FILE* out = command_out();
  const ModelConfig& c = s_.engine->config();
  const KvCache& kv = s_.engine->cache();
  const uint32_t ctx = kv.capacity();
  std::fprintf(out, "KV cache: %u layers × 2 (K, V) × %u KV heads × %u head dim per token\n", c.n_layer, c.n_head_kv,
               c.head_dim);
  std::fprintf(out, "  %-10s %14s %14s %14s\n", "type", "per token", ("× " + with_commas(ctx) + " tok").c_str(), "used now");
  for (CacheType t : k_cache_types) {
    if (!cache_type_fits(t, c.n_embd_kv())) {
      std::fprintf(out, "  %-10s unavailable: %s\n", cache_type_name(t), cache_type_misfit(c.n_embd_kv()).c_str());
      continue;
    }
    const uint64_t per = kv_bytes_per_token(c, t, t);
    const bool chosen = t == kv.type_k() && t == kv.type_v();
    const uint32_t ring = kv.window_ring();
    std::fprintf(out, "%s %-10s %14s %14s %14s\n", chosen ? "*" : " ", cache_type_name(t), human_bytes(per).c_str(),
                 human_bytes(kv_cache_bytes(c, t, t, ctx, ring)).c_str(), human_bytes(kv_cache_bytes(c, t, t, ctx, ring, kv.used())).c_str());
  }
  if (kv.type_k() != kv.type_v()) {
    const std::string name = std::string(cache_type_name(kv.type_k())) + "/" + cache_type_name(kv.type_v());
    std::fprintf(out, "* %-10s %14s %14s %14s\n", name.c_str(), human_bytes(kv.bytes_per_token()).c_str(),
                 human_bytes(kv.device_bytes()).c_str(), human_bytes(kv.bytes_used()).c_str());
  }
  if (kv.window_ring())
    std::fprintf(out, "  (per token: every layer; the %u-token window layers keep a ring of %u slots each)\n", c.n_swa, kv.window_ring());
}

const ModelFingerprint& ChatSession::fingerprint() {
  if (!fingerprint_) fingerprint_ = model_fingerprint(s_.file, s_.engine->cache().capacity(), c_.opts.rope);
  return *fingerprint_;
}

// The session file holds the cache, its tokens, the sampler and the conversation with its
// account of the cache (docs/chat.md, "Sessions").
void ChatSession::save_session(const std::string& file) {
  const uint64_t bytes = conv_.save(file, fingerprint());
  std::fprintf(stderr, "vkllm: /save: %s: %zu messages, %s tokens, %s%s\n", file.c_str(), conv_.messages().size(),
               with_commas(s_.engine->cache().used()).c_str(), human_bytes(bytes).c_str(), appended_note(conv_.journal()).c_str());
}

void ChatSession::restore(const std::string& file, const std::string& label, bool quiet) {
  const auto t0 = std::chrono::steady_clock::now();
  const Conversation::Restored r = conv_.load(file, fingerprint());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char took[32];
  std::snprintf(took, sizeof took, " in %.2f ms", ms);
  std::string summary = with_commas(conv_.messages().size()) + " messages, " + with_commas(s_.engine->cache().used()) +
                        " tokens restored";
  if (conv_.evicted() > 0) summary += " (" + with_commas(conv_.evicted()) + " evicted before)";
  summary += took;
  if (!r.chat_state) summary += "; no chat state in the file (vkllm run --chat): rebuilt from the messages";
  summary += unfinished_save_note(r.info);
  if (!quiet) std::fprintf(stderr, "vkllm: %s: %s\n", label.c_str(), summary.c_str());
  if (const std::string note = apply_sampling_flags(file, sampler_, c_.opts.sampling, c_.sampling_flags); !c_.opts.quiet && !note.empty())
    std::fprintf(stderr, "vkllm: %s\n", note.c_str());
}

// A failed load changes nothing: the conversation, the cache and the sampler stay as they were.
void ChatSession::load_session(const std::string& file) { restore(file, "/load: " + file, false); }

void ChatSession::start_session(const std::string& system, bool resuming) {
  if (!resuming) return;
  restore(c_.session, "session " + c_.session, c_.opts.quiet);
  if (c_.opts.quiet || system.empty() || system == conv_.system()) return;
  std::fprintf(stderr, "vkllm: session %s: %s\n", c_.session.c_str(),
               conv_.system().empty() ? "the session has no system prompt; --system is not used (/system TEXT sets one)"
                                      : "the saved system prompt is kept, not --system (/system TEXT replaces it)");
}

void ChatSession::autosave() {
  if (c_.session.empty()) return;
  try {
    conv_.save(c_.session, fingerprint());
  } catch (const Error& e) {
    std::fprintf(stderr, "vkllm: --session: %s\n", e.what());
    failed_ = true;
  }
}

constexpr const char* k_help =
    "commands:\n"
    "  /help            this list\n"
    "  /exit            leave (also Ctrl+D, or Ctrl+C at the prompt)\n"
    "  /clear           new conversation (the system prompt stays cached)\n"
    "  /system [TEXT]   show or set the system prompt\n"
    "  /regen           generate the last reply again\n"
    "  /undo            drop the last exchange\n"
    "  /stats           cache use, evictions, last turn's timing\n"
    "  /kv              KV cache memory for this context and cache type\n"
    "  /save FILE       save the session   /load FILE   load one\n"
    "input: \"\"\" starts and ends a multi-line message; pasted lines are sent as one message;\n"
    "Ctrl+C stops a reply; a line starting with // sends the rest starting with /\n";

bool ChatSession::command(const std::string& line) {
  const size_t sp = line.find(' ');
  const std::string name = line.substr(0, sp);
  std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
  while (!arg.empty() && arg.front() == ' ') arg.erase(0, 1);
  while (!arg.empty() && arg.back() == ' ') arg.pop_back();
  try {
    // A word after a command that takes none is a typo, not something to ignore (/clear now).
    if (!arg.empty() && (name == "/exit" || name == "/quit" || name == "/help" || name == "/clear" || name == "/regen" ||
                         name == "/undo" || name == "/stats" || name == "/kv"))
      throw Error(name + " takes no argument (got '" + arg + "'): nothing done");
    if (name == "/exit" || name == "/quit") return false;
    if (name == "/help") std::fprintf(command_out(), "%s", k_help);
    else if (name == "/clear") {
      conv_.clear();
      std::fprintf(command_out(), "(new conversation)\n");
      autosave();
    } else if (name == "/system") {
      if (arg.empty()) std::fprintf(command_out(), "%s\n", conv_.system().empty() ? "(no system prompt)" : conv_.system().c_str());
      else {
        conv_.set_system(arg);
        std::fprintf(command_out(), "(system prompt set)\n");
        autosave();
      }
    } else if (name == "/regen") {
      stream_reply(true, "");
      autosave();
    } else if (name == "/undo") {
      conv_.undo();
      std::fprintf(command_out(), "(last exchange dropped; %zu left)\n", conv_.n_exchanges());
      autosave();
    } else if (name == "/stats") print_stats();
    else if (name == "/kv") print_kv();
    else if (name == "/save" || name == "/load") {
      if (arg.empty()) throw Error(name + " needs a file name");
      try {
        if (name == "/save") save_session(arg);
        else load_session(arg);
      } catch (const Error& e) {
        failed_ = true;  // nothing was written or loaded: a piped chat exits 1 at the end
        throw Error(name + ": " + e.what());
      }
      if (name == "/load") autosave();
    } else std::fprintf(stderr, "vkllm: unknown command %s (/help lists them)\n", name.c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "vkllm: %s\n", e.what());
  }
  std::fflush(stdout);
  return true;
}

int ChatSession::run() {
  // A Ctrl+C while the chat was starting (its handlers installed, a --session restoring) ends it, as
  // one during the model load does; it was cleared by the first read and the chat went on.
  if (g_sigint.load() > 0) return 130;
  if (tty_in_ && !c_.opts.quiet) std::fprintf(stderr, "vkllm: chat: /help for commands, Ctrl+D to leave\n");
  for (;;) {
    std::optional<std::string> msg = read_message();
    if (!msg) return exit_status(exit_code_);
    if (msg->find_first_not_of(" \t\n\r") == std::string::npos) continue;  // nothing to say
    if (msg->starts_with("/") && !msg->starts_with("//")) {
      last_interrupted_ = false;
      if (!command(*msg)) return exit_status(0);
      if (ending()) return end_status();
      continue;
    }
    if (msg->starts_with("//")) msg->erase(0, 1);
    try {
      stream_reply(false, *msg);
      autosave();
      if (ending()) return end_status();
      // Replies nobody can read (stdout failed): the chat ends, status 1 (main() says why); it
      // prefilled every later message for a reply of one token.
      if (noted_stdout_error() != 0) return 1;
    } catch (const Error& e) {
      // A template that refuses the conversation, say: the chat stays usable (/undo, /clear).
      std::fprintf(stderr, "vkllm: error: %s\n", e.what());
      failed_ = true;
    }
  }
}

int chat(const ChatCommand& c) {
  std::string system = c.system;
  if (!c.system_file.empty()) {
    system = read_text_input(c.system_file, "the system prompt file");
    while (!system.empty() && (system.back() == '\n' || system.back() == '\r')) system.pop_back();
  }
  check_session_path(c.session);
  GenerateOptions reply;
  reply.n_predict = c.n_predict;
  reply.stop = c.stop;
  reply.grammar = read_grammar_flags(c.grammar);
  reply.speculative = c.speculative;
  check_speculative_options(reply.speculative, c.opts.ubatch, c.opts.model_draft);
  note_idle_draft_flags(c.draft_flags, reply.speculative, c.opts.quiet);
  // Messages come from stdin: one that cannot be read (a directory) is refused before the load
  // (it read as an empty chat, status 0).
  if (struct stat st{}; ::fstat(STDIN_FILENO, &st) == 0 && S_ISDIR(st.st_mode))
    throw Error("stdin: cannot read the messages: Is a directory");
  // The template is resolved before the weights load: a wrong --chat-template is refused at once.
  std::optional<ChatTemplate> tmpl;
  const bool resuming = session_to_resume(c.session, c.opts.quiet);
  const RunOptions opts = resuming ? with_session_cache_type(c.session, c.opts) : c.opts;
  Session s = open_session(opts, [&](const gguf::File& file, const Tokenizer& tok, uint32_t capacity) {
    reply.logit_bias = read_logit_bias(c.logit_bias, tok.n_vocab());
    tmpl.emplace(ChatTemplate::resolve(&file, c.chat_template));
    if (resuming) precheck_session(c.session, file, capacity, opts);
  });
  reply.speculative.draft_model = s.drafter();
  check_speculation(reply.speculative, *s.engine, c.opts.quiet);
  Sampler sampler(c.opts.sampling);
  Conversation conv(*s.engine, *s.tokenizer, sampler, std::move(*tmpl), system, c.opts.keep);
  install_signals();
  ChatSession session(c, s, sampler, conv, std::move(reply));
  session.start_session(system, resuming);
  const int code = session.run();
  if (c.opts.profile) print_profile(s.engine->timings());
  std::fflush(stdout);
  return code;
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto c = std::make_shared<ChatCommand>();
  CLI::App* cmd = app.add_subcommand("chat", "Chat with a model in the terminal (or one message per line from stdin)");
  add_model_options(cmd, c->opts);
  c->sampling_flags = add_sampling_options(cmd, c->opts.sampling);
  auto* sys = cmd->add_option("--system", c->system, "System prompt");
  cmd->add_option("--system-file", c->system_file, "Read the system prompt from a file")->excludes(sys);
  cmd->add_option("--chat-template", c->chat_template, "Chat template: a built-in name or a Jinja file");
  add_n_predict_option(cmd, c->n_predict, "Most tokens per reply");
  add_stop_option(cmd, c->stop, "a reply");
  add_grammar_options(cmd, c->grammar);
  add_logit_bias_option(cmd, c->logit_bias);
  c->draft_flags = add_speculative_options(cmd, c->speculative, c->opts.model_draft);
  add_session_option(cmd, c->session);
  cmd->callback([c] {
    // The session is gone (device objects freed) before the exit status leaves through CLI11.
    if (const int code = chat(*c); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace vkllm::cli
