// GGUF reader: bounds-checked parsing of the header described in gguf.h.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <utility>

#include "gguf.h"

namespace gguf {

namespace {

constexpr uint32_t k_max_depth = 8;  // nested arrays deeper than this are refused

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

// A cursor over the file's bytes that checks every read.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> b, const std::string& path) : b_(b), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return b_.size() - pos_; }

  [[noreturn]] void fail(uint64_t at, const std::string& what) const {
    throw Error(path_ + ": offset " + hex(at) + ": " + what);
  }

  template <typename T>
  T read(const char* what) {
    if (left() < sizeof(T))
      fail(pos_, std::string("file ends inside ") + what + " (" + std::to_string(sizeof(T)) +
                     " bytes needed, " + std::to_string(left()) + " left)");
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t at = pos_;
    const uint64_t n = read<uint64_t>(what);
    if (n > left())
      fail(at, std::string(what) + " has length " + std::to_string(n) + ", but only " +
                   std::to_string(left()) + " bytes remain in the file");
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }

  const uint8_t* take(uint64_t n, const char* what) {
    if (n > left())
      fail(pos_, std::string("file ends inside ") + what + " (" + std::to_string(n) +
                     " bytes needed, " + std::to_string(left()) + " left)");
    const uint8_t* p = b_.data() + pos_;
    pos_ += n;
    return p;
  }

 private:
  std::span<const uint8_t> b_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(ValueType::F64); }

Value read_value(Cursor& c, ValueType type, const std::string& key, uint32_t depth);

Array read_array(Cursor& c, const std::string& key, uint32_t depth) {
  const uint64_t at = c.pos();
  if (depth >= k_max_depth) c.fail(at, "key '" + key + "': arrays nested deeper than " + std::to_string(k_max_depth));
  Array a;
  const uint32_t et = c.read<uint32_t>("array element type");
  if (!valid_value_type(et))
    c.fail(at, "key '" + key + "': array element type " + std::to_string(et) + " is not a GGUF value type (0..12)");
  a.elem_type = static_cast<ValueType>(et);
  const uint64_t count_at = c.pos();
  a.count = c.read<uint64_t>("array length");
  // Lower bound on bytes per element: fixed size, or 8 for a string length / 12 for an array head.
  const size_t fixed = value_type_size(a.elem_type);
  const uint64_t min_elem = fixed ? fixed : (a.elem_type == ValueType::STRING ? 8 : 12);
  if (a.count > c.left() / min_elem)
    c.fail(count_at, "key '" + key + "': array of " + std::to_string(a.count) + " " +
                         value_type_name(a.elem_type) + " elements cannot fit in the " +
                         std::to_string(c.left()) + " bytes left");
  if (fixed) {
    const uint8_t* p = c.take(a.count * fixed, "array data");
    a.raw.assign(p, p + a.count * fixed);
    if (a.elem_type == ValueType::BOOL)
      for (uint64_t i = 0; i < a.count; ++i)
        if (a.raw[i] > 1) c.fail(c.pos() - a.count + i, "key '" + key + "': bool element " + std::to_string(i) + " is " + std::to_string(a.raw[i]) + ", expected 0 or 1");
  } else if (a.elem_type == ValueType::STRING) {
    a.strings.reserve(a.count);
    for (uint64_t i = 0; i < a.count; ++i) a.strings.push_back(c.read_string("array string"));
  } else {
    a.arrays.reserve(a.count);
    for (uint64_t i = 0; i < a.count; ++i) a.arrays.push_back(read_value(c, ValueType::ARRAY, key, depth + 1));
  }
  return a;
}

Value read_value(Cursor& c, ValueType type, const std::string& key, uint32_t depth) {
  Value v;
  v.type = type;
  switch (type) {
    case ValueType::U8: v.data = uint64_t{c.read<uint8_t>("u8 value")}; break;
    case ValueType::I8: v.data = int64_t{c.read<int8_t>("i8 value")}; break;
    case ValueType::U16: v.data = uint64_t{c.read<uint16_t>("u16 value")}; break;
    case ValueType::I16: v.data = int64_t{c.read<int16_t>("i16 value")}; break;
    case ValueType::U32: v.data = uint64_t{c.read<uint32_t>("u32 value")}; break;
    case ValueType::I32: v.data = int64_t{c.read<int32_t>("i32 value")}; break;
    case ValueType::U64: v.data = c.read<uint64_t>("u64 value"); break;
    case ValueType::I64: v.data = c.read<int64_t>("i64 value"); break;
    case ValueType::F32: v.data = double{c.read<float>("f32 value")}; break;
    case ValueType::F64: v.data = c.read<double>("f64 value"); break;
    case ValueType::BOOL: {
      const uint64_t at = c.pos();
      const uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.fail(at, "key '" + key + "': bool value is " + std::to_string(b) + ", expected 0 or 1");
      v.data = uint64_t{b};
      break;
    }
    case ValueType::STRING: v.data = c.read_string("string value"); break;
    case ValueType::ARRAY: v.data = read_array(c, key, depth); break;
  }
  return v;
}

}  // namespace

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::U8: return "u8";
    case ValueType::I8: return "i8";
    case ValueType::U16: return "u16";
    case ValueType::I16: return "i16";
    case ValueType::U32: return "u32";
    case ValueType::I32: return "i32";
    case ValueType::F32: return "f32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::U64: return "u64";
    case ValueType::I64: return "i64";
    case ValueType::F64: return "f64";
  }
  return "?";
}

