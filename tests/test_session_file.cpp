// Session file format without a device: round trip of encode/read, every truncation and byte
// flip refused with the section and offset, a newer version refused, the model fingerprint,
// and kill -9 during 200 repeated atomic saves never leaving an unreadable file.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <xxhash.h>
#include <vector>

#include "base/error.h"
#include "store/prompt_cache.h"
#include "store/session_file.h"
#include "atomic_file.h"
#include "test_support.h"

namespace fs = std::filesystem;
using vkllm::CacheType;
using vkllm::SessionInfo;

namespace {

// A small session: 3 layers, rows of 64 / 34 bytes (f16 K, q8_0 V), `n` tokens.
SessionInfo make_info(uint32_t n, uint32_t salt = 0) {
  SessionInfo s;
  s.model.hash = 0x0123456789abcdefull;
  s.model.name = "test-model";
  s.n_layer = 3;
  s.n_head_kv = 2;
  s.head_dim = 16;
  s.type_k = CacheType::F16;
  s.type_v = CacheType::Q8_0;
  s.row_bytes_k = 64;
  s.row_bytes_v = 34;
  s.capacity = 256;
  s.n_keep = 1;
  for (uint32_t i = 0; i < n; ++i) s.tokens.push_back(int32_t((i * 7 + salt) % 500));
  s.conversation = R"({"messages":[{"role":"user","content":"hi"}]})";
  s.sampler = {1, 2, 3, 4, 5};
  return s;
}

std::vector<uint8_t> make_kv(const SessionInfo& s, uint32_t salt = 0) {
  std::vector<uint8_t> kv(s.n_layer * s.tokens.size() * (s.row_bytes_k + s.row_bytes_v));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = uint8_t(i * 31 + salt);
  return kv;
}

std::string tmp_path(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("vkllm_test_session_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return (dir / name).string();
}

void write(const std::string& path, std::span<const uint8_t> bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// The message read_session_info throws for these bytes ("" when it accepts them).
std::string error_for(std::span<const uint8_t> bytes, bool with_kv = true) {
  const std::string path = tmp_path("probe.vkv");
  write(path, bytes);
  try {
    vkllm::read_session_info(path, with_kv);
  } catch (const vkllm::Error& e) {
    return e.what();
  }
  return "";
}

// Offsets where each section's frame starts: the preamble is 16 bytes, a frame 24 + payload.
std::vector<std::pair<std::string, uint64_t>> section_starts(const std::vector<uint8_t>& f) {
  std::vector<std::pair<std::string, uint64_t>> out;
  uint64_t at = 16;
  while (at + 16 <= f.size()) {
    uint64_t len;
    std::memcpy(&len, f.data() + at + 8, 8);
    out.emplace_back(std::string(reinterpret_cast<const char*>(f.data() + at), 4), at);
    at += 24 + len;
  }
  return out;
}

// One section as session files frame it: tag, 0, length, payload, XXH64(payload, seed = tag).
void put_section(std::vector<uint8_t>& out, const char* tag, std::span<const uint8_t> payload) {
  uint32_t t;
  std::memcpy(&t, tag, 4);
  const uint64_t len = payload.size(), sum = XXH64(payload.data(), payload.size(), t);
  const auto put = [&](const void* p, size_t n) { out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n); };
  const uint32_t zero = 0;
  put(&t, 4);
  put(&zero, 4);
  put(&len, 8);
  put(payload.data(), payload.size());
  put(&sum, 8);
}

// HEAD .. SAMP of `s` as encode_session writes them (the sections before KVDT).
std::vector<uint8_t> state_sections(const SessionInfo& s) {
  const std::vector<uint8_t> whole = vkllm::encode_session(s, make_kv(s));
  const uint64_t kvdt = section_starts(whole).back().second;
  return {whole.begin() + 16, whole.begin() + std::ptrdiff_t(kvdt)};
}

// A version-3 file: `base` written whole, then one update appended by hand as save_session
// appends it: 5 new tokens' rows (ROWS) and the state of base + those 5 (LIST: the base's KVDT,
// then the ROWS). `extents` replaces the LIST's extents when given.
struct Appended {
  std::vector<uint8_t> bytes;
  uint64_t update_at = 0;  // where the update starts (the base's end)
  SessionInfo state;       // what the update holds
};
Appended appended_file(const std::vector<std::array<uint64_t, 3>>* extents = nullptr, uint64_t model = 0) {
  const SessionInfo base = make_info(10);
  Appended a;
  a.bytes = vkllm::encode_session(base, make_kv(base));
  const uint32_t preamble[2] = {3, 6};
  std::memcpy(a.bytes.data() + 8, preamble, 8);
  const uint64_t kvdt = section_starts(a.bytes).back().second;
  a.update_at = a.bytes.size();
  a.state = make_info(15);
  if (model) a.state.model.hash = model;
  std::vector<uint8_t> body, rows(8 + 5 * 3 * (64 + 34), 0x5a);
  const uint32_t five = 5;
  std::memcpy(rows.data(), &five, 4);
  std::memset(rows.data() + 4, 0, 4);
  put_section(body, "ROWS", rows);
  const std::vector<uint8_t> state = state_sections(a.state);
  body.insert(body.end(), state.begin(), state.end());
  const uint64_t rows_at = a.update_at + 32;
  const std::vector<std::array<uint64_t, 3>> normal = {{kvdt, 0, 10}, {rows_at, 0, 5}};
  const auto& xs = extents ? *extents : normal;
  std::vector<uint8_t> list(8 + 16 * xs.size());
  const uint32_t n = uint32_t(xs.size());
  std::memcpy(list.data(), &n, 4);
  for (size_t i = 0; i < xs.size(); ++i) {
    const uint32_t first = uint32_t(xs[i][1]), count = uint32_t(xs[i][2]);
    std::memcpy(list.data() + 8 + 16 * i, &xs[i][0], 8);
    std::memcpy(list.data() + 16 + 16 * i, &first, 4);
    std::memcpy(list.data() + 20 + 16 * i, &count, 4);
  }
  put_section(body, "LIST", list);
  const uint64_t total = 32 + body.size();
  put_section(a.bytes, "UPDT", std::span(reinterpret_cast<const uint8_t*>(&total), 8));
  a.bytes.insert(a.bytes.end(), body.begin(), body.end());
  return a;
}

}  // namespace

TEST(SessionFile, RoundTrip) {
  SessionInfo s = make_info(40);
  s.shifts = {25, 0, 7, 7};
  const std::vector<uint8_t> kv = make_kv(s);
  const std::vector<uint8_t> bytes = vkllm::encode_session(s, kv);
  const std::string path = tmp_path("round.vkv");
  write(path, bytes);
  const SessionInfo r = vkllm::read_session_info(path);
  EXPECT_EQ(r.model.hash, s.model.hash);
  EXPECT_EQ(r.model.name, s.model.name);
  EXPECT_EQ(r.tokens, s.tokens);
  EXPECT_EQ(r.conversation, s.conversation);
  EXPECT_EQ(r.sampler, s.sampler);
  EXPECT_EQ(r.type_v, CacheType::Q8_0);
  EXPECT_EQ(r.n_keep, 1u);
  EXPECT_TRUE(r.has_shifts);
  EXPECT_EQ(r.shifts.split, 25u);
  EXPECT_EQ(r.shifts.rest, 7u);
  EXPECT_EQ(r.file_bytes, bytes.size());
  // Header-only read (the prompt cache's index) agrees.
  EXPECT_EQ(vkllm::read_session_info(path, false).tokens, s.tokens);
  // Size: the KV rows plus tokens plus a small fixed overhead.
  const uint64_t overhead = bytes.size() - kv.size() - s.tokens.size() * 4 - s.conversation.size() - s.sampler.size();
  EXPECT_LT(overhead, 256u);
}

TEST(SessionFile, TruncationAtEverySectionBoundaryAndRandomOffsets) {
  const SessionInfo s = make_info(20);
  const std::vector<uint8_t> bytes = vkllm::encode_session(s, make_kv(s));
  std::vector<uint64_t> cuts = {0, 1, 7, 8, 12, 15};
  for (const auto& [tag, at] : section_starts(bytes)) {
    for (uint64_t d : {0, 1, 4, 8, 15, 16, 17}) cuts.push_back(at + d);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) cuts.push_back(rng() % bytes.size());
  for (uint64_t cut : cuts) {
    if (cut >= bytes.size()) continue;
    const std::string err = error_for(std::span(bytes).first(cut));
    ASSERT_FALSE(err.empty()) << "truncated at " << cut << " was accepted";
    EXPECT_NE(err.find("probe.vkv"), std::string::npos) << err;
    if (cut > 16) {
      EXPECT_TRUE(err.find("truncated") != std::string::npos || err.find("section") != std::string::npos) << err;
    }
  }
  // A cut inside KVDT names that section and its offset.
  const auto starts = section_starts(bytes);
  const uint64_t kvdt = starts.back().second;
  const std::string err = error_for(std::span(bytes).first(kvdt + 40));
  EXPECT_NE(err.find("truncated: section 'KVDT' at offset " + std::to_string(kvdt)), std::string::npos) << err;
}

TEST(SessionFile, EveryByteFlipIsRefused) {
  const SessionInfo s = make_info(6);
  const std::vector<uint8_t> bytes = vkllm::encode_session(s, make_kv(s));
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::vector<uint8_t> bad = bytes;
    bad[i] ^= uint8_t(1u << (i % 8));
    const std::string err = error_for(bad);
    ASSERT_FALSE(err.empty()) << "flip at " << i << " was accepted";
  }
  // A flip inside a payload is reported as that section's checksum mismatch.
  std::vector<uint8_t> bad = bytes;
  const auto starts = section_starts(bytes);
  bad[starts[1].second + 24 + 2] ^= 0x40;  // inside TOKS' payload
  EXPECT_NE(error_for(bad).find("section 'TOKS' at offset " + std::to_string(starts[1].second) + " (24 bytes): checksum mismatch"),
            std::string::npos)
      << error_for(bad);
  // Trailing garbage is refused too.
  bad = bytes;
  bad.push_back(0);
  EXPECT_NE(error_for(bad).find("1 bytes after the last section"), std::string::npos) << error_for(bad);
}

