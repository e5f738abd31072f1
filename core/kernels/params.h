// Host side of the push-constant structs in shaders/common/params.h, with size checks.
#pragma once
#include "common/params.h"

namespace vkllm {

static_assert(sizeof(FillParams) == 8);
static_assert(sizeof(GetRowsParams) == 24);
static_assert(sizeof(MatmulParams) == 68);
static_assert(sizeof(ReadCeilingParams) == 12);
static_assert(sizeof(QuantizeXParams) == 16);
static_assert(sizeof(BinaryParams) == 8);
static_assert(sizeof(NormParams) == 28);
static_assert(sizeof(ScaleParams) == 8);
static_assert(sizeof(RowParams) == 8);
static_assert(sizeof(RopeParams) == 48);
static_assert(sizeof(KvStoreParams) == 20);
static_assert(sizeof(AttentionParams) == 104);

}  // namespace vkllm