size_t value_type_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: case ValueType::ARRAY: return 0;
  }
  return 0;
}

int64_t Array::int_at(size_t i) const {
  const uint8_t* p = raw.data() + i * value_type_size(elem_type);
  auto get = [p]<typename T>(T) { T v; std::memcpy(&v, p, sizeof v); return v; };
  switch (elem_type) {
    case ValueType::U8: case ValueType::BOOL: return get(uint8_t{});
    case ValueType::I8: return get(int8_t{});
    case ValueType::U16: return get(uint16_t{});
    case ValueType::I16: return get(int16_t{});
    case ValueType::U32: return get(uint32_t{});
    case ValueType::I32: return get(int32_t{});
    case ValueType::U64: return static_cast<int64_t>(get(uint64_t{}));
    case ValueType::I64: return get(int64_t{});
    case ValueType::F32: return static_cast<int64_t>(get(float{}));
    case ValueType::F64: return static_cast<int64_t>(get(double{}));
    default: throw Error(std::string("array of ") + value_type_name(elem_type) + " has no numeric elements");
  }
}

double Array::float_at(size_t i) const {
  const uint8_t* p = raw.data() + i * value_type_size(elem_type);
  if (elem_type == ValueType::F32) { float v; std::memcpy(&v, p, 4); return v; }
  if (elem_type == ValueType::F64) { double v; std::memcpy(&v, p, 8); return v; }
  return static_cast<double>(int_at(i));
}

bool Array::operator==(const Array& o) const {
  return elem_type == o.elem_type && count == o.count && raw == o.raw && strings == o.strings && arrays == o.arrays;
}

Value Value::strings(std::vector<std::string> v) {
  Array a;
  a.elem_type = ValueType::STRING;
  a.count = v.size();
  a.strings = std::move(v);
  return {ValueType::ARRAY, std::move(a)};
}

Value Value::f32s(std::span<const float> v) {
  Array a;
  a.elem_type = ValueType::F32;
  a.count = v.size();
  a.raw.resize(v.size_bytes());
  if (!v.empty()) std::memcpy(a.raw.data(), v.data(), v.size_bytes());
  return {ValueType::ARRAY, std::move(a)};
}

Value Value::i32s(std::span<const int32_t> v) {
  Array a;
  a.elem_type = ValueType::I32;
  a.count = v.size();
  a.raw.resize(v.size_bytes());
  if (!v.empty()) std::memcpy(a.raw.data(), v.data(), v.size_bytes());
  return {ValueType::ARRAY, std::move(a)};
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (uint32_t i = 0; i < n_dims; ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "]";
}

File File::open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO waits for a writer; the fstat below refuses it at once instead.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  File f;
  f.path_ = path;
  if (st.st_size > 0) {
    void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw Error(path + ": cannot map " + std::to_string(st.st_size) + " bytes: " + std::strerror(e));
    }
    f.map_ = m;
    f.map_size_ = static_cast<size_t>(st.st_size);
    f.bytes_ = {static_cast<const uint8_t*>(m), f.map_size_};
  }
  ::close(fd);
  f.parse_all();
  return f;
}

File File::parse(std::span<const uint8_t> bytes, const std::string& name) {
  File f;
  f.path_ = name;
  f.bytes_ = bytes;
  f.parse_all();
  return f;
}

