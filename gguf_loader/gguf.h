// GGUF reader and writer: the model file format of llama.cpp, versions 2 and 3, little-endian.
//
// ## The format, as this reader checks it
//
// All integers are little-endian. A `string` is { u64 length; u8 bytes[length] } (UTF-8, no NUL).
//
//   offset 0   u32 magic        "GGUF" as bytes (0x47 0x47 0x55 0x46). The same bytes read as a
//                               big-endian file's version field tell us it is big-endian: refused.
//   offset 4   u32 version      2 or 3 (1 used u32 counts and is refused; > 3 is unknown).
//   offset 8   u64 n_tensors    each tensor info takes ≥ 24 bytes, so n_tensors ≤ file size / 24.
//   offset 16  u64 n_kv         each key/value takes ≥ 12 bytes, so n_kv ≤ file size / 12.
//   then n_kv metadata pairs:   string key; u32 value_type; value
//        value_type: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool (one byte, 0 or 1),
//                    8 string, 9 array, 10 u64, 11 i64, 12 f64.
//        an array is { u32 elem_type; u64 count; count values } and may nest (arrays of arrays).
//        Keys are unique, non-empty.
//   then n_tensors tensor infos: string name; u32 n_dims (1..4); u64 ne[n_dims]; u32 type;
//        u64 offset. Names are unique. ne[0] is the fastest-varying (row) dimension; every
//        ne[i] ≥ 1 (0 is allowed: an empty tensor) and their product fits in 63 bits; ne[0] is a
//        multiple of the type's block size. offset is relative to the data section and a
//        multiple of the alignment.
//   then padding to `general.alignment` (u32 metadata, a power of two, default 32).
//   data section: the tensors' bytes, each at data_start + offset, nbytes = n_elements /
//        block_size * block_bytes, every tensor inside the file and no two overlapping.
//
// Every count, length and offset is checked against the file's size before it is used, so a
// hostile file cannot make the reader allocate more than a small multiple of its own size.
// Errors throw gguf::Error with the file, the byte offset and what was wrong.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gguf_types.h"

namespace gguf {

// Bad input: a corrupt, truncated or unsupported file, or a wrongly typed key.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8,
  ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);  // "u32", "string", "array", …
// Bytes of one element of a fixed-size type (0 for STRING and ARRAY).
size_t value_type_size(ValueType t);

struct Value;

// An array value. Fixed-size elements stay packed as little-endian bytes in `raw`; strings and
// nested arrays are unpacked.
struct Array {
  ValueType elem_type = ValueType::U8;
  uint64_t count = 0;
  std::vector<uint8_t> raw;           // count * value_type_size(elem_type) bytes
  std::vector<std::string> strings;   // elem_type == STRING
  std::vector<Value> arrays;          // elem_type == ARRAY

  // Element i of a numeric/bool array, converted.
  int64_t int_at(size_t i) const;
  double float_at(size_t i) const;
  bool operator==(const Array&) const;
};

struct Value {
  ValueType type = ValueType::U8;
  // U8..U64 and BOOL → uint64_t (BOOL is 0/1), I8..I64 → int64_t, F32/F64 → double.
  std::variant<uint64_t, int64_t, double, std::string, Array> data;

  static Value u32(uint32_t v) { return {ValueType::U32, uint64_t{v}}; }
  static Value u64(uint64_t v) { return {ValueType::U64, v}; }
  static Value i32(int32_t v) { return {ValueType::I32, int64_t{v}}; }
  static Value f32(float v) { return {ValueType::F32, double{v}}; }
  static Value boolean(bool v) { return {ValueType::BOOL, uint64_t{v}}; }
  static Value str(std::string v) { return {ValueType::STRING, std::move(v)}; }
  static Value strings(std::vector<std::string> v);
  static Value f32s(std::span<const float> v);
  static Value i32s(std::span<const int32_t> v);
  bool operator==(const Value&) const = default;
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  uint64_t ne[4] = {1, 1, 1, 1};  // ne[0] = elements per row
  TensorType type = TensorType::F32;
  uint64_t offset = 0;            // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (reader only)

  std::string shape_string() const;  // "[64, 512]"
};

// A GGUF file opened read-only and memory-mapped. Tensor data pointers stay valid while the
// File lives.
class File {
 public:
  // Parses and validates the whole header; throws Error naming path and offset.
  static File open(const std::string& path);
  // Parses from memory (tests and fuzzing); `bytes` must outlive the File.
  static File parse(std::span<const uint8_t> bytes, const std::string& name = "<memory>");

  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  ~File();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t file_size() const { return bytes_.size(); }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;

  // Typed accessors: throw Error("file: key 'k' is a string, expected u32") on a type mismatch
  // and Error("…: key 'k' is missing") when absent. Integer getters accept any integer type
  // whose value fits.
  uint32_t get_u32(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  int64_t get_i64(std::string_view key) const;
  float get_f32(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  const Array& get_array(std::string_view key) const;
  // Same, with a default when the key is absent (a present key of the wrong type still throws).
  uint32_t get_u32_or(std::string_view key, uint32_t def) const;
  float get_f32_or(std::string_view key, float def) const;
  bool get_bool_or(std::string_view key, bool def) const;
  std::string get_string_or(std::string_view key, std::string def) const;

 private:
  File() = default;
  void parse_all();
  [[noreturn]] void key_type_error(std::string_view key, const Value& v, const char* expected) const;

  std::string path_;
  std::span<const uint8_t> bytes_;
  void* map_ = nullptr;  // mmap base when opened from a path
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF v3 file: metadata in insertion order, tensors with their raw bytes.
class Writer {
 public:
  void set(std::string key, Value v);
  // `data` must hold exactly the tensor's n_bytes; it is copied.
  void add_tensor(std::string name, TensorType type, std::vector<uint64_t> ne, std::span<const uint8_t> data);
  std::vector<uint8_t> to_bytes() const;
  // Writes atomically (write_file_atomic in atomic_file.h).
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace gguf
