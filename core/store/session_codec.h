// Session files' encoding, shared by the reader (session_read.cpp) and the writer
// (session_file.cpp): constants, section framing, and the parsed form of a file. Internal to core/store.
#pragma once
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "store/session_file.h"

namespace vkllm::session_codec {

static_assert(std::endian::native == std::endian::little, "session files are written little-endian");

inline constexpr char kMagic[8] = {'V', 'K', 'L', 'L', 'M', 'S', 'E', 'S'};
inline constexpr uint32_t kSectionCount = 5;
inline constexpr uint32_t kWholeFileVersion = 2;  // a file written whole; the first update makes it 3
inline constexpr uint64_t kPreambleBytes = 16;
inline constexpr uint64_t kFrameBytes = 16 + 8;  // tag, reserved, length; checksum after the payload
inline constexpr const char* kTags[kSectionCount] = {"HEAD", "TOKS", "CONV", "SAMP", "KVDT"};
enum Section { kHead, kToks, kConv, kSamp, kKvdt };

inline uint32_t tag_value(const char* tag) {
  uint32_t v;
  std::memcpy(&v, tag, 4);
  return v;
}

inline std::string printable_tag(uint32_t v) {
  char c[4];
  std::memcpy(c, &v, 4);
  std::string s;
  for (char ch : c) s += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
  return s;
}

// Section framing: tag, reserved 0, payload length, payload, XXH64 of the payload seeded with the tag.
class Writer {
 public:
  template <typename T>
  void put(T v) {
    put_bytes(&v, sizeof v);
  }
  void put_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  // Frames `payload` as one section.
  void section(const char* tag, std::span<const uint8_t> payload) {
    put<uint32_t>(tag_value(tag));
    put<uint32_t>(0);
    put<uint64_t>(payload.size());
    put_bytes(payload.data(), payload.size());
    put<uint64_t>(XXH64(payload.data(), payload.size(), tag_value(tag)));
  }
  std::vector<uint8_t>& bytes() { return out_; }

 private:
  std::vector<uint8_t> out_;
};

// A file read in pieces: the whole file for a load, only the first sections for an index.
using Fetch = std::function<std::span<const uint8_t>(uint64_t offset, uint64_t n)>;

// Where a run of the logical sequence's rows is: `count` rows from row `first` of the KVDT or ROWS
// section at `section`.
struct Extent {
  uint64_t section;
  uint32_t first, count;
};

struct Parsed {
  SessionInfo info;
  std::span<const uint8_t> kv;    // the logical sequence's rows, session layout (empty unless read)
  std::vector<uint8_t> gathered;  // kv's bytes where an update's rows came from several sections
  std::vector<Extent> extents;    // the rows' places in the file
  uint64_t end = 0;               // the end of the last whole update (of the base without one)
  uint64_t base_kv_at = 0;        // the base's KVDT section
  uint32_t version = 0;
};

// Whether `head` (a file's first bytes, any number) is how a session file begins.
inline bool begins_like_a_session(const void* head, size_t n) { return std::memcmp(head, kMagic, std::min(n, sizeof kMagic)) == 0; }

// Parses and checks a whole file (version 1 to 3; with_kv false: what an index needs, HEAD and
// TOKS of the state the file holds). Errors name the file, the section and the offset.
Parsed parse(const std::string& path, uint64_t file_size, const Fetch& fetch, bool with_kv);

// HEAD's payload for `info`; HEAD, TOKS, CONV and SAMP of `info` as the base and every update carry them.
std::vector<uint8_t> encode_head(const SessionInfo& info);
void put_state(Writer& w, const SessionInfo& info);

}  // namespace vkllm::session_codec