File::File(File&& o) noexcept { *this = std::move(o); }

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (map_) munmap(map_, map_size_);
    path_ = std::move(o.path_);
    bytes_ = o.bytes_;
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    kv_ = std::move(o.kv_);
    kv_index_ = std::move(o.kv_index_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

File::~File() {
  if (map_) munmap(map_, map_size_);
}

void File::parse_all() {
  Cursor c(bytes_, path_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != 0x46554747u)  // "GGUF" read little-endian
    c.fail(0, "not a GGUF file (magic is " + hex(magic) + ", expected 0x46554747 \"GGUF\")");
  const uint32_t version = c.read<uint32_t>("version");
  if (version == 0x03000000u || version == 0x02000000u)
    c.fail(4, "GGUF version field is " + hex(version) + ": a big-endian GGUF file, which vkllm cannot read");
  if (version == 1) c.fail(4, "GGUF version 1 is not supported (only versions 2 and 3)");
  if (version < 2 || version > 3)
    c.fail(4, "GGUF version " + std::to_string(version) + " is not supported (only versions 2 and 3)");
  version_ = version;

  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  if (n_tensors > bytes_.size() / 24)
    c.fail(8, "tensor count " + std::to_string(n_tensors) + " cannot fit in a file of " + std::to_string(bytes_.size()) + " bytes");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  if (n_kv > bytes_.size() / 12)
    c.fail(16, "metadata count " + std::to_string(n_kv) + " cannot fit in a file of " + std::to_string(bytes_.size()) + " bytes");

  kv_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t at = c.pos();
    std::string key = c.read_string("metadata key");
    if (key.empty()) c.fail(at, "metadata key " + std::to_string(i) + " is empty");
    if (kv_index_.count(key)) c.fail(at, "duplicate metadata key '" + key + "'");
    const uint64_t type_at = c.pos();
    const uint32_t type = c.read<uint32_t>("metadata value type");
    if (!valid_value_type(type))
      c.fail(type_at, "key '" + key + "': value type " + std::to_string(type) + " is not a GGUF value type (0..12)");
    Value v = read_value(c, static_cast<ValueType>(type), key, 0);
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = find("general.alignment")) {
    if (a->type != ValueType::U32) key_type_error("general.alignment", *a, "u32");
    const uint64_t al = std::get<uint64_t>(a->data);
    if (al == 0 || (al & (al - 1)) != 0 || al > (1u << 20))
      throw Error(path_ + ": key 'general.alignment' is " + std::to_string(al) + ", expected a power of two ≤ 1 MiB");
    alignment_ = static_cast<uint32_t>(al);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t at = c.pos();
    TensorInfo t;
    t.name = c.read_string("tensor name");
    if (t.name.empty()) c.fail(at, "tensor " + std::to_string(i) + " has an empty name");
    if (tensor_index_.count(t.name)) c.fail(at, "duplicate tensor name '" + t.name + "'");
    const std::string who = "tensor '" + t.name + "'";
    const uint64_t dims_at = c.pos();
    t.n_dims = c.read<uint32_t>("tensor dimension count");
    if (t.n_dims < 1 || t.n_dims > 4)
      c.fail(dims_at, who + ": " + std::to_string(t.n_dims) + " dimensions, expected 1 to 4");
    t.n_elements = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      t.ne[d] = c.read<uint64_t>("tensor dimension");
      if (t.ne[d] > INT64_MAX) overflow = true;
      else if (t.ne[d] != 0 && t.n_elements > static_cast<uint64_t>(INT64_MAX) / t.ne[d]) overflow = true;
      else t.n_elements *= t.ne[d];
    }
    if (overflow) c.fail(dims_at, who + ": dimensions " + t.shape_string() + " overflow 63 bits of elements");
    const uint64_t type_at = c.pos();
    const uint32_t type = c.read<uint32_t>("tensor type");
    const auto info = type_info(type);
    if (!info) c.fail(type_at, who + ": type " + std::to_string(type) + " is not a known ggml type");
    if (info->block_bytes == 0)
      c.fail(type_at, who + ": type " + info->name + " was retired by ggml and has no data layout");
    t.type = info->type;
    if (t.ne[0] % info->block_size != 0)
      c.fail(dims_at, who + ": row length " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                          info->name + " block size " + std::to_string(info->block_size));
    t.n_bytes = t.n_elements / info->block_size * info->block_bytes;  // ≤ 2^63/1 * 8: checked below
    if (t.n_elements / info->block_size > UINT64_MAX / info->block_bytes)
      c.fail(dims_at, who + ": byte size overflows 64 bits");
    const uint64_t off_at = c.pos();
    t.offset = c.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0)
      c.fail(off_at, who + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(alignment_));
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment (it may be empty).
  const uint64_t header_end = c.pos();
  data_offset_ = (header_end + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_offset_ > bytes_.size())
    throw Error(path_ + ": offset " + hex(header_end) + ": data section would start at " + std::to_string(data_offset_) + ", past the end of the " + std::to_string(bytes_.size()) + "-byte file");
  const uint64_t data_size = data_offset_ <= bytes_.size() ? bytes_.size() - data_offset_ : 0;

  // Bounds and overlap: sort by offset and check neighbours.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors_[a].offset < tensors_[b].offset; });
  uint64_t prev_end = 0;
  const TensorInfo* prev = nullptr;
  for (size_t idx : order) {
    TensorInfo& t = tensors_[idx];
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      throw Error(path_ + ": tensor '" + t.name + "': data at offset " + std::to_string(data_offset_) + " + " + std::to_string(t.offset) +
                  " (+ " + std::to_string(t.n_bytes) + " bytes) runs past the end of the " + std::to_string(bytes_.size()) + "-byte file");
    if (prev && t.offset < prev_end && t.n_bytes > 0)
      throw Error(path_ + ": tensor '" + t.name + "' (data offset " + std::to_string(t.offset) + ") overlaps tensor '" +
                  prev->name + "' (" + std::to_string(prev->offset) + " + " + std::to_string(prev->n_bytes) + " bytes)");
    t.data = bytes_.data() + data_offset_ + t.offset;
    if (t.n_bytes > 0 && t.offset + t.n_bytes >= prev_end) {
      prev_end = t.offset + t.n_bytes;
      prev = &t;
    }
  }
}

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void File::key_type_error(std::string_view key, const Value& v, const char* expected) const {
  throw Error(path_ + ": key '" + std::string(key) + "' is " + (v.type == ValueType::ARRAY ? "an " : "a ") +
              value_type_name(v.type) + ", expected " + expected);
}

