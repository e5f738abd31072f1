// The table of ggml tensor types (ids from ggml.h, block layouts from ggml-common.h).
#include "gguf_types.h"

#include <algorithm>
#include <cctype>
#include <iterator>

namespace gguf {
namespace {

using T = TensorType;
constexpr uint32_t QK_K = 256;

// clang-format off
constexpr TypeInfo k_types[] = {
  {T::F32,        "F32",        1,    4},
  {T::F16,        "F16",        1,    2},
  {T::Q4_0,       "Q4_0",       32,   2 + 16},
  {T::Q4_1,       "Q4_1",       32,   2 + 2 + 16},
  {T::Q4_2,       "Q4_2",       32,   0},  // retired by ggml
  {T::Q4_3,       "Q4_3",       32,   0},  // retired by ggml
  {T::Q5_0,       "Q5_0",       32,   2 + 4 + 16},
  {T::Q5_1,       "Q5_1",       32,   2 + 2 + 4 + 16},
  {T::Q8_0,       "Q8_0",       32,   2 + 32},
  {T::Q8_1,       "Q8_1",       32,   2 + 2 + 32},
  {T::Q2_K,       "Q2_K",       QK_K, QK_K / 16 + QK_K / 4 + 2 + 2},
  {T::Q3_K,       "Q3_K",       QK_K, QK_K / 8 + QK_K / 4 + 12 + 2},
  {T::Q4_K,       "Q4_K",       QK_K, 2 + 2 + 12 + QK_K / 2},
  {T::Q5_K,       "Q5_K",       QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2},
  {T::Q6_K,       "Q6_K",       QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2},
  {T::Q8_K,       "Q8_K",       QK_K, 4 + QK_K + QK_K / 16 * 2},
  {T::IQ2_XXS,    "IQ2_XXS",    QK_K, 2 + QK_K / 8 * 2},
  {T::IQ2_XS,     "IQ2_XS",     QK_K, 2 + QK_K / 8 * 2 + QK_K / 32},
  {T::IQ3_XXS,    "IQ3_XXS",    QK_K, 2 + 3 * QK_K / 8},
  {T::IQ1_S,      "IQ1_S",      QK_K, 2 + QK_K / 8 + QK_K / 16},
  {T::IQ4_NL,     "IQ4_NL",     32,   2 + 16},
  {T::IQ3_S,      "IQ3_S",      QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 8 + QK_K / 64},
  {T::IQ2_S,      "IQ2_S",      QK_K, 2 + QK_K / 4 + QK_K / 32 + QK_K / 32},
  {T::IQ4_XS,     "IQ4_XS",     QK_K, 2 + 2 + QK_K / 64 + QK_K / 2},
  {T::I8,         "I8",         1,    1},
  {T::I16,        "I16",        1,    2},
  {T::I32,        "I32",        1,    4},
  {T::I64,        "I64",        1,    8},
  {T::F64,        "F64",        1,    8},
  {T::IQ1_M,      "IQ1_M",      QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32},
  {T::BF16,       "BF16",       1,    2},
  {T::Q4_0_4_4,   "Q4_0_4_4",   32,   2 + 16},  // retired repacked layouts: same bytes as Q4_0
  {T::Q4_0_4_8,   "Q4_0_4_8",   32,   2 + 16},
  {T::Q4_0_8_8,   "Q4_0_8_8",   32,   2 + 16},
  {T::TQ1_0,      "TQ1_0",      QK_K, (QK_K - 4 * QK_K / 64) / 5 + QK_K / 64 + 2},
  {T::TQ2_0,      "TQ2_0",      QK_K, 2 + QK_K / 4},
  {T::IQ4_NL_4_4, "IQ4_NL_4_4", 32,   2 + 16},
  {T::IQ4_NL_4_8, "IQ4_NL_4_8", 32,   2 + 16},
  {T::IQ4_NL_8_8, "IQ4_NL_8_8", 32,   2 + 16},
  {T::MXFP4,      "MXFP4",      32,   1 + 16},
};
// clang-format on

static_assert(std::size(k_types) == 40);

}  // namespace

std::optional<TypeInfo> type_info(uint32_t id) {
  if (id >= std::size(k_types)) return std::nullopt;
  return k_types[id];
}

std::string type_name(uint32_t id) {
  if (auto info = type_info(id)) return info->name;
  return "type " + std::to_string(id);
}

std::optional<TensorType> type_from_name(std::string_view name) {
  for (const TypeInfo& info : k_types) {
    std::string_view n = info.name;
    if (n.size() == name.size() &&
        std::equal(n.begin(), n.end(), name.begin(),
                   [](char a, char b) { return std::toupper((unsigned char)a) == std::toupper((unsigned char)b); }))
      return info.type;
  }
  return std::nullopt;
}

uint64_t type_bytes(TensorType t, uint64_t n_elements) {
  const TypeInfo& info = k_types[static_cast<uint32_t>(t)];
  return n_elements / info.block_size * info.block_bytes;
}

}  // namespace gguf
