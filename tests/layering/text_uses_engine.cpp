// Compiled with vkllm_text's include directories: a higher layer must not be found.
#include "engine/engine.h"