TEST(SessionFile, MagicAndNewerVersion) {
  const SessionInfo s = make_info(3);
  std::vector<uint8_t> bytes = vkllm::encode_session(s, make_kv(s));
  std::vector<uint8_t> v4 = bytes;
  v4[8] = 4;
  EXPECT_NE(error_for(v4).find("format version 4 is newer than this vkllm reads (3)"), std::string::npos) << error_for(v4);
  // Version 3 (updates appended) says 6 sections: a version-2 file with only its version changed is damaged.
  std::vector<uint8_t> v3 = bytes;
  v3[8] = 3;
  EXPECT_NE(error_for(v3).find("offset 12: 5 sections, version 3 has 6"), std::string::npos) << error_for(v3);
  std::vector<uint8_t> v0 = bytes;
  v0[8] = 0;
  EXPECT_NE(error_for(v0).find("format version 0 is not supported"), std::string::npos) << error_for(v0);
  std::vector<uint8_t> gguf = bytes;
  std::memcpy(gguf.data(), "GGUF", 4);
  EXPECT_NE(error_for(gguf).find("not a vkllm session file"), std::string::npos);
  // A flipped high bit of the version is damage, not a newer format.
  std::vector<uint8_t> flipped = bytes;
  flipped[9] ^= 0x40;
  EXPECT_NE(error_for(flipped).find("offset 8: format version 16386 is no version of this format (the file is corrupted)"),
            std::string::npos)
      << error_for(flipped);
  // A short file that does not begin like a session file is not one; one that does is truncated.
  const std::string text = "hello\n";
  EXPECT_NE(error_for(std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())).find("offset 0: not a vkllm session file"),
            std::string::npos);
  EXPECT_NE(error_for(std::span(bytes).first(6)).find("truncated: 6 bytes, a session file starts with 16"), std::string::npos)
      << error_for(std::span(bytes).first(6));
  EXPECT_NE(error_for(std::span(bytes).first(0)).find("truncated: 0 bytes"), std::string::npos);
}

