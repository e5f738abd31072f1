// GGUF writer: serialises metadata and tensors as GGUF v3 (layout in gguf.h).
#include <cstring>

#include "atomic_file.h"
#include "gguf.h"

namespace gguf {

namespace {

class Out {
 public:
  std::vector<uint8_t> bytes;

  template <typename T>
  void put(T v) {
    const size_t n = bytes.size();
    bytes.resize(n + sizeof(T));
    std::memcpy(bytes.data() + n, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
  }

  void put_value(const Value& v) {
    switch (v.type) {
      case ValueType::U8: put<uint8_t>(static_cast<uint8_t>(std::get<uint64_t>(v.data))); break;
      case ValueType::BOOL: put<uint8_t>(std::get<uint64_t>(v.data) ? 1 : 0); break;
      case ValueType::U16: put<uint16_t>(static_cast<uint16_t>(std::get<uint64_t>(v.data))); break;
      case ValueType::U32: put<uint32_t>(static_cast<uint32_t>(std::get<uint64_t>(v.data))); break;
      case ValueType::U64: put<uint64_t>(std::get<uint64_t>(v.data)); break;
      case ValueType::I8: put<int8_t>(static_cast<int8_t>(std::get<int64_t>(v.data))); break;
      case ValueType::I16: put<int16_t>(static_cast<int16_t>(std::get<int64_t>(v.data))); break;
      case ValueType::I32: put<int32_t>(static_cast<int32_t>(std::get<int64_t>(v.data))); break;
      case ValueType::I64: put<int64_t>(std::get<int64_t>(v.data)); break;
      case ValueType::F32: put<float>(static_cast<float>(std::get<double>(v.data))); break;
      case ValueType::F64: put<double>(std::get<double>(v.data)); break;
      case ValueType::STRING: put_string(std::get<std::string>(v.data)); break;
      case ValueType::ARRAY: {
        const Array& a = std::get<Array>(v.data);
        put<uint32_t>(static_cast<uint32_t>(a.elem_type));
        put<uint64_t>(a.count);
        if (a.elem_type == ValueType::STRING) {
          for (const std::string& s : a.strings) put_string(s);
        } else if (a.elem_type == ValueType::ARRAY) {
          for (const Value& e : a.arrays) put_value(e);
        } else {
          bytes.insert(bytes.end(), a.raw.begin(), a.raw.end());
        }
        break;
      }
    }
  }
};

}  // namespace

void Writer::set(std::string key, Value v) {
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(std::move(key), std::move(v));
}

void Writer::add_tensor(std::string name, TensorType type, std::vector<uint64_t> ne, std::span<const uint8_t> data) {
  if (ne.empty() || ne.size() > 4) throw Error("tensor '" + name + "': " + std::to_string(ne.size()) + " dimensions, expected 1 to 4");
  uint64_t n = 1;
  for (uint64_t d : ne) n *= d;
  const TypeInfo info = *type_info(static_cast<uint32_t>(type));
  if (ne[0] % info.block_size != 0)
    throw Error("tensor '" + name + "': row length " + std::to_string(ne[0]) + " is not a multiple of the " + info.name + " block size");
  const uint64_t want = type_bytes(type, n);
  if (data.size() != want)
    throw Error("tensor '" + name + "': " + std::to_string(data.size()) + " bytes given, expected " + std::to_string(want));
  tensors_.push_back({std::move(name), type, std::move(ne), std::vector<uint8_t>(data.begin(), data.end())});
}

std::vector<uint8_t> Writer::to_bytes() const {
  uint64_t alignment = 32;
  for (const auto& [k, v] : kv_)
    if (k == "general.alignment" && v.type == ValueType::U32) alignment = std::get<uint64_t>(v.data);

  Out o;
  o.put<uint32_t>(0x46554747u);
  o.put<uint32_t>(3);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [k, v] : kv_) {
    o.put_string(k);
    o.put<uint32_t>(static_cast<uint32_t>(v.type));
    o.put_value(v);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    o.put_string(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) o.put<uint64_t>(d);
    o.put<uint32_t>(static_cast<uint32_t>(t.type));
    o.put<uint64_t>(offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  o.pad_to(alignment);
  for (const Tensor& t : tensors_) {
    o.bytes.insert(o.bytes.end(), t.data.begin(), t.data.end());
    o.pad_to(alignment);
  }
  return o.bytes;
}

void Writer::write(const std::string& path) const { write_file_atomic(path, to_bytes()); }

}  // namespace gguf
