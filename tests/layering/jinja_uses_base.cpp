// Compiled with vkllm_jinja's include directories: a layer below it is visible.
#include "base/error.h"
#include "jinja/value.h"