// The model name is stored as the saving run had it, and shown in errors and `vkllm cache list`:
// control characters (a damaged or crafted file) are shown as '?', never sent to a terminal.
TEST(SessionFile, ControlCharactersOfTheModelNameAreNotShown) {
  // C0, DEL and C1 controls become '?', a malformed byte U+FFFD; other characters stay.
  SessionInfo s = make_info(3);
  s.model.name = "evil\x1b" "[2J\nname\x7f \xc2\x9b" "1m \x9b" "2m café";
  const std::string path = tmp_path("name.vkv");
  write(path, vkllm::encode_session(s, make_kv(s)));
  EXPECT_EQ(vkllm::read_session_info(path, false).model.name, "evil?[2J?name? ?1m \xef\xbf\xbd" "2m café");
}

// A huge file that is no session (a model passed as --session by mistake; here a sparse 64 GiB
// file) is refused by its first bytes, not read into memory first (that was a bad_alloc).
TEST(SessionFile, AHugeFileIsRefusedByItsFirstBytes) {
  const std::string path = tmp_path("huge.vkv");
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << "GGUF";
  }
  fs::resize_file(path, uint64_t{64} << 30);
  try {
    vkllm::read_session_info(path, true);
    ADD_FAILURE() << "accepted";
  } catch (const vkllm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 0: not a vkllm session file"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

// Version 1 files (before the rotated copy's shifts joined HEAD) still read: HEAD is 16 bytes
// shorter, and the load rebases the copy.
TEST(SessionFile, VersionOneStillReads) {
  const SessionInfo s = make_info(5);
  std::vector<uint8_t> bytes = vkllm::encode_session(s, make_kv(s));
  uint64_t head_len;
  std::memcpy(&head_len, bytes.data() + 16 + 8, 8);
  const uint64_t payload = 16 + 16;
  bytes.erase(bytes.begin() + std::ptrdiff_t(payload + head_len - 16), bytes.begin() + std::ptrdiff_t(payload + head_len));
  head_len -= 16;
  std::memcpy(bytes.data() + 16 + 8, &head_len, 8);
  uint32_t tag;
  std::memcpy(&tag, "HEAD", 4);
  const uint64_t sum = XXH64(bytes.data() + payload, head_len, tag);
  std::memcpy(bytes.data() + payload + head_len, &sum, 8);
  bytes[8] = 1;
  const std::string path = tmp_path("v1.vkv");
  write(path, bytes);
  const SessionInfo r = vkllm::read_session_info(path);
  EXPECT_FALSE(r.has_shifts);
  EXPECT_EQ(r.tokens, s.tokens);
  EXPECT_EQ(r.n_evicted, s.n_evicted);
}

TEST(SessionFile, HugeCountsAreBoundedByTheFileSize) {
  // A HEAD claiming 2^31 tokens in a small file must fail before allocating.
  SessionInfo s = make_info(2);
  std::vector<uint8_t> bytes = vkllm::encode_session(s, make_kv(s));
  // n_used sits 16 (the rotation shifts) + 8 (n_evicted) + 4 bytes before the HEAD checksum;
  // rewrite it and the checksum.
  const auto starts = section_starts(bytes);
  uint64_t head_len;
  std::memcpy(&head_len, bytes.data() + 16 + 8, 8);
  const uint64_t payload = 16 + 16, n_used_at = payload + head_len - 28;
  const uint32_t huge = 0x7fffffff;
  std::memcpy(bytes.data() + n_used_at, &huge, 4);
  uint32_t tag;
  std::memcpy(&tag, "HEAD", 4);
  const uint64_t sum = XXH64(bytes.data() + payload, head_len, tag);
  std::memcpy(bytes.data() + payload + head_len, &sum, 8);
  const std::string err = error_for(bytes);
  EXPECT_NE(err.find("tokens cannot fit"), std::string::npos) << err;
  (void)starts;
}

TEST(SessionFile, FingerprintDistinguishesModels) {
  VKLLM_REQUIRE_SHARED("models/stories260K.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-f16.gguf");
  VKLLM_REQUIRE_SHARED("models/synth-llama-q8_0.gguf");
  const auto a = vkllm::model_fingerprint(gguf::File::open(vkllm::test::shared_path("models/stories260K.gguf")), 2048);
  const auto a2 = vkllm::model_fingerprint(gguf::File::open(vkllm::test::shared_path("models/stories260K.gguf")), 2048);
  const auto b = vkllm::model_fingerprint(gguf::File::open(vkllm::test::shared_path("models/synth-llama-f16.gguf")), 2048);
  const auto c = vkllm::model_fingerprint(gguf::File::open(vkllm::test::shared_path("models/synth-llama-q8_0.gguf")), 2048);
  EXPECT_EQ(a.hash, a2.hash);
  EXPECT_NE(a.hash, b.hash);
  EXPECT_NE(b.hash, c.hash);
  EXPECT_EQ(a.hex().size(), 16u);
  EXPECT_FALSE(a.name.empty());
}

// A child saves 200 times in a loop (alternating contents); the parent kills it with SIGKILL at
// a random moment. Whatever is on disk must read back as one of the two contents.
TEST(SessionFile, KillDuringRepeatedSavesNeverLeavesABrokenFile) {
  const SessionInfo s1 = make_info(200, 1), s2 = make_info(300, 2);
  const std::vector<uint8_t> b1 = vkllm::encode_session(s1, make_kv(s1, 1));
  const std::vector<uint8_t> b2 = vkllm::encode_session(s2, make_kv(s2, 2));
  const std::string path = tmp_path("killed.vkv");
  std::mt19937 rng(11);
  for (int round = 0; round < 5; ++round) {
    fs::remove(path);
    gguf::write_file_atomic(path, b1);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0; i < 200; ++i) gguf::write_file_atomic(path, i % 2 ? b1 : b2);
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(500 + rng() % 20000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    SessionInfo r;
    ASSERT_NO_THROW(r = vkllm::read_session_info(path)) << "round " << round;
    EXPECT_TRUE(r.tokens == s1.tokens || r.tokens == s2.tokens);
  }
  // Leftover temporaries (".killed.vkv.XXXXXX") are possible; the file itself never breaks.
  fs::remove_all(fs::path(path).parent_path());
}

// Which prompt-cache matches are worth loading an entry for: at least 8 shared tokens (all of a
// shorter entry) and at least 1/16 of the entry.
TEST(PromptCacheRule, WorthLoading) {
  EXPECT_FALSE(vkllm::worth_loading(1, 336));   // a shared BOS
  EXPECT_FALSE(vkllm::worth_loading(7, 20));
  EXPECT_TRUE(vkllm::worth_loading(8, 20));
  EXPECT_TRUE(vkllm::worth_loading(5, 5));      // a whole short entry
  EXPECT_FALSE(vkllm::worth_loading(4, 5));
  EXPECT_TRUE(vkllm::worth_loading(128, 2048));  // 1/16
  EXPECT_FALSE(vkllm::worth_loading(127, 2048));
}

// Version 3 (docs/session-format.md, "Appending"): the last whole update is the file's state; a
// file cut inside an update reads as the one before (the unfinished bytes counted); every flipped
// byte of the update is refused; so are LISTs that name what is not there, and an update of
// another model.
TEST(SessionFile, AnAppendedUpdateIsTheStateAndACutOneIsIgnored) {
  const Appended a = appended_file();
  const std::string path = tmp_path("v3.vkv");
  write(path, a.bytes);
  const SessionInfo r = vkllm::read_session_info(path);
  EXPECT_EQ(r.tokens, a.state.tokens);
  EXPECT_EQ(r.conversation, a.state.conversation);
  EXPECT_EQ(r.unfinished_bytes, 0u);
  EXPECT_EQ(vkllm::read_session_info(path, false).tokens, a.state.tokens);
  const std::vector<int32_t> base_tokens = make_info(10).tokens;
  for (uint64_t cut = a.update_at; cut < a.bytes.size(); ++cut) {
    write(path, std::span(a.bytes).first(cut));
    for (const bool with_kv : {true, false}) {
      const SessionInfo b = vkllm::read_session_info(path, with_kv);
      ASSERT_EQ(b.tokens, base_tokens) << "cut at " << cut;
      EXPECT_EQ(b.unfinished_bytes, cut - a.update_at);
    }
  }
  for (size_t i = a.update_at; i < a.bytes.size(); ++i) {
    std::vector<uint8_t> bad = a.bytes;
    bad[i] ^= uint8_t(1u << (i % 8));
    ASSERT_FALSE(error_for(bad).empty()) << "flip at " << i << " was accepted";
  }
  // Zeros to the end (a power loss can leave an append's length without its bytes): a save cut
  // short, after the base or after an update.
  for (const uint64_t at : {a.update_at, uint64_t(a.bytes.size())}) {
    std::vector<uint8_t> zeros(a.bytes.begin(), a.bytes.begin() + std::ptrdiff_t(at));
    zeros.resize(zeros.size() + 70000, 0);
    write(path, zeros);
    const SessionInfo z = vkllm::read_session_info(path);
    EXPECT_EQ(z.tokens, at == a.update_at ? base_tokens : a.state.tokens);
    EXPECT_EQ(z.unfinished_bytes, 70000u);
    zeros.back() = 1;  // not zeros to the end: damage
    EXPECT_NE(error_for(zeros).find("expected section 'UPDT', found '?\?\?\?' (the file is corrupted)"), std::string::npos) << error_for(zeros);
  }
  // Bytes after a whole update that are no update: damage.
  std::vector<uint8_t> junk = a.bytes;
  junk.insert(junk.end(), {'X', 'Y', 'Z', 'W'});
  EXPECT_NE(error_for(junk).find("expected section 'UPDT', found 'XYZW' (the file is corrupted)"), std::string::npos) << error_for(junk);

  const uint64_t kvdt = section_starts(a.bytes)[4].second, rows_at = a.update_at + 32;
  const std::vector<std::pair<std::vector<std::array<uint64_t, 3>>, std::string>> lists = {
      {{{kvdt + 1, 0, 10}, {rows_at, 0, 5}}, "extent 0 names offset " + std::to_string(kvdt + 1) + ", where no KVDT or ROWS section begins"},
      {{{kvdt, 0, 10}, {rows_at, 3, 5}}, "extent 1 takes rows 3 to 8 of a section of 5"},
      {{{kvdt, 0, 10}, {rows_at, 0, 4}}, "14 rows for 15 tokens"},
      {{{kvdt, 0, 11}, {rows_at, 0, 4}}, "extent 0 takes rows 0 to 11 of a section of 10"},
  };
  for (const auto& [extents, message] : lists) {
    const std::string err = error_for(appended_file(&extents).bytes);
    EXPECT_NE(err.find("section 'LIST' at offset"), std::string::npos) << err;
    EXPECT_NE(err.find(message), std::string::npos) << err;
  }
  const std::string other = error_for(appended_file(nullptr, 42).bytes);
  EXPECT_NE(other.find("an update's model or cache geometry differs from the first HEAD's (the file is corrupted)"), std::string::npos)
      << other;
}