namespace {
const Value& require(const File& f, std::string_view key) {
  const Value* v = f.find(key);
  if (!v) throw Error(f.path() + ": key '" + std::string(key) + "' is missing");
  return *v;
}
}  // namespace

uint64_t File::get_u64(std::string_view key) const {
  const Value& v = require(*this, key);
  if (auto* u = std::get_if<uint64_t>(&v.data); u && v.type != ValueType::BOOL) return *u;
  if (auto* i = std::get_if<int64_t>(&v.data)) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
    throw Error(path_ + ": key '" + std::string(key) + "' is " + std::to_string(*i) + ", expected a non-negative number");
  }
  key_type_error(key, v, "an unsigned integer");
}

uint32_t File::get_u32(std::string_view key) const {
  const Value& v = require(*this, key);
  if (v.type == ValueType::BOOL || std::holds_alternative<double>(v.data) || std::holds_alternative<std::string>(v.data) ||
      std::holds_alternative<Array>(v.data))
    key_type_error(key, v, "u32");
  const uint64_t u = get_u64(key);
  if (u > UINT32_MAX) throw Error(path_ + ": key '" + std::string(key) + "' is " + std::to_string(u) + ", expected a u32");
  return static_cast<uint32_t>(u);
}

int64_t File::get_i64(std::string_view key) const {
  const Value& v = require(*this, key);
  if (auto* i = std::get_if<int64_t>(&v.data)) return *i;
  if (auto* u = std::get_if<uint64_t>(&v.data); u && v.type != ValueType::BOOL) {
    if (*u <= static_cast<uint64_t>(INT64_MAX)) return static_cast<int64_t>(*u);
    throw Error(path_ + ": key '" + std::string(key) + "' is " + std::to_string(*u) + ", out of i64 range");
  }
  key_type_error(key, v, "an integer");
}

float File::get_f32(std::string_view key) const {
  const Value& v = require(*this, key);
  if (auto* d = std::get_if<double>(&v.data)) return static_cast<float>(*d);
  key_type_error(key, v, "f32");
}

bool File::get_bool(std::string_view key) const {
  const Value& v = require(*this, key);
  if (v.type != ValueType::BOOL) key_type_error(key, v, "bool");
  return std::get<uint64_t>(v.data) != 0;
}

const std::string& File::get_string(std::string_view key) const {
  const Value& v = require(*this, key);
  if (auto* s = std::get_if<std::string>(&v.data)) return *s;
  key_type_error(key, v, "string");
}

const Array& File::get_array(std::string_view key) const {
  const Value& v = require(*this, key);
  if (auto* a = std::get_if<Array>(&v.data)) return *a;
  key_type_error(key, v, "array");
}

uint32_t File::get_u32_or(std::string_view key, uint32_t def) const { return find(key) ? get_u32(key) : def; }
float File::get_f32_or(std::string_view key, float def) const { return find(key) ? get_f32(key) : def; }
bool File::get_bool_or(std::string_view key, bool def) const { return find(key) ? get_bool(key) : def; }
std::string File::get_string_or(std::string_view key, std::string def) const {
  return find(key) ? get_string(key) : std::move(def);
}

}  // namespace gguf
