// Session files: fully validated reading of every version (format in session_file.h).
#include <algorithm>
#include <map>
#include <optional>

#include "base/commas.h"
#include "base/utf8.h"
#include "store/session_codec.h"

namespace vkllm::session_codec {
namespace {

// Bounds-checked little-endian reads of one section's payload; errors name the file, the
// section and the absolute offset.
class PayloadReader {
 public:
  PayloadReader(const std::string& path, const char* tag, uint64_t base, std::span<const uint8_t> p)
      : path_(path), tag_(tag), base_(base), p_(p) {}
  template <typename T>
  T get(const char* what) {
    if (p_.size() - pos_ < sizeof(T)) fail(std::string("truncated before ") + what);
    T v;
    std::memcpy(&v, p_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }
  std::span<const uint8_t> get_bytes(uint64_t n, const char* what) {
    if (p_.size() - pos_ < n) fail(std::string("truncated in ") + what);
    auto s = p_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  void expect_end() {
    if (pos_ != p_.size()) fail(std::to_string(p_.size() - pos_) + " unexpected bytes at the end of the section");
  }
  uint64_t offset() const { return base_ + pos_; }
  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(path_ + ": section '" + tag_ + "' at offset " + std::to_string(base_ + pos_) + ": " + msg);
  }

 private:
  const std::string& path_;
  const char* tag_;
  uint64_t base_;
  std::span<const uint8_t> p_;
  uint64_t pos_ = 0;
};

// A section's frame: tag and payload length at `at`.
struct Frame {
  uint32_t tag = 0;
  uint64_t len = 0;
};

// Reads the frame at `at`; nullopt when the file ends inside the section (header, payload or
// checksum), with `cut` saying why. A reserved field other than 0 is damage.
std::optional<Frame> read_frame(const std::string& path, uint64_t file_size, const Fetch& fetch, uint64_t at, std::string& cut) {
  if (file_size - at < 16) {
    cut = "needs a 16-byte header, only " + std::to_string(file_size - at) + " bytes left";
    return std::nullopt;
  }
  auto hdr = fetch(at, 16);
  Frame f;
  uint32_t reserved;
  std::memcpy(&f.tag, hdr.data(), 4);
  std::memcpy(&reserved, hdr.data() + 4, 4);
  std::memcpy(&f.len, hdr.data() + 8, 8);
  if (reserved != 0)
    throw Error(path + ": section '" + printable_tag(f.tag) + "' at offset " + std::to_string(at + 4) + ": reserved field is not 0");
  const uint64_t left = file_size - at - 16;
  if (f.len > left || left - f.len < 8) {
    cut = "declares " + with_commas(f.len) + " bytes of payload and a checksum, only " + with_commas(left) + " bytes left";
    return std::nullopt;
  }
  return f;
}

// The payload of the section at `at`, its checksum checked.
std::span<const uint8_t> checked_payload(const std::string& path, const Fetch& fetch, uint64_t at, const Frame& f) {
  auto payload = fetch(at + 16, f.len);
  auto sum = fetch(at + 16 + f.len, 8);
  uint64_t stored;
  std::memcpy(&stored, sum.data(), 8);
  if (XXH64(payload.data(), payload.size(), f.tag) != stored)
    throw Error(path + ": section '" + printable_tag(f.tag) + "' at offset " + std::to_string(at) + " (" + with_commas(f.len) +
                " bytes): checksum mismatch (the file is corrupted)");
  return payload;
}

// HEAD's payload into `info` (its tokens sized to n_used).
void parse_head(PayloadReader& r, uint32_t version, uint64_t file_size, SessionInfo& info) {
  info.model.hash = r.get<uint64_t>("the model fingerprint");
  const auto name_len = r.get<uint32_t>("the model name length");
  if (name_len > kMaxModelName) r.fail("model name length " + std::to_string(name_len) + " exceeds " + std::to_string(kMaxModelName));
  auto name = r.get_bytes(name_len, "the model name");
  // Only shown (in errors, `vkllm cache list`): control characters (C0, DEL, C1) and
  // malformed UTF-8 of a damaged or crafted file do not reach a terminal.
  const std::string_view raw(reinterpret_cast<const char*>(name.data()), name.size());
  info.model.name.clear();
  for (size_t at = 0; at < raw.size();) {
    const uint32_t cp = utf8::next(raw, at);
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) info.model.name += '?';
    else utf8::append(info.model.name, cp);
  }
  info.n_layer = r.get<uint32_t>("n_layer");
  info.n_head_kv = r.get<uint32_t>("n_head_kv");
  info.head_dim = r.get<uint32_t>("head_dim");
  const auto tk = r.get<uint32_t>("type_k"), tv = r.get<uint32_t>("type_v");
  if (tk > 2 || tv > 2) r.fail("cache type " + std::to_string(std::max(tk, tv)) + " is not f16 (0), q8_0 (1) or q4_0 (2)");
  info.type_k = static_cast<CacheType>(tk);
  info.type_v = static_cast<CacheType>(tv);
  info.row_bytes_k = r.get<uint64_t>("row_bytes_k");
  info.row_bytes_v = r.get<uint64_t>("row_bytes_v");
  info.capacity = r.get<uint32_t>("capacity");
  info.n_keep = r.get<uint32_t>("n_keep");
  const auto n_used = r.get<uint32_t>("n_used");
  info.n_evicted = r.get<uint64_t>("n_evicted");
  if (version >= 2) {
    info.shifts.split = r.get<uint32_t>("rot_split");
    info.shifts.first = r.get<uint32_t>("rot_first");
    info.shifts.rest = r.get<uint32_t>("rot_rest");
    info.shifts.next = r.get<uint32_t>("rot_next");
    info.has_shifts = true;
  }
  r.expect_end();
  if (info.n_layer == 0 || info.n_layer > 4096 || info.row_bytes_k == 0 || info.row_bytes_v == 0 || info.row_bytes_k > (1u << 24) ||
      info.row_bytes_v > (1u << 24))
    r.fail("implausible geometry: " + std::to_string(info.n_layer) + " layers, rows of " + std::to_string(info.row_bytes_k) + " / " +
           std::to_string(info.row_bytes_v) + " bytes");
  // Every token needs 4 bytes of TOKS: bounding n_used by the file size keeps the
  // allocation below a small multiple of the file.
  if (uint64_t{n_used} * 4 > file_size) r.fail(with_commas(n_used) + " tokens cannot fit in a " + with_commas(file_size) + "-byte file");
  info.tokens.resize(n_used);
}

// TOKS's payload into `info.tokens` (sized by HEAD).
void parse_tokens(const std::string& path, uint64_t at, const Frame& f, std::span<const uint8_t> payload, SessionInfo& info) {
  if (f.len != info.tokens.size() * 4)
    throw Error(path + ": section 'TOKS' at offset " + std::to_string(at + 16) + ": " + with_commas(f.len) + " bytes, expected " +
                with_commas(info.tokens.size() * 4) + " for " + with_commas(info.tokens.size()) + " tokens");
  std::memcpy(info.tokens.data(), payload.data(), f.len);
  for (size_t i = 0; i < info.tokens.size(); ++i)
    if (info.tokens[i] < 0)
      throw Error(path + ": section 'TOKS' at offset " + std::to_string(at + 16 + 4 * i) + ": token " + std::to_string(i) + " = " +
                  std::to_string(info.tokens[i]) + " is negative");
}

// KV bytes of `n` rows in every layer, or nullopt when the product overflows.
std::optional<uint64_t> rows_bytes(const SessionInfo& info, uint64_t n) {
  uint64_t want = 0;
  if (__builtin_mul_overflow(uint64_t{info.n_layer} * n, info.row_bytes_k + info.row_bytes_v, &want)) return std::nullopt;
  return want;
}

// The base: the version-2 layout, whose KVDT holds the rows of its own tokens.
void parse_base(const std::string& path, uint64_t file_size, const Fetch& fetch, bool with_kv, Parsed& out) {
  SessionInfo& info = out.info;
  uint64_t at = kPreambleBytes;
  // An index (no KV) of a version-2 file stops after TOKS; a later version's file is read to its last update.
  const int last = with_kv || out.version >= 3 ? kKvdt : kToks;
  for (int s = 0; s <= last; ++s) {
    const char* tag = kTags[s];
    std::string cut;
    const std::optional<Frame> f = read_frame(path, file_size, fetch, at, cut);
    if (!f) throw Error(path + ": truncated: section '" + tag + "' at offset " + std::to_string(at) + " " + cut);
    if (f->tag != tag_value(tag))
      throw Error(path + ": offset " + std::to_string(at) + ": expected section '" + tag + "', found '" + printable_tag(f->tag) +
                  "' (the file is corrupted)");
    if (s == kKvdt) {
      // Checked before it is read (the rest is small): a length the header does not account for
      // would otherwise be read whole first. The factors are bounded; their product is checked.
      const std::optional<uint64_t> want = rows_bytes(info, info.tokens.size());
      if (!want || f->len != *want)
        throw Error(path + ": section 'KVDT' at offset " + std::to_string(at + 16) + ": " + with_commas(f->len) + " bytes of KV, expected " +
                    with_commas(want.value_or(0)) + " (" + std::to_string(info.n_layer) + " layers × " + with_commas(info.tokens.size()) +
                    " tokens × " + std::to_string(info.row_bytes_k + info.row_bytes_v) + " bytes)");
      if (with_kv) out.kv = checked_payload(path, fetch, at, *f);
      out.base_kv_at = at;
      out.extents.push_back({at, 0, static_cast<uint32_t>(info.tokens.size())});
      at += kFrameBytes + f->len;
      break;
    }
    const std::span<const uint8_t> payload = checked_payload(path, fetch, at, *f);
    PayloadReader r(path, tag, at + 16, payload);
    switch (s) {
      case kHead: parse_head(r, out.version, file_size, info); break;
      case kToks: parse_tokens(path, at, *f, payload, info); break;
      case kConv: info.conversation.assign(payload.begin(), payload.end()); break;
      case kSamp: info.sampler.assign(payload.begin(), payload.end()); break;
    }
    at += kFrameBytes + f->len;
  }
  out.end = at;
}

// The updates after the base (version 3): the last whole one replaces the base's state.
void parse_updates(const std::string& path, uint64_t file_size, const Fetch& fetch, bool with_kv, Parsed& out) {
  std::map<uint64_t, uint32_t> rows_sections;  // offset → rows, of the KVDT and the ROWS sections before
  const uint32_t base_rows = out.extents.front().count;
  rows_sections[out.base_kv_at] = base_rows;
  const SessionInfo base = out.info;
  uint64_t at = out.end;
  for (;;) {
    // One update: UPDT says how many bytes it has, so a file that ends inside it is a save cut
    // short (ignored), and any other damage is refused.
    if (at == file_size) break;
    const uint64_t left = file_size - at;
    // Zeros to the end: an append the file's size took before its bytes (a power loss on some
    // file systems), a save cut short too.
    const auto all_zero = [](std::span<const uint8_t> b) { return std::all_of(b.begin(), b.end(), [](uint8_t x) { return x == 0; }); };
    const auto present = fetch(at, std::min<uint64_t>(left, 16));  // the UPDT header, or as much of it as there is
    if (all_zero(present)) {
      bool zeros = true;
      for (uint64_t pos = at + 16; zeros && pos < file_size; pos += 1 << 16)
        zeros = all_zero(fetch(pos, std::min<uint64_t>(file_size - pos, 1 << 16)));
      if (zeros) break;
    }
    std::vector<uint8_t> frame(16);
    const uint32_t updt = tag_value("UPDT");
    const uint64_t eight = 8;
    std::memcpy(frame.data(), &updt, 4);
    std::memcpy(frame.data() + 8, &eight, 8);
    if (std::memcmp(present.data(), frame.data(), present.size()) != 0) {
      uint32_t found = 0;
      std::memcpy(&found, present.data(), std::min<size_t>(present.size(), 4));
      throw Error(path + ": offset " + std::to_string(at) + ": expected section 'UPDT', found '" + printable_tag(found) +
                  "' (the file is corrupted)");
    }
    if (left < kFrameBytes + 8) break;
    uint64_t total;
    std::memcpy(&total, checked_payload(path, fetch, at, Frame{updt, 8}).data(), 8);
    if (total < kFrameBytes + 8)
      throw Error(path + ": section 'UPDT' at offset " + std::to_string(at) + ": an update of " + with_commas(total) + " bytes (the file is corrupted)");
    if (total > left) break;
    const uint64_t update_end = at + total;
    at += kFrameBytes + 8;
    // Within an update every section is whole.
    const auto next_frame = [&](uint64_t pos) {
      std::string cut;
      const std::optional<Frame> f = read_frame(path, update_end, fetch, pos, cut);
      if (!f) throw Error(path + ": section at offset " + std::to_string(pos) + " " + cut + " in its update (the file is corrupted)");
      return f;
    };
    std::optional<Frame> f = next_frame(at);
    std::optional<std::pair<uint64_t, uint32_t>> new_rows;
    if (f->tag == tag_value("ROWS")) {
      if (f->len < 8) throw Error(path + ": section 'ROWS' at offset " + std::to_string(at) + ": " + with_commas(f->len) + " bytes, less than its 8-byte count");
      uint32_t n;
      std::memcpy(&n, fetch(at + 16, 4).data(), 4);
      const std::optional<uint64_t> want = rows_bytes(base, n);
      if (!want || f->len != 8 + *want)
        throw Error(path + ": section 'ROWS' at offset " + std::to_string(at + 16) + ": " + with_commas(f->len) + " bytes, expected " +
                    with_commas(8 + want.value_or(0)) + " for " + with_commas(n) + " rows");
      new_rows = {at, n};
      at += kFrameBytes + f->len;
      f = next_frame(at);
    }
    SessionInfo u;
    std::vector<Extent> extents;
    for (const char* tag : {"HEAD", "TOKS", "CONV", "SAMP", "LIST"}) {
      if (tag != std::string_view("HEAD")) f = next_frame(at);
      if (f->tag != tag_value(tag))
        throw Error(path + ": offset " + std::to_string(at) + ": expected section '" + tag + "', found '" + printable_tag(f->tag) +
                    "' (the file is corrupted)");
      const std::span<const uint8_t> payload = checked_payload(path, fetch, at, *f);
      PayloadReader r(path, tag, at + 16, payload);
      const std::string_view t(tag);
      if (t == "HEAD") {
        parse_head(r, out.version, file_size, u);
        if (u.model.hash != base.model.hash || u.n_layer != base.n_layer || u.n_head_kv != base.n_head_kv || u.head_dim != base.head_dim ||
            u.type_k != base.type_k || u.type_v != base.type_v || u.row_bytes_k != base.row_bytes_k || u.row_bytes_v != base.row_bytes_v)
          throw Error(path + ": section 'HEAD' at offset " + std::to_string(at) +
                      ": an update's model or cache geometry differs from the first HEAD's (the file is corrupted)");
      } else if (t == "TOKS") {
        parse_tokens(path, at, *f, payload, u);
      } else if (t == "CONV") {
        u.conversation.assign(payload.begin(), payload.end());
      } else if (t == "SAMP") {
        u.sampler.assign(payload.begin(), payload.end());
      } else {
        const auto n_extents = r.get<uint32_t>("the extent count");
        if (r.get<uint32_t>("a reserved field") != 0) r.fail("reserved field is not 0");
        uint64_t rows = 0;
        for (uint32_t e = 0; e < n_extents; ++e) {
          Extent x;
          x.section = r.get<uint64_t>("an extent's section");
          x.first = r.get<uint32_t>("an extent's first row");
          x.count = r.get<uint32_t>("an extent's rows");
          const auto in = x.section == (new_rows ? new_rows->first : ~0ull) ? std::optional<uint32_t>(new_rows->second)
                          : rows_sections.count(x.section)                 ? std::optional<uint32_t>(rows_sections[x.section])
                                                                           : std::nullopt;
          if (!in) r.fail("extent " + std::to_string(e) + " names offset " + std::to_string(x.section) + ", where no KVDT or ROWS section begins");
          if (x.first > *in || x.count > *in - x.first)
            r.fail("extent " + std::to_string(e) + " takes rows " + with_commas(x.first) + " to " + with_commas(uint64_t{x.first} + x.count) +
                   " of a section of " + with_commas(*in));
          rows += x.count;
          extents.push_back(x);
        }
        r.expect_end();
        if (rows != u.tokens.size()) r.fail(with_commas(rows) + " rows for " + with_commas(u.tokens.size()) + " tokens");
      }
      at += kFrameBytes + f->len;
    }
    if (at != update_end)
      throw Error(path + ": offset " + std::to_string(at) + ": " + with_commas(update_end - at) +
                  " bytes after the update's last section (the file is corrupted)");
    if (new_rows) rows_sections[new_rows->first] = new_rows->second;
    u.file_bytes = base.file_bytes;
    out.info = std::move(u);
    out.extents = std::move(extents);
    out.end = at;
  }
  out.info.unfinished_bytes = file_size - out.end;
  if (!with_kv || (out.extents.size() == 1 && out.extents[0].section == out.base_kv_at && out.extents[0].count == base_rows)) return;
  // The rows: each section the extents name, its checksum checked, then the runs in order.
  std::map<uint64_t, std::span<const uint8_t>> payloads;  // rows of each section (a ROWS's after its count)
  payloads[out.base_kv_at] = out.kv;
  for (const Extent& x : out.extents) {
    if (payloads.count(x.section)) continue;
    std::string unused;
    const std::optional<Frame> f = read_frame(path, file_size, fetch, x.section, unused);
    VKLLM_CHECK(f.has_value(), "an extent's section was read whole before");
    payloads[x.section] = checked_payload(path, fetch, x.section, *f).subspan(8);
  }
  const SessionInfo& info = out.info;
  const uint64_t rk = info.row_bytes_k, rv = info.row_bytes_v, n = info.tokens.size();
  out.gathered.resize(*rows_bytes(info, n));
  uint64_t dst = 0;
  for (const Extent& x : out.extents) {
    const uint8_t* src = payloads[x.section].data();
    const uint64_t in = rows_sections[x.section];
    for (uint32_t l = 0; l < info.n_layer; ++l) {
      const uint8_t* layer_in = src + l * in * (rk + rv);
      uint8_t* layer_out = out.gathered.data() + l * n * (rk + rv);
      std::memcpy(layer_out + dst * rk, layer_in + uint64_t{x.first} * rk, x.count * rk);
      std::memcpy(layer_out + n * rk + dst * rv, layer_in + in * rk + uint64_t{x.first} * rv, x.count * rv);
    }
    dst += x.count;
  }
  out.kv = out.gathered;
}

}  // namespace

Parsed parse(const std::string& path, uint64_t file_size, const Fetch& fetch, bool with_kv) {
  Parsed out;
  SessionInfo& info = out.info;
  info.file_bytes = file_size;
  // A short file is "truncated" only if what it has begins like a session file.
  if (file_size > 0) {
    const auto head = fetch(0, std::min<uint64_t>(file_size, sizeof kMagic));
    if (!begins_like_a_session(head.data(), head.size()))
      throw Error(path + ": offset 0: not a vkllm session file (no 'VKLLMSES' magic)");
  }
  if (file_size < kPreambleBytes)
    throw Error(path + ": truncated: " + std::to_string(file_size) + " bytes, a session file starts with " +
                std::to_string(kPreambleBytes));
  auto pre = fetch(0, kPreambleBytes);
  uint32_t version, n_sections;
  std::memcpy(&version, pre.data() + 8, 4);
  std::memcpy(&n_sections, pre.data() + 12, 4);
  // A number no release will reach is damage, not a newer format (one flipped bit makes 16,386).
  if (version > kSessionVersion + 100)
    throw Error(path + ": offset 8: format version " + std::to_string(version) + " is no version of this format (the file is corrupted)");
  if (version > kSessionVersion)
    throw Error(path + ": offset 8: format version " + std::to_string(version) + " is newer than this vkllm reads (" +
                std::to_string(kSessionVersion) + "); update vkllm");
  if (version < kOldestSessionVersion)
    throw Error(path + ": offset 8: format version " + std::to_string(version) + " is not supported");
  const uint32_t sections = version >= 3 ? kSectionCount + 1 : kSectionCount;
  if (n_sections != sections)
    throw Error(path + ": offset 12: " + std::to_string(n_sections) + " sections, version " + std::to_string(version) + " has " +
                std::to_string(sections));
  out.version = version;
  parse_base(path, file_size, fetch, with_kv, out);
  if (version >= 3) {
    parse_updates(path, file_size, fetch, with_kv, out);
  } else if (with_kv && out.end != file_size) {
    throw Error(path + ": offset " + std::to_string(out.end) + ": " + with_commas(file_size - out.end) + " bytes after the last section");
  }
  return out;
}

}  // namespace vkllm::session_codec
