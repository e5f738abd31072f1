// Host side of the push-constant structs in shaders/common/params.h, with size checks.
#pragma once
#include "common/params.h"

namespace vkllm {

static_assert(sizeof(FillParams) == 8);
static_assert(sizeof(GetRowsParams) == 24);
static_assert(sizeof(MatmulParams) == 28);

}  // namespace vkllm
