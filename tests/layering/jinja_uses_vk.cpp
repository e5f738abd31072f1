// Compiled with vkllm_jinja's include directories: a layer it does not link must not be found.
#include "vk/context.h"
