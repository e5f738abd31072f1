// The ggml tensor types a GGUF file can name: id, name, block size and bytes per block.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gguf {

// Values are the ggml_type ids stored in GGUF tensor infos (ggml.h).
enum class TensorType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q4_2 = 4, Q4_3 = 5, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q8_1 = 9, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, IQ2_XXS = 16,
  IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30, Q4_0_4_4 = 31,
  Q4_0_4_8 = 32, Q4_0_8_8 = 33, TQ1_0 = 34, TQ2_0 = 35, IQ4_NL_4_4 = 36, IQ4_NL_4_8 = 37,
  IQ4_NL_8_8 = 38, MXFP4 = 39,
};

struct TypeInfo {
  TensorType type;
  const char* name;       // as ggml prints it: "Q4_K", "BF16"
  uint32_t block_size;    // elements per block (1 for plain types)
  uint32_t block_bytes;   // bytes per block; 0 for ids ggml retired without a layout
};

// The row of the table for `id`, or nullopt for an id no ggml version defined.
std::optional<TypeInfo> type_info(uint32_t id);
// "Q4_K" for a known id, "type 9999" otherwise.
std::string type_name(uint32_t id);
inline std::string type_name(TensorType t) { return type_name(static_cast<uint32_t>(t)); }
// Parses a type name, case-insensitive ("q8_0" → Q8_0).
std::optional<TensorType> type_from_name(std::string_view name);
// Bytes of `n_elements` elements of `t`; n_elements must be a multiple of the block size.
uint64_t type_bytes(TensorType t, uint64_t n_elements);

}  // namespace gguf
